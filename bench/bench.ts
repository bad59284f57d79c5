/*
 * `npm run bench`: dist/webhook against the real adnanh/webhook, side by side, on the same hooks file.
 *
 * Scenarios (the table in bench/common.ts; each gets a fresh pair of server processes, so memory is
 * per scenario):
 *   mismatch       POST /hooks/mismatch?token=wrong, ACR push          → 500 "Hook rules were not satisfied."
 *   command        POST /hooks/echo, ACR push                          → 200, `/bin/echo <repo_full_name>`
 *   seed-mismatch  the seed hook (examples/hooks/web.json), ACR push, wrong token → 500, as above
 *   seed-command   the seed hook running /bin/echo instead of /webhooks.sh, right token
 *                                                                      → 200, `/bin/echo <entire payload>`
 *   seed-flood     the seed hook, 8 connections of ~9 MB pushes, wrong token → 500, as above
 *
 * Both servers load one hooks file with -template (the seed's token is `{{ getenv "HOOK_TOKEN" }}`,
 * HOOK_TOKEN in both environments) and listen on their own free loopback port, without -verbose
 * (BENCH_VERBOSE=1 adds a second pass with -verbose, logs going to /dev/null). Ours gets
 * `-max-concurrent-commands 1000` so its 503 back-pressure never kicks in where adnanh has none.
 * The load generator is wrk (Debian) with a Lua script that checks every response's status and
 * body; without wrk a small Node keep-alive generator does the same. Both servers get the same
 * client, connections, warm-up and duration, run one after the other (order alternates per round).
 * While a scenario runs, each server's /proc/<pid>/status is sampled every 20 ms: RssAnon before
 * any request, at its peak, and BENCH_SETTLE s after its last run; RssFile at its peak.
 *
 * Environment: BENCH_DURATION (s, default 10), BENCH_WARMUP (s, default 2), BENCH_CONNECTIONS
 * (default 32; the flood uses 8), BENCH_THREADS (wrk threads, default 2), BENCH_ROUNDS (default 1),
 * BENCH_SETTLE (s, default 2), BENCH_VERBOSE=1, BENCH_CLIENT=node to force the Node generator,
 * BENCH_SCENARIOS=mismatch,command,seed-mismatch,seed-command,seed-flood (default: all).
 */

import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { adnanhBinary, binaryVersion } from '../test/peer.ts';
import {
  CONNECTIONS, DURATION, HAVE_WRK, OURS, ROUNDS, SCENARIOS, SETTLE, THREADS, VERBOSE_PASS, WARMUP,
  combine, load, measuredLoad, rss, sanityCheck, sleep, startServer, stopServer, watchMemory, writeHooksFile,
  type LoadResult, type Scenario, type Server,
} from './common.ts';

type Who = 'ours' | 'adnanh';

interface Row {
  pass: string;
  scenario: Scenario;
  who: Who;
  result: LoadResult;
  anonBefore: number; // MB
  anonPeak: number;
  anonAfter: number;
  filePeak: number;
  hwm: number;
}

// ---------------------------------------------------------------------------------------------
// Running a scenario
// ---------------------------------------------------------------------------------------------

/** ROUNDS measured runs per server, alternating the order; each server's RssAnon SETTLE s after its last. */
async function measuredRuns(dir: string, servers: Server[], sc: Scenario) {
  const runs: Record<Who, LoadResult[]> = { ours: [], adnanh: [] };
  const after: Record<Who, number> = { ours: NaN, adnanh: NaN };
  for (let round = 0; round < ROUNDS; round++) {
    for (const s of round % 2 === 0 ? servers : [...servers].reverse()) {
      const r = await measuredLoad(dir, s, sc, DURATION);
      runs[s.who].push(r);
      process.stderr.write(
        `  ${sc.name} ${s.who.padEnd(6)} round ${round + 1}: ${r.rps.toFixed(0)} req/s, ` +
          `p50 ${r.p50ms.toFixed(2)} ms, p99 ${r.p99ms.toFixed(2)} ms, ` +
          `unexpected ${r.unexpected}, socket errors ${r.socketErrors}\n`,
      );
      await sleep(SETTLE * 1000);
      after[s.who] = rss(s.proc.pid!).anon;
    }
  }
  return { runs, after };
}

async function benchScenario(
  dir: string, hooksFile: string, bins: Record<Who, string>, sc: Scenario, verbose: boolean,
): Promise<Row[]> {
  const servers = [
    await startServer('ours', bins.ours, hooksFile, verbose),
    await startServer('adnanh', bins.adnanh, hooksFile, verbose),
  ];
  const watches = servers.map((s) => watchMemory(s.proc.pid!));
  try {
    for (const s of servers) await sanityCheck(s.who, s.port, sc);
    for (const s of servers) if (WARMUP > 0) await load(dir, s.port, sc, WARMUP);
    const { runs, after } = await measuredRuns(dir, servers, sc);
    return servers.map((s, i) => ({
      pass: verbose ? '-verbose' : 'quiet',
      scenario: sc,
      who: s.who,
      result: combine(runs[s.who]),
      anonBefore: watches[i].before.anon,
      anonPeak: watches[i].peak.anon,
      anonAfter: after[s.who],
      filePeak: watches[i].peak.file,
      hwm: rss(s.proc.pid!).hwm,
    }));
  } finally {
    for (const w of watches) w.stop();
    await Promise.all(servers.map(stopServer));
  }
}

// ---------------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------------

/** Server CPU (user+sys, its own process, not the commands it runs) per completed request, in µs. */
function cpuPerReq(r: Row): number {
  return r.result.requests > 0 ? ((r.result.cpuMs ?? NaN) * 1000) / r.result.requests : NaN;
}

/** The numeric columns: title, value, decimals, and whether an ours/adnanh ratio is shown. */
const COLUMNS: { title: string; value: (r: Row) => number; digits: number; ratio: boolean }[] = [
  { title: 'req/s', value: (r) => r.result.rps, digits: 0, ratio: true },
  { title: 'ok req/s', value: (r) => r.result.goodRps, digits: 0, ratio: true },
  { title: 'p50 ms', value: (r) => r.result.p50ms, digits: 2, ratio: true },
  { title: 'p99 ms', value: (r) => r.result.p99ms, digits: 2, ratio: true },
  { title: 'bad', value: (r) => r.result.unexpected, digits: 0, ratio: false },
  { title: 'sock err', value: (r) => r.result.socketErrors, digits: 0, ratio: false },
  { title: 'CPU µs/req', value: cpuPerReq, digits: 0, ratio: true },
  { title: 'anon before', value: (r) => r.anonBefore, digits: 1, ratio: true },
  { title: 'anon peak', value: (r) => r.anonPeak, digits: 1, ratio: true },
  { title: 'anon after', value: (r) => r.anonAfter, digits: 1, ratio: true },
  { title: 'file peak', value: (r) => r.filePeak, digits: 1, ratio: true },
  { title: 'VmHWM', value: (r) => r.hwm, digits: 1, ratio: true },
];

function table(rows: Row[]): string {
  const fmt = (n: number, d: number) => (Number.isFinite(n) ? n.toFixed(d) : '-');
  const ratio = (a: number, b: number) => (b > 0 && Number.isFinite(a) ? `${(a / b).toFixed(2)}x` : '-');
  const lines: string[][] = [['pass', 'scenario', 'server', ...COLUMNS.map((c) => c.title)]];
  for (let i = 0; i < rows.length; i += 2) {
    const [o, a] = [rows[i], rows[i + 1]];
    for (const r of [o, a]) {
      lines.push([r.pass, r.scenario.name, r.who, ...COLUMNS.map((c) => fmt(c.value(r), c.digits))]);
    }
    lines.push(['', '', 'ours/adnanh', ...COLUMNS.map((c) => (c.ratio ? ratio(c.value(o), c.value(a)) : ''))]);
  }
  const widths = lines[0].map((_, c) => Math.max(...lines.map((l) => l[c].length)));
  const render = (l: string[]) => l.map((cell, c) => (c <= 2 ? cell.padEnd(widths[c]) : cell.padStart(widths[c])));
  const out = [render(lines[0]).join('  '), widths.map((w) => '-'.repeat(w)).join('  ')];
  for (const l of lines.slice(1)) out.push(render(l).join('  ').trimEnd() + (l[2] === 'ours/adnanh' ? '\n' : ''));
  return out.join('\n');
}

const LEGEND = `req/s counts every completed response; "ok req/s" only those with the expected status and body
("bad": the others). Latency, CPU and memory ratios < 1 and req/s ratios > 1 favour ours. CPU µs/req is
the server process's user+sys time per completed request (the commands it runs excluded). Memory in MB
from /proc/<pid>/status: anon = RssAnon (private memory) before any request, at its peak, and
${SETTLE} s after the server's last run; file peak = RssFile (pages of the executable and libraries,
shared with other processes mapping the same file); VmHWM = the kernel's peak of their sum.
`;

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

async function main(): Promise<number> {
  if (!fs.existsSync(OURS)) {
    process.stderr.write(`bench: ${path.relative(process.cwd(), OURS) || OURS} is missing: run npm run build\n`);
    return 1;
  }
  const adnanh = await adnanhBinary();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'webhook-bench-'));
  try {
    const hooksFile = writeHooksFile(dir);
    const client = HAVE_WRK ? `wrk -t${THREADS}` : 'node keep-alive generator';
    process.stderr.write(
      `bench: ours ${OURS} vs adnanh/webhook ${await binaryVersion(adnanh)} (${adnanh})\n` +
        `       client ${client}, ${CONNECTIONS} connections unless the scenario says otherwise, ` +
        `warm-up ${WARMUP} s, ${ROUNDS} × ${DURATION} s per server per scenario, ` +
        `${os.cpus().length} CPUs shared by client and servers\n`,
    );
    const rows: Row[] = [];
    const bins = { ours: OURS, adnanh };
    for (const verbose of VERBOSE_PASS ? [false, true] : [false]) {
      for (const sc of SCENARIOS) rows.push(...(await benchScenario(dir, hooksFile, bins, sc, verbose)));
    }
    process.stdout.write(`\n${table(rows)}\n${LEGEND}`);
    for (const r of rows.filter((r) => r.result.unexpected > 0 || r.result.socketErrors > 0)) {
      const statuses = Object.entries(r.result.statuses).map(([k, v]) => `${k}:${v}`).join(' ');
      process.stdout.write(
        `WARNING: ${r.who} ${r.scenario.name} (${r.pass}): ${r.result.unexpected} unexpected responses, ` +
          `${r.result.socketErrors} socket errors; statuses ${statuses}\n`,
      );
    }
    return 0;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

process.exitCode = await main();
