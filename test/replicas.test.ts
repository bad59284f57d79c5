/*
 * Several replicas of the built executable against one real test cluster: which push wins is
 * decided on the workload itself (the webhook/last-push annotation, written in the image's PATCH
 * under a `test` of the value read), not in one process's memory. So pushes delivered to three
 * replicas in shuffled order, with repeats, end on the newest; each is applied at most once; and
 * a replica started afterwards still knows what was applied.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { startWebhook, type Response, type Webhook } from './harness.ts';
import {
  acrImage, acrPayload, clusterOrSkip, containerImage, deployment, freshNamespaceName, kubectlFor, namespacedGetter,
  removeNamespace,
} from './cluster/kube.ts';
import { upgradeHook } from './upgrade-hooks.ts';

const TOKEN = 'replicas-token-5c1e9a';
const cluster = await clusterOrSkip();

/** The action line of an answer. */
const actionOf = (res: Response) => /^action: +(.*)$/m.exec(res.body)?.[1] ?? `(no action line) ${res.status} ${res.body}`;
const APPLIED = /^image updated$/;
const SUPERSEDED = /^none \(superseded: a newer push, \S+ pushed at \S+, was applied already\)$/;
const REPEATED = /^none \(the same push was applied \S+ ago: a repeated notification\)$/;

/** Fisher–Yates with a seeded generator, so a failing order can be replayed from the log. */
function shuffled<T>(items: T[], seed: number): T[] {
  const out = [...items];
  let s = seed;
  const next = () => ((s = (s * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1));
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}

describe('three replicas, one workload: the newest push wins', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('replicas');
  const kubectl = kubectlFor(cluster!);
  const getJson = namespacedGetter(kubectl, ns);
  const replicas: Webhook[] = [];
  // An hour ago, whole seconds: payload times older than any receipt time of this run.
  const base = Math.floor(Date.now() / 1000) * 1000 - 3_600_000;
  /** Push i: tag t<i>, pushed i seconds after base, its own digest; the same text when delivered again. */
  const payloads = Array.from({ length: 20 }, (_, i) =>
    acrPayload(`t${String(i).padStart(2, '0')}`, 'shop/web-api', { pushed_at: new Date(base + i * 1000).toISOString() }),
  );
  const push = (replica: Webhook, body: string) =>
    replica.request(`/hooks/deploy?${new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/web', container: 'app', repo_type: 'regionalregistry' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body,
    });

  before(async () => {
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('web', [{ name: 'app', image: acrImage('t-start') }], { replicas: 1 })));
    const hooks = [upgradeHook('deploy', TOKEN)];
    for (let i = 0; i < 3; i++) replicas.push(await startWebhook({ hooks, env: { KUBECONFIG: cluster!.kubeconfigPath } }));
  });
  after(async () => {
    await Promise.all(replicas.map((r) => r.stop()));
    await removeNamespace(kubectl, ns);
  });

  test('30 deliveries (20 pushes, 10 repeats) in shuffled order across 3 replicas: ends on the newest, each applied at most once', async () => {
    const seed = Date.now() % 2 ** 31;
    const repeats = [19, 0, 7, 19, 12, 3, 15, 18, 7, 10];
    const deliveries = shuffled([...payloads.map((_, i) => i), ...repeats], seed);
    const answers = await Promise.all(deliveries.map((i, n) => push(replicas[n % 3], payloads[i]).then((res) => ({ i, res }))));
    const context = `seed ${seed}, order ${deliveries.join(',')}\n${answers.map(({ i, res }) => `t${i}: ${res.status} ${actionOf(res)}`).join('\n')}`;
    for (const { res } of answers) {
      assert.equal(res.status, 200, `${res.body}\n${context}`);
      const action = actionOf(res);
      assert.ok(APPLIED.test(action) || SUPERSEDED.test(action) || REPEATED.test(action), `${action}\n${context}`);
    }
    const appliedPerPush = new Map<number, number>();
    for (const { i, res } of answers) if (APPLIED.test(actionOf(res))) appliedPerPush.set(i, (appliedPerPush.get(i) ?? 0) + 1);
    assert.deepEqual([...appliedPerPush.values()].filter((n) => n > 1), [], `a push applied twice\n${context}`);
    assert.equal(appliedPerPush.get(19), 1, `the newest push is applied, once\n${context}`);
    const d = await getJson('deployment/web');
    assert.equal(containerImage(d, 'app'), acrImage('t19'), context);
    const record = JSON.parse(d.metadata.annotations['webhook/last-push']).app;
    assert.equal(record.image, acrImage('t19'));
    assert.equal(record.pushedAt, new Date(base + 19_000).toISOString());
    assert.equal(record.timeFrom, 'payload');
  });

  test('afterwards, on any replica or a new one: an older push is superseded, the newest is a repeat; nothing changes', async () => {
    // The pod template, not metadata.generation: a Deployment's generation also counts annotation
    // changes, such as a replica taking a finished follow's record off.
    const template = JSON.stringify((await getJson('deployment/web')).spec.template);
    const seen: string[] = [];
    const fresh = await startWebhook({ hooks: [upgradeHook('deploy', TOKEN)], env: { KUBECONFIG: cluster!.kubeconfigPath } });
    try {
      for (const replica of [...replicas, fresh]) {
        const older = await push(replica, payloads[4]);
        seen.push(older.body);
        assert.equal(older.status, 200, older.body);
        const newestAt = new Date(base + 19_000).toISOString();
        assert.equal(actionOf(older), `none (superseded: a newer push, ${acrImage('t19')} pushed at ${newestAt}, was applied already)`);
        assert.match(older.body, /^result: +ok$/m);
        const newest = await push(replica, payloads[19]);
        seen.push(newest.body);
        assert.match(actionOf(newest), REPEATED);
      }
    } finally {
      await fresh.stop();
    }
    const d = await getJson('deployment/web');
    assert.equal(JSON.stringify(d.spec.template), template, seen.join('\n'));
    assert.equal(containerImage(d, 'app'), acrImage('t19'));
  });

  test('a push newer than the record is applied by whichever replica gets it, and records the image before it', async () => {
    const newer = acrPayload('t20', 'shop/web-api', { pushed_at: new Date(base + 20_000).toISOString() });
    const res = await push(replicas[1], newer);
    assert.equal(actionOf(res), 'image updated', res.body);
    const record = JSON.parse((await getJson('deployment/web')).metadata.annotations['webhook/last-push']).app;
    assert.equal(record.image, acrImage('t20'));
    assert.equal(record.previous, acrImage('t19'));
    assert.match(record.request, /\S/);
  });

  test('a payload without a time is ordered by when it was received', async () => {
    const res = await push(replicas[2], JSON.stringify({ ...JSON.parse(acrPayload('t21')), push_data: { tag: 't21' } }));
    assert.equal(actionOf(res), 'image updated', res.body);
    const record = JSON.parse((await getJson('deployment/web')).metadata.annotations['webhook/last-push']).app;
    assert.equal(record.timeFrom, 'received');
    assert.ok(Date.parse(record.pushedAt) > base + 20_000);
  });
});
