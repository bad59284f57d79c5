/*
 * The pure parts of the newest-push-wins rule and of the records it keeps on the workload: when a
 * push was pushed, what a recorded push makes of another, the guarded annotation patch, and the
 * rollback line. The cluster-facing behaviour is proven in replicas, rollback, resume and outage.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  decidePush, decisionAction, formatRollback, LAST_PUSH_ANNOTATION, locateContainer, planPatch, pushTime, readFollowRecords, readPushRecords,
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
  test('a push with neither digest nor time is a repeat only within the window', () => {
    const r = record({ push: '|', appliedAt: new Date(now - 59_000).toISOString() });
    assert.equal(decidePush(r, push({ push: '|', pushedAtMs: now }), now).kind, 'repeat');
    assert.equal(decidePush(r, push({ push: '|', pushedAtMs: now + 2_000 }), now + 2_000).kind, 'apply');
  });
  test('the answers say what the record holds', () => {
    assert.equal(decisionAction({ kind: 'superseded', record: record() }, now),
      'none (superseded: a newer push, reg.example/shop/app:v2 pushed at 2024-05-20T10:41:07.000Z, was applied already)');
    assert.equal(decisionAction({ kind: 'repeat', record: record() }, now), 'none (the same push was applied 1m0s ago: a repeated notification)');
    assert.equal(decisionAction({ kind: 'repeat', record: record({ rolledBack: 'why' }) }, now),
      'none (the same push was applied 1m0s ago and rolled back: a repeated notification)');
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
