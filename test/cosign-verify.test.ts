/*
 * The cosign verifier as a pure function (webhook.ts, chapter "oci registry client"): simple-signing
 * payloads signed here with keys node:crypto makes (ECDSA P-256, Ed25519, RSA with PKCS#1 v1.5 and PSS), checked against the keys,
 * Ed25519ph (how cosign signs with an Ed25519 key) against RFC 8032's test vector,
 * the digest, the repository and the annotations required; and the keys a hook may name
 * (parseCosignKeys, VERIFY_SIGNATURE, VERIFY_SIGNATURE_ANNOTATIONS). Signatures made by the real
 * cosign on a real registry are in test/signed-images.test.ts.
 */
import assert from 'node:assert/strict';
import { constants, createHash, generateKeyPairSync, sign, type KeyObject } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, test } from 'node:test';
import { HOOK_SETTINGS, parseCosignKeys, verifyCosignSignatures, verifyEd25519ph, type CosignSignatures } from '../webhook.ts';
import { makeTempDir } from './harness.ts';

const DIGEST = `sha256:${createHash('sha256').update('the image').digest('hex')}`;
const OTHER = `sha256:${createHash('sha256').update('another image').digest('hex')}`;
const REPO = 'registry.example.com:5000/acme/web';

function pair(kind: 'ec' | 'ed25519' | 'rsa') {
  const options = kind === 'ec' ? { namedCurve: 'prime256v1' } : kind === 'rsa' ? { modulusLength: 2048 } : {};
  const { publicKey, privateKey } = generateKeyPairSync(kind as 'ec', options as { namedCurve: string });
  return { pem: publicKey.export({ type: 'spki', format: 'pem' }) as string, privateKey };
}

/** cosign's simple-signing payload, as `cosign sign` writes it. */
function payload(digest = DIGEST, reference = REPO, optional: Record<string, string> | null = null): Buffer {
  return Buffer.from(JSON.stringify({
    critical: { identity: { 'docker-reference': reference }, image: { 'docker-manifest-digest': digest }, type: 'cosign container image signature' },
    optional,
  }));
}

function layer(data: Buffer, key: KeyObject, how: 'sha256' | 'ed25519' | 'pss' = 'sha256', extra: Record<string, string> = {}) {
  const signature = how === 'ed25519' ? sign(null, data, key)
    : how === 'pss' ? sign('sha256', data, { key, padding: constants.RSA_PKCS1_PSS_PADDING }) : sign('sha256', data, key);
  return { where: 'tag sha256-x.sig, layer 1', payload: data, annotations: { 'dev.cosignproject.cosign/signature': signature.toString('base64'), ...extra } };
}

const found = (...layers: CosignSignatures['layers']): CosignSignatures => ({ layers, looked: ['tag sha256-x.sig', 'the referrers API'], bundles: [] });
const want = (pem: string, annotations: Record<string, string> = {}) =>
  ({ digest: DIGEST, repository: REPO, keys: parseCosignKeys(pem, 'test'), annotations });
const problem = (v: ReturnType<typeof verifyCosignSignatures>) => (v.ok ? 'ok' : v.problem);

describe('verifyCosignSignatures', () => {
  const ec = pair('ec');
  test('ECDSA P-256, Ed25519 and RSA (PKCS#1 v1.5 and PSS) signatures verify under their public keys', () => {
    const ed = pair('ed25519');
    const rsa = pair('rsa');
    for (const [p, how] of [[ec, 'sha256'], [ed, 'ed25519'], [rsa, 'sha256'], [rsa, 'pss']] as const) {
      const v = verifyCosignSignatures(found(layer(payload(), p.privateKey, how)), want(p.pem));
      assert.ok(v.ok, `${how}: ${problem(v)}`);
      assert.match(v.key.fingerprint, /^sha256:[0-9a-f]{64}$/);
    }
  });

  test('another key, a copied signature, another repository and missing annotations are each named', () => {
    const other = pair('ec');
    assert.match(problem(verifyCosignSignatures(found(layer(payload(), other.privateKey)), want(ec.pem))),
      /^tag sha256-x\.sig, layer 1: not signed by a key VERIFY_SIGNATURE names \(sha256:[0-9a-f]{64}\)$/);
    assert.match(problem(verifyCosignSignatures(found(layer(payload(OTHER), ec.privateKey)), want(ec.pem))),
      new RegExp(`signed by sha256:[0-9a-f]{64}, but for "${OTHER}", not this digest \\(a signature copied from another image\\)`));
    assert.match(problem(verifyCosignSignatures(found(layer(payload(DIGEST, 'registry.example.com:5000/acme/evil'), ec.privateKey)), want(ec.pem))),
      /but for the repository "registry\.example\.com:5000\/acme\/evil", not registry\.example\.com:5000\/acme\/web/);
    const annotated = layer(payload(DIGEST, REPO, { pipeline: 'dev' }), ec.privateKey);
    assert.match(problem(verifyCosignSignatures(found(annotated), want(ec.pem, { pipeline: 'release' }))),
      /with the annotation pipeline="dev", not release/);
    assert.match(problem(verifyCosignSignatures(found(annotated), want(ec.pem, { team: 'a' }))), /without the annotation team=a/);
    assert.ok(verifyCosignSignatures(found(annotated), want(ec.pem, { pipeline: 'dev' })).ok);
  });

  test('a required annotation is a string: ["release"], 1 and true are not "release", "1" and "true"', () => {
    for (const [has, required, shown] of [[['release'], 'release', '["release"]'], [1, '1', '1'], [true, 'true', 'true']] as const) {
      const l = layer(payload(DIGEST, REPO, { pipeline: has } as unknown as Record<string, string>), ec.privateKey);
      assert.equal(problem(verifyCosignSignatures(found(l), want(ec.pem, { pipeline: required }))),
        `tag sha256-x.sig, layer 1: signed by ${parseCosignKeys(ec.pem, 'test')[0].fingerprint}, ` +
        `but with the annotation pipeline=${JSON.stringify(shown)} (not a string), not ${required}`);
    }
  });

  test('a payload changed after signing does not verify; one valid layer among bad ones is enough', () => {
    const good = layer(payload(), ec.privateKey);
    const tampered = { ...good, payload: payload(OTHER) };
    assert.match(problem(verifyCosignSignatures(found(tampered), want(ec.pem))), /not signed by a key VERIFY_SIGNATURE names/);
    const v = verifyCosignSignatures(found(tampered, { ...good, where: 'referrer sha256:r, layer 1' }), want(ec.pem));
    assert.ok(v.ok && v.where === 'referrer sha256:r, layer 1');
  });

  test('Docker Hub names its repositories several ways: all of them are the same repository', () => {
    const hub = { ...want(ec.pem), repository: 'registry-1.docker.io/library/nginx' };
    assert.ok(verifyCosignSignatures(found(layer(payload(DIGEST, 'index.docker.io/library/nginx'), ec.privateKey)), hub).ok);
  });

  test('keyless signatures are refused offline; no signature at all is said so', () => {
    const keyless = layer(payload(), pair('ec').privateKey, 'sha256', { 'dev.sigstore.cosign/certificate': '-----BEGIN CERTIFICATE-----' });
    assert.match(problem(verifyCosignSignatures(found(keyless), want(ec.pem))),
      /signed keyless \(a Fulcio certificate, no key\): checking it needs Fulcio and Rekor online; a key is needed offline/);
    assert.equal(problem(verifyCosignSignatures(found(), want(ec.pem))), 'no cosign signature (looked at tag sha256-x.sig and the referrers API)');
  });
});

/** cosign 3's own bundle of a digest, signed with annotations env=prod and team=payments (test/fixtures/cosign3). */
const COSIGN3 = path.join(import.meta.dirname, 'fixtures', 'cosign3');
const COSIGN3_DIGEST = 'sha256:a51618d53afe7ded5a250d57bee51d38fa5df0ec6fef107921b1b665200d9e15';
const IMAGE_SIGNATURE = 'https://sigstore.dev/cosign/sign/v1';

/** An in-toto statement of `predicateType` for a digest, with its subject's annotations. */
function statement(digest = DIGEST, predicateType = IMAGE_SIGNATURE, annotations: Record<string, unknown> = {}): Buffer {
  const subject = [{ digest: { sha256: digest.slice('sha256:'.length) }, annotations }];
  return Buffer.from(JSON.stringify({ _type: 'https://in-toto.io/Statement/v1', subject, predicateType, predicate: {} }));
}

/** A Sigstore bundle v0.3 whose DSSE envelope is signed over DSSE's pre-authentication encoding (or, `bare`, not). */
function bundleOf(body: Buffer, key: KeyObject, o: { type?: string; bare?: boolean; material?: object } = {}) {
  const type = o.type ?? 'application/vnd.in-toto+json';
  const signed = o.bare ? body : Buffer.concat([Buffer.from(`DSSEv1 ${Buffer.byteLength(type)} ${type} ${body.length} `), body]);
  const sig = sign(key.asymmetricKeyType === 'ed25519' ? null : 'sha256', signed, key).toString('base64');
  const bundle = {
    mediaType: 'application/vnd.dev.sigstore.bundle.v0.3+json',
    verificationMaterial: o.material ?? { publicKey: { hint: 'x' } },
    dsseEnvelope: { payload: body.toString('base64'), payloadType: type, signatures: [{ sig }] },
  };
  return { where: 'referrer sha256:b (a Sigstore bundle)', bytes: Buffer.from(JSON.stringify(bundle)) };
}

const bundled = (...bundles: CosignSignatures['bundles']): CosignSignatures => ({ ...found(), bundles });

describe('Sigstore bundles (cosign 3 signs in them by default)', () => {
  const ec = pair('ec');
  const real = { where: 'referrer sha256:r (a Sigstore bundle)', bytes: fs.readFileSync(path.join(COSIGN3, 'bundle.json')) };
  const cosign3 = (annotations: Record<string, string> = {}) =>
    ({ ...want(fs.readFileSync(path.join(COSIGN3, 'cosign.pub'), 'utf8'), annotations), digest: COSIGN3_DIGEST });

  test("cosign 3's own bundle verifies under its key, with the annotations it was signed with", () => {
    const v = verifyCosignSignatures(bundled(real), cosign3({ env: 'prod', team: 'payments' }));
    assert.ok(v.ok, problem(v));
    assert.equal(v.where, 'referrer sha256:r (a Sigstore bundle)');
    assert.match(problem(verifyCosignSignatures(bundled(real), cosign3({ env: 'staging' }))),
      /^referrer sha256:r \(a Sigstore bundle\): signed by sha256:[0-9a-f]{64}, but with the annotation env="prod", not staging$/);
    assert.match(problem(verifyCosignSignatures(bundled(real), { ...cosign3(), digest: DIGEST })),
      new RegExp(`but for "${COSIGN3_DIGEST}", not this digest \\(a signature copied from another image\\)`));
    assert.match(problem(verifyCosignSignatures(bundled(real), want(ec.pem))), /not signed by a key VERIFY_SIGNATURE names/);
  });

  test('ECDSA P-256 and Ed25519 envelopes verify over the pre-authentication encoding, not over the bare payload', () => {
    const ed = pair('ed25519');
    for (const p of [ec, ed]) assert.ok(verifyCosignSignatures(bundled(bundleOf(statement(), p.privateKey)), want(p.pem)).ok);
    assert.match(problem(verifyCosignSignatures(bundled(bundleOf(statement(), ec.privateKey, { bare: true })), want(ec.pem))),
      /not signed by a key VERIFY_SIGNATURE names/);
    // The payload type is bound in: the same bytes announced as another type are not what was signed.
    const retyped = JSON.parse(bundleOf(statement(), ec.privateKey).bytes.toString());
    retyped.dsseEnvelope.payloadType = 'application/json';
    const changed = { where: 'referrer sha256:b', bytes: Buffer.from(JSON.stringify(retyped)) };
    assert.match(problem(verifyCosignSignatures(bundled(changed), want(ec.pem))), /not signed by a key VERIFY_SIGNATURE names/);
  });

  test('an attestation, another payload type, a keyless bundle and a message signature are not image signatures', () => {
    const attested = bundleOf(statement(DIGEST, 'https://cosign.sigstore.dev/attestation/vuln/v1'), ec.privateKey);
    assert.match(problem(verifyCosignSignatures(bundled(attested), want(ec.pem))),
      /but it attests "https:\/\/cosign\.sigstore\.dev\/attestation\/vuln\/v1", not an image signature \(https:\/\/sigstore\.dev\/cosign\/sign\/v1\)$/);
    const typed = bundleOf(statement(), ec.privateKey, { type: 'application/json' });
    assert.match(problem(verifyCosignSignatures(bundled(typed), want(ec.pem))), /but its payload is "application\/json", not an in-toto statement$/);
    const keyless = bundleOf(statement(), pair('ec').privateKey, { material: { certificate: { rawBytes: 'MII=' } } });
    assert.match(problem(verifyCosignSignatures(bundled(keyless), want(ec.pem))), /signed keyless \(a Fulcio certificate, no key\)/);
    const blob = { where: 'referrer sha256:m', bytes: Buffer.from(JSON.stringify({ messageSignature: {} })) };
    assert.match(problem(verifyCosignSignatures(bundled(blob), want(ec.pem))), /a message signature \(cosign sign-blob\), not of an image$/);
    const junk = { where: 'referrer sha256:j', bytes: Buffer.from('not json') };
    assert.equal(problem(verifyCosignSignatures(bundled(junk), want(ec.pem))), 'referrer sha256:j: its Sigstore bundle is not a JSON object');
  });

  test('attestations passed over are not signatures: none is found, and they are named', () => {
    const v = verifyCosignSignatures({ ...found(), attestations: ['https://cosign.sigstore.dev/attestation/vuln/v1'] }, want(ec.pem));
    assert.ok(!v.ok && v.none, 'nothing that signs it: not signed yet (SIGNATURE_WAIT waits)');
    assert.equal(problem(v), 'no cosign signature (looked at tag sha256-x.sig and the referrers API; the referrers hold attestations ' +
      '("https://cosign.sigstore.dev/attestation/vuln/v1"), which are not signatures)');
  });

  test('a required annotation is the subject\'s, as a string', () => {
    const b = bundleOf(statement(DIGEST, IMAGE_SIGNATURE, { pipeline: 1 }), ec.privateKey);
    assert.match(problem(verifyCosignSignatures(bundled(b), want(ec.pem, { pipeline: '1' }))),
      /but with the annotation pipeline="1" \(not a string\), not 1$/);
    assert.match(problem(verifyCosignSignatures(bundled(b), want(ec.pem, { team: 'a' }))), /without the annotation team=a$/);
  });
});

describe('Ed25519ph (cosign signs with Ed25519 keys that way; node:crypto has no Ed25519ph)', () => {
  test('RFC 8032 section 7.3 test vector "abc": verifies; another message, a changed signature or key do not', () => {
    const key = Buffer.from('ec172b93ad5e563bf4932c70e1245034c35467ef2efd4d64ebf819683467e2bf', 'hex');
    const signature = Buffer.from('98a70222f0b8121aa9d30f813d683f809e462b469c7ff87639499bb94e6dae41' +
      '31f85042463c2a355a2003d062adf5aaa10b8c61e636062aaad11c2a26083406', 'hex');
    assert.equal(verifyEd25519ph(key, Buffer.from('abc'), signature), true);
    assert.equal(verifyEd25519ph(key, Buffer.from('abd'), signature), false);
    const changed = Buffer.from(signature);
    changed[40] ^= 1;
    assert.equal(verifyEd25519ph(key, Buffer.from('abc'), changed), false);
    assert.equal(verifyEd25519ph(Buffer.alloc(32, 7), Buffer.from('abc'), signature), false);
    assert.equal(verifyEd25519ph(key, Buffer.from('abc'), signature.subarray(0, 63)), false);
  });
});

describe('the keys a hook names', () => {
  test('parseCosignKeys refuses private keys, certificates, short RSA and other curves, naming the block and line', () => {
    const { privateKey } = pair('ec');
    const priv = privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
    assert.throws(() => parseCosignKeys(`# keys\n\n${priv}`, 'k.pub'), /^Error: k\.pub: PEM block 1 \(line 3\) is PRIVATE KEY, not PUBLIC KEY \(give the public key/);
    const p384 = generateKeyPairSync('ec', { namedCurve: 'secp384r1' }).publicKey.export({ type: 'spki', format: 'pem' }) as string;
    assert.throws(() => parseCosignKeys(p384, 'k.pub'), /k\.pub: PEM block 1 \(line 1\): an EC key on secp384r1; cosign keys are ECDSA P-256, Ed25519 or RSA/);
    const rsa1024 = generateKeyPairSync('rsa', { modulusLength: 1024 }).publicKey.export({ type: 'spki', format: 'pem' }) as string;
    assert.throws(() => parseCosignKeys(rsa1024, 'k.pub'), /an RSA key of 1024 bits \(at least 2048\)/);
    assert.throws(() => parseCosignKeys('not pem', 'k.pub'), /k\.pub: no PEM public key/);
    const broken = '-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n';
    assert.throws(() => parseCosignKeys(broken, 'k.pub'), /k\.pub: PEM block 1 \(line 1\) is not a public key/);
  });

  test('VERIFY_SIGNATURE takes several cosign: items, PEM text or files; anything else is named', () => {
    const dir = makeTempDir('cosign-keys-');
    const a = pair('ec');
    const b = pair('ed25519');
    fs.writeFileSync(path.join(dir, 'b.pub'), b.pem);
    const keys = HOOK_SETTINGS.VERIFY_SIGNATURE.parse(`cosign:${a.pem} cosign:${path.join(dir, 'b.pub')}`);
    assert.deepEqual(keys.map((k) => k.kind), ['ECDSA P-256', 'Ed25519']);
    assert.deepEqual(HOOK_SETTINGS.VERIFY_SIGNATURE.parse(' '), []);
    assert.throws(() => HOOK_SETTINGS.VERIFY_SIGNATURE.parse('notation:/keys/x.crt'),
      /VERIFY_SIGNATURE item 1 "notation:\/keys\/x\.crt" is not cosign:<public key PEM or file> \(cosign is the only signature format checked\)/);
    assert.throws(() => HOOK_SETTINGS.VERIFY_SIGNATURE.parse(`cosign:${a.pem} cosign:${path.join(dir, 'absent.pub')}`),
      /VERIFY_SIGNATURE item 2: the key file ".*absent\.pub" cannot be read: ENOENT/);
    assert.deepEqual(HOOK_SETTINGS.VERIFY_SIGNATURE_ANNOTATIONS.parse('pipeline=release team=a=b'), { pipeline: 'release', team: 'a=b' });
    assert.throws(() => HOOK_SETTINGS.VERIFY_SIGNATURE_ANNOTATIONS.parse('pipeline'), /VERIFY_SIGNATURE_ANNOTATIONS item 1 "pipeline" is not key=value/);
  });
});
