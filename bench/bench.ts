/*
 * `npm run bench`: dist/webhook against the real adnanh/webhook, side by side, on the same hooks file.
 *
 * Scenarios (each gets a fresh pair of server processes, so peak RSS is per scenario):
 *   mismatch  GET /hooks/mismatch?token=wrong           → 500 "Hook rules were not satisfied."
 *   command   POST /hooks/echo (ACR push payload)         → 200, body = `/bin/echo <repo_full_name>` output
 *
 * Both servers listen on their own free loopback port (`-ip 127.0.0.1 -port N`), without -verbose
 * (BENCH_VERBOSE=1 adds a second pass with -verbose, logs going to /dev/null). Ours gets
 * `-max-concurrent-commands 1000` so its 503 back-pressure never kicks in where adnanh has none.
 * The load generator is wrk (Debian) with a Lua script that checks every response's status and
 * body; without wrk a small Node keep-alive generator does the same. Both servers get the same
 * client, connections, warm-up and duration, run one after the other (order alternates per round).
 *
 * Environment: BENCH_DURATION (s, default 10), BENCH_WARMUP (s, default 2), BENCH_CONNECTIONS
 * (default 32), BENCH_THREADS (wrk threads, default 2), BENCH_ROUNDS (default 1), BENCH_VERBOSE=1,
 * BENCH_CLIENT=node to force the Node generator, BENCH_SCENARIOS=mismatch,command.
 */

import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { adnanhBinary, binaryVersion } from '../test/peer.ts';
import {
  CONNECTIONS, DURATION, HAVE_WRK, HOOKS, OURS, ROUNDS, SCENARIOS, THREADS, VERBOSE_PASS, WARMUP,
  combine, get, load, measuredLoad, memory, startServer, stopServer, type LoadResult, type Scenario,
} from './common.ts';

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

interface Row {
  pass: string;
  scenario: Scenario;
  who: 'ours' | 'adnanh';
  result: LoadResult;
  hwm: number;
  rss: number;
}

async function benchScenario(dir: string, hooksFile: string, bins: Record<'ours' | 'adnanh', string>, sc: Scenario, verbose: boolean): Promise<Row[]> {
  const servers = [await startServer('ours', bins.ours, hooksFile, verbose), await startServer('adnanh', bins.adnanh, hooksFile, verbose)];
  try {
    for (const s of servers) {
      const r = await get(s.port, sc.path, sc.method, sc.body);
      if (r.status !== sc.expectStatus || !r.body.includes(sc.expectBody)) {
        throw new Error(`${s.who}: sanity request for ${sc.name} got ${r.status} ${JSON.stringify(r.body)}, expected ${sc.expectStatus} containing ${JSON.stringify(sc.expectBody)}`);
      }
    }
    for (const s of servers) if (WARMUP > 0) await load(dir, s.port, sc, WARMUP);
    const runs: Record<string, LoadResult[]> = { ours: [], adnanh: [] };
    for (let round = 0; round < ROUNDS; round++) {
      const order = round % 2 === 0 ? servers : [...servers].reverse();
      for (const s of order) {
        const r = await measuredLoad(dir, s, sc, DURATION);
        runs[s.who].push(r);
        process.stderr.write(
          `  ${sc.name} ${s.who.padEnd(6)} round ${round + 1}: ${r.rps.toFixed(0)} req/s, p50 ${r.p50ms.toFixed(2)} ms, p99 ${r.p99ms.toFixed(2)} ms, unexpected ${r.unexpected}, socket errors ${r.socketErrors}\n`,
        );
      }
    }
    return servers.map((s) => ({ pass: verbose ? '-verbose' : 'quiet', scenario: sc, who: s.who, result: combine(runs[s.who]), ...memory(s.proc.pid!) }));
  } finally {
    await Promise.all(servers.map(stopServer));
  }
}

/** Server CPU (user+sys, its own process, not the commands it runs) per completed request, in µs. */
function cpuPerReq(r: Row): number {
  return r.result.requests > 0 ? ((r.result.cpuMs ?? NaN) * 1000) / r.result.requests : NaN;
}

function table(rows: Row[]): string {
  const header = ['pass', 'scenario', 'server', 'req/s', 'ok req/s', 'p50 ms', 'p99 ms', 'unexpected', 'sock err', 'statuses', 'CPU µs/req', 'peak RSS MB'];
  const lines: string[][] = [header];
  const fmt = (n: number, d = 0) => (Number.isFinite(n) ? n.toFixed(d) : '-');
  const ratio = (a: number, b: number) => (b > 0 ? `${(a / b).toFixed(2)}x` : '-');
  for (let i = 0; i < rows.length; i += 2) {
    const [o, a] = [rows[i], rows[i + 1]];
    for (const r of [o, a]) {
      const st = Object.entries(r.result.statuses).map(([k, v]) => `${k}:${v}`).join(' ');
      lines.push([r.pass, r.scenario.name, r.who, fmt(r.result.rps), fmt(r.result.goodRps), fmt(r.result.p50ms, 2), fmt(r.result.p99ms, 2), String(r.result.unexpected), String(r.result.socketErrors), st, fmt(cpuPerReq(r)), fmt(r.hwm, 1)]);
    }
    lines.push(['', '', 'ours/adnanh', ratio(o.result.rps, a.result.rps), ratio(o.result.goodRps, a.result.goodRps), ratio(o.result.p50ms, a.result.p50ms), ratio(o.result.p99ms, a.result.p99ms), '', '', '', ratio(cpuPerReq(o), cpuPerReq(a)), ratio(o.hwm, a.hwm)]);
  }
  const widths = header.map((_, c) => Math.max(...lines.map((l) => l[c].length)));
  const render = (l: string[]) => l.map((cell, c) => (c <= 2 || c === 9 ? cell.padEnd(widths[c]) : cell.padStart(widths[c]))).join('  ');
  const out = [render(lines[0]), widths.map((w) => '-'.repeat(w)).join('  ')];
  for (let i = 1; i < lines.length; i++) {
    out.push(render(lines[i]));
    if (lines[i][2] === 'ours/adnanh') out.push('');
  }
  return out.join('\n');
}

async function main(): Promise<number> {
  if (!fs.existsSync(OURS)) {
    process.stderr.write(`bench: ${path.relative(process.cwd(), OURS) || OURS} is missing: run npm run build\n`);
    return 1;
  }
  const adnanh = await adnanhBinary();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'webhook-bench-'));
  try {
    const hooksFile = path.join(dir, 'hooks.json');
    fs.writeFileSync(hooksFile, JSON.stringify(HOOKS, null, 2));
    const bins = { ours: OURS, adnanh };
    const client = HAVE_WRK ? `wrk -t${THREADS} -c${CONNECTIONS}` : `node keep-alive generator, ${CONNECTIONS} connections`;
    process.stderr.write(
      `bench: ours ${OURS} vs adnanh/webhook ${await binaryVersion(adnanh)} (${adnanh})\n` +
        `       client ${client}, warm-up ${WARMUP} s, ${ROUNDS} × ${DURATION} s per server per scenario, ${os.cpus().length} CPUs shared by client and servers\n`,
    );
    const rows: Row[] = [];
    for (const verbose of VERBOSE_PASS ? [false, true] : [false]) {
      for (const sc of SCENARIOS) rows.push(...(await benchScenario(dir, hooksFile, bins, sc, verbose)));
    }
    process.stdout.write('\n' + table(rows) + '\n');
    process.stdout.write(
      `\nreq/s counts every completed response; "ok req/s" only those with the expected status and body.\n` +
        `Latency, CPU and RSS ratios < 1 and req/s ratios > 1 favour ours. CPU µs/req is the server process's\n` +
        `user+sys time per completed request (commands excluded). Peak RSS is the server process's VmHWM.\n`,
    );
    const bad = rows.filter((r) => r.result.unexpected > 0 || r.result.socketErrors > 0);
    for (const r of bad) process.stdout.write(`WARNING: ${r.who} ${r.scenario.name} (${r.pass}): ${r.result.unexpected} unexpected responses, ${r.result.socketErrors} socket errors\n`);
    return 0;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

process.exitCode = await main();
