/*
 * VERIFY_SIGNATURE end to end: the real cosign (built by test/cosign.ts: v2.6.5, and v3.1.3, whose default is
 * the Sigstore bundle format: a DSSE envelope stored as a referrer, no .sig tag) signs images that
 * skopeo pushed to a real registry (Debian's docker-registry over TLS with basic auth,
 * test/registry.ts), offline (`cosign sign --key … --tlog-upload=false`); the built executable then
 * gets the registry's push envelopes and, on the real test cluster, deploys a signed digest and refuses
 * the rest. The envelopes are posted by the test once the signature is (or is not) in place, in the
 * registry's own shape: the registry's own notifications would race cosign.
 *
 * An approved push whose entry names an unsigned digest is checked again, and refused.
 *
 * The referrers way, both ways: cosign's --registry-referrers-mode=oci-1-1 against Distribution 2.8
 * (no referrers API: GET /v2/<repo>/referrers/<digest> is 404) stores the signature as a referrer and
 * lists it in the referrers tag schema's index (tag sha256-<hex>), which the service reads as the
 * fallback; against go-containerregistry's registry with its referrers API on (test/oci-registry.ts) it
 * writes no tag at all, and the service reads the referrers API.
 *
 * cosign and the registries are required in CI (a failure to build or start them fails); outside CI,
 * without the cluster or cosign, the tests skip loudly.
 */
import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import { createHash, createPrivateKey, createPublicKey, generateKeyPairSync, sign as signWith } from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import {
  adminPort, defaultBinary, httpRequest, makeTempDir, startWebhook, waitFor, waitForOutput, type Webhook,
} from './harness.ts';
import { COSIGN3_VERSION, cosignOrSkip } from './cosign.ts';
import { ociRegistryOrSkip, pushBlob, pushManifest, type OciRegistry } from './oci-registry.ts';
import { makeCertificate, ociArchive, startRegistry, type Registry } from './registry.ts';
import { clusterOrSkip, containerImage, deployment, freshNamespaceName, kubectlFor, pushedState, removeNamespace } from './cluster/kube.ts';
import { fixedSettings, registryHook } from './upgrade-hooks.ts';
import { approvalToken, sealPendingEntry } from '../webhook.ts';

const run = promisify(execFile);
const TOKEN = 'signed-images-token-3e81c0';
const LOGIN = { user: 'signer', password: 'signed-images-password-b2d9e4' };
const KEY_PASSWORD = 'cosign-key-password-7f10aa';
// cosign signs in well under a second; a loaded CI machine and a registry login make that seconds.
const COSIGN_TIMEOUT_MS = 120_000;
const cluster = await clusterOrSkip();
const cosign = cluster ? await cosignOrSkip() : undefined;
const cosign3 = cosign ? await cosignOrSkip(COSIGN3_VERSION) : undefined;

/** sha256 of a PEM public key's SubjectPublicKeyInfo, as -validate and the answers show it. */
function fingerprint(pemFile: string): string {
  const der = createPublicKey(fs.readFileSync(pemFile, 'utf8')).export({ type: 'spki', format: 'der' });
  return `sha256:${createHash('sha256').update(der).digest('hex')}`;
}

const escape = (text: string) => text.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');

describe('VERIFY_SIGNATURE: cosign signatures on a real registry, through the executable', { skip: cosign && cosign3 ? false : 'no cluster or no cosign' }, () => {
  const ns = freshNamespaceName('signed');
  const kubectl = kubectlFor(cluster!);
  let registry: Registry;
  let wh: Webhook;
  /** The flags that seal the entries the service writes on workloads (-approval-key-file, with -public-url). */
  let sealing: string[] = [];
  let work: string;
  let caFile: string;
  let certDir: string;
  let dockerConfig: string;
  let signedV2: string;
  // go-containerregistry's registry, which has the referrers API (undefined locally when it cannot be built).
  let oci: OciRegistry | undefined;
  let ociCa: string;

  const image = (tag: string) => `${registry.host}/acme/web:${tag}`;
  const imageOf = async (name = 'web') => containerImage(JSON.parse(await kubectl(['-n', ns, 'get', `deployment/${name}`, '-o', 'json'])), 'app');
  const stateOf = async (name = 'web') => pushedState(JSON.parse(await kubectl(['-n', ns, 'get', `deployment/${name}`, '-o', 'json'])));

  /** The digest the registry (by default the Distribution one, with the login) has for acme/web:<tag>. */
  const digestOf = (tag: string, at: { host: string; caPem?: string; auth?: string } = { ...registry, auth: `${LOGIN.user}:${LOGIN.password}` }) =>
    new Promise<string>((resolve, reject) => {
    const req = https.request(`https://${at.host}/v2/acme/web/manifests/${tag}`, {
      method: 'HEAD', ca: at.caPem, auth: at.auth,
      headers: { Accept: 'application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json' },
    }, (res) => {
      res.resume();
      const digest = res.headers['docker-content-digest'];
      if (res.statusCode === 200 && typeof digest === 'string') resolve(digest);
      else reject(new Error(`HEAD acme/web:${tag}: ${res.statusCode}`));
    });
    req.on('error', reject);
    req.end();
  });
  /** Pushes a new image to acme/web:<tag> on go-containerregistry's registry (the one with the referrers API); its digest. */
  const pushToOci = async (tag: string) => {
    await run('skopeo', ['copy', '--quiet', '--dest-cert-dir', oci!.certDir, `oci-archive:${ociArchive(work, `referrers ${tag}`).path}`,
      `docker://${oci!.host}/acme/web:${tag}`], { timeout: COSIGN_TIMEOUT_MS });
    return digestOf(tag, { host: oci!.host, caPem: oci!.caPem });
  };
  /** Pushes a new image to acme/web:<tag>; its digest. */
  const pushImage = async (tag: string) => {
    await registry.push(ociArchive(work, `signed-images ${tag} ${Date.now()}`).path, `acme/web:${tag}`);
    return digestOf(tag);
  };
  /** `cosign sign --key <key>.key --tlog-upload=false` of acme/web@<digest>, offline, trusting the registry's CA. */
  const sign = (key: string, digest: string, extra: string[] = [], at = { host: registry.host, ca: caFile }) =>
    run(cosign!, ['sign', '--key', path.join(work, `${key}.key`), '--tlog-upload=false', '--yes', ...extra, `${at.host}/acme/web@${digest}`], {
      cwd: work, timeout: COSIGN_TIMEOUT_MS,
      env: { ...process.env, COSIGN_PASSWORD: KEY_PASSWORD, COSIGN_EXPERIMENTAL: '1', SSL_CERT_FILE: at.ca, DOCKER_CONFIG: dockerConfig },
    });
  /**
   * cosign 3 of acme/web@<digest>, offline, in its default format (a Sigstore bundle): `sign`, or `attest` with its
   * extra arguments. Offline in cosign 3 is without its signing config, which would name a log and a timestamp
   * authority to upload to.
   */
  const cosign3Of = (verb: 'sign' | 'attest', key: string, digest: string, extra: string[] = [], at = { host: registry.host, ca: caFile }) =>
    run(cosign3!, [verb, '--key', path.join(work, `${key}.key`), '--use-signing-config=false', '--tlog-upload=false', '--yes', ...extra,
      `${at.host}/acme/web@${digest}`], {
      cwd: work, timeout: COSIGN_TIMEOUT_MS,
      env: { ...process.env, COSIGN_PASSWORD: KEY_PASSWORD, SSL_CERT_FILE: at.ca, DOCKER_CONFIG: dockerConfig },
    });
  /** The registry's push envelope for acme/web:<tag> at <digest>, to the hook for deployment/<workload>. */
  const post = (tag: string, digest: string, { hook = 'signed', workload = 'web', host = registry.host, repository = 'acme/web', via = wh } = {}) => via.request(
    `/hooks/${hook}?${new URLSearchParams({ token: TOKEN, ns, workload: `deployment/${workload}`, container: 'app' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/vnd.docker.distribution.events.v1+json' },
      body: JSON.stringify({ events: [{
        action: 'push', timestamp: new Date().toISOString(),
        target: { mediaType: 'application/vnd.oci.image.manifest.v1+json', repository, tag, digest },
        request: { host, method: 'PUT' },
      }] }),
    });
  /** The deliveries page's record of the push `res` answered, once it is done. */
  const deliveryOf = async (res: { headers: Record<string, unknown> }, timeoutMs = 30_000, at = wh) => {
    const admin = await adminPort(at);
    const id = String(res.headers['x-request-id']);
    return waitFor(async () => {
      const d = JSON.parse((await httpRequest(admin, '/deliveries.json')).body).deliveries.find((x: any) => x.request_id === id);
      return d?.state === 'done' ? d : undefined;
    }, { timeoutMs, what: `the delivery of ${id}` });
  };
  /** A push refused for its signature: 500 with the message, nothing on the workload changed. */
  const refused = async (tag: string, digest: string, why: RegExp, opts: Parameters<typeof post>[2] = {}) => {
    const before = await stateOf(opts.workload);
    const res = await post(tag, digest, opts);
    assert.equal(res.status, 500, res.body);
    const prefix = `^result: +failed: signature: ${escape(`${opts.host ?? registry.host}/acme/web@${digest}`)} is not signed as VERIFY_SIGNATURE requires: `;
    assert.match(res.body, new RegExp(`${prefix}${why.source}; nothing was changed$`, 'm'));
    assert.equal(await stateOf(opts.workload), before, `${tag}: the workload is unchanged`);
    return res;
  };

  before(async () => {
    work = makeTempDir('signed-images-');
    registry = await startRegistry({ tls: true, auth: LOGIN });
    caFile = path.join(work, 'registry-ca.pem');
    fs.writeFileSync(caFile, registry.caPem!);
    certDir = path.join(work, 'certs');
    fs.mkdirSync(certDir);
    fs.writeFileSync(path.join(certDir, 'ca.crt'), registry.caPem!);
    // cosign reads its registry login from a docker config, as in CI after `docker login`.
    dockerConfig = path.join(work, 'docker');
    fs.mkdirSync(dockerConfig);
    const auth = Buffer.from(`${LOGIN.user}:${LOGIN.password}`).toString('base64');
    fs.writeFileSync(path.join(dockerConfig, 'config.json'), JSON.stringify({ auths: { [registry.host]: { auth } } }));
    const keyEnv = { cwd: work, timeout: COSIGN_TIMEOUT_MS, env: { ...process.env, COSIGN_PASSWORD: KEY_PASSWORD } };
    for (const prefix of ['release', 'other']) await run(cosign!, ['generate-key-pair', '--output-key-prefix', prefix], keyEnv);
    // cosign makes ECDSA P-256 keys; Ed25519 and RSA keys are made elsewhere and imported, as an operator would.
    for (const [prefix, kind, options] of [['ed', 'ed25519', {}], ['rsa', 'rsa', { modulusLength: 3072 }]] as const) {
      const { privateKey } = generateKeyPairSync(kind as 'rsa', options as { modulusLength: number });
      fs.writeFileSync(path.join(work, `${prefix}-private.pem`), privateKey.export({ type: 'pkcs8', format: 'pem' }));
      await run(cosign!, ['import-key-pair', '--key', `${prefix}-private.pem`, '--output-key-prefix', prefix], keyEnv);
    }
    const urlToken = { match: { type: 'value', value: TOKEN, parameter: { source: 'url', name: 'token' } } };
    const hook = (id: string, settings: Record<string, string>) => {
      const h = registryHook(id, urlToken, 'distribution') as Record<string, object[]>;
      h['pass-environment-to-command'].push(...fixedSettings({ REGISTRY_CA: caFile, ...settings }));
      return h;
    };
    const hooks = [
      // SIGNATURE_WAIT=0: a digest not signed yet is refused at once, as before the wait.
      hook('signed', { VERIFY_SIGNATURE: `cosign:${path.join(work, 'release.pub')}`, SIGNATURE_WAIT: '0' }),
      hook('annotated', { VERIFY_SIGNATURE: `cosign:${fs.readFileSync(path.join(work, 'release.pub'), 'utf8')}`, VERIFY_SIGNATURE_ANNOTATIONS: 'pipeline=release' }),
      // Several keys, any one suffices: a file and PEM text.
      hook('anykey', { VERIFY_SIGNATURE: `cosign:${path.join(work, 'ed.pub')} cosign:${fs.readFileSync(path.join(work, 'rsa.pub'), 'utf8')}` }),
      // A push the registry cannot be asked about waits for it (-apply-deadline, 10 minutes by default).
      hook('patient', { VERIFY_SIGNATURE: `cosign:${path.join(work, 'release.pub')}`, ON_REGISTRY_AWAY: 'keep', SIGNATURE_WAIT: '0' }),
      // A digest not signed yet waits for its signature: 10 minutes (the default), and 10 s (the shortest allowed: a
      // push, its answer and cosign's signing take about a second here, a few on a loaded machine).
      hook('waits', { VERIFY_SIGNATURE: `cosign:${path.join(work, 'release.pub')}` }),
      hook('brief', { VERIFY_SIGNATURE: `cosign:${path.join(work, 'release.pub')}`, SIGNATURE_WAIT: '10s' }),
    ];
    oci = await ociRegistryOrSkip();
    if (oci) {
      ociCa = path.join(work, 'oci-ca.pem');
      fs.writeFileSync(ociCa, oci.caPem);
      hooks.push(hook('referrers', { VERIFY_SIGNATURE: `cosign:${path.join(work, 'release.pub')}`, REGISTRY_CA: ociCa, SIGNATURE_WAIT: '0' }));
      // Signatures made here with the Ed25519 key (node:crypto), pushed as a registry pusher could shape them.
      hooks.push(hook('flood', { VERIFY_SIGNATURE: `cosign:${path.join(work, 'ed.pub')}`, REGISTRY_CA: ociCa }));
      hooks.push(hook('typed', { VERIFY_SIGNATURE: `cosign:${path.join(work, 'ed.pub')}`, REGISTRY_CA: ociCa,
        VERIFY_SIGNATURE_ANNOTATIONS: 'pipeline=release' }));
    }
    fs.writeFileSync(path.join(work, 'hooks.json'), JSON.stringify(hooks));
    // Entries (a push waiting for its signature) are sealed with the approval key: only a sealed entry of a hook
    // that leaves its workload to the request is resumed.
    fs.writeFileSync(path.join(work, 'entries-key'), 'signed-images-entries-key-4b1f9e0c7d2a6e3f');
    sealing = ['-public-url', 'https://webhook.example.test', '-approval-key-file', path.join(work, 'entries-key')];
    wh = await startWebhook({ hooks: path.join(work, 'hooks.json'), env: { KUBECONFIG: cluster!.kubeconfigPath }, metrics: true,
      args: ['-deliveries', '50', ...sealing] });
    await kubectl(['create', 'namespace', ns]);
    const withSecret = (d: Record<string, any>) => ((d.spec.template.spec.imagePullSecrets = [{ name: 'regcred' }]), d);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
      { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'regcred' }, type: 'kubernetes.io/dockerconfigjson',
        data: { '.dockerconfigjson': Buffer.from(JSON.stringify({ auths: { [`https://${registry.host}`]: { auth } } })).toString('base64') } },
      withSecret(deployment('web', [{ name: 'app', image: image('v1') }], { replicas: 1 })),
      withSecret(deployment('annotated', [{ name: 'app', image: image('v1') }], { replicas: 1 })),
      withSecret(deployment('anykey', [{ name: 'app', image: image('v1') }], { replicas: 1 })),
      withSecret(deployment('patient', [{ name: 'app', image: image('v1') }], { replicas: 1 })),
      withSecret(deployment('waits', [{ name: 'app', image: image('v1') }], { replicas: 1 })),
      withSecret(deployment('brief', [{ name: 'app', image: image('v1') }], { replicas: 1 })),
      ...(oci ? ['referrers', 'flood', 'typed'].map((name) =>
        deployment(name, [{ name: 'app', image: `${oci!.host}/acme/${name === 'referrers' ? 'web' : 'flood'}:v1` }], { replicas: 1 })) : []),
    ] }));
  });
  after(async () => {
    await wh?.stop();
    await registry?.stop();
    await oci?.stop();
    await removeNamespace(kubectl, ns);
  });

  test('a digest signed with the hook\'s key is deployed at that digest, and the answer names the key and signature', async () => {
    signedV2 = await pushImage('v2');
    await sign('release', signedV2);
    const res = await post('v2', signedV2);
    assert.equal(res.status, 200, res.body);
    assert.equal(await imageOf(), `${image('v2')}@${signedV2}`);
    const sig = `${signedV2.replace(':', '-')}.sig`;
    assert.match(res.body, new RegExp(`^note: +signature: ${escape(`${registry.host}/acme/web@${signedV2}`)} is signed by ECDSA P-256 key ` +
      `${fingerprint(path.join(work, 'release.pub'))} \\(tag ${sig}, layer 1\\)$`, 'm'));
  });

  test('an unsigned digest is refused: 500, nothing changed, an UpgradeRefused Event, the delivery "refused: unsigned"', async () => {
    const digest = await pushImage('v3');
    const hex = digest.slice('sha256:'.length);
    const res = await refused('v3', digest, new RegExp(`no cosign signature \\(looked at tag sha256-${hex}\\.sig and the referrers tag sha256-${hex}\\)`));
    const events = async () => (JSON.parse(await kubectl(['-n', ns, 'get', 'events', '--field-selector', 'involvedObject.name=web,reason=UpgradeRefused', '-o', 'json'])).items as any[])
      .filter((e) => e.type === 'Warning' && e.message.includes(`acme/web@${digest} is not signed as VERIFY_SIGNATURE requires: no cosign signature`));
    await waitFor(async () => (await events()).length > 0, { timeoutMs: 30_000, what: 'the UpgradeRefused Event' });
    const delivery = await deliveryOf(res);
    assert.equal(delivery.decision, 'refused: unsigned');
    assert.match(delivery.detail, new RegExp(`^signature: ${escape(registry.host)}/acme/web@${digest} is not signed`));
  });

  test('a digest signed with another key is refused, naming the key the hook trusts', async () => {
    const digest = await pushImage('v4');
    await sign('other', digest);
    await refused('v4', digest, new RegExp(`tag sha256-[0-9a-f]{64}\\.sig, layer 1: not signed by a key VERIFY_SIGNATURE names \\(${fingerprint(path.join(work, 'release.pub'))}\\)`));
  });

  test('a tag moved to an unsigned digest after signing is refused; the signed digest announced late is not the tag\'s', async () => {
    const signed = await pushImage('v5');
    await sign('release', signed);
    const moved = await pushImage('v5');
    assert.notEqual(moved, signed);
    await refused('v5', moved, /no cosign signature \(looked at tag .*\)/);
    const late = await post('v5', signed);
    assert.equal(late.status, 500, late.body);
    assert.match(late.body, new RegExp(`failed: VERIFY_IMAGE: the payload announced ${signed} but the registry's .*acme/web:v5 is ${moved}; nothing was changed`));
  });

  test('a signature copied from another digest (its .sig tag copied over) is refused as naming that digest', async () => {
    const digest = await pushImage('v6');
    const tag = (d: string) => `docker://${registry.host}/acme/web:${d.replace(':', '-')}.sig`;
    const creds = `${LOGIN.user}:${LOGIN.password}`;
    await run('skopeo', ['copy', '--quiet', '--src-cert-dir', certDir, '--dest-cert-dir', certDir, '--src-creds', creds, '--dest-creds', creds,
      tag(signedV2), tag(digest)], { timeout: COSIGN_TIMEOUT_MS });
    await refused('v6', digest, new RegExp(`tag sha256-${digest.slice(7)}\\.sig, layer 1: signed by sha256:[0-9a-f]{64}, but for "${signedV2}", not this digest \\(a signature copied from another image\\)`));
  });

  test('a signature stored as a referrer (cosign --registry-referrers-mode=oci-1-1) is found through the referrers tag schema', async () => {
    const digest = await pushImage('v7');
    await sign('release', digest, ['--registry-referrers-mode=oci-1-1']);
    const res = await post('v7', digest);
    assert.equal(res.status, 200, res.body);
    assert.equal(await imageOf(), `${image('v7')}@${digest}`);
    assert.match(res.body, /is signed by ECDSA P-256 key sha256:[0-9a-f]{64} \(referrer sha256:[0-9a-f]{64}, layer 1\)$/m);
  });

  test('on a registry with the OCI 1.1 referrers API, the referrers are read through it: unsigned refused, signed deployed', async (t) => {
    if (!oci) return t.skip("go-containerregistry's registry could not be built or started");
    const at = { host: oci.host, caPem: oci.caPem };
    const digest = await pushToOci('v2');
    const where = { hook: 'referrers', workload: 'referrers', host: oci.host };
    await refused('v2', digest, new RegExp(`no cosign signature \\(looked at tag sha256-${digest.slice(7)}\\.sig and the referrers API\\)`), where);
    await sign('release', digest, ['--registry-referrers-mode=oci-1-1'], { host: oci.host, ca: ociCa });
    // Stored as a referrer only: no .sig tag, and (the registry having the API) no referrers tag either.
    await assert.rejects(digestOf(`${digest.replace(':', '-')}.sig`, at), /: 404$/);
    await assert.rejects(digestOf(digest.replace(':', '-'), at), /: 404$/);
    const res = await post('v2', digest, where);
    assert.equal(res.status, 200, res.body);
    assert.equal(await imageOf('referrers'), `${oci.host}/acme/web:v2@${digest}`);
    assert.match(res.body, /is signed by ECDSA P-256 key sha256:[0-9a-f]{64} \(referrer sha256:[0-9a-f]{64}, layer 1\)$/m);
  });

  test("cosign 3's default signature, a Sigstore bundle stored as a referrer (no .sig tag), is found and deployed", async () => {
    const digest = await pushImage('b1');
    await cosign3Of('sign', 'release', digest);
    // Stored as a referrer only: the .sig tag cosign 2 wrote is not there.
    await assert.rejects(digestOf(`${digest.replace(':', '-')}.sig`), /: 404$/);
    const res = await post('b1', digest);
    assert.equal(res.status, 200, res.body);
    assert.equal(await imageOf(), `${image('b1')}@${digest}`);
    assert.match(res.body, new RegExp(`^note: +signature: ${escape(`${registry.host}/acme/web@${digest}`)} is signed by ECDSA P-256 key ` +
      `${fingerprint(path.join(work, 'release.pub'))} \\(referrer sha256:[0-9a-f]{64} \\(a Sigstore bundle\\)\\)$`, 'm'));
  });

  test("cosign 3's annotations (sign -a) are checked as cosign 2's are: another value is refused, the one required deployed", async () => {
    const digest = await pushImage('b2');
    await cosign3Of('sign', 'release', digest, ['-a', 'pipeline=dev']);
    await refused('b2', digest, /referrer sha256:[0-9a-f]{64} \(a Sigstore bundle\): signed by sha256:[0-9a-f]{64}, but with the annotation pipeline="dev", not release/,
      { hook: 'annotated', workload: 'annotated' });
    await cosign3Of('sign', 'release', digest, ['-a', 'pipeline=release']);
    const res = await post('b2', digest, { hook: 'annotated', workload: 'annotated' });
    assert.equal(res.status, 200, res.body);
    assert.equal(await imageOf('annotated'), `${image('b2')}@${digest}`);
  });

  test('a cosign 3 attestation (cosign attest) is not a signature: a digest that has only one is not signed, and is said so', async () => {
    const digest = await pushImage('b3');
    const predicate = path.join(work, 'scan.json');
    fs.writeFileSync(predicate, JSON.stringify({ scanner: { uri: 'pkg:github/aquasecurity/trivy' }, result: {} }));
    await cosign3Of('attest', 'release', digest, ['--type', 'vuln', '--predicate', predicate]);
    const hex = digest.slice('sha256:'.length);
    await refused('b3', digest, new RegExp(`no cosign signature \\(looked at tag sha256-${hex}\\.sig and the referrers tag sha256-${hex}; ` +
      'the referrers hold attestations \\("https://cosign\\.sigstore\\.dev/attestation/vuln/v1"\\), which are not signatures\\)'));
  });

  test("on a registry with the referrers API, cosign 3's bundle is read through it (a referrer typed as its config, as this registry lists it)", async (t) => {
    if (!oci) return t.skip("go-containerregistry's registry could not be built or started");
    const digest = await pushToOci('b4');
    await cosign3Of('sign', 'release', digest, [], { host: oci.host, ca: ociCa });
    const res = await post('b4', digest, { hook: 'referrers', workload: 'referrers', host: oci.host });
    assert.equal(res.status, 200, res.body);
    assert.equal(await imageOf('referrers'), `${oci.host}/acme/web:b4@${digest}`);
    assert.match(res.body, /is signed by ECDSA P-256 key sha256:[0-9a-f]{64} \(referrer sha256:[0-9a-f]{64} \(a Sigstore bundle\)\)$/m);
  });

  describe('signatures shaped by whoever may push to the registry (go-containerregistry\'s registry, its requests counted)', () => {
    const REPO = 'acme/flood';
    const MANIFEST = 'application/vnd.oci.image.manifest.v1+json';
    const descriptor = (mediaType: string, digest: string, size: number, annotations?: Record<string, string>) =>
      ({ mediaType, digest, size, ...(annotations ? { annotations } : {}) });
    /** A new image at acme/flood:<tag>; its digest. */
    const newImage = async (tag: string) => {
      const config = Buffer.from(JSON.stringify({ architecture: 'amd64', os: 'linux', rootfs: { type: 'layers', diff_ids: [] }, comment: `${tag} ${Date.now()}` }));
      const c = await pushBlob(oci!, REPO, config);
      return pushManifest(oci!, REPO, { schemaVersion: 2, mediaType: MANIFEST, config: descriptor('application/vnd.oci.image.config.v1+json', c, config.length), layers: [] }, tag);
    };
    /** cosign's simple-signing payload for acme/flood@<digest>, padded with spaces to `size` bytes when given. */
    const payload = (digest: string, optional: unknown = null, size = 0) => Buffer.from(JSON.stringify({
      critical: { identity: { 'docker-reference': `${oci!.host}/${REPO}` }, image: { 'docker-manifest-digest': digest }, type: 'cosign container image signature' },
      optional }).padEnd(size));
    /** A signature layer: the payload as a blob, signed by the hook's Ed25519 key (or over `signed` instead); `size` as declared. */
    const layer = async (bytes: Buffer, signed = bytes, size = bytes.length) => {
      const signature = signWith(null, signed, createPrivateKey(fs.readFileSync(path.join(work, 'ed-private.pem')))).toString('base64');
      return descriptor('application/vnd.dev.cosign.simplesigning.v1+json', await pushBlob(oci!, REPO, bytes), size, { 'dev.cosignproject.cosign/signature': signature });
    };
    /** A signature manifest listing `layers`: at the .sig tag of `digest`, or as its referrer (cosign's artifactType, a subject). */
    const signatures = async (digest: string, layers: object[], as: 'tag' | number) => {
      const artifact = as === 'tag' ? 'application/vnd.oci.image.config.v1+json' : 'application/vnd.dev.cosign.artifact.sig.v1+json';
      const config = await pushBlob(oci!, REPO, Buffer.from('{}'));
      const subject = as === 'tag' ? {} : { subject: descriptor(MANIFEST, digest, 0), annotations: { copy: String(as) } };
      return pushManifest(oci!, REPO, { schemaVersion: 2, mediaType: MANIFEST, config: descriptor(artifact, config, 2), layers, ...subject },
        as === 'tag' ? `${digest.replace(':', '-')}.sig` : undefined);
    };
    /** The push of acme/flood:<tag> at `digest` to `hook`, and the registry requests it made. */
    const pushed = async (tag: string, digest: string, hook = 'flood') => {
      const mark = oci!.requests().length;
      const res = await post(tag, digest, { hook, workload: hook, host: oci!.host, repository: REPO });
      return { res, requests: oci!.requests().slice(mark) };
    };
    const gets = (requests: string[], what: string) => requests.filter((r) => r.startsWith(`GET /v2/${REPO}/${what}`)).length;

    test('one blob listed 20 times in the .sig manifest and in each of 22 referrers is read once and checked once; 20 manifests at most', async (t) => {
      if (!oci) return t.skip("go-containerregistry's registry could not be built or started");
      const digest = await newImage('junk');
      // Just under the payload cap, signed over something else: every copy would be read and checked in vain.
      const junk = await layer(payload(digest, null, 60 * 1024), Buffer.from('another payload'));
      await signatures(digest, Array(20).fill(junk), 'tag');
      for (let i = 0; i < 22; i++) await signatures(digest, Array(20).fill(junk), i);
      const before = await stateOf('flood');
      const { res, requests } = await pushed('junk', digest);
      assert.equal(res.status, 500, res.body);
      assert.match(res.body, new RegExp(`is not signed as VERIFY_SIGNATURE requires: tag sha256-${digest.slice(7)}\\.sig, layer 1: not signed by a key ` +
        'VERIFY_SIGNATURE names \\(sha256:[0-9a-f]{64}\\); more than 20 signature manifests: the rest were not read; nothing was changed$', 'm'));
      assert.equal(gets(requests, `blobs/${junk.digest}`), 1, requests.join('\n'));
      assert.equal(gets(requests, 'manifests/sha256%3A'), 19, 'the .sig manifest and 19 referrers: 20 manifests');
      assert.ok(requests.length <= 25, `${requests.length} requests:\n${requests.join('\n')}`);
      assert.equal(await stateOf('flood'), before);
    });

    test('a payload over 64 KiB is refused unread, whatever its descriptor says, even when validly signed', async (t) => {
      if (!oci) return t.skip("go-containerregistry's registry could not be built or started");
      const digest = await newImage('big');
      const declared = await layer(payload(digest, null, 64 * 1024 + 1));
      const hidden = await layer(payload(digest, null, 64 * 1024 + 2), undefined, 400);
      await signatures(digest, [declared, hidden], 'tag');
      const before = await stateOf('flood');
      const { res, requests } = await pushed('big', digest);
      assert.equal(res.status, 500, res.body);
      assert.match(res.body, /\.sig, layer 1: its payload is 65537 bytes, more than a signing payload's 65536: not read; /);
      assert.match(res.body, /\.sig, layer 2: its payload is larger than a signing payload's 65536 bytes: refused; nothing was changed$/m);
      assert.equal(gets(requests, `blobs/${declared.digest}`), 0);
      assert.equal(await stateOf('flood'), before);
    });

    test('the search stops at the first valid signature: one blob read, the referrers not asked', async (t) => {
      if (!oci) return t.skip("go-containerregistry's registry could not be built or started");
      const digest = await newImage('good');
      const others = await Promise.all(Array.from({ length: 19 }, (_, i) => layer(payload(digest, { n: String(i) }), Buffer.from(`other ${i}`))));
      await signatures(digest, [await layer(payload(digest)), ...others], 'tag');
      await signatures(digest, others, 1);
      const { res, requests } = await pushed('good', digest);
      assert.equal(res.status, 200, res.body);
      assert.equal(await imageOf('flood'), `${oci.host}/${REPO}:good@${digest}`);
      assert.match(res.body, /is signed by Ed25519 key sha256:[0-9a-f]{64} \(tag sha256-[0-9a-f]{64}\.sig, layer 1\)$/m);
      assert.equal(gets(requests, 'blobs/'), 1, requests.join('\n'));
      assert.equal(gets(requests, 'referrers/'), 0);
    });

    test('a registry slower than the check\'s 30 s in all is away: the push is kept (ON_REGISTRY_AWAY=keep), nothing changed', async (t) => {
      if (!oci) return t.skip("go-containerregistry's registry could not be built or started");
      // In front of the lab registry, each GET answered 8 s late: each request within its own 10 s, four past 30 s.
      const certs = makeCertificate(makeTempDir('slow-registry-'));
      const slow = https.createServer({ cert: fs.readFileSync(certs.certFile), key: fs.readFileSync(certs.keyFile) }, (req, res) => {
        const forward = () => req.pipe(https.request(`https://${oci!.host}${req.url}`, { method: req.method, headers: req.headers, ca: oci!.caPem },
          (answer) => (res.writeHead(answer.statusCode ?? 502, answer.headers), answer.pipe(res))).on('error', () => res.destroy()));
        if (req.method === 'GET') setTimeout(forward, 8_000);
        else forward();
      });
      await new Promise<void>((resolve) => slow.listen(0, '127.0.0.1', resolve));
      const host = `127.0.0.1:${(slow.address() as import('node:net').AddressInfo).port}`;
      const dir = makeTempDir('slow-hooks-');
      fs.writeFileSync(path.join(dir, 'ca.pem'), certs.caPem);
      const h = registryHook('slow', { match: { type: 'value', value: TOKEN, parameter: { source: 'url', name: 'token' } } }, 'distribution') as Record<string, object[]>;
      h['pass-environment-to-command'].push(...fixedSettings({ VERIFY_SIGNATURE: `cosign:${path.join(work, 'ed.pub')}`,
        REGISTRY_CA: path.join(dir, 'ca.pem'), ON_REGISTRY_AWAY: 'keep' }));
      const own = await startWebhook({ hooks: [h], env: { KUBECONFIG: cluster!.kubeconfigPath } });
      try {
        await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('slow', [{ name: 'app', image: `${host}/${REPO}:v1` }], { replicas: 1 })));
        const digest = await newImage('slow');
        const junk = await layer(payload(digest), Buffer.from('another payload'));
        await signatures(digest, [junk], 'tag');
        await signatures(digest, [junk, await layer(payload(digest, { n: '1' }), Buffer.from('another'))], 1);
        const before = await stateOf('slow');
        const started = Date.now();
        // The harness's requests give up after 30 s idle; this answer comes after the check's 30 s.
        const res = await new Promise<{ status: number; body: string }>((resolve, reject) => {
          const req = http.request({ host: '127.0.0.1', port: own.port, method: 'POST',
            path: `/hooks/slow?${new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/slow', container: 'app' })}`,
            headers: { 'Content-Type': 'application/vnd.docker.distribution.events.v1+json' } }, (r) => {
            let body = '';
            r.setEncoding('utf8').on('data', (c: string) => (body += c)).on('end', () => resolve({ status: r.statusCode ?? 0, body }));
          });
          req.on('error', reject);
          req.end(JSON.stringify({ events: [{ action: 'push', timestamp: new Date().toISOString(),
            target: { mediaType: MANIFEST, repository: REPO, tag: 'slow', digest }, request: { host, method: 'PUT' } }] }));
        });
        assert.equal(res.status, 202, res.body);
        assert.match(res.body, new RegExp(`^action: +waiting for the registry \\(signature: could not read the signatures of ${escape(`${host}/${REPO}@${digest}`)}: ` +
          'the registry did not give the signatures within 30s.*\\): kept', 'm'));
        assert.ok(Date.now() - started < 40_000, `answered after ${Date.now() - started} ms: one deadline for the whole check`);
        assert.equal(await stateOf('slow'), before);
      } finally {
        await own.stop();
        slow.closeAllConnections();
        await new Promise((resolve) => slow.close(resolve));
      }
    });

    test('a required annotation is a string: a payload saying ["release"] is not signed "release"', async (t) => {
      if (!oci) return t.skip("go-containerregistry's registry could not be built or started");
      const digest = await newImage('typed');
      await signatures(digest, [await layer(payload(digest, { pipeline: ['release'] }))], 'tag');
      const before = await stateOf('typed');
      const { res } = await pushed('typed', digest, 'typed');
      assert.equal(res.status, 500, res.body);
      assert.match(res.body, /layer 1: signed by sha256:[0-9a-f]{64}, but with the annotation pipeline="\[\\"release\\"\]" \(not a string\), not release; /);
      assert.equal(await stateOf('typed'), before);
    });
  });

  test('VERIFY_SIGNATURE_ANNOTATIONS: a signature with the annotation required is deployed, one with another value refused', async () => {
    const release = await pushImage('v8');
    await sign('release', release, ['-a', 'pipeline=release']);
    const res = await post('v8', release, { hook: 'annotated', workload: 'annotated' });
    assert.equal(res.status, 200, res.body);
    assert.equal(await imageOf('annotated'), `${image('v8')}@${release}`);
    const dev = await pushImage('v9');
    await sign('release', dev, ['-a', 'pipeline=dev']);
    await refused('v9', dev, /tag sha256-[0-9a-f]{64}\.sig, layer 1: signed by sha256:[0-9a-f]{64}, but with the annotation pipeline="dev", not release/, { hook: 'annotated', workload: 'annotated' });
  });

  test('Ed25519 and RSA keys (cosign import-key-pair): either of a hook\'s keys suffices; the ECDSA key it does not name does not', async () => {
    const where = { hook: 'anykey', workload: 'anykey' };
    for (const [tag, key, kind] of [['v10', 'ed', 'Ed25519'], ['v11', 'rsa', 'RSA 3072']]) {
      const digest = await pushImage(tag);
      await sign(key, digest);
      const res = await post(tag, digest, where);
      assert.equal(res.status, 200, res.body);
      assert.equal(await imageOf('anykey'), `${image(tag)}@${digest}`);
      assert.match(res.body, new RegExp(`is signed by ${kind} key ${fingerprint(path.join(work, `${key}.pub`))} \\(tag `));
    }
    const digest = await pushImage('v12');
    await sign('release', digest);
    await refused('v12', digest, new RegExp(`tag sha256-${digest.slice(7)}\\.sig, layer 1: not signed by a key VERIFY_SIGNATURE names \\(${fingerprint(path.join(work, 'ed.pub'))}, ` +
      `${fingerprint(path.join(work, 'rsa.pub'))}\\)`), where);
  });

  test('-validate shows each key\'s fingerprint, never the key; a private key given as the key fails the load, naming where', () => {
    const out = execFileSync(defaultBinary(), ['-validate', '-hooks', path.join(work, 'hooks.json')], { encoding: 'utf8' });
    const fp = fingerprint(path.join(work, 'release.pub'));
    assert.match(out, new RegExp(`signatures: cosign, signed by any of 1 key \\(ECDSA P-256 ${fp}\\); the tag is resolved`));
    assert.match(out, new RegExp(`signatures: cosign, signed by any of 1 key \\(ECDSA P-256 ${fp}\\), with pipeline=release;`));
    // SIGNATURE_WAIT: 10 minutes unless the hook says otherwise; 0 refuses a digest not signed yet at once.
    assert.match(out, /digest deployed; a digest not signed yet waits up to 10m0s for its signature \(SIGNATURE_WAIT\)$/m);
    assert.match(out, /digest deployed; a digest not signed yet waits up to 10s for its signature \(SIGNATURE_WAIT\)$/m);
    assert.match(out, /digest deployed; a digest not signed yet is refused at once \(SIGNATURE_WAIT\)$/m);
    const body = fs.readFileSync(path.join(work, 'release.pub'), 'utf8').split('\n')[1];
    assert.ok(!out.includes(body), out);
    const bad = JSON.parse(fs.readFileSync(path.join(work, 'hooks.json'), 'utf8')).slice(0, 1);
    bad[0]['pass-environment-to-command'].find((p: any) => p.envname === 'VERIFY_SIGNATURE').name = `cosign:${path.join(work, 'release.key')}`;
    fs.writeFileSync(path.join(work, 'bad.json'), JSON.stringify(bad, null, 1));
    let failed: any;
    try {
      execFileSync(defaultBinary(), ['-validate', '-hooks', path.join(work, 'bad.json')], { encoding: 'utf8', stdio: 'pipe' });
    } catch (e) {
      failed = e;
    }
    assert.ok(failed, 'the load fails');
    assert.match(failed.stderr, /bad\.json.*hook "signed".*pass-environment-to-command\[\d+\]\.name: VERIFY_SIGNATURE item 1: key file .*release\.key: PEM block 1 \(line 1\) is ENCRYPTED SIGSTORE PRIVATE KEY, not PUBLIC KEY/);
    assert.ok(!failed.stderr.includes(fs.readFileSync(path.join(work, 'release.key'), 'utf8').split('\n')[1]));
  });

  test('-print-rbac grants get on the pull secrets of a workload whose hook sets VERIFY_SIGNATURE alone', () => {
    const pinned = (name: string, value: string) => ({ match: { type: 'value', value, parameter: { source: 'url', name } } });
    const hook = registryHook('signed', { and: [pinned('ns', ns), pinned('workload', 'deployment/web')] }, 'distribution') as Record<string, object[]>;
    hook['pass-environment-to-command'].push(...fixedSettings({ VERIFY_SIGNATURE: `cosign:${path.join(work, 'release.pub')}` }));
    fs.writeFileSync(path.join(work, 'rbac.json'), JSON.stringify([hook]));
    const yaml = execFileSync(defaultBinary(), ['-print-rbac', '-hooks', path.join(work, 'rbac.json'), '-kubeconfig', cluster!.kubeconfigPath,
      '-rbac-service-account', 'cattle-system/webhook'], { encoding: 'utf8' });
    assert.match(yaml, /  - apiGroups: \[""\]\n    resources: \["secrets"\]\n    resourceNames: \["regcred"\]\n    verbs: \["get"\]/, yaml);
  });

  test('a registry that cannot be reached fails closed: VERIFY_SIGNATURE alone resolves the tag, and nothing changes', async () => {
    const { freePort } = await import('./harness.ts');
    const away = `127.0.0.1:${await freePort()}`;
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('away', [{ name: 'app', image: `${away}/acme/web:v1` }], { replicas: 1 })));
    const before = await stateOf('away');
    const res = await wh.request(`/hooks/signed?${new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/away', container: 'app' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/vnd.docker.distribution.events.v1+json' },
      body: JSON.stringify({ events: [{ action: 'push', timestamp: new Date().toISOString(),
        target: { mediaType: 'application/vnd.oci.image.manifest.v1+json', repository: 'acme/web', tag: 'v2', digest: `sha256:${'1'.repeat(64)}` },
        request: { host: away, method: 'PUT' } }] }),
    });
    assert.equal(res.status, 500, res.body);
    assert.match(res.body, new RegExp(`^result: +failed: VERIFY_IMAGE: could not resolve ${escape(away)}/acme/web:v2: .*; nothing was changed$`, 'm'));
    assert.equal(await stateOf('away'), before);
  });

  test('ON_REGISTRY_AWAY=keep: a push the registry cannot be asked about is kept (202) and deployed, signature checked, once it answers', async () => {
    const before = await stateOf('patient');
    await registry.down();
    let res: Awaited<ReturnType<typeof post>>;
    try {
      res = await post('v2', signedV2, { hook: 'patient', workload: 'patient' });
      assert.equal(res.status, 202, res.body);
      assert.match(res.body, new RegExp(`^action: +waiting for the registry \\(VERIFY_IMAGE: could not resolve ${escape(registry.host)}/acme/web:v2: ` +
        '.*ECONNREFUSED.*\\): kept, and applied when it answers until \\d{4}-', 'm'));
      assert.match(res.body, /^result: +ok$/m);
      assert.equal(await stateOf('patient'), before, 'nothing written while the registry is away');
      await waitForOutput(wh, new RegExp(`\\[${res.headers['x-request-id']}\\] .*: the registry does not answer; push kept until`));
    } finally {
      await registry.up();
    }
    const id = String(res.headers['x-request-id']);
    // Kept pushes are tried again every 5 s: the first try after the registry is back deploys the signed digest.
    await waitForOutput(wh, new RegExp(`\\[${id}\\] .*: the registry answered again; image updated`), 60_000);
    assert.equal(await imageOf('patient'), `${image('v2')}@${signedV2}`);
    // Done once its rollout is followed to the end: on a loaded machine that takes longer than the 30 s of a decision.
    const delivery = await deliveryOf(res, 90_000);
    assert.equal(delivery.decision, 'applied');
    // Only a registry that is away keeps a push: an unsigned digest is refused at once under the same hook.
    const unsigned = await pushImage('v9');
    await refused('v9', unsigned, /no cosign signature \(looked at .*\)/, { hook: 'patient', workload: 'patient' });
  });

  test('an approved push is checked again: an unsigned digest waiting under VERIFY_SIGNATURE and REQUIRE_APPROVAL is refused', async () => {
    // An entry the signature check never saw (sealed with the key: as a replica writes one for a hook that did not
    // verify signatures then), approved by a person through its link.
    const approvalKey = 'signed-images-approval-key-0c5d1e7a9b3f2d8c';
    const keyFile = path.join(work, 'approval-key');
    fs.writeFileSync(keyFile, approvalKey);
    const gated = registryHook('gated', { match: { type: 'value', value: TOKEN, parameter: { source: 'url', name: 'token' } } }, 'distribution') as Record<string, object[]>;
    gated['pass-environment-to-command'].push(...fixedSettings({ REGISTRY_CA: caFile, VERIFY_SIGNATURE: `cosign:${path.join(work, 'release.pub')}`, REQUIRE_APPROVAL: 'true' }));
    fs.writeFileSync(path.join(work, 'gated.json'), JSON.stringify([gated]));
    const d: Record<string, any> = deployment('gated', [{ name: 'app', image: image('v1') }], { replicas: 1 });
    d.spec.template.spec.imagePullSecrets = [{ name: 'regcred' }];
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(d));
    const svc = await startWebhook({ hooks: path.join(work, 'gated.json'), env: { KUBECONFIG: cluster!.kubeconfigPath },
      args: ['-public-url', 'https://webhook.example.test', '-approval-key-file', keyFile, '-rollout-follow', '0s'] });
    try {
      const unsigned = await pushImage('v21');
      const ref = `${image('v21')}@${unsigned}`;
      const now = new Date().toISOString();
      const until = new Date(Date.now() + 3_600_000).toISOString();
      const entry = sealPendingEntry(Buffer.from(approvalKey), { cluster: undefined, namespace: ns, kind: 'deployment', name: 'gated', container: 'app' }, {
        id: 'unchecked-1', hook: 'gated', request: 'unchecked-1', image: ref, push: `${unsigned}|${now}`, pushedAt: now,
        timeFrom: 'payload', receivedAt: now, waitsFor: 'approval', until, decides: 'whoever opens its links' });
      await kubectl(['-n', ns, 'annotate', 'deployment/gated', `webhook/pending=${JSON.stringify({ app: entry })}`]);
      const token = approvalToken(Buffer.from(approvalKey), {
        namespace: ns, kind: 'deployment', name: 'gated', container: 'app', id: entry.id, hook: 'gated', image: ref, action: 'approve', exp: Date.parse(until) });
      const res = await svc.request(`/approval/${token}`, { method: 'POST', body: 'name=Qian', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
      assert.equal(res.status, 500, res.body);
      assert.match(res.body, new RegExp(`signature: ${escape(`${registry.host}/acme/web@${unsigned}`)} is not signed as VERIFY_SIGNATURE requires: no cosign signature`));
      assert.equal(await imageOf('gated'), image('v1'));
    } finally {
      await svc.stop();
    }
  });

  test('"Deploy again" checks the signature as the hook asks now: refused under another key, deployed again under the signing one', async () => {
    const admin = await adminPort(wh);
    const deliveries = async () => JSON.parse((await httpRequest(admin, '/deliveries.json')).body).deliveries as any[];
    const past = (await deliveries()).find((d) => d.decision === 'applied' && d.workload === 'deployment/web' && d.image_after === `${image('v2')}@${signedV2}`);
    assert.ok(past, 'the signed push of v2 is on the page');
    const replay = () => httpRequest(admin, '/deliveries/replay', { method: 'POST', body: `seq=${past.seq}&name=Ops+Ma&action=replay`,
      headers: { 'Content-Type': 'application/x-www-form-urlencoded', Origin: `http://127.0.0.1:${admin}` } });
    const reload = async (text: string) => {
      const reloads = wh.output().split('reloaded ').length;
      fs.writeFileSync(path.join(work, 'hooks.json'), text);
      wh.proc.kill('SIGHUP');
      await waitFor(() => wh.output().split('reloaded ').length > reloads, { what: 'the hooks reloaded' });
    };
    const hooks = fs.readFileSync(path.join(work, 'hooks.json'), 'utf8');
    await kubectl(['-n', ns, 'set', 'image', 'deployment/web', `app=${image('v1')}`]);
    // The hook now trusts another key only: the past push is signed by a key it no longer names.
    await reload(hooks.replaceAll(path.join(work, 'release.pub'), path.join(work, 'other.pub')));
    try {
      const refusedAgain = await replay();
      assert.equal(refusedAgain.status, 500, refusedAgain.body);
      assert.match(refusedAgain.body, new RegExp(`signature: ${escape(`${registry.host}/acme/web@${signedV2}`)} is not signed as VERIFY_SIGNATURE requires: .*not signed by a key VERIFY_SIGNATURE names`));
      assert.equal(await imageOf(), image('v1'), 'nothing deployed');
    } finally {
      await reload(hooks);
    }
    const again = await replay();
    assert.equal(again.status, 200, again.body);
    assert.match(again.body, new RegExp(`note: +signature: ${escape(`${registry.host}/acme/web@${signedV2}`)} is signed by ECDSA P-256 key`));
    assert.equal(await imageOf(), `${image('v2')}@${signedV2}`);
  });

  describe('SIGNATURE_WAIT: a push made before its signature waits for it (CI pushes, then signs)', () => {
    const pendingOf = async (workload: string) => {
      const raw = JSON.parse(await kubectl(['-n', ns, 'get', `deployment/${workload}`, '-o', 'json'])).metadata.annotations?.['webhook/pending'];
      return raw === undefined ? undefined : JSON.parse(raw).app;
    };
    /** The push of acme/web:<tag> at a digest not signed yet, to hook and deployment `workload`: kept waiting (202). */
    const waiting = async (tag: string, digest: string, workload: string, { hook = workload, via = wh } = {}) => {
      const before = await stateOf(workload);
      const res = await post(tag, digest, { hook, workload, via });
      assert.equal(res.status, 202, res.body);
      assert.match(res.body, /^action: +waiting for its signature until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/m);
      assert.equal(await stateOf(workload), before, 'nothing deployed while it waits');
      const entry = await pendingOf(workload);
      assert.deepEqual([entry?.waitsFor, entry?.image], ['signature', `${image(tag)}@${digest}`]);
      const delivery = await deliveryOf(res, 30_000, via);
      assert.equal(delivery.decision, 'waiting: signature');
      assert.equal(delivery.waiting.for, 'signature');
      return res;
    };
    /** What the registry announces once cosign stored the signature of `digest`: the push of its sha256-<hex>.sig tag. */
    const postSignature = async (digest: string, workload: string, via = wh) => {
      const tag = `${digest.replace(':', '-')}.sig`;
      return post(tag, await digestOf(tag), { hook: workload, workload, via });
    };
    /** The record, on `at`'s deliveries page, of the push of `digest` to deployment/<workload> decided `decision`. */
    const findRecord = async (at: Webhook, workload: string, decision: string, digest: string) =>
      (JSON.parse((await httpRequest(await adminPort(at), '/deliveries.json')).body).deliveries as any[]).find((d) =>
        d.state === 'done' && d.workload === `deployment/${workload}` && d.decision === decision && JSON.stringify(d).includes(digest));
    const recordOf = (at: Webhook, workload: string, decision: string, digest: string, timeoutMs: number) =>
      waitFor(() => findRecord(at, workload, decision, digest), { timeoutMs, what: `a record "${decision}" of ${digest} on deployment/${workload}` });

    test('the signature\'s push deploys the waiting digest, on a replica that did not answer the push (started before it)', async () => {
      // Another replica, which never saw the push: the waiting push lives on the workload, not in a replica's memory.
      const other = await startWebhook({ hooks: path.join(work, 'hooks.json'), env: { KUBECONFIG: cluster!.kubeconfigPath }, metrics: true,
        args: ['-deliveries', '50', ...sealing] });
      try {
        const digest = await pushImage('w1');
        await waiting('w1', digest, 'waits');
        await sign('release', digest);
        const sig = await postSignature(digest, 'waits', other);
        assert.equal(sig.status, 200, sig.body);
        assert.match(sig.body, /^action: +none \(tag "sha256-[0-9a-f]{64}\.sig" is a signature, attestation or SBOM, not an image\)$/m);
        // Well within the minute after which a waiting push is looked at again anyway: the signature's push did it.
        const applied = await recordOf(other, 'waits', 'applied', digest, 30_000);
        assert.match(applied.report, /its signature was found \(its signature's push, request [0-9a-f-]+\)/);
        assert.match(applied.report, new RegExp(`signature: ${escape(`${registry.host}/acme/web@${digest}`)} is signed by ECDSA P-256 key`));
        assert.equal(await imageOf('waits'), `${image('w1')}@${digest}`);
        assert.equal(await pendingOf('waits'), undefined, 'its entry is taken off');
      } finally {
        await other.stop();
      }
    });

    test('signed, but its signature never announced: deployed when its wait ends (SIGNATURE_WAIT=10s)', async () => {
      const digest = await pushImage('w2');
      await waiting('w2', digest, 'brief');
      await sign('release', digest);
      const applied = await recordOf(wh, 'brief', 'applied', digest, 90_000);
      assert.match(applied.report, /its signature was found \(the end of its SIGNATURE_WAIT\)/);
      assert.equal(await imageOf('brief'), `${image('w2')}@${digest}`);
      assert.equal(await pendingOf('brief'), undefined, 'its entry is taken off');
    });

    test('never signed: refused (refused: unsigned) when its wait ends, its entry taken off, nothing deployed', async () => {
      const digest = await pushImage('w3');
      const before = await stateOf('brief');
      await waiting('w3', digest, 'brief');
      const refusal = await recordOf(wh, 'brief', 'refused: unsigned', digest, 90_000);
      assert.match(refusal.detail, new RegExp(`^signature: ${escape(`${registry.host}/acme/web@${digest}`)} is not signed as VERIFY_SIGNATURE requires: ` +
        'no cosign signature \\(looked at .*\\), and none came within SIGNATURE_WAIT \\(by \\d{4}-[^)]+\\); nothing was changed$'));
      assert.equal(await stateOf('brief'), before);
      assert.equal(await pendingOf('brief'), undefined, 'its entry is taken off');
      const events = async () => (JSON.parse(await kubectl(['-n', ns, 'get', 'events', '--field-selector', 'involvedObject.name=brief,reason=UpgradeRefused', '-o', 'json'])).items as any[])
        .filter((e) => e.type === 'Warning' && e.message.includes(`acme/web@${digest} is not signed`) && e.message.includes('none came within SIGNATURE_WAIT'));
      await waitFor(async () => (await events()).length > 0, { timeoutMs: 30_000, what: 'the UpgradeRefused Event' });
    });

    test('a replica started since finds a push waiting on a watched workload, and deploys it at a look once signed', async () => {
      // Hook "watching" (as "waits") is loaded only by these two replicas: the test's main service neither watches nor
      // completes the push.
      const hooksFile = path.join(work, 'watching.json');
      const waits = JSON.parse(fs.readFileSync(path.join(work, 'hooks.json'), 'utf8')).find((h: any) => h.id === 'waits');
      // Its workload names it by annotation (a watch): it lists the test's namespace as one whose workloads may.
      const annotated = { ...waits, id: 'watching', 'pass-environment-to-command': [...waits['pass-environment-to-command'],
        { envname: 'ANNOTATION_NAMESPACES', source: 'string', name: ns }] };
      fs.writeFileSync(hooksFile, JSON.stringify([annotated]));
      const d: Record<string, any> = deployment('watched', [{ name: 'app', image: image('v1') }], { replicas: 1 });
      d.metadata.annotations = { 'webhook/poll': '2s', 'webhook/hook': 'watching' };
      d.spec.template.spec.imagePullSecrets = [{ name: 'regcred' }];
      await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(d));
      const options = { hooks: hooksFile, env: { KUBECONFIG: cluster!.kubeconfigPath }, metrics: true, args: ['-deliveries', '50', '-poll-min-interval', '1s', ...sealing] };
      const digest = await pushImage('w10');
      // The replica that answered the push is gone before it is signed; no signature's push is announced.
      const answering = await startWebhook(options);
      try {
        await waiting('w10', digest, 'watched', { hook: 'watching', via: answering });
      } finally {
        await answering.stop();
      }
      await sign('release', digest);
      const watcher = await startWebhook(options);
      try {
        // Within its first looks (every 2 s), well before the minute after which a known waiting push is looked at.
        const applied = await recordOf(watcher, 'watched', 'applied', digest, 45_000);
        assert.match(applied.report, /its signature was found \(the registry watch\)/);
        assert.equal(await imageOf('watched'), `${image('w10')}@${digest}`);
        assert.equal(await pendingOf('watched'), undefined, 'its entry is taken off');
      } finally {
        await watcher.stop();
      }
    });

    test('a signature stored as a referrer: the push of its referrers index (tag sha256-<hex>) deploys the waiting digest', async () => {
      const digest = await pushImage('w12');
      await waiting('w12', digest, 'waits');
      await sign('release', digest, ['--registry-referrers-mode=oci-1-1']);
      // Distribution 2.8 has no referrers API: cosign lists the signature in the referrers tag schema's index.
      const index = digest.replace(':', '-');
      const res = await post(index, await digestOf(index), { hook: 'waits', workload: 'waits' });
      assert.equal(res.status, 200, res.body);
      assert.match(res.body, /^action: +none \(tag "sha256-[0-9a-f]{64}" is a referrers index \(signatures and attestations of a digest\), not an image\)$/m);
      const applied = await recordOf(wh, 'waits', 'applied', digest, 30_000);
      assert.match(applied.report, /its signature was found \(its signature's push, request [0-9a-f-]+\)/);
      assert.match(applied.report, /is signed by ECDSA P-256 key sha256:[0-9a-f]{64} \(referrer sha256:[0-9a-f]{64}, layer 1\)/);
      assert.equal(await imageOf('waits'), `${image('w12')}@${digest}`);
    });

    test('under SIGNATURE_WAIT, a wrong key, a copied signature and a tag moved are refused at once (500), none kept waiting', async () => {
      const where = { hook: 'waits', workload: 'waits' };
      // The wait is in force (10 minutes): a digest not signed yet waits; what follows is refused at once, and
      // leaves it waiting.
      const unsigned = await pushImage('w3a');
      await waiting('w3a', unsigned, 'waits');
      const wrong = await pushImage('w4');
      await sign('other', wrong);
      await refused('w4', wrong, new RegExp(`tag sha256-[0-9a-f]{64}\\.sig, layer 1: not signed by a key VERIFY_SIGNATURE names \\(${fingerprint(path.join(work, 'release.pub'))}\\)`), where);
      const copied = await pushImage('w5');
      const tag = (d: string) => `docker://${registry.host}/acme/web:${d.replace(':', '-')}.sig`;
      const creds = `${LOGIN.user}:${LOGIN.password}`;
      await run('skopeo', ['copy', '--quiet', '--src-cert-dir', certDir, '--dest-cert-dir', certDir, '--src-creds', creds, '--dest-creds', creds,
        tag(signedV2), tag(copied)], { timeout: COSIGN_TIMEOUT_MS });
      await refused('w5', copied, /tag sha256-[0-9a-f]{64}\.sig, layer 1: signed by sha256:[0-9a-f]{64}, but for "sha256:[0-9a-f]{64}", not this digest \(a signature copied from another image\)/, where);
      const signed = await pushImage('w6');
      await sign('release', signed);
      const moved = await pushImage('w6');
      const late = await post('w6', signed, where);
      assert.equal(late.status, 500, late.body);
      assert.match(late.body, new RegExp(`failed: VERIFY_IMAGE: the payload announced ${signed} but the registry's .*acme/web:w6 is ${moved}; nothing was changed`));
      assert.equal((await pendingOf('waits'))?.image, `${image('w3a')}@${unsigned}`, 'none of them kept waiting');
    });

    test('a signature by another key, announced for a waiting push, refuses it at once; a newer push replaces a waiting one', async () => {
      const digest = await pushImage('w7');
      await waiting('w7', digest, 'waits');
      await sign('other', digest);
      await postSignature(digest, 'waits');
      const refusal = await recordOf(wh, 'waits', 'refused: unsigned', digest, 30_000);
      assert.match(refusal.detail, /layer 1: not signed by a key VERIFY_SIGNATURE names/);
      assert.equal(await pendingOf('waits'), undefined, 'its entry is taken off');
      // Newest wins: the push waiting for its signature is replaced by a newer one, and reported superseded.
      const older = await pushImage('w8');
      const first = await waiting('w8', older, 'waits');
      const newer = await pushImage('w9');
      const second = await waiting('w9', newer, 'waits');
      assert.match(second.body, new RegExp(`^note: +the waiting push of ${escape(`${image('w8')}@${older}`)} \\(request ${first.headers['x-request-id']}, pushed at [^)]+\\) is superseded$`, 'm'));
      // Published as schema 1 names a superseded push: no-op.
      const superseded = await recordOf(wh, 'waits', 'no-op', newer, 30_000);
      assert.equal(superseded.request_id, first.headers['x-request-id']);
      assert.match(superseded.detail, new RegExp(`^superseded: a newer push, ${escape(`${image('w9')}@${newer}`)} \\(request ${second.headers['x-request-id']}\\), replaced it while it waited$`));
      // The digest waiting, announced again (a registry's retry, a registry watch's look): it waits on as it is.
      const again = await post('w9', newer, { hook: 'waits', workload: 'waits' });
      assert.equal(again.status, 200, again.body);
      assert.match(again.body, /^action: +none \(the same digest is waiting already: waiting for its signature until [^)]+\)$/m);
      assert.equal((await pendingOf('waits'))?.request, second.headers['x-request-id']);
    });

    test('a look that fails within the wait (the registry away) leaves the push waiting; the next one deploys it', async () => {
      const digest = await pushImage('w11');
      await waiting('w11', digest, 'waits');
      await sign('release', digest);
      const tag = `${digest.replace(':', '-')}.sig`;
      const announced = await digestOf(tag);
      await registry.down();
      try {
        const sig = await post(tag, announced, { hook: 'waits', workload: 'waits' });
        assert.equal(sig.status, 200, sig.body);
        await waitForOutput(wh, new RegExp(`the push of ${escape(`${image('w11')}@${digest}`)} waiting for its signature: ` +
          'signature: could not read the signatures .*; looked at again later'), 60_000);
        assert.equal((await pendingOf('waits'))?.image, `${image('w11')}@${digest}`, 'still waiting');
      } finally {
        await registry.up();
      }
      // Announced again, as a registry retries (once a second here): one delivery within 5 s of the last look is
      // acknowledged without another look, so the first few may find it looked at a moment ago.
      let announcedAt = 0;
      const applied = await waitFor(async () => {
        if (Date.now() - announcedAt >= 1_000) {
          announcedAt = Date.now();
          assert.equal((await post(tag, announced, { hook: 'waits', workload: 'waits' })).status, 200);
        }
        return findRecord(wh, 'waits', 'applied', digest);
      }, { timeoutMs: 30_000, what: `the deployment of ${digest} once its signature is announced again` });
      assert.match(applied.report, /its signature was found \(its signature's push, request [0-9a-f-]+\)/);
      assert.equal(await imageOf('waits'), `${image('w11')}@${digest}`);
    });
  });

  test('the registry login and the key password never appear in the output', () => {
    for (const secret of [LOGIN.password, Buffer.from(`${LOGIN.user}:${LOGIN.password}`).toString('base64'), KEY_PASSWORD])
      assert.ok(!wh.output().includes(secret), 'a secret in the output');
  });
});
