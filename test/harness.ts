/*
 * Test harness: start a webhook executable (ours or adnanh's) on a free loopback port with a given
 * set of hooks, talk to it over real HTTP, and record what the commands it runs received.
 *
 *   const wh = await startWebhook({ hooks: [{ id: 'x', 'execute-command': '/bin/true' }] });
 *   const res = await wh.request('/hooks/x', { method: 'POST', body: '{}' });
 *   await wh.stop();
 *
 * The binary is `$WEBHOOK_BIN`, else `<repo>/dist/webhook`. `recorderCommand(dir)` writes a POSIX
 * shell script that records its argv, environment and working directory into `dir`; the read*
 * helpers read them back.
 */

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
// A test file's process must end with its tests: this reports (and fails) one that does not.
import './exit-check.ts';

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** How long a started server may take to answer `GET /` with 200. */
const READY_TIMEOUT_MS = 10_000;
/** How long `stop()` waits after SIGTERM before it sends SIGKILL. */
const STOP_GRACE_MS = 5_000;
/** Interval between polls (readiness, files appearing). */
const POLL_MS = 20;

export function defaultBinary(): string {
  return process.env.WEBHOOK_BIN ?? path.join(REPO_ROOT, 'dist', 'webhook');
}

/** True when the binary under test is the real adnanh/webhook (set by whoever runs the tests). */
export const IS_ADNANH = process.env.PEER === 'adnanh';

// ---------------------------------------------------------------------------------------------
// Temporary directories, removed when the test process exits.
// ---------------------------------------------------------------------------------------------

const tempDirs: string[] = [];
process.on('exit', () => {
  if (process.env.KEEP_TEST_DIRS) return;
  for (const d of tempDirs) {
    try {
      fs.rmSync(d, { recursive: true, force: true });
    } catch {
      /* best effort */
    }
  }
});

/**
 * The first run of `run` characters of `secret`, or of the base64 of `prefix` + `secret` (an Authorization: Basic
 * value), that `text` holds; undefined when none: what a quote cut across a secret would leave.
 */
export function leaks(text: string, secret: string, prefix = '', run = 16): string | undefined {
  for (const form of [secret, Buffer.from(`${prefix}${secret}`, 'utf8').toString('base64')])
    for (let i = 0; i + run <= form.length; i++) if (text.includes(form.slice(i, i + run))) return form.slice(i, i + run);
  return undefined;
}

export function makeTempDir(prefix = 'webhook-test-'): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  tempDirs.push(dir);
  return dir;
}

/**
 * What `start` gives (a peer the tests need: the cluster, a browser, Helm), or undefined locally
 * when it cannot be had, with a loud message that the `tests` that need it are skipped; in CI
 * (CI=true) the failure fails the run, after one more try (a browser or a cluster component can
 * fail its start on a loaded machine and start the next time); the first failure is written out
 * whole, so that a run that then passes still shows it.
 */
export async function peerOrSkip<T>(start: () => Promise<T>, what: string, tests: string): Promise<T | undefined> {
  try {
    return await start();
  } catch (e) {
    if (!process.env.CI) {
      process.stderr.write(`\n#### ${what} unavailable, SKIPPING ${tests}: ${(e as Error).message}\n\n`);
      return undefined;
    }
    process.stderr.write(`\n#### ${what} did not start, trying once more: ${(e as Error).stack ?? e}\n\n`);
  }
  return start();
}

/**
 * Installs Debian `packages` with apt-get unless `present()` already holds; on a fresh machine with
 * no package lists yet, fetches them once and tries again. Throws, naming `what` and quoting
 * apt-get's last lines, when `present()` still does not hold.
 */
export function aptInstall(packages: string[], present: () => boolean, what: string): void {
  if (present()) return;
  const aptGet = (...args: string[]) => spawnSync('apt-get', ['-o', 'DPkg::Lock::Timeout=300', ...args], {
    encoding: 'utf8',
    env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' },
  });
  let install = aptGet('install', '-y', '--no-install-recommends', ...packages);
  if (install.status !== 0) {
    aptGet('update');
    install = aptGet('install', '-y', '--no-install-recommends', ...packages);
  }
  if (present()) return;
  const detail = install.error ? install.error.message : `${install.stdout}\n${install.stderr}`.trim().split('\n').slice(-15).join('\n');
  throw new Error(
    `${what} missing and "apt-get install -y --no-install-recommends ${packages.join(' ')}" failed (also after "apt-get update"):\n${detail}`,
  );
}

// ---------------------------------------------------------------------------------------------
// Polling
// ---------------------------------------------------------------------------------------------

export async function waitFor<T>(
  probe: () => T | undefined | false | Promise<T | undefined | false>,
  { timeoutMs = 5_000, what = 'condition' }: { timeoutMs?: number; what?: string } = {},
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined && value !== false) return value as T;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, POLL_MS));
  }
}

// ---------------------------------------------------------------------------------------------
// HTTP client
// ---------------------------------------------------------------------------------------------

export interface RequestOptions {
  method?: string;
  headers?: Record<string, string>;
  body?: string | Buffer;
  /** Send no Host header (node adds one otherwise). */
  noHost?: boolean;
}

export interface Response {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

/** One request on a fresh connection (`agent: false`), body collected as UTF-8. */
export function httpRequest(port: number, urlPath: string, opts: RequestOptions = {}): Promise<Response> {
  return new Promise((resolve, reject) => {
    const body = opts.body === undefined ? undefined : Buffer.isBuffer(opts.body) ? opts.body : Buffer.from(opts.body);
    const headers: Record<string, string> = { ...(opts.headers ?? {}) };
    if (body && !Object.keys(headers).some((h) => h.toLowerCase() === 'content-length')) {
      headers['Content-Length'] = String(body.length);
    }
    const req = http.request(
      {
        host: '127.0.0.1',
        port,
        path: urlPath,
        method: opts.method ?? 'GET',
        headers,
        agent: false,
        setHost: !opts.noHost,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.setTimeout(30_000, () => req.destroy(new Error(`request ${urlPath} timed out`)));
    req.end(body);
  });
}

// ---------------------------------------------------------------------------------------------
// Starting and stopping the server
// ---------------------------------------------------------------------------------------------

export interface StartOptions {
  /** Hook objects (written to `hooks.json` in a temp dir), or a path to a hooks file or directory. */
  hooks: object[] | string;
  /** Extra command-line arguments, after `-hooks`, `-ip`, `-port`. */
  args?: string[];
  /** Added to (and overriding) the inherited environment. */
  env?: Record<string, string>;
  bin?: string;
  /** Pass `-verbose` (default true). */
  verbose?: boolean;
  /** Working directory of the server process (default: a fresh temp dir). */
  cwd?: string;
  /** Serve /metrics on a listener of its own (`-metrics-listen 127.0.0.1:0`), read with `metrics()`. */
  metrics?: boolean;
}

export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

export interface Spawned {
  proc: ChildProcess;
  port: number;
  /** Everything the process wrote to stdout and stderr so far, interleaved as received. */
  output(): string;
  /** What it wrote to stdout only. */
  stdout(): string;
  /** What it wrote to stderr only. */
  stderr(): string;
  /** Resolves when the process has exited. */
  exited: Promise<Exit>;
  /** The hooks file or directory passed with `-hooks`. */
  hooksPath: string;
}

export interface Webhook extends Spawned {
  url: string;
  request(urlPath: string, opts?: RequestOptions): Promise<Response>;
  /** GET /metrics from the metrics listener (started with `metrics: true`). */
  metrics(): Promise<Response>;
  stop(): Promise<Exit>;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

function writeHooks(hooks: object[] | string): string {
  if (typeof hooks === 'string') return hooks;
  const dir = makeTempDir('webhook-hooks-');
  const file = path.join(dir, 'hooks.json');
  fs.writeFileSync(file, JSON.stringify(hooks, null, 2));
  return file;
}

/** Starts the process without waiting for it to serve (for tests that expect it to fail at start). */
export async function spawnWebhook(opts: StartOptions, port?: number): Promise<Spawned> {
  const bin = opts.bin ?? defaultBinary();
  const hooksPath = writeHooks(opts.hooks);
  port ??= await freePort();
  const args = ['-hooks', hooksPath, '-ip', '127.0.0.1', '-port', String(port)];
  if (opts.verbose ?? true) args.push('-verbose');
  if (opts.metrics) args.push('-metrics-listen', '127.0.0.1:0');
  args.push(...(opts.args ?? []));
  const proc = spawn(bin, args, {
    cwd: opts.cwd ?? makeTempDir('webhook-cwd-'),
    env: { ...process.env, ...(opts.env ?? {}) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let stdout = '';
  let stderr = '';
  proc.stdout!.setEncoding('utf8').on('data', (s: string) => {
    out += s;
    stdout += s;
  });
  proc.stderr!.setEncoding('utf8').on('data', (s: string) => {
    out += s;
    stderr += s;
  });
  const exited = new Promise<Exit>((resolve) => {
    proc.on('error', (err) => {
      out += `\n[harness] spawn ${bin} failed: ${err.message}\n`;
      resolve({ code: null, signal: null });
    });
    // 'close' (not 'exit') so that all output has been read when this resolves.
    proc.on('close', (code, signal) => resolve({ code, signal }));
  });
  return { proc, port, output: () => out, stdout: () => stdout, stderr: () => stderr, exited, hooksPath };
}

/**
 * Starts the binary on a free loopback port and waits until `GET /` answers 200. Retries on a new
 * port when the chosen one was taken in between; throws with the captured output otherwise.
 */
export async function startWebhook(opts: StartOptions): Promise<Webhook> {
  for (let attempt = 1; ; attempt++) {
    const s = await spawnWebhook(opts);
    let exitedEarly: Exit | undefined;
    s.exited.then((e) => (exitedEarly = e));
    const deadline = Date.now() + READY_TIMEOUT_MS;
    let ready = false;
    while (!ready && !exitedEarly && Date.now() < deadline) {
      try {
        ready = (await httpRequest(s.port, '/')).status === 200;
      } catch {
        /* not listening yet */
      }
      if (!ready) await new Promise((r) => setTimeout(r, POLL_MS));
    }
    if (ready) {
      return {
        ...s,
        url: `http://127.0.0.1:${s.port}`,
        request: (urlPath, ro) => httpRequest(s.port, urlPath, ro),
        metrics: () => metricsOf(s),
        stop: () => stopProcess(s),
      };
    }
    if (!exitedEarly) await stopProcess(s);
    if (/address already in use|EADDRINUSE/i.test(s.output()) && attempt < 3) continue;
    throw new Error(
      `webhook (${opts.bin ?? defaultBinary()}) did not answer GET / with 200 within ${READY_TIMEOUT_MS} ms` +
        (exitedEarly ? ` (exited with code ${exitedEarly.code}, signal ${exitedEarly.signal})` : '') +
        `; output:\n${s.output()}`,
    );
  }
}

/** GET /metrics from the port the server logged for its metrics listener. */
async function metricsOf(s: Spawned): Promise<Response> {
  const logged = await waitForOutput(s, /serving metrics on http:\/\/127\.0\.0\.1:(\d+)\/metrics/);
  const port = Number(/serving metrics on http:\/\/127\.0\.0\.1:(\d+)\/metrics/.exec(logged)![1]);
  return httpRequest(port, '/metrics');
}

async function stopProcess(s: Spawned): Promise<Exit> {
  if (s.proc.exitCode === null && s.proc.signalCode === null) {
    s.proc.kill('SIGTERM');
    const timer = setTimeout(() => s.proc.kill('SIGKILL'), STOP_GRACE_MS);
    try {
      return await s.exited;
    } finally {
      clearTimeout(timer);
    }
  }
  return s.exited;
}

/** Waits until the output contains `needle` (string or pattern). */
/**
 * The output once it matches `needle`, looked for from the offset `from` on: a line an earlier event logged (a
 * reload before this one) is not taken for the one awaited when the caller marks where it starts
 * (`const from = s.output().length` before the action).
 */
export function waitForOutput(s: Spawned, needle: string | RegExp, timeoutMs = 5_000, from = 0): Promise<string> {
  const hit = () => {
    const text = s.output().slice(from);
    return typeof needle === 'string' ? text.includes(needle) : needle.test(text);
  };
  return waitFor(() => (hit() ? s.output() : undefined), { timeoutMs, what: `output matching ${needle}` });
}

/** The admin listener's port, from the line the service logs when it starts serving the deliveries pages. */
export async function adminPort(s: Spawned): Promise<number> {
  const re = /serving deliveries on http:\/\/127\.0\.0\.1:(\d+)\/deliveries/;
  return Number(re.exec(await waitForOutput(s, re))![1]);
}

/**
 * The log lines of the request that got `res` (by its X-Request-Id), read once the server has
 * answered and logged a later request (`GET /healthz`): by then it has logged all it did for the
 * earlier one, a command it started for it included ("executing …"). For a check that something
 * did not happen: it waits for that later event instead of for a while.
 */
export async function logOfAnsweredRequest(wh: Webhook, res: Response): Promise<string[]> {
  const id = String(res.headers['x-request-id']);
  const later = await wh.request('/healthz');
  await waitForOutput(wh, `[${String(later.headers['x-request-id'])}] `);
  const lines = wh.output().split('\n').filter((line) => line.includes(`[${id}] `));
  if (lines.length === 0) throw new Error(`no log line of request ${id} in:\n${wh.output()}`);
  return lines;
}

// ---------------------------------------------------------------------------------------------
// The recorder: a command that writes down what it was given
// ---------------------------------------------------------------------------------------------

export interface RecorderOptions {
  /** Printed on stdout (default `recorder stdout\n`). */
  stdout?: string;
  /** Printed on stderr after stdout (default `recorder stderr\n`). */
  stderr?: string;
  /** Exit status unless `$RECORDER_EXIT` is set (default 0). */
  exitCode?: number;
  /** File name of the script inside `dir` (default `record.sh`). */
  name?: string;
  /** Names of env vars holding file paths (pass-file-to-command): each file is copied as `file.<NAME>`. */
  copyFilesFromEnv?: string[];
}

function shQuote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/**
 * Writes an executable POSIX sh script into `dir` and returns its absolute path. Each run writes
 * `argv` (arguments after $0, NUL-terminated), `env` (NUL-terminated NAME=value), `cwd`,
 * for each `copyFilesFromEnv` name `file.<NAME>` (a copy), `path.<NAME>` (the path) and `mode.<NAME>`,
 * then `done` last. The exit status is `$RECORDER_EXIT` when set, else `exitCode`.
 */
export function recorderCommand(dir: string, opts: RecorderOptions = {}): string {
  fs.mkdirSync(dir, { recursive: true });
  const script = path.join(dir, opts.name ?? 'record.sh');
  const out = opts.stdout ?? 'recorder stdout\n';
  const err = opts.stderr ?? 'recorder stderr\n';
  const copies = (opts.copyFilesFromEnv ?? [])
    .map(
      (name) =>
        `if [ -n "\${${name}+set}" ]; then printf '%s' "$${name}" > "$rec/path.${name}"; ` +
        `cat "$${name}" > "$rec/file.${name}"; stat -c %a "$${name}" > "$rec/mode.${name}"; fi`,
    )
    .join('\n');
  fs.writeFileSync(
    script,
    [
      '#!/bin/sh',
      `rec=${shQuote(dir)}`,
      `: > "$rec/argv"`,
      `for a in "$@"; do printf '%s\\0' "$a" >> "$rec/argv"; done`,
      // GNU and busybox env both support -0 (NUL-terminated entries).
      `env -0 > "$rec/env"`,
      `pwd > "$rec/cwd"`,
      copies,
      `printf '%s' ${shQuote(out)}`,
      `printf '%s' ${shQuote(err)} >&2`,
      `: > "$rec/done"`,
      `exit "\${RECORDER_EXIT:-${opts.exitCode ?? 0}}"`,
      '',
    ].join('\n'),
    { mode: 0o755 },
  );
  return script;
}

/** Removes what a previous run recorded (the script itself stays). */
export function resetRecord(dir: string): void {
  for (const f of fs.readdirSync(dir)) {
    if (f === 'argv' || f === 'env' || f === 'cwd' || f === 'done' || /^(file|path|mode)\./.test(f)) {
      fs.rmSync(path.join(dir, f), { force: true });
    }
  }
}

export function hasRecord(dir: string): boolean {
  return fs.existsSync(path.join(dir, 'done'));
}

/** Waits until a run has finished recording (for asynchronous hooks). */
export function waitForRecord(dir: string, timeoutMs = 5_000): Promise<true> {
  return waitFor(() => hasRecord(dir), { timeoutMs, what: `a recorder run in ${dir}` });
}

function splitNul(s: string): string[] {
  const parts = s.split('\0');
  parts.pop(); // every entry is NUL-terminated
  return parts;
}

export function readArgv(dir: string): string[] {
  return splitNul(fs.readFileSync(path.join(dir, 'argv'), 'utf8'));
}

export function readEnv(dir: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const entry of splitNul(fs.readFileSync(path.join(dir, 'env'), 'utf8'))) {
    const eq = entry.indexOf('=');
    env[entry.slice(0, eq)] = entry.slice(eq + 1);
  }
  return env;
}

export function readCwd(dir: string): string {
  return fs.readFileSync(path.join(dir, 'cwd'), 'utf8').replace(/\n$/, '');
}

/** The copy of the file that `$name` pointed at, its path and octal mode; undefined when not given. */
export function readPassedFile(dir: string, name: string): { content: Buffer; path: string; mode: string } | undefined {
  const copy = path.join(dir, `file.${name}`);
  if (!fs.existsSync(copy)) return undefined;
  return {
    content: fs.readFileSync(copy),
    path: fs.readFileSync(path.join(dir, `path.${name}`), 'utf8'),
    mode: fs.readFileSync(path.join(dir, `mode.${name}`), 'utf8').trim(),
  };
}

export interface Recorded {
  argv: string[];
  env: Record<string, string>;
  cwd: string;
}

export function readRecord(dir: string): Recorded {
  return { argv: readArgv(dir), env: readEnv(dir), cwd: readCwd(dir) };
}

/**
 * Webhooks a file starts (with metrics on) and stops from each suite's own after(): a file-level after() does not
 * run when a name filter leaves a suite's tests out, and a webhook left running keeps the test process alive.
 */
export function webhookPool(): { start: typeof startWebhook; stopAll: () => Promise<unknown> } {
  const running: Webhook[] = [];
  return {
    start: async (opts) => {
      const w = await startWebhook({ metrics: true, ...opts });
      running.push(w);
      return w;
    },
    stopAll: () => Promise.all(running.splice(0).map((w) => w.stop())),
  };
}
