// A real container registry for the tests: Debian's docker-registry (CNCF Distribution 2.8), started
// on loopback in a private temp directory, and Debian's skopeo to push to it.
//
// What it gives a test (see `Registry`): the registry's host:port, optionally TLS (a CA of its own
// signs a certificate for 127.0.0.1 and localhost) and htpasswd basic auth for one user; its
// `notifications` endpoint pointed at a URL the test chooses, with a header the test chooses (the
// registry then POSTs its own event envelopes there); `push` copies an OCI archive to a tag with
// skopeo (`--all` for a multi-arch index), `pull` reads a tag's manifest (a pull event); and
// `ociArchive` builds a tiny OCI image, or an index of two platforms, as an `oci-archive:` the test
// owns. No hand-written payload: the events are the registry's.
//
// docker-registry and skopeo are real external programs, never mocks (DESIGN.md). When missing they
// are installed with apt-get (with apache2-utils for htpasswd); when that or the start fails,
// startRegistry throws: in CI the registry tests must fail, never skip.
//
// Pitfalls this file handles:
// - The registry cannot listen on port 0 and does not report its port, so a free port is found
//   first; a lost race ("address already in use") is retried with a fresh port.
// - Notifications go out asynchronously, one at a time per endpoint, retried on failure every
//   `backoff`; a short backoff keeps a test that makes the first delivery fail quick.
// - skopeo refuses plain HTTP and unknown CAs unless told (`--dest-tls-verify=false`, `--dest-cert-dir`).

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash, createSign, randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import * as https from 'node:https';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { aptInstall, freePort } from './harness.ts';

export interface RegistryOptions {
  /** The URL the registry POSTs its event envelopes to; none when absent. */
  notify?: { url: string; headers?: Record<string, string> };
  /** Serve HTTPS with a certificate from a CA of the registry's own. */
  tls?: boolean;
  /**
   * Require a login for this user: basic auth against htpasswd, or (`token`, which needs tls) the
   * registry's token auth, with a token service this file runs that checks the same login and
   * issues RS256 tokens the registry verifies against a certificate of its own (x5c); `realmHost`
   * names the token service by that host (its certificate holds 127.0.0.1 and localhost).
   */
  auth?: { user: string; password: string; token?: boolean; realmHost?: string };
}

export interface Registry {
  /** 127.0.0.1:PORT, as image references name it. */
  host: string;
  /** The CA that signed the server certificate (with tls). */
  caPem?: string;
  /** skopeo copy oci-archive → docker://host/<repoTag>; `all` for every image of an index. */
  push(archive: string, repoTag: string, opts?: { all?: boolean }): Promise<void>;
  /** Reads the manifest of host/<repoTag> (the registry announces a pull). */
  pull(repoTag: string): Promise<void>;
  /** The registry's log (stderr and stdout). */
  log(): string;
  /** The User-Agent of each client the token service issued a token to (token auth). */
  tokensIssuedTo(): string[];
  /** Every request the token service received: its User-Agent and Authorization header (token auth). */
  tokenRequests(): { userAgent: string; authorization?: string }[];
  /** Stops the registry process, keeping its storage and port: the registry is away until up(). */
  down(): Promise<void>;
  /** Starts the registry again, as it was, on the same port. */
  up(): Promise<void>;
  stop(): Promise<void>;
}

// A cold start of the registry takes well under a second; 15 s leaves room for a loaded machine.
const START_TIMEOUT_MS = 15_000;
const PORT_ATTEMPTS = 3;
// skopeo's pushes of a few KiB take a second; a minute covers a loaded CI machine.
const SKOPEO_TIMEOUT_MS = 60_000;

export async function startRegistry(opts: RegistryOptions = {}): Promise<Registry> {
  ensurePackages();
  const dir = mkdtempSync(join(tmpdir(), 'webhook-registry-'));
  const certs = opts.tls ? makeCertificate(dir) : undefined;
  const htpasswd = opts.auth && !opts.auth.token ? makeHtpasswd(dir, opts.auth) : undefined;
  if (opts.auth?.token && !certs) throw new Error('startRegistry: token auth needs tls');
  const tokens = opts.auth?.token ? await startTokenService(dir, certs!, opts.auth) : undefined;
  let lastFailure = '';
  for (let attempt = 0; attempt < PORT_ATTEMPTS; attempt++) {
    const port = await freePort();
    const config = join(dir, 'config.yml');
    writeFileSync(config, registryConfig({ dir, port, notify: opts.notify, certs, htpasswd, tokens }));
    const { child, log } = serve(config);
    const up = await waitUntilListening(port, child, log);
    if (up) return registryHandle({ dir, port, config, child, log, certs, auth: opts.auth, tokens });
    lastFailure = log();
    child.kill('SIGKILL');
    if (!/address already in use/i.test(lastFailure)) break;
  }
  tokens?.server.close();
  rmSync(dir, { recursive: true, force: true });
  throw new Error(`startRegistry: docker-registry did not start:\n${lastFailure.split('\n').slice(-15).join('\n')}`);
}

/** docker-registry serving `config`, its output gathered (one log across restarts when `before` is given). */
function serve(config: string, before = ''): { child: ChildProcess; log: () => string } {
  const child = spawn('docker-registry', ['serve', config], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = before;
  child.stdout!.setEncoding('utf8').on('data', (s: string) => (output += s));
  child.stderr!.setEncoding('utf8').on('data', (s: string) => (output += s));
  return { child, log: () => output };
}

/** Ends a registry process: SIGTERM, then SIGKILL if it is still there after a while. */
async function endProcess(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.on('close', r));
  child.kill('SIGTERM');
  await Promise.race([exited, sleep(5_000)]);
  child.kill('SIGKILL');
}

function registryHandle(v: {
  dir: string;
  port: number;
  config: string;
  child: ChildProcess;
  log: () => string;
  certs?: { caFile: string; caPem: string; certDir: string };
  auth?: { user: string; password: string };
  tokens?: TokenService;
}): Registry {
  const host = `127.0.0.1:${v.port}`;
  const tlsArgs = (side: 'src' | 'dest') =>
    v.certs ? [`--${side}-cert-dir`, v.certs.certDir] : [`--${side}-tls-verify=false`];
  const credArgs = (side: 'src' | 'dest') => (v.auth ? [`--${side}-creds`, `${v.auth.user}:${v.auth.password}`] : []);
  return {
    host,
    caPem: v.certs?.caPem,
    async push(archive, repoTag, o = {}) {
      await run('skopeo', ['copy', '--quiet', ...(o.all ? ['--all'] : []), ...tlsArgs('dest'), ...credArgs('dest'),
        `oci-archive:${archive}`, `docker://${host}/${repoTag}`]);
    },
    async pull(repoTag) {
      const args = ['inspect', '--raw', ...tlsArgs('src').map((a) => a.replace('--src-', '--')),
        ...credArgs('src').map((a) => a.replace('--src-', '--')), `docker://${host}/${repoTag}`];
      await run('skopeo', args);
    },
    log: () => v.log(),
    tokensIssuedTo: () => [...(v.tokens?.issued ?? [])],
    tokenRequests: () => [...(v.tokens?.requests ?? [])],
    down: () => endProcess(v.child),
    async up() {
      const again = serve(v.config, v.log());
      v.child = again.child;
      v.log = again.log;
      if (!(await waitUntilListening(v.port, v.child, v.log)))
        throw new Error(`registry.up: docker-registry did not start again on ${host}:\n${v.log().slice(-2000)}`);
    },
    async stop() {
      v.tokens?.server.close();
      await endProcess(v.child);
      rmSync(v.dir, { recursive: true, force: true });
    },
  };
}

function registryConfig(v: {
  dir: string;
  port: number;
  notify?: { url: string; headers?: Record<string, string> };
  certs?: { certFile: string; keyFile: string };
  htpasswd?: string;
  tokens?: TokenService;
}): string {
  const lines = [
    'version: 0.1',
    'log:',
    '  level: info',
    'storage:',
    '  filesystem:',
    `    rootdirectory: ${JSON.stringify(join(v.dir, 'data'))}`,
    '  delete:',
    '    enabled: true',
    'http:',
    `  addr: 127.0.0.1:${v.port}`,
  ];
  if (v.certs) lines.push('  tls:', `    certificate: ${v.certs.certFile}`, `    key: ${v.certs.keyFile}`);
  if (v.htpasswd) lines.push('auth:', '  htpasswd:', '    realm: webhook-test', `    path: ${v.htpasswd}`);
  if (v.tokens) {
    lines.push('auth:', '  token:', `    realm: ${v.tokens.realm}`, `    service: ${TOKEN_SERVICE}`, `    issuer: ${TOKEN_ISSUER}`);
    lines.push(`    rootcertbundle: ${v.tokens.signerCertFile}`);
  }
  if (v.notify) {
    lines.push('notifications:', '  endpoints:', '    - name: webhook', `      url: ${JSON.stringify(v.notify.url)}`);
    const headers = Object.entries(v.notify.headers ?? {});
    if (headers.length) lines.push('      headers:', ...headers.map(([k, val]) => `        ${k}: [${JSON.stringify(val)}]`));
    // A failed delivery is retried after `backoff`; the test cluster's answers take milliseconds.
    lines.push('      timeout: 30s', '      threshold: 3', '      backoff: 1s');
  }
  return `${lines.join('\n')}\n`;
}

async function waitUntilListening(port: number, child: ChildProcess, output: () => string): Promise<boolean> {
  const deadline = Date.now() + START_TIMEOUT_MS;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) return false;
    const open = await new Promise<boolean>((resolve) => {
      const s = net.connect(port, '127.0.0.1', () => {
        s.destroy();
        resolve(true);
      });
      s.on('error', () => resolve(false));
    });
    if (open) return true;
    if (/address already in use/i.test(output())) return false;
    await sleep(50);
  }
  return false;
}

// ---- the token service (Docker registry token auth) ---------------------------------------------

const TOKEN_SERVICE = 'webhook-test-registry';
const TOKEN_ISSUER = 'webhook-test-token-service';

interface TokenService {
  server: https.Server;
  realm: string;
  signerCertFile: string;
  /** The User-Agent of each request a token was issued to. */
  issued: string[];
  /** Every request received, with or without a login. */
  requests: { userAgent: string; authorization?: string }[];
}

/**
 * A token service as the Docker token spec describes it: GET <realm>?service=…&scope=… with the
 * user's basic auth answers {"token": <JWT>}, the JWT signed (RS256) by a key whose self-signed
 * certificate the registry trusts (rootcertbundle) and names in the header (x5c). 401 otherwise.
 */
async function startTokenService(
  dir: string,
  certs: { certFile: string; keyFile: string },
  login: { user: string; password: string; realmHost?: string },
): Promise<TokenService> {
  const p = (name: string) => join(dir, name);
  runSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', p('signer.key'), '-out', p('signer.pem'),
    '-days', '2', '-subj', '/CN=webhook test token signer']);
  const signerKey = readFileSync(p('signer.key'), 'utf8');
  const x5c = readFileSync(p('signer.pem'), 'utf8').replace(/-----[^-]+-----|\s/g, '');
  const b64url = (v: Buffer | string) => Buffer.from(v).toString('base64url');
  const expected = `Basic ${Buffer.from(`${login.user}:${login.password}`).toString('base64')}`;
  const service: TokenService = { server: undefined as unknown as https.Server, realm: '', signerCertFile: p('signer.pem'), issued: [], requests: [] };
  service.server = https.createServer({ cert: readFileSync(certs.certFile), key: readFileSync(certs.keyFile) }, (req, res) => {
    const url = new URL(req.url ?? '/', 'https://127.0.0.1');
    service.requests.push({ userAgent: req.headers['user-agent'] ?? '', authorization: req.headers.authorization });
    if (req.headers.authorization !== expected) {
      res.writeHead(401, { 'Content-Type': 'application/json' }).end('{"errors":[{"code":"UNAUTHORIZED"}]}');
      return;
    }
    const access = url.searchParams.getAll('scope').flatMap((scope) => {
      const [type, name, actions] = scope.split(':');
      return type && name && actions ? [{ type, name, actions: actions.split(',') }] : [];
    });
    const now = Math.floor(Date.now() / 1000);
    const header = b64url(JSON.stringify({ alg: 'RS256', typ: 'JWT', x5c: [x5c] }));
    const claims = b64url(JSON.stringify({ iss: TOKEN_ISSUER, sub: login.user, aud: url.searchParams.get('service') ?? TOKEN_SERVICE,
      exp: now + 300, nbf: now - 10, iat: now, jti: randomBytes(8).toString('hex'), access }));
    const signature = b64url(createSign('sha256').update(`${header}.${claims}`).sign(signerKey));
    const token = `${header}.${claims}.${signature}`;
    service.issued.push(req.headers['user-agent'] ?? '');
    res.writeHead(200, { 'Content-Type': 'application/json' }).end(JSON.stringify({ token, access_token: token, expires_in: 300 }));
  });
  await new Promise<void>((resolve) => service.server.listen(0, '127.0.0.1', resolve));
  // `realmHost` (localhost, say) names the token service by another host than the registry's 127.0.0.1.
  service.realm = `https://${login.realmHost ?? '127.0.0.1'}:${(service.server.address() as net.AddressInfo).port}/token`;
  return service;
}

// ---- the OCI archive -----------------------------------------------------------------------------

export interface OciArchive {
  /** Path of the oci-archive tarball. */
  path: string;
  /** The manifest digest (single image) or index digest (with platforms). */
  digest: string;
}

/**
 * A tiny OCI image whose one layer holds `content` (so each call with other content is a new image),
 * or, with `platforms`, an index of one such image per platform. Written as an OCI layout, then tarred.
 */
export function ociArchive(
  dir: string,
  content: string,
  platforms?: { os: string; architecture: string }[],
  o: { created?: string } = {},
): OciArchive {
  const layout = mkdtempSync(join(dir, 'oci-'));
  mkdirSync(join(layout, 'blobs', 'sha256'), { recursive: true });
  const blob = (data: Buffer | string) => {
    const buf = Buffer.isBuffer(data) ? data : Buffer.from(data);
    const hex = createHash('sha256').update(buf).digest('hex');
    writeFileSync(join(layout, 'blobs', 'sha256', hex), buf);
    return { digest: `sha256:${hex}`, size: buf.length };
  };
  const image = (platform: { os: string; architecture: string }) => {
    const layer = blob(layerTar(dir, `${content} ${platform.os}/${platform.architecture}\n`));
    const config = blob(JSON.stringify({ ...(o.created ? { created: o.created } : {}), ...platform, rootfs: { type: 'layers', diff_ids: [layer.digest] }, config: {} }));
    const manifest = JSON.stringify({
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...config },
      layers: [{ mediaType: 'application/vnd.oci.image.layer.v1.tar', ...layer }],
    });
    return { mediaType: 'application/vnd.oci.image.manifest.v1+json', ...blob(manifest), platform };
  };
  const images = (platforms ?? [{ os: 'linux', architecture: 'amd64' }]).map(image);
  let top = images[0];
  if (platforms) {
    const index = JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.index.v1+json', manifests: images });
    top = { mediaType: 'application/vnd.oci.image.index.v1+json', ...blob(index), platform: images[0].platform };
  }
  const { platform: _platform, ...descriptor } = top;
  writeFileSync(join(layout, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
  writeFileSync(join(layout, 'index.json'), JSON.stringify({ schemaVersion: 2, manifests: [descriptor] }));
  const path = `${layout}.tar`;
  runSync('tar', ['-cf', path, '-C', layout, '.']);
  return { path, digest: top.digest };
}

/** An uncompressed tar holding one file, made with tar from a directory of its own. */
function layerTar(dir: string, content: string): Buffer {
  const root = mkdtempSync(join(dir, 'layer-'));
  writeFileSync(join(root, 'hello.txt'), content);
  const out = spawnSync('tar', ['--sort=name', '--mtime=@0', '--owner=0', '--group=0', '-cf', '-', '-C', root, '.']);
  if (out.status !== 0) throw new Error(`tar failed: ${out.stderr}`);
  return out.stdout;
}

// ---- setup ------------------------------------------------------------------------------------------

function ensurePackages(): void {
  const present = () => ['docker-registry', 'skopeo', 'htpasswd'].every((b) => spawnSync('which', [b]).status === 0);
  aptInstall(['docker-registry', 'skopeo', 'apache2-utils'], present, 'startRegistry: docker-registry, skopeo or htpasswd');
}

export function makeCertificate(dir: string): { caFile: string; caPem: string; certFile: string; keyFile: string; certDir: string } {
  const p = (name: string) => join(dir, name);
  const key = ['-newkey', 'rsa:2048', '-nodes'];
  runSync('openssl', ['req', '-x509', ...key, '-keyout', p('ca.key'), '-out', p('ca.pem'), '-days', '2', '-subj', '/CN=webhook registry test CA']);
  runSync('openssl', ['req', '-new', ...key, '-keyout', p('server.key'), '-out', p('server.csr'), '-subj', '/CN=127.0.0.1']);
  writeFileSync(p('san.ext'), 'subjectAltName=DNS:localhost,IP:127.0.0.1\n');
  runSync('openssl', ['x509', '-req', '-in', p('server.csr'), '-CA', p('ca.pem'), '-CAkey', p('ca.key'), '-CAcreateserial',
    '-out', p('server.pem'), '-days', '2', '-extfile', p('san.ext')]);
  // skopeo's --cert-dir reads CA certificates named *.crt.
  const certDir = p('skopeo-certs');
  mkdirSync(certDir);
  const caPem = spawnSync('cat', [p('ca.pem')], { encoding: 'utf8' }).stdout;
  writeFileSync(join(certDir, 'ca.crt'), caPem);
  return { caFile: p('ca.pem'), caPem, certFile: p('server.pem'), keyFile: p('server.key'), certDir };
}

function makeHtpasswd(dir: string, auth: { user: string; password: string }): string {
  const file = join(dir, 'htpasswd');
  // The registry accepts bcrypt entries only.
  runSync('htpasswd', ['-Bbc', file, auth.user, auth.password]);
  return file;
}

function runSync(cmd: string, args: string[]): void {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${cmd} ${args[0]} failed: ${r.error?.message ?? r.stderr}`);
}

function run(cmd: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout!.setEncoding('utf8').on('data', (s: string) => (output += s));
    child.stderr!.setEncoding('utf8').on('data', (s: string) => (output += s));
    const timer = setTimeout(() => child.kill('SIGKILL'), SKOPEO_TIMEOUT_MS);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      if (code === 0) resolve();
      else reject(new Error(`${cmd} ${args[0]} exited with ${code}: ${output.trim()}`));
    });
  });
}

