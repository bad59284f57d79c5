/*
 * A test file's process ends with its tests. Imported by test/harness.ts and preloaded by `npm test`
 * (`node --import ./test/exit-check.ts --test …`), so every test file's process has it: once the
 * file has been read to its end (top-level awaits included) and its last test, suite and `after` hook
 * have ended, the process has EXIT_GRACE_MS to end on its own. Still alive then, something the tests
 * opened holds it (a socket, a server, a child process): the check names each such handle on stderr,
 * kills the child processes it finds and exits 1, so the file is reported failed at once instead of
 * holding `npm test` until the handle lets go (a Kubernetes watch: up to ten minutes).
 *
 * When the tests have ended is read from node:test's own diagnostics channel (`tracing:node.test:start`
 * and `…:end`, published for every test and suite and for the root, whose end follows the file's root
 * `after` hooks), and from the test file's module having been evaluated: node:test runs the root's
 * `after` hooks as soon as the tests known so far have ended, even while a top-level await (a test
 * cluster being built) is still to add more.
 *
 * Nothing happens in a process that is not a test file: the runner's own process, a benchmark that
 * imports the harness.
 */
import type { ChildProcess } from 'node:child_process';
import { channel } from 'node:diagnostics_channel';
import { realpathSync } from 'node:fs';
import * as net from 'node:net';
import { pathToFileURL } from 'node:url';

/**
 * How long a test file's process may live on after its tests, suites and hooks have ended. A few seconds: time for a
 * child's exit status or a closing socket's last callback to arrive on a loaded 2-core machine; a
 * handle still open past it is one the tests forgot, not one on its way out. EXIT_CHECK_GRACE_MS
 * overrides it (test/exit-check.test.ts, which checks the check, waits less).
 */
export const EXIT_GRACE_MS = Number(process.env.EXIT_CHECK_GRACE_MS) || 10_000;

/** Whether this process runs a test file: a child of `node --test`, or a `*.test.ts` run directly. */
function isTestFile(): boolean {
  const main = process.argv[1] ?? '';
  return main !== '' && (process.env.NODE_TEST_CONTEXT !== undefined || /\.test\.[cm]?[jt]s$/.test(main));
}

/** One handle in words: what it is and what it is connected to. */
export function describeHandle(handle: unknown): string {
  if (handle instanceof net.Socket) {
    const request = (handle as net.Socket & { _httpMessage?: { method?: string; path?: string } })._httpMessage;
    const where = handle.remoteAddress
      ? `${handle.localAddress}:${handle.localPort} → ${handle.remoteAddress}:${handle.remotePort}`
      : "a pipe (a child process's stdio, or a Unix socket)";
    const carrying = request?.method ? `, carrying ${request.method} ${request.path}` : '';
    return `${handle.constructor.name} ${where}${carrying}`;
  }
  if (handle instanceof net.Server) {
    const address = handle.address();
    const at = typeof address === 'string' ? address : address ? `${address.address}:${address.port}` : 'no address';
    return `${handle.constructor.name} listening on ${at}`;
  }
  if (isChildProcess(handle)) return `child process ${handle.pid}: ${handle.spawnargs.join(' ')}`;
  return (handle as object)?.constructor?.name ?? typeof handle;
}

function isChildProcess(handle: unknown): handle is ChildProcess {
  return (handle as ChildProcess)?.constructor?.name === 'ChildProcess';
}

/** The handles that keep this process alive, stdio aside. Node lists the objects only through this call. */
export function openHandles(): unknown[] {
  const all = (process as unknown as { _getActiveHandles(): unknown[] })._getActiveHandles();
  return all.filter((h) => h !== process.stdin && h !== process.stdout && h !== process.stderr);
}

/** The report of a process that outlived its tests. */
export function lingeringReport(file: string, handles: unknown[], resources: string[]): string {
  const lines = [
    `${file}: the process is still running ${EXIT_GRACE_MS / 1000} s after its tests and their after hooks ended;`,
    'these keep it alive (close each in an after hook):',
    ...handles.map((h) => `  - ${describeHandle(h)}`),
    `  all active resources: ${resources.join(', ') || 'none'}`,
  ];
  return lines.join('\n') + '\n';
}

function reportAndExit(): void {
  const handles = openHandles();
  process.stderr.write(lingeringReport(process.argv[1] ?? 'the test file', handles, process.getActiveResourcesInfo()));
  for (const h of handles) if (isChildProcess(h)) h.kill('SIGKILL');
  process.exit(1);
}

/** How often the check looks whether the tests have ended; the timer is unref'd, so it never holds the process. */
const CHECK_EVERY_MS = 1_000;

/** Watches the tests of this process and reports it once it outlives them by EXIT_GRACE_MS. */
function watchTests(): void {
  const running = new Set<unknown>();
  let evaluation: Promise<unknown> | undefined;
  let evaluated = false;
  let idleSince = Date.now();
  channel('tracing:node.test:start').subscribe((test) => {
    running.add(test);
    // The first test runs while the file is being evaluated: importing it again waits for its evaluation to end.
    // Node loaded it by its real path: by another (a symlink on the way) it would be a second module, run again.
    evaluation ??= import(pathToFileURL(realpathSync(process.argv[1])).href)
      .catch(() => undefined)
      .finally(() => {
        evaluated = true;
        idleSince = Date.now();
      });
  });
  channel('tracing:node.test:end').subscribe((test) => {
    running.delete(test);
    idleSince = Date.now();
  });
  setInterval(() => {
    if (evaluated && running.size === 0 && Date.now() - idleSince >= EXIT_GRACE_MS) reportAndExit();
  }, CHECK_EVERY_MS).unref();
}

if (isTestFile()) watchTests();
