/*
 * A burst of pushes (a monorepo release): the Kubernetes client's bound on its own request rate,
 * proved with a clock the test drives, then on the real test cluster: every call of one client
 * waits its turn in one token bucket, and 200 pushes at once through the built executable all land.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { KubeClient, KubeError, loadKubeconfig, retryDelay, TokenBucket } from '../webhook.ts';
import {
  acrPayload, apfThrottle, apiRequestCounter, clusterOrSkip, containerImage, deployment, freshNamespaceName,
  kubectlFor, removeNamespace, shippedServiceAccount,
} from './cluster/kube.ts';
import { makeTempDir, REPO_ROOT, startWebhook, type Response, type Webhook } from './harness.ts';
import { upgradeHookGuardedBy } from './upgrade-hooks.ts';

/** Where a request reserved at `at` may start: the reservation time plus the wait it was given. */
function starts(bucket: TokenBucket, clock: { t: number }, at: number[]): number[] {
  return at.map((t) => {
    clock.t = t;
    return t + bucket.reserve(Infinity)!;
  });
}

describe('token bucket (a clock the test drives)', () => {
  test('never more than burst + rate × t requests start within any t ms, however they are asked for', () => {
    const clock = { t: 0 };
    const bucket = new TokenBucket(50, 100, () => clock.t);
    // 300 at once, then 100 spread over the next second, then 200 more at once after a pause.
    const asked = [...Array(300).fill(0), ...Array.from({ length: 100 }, (_, i) => i * 10), ...Array(200).fill(9_000)];
    const started = starts(bucket, clock, asked).sort((a, b) => a - b);
    for (let i = 0; i < started.length; i++) {
      for (let j = i; j < started.length; j++) {
        // started[i..j] all began within started[j] - started[i] ms of each other.
        const allowed = 100 + ((started[j] - started[i]) * 50) / 1000;
        assert.ok(j - i + 1 <= allowed + 1e-9, `${j - i + 1} requests within ${started[j] - started[i]} ms`);
      }
    }
  });

  test('the burst goes at once, the rest in arrival order at the rate; idle time refills up to the burst only', () => {
    const clock = { t: 0 };
    const bucket = new TokenBucket(10, 5, () => clock.t);
    assert.deepEqual(starts(bucket, clock, Array(8).fill(0)), [0, 0, 0, 0, 0, 100, 200, 300]);
    // An hour idle is worth 5 tokens, not 36 000.
    assert.deepEqual(starts(bucket, clock, Array(7).fill(3_600_000)).map((t) => t - 3_600_000), [0, 0, 0, 0, 0, 100, 200]);
  });

  test('a caller that cannot wait long enough takes no turn from the callers after it', () => {
    const clock = { t: 0 };
    const bucket = new TokenBucket(10, 1, () => clock.t);
    assert.equal(bucket.reserve(0), 0);
    assert.equal(bucket.reserve(99), undefined);
    assert.equal(bucket.reserve(1_000), 100);
    assert.equal(bucket.reserve(1_000), 200);
  });
  test('a background request (a rollout poll) takes a token only above the headroom, so the others keep it', () => {
    const clock = { t: 0 };
    const bucket = new TokenBucket(10, 4, () => clock.t);
    assert.equal(bucket.takeAbove(2), 0, 'four tokens: one may go');
    assert.equal(bucket.takeAbove(2), 0, 'three: one may go');
    assert.equal(bucket.takeAbove(2), 100, 'two left: it waits until there are three');
    // Waiting took nothing: the interactive callers still have their two at once.
    assert.deepEqual(starts(bucket, clock, [0, 0, 0]), [0, 0, 100]);
    clock.t = 100;
    assert.equal(bucket.takeAbove(2), 300, 'the debt paid, then three back');
    clock.t = 400;
    assert.equal(bucket.takeAbove(2), 0);
  });

  test('callers throttled together (one Retry-After) retry spread over their backoff, never before the Retry-After', () => {
    const throttled = { verb: 'get' as const, status: 429, retryAfterSeconds: 1 };
    assert.equal(retryDelay(throttled, 0, 20_000, () => 0), 1_000);
    assert.equal(retryDelay(throttled, 0, 20_000, () => 0.999), 1_199);
    assert.equal(retryDelay(throttled, 3, 20_000, () => 0.5), 1_800);
    assert.equal(retryDelay(throttled, 3, 1_700, () => 0.5), undefined, 'past the budget');
  });
});

const cluster = await clusterOrSkip();

describe('burst on a real cluster', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('burst');
  const kubectl = kubectlFor(cluster!);
  const dir = makeTempDir('burst-');
  const PUSHES = 200;
  const names = Array.from({ length: PUSHES }, (_, i) => `svc-${String(i).padStart(3, '0')}`);
  const image = (name: string, tag: string) => `registry.cn-hangzhou.aliyuncs.com/shop/${name}:${tag}`;
  let sa: Awaited<ReturnType<typeof shippedServiceAccount>>;
  let counter: Awaited<ReturnType<typeof apiRequestCounter>>;

  before(async () => {
    await kubectl(['create', 'namespace', ns]);
    // No replicas: what is measured is the patches, not kwok starting 200 pods.
    const items = names.map((n) => deployment(n, [{ name: 'app', image: image(n, 'v1') }], { replicas: 0 }));
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
    sa = await shippedServiceAccount(kubectl, cluster!, ns, [path.join(REPO_ROOT, 'deploy', 'serviceaccount.yaml'), path.join(REPO_ROOT, 'deploy', 'rbac-cluster.yaml')], dir);
    counter = await apiRequestCounter(kubectl, ns, 'webhook', loadKubeconfig(sa.kubeconfig));
  });
  after(async () => {
    await counter?.remove();
    await sa?.remove();
    await removeNamespace(kubectl, ns);
  });

  test('every call of one client takes its turn in the one bucket: waits in arrival order, nothing unaccounted', async () => {
    const waits: (number | undefined)[] = [];
    // The clock stands still, so each turn's wait is exactly what the bucket owes, not what time did.
    const bucket = new (class extends TokenBucket {
      reserve(maxWaitMs: number) {
        const w = super.reserve(maxWaitMs);
        waits.push(w);
        return w;
      }
    })(10, 5, () => 0);
    const client = new KubeClient(loadKubeconfig(sa.kubeconfig), { rate: bucket, retryBudgetMs: 60_000 });
    const before = await counter.count();
    try {
      const ref = (name: string) => ({ group: 'apps', version: 'v1', resource: 'deployments', namespace: ns, name });
      const got = await Promise.all(names.slice(0, 30).map((n) => client.get<{ metadata: { name: string } }>(ref(n))));
      assert.deepEqual(got.map((d) => d.metadata.name), names.slice(0, 30));
    } finally {
      client.close();
    }
    assert.deepEqual(waits, [0, 0, 0, 0, 0, ...Array.from({ length: 25 }, (_, i) => (i + 1) * 100)]);
    const after = await counter.count();
    assert.equal(after.dispatched + after.rejected - before.dispatched - before.rejected, 30, 'requests the API server saw');
  });

  test('a call whose turn lies beyond its retry budget fails at once, saying so, and sends nothing', async () => {
    // One request every 4 s, and 2 s to spare: the second call's turn is out of its reach.
    const bucket = new TokenBucket(0.25, 1, () => 0);
    const client = new KubeClient(loadKubeconfig(sa.kubeconfig), { rate: bucket, retryBudgetMs: 2_000 });
    const ref = { group: 'apps', version: 'v1', resource: 'deployments', namespace: ns, name: names[0] };
    const before = await counter.count();
    try {
      await client.get(ref);
      await assert.rejects(client.get(ref), (e: KubeError) =>
        e instanceof KubeError && e.reason === 'ClientRateLimited' &&
        e.message === `cannot get deployments.apps "${names[0]}" in namespace "${ns}": this client's own rate limit ` +
          '(0.25 requests/s, burst 1) has no turn for it within 2s');
    } finally {
      client.close();
    }
    const after = await counter.count();
    assert.equal(after.dispatched + after.rejected - before.dispatched - before.rejected, 1);
  });

  /** One hook for the namespace: the workload and container come from the URL. */
  const releaseHooks = () => [upgradeHookGuardedBy('release', { match: { type: 'value', value: ns, parameter: { source: 'url', name: 'ns' } } })];
  const push = (wh: Webhook, name: string, tag: string) => {
    const query = new URLSearchParams({ ns, workload: `deployment/${name}`, container: 'app', repo_type: 'regionalregistry' });
    const headers = { 'Content-Type': 'application/json' };
    return wh.request(`/hooks/release?${query}`, { method: 'POST', headers, body: acrPayload(tag, `shop/${name}`) });
  };
  /** Every push answered "image updated", and every Deployment of `pushed` runs `tag` now. */
  const assertLanded = async (pushed: string[], answers: Response[], tag: string) => {
    const failed = answers.map((a, i) => ({ ...a, name: pushed[i] }))
      .filter((a) => a.status !== 200 || !/^action: +image updated$/m.test(a.body));
    assert.deepEqual(failed.map((a) => `${a.name}: ${a.status} ${a.body}`), []);
    const list = JSON.parse(await kubectl(['-n', ns, 'get', 'deployments', '-o', 'json'])).items
      .filter((d: any) => pushed.includes(d.metadata.name));
    const stale = list.filter((d: any) => containerImage(d, 'app') !== image(d.metadata.name, tag));
    assert.deepEqual(stale.map((d: any) => d.metadata.name), []);
    assert.equal(list.length, pushed.length);
  };

  test(`${PUSHES} pushes at once for ${PUSHES} Deployments through the executable: all answered, all applied`, async () => {
    const wh = await startWebhook({ hooks: releaseHooks(), verbose: false, env: { KUBECONFIG: sa.kubeconfig } });
    const before = await counter.count();
    let answers;
    try {
      answers = await Promise.all(names.map((n) => push(wh, n, 'v2')));
    } finally {
      await wh.stop();
    }
    await assertLanded(names, answers, 'v2');
    const after = await counter.count();
    // Each push reads and patches its Deployment at least; 429s, if any, were waited out above.
    assert.ok(after.dispatched - before.dispatched >= 2 * PUSHES, JSON.stringify({ before, after }));
  });

  test('a burst the API server throttles (Priority and Fairness 429s): every 429 waited out, every push applied', async () => {
    // Fewer pushes than above: each one's rollout is polled every second, and polls beyond the
    // client's rate would queue ahead of the retries of the pushes still being applied.
    const pushed = names.slice(0, 20);
    // A priority level with no seats of its own: while its one request runs, the others get 429.
    const throttle = await apfThrottle(kubectl, ns, 'webhook', loadKubeconfig(sa.kubeconfig));
    const wh = await startWebhook({ hooks: releaseHooks(), verbose: false, env: { KUBECONFIG: sa.kubeconfig } });
    let release = await throttle.hold();
    try {
      const before = await throttle.rejected();
      const answers = Promise.all(pushed.map((n) => push(wh, n, 'v3')));
      await throttle.rejectedBeyond(before);
      release();
      release = () => undefined;
      await assertLanded(pushed, await answers, 'v3');
    } finally {
      release();
      await wh.stop();
      await throttle.remove();
    }
  });
});
