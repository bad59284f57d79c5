/*
 * `node bench/signed-load.ts [binary]`: issue 21's figures for signature hooks (the GHCR recipe),
 * against dist/webhook (or BENCH_OURS, or the binary given), with no cluster (each upgrade reads
 * its payload and fails at its first Kubernetes call).
 *
 * 1. 64 concurrent 1 MiB bodies with a wrong signature while GET / is asked in a loop: the longest
 *    GET / (the issue's bound: 2 s) and how the 64 were answered.
 * 2. 32 concurrent correctly signed 1 MiB pushes: peak RSS (VmHWM) and the answers.
 * 3. The JSON reader on the same body: JSON.parse, JSON.parse with a reviver reading each number's
 *    source (the reader before), and parseJsonKeepingNumbers, in ms per parse.
 */
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import { JsonNumber, parseJsonKeepingNumbers } from '../webhook.ts';
import { largePushBody, signature, SIGNED_PATH, signedHook } from '../test/signed-load.ts';
import { freePort, OURS } from './common.ts';

const BIN = process.argv[2] ?? OURS;

interface Answer {
  status: number;
  body: string;
  ms: number;
}

function request(port: number, path: string, method = 'GET', body?: string, headers: Record<string, string> = {}): Promise<Answer> {
  const started = performance.now();
  return new Promise((resolve) => {
    const req = http.request({ host: '127.0.0.1', port, path, method, agent: false, headers }, (res) => {
      let text = '';
      res.setEncoding('utf8').on('data', (d: string) => (text += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text, ms: performance.now() - started }));
    });
    req.on('error', (e) => resolve({ status: 0, body: e.message, ms: performance.now() - started }));
    req.end(body);
  });
}

async function serve(): Promise<{ port: number; pid: number; stop(): void }> {
  const hooks = `${fs.mkdtempSync('/tmp/bench-signed-')}/hooks.json`;
  fs.writeFileSync(hooks, JSON.stringify([signedHook()]));
  const port = await freePort();
  const proc = spawn(BIN, ['-hooks', hooks, '-ip', '127.0.0.1', '-port', String(port)], { stdio: 'ignore', env: { ...process.env, KUBECONFIG: '' } });
  while ((await request(port, '/')).status !== 200) await new Promise((r) => setTimeout(r, 50));
  return { port, pid: proc.pid!, stop: () => proc.kill('SIGKILL') };
}

const tally = (answers: Answer[]) => {
  const counts = new Map<string, number>();
  for (const a of answers) {
    const key = `${a.status} ${a.body.split('\n').find((l) => l.startsWith('result:')) ?? a.body.slice(0, 50)}`;
    counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  return [...counts].map(([k, n]) => `${n} × ${k}`).join('; ');
};

async function flood(body: string, count: number, sig: string): Promise<{ answers: Answer[]; longestGet: number; gets: number; hwm: number }> {
  const s = await serve();
  let done = false;
  const gets: number[] = [];
  const poll = (async () => {
    while (!done) gets.push((await request(s.port, '/')).ms);
  })();
  const headers = { 'Content-Type': 'application/json', 'X-Hub-Signature-256': sig, 'Content-Length': String(Buffer.byteLength(body)) };
  const answers = await Promise.all(Array.from({ length: count }, () => request(s.port, SIGNED_PATH, 'POST', body, headers)));
  done = true;
  await poll;
  const hwm = Number(/^VmHWM:\s+(\d+) kB/m.exec(fs.readFileSync(`/proc/${s.pid}/status`, 'utf8'))![1]) / 1024;
  s.stop();
  return { answers, longestGet: Math.max(...gets), gets: gets.length, hwm };
}

function timeParse(label: string, parse: (t: string) => unknown, text: string): void {
  for (let i = 0; i < 3; i++) parse(text);
  const rounds = 20;
  const started = performance.now();
  for (let i = 0; i < rounds; i++) parse(text);
  console.log(`  ${label.padEnd(40)} ${((performance.now() - started) / rounds).toFixed(1)} ms`);
}

const body = largePushBody();
console.log(`binary ${BIN}; body ${(Buffer.byteLength(body) / 1048576).toFixed(2)} MiB`);
const wrong = await flood(body, 64, `sha256=${'0'.repeat(64)}`);
console.log(`64 wrong-signature bodies: longest GET / ${wrong.longestGet.toFixed(0)} ms over ${wrong.gets} GETs; peak RSS ${wrong.hwm.toFixed(0)} MB; ${tally(wrong.answers)}`);
const signed = await flood(body, 32, signature(body));
console.log(`32 signed pushes: peak RSS ${signed.hwm.toFixed(0)} MB; longest GET / ${signed.longestGet.toFixed(0)} ms; ${tally(signed.answers)}`);
console.log('JSON reader, per parse of the body:');
timeParse('JSON.parse (numbers as doubles)', JSON.parse, body);
timeParse('JSON.parse twice, reviver (before)', (t) => {
  JSON.parse(t);
  return JSON.parse(t, (_k, v, c?: { source?: string }) => (typeof v === 'number' && c?.source !== undefined ? new JsonNumber(c.source) : v));
}, body);
timeParse('parseJsonKeepingNumbers (now)', parseJsonKeepingNumbers, body);
