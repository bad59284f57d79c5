/*
 * Shared by bench/bench.ts and bench/profile.ts: the hooks file, the scenario table, starting and
 * stopping a server, its CPU time and memory from /proc, and the load generator (wrk with a
 * checking Lua script, or a Node fallback).
 */

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as net from 'node:net';
import * as path from 'node:path';

export const ROOT = path.resolve(import.meta.dirname, '..');
export const OURS = process.env.BENCH_OURS ?? path.join(ROOT, 'dist', 'webhook');

export const DURATION = Number(process.env.BENCH_DURATION ?? 10);
export const WARMUP = Number(process.env.BENCH_WARMUP ?? 2);
export const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 32);
export const THREADS = Number(process.env.BENCH_THREADS ?? 2);
export const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 1);
export const VERBOSE_PASS = process.env.BENCH_VERBOSE === '1';
/** Idle time after a server's last run before its "after" memory is read (garbage collection, scavenging). */
export const SETTLE = Number(process.env.BENCH_SETTLE ?? 2);
/** /proc/<pid>/status is read this often during a scenario: brief peaks (a flood's bodies) last longer. */
const SAMPLE_MS = 20;

// ---------------------------------------------------------------------------------------------
// Payloads, hooks and the scenario table
// ---------------------------------------------------------------------------------------------

const FIXTURES = path.join(ROOT, 'test', 'fixtures', 'upgrade');
/** Aliyun ACR's documented push payload, verbatim. */
export const PAYLOAD = fs.readFileSync(path.join(FIXTURES, 'acr-push.json'), 'utf8').trim();
const ACR = JSON.parse(PAYLOAD);

/** The token the seed hook's template reads; both servers get it in their environment. */
export const HOOK_TOKEN = 'bench-7f3c9a1e5d2b8046c1a9e3f7';
const WRONG_TOKEN = 'bench-0000000000000000000000';
const TOKEN_TEMPLATE = '{{ getenv "HOOK_TOKEN" }}';

/** The seed hook as shipped (examples/hooks/web.json): the hook every deployment of the old image uses. */
const SEED = JSON.parse(fs.readFileSync(path.join(ROOT, 'examples', 'hooks', 'web.json'), 'utf8'))[0];

export const HOOKS = [
  {
    id: 'mismatch',
    'execute-command': '/bin/true',
    'trigger-rule-mismatch-http-response-code': 500,
    'trigger-rule': {
      match: { type: 'value', value: 'right-token-0123456789', parameter: { source: 'url', name: 'token' } },
    },
  },
  {
    id: 'echo',
    'execute-command': '/bin/echo',
    'include-command-output-in-response': true,
    'pass-arguments-to-command': [{ source: 'payload', name: 'repository.repo_full_name' }],
  },
  SEED,
  { ...SEED, id: `${SEED.id}-echo`, 'execute-command': '/bin/echo' },
];

/**
 * `/hooks/<id>?token=…` plus every other URL parameter the seed hook's rule compares, with the value
 * it wants (ns, workload, container), and the repo_type an ACR webhook is configured with.
 */
function seedPath(id: string, token: string): string {
  const query = new URLSearchParams({ token });
  type Match = { value: string; parameter: { source: string; name: string } };
  const rules: { match?: Match }[] = SEED['trigger-rule'].and;
  if (!rules.some((r) => r.match?.parameter.name === 'token' && r.match.value === TOKEN_TEMPLATE)) {
    throw new Error(`examples/hooks/web.json: the seed hook no longer compares token with ${TOKEN_TEMPLATE}`);
  }
  for (const { match } of rules) {
    const name = match?.parameter.source === 'url' ? match.parameter.name : 'token';
    if (name !== 'token') query.set(name, match!.value);
  }
  query.set('repo_type', 'regionalregistry');
  return `/hooks/${id}?${query}`;
}

/**
 * A ~9 MB push: the ACR payload with Docker Hub's README fixture (Chinese, HTML, `$(id)`) repeated
 * into a `full_description`, below our default -max-body-size (10 MiB). adnanh has no body limit.
 */
function floodPayload(bytes: number): string {
  const readme: string = JSON.parse(fs.readFileSync(path.join(FIXTURES, 'dockerhub-push.json'), 'utf8'))
    .repository.full_description;
  const times = Math.floor((bytes - PAYLOAD.length) / Buffer.byteLength(JSON.stringify(readme)));
  return JSON.stringify({ ...ACR, repository: { ...ACR.repository, full_description: readme.repeat(times) } });
}

export interface Scenario {
  name: string;
  label: string;
  method: 'GET' | 'POST';
  path: string;
  body?: string;
  expectStatus: number;
  expectBody: string; // the response body must contain this
  connections?: number; // instead of BENCH_CONNECTIONS
}

const MISMATCH = 'Hook rules were not satisfied.';

const ALL_SCENARIOS: Scenario[] = [
  {
    name: 'mismatch',
    label: '(a) one value rule, wrong token → 500',
    method: 'POST',
    path: '/hooks/mismatch?token=wrong-token-0123456789',
    body: PAYLOAD,
    expectStatus: 500,
    expectBody: MISMATCH,
  },
  {
    name: 'command',
    label: '(b) /bin/echo, output in response',
    method: 'POST',
    path: '/hooks/echo',
    body: PAYLOAD,
    expectStatus: 200,
    expectBody: ACR.repository.repo_full_name,
  },
  {
    name: 'seed-mismatch',
    label: '(c) seed hook, ACR push, wrong token → 500',
    method: 'POST',
    path: seedPath(SEED.id, WRONG_TOKEN),
    body: PAYLOAD,
    expectStatus: 500,
    expectBody: MISMATCH,
  },
  {
    name: 'seed-command',
    label: '(d) seed hook running /bin/echo <entire payload>, right token → 200',
    method: 'POST',
    path: seedPath(`${SEED.id}-echo`, HOOK_TOKEN),
    body: PAYLOAD,
    expectStatus: 200,
    expectBody: PAYLOAD, // entire-payload is re-serialised with sorted keys, as the fixture already is
  },
  {
    name: 'seed-flood',
    label: '(e) seed hook, 8 concurrent ~9 MB pushes, wrong token → 500',
    method: 'POST',
    path: seedPath(SEED.id, WRONG_TOKEN),
    body: floodPayload(9 * 1024 * 1024),
    expectStatus: 500,
    expectBody: MISMATCH,
    connections: 8,
  },
];

const SELECTED = process.env.BENCH_SCENARIOS?.split(',');
export const SCENARIOS = ALL_SCENARIOS.filter((s) => !SELECTED || SELECTED.includes(s.name));

export function connections(sc: Scenario): number {
  return sc.connections ?? CONNECTIONS;
}

/**
 * Writes HOOKS as a -template file. The token is written `{{ getenv "HOOK_TOKEN" }}` with bare
 * quotes, as adnanh's own templates do: examples/hooks/web.json escapes them (`\"`) so that the file
 * is valid JSON before templating, which ours accepts and adnanh 2.8 refuses (`unexpected "\\" in
 * operand`), so both servers load the same text.
 */
export function writeHooksFile(dir: string): string {
  const file = path.join(dir, 'hooks.json');
  const text = JSON.stringify(HOOKS, null, 2).replaceAll(JSON.stringify(TOKEN_TEMPLATE), `"${TOKEN_TEMPLATE}"`);
  fs.writeFileSync(file, text);
  return file;
}

// ---------------------------------------------------------------------------------------------
// Servers
// ---------------------------------------------------------------------------------------------

export interface Server {
  who: 'ours' | 'adnanh';
  port: number;
  proc: ChildProcess;
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

export function get(port: number, p: string, method = 'GET', body?: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const headers = body ? { 'Content-Type': 'application/json' } : {};
    const req = http.request({ host: '127.0.0.1', port, path: p, method, agent: false, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
    });
    req.on('error', reject);
    req.setTimeout(5000, () => req.destroy(new Error('timeout')));
    req.end(body);
  });
}

/** Sends one request of the scenario and throws unless it gets the expected answer. */
export async function sanityCheck(label: string, port: number, sc: Scenario): Promise<void> {
  const r = await get(port, sc.path, sc.method, sc.body);
  if (r.status !== sc.expectStatus || !r.body.includes(sc.expectBody)) {
    throw new Error(
      `${label}: sanity request for ${sc.name} got ${r.status} ${JSON.stringify(r.body.slice(0, 500))}, ` +
        `expected ${sc.expectStatus} containing ${JSON.stringify(sc.expectBody)}`,
    );
  }
}

/**
 * Starts `bin [...prefix] -hooks … -template -ip 127.0.0.1 -port N` with HOOK_TOKEN (and `env`) in
 * its environment and waits until `GET /` answers 200.
 */
export async function startServer(
  who: 'ours' | 'adnanh', bin: string, hooksFile: string, verbose: boolean, prefix: string[] = [],
  env: Record<string, string> = {},
  maxCommands = 1000,
): Promise<Server> {
  const port = await freePort();
  const args = [...prefix, '-hooks', hooksFile, '-template', '-ip', '127.0.0.1', '-port', String(port)];
  if (verbose) args.push('-verbose');
  if (who === 'ours') args.push('-max-concurrent-commands', String(maxCommands));
  // BENCH_SERVER_LOG: the server's output appended to that file (to see what a run did), else dropped.
  const log = process.env.BENCH_SERVER_LOG ? fs.openSync(process.env.BENCH_SERVER_LOG, 'a') : 'ignore';
  const proc = spawn(bin, args, { stdio: ['ignore', log, log], env: { ...process.env, ...env, HOOK_TOKEN } });
  if (typeof log === 'number') fs.closeSync(log);
  let exited = false;
  proc.once('exit', () => (exited = true));
  const deadline = Date.now() + 15_000;
  for (;;) {
    if (exited) throw new Error(`${who} (${bin}) exited during start-up`);
    try {
      const r = await get(port, '/');
      if (r.status === 200) return { who, port, proc };
    } catch {
      /* not listening yet */
    }
    if (Date.now() > deadline) throw new Error(`${who} did not answer GET / within 15 s`);
    await sleep(50);
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

export function stopServer(s: Server): Promise<void> {
  return new Promise((resolve) => {
    if (s.proc.exitCode !== null || s.proc.signalCode !== null) return resolve();
    const kill = setTimeout(() => s.proc.kill('SIGKILL'), 5000);
    s.proc.once('exit', () => {
      clearTimeout(kill);
      resolve();
    });
    s.proc.kill('SIGTERM');
  });
}

// ---------------------------------------------------------------------------------------------
// What a server uses, from /proc
// ---------------------------------------------------------------------------------------------

/**
 * Resident memory in MB from /proc/<pid>/status: private (RssAnon: heaps, stacks, what a request
 * body costs), file-backed (RssFile: the executable's and libraries' pages in use; for ours mostly
 * the 150 MB single executable, shared with every other process that maps it), and the kernel's
 * own peak of their sum (VmHWM).
 */
export function rss(pid: number): { anon: number; file: number; hwm: number } {
  const text = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const mb = (k: string) => Number(text.match(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm'))?.[1] ?? NaN) / 1024;
  return { anon: mb('RssAnon'), file: mb('RssFile'), hwm: mb('VmHWM') };
}

export interface MemoryWatch {
  before: { anon: number; file: number };
  peak: { anon: number; file: number };
  stop(): void;
}

/** Reads a process's RSS every SAMPLE_MS from now until stop(), keeping the first reading and the peaks. */
export function watchMemory(pid: number): MemoryWatch {
  const before = rss(pid);
  const peak = { anon: before.anon, file: before.file };
  const timer = setInterval(() => {
    try {
      const m = rss(pid);
      peak.anon = Math.max(peak.anon, m.anon);
      peak.file = Math.max(peak.file, m.file);
    } catch {
      /* the process has exited */
    }
  }, SAMPLE_MS);
  return { before, peak, stop: () => clearInterval(timer) };
}

const CLK_TCK = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout?.trim()) || 100;

/** CPU time in ms used so far by the process itself and by its reaped children (the commands). */
export function cpuTime(pid: number): { self: number; children: number } {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ').map(Number); // f[0] is field 3 (state)
  const ms = (ticks: number) => (ticks * 1000) / CLK_TCK;
  return { self: ms(f[11] + f[12]), children: ms(f[13] + f[14]) };
}

/** Runs a load against a server and adds the server's CPU time used meanwhile to the result. */
export async function measuredLoad(dir: string, s: Server, sc: Scenario, seconds: number): Promise<LoadResult> {
  const before = cpuTime(s.proc.pid!);
  const r = await load(dir, s.port, sc, seconds);
  const after = cpuTime(s.proc.pid!);
  return { ...r, cpuMs: after.self - before.self, childCpuMs: after.children - before.children };
}

// ---------------------------------------------------------------------------------------------
// Load generators
// ---------------------------------------------------------------------------------------------

export interface LoadResult {
  requests: number; // completed responses
  seconds: number;
  rps: number; // completed responses per second (good and bad)
  goodRps: number; // expected responses per second
  p50ms: number;
  p99ms: number;
  unexpected: number; // wrong status or body
  socketErrors: number; // connect/read/write/timeout
  statuses: Record<string, number>;
  cpuMs?: number; // server process CPU (user+sys) during the run, when measured
  childCpuMs?: number; // CPU of the commands it ran and reaped during the run
}

export const HAVE_WRK = process.env.BENCH_CLIENT !== 'node' && spawnSync('wrk', ['--version']).error === undefined;

/** A Lua long string holding `s` verbatim, its bracket level chosen so that `s` cannot close it. */
function luaString(s: string): string {
  let eq = '=';
  while (s.includes(`]${eq}]`)) eq += '=';
  return `[${eq}[${s}]${eq}]`;
}

const WRK_CHECKS = `
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) statuses = {}; bad = 0 end
function response(status, headers, body)
  local k = tostring(status)
  statuses[k] = (statuses[k] or 0) + 1
  if status ~= expect_status or body == nil or not string.find(body, expect_body, 1, true) then bad = bad + 1 end
end
function done(summary, latency, requests)
  local total, parts, all = 0, {}, {}
  for _, t in ipairs(threads) do
    total = total + t:get("bad")
    for k, v in pairs(t:get("statuses")) do all[k] = (all[k] or 0) + v end
  end
  for k, v in pairs(all) do table.insert(parts, string.format('"%s":%d', k, v)) end
  local e = summary.errors
  io.write(string.format('BENCH_JSON {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"bad":%d,' ..
    '"socket_errors":%d,"statuses":{%s}}\\n', summary.requests, summary.duration, latency:percentile(50),
    latency:percentile(99), total, e.connect + e.read + e.write + e.timeout, table.concat(parts, ",")))
end
`;

/** The wrk script of a scenario: its request, and a check of every response's status and body. */
export function wrkScript(dir: string, sc: Scenario): string {
  const file = path.join(dir, `${sc.name}.lua`);
  const body = sc.body === undefined
    ? ''
    : `wrk.body = ${luaString(sc.body)}\nwrk.headers["Content-Type"] = "application/json"\n`;
  const expect = `expect_status = ${sc.expectStatus}\nexpect_body = ${luaString(sc.expectBody)}\n`;
  fs.writeFileSync(file, `wrk.method = "${sc.method}"\n${body}${expect}${WRK_CHECKS}`);
  return file;
}

export function runWrk(script: string, port: number, sc: Scenario, seconds: number): Promise<LoadResult> {
  const c = connections(sc);
  const threads = String(Math.min(THREADS, c));
  const args = ['-t', threads, '-c', String(c), '-d', `${seconds}s`, '--timeout', '5s', '-s', script];
  return new Promise((resolve, reject) => {
    const p = spawn('wrk', [...args, `http://127.0.0.1:${port}${sc.path}`], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    p.stdout.on('data', (d) => (out += d));
    p.stderr.on('data', (d) => (out += d));
    p.on('error', reject);
    p.on('exit', () => {
      const line = out.split('\n').find((l) => l.startsWith('BENCH_JSON '));
      if (!line) return reject(new Error(`wrk gave no result:\n${out}`));
      const j = JSON.parse(line.slice('BENCH_JSON '.length));
      const secs = j.duration_us / 1e6;
      resolve({
        requests: j.requests,
        seconds: secs,
        rps: j.requests / secs,
        goodRps: (j.requests - j.bad) / secs,
        p50ms: j.p50_us / 1000,
        p99ms: j.p99_us / 1000,
        unexpected: j.bad,
        socketErrors: j.socket_errors,
        statuses: j.statuses,
      });
    });
  });
}

interface Tally {
  latencies: number[];
  statuses: Record<string, number>;
  unexpected: number;
  socketErrors: number;
}

/** One request of the scenario on a keep-alive agent, its outcome added to the tally. */
function nodeRequest(agent: http.Agent, port: number, sc: Scenario, body: Buffer | undefined, t: Tally): Promise<void> {
  const headers = body ? { 'Content-Type': 'application/json' } : {};
  return new Promise<void>((resolve) => {
    const t0 = performance.now();
    const req = http.request({ host: '127.0.0.1', port, path: sc.path, method: sc.method, agent, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        t.latencies.push(performance.now() - t0);
        const k = String(res.statusCode);
        t.statuses[k] = (t.statuses[k] ?? 0) + 1;
        const text = Buffer.concat(chunks).toString();
        if (res.statusCode !== sc.expectStatus || !text.includes(sc.expectBody)) t.unexpected++;
        resolve();
      });
    });
    req.on('error', () => {
      t.socketErrors++;
      resolve();
    });
    req.end(body);
  });
}

/** Fallback: connections(sc) keep-alive request loops in this process. */
export async function runNodeLoad(port: number, sc: Scenario, seconds: number): Promise<LoadResult> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: connections(sc) });
  const body = sc.body === undefined ? undefined : Buffer.from(sc.body);
  const t: Tally = { latencies: [], statuses: {}, unexpected: 0, socketErrors: 0 };
  const start = performance.now();
  const end = start + seconds * 1000;
  await Promise.all(
    Array.from({ length: connections(sc) }, async () => {
      while (performance.now() < end) await nodeRequest(agent, port, sc, body, t);
    }),
  );
  const secs = (performance.now() - start) / 1000;
  agent.destroy();
  const sorted = t.latencies.sort((a, b) => a - b);
  const pct = (p: number) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? NaN;
  const { statuses, unexpected, socketErrors } = t;
  const requests = sorted.length;
  const rps = requests / secs;
  const goodRps = (requests - unexpected) / secs;
  return { requests, seconds: secs, rps, goodRps, p50ms: pct(50), p99ms: pct(99), unexpected, socketErrors, statuses };
}

export function load(dir: string, port: number, sc: Scenario, seconds: number): Promise<LoadResult> {
  return HAVE_WRK ? runWrk(wrkScript(dir, sc), port, sc, seconds) : runNodeLoad(port, sc, seconds);
}

export function combine(runs: LoadResult[]): LoadResult {
  const sum = (f: (r: LoadResult) => number) => runs.reduce((a, r) => a + f(r), 0);
  const median = (xs: number[]) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const requests = sum((r) => r.requests);
  const seconds = sum((r) => r.seconds);
  const unexpected = sum((r) => r.unexpected);
  const statuses: Record<string, number> = {};
  for (const r of runs) for (const [k, v] of Object.entries(r.statuses)) statuses[k] = (statuses[k] ?? 0) + v;
  return {
    requests,
    seconds,
    rps: requests / seconds,
    goodRps: (requests - unexpected) / seconds,
    p50ms: median(runs.map((r) => r.p50ms)),
    p99ms: median(runs.map((r) => r.p99ms)),
    unexpected,
    socketErrors: sum((r) => r.socketErrors),
    statuses,
    cpuMs: sum((r) => r.cpuMs ?? NaN),
    childCpuMs: sum((r) => r.childCpuMs ?? NaN),
  };
}
