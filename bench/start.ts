/*
 * npm run bench:start — how long a replica takes from exec to its first answered `GET /`, hooks
 * loaded (the bench hooks of common.ts, -template), for ours (dist/webhook, or BENCH_OURS), adnanh,
 * and Node itself serving HTTP from a one-line script (the floor any Node program stands on), side by
 * side in one run: BENCH_STARTS starts each (default 20), interleaved so a busy moment of the shared
 * machine weighs on all three alike; min and median printed. BENCH_IMAGE_ROOT, when set, adds the
 * container image's executable run from that unpacked root file system (`npm run image`, then
 * `node scripts/image.ts unpack dist/webhook-image.tar DIR`; started with chroot, so it needs root).
 *
 * The time is measured by the bench itself: from just before spawn() until the first 200 to a
 * `GET /` sent over a fresh connection every millisecond. On a shared machine that wall time
 * depends on the other engineers' load, so the CPU time the process had used by then (from
 * /proc, in clock ticks of 10 ms) is printed beside it: the part of a start that is ours.
 */
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as os from 'node:os';
import * as path from 'node:path';
import { adnanhBinary } from '../test/peer.ts';
import { EXECUTABLE } from '../scripts/image.ts';
import { cpuTime, freePort, HOOK_TOKEN, OURS, sleep, writeHooksFile } from './common.ts';

const STARTS = Number(process.env.BENCH_STARTS ?? 20);
const IMAGE_ROOT = process.env.BENCH_IMAGE_ROOT;
/** How often a starting server is asked: one millisecond is the resolution the figures need. */
const PROBE_MS = 1;
/** A start that takes longer than this has failed. */
const START_TIMEOUT_MS = 15_000;

interface Contender {
  who: string;
  /** The command line that serves GET / on `port`. */
  command(port: number): { bin: string; args: string[] };
}

/** One GET / on a fresh connection: true when it was answered 200. */
function answered(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path: '/', agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode === 200));
    });
    req.on('error', () => resolve(false));
    req.setTimeout(START_TIMEOUT_MS, () => req.destroy());
  });
}

/** Milliseconds from spawn until GET / is answered, and the CPU used by then; the process is killed afterwards. */
async function timeStart(c: Contender): Promise<{ wall: number; cpu: number }> {
  const port = await freePort();
  const { bin, args } = c.command(port);
  const t0 = performance.now();
  const proc = spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, HOOK_TOKEN } });
  let stderr = '';
  proc.stderr!.setEncoding('utf8').on('data', (s: string) => (stderr += s));
  let exited = false;
  proc.once('exit', () => (exited = true));
  try {
    for (;;) {
      if (await answered(port)) return { wall: performance.now() - t0, cpu: cpuTime(proc.pid!).self };
      if (exited) throw new Error(`${c.who} exited during start-up: ${stderr.slice(0, 500)}`);
      if (performance.now() - t0 > START_TIMEOUT_MS) throw new Error(`${c.who} did not answer GET / in time`);
      await sleep(PROBE_MS);
    }
  } finally {
    const gone = new Promise((r) => proc.once('exit', r));
    if (!exited) proc.kill('SIGKILL');
    await gone.catch(() => undefined);
  }
}

const work = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-start-'));
const hooks = writeHooksFile(work);
const serverArgs = (port: number) => ['-hooks', hooks, '-template', '-ip', '127.0.0.1', '-port', String(port)];
const adnanh = await adnanhBinary();
const BARE = "require('http').createServer((q,s)=>s.end('OK')).listen(+process.argv[1],'127.0.0.1')";

const contenders: Contender[] = [
  { who: 'ours', command: (port) => ({ bin: OURS, args: serverArgs(port) }) },
  { who: 'adnanh', command: (port) => ({ bin: adnanh, args: serverArgs(port) }) },
  { who: 'bare node', command: (port) => ({ bin: process.execPath, args: ['-e', BARE, String(port)] }) },
];
if (IMAGE_ROOT) {
  // The image's executable with nothing but the image's files around it; the hooks are copied in.
  fs.copyFileSync(hooks, path.join(IMAGE_ROOT, 'tmp-bench-hooks.json'));
  contenders.push({
    who: 'ours (image)',
    command: (port) => ({
      bin: 'chroot',
      args: [IMAGE_ROOT, EXECUTABLE, ...serverArgs(port).map((a) => (a === hooks ? '/tmp-bench-hooks.json' : a))],
    }),
  });
}

const times = new Map<string, { wall: number; cpu: number }[]>(contenders.map((c) => [c.who, []]));
for (let i = 0; i < STARTS; i++) for (const c of contenders) times.get(c.who)!.push(await timeStart(c));

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
console.log(`exec → first answered GET /, ${STARTS} starts each (ms):`);
for (const [who, runs] of times) {
  const wall = runs.map((r) => r.wall);
  const cpu = runs.map((r) => r.cpu);
  console.log(JSON.stringify({ who, min: +Math.min(...wall).toFixed(1), median: +median(wall).toFixed(1), cpuMedian: median(cpu) }));
}
fs.rmSync(work, { recursive: true, force: true });
