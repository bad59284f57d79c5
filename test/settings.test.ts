/*
 * HOOK_SETTINGS, the one table of the settings of the upgrade, its mail and its notifications:
 * the settings tables of docs/configuration.md are what scripts/settings-doc.ts renders from it, every setting the
 * code reads is in it, the load-time check of fixed settings and -validate come from it, and its
 * parses keep the messages operators know.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, test } from 'node:test';

import { documentedSection, settingsSection } from '../scripts/settings-doc.ts';
import { fixedSettingChecks, HOOK_SETTINGS, type HookSetting } from '../webhook.ts';
import { defaultBinary, REPO_ROOT } from './harness.ts';

const escaped = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
const entries = Object.entries(HOOK_SETTINGS) as [string, HookSetting<unknown>][];

/** Variables the program reads that are not settings of a hook: the cluster's, the shell's, the service's flags. */
const NOT_SETTINGS = ['KUBECONFIG', 'KUBERNETES_SERVICE_HOST', 'KUBERNETES_SERVICE_PORT', 'PATH', 'WEBHOOK_CMD'];

describe('the settings table and its document', () => {
  test("docs/configuration.md's settings tables are what scripts/settings-doc.ts renders from HOOK_SETTINGS", () => {
    assert.equal(documentedSection(), settingsSection(), 'run: node scripts/docs.ts');
  });

  test('every setting has one row with its type, default and meaning, and the document has no other', () => {
    const rows = documentedSection()
      .split('\n')
      .filter((l) => l.startsWith('| `'));
    const documented = rows.map((r) => /^\| `([A-Z_]+)` \|/.exec(r)?.[1]);
    assert.deepEqual(documented.toSorted(), entries.map(([name]) => name).toSorted());
    for (const [name, s] of entries) {
      const row = rows.find((r) => r.startsWith(`| \`${name}\` |`))!;
      const cells = row.split(/(?<!\\) \| /).map((c) => c.replaceAll('\\|', '|'));
      assert.equal(cells[1], s.type, `${name}: type`);
      assert.equal(cells[2], s.default, `${name}: default`);
      assert.equal(cells[3], s.fixed ? 'yes' : 'no', `${name}: fixed`);
      assert.ok(s.meaning !== '' && row.includes(s.meaning.replaceAll('|', '\\|')), `${name}: meaning`);
    }
  });

  test('every environment variable webhook.ts reads is a setting of the table, or one of the few that are not', () => {
    const source = fs.readFileSync(path.join(REPO_ROOT, 'webhook.ts'), 'utf8');
    const read = new Set([...source.matchAll(/\benv\.([A-Z][A-Z0-9_]+)/g)].map((m) => m[1]));
    const undocumented = [...read].filter((n) => !Object.hasOwn(HOOK_SETTINGS, n) && !NOT_SETTINGS.includes(n));
    assert.deepEqual(undocumented, []);
  });
});

describe('what comes from the table', () => {
  test('the load-time check covers exactly the settings marked fixed, with their parse messages', () => {
    const checks = fixedSettingChecks();
    assert.deepEqual(
      Object.keys(checks).toSorted(),
      ['ALLOW_IMAGES', 'ANNOTATION_NAMESPACES', 'APPROVAL_OVERRIDE', 'APPROVAL_TIMEOUT', 'CLUSTER', 'CLUSTERS', 'DEPLOY_WINDOW', 'DRY_RUN',
        'GIT_API', 'GIT_AUTHOR', 'GIT_BRANCH', 'GIT_CA', 'GIT_FIELD', 'GIT_PATH', 'GIT_PULL_REQUEST', 'GIT_REPO', 'GIT_SIGNING_KEY', 'GIT_SYNC_TIMEOUT', 'GIT_TOKEN', 'GIT_USERNAME', 'HELM_FIELD', 'HELM_RELEASE', 'MIN_IMAGE_AGE', 'NOTIFY_FORMAT', 'NOTIFY_ON_SKIP',
        'NOTIFY_SECRET', 'NOTIFY_TELEGRAM_CHAT', 'NOTIFY_URL', 'ON_GITOPS_OWNER', 'ON_OUTSIDE_CHANGE', 'ON_REGISTRY_AWAY', 'POLL_INTERVAL', 'PROMOTE_AFTER', 'PROMOTE_CHECK', 'REGISTRY_HOST', 'REGISTRY_TOKEN_HOSTS', 'REQUIRE_APPROVAL', 'ROLLOUT_STUCK_TIMEOUT', 'SIGNATURE_WAIT', 'UPDATE_POLICY',
        'VERIFY_SIGNATURE', 'VERIFY_SIGNATURE_ANNOTATIONS'],
    );
    assert.match(checks.VERIFY_SIGNATURE('cosign:/nonexistent/cosign.pub') ?? '', /^VERIFY_SIGNATURE item 1: the key file "\/nonexistent\/cosign\.pub" cannot be read/);
    assert.match(checks.DEPLOY_WINDOW('Mon-Fri 09:00-18:00 Mars/Olympus') ?? '', /^DEPLOY_WINDOW ".*": range 1 .*is not an IANA time zone/);
    assert.match(checks.REQUIRE_APPROVAL('perhaps') ?? '', /^REQUIRE_APPROVAL "perhaps" is not a boolean/);
    assert.match(checks.UPDATE_POLICY('newest') ?? '', /^UPDATE_POLICY "newest" is not a policy: not one of all, semver:<range>/);
    assert.equal(checks.UPDATE_POLICY('semver:^1.4'), undefined);
    assert.match(checks.MIN_IMAGE_AGE('3 days') ?? '', /^MIN_IMAGE_AGE "3 days" is not a duration \(e\.g\. 0, 12h, 72h\)/);
    assert.match(checks.MIN_IMAGE_AGE('2200h') ?? '', /^MIN_IMAGE_AGE "2200h" is outside 0 to 2160h0m0s/);
    assert.equal(checks.MIN_IMAGE_AGE('72h'), undefined);
    assert.match(checks.NOTIFY_ON_SKIP('maybe') ?? '', /^NOTIFY_ON_SKIP "maybe" is not a boolean/);
    assert.match(checks.REGISTRY_TOKEN_HOSTS('https://auth.example.com') ?? '', /^REGISTRY_TOKEN_HOSTS item 1 .* is not a host name/);
    assert.equal(checks.NOTIFY_URL(''), 'NOTIFY_URL is empty');
    assert.equal(checks.NOTIFY_SECRET('anything'), undefined);
    assert.equal(checks.NOTIFY_TELEGRAM_CHAT('-1001234567890 @release_ops'), undefined);
    assert.match(checks.NOTIFY_TELEGRAM_CHAT('ops room') ?? '', /^NOTIFY_TELEGRAM_CHAT "ops" is not a chat id \(an integer\) or a @channelusername/);
    assert.match(checks.REGISTRY_HOST('not a host') ?? '', /^REGISTRY_HOST "not a host" is not a valid registry host/);
    assert.match(checks.CLUSTER('staging prod') ?? '', /^CLUSTER names one context \(2 given; several clusters are CLUSTERS\)/);
    assert.equal(checks.CLUSTERS('staging prod'), undefined);
    assert.match(checks.ON_REGISTRY_AWAY('wait') ?? '', /^ON_REGISTRY_AWAY "wait" is not fail or keep/);
    // What any service may allow (-poll-min-interval's floor); the service's own minimum is checked at its load.
    assert.match(checks.POLL_INTERVAL('500ms') ?? '', /^POLL_INTERVAL "500ms" is outside 1s to 24h0m0s/);
    assert.equal(checks.POLL_INTERVAL('1m'), undefined);
    assert.equal(checks.ROLLOUT_STUCK_TIMEOUT('10s'), undefined);
    assert.match(checks.ROLLOUT_STUCK_TIMEOUT('0s') ?? '', /^ROLLOUT_STUCK_TIMEOUT "0s" is outside 1s to 1h/);
    assert.match(checks.ROLLOUT_STUCK_TIMEOUT('soon') ?? '', /^ROLLOUT_STUCK_TIMEOUT "soon" is not a duration/);
    assert.match(checks.ANNOTATION_NAMESPACES('team-b Team_C') ?? '', /^ANNOTATION_NAMESPACES "Team_C" is not a namespace name/);
    assert.deepEqual(['team-b, team-c', '*', undefined].map((v) => HOOK_SETTINGS.ANNOTATION_NAMESPACES.parse(v)),
      [['team-b', 'team-c'], 'any', []]);
    assert.match(checks.ANNOTATION_NAMESPACES('* team-a') ?? '', /^ANNOTATION_NAMESPACES "\*" is not a namespace name .*, nor \* alone/);
    // SIGNATURE_WAIT: 0 (refused at once) or 10s to 24h; bad input names the setting and the range.
    assert.match(checks.SIGNATURE_WAIT('1ms') ?? '', /^SIGNATURE_WAIT "1ms" is not 0 nor between 10s and 24h$/);
    assert.match(checks.SIGNATURE_WAIT('25h') ?? '', /^SIGNATURE_WAIT "25h" is not 0 nor between 10s and 24h$/);
    assert.match(checks.SIGNATURE_WAIT('forever') ?? '', /^SIGNATURE_WAIT "forever" is not a duration \(e\.g\. 0, 30s, 10m\)$/);
    assert.deepEqual(['0', '20s', ' ', undefined].map((v) => HOOK_SETTINGS.SIGNATURE_WAIT.parse(v)), [0, 20_000, 600_000, 600_000]);
    assert.match(checks.GIT_REPO('http://git.example/deploy.git') ?? '', /^GIT_REPO "http:\/\/git\.example\/deploy\.git" is not https:\/\//);
    assert.match(checks.GIT_TOKEN('/nonexistent/token') ?? '', /^GIT_TOKEN: the token file "\/nonexistent\/token" cannot be read/);
    assert.equal(HOOK_SETTINGS.ON_REGISTRY_AWAY.parse(' KEEP '), 'keep');
    assert.equal(HOOK_SETTINGS.ON_REGISTRY_AWAY.parse(undefined), 'fail');
    assert.deepEqual(HOOK_SETTINGS.CLUSTERS.parse(' staging  prod staging '), ['staging', 'prod']);
  });

  test('each parse gives the typed value or the message the upgrade has always given', () => {
    const s = HOOK_SETTINGS;
    assert.equal(s.ROLLOUT_TIMEOUT.parse(' 1m30s '), 90_000);
    assert.equal(s.ROLLOUT_TIMEOUT.parse(undefined), 0);
    assert.throws(() => s.ROLLOUT_TIMEOUT.parse('soon'), {
      message: 'ROLLOUT_TIMEOUT "soon" is not a duration (e.g. 0, 60s, 5m)',
    });
    assert.equal(s.ROLLBACK_ON_FAILURE.parse('T'), true);
    assert.throws(() => s.ROLLBACK_ON_FAILURE.parse('yes'), {
      message: 'ROLLBACK_ON_FAILURE "yes" is not a boolean (true or false)',
    });
    assert.throws(() => s.VERIFY_IMAGE.parse('yes'), { message: 'VERIFY_IMAGE "yes" is not a boolean (use true or false)' });
    assert.throws(() => s.APP_NS.parse(' '), { message: 'APP_NS is not set (the hook passes it from the URL parameter ns)' });
    assert.deepEqual(s.APP_WORKLOAD.parse('deploy/web'), { kind: 'deployment', name: 'web' });
    assert.equal(s.REPO_TYPE.parse('Harbor'), 'harbor');
    assert.equal(s.NET_TYPE.parse('VPC'), 'registry-vpc');
    assert.equal(s.MAIL_SMTP_PORT.parse(undefined), 465);
    assert.throws(() => s.MAIL_SMTP_PORT.parse('70000'), { message: 'MAIL_SMTP_PORT: not a port number (1-65535)' });
    assert.deepEqual(s.MAIL_TO.parse('a@example.com, A@example.com,'), ['a@example.com']);
    assert.deepEqual(s.NOTIFY_FORMAT.parse('dingtalk, '), ['dingtalk', 'json']);
  });

  test('-validate describes each setting a hook passes from the table: type, default, meaning', () => {
    const r = spawnSync(defaultBinary(), ['-validate', '-hooks', path.join(REPO_ROOT, 'examples', 'hooks'), '-template'], {
      env: { PATH: process.env.PATH, HOOK_TOKEN: 'a-token-value' },
      encoding: 'utf8',
    });
    assert.equal(r.status, 0, r.stderr);
    const s = HOOK_SETTINGS;
    assert.match(r.stdout, new RegExp(`^  settings: +APP_NS \\(namespace; unset: required\\): ${escaped(s.APP_NS.meaning)}$`, 'm'));
    assert.match(r.stdout, new RegExp(`^ +REPO_TYPE \\(registry type; unset: required\\): ${escaped(s.REPO_TYPE.meaning)}$`, 'm'));
  });
});
