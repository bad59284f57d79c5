/*
 * `webhook -validate -hooks DIR` through the built executable: it loads the hooks as the service
 * would (the same -template, WEBHOOK_CMD and environment), prints what each hook accepts, runs and
 * answers, and refuses what the service refuses with the same message a reload logs. Also: a hook
 * that runs /webhooks.sh on a machine without that file runs the bundled upgrade.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, test } from 'node:test';
import { defaultBinary, makeTempDir, REPO_ROOT, startWebhook, waitForOutput } from './harness.ts';

const EXAMPLES = path.join(REPO_ROOT, 'examples', 'hooks');

/** A mail server for the service's environment (its MAIL_* values are base64, as the old image's). */
const b64 = (text: string) => Buffer.from(text).toString('base64');
const MAIL_SERVER = { MAIL_SMTP_SERVER: b64('smtp.example.com'), MAIL_FROM: b64('webhook@example.com') };

function validate(args: string[], env: Record<string, string | undefined> = {}) {
  const r = spawnSync(defaultBinary(), ['-validate', ...args], {
    env: { PATH: process.env.PATH, ...env } as NodeJS.ProcessEnv,
    encoding: 'utf8',
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** The seed hook of deploy/, as its ConfigMap holds it. */
function deploySeedHook(): string {
  return fs.readFileSync(path.join(REPO_ROOT, 'deploy', 'hooks', 'web.json'), 'utf8');
}

describe('webhook -validate', () => {
  test('the example hooks: each hook with what it accepts, runs and answers; the token is not shown', () => {
    const r = validate(['-hooks', EXAMPLES, '-template'], { HOOK_TOKEN: 'tok', ...MAIL_SERVER });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stderr, '');
    assert.match(r.stdout, /^hook "echo" \(.*examples\/hooks\/echo\.json\)$/m);
    assert.match(r.stdout, /^ {2}runs: +\/bin\/echo$/m);
    assert.match(r.stdout, /^hook "web" \(.*examples\/hooks\/web\.json\)$/m);
    // The seed hook's rule, each value it requires; the token only as "inserted by the template".
    assert.match(r.stdout, /url "token" is the value the template inserted \(not shown\)/);
    for (const [param, value] of [['ns', 'prod'], ['workload', 'deployment/web'], ['container', 'app']])
      assert.match(r.stdout, new RegExp(`url "${param}" is "${value.replace('/', '\\/')}"`));
    assert.match(r.stdout, /^ {2}otherwise: +500 Hook rules were not satisfied\.$/m);
    // /webhooks.sh is not on this machine (or is): either way it is the bundled upgrade.
    assert.match(r.stdout, /^ {2}runs: +the upgrade, in this process \(\/webhooks\.sh\)$/m);
    assert.match(r.stdout, /^ {2}upgrades: +namespace: prod\n +workload: deployment\/web\n +container: app\n/m);
    assert.match(r.stdout, /registry type: whatever the request's url "repo_type" says/);
    assert.match(r.stdout, /mail to: ops@example\.com/);
    assert.match(r.stdout, /^2 hook\(s\) from 2 file\(s\): valid$/m);
    assert.ok(!r.stdout.includes('tok"') && !/\btok\b/.test(r.stdout), 'the token value is never printed');
  });

  test('the environment as the service sees it: WEBHOOK_CMD adds -template; an unset token refuses the hooks', () => {
    const viaEnv = validate(['-hooks', EXAMPLES], { WEBHOOK_CMD: '-template', HOOK_TOKEN: 'a-token-value' });
    assert.equal(viaEnv.code, 0, viaEnv.stderr);
    assert.ok(!viaEnv.stdout.includes('a-token-value'));
    const unset = validate(['-hooks', EXAMPLES, '-template']);
    assert.equal(unset.code, 1);
    assert.match(unset.stderr, /^error: .*echo\.json:\d+: hook "echo": trigger-rule\.match\.value: empty/m);
  });

  test('a refused file: exit 1 with the message the running service logs when a reload meets it', async () => {
    const dir = makeTempDir('validate-');
    const file = path.join(dir, 'hooks.json');
    fs.writeFileSync(file, JSON.stringify([{ id: 'x', 'execute-command': '/bin/true' }]));
    const wh = await startWebhook({ hooks: dir, args: ['-hotreload'] });
    try {
      const broken = JSON.stringify([{ id: 'x', 'execute-command': '/bin/true', 'trigger-rules': {} }]);
      fs.writeFileSync(file, broken);
      const logged = await waitForOutput(wh, /reload \(files changed\) rejected, still serving the previous 1 hook\(s\): .*\n/);
      const message = /reload \(files changed\) rejected, still serving the previous 1 hook\(s\): (.*)\n/.exec(logged)![1];
      assert.match(message, /trigger-rules/);
      const r = validate(['-hooks', dir]);
      assert.equal(r.code, 1);
      assert.equal(r.stderr, `error: ${message}\n`);
      assert.equal(r.stdout, '');
    } finally {
      await wh.stop();
    }
  });

  test("deploy/'s seed hook before its ConfigMap is applied: refused while a placeholder is left, valid once filled in", () => {
    const dir = makeTempDir('validate-deploy-');
    fs.writeFileSync(path.join(dir, 'web.json'), deploySeedHook());
    const shipped = validate(['-hooks', dir, '-template'], { HOOK_TOKEN: 'a-long-random-token' });
    assert.equal(shipped.code, 1);
    for (const placeholder of ['<namespace>', '<workload>', '<container>'])
      assert.ok(shipped.stderr.includes(`still holds the placeholder "${placeholder}"`), shipped.stderr);
    const filled = deploySeedHook()
      .replace('<namespace>', 'shop')
      .replace('<workload>', 'statefulset/db')
      .replace('<container>', 'main')
      .replace('<mail-to>', 'ops@example.com');
    fs.writeFileSync(path.join(dir, 'web.json'), filled);
    const r = validate(['-hooks', dir, '-template'], { HOOK_TOKEN: 'a-long-random-token', ...MAIL_SERVER });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stderr, '');
    assert.match(r.stdout, /namespace: shop\n +workload: statefulset\/db\n +container: main\n/);
  });

  test('a hook that passes MAIL_TO where the environment has no mail server (or a broken one) is warned about', () => {
    const unset = validate(['-hooks', EXAMPLES, '-template'], { HOOK_TOKEN: 'tok' });
    assert.equal(unset.code, 0, unset.stderr);
    assert.equal(unset.stderr,
      `warning: ${path.join(EXAMPLES, 'web.json')}: hook "web": MAIL_TO is passed, but mail is off: MAIL_SMTP_SERVER is not ` +
        'set: no result will be mailed\n');
    const password = 'not base64 at all!';
    const broken = validate(['-hooks', EXAMPLES, '-template'], { HOOK_TOKEN: 'tok', ...MAIL_SERVER, MAIL_PASSWORD: password });
    assert.equal(broken.code, 0, broken.stderr);
    assert.match(broken.stderr, /^warning: .*hook "web": MAIL_TO is passed, but mail is off: MAIL_PASSWORD\b.*: no result will be mailed$/m);
    assert.ok(!broken.stderr.includes(password), 'the value is never shown');
    assert.doesNotMatch(broken.stderr, /hook "echo"/, 'a hook without MAIL_TO is not warned about');
  });

  test('other rule types and commands: regex, signatures (secret not shown), not/or, a missing command', () => {
    const dir = makeTempDir('validate-rules-');
    fs.writeFileSync(path.join(dir, 'hooks.json'), JSON.stringify([{
      id: 'ci', 'execute-command': '/nonexistent/deploy', 'http-methods': ['post'],
      'response-message': 'queued',
      'trigger-rule': { or: [
        { match: { type: 'payload-hmac-sha256', secret: 'hmac-secret-value', parameter: { source: 'header', name: 'X-Sig' } } },
        { not: { match: { type: 'regex', regex: '^refs/tags/', parameter: { source: 'payload', name: 'ref' } } } },
      ] },
    }]));
    const r = validate(['-hooks', dir]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /^warning: .*hook "ci": execute-command: exec: "\/nonexistent\/deploy": stat .*no such file or directory \(checked again on each request\)$/m);
    assert.match(r.stdout, /url: +POST \/hooks\/ci/);
    assert.match(r.stdout, /any of:\n +header "X-Sig" payload-hmac-sha256 a valid signature \(its secret not shown\)\n +not:\n +payload "ref" regex "\^refs\/tags\/"/);
    assert.match(r.stdout, /runs: +nothing now: exec/);
    assert.match(r.stdout, /answers: +200 "queued" at once; the command runs on/);
    assert.ok(!r.stdout.includes('hmac-secret-value') && !r.stderr.includes('hmac-secret-value'));
  });
});

describe('approvals and change windows', () => {
  test('-validate shows per hook whether a push waits for an approval and for a change window', () => {
    const dir = makeTempDir('validate-approvals-');
    const hook = (id: string, settings: Record<string, string>) => ({
      id, 'execute-command': '/webhooks.sh',
      'pass-environment-to-command': Object.entries(settings).map(([envname, name]) => ({ envname, source: 'string', name })),
    });
    fs.writeFileSync(path.join(dir, 'hooks.json'), JSON.stringify([
      hook('plain', { APP_NS: 'prod', APP_WORKLOAD: 'deployment/web' }),
      hook('guarded', { APP_NS: 'prod', APP_WORKLOAD: 'deployment/web', REQUIRE_APPROVAL: 'true', APPROVAL_TIMEOUT: '2h',
        DEPLOY_WINDOW: 'Mon-Fri 09:00-18:00 Asia/Shanghai', APPROVAL_OVERRIDE: 'true' }),
    ]));
    const r = validate(['-hooks', path.join(dir, 'hooks.json')]);
    assert.equal(r.code, 0, r.stderr);
    const [plain, guarded] = r.stdout.split(/^hook "guarded"/m);
    assert.match(plain, /approval: not required \(the annotation webhook\/approval: required asks for one on a workload\)/);
    assert.match(plain, /change window: always open \(the annotation webhook\/window sets one on a workload\)/);
    assert.match(guarded, /approval: required \(REQUIRE_APPROVAL=true\): a push waits up to 2h0m0s for Approve or Reject/);
    assert.match(guarded, /change window: Mon-Fri 09:00-18:00 Asia\/Shanghai: a push outside waits and is applied when it opens; an approval link may deploy now \(APPROVAL_OVERRIDE=true\)/);
  });
});

describe('/webhooks.sh where no such file exists', { skip: fs.existsSync('/webhooks.sh') ? '/webhooks.sh exists on this machine' : false }, () => {
  test('the example seed hook runs the bundled upgrade in-process (a Docker Hub test ping is acknowledged)', async () => {
    const wh = await startWebhook({ hooks: EXAMPLES, args: ['-template'], env: { HOOK_TOKEN: 'ping-token' } });
    try {
      assert.doesNotMatch(wh.output(), /execute-command/);
      const q = new URLSearchParams({ token: 'ping-token', ns: 'prod', workload: 'deployment/web', container: 'app', repo_type: 'publicregistry' });
      const res = await wh.request(`/hooks/web?${q}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{}' });
      assert.equal(res.status, 200, res.body);
      assert.match(res.body, /^action: +none \(test ping/m);
      assert.match(wh.output(), /executing \/webhooks\.sh \(the upgrade, in-process\)/);
    } finally {
      await wh.stop();
    }
  });
});
