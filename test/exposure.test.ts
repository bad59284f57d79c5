/*
 * Safe to expose: the hook URL is a bearer secret that leaks, so the executable must hold up
 * when anyone can reach it. Through the built executable over real HTTP: nothing from the
 * environment runs code in it; rules that need no body are decided before the body is read;
 * memory stays flat under a flood of large wrong-token bodies; hook regexes run in linear time;
 * a body that stops arriving is dropped; multipart bodies are signed over their raw bytes.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, describe, test } from 'node:test';
import { promisify } from 'node:util';
import { makeTempDir, spawnWebhook, startWebhook, type Webhook } from './harness.ts';

const run = promisify(execFile);

const stopAll: Webhook[] = [];
after(async () => {
  await Promise.all(stopAll.map((w) => w.stop()));
});
async function started(opts: Parameters<typeof startWebhook>[0]): Promise<Webhook> {
  const w = await startWebhook(opts);
  stopAll.push(w);
  return w;
}

describe('no code from the environment', () => {
  test('NODE_OPTIONS and OPENSSL_CONF are ignored: the service runs and nothing they name is loaded', async () => {
    const dir = makeTempDir();
    const marker = path.join(dir, 'marker');
    const evil = path.join(dir, 'evil.cjs');
    fs.writeFileSync(evil, `require('node:fs').writeFileSync(${JSON.stringify(marker)}, 'ran');\n`);
    // An OpenSSL configuration that activates a provider library that does not exist: a Node that
    // reads it aborts at start-up (a real one would be loaded and run instead).
    const sslConf = path.join(dir, 'openssl.cnf');
    fs.writeFileSync(
      sslConf,
      'nodejs_conf = init\nopenssl_conf = init\n[init]\nproviders = providers\n[providers]\nevil = evil\n' +
        `[evil]\nmodule = ${path.join(dir, 'evil.so')}\nactivate = 1\n`,
    );
    const env = { NODE_OPTIONS: `--require ${evil}`, OPENSSL_CONF: sslConf };

    // The same environment does reach a plain Node: the probe itself works.
    await run(process.execPath, ['-e', '0'], { env: { ...process.env, NODE_OPTIONS: env.NODE_OPTIONS } });
    assert.equal(fs.readFileSync(marker, 'utf8'), 'ran', 'NODE_OPTIONS --require runs code in a plain Node');
    fs.rmSync(marker);
    await assert.rejects(run(process.execPath, ['-e', '0'], { env: { ...process.env, OPENSSL_CONF: sslConf } }));

    const wh = await started({ hooks: [{ id: 'x', 'execute-command': '/bin/true' }], env });
    assert.equal((await wh.request('/hooks/x', { method: 'POST' })).status, 200);
    assert.equal(fs.existsSync(marker), false, 'the --require module ran inside the executable');
  });
});

describe('hook regexes run in linear time', () => {
  test('a catastrophic pattern gets a long input answered at once, and the server goes on answering', { timeout: 30_000 }, async () => {
    const hooks = [{
      id: 're', 'execute-command': '/bin/true', 'response-message': 'triggered',
      'trigger-rule': { match: { type: 'regex', regex: '^([a-z0-9]+-?)+$', parameter: { source: 'url', name: 'name' } } },
    }];
    const wh = await started({ hooks });
    // With backtracking, 40 characters and a final mismatch take 2^40 steps: hours, not an answer.
    const slow = await wh.request(`/hooks/re?name=${'a'.repeat(40)}!`, { method: 'POST' });
    assert.deepEqual([slow.status, slow.body], [200, 'Hook rules were not satisfied.']);
    const next = await wh.request('/hooks/re?name=web-app-2', { method: 'POST' });
    assert.deepEqual([next.status, next.body], [200, 'triggered']);
  });

  test('a pattern the linear engine cannot run is a load error naming the hook and field', async () => {
    const cases: [string, RegExp][] = [
      ['(?:(?:ab){5}){5}', /linear-time engine cannot run it/],
      ['^\\pL+$', /Unicode classes \(\\p\) need Unicode mode/],
    ];
    for (const [regex, why] of cases) {
      const dir = makeTempDir();
      const rule = { match: { type: 'regex', regex, parameter: { source: 'url', name: 'x' } } };
      fs.writeFileSync(path.join(dir, 'hooks.json'), JSON.stringify([{ id: 'linear', 'execute-command': '/bin/true', 'trigger-rule': rule }], null, 2));
      const s = await spawnWebhook({ hooks: dir });
      assert.equal((await s.exited).code, 1, regex);
      assert.match(s.output(), /hooks\.json:\d+: hook "linear": trigger-rule\.match\.regex: invalid regular expression: /, regex);
      assert.match(s.output(), why, regex);
    }
  });
});
