/*
 * A real Git server for tests: git's own `git http-backend` (Debian's git) run as a CGI program behind a small
 * HTTP server on loopback with basic auth, serving bare repositories under one root. `git` here is the test's
 * tool (to build repositories and check what the service wrote); the service under test never runs it.
 * `answer` lets a test replace an answer (garbage, a truncated pack); every request is counted.
 */
import { execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';

export const GIT_HTTP_BACKEND = '/usr/lib/git-core/git-http-backend';

export interface GitServer {
  /** http://127.0.0.1:<port> */
  base: string;
  requests: { method: string; path: string; status: number }[];
  /** Replaces an answer: given the request's path and query and the backend's body, the body sent. */
  answer?: (pathAndQuery: string, body: Buffer) => Buffer;
  close(): Promise<void>;
}

/** git with a fixed identity and no user configuration, in `cwd`. */
export function git(cwd: string, args: string[], input?: string | Buffer): string {
  return execFileSync('git', args, {
    cwd,
    input,
    encoding: 'utf8',
    maxBuffer: 256 << 20,
    env: {
      PATH: process.env.PATH,
      HOME: cwd,
      GIT_CONFIG_NOSYSTEM: '1',
      GIT_AUTHOR_NAME: 'test',
      GIT_AUTHOR_EMAIL: 'test@example.com',
      GIT_COMMITTER_NAME: 'test',
      GIT_COMMITTER_EMAIL: 'test@example.com',
    },
  });
}

/** Serves the bare repositories under `root` to `user`:`password`; pushes are allowed. */
export function startGitServer(root: string, user: string, password: string): Promise<GitServer> {
  const server: GitServer = { base: '', requests: [], close: async () => undefined };
  const expected = `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;
  const http1 = http.createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://x');
    const record = (status: number) => server.requests.push({ method: req.method ?? '', path: url.pathname, status });
    if (req.headers.authorization !== expected) {
      record(401);
      res.writeHead(401, { 'WWW-Authenticate': 'Basic realm="git"', 'Content-Type': 'text/plain' });
      res.end('Authentication failed\n');
      return;
    }
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const env: Record<string, string> = {
        PATH: process.env.PATH ?? '',
        GIT_PROJECT_ROOT: root,
        GIT_HTTP_EXPORT_ALL: '1',
        GIT_CONFIG_NOSYSTEM: '1',
        HOME: root,
        REQUEST_METHOD: req.method ?? 'GET',
        PATH_INFO: decodeURIComponent(url.pathname),
        QUERY_STRING: url.search.slice(1),
        CONTENT_TYPE: String(req.headers['content-type'] ?? ''),
        CONTENT_LENGTH: String(Buffer.concat(chunks).length),
        REMOTE_USER: user,
        REMOTE_ADDR: '127.0.0.1',
        GIT_HTTP_MAX_REQUEST_BUFFER: '1000M',
      };
      if (req.headers['git-protocol']) env.GIT_PROTOCOL = String(req.headers['git-protocol']);
      const cgi = spawn(GIT_HTTP_BACKEND, [], { env });
      const out: Buffer[] = [];
      const err: Buffer[] = [];
      cgi.stdout.on('data', (c: Buffer) => out.push(c));
      cgi.stderr.on('data', (c: Buffer) => err.push(c));
      cgi.stdin.on('error', () => undefined);
      cgi.stdin.end(Buffer.concat(chunks));
      cgi.on('close', () => {
        const all = Buffer.concat(out);
        const split = all.indexOf('\r\n\r\n') >= 0 ? all.indexOf('\r\n\r\n') : all.indexOf('\n\n');
        const sep = all.indexOf('\r\n\r\n') >= 0 ? 4 : 2;
        const head = all.subarray(0, Math.max(split, 0)).toString('latin1');
        let body = split >= 0 ? all.subarray(split + sep) : Buffer.alloc(0);
        let status = 200;
        const headers: Record<string, string> = {};
        for (const line of head.split(/\r?\n/)) {
          const colon = line.indexOf(':');
          if (colon < 0) continue;
          const name = line.slice(0, colon).trim();
          const value = line.slice(colon + 1).trim();
          if (name.toLowerCase() === 'status') status = Number(value.split(' ')[0]);
          else headers[name] = value;
        }
        if (server.answer) body = Buffer.from(server.answer(`${url.pathname}${url.search}`, body));
        record(status);
        res.writeHead(status, { ...headers, 'Content-Length': String(body.length) });
        res.end(body);
        if (status >= 500) process.stderr.write(Buffer.concat(err));
      });
    });
  });
  return new Promise((resolve) => {
    http1.listen(0, '127.0.0.1', () => {
      server.base = `http://127.0.0.1:${(http1.address() as AddressInfo).port}`;
      server.close = () => new Promise((done) => {
        http1.closeAllConnections();
        http1.close(() => done());
      });
      resolve(server);
    });
  });
}

/**
 * A bare repository `<root>/<name>.git` holding `files` committed over `commits` commits (each commit changing
 * every file a little, so that `git gc --aggressive` stores them as deltas), with filters and pushes allowed.
 */
export function makeRepository(root: string, name: string, files: Record<string, string>, commits = 5): string {
  const work = path.join(root, `${name}-work`);
  const bare = path.join(root, `${name}.git`);
  fs.mkdirSync(work, { recursive: true });
  git(work, ['init', '-q', '-b', 'main']);
  // No automatic gc: with thousands of loose objects a commit starts one in the background, which packs them away
  // while the clone below copies them ("failed to copy file … No such file or directory").
  git(work, ['config', 'gc.auto', '0']);
  for (let i = 0; i < commits; i++) {
    for (const [file, text] of Object.entries(files)) {
      fs.mkdirSync(path.dirname(path.join(work, file)), { recursive: true });
      const last = i === commits - 1;
      fs.writeFileSync(path.join(work, file), last ? text : `${text}# revision ${i}\n`);
    }
    git(work, ['add', '-A']);
    git(work, ['commit', '-q', '-m', `revision ${i}`]);
  }
  git(root, ['clone', '-q', '--bare', work, bare]);
  git(bare, ['gc', '-q', '--aggressive']);
  git(bare, ['config', 'uploadpack.allowFilter', 'true']);
  git(bare, ['config', 'http.receivepack', 'true']);
  git(bare, ['config', 'receive.fsckObjects', 'true']);
  return bare;
}
