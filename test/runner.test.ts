/*
 * The runner's own behaviour, through the built executable over real HTTP: command line, strict
 * hook loading, templates, directory merge, hot reload, limits, graceful shutdown, the seed hook,
 * and that no secret reaches any output. (Compatibility with adnanh/webhook: compat.test.ts.)
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import {
  defaultBinary, hasRecord, logOfAnsweredRequest, makeTempDir, readArgv, readEnv, recorderCommand, resetRecord, spawnWebhook,
  startWebhook, waitFor, waitForOutput, waitForRecord, type Webhook,
} from './harness.ts';

const run = promisify(execFile);
const BIN = defaultBinary();

/** Runs the binary to completion; returns exit code and all output. */
async function runBinary(args: string[], env: Record<string, string> = {}): Promise<{ code: number; out: string }> {
  try {
    const r = await run(BIN, args, { env: { ...process.env, ...env }, timeout: 10_000 });
    return { code: 0, out: r.stdout + r.stderr };
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string };
    return { code: err.code, out: err.stdout + err.stderr };
  }
}

/** Starts the binary on hooks that must fail to load; returns exit code and output. */
async function loadFailure(files: Record<string, string>, extraArgs: string[] = [], env: Record<string, string> = {}) {
  const dir = makeTempDir('webhook-bad-');
  for (const [name, text] of Object.entries(files)) fs.writeFileSync(path.join(dir, name), text);
  const s = await spawnWebhook({ hooks: dir, args: extraArgs, env });
  // A server that loads what it should have refused would wait for requests forever.
  const serving = setTimeout(() => s.proc.kill('SIGKILL'), 10_000);
  const exit = await s.exited;
  clearTimeout(serving);
  return { code: exit.code, out: s.output(), dir };
}

/** Sends part of a request and stalls; resolves with what the server sent before closing, and when. */
function sendAndStall(port: number, partial: string): Promise<{ reply: string; ms: number }> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1', () => sock.write(partial));
    let reply = '';
    sock.on('data', (d) => (reply += d));
    sock.on('close', () => resolve({ reply, ms: Date.now() - t0 }));
    sock.setTimeout(10_000, () => sock.destroy());
  });
}

/** Writes `text` and resolves with the head of the first answer, without sending anything more. */
function firstAnswer(port: number, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1', () => sock.write(text));
    let reply = '';
    sock.on('data', (d) => {
      reply += d;
      if (reply.includes('\r\n\r\n')) sock.destroy();
    });
    sock.on('error', reject);
    sock.on('close', () => resolve(reply));
  });
}

const stopAll: Webhook[] = [];
after(async () => { await Promise.all(stopAll.map((w) => w.stop())); });
async function started(opts: Parameters<typeof startWebhook>[0]): Promise<Webhook> {
  const w = await startWebhook(opts);
  stopAll.push(w);
  return w;
}

describe('command line', () => {
  test('-version prints the version and runs with no Node on PATH', async () => {
    const r = await run(BIN, ['-version'], { env: { PATH: '/nonexistent' } });
    assert.match(r.stdout, /^webhook version \d+\.\d+\.\d+\n$/);
  });

  test('an unknown flag prints usage on stderr and exits 2', async () => {
    const r = await runBinary(['-nosuchflag']);
    assert.equal(r.code, 2);
    assert.match(r.out, /flag provided but not defined: -nosuchflag/);
    assert.match(r.out, /Usage of webhook:[\s\S]*-hotreload/);
  });

  test('a flag value that does not parse is named', async () => {
    const r = await runBinary(['-command-timeout', 'soon']);
    assert.equal(r.code, 2);
    assert.match(r.out, /invalid value "soon" for flag -command-timeout/);
  });

  test('WEBHOOK_CMD adds -template (the old image passed it that way)', async () => {
    const dir = makeTempDir();
    fs.writeFileSync(path.join(dir, 'h.json'), '[{"id":"{{ getenv \\"HOOK_ID\\" }}","execute-command":"/bin/true"}]');
    const wh = await started({ hooks: dir, env: { WEBHOOK_CMD: '-template', HOOK_ID: 'from-env' } });
    assert.equal((await wh.request('/hooks/from-env', { method: 'POST' })).status, 200);
  });

  test('--flag=value and -flag value both work, -hooks repeats', async () => {
    const a = makeTempDir();
    const b = makeTempDir();
    fs.writeFileSync(path.join(a, 'a.json'), '[{"id":"a","execute-command":"/bin/true"}]');
    fs.writeFileSync(path.join(b, 'b.json'), '[{"id":"b","execute-command":"/bin/true"}]');
    const wh = await started({ hooks: path.join(a, 'a.json'), args: [`--hooks=${path.join(b, 'b.json')}`] });
    assert.equal((await wh.request('/hooks/a', { method: 'POST' })).status, 200);
    assert.equal((await wh.request('/hooks/b', { method: 'POST' })).status, 200);
  });
});

describe('hook files are loaded strictly, errors name file, line, hook and field', () => {
  const cases: [string, string, RegExp][] = [
    ['unknown key with a suggestion', '[{"id":"x",\n "execute-command":"/bin/true",\n "trigger-rules":{}}]', /h\.json:3: hook "x": trigger-rules: unknown field \(did you mean "trigger-rule"\?\)/],
    ['wrong type', '[{"id":"x","execute-command":"/bin/true",\n"include-command-output-in-response":"yes"}]', /h\.json:2: hook "x": include-command-output-in-response: expected a boolean, got a string/],
    ['misspelt match type', '[{"id":"x","execute-command":"/bin/true","trigger-rule":{"and":[\n{"match":{"type":"value","value":"a","parameter":{"source":"url","name":"a"}}},\n{"match":{"type":"valeu","value":"a","parameter":{"source":"url","name":"a"}}}]}}]', /h\.json:3: hook "x": trigger-rule\.and\[1\]\.match\.type: unknown type "valeu" \(did you mean "value"\?\)/],
    ['invalid regex', '[{"id":"x","execute-command":"/bin/true","trigger-rule":{"match":{"type":"regex","regex":"(unclosed","parameter":{"source":"url","name":"a"}}}}]', /hook "x": trigger-rule\.match\.regex: invalid regular expression/],
    ['invalid CIDR', '[{"id":"x","execute-command":"/bin/true","trigger-rule":{"match":{"type":"ip-whitelist","ip-range":"10.0.0.0/33"}}}]', /hook "x": trigger-rule\.match\.ip-range: invalid IP range "10\.0\.0\.0\/33"/],
    ['a rule with two kinds', '[{"id":"x","execute-command":"/bin/true","trigger-rule":{"and":[],"or":[]}}]', /hook "x": trigger-rule: a rule takes exactly one of "and", "or", "not", "match", got "and" and "or"/],
    ['a rule with none', '[{"id":"x","execute-command":"/bin/true","trigger-rule":{}}]', /hook "x": trigger-rule: a rule needs one of "and", "or", "not", "match"/],
    ['a duplicate key', '[{"id":"x","execute-command":"/bin/true",\n"id":"y"}]', /h\.json: line 2, column \d+: duplicate key "id"/],
    ['a syntax error', '[{"id":"x",\n "execute-command":"/bin/true"', /h\.json: line 3, column \d+: did not find expected ',' or '}'/],
    ['a number where adnanh takes a string is its text; a list where a string is expected is not', '[{"id":"x","execute-command":"/bin/true","response-message":[1]}]', /hook "x": response-message: expected a string, got an array/],
    ['an unknown parameter source', '[{"id":"x","execute-command":"/bin/true","pass-arguments-to-command":[{"source":"body","name":"a"}]}]', /hook "x": pass-arguments-to-command\[0\]\.source: unknown source "body"/],
    ['a missing execute-command', '[{"id":"x"}]', /hook "x": execute-command: required/],
    ['an empty value (unset template variable)', '[{"id":"x","execute-command":"/bin/true","trigger-rule":{"match":{"type":"value","value":"","parameter":{"source":"url","name":"token"}}}}]', /hook "x": trigger-rule\.match\.value: empty/],
    ['an empty regex (it would match anything)', '[{"id":"x","execute-command":"/bin/true","trigger-rule":{"match":{"type":"regex","regex":"","parameter":{"source":"url","name":"ns"}}}}]', /hook "x": trigger-rule\.match\.regex: empty/],
  ];
  for (const [name, text, expected] of cases) {
    test(name, async () => {
      const r = await loadFailure({ 'h.json': text });
      assert.equal(r.code, 1, r.out);
      assert.match(r.out, expected);
    });
  }

  test('a duplicate id across files names both files', async () => {
    const r = await loadFailure({
      'a.json': '[{"id":"same","execute-command":"/bin/true"}]',
      'b.json': '[{"id":"same","execute-command":"/bin/true"}]',
    });
    assert.equal(r.code, 1);
    assert.match(r.out, /b\.json: hook "same": id: duplicate id \(also defined in .*a\.json\)/);
  });

  test('a rule that compares against a placeholder fails closed: the file is not loaded, every such field named', async () => {
    const rule = (match: object) => JSON.stringify({ match });
    const r = await loadFailure({ 'h.json': `[{"id":"x","execute-command":"/bin/true",\n"trigger-rule":{"and":[\n${[
      rule({ type: 'value', value: '<token>', parameter: { source: 'url', name: 'token' } }),
      rule({ type: 'regex', regex: '^<namespace>$', parameter: { source: 'url', name: 'ns' } }),
      rule({ type: 'ip-whitelist', 'ip-range': '10.0.0.0/8 <office-cidr>' }),
      rule({ type: 'payload-hmac-sha256', secret: '<hmac-secret>', parameter: { source: 'header', name: 'X-Sig' } }),
      rule({ type: 'scalr-signature', secret: 'Real-Secret-<ab>-Part' }),
    ].join(',\n')}]}}]` });
    assert.equal(r.code, 1, r.out);
    assert.match(r.out, /error: couldn't load hooks: /);
    for (const [line, field, which] of [[3, 'and[0].match.value', 'the placeholder "<token>"'], [4, 'and[1].match.regex', 'the placeholder "<namespace>"'],
      [5, 'and[2].match.ip-range', 'the placeholder "<office-cidr>"'], [6, 'and[3].match.secret', 'the placeholder "<hmac-secret>"'], [7, 'and[4].match.secret', 'a placeholder']]) {
      assert.ok(r.out.includes(`h.json:${line}: hook "x": trigger-rule.${field}: still holds ${which}; replace it`), `${field} in:\n${r.out}`);
    }
    // A secret that merely contains something like a placeholder is not quoted, even in part.
    assert.equal(r.out.includes('Real-Secret') || r.out.includes('<ab>'), false);
  });

  test('HOOK_TOKEN=<hook-token>, as the shipped Secret has it, keeps the hook from loading', async () => {
    // Before, this hook loaded and let in ?token=<hook-token>.
    const r = await loadFailure({ 'h.json': '[{"id":"web","execute-command":"/bin/true",\n"trigger-rule":{"match":{"type":"value","value":"{{ getenv \\"HOOK_TOKEN\\" }}","parameter":{"source":"url","name":"token"}}}}]' },
      ['-template'], { HOOK_TOKEN: '<hook-token>' });
    assert.equal(r.code, 1, r.out);
    assert.match(r.out, /h\.json:2: hook "web": trigger-rule\.match\.value: still holds the placeholder "<hook-token>"; replace it/);
  });

  test('a placeholder outside the trigger rule (MAIL_TO, say) is still only a warning, logged without -verbose', async () => {
    const dir = makeTempDir();
    fs.writeFileSync(path.join(dir, 'h.json'), '[{"id":"x","execute-command":"/bin/true",\n"pass-environment-to-command":[{"envname":"MAIL_TO","source":"string","name":"<mail-to>"}]}]');
    const wh = await started({ hooks: dir, verbose: false });
    const out = await waitForOutput(wh, 'placeholder');
    assert.match(out, /warning: .*h\.json:2: hook "x": pass-environment-to-command\[0\]\.name: still holds the placeholder "<mail-to>"/);
    assert.equal((await wh.request('/hooks/x', { method: 'POST' })).status, 200);
  });

  test('the example hooks load with HOOK_TOKEN set, no placeholder reported; without it, the token rule is refused', async () => {
    const examples = path.join(import.meta.dirname, '..', 'examples', 'hooks');
    const wh = await started({ hooks: examples, args: ['-template'], env: { HOOK_TOKEN: 'example-token-51c2' }, verbose: false });
    assert.match(wh.output(), /loaded 2 hook\(s\) from 2 file\(s\): echo, web/);
    // (The one warning here is that /webhooks.sh, the image's, is not on this machine.)
    assert.doesNotMatch(wh.output(), /placeholder|error:/);
    const r = await loadFailure({ 'web.json': fs.readFileSync(path.join(examples, 'web.json'), 'utf8') }, ['-template'], { HOOK_TOKEN: '' });
    assert.equal(r.code, 1, r.out);
    assert.match(r.out, /web\.json:\d+: hook "web": trigger-rule\.and\[0\]\.match\.value: empty/);
  });

  test('an unknown status code is a warning and 200 is used, as adnanh does', async () => {
    const dir = makeTempDir();
    fs.writeFileSync(path.join(dir, 'h.json'), '[{"id":"x","execute-command":"/bin/true",\n"success-http-response-code":299}]');
    const wh = await started({ hooks: dir, verbose: false });
    assert.match(wh.output(), /warning: .*h\.json:2: hook "x": success-http-response-code: 299 is not a known HTTP status code; 200 is used/);
    assert.equal((await wh.request('/hooks/x', { method: 'POST' })).status, 200);
  });

  test('zero hooks is an error unless -nopanic', async () => {
    const r = await loadFailure({ 'h.json': '[]' });
    assert.equal(r.code, 1);
    assert.match(r.out, /couldn't load any hooks/);
    const wh = await started({ hooks: r.dir, args: ['-nopanic'] });
    assert.equal((await wh.request('/')).body, 'OK');
  });
});

describe('templates', () => {
  test('getenv, cat, credential, js, html, urlquery, comments and trim markers', async () => {
    const dir = makeTempDir();
    const creds = makeTempDir();
    fs.writeFileSync(path.join(creds, 'cred'), 'from-credentials-dir\n');
    fs.writeFileSync(path.join(dir, 'file.txt'), 'from-a-file\n');
    const rec = makeTempDir();
    const cmd = recorderCommand(rec);
    const hooks = `[{{/* a comment */}}
      {"id":"t","execute-command":"${cmd}",
       "pass-arguments-to-command":[
         {"source":"string","name":"{{ getenv "A" }}"},
         {"source":"string","name":"{{ cat "${path.join(dir, 'file.txt')}" }}"},
         {"source":"string","name":"{{ credential "cred" }}"},
         {"source":"string","name":"{{ getenv "Q" | urlquery }}"},
         {"source":"string","name":"{{ getenv "H" | html }}"},
         {"source":"string","name":"{{ js (getenv "J") }}"},
         {"source":"string","name":"x   {{- "y" -}}   z"},
         {"source":"string","name":"{{ getenv "UNSET_VARIABLE" }}"},
         {"source":"string","name":"{{ cat "/nonexistent" }}"}]}]`;
    fs.writeFileSync(path.join(dir, 'h.json'), hooks);
    const wh = await started({ hooks: path.join(dir, 'h.json'), args: ['-template'], env: { A: 'plain', CREDENTIALS_DIRECTORY: creds, Q: 'a b&c', H: '<b>', J: '<say "hi">' } });
    assert.equal((await wh.request('/hooks/t', { method: 'POST' })).status, 200);
    await waitForRecord(rec);
    assert.deepEqual(readArgv(rec), ['plain', 'from-a-file', 'from-credentials-dir', 'a+b%26c', '&lt;b&gt;', '<say "hi">', 'xyz', '', '']);
  });

  test('credential falls back to the environment without CREDENTIALS_DIRECTORY', async () => {
    const dir = makeTempDir();
    fs.writeFileSync(path.join(dir, 'h.json'), '[{"id":"{{ credential "CRED_ID" }}","execute-command":"/bin/true"}]');
    const wh = await started({ hooks: dir, args: ['-template'], env: { CRED_ID: 'c1' } });
    assert.equal((await wh.request('/hooks/c1', { method: 'POST' })).status, 200);
  });

  test('an unsupported function is a clear load error with the line', async () => {
    const r = await loadFailure({ 'h.json': '[\n{"id":"{{ printf "%s" "x" }}","execute-command":"/bin/true"}]' }, ['-template']);
    assert.equal(r.code, 1);
    assert.match(r.out, /h\.json: line 2: template: function "printf" not defined/);
  });
});

describe('directory of hook files', () => {
  test('every *.json is merged in name order; other files and dot-entries are ignored', async () => {
    const dir = makeTempDir();
    fs.writeFileSync(path.join(dir, 'b.json'), '[{"id":"b","execute-command":"/bin/echo","include-command-output-in-response":true,"pass-arguments-to-command":[{"source":"string","name":"b"}]}]');
    fs.writeFileSync(path.join(dir, 'a.json'), '[{"id":"a","execute-command":"/bin/true"}]');
    fs.writeFileSync(path.join(dir, 'notes.txt'), 'not json at all');
    fs.writeFileSync(path.join(dir, '.hidden.json'), 'broken');
    const wh = await started({ hooks: dir });
    assert.equal((await wh.request('/hooks/a', { method: 'POST' })).status, 200);
    assert.equal((await wh.request('/hooks/b', { method: 'POST' })).body, 'b\n');
    assert.match(wh.output(), /loaded 2 hook\(s\) from 2 file\(s\): a, b/);
  });
});

describe('hot reload', () => {
  const hook = (id: string) => JSON.stringify([{ id, 'execute-command': '/bin/true' }]);
  const serves = async (wh: Webhook, id: string) => (await wh.request(`/hooks/${id}`, { method: 'POST' })).status === 200;
  const until = (wh: Webhook, id: string, want: boolean) =>
    waitFor(async () => ((await serves(wh, id)) === want ? true : undefined), { timeoutMs: 5_000, what: `hook ${id} ${want ? 'served' : 'gone'}` });

  test('an in-place edit is picked up', async () => {
    const dir = makeTempDir();
    fs.writeFileSync(path.join(dir, 'h.json'), hook('one'));
    const wh = await started({ hooks: path.join(dir, 'h.json'), args: ['-hotreload'] });
    fs.writeFileSync(path.join(dir, 'h.json'), hook('two'));
    await until(wh, 'two', true);
    assert.equal(await serves(wh, 'one'), false);
  });

  test('mv over the file (atomic replace) is picked up, repeatedly', async () => {
    const dir = makeTempDir();
    const file = path.join(dir, 'h.json');
    fs.writeFileSync(file, hook('one'));
    const wh = await started({ hooks: file, args: ['-hotreload'] });
    for (const id of ['two', 'three']) {
      fs.writeFileSync(path.join(dir, 'tmp'), hook(id));
      fs.renameSync(path.join(dir, 'tmp'), file);
      await until(wh, id, true);
    }
  });

  test('delete and re-create is picked up; the deleted file keeps the old set until then', async () => {
    const dir = makeTempDir();
    const file = path.join(dir, 'h.json');
    fs.writeFileSync(file, hook('one'));
    const wh = await started({ hooks: file, args: ['-hotreload'] });
    fs.rmSync(file);
    await waitForOutput(wh, /reload \(files changed\) rejected/);
    assert.equal(await serves(wh, 'one'), true);
    fs.writeFileSync(file, hook('two'));
    await until(wh, 'two', true);
  });

  test('a Kubernetes ConfigMap update (the ..data symlink swap) is picked up', async () => {
    const mount = makeTempDir();
    const publish = (version: string, files: Record<string, string>) => {
      const data = path.join(mount, `..${version}`);
      fs.mkdirSync(data);
      for (const [n, t] of Object.entries(files)) fs.writeFileSync(path.join(data, n), t);
      fs.symlinkSync(`..${version}`, path.join(mount, '..data_tmp'));
      fs.renameSync(path.join(mount, '..data_tmp'), path.join(mount, '..data'));
      for (const n of Object.keys(files)) if (!fs.existsSync(path.join(mount, n))) fs.symlinkSync(path.join('..data', n), path.join(mount, n));
    };
    publish('2026_01_01_v1', { 'web.json': hook('one') });
    const wh = await started({ hooks: mount, args: ['-hotreload'] });
    assert.equal(await serves(wh, 'one'), true);
    publish('2026_01_02_v2', { 'web.json': hook('two') });
    await until(wh, 'two', true);
    assert.equal(await serves(wh, 'one'), false);
  });

  test('a broken file is rejected whole: the old set keeps serving and the error names the place', async () => {
    const dir = makeTempDir();
    fs.writeFileSync(path.join(dir, 'a.json'), hook('a'));
    fs.writeFileSync(path.join(dir, 'b.json'), hook('b'));
    const wh = await started({ hooks: dir, args: ['-hotreload'], verbose: false, metrics: true });
    fs.writeFileSync(path.join(dir, 'a.json'), hook('a2'));
    fs.writeFileSync(path.join(dir, 'b.json'), '[{"id":"b",\n"execute-commandd":"/bin/true"}]');
    await waitForOutput(wh, /reload \(files changed\) rejected, still serving the previous 2 hook\(s\): .*b\.json:2: hook "b": execute-commandd: unknown field/);
    assert.equal(await serves(wh, 'a'), true, 'old hook a still served');
    assert.equal(await serves(wh, 'a2'), false, 'no half-loaded set');
    const metrics = (await wh.metrics()).body;
    assert.match(metrics, /webhook_reloads_total\{result="failure"\} [1-9]/);
    assert.match(metrics, /webhook_config_last_reload_successful 0/);
    fs.writeFileSync(path.join(dir, 'b.json'), hook('b'));
    await until(wh, 'a2', true);
  });

  test('SIGHUP reloads without -hotreload', async () => {
    const dir = makeTempDir();
    fs.writeFileSync(path.join(dir, 'h.json'), hook('one'));
    const wh = await started({ hooks: dir });
    // A second server on the same directory, with -hotreload: once it has reloaded, the change was
    // there for a watcher to see and its debounce is over.
    const witness = await started({ hooks: dir, args: ['-hotreload'] });
    fs.writeFileSync(path.join(dir, 'h.json'), hook('two'));
    await waitForOutput(witness, /reloaded 1 hook\(s\) from 1 file\(s\) \(files changed\); added: two/);
    assert.equal(await serves(wh, 'two'), false, 'no reload without -hotreload or a signal');
    assert.doesNotMatch(wh.output(), /watching |reloaded /);
    wh.proc.kill('SIGHUP');
    await until(wh, 'two', true);
  });
});

describe('limits', () => {
  test('a body over -max-body-size gets 413 and the command does not run', async () => {
    const rec = makeTempDir();
    const wh = await started({ hooks: [{ id: 'x', 'execute-command': recorderCommand(rec) }], args: ['-max-body-size', '1000'] });
    const res = await wh.request('/hooks/x', { method: 'POST', body: 'x'.repeat(1001) });
    assert.equal(res.status, 413);
    assert.equal((await wh.request('/hooks/x', { method: 'POST', body: 'x'.repeat(1000) })).status, 200);
    await waitForRecord(rec);
  });

  test('a command past its timeout is killed with its whole process group', async () => {
    const dir = makeTempDir();
    const script = path.join(dir, 'slow.sh');
    // The grandchild (sleep in a subshell) records its pid; it must die with the group.
    fs.writeFileSync(script, `#!/bin/sh\necho started\n(sleep 30; echo survived > ${dir}/survived) &\necho $! > ${dir}/child.pid\nsleep 30\n`, { mode: 0o755 });
    const wh = await started({ hooks: [{ id: 'slow', 'execute-command': script, 'include-command-output-in-response': true, 'include-command-output-in-response-on-error': true, 'command-timeout': '500ms' }], metrics: true });
    const res = await wh.request('/hooks/slow', { method: 'POST' });
    assert.equal(res.status, 500);
    assert.match(res.body, /started/);
    const childPid = Number(fs.readFileSync(path.join(dir, 'child.pid'), 'utf8'));
    await waitFor(() => { try { process.kill(childPid, 0); return undefined; } catch { return true; } }, { timeoutMs: 5_000, what: 'grandchild killed' });
    assert.match(wh.output(), /timed out after 0\.5s; killing its process group/);
    assert.match((await wh.metrics()).body, /webhook_command_timeouts_total\{hook="slow"\} 1/);
  });

  test('when all command slots are busy, a triggered request gets 503 with Retry-After (5 to 9 s in turn), before its body is read', async () => {
    const dir = makeTempDir();
    const script = path.join(dir, 'wait.sh');
    fs.writeFileSync(script, `#!/bin/sh\nwhile [ ! -f ${dir}/go ]; do sleep 0.05; done\necho done\n`, { mode: 0o755 });
    const hook = { id: 'w', 'execute-command': script, 'include-command-output-in-response': true, 'pass-arguments-to-command': [{ source: 'entire-payload' }] };
    const wh = await started({ hooks: [hook], args: ['-max-concurrent-commands', '2'], metrics: true });
    const first = [wh.request('/hooks/w', { method: 'POST' }), wh.request('/hooks/w', { method: 'POST' })];
    await waitFor(async () => ((await wh.metrics()).body.includes('webhook_commands_running 2') ? true : undefined), { what: 'two commands running' });
    // The hook uses the body, its rule (none) does not: the answer comes while the body is still unsent.
    const third = await firstAnswer(wh.port, 'POST /hooks/w HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n');
    assert.match(third, /^HTTP\/1\.1 503 /);
    assert.match(third, /\r\nretry-after: 5\r\n/i);
    // Refused in turn, they are asked back over five seconds: a burst does not come back as one wave.
    const waits: unknown[] = [];
    for (let i = 0; i < 5; i++) waits.push((await wh.request('/hooks/w', { method: 'POST' })).headers['retry-after']);
    assert.deepEqual(waits, ['6', '7', '8', '9', '5']);
    fs.writeFileSync(path.join(dir, 'go'), '');
    for (const r of await Promise.all(first)) assert.deepEqual([r.status, r.body], [200, 'done\n']);
    assert.match((await wh.metrics()).body, /webhook_commands_rejected_total\{hook="w"\} 6/);
  });

  test('a client that sends headers too slowly is disconnected after -read-header-timeout', async () => {
    const wh = await started({ hooks: [{ id: 'x', 'execute-command': '/bin/true' }], args: ['-read-header-timeout', '500ms'] });
    const { reply, ms } = await sendAndStall(wh.port, 'POST /hooks/x HTTP/1.1\r\nHost: x\r\n');
    assert.ok(ms < 8_000, 'closed by the server, not by the test timeout');
    assert.match(reply, /^HTTP\/1\.1 408|^$/);
  });

  test('every response has X-Request-Id; /healthz answers, and /metrics on the -metrics-listen address only', async () => {
    const wh = await started({ hooks: [{ id: 'x', 'execute-command': '/bin/true' }], metrics: true });
    for (const p of ['/', '/hooks/x', '/hooks/nope', '/healthz', '/elsewhere']) {
      const r = await wh.request(p, { method: 'POST' });
      assert.match(String(r.headers['x-request-id']), /^[0-9a-f-]{36}$/, p);
    }
    assert.equal((await wh.request('/healthz')).status, 200);
    const m = await wh.metrics();
    assert.match(String(m.headers['content-type']), /^text\/plain; version=0\.0\.4/);
    assert.match(m.body, /webhook_requests_total\{hook="x",code="200"\} 1/);
    assert.match(m.body, /webhook_requests_total\{hook="",code="404"\} 2/);
    assert.equal((await wh.request('/metrics')).status, 404, 'the hook port does not serve /metrics');
    // The command runs after the answer: its duration is recorded when it ends.
    const counted = /webhook_command_duration_seconds_count\{hook="x"\} 1/;
    await waitFor(async () => (counted.test((await wh.metrics()).body) ? true : undefined), { what: 'the duration metric' });
    assert.match(m.body, /webhook_hooks_loaded 1/);
  });

  test('-x-request-id uses the client id, made log-safe and truncated', async () => {
    const wh = await started({ hooks: [{ id: 'x', 'execute-command': '/bin/true' }], args: ['-x-request-id', '-x-request-id-limit', '8'] });
    const r = await wh.request('/hooks/x', { method: 'POST', headers: { 'X-Request-Id': 'ab c;d"efghijkl' } });
    assert.equal(r.headers['x-request-id'], 'ab_c_d_e');
  });

  test('errors are logged without -verbose; a missing command names the hint', async () => {
    const wh = await started({ hooks: [{ id: 'x', 'execute-command': '/bin/echo hello', 'include-command-output-in-response': true }], verbose: false });
    assert.equal((await wh.request('/hooks/x', { method: 'POST' })).status, 500);
    const out = await waitForOutput(wh, 'pass-arguments-to-command');
    assert.match(out, /error: \[[0-9a-f-]+\] error in exec: "\/bin\/echo hello": stat \/bin\/echo hello: no such file or directory/);
    assert.match(out, /use 'pass-arguments-to-command' to specify args for '\/bin\/echo'/);
  });
});

describe('graceful shutdown', () => {
  test('SIGTERM stops accepting, lets a running command finish, exits 0', async () => {
    const dir = makeTempDir();
    const script = path.join(dir, 'work.sh');
    fs.writeFileSync(script, `#!/bin/sh\ntouch ${dir}/started\nsleep 1\necho finished\n`, { mode: 0o755 });
    const wh = await startWebhook({ hooks: [{ id: 'w', 'execute-command': script, 'include-command-output-in-response': true }] });
    const pending = wh.request('/hooks/w', { method: 'POST' });
    await waitFor(() => (fs.existsSync(path.join(dir, 'started')) ? true : undefined), { what: 'command started' });
    wh.proc.kill('SIGTERM');
    await waitForOutput(wh, 'shutting down');
    await assert.rejects(wh.request('/'), /ECONNREFUSED/);
    const res = await pending;
    assert.deepEqual([res.status, res.body], [200, 'finished\n']);
    assert.deepEqual(await wh.exited, { code: 0, signal: null });
  });

  test('a command still running after -shutdown-grace is killed, and the exit is still 0', async () => {
    const dir = makeTempDir();
    const script = path.join(dir, 'stuck.sh');
    fs.writeFileSync(script, `#!/bin/sh\ntouch ${dir}/started\nexec sleep 60\n`, { mode: 0o755 });
    const wh = await startWebhook({ hooks: [{ id: 's', 'execute-command': script }], args: ['-shutdown-grace', '300ms'] });
    assert.equal((await wh.request('/hooks/s', { method: 'POST' })).status, 200);
    await waitFor(() => (fs.existsSync(path.join(dir, 'started')) ? true : undefined), { what: 'command started' });
    const t0 = Date.now();
    wh.proc.kill('SIGTERM');
    assert.deepEqual(await wh.exited, { code: 0, signal: null });
    assert.ok(Date.now() - t0 < 10_000);
    assert.match(wh.output(), /grace period over; killing 1 command\(s\)/);
  });
});

describe('the seed hook, from a directory through WEBHOOK_CMD=-template', () => {
  const TOKEN = 'seed-Token-4c8f2b19e7';
  const rec = makeTempDir();
  const seedDir = makeTempDir();
  const seed = fs.readFileSync(path.join(import.meta.dirname, '..', 'examples', 'hooks', 'web.json'), 'utf8')
    .replace('"/webhooks.sh"', JSON.stringify(recorderCommand(rec)))
    .replace('"/home"', JSON.stringify(rec));
  fs.writeFileSync(path.join(seedDir, 'web.json'), seed);
  const payload = fs.readFileSync(path.join(import.meta.dirname, 'fixtures', 'upgrade', 'acr-push.json'), 'utf8');
  let wh: Webhook;
  const right = { token: TOKEN, ns: 'prod', workload: 'deployment/web', container: 'app', repo_type: 'regionalregistry', net_type: 'vpc' };
  const post = (q: Record<string, string>) => wh.request(`/hooks/web?${new URLSearchParams(q)}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: payload });

  before(async () => { wh = await started({ hooks: seedDir, env: { WEBHOOK_CMD: '-template', HOOK_TOKEN: TOKEN } }); });

  for (const key of ['token', 'ns', 'workload', 'container'] as const) {
    for (const variant of ['wrong', 'missing'] as const) {
      test(`${variant} ${key} → 500 "Hook rules were not satisfied." and the command does not run`, async () => {
        resetRecord(rec);
        const q: Record<string, string> = { ...right };
        if (variant === 'wrong') q[key] = key === 'token' ? TOKEN.slice(0, -1) : 'other';
        else delete q[key];
        const res = await post(q);
        assert.deepEqual([res.status, res.body], [500, 'Hook rules were not satisfied.']);
        assert.equal(res.headers['access-control-allow-origin'], undefined);
        assert.deepEqual((await logOfAnsweredRequest(wh, res)).filter((line) => line.includes('executing')), []);
        assert.equal(hasRecord(rec), false);
      });
    }
  }

  test('all four right → the command runs with the environment and the payload, CORS header set', async () => {
    resetRecord(rec);
    const res = await post(right);
    assert.equal(res.status, 200);
    assert.equal(res.body, 'recorder stdout\nrecorder stderr\n');
    assert.equal(res.headers['access-control-allow-origin'], '*');
    const env = readEnv(rec);
    assert.deepEqual(
      [env.APP_NS, env.APP_WORKLOAD, env.APP_CONTAINER, env.REPO_TYPE, env.NET_TYPE, env.MAIL_TO],
      ['prod', 'deployment/web', 'app', 'regionalregistry', 'vpc', 'ops@example.com'],
    );
    const argv = readArgv(rec);
    assert.equal(argv.length, 1);
    assert.deepEqual(JSON.parse(argv[0]), JSON.parse(payload));
  });

  test('no secret appears in any output of the run', async () => {
    await wh.stop();
    const out = wh.output();
    assert.ok(out.includes('token=REDACTED'), 'access log shows the redaction');
    assert.equal(out.includes(TOKEN), false, 'token value leaked into the output');
  });
});

describe('secrets never reach the output', () => {
  test('token, HMAC secret, Scalr secret and template values stay out of logs and answers', async () => {
    const secrets = { token: 'tok-7f3a9c2e5d', hmac: 'hmac-secret-91b2c3', scalr: 'scalr-secret-44d1e0', fromEnv: 'env-inserted-58ab' };
    const dir = makeTempDir();
    const script = path.join(dir, 'leaky.sh');
    // A careless script that prints its whole environment (which holds the template's variable).
    fs.writeFileSync(script, '#!/bin/sh\nenv\necho "args: $*"\nexit 3\n', { mode: 0o755 });
    fs.writeFileSync(path.join(dir, 'h.json'), JSON.stringify([{
      id: 'leak', 'execute-command': script, 'include-command-output-in-response': true, 'include-command-output-in-response-on-error': true,
      'pass-arguments-to-command': [{ source: 'entire-query' }, { source: 'header', name: 'X-Hub-Signature' }],
      'trigger-rule': { or: [
        { and: [
          { match: { type: 'value', value: '{{ getenv "LEAK_TOKEN" }}', parameter: { source: 'url', name: 'token' } } },
          { match: { type: 'payload-hmac-sha256', secret: secrets.hmac, parameter: { source: 'header', name: 'X-Hub-Signature' } } },
        ] },
        { match: { type: 'scalr-signature', secret: secrets.scalr } },
      ] },
    }]));
    const wh = await startWebhook({ hooks: dir, args: ['-template', '-debug'], env: { LEAK_TOKEN: secrets.token, OTHER: secrets.fromEnv } });
    const { createHmac } = await import('node:crypto');
    const body = '{"a":1}';
    const sig = 'sha256=' + createHmac('sha256', secrets.hmac).update(body).digest('hex');
    const answers: string[] = [];
    for (const [token, signature] of [[secrets.token, sig], [secrets.token, 'sha256=00'], ['wrong', sig]]) {
      const r = await wh.request(`/hooks/leak?token=${token}&x=1`, { method: 'POST', headers: { 'Content-Type': 'application/json', 'X-Hub-Signature': signature }, body });
      answers.push(`${r.status} ${JSON.stringify(r.headers)} ${r.body}`);
    }
    await wh.stop();
    const everything = wh.output() + answers.join('\n');
    assert.match(answers[0], /^500 /, 'the triggered command ran and failed');
    for (const [name, value] of Object.entries(secrets)) {
      if (name === 'fromEnv') continue;
      assert.equal(everything.includes(value), false, `${name} leaked`);
    }
    assert.match(wh.output(), /token=REDACTED/);
  });
});

describe('secrets stay in the service', () => {
  const b64 = (t: string) => Buffer.from(t).toString('base64');

  test('a command inherits no MAIL_* setting, HOOK_TOKEN, credential path or variable a template read, unless its hook passes it', async () => {
    const rec = makeTempDir();
    const creds = makeTempDir();
    fs.writeFileSync(path.join(creds, 'api'), 'credential-value-8d1e');
    const dir = makeTempDir();
    fs.writeFileSync(path.join(dir, 'h.json'), JSON.stringify([{
      id: 'x', 'execute-command': recorderCommand(rec),
      'pass-arguments-to-command': [{ source: 'string', name: '{{ getenv "API_KEY" }}' }, { source: 'string', name: '{{ credential "api" }}' }],
      'pass-environment-to-command': [{ envname: 'MAIL_FROM', source: 'string', name: 'explicit@example.com' }, { envname: 'PASSED_TOKEN', source: 'url', name: 'token' }],
      'trigger-rule': { match: { type: 'value', value: '{{ getenv "HOOK_TOKEN" }}', parameter: { source: 'url', name: 'token' } } },
    }]));
    const env = {
      HOOK_TOKEN: 'hook-token-30a9f1', API_KEY: 'api-key-77c2e0', CREDENTIALS_DIRECTORY: creds, KUBECONFIG: '/etc/webhook/kubeconfig.json',
      MAIL_SMTP_SERVER: b64('localhost'), MAIL_FROM: b64('webhook@example.com'), MAIL_PASSWORD: b64('smtp-password-5e'), MAIL_TO: 'ops@example.com',
      PLAIN_SETTING: 'kept',
    };
    const wh = await started({ hooks: dir, args: ['-template'], env });
    assert.equal((await wh.request('/hooks/x?token=hook-token-30a9f1', { method: 'POST' })).status, 200);
    await waitForRecord(rec);
    const got = readEnv(rec);
    for (const name of ['HOOK_TOKEN', 'API_KEY', 'CREDENTIALS_DIRECTORY', 'KUBECONFIG', 'MAIL_SMTP_SERVER', 'MAIL_PASSWORD', 'MAIL_TO']) {
      assert.equal(got[name], undefined, `${name} inherited`);
    }
    assert.deepEqual([got.MAIL_FROM, got.PASSED_TOKEN, got.PLAIN_SETTING], ['explicit@example.com', 'hook-token-30a9f1', 'kept']);
    assert.ok(got.PATH, 'ordinary variables are inherited');
    assert.deepEqual(readArgv(rec), ['api-key-77c2e0', 'credential-value-8d1e'], 'what the hook passes arrives');
  });

  test('WEBHOOK_CMD and the -admin-token it carries reach no command; -admin-token-file keeps the token off the command line', async () => {
    const ADMIN = 'admin-token-in-cmd-5b7d20';
    const rec = makeTempDir();
    const hooks = [{ id: 'env', 'execute-command': recorderCommand(rec) }];
    const wh = await started({ hooks, env: { WEBHOOK_CMD: `-admin-token ${ADMIN} -deliveries 5` } });
    assert.equal((await wh.request('/hooks/env', { method: 'POST' })).status, 200);
    await waitForRecord(rec);
    const recorded = fs.readFileSync(path.join(rec, 'env'), 'utf8');
    assert.equal(readEnv(rec).WEBHOOK_CMD, undefined, 'WEBHOOK_CMD inherited');
    assert.ok(!recorded.includes(ADMIN), 'the admin token reached the command');
    assert.ok(readEnv(rec).PATH, 'ordinary variables are still inherited');
    // The same token from a file: on no command line and in no environment.
    const file = path.join(makeTempDir(), 'admin-token');
    fs.writeFileSync(file, `${ADMIN}\n`);
    const rec2 = makeTempDir();
    const wh2 = await started({ hooks: [{ id: 'env', 'execute-command': recorderCommand(rec2) }], args: ['-admin-token-file', file] });
    assert.equal((await wh2.request('/hooks/env', { method: 'POST' })).status, 200);
    await waitForRecord(rec2);
    assert.ok(!fs.readFileSync(path.join(rec2, 'env'), 'utf8').includes(ADMIN));
    assert.ok(!fs.readFileSync(`/proc/${wh2.proc.pid}/cmdline`, 'utf8').includes(ADMIN), 'the token is on the command line');
  });

  test('a value a template read is REDACTED in the fixed answer (response-message, response headers), as in the log', async () => {
    const dir = makeTempDir();
    fs.writeFileSync(path.join(dir, 'key.txt'), 'file-secret-c41b\n');
    const creds = makeTempDir();
    fs.writeFileSync(path.join(creds, 'api'), 'credential-value-0f3a');
    const cat = `{{ cat "${path.join(dir, 'key.txt')}" }}`;
    fs.writeFileSync(path.join(dir, 'h.json'), JSON.stringify([{
      id: 'r', 'execute-command': '/bin/true', 'response-message': `key ${cat}, credential {{ credential "api" }}, env {{ getenv "API_KEY" }}`,
      'response-headers': [{ name: 'X-Key', value: cat }],
    }]));
    const wh = await started({ hooks: path.join(dir, 'h.json'), args: ['-template'], env: { CREDENTIALS_DIRECTORY: creds, API_KEY: 'api-key-e9d8c7' } });
    const r = await wh.request('/hooks/r', { method: 'POST' });
    assert.deepEqual([r.status, r.body, r.headers['x-key']], [200, 'key REDACTED, credential REDACTED, env REDACTED', 'REDACTED']);
  });
});

describe('log lines', () => {
  test('control characters a request sends are escaped: no forged line, no terminal escape sequence', async () => {
    const wh = await started({ hooks: [{ id: 'sig', 'execute-command': '/bin/true', 'trigger-rule': { match: {
      type: 'payload-hmac-sha256', secret: 'hmac-secret-61d0', parameter: { source: 'header', name: 'X-Sig' } } } }] });
    const forged = '\n[webhook] 2020/01/01 00:00:00 forged line\x1b[31m';
    assert.equal((await wh.request(`/hooks/nope${encodeURIComponent(forged)}`, { method: 'POST' })).status, 404);
    // Header values reach Node as latin-1: the bytes C2 9B arrive as "Â" and the C1 control CSI.
    const raw = await new Promise<string>((resolve) => {
      let reply = '';
      const sock = net.connect(wh.port, '127.0.0.1', () => sock.end(Buffer.concat([
        Buffer.from('POST /hooks/sig HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\nX-Sig: sha256=ab'),
        Buffer.from([0xc2, 0x9b]), Buffer.from('31mred\r\n\r\n{}'),
      ])));
      sock.on('data', (d) => (reply += d));
      sock.on('close', () => resolve(reply));
    });
    assert.match(raw, /^HTTP\/1\.1 500 /);
    const out = await waitForOutput(wh, 'error evaluating hook');
    assert.ok(out.includes('hook not found: nope\\x0a[webhook] 2020/01/01 00:00:00 forged line\\x1b[31m'), out);
    assert.ok(out.includes('invalid payload signature ab\u00c2\\x9b31mred'), out);
    assert.doesNotMatch(out, /^\[webhook\] 2020\/01\/01/m);
    assert.doesNotMatch(out, /[\x1b\x9b]/);
  });
});

describe('methods', () => {
  test('HEAD and OPTIONS do not trigger a hook unless listed', async () => {
    const rec = makeTempDir();
    const cmd = recorderCommand(rec);
    const wh = await started({ hooks: [{ id: 'any', 'execute-command': cmd }, { id: 'opt', 'execute-command': cmd, 'http-methods': [' options '] }] });
    for (const m of ['HEAD', 'OPTIONS']) {
      const res = await wh.request('/hooks/any', { method: m });
      assert.equal(res.status, 405, m);
      assert.deepEqual((await logOfAnsweredRequest(wh, res)).filter((line) => line.includes('executing')), [], m);
    }
    assert.equal(hasRecord(rec), false);
    assert.equal((await wh.request('/hooks/opt', { method: 'OPTIONS' })).status, 200);
    await waitForRecord(rec);
  });
});

/** A whole request written raw; resolves with everything the server sent before it closed. */
const rawRequest = (port: number, text: string) => sendAndStall(port, text).then((r) => r.reply);

describe('a method Node does not parse (Get, post)', () => {
  test('at a hook: 405 with Allow, logged as a disallowed method; the command does not run', async () => {
    const rec = makeTempDir();
    const wh = await started({ hooks: [{ id: 'h', 'execute-command': recorderCommand(rec), 'http-methods': ['POST'] }] });
    for (const method of ['Get', 'post']) {
      const res = await rawRequest(wh.port, `${method} /hooks/h?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n`);
      assert.match(res, /^HTTP\/1\.1 405 Method Not Allowed\r\n/, method);
      assert.match(res, /\r\nAllow: POST\r\n/);
      assert.match(res, /\r\nX-Request-Id: [0-9a-f-]{36}\r\n/);
      await waitForOutput(wh, `HTTP ${method} method not allowed for hook "h"`);
    }
    assert.match(await rawRequest(wh.port, 'Get /nothing HTTP/1.1\r\nHost: x\r\n\r\n'), /^HTTP\/1\.1 400 Bad Request\r\n/);
    assert.match(await rawRequest(wh.port, 'Get /hooks/missing HTTP/1.1\r\nHost: x\r\n\r\n'), /^HTTP\/1\.1 404 Not Found\r\n[\s\S]*Hook not found\.$/);
    assert.equal(hasRecord(rec), false);
  });
});

describe('the log is written before the answer', () => {
  test('killed with SIGKILL right after answering, the process has logged everything about the request', async () => {
    const rec = makeTempDir();
    const cmd = recorderCommand(rec, { stdout: 'out-7f3a\n' });
    const wh = await startWebhook({ hooks: [{ id: 'h', 'execute-command': cmd, 'include-command-output-in-response': true }] });
    const res = await wh.request('/hooks/h?a=1');
    wh.proc.kill('SIGKILL');
    await wh.exited;
    assert.equal(res.status, 200);
    for (const line of ['incoming HTTP GET request', 'h got matched', 'h hook triggered successfully', 'command output: out-7f3a', '"GET /hooks/h?a=1" 200']) {
      assert.ok(wh.output().includes(line), `${line} in\n${wh.output()}`);
    }
  });
});

describe('other flags', () => {
  test('-secure serves HTTPS with -cert/-key and -tls-min-version; a missing certificate exits 1', async () => {
    const dir = makeTempDir();
    await run('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1', '-subj', '/CN=localhost',
      '-addext', 'subjectAltName=IP:127.0.0.1', '-keyout', path.join(dir, 'key.pem'), '-out', path.join(dir, 'cert.pem')]);
    const bad = await spawnWebhook({ hooks: [{ id: 'x', 'execute-command': '/bin/true' }], args: ['-secure', '-cert', path.join(dir, 'none.pem'), '-key', path.join(dir, 'key.pem')] });
    assert.equal((await bad.exited).code, 1);
    assert.match(bad.output(), /cannot start HTTPS: .*none\.pem/);
    const s = await spawnWebhook({ hooks: [{ id: 'x', 'execute-command': '/bin/true' }], args: ['-secure', '-cert', path.join(dir, 'cert.pem'), '-key', path.join(dir, 'key.pem'), '-tls-min-version', '1.3'] });
    try {
      await waitForOutput(s, 'serving hooks on https://');
      const https = await import('node:https');
      const ca = fs.readFileSync(path.join(dir, 'cert.pem'));
      const get = (opts: object) => new Promise<string>((resolve, reject) => {
        https.get({ host: '127.0.0.1', port: s.port, path: '/', ca, ...opts }, (res) => {
          let b = '';
          res.on('data', (d) => (b += d)).on('end', () => resolve(`${res.statusCode} ${b}`));
        }).on('error', reject);
      });
      assert.equal(await get({}), '200 OK');
      await assert.rejects(get({ maxVersion: 'TLSv1.2' }), /version|alert|handshake/i);
    } finally {
      s.proc.kill('SIGTERM');
      await s.exited;
    }
  });

  test('a client that sends its body too slowly is cut off after -read-timeout', async () => {
    const rec = makeTempDir();
    const wh = await started({ hooks: [{ id: 'x', 'execute-command': recorderCommand(rec) }], args: ['-read-timeout', '700ms'] });
    const { reply, ms } = await sendAndStall(wh.port, 'POST /hooks/x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc');
    assert.ok(ms < 8_000, 'closed by the server, not by the test timeout');
    assert.match(reply, /^HTTP\/1\.1 408|^$/);
    assert.equal(hasRecord(rec), false);
  });

  test('-pidfile is written and removed; -logfile receives the log; -socket serves on a Unix socket', async () => {
    const dir = makeTempDir();
    const s = await spawnWebhook({ hooks: [{ id: 'x', 'execute-command': '/bin/true' }], args: ['-pidfile', path.join(dir, 'pid'), '-logfile', path.join(dir, 'log'), '-socket', path.join(dir, 'sock')] });
    await waitFor(() => (fs.existsSync(path.join(dir, 'pid')) ? true : undefined), { what: 'pid file' });
    assert.equal(fs.readFileSync(path.join(dir, 'pid'), 'utf8'), `${s.proc.pid}\n`);
    const http = await import('node:http');
    const body = await new Promise<string>((resolve, reject) => {
      http.request({ socketPath: path.join(dir, 'sock'), path: '/hooks/x', method: 'POST' }, (res) => {
        let b = '';
        res.on('data', (d) => (b += d)).on('end', () => resolve(`${res.statusCode}`));
      }).on('error', reject).end();
    });
    assert.equal(body, '200');
    s.proc.kill('SIGTERM');
    assert.equal((await s.exited).code, 0);
    assert.equal(fs.existsSync(path.join(dir, 'pid')), false);
    assert.match(fs.readFileSync(path.join(dir, 'log'), 'utf8'), /x hook triggered successfully/);
  });
});
