/*
 * The built executable as it starts (scripts/build.ts, docs/development.md#building): it runs from
 * its start-up snapshot, which holds the code cache of Node's own modules the build compiled. V8
 * takes that cache only in a process whose V8 flags are those of the build: a flag set in one place
 * and not the other (the executable's execArgv, serve()'s setFlagsFromString) makes node:http and
 * the rest compile from source at every start (`npm run bench:start` measures the time it costs).
 *   node_modules/.bin/node --test test/build.test.ts
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { startWebhook } from './harness.ts';

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
