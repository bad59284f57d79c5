/*
 * A minimum image age (MIN_IMAGE_AGE, webhook/min-age) through the built executable, on the real test cluster and a
 * real registry (Debian's docker-registry over TLS): a push younger than the minimum is answered 202 and waits on
 * the workload, a newer push replaces it, and the newer one is deployed when it comes of age (the older never); a
 * registry watch passes over a tag built moments ago, takes the highest tag old enough meanwhile, and the young one
 * once it is old enough. The minimum is 30 s, so each wait is for an event (an image, a log line) within a bound.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { acrImage, acrPayload, clusterOrSkip, containerImage, deployment, freshNamespaceName, kubectlFor, namespacedGetter, removeNamespace } from './cluster/kube.ts';
import { makeTempDir, startWebhook, waitFor, waitForOutput, type Webhook } from './harness.ts';
import { ociArchive, startRegistry, type Registry } from './registry.ts';
import { upgradeHook } from './upgrade-hooks.ts';

const cluster = await clusterOrSkip();
const TOKEN = 'min-age-token-4d81c2';
const AGE = '30s';
// Past the minimum, with room for a loaded machine: a look every 2 s, a tick every second.
const WITHIN = 120_000;

describe('MIN_IMAGE_AGE: a young image waits until it is old enough', { skip: cluster ? false : 'no cluster' }, () => {
  const kubectl = kubectlFor(cluster!);
  const ns = freshNamespaceName('min-age');
  const get = namespacedGetter(kubectl, ns);
  const work = makeTempDir('min-age-');
  let registry: Registry;
  let wh: Webhook;
  const push = (tag: string) => wh.request(`/hooks/aged?${new URLSearchParams({ token: TOKEN })}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag),
  });
  const events = async (name: string, reason: string) => (JSON.parse(await kubectl(['-n', ns, 'get', 'events', '--field-selector',
    `involvedObject.name=${name},reason=${reason}`, '-o', 'json'])).items as { message: string }[]).map((e) => e.message);
  const image = async (name: string) => containerImage(await get(`deployment/${name}`), 'app');

  before(async () => {
    registry = await startRegistry({ tls: true });
    const ca = path.join(work, 'registry.pem');
    fs.writeFileSync(ca, registry.caPem!);
    const hooks = path.join(work, 'hooks.json');
    fs.writeFileSync(hooks, JSON.stringify([
      upgradeHook('aged', TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/web', APP_CONTAINER: 'app', REPO_TYPE: 'regionalregistry',
        MIN_IMAGE_AGE: AGE }),
      upgradeHook('watch', TOKEN, { REGISTRY_CA: ca, ANNOTATION_NAMESPACES: ns }),
      upgradeHook('verified', TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/verified', APP_CONTAINER: 'app', REPO_TYPE: 'custom',
        VERIFY_IMAGE: 'true', REGISTRY_CA: ca, MIN_IMAGE_AGE: AGE }),
    ]));
    await registry.push(ociArchive(work, 'verified old', undefined, { created: '2026-01-01T00:00:00Z' }).path, 'acme/verified:old');

    await registry.push(ociArchive(work, 'aged 1.0.0', undefined, { created: '2026-01-01T00:00:00Z' }).path, 'acme/aged:1.0.0');
    await kubectl(['create', 'namespace', ns]);
    const watched = deployment('watched', [{ name: 'app', image: `${registry.host}/acme/aged:1.0.0` }], { replicas: 1 });
    Object.assign(watched.metadata, { annotations: { 'webhook/poll': '2s', 'webhook/hook': 'watch', 'webhook/policy': 'semver:^1',
      'webhook/min-age': AGE } });
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
      deployment('web', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 }), watched,
      deployment('verified', [{ name: 'app', image: `${registry.host}/acme/verified:start` }], { replicas: 1 })] }));
    wh = await startWebhook({ hooks, args: ['-poll-min-interval', '1s'], env: { KUBECONFIG: cluster!.kubeconfigPath } });
  });
  after(async () => {
    await wh?.stop();
    await registry?.stop();
    await removeNamespace(kubectl, ns);
  });

  test('a young push waits (202), a newer one replaces it, and only the newer is deployed, once it is old enough', async () => {
    const first = await push('v2');
    assert.equal(first.status, 202, first.body);
    assert.match(first.body, /^action: +waiting until \S+Z, when it is old enough \(its age: 30s after it was pushed\)$/m);
    const pending = JSON.parse((await get('deployment/web')).metadata.annotations['webhook/pending']).app;
    assert.deepEqual([pending.waitsFor, pending.image], ['age', acrImage('v2')]);
    const second = await push('v3');
    assert.equal(second.status, 202, second.body);
    assert.match(second.body, new RegExp(`^note: +the waiting push of ${acrImage('v2').replace(/\./g, '\\.')} \\(request \\S+, pushed at \\S+\\) is superseded$`, 'm'));
    assert.equal(await image('web'), acrImage('v1'), 'nothing deployed while it is young');
    await waitFor(async () => (await image('web')) === acrImage('v3'), { timeoutMs: WITHIN, what: 'v3 deployed once 30s old' });
    // Deployed by the service itself when its time came: a request of its own, neither push's.
    const line = await waitForOutput(wh, new RegExp(`\\[(\\S+)\\] deployment/web in ${ns}: image updated`), WITHIN);
    const by = /\[(\S+)\] deployment\/web in \S+: image updated/.exec(line)![1];
    assert.ok(![first.headers['x-request-id'], second.headers['x-request-id']].includes(by), line);
    // The older push is told as replaced while it waited.
    assert.match(wh.output(), new RegExp(`\\[${first.headers['x-request-id']}\\] deployment/web in ${ns}: none \\(superseded: a newer push`));
    const updated = await events('web', 'ImageUpdated');
    assert.equal(updated.length, 1, JSON.stringify(updated));
    assert.match(updated[0], /→ \S+:v3;/);
    assert.equal((await events('web', 'UpgradeWaiting')).length, 2);
    const record = JSON.parse((await get('deployment/web')).metadata.annotations['webhook/last-push']).app;
    assert.equal(record.image, acrImage('v3'));
    assert.deepEqual(JSON.parse((await get('deployment/web')).metadata.annotations['webhook/pending'] ?? '{}'), {});
  });

  test('under VERIFY_IMAGE the age counts from when the image was built: an old build at once, a new one waits', async () => {
    // A build job's notification names the tag only; the registry says the digest and, in its config, when it was built.
    const notify = (tag: string) => wh.request(`/hooks/verified?${new URLSearchParams({ token: TOKEN })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ push_data: { tag }, repository: { repo_url: `https://${registry.host}/`, namespace: 'acme', name: 'verified' } }),
    });
    const old = await notify('old');
    assert.equal(old.status, 200, old.body);
    assert.match(old.body, /^action: +image updated$/m);
    assert.ok((await image('verified'))?.startsWith(`${registry.host}/acme/verified:old@sha256:`));
    await registry.push(ociArchive(work, 'verified new', undefined, { created: new Date().toISOString() }).path, 'acme/verified:new');
    const young = await notify('new');
    assert.equal(young.status, 202, young.body);
    assert.match(young.body, /^action: +waiting until \S+Z, when it is old enough \(its age: 30s after it was built\)$/m);
    const entry = JSON.parse((await get('deployment/verified')).metadata.annotations['webhook/pending']).app;
    assert.match(entry.builtAt, /^\d{4}-\d\d-\d\dT/);
    await waitFor(async () => (await image('verified'))?.startsWith(`${registry.host}/acme/verified:new@sha256:`),
      { timeoutMs: WITHIN, what: 'the new build deployed once 30s old' });
  });

  test('a registry watch passes over a tag built moments ago, takes the highest old enough, then the young one', async () => {
    await registry.push(ociArchive(work, 'aged 1.0.5', undefined, { created: '2026-01-02T00:00:00Z' }).path, 'acme/aged:1.0.5');
    await registry.push(ociArchive(work, 'aged 1.1.0', undefined, { created: new Date().toISOString() }).path, 'acme/aged:1.1.0');
    const young = `${registry.host}/acme/aged:1.1.0`.replace(/[.]/g, '\\.');
    await waitForOutput(wh, new RegExp(`deployment/watched in ${ns}, container app: .*younger than 30s, passed over: ${young} \\(built \\S+, old enough at \\S+\\)`), WITHIN);
    await waitFor(async () => (await image('watched'))?.startsWith(`${registry.host}/acme/aged:1.0.5@sha256:`),
      { timeoutMs: WITHIN, what: 'the watch to take 1.0.5, old enough, meanwhile' });
    await waitFor(async () => (await image('watched'))?.startsWith(`${registry.host}/acme/aged:1.1.0@sha256:`),
      { timeoutMs: WITHIN, what: 'the watch to take 1.1.0 once it is 30s old' });
    assert.equal((await events('watched', 'ImageUpdated')).length, 2);
    // Never waiting on the workload: the watch handed it over only once it was old enough.
    assert.equal((await events('watched', 'UpgradeWaiting')).length, 0);
  });
});
