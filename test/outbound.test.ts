/*
 * The outbound-call kit (webhook.ts, chapter "outbound calls"): the pure parts (retry policy,
 * Retry-After, the scrubber's encoded forms, TLS trust, which token hosts may be given a registry login), the request
 * function against local HTTP servers (its total deadline, its size cap), and through the built
 * executable: a notification receiver that dribbles one byte a second ends at the total deadline
 * while the push's result is still reported, and a secret a template encoded (URL, HTML, JS, base64)
 * is taken out of the hook's answer.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as http from 'node:http';
import type * as net from 'node:net';
import * as path from 'node:path';
import { after, describe, test } from 'node:test';
import * as tls from 'node:tls';
import { adminPort, httpRequest, leaks, makeTempDir, startWebhook, waitFor, type Webhook } from './harness.ts';
import {
  clientTlsOptions,
  OutboundError,
  outboundRequest,
  peerText,
  registryAway,
  retryAfterSeconds,
  retryDelay,
  retrying,
  Scrubber,
  tokenHostAllowed,
} from '../webhook.ts';

const b64 = (text: string) => Buffer.from(text, 'utf8').toString('base64');

describe('the retry policy', () => {
  test('a caller\'s own backoff and its own verdict on a failure', () => {
    const backoff = { initialMs: 2_000, maxMs: 8_000 };
    assert.equal(retryDelay({ transient: true }, 0, 60_000, () => 0, backoff), 2_000);
    assert.equal(retryDelay({ transient: true }, 3, 60_000, () => 0, backoff), 8_000);
    assert.equal(retryDelay({ status: 408, transient: true }, 0, 60_000, () => 0, backoff), 2_000, 'the caller says 408 is worth it');
    assert.equal(retryDelay({ status: 503, transient: false }, 0, 60_000, () => 0, backoff), undefined, 'the caller says no');
    assert.equal(retryDelay({ transient: true, retryAfterSeconds: 70 }, 0, 60_000, () => 0, backoff), undefined, 'past the budget');
  });

  test('retrying: attempts until a value, the last error after the last attempt, at once after a permanent failure', async () => {
    const policy = { budgetMs: 60_000, attempts: 3, backoff: { initialMs: 1, maxMs: 1 } };
    const seen: (string | undefined)[] = [];
    const succeeds = await retrying<string, string>(policy, async (attempt, previous) => {
      seen.push(previous);
      return attempt < 2 ? { ok: false, failure: { status: 503 }, error: `503 #${attempt}` } : { ok: true, value: 'done' };
    });
    assert.deepEqual([succeeds.ok, succeeds.ok && succeeds.value, succeeds.attempts], [true, 'done', 3]);
    assert.deepEqual(seen, [undefined, '503 #0', '503 #1'], 'each attempt is given the previous one\'s error');
    const exhausted = await retrying<string, string>(policy, async (attempt) => ({ ok: false, failure: { code: 'ECONNRESET' }, error: `reset #${attempt}` }));
    assert.deepEqual([exhausted.ok, !exhausted.ok && exhausted.error, exhausted.attempts], [false, 'reset #2', 3]);
    const permanent = await retrying<string, string>(policy, async () => ({ ok: false, failure: { status: 404 }, error: 'gone' }));
    assert.deepEqual([permanent.ok, permanent.attempts], [false, 1]);
  });

  test('Retry-After: seconds, an HTTP-date, or nothing usable', () => {
    const now = Date.parse('2026-11-22T04:12:00Z');
    assert.equal(retryAfterSeconds('7', now), 7);
    assert.equal(retryAfterSeconds(['12'], now), 12);
    assert.equal(retryAfterSeconds('Sun, 22 Nov 2026 04:12:30 GMT', now), 30);
    assert.equal(retryAfterSeconds('Sun, 22 Nov 2026 04:11:00 GMT', now), 0, 'a date gone by: at once');
    assert.equal(retryAfterSeconds(undefined, now), undefined);
    assert.equal(retryAfterSeconds('-3', now), undefined);
    assert.equal(retryAfterSeconds('soon', now), undefined);
  });
});

describe('the scrubber', () => {
  const secret = 'p@ss w0rd/<&>"+=~x';
  const s = new Scrubber([secret]);

  test('the secret as it is, and URL-, JSON-, JavaScript- and HTML-encoded', () => {
    assert.equal(s.scrub(`raw ${secret}.`), 'raw REDACTED.');
    assert.equal(s.scrub(`url ${encodeURIComponent(secret)}.`), 'url REDACTED.');
    assert.equal(s.scrub('go urlquery p%40ss+w0rd%2F%3C%26%3E%22%2B%3D~x.'), 'go urlquery REDACTED.');
    assert.equal(s.scrub(`json ${JSON.stringify({ k: secret })}`), 'json {"k":"REDACTED"}');
    assert.equal(s.scrub('js p@ss w0rd/\\u003C\\u0026\\u003E\\"+\\u003D~x.'), 'js REDACTED.');
    assert.equal(s.scrub('html p@ss w0rd/&lt;&amp;&gt;&quot;+=~x and p@ss w0rd/&lt;&amp;&gt;&#34;+=~x'), 'html REDACTED and REDACTED');
  });

  test('base64: alone, URL-safe, and inside a longer encoded text at every alignment', () => {
    assert.equal(s.scrub(`b64 ${b64(secret)}.`), 'b64 REDACTED.');
    assert.equal(s.scrub(`b64url ${Buffer.from(secret).toString('base64url')}.`), 'b64url REDACTED.');
    for (const prefix of ['', 'u', 'us', 'user:']) {
      const basic = b64(`${prefix}${secret}`);
      assert.ok(!s.scrub(basic).includes(basic.slice(8, -4)), `inside base64 of "${prefix}…": ${s.scrub(basic)}`);
      assert.match(s.scrub(basic), /REDACTED/);
    }
  });

  test('ordinary text is left alone; no secrets, nothing changes; the replacement is the caller\'s', () => {
    const text = 'image after: registry.example.com/acme/web:v2 (p@ss)';
    assert.equal(s.scrub(text), text);
    assert.equal(new Scrubber([]).scrub(text), text);
    assert.equal(new Scrubber([''], '[redacted]').scrub(text), text);
    assert.equal(new Scrubber(['acme/web'], '[redacted]').scrub(text), 'image after: registry.example.com/[redacted]:v2 (p@ss)');
  });
});

describe('a server\'s answer quoted', () => {
  const token = 'ghp_4f1c2b9e7d0a3c8b5e6f7a9d1c3b5e7f9a1c3d';

  test('the secrets its request carried go before the cut, whichever side of it they fall on', () => {
    for (let pad = 0; pad < 120; pad += 7) {
      const echoed = `${'x'.repeat(pad)} you sent Authorization: Basic ${b64(`bot:${token}`)} and ${token} again`;
      const quoted = peerText(echoed, [token, `bot:${token}`], 80);
      assert.ok(quoted.length <= 80, quoted);
      assert.equal(leaks(quoted, token, 'bot:'), undefined, `pad ${pad}: ${quoted}`);
      // Cut first, then scrubbed, the same answer would leak.
      if (pad === 0) assert.ok(leaks(new Scrubber([token]).scrub(echoed.slice(0, 80)), token, 'bot:'));
    }
    assert.equal(peerText('no such repository', [token], 80), 'no such repository');
    assert.equal(peerText('a'.repeat(100), [undefined, ''], 10), 'a'.repeat(10));
  });
});

describe('TLS trust', () => {
  const pem = tls.rootCertificates[0];
  test('an extra CA joins Node\'s default set; an only-CA replaces it; the switch and the server name', () => {
    const defaults = tls.getCACertificates('default').length;
    assert.equal((clientTlsOptions('registry.example.com', { extraCa: pem }).ca as string[]).length, defaults + 1);
    assert.equal(clientTlsOptions('registry.example.com').ca, undefined, 'nothing extra: Node\'s own set');
    const only = Buffer.from(pem);
    assert.equal(clientTlsOptions('10.0.0.1', { onlyCa: only }).ca, only);
    assert.equal(clientTlsOptions('registry.example.com.').servername, 'registry.example.com');
    assert.equal(clientTlsOptions('10.0.0.1').servername, undefined, 'SNI carries names only');
    assert.equal(clientTlsOptions('[::1]').servername, undefined);
    assert.equal(clientTlsOptions('10.0.0.1', { servername: 'kubernetes' }).servername, 'kubernetes');
    assert.equal(clientTlsOptions('x.example').rejectUnauthorized, true);
    assert.equal(clientTlsOptions('x.example', { verify: false }).rejectUnauthorized, false);
  });
});

describe('a registry that is away, as ON_REGISTRY_AWAY=keep keeps its pushes', () => {
  test('no answer (refused, reset, timed out, unresolvable for now) is away; a bad certificate or an oversized answer is not', () => {
    for (const code of ['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EAI_AGAIN', 'EHOSTUNREACH'])
      assert.equal(registryAway(new OutboundError(`connect ${code}`, code)), true, code);
    for (const code of ['CERT_HAS_EXPIRED', 'DEPTH_ZERO_SELF_SIGNED_CERT', 'E2BIG', 'ERR_TLS_CERT_ALTNAME_INVALID'])
      assert.equal(registryAway(new OutboundError(`failed ${code}`, code)), false, code);
    assert.equal(registryAway(new Error('ECONNREFUSED')), false, 'only a failed call is judged');
  });
});

describe('which token services may be given a registry login', () => {
  test('the registry\'s own host (any port), the hosts the operator allowed, the well-known registries\' token hosts', () => {
    assert.equal(tokenHostAllowed('127.0.0.1', '127.0.0.1:5000', []), true);
    assert.equal(tokenHostAllowed('localhost', '127.0.0.1:5000', []), false);
    assert.equal(tokenHostAllowed('localhost', '127.0.0.1:5000', ['localhost']), true);
    assert.equal(tokenHostAllowed('auth.corp.example', 'registry.corp.example', ['*.corp.example']), true);
    assert.equal(tokenHostAllowed('corp.example.evil.test', 'registry.corp.example', ['*.corp.example']), false);
    assert.equal(tokenHostAllowed('AUTH.docker.io', 'registry-1.docker.io', []), true);
    assert.equal(tokenHostAllowed('auth.docker.io', 'ghcr.io', []), false);
    assert.equal(tokenHostAllowed('ghcr.io', 'ghcr.io', []), true);
    assert.equal(tokenHostAllowed('myreg.azurecr.io', 'myreg.azurecr.io', []), true);
    assert.equal(tokenHostAllowed('dockerauth.cn-hangzhou.aliyuncs.com', 'registry.cn-hangzhou.aliyuncs.com', []), true);
    assert.equal(tokenHostAllowed('dockerauth.cn-beijing.aliyuncs.com', 'registry.cn-hangzhou.aliyuncs.com', []), false);
    assert.equal(tokenHostAllowed('gitlab.com', 'registry.gitlab.com', []), true);
    assert.equal(tokenHostAllowed('attacker.example', 'registry.gitlab.com', []), false);
  });
});

/** A local HTTP server whose handler the test writes; closed (with its connections) after the suite. */
async function localServer(handler: http.RequestListener): Promise<{ url: (p: string) => URL; close: () => Promise<void>; requests: () => number }> {
  const sockets = new Set<net.Socket>();
  let requests = 0;
  const server = http.createServer((req, res) => {
    requests++;
    handler(req, res);
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as net.AddressInfo).port;
  return {
    url: (p) => new URL(`http://127.0.0.1:${port}${p}`),
    requests: () => requests,
    close: () => new Promise((resolve) => {
      for (const s of sockets) s.destroy();
      server.close(() => resolve());
    }),
  };
}

/** Answers 200 with a long body sent one byte per `everyMs`, until the client goes away. */
function dribble(everyMs: number): http.RequestListener {
  return (req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': '100000' });
      const timer = setInterval(() => res.write('{'), everyMs);
      res.on('close', () => clearInterval(timer));
    });
  };
}

describe('one request', () => {
  const closers: (() => Promise<void>)[] = [];
  after(() => Promise.all(closers.map((c) => c())));

  test('the deadline covers the whole body: a server that dribbles cannot hold the call', async () => {
    const server = await localServer(dribble(50));
    closers.push(server.close);
    await assert.rejects(
      outboundRequest(server.url('/'), { method: 'GET', deadlineMs: 1_000, maxResponseBytes: 1_000_000 }),
      (e: OutboundError) => e instanceof OutboundError && e.code === 'ETIMEDOUT' && e.message === 'no complete answer within 1s',
    );
  });

  test('the size cap: `fail` ends the call, `cut` keeps what fits; the body and headers as sent', async () => {
    const server = await localServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => res.writeHead(201, { 'X-Got': Buffer.concat(chunks).toString() }).end('x'.repeat(5_000)));
    });
    closers.push(server.close);
    const o = { method: 'POST', body: 'hello', deadlineMs: 30_000 };
    await assert.rejects(outboundRequest(server.url('/'), { ...o, maxResponseBytes: 100 }), (e: OutboundError) => e.code === 'E2BIG');
    const cut = await outboundRequest(server.url('/'), { ...o, maxResponseBytes: 100, overLimit: 'cut' });
    assert.deepEqual([cut.status, cut.headers['x-got'], cut.body], [201, 'hello', 'x'.repeat(100)]);
    const whole = await outboundRequest(server.url('/'), { ...o, maxResponseBytes: 5_000 });
    assert.equal(whole.body.length, 5_000);
  });
});

describe('through the executable', () => {
  const stopAll: Webhook[] = [];
  const closers: (() => Promise<void>)[] = [];
  after(async () => {
    await Promise.all(stopAll.map((w) => w.stop()));
    await Promise.all(closers.map((c) => c()));
  });

  test('a notification receiver that dribbles one byte a second: each attempt ends at the deadline, the result is still reported', async () => {
    const receiver = await localServer(dribble(1_000));
    closers.push(receiver.close);
    const hook = {
      id: 'dribbled', 'execute-command': '/bin/echo', 'include-command-output-in-response': true,
      'pass-arguments-to-command': [{ source: 'string', name: 'done' }],
      'pass-environment-to-command': [{ envname: 'NOTIFY_URL', source: 'string', name: receiver.url('/robot').href }],
    };
    // Each try may take 3 s (-notify-timeout; 10 s by default), which the dribble outlasts.
    const w = await startWebhook({ hooks: [hook], metrics: true, args: ['-deliveries', '10', '-notify-timeout', '3s'] });
    stopAll.push(w);
    const res = await w.request('/hooks/dribbled', { method: 'POST' });
    assert.deepEqual([res.status, res.body], [200, 'done\n']);
    const requestId = String(res.headers['x-request-id']);
    const admin = await adminPort(w);
    // Three attempts of 3 s each, and the backoff between them: the page says how it ended.
    const entry = await waitFor(async () => {
      const doc = JSON.parse((await httpRequest(admin, '/deliveries.json')).body);
      const d = doc.deliveries.find((x: any) => x.request_id === requestId);
      return d?.notifications.every((n: any) => n.state !== 'pending') ? d : undefined;
    }, { timeoutMs: 120_000, what: 'the notification to the dribbling receiver to end' });
    assert.equal(entry.outcome, 'succeeded', 'the push itself is reported as it went');
    assert.deepEqual(entry.notifications.map((n: any) => [n.state, n.detail]), [['failed', 'no complete answer within 3s (after 3 attempt(s))']]);
    assert.match(w.output(), /json notification to 127\.0\.0\.1:\d+ not sent: no complete answer within 3s \(after 3 attempt\(s\)\)/);
    assert.equal(receiver.requests(), 3);
  });

  test('a receiver that quotes its URL (the robot\'s key) in an error answer: no part of the key in the log or on the page', async () => {
    const key = 'k3y-7d2f9a4c1e8b6d3f0a2c4e6b8d1f3a5c7e9b2d4';
    // The key after a prefix that puts it across the 200 characters an error answer is quoted to.
    const receiver = await localServer((req, res) => {
      res.writeHead(500, { 'Content-Type': 'text/plain' });
      res.end(`${'e'.repeat(150)} no robot at ${req.url}`);
    });
    closers.push(receiver.close);
    const hook = {
      id: 'echoed', 'execute-command': '/bin/true',
      'pass-environment-to-command': [{ envname: 'NOTIFY_URL', source: 'string', name: receiver.url(`/robot/${key}`).href }],
    };
    const w = await startWebhook({ hooks: [hook], metrics: true, args: ['-deliveries', '10'] });
    stopAll.push(w);
    const res = await w.request('/hooks/echoed', { method: 'POST' });
    assert.equal(res.status, 200);
    const requestId = String(res.headers['x-request-id']);
    const admin = await adminPort(w);
    const page = await waitFor(async () => {
      const text = (await httpRequest(admin, '/deliveries.json')).body;
      const d = JSON.parse(text).deliveries.find((x: any) => x.request_id === requestId);
      return d?.notifications.every((n: any) => n.state !== 'pending') ? text : undefined;
    }, { timeoutMs: 60_000, what: 'the notification to the echoing receiver to end' });
    assert.match(page, /HTTP 500: \\"e+ no robot at REDACTED\\"/);
    for (const text of [page, w.output(), (await httpRequest(admin, '/deliveries')).body])
      assert.equal(leaks(text, key), undefined, text.slice(0, 2000));
  });

  test('a secret a template encoded (urlquery, html, js) or a command base64-encoded is taken out of the answer and the log', async () => {
    const password = 'p@ss w0rd/<&>"+=~x';
    const dir = makeTempDir('outbound-scrub-');
    fs.writeFileSync(path.join(dir, 'hooks.json'), JSON.stringify([
      { id: 'encoded', 'execute-command': '/bin/true',
        'response-message': 'url {{ getenv "MAIL_PASSWORD" | urlquery }} html {{ getenv "MAIL_PASSWORD" | html }} js {{ getenv "MAIL_PASSWORD" | js }}' },
      { id: 'b64', 'execute-command': '/bin/sh', 'include-command-output-in-response': true,
        'pass-arguments-to-command': [{ source: 'string', name: '-c' }, { source: 'string', name: 'printf %s "$1" | base64 -w0; echo " in $1"' },
          { source: 'string', name: 'sh' }, { source: 'string', name: '{{ getenv "MAIL_PASSWORD" | js }}' }] },
    ]));
    const w = await startWebhook({ hooks: path.join(dir, 'hooks.json'), args: ['-template'], env: { MAIL_PASSWORD: password } });
    stopAll.push(w);
    const encoded = await w.request('/hooks/encoded', { method: 'POST' });
    assert.deepEqual([encoded.status, encoded.body], [200, 'url REDACTED html REDACTED js REDACTED']);
    const command = await w.request('/hooks/b64', { method: 'POST' });
    assert.deepEqual([command.status, command.body], [200, 'REDACTED in REDACTED\n']);
    for (const form of [password, encodeURIComponent(password), b64(password), 'p%40ss+w0rd', '&lt;&amp;&gt;']) {
      assert.ok(!w.output().includes(form), `the log shows ${form}`);
    }
  });
});
