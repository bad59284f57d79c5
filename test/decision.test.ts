// What became of a push, as data: the closed list of decisions every report renders, the verdict
// on a followed rollout (failed? rolled back?) and why a failed rollout cannot be rolled back. Pure
// functions over tables of cases; the cluster suites (rollback, e2e, deliveries) show the same
// decisions end to end.

import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { describe, test } from 'node:test';
import {
  decide, DECISIONS, deliveryFacts, newReport, published, pushEvent, readHookConfig, recordUnchanged, resultSettings, rollbackObstacle,
  rolloutEvent, rolloutVerdict, unchanged,
  type Decision, type DecisionInput, type Push, type PushRecord, type RolloutOutcome, type Delivery,
} from '../webhook.ts';

const rollout = (state: RolloutOutcome['state']): RolloutOutcome => ({ state, detail: state, pods: [] });

describe('the rollout verdict', () => {
  // [state, ROLLBACK_ON_FAILURE, timeout given, error, roll back]
  const cases: [RolloutOutcome['state'], boolean, number | undefined, string | undefined, boolean][] = [
    ['complete', true, 60_000, undefined, false],
    ['progressing', true, 60_000, undefined, false],
    ['not tracked', true, undefined, undefined, false],
    ['failed', false, 60_000, 'the rollout failed (see rollout)', false],
    ['failed', true, 60_000, 'the rollout failed (see rollout)', true],
    ['failed', true, undefined, 'the rollout failed (see rollout)', true],
    ['timed out', false, 300_000, 'the rollout did not complete within 5m0s (see rollout)', false],
    // A rollout that timed out may still complete: it is reported, never rolled back.
    ['timed out', true, 90_000, 'the rollout did not complete within 1m30s (see rollout)', false],
    ['timed out', true, undefined, 'the rollout did not complete (see rollout)', false],
  ];
  for (const [state, rollbackOnFailure, timeoutMs, error, rollBack] of cases)
    test(`${state}, ROLLBACK_ON_FAILURE=${rollbackOnFailure}, timeout ${timeoutMs ?? 'not given'}`, () => {
      assert.deepEqual(rolloutVerdict(rollout(state), rollbackOnFailure, timeoutMs), {
        ...(error !== undefined && { error }),
        rollBack,
      });
    });
});

describe('why a failed rollout is not rolled back', () => {
  const record: PushRecord = {
    pushedAt: '2026-11-25T10:00:00Z', timeFrom: 'payload', image: 'r.io/ns/app:v2', push: 'sha256:aa|',
    previous: 'r.io/ns/app:v1', appliedAt: '2026-11-25T10:00:01Z',
  };
  const raw = JSON.stringify({ app: record });
  const report = { imageAfter: 'r.io/ns/app:v2', lastPush: raw } as Delivery;
  const located = { list: 'containers' as const, index: 0, image: 'r.io/ns/app:v2', pullPolicy: undefined };
  const newer = { ...record, image: 'r.io/ns/app:v3', pushedAt: '2026-11-25T11:00:00Z' };
  const cases: [string, Parameters<typeof rollbackObstacle>, RegExp | undefined][] = [
    ['the push is still the last one: it is rolled back', [report, raw, record, located], undefined],
    ['no record on the workload', [report, undefined, undefined, located], /no record of the push/],
    ['this upgrade wrote no record', [{ ...report, lastPush: undefined }, raw, record, located], /no record of the push/],
    ['a newer push was applied meanwhile', [report, JSON.stringify({ app: newer }), newer, located], /a newer push \(r\.io\/ns\/app:v3/],
    ['the record changed, same image', [report, `${raw} `, record, located], /the push record changed meanwhile/],
    ['the container is gone', [report, raw, record, undefined], /the container was changed meanwhile/],
    ['the container was edited by hand', [report, raw, record, { ...located, image: 'r.io/ns/app:hotfix' }], /changed meanwhile/],
    ['a re-pull has no earlier image', [report, raw, { ...record, previous: 'r.io/ns/app:v2' }, located], /no earlier image/],
  ];
  for (const [name, args, why] of cases)
    test(name, () => {
      const obstacle = rollbackObstacle(...args);
      if (why === undefined) assert.equal(obstacle, undefined);
      else assert.match(obstacle ?? '', why);
    });
});

describe('the decision of a push', () => {
  const of = { hookId: 'web', requestId: 'r1', settings: resultSettings(() => undefined) };
  const result = (report: Delivery) => deliveryFacts(of, undefined, report, new Date(0), '');
  const base = (): Delivery => ({
    ...newReport(),
    imageBefore: 'r.io/ns/app:v2', imageAfter: 'r.io/ns/app:v3',
  });

  test('a push that changes nothing shows the image the container runs, and why', () => {
    const report = base();
    recordUnchanged(report, 'repeat', 'the same push was applied 59s ago: a repeated notification', 'r.io/ns/app:v1');
    assert.equal(report.imageAfter, 'r.io/ns/app:v1');
    assert.equal(report.action, 'none (the same push was applied 59s ago: a repeated notification)');
    assert.deepEqual([published(result(report)), result(report).detail],
      ['no-op', 'the same push was applied 59s ago: a repeated notification']);
  });

  test('each decision is published as schema 1 names it, whatever the action says', () => {
    const words = Object.fromEntries(Object.entries(DECISIONS).map(([code, d]) => [code, d.published]));
    assert.deepEqual(words, {
      applied: 'applied', 're-pulled': 'same image restarted', superseded: 'no-op', repeat: 'no-op', 'no-op': 'no-op',
      refused: 'refused', 'refused: unsigned': 'refused: unsigned', 'refused: platform': 'refused: platform',
      'skipped by policy': 'skipped by policy', held: 'held', failed: 'failed', kept: 'no-op', waiting: 'waiting',
      'waiting: signature': 'waiting: signature', 'waiting: age': 'waiting: age', approved: 'approved', rejected: 'rejected', expired: 'expired',
      'taken over': 'superseded', 'fanned out': 'fanned out', ran: 'ran', running: 'running',
    });
    const unsigned = { ...base(), decision: 'refused: unsigned' as const, result: 'failed' as const, error: 'signature: x is not signed' };
    assert.deepEqual([published(result(unsigned)), result(unsigned).detail], ['refused: unsigned', 'signature: x is not signed']);
    const skipped = { ...base(), ...unchanged('skipped by policy', 'policy: v2.0.0 is outside semver:^1 of deployment/web') };
    assert.deepEqual([published(result(skipped)), result(skipped).detail], ['skipped by policy', 'policy: v2.0.0 is outside semver:^1 of deployment/web']);
    // The action's text once a failed rollout is rolled back does not make an applied push anything else.
    const rolledBack = { ...base(), decision: 'applied' as const, changed: true, action: 'image updated, then rolled back to x' };
    assert.equal(published(result(rolledBack)), 'applied');
  });

  test('refusals and failures are detailed by their error; a rollout taken over is superseded', () => {
    const refused = { ...base(), decision: 'refused' as const, result: 'failed' as const, error: 'image pin: no' };
    assert.deepEqual([published(result(refused)), result(refused).detail], ['refused', 'image pin: no']);
    const taken = {
      ...base(), decision: 'applied' as const, changed: true,
      rollout: { state: 'progressing' as const, detail: 'superseded by a later push', superseded: true as const, pods: [] },
    };
    assert.equal(published(result(taken)), 'superseded');
  });
});

describe('the Event of a push', () => {
  // Operators and the cluster suites read these words: each is the text the Event had before PUSH_EVENTS wrote it.
  const asked = 'hook "web", request r1';
  const push = { container: 'app', image: 'r.io/ns/app:v3', asked };
  const cases: [ReturnType<typeof pushEvent>, string, string, string][] = [
    [pushEvent('applied', { ...push, before: 'r.io/ns/app:v2' }), 'Normal', 'ImageUpdated',
      'container app: image r.io/ns/app:v2 → r.io/ns/app:v3; asked by hook "web", request r1'],
    [pushEvent('re-pulled', push), 'Normal', 'RolloutRestarted',
      'container app: r.io/ns/app:v3 pulled again (same image, rollout restarted); asked by hook "web", request r1'],
    [pushEvent('held', { ...push, why: 'is held: x' }), 'Warning', 'UpgradeHeld',
      'container app: r.io/ns/app:v3 is held: x; asked by hook "web", request r1'],
    [pushEvent('waiting', { ...push, why: 'waits for an approval' }), 'Normal', 'UpgradeWaiting',
      'container app: r.io/ns/app:v3 waits for an approval; asked by hook "web", request r1'],
    [pushEvent('skipped by policy', { why: 'policy: no', asked }), 'Normal', 'UpgradeSkipped',
      'policy: no; asked by hook "web", request r1'],
    [pushEvent('refused', { why: 'image pin: no', asked }), 'Warning', 'UpgradeRefused',
      'image pin: no; asked by hook "web", request r1'],
    [pushEvent('failed', { why: 'container "x" not found', asked }), 'Warning', 'UpgradeFailed',
      'container "x" not found; asked by hook "web", request r1'],
    [pushEvent('dropped', { container: 'app', image: 'r.io/ns/app:v3', hook: 'web', why: 'its seal is wrong' }),
      'Warning', 'UpgradeRefused',
      'container app: the waiting push of "r.io/ns/app:v3" (hook "web") dropped, not deployed: its seal is wrong'],
    [pushEvent('rejected', { container: 'app', image: 'r.io/ns/app:v3', why: 'rejected by li at t' }),
      'Normal', 'UpgradeRejected', 'container app: r.io/ns/app:v3 not deployed: rejected by li at t'],
    [pushEvent('expired', { container: 'app', image: 'r.io/ns/app:v3', why: 'expired: nobody decided by t' }),
      'Normal', 'UpgradeExpired', 'container app: r.io/ns/app:v3 not deployed: expired: nobody decided by t'],
    [pushEvent('rolled back', { container: 'app', image: 'r.io/ns/app:v2', why: 'the rollout failed', asked }),
      'Warning', 'RolledBack', 'container app: rolled back to r.io/ns/app:v2: the rollout failed; hook "web", request r1'],
  ];
  for (const [event, type, reason, message] of cases)
    test(reason, () => assert.deepEqual(event, { type, reason, message }));

  test('a rollout\'s end names the first five pods not ready', () => {
    const pods = [1, 2, 3, 4, 5, 6].map((i) => ({ name: `web-${i}`, ready: i === 1, reason: i === 2 ? undefined : 'ErrImagePull' }));
    const end = (state: RolloutOutcome['state']) => rolloutEvent({ state, detail: 'd', pods } as RolloutOutcome, 'app');
    assert.deepEqual(end('complete'), { type: 'Normal', reason: 'RolloutComplete', message: 'container app: rollout complete: d' });
    const stuck = ' (web-2 not ready, web-3 ErrImagePull, web-4 ErrImagePull, web-5 ErrImagePull, web-6 ErrImagePull)';
    assert.deepEqual(end('failed'), { type: 'Warning', reason: 'RolloutFailed', message: `container app: rollout failed: d${stuck}` });
    assert.deepEqual(end('timed out'), { type: 'Warning', reason: 'RolloutTimedOut', message: `container app: rollout timed out d${stuck}` });
    assert.equal(end('progressing'), undefined);
  });
});

describe('the decision of one push on one workload (decide): each step, as a table', () => {
  const NOW = Date.parse('2026-11-27T12:00:00Z');
  const config = (env: Record<string, string> = {}) => {
    const settings: Record<string, string> = { APP_NS: 'shop', APP_WORKLOAD: 'deployment/web', APP_CONTAINER: 'app', ...env };
    return readHookConfig((name) => settings[name]);
  };
  const workload = (image: string, annotations: Record<string, string> = {}, managedFields: unknown[] = []) => ({
    apiVersion: 'apps/v1', kind: 'Deployment',
    metadata: { name: 'web', namespace: 'shop', uid: 'u-1', annotations, managedFields },
    spec: { template: { spec: { containers: [{ name: 'app', image }] } } },
  });
  const target = { kind: 'deployment' as const, name: 'web', namespace: 'shop' };
  const push = (image: string, pushedAt = '2026-11-27T11:59:00Z', id = 'sha256:ab|', more: Partial<Push> = {}): Push => ({
    image, push: id, pushedAtMs: Date.parse(pushedAt), timeFrom: 'payload', target, cluster: undefined,
    requestId: 'req-1', hookId: 'deploy', ...more,
  });
  const input = (p: Push, w: object, env: Record<string, string> = {}, more: Partial<DecisionInput> = {}): DecisionInput => ({
    push: p, config: config(env), workload: w as Record<string, unknown>, nowMs: NOW, entryId: 'entry-1', ...more,
  });
  const record = (image: string, pushedAt: string, id = 'sha256:00|') => JSON.stringify({
    app: { pushedAt, timeFrom: 'payload', image, push: id, previous: 'r.io/shop/web:v0', appliedAt: pushedAt },
  });
  const approvals = { publicUrl: 'https://webhook.example.test', key: Buffer.alloc(32, 7) };
  const kubectlSet = { manager: 'kubectl-set', operation: 'Update', time: '2026-11-27T11:30:00Z',
    fieldsV1: { 'f:spec': { 'f:template': { 'f:spec': { 'f:containers': { 'k:{"name":"app"}': { 'f:image': {} } } } } } } };

  // [what, input, code, reason (a pattern), Event reason or undefined]
  const cases: [string, DecisionInput, Decision['code'], RegExp, string | undefined][] = [
    ['no such container', input(push('r.io/shop/web:v2'), { ...workload('x'), spec: { template: { spec: { containers: [] } } } }),
      'failed', /container "app" not found/, 'UpgradeFailed'],
    ['the pin refuses another repository', input(push('evil.io/shop/web:v2'), workload('r.io/shop/web:v1')),
      'refused', /evil\.io/, 'UpgradeRefused'],
    ['a tag outside the policy', input(push('r.io/shop/web:v2.0.0'), workload('r.io/shop/web:v1.2.3'), { UPDATE_POLICY: 'patch' }),
      'skipped by policy', /^policy: v2\.0\.0 is outside patch/, 'UpgradeSkipped'],
    ['a malformed policy annotation', input(push('r.io/shop/web:v2'), workload('r.io/shop/web:v1', { 'webhook/policy': 'semver:>>1' })),
      'failed', /webhook\/policy.*nothing was changed$/, 'UpgradeFailed'],
    ['the digest it runs', input(push(`r.io/shop/web@sha256:${'a'.repeat(64)}`), workload(`r.io/shop/web@sha256:${'a'.repeat(64)}`)),
      'no-op', /^already running this digest$/, undefined],
    ['a change made outside webhook, not newer', input(push('r.io/shop/web:v0.9.5', '2026-11-27T11:00:00Z'),
      workload('r.io/shop/web:v0.9.0', { 'webhook/last-push': record('r.io/shop/web:v1.0.0', '2026-11-27T10:00:00Z') }, [kubectlSet])),
      'held', /^held: deployment\/web was set to r\.io\/shop\/web:v0\.9\.0 outside webhook by kubectl-set/, 'UpgradeHeld'],
    ['an older push than the recorded one', input(push('r.io/shop/web:v2', '2026-11-27T10:00:00Z'),
      workload('r.io/shop/web:v3', { 'webhook/last-push': record('r.io/shop/web:v3', '2026-11-27T11:00:00Z') })),
      'superseded', /^superseded: a newer push, r\.io\/shop\/web:v3/, undefined],
    ['the recorded push again', input(push('r.io/shop/web:v3', '2026-11-27T11:00:00Z', 'sha256:00|'),
      workload('r.io/shop/web:v3', { 'webhook/last-push': record('r.io/shop/web:v3', '2026-11-27T11:00:00Z') })),
      'repeat', /^the same push was applied 1h0m0s ago/, undefined],
    ['an approval needed, no links to ask with', input(push('r.io/shop/web:v2'), workload('r.io/shop/web:v1'), { REQUIRE_APPROVAL: 'true' }),
      'failed', /started without -public-url/, undefined],
    ['an approval needed', input(push('r.io/shop/web:v2'), workload('r.io/shop/web:v1'), { REQUIRE_APPROVAL: 'true' }, { approvals }),
      'waiting', /^waiting for approval until 2026-11-28T12:00:00\.000Z$/, 'UpgradeWaiting'],
    ['a decided push whose entry is gone', input(push('r.io/shop/web:v2', undefined, undefined,
      { decided: { id: 'gone-1', action: 'approve', by: 'Li Lei' } }), workload('r.io/shop/web:v1'), {}, { approvals }),
      'failed', /decided already/, undefined],
    ['a new image', input(push('r.io/shop/web:v2'), workload('r.io/shop/web:v1')), 'applied', /./, 'ImageUpdated'],
    ['the same tag again', input(push('r.io/shop/web:v1'), workload('r.io/shop/web:v1')), 're-pulled', /./, 'RolloutRestarted'],
  ];
  for (const [what, given, code, reason, event] of cases)
    test(`${what}: ${code}`, () => {
      const d = decide(given);
      assert.equal(d.code, code, JSON.stringify(d));
      if ('reason' in d) assert.match(d.reason, reason);
      assert.equal('event' in d ? d.event?.reason : undefined, event);
    });

  test('what an apply plans: the image, the change-cause, the record under a test of the value read', () => {
    const before = record('r.io/shop/web:v1', '2026-11-27T10:00:00Z');
    const d = decide(input(push('r.io/shop/web:v2'), workload('r.io/shop/web:v1', { 'webhook/last-push': before })));
    assert.equal(d.code, 'applied');
    if (d.code !== 'applied') return;
    assert.equal(d.change.image, 'r.io/shop/web:v2');
    assert.equal(d.change.changeCause, 'webhook: set app image to r.io/shop/web:v2 (hook "deploy", request req-1)');
    assert.equal(d.change.guarded!['webhook/last-push'].read, before);
    assert.deepEqual(JSON.parse(d.lastPush).app, {
      pushedAt: '2026-11-27T11:59:00.000Z', timeFrom: 'payload', image: 'r.io/shop/web:v2', push: 'sha256:ab|',
      previous: 'r.io/shop/web:v1', appliedAt: '2026-11-27T12:00:00.000Z', request: 'req-1', hook: 'deploy',
    });
    assert.equal(d.event.message, 'container app: image r.io/shop/web:v1 → r.io/shop/web:v2; asked by hook "deploy", request req-1');
  });

  test('what a wait plans: the sealed entry under the id drawn by the caller, its links, the annotation written', () => {
    const d = decide(input(push('r.io/shop/web:v2'), workload('r.io/shop/web:v1'), { REQUIRE_APPROVAL: 'true' }, { approvals }));
    assert.equal(d.code, 'waiting');
    if (d.code !== 'waiting') return;
    assert.equal(d.entry.id, 'entry-1');
    assert.ok(d.entry.mac, 'sealed with the approval key');
    assert.deepEqual(JSON.parse(d.pending.value), { app: d.entry });
    assert.equal(d.pending.read, undefined);
    assert.ok(d.links?.approve.startsWith('https://webhook.example.test/'), JSON.stringify(d.links));
  });

  test('the signature step: a digest not signed yet waits (SIGNATURE_WAIT), waits on as it was, then is refused', () => {
    const { publicKey } = generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
    const env = { VERIFY_SIGNATURE: `cosign:${publicKey.export({ type: 'spki', format: 'pem' })}`, SIGNATURE_WAIT: '20s' };
    const ref = `r.io/shop/web:v2@sha256:${'b'.repeat(64)}`;
    const unsigned = `signature: r.io/shop/web@sha256:${'b'.repeat(64)} is not signed as VERIFY_SIGNATURE requires: no cosign signature`;
    const first = decide(input(push(ref, undefined, undefined, { unsigned }), workload('r.io/shop/web:v1'), env));
    assert.equal(first.code, 'waiting: signature', JSON.stringify(first));
    if (first.code !== 'waiting: signature') return;
    assert.equal(first.reason, 'waiting for its signature until 2026-11-27T12:00:20.000Z');
    assert.deepEqual([first.entry.waitsFor, first.entry.image, first.event?.reason], ['signature', ref, 'UpgradeWaiting']);
    const waited = workload('r.io/shop/web:v1', { 'webhook/pending': first.pending.value });
    const again = (nowMs: number, more: Partial<Push>) =>
      decide({ ...input(push(ref, undefined, undefined, more), waited, env), nowMs });
    const looked = { id: 'entry-1', action: 'signature' as const, by: 'its signature\'s push' };
    // Looked at again before its wait is over, not signed yet: it waits on as it was, nothing written, no Event.
    const on = again(NOW + 10_000, { unsigned, decided: looked });
    assert.equal(on.code, 'waiting: signature');
    if (on.code === 'waiting: signature') assert.deepEqual([on.pending.value === on.pending.read, on.event], [true, undefined]);
    const end = again(NOW + 20_000, { unsigned, decided: looked });
    assert.equal(end.code, 'refused: unsigned');
    if ('reason' in end)
      assert.match(end.reason, /no cosign signature, and none came within SIGNATURE_WAIT \(by 2026-11-27T12:00:20\.000Z\); nothing was changed$/);
    // A person's decision of a digest not signed never waits for it.
    assert.equal(again(NOW + 10_000, { unsigned, decided: { ...looked, action: 'approve' } }).code, 'refused: unsigned');
    // Signed by then: deployed, its entry taken off by the same patch.
    const signed = again(NOW + 10_000, { decided: looked });
    assert.equal(signed.code, 'applied');
    if (signed.code === 'applied') assert.deepEqual(JSON.parse(signed.change.guarded!['webhook/pending'].value), {});
    // The same digest announced again while it waits: a repeat, nothing written.
    assert.equal(again(NOW + 10_000, { unsigned, push: 'sha256:cd|' }).code, 'repeat');
  });

  test('the age step: a young image waits until it is old enough, by its build time, else its push time', () => {
    const env = { MIN_IMAGE_AGE: '72h' };
    // Pushed a minute ago, no build time known: old enough 72 h after the push.
    const first = decide(input(push('r.io/shop/web:v2'), workload('r.io/shop/web:v1'), env, { approvals }));
    assert.equal(first.code, 'waiting: age', JSON.stringify(first));
    if (first.code !== 'waiting: age') return;
    assert.equal(first.reason, 'waiting until 2026-11-30T11:59:00.000Z, when it is old enough (its age: 72h0m0s after it was pushed)');
    assert.deepEqual([first.entry.waitsFor, first.entry.opensAt, first.event?.reason], ['age', '2026-11-30T11:59:00.000Z', 'UpgradeWaiting']);
    assert.ok(first.entry.mac, 'sealed: its build time and opening cannot be edited into an earlier one');
    // Built 3 days before it was pushed (the registry watch, VERIFY_IMAGE): old enough now.
    const built = { builtAtMs: Date.parse('2026-11-24T11:00:00Z') };
    assert.equal(decide(input(push('r.io/shop/web:v2', undefined, undefined, built), workload('r.io/shop/web:v1'), env)).code, 'applied');
    // The workload's annotation overrides the hook's: 0 takes any age, a malformed one fails naming it.
    assert.equal(decide(input(push('r.io/shop/web:v2'), workload('r.io/shop/web:v1', { 'webhook/min-age': '0' }), env)).code, 'applied');
    const bad = decide(input(push('r.io/shop/web:v2'), workload('r.io/shop/web:v1', { 'webhook/min-age': 'soon' }), env));
    assert.equal(bad.code, 'failed');
    if ('reason' in bad) assert.match(bad.reason, /^annotation webhook\/min-age "soon" is not a duration/);
    const waited = workload('r.io/shop/web:v1', { 'webhook/pending': first.pending.value });
    const later = (p: Push, nowMs: number) => decide({ ...input(p, waited, env, { approvals }), nowMs });
    // The same image again (a registry's retry): a repeat; an older push: superseded; a newer one replaces it.
    assert.equal(later(push('r.io/shop/web:v2', undefined, 'sha256:cd|'), NOW + 1000).code, 'repeat');
    assert.equal(later(push('r.io/shop/web:v1b', '2026-11-27T11:00:00Z'), NOW + 1000).code, 'superseded');
    const newer = later(push('r.io/shop/web:v3', '2026-11-27T12:00:00Z'), NOW + 1000);
    assert.equal(newer.code, 'waiting: age');
    if (newer.code === 'waiting: age') assert.deepEqual([newer.entry.image, newer.replaced?.image], ['r.io/shop/web:v3', 'r.io/shop/web:v2']);
    // Its time come, the service decides it (action age): applied, its entry taken off in the same patch.
    const aged = { decided: { id: 'entry-1', action: 'age' as const, by: 'its age' } };
    const early = later(push('r.io/shop/web:v2', undefined, undefined, aged), NOW + 3_600_000);
    assert.equal(early.code, 'waiting: age');
    if (early.code === 'waiting: age') assert.equal(early.pending.value, early.pending.read, 'looked at early: nothing written');
    const due = later(push('r.io/shop/web:v2', undefined, undefined, aged), Date.parse('2026-11-30T11:59:00Z'));
    assert.equal(due.code, 'applied', JSON.stringify(due));
    if (due.code === 'applied') {
      assert.deepEqual(JSON.parse(due.change.guarded!['webhook/pending'].value), {});
      assert.match(due.notes.join('\n'), /^old enough \(its age\) at 2026-11-30T11:59:00\.000Z$/m);
    }
    // Come of age under a closed change window: it waits on, now for the window.
    const closed = workload('r.io/shop/web:v1', { 'webhook/pending': first.pending.value, 'webhook/window': 'Sat 00:00-00:01 UTC' });
    const windowed = decide({ ...input(push('r.io/shop/web:v2', undefined, undefined, aged), closed, env, { approvals }),
      nowMs: Date.parse('2026-11-30T11:59:00Z') });
    assert.equal(windowed.code, 'waiting', JSON.stringify(windowed));
    if (windowed.code === 'waiting') assert.equal(windowed.entry.waitsFor, 'window');
  });

  test('deciding is pure: the same input, frozen, gives the same decision twice', () => {
    const freeze = <T>(o: T): T => {
      if (o && typeof o === 'object' && !Buffer.isBuffer(o)) for (const v of Object.values(o)) freeze(v);
      return Buffer.isBuffer(o) ? o : Object.freeze(o);
    };
    for (const [, given] of cases) {
      const frozen = freeze(structuredClone({ ...given, approvals: undefined }));
      const withKey = { ...frozen, approvals: given.approvals };
      assert.deepEqual(decide(withKey), decide(withKey));
    }
  });
});
