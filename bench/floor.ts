/*
 * The Node floor for the bench scenarios: the least a node:http server must do to give the same
 * answers (read the body, answer 500 "Hook rules were not satisfied." for /hooks/mismatch and the
 * seed's /hooks/web; parse the JSON and return `/bin/echo <repository.repo_full_name>` output for
 * /hooks/echo; `/bin/echo <body>` for /hooks/web-echo). No rules, logging, metrics or request ids.
 * bench/profile.ts runs it beside webhook.ts so that what our code costs can be told apart from
 * what Node itself costs.
 *
 *   node bench/floor.ts -hooks IGNORED -ip 127.0.0.1 -port N
 */

import { spawn } from 'node:child_process';
import * as http from 'node:http';

const argv = process.argv.slice(2);
const port = Number(argv[argv.indexOf('-port') + 1]);
const ip = argv.includes('-ip') ? argv[argv.indexOf('-ip') + 1] : '127.0.0.1';

function send(res: http.ServerResponse, status: number, body: string): void {
  res.setHeader('Content-Type', 'text/plain; charset=utf-8');
  res.setHeader('Content-Length', Buffer.byteLength(body));
  res.writeHead(status);
  res.end(body);
}

/** `/bin/echo arg`, its output the answer: 200 on exit 0, else 500. */
function echo(res: http.ServerResponse, arg: string): void {
  const child = spawn('/bin/echo', [arg], { detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  const out: Buffer[] = [];
  child.stdout.on('data', (c: Buffer) => out.push(c));
  child.stderr.on('data', (c: Buffer) => out.push(c));
  child.on('close', (code) => send(res, code === 0 ? 200 : 500, Buffer.concat(out).toString()));
}

function repoFullName(body: Buffer): string {
  try {
    return String(JSON.parse(body.toString()).repository.repo_full_name);
  } catch {
    return ''; // an empty argument, as adnanh passes for a missing parameter
  }
}

/** The answer per path, one per hook of bench/common.ts (the floor checks no token: each path has one answer). */
const ANSWERS: Record<string, (res: http.ServerResponse, body: Buffer) => void> = {
  '/': (res) => send(res, 200, 'OK'),
  '/hooks/mismatch': (res) => send(res, 500, 'Hook rules were not satisfied.'),
  '/hooks/echo': (res, body) => echo(res, repoFullName(body)),
  '/hooks/web': (res) => send(res, 500, 'Hook rules were not satisfied.'),
  '/hooks/web-echo': (res, body) => echo(res, body.toString()),
};

const server = http.createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    const answer = ANSWERS[(req.url ?? '/').split('?')[0]];
    if (answer) answer(res, Buffer.concat(chunks));
    else send(res, 404, 'Hook not found.');
  });
});
server.listen(port, ip);
// A clean exit on SIGTERM/SIGINT, so that `--cpu-prof` writes its profile.
for (const sig of ['SIGTERM', 'SIGINT'] as const) process.on(sig, () => process.exit(0));
