/*
 * Change windows and approval links as pure functions: DEPLOY_WINDOW ranges read in their IANA zones
 * (far from UTC, across midnight, across daylight saving time), the next opening, malformed windows
 * named by range and field, and approval links that are signed, expire and cannot be changed; pending entries
 * whose MAC covers the entry and where it sits (workload, container, cluster).
 */
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import {
  approvalToken,
  HOOK_SETTINGS,
  keptZoneFormats,
  nextOpening,
  parseDeployWindows,
  pendingEntryMac,
  pendingEntrySealed,
  readApprovalToken,
  sealPendingEntry,
  windowOpen,
} from '../webhook.ts';

const at = (iso: string) => Date.parse(iso);
const iso = (ms: number) => new Date(ms).toISOString();

describe('change windows', () => {
  test('a zone far from UTC: Mon-Fri 09:00-18:00 Asia/Shanghai is 01:00-10:00 UTC', () => {
    const w = parseDeployWindows('Mon-Fri 09:00-18:00 Asia/Shanghai');
    // Wednesday 2026-11-25 00:30 UTC is 08:30 in Shanghai: closed, opens at 09:00 local = 01:00 UTC.
    assert.equal(windowOpen(w, at('2026-11-25T00:30:00Z')), false);
    assert.equal(iso(nextOpening(w, at('2026-11-25T00:30:00Z'))), '2026-11-25T01:00:00.000Z');
    assert.equal(windowOpen(w, at('2026-11-25T09:59:00Z')), true);
    assert.equal(windowOpen(w, at('2026-11-25T10:00:00Z')), false);
    // Friday 18:00 local closes it until Monday 09:00 local (Monday 01:00 UTC).
    assert.equal(iso(nextOpening(w, at('2026-11-27T10:00:00Z'))), '2026-11-30T01:00:00.000Z');
  });

  test('west of UTC: Pacific/Honolulu (UTC-10) on the evening before in UTC', () => {
    const w = parseDeployWindows('Sat 22:00-23:00 Pacific/Honolulu');
    assert.equal(iso(nextOpening(w, at('2026-11-25T00:00:00Z'))), '2026-11-29T08:00:00.000Z');
  });

  test('a range whose end is before its start crosses midnight', () => {
    const w = parseDeployWindows('Fri 22:00-02:00 UTC');
    assert.equal(windowOpen(w, at('2026-11-27T23:30:00Z')), true, 'Friday night');
    assert.equal(windowOpen(w, at('2026-11-28T01:59:00Z')), true, 'the early hours of Saturday');
    assert.equal(windowOpen(w, at('2026-11-28T02:00:00Z')), false);
    assert.equal(windowOpen(w, at('2026-11-26T01:00:00Z')), false, 'Thursday early hours follow no Friday');
  });

  test('daylight saving time: a window at 02:30 New York on the day the clocks skip it opens at 03:00', () => {
    const w = parseDeployWindows('Sun 02:30-04:00 America/New_York');
    // 2026-03-08: 02:00 EST becomes 03:00 EDT (07:00 UTC).
    assert.equal(iso(nextOpening(w, at('2026-03-08T05:00:00Z'))), '2026-03-08T07:00:00.000Z');
    // A week later 02:30 EDT is 06:30 UTC.
    assert.equal(iso(nextOpening(w, at('2026-03-09T00:00:00Z'))), '2026-03-15T06:30:00.000Z');
    // Autumn: on 2026-11-01 the clocks go back at 02:00 EDT; 02:30 EST is 07:30 UTC.
    assert.equal(iso(nextOpening(w, at('2026-11-01T04:00:00Z'))), '2026-11-01T07:30:00.000Z');
  });

  test('several ranges separated by ";": the earliest opening wins; inside one the push goes at once', () => {
    const w = parseDeployWindows('Mon-Fri 09:00-18:00 Europe/Berlin; Sat,Sun 10:00-12:00 Asia/Tokyo');
    assert.equal(w.length, 2);
    const saturday = at('2026-11-28T00:00:00Z');
    assert.equal(iso(nextOpening(w, saturday)), '2026-11-28T01:00:00.000Z');
    assert.equal(nextOpening(w, at('2026-11-25T10:00:00Z')), at('2026-11-25T10:00:00Z'));
  });

  test('malformed windows name the range and what is wrong', () => {
    const bad: [string, RegExp][] = [
      ['', /no range given/],
      ['Mon-Fri 09:00-18:00 Mars/Olympus', /range 1 "Mon-Fri 09:00-18:00 Mars\/Olympus": "Mars\/Olympus" is not an IANA time zone/],
      ['Mon-Fri 9-18', /range 1 .*"9" is not a time of day/],
      ['Mon-Fri 09:00-09:00', /is empty/],
      ['Mon-Fri 09:00-18:00; Funday 10:00-11:00', /range 2 "Funday 10:00-11:00": "Funday" is not a weekday/],
      ['Mon-Fri 25:00-26:00', /"25:00" is not a time of day/],
      ['Mon-Fri', /expected "<days> <HH:MM>-<HH:MM> \[<zone>\]"/],
    ];
    for (const [text, message] of bad) assert.throws(() => parseDeployWindows(text), { message }, text);
  });

  test('a window is one line: over 1,024 characters or 16 ranges it is refused before any range is read', () => {
    const range = 'Mon 09:00-10:00 UTC';
    assert.equal(parseDeployWindows(Array(16).fill(range).join(';')).length, 16);
    assert.throws(() => parseDeployWindows(Array(17).fill(range).join(';')), { message: 'more than 16 ranges (17)' });
    // Past the length nothing is parsed: not even a first range that is wrong.
    assert.throws(() => parseDeployWindows(`Funday 09:00-10:00 ${'x'.repeat(1024)}`), { message: /^longer than 1024 characters \(1043\)$/ });
    assert.throws(() => HOOK_SETTINGS.DEPLOY_WINDOW.parse(`Mon 09:00-10:00 UTC;${' '.repeat(1010)}`),
      { message: /^DEPLOY_WINDOW "Mon 09:00-10:00 UTC; *"… \(1030 characters\): longer than 1024 characters \(1030\)$/ });
  });

  test('a zone is kept as Intl spells it: many spellings of one zone keep one formatter', () => {
    const spellings = ['America/Argentina/ComodRivadavia', 'america/argentina/comodrivadavia', 'AMERICA/ARGENTINA/COMODRIVADAVIA',
      'aMeRiCa/ArGeNtInA/cOmOdRiVaDaViA', 'America/Catamarca'];
    const monday = at('2026-11-23T13:30:00Z');
    const before = keptZoneFormats();
    for (const zone of spellings) {
      const [w] = parseDeployWindows(`Mon 10:00-11:00 ${zone}`);
      assert.equal(w.zone, 'America/Catamarca', zone);
      assert.equal(w.text, `Mon 10:00-11:00 ${zone}`, 'messages show the window as written');
      assert.ok(windowOpen([w], monday), zone);
      assert.equal(nextOpening([w], monday + 3_600_000), at('2026-11-30T13:00:00Z'));
    }
    assert.ok(keptZoneFormats() <= before + 1, `${keptZoneFormats()} formatters kept after ${before}`);
    // A window built by hand with another spelling still finds the kept one.
    assert.ok(windowOpen([{ days: new Set([1]), start: 600, end: 660, zone: 'AMERICA/CATAMARCA', text: 'x' }], monday));
    assert.ok(keptZoneFormats() <= before + 1);
  });

  test('DEPLOY_WINDOW and APPROVAL_TIMEOUT name the setting; unset means always open and 24h', () => {
    assert.equal(HOOK_SETTINGS.DEPLOY_WINDOW.parse(undefined), undefined);
    assert.throws(() => HOOK_SETTINGS.DEPLOY_WINDOW.parse('Mon 9:00-x'), { message: /^DEPLOY_WINDOW "Mon 9:00-x": range 1/ });
    assert.equal(HOOK_SETTINGS.APPROVAL_TIMEOUT.parse(''), 24 * 3_600_000);
    assert.throws(() => HOOK_SETTINGS.APPROVAL_TIMEOUT.parse('10s'), { message: 'APPROVAL_TIMEOUT "10s" is less than 1m' });
    for (const name of ['REQUIRE_APPROVAL', 'APPROVAL_TIMEOUT', 'DEPLOY_WINDOW', 'APPROVAL_OVERRIDE'] as const)
      assert.equal(HOOK_SETTINGS[name].fixed, true, `${name}: a request must not choose its own approval`);
  });
});

describe('approval links', () => {
  const key = Buffer.alloc(32, 7);
  const claims = {
    namespace: 'apps',
    kind: 'deployment',
    name: 'web',
    container: 'app',
    id: 'e1',
    hook: 'deploy',
    image: 'registry.example.com/acme/web:v2',
    action: 'approve' as const,
    exp: at('2026-11-26T00:00:00Z'),
  };

  test('a link signed with the key reads back; another key, a changed claim or an expired one is refused', () => {
    const token = approvalToken(key, claims);
    assert.deepEqual(readApprovalToken(key, token, at('2026-11-25T00:00:00Z')), { claims });
    const other = readApprovalToken(Buffer.alloc(32, 8), token, at('2026-11-25T00:00:00Z'));
    assert.match((other as { refused: string }).refused, /not signed by this service/);
    const [, signature] = token.split('.');
    const changed = Buffer.from(JSON.stringify({ ...claims, action: 'reject' })).toString('base64url');
    const tampered = readApprovalToken(key, `${changed}.${signature}`, at('2026-11-25T00:00:00Z'));
    assert.match((tampered as { refused: string }).refused, /not signed by this service/);
    const late = readApprovalToken(key, token, at('2026-11-26T00:00:00Z'));
    assert.match((late as { refused: string }).refused, /expired at 2026-11-26T00:00:00.000Z/);
    assert.match((readApprovalToken(key, 'nonsense', 0) as { refused: string }).refused, /not an approval link/);
  });
});

describe('pending entries carry a MAC over the entry and where it sits', () => {
  const key = Buffer.alloc(32, 7);
  const place = { cluster: undefined, namespace: 'apps', kind: 'deployment', name: 'web', container: 'app' };
  const entry = {
    id: 'e1', hook: 'deploy', request: 'r1', image: 'registry.example.com/acme/web:v2', push: 'sha256:x|t',
    pushedAt: '2026-11-25T00:00:00.000Z', timeFrom: 'payload' as const, receivedAt: '2026-11-25T00:00:00.000Z',
    waitsFor: 'approval' as const, until: '2026-11-26T00:00:00.000Z', decides: 'whoever opens its links',
  };

  test('a sealed entry verifies where it was sealed, and nowhere else; a changed field, key or encoding fails', () => {
    const sealed = sealPendingEntry(key, place, entry);
    assert.equal(sealed.mac, pendingEntryMac(key, place, entry));
    assert.ok(pendingEntrySealed(key, place, sealed));
    // The order of the fields as read back does not matter.
    assert.ok(pendingEntrySealed(key, place, JSON.parse(JSON.stringify({ mac: sealed.mac, ...entry }))));
    for (const [what, where] of [
      ['another container', { ...place, container: 'sidecar' }],
      ['another workload', { ...place, name: 'api' }],
      ['another namespace', { ...place, namespace: 'prod' }],
      ['another kind', { ...place, kind: 'statefulset' }],
      ['another cluster', { ...place, cluster: 'b' }],
    ] as const) assert.ok(!pendingEntrySealed(key, where, sealed), what);
    for (const change of [{ image: 'evil.example.net/x/backdoor:1' }, { hook: 'api' }, { waitsFor: 'window' as const },
      { approvedBy: 'nobody' }, { until: '2027-01-01T00:00:00.000Z' }])
      assert.ok(!pendingEntrySealed(key, place, { ...sealed, ...change }), JSON.stringify(change));
    assert.ok(!pendingEntrySealed(Buffer.alloc(32, 8), place, sealed), 'another key');
    assert.ok(!pendingEntrySealed(key, place, entry), 'no MAC: an entry written before entries had one');
    assert.ok(!pendingEntrySealed(key, place, { ...sealed, mac: `${sealed.mac}!!` }), 'a lenient encoding');
    assert.ok(!pendingEntrySealed(key, place, { ...sealed, mac: `${sealed.mac}=` }), 'padding');
    // Without a key (no links) there is nothing to check an entry with.
    assert.deepEqual(sealPendingEntry(undefined, place, entry), entry);
    assert.ok(pendingEntrySealed(undefined, place, entry));
  });
});
