/*
 * The built executable as it starts (scripts/build.ts, docs/development.md#building): it runs from
 * its start-up snapshot, which holds the code cache of Node's own modules the build compiled. V8
 * takes that cache only in a process whose V8 flags are those of the build: a flag set in one place
 * and not the other (the executable's execArgv, serve()'s setFlagsFromString) makes node:http and
 * the rest compile from source at every start (`npm run bench:start` measures the time it costs). Its
 * script is kept ASCII, characters past it escaped, so that V8 keeps the text with one byte each.
 *   node_modules/.bin/node --test test/build.test.ts
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, test } from 'node:test';
import { REPO_ROOT, startWebhook } from './harness.ts';

describe('the executable starts from what its build compiled', () => {
  test("V8 takes the code cache of every module of Node's it loads to serve and to run a command", async () => {
    // Node's own debug output: a line per built-in module compiled, saying whether its cache was taken.
    const wh = await startWebhook({
      hooks: [{ id: 'x', 'execute-command': '/bin/true' }],
      env: { NODE_DEBUG_NATIVE: 'CODE_CACHE' },
    });
    try {
      assert.equal((await wh.request('/hooks/x', { method: 'POST' })).status, 200);
    } finally {
      await wh.stop();
    }
    const out = wh.output();
    assert.match(out, /Code cache of http \(\w+\) is accepted/);
    assert.doesNotMatch(out, /Code cache of .* is rejected/);
  });
});

describe('the snapshot script', () => {
  test('is ASCII, so V8 keeps its text with one byte per character (escapes stand for the rest)', () => {
    const script = fs.readFileSync(path.join(REPO_ROOT, 'dist', 'webhook-snapshot.cjs'), 'utf8');
    assert.doesNotMatch(script, /[^\x00-\x7f]/);
    // The escapes mean the characters: a text with characters past ASCII is in the script as such.
    assert.ok(script.includes('Webhooks\\u901a\\u77e5'));
  });
});
