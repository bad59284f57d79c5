/*
 * `npm run bench:flood`: resident memory of dist/webhook and of the real adnanh/webhook under a
 * flood of large wrong-token bodies, side by side, on the same hooks file.
 *
 * Each server gets a fresh process. After one small request, its RSS is read; then ROUNDS times,
 * CONCURRENCY clients each POST a SIZE_MB body to the mismatch hook with a wrong token (every
 * other one chunked, without Content-Length), written as fast as the connection takes it; then
 * the RSS is read again, with the peak (VmHWM) and the anonymous (private) part. A client that
 * got its answer counts as answered, whatever happens to the rest of its body.
 *
 * Environment: BENCH_FLOOD_ROUNDS (default 5), BENCH_FLOOD_CONCURRENCY (8), BENCH_FLOOD_MB (9),
 * BENCH_FLOOD_PEER=0 to measure ours alone.
 */

import * as fs from 'node:fs';
import * as http from 'node:http';
import * as os from 'node:os';
import * as path from 'node:path';
import { adnanhBinary, binaryVersion } from '../test/peer.ts';
import { get, HOOKS, OURS, startServer, stopServer, type Server } from './common.ts';

const ROUNDS = Number(process.env.BENCH_FLOOD_ROUNDS ?? 5);
const CONCURRENCY = Number(process.env.BENCH_FLOOD_CONCURRENCY ?? 8);
const SIZE = Number(process.env.BENCH_FLOOD_MB ?? 9) * 1024 * 1024;
const PATH = '/hooks/mismatch?token=wrong-token-0123456789';

/** VmRSS, RssAnon and VmHWM of a process, in MiB. */
function memory(pid: number): { rss: number; anon: number; hwm: number } {
  const text = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (k: string) => Number(text.match(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm'))?.[1] ?? NaN);
  return { rss: kb('VmRSS') / 1024, anon: kb('RssAnon') / 1024, hwm: kb('VmHWM') / 1024 };
}

/** One large POST; resolves with the status once the answer is in, or 0 when none came. */
function post(port: number, chunked: boolean): Promise<number> {
  return new Promise((resolve) => {
    const headers = { 'Content-Type': 'application/json', ...(chunked ? {} : { 'Content-Length': String(SIZE) }) };
    const req = http.request({ host: '127.0.0.1', port, path: PATH, method: 'POST', headers, agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
      res.on('error', () => resolve(0));
    });
    req.on('error', () => resolve(0));
    const chunk = Buffer.alloc(64 * 1024, ' ');
    let sent = 0;
    const pump = () => {
      while (sent < SIZE && !req.destroyed) {
        sent += chunk.length;
        if (!req.write(chunk)) return void req.once('drain', pump);
      }
      req.end();
    };
    pump();
  });
}

interface Row {
  who: string;
  before: ReturnType<typeof memory>;
  after: ReturnType<typeof memory>;
  answered: number;
  seconds: number;
}

async function flood(s: Server): Promise<Row> {
  await get(s.port, PATH, 'POST', '{}');
  const before = memory(s.proc.pid!);
  const started = Date.now();
  let answered = 0;
  for (let r = 0; r < ROUNDS; r++) {
    const statuses = await Promise.all(Array.from({ length: CONCURRENCY }, (_, i) => post(s.port, i % 2 === 1)));
    answered += statuses.filter((st) => st === 500).length;
  }
  return { who: s.who, before, after: memory(s.proc.pid!), answered, seconds: (Date.now() - started) / 1000 };
}

async function main(): Promise<number> {
  if (!fs.existsSync(OURS)) {
    process.stderr.write('bench: dist/webhook is missing: run npm run build\n');
    return 1;
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'webhook-flood-'));
  try {
    const hooksFile = path.join(dir, 'hooks.json');
    fs.writeFileSync(hooksFile, JSON.stringify(HOOKS, null, 2));
    const bins: [Server['who'], string][] = [['ours', OURS]];
    if (process.env.BENCH_FLOOD_PEER !== '0') bins.push(['adnanh', await adnanhBinary()]);
    process.stderr.write(
      `flood: ${ROUNDS} rounds × ${CONCURRENCY} concurrent POSTs of ${SIZE / 1024 / 1024} MiB, wrong token` +
        (bins.length > 1 ? `; adnanh/webhook ${await binaryVersion(bins[1][1])}` : '') +
        '\n',
    );
    const rows: Row[] = [];
    for (const [who, bin] of bins) {
      const s = await startServer(who, bin, hooksFile, false);
      try {
        rows.push(await flood(s));
      } finally {
        await stopServer(s);
      }
    }
    const f = (n: number) => n.toFixed(0).padStart(5);
    process.stdout.write('\nserver   RSS before  RSS after  growth  anon before  anon after  peak RSS  answered  seconds\n');
    for (const r of rows) {
      process.stdout.write(
        `${r.who.padEnd(6)}  ${f(r.before.rss)} MiB  ${f(r.after.rss)} MiB ${f(r.after.rss - r.before.rss)} MiB` +
          `  ${f(r.before.anon)} MiB   ${f(r.after.anon)} MiB ${f(r.after.hwm)} MiB  ${String(r.answered).padStart(3)}/${ROUNDS * CONCURRENCY}` +
          `  ${r.seconds.toFixed(1).padStart(7)}\n`,
      );
    }
    return 0;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

process.exitCode = await main();
