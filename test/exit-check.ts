/*
 * A test file's process ends with its tests. Imported by test/harness.ts and preloaded by `npm test`
 * (`node --import ./test/exit-check.ts --test …`), so every test file's process has it: once the
 * file's last test and its last `after` hook have ended, the process has EXIT_GRACE_MS to end on its
 * own. Still alive then, something the tests opened holds it (a socket, a server, a child process, a
 * timer): the check names each such handle on stderr, kills the child processes it finds and exits 1,
 * so the file is reported failed at once instead of holding `npm test` until the handle lets go
 * (a Kubernetes watch: up to ten minutes).
 *
 * Nothing happens in a process that is not a test file: the runner's own process, a benchmark that
 * imports the harness.
 */
import { AsyncResource } from 'node:async_hooks';
import type { ChildProcess } from 'node:child_process';
import * as net from 'node:net';
import { after } from 'node:test';

/**
 * How long a test file's process may live on after its last `after` hook. A few seconds: time for a
 * child's exit status or a closing socket's last callback to arrive on a loaded 2-core machine; a
 * handle still open past it is one the tests forgot, not one on its way out. EXIT_CHECK_GRACE_MS
 * overrides it (test/exit-check.test.ts, which checks the check, waits less).
 */
export const EXIT_GRACE_MS = Number(process.env.EXIT_CHECK_GRACE_MS) || 10_000;

/** Whether this process runs a test file: a child of `node --test`, or a `*.test.ts` run directly. */
function isTestFile(): boolean {
  return process.env.NODE_TEST_CONTEXT !== undefined || /\.test\.[cm]?[jt]s$/.test(process.argv[1] ?? '');
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
    `${file}: the process is still running ${EXIT_GRACE_MS / 1000} s after its last test and after hook ended;`,
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

if (isTestFile()) {
  // A hook registered here would run before the file's own root `after` hooks (it is registered
  // first). So this one registers the watch when the after hooks start, from a scope outside every
  // test: node:test then puts it on the root, after the file's hooks, and it runs last.
  const outsideTests = new AsyncResource('exit-check');
  after(() => {
    outsideTests.runInAsyncScope(() =>
      after(() => {
        // Unref'd: it never holds the process itself, so it fires only when something else does.
        setTimeout(reportAndExit, EXIT_GRACE_MS).unref();
      }),
    );
  });
}
