/*
 * Shared by bench/bench.ts and bench/profile.ts: the hooks file, the two scenarios, starting and
 * stopping a server, and the load generator (wrk with a checking Lua script, or a Node fallback).
 */

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as net from 'node:net';
import * as path from 'node:path';

export const ROOT = path.resolve(import.meta.dirname, '..');
export const OURS = path.join(ROOT, 'dist', 'webhook');

export const DURATION = Number(process.env.BENCH_DURATION ?? 10);
export const WARMUP = Number(process.env.BENCH_WARMUP ?? 2);
export const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 32);
export const THREADS = Math.min(Number(process.env.BENCH_THREADS ?? 2), CONNECTIONS);
export const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 1);
export const VERBOSE_PASS = process.env.BENCH_VERBOSE === '1';

// ---------------------------------------------------------------------------------------------
// Scenarios and the shared hooks file
// ---------------------------------------------------------------------------------------------

export const PAYLOAD = fs.readFileSync(path.join(ROOT, 'test', 'fixtures', 'upgrade', 'acr-push.json'), 'utf8').trim();
const REPO_FULL_NAME: string = JSON.parse(PAYLOAD).repository.repo_full_name;

export const HOOKS = [
  {
    id: 'mismatch',
    'execute-command': '/bin/true',
    'trigger-rule-mismatch-http-response-code': 500,
    'trigger-rule': { match: { type: 'value', value: 'right-token-0123456789', parameter: { source: 'url', name: 'token' } } },
  },
  {
    id: 'echo',
    'execute-command': '/bin/echo',
    'include-command-output-in-response': true,
    'pass-arguments-to-command': [{ source: 'payload', name: 'repository.repo_full_name' }],
  },
];

export interface Scenario {
  name: string;
  label: string;
  method: 'GET' | 'POST';
  path: string;
  body?: string;
  expectStatus: number;
  expectBody: string; // the response body must contain this
}

export const SCENARIOS: Scenario[] = [
  {
    name: 'mismatch',
    label: '(a) rule mismatch → 500',
    method: 'POST',
    path: '/hooks/mismatch?token=wrong-token-0123456789',
    body: PAYLOAD,
    expectStatus: 500,
    expectBody: 'Hook rules were not satisfied.',
  },
  {
    name: 'command',
    label: '(b) /bin/echo, output in response',
    method: 'POST',
    path: '/hooks/echo',
    body: PAYLOAD,
    expectStatus: 200,
    expectBody: REPO_FULL_NAME,
  },
].filter((s) => !process.env.BENCH_SCENARIOS || process.env.BENCH_SCENARIOS.split(',').includes(s.name)) as Scenario[];

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
    const req = http.request({ host: '127.0.0.1', port, path: p, method, agent: false, headers: body ? { 'Content-Type': 'application/json' } : {} }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
    });
    req.on('error', reject);
    req.setTimeout(5000, () => req.destroy(new Error('timeout')));
    req.end(body);
  });
}

/** Starts `bin [...prefix] -hooks … -ip 127.0.0.1 -port N` and waits until `GET /` answers 200. */
export async function startServer(who: 'ours' | 'adnanh', bin: string, hooksFile: string, verbose: boolean, prefix: string[] = []): Promise<Server> {
  const port = await freePort();
  const args = [...prefix, '-hooks', hooksFile, '-ip', '127.0.0.1', '-port', String(port)];
  if (verbose) args.push('-verbose');
  if (who === 'ours') args.push('-max-concurrent-commands', '1000');
  const proc = spawn(bin, args, { stdio: ['ignore', 'ignore', 'ignore'] });
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
    await new Promise((r) => setTimeout(r, 50));
  }
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

/** Peak and current resident set size in MB, from /proc/<pid>/status. */
export function memory(pid: number): { hwm: number; rss: number } {
  const text = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (k: string) => Number(text.match(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm'))?.[1] ?? NaN);
  return { hwm: kb('VmHWM') / 1024, rss: kb('VmRSS') / 1024 };
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

function luaString(s: string): string {
  return `[==[${s}]==]`;
}

export function wrkScript(dir: string, sc: Scenario): string {
  const file = path.join(dir, `${sc.name}.lua`);
  fs.writeFileSync(
    file,
    `wrk.method = "${sc.method}"
${sc.body !== undefined ? `wrk.body = ${luaString(sc.body)}\nwrk.headers["Content-Type"] = "application/json"` : ''}
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) statuses = {}; bad = 0 end
local expect_body = ${luaString(sc.expectBody)}
function response(status, headers, body)
  local k = tostring(status)
  statuses[k] = (statuses[k] or 0) + 1
  if status ~= ${sc.expectStatus} or body == nil or not string.find(body, expect_body, 1, true) then bad = bad + 1 end
end
function done(summary, latency, requests)
  local total, parts = 0, {}
  local all = {}
  for _, t in ipairs(threads) do
    total = total + t:get("bad")
    for k, v in pairs(t:get("statuses")) do all[k] = (all[k] or 0) + v end
  end
  for k, v in pairs(all) do table.insert(parts, string.format('"%s":%d', k, v)) end
  local e = summary.errors
  io.write(string.format('BENCH_JSON {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"bad":%d,"socket_errors":%d,"statuses":{%s}}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), total,
    e.connect + e.read + e.write + e.timeout, table.concat(parts, ",")))
end
`,
  );
  return file;
}

export function runWrk(script: string, port: number, sc: Scenario, seconds: number): Promise<LoadResult> {
  return new Promise((resolve, reject) => {
    const args = ['-t', String(THREADS), '-c', String(CONNECTIONS), '-d', `${seconds}s`, '--timeout', '5s', '-s', script, `http://127.0.0.1:${port}${sc.path}`];
    const p = spawn('wrk', args, { stdio: ['ignore', 'pipe', 'pipe'] });
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

/** Fallback: CONNECTIONS keep-alive request loops in this process. */
export async function runNodeLoad(port: number, sc: Scenario, seconds: number): Promise<LoadResult> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONNECTIONS });
  const latencies: number[] = [];
  const statuses: Record<string, number> = {};
  let unexpected = 0;
  let socketErrors = 0;
  const start = performance.now();
  const end = start + seconds * 1000;
  const one = () =>
    new Promise<void>((resolve) => {
      const t0 = performance.now();
      const req = http.request(
        { host: '127.0.0.1', port, path: sc.path, method: sc.method, agent, headers: sc.body ? { 'Content-Type': 'application/json' } : {} },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            latencies.push(performance.now() - t0);
            const k = String(res.statusCode);
            statuses[k] = (statuses[k] ?? 0) + 1;
            if (res.statusCode !== sc.expectStatus || !Buffer.concat(chunks).toString().includes(sc.expectBody)) unexpected++;
            resolve();
          });
        },
      );
      req.on('error', () => {
        socketErrors++;
        resolve();
      });
      req.end(sc.body);
    });
  await Promise.all(
    Array.from({ length: CONNECTIONS }, async () => {
      while (performance.now() < end) await one();
    }),
  );
  const secs = (performance.now() - start) / 1000;
  agent.destroy();
  latencies.sort((a, b) => a - b);
  const pct = (p: number) => latencies[Math.min(latencies.length - 1, Math.floor((p / 100) * latencies.length))] ?? NaN;
  return {
    requests: latencies.length,
    seconds: secs,
    rps: latencies.length / secs,
    goodRps: (latencies.length - unexpected) / secs,
    p50ms: pct(50),
    p99ms: pct(99),
    unexpected,
    socketErrors,
    statuses,
  };
}

export function load(dir: string, port: number, sc: Scenario, seconds: number): Promise<LoadResult> {
  return HAVE_WRK ? runWrk(wrkScript(dir, sc), port, sc, seconds) : runNodeLoad(port, sc, seconds);
}

export function combine(runs: LoadResult[]): LoadResult {
  const requests = runs.reduce((a, r) => a + r.requests, 0);
  const seconds = runs.reduce((a, r) => a + r.seconds, 0);
  const unexpected = runs.reduce((a, r) => a + r.unexpected, 0);
  const statuses: Record<string, number> = {};
  for (const r of runs) for (const [k, v] of Object.entries(r.statuses)) statuses[k] = (statuses[k] ?? 0) + v;
  const median = (xs: number[]) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  return {
    requests,
    seconds,
    rps: requests / seconds,
    goodRps: (requests - unexpected) / seconds,
    p50ms: median(runs.map((r) => r.p50ms)),
    p99ms: median(runs.map((r) => r.p99ms)),
    unexpected,
    socketErrors: runs.reduce((a, r) => a + r.socketErrors, 0),
    statuses,
    cpuMs: runs.reduce((a, r) => a + (r.cpuMs ?? NaN), 0),
    childCpuMs: runs.reduce((a, r) => a + (r.childCpuMs ?? NaN), 0),
  };
}

