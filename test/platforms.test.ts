/*
 * The platform check through the executable, on the test cluster (kwok's nodes are linux/amd64), against a real
 * registry (Debian's docker-registry over TLS, test/registry.ts) holding image indexes pushed by skopeo: an index
 * without the nodes' platform is refused (`refused: platform`, naming what is missing, nothing changed), one with it
 * deploys; a registry watch checks what it finds the same way; a service that may not list nodes skips the check
 * with one warning. Pure parts: which platforms an index offers, which nodes a pod's affinity allows, -print-rbac.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as https from 'node:https';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import {
  adminPort, defaultBinary, httpRequest, makeTempDir, startWebhook, waitFor, waitForOutput, type Webhook,
} from './harness.ts';
import { ociArchive, startRegistry, type Registry } from './registry.ts';
import {
  clusterOrSkip, containerImage, deployment, freshNamespaceName, kubectlFor, namespaceAdminAccount, pushedState,
  removeNamespace,
} from './cluster/kube.ts';
import { fixedSettings, registryHook, upgradeHook } from './upgrade-hooks.ts';
import { indexPlatforms, nodeAffinityAllows } from '../webhook.ts';

const cluster = await clusterOrSkip();
const TOKEN = 'platforms-token-5d1c';
// A watch looks every 10 s (the shortest interval allowed); what it finds is decided within a few of them.
const WITHIN = 90_000;
const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

describe('the platform check through the executable', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('platforms');
  const kubectl = kubectlFor(cluster!);
  let registry: Registry;
  let work: string;
  let caFile: string;
  let wh: Webhook;

  const workload = async (name: string) => JSON.parse(await kubectl(['-n', ns, 'get', `deployment/${name}`, '-o', 'json']));
  const imageOf = async (name: string) => containerImage(await workload(name), 'app');
  /** The digest the registry has for <repoTag> (HEAD, accepting an index). */
  const digestOf = (repoTag: string) => new Promise<string>((resolve, reject) => {
    const [repo, tag] = repoTag.split(':');
    const req = https.request(`https://${registry.host}/v2/${repo}/manifests/${tag}`, {
      method: 'HEAD', ca: registry.caPem,
      headers: { Accept: 'application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json' },
    }, (res) => {
      res.resume();
      const d = res.headers['docker-content-digest'];
      if (res.statusCode === 200 && typeof d === 'string') resolve(d);
      else reject(new Error(`HEAD ${repoTag}: ${res.statusCode}`));
    });
    req.on('error', reject);
    req.end();
  });
  /** An index of one tiny image per platform, pushed whole (skopeo --all) to <repoTag>; its digest. */
  const pushIndex = async (repoTag: string, platforms: string[]) => {
    const list = platforms.map((p) => ({ os: p.split('/')[0], architecture: p.split('/')[1] }));
    await registry.push(ociArchive(work, `${repoTag} ${platforms.join(' ')} ${Date.now()}`, list).path, repoTag, { all: true });
    return digestOf(repoTag);
  };
  /** The registry's push envelope for acme/<repo>:<tag>, to the hook for deployment/<name>. */
  const post = (service: Webhook, hook: string, name: string, repoTag: string, digest: string) => {
    const [repository, tag] = repoTag.split(':');
    return service.request(`/hooks/${hook}?${new URLSearchParams({ token: TOKEN, ns, workload: `deployment/${name}`, container: 'app' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/vnd.docker.distribution.events.v1+json' },
      body: JSON.stringify({ events: [{
        action: 'push', timestamp: new Date().toISOString(),
        target: { mediaType: 'application/vnd.oci.image.index.v1+json', repository, tag, digest },
        request: { host: registry.host, method: 'PUT' },
      }] }),
    });
  };
  const deliveryOf = async (res: { headers: Record<string, unknown> }) => {
    const admin = await adminPort(wh);
    const id = String(res.headers['x-request-id']);
    return waitFor(async () => {
      const d = JSON.parse((await httpRequest(admin, '/deliveries.json')).body).deliveries.find((x: any) => x.request_id === id);
      return d?.state === 'done' ? d : undefined;
    }, { timeoutMs: 30_000, what: `the delivery of ${id}` });
  };
  const events = async (name: string, reason: string) => (JSON.parse(await kubectl(['-n', ns, 'get', 'events', '--field-selector',
    `involvedObject.name=${name},reason=${reason}`, '-o', 'json'])).items as { message: string }[]).map((e) => e.message);
  const refusal = (digest: string, name: string, offered: string) =>
    `platform: the image index ${digest} has ${offered} only; the nodes deployment/${name} can run on run linux/amd64: ` +
    'no manifest for linux/amd64';

  before(async () => {
    work = makeTempDir('platforms-');
    registry = await startRegistry({ tls: true });
    caFile = path.join(work, 'registry-ca.pem');
    fs.writeFileSync(caFile, registry.caPem!);
    const urlToken = { match: { type: 'value', value: TOKEN, parameter: { source: 'url', name: 'token' } } };
    const verify = registryHook('verify', urlToken, 'distribution') as Record<string, object[]>;
    verify['pass-environment-to-command'].push(...fixedSettings({ REGISTRY_CA: caFile, VERIFY_IMAGE: 'true' }));
    const plain = registryHook('plain', urlToken, 'distribution') as Record<string, object[]>;
    plain['pass-environment-to-command'].push(...fixedSettings({ REGISTRY_CA: caFile }));
    const hooks = [verify, plain, upgradeHook('watch', TOKEN, { REGISTRY_CA: caFile, ANNOTATION_NAMESPACES: ns })];
    fs.writeFileSync(path.join(work, 'hooks.json'), JSON.stringify(hooks));
    await registry.push(ociArchive(work, 'platforms v1').path, 'acme/multi:v1');
    await registry.push(ociArchive(work, 'watched v1').path, 'acme/watched:latest');
    const watchedAt = await digestOf('acme/watched:latest');
    await kubectl(['create', 'namespace', ns]);
    const app = (image: string) => [{ name: 'app', image }];
    const watched = deployment('watched', app(`${registry.host}/acme/watched:latest@${watchedAt}`), { replicas: 1 }) as any;
    watched.metadata.annotations = { 'webhook/poll': '2s', 'webhook/hook': 'watch' };
    // Its pods may run only on arm64 or s390x nodes, of which the cluster has none: nothing to check against.
    const elsewhere = deployment('elsewhere', app(`${registry.host}/acme/multi:v1`), { replicas: 1 }) as any;
    elsewhere.spec.template.spec.affinity = { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: {
      nodeSelectorTerms: [{ matchExpressions: [{ key: 'kubernetes.io/arch', operator: 'In', values: ['arm64', 's390x'] }] }] } } };
    // A required node affinity of 1,500 expressions (each allowing amd64, which every node is): past what is read.
    const sprawling = deployment('sprawling', app(`${registry.host}/acme/multi:v1`), { replicas: 1 }) as any;
    sprawling.spec.template.spec.affinity = { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: {
      nodeSelectorTerms: [{ matchExpressions: Array.from({ length: 1_500 }, (_, i) =>
        ({ key: i === 0 ? 'kubernetes.io/arch' : `x${i}.example.com/k`, operator: i === 0 ? 'In' : 'DoesNotExist', ...(i === 0 ? { values: ['amd64'] } : {}) })) }] } } };
    const picky = deployment('picky', app(`${registry.host}/acme/multi:v1`), { replicas: 1 }) as any;
    picky.spec.template.spec.nodeSelector = { 'kubernetes.io/os': 'linux', type: 'kwok' };
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
      ...['web', 'plain', 'unlisted'].map((name) => deployment(name, app(`${registry.host}/acme/multi:v1`), { replicas: 1 })),
      watched, elsewhere, picky, sprawling,
    ] }));
    // A look every 2 s: the registry is on this machine (-poll-min-interval).
    wh = await startWebhook({ hooks: path.join(work, 'hooks.json'), env: { KUBECONFIG: cluster!.kubeconfigPath }, metrics: true,
      args: ['-poll-min-interval', '1s'] });
  });
  after(async () => {
    await wh?.stop();
    await registry?.stop();
    await removeNamespace(kubectl, ns);
  });

  test('an index without the nodes\' platform is refused: 500, naming what is missing, nothing changed, "refused: platform"', async () => {
    const digest = await pushIndex('acme/multi:arm', ['linux/arm64', 'linux/s390x']);
    const before = pushedState(await workload('web'));
    const res = await post(wh, 'verify', 'web', 'acme/multi:arm', digest);
    assert.equal(res.status, 500, res.body);
    assert.match(res.body, new RegExp(`^result: +failed: ${escape(refusal(digest, 'web', 'linux/arm64, linux/s390x'))}; nothing was changed$`, 'm'));
    assert.equal(pushedState(await workload('web')), before);
    const delivery = await deliveryOf(res);
    assert.equal(delivery.decision, 'refused: platform');
    assert.match(delivery.detail, /^platform: the image index sha256:[0-9a-f]{64} has linux\/arm64, linux\/s390x only/);
    await waitFor(async () => (await events('web', 'UpgradeRefused')).some((m) => m.includes(refusal(digest, 'web', 'linux/arm64, linux/s390x'))),
      { timeoutMs: 30_000, what: 'the UpgradeRefused Event' });
  });

  test('an index with the nodes\' platform deploys, pinned to the index', async () => {
    const digest = await pushIndex('acme/multi:both', ['linux/arm64', 'linux/amd64']);
    const res = await post(wh, 'verify', 'web', 'acme/multi:both', digest);
    assert.equal(res.status, 200, res.body);
    assert.equal(await imageOf('web'), `${registry.host}/acme/multi:both@${digest}`);
  });

  test('the nodes are those the nodeSelector and the required node affinity allow', async () => {
    const digest = await pushIndex('acme/multi:arm-only', ['linux/arm64']);
    const res = await post(wh, 'verify', 'picky', 'acme/multi:arm-only', digest);
    assert.equal(res.status, 500, res.body);
    assert.match(res.body, new RegExp(escape(refusal(digest, 'picky', 'linux/arm64'))));
    // No node is arm64 or s390x: there is no platform to require, and the index is deployed (with a note).
    const elsewhere = await post(wh, 'verify', 'elsewhere', 'acme/multi:arm-only', digest);
    assert.equal(elsewhere.status, 200, elsewhere.body);
    assert.match(elsewhere.body, /^note: +platform: no node deployment\/elsewhere can run on says its os and arch: not checked$/m);
    assert.equal(await imageOf('elsewhere'), `${registry.host}/acme/multi:arm-only@${digest}`);
  });

  test('a node affinity larger than is read (1,500 expressions) skips the check with a note, not the event loop', async () => {
    const digest = await pushIndex('acme/multi:arm-only', ['linux/arm64']);
    const res = await post(wh, 'verify', 'sprawling', 'acme/multi:arm-only', digest);
    assert.equal(res.status, 200, res.body);
    assert.match(res.body, /^note: +platform: the required node affinity has 1502 terms, expressions and values, more than 1000: the platform check is skipped$/m);
    assert.equal(await imageOf('sprawling'), `${registry.host}/acme/multi:arm-only@${digest}`);
  });

  test('a push the registry is not asked about (no VERIFY_IMAGE) is not checked', async () => {
    const digest = await digestOf('acme/multi:arm');
    const res = await post(wh, 'plain', 'plain', 'acme/multi:arm', digest);
    assert.equal(res.status, 200, res.body);
    assert.equal(await imageOf('plain'), `${registry.host}/acme/multi:arm`);
  });

  test('a registry watch refuses an index without the nodes\' platform, and deploys one with it', async () => {
    const start = await imageOf('watched');
    const arm = await pushIndex('acme/watched:latest', ['linux/arm64']);
    const line = new RegExp(`registry watch: deployment/watched in ${ns}, container app: ` +
      `${escape(`${registry.host}/acme/watched:latest@${arm}`)}: refused: platform \\(`);
    await waitForOutput(wh, line, WITHIN);
    assert.equal(await imageOf('watched'), start);
    const both = await pushIndex('acme/watched:latest', ['linux/amd64', 'linux/arm64']);
    await waitFor(async () => (await imageOf('watched')) === `${registry.host}/acme/watched:latest@${both}`,
      { timeoutMs: WITHIN, what: 'the watch to deploy the index with linux/amd64' });
  });

  test('a service that may not list nodes skips the check, with one warning, and deploys', async () => {
    const kubeconfig = path.join(work, 'namespaced.json');
    await namespaceAdminAccount(kubectl, cluster!, ns, 'no-nodes', kubeconfig);
    const limited = await startWebhook({ hooks: path.join(work, 'hooks.json'), env: { KUBECONFIG: kubeconfig },
      args: ['-poll-min-interval', '1s'] });
    try {
      const digest = await digestOf('acme/multi:arm');
      const first = await post(limited, 'verify', 'unlisted', 'acme/multi:arm', digest);
      assert.equal(first.status, 200, first.body);
      assert.match(first.body, /^note: +platform: the nodes could not be listed \(forbidden: .*cannot "list" nodes.*\): the platform check is skipped$/m);
      assert.equal(await imageOf('unlisted'), `${registry.host}/acme/multi:arm@${digest}`);
      const again = await post(limited, 'verify', 'unlisted', 'acme/multi:both', await digestOf('acme/multi:both'));
      assert.equal(again.status, 200, again.body);
      const warnings = limited.output().split('\n').filter((l) => l.includes('platform check: the nodes could not be listed'));
      assert.equal(warnings.length, 1, limited.output());
      assert.match(warnings[0], /cannot "list" nodes/);
    } finally {
      await limited.stop();
    }
  });
});

describe('the platform check, pure parts', () => {
  test('an index offers the os/architecture of its entries, attestations left out; a single image is no index', () => {
    const entry = (os: string, architecture: string, variant?: string) => ({ platform: { os, architecture, ...(variant ? { variant } : {}) } });
    const index = { mediaType: 'application/vnd.oci.image.index.v1+json',
      manifests: [entry('linux', 'arm64', 'v8'), entry('linux', 'amd64'), entry('unknown', 'unknown'), entry('linux', 'arm64'), {}] };
    assert.deepEqual(indexPlatforms(index), ['linux/amd64', 'linux/arm64']);
    assert.deepEqual(indexPlatforms({ mediaType: 'application/vnd.docker.distribution.manifest.list.v2+json', manifests: [] }), []);
    assert.deepEqual(indexPlatforms({ schemaVersion: 2, manifests: [entry('windows', 'amd64')] }), ['windows/amd64']);
    assert.equal(indexPlatforms({ mediaType: 'application/vnd.oci.image.manifest.v1+json', layers: [] }), undefined);
  });

  test('a required node affinity allows the nodes one of its terms matches', () => {
    const term = (...matchExpressions: object[]) => ({ matchExpressions });
    const arm = { 'kubernetes.io/arch': 'arm64', 'kubernetes.io/os': 'linux', zone: 'a', cores: '8' };
    assert.equal(nodeAffinityAllows([], arm, 'n1'), true);
    assert.equal(nodeAffinityAllows([term({ key: 'kubernetes.io/arch', operator: 'In', values: ['amd64'] })], arm, 'n1'), false);
    assert.equal(nodeAffinityAllows([term({ key: 'kubernetes.io/arch', operator: 'In', values: ['amd64'] }),
      term({ key: 'zone', operator: 'Exists' })], arm, 'n1'), true);
    assert.equal(nodeAffinityAllows([term({ key: 'zone', operator: 'NotIn', values: ['a'] })], arm, 'n1'), false);
    assert.equal(nodeAffinityAllows([term({ key: 'gpu', operator: 'DoesNotExist' }, { key: 'cores', operator: 'Gt', values: ['4'] })], arm, 'n1'), true);
    assert.equal(nodeAffinityAllows([term({ key: 'cores', operator: 'Lt', values: ['4'] })], arm, 'n1'), false);
    assert.equal(nodeAffinityAllows([{ matchFields: [{ key: 'metadata.name', operator: 'In', values: ['n2'] }] }], arm, 'n1'), false);
    // An empty term matches no node, as the scheduler has it.
    assert.equal(nodeAffinityAllows([{}], arm, 'n1'), false);
  });

  test('-print-rbac grants list on nodes (one ClusterRole) to hooks that read the registry, and to no other', () => {
    const dir = makeTempDir('platforms-rbac-');
    const file = path.join(dir, 'hooks.json');
    const fixed = (id: string, settings: Record<string, string>) =>
      upgradeHook(id, TOKEN, { APP_NS: 'shop', APP_WORKLOAD: `deployment/${id}`, APP_CONTAINER: 'app', ...settings });
    const rbac = (hooks: object[]) => {
      fs.writeFileSync(file, JSON.stringify(hooks));
      const out = spawnSync(defaultBinary(), ['-print-rbac', '-hooks', file, '-rbac-service-account', 'ops/webhook'],
        { encoding: 'utf8', env: { PATH: process.env.PATH } });
      assert.equal(out.status, 0, out.stderr);
      return out.stdout;
    };
    const plain = rbac([fixed('web', {})]);
    assert.doesNotMatch(plain, /nodes/);
    for (const settings of [{ VERIFY_IMAGE: 'true' }, { POLL_INTERVAL: '1m' }] as Record<string, string>[]) {
      const text = rbac([fixed('web', {}), fixed('api', settings)]);
      assert.match(text, /^kind: ClusterRole\nmetadata:\n {2}name: "webhook-nodes"\n(?: {2}.*\n)*rules:\n {2}- apiGroups: \[""\]\n {4}resources: \["nodes"\]\n {4}verbs: \["list"\]$/m);
      assert.match(text, /^kind: ClusterRoleBinding\nmetadata:\n {2}name: "webhook-nodes"\n/m);
      assert.match(text, /subjects:\n {2}- kind: ServiceAccount\n {4}name: "webhook"\n {4}namespace: "ops"\n$/);
      assert.equal(text.match(/^kind: ClusterRole$/gm)?.length, 1);
    }
  });
});
