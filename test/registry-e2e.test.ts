/*
 * End to end with real registries' events, through the built executable, on the real test cluster.
 *
 * A real CNCF Distribution registry (Debian's docker-registry, test/registry.ts) is started on
 * loopback with its notifications pointed at dist/webhook; skopeo pushes OCI archives this test
 * builds. The registry's own envelopes (no hand-written payload) upgrade a Deployment: a push of a
 * tag upgrades it, a multi-arch push (blobs, untagged per-platform manifests, the tagged index,
 * each its own envelope) upgrades it once, and a pull changes nothing.
 *
 * Harbor, GHCR and Azure Event Grid cannot run here; their documented payloads (fixtures/upgrade)
 * are sent over HTTP through the README's ready hooks: Harbor's Authorization header (value
 * rule), GitHub's X-Hub-Signature-256 (payload-hmac-sha256), Event Grid's validation handshake.
 *
 * The registry is required: when it cannot be installed or started the tests fail (with CI set, or
 * anywhere: a registry is a Debian package, unlike the cluster). Outside CI the cluster tests skip
 * when the cluster cannot start, like the other cluster tests.
 */
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { makeTempDir, startWebhook, waitFor, waitForOutput, type Spawned, type Webhook } from './harness.ts';
import { ociArchive, startRegistry, type Registry } from './registry.ts';
import {
  clusterOrSkip, containerImage, deployment, freshNamespaceName, kubectlFor, namespacedGetter, pushedState,
  removeNamespace,
} from './cluster/kube.ts';
import { registryHook } from './upgrade-hooks.ts';
import { loginFromPullSecret } from '../webhook.ts';

const REPO = path.join(import.meta.dirname, '..');
const FIXTURES = path.join(REPO, 'test', 'fixtures', 'upgrade');
const TOKEN = 'registry-e2e-token-5d1c';
// Secrets the hooks read through -template: none may appear in the service's output.
const SECRETS = {
  REGISTRY_AUTH: 'Bearer distribution-notify-2b9f7e',
  HARBOR_AUTH: 'harbor-auth-header-71c3a0',
  GITHUB_SECRET: 'github-hmac-secret-9e44d1',
  GITEA_SECRET: 'gitea-hmac-secret-0c7d2a',
  NEXUS_SECRET: 'nexus-hmac-secret-4f18b6',
};
const cluster = await clusterOrSkip();


function withEnv(hook: object, env: Record<string, string>): object {
  const h = hook as Record<string, unknown[]>;
  h['pass-environment-to-command'].push(...Object.entries(env).map(([envname, name]) => ({ envname, source: 'string', name })));
  return h;
}

const headerValue = (name: string, secret: string) => ({
  match: { type: 'value', value: `{{ getenv "${secret}" }}`, parameter: { source: 'header', name } },
});
const urlToken = { match: { type: 'value', value: '{{ getenv "HOOK_TOKEN" }}', parameter: { source: 'url', name: 'token' } } };

function hooksFile(): string {
  const dir = makeTempDir('registry-e2e-hooks-');
  const file = path.join(dir, 'hooks.json');
  fs.writeFileSync(file, JSON.stringify([
    registryHook('distribution', headerValue('Authorization', 'REGISTRY_AUTH'), 'distribution'),
    registryHook('harbor', headerValue('Authorization', 'HARBOR_AUTH'), 'harbor'),
    registryHook('ghcr', { match: { type: 'payload-hmac-sha256', secret: '{{ getenv "GITHUB_SECRET" }}', parameter: { source: 'header', name: 'X-Hub-Signature-256' } } }, 'ghcr'),
    registryHook('azure', urlToken, 'azure'),
    // Event Grid's CloudEvents schema validates an endpoint with OPTIONS first (abuse protection).
    { ...registryHook('azure-cloudevents', urlToken, 'cloudevents'), 'http-methods': ['POST', 'OPTIONS'],
      'response-headers': [{ name: 'WebHook-Allowed-Origin', value: 'eventgrid.azure.net' }] },
    registryHook('gitea', { match: { type: 'payload-hmac-sha256', secret: '{{ getenv "GITEA_SECRET" }}', parameter: { source: 'header', name: 'X-Gitea-Signature' } } }, 'gitea'),
    withEnv(registryHook('nexus', { match: { type: 'payload-hmac-sha1', secret: '{{ getenv "NEXUS_SECRET" }}', parameter: { source: 'header', name: 'X-Nexus-Webhook-Signature' } } }, 'nexus'),
      { REGISTRY_HOST: 'nexus.example.com:8082' }),
  ], null, 1));
  return file;
}

/**
 * A registry over TLS (with `auth` when given) whose events go to the hook `verified` (VERIFY_IMAGE,
 * REGISTRY_CA the registry's CA) of a started service, for deployment/web in `ns`.
 */
async function verifiedService(ns: string, work: string, auth?: { user: string; password: string; token?: boolean; realmHost?: string }) {
  const { spawnWebhook, freePort, httpRequest } = await import('./harness.ts');
  const port = await freePort();
  const query = new URLSearchParams({ ns, workload: 'deployment/web', container: 'app' });
  const registry = await startRegistry({
    tls: true,
    ...(auth ? { auth } : {}),
    notify: { url: `http://127.0.0.1:${port}/hooks/verified?${query}`, headers: { Authorization: SECRETS.REGISTRY_AUTH } },
  });
  const caFile = path.join(work, 'registry-ca.pem');
  fs.writeFileSync(caFile, registry.caPem!);
  const hook = withEnv(registryHook('verified', headerValue('Authorization', 'REGISTRY_AUTH'), 'distribution'), { VERIFY_IMAGE: 'true', REGISTRY_CA: caFile });
  fs.writeFileSync(path.join(work, 'hooks.json'), JSON.stringify([hook]));
  const s = await spawnWebhook({ hooks: path.join(work, 'hooks.json'), env: { WEBHOOK_CMD: '-template', KUBECONFIG: cluster!.kubeconfigPath, ...SECRETS } }, port);
  await waitFor(async () => (await httpRequest(port, '/').catch(() => undefined))?.status === 200, { timeoutMs: 10_000, what: 'the service' });
  const stop = async () => { s.proc.kill('SIGTERM'); return s.exited; };
  return { registry, service: s, port, stop };
}

describe('which login of a pull secret a registry gets', () => {
  const secret = (auths: Record<string, unknown>) =>
    ({ data: { '.dockerconfigjson': Buffer.from(JSON.stringify({ auths })).toString('base64') } });
  const auth = (user: string, password: string) => ({ auth: Buffer.from(`${user}:${password}`).toString('base64') });

  test('Docker Hub as docker login writes it (https://index.docker.io/v1/) serves registry-1.docker.io; no other host', () => {
    const hub = secret({ 'https://index.docker.io/v1/': auth('hubuser', 'hub-pass') });
    assert.deepEqual(loginFromPullSecret(hub, 'registry-1.docker.io', 'regcred'), { user: 'hubuser', password: 'hub-pass', secret: 'regcred' });
    assert.equal(loginFromPullSecret(hub, 'ghcr.io', 'regcred'), undefined);
    const own = secret({ 'https://reg.example.com/v2/': auth('u', 'p'), 'docker.io': auth('d', 'q') });
    assert.equal(loginFromPullSecret(own, 'reg.example.com', 'x')?.user, 'u');
    assert.equal(loginFromPullSecret(own, 'registry-1.docker.io', 'x')?.user, 'd');
    assert.equal(loginFromPullSecret(own, 'evil.reg.example.com', 'x'), undefined);
  });
});

describe('real registry events and registry payloads through the executable', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('registry-e2e');
  const kubectl = kubectlFor(cluster!);
  const getJson = namespacedGetter(kubectl, ns);
  let wh: Webhook;
  let registry: Registry;
  let work: string;
  const query = (name: string, more: Record<string, string> = {}) =>
    new URLSearchParams({ ns, workload: `deployment/${name}`, container: 'app', ...more }).toString();

  before(async () => {
    work = makeTempDir('registry-e2e-');
    wh = await startWebhook({
      hooks: hooksFile(),
      env: { WEBHOOK_CMD: '-template', HOOK_TOKEN: TOKEN, KUBECONFIG: cluster!.kubeconfigPath, ...SECRETS },
    });
    registry = await startRegistry({
      notify: { url: `${wh.url}/hooks/distribution?${query('web')}`, headers: { Authorization: SECRETS.REGISTRY_AUTH } },
    });
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
      deployment('web', [{ name: 'app', image: `${registry.host}/acme/web:v1` }], { replicas: 1 }),
      deployment('harbor', [{ name: 'app', image: 'hub.harbor.com/test-webhook/debian:old' }], { replicas: 1 }),
      deployment('ghcr', [{ name: 'app', image: 'ghcr.io/myorg/my-service:v0' }], { replicas: 1 }),
      deployment('gitea', [{ name: 'app', image: 'localhost:3000/user1/giteacontainer:v0' }], { replicas: 1 }),
      deployment('acr', [{ name: 'app', image: 'demo.azurecr.io/aci-helloworld:v0' }], { replicas: 1 }),
      deployment('nexus', [{ name: 'app', image: 'nexus.example.com:8082/app1/alpine:3.3' }], { replicas: 1 }),
    ] }));
  });
  after(async () => {
    await registry?.stop();
    await wh?.stop();
    await removeNamespace(kubectl, ns);
  });

  const imageOf = async (name: string) => containerImage(await getJson(`deployment/${name}`), 'app');
  /** Reports the service logged for pushes of `ref` that changed the image. */
  const updatesTo = (ref: string) =>
    wh.output().split(`image after:  ${ref}\naction:       image updated`).length - 1;

  test('the registry\'s own events: a tag push upgrades, a multi-arch push upgrades once, a pull changes nothing', async () => {
    await registry.push(ociArchive(work, 'v2').path, 'acme/web:v2');
    await waitFor(async () => (await imageOf('web')) === `${registry.host}/acme/web:v2`, { timeoutMs: 60_000, what: 'the v2 push to land' });

    const multi = ociArchive(work, 'v3', [{ os: 'linux', architecture: 'amd64' }, { os: 'linux', architecture: 'arm64' }]);
    await registry.push(multi.path, 'acme/web:v3', { all: true });
    await waitFor(async () => (await imageOf('web')) === `${registry.host}/acme/web:v3`, { timeoutMs: 60_000, what: 'the v3 push to land' });
    const state = pushedState(await getJson('deployment/web'));

    // The registry sends one envelope at a time: once the pull's is answered, every earlier one was.
    await registry.pull('acme/web:v3');
    await waitForOutput(wh, 'no push of a tagged manifest in the envelope (pull of a manifest)', 60_000);
    await waitForOutput(wh, 'no push of a tagged manifest in the envelope (push of an untagged manifest)', 60_000);
    await waitForOutput(wh, 'no push of a tagged manifest in the envelope (push of a blob)', 60_000);
    assert.equal(updatesTo(`${registry.host}/acme/web:v3`), 1, wh.output());
    const after = await getJson('deployment/web');
    assert.equal(pushedState(after), state, 'the pull changed the Deployment');
    assert.equal(containerImage(after, 'app'), `${registry.host}/acme/web:v3`);
    // The Event is recorded after the answer: wait for it, then there must be exactly one.
    const updated = async () => {
      const events = JSON.parse(await kubectl(['-n', ns, 'get', 'events', '--field-selector', 'involvedObject.name=web,reason=ImageUpdated', '-o', 'json']));
      return (events.items as { message: string }[]).map((e) => e.message).filter((m) => m.includes('/acme/web:v3;'));
    };
    await waitFor(async () => (await updated()).length > 0, { timeoutMs: 30_000, what: 'the ImageUpdated Event' });
    assert.equal((await updated()).length, 1, (await updated()).join('\n'));
  });

  test('Harbor through its Authorization header: the wrong value changes nothing, the right one upgrades', async () => {
    const body = fs.readFileSync(path.join(FIXTURES, 'harbor-push-artifact.json'), 'utf8');
    const post = (auth: string) => wh.request(`/hooks/harbor?${query('harbor')}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: auth }, body,
    });
    const refused = await post('not-the-header');
    assert.equal(refused.status, 401, refused.body);
    assert.equal(await imageOf('harbor'), 'hub.harbor.com/test-webhook/debian:old');
    const res = await post(SECRETS.HARBOR_AUTH);
    assert.equal(res.status, 200, res.body);
    assert.match(res.body, /^action: +image updated$/m);
    assert.equal(await imageOf('harbor'), 'hub.harbor.com/test-webhook/debian:latest');
  });

  test('GHCR through X-Hub-Signature-256: a bad signature is refused, a ping is a no-op, a tagged version upgrades', async () => {
    const body = fs.readFileSync(path.join(FIXTURES, 'ghcr-package-published.json'), 'utf8');
    const sign = (text: string) => `sha256=${createHmac('sha256', SECRETS.GITHUB_SECRET).update(text).digest('hex')}`;
    const post = (event: string, signature: string, text = body) => wh.request(`/hooks/ghcr?${query('ghcr')}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json', 'X-GitHub-Event': event, 'X-Hub-Signature-256': signature }, body: text,
    });
    const forged = await post('package', sign(`${body} `));
    assert.equal(forged.status, 500, forged.body);
    assert.equal(forged.body, 'Error occurred while evaluating hook rules.');
    const ping = '{"zen":"Design for failure.","hook_id":1}';
    const pinged = await post('ping', sign(ping), ping);
    assert.equal(pinged.status, 200, pinged.body);
    assert.match(pinged.body, /^action: +none \(GitHub event "ping" is not a package event\)$/m);
    assert.equal(await imageOf('ghcr'), 'ghcr.io/myorg/my-service:v0');
    const res = await post('package', sign(body));
    assert.equal(res.status, 200, res.body);
    assert.equal(await imageOf('ghcr'), 'ghcr.io/myorg/my-service:latest');
  });

  test('Gitea and Nexus sign without a prefix (X-Gitea-Signature, X-Nexus-Webhook-Signature): the rules check it as it is', async () => {
    for (const [name, file, header, algorithm, secret, extra, image] of [
      ['gitea', 'gitea-package-created.json', 'X-Gitea-Signature', 'sha256', SECRETS.GITEA_SECRET, { 'X-Gitea-Event': 'package', 'X-GitHub-Event': 'package' }, 'localhost:3000/user1/giteacontainer:latest'],
      ['nexus', 'nexus-component-created.json', 'X-Nexus-Webhook-Signature', 'sha1', SECRETS.NEXUS_SECRET, { 'X-Nexus-Webhook-Id': 'rm:repository:component' }, 'nexus.example.com:8082/app1/alpine:3.4'],
    ] as const) {
      const body = fs.readFileSync(path.join(FIXTURES, file), 'utf8');
      const post = (signature: string) => wh.request(`/hooks/${name}?${query(name)}`, {
        method: 'POST', headers: { 'Content-Type': 'application/json', ...extra, [header]: signature }, body,
      });
      const good = createHmac(algorithm, secret).update(body).digest('hex');
      const forged = await post(createHmac(algorithm, 'not-the-secret').update(body).digest('hex'));
      assert.equal(forged.status, 500, `${name}: ${forged.body}`);
      assert.notEqual(await imageOf(name), image);
      const res = await post(good);
      assert.equal(res.status, 200, `${name}: ${res.body}`);
      assert.equal(await imageOf(name), image);
    }
  });

  test('Event Grid\'s subscription validation is answered as Azure requires', async () => {
    const body = fs.readFileSync(path.join(FIXTURES, 'azure-eventgrid-validation.json'), 'utf8');
    const res = await wh.request(`/hooks/azure?${query('harbor', { token: TOKEN })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json', 'aeg-event-type': 'SubscriptionValidation' }, body,
    });
    assert.equal(res.status, 200, res.body);
    assert.deepEqual(JSON.parse(res.body), { validationResponse: '512d38b6-c7b8-40c8-89fe-f46f9e9622b6' });
  });

  test('Event Grid\'s CloudEvents schema: the OPTIONS validation is allowed, then an ImagePushed event upgrades', async () => {
    const pushed = (fixture: string) => JSON.parse(fs.readFileSync(path.join(FIXTURES, fixture), 'utf8'));
    const url = `/hooks/azure-cloudevents?${query('acr', { token: TOKEN })}`;
    const options = await wh.request(url, { method: 'OPTIONS', headers: { 'WebHook-Request-Origin': 'eventgrid.azure.net' } });
    assert.equal(options.status, 200, options.body);
    assert.equal(options.headers['webhook-allowed-origin'], 'eventgrid.azure.net');
    assert.match(options.body, /^action: +none \(CloudEvents webhook validation from "eventgrid\.azure\.net"/m);
    assert.equal(await imageOf('acr'), 'demo.azurecr.io/aci-helloworld:v0');
    const event = pushed('azure-eventgrid-image-pushed.json')[0];
    const res = await wh.request(url, { method: 'POST', headers: { 'Content-Type': 'application/cloudevents+json; charset=utf-8' }, body: JSON.stringify(event) });
    assert.equal(res.status, 200, res.body);
    assert.equal(await imageOf('acr'), 'demo.azurecr.io/aci-helloworld:v1');
  });

  test('no secret of the hooks appears in the service\'s output', () => {
    for (const secret of Object.values(SECRETS)) assert.ok(!wh.output().includes(secret), `${secret} leaked:\n${wh.output()}`);
    assert.ok(!wh.output().includes(TOKEN), 'the URL token leaked');
  });
});

describe('VERIFY_IMAGE against a real registry with htpasswd over TLS', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('registry-verify');
  const kubectl = kubectlFor(cluster!);
  const getJson = namespacedGetter(kubectl, ns);
  const LOGIN = { user: 'pusher', password: 'pull-secret-password-c81f3e' };
  let wh: Webhook;
  let registry: Registry;
  let work: string;
  let v2Digest = '';
  const query = (name: string) => new URLSearchParams({ ns, workload: `deployment/${name}`, container: 'app' }).toString();
  const imageOf = async (name: string) => containerImage(await getJson(`deployment/${name}`), 'app');

  before(async () => {
    work = makeTempDir('registry-verify-');
    // The registry's URL is known only once it runs: the hooks are written after, then the service started.
    const started = await verifiedService(ns, makeTempDir('registry-verify-hooks-'), LOGIN);
    registry = started.registry;
    const { port, service, stop } = started;
    const { httpRequest } = await import('./harness.ts');
    wh = { ...service, url: `http://127.0.0.1:${port}`, request: (p, o) => httpRequest(port, p, o), metrics: async () => { throw new Error('no metrics'); }, stop };
    const dockerconfig = { auths: { [registry.host]: { username: LOGIN.user, password: LOGIN.password,
      auth: Buffer.from(`${LOGIN.user}:${LOGIN.password}`).toString('base64') } } };
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
      { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'regcred' }, type: 'kubernetes.io/dockerconfigjson',
        data: { '.dockerconfigjson': Buffer.from(JSON.stringify(dockerconfig)).toString('base64') } },
      deployment('web', [{ name: 'app', image: `${registry.host}/acme/web:v1` }], { replicas: 1 }),
      deployment('nologin', [{ name: 'app', image: `${registry.host}/acme/web:v1` }], { replicas: 1 }),
    ] }));
    // imagePullSecrets sit in the pod template (deployment() does not take them).
    await kubectl(['-n', ns, 'patch', 'deployment/web', '--type=json', '-p',
      JSON.stringify([{ op: 'add', path: '/spec/template/spec/imagePullSecrets', value: [{ name: 'regcred' }] }])]);
  });
  after(async () => {
    await registry?.stop();
    await wh?.stop();
    await removeNamespace(kubectl, ns);
  });

  /** The registry's own envelope for the v2 push, as the service logged... no: as the registry sends it, replayed with changes. */
  const envelope = (tag: string, digest: string) => JSON.stringify({ events: [{
    action: 'push', timestamp: new Date().toISOString(),
    target: { mediaType: 'application/vnd.oci.image.manifest.v1+json', repository: 'acme/web', tag, digest },
    request: { host: registry.host, method: 'PUT' },
  }] });
  const post = (name: string, body: string) => wh.request(`/hooks/verified?${query(name)}`, {
    method: 'POST', headers: { 'Content-Type': 'application/vnd.docker.distribution.events.v1+json', Authorization: SECRETS.REGISTRY_AUTH }, body,
  });

  test('the registry\'s own event: the tag is resolved with the workload\'s pull secret over TLS and its digest deployed', async () => {
    await registry.push(ociArchive(work, 'verified v2').path, 'acme/web:v2');
    const image = await waitFor(async () => {
      const i = await imageOf('web');
      return i?.startsWith(`${registry.host}/acme/web:v2@sha256:`) ? i : undefined;
    }, { timeoutMs: 60_000, what: 'the verified v2 push to land' });
    v2Digest = image.split('@')[1];
    assert.match(wh.output(), new RegExp(`VERIFY_IMAGE: ${registry.host.replace(/\./g, '\\.')}/acme/web:v2 is ${v2Digest} on the registry \\(login from pull secret "regcred"\\)`));
  });

  test('a tag the registry does not have is refused and changes nothing', async () => {
    const before = await getJson('deployment/web');
    const res = await post('web', envelope('v9', v2Digest));
    assert.equal(res.status, 500, res.body);
    assert.match(res.body, /^result: +failed: VERIFY_IMAGE: the registry has no tag "v9" in 127\.0\.0\.1:\d+\/acme\/web; nothing was changed$/m);
    assert.equal(pushedState(await getJson('deployment/web')), pushedState(before));
  });

  test('a digest other than the registry\'s is refused and changes nothing', async () => {
    const before = await getJson('deployment/web');
    const other = `sha256:${'0'.repeat(64)}`;
    const res = await post('web', envelope('v2', other));
    assert.equal(res.status, 500, res.body);
    assert.match(res.body, new RegExp(`failed: VERIFY_IMAGE: the payload announced ${other} but the registry's 127\\.0\\.0\\.1:\\d+/acme/web:v2 is ${v2Digest}; nothing was changed`));
    assert.equal(pushedState(await getJson('deployment/web')), pushedState(before));
  });

  test('without a pull secret for the registry the login is refused, named, and nothing changes', async () => {
    const res = await post('nologin', envelope('v2', v2Digest));
    assert.equal(res.status, 500, res.body);
    assert.match(res.body, /failed: VERIFY_IMAGE: could not resolve 127\.0\.0\.1:\d+\/acme\/web:v2: the registry asks for a login and the workload names no pull secret for it; nothing was changed/);
    assert.equal(await imageOf('nologin'), `${registry.host}/acme/web:v1`);
  });

  test('-print-rbac grants get on exactly the pull secrets the workload of a VERIFY_IMAGE hook names', async () => {
    await kubectl(['-n', ns, 'create', 'secret', 'generic', 'unrelated', '--from-literal=k=v']);
    const dir = makeTempDir('registry-verify-rbac-');
    const pinned = (name: string, value: string) => ({ match: { type: 'value', value, parameter: { source: 'url', name } } });
    const hook = registryHook('verified', { and: [pinned('ns', ns), pinned('workload', 'deployment/web')] }, 'distribution') as Record<string, unknown[]>;
    hook['pass-environment-to-command'].push({ envname: 'VERIFY_IMAGE', source: 'string', name: 'true' });
    fs.writeFileSync(path.join(dir, 'hooks.json'), JSON.stringify([hook]));
    const { execFileSync } = await import('node:child_process');
    const { defaultBinary } = await import('./harness.ts');
    const yaml = execFileSync(defaultBinary(), ['-print-rbac', '-hooks', dir, '-kubeconfig', cluster!.kubeconfigPath, '-rbac-service-account', 'cattle-system/webhook'], { encoding: 'utf8' });
    assert.match(yaml, /  - apiGroups: \[""\]\n    resources: \["secrets"\]\n    resourceNames: \["regcred"\]\n    verbs: \["get"\]/, yaml);
    assert.ok(!yaml.includes('unrelated'), yaml);
    assert.match(yaml, /pull secrets regcred \(VERIFY_IMAGE\)/);
  });

  test('the pull secret\'s password never appears in the output', () => {
    assert.ok(!wh.output().includes(LOGIN.password), wh.output());
    assert.ok(!wh.output().includes(Buffer.from(`${LOGIN.user}:${LOGIN.password}`).toString('base64')));
  });
});

describe('VERIFY_IMAGE against a real registry with token auth over TLS (the bearer flow)', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('registry-token');
  const kubectl = kubectlFor(cluster!);
  const LOGIN = { user: 'deployer', password: 'token-flow-password-5a90e2', token: true };
  let stopService: () => Promise<unknown>;
  let service: Spawned;
  let registry: Registry;

  before(async () => {
    const work = makeTempDir('registry-token-');
    const started = await verifiedService(ns, work, LOGIN);
    ({ registry, stop: stopService } = started);
    service = started.service;
    const auth = Buffer.from(`${LOGIN.user}:${LOGIN.password}`).toString('base64');
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
      { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'tokencred' }, type: 'kubernetes.io/dockerconfigjson',
        data: { '.dockerconfigjson': Buffer.from(JSON.stringify({ auths: { [`https://${registry.host}`]: { auth } } })).toString('base64') } },
      deployment('web', [{ name: 'app', image: `${registry.host}/acme/web:v1` }], { replicas: 1 }),
    ] }));
    await kubectl(['-n', ns, 'patch', 'deployment/web', '--type=json', '-p',
      JSON.stringify([{ op: 'add', path: '/spec/template/spec/imagePullSecrets', value: [{ name: 'tokencred' }] }])]);
    await registry.push(ociArchive(work, 'token v2').path, 'acme/web:v2');
  });
  after(async () => {
    await registry?.stop();
    await stopService?.();
    await removeNamespace(kubectl, ns);
  });

  test('the registry\'s challenge is answered with a token from its token service, got with the pull secret\'s login', async () => {
    const image = await waitFor(async () => {
      const i = containerImage(JSON.parse(await kubectl(['-n', ns, 'get', 'deployment/web', '-o', 'json'])), 'app');
      return i?.startsWith(`${registry.host}/acme/web:v2@sha256:`) ? i : undefined;
    }, { timeoutMs: 60_000, what: 'the verified v2 push to land' });
    // The log line of the answer comes after the PATCH the cluster shows.
    const login = `VERIFY_IMAGE: 127\\.0\\.0\\.1:\\d+/acme/web:v2 is ${image.split('@')[1]} on the registry \\(login from pull secret "tokencred"\\)`;
    await waitForOutput(service, new RegExp(login), 30_000);
    assert.ok(!service.output().includes(LOGIN.password), service.output());
    // skopeo's push took tokens too; the verification's are the ones issued to the service.
    assert.ok(registry.tokensIssuedTo().some((ua) => ua.startsWith('webhook/')), registry.tokensIssuedTo().join(', '));
  });
});

describe('VERIFY_IMAGE against a real public registry over TLS (anonymous)', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('registry-anon');
  const kubectl = kubectlFor(cluster!);
  let stopService: () => Promise<unknown>;
  let service: Spawned;
  let registry: Registry;

  before(async () => {
    const work = makeTempDir('registry-anon-');
    const started = await verifiedService(ns, work);
    ({ registry, stop: stopService } = started);
    service = started.service;
    await kubectl(['create', 'namespace', ns]);
    // It names a pull secret that does not exist: a public registry must not need it.
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('web', [{ name: 'app', image: `${registry.host}/acme/web:v1` }], { replicas: 1 })));
    await kubectl(['-n', ns, 'patch', 'deployment/web', '--type=json', '-p',
      JSON.stringify([{ op: 'add', path: '/spec/template/spec/imagePullSecrets', value: [{ name: 'absent' }] }])]);
    await registry.push(ociArchive(work, 'anonymous v2').path, 'acme/web:v2');
  });
  after(async () => {
    await registry?.stop();
    await stopService?.();
    await removeNamespace(kubectl, ns);
  });

  test('the tag is resolved anonymously, no pull secret read, and its digest deployed', async () => {
    const image = await waitFor(async () => {
      const i = containerImage(JSON.parse(await kubectl(['-n', ns, 'get', 'deployment/web', '-o', 'json'])), 'app');
      return i?.startsWith(`${registry.host}/acme/web:v2@sha256:`) ? i : undefined;
    }, { timeoutMs: 60_000, what: 'the verified v2 push to land' });
    // The log line of the answer comes after the PATCH the cluster shows.
    const note = `note: +VERIFY_IMAGE: 127\\.0\\.0\\.1:\\d+/acme/web:v2 is ${image.split('@')[1]} on the registry\\n`;
    await waitForOutput(service, new RegExp(note), 30_000);
  });
});

describe('VERIFY_IMAGE: a token realm on another host gets no credentials unless REGISTRY_TOKEN_HOSTS names it', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('registry-realm');
  const kubectl = kubectlFor(cluster!);
  // The registry is 127.0.0.1:PORT; its challenge names its token service as localhost: another host.
  const LOGIN = { user: 'deployer', password: 'realm-flow-password-8c31f4', token: true, realmHost: 'localhost' };
  let started: Awaited<ReturnType<typeof verifiedService>>;
  let work: string;
  let restarted: Awaited<ReturnType<typeof import('./harness.ts')['spawnWebhook']>> | undefined;
  const imageOf = async () => containerImage(JSON.parse(await kubectl(['-n', ns, 'get', 'deployment/web', '-o', 'json'])), 'app');

  before(async () => {
    work = makeTempDir('registry-realm-');
    started = await verifiedService(ns, work, LOGIN);
    const auth = Buffer.from(`${LOGIN.user}:${LOGIN.password}`).toString('base64');
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
      { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'realmcred' }, type: 'kubernetes.io/dockerconfigjson',
        data: { '.dockerconfigjson': Buffer.from(JSON.stringify({ auths: { [`https://${started.registry.host}`]: { auth } } })).toString('base64') } },
      deployment('web', [{ name: 'app', image: `${started.registry.host}/acme/web:v1` }], { replicas: 1 }),
    ] }));
    await kubectl(['-n', ns, 'patch', 'deployment/web', '--type=json', '-p',
      JSON.stringify([{ op: 'add', path: '/spec/template/spec/imagePullSecrets', value: [{ name: 'realmcred' }] }])]);
  });
  after(async () => {
    await started?.registry.stop();
    await started?.stop();
    if (restarted) { restarted.proc.kill('SIGTERM'); await restarted.exited; }
    if (!process.env.KEEP_NAMESPACE) await kubectl(['delete', 'namespace', ns, '--wait=false']).catch(() => undefined);
  });

  test('the token is asked for anonymously, the failure says why, nothing changes; with the host allowed the login goes', async () => {
    await started.registry.push(ociArchive(work, 'realm v2').path, 'acme/web:v2');
    const refused = await waitForOutput(started.service,
      /VERIFY_IMAGE: could not resolve 127\.0\.0\.1:\d+\/acme\/web:v2: the registry's token service localhost:\d+ answered 401 to an anonymous request \(the login of pull secret "realmcred" was not sent to the token service on localhost: it is not the registry's host, a well-known registry's token host or one REGISTRY_TOKEN_HOSTS names\); nothing was changed/, 60_000);
    assert.ok(!refused.includes(LOGIN.password));
    const asked = started.registry.tokenRequests().filter((r) => r.userAgent.startsWith('webhook/'));
    assert.ok(asked.length > 0, 'the service asked the token service');
    assert.deepEqual(asked.map((r) => r.authorization), asked.map(() => undefined), 'no credentials sent to the realm');
    assert.equal(await imageOf(), `${started.registry.host}/acme/web:v1`);

    // The same service, restarted with REGISTRY_TOKEN_HOSTS naming the realm's host: the login goes, the push lands.
    const { spawnWebhook, httpRequest } = await import('./harness.ts');
    await started.stop();
    const hooks = JSON.parse(fs.readFileSync(path.join(work, 'hooks.json'), 'utf8'));
    hooks[0]['pass-environment-to-command'].push({ envname: 'REGISTRY_TOKEN_HOSTS', source: 'string', name: 'auth.example.com localhost' });
    fs.writeFileSync(path.join(work, 'hooks.json'), JSON.stringify(hooks));
    restarted = await spawnWebhook({ hooks: path.join(work, 'hooks.json'), env: { WEBHOOK_CMD: '-template', KUBECONFIG: cluster!.kubeconfigPath, ...SECRETS } }, started.port);
    await waitFor(async () => (await httpRequest(started.port, '/').catch(() => undefined))?.status === 200, { timeoutMs: 10_000, what: 'the restarted service' });
    await started.registry.push(ociArchive(work, 'realm v3').path, 'acme/web:v3');
    const image = await waitFor(async () => {
      const i = await imageOf();
      return i?.startsWith(`${started.registry.host}/acme/web:v3@sha256:`) ? i : undefined;
    }, { timeoutMs: 60_000, what: 'the verified v3 push to land' });
    assert.match(restarted.output(), new RegExp(`VERIFY_IMAGE: 127\\.0\\.0\\.1:\\d+/acme/web:v3 is ${image.split('@')[1]} on the registry \\(login from pull secret "realmcred"\\)`));
    assert.ok(started.registry.tokenRequests().some((r) => r.userAgent.startsWith('webhook/') && r.authorization?.startsWith('Basic ')));
    assert.ok(!restarted.output().includes(LOGIN.password));
  });
});
