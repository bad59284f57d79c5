/*
 * A registry with the OCI 1.1 referrers API (GET /v2/<repo>/referrers/<digest>), for the signature
 * tests: go-containerregistry's in-memory registry with its referrers API on, over TLS, from the tools
 * module in ./oci-registry (built from the Go module proxy like the cluster's binaries, cached beside
 * them as `${XDG_CACHE_HOME:-~/.cache}/webhook-test/bin/oci-registry-<ggcr version>-<main.go hash>`).
 * Debian's docker-registry (Distribution 2.8, test/registry.ts) has no referrers API; with this one,
 * cosign's --registry-referrers-mode=oci-1-1 stores a signature as a referrer and writes no referrers tag.
 *
 *   node test/oci-registry.ts     # builds it (about a minute the first time) and prints its path
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import * as https from 'node:https';
import { join } from 'node:path';
import { binPath, buildInto, GO_ENV, goBuildWithProgress } from './cluster/cluster.ts';
import { makeTempDir, peerOrSkip, waitFor } from './harness.ts';
import { makeCertificate } from './registry.ts';

const MODULE_DIR = join(import.meta.dirname, 'oci-registry');
// It listens at once; 15 s leaves room for a loaded machine.
const START_TIMEOUT_MS = 15_000;

/** The cache key: go-containerregistry's version in the tools module, and the main that sets the options. */
function version(): string {
  const ggcr = /github\.com\/google\/go-containerregistry (v\S+)/.exec(readFileSync(join(MODULE_DIR, 'go.mod'), 'utf8'))![1];
  return `${ggcr}-${createHash('sha256').update(readFileSync(join(MODULE_DIR, 'main.go'))).digest('hex').slice(0, 12)}`;
}

let built: Promise<string> | undefined;

/** The path of the registry binary, built on first use. */
export function ensureOciRegistry(): Promise<string> {
  const v = version();
  built ??= buildInto(['oci-registry'], v, (outDir) =>
    goBuildWithProgress(`the OCI registry (go-containerregistry ${v})`, '1 minute', {
      args: ['build', '-v', '-trimpath', '-o', join(outDir, 'oci-registry'), '.'],
      cwd: MODULE_DIR,
      env: GO_ENV,
      packages: ['.'],
    }),
  ).then(() => binPath('oci-registry', v));
  built.catch(() => (built = undefined));
  return built;
}

export interface OciRegistry {
  /** 127.0.0.1:PORT, as image references name it. */
  host: string;
  caPem: string;
  /** A directory holding the CA as ca.crt, for skopeo's --dest-cert-dir. */
  certDir: string;
  /** Every request the registry served so far, one line each ("GET /v2/acme/web/blobs/sha256:…"), as it logs them. */
  requests(): string[];
  stop(): Promise<void>;
}

/** The registry over TLS (a CA of its own signs its certificate); throws when it cannot be built or started. */
export async function startOciRegistry(): Promise<OciRegistry> {
  const bin = await ensureOciRegistry();
  const certs = makeCertificate(makeTempDir('oci-registry-'));
  const child = spawn(bin, ['-cert', certs.certFile, '-key', certs.keyFile], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout!.setEncoding('utf8').on('data', (s: string) => (output += s));
  child.stderr!.setEncoding('utf8').on('data', (s: string) => (output += s));
  const port = await waitFor(() => /serving on port (\d+)/.exec(output)?.[1] ?? (child.exitCode !== null ? 'exited' : undefined),
    { timeoutMs: START_TIMEOUT_MS, what: 'the OCI registry to listen' });
  if (port === 'exited') throw new Error(`the OCI registry exited:\n${output}`);
  return {
    host: `127.0.0.1:${port}`,
    caPem: certs.caPem,
    certDir: certs.certDir,
    requests: () => [...output.matchAll(/^\S+ \S+ ((?:GET|HEAD|PUT|POST|PATCH|DELETE) \S+)/gm)].map((m) => m[1]),
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise((resolve) => child.on('close', resolve));
      child.kill('SIGTERM');
      await exited;
    },
  };
}

/** One request to the registry over its TLS; the answer's status, headers and body. */
function registryCall(reg: OciRegistry, method: string, path: string, body?: Buffer, type?: string) {
  return new Promise<{ status: number; headers: Record<string, unknown>; body: string }>((resolve, reject) => {
    const headers = type ? { 'Content-Type': type } : {};
    const req = https.request(`https://${reg.host}${path}`, { method, ca: reg.caPem, headers }, (res) => {
      let text = '';
      res.setEncoding('utf8').on('data', (s: string) => (text += s));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: text }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

const sha256 = (bytes: Buffer) => `sha256:${createHash('sha256').update(bytes).digest('hex')}`;

/** Uploads a blob in one request (POST …/blobs/uploads/?digest=); its digest. */
export async function pushBlob(reg: OciRegistry, repository: string, bytes: Buffer): Promise<string> {
  const digest = sha256(bytes);
  const res = await registryCall(reg, 'POST', `/v2/${repository}/blobs/uploads/?digest=${digest}`, bytes, 'application/octet-stream');
  if (res.status !== 201) throw new Error(`blob upload to ${repository}: ${res.status} ${res.body}`);
  return digest;
}

/** PUTs a manifest (an OCI image manifest unless it says otherwise) at a tag or its digest; its digest. */
export async function pushManifest(reg: OciRegistry, repository: string, manifest: Record<string, unknown>, tag?: string): Promise<string> {
  const bytes = Buffer.from(JSON.stringify(manifest));
  const type = String(manifest.mediaType ?? 'application/vnd.oci.image.manifest.v1+json');
  const res = await registryCall(reg, 'PUT', `/v2/${repository}/manifests/${tag ?? sha256(bytes)}`, bytes, type);
  if (res.status !== 201) throw new Error(`manifest PUT to ${repository}: ${res.status} ${res.body}`);
  return sha256(bytes);
}

/** The registry, or undefined locally (with a loud message) when it cannot be built or started; in CI it fails. */
export function ociRegistryOrSkip(): Promise<OciRegistry | undefined> {
  return peerOrSkip(startOciRegistry, 'the OCI registry with the referrers API', 'the referrers API test');
}

if (import.meta.main) process.stdout.write(`${await ensureOciRegistry()}\n`);
