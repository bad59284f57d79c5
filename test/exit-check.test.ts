/*
 * The check that a test file's process ends with its tests (test/exit-check.ts), run as `npm test`
 * runs it on small test files: one that leaves a server, a client request and a child process open,
 * which is reported failed naming each; ones that close what they open, which pass however long their
 * after hooks take or a top-level await keeps them between two suites.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'node:test';
import { makeTempDir, waitFor } from './harness.ts';

const CHECK = path.join(import.meta.dirname, 'exit-check.ts');
/** The grace the runs below get: short, since here the lingering is on purpose. */
const GRACE_MS = 500;

const PRELUDE = [
  "import { after, test } from 'node:test';",
  "import * as http from 'node:http';",
  "import { spawn } from 'node:child_process';",
  "const server = http.createServer((req, res) => { res.writeHead(200); res.write('event'); });",
  "await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));",
  'const port = server.address().port;',
];

/**
 * A test file of PRELUDE and `lines`, named `name`, run as npm test runs each file (`node --import
 * test/exit-check.ts --test <file>`): its exit code and output.
 */
function runTestFile(name: string, lines: string[]): Promise<{ code: number | null; output: string }> {
  const file = path.join(makeTempDir('exit-check-'), name);
  fs.writeFileSync(file, [...PRELUDE, ...lines].join('\n'));
  // Without this process's NODE_TEST_CONTEXT, which would make the run a test file of this one.
  const { NODE_TEST_CONTEXT: _, ...env } = process.env;
  const child = spawn(process.execPath, ['--import', CHECK, '--test', file], {
    env: { ...env, EXIT_CHECK_GRACE_MS: String(GRACE_MS) },
  });
  let output = '';
  child.stdout.on('data', (d) => (output += d));
  child.stderr.on('data', (d) => (output += d));
  return new Promise((resolve) => child.on('close', (code) => resolve({ code, output })));
}

test('a test file that leaves a watch, a server and a child process open is failed, naming each', async () => {
  const run = await runTestFile('lingers.test.mjs', [
    "test('passes, and leaves things open', async () => {",
    "  await new Promise((resolve) => http.get({ host: '127.0.0.1', port, path: '/watch?w=1' }, resolve));",
    "  spawn('sleep', ['600'], { stdio: 'ignore' });",
    '});',
  ]);
  assert.notEqual(run.code, 0, run.output);
  assert.match(run.output, /✔ passes, and leaves things open/);
  assert.match(
    run.output,
    /lingers\.test\.mjs: the process is still running 0\.5 s after its tests and their after hooks ended/,
  );
  assert.match(run.output, /- Server listening on 127\.0\.0\.1:\d+/);
  assert.match(run.output, /- Socket 127\.0\.0\.1:\d+ → 127\.0\.0\.1:\d+, carrying GET \/watch\?w=1/);
  const pid = /- child process (\d+): sleep 600/.exec(run.output)?.[1];
  assert.ok(pid, run.output);
  // Killed, it is gone or a zombie until whoever inherited it reaps it.
  const ended = () => {
    try {
      return /^\S+ \(.*\) Z/.test(fs.readFileSync(`/proc/${pid}/stat`, 'utf8'));
    } catch {
      return true;
    }
  };
  await waitFor(ended, { timeoutMs: 10_000, what: `the child process ${pid} it found, killed` });
});

test('a test file that closes what it opens, in an after hook that takes longer than the grace, passes', async () => {
  const run = await runTestFile('closes.test.mjs', [
    // The file's own after hook runs after the check's first one: the grace starts when it has ended.
    `after(() => new Promise((resolve) => setTimeout(() => server.close(resolve), ${GRACE_MS * 4})));`,
    "test('passes', async () => {",
    '  const agent = new http.Agent({ keepAlive: false });',
    "  await new Promise((resolve) => http.get({ host: '127.0.0.1', port, agent }, (res) => { res.destroy(); resolve(); }));",
    '});',
  ]);
  assert.equal(run.code, 0, run.output);
  assert.doesNotMatch(run.output, /still running/);
});

test('a test file that awaits longer than the grace between two suites (a cluster being built) is not reported meanwhile', async () => {
  const run = await runTestFile('awaits.test.mjs', [
    "test('before the await', () => {});",
    // A slow set-up (the test cluster built on first use) between two suites. node:test runs the root's after
    // hooks before it already: only the end of the file's evaluation says the tests ended.
    "const { setTimeout: slowSetUp } = await import('node:timers/promises');",
    `await slowSetUp(${GRACE_MS * 4});`,
    "test('after the await', () => new Promise((resolve) => server.close(resolve)));",
  ]);
  assert.equal(run.code, 0, run.output);
  assert.match(run.output, /✔ after the await/);
  assert.doesNotMatch(run.output, /still running/);
});
