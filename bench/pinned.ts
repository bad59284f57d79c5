/*
 * `npm run bench:pinned`: the seed hook's mismatch (a real ACR push, a wrong token) served with each server pinned
 * to one CPU, as in a container limited to one CPU, and the load generator (wrk, this process's child) on another:
 * dist/webhook, the Node floor (bench/floor.ts: a bare node:http server on the same Node that reads the body and
 * gives the same 500) and adnanh/webhook, one after the other, the order rotated each round. With every process
 * sharing both cores the load generator is the bottleneck and the servers look alike; pinned, each server's own
 * cost per request shows.
 *
 * For each server: requests per second (median of the rounds, every answer checked), peak RSS (VmHWM) and idle RSS
 * (before the first request, after start-up); then ours against the floor and against adnanh.
 *
 * Environment: BENCH_ROUNDS (default 3), BENCH_DURATION (s, default 10), BENCH_WARMUP (s, default 2),
 * BENCH_CONNECTIONS (default 32), BENCH_SERVER_CPU (default 0), BENCH_CLIENT_CPU (default 1), BENCH_OURS.
 */

import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { adnanhBinary } from '../test/peer.ts';
import {
  DURATION, OURS, ROOT, SCENARIOS, WARMUP, load, rss, sanityCheck, startServer, stopServer, writeHooksFile,
  type Server,
} from './common.ts';

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const SERVER_CPU = process.env.BENCH_SERVER_CPU ?? '0';
const CLIENT_CPU = process.env.BENCH_CLIENT_CPU ?? '1';
const scenario = SCENARIOS.find((s) => s.name === 'seed-mismatch');
if (!scenario) throw new Error('bench/common.ts has no seed-mismatch scenario (BENCH_SCENARIOS must include it)');
if (spawnSync('taskset', ['-V']).error) throw new Error('taskset (util-linux) is needed to pin the processes');

type Name = 'ours' | 'floor' | 'adnanh';

/** How each server is started: its program and first arguments, pinned to SERVER_CPU by taskset. */
async function commandOf(name: Name): Promise<{ who: 'ours' | 'adnanh'; prefix: string[] }> {
  if (name === 'ours') return { who: 'ours', prefix: ['-c', SERVER_CPU, OURS] };
  if (name === 'adnanh') return { who: 'adnanh', prefix: ['-c', SERVER_CPU, await adnanhBinary()] };
  const floor = path.join(ROOT, 'bench', 'floor.ts');
  return { who: 'adnanh', prefix: ['-c', SERVER_CPU, process.execPath, '--disable-warning=ExperimentalWarning', floor] };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const mb = (n: number) => `${n.toFixed(0)} MB`;

async function main(): Promise<void> {
  // wrk, started by this process, inherits its CPU; each server is pinned to its own by taskset.
  spawnSync('taskset', ['-p', '-c', CLIENT_CPU, String(process.pid)], { stdio: 'ignore' });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-pinned-'));
  const hooks = writeHooksFile(dir);
  const names: Name[] = ['ours', 'floor', 'adnanh'];
  const runs = new Map<Name, { rps: number[]; peakMb: number[]; idleMb: number[] }>(
    names.map((n) => [n, { rps: [], peakMb: [], idleMb: [] }]),
  );
  for (let round = 0; round < ROUNDS; round++) {
    const order = names.map((_, i) => names[(i + round) % names.length]);
    for (const name of order) {
      const { who, prefix } = await commandOf(name);
      const server: Server = await startServer(who, 'taskset', hooks, false, prefix);
      try {
        await sanityCheck(name, server.port, scenario!);
        const idle = rss(server.proc.pid!);
        await load(dir, server.port, scenario!, WARMUP);
        const r = await load(dir, server.port, scenario!, DURATION);
        if (r.unexpected > 0 || r.socketErrors > 0)
          throw new Error(`${name}: ${r.unexpected} unexpected answers, ${r.socketErrors} socket errors`);
        const run = runs.get(name)!;
        run.rps.push(r.rps);
        run.peakMb.push(rss(server.proc.pid!).hwm);
        run.idleMb.push(idle.anon + idle.file);
        console.log(`round ${round + 1}: ${name.padEnd(6)} ${r.rps.toFixed(0).padStart(7)} req/s`);
      } finally {
        await stopServer(server);
      }
    }
  }
  const row = (n: Name) => runs.get(n)!;
  console.log(`\n${scenario!.label}; servers on CPU ${SERVER_CPU}, wrk on CPU ${CLIENT_CPU}; median of ${ROUNDS}`);
  console.log('| server | req/s | peak RSS | idle RSS |\n| --- | --- | --- | --- |');
  for (const n of names)
    console.log(`| ${n} | ${median(row(n).rps).toFixed(0)} | ${mb(median(row(n).peakMb))} | ${mb(median(row(n).idleMb))} |`);
  const ours = median(row('ours').rps);
  console.log(`\nours / floor: ${(ours / median(row('floor').rps)).toFixed(2)}x; ` +
    `ours / adnanh: ${(ours / median(row('adnanh').rps)).toFixed(2)}x; ` +
    `peak RSS ours / floor: ${(median(row('ours').peakMb) / median(row('floor').peakMb)).toFixed(2)}x`);
  fs.rmSync(dir, { recursive: true, force: true });
}

await main();
