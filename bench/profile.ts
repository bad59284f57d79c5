/*
 * Where our time goes: for each scenario of `npm run bench`, under the same wrk load,
 *   1. the Node floor (bench/floor.ts: bare node:http giving the same answers) and webhook.ts run
 *      by plain `node`, without a profiler: req/s and server CPU µs per request, so that what our
 *      code adds over Node itself is a number;
 *   2. webhook.ts (the source dist/webhook is built from) under `node --cpu-prof`, stopped with
 *      SIGTERM (a clean exit writes the profile), summarised by bench/cpuprofile.ts.
 *
 *   node bench/profile.ts [mismatch|command|seed-mismatch|seed-command|seed-flood ...]
 *   (BENCH_DURATION, BENCH_WARMUP as for bench.ts)
 *   PROFILE_DIR=/tmp/prof keeps the .cpuprofile files (open them in Chrome DevTools);
 *   BENCH_PROFILE_VERBOSE=1 runs webhook.ts with -verbose (logs to /dev/null).
 */

import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import {
  DURATION, ROOT, SCENARIOS, WARMUP, load, measuredLoad, rss, sanityCheck, startServer, stopServer, writeHooksFile,
  type Scenario, type Server,
} from './common.ts';
import { summarise } from './cpuprofile.ts';

const wanted = process.argv.slice(2);
const scenarios = SCENARIOS.filter((s) => wanted.length === 0 || wanted.includes(s.name));
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'webhook-profile-'));
const profDir = process.env.PROFILE_DIR ?? path.join(work, 'prof');
fs.mkdirSync(profDir, { recursive: true });
const hooksFile = writeHooksFile(work);
const verbose = process.env.BENCH_PROFILE_VERBOSE === '1';
const node = process.execPath;

async function measure(label: string, sc: Scenario, start: () => Promise<Server>) {
  const s = await start();
  try {
    await sanityCheck(label, s.port, sc);
    if (WARMUP > 0) await load(work, s.port, sc, WARMUP);
    const r = await measuredLoad(work, s, sc, DURATION);
    const cpuUs = ((r.cpuMs ?? NaN) * 1000) / r.requests;
    const m = rss(s.proc.pid!);
    process.stdout.write(
      `  ${label.padEnd(34)} ${r.rps.toFixed(0).padStart(6)} req/s  p50 ${r.p50ms.toFixed(2).padStart(6)} ms  ` +
        `p99 ${r.p99ms.toFixed(2).padStart(6)} ms  server CPU ${cpuUs.toFixed(0).padStart(5)} µs/req  ` +
        `unexpected ${r.unexpected}  peak RSS ${m.hwm.toFixed(0)} MB (now ${m.anon.toFixed(0)} MB anon)\n`,
    );
    return { rps: r.rps, cpuUs };
  } finally {
    await stopServer(s);
  }
}

async function profileScenario(sc: Scenario): Promise<void> {
  process.stdout.write(`\n=== ${sc.label}${verbose ? ' (-verbose)' : ''}\n`);
  const source = path.join(ROOT, 'webhook.ts');
  const run = (args: string[], logs = verbose) => () => startServer('ours', node, hooksFile, logs, args);
  const floor = await measure('Node floor (bench/floor.ts)', sc, run([path.join(ROOT, 'bench', 'floor.ts')], false));
  const ours = await measure('webhook.ts (node, no profiler)', sc, run([source]));
  const added = ours.cpuUs - floor.cpuUs;
  process.stdout.write(
    `  our code adds ${added.toFixed(0)} µs CPU per request over the Node floor ` +
      `(${((100 * added) / ours.cpuUs).toFixed(0)}% of ours)\n`,
  );
  const dir = path.join(profDir, sc.name + (verbose ? '-verbose' : ''));
  fs.rmSync(dir, { recursive: true, force: true });
  await measure('webhook.ts (node --cpu-prof)', sc, run(['--cpu-prof', '--cpu-prof-dir', dir, source]));
  const file = fs.readdirSync(dir).find((f) => f.endsWith('.cpuprofile'));
  if (!file) throw new Error(`no .cpuprofile written in ${dir}`);
  process.stdout.write(summarise(path.join(dir, file)).text + '\n');
}

try {
  for (const sc of scenarios) await profileScenario(sc);
} finally {
  if (!process.env.PROFILE_DIR) fs.rmSync(work, { recursive: true, force: true });
  else fs.rmSync(hooksFile, { force: true });
}
