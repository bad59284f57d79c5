/*
 * The Node floor for the bench scenarios: the least a node:http server must do to give the same
 * answers (read the body, answer 500 "Hook rules were not satisfied." for /hooks/mismatch; parse
 * the JSON and return `/bin/echo <repository.repo_full_name>` output for /hooks/echo). No rules,
 * logging, metrics or request ids. bench/profile.ts runs it beside webhook.ts so that what our
 * code costs can be told apart from what Node itself costs.
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

const server = http.createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    const path = (req.url ?? '/').split('?')[0];
    if (path === '/') return send(res, 200, 'OK');
    if (path === '/hooks/mismatch') return send(res, 500, 'Hook rules were not satisfied.');
    if (path === '/hooks/echo') {
      let arg = '';
      try {
        arg = String(JSON.parse(Buffer.concat(chunks).toString()).repository.repo_full_name);
      } catch {
        /* empty argument */
      }
      const child = spawn('/bin/echo', [arg], { detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
      const out: Buffer[] = [];
      child.stdout.on('data', (c: Buffer) => out.push(c));
      child.stderr.on('data', (c: Buffer) => out.push(c));
      child.on('close', (code) => send(res, code === 0 ? 200 : 500, Buffer.concat(out).toString()));
      return;
    }
    send(res, 404, 'Hook not found.');
  });
});
server.listen(port, ip);
// A clean exit on SIGTERM/SIGINT, so that `--cpu-prof` writes its profile.
for (const sig of ['SIGTERM', 'SIGINT'] as const) process.on(sig, () => process.exit(0));
