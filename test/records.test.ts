/*
 * The pure parts of the newest-push-wins rule and of the records it keeps on the workload: when a
 * push was pushed, what a recorded push makes of another, the guarded annotation patch, and the
 * rollback line. The cluster-facing behaviour is proven in replicas, rollback, resume and outage;
 * here, through the executable and the cluster, that a push from the future stops no later push.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { startWebhook, type Webhook } from './harness.ts';
import { acrImage, acrPayload, clusterOrSkip, containerImage, deployment, freshNamespaceName, kubectlFor } from './cluster/kube.ts';
import { upgradeHook } from './upgrade-hooks.ts';
import {
  decidePush, decisionReason, unchanged, formatRollback, LIMITS, futureTimeNote, LAST_PUSH_ANNOTATION, locateContainer, planPatch, pushTime, readFollowRecords, readPushRecords,
  withPushRecord, type PushRecord,
} from '../webhook.ts';

const received = new Date('2030-01-01T00:00:00Z');
const record = (over: Partial<PushRecord> = {}): PushRecord => ({
  pushedAt: '2024-05-20T10:41:07.000Z', timeFrom: 'payload', image: 'reg.example/shop/app:v2', push: 'sha256:aa|2024-05-20 10:41:07',
  previous: 'reg.example/shop/app:v1', appliedAt: '2029-12-31T23:59:00.000Z', ...over,
});

describe('pushTime', () => {
  test("each registry's time, else the time received", () => {
    assert.deepEqual(pushTime('1716201667', received), { ms: 1716201667_000, from: 'payload' }, 'Docker Hub: epoch seconds');
    assert.deepEqual(pushTime('1716201667123', received), { ms: 1716201667123, from: 'payload' }, 'epoch milliseconds');
    assert.deepEqual(pushTime('2024-05-20 10:41:07', received), { ms: Date.parse('2024-05-20T10:41:07Z'), from: 'payload' }, 'ACR: no zone, read as UTC');
    assert.deepEqual(pushTime('2024-05-20T12:41:07+02:00', received), { ms: Date.parse('2024-05-20T10:41:07Z'), from: 'payload' });
    for (const none of ['', '  ', 'yesterday', '0']) assert.deepEqual(pushTime(none, received), { ms: received.getTime(), from: 'received' }, JSON.stringify(none));
  });
  test('a payload time more than the skew after receipt is the time received, and says what it was', () => {
    const at = received.getTime();
    assert.deepEqual(pushTime(String((at + LIMITS.upgrade.futurePushSkewMs) / 1000), received), { ms: at + LIMITS.upgrade.futurePushSkewMs, from: 'payload' }, 'a clock just ahead');
    assert.deepEqual(pushTime(String((at + LIMITS.upgrade.futurePushSkewMs) / 1000 + 1), received), { ms: at, from: 'received', future: at + LIMITS.upgrade.futurePushSkewMs + 1000 });
    assert.deepEqual(pushTime('2099-01-01 00:00:00', received), { ms: at, from: 'received', future: Date.parse('2099-01-01T00:00:00Z') });
    assert.equal(futureTimeNote('payload', Date.parse('2030-01-01T01:00:00Z'), at),
      "the payload's push time 2030-01-01T01:00:00.000Z is 1h0m0s after it was received (more than 5m0s ahead): the time received is recorded instead");
  });
});

describe('decidePush', () => {
  const now = Date.parse('2030-01-01T00:00:00Z');
  const push = (over: Partial<{ pushedAtMs: number; image: string; push: string }> = {}) => ({
    pushedAtMs: Date.parse('2024-05-20T10:41:07Z'), timeFrom: 'payload' as const, image: 'reg.example/shop/app:v2', push: 'sha256:aa|2024-05-20 10:41:07', ...over,
  });
  test('no record: apply', () => assert.deepEqual(decidePush(undefined, push(), now), { kind: 'apply' }));
  test('the recorded push again, however long after: a repeat (the image compared normalised)', () => {
    assert.equal(decidePush(record(), push(), now).kind, 'repeat');
    assert.equal(decidePush(record({ image: 'docker.io/library/nginx:1' }), push({ image: 'nginx:1' }), now).kind, 'repeat');
  });
  test('older: superseded; newer or as new: apply', () => {
    assert.equal(decidePush(record(), push({ pushedAtMs: Date.parse('2024-05-20T10:41:06Z'), push: 'x|y' }), now).kind, 'superseded');
    assert.equal(decidePush(record(), push({ pushedAtMs: Date.parse('2024-05-20T10:41:08Z'), push: 'x|y' }), now).kind, 'apply');
    assert.equal(decidePush(record(), push({ push: 'sha256:bb|2024-05-20 10:41:07' }), now).kind, 'apply', 'same time, another digest');
  });
  test('a payload time and a receipt time are not compared: arrival order', () => {
    assert.equal(decidePush(record(), { ...push({ push: '|' }), timeFrom: 'received', pushedAtMs: Date.parse('2024-05-20T10:00:00Z') }, now).kind, 'apply');
    assert.equal(decidePush(record({ timeFrom: 'received' }), push({ pushedAtMs: Date.parse('2024-05-20T10:00:00Z'), push: 'x|y' }), now).kind, 'apply');
    assert.equal(decidePush(record({ timeFrom: 'received' }), { ...push({ push: '|' }), timeFrom: 'received', pushedAtMs: Date.parse('2024-05-20T10:00:00Z') }, now).kind, 'superseded');
  });
  test('a record from the future holds no push off: it is replaced, and the decision says which', () => {
    const future = record({ pushedAt: '2099-01-01T00:00:00.000Z' });
    assert.deepEqual(decidePush(future, push({ pushedAtMs: now, push: 'x|y' }), now), { kind: 'apply', replacesFuture: future });
    assert.deepEqual(decidePush(future, { ...push({ push: '|' }), timeFrom: 'received', pushedAtMs: now }, now), { kind: 'apply', replacesFuture: future });
    const ahead = record({ pushedAt: new Date(now + LIMITS.upgrade.futurePushSkewMs).toISOString() });
    assert.equal(decidePush(ahead, push({ pushedAtMs: now, push: 'x|y' }), now).kind, 'superseded', 'within the skew: a clock ahead');
    assert.equal(decidePush(future, push({ push: future.push }), now).kind, 'repeat', 'the recorded push itself again');
    assert.equal(futureTimeNote('record', Date.parse(future.pushedAt), now, future.image),
      'the recorded push (reg.example/shop/app:v2, pushed at 2099-01-01T00:00:00.000Z) is 604848h0m0s in the future (more than 5m0s ahead): it holds no push off and is replaced');
  });
  test('a push with neither digest nor time is a repeat only within the window', () => {
    const r = record({ push: '|', appliedAt: new Date(now - 59_000).toISOString() });
    assert.equal(decidePush(r, push({ push: '|', pushedAtMs: now }), now).kind, 'repeat');
    assert.equal(decidePush(r, push({ push: '|', pushedAtMs: now + 2_000 }), now + 2_000).kind, 'apply');
  });
  test('the answers say what the record holds', () => {
    assert.equal(decisionReason({ kind: 'superseded', record: record() }, now),
      'superseded: a newer push, reg.example/shop/app:v2 pushed at 2024-05-20T10:41:07.000Z, was applied already');
    assert.equal(decisionReason({ kind: 'repeat', record: record() }, now), 'the same push was applied 1m0s ago: a repeated notification');
    assert.equal(decisionReason({ kind: 'repeat', record: record({ rolledBack: 'why' }) }, now),
      'the same push was applied 1m0s ago and rolled back: a repeated notification');
  });
  test("a decision's reason is data; the answer's action says it as the closed list of decisions says", () => {
    assert.deepEqual(unchanged('repeat', 'a repeated notification'),
      { decision: 'repeat', reason: 'a repeated notification', action: 'none (a repeated notification)' });
    assert.deepEqual(unchanged('waiting', 'waiting for approval until 2024-05-21T10:41:07.000Z'), {
      decision: 'waiting', reason: 'waiting for approval until 2024-05-21T10:41:07.000Z',
      action: 'waiting for approval until 2024-05-21T10:41:07.000Z',
    });
  });
});

describe('the records on the workload', () => {
  test('read per container; malformed text or entries are no record', () => {
    const raw = withPushRecord({}, 'app', record());
    const workload = { metadata: { annotations: { [LAST_PUSH_ANNOTATION]: raw } } };
    assert.deepEqual(readPushRecords(workload), { raw, records: { app: record() } });
    assert.deepEqual(readPushRecords({ metadata: { annotations: { [LAST_PUSH_ANNOTATION]: '{not json' } } }), { raw: '{not json', records: {} });
    assert.deepEqual(readPushRecords({ metadata: { annotations: { [LAST_PUSH_ANNOTATION]: '{"app":{"image":1}}' } } }).records, {});
    assert.deepEqual(readPushRecords({ metadata: {} }), { raw: undefined, records: {} });
    const follow = '{"app":{"request":"r","hook":"h","deadline":"2030-01-01T00:00:00.000Z"},"x":{"request":"r"}}';
    assert.deepEqual(Object.keys(readFollowRecords({ metadata: { annotations: { 'webhook/follow': follow } } }).entries), ['app']);
  });
  test('the patch tests the record as read (absent: null) and writes it with change-cause', () => {
    const obj = { metadata: { name: 'w', annotations: { x: 'y' } }, spec: { template: { spec: { containers: [{ name: 'app', image: 'a:1' }] } } } };
    const located = locateContainer(obj.spec.template.spec, 'app')!;
    const ops = planPatch(obj, 'deployment', 'app', located, { image: 'a:2', changeCause: 'why', guarded: { [LAST_PUSH_ANNOTATION]: { value: 'new', read: undefined } } });
    assert.deepEqual(ops.slice(3), [
      { op: 'test', path: '/metadata/annotations/webhook~1last-push', value: null },
      { op: 'add', path: '/metadata/annotations/kubernetes.io~1change-cause', value: 'why' },
      { op: 'add', path: '/metadata/annotations/webhook~1last-push', value: 'new' },
    ]);
    const read = planPatch(obj, 'deployment', 'app', located, { image: 'a:2', changeCause: 'why', guarded: { [LAST_PUSH_ANNOTATION]: { value: 'new', read: 'old' } } });
    assert.deepEqual(read[3], { op: 'test', path: '/metadata/annotations/webhook~1last-push', value: 'old' });
    const bare = { ...obj, metadata: { name: 'w' } };
    assert.deepEqual(planPatch(bare, 'deployment', 'app', located, { image: 'a:2', changeCause: 'why', guarded: { [LAST_PUSH_ANNOTATION]: { value: 'new', read: undefined } } }).slice(3), [
      { op: 'test', path: '/metadata/annotations', value: null },
      { op: 'add', path: '/metadata/annotations', value: { 'kubernetes.io/change-cause': 'why', [LAST_PUSH_ANNOTATION]: 'new' } },
    ]);
  });
  test('the rollback line', () => {
    assert.equal(formatRollback({ reason: 'the rollout of a:2 failed: x', image: 'a:1', rollout: { state: 'complete', detail: '1/1 pods updated and available', pods: [] } }),
      'rolled back to a:1: the rollout of a:2 failed: x; its rollout complete (1/1 pods updated and available)');
    assert.equal(formatRollback({ reason: 'the rollout of a:2 failed: x', notDone: 'a newer push (a:3, pushed at t) was applied meanwhile' }),
      'not rolled back: a newer push (a:3, pushed at t) was applied meanwhile; the rollout of a:2 failed: x');
  });
});

const cluster = await clusterOrSkip();

describe('a push from the future, through the executable and the cluster', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('future');
  const kubectl = kubectlFor(cluster!);
  const TOKEN = 'future-token-3e8d1c';
  let wh: Webhook;
  const push = (body: string) =>
    wh.request(`/hooks/deploy?${new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/web', container: 'app', repo_type: 'regionalregistry' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body,
    });
  const recordOnWorkload = async () => {
    const d = JSON.parse(await kubectl(['-n', ns, 'get', 'deployment/web', '-o', 'json']));
    return { image: containerImage(d, 'app'), record: JSON.parse(d.metadata.annotations[LAST_PUSH_ANNOTATION]).app as PushRecord };
  };

  before(async () => {
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('web', [{ name: 'app', image: acrImage('v0') }], { replicas: 1 })));
    wh = await startWebhook({ hooks: [upgradeHook('deploy', TOKEN)], env: { KUBECONFIG: cluster!.kubeconfigPath } });
  });
  after(async () => {
    await wh?.stop();
    if (!process.env.KEEP_NAMESPACE) await kubectl(['delete', 'namespace', ns, '--wait=false']).catch(() => undefined);
  });

  test('a payload time years ahead is recorded as the time received, and the next real push applies', async () => {
    const sent = Date.now();
    const future = await push(acrPayload('v1', 'shop/web-api', { pushed_at: '2099-01-01 00:00:00' }));
    assert.equal(future.status, 200, future.body);
    assert.match(future.body, /^action: +image updated$/m);
    assert.match(future.body, /^note: +the payload's push time 2099-01-01T00:00:00\.000Z is \S+ after it was received \(more than 5m0s ahead\): the time received is recorded instead$/m);
    const first = await recordOnWorkload();
    assert.equal(first.record.timeFrom, 'received');
    assert.ok(Date.parse(first.record.pushedAt) >= sent - 1000 && Date.parse(first.record.pushedAt) <= Date.now(), first.record.pushedAt);

    const next = await push(acrPayload('v2'));
    assert.match(next.body, /^action: +image updated$/m, next.body);
    assert.equal((await recordOnWorkload()).image, acrImage('v2'));
  });

  test('a record already holding a far-future time is replaced by a newer push, with a warning', async () => {
    const { record } = await recordOnWorkload();
    const planted = { ...record, pushedAt: '2099-01-01T00:00:00.000Z', timeFrom: 'payload', push: 'sha256:planted|2099-01-01 00:00:00' };
    await kubectl(['-n', ns, 'annotate', '--overwrite', 'deployment/web', `${LAST_PUSH_ANNOTATION}=${JSON.stringify({ app: planted })}`]);
    const res = await push(acrPayload('v3'));
    assert.match(res.body, /^action: +image updated$/m, res.body);
    assert.match(res.body, /^note: +the recorded push \(\S+:v2, pushed at 2099-01-01T00:00:00\.000Z\) is \S+ in the future \(more than 5m0s ahead\): it holds no push off and is replaced$/m);
    const after = await recordOnWorkload();
    assert.equal(after.image, acrImage('v3'));
    assert.notEqual(after.record.pushedAt, planted.pushedAt);
    assert.match(wh.output(), /the recorded push \(\S+:v2, pushed at 2099-01-01T00:00:00\.000Z\) is \S+ in the future/);
  });
});
