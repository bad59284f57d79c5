/**
 * A real local Kubernetes control plane for integration tests, with no Docker and no internet.
 *
 *   node test/cluster/cluster.ts up     # build what is missing, start the cluster, write the kubeconfig
 *   node test/cluster/cluster.ts down   # delete the cluster
 *
 * kube-apiserver, kube-controller-manager, kube-scheduler and kubectl are built from the Go module
 * proxy through the tools module in ./k8s, etcd through ./etcd, kwok and kwokctl with `go install`.
 * Binaries are cached outside the clone, keyed by version, in
 * `${XDG_CACHE_HOME:-~/.cache}/webhook-test/bin/<name>-<version>`; kwokctl's working directory is
 * `…/webhook-test/kwok`. kwokctl runs every component as a local process (`--runtime binary`) and
 * fakes the nodes and the pods' lifecycle, so Deployments, DaemonSets and StatefulSets really roll
 * out. Tests import `ensureCluster()` and use the JSON kubeconfig it writes to
 * `.cache/cluster/kubeconfig.json`.
 */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const repoRoot = resolve(here, '..', '..');

/** The cluster every test file shares; ensureCluster(name) starts others beside it (multi-cluster tests). */
const CLUSTER_NAME = 'webhook-test';
const NODE_COUNT = 2;
const KWOK_VERSION = 'v0.8.0';
/** Pods whose labels carry this (from the pod template) stay Running but never Ready. */
export const UNREADY_LABEL = 'webhook-test/unready';

const cacheRoot = join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'webhook-test');
const binDir = join(cacheRoot, 'bin');
const kwokWorkdir = join(cacheRoot, 'kwok');
/** The processes of kwokctl's binary runtime, as named in its pids directory. */
const COMPONENTS = ['etcd', 'kube-apiserver', 'kube-controller-manager', 'kube-scheduler', 'kwok-controller'];
const stageSource = join(here, 'unready-stage.yaml');

/**
 * Where one cluster's files are. kwokctl keeps each cluster (its etcd data, certificates, pids)
 * under clusters/<name> and gives each component a free port of its own, so clusters of different
 * names run side by side.
 */
function clusterFiles(name: string) {
  const dir = join(kwokWorkdir, 'clusters', name);
  return {
    name,
    /** kwokctl names the context (and cluster, and user) of its kubeconfig `kwok-<name>`. */
    context: `kwok-${name}`,
    dir,
    kubeconfig: join(dir, 'kubeconfig.yaml'),
    /** The stage file kwok-controller reads: a copy, so the running cluster never depends on a clone. */
    stageCopy: join(kwokWorkdir, `${name}-unready-stage.yaml`),
    /** The log files the ClusterLogs document names. */
    currentLog: join(kwokWorkdir, `${name}-container.log`),
    previousLog: join(kwokWorkdir, `${name}-container-previous.log`),
    /**
     * kwokctl binds every component (etcd too, unauthenticated) to 0.0.0.0 by default, and v0.8.0 has
     * no flag or env var for it: only a KwokctlConfiguration document can set it.
     */
    kwokctlConfig: join(kwokWorkdir, `${name}-kwokctl.yaml`),
    /** The versions the running cluster was made from. */
    versionsRecord: join(kwokWorkdir, `${name}-versions.json`),
    /** The JSON kubeconfig tests read: the shared cluster's where it always was, others' beside it. */
    jsonKubeconfig:
      name === CLUSTER_NAME ? kubeconfigPath : join(repoRoot, '.cache', 'cluster', name, 'kubeconfig.json'),
  };
}
type ClusterFiles = ReturnType<typeof clusterFiles>;

const KWOKCTL_CONFIG = `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  bindAddress: 127.0.0.1
`;
const lockDir = join(cacheRoot, 'cluster.lock');

/**
 * What kwok-controller serves as every pod's container log (ClusterLogs, read through the API server's pods/log):
 * the previous run's of a crash-looping container ends in an error that quotes this secret, which a test's hook holds.
 */
export const CRASH_LOG_SECRET = 'crash-log-secret-5f0c2a9e7d41';
export const CRASH_LOG_PREVIOUS = [
  'starting web-api v2',
  `connecting to db://orders with token ${CRASH_LOG_SECRET}`,
  'panic: database unreachable: dial tcp 10.0.0.7:5432: connect: connection refused',
];
const CURRENT_LOG = ['starting web-api'];

/** Lines as the CRI log files kwok reads hold them (`<time> <stream> F <line>`). */
function criLog(lines: string[]): string {
  return lines.map((l, i) => `2026-01-01T00:00:0${i}.000000000Z ${l.startsWith('panic') ? 'stderr' : 'stdout'} F ${l}\n`).join('');
}

/** The ClusterLogs document kwok-controller reads beside the stages: every pod's log, and its previous run's. */
function clusterLogs(f: ClusterFiles): string {
  return [
    'apiVersion: kwok.x-k8s.io/v1alpha1',
    'kind: ClusterLogs',
    'metadata:',
    '  name: webhook-test-logs',
    'spec:',
    '  selector: {}',
    '  logs:',
    `  - logsFile: ${JSON.stringify(f.currentLog)}`,
    `    previousLogsFile: ${JSON.stringify(f.previousLog)}`,
    '',
  ].join('\n');
}

export const kubeconfigPath = join(repoRoot, '.cache', 'cluster', 'kubeconfig.json');

interface RunOptions {
  cwd?: string;
  env?: Record<string, string>;
  /** Stream the command's output to our stderr instead of capturing it (long builds). */
  stream?: boolean;
  /** Resolve with the exit code instead of rejecting when the command fails. */
  allowFailure?: boolean;
}

interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

function run(command: string, args: string[], options: RunOptions = {}): Promise<RunResult> {
  return new Promise((resolveRun, reject) => {
    const child = spawn(command, args, {
      cwd: options.cwd,
      env: { ...process.env, ...options.env },
      stdio: options.stream ? ['ignore', 2, 2] : ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout?.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
    child.stderr?.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
    child.on('error', reject);
    child.on('close', (code, signal) => {
      const result = { code: code ?? 128, stdout, stderr };
      if (result.code === 0 || options.allowFailure) return resolveRun(result);
      const detail = stderr.trim() || stdout.trim();
      reject(new Error(`${command} ${args.join(' ')} failed (${signal ?? `exit ${code}`})${detail ? `:\n${detail}` : ''}`));
    });
  });
}

function log(message: string): void {
  process.stderr.write(`[cluster] ${message}\n`);
}

/** How often a long build reports how far it got. */
const PROGRESS_EVERY_MS = 15_000;

function minutes(ms: number): string {
  const s = Math.round(ms / 1000);
  return s < 60 ? `${s} s` : `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, '0')} s`;
}

/**
 * A `go build -v` or `go install -v` whose progress is reported: go prints each package it compiles,
 * so the count against the packages the build needs (`go list -deps`, when the packages can be
 * listed) says how far it got and, from the rate so far, about how long is left. Downloading the
 * modules comes first and is reported by time only. Go's own errors are printed when it fails.
 */
export async function goBuildWithProgress(
  what: string,
  expected: string,
  go: { args: string[]; cwd: string; env: Record<string, string>; packages?: string[] },
): Promise<void> {
  const started = Date.now();
  log(`building ${what}: the first time takes about ${expected} on 2 cores (downloading modules, then compiling)`);
  const state = { total: 0, compiled: 0, compileStarted: 0 };
  const timer = setInterval(() => log(`${what}: ${buildProgress(state, started)}`), PROGRESS_EVERY_MS);
  try {
    if (go.packages) {
      const listed = await run('go', ['list', '-deps', ...go.packages], { cwd: go.cwd, env: go.env, allowFailure: true });
      state.total = listed.code === 0 ? listed.stdout.split('\n').filter((l) => l !== '').length : 0;
      if (state.total) log(`${what}: modules ready after ${minutes(Date.now() - started)}; compiling up to ${state.total} packages`);
    }
    await new Promise<void>((resolveBuild, reject) => {
      const child = spawn('go', go.args, { cwd: go.cwd, env: { ...process.env, ...go.env }, stdio: ['ignore', 'pipe', 'pipe'] });
      let errors = '';
      const read = (chunk: string) => {
        // go -v names each package it compiles on a line of its own; anything else is a message.
        for (const line of chunk.split('\n')) {
          if (/^[\w.\-/]+$/.test(line)) state.compiled++;
          else if (line !== '' && !line.startsWith('go: downloading')) errors += `${line}\n`;
        }
        if (state.compiled && !state.compileStarted) state.compileStarted = Date.now();
      };
      child.stdout.setEncoding('utf8').on('data', read);
      child.stderr.setEncoding('utf8').on('data', read);
      child.on('error', reject);
      child.on('close', (code) => (code === 0 ? resolveBuild() : reject(new Error(`go ${go.args.join(' ')} failed (exit ${code}):\n${errors}`))));
    });
  } finally {
    clearInterval(timer);
  }
  log(`built ${what} in ${minutes(Date.now() - started)}`);
}

function buildProgress(state: { total: number; compiled: number; compileStarted: number }, started: number): string {
  const elapsed = `${minutes(Date.now() - started)} so far`;
  if (!state.compiled) return `downloading modules, ${elapsed}`;
  if (!state.total) return `${state.compiled} packages compiled, ${elapsed}`;
  const left = Math.max(0, state.total - state.compiled) / (state.compiled / (Date.now() - state.compileStarted));
  const percent = Math.round((100 * state.compiled) / state.total);
  return `${state.compiled}/${state.total} packages (${percent}%), ${elapsed}, about ${minutes(left)} left`;
}

// ---------------------------------------------------------------------------------------------
// Binaries

interface Versions {
  kubernetes: string;
  etcd: string;
  kwok: string;
}

/** The version a tools module requires, so its go.mod stays the one place to bump. */
async function requiredVersion(goMod: string, module: string): Promise<string> {
  const text = await readFile(goMod, 'utf8');
  const escaped = module.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');
  const match = new RegExp(`^\\s*(?:require\\s+)?${escaped}\\s+(v\\S+)\\s*(?://.*)?$`, 'm').exec(text);
  if (!match) throw new Error(`${goMod} does not require ${module}`);
  return match[1];
}

async function versions(): Promise<Versions> {
  return {
    kubernetes: await requiredVersion(join(here, 'k8s', 'go.mod'), 'k8s.io/kubernetes'),
    etcd: await requiredVersion(join(here, 'etcd', 'go.mod'), 'go.etcd.io/etcd/server/v3'),
    kwok: KWOK_VERSION,
  };
}

const K8S_COMMANDS = ['kube-apiserver', 'kube-controller-manager', 'kube-scheduler', 'kubectl'];

export function binPath(name: string, version: string): string {
  return join(binDir, `${name}-${version}`);
}

/** Local toolchain only (no toolchain download), static binaries, no local paths baked in. */
export const GO_ENV = { GOTOOLCHAIN: 'local', CGO_ENABLED: '0' };

/**
 * Builds into a scratch directory, then renames each binary into place, so an interrupted build
 * never leaves a truncated binary that later looks cached.
 */
export async function buildInto(names: string[], version: string, build: (outDir: string) => Promise<unknown>): Promise<void> {
  if (names.every((name) => existsSync(binPath(name, version)))) return;
  await mkdir(binDir, { recursive: true });
  const outDir = await mkdtemp(join(binDir, '.build-'));
  try {
    await build(outDir);
    for (const name of names) await rename(join(outDir, name), binPath(name, version));
  } finally {
    await rm(outDir, { recursive: true, force: true });
  }
}

async function ensureBinaries(v: Versions): Promise<void> {
  const [, major, minor] = /^v(\d+)\.(\d+)\./.exec(v.kubernetes) ?? [];
  // Stamped like a release: kwokctl and kubectl read `--version` for flag and skew decisions.
  const k8sLdflags = [
    `-X k8s.io/component-base/version.gitVersion=${v.kubernetes}`,
    `-X k8s.io/component-base/version.gitMajor=${major}`,
    `-X k8s.io/component-base/version.gitMinor=${minor}`,
    '-X k8s.io/component-base/version.gitTreeState=clean',
  ].join(' ');
  // One `go build` for all four commands: they share most packages, so they compile once.
  const k8sPackages = K8S_COMMANDS.map((c) => `k8s.io/kubernetes/cmd/${c}`);
  // Measured on 2 shared cores with nothing cached (no modules, no build cache): 6 min 16 s for these
  // four, 1 min 15 s for etcd, 2 min for kwok; `npm start` from a fresh clone was serving after 9 min 41 s.
  await buildInto(K8S_COMMANDS, v.kubernetes, (outDir) =>
    goBuildWithProgress(`Kubernetes ${v.kubernetes} (${K8S_COMMANDS.join(', ')})`, '6 minutes', {
      args: ['build', '-v', '-trimpath', '-ldflags', k8sLdflags, '-o', `${outDir}/`, ...k8sPackages],
      cwd: join(here, 'k8s'),
      env: GO_ENV,
      packages: k8sPackages,
    }),
  );
  // etcd's version is a constant in its source; nothing to stamp.
  await buildInto(['etcd'], v.etcd, (outDir) =>
    goBuildWithProgress(`etcd ${v.etcd}`, '1 minute', {
      args: ['build', '-v', '-trimpath', '-o', join(outDir, 'etcd'), 'go.etcd.io/etcd/server/v3'],
      cwd: join(here, 'etcd'),
      env: GO_ENV,
      packages: ['go.etcd.io/etcd/server/v3'],
    }),
  );
  // kwok's go.mod has no replace directives, so `go install pkg@version` works as it is.
  await buildInto(['kwok', 'kwokctl'], v.kwok, (outDir) =>
    goBuildWithProgress(`kwok ${v.kwok}`, '2 minutes', {
      args: ['install', '-v', '-trimpath', `sigs.k8s.io/kwok/cmd/kwok@${v.kwok}`, `sigs.k8s.io/kwok/cmd/kwokctl@${v.kwok}`],
      cwd: outDir,
      env: { ...GO_ENV, GOBIN: outDir },
    }),
  );
}

// ---------------------------------------------------------------------------------------------
// Cluster

/** Keeps kwokctl's state (and its default config lookup) in our cache, away from ~/.kwok. */
function kwokEnv(v: Versions): Record<string, string> {
  return {
    KWOK_WORKDIR: kwokWorkdir,
    // Only an env var in v0.8.0 (no flag); it picks version-dependent component flags.
    KWOK_KUBE_VERSION: v.kubernetes,
    // `kwokctl kubectl` and friends would otherwise download kubectl.
    KWOK_KUBECTL_BINARY: binPath('kubectl', v.kubernetes),
  };
}

function kwokctl(v: Versions, f: ClusterFiles, args: string[], options: RunOptions = {}): Promise<RunResult> {
  return run(binPath('kwokctl', v.kwok), [...args, '--name', f.name], { ...options, env: kwokEnv(v) });
}

function kubectl(v: Versions, f: ClusterFiles, args: string[], options: RunOptions = {}): Promise<RunResult> {
  return run(binPath('kubectl', v.kubernetes), ['--kubeconfig', f.kubeconfig, '--context', f.context, '--request-timeout=5s', ...args], options);
}

/** Why the cluster is not usable yet, or undefined when it is. */
async function clusterProblem(v: Versions, f: ClusterFiles): Promise<string | undefined> {
  if (!existsSync(f.kubeconfig)) return 'cluster does not exist';
  // kwokctl records each component's pid; one that died (kwok-controller most of all: without it
  // no pod ever leaves Pending) makes the cluster unusable even when the API server answers.
  for (const component of COMPONENTS) {
    const pid = Number(await readFile(join(f.dir, 'pids', `${component}.pid`), 'utf8').catch(() => ''));
    if (!pid || !alive(pid)) return `${component} is not running`;
  }
  const ready = await kubectl(v, f, ['get', '--raw', '/readyz'], { allowFailure: true });
  if (ready.code !== 0) return 'API server not ready';
  const sa = await kubectl(v, f, ['get', 'serviceaccount', 'default', '--namespace', 'default', '--output', 'name'], { allowFailure: true });
  if (sa.code !== 0) return 'default service account missing';
  const nodes = await kubectl(v, f, ['get', 'nodes', '--output', 'json'], { allowFailure: true });
  if (nodes.code !== 0) return 'cannot list nodes';
  const items: Array<{ status?: { conditions?: Array<{ type: string; status: string }> } }> = JSON.parse(nodes.stdout).items;
  const readyNodes = items.filter((n) => n.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')).length;
  if (readyNodes < NODE_COUNT) return `${readyNodes} of ${NODE_COUNT} nodes ready`;
  return undefined;
}

/**
 * What the cluster is made from: the files kwokctl and kwok-controller read, and a record of the
 * versions, each with the content this script wants.
 */
async function kwokInputs(v: Versions, f: ClusterFiles): Promise<Array<{ path: string; content: string }>> {
  return [
    { path: f.kwokctlConfig, content: KWOKCTL_CONFIG },
    { path: f.stageCopy, content: `${await readFile(stageSource, 'utf8')}---\n${clusterLogs(f)}` },
    { path: f.currentLog, content: criLog(CURRENT_LOG) },
    { path: f.previousLog, content: criLog(CRASH_LOG_PREVIOUS) },
    { path: f.versionsRecord, content: `${JSON.stringify(v)}\n` },
  ];
}

/** A cluster made from other versions, config or stages is recreated rather than restarted. */
async function isStale(v: Versions, f: ClusterFiles): Promise<boolean> {
  if (!existsSync(f.kubeconfig)) return false;
  for (const input of await kwokInputs(v, f)) {
    const current = await readFile(input.path, 'utf8').catch(() => '');
    if (current !== input.content) return true;
  }
  return false;
}

async function createCluster(v: Versions, f: ClusterFiles): Promise<void> {
  await mkdir(kwokWorkdir, { recursive: true });
  for (const input of await kwokInputs(v, f)) await writeFile(input.path, input.content);
  // Every binary is named, so kwokctl downloads nothing. --kubeconfig= keeps kwokctl away from
  // ~/.kube/config.
  await kwokctl(v, f, [
    'create', 'cluster',
    '--config', f.kwokctlConfig,
    '--runtime', 'binary',
    '--etcd-binary', binPath('etcd', v.etcd),
    '--kube-apiserver-binary', binPath('kube-apiserver', v.kubernetes),
    '--kube-controller-manager-binary', binPath('kube-controller-manager', v.kubernetes),
    '--kube-scheduler-binary', binPath('kube-scheduler', v.kubernetes),
    '--kwok-controller-binary', binPath('kwok', v.kwok),
    // Tests use service-account tokens bound by RBAC; these are kwokctl's defaults, made explicit.
    '--secure-port=true',
    '--kube-authorization=true',
    '--kube-admission=true',
    // A second --config for kwok-controller: it merges these stages with kwokctl's defaults.
    '--extra-args', `kwok-controller=config=${f.stageCopy}`,
    '--kubeconfig=',
    '--wait', '2m',
  ], { stream: true });
  await kwokctl(v, f, ['scale', 'node', '--replicas', String(NODE_COUNT)], { stream: true });
}

async function waitUsable(v: Versions, f: ClusterFiles, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let problem = await clusterProblem(v, f);
  while (problem) {
    if (Date.now() > deadline) throw new Error(`cluster not usable after ${timeoutMs / 1000} s: ${problem}`);
    await sleep(500);
    problem = await clusterProblem(v, f);
  }
}

/** Self-contained (certificates inlined) JSON kubeconfig for the cluster's context only. */
async function writeKubeconfig(v: Versions, f: ClusterFiles): Promise<void> {
  const { stdout } = await kubectl(v, f, ['config', 'view', '--raw', '--minify', '--flatten', '--output', 'json']);
  await mkdir(dirname(f.jsonKubeconfig), { recursive: true });
  const tmp = `${f.jsonKubeconfig}.${process.pid}.tmp`;
  await writeFile(tmp, stdout, { mode: 0o600 });
  await rename(tmp, f.jsonKubeconfig);
}

// ---------------------------------------------------------------------------------------------
// Cross-process lock: `node --test` runs test files in parallel processes, each may call ensureCluster.

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

async function withLock<T>(body: () => Promise<T>): Promise<T> {
  await mkdir(cacheRoot, { recursive: true });
  for (;;) {
    try {
      await mkdir(lockDir);
      break;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
      const owner = Number(await readFile(join(lockDir, 'pid'), 'utf8').catch(() => ''));
      // A lock without a pid may be one being taken right now; only a dead owner's is stale.
      if (owner && !alive(owner)) await rm(lockDir, { recursive: true, force: true });
      else await sleep(250);
    }
  }
  try {
    await writeFile(join(lockDir, 'pid'), String(process.pid));
    return await body();
  } finally {
    await rm(lockDir, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------------------------------------
// Entry points

export interface Cluster {
  /** JSON kubeconfig with inlined credentials for the cluster-admin user. */
  kubeconfigPath: string;
  /** kubectl of the cluster's own version. */
  kubectl: string;
}

const ensured = new Map<string, Promise<Cluster>>();

/**
 * Starts the cluster if it is not running and answering (idempotent; quick when it is). `name`
 * starts another cluster beside the shared one, with its own ports, data and kubeconfig.
 */
export function ensureCluster(name = CLUSTER_NAME): Promise<Cluster> {
  const f = clusterFiles(name);
  let started = ensured.get(name);
  if (started) return started;
  started = withLock(async () => {
    const v = await versions();
    await ensureBinaries(v);
    if (await isStale(v, f)) {
      log(`cluster ${name} was made from other versions, config or stages: recreating it`);
      await kwokctl(v, f, ['delete', 'cluster'], { stream: true });
    }
    const problem = await clusterProblem(v, f);
    if (problem) {
      // A stopped cluster is made afresh, not restarted: the node leases of the kwok-controller
      // that ran before stay valid for 200 s (kwokctl's 40 s times its heartbeat factor 5), and
      // until they expire the new kwok-controller leaves every new pod Pending.
      if (existsSync(f.kubeconfig)) {
        log(`cluster ${name} is not usable (${problem}): deleting it to start afresh`);
        await kwokctl(v, f, ['delete', 'cluster'], { stream: true });
      }
      log(`starting cluster ${name} (${problem})`);
      await createCluster(v, f);
      await waitUsable(v, f, 120_000);
    }
    await writeKubeconfig(v, f);
    return { kubeconfigPath: f.jsonKubeconfig, kubectl: binPath('kubectl', v.kubernetes) };
  });
  ensured.set(name, started);
  started.catch(() => ensured.delete(name));
  return started;
}

export async function deleteCluster(name = CLUSTER_NAME): Promise<void> {
  const f = clusterFiles(name);
  ensured.delete(name);
  await withLock(async () => {
    const v = await versions();
    if (existsSync(binPath('kwokctl', v.kwok))) await kwokctl(v, f, ['delete', 'cluster'], { stream: true });
    await rm(f.jsonKubeconfig, { force: true });
  });
}

if (import.meta.main) {
  const command = process.argv[2];
  // `up NAME`, `down NAME`: a cluster other than the shared one (as the multi-cluster tests start).
  const name = process.argv[3] ?? CLUSTER_NAME;
  const started = Date.now();
  try {
    if (command === 'up') {
      const cluster = await ensureCluster(name);
      log(`ready in ${((Date.now() - started) / 1000).toFixed(1)} s; kubeconfig: ${cluster.kubeconfigPath}`);
      log(`try: ${cluster.kubectl} --kubeconfig ${cluster.kubeconfigPath} get nodes`);
    } else if (command === 'down') {
      await deleteCluster(name);
      log(`cluster ${name} deleted`);
    } else {
      process.stderr.write('usage: node test/cluster/cluster.ts up|down [NAME]\n');
      process.exitCode = 2;
    }
  } catch (error) {
    process.stderr.write(`[cluster] ${(error as Error).message}\n`);
    process.exitCode = 1;
  }
}
