/*
 * A local HTTPS receiver for the notification tests: a self-signed certificate for 127.0.0.1 made
 * with openssl (a real external program), a server that records every request (method, path with
 * query, headers, raw body) and answers each with what the test queued, or a default answer.
 *
 *   const rx = await startReceiver();
 *   rx.answers.push({ status: 503 });          // the next request gets 503
 *   ... rx.requests[0].body ...
 *   await rx.close();
 */
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as https from 'node:https';
import type * as net from 'node:net';
import * as path from 'node:path';
import { makeTempDir, waitFor } from './harness.ts';

export interface Received {
  method: string;
  /** Path and query, as sent. */
  url: string;
  headers: Record<string, string | string[] | undefined>;
  body: string;
  /** When it arrived (Date.now()). */
  at: number;
}

export interface Answer {
  status?: number;
  body?: string;
  /** Withhold the answer until this promise settles. */
  hold?: Promise<unknown>;
}

export interface Receiver {
  port: number;
  /** The certificate (PEM) the receiver presents: self-signed, for IP 127.0.0.1 and localhost. */
  certPem: string;
  base: string;
  requests: Received[];
  /** Answers for the next requests, in order; when empty, `defaultAnswer`. */
  answers: Answer[];
  /** The answer to a request when none is queued: by default `defaultAnswer`, a test may answer by the request. */
  answerFor?: (r: Received) => Answer | undefined;
  defaultAnswer: Answer;
  /** Requests whose answer has been sent. */
  answered: number;
  waitForRequests(n: number, timeoutMs?: number): Promise<Received[]>;
  close(): Promise<void>;
}

/** A self-signed certificate and key for 127.0.0.1 and localhost, made by openssl. */
export function selfSignedCertificate(): { certPem: string; keyPem: string } {
  const dir = makeTempDir('receiver-tls-');
  const key = path.join(dir, 'key.pem');
  const cert = path.join(dir, 'cert.pem');
  execFileSync('openssl', [
    'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', key, '-out', cert, '-days', '2',
    '-subj', '/CN=notify-receiver.test', '-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost',
  ], { stdio: 'pipe' });
  return { certPem: fs.readFileSync(cert, 'utf8'), keyPem: fs.readFileSync(key, 'utf8') };
}

export async function startReceiver(defaultAnswer: Answer = { status: 200, body: '{"errcode":0,"errmsg":"ok"}' }): Promise<Receiver> {
  const { certPem, keyPem } = selfSignedCertificate();
  const sockets = new Set<net.Socket>();
  const rx: Receiver = {
    port: 0, certPem, base: '', requests: [], answers: [], defaultAnswer, answered: 0,
    waitForRequests: (n, timeoutMs = 30_000) =>
      waitFor(() => (rx.requests.length >= n ? rx.requests : undefined), { timeoutMs, what: `${n} request(s) at the receiver` }),
    close: () => new Promise((resolve) => {
      for (const s of sockets) s.destroy();
      server.close(() => resolve());
    }),
  };
  const server = https.createServer({ cert: certPem, key: keyPem }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', async () => {
      const received = { method: req.method ?? '', url: req.url ?? '', headers: req.headers, body: Buffer.concat(chunks).toString('utf8'), at: Date.now() };
      rx.requests.push(received);
      const answer = rx.answers.shift() ?? rx.answerFor?.(received) ?? rx.defaultAnswer;
      await answer.hold;
      res.writeHead(answer.status ?? 200, { 'Content-Type': 'application/json' });
      res.end(answer.body ?? '');
      rx.answered++;
    });
  });
  server.on('connection', (s: net.Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  rx.port = (server.address() as net.AddressInfo).port;
  rx.base = `https://127.0.0.1:${rx.port}`;
  return rx;
}
