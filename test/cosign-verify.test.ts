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

  test('keyless signatures are refused offline; no signature at all, and Sigstore bundles, are said so', () => {
    const keyless = layer(payload(), pair('ec').privateKey, 'sha256', { 'dev.sigstore.cosign/certificate': '-----BEGIN CERTIFICATE-----' });
    assert.match(problem(verifyCosignSignatures(found(keyless), want(ec.pem))),
      /signed keyless \(a Fulcio certificate, no key\): checking it needs Fulcio and Rekor online; a key is needed offline/);
    assert.equal(problem(verifyCosignSignatures(found(), want(ec.pem))), 'no cosign signature (looked at tag sha256-x.sig and the referrers API)');
    const bundle = { ...found(), bundles: ['sha256:b'] };
    assert.match(problem(verifyCosignSignatures(bundle, want(ec.pem))), /^referrer sha256:b: a Sigstore bundle, not a simple-signing signature/);
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
