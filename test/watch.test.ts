/*
 * Rollouts are followed by watching, on the real test cluster. The library: a watch the API server
 * ends mid-follow (timeoutSeconds of 1 s while a paused Deployment holds the rollout open) is
 * resumed, and the follow ends "complete" once the rollout is resumed; a follow that starts from a
 * resourceVersion the API server no longer has (410 Gone) re-lists and ends right; the watch is
 * shared by the follows of one namespace and closed when the last ends. The built executable: a
 * ServiceAccount whose Role has no `watch` still follows every rollout to its end, by polling,
 * with one warning; the Role `-print-rbac` prints (list and watch on the named workloads) follows
 * without one. What a release costs: the namespace's pods, watched for a still rollout, are kept
 * lean and indexed by workload; a follow whose shared watch is heard from reads nothing, and reads
 * its workload again once the watch has gone quiet; the first push to a workload served by a hook
 * that fixes it is patched on the copy the start-up list made, without a read (a Role without
 * `get` on Deployments proves it); a client's calls, however many at once, share a bounded set of
 * connections (counted by a TCP proxy in front of the API server), and its watch has one of its own.
 * KubeClient's openWatch, list and get are counted by a subclass that calls them as they are: every
 * request still goes to the real API server.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { makeTempDir, startWebhook, waitFor, waitForOutput, type Webhook } from './harness.ts';
import {
  accountKubeconfig, acrImage, apiRequestCounter, acrPayload, ApiServerProxy, clusterOrSkip, deployment, freshNamespaceName, kubectlFor,
  removeNamespace, roleBoundAccount, type Kubectl,
} from './cluster/kube.ts';
import { upgradeHook } from './upgrade-hooks.ts';
import { followRollout, KUBE_LIMITS, KubeClient, loadKubeconfig, type ResourceRef } from '../webhook.ts';

const TOKEN = 'watch-token-5c0e7a';
const cluster = await clusterOrSkip();

/**
 * A KubeClient that counts its watch requests, lists and reads of Deployments (each still made for real), and keeps
 * the resourceVersion each list of them answered with.
 */
class CountingClient extends KubeClient {
  watchQueries: Record<string, string>[] = [];
  lists = 0;
  listVersions: string[] = [];
  gets = 0;
  override get<T>(r: ResourceRef, o: { background?: boolean } = {}): Promise<T> {
    if (r.resource === 'deployments') this.gets++;
    return super.get<T>(r, o);
  }
  override openWatch(r: ResourceRef, query: Record<string, string>, onRequest: Parameters<KubeClient['openWatch']>[2]) {
    this.watchQueries.push(query);
    return super.openWatch(r, query, onRequest);
  }
  override async list<T>(r: ResourceRef, query: Record<string, string> = {}): Promise<T> {
    if (r.resource !== 'deployments') return super.list<T>(r, query);
    this.lists++;
    const answer = await super.list<T & { metadata?: { resourceVersion?: string } }>(r, query);
    this.listVersions.push(answer.metadata?.resourceVersion ?? '');
    return answer;
  }
}

/** Sets the app container's image as a push would and returns the workload as the PATCH answered it. */
async function patchImage(kubectl: Kubectl, ns: string, name: string, tag: string): Promise<Record<string, any>> {
  const patch = JSON.stringify([{ op: 'replace', path: '/spec/template/spec/containers/0/image', value: acrImage(tag) }]);
  return JSON.parse(await kubectl(['-n', ns, 'patch', 'deployment', name, '--type=json', '-p', patch, '-o', 'json']));
}

describe('rollouts followed by watching', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('watch');
  const kubectl = kubectlFor(cluster!);
  const target = (name: string) => ({ kind: 'deployment' as const, name, namespace: ns });
  const WORKLOADS = ['paused', 'gone', 'a', 'b', 'lean', 'still', 'busy', 'bounded'];

  before(async () => {
    await kubectl(['create', 'namespace', ns]);
    for (const name of WORKLOADS) {
      await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment(name, [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })));
    }
    for (const name of WORKLOADS) await kubectl(['-n', ns, 'rollout', 'status', `deployment/${name}`, '--timeout=90s']);
  });
  after(() => removeNamespace(kubectl, ns));

  test('a watch the API server ends mid-follow is resumed from where it was; the follow ends complete', async () => {
    const client = new CountingClient(loadKubeconfig(cluster!.kubeconfigPath), { watchTimeoutSeconds: 1 });
    try {
      await kubectl(['-n', ns, 'rollout', 'pause', 'deployment/paused']);
      const initial = await patchImage(kubectl, ns, 'paused', 'v2');
      const following = followRollout(client, target('paused'), { timeoutMs: 120_000, container: 'app', initial });
      // Three watches: the first and two resumed after the API server ended them.
      await waitFor(() => client.watchQueries.length >= 3, { timeoutMs: 30_000, what: 'the watch resumed twice' });
      assert.equal(client.watchesOpen().length, 1, 'one shared watch');
      const versions = client.watchQueries.map((q) => Number(q.resourceVersion));
      assert.equal(versions[0], Number(initial.metadata.resourceVersion), 'started at the PATCH answer');
      for (let i = 1; i < versions.length; i++) assert.ok(versions[i] >= versions[i - 1], `resumed from the last seen: ${versions}`);
      assert.ok(client.watchQueries.every((q) => q.allowWatchBookmarks === 'true' && q.timeoutSeconds === '1'));
      await kubectl(['-n', ns, 'rollout', 'resume', 'deployment/paused']);
      const outcome = await following;
      assert.equal(outcome.state, 'complete', outcome.detail);
      assert.equal(client.lists, 0, 'no re-list was needed');
      assert.deepEqual(client.watchesOpen(), [], 'closed with its last follow');
    } finally {
      client.close();
    }
  });

  test('410 Gone: a follow from a resourceVersion the API server no longer has re-lists and ends right', async () => {
    const client = new CountingClient(loadKubeconfig(cluster!.kubeconfigPath));
    try {
      // Paused, so that the list cannot already show the rollout complete: the follow must watch on from it.
      await kubectl(['-n', ns, 'rollout', 'pause', 'deployment/gone']);
      const patched = await patchImage(kubectl, ns, 'gone', 'v2');
      const initial = { ...patched, metadata: { ...patched.metadata, resourceVersion: '1' } };
      const following = followRollout(client, target('gone'), { timeoutMs: 120_000, container: 'app', initial });
      await waitFor(() => client.lists >= 1 && client.watchQueries.length >= 2, { timeoutMs: 30_000, what: 'the re-list and the watch after it' });
      await kubectl(['-n', ns, 'rollout', 'resume', 'deployment/gone']);
      const outcome = await following;
      assert.equal(outcome.state, 'complete', outcome.detail);
      assert.ok(client.lists >= 1, 'the namespace was listed again');
      assert.equal(client.watchQueries[0].resourceVersion, '1');
      // The list's version, not the '1' it was refused or the PATCH's (the list may answer with that one when nothing
      // else was written in between).
      const watchedFrom = client.watchQueries.map((q) => q.resourceVersion);
      assert.ok(watchedFrom.slice(1).some((v) => client.listVersions.includes(v)),
        `the watch went on from the list: watched from ${watchedFrom}, listed at ${client.listVersions}`);
    } finally {
      client.close();
    }
  });

  test('the follows of one namespace share one watch', async () => {
    const client = new CountingClient(loadKubeconfig(cluster!.kubeconfigPath));
    try {
      for (const name of ['a', 'b']) await kubectl(['-n', ns, 'rollout', 'pause', `deployment/${name}`]);
      const [a, b] = [await patchImage(kubectl, ns, 'a', 'v2'), await patchImage(kubectl, ns, 'b', 'v2')];
      const follows = [
        followRollout(client, target('a'), { timeoutMs: 120_000, container: 'app', initial: a }),
        followRollout(client, target('b'), { timeoutMs: 120_000, container: 'app', initial: b }),
      ];
      await waitFor(() => client.watchQueries.length >= 1, { timeoutMs: 10_000, what: 'the watch' });
      for (const name of ['a', 'b']) await kubectl(['-n', ns, 'rollout', 'resume', `deployment/${name}`]);
      const outcomes = await Promise.all(follows);
      assert.deepEqual(outcomes.map((o) => o.state), ['complete', 'complete']);
      assert.equal(client.watchQueries.length, 1, 'one WATCH for both follows');
      assert.equal(client.watchQueries[0].fieldSelector, undefined, 'the namespace, not one workload');
    } finally {
      client.close();
    }
  });

  /**
   * A follow of `name`'s rollout to v2, paused, through a counting client; `body` gets the client, the
   * follow and the controller that stops it (stopped, and the client closed, after `body`).
   */
  async function followPaused(
    name: string,
    options: { stuckFailMs?: number },
    body: (client: CountingClient, following: ReturnType<typeof followRollout>, stop: AbortController) => Promise<void>,
  ): Promise<void> {
    const client = new CountingClient(loadKubeconfig(cluster!.kubeconfigPath));
    const stop = new AbortController();
    try {
      await kubectl(['-n', ns, 'rollout', 'pause', `deployment/${name}`]);
      const initial = await patchImage(kubectl, ns, name, 'v2');
      const follow = { timeoutMs: 120_000, container: 'app', initial, ...options, signal: stop.signal };
      await body(client, followRollout(client, target(name), follow), stop);
    } finally {
      stop.abort();
      client.close();
    }
  }

  test("a still rollout's pods come from the namespace's pod watch, which keeps each pod lean and indexed by workload", () =>
    followPaused('lean', {}, async (client, following, stop) => {
      const pods = { ref: { group: '', version: 'v1', resource: 'pods', namespace: ns } };
      // The follow opens the pod watch once its rollout has been still for a while (5 s).
      await waitFor(() => client.watchSynced(pods), { timeoutMs: 30_000, what: 'the pods watched' });
      const own = [...client.watchedBy(pods, 'lean')!.values()] as any[];
      assert.deepEqual(own.map((p) => p.metadata.name.startsWith('lean-')), [true], 'the paused rollout\'s one pod');
      assert.ok(client.watched(pods)!.size >= WORKLOADS.length, 'every pod of the namespace is watched');
      assert.equal(own[0].metadata.managedFields, undefined);
      assert.deepEqual(Object.keys(own[0].spec.containers[0]).sort(), ['image', 'imagePullPolicy', 'name']);
      assert.deepEqual(own[0].status.containerStatuses.map((c: any) => [c.name, c.ready]), [['app', true]]);
      stop.abort();
      const outcome = await following;
      assert.deepEqual(outcome.pods.map((p) => [p.name, p.ready]), own.map((p) => [p.metadata.name, true]));
    }));

  test('a follow whose watch is heard from reads nothing more; once the watch goes quiet it reads its workload again', () =>
    followPaused('still', { stuckFailMs: 2_000 }, async (client, following, stop) => {
      // Another workload of the namespace changes, again and again, for three times the follow's limit of 2 s.
      for (let i = 0, end = Date.now() + 6_000; Date.now() < end; i++) {
        await kubectl(['-n', ns, 'annotate', '--overwrite', 'deployment/busy', `churn=${i}`]);
      }
      assert.equal(client.gets, 0, 'no read while the watch is heard from');
      await waitFor(() => client.gets >= 1, { timeoutMs: 20_000, what: 'the workload read again once the watch is quiet' });
      stop.abort();
      assert.equal((await following).state, 'timed out');
    }));

  test("a client's calls share a bounded set of connections; a watch that stays open has one of its own", async () => {
    const proxy = new ApiServerProxy(new URL(loadKubeconfig(cluster!.kubeconfigPath).server));
    await proxy.restore();
    const client = new KubeClient({ ...loadKubeconfig(cluster!.kubeconfigPath), server: `https://127.0.0.1:${proxy.port}` });
    const stop = new AbortController();
    try {
      await kubectl(['-n', ns, 'rollout', 'pause', 'deployment/bounded']);
      const initial = await patchImage(kubectl, ns, 'bounded', 'v2');
      const following = followRollout(client, target('bounded'), { timeoutMs: 120_000, container: 'app', initial, signal: stop.signal });
      await waitFor(() => proxy.peak >= 1, { timeoutMs: 10_000, what: 'the watch connected' });
      // Three times the bound of calls at once, each its own GET of the workload, while the watch stays open.
      const calls = KUBE_LIMITS.maxConnections * 3;
      const ref = { group: 'apps', version: 'v1', resource: 'deployments', namespace: ns, name: 'bounded' };
      const read = await Promise.all(Array.from({ length: calls }, () => client.get<any>(ref)));
      assert.equal(read.filter((d) => d.metadata.name === 'bounded').length, calls, 'every call answered');
      assert.ok(proxy.peak <= KUBE_LIMITS.maxConnections + 1, `${proxy.peak} connections at once`);
      stop.abort();
      assert.equal((await following).state, 'timed out');
    } finally {
      stop.abort();
      client.close();
      await proxy.cut();
    }
  });
});

/** The namespace, with Deployments web and api (container app at v1) of this many replicas. */
async function webAndApi(kubectl: Kubectl, ns: string, replicas: number): Promise<void> {
  await kubectl(['create', 'namespace', ns]);
  for (const name of ['web', 'api'])
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment(name, [{ name: 'app', image: acrImage('v1') }], { replicas })));
}

describe('a Role without watch: the executable polls, with one warning', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('nowatch');
  const kubectl = kubectlFor(cluster!);
  let wh: Webhook;
  const dir = makeTempDir('watch-test-');

  /** A ServiceAccount with these rules, and a JSON kubeconfig that authenticates as it. */
  async function account(name: string, workloadVerbs: string[]): Promise<string> {
    await roleBoundAccount(kubectl, ns, name, [
      { apiGroups: ['apps'], resources: ['deployments'], resourceNames: ['web', 'api'], verbs: workloadVerbs },
      { apiGroups: ['apps'], resources: ['replicasets'], verbs: ['list'] },
      { apiGroups: [''], resources: ['pods'], verbs: ['list'] },
      { apiGroups: [''], resources: ['events'], verbs: ['create'] },
    ]);
    return accountKubeconfig(kubectl, cluster!, ns, name, path.join(dir, `${name}.json`), '10m');
  }
  const push = (name: string, tag: string) =>
    wh.request(`/hooks/up?${new URLSearchParams({ token: TOKEN, ns, workload: `deployment/${name}`, container: 'app', repo_type: 'regionalregistry' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag),
    });

  before(() => webAndApi(kubectl, ns, 1));
  after(async () => {
    await wh?.stop();
    await removeNamespace(kubectl, ns);
  });

  test('get and patch only: both rollouts followed to complete by polling, one warning naming the missing verb', async () => {
    const kubeconfig = await account('nowatch', ['get', 'patch']);
    wh = await startWebhook({ hooks: [upgradeHook('up', TOKEN)], env: { KUBECONFIG: kubeconfig } });
    for (const [name, tag] of [['web', 'v2'], ['api', 'v2']]) assert.equal((await push(name, tag)).status, 200);
    for (const name of ['web', 'api']) await waitForOutput(wh, new RegExp(`deployment/${name} in ${ns}: rollout complete`), 90_000);
    const warnings = wh.output().split('\n').filter((l) => /rollouts are polled/.test(l));
    assert.equal(warnings.length, 1, wh.output());
    assert.match(warnings[0], /cannot "watch" deployments\.apps "(web|api)"/);
    await wh.stop();
  });

  test('the verbs -print-rbac grants (list and watch on the named workloads): followed by watching, no warning', async () => {
    const kubeconfig = await account('named', ['get', 'patch', 'list', 'watch']);
    wh = await startWebhook({ hooks: [upgradeHook('up', TOKEN)], env: { KUBECONFIG: kubeconfig } });
    assert.equal((await push('web', 'v3')).status, 200);
    await waitForOutput(wh, new RegExp(`deployment/web in ${ns}: rollout complete`), 90_000);
    assert.doesNotMatch(wh.output(), /rollouts are polled/);
  });
});

describe('the start-up list: a hook that fixes its workload patches it without a read', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('seeded');
  const kubectl = kubectlFor(cluster!);
  const dir = makeTempDir('watch-seeded-');
  let wh: Webhook | undefined;

  /** The hook pinned to one Deployment of the namespace, as deploy/hooks/web.json is. */
  const pinned = (name: string) => {
    const hook = upgradeHook(name, TOKEN) as Record<string, unknown>;
    const rule = (param: string, value: string) => ({ match: { type: 'value', value, parameter: { source: 'url', name: param } } });
    hook['trigger-rule'] = { and: [rule('token', TOKEN), rule('ns', ns), rule('workload', `deployment/${name}`)] };
    return hook;
  };

  before(() => webAndApi(kubectl, ns, 0));
  after(async () => {
    await wh?.stop();
    await removeNamespace(kubectl, ns);
  });

  test('a Role with list, watch and patch but no get: the first push is applied on the copy the start-up list made', async () => {
    const name = 'noget';
    await roleBoundAccount(kubectl, ns, name, [
      { apiGroups: ['apps'], resources: ['deployments'], verbs: ['list', 'watch', 'patch'] },
      { apiGroups: ['apps'], resources: ['replicasets'], verbs: ['list'] },
      { apiGroups: [''], resources: ['pods'], verbs: ['list', 'watch'] },
      { apiGroups: [''], resources: ['events'], verbs: ['create'] },
    ]);
    const kubeconfig = await accountKubeconfig(kubectl, cluster!, ns, name, path.join(dir, `${name}.json`), '10m');
    const counter = await apiRequestCounter(kubectl, ns, name, loadKubeconfig(kubeconfig));
    try {
      const before = await counter.count();
      wh = await startWebhook({ hooks: [pinned('web'), pinned('api')], verbose: true, env: { KUBECONFIG: kubeconfig } });
      // The start-up list of the served Deployments, before any push.
      await waitFor(async () => (await counter.count()).dispatched > before.dispatched, { timeoutMs: 30_000, what: 'the start-up list' });
      const query = new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/web', container: 'app', repo_type: 'regionalregistry' });
      const answer = await wh.request(`/hooks/web?${query}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload('v2') });
      assert.equal(answer.status, 200, answer.body);
      assert.match(answer.body, /^action: +image updated$/m);
      const image = await kubectl(['-n', ns, 'get', 'deployment/web', '-o', 'jsonpath={.spec.template.spec.containers[0].image}']);
      assert.equal(image, acrImage('v2'));
      assert.doesNotMatch(wh.output(), /cannot "get"/);
    } finally {
      await counter.remove();
    }
  });
});
