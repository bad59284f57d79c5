/*
 * Safe to expose: the hook URL is a bearer secret that leaks, so the executable must hold up
 * when anyone can reach it. Through the built executable over real HTTP: nothing from the
 * environment runs code in it; rules that need no body are decided before the body is read;
 * memory stays flat under a flood of large wrong-token bodies; hook regexes run in linear time;
 * a body that stops arriving is dropped; multipart bodies are signed over their raw bytes.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHmac } from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as net from 'node:net';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import {
  hasRecord, httpRequest, makeTempDir, readArgv, recorderCommand, resetRecord, spawnWebhook, startWebhook, waitFor, waitForOutput,
  waitForRecord,
  type Webhook,
} from './harness.ts';
import { largePushBody, signature, SIGNED_PATH, signedHook } from './signed-load.ts';

const run = promisify(execFile);

const stopAll: Webhook[] = [];
after(async () => {
  await Promise.all(stopAll.map((w) => w.stop()));
});
async function started(opts: Parameters<typeof startWebhook>[0]): Promise<Webhook> {
  const w = await startWebhook(opts);
  stopAll.push(w);
  return w;
}

interface RawResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/**
 * One HTTP/1.1 connection driven by hand: the test decides when each byte is sent, and reads the
 * responses in order as they arrive. `closed` resolves when the server ends the connection.
 */
class RawConnection {
  private received = Buffer.alloc(0);
  private wake: (() => void) | undefined;
  private ended = false;
  /** The error that ended the connection (ECONNRESET: the server reset it), if any. */
  error: string | undefined;
  readonly socket: net.Socket;
  readonly closed: Promise<void>;

  constructor(port: number) {
    this.socket = net.connect(port, '127.0.0.1');
    this.socket.on('data', (d: Buffer) => {
      this.received = Buffer.concat([this.received, d]);
      this.wake?.();
    });
    this.socket.on('error', (e: NodeJS.ErrnoException) => (this.error = e.code));
    this.closed = new Promise((resolve) =>
      this.socket.on('close', () => {
        this.ended = true;
        this.wake?.();
        resolve();
      }),
    );
  }

  write(data: string | Buffer): void {
    this.socket.write(data);
  }

  /** The next complete response (interim 1xx ones included); rejects if the connection ends first. */
  async response(): Promise<RawResponse> {
    for (;;) {
      const head = this.received.indexOf('\r\n\r\n');
      if (head >= 0) {
        const lines = this.received.subarray(0, head).toString('latin1').split('\r\n');
        const headers = Object.fromEntries(lines.slice(1).map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]));
        const length = Number(headers['content-length'] ?? 0);
        if (this.received.length >= head + 4 + length) {
          const body = this.received.subarray(head + 4, head + 4 + length).toString('utf8');
          this.received = this.received.subarray(head + 4 + length);
          return { status: Number(lines[0].split(' ')[1]), headers, body };
        }
      }
      if (this.ended) throw new Error(`connection closed; received ${JSON.stringify(this.received.toString('latin1'))}`);
      await new Promise<void>((resolve) => (this.wake = resolve));
    }
  }
}

/** /proc/<pid>/status fields in MiB: resident memory, anonymous (private) and file-backed parts. */
function memoryMiB(pid: number): { rss: number; anon: number; file: number } {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN);
  return { rss: kb('VmRSS') / 1024, anon: kb('RssAnon') / 1024, file: kb('RssFile') / 1024 };
}

const SEED = fs.readFileSync(path.join(import.meta.dirname, '..', 'examples', 'hooks', 'web.json'), 'utf8');
const PAYLOAD = fs.readFileSync(path.join(import.meta.dirname, 'fixtures', 'upgrade', 'acr-push.json'), 'utf8');
const TOKEN = 'seed-Token-5d1e9a30c2';
const RIGHT = { token: TOKEN, ns: 'prod', workload: 'deployment/web', container: 'app', repo_type: 'regionalregistry' };
const seedPath = (q: Record<string, string>) => `/hooks/web?${new URLSearchParams(q)}`;
const WRONG_TOKEN = seedPath({ ...RIGHT, token: 'wrong' });

/** The seed hook as shipped, rendered with -template and HOOK_TOKEN, its command a recorder. */
async function startSeed(rec: string, args: string[] = []): Promise<Webhook> {
  const dir = makeTempDir();
  const seed = SEED.replace('"/webhooks.sh"', JSON.stringify(recorderCommand(rec))).replace('"/home"', JSON.stringify(rec));
  fs.writeFileSync(path.join(dir, 'web.json'), seed);
  return started({ hooks: dir, args: ['-template', ...args], env: { HOOK_TOKEN: TOKEN } });
}

function requestHead(pathAndQuery: string, headers: Record<string, string | number>): string {
  const lines = Object.entries({ Host: 'webhook', 'Content-Type': 'application/json', ...headers }).map(([k, v]) => `${k}: ${v}`);
  return `POST ${pathAndQuery} HTTP/1.1\r\n${lines.join('\r\n')}\r\n\r\n`;
}

describe('no code from the environment', () => {
  test('NODE_OPTIONS and OPENSSL_CONF are ignored: the service runs and nothing they name is loaded', async () => {
    const dir = makeTempDir();
    const marker = path.join(dir, 'marker');
    const evil = path.join(dir, 'evil.cjs');
    fs.writeFileSync(evil, `require('node:fs').writeFileSync(${JSON.stringify(marker)}, 'ran');\n`);
    // An OpenSSL configuration that activates a provider library that does not exist: a Node that
    // reads it aborts at start-up (a real one would be loaded and run instead).
    const sslConf = path.join(dir, 'openssl.cnf');
    fs.writeFileSync(
      sslConf,
      'nodejs_conf = init\nopenssl_conf = init\n[init]\nproviders = providers\n[providers]\nevil = evil\n' +
        `[evil]\nmodule = ${path.join(dir, 'evil.so')}\nactivate = 1\n`,
    );
    const env = { NODE_OPTIONS: `--require ${evil}`, OPENSSL_CONF: sslConf };

    // The same environment does reach a plain Node: the probe itself works.
    await run(process.execPath, ['-e', '0'], { env: { ...process.env, NODE_OPTIONS: env.NODE_OPTIONS } });
    assert.equal(fs.readFileSync(marker, 'utf8'), 'ran', 'NODE_OPTIONS --require runs code in a plain Node');
    fs.rmSync(marker);
    await assert.rejects(run(process.execPath, ['-e', '0'], { env: { ...process.env, OPENSSL_CONF: sslConf } }));

    const wh = await started({ hooks: [{ id: 'x', 'execute-command': '/bin/true' }], env });
    assert.equal((await wh.request('/hooks/x', { method: 'POST' })).status, 200);
    assert.equal(fs.existsSync(marker), false, 'the --require module ran inside the executable');
  });
});

describe('hook regexes run in linear time', () => {
  test('a catastrophic pattern gets a long input answered at once, and the server goes on answering', { timeout: 30_000 }, async () => {
    const hooks = [{
      id: 're', 'execute-command': '/bin/true', 'response-message': 'triggered',
      'trigger-rule': { match: { type: 'regex', regex: '^([a-z0-9]+-?)+$', parameter: { source: 'url', name: 'name' } } },
    }];
    const wh = await started({ hooks });
    // With backtracking, 40 characters and a final mismatch take 2^40 steps: hours, not an answer.
    const slow = await wh.request(`/hooks/re?name=${'a'.repeat(40)}!`, { method: 'POST' });
    assert.deepEqual([slow.status, slow.body], [200, 'Hook rules were not satisfied.']);
    const next = await wh.request('/hooks/re?name=web-app-2', { method: 'POST' });
    assert.deepEqual([next.status, next.body], [200, 'triggered']);
  });

  test('a pattern the linear engine cannot run is a load error naming the hook and field', async () => {
    const cases: [string, RegExp][] = [
      ['(?:(?:ab){5}){5}', /linear-time engine cannot run it/],
      ['^\\pL+$', /Unicode classes \(\\p\) need Unicode mode/],
    ];
    for (const [regex, why] of cases) {
      const dir = makeTempDir();
      const rule = { match: { type: 'regex', regex, parameter: { source: 'url', name: 'x' } } };
      fs.writeFileSync(path.join(dir, 'hooks.json'), JSON.stringify([{ id: 'linear', 'execute-command': '/bin/true', 'trigger-rule': rule }], null, 2));
      const s = await spawnWebhook({ hooks: dir });
      // A server that accepts the pattern starts serving instead of exiting (it is then killed); one that refuses it
      // exits, which ends the wait at once rather than at its deadline.
      let exited = false;
      void s.exited.then(() => (exited = true));
      const serving = waitFor(() => exited || s.output().includes('serving hooks on'), { timeoutMs: 10_000, what: 'an exit or serving' })
        .then(() => exited || s.proc.kill('SIGKILL'));
      assert.equal((await s.exited).code, 1, regex);
      await serving;
      assert.match(s.output(), /hooks\.json:\d+: hook "linear": trigger-rule\.match\.regex: invalid regular expression: /, regex);
      assert.match(s.output(), why, regex);
    }
  });
});

describe('rules before the body', () => {
  const rec = makeTempDir();
  let wh: Webhook;
  // A short whole-request timeout: a server that waits for the body answers 408 instead.
  before(async () => { wh = await startSeed(rec, ['-read-timeout', '3s']); });

  test('the seed hook answers a wrong token before the body is sent, and the connection goes on', async () => {
    const conn = new RawConnection(wh.port);
    conn.write(requestHead(WRONG_TOKEN, { 'Content-Length': 65536 }));
    const res = await conn.response();
    assert.deepEqual([res.status, res.body], [500, 'Hook rules were not satisfied.']);
    assert.notEqual(res.headers.connection, 'close');
    // The body that follows is dropped as it arrives; the next request on the connection is served.
    conn.write(Buffer.alloc(65536, 'x'));
    conn.write('GET /healthz HTTP/1.1\r\nHost: webhook\r\n\r\n');
    assert.deepEqual([(await conn.response()).status], [200]);
    conn.socket.destroy();
    assert.equal(hasRecord(rec), false);
  });

  test('a client that asked to close gets its answer, and the connection ends after its body, not reset', async () => {
    const conn = new RawConnection(wh.port);
    conn.write(requestHead(WRONG_TOKEN, { 'Content-Length': 256 * 1024, Connection: 'close' }));
    const res = await conn.response();
    assert.deepEqual([res.status, res.body, res.headers.connection], [500, 'Hook rules were not satisfied.', 'close']);
    for (let i = 0; i < 4; i++) conn.write(Buffer.alloc(64 * 1024, 'x'));
    await conn.closed;
    assert.equal(conn.error, undefined);
  });

  test('a body declared larger than the limit is never read: the answer closes the connection', async () => {
    const conn = new RawConnection(wh.port);
    conn.write(requestHead(WRONG_TOKEN, { 'Content-Length': 9 * 1024 * 1024 }));
    const res = await conn.response();
    assert.deepEqual([res.status, res.body, res.headers.connection], [500, 'Hook rules were not satisfied.', 'close']);
    await conn.closed;
  });

  test('a client waiting for 100 Continue is sent it only when the hook will read its body', async () => {
    const refused = new RawConnection(wh.port);
    refused.write(requestHead(WRONG_TOKEN, { 'Content-Length': PAYLOAD.length, Expect: '100-continue' }));
    const final = await refused.response();
    assert.deepEqual([final.status, final.body, final.headers.connection], [500, 'Hook rules were not satisfied.', 'close']);
    await refused.closed;

    resetRecord(rec);
    const accepted = new RawConnection(wh.port);
    accepted.write(requestHead(seedPath(RIGHT), { 'Content-Length': Buffer.byteLength(PAYLOAD), Expect: '100-continue' }));
    assert.equal((await accepted.response()).status, 100);
    accepted.write(PAYLOAD);
    assert.equal((await accepted.response()).status, 200);
    assert.deepEqual(JSON.parse(readArgv(rec)[0]), JSON.parse(PAYLOAD));
    accepted.socket.destroy();
  });

  test('rules are evaluated in order: a body-free match after one that reads the body waits for it', async () => {
    const token = { match: { type: 'value', value: 'right-token-1', parameter: { source: 'url', name: 'token' } } };
    const ref = { match: { type: 'value', value: 'main', parameter: { source: 'payload', name: 'ref' } } };
    const hook = (id: string, and: object[]) => ({ id, 'execute-command': '/bin/true', 'trigger-rule': { and } });
    const w = await started({ hooks: [hook('token-first', [token, ref]), hook('ref-first', [ref, token])] });
    for (const id of ['token-first', 'ref-first']) {
      const conn = new RawConnection(w.port);
      conn.write(requestHead(`/hooks/${id}?token=wrong`, { 'Content-Length': 2 }));
      if (id === 'ref-first') conn.write('{}');
      const res = await conn.response();
      assert.deepEqual([res.status, res.body], [200, 'Hook rules were not satisfied.'], id);
      conn.socket.destroy();
    }
    // adnanh reaches the payload match first and logs its missing parameter: so must we, which
    // takes the body; the token-first hook never looks at the payload.
    const out = await waitForOutput(w, 'parameter node not found: ref');
    assert.equal(out.match(/parameter node not found: ref/g)?.length, 1);
  });

  test('the right token still runs the command with the payload', async () => {
    resetRecord(rec);
    const res = await wh.request(seedPath(RIGHT), { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: PAYLOAD });
    assert.equal(res.status, 200);
    assert.deepEqual(JSON.parse(readArgv(rec)[0]), JSON.parse(PAYLOAD));
  });
});

/**
 * One POST of `size` bytes of body, declared (Content-Length) or chunked, written as fast as the
 * connection takes it. Resolves with the answer, or with the error when the connection ended
 * before one arrived.
 */
function post(port: number, urlPath: string, size: number, chunked: boolean): Promise<RawResponse | Error> {
  return new Promise((resolve) => {
    const headers = { 'Content-Type': 'application/json', ...(chunked ? {} : { 'Content-Length': String(size) }) };
    const req = http.request({ host: '127.0.0.1', port, path: urlPath, method: 'POST', headers, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (d: string) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers as Record<string, string>, body }));
      res.on('error', resolve);
    });
    req.on('error', resolve);
    const chunk = Buffer.alloc(64 * 1024, ' ');
    let sent = 0;
    const pump = () => {
      while (sent < size && !req.destroyed) {
        sent += chunk.length;
        if (!req.write(chunk)) return void req.once('drain', pump);
      }
      req.end();
    };
    pump();
  });
}

describe('memory under a flood of large wrong-token bodies', () => {
  test('8 concurrent 9 MB POSTs, 5 times over: answered unread, resident memory stays flat', { timeout: 120_000 }, async (t) => {
    const rec = makeTempDir();
    const wh = await startSeed(rec);
    const round = () =>
      Promise.all(Array.from({ length: 8 }, (_, i) => post(wh.port, WRONG_TOKEN, 9 * 1024 * 1024, i % 2 === 1)));
    await wh.request(WRONG_TOKEN, { method: 'POST', body: '{}' });
    const before = memoryMiB(wh.proc.pid!);
    const answers = [];
    for (let i = 0; i < 5; i++) answers.push(...(await round()));
    const afterFlood = memoryMiB(wh.proc.pid!);
    t.diagnostic(
      `RSS ${before.rss.toFixed(0)} → ${afterFlood.rss.toFixed(0)} MiB ` +
        `(anonymous ${before.anon.toFixed(0)} → ${afterFlood.anon.toFixed(0)}, file ${before.file.toFixed(0)} → ${afterFlood.file.toFixed(0)})`,
    );
    // Answered at once; the rest of each body is read and dropped until it ends, so every client,
    // though it sends all 9 MB before it reads, gets its answer rather than a reset.
    for (const a of answers) assert.deepEqual(a instanceof Error ? a.message : [a.status, a.body], [500, 'Hook rules were not satisfied.']);
    // 40 bodies of 9 MB went by; keeping even one round of them would take 72 MB.
    assert.ok(afterFlood.rss - before.rss < 64, `RSS grew by ${(afterFlood.rss - before.rss).toFixed(0)} MiB`);
    assert.equal(hasRecord(rec), false);
    assert.equal((await wh.request('/healthz')).status, 200);
  });
});

/** The value of a counter in /metrics text (absent: undefined). */
function counter(metrics: string, name: string, labels: string): number | undefined {
  const line = metrics.split('\n').find((l) => l.startsWith(`${name}{${labels}} `));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(' ') + 1));
}

describe('signature hooks verify before they parse', () => {
  test('64 concurrent 1 MiB bodies with a wrong signature: all refused, none parsed, GET / answered meanwhile', { timeout: 180_000 }, async () => {
    // The queue timeout is long: a loaded machine must not turn the test into one of -max-body-memory.
    const wh = await started({ hooks: [signedHook()], metrics: true, args: ['-body-queue-timeout', '2m'] });
    const body = largePushBody();
    const head = (sig: string) => requestHead(SIGNED_PATH, { 'Content-Length': Buffer.byteLength(body), 'X-Hub-Signature-256': sig });
    // One correctly signed push is parsed (its upgrade then fails: no cluster): the counter exists and counts.
    const signed = await wh.request(SIGNED_PATH, { method: 'POST', body, headers: { 'Content-Type': 'application/json', 'X-Hub-Signature-256': signature(body) } });
    assert.match(signed.body, /result: +failed/);
    assert.equal(counter((await wh.metrics()).body, 'webhook_bodies_parsed_total', 'hook="ghcr"'), 1);

    const wrong = `sha256=${'0'.repeat(64)}`;
    const conns = Array.from({ length: 64 }, () => new RawConnection(wh.port));
    // Every body but its last byte: each request is in flight, none can be answered yet.
    for (const c of conns) c.write(head(wrong) + body.slice(0, -1));
    const home = await httpRequest(wh.port, '/');
    assert.deepEqual([home.status, home.body], [200, 'OK']);
    for (const c of conns) c.write(body.slice(-1));
    const answers = await Promise.all(conns.map((c) => c.response()));
    for (const a of answers) assert.deepEqual([a.status, a.body], [500, 'Error occurred while evaluating hook rules.']);
    for (const c of conns) c.socket.destroy();
    assert.equal(wh.output().match(/error evaluating hook: invalid payload signature 0{64}/g)?.length, 64);
    assert.equal(counter((await wh.metrics()).body, 'webhook_bodies_parsed_total', 'hook="ghcr"'), 1, 'a wrong-signature body was parsed');
  });

  test('a signature inside `or` with soft failures still lets the payload decide', async () => {
    const rec = makeTempDir();
    const sig = { match: { type: 'payload-hmac-sha256', secret: 'soft-secret-9a1b', parameter: { source: 'header', name: 'X-Sig' } } };
    const ref = { match: { type: 'value', value: 'main', parameter: { source: 'payload', name: 'ref' } } };
    const wh = await started({ hooks: [{
      id: 'soft', 'execute-command': recorderCommand(rec), 'trigger-signature-soft-failures': true, 'trigger-rule': { or: [sig, ref] },
    }], metrics: true });
    const send = (payload: string) => wh.request('/hooks/soft', { method: 'POST', body: payload, headers: { 'Content-Type': 'application/json', 'X-Sig': 'sha256=00' } });
    assert.equal((await send('{"ref":"main"}')).status, 200);
    await waitForRecord(rec);
    resetRecord(rec);
    assert.deepEqual([(await send('{"ref":"dev"}')).body], ['Hook rules were not satisfied.']);
    assert.equal(hasRecord(rec), false);
  });
});

describe('request bodies held in memory', () => {
  test('past -max-body-memory a request waits -body-queue-timeout, unread, then gets 503 with Retry-After', async () => {
    const wh = await started({ hooks: [signedHook()], args: ['-max-body-memory', '1048576', '-body-queue-timeout', '1s'], env: { KUBECONFIG: '' } });
    const body = largePushBody();
    const head = requestHead(SIGNED_PATH, { 'Content-Length': Buffer.byteLength(body), 'X-Hub-Signature-256': signature(body) });
    // The first body, half sent, holds all the room there is.
    const holder = new RawConnection(wh.port);
    holder.write(head + body.slice(0, body.length / 2));
    const waiting = new RawConnection(wh.port);
    waiting.write(head);
    const refused = await waiting.response();
    assert.deepEqual([refused.status, refused.body, refused.headers['retry-after'], refused.headers.connection],
      [503, 'Too many request bodies in memory; retry later.', '5', 'close']);
    await waiting.closed;
    await waitForOutput(wh, /ghcr: no room for the request body within 1s \(-max-body-memory 1048576 bytes in use\); answering 503/);
    holder.write(body.slice(body.length / 2));
    assert.match((await holder.response()).body, /^result: +failed: /m, 'the holder is served');
    holder.socket.destroy();
    // Room given back: the next one is served.
    const next = await wh.request(SIGNED_PATH, { method: 'POST', body, headers: { 'Content-Type': 'application/json', 'X-Hub-Signature-256': signature(body) } });
    assert.match(next.body, /^result: +failed: /m);
  });

  test('-max-body-memory below -max-body-size is refused at start, naming both', async () => {
    const s = await spawnWebhook({ hooks: [{ id: 'x', 'execute-command': '/bin/true' }], args: ['-max-body-memory', '1000'] });
    assert.equal((await s.exited).code, 2);
    assert.match(s.output(), /invalid value for flag -max-body-memory: 1000 is less than -max-body-size \(1048576\)/);
  });
});

describe('connections', () => {
  test('-max-connections: connections past it are closed unanswered; once others close, requests are served', async () => {
    const wh = await started({ hooks: [{ id: 'x', 'execute-command': '/bin/true' }], args: ['-max-connections', '3'] });
    // Three kept connections, each answered. The start-up probe's connection may still be closing on the
    // server's side: a connection refused meanwhile is opened again.
    const open: RawConnection[] = [];
    await waitFor(async () => {
      const c = new RawConnection(wh.port);
      c.write('GET /healthz HTTP/1.1\r\nHost: webhook\r\n\r\n');
      if ((await c.response().catch(() => undefined))?.status === 200) open.push(c);
      return open.length === 3;
    }, { what: 'three kept connections' });
    const extra = new RawConnection(wh.port);
    extra.write('GET / HTTP/1.1\r\nHost: webhook\r\n\r\n');
    await assert.rejects(extra.response(), /connection closed/);
    await waitForOutput(wh, /-max-connections 3 reached: closed a new connection/);
    for (const c of open) c.socket.destroy();
    await Promise.all(open.map((c) => c.closed));
    // The server counts a connection gone once it has seen it close: wait for that, not for a time.
    await waitFor(async () => (await httpRequest(wh.port, '/').catch(() => undefined))?.status === 200, { timeoutMs: 10_000, what: 'GET / after the connections closed' });
  });

  test('the limits are documented with their defaults', async () => {
    const out = await run(process.env.WEBHOOK_BIN ?? path.join(import.meta.dirname, '..', 'dist', 'webhook'), ['-help']).catch((e: { stderr: string }) => e);
    assert.match(out.stderr, /-max-connections int\n.*ulimit -n.*\(default 10000\)/);
    assert.match(out.stderr, /-max-body-memory int\n.*503 with Retry-After.*\(default 8388608\)/);
    assert.match(out.stderr, /-body-queue-timeout duration\n.*\(default 5s\)/);
  });
});

describe('a body that stops arriving is dropped', () => {
  test('a body the hook reads: 408 after -body-idle-timeout, and the command does not run', async () => {
    const rec = makeTempDir();
    // The whole-request timeout stays long: the idle limit is what cuts this client off.
    const wh = await startSeed(rec, ['-body-idle-timeout', '300ms', '-read-timeout', '10m']);
    const conn = new RawConnection(wh.port);
    conn.write(requestHead(seedPath(RIGHT), { 'Content-Length': 100 }) + '{"push_data":');
    const res = await conn.response();
    assert.deepEqual([res.status, res.body, res.headers.connection], [408, 'Request body not received in time.', 'close']);
    await conn.closed;
    assert.equal(hasRecord(rec), false);
    await waitForOutput(wh, /no body data for 0\.3s: request dropped/);
  });

  test('a body left unread after the answer: the connection is closed once it stalls', async () => {
    // Node drains a declared body on a kept connection; its keep-alive timeout ends a stalled one.
    const wh = await startSeed(makeTempDir(), ['-read-timeout', '10m']);
    const conn = new RawConnection(wh.port);
    conn.write(requestHead(WRONG_TOKEN, { 'Content-Length': 100 }));
    assert.equal((await conn.response()).status, 500);
    conn.write('{"push_data":');
    await conn.closed;
  });

  test('the default is 30 s', async () => {
    const out = await run(process.env.WEBHOOK_BIN ?? path.join(import.meta.dirname, '..', 'dist', 'webhook'), ['-help']).catch((e: { stderr: string }) => e);
    assert.match(out.stderr, /-body-idle-timeout duration\n\s+time a request body may go without data before the connection is dropped \(0: no limit\) \(default 30s\)/);
    assert.match(out.stderr, /-max-body-size int\n.*\(default 1048576\)/);
  });
});

describe('payload signatures over multipart bodies', () => {
  test('an HMAC covers the raw multipart body, as senders sign it; raw-request-body stays empty', async () => {
    const rec = makeTempDir();
    const secret = 'multipart-secret-6b1f';
    const wh = await started({
      hooks: [{
        id: 'mp', 'execute-command': recorderCommand(rec), 'include-command-output-in-response': true,
        'pass-arguments-to-command': [{ source: 'payload', name: 'tag' }, { source: 'raw-request-body' }],
        'trigger-rule': { match: { type: 'payload-hmac-sha256', secret, parameter: { source: 'header', name: 'X-Hub-Signature-256' } } },
      }],
    });
    const boundary = 'b0undary42';
    const body = `--${boundary}\r\nContent-Disposition: form-data; name="tag"\r\n\r\nv1.2.3\r\n--${boundary}--\r\n`;
    const send = (signature: string) => wh.request('/hooks/mp', {
      method: 'POST', body,
      headers: { 'Content-Type': `multipart/form-data; boundary=${boundary}`, 'X-Hub-Signature-256': signature },
    });
    const signed = await send('sha256=' + createHmac('sha256', secret).update(body).digest('hex'));
    assert.equal(signed.status, 200, signed.body);
    assert.deepEqual(readArgv(rec), ['v1.2.3', '']);
    resetRecord(rec);
    const overEmpty = await send('sha256=' + createHmac('sha256', secret).update('').digest('hex'));
    assert.deepEqual([overEmpty.status, overEmpty.body], [500, 'Error occurred while evaluating hook rules.']);
    assert.equal(hasRecord(rec), false);
  });
});
