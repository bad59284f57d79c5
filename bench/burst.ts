/*
 * npm run bench:burst — a monorepo release on the test cluster: 200 pushes (BENCH_PUSHES) for 200
 * different Deployments (BENCH_REPLICAS pods each, default 1) sent at once, through ours
 * (dist/webhook, or BENCH_OURS: the upgrade runs in-process) and through the old stack
 * (adnanh/webhook running bench/old-webhooks.sh, which calls kubectl and jq per push), one hook per
 * Deployment as operators write them (the seed hook's rules and MAIL_TO; no SMTP server in either
 * run, so no mail leaves). Runs alternate between the two, BENCH_ROUNDS rounds (default 1).
 *
 * Measured per run:
 *   - until all patched: from the first push sent until a watch (as the cluster's admin) has seen
 *     every Deployment's container carry its new image; and until every push was answered;
 *   - API requests: from kube-apiserver's own metrics, counted per ServiceAccount (ours and the old
 *     stack's have their own; see apiRequestCounter in test/cluster/kube.ts), from the first push
 *     until every rollout is complete and the account has made no request for 3 s: the whole
 *     cost of the release, rollout follow-up and the old script's pod details included; 429s
 *     (Priority and Fairness rejections) apart;
 *   - peak memory, sampled from /proc every 50 ms: ours, one process (private RssAnon; VmHWM, the
 *     kernel's peak RSS); the old stack, adnanh and every process below it (bash, kubectl, jq)
 *     summed (RssAnon; RSS, which counts shared pages of the same binary once per process);
 *   - CPU time: ours; adnanh plus its reaped children.
 * Each stack runs in a CPU cgroup of its own limited to one CPU (see CPU_CGROUPS), as in a container.
 * BENCH_MEMORY_MB=256 also puts ours in a memory cgroup with that limit, as deploy/ and the chart
 * set it (V8 then sizes its heap to half of it); the run says whether the kernel's OOM killer acted.
 */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';
import * as os from 'node:os';
import * as path from 'node:path';
import {
  apiRequestCounter, clusterOrSkip, deployment, freshNamespaceName, kubectlFor, namespaceAdminAccount,
  shippedServiceAccount, type Kubectl,
} from '../test/cluster/kube.ts';
import { adnanhBinary } from '../test/peer.ts';
import { loadKubeconfig } from '../webhook.ts';
import { cpuTime, HOOK_TOKEN, OURS, ROOT, rss, sleep, startServer, stopServer, type Server } from './common.ts';

const PUSHES = Number(process.env.BENCH_PUSHES ?? 200);
const REPLICAS = Number(process.env.BENCH_REPLICAS ?? 1);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 1);
/**
 * BENCH_STACKS=ours runs ours alone: at 2,000 pushes the old stack (a kubectl per call, ~0.5 s of
 * CPU each) needs far longer than RUN_TIMEOUT_MS; its figure is then the 200-push run's scaled.
 */
const STACKS = (process.env.BENCH_STACKS ?? 'ours,old').split(',');
/**
 * How long the last push may take to be answered, and the rollouts to complete: the test cluster's
 * controllers bring up about 4 pods a second, so a release of 2,000 takes some 10 minutes.
 */
const RUN_TIMEOUT_MS = Math.max(10 * 60_000, PUSHES * REPLICAS * 600);
/** A watch event reaches the watcher within moments of the change; an answered push has changed. */
const WATCH_DELAY_MS = 10_000;
/** An account that has made no request for this long after its rollouts completed is done. */
const QUIET_MS = 3_000;
const SAMPLE_MS = 50;
/**
 * Each stack runs in a CPU cgroup of its own, as in a container with `limits.cpu: 1`
 * (BENCH_CPUS; 0 for no limit): however many processes it starts (200 kubectl at once), together
 * they get at most that much CPU and weigh as one task (cpu.shares 1024) against the test
 * cluster's control plane. On 2 shared cores an unlimited old stack starves the control plane
 * until its controllers lose their leader leases and exit, which breaks the cluster for its
 * other users. Without a writable cgroup v1 cpu hierarchy, nice 19 and no limit instead.
 */
const CPU_CGROUPS = '/sys/fs/cgroup/cpu';
const CPUS = Number(process.env.BENCH_CPUS ?? 1);
const MEMORY_CGROUPS = '/sys/fs/cgroup/memory';
/** The shell moves itself into the cgroup whose cgroup.procs is $0 and exec()s the server there: children inherit it. */
const JOIN_AND_EXEC = 'echo $$ > "$0" && exec "$@"';
const MEMORY_MB = Number(process.env.BENCH_MEMORY_MB ?? 0);

if (spawnSync('jq', ['--version']).error) {
  console.error('bench:burst needs jq for the old stack (bench/old-webhooks.sh): apt-get install -y jq');
  process.exit(1);
}
const cluster = await clusterOrSkip();
if (!cluster) process.exit(1);
const kubectl = kubectlFor(cluster);
const admin = loadKubeconfig(cluster.kubeconfigPath);
/** BENCH_NAMESPACE: a namespace a run left (KEEP_NAMESPACE=1), its Deployments set back to v0 and used again. */
const ns = process.env.BENCH_NAMESPACE ?? freshNamespaceName('bench-burst');
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-burst-'));
const names = Array.from({ length: PUSHES }, (_, i) => `svc-${String(i).padStart(3, '0')}`);
const image = (name: string, tag: string) => `registry.cn-hangzhou.aliyuncs.com/shop/${name}:${tag}`;

// ---------------------------------------------------------------------------------------------
// The release: Deployments, hooks, payloads
// ---------------------------------------------------------------------------------------------

/** One hook per Deployment, the seed hook's shape: token, namespace, workload and container compared. */
function writeHooks(command: string): string {
  const TOKEN_TEMPLATE = '{{ getenv "HOOK_TOKEN" }}';
  const url = (envname: string, name: string) => ({ envname, source: 'url', name });
  const match = (value: string, name: string) => ({ match: { type: 'value', value, parameter: { source: 'url', name } } });
  const hooks = names.map((n) => ({
    id: n,
    'execute-command': command,
    'command-working-directory': work,
    'include-command-output-in-response': true,
    'include-command-output-in-response-on-error': true,
    'trigger-rule-mismatch-http-response-code': 500,
    'pass-arguments-to-command': [{ source: 'entire-payload' }],
    'pass-environment-to-command': [
      url('APP_NS', 'ns'), url('APP_WORKLOAD', 'workload'), url('APP_CONTAINER', 'container'),
      url('REPO_TYPE', 'repo_type'), url('NET_TYPE', 'net_type'),
      { envname: 'MAIL_TO', source: 'string', name: 'ops@example.com' },
    ],
    'trigger-rule': {
      and: [match(TOKEN_TEMPLATE, 'token'), match(ns, 'ns'), match(`deployment/${n}`, 'workload'), match('app', 'container')],
    },
  }));
  const file = path.join(work, `hooks-${path.basename(command)}.json`);
  // Bare quotes in the template, as adnanh's own templates write them (see writeHooksFile in common.ts).
  fs.writeFileSync(file, JSON.stringify(hooks, null, 2).replaceAll(JSON.stringify(TOKEN_TEMPLATE), `"${TOKEN_TEMPLATE}"`));
  return file;
}

/** Aliyun ACR's push payload for shop/<name>:<tag>. */
function payload(name: string, tag: string): string {
  return JSON.stringify({
    push_data: { digest: `sha256:${'0'.repeat(64)}`, pushed_at: new Date().toISOString().slice(0, 19).replace('T', ' '), tag },
    repository: {
      name, namespace: 'shop', region: 'cn-hangzhou', repo_full_name: `shop/${name}`, repo_type: 'PRIVATE',
      repo_authentication_type: 'NO_CERTIFIED', repo_origin_type: 'NO_CERTIFIED', date_created: '2016-10-28 21:31:42',
    },
  });
}

/**
 * A push as a registry delivers it: a 503 with Retry-After (every slot busy: more upgrades in
 * flight than the service takes at once, 256) is sent again after that many seconds, as
 * registries retry a failed delivery; `retries` counts them.
 */
async function deliver(port: number, name: string, tag: string): Promise<{ status: number; body: string; at: number; retries: number }> {
  for (let retries = 0; ; retries++) {
    const answer = await push(port, name, tag);
    const wait = Number(/^Retry-After: (\d+)$/m.exec(answer.headers)?.[1]);
    if (answer.status !== 503 || !(wait >= 0) || retries >= 20) return { ...answer, retries };
    await sleep(wait * 1000);
  }
}

function push(port: number, name: string, tag: string): Promise<{ status: number; body: string; at: number; headers: string }> {
  const query = new URLSearchParams({ token: HOOK_TOKEN, ns, workload: `deployment/${name}`, container: 'app', repo_type: 'regionalregistry' });
  const body = payload(name, tag);
  return new Promise((resolve) => {
    const headers = { 'Content-Type': 'application/json', 'Content-Length': String(Buffer.byteLength(body)) };
    const req = http.request({ host: '127.0.0.1', port, path: `/hooks/${name}?${query}`, method: 'POST', agent: false, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      const headers = `Retry-After: ${res.headers['retry-after'] ?? ''}`;
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString(), at: performance.now(), headers }));
    });
    req.on('error', (e) => resolve({ status: 0, body: e.message, at: performance.now(), headers: '' }));
    req.setTimeout(RUN_TIMEOUT_MS, () => req.destroy(new Error('no answer')));
    req.end(body);
  });
}

// ---------------------------------------------------------------------------------------------
// Watching the cluster (as its admin, whose requests are exempt and not counted)
// ---------------------------------------------------------------------------------------------

async function deployments(): Promise<any[]> {
  return JSON.parse(await kubectl(['-n', ns, 'get', 'deployments', '-o', 'json'])).items;
}

const appImage = (d: any): string => d.spec.template.spec.containers.find((c: any) => c.name === 'app').image;

/** Resolves with the time at which every Deployment's app container was seen with its image for `tag`. */
async function watchPatched(tag: string): Promise<{ done: Promise<number>; stop: () => void }> {
  const list = JSON.parse(await kubectl(['-n', ns, 'get', 'deployments', '-o', 'json']));
  const seen = new Set<string>();
  let resolve!: (t: number) => void;
  const done = new Promise<number>((r) => (resolve = r));
  const url = `${admin.server}/apis/apps/v1/namespaces/${ns}/deployments?watch=1&resourceVersion=${list.metadata.resourceVersion}`;
  const req = https.get(url, { ca: admin.ca, cert: admin.cert, key: admin.key }, (res) => {
    let buffered = '';
    res.setEncoding('utf8');
    res.on('data', (chunk: string) => {
      buffered += chunk;
      for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n')) {
        const event = JSON.parse(buffered.slice(0, nl));
        buffered = buffered.slice(nl + 1);
        const d = event.object;
        if (event.type === 'MODIFIED' && appImage(d) === image(d.metadata.name, tag)) seen.add(d.metadata.name);
        if (seen.size === PUSHES) resolve(performance.now());
      }
    });
  });
  req.on('error', () => undefined);
  return { done, stop: () => req.destroy() };
}

/** Waits until every Deployment has rolled out its current template (kubectl's rules). */
async function rolledOut(): Promise<void> {
  const complete = (d: any) => d.status.observedGeneration >= d.metadata.generation &&
    (d.status.updatedReplicas ?? 0) === d.spec.replicas && (d.status.replicas ?? 0) === d.spec.replicas &&
    (d.status.availableReplicas ?? 0) === d.spec.replicas;
  for (const deadline = Date.now() + RUN_TIMEOUT_MS; ;) {
    const pending = (await deployments()).filter((d) => !complete(d)).length;
    if (pending === 0) return;
    if (Date.now() > deadline) throw new Error(`${pending} rollouts still in progress`);
    await sleep(1000);
  }
}

// ---------------------------------------------------------------------------------------------
// Memory of a process and everything below it, from /proc
// ---------------------------------------------------------------------------------------------

/** The pid and every descendant of it that is running now. */
function processTree(root: number): number[] {
  const children = new Map<number, number[]>();
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(entry)]);
    } catch {
      /* exited meanwhile */
    }
  }
  const tree = [root];
  for (let i = 0; i < tree.length; i++) tree.push(...(children.get(tree[i]) ?? []));
  return tree;
}

interface MemoryPeak { anon: number; rss: number; processes: number; stop(): void }

function watchTreeMemory(root: number): MemoryPeak {
  const peak: MemoryPeak = { anon: 0, rss: 0, processes: 0, stop: () => clearInterval(timer) };
  const sample = () => {
    let anon = 0;
    let resident = 0;
    const tree = processTree(root);
    for (const pid of tree) {
      try {
        const m = rss(pid);
        if (Number.isNaN(m.anon)) continue; // a zombie
        anon += m.anon;
        resident += m.anon + m.file;
      } catch {
        /* exited meanwhile */
      }
    }
    peak.anon = Math.max(peak.anon, anon);
    peak.rss = Math.max(peak.rss, resident);
    peak.processes = Math.max(peak.processes, tree.length);
  };
  const timer = setInterval(sample, SAMPLE_MS);
  sample();
  return peak;
}

// ---------------------------------------------------------------------------------------------
// A container's worth of CPU
// ---------------------------------------------------------------------------------------------

interface CpuBox {
  /** The command and arguments that start `bin` in the box (its pid stays the server's). */
  command(bin: string): { bin: string; prefix: string[] };
  remove(): Promise<void>;
}

function cpuBox(name: string): CpuBox {
  const dir = path.join(CPU_CGROUPS, `webhook-bench-${name}-${process.pid}`);
  try {
    fs.mkdirSync(dir);
    fs.writeFileSync(path.join(dir, 'cpu.shares'), '1024');
    const period = Number(fs.readFileSync(path.join(dir, 'cpu.cfs_period_us'), 'utf8'));
    if (CPUS > 0) fs.writeFileSync(path.join(dir, 'cpu.cfs_quota_us'), String(Math.round(CPUS * period)));
  } catch (e) {
    console.error(`no CPU cgroup (${(e as Error).message}): the stacks run under nice 19 instead`);
    return { command: (bin) => ({ bin: 'nice', prefix: ['-n', '19', bin] }), remove: async () => undefined };
  }
  const procs = path.join(dir, 'cgroup.procs');
  return {
    command: (bin) => ({ bin: '/bin/sh', prefix: ['-c', JOIN_AND_EXEC, procs, bin] }),
    async remove() {
      for (let i = 0; ; i++) {
        const left = fs.readFileSync(procs, 'utf8').split('\n').filter(Boolean).map(Number);
        if (left.length === 0 || i === 50) break;
        // What the server left running (the old script's sleeping shells) ends with the run.
        for (const pid of left) {
          try {
            process.kill(pid, 'SIGKILL');
          } catch {
            /* gone meanwhile */
          }
        }
        await sleep(100);
      }
      fs.rmdirSync(dir);
    },
  };
}

/**
 * A memory cgroup (v1) limited to MEMORY_MB, as a container's `limits.memory`: `command` joins it and
 * exec()s; `oomKills` reads how often the kernel's OOM killer acted in it.
 */
interface MemoryBox {
  command(bin: string): { bin: string; prefix: string[] };
  oomKills(): number;
  remove(): void;
}

function memoryBox(name: string): MemoryBox {
  const dir = path.join(MEMORY_CGROUPS, `webhook-bench-${name}-${process.pid}`);
  fs.mkdirSync(dir);
  fs.writeFileSync(path.join(dir, 'memory.limit_in_bytes'), String(MEMORY_MB * 1024 * 1024));
  return {
    command: (bin) => ({ bin: '/bin/sh', prefix: ['-c', JOIN_AND_EXEC, path.join(dir, 'cgroup.procs'), bin] }),
    oomKills: () => Number(/^oom_kill (\d+)$/m.exec(fs.readFileSync(path.join(dir, 'memory.oom_control'), 'utf8'))?.[1]),
    remove: () => fs.rmdirSync(dir),
  };
}

// ---------------------------------------------------------------------------------------------
// One run
// ---------------------------------------------------------------------------------------------

type Counter = Awaited<ReturnType<typeof apiRequestCounter>>;

interface Stack {
  who: 'ours' | 'old stack';
  start(): Promise<Server>;
  counter: Counter;
  landed(answer: { status: number; body: string }): boolean;
  /** BENCH_MEMORY_MB: how often the OOM killer has acted in the stack's memory cgroup. */
  oomKills?: () => number;
}

interface RunResult {
  patchedS: number;
  /** Deliveries sent again after a 503 (all command slots busy), as a registry retries them. */
  retried: number;
  answeredS: number;
  landed: number;
  requests: number;
  rejected: number;
  anonMB: number;
  rssMB: number;
  processes: number;
  cpuS: number;
}

/** Waits until the account has made no request for QUIET_MS; returns its count then. */
async function quiet(counter: Counter): Promise<{ dispatched: number; rejected: number }> {
  let last = await counter.count();
  for (;;) {
    await sleep(QUIET_MS);
    const now = await counter.count();
    if (now.dispatched === last.dispatched && now.rejected === last.rejected) return now;
    last = now;
  }
}

async function run(stack: Stack, tag: string): Promise<RunResult> {
  const server = await stack.start();
  const memory = watchTreeMemory(server.proc.pid!);
  try {
    return await measure(stack, server, memory, tag);
  } finally {
    memory.stop();
    await stopServer(server);
  }
}

async function measure(stack: Stack, server: Server, memory: MemoryPeak, tag: string): Promise<RunResult> {
  const pid = server.proc.pid!;
  const before = await stack.counter.count();
  const cpuBefore = cpuTime(pid);
  const watch = await watchPatched(tag);
  const t0 = performance.now();
  const answers = await Promise.all(names.map((n) => deliver(server.port, n, tag)));
  // Both stacks answer after their patch: what has not landed by now (and the watch's delay) never will.
  const patchedAt = await Promise.race([watch.done, sleep(WATCH_DELAY_MS).then(() => NaN)]);
  watch.stop();
  const bad = answers.filter((a) => !stack.landed(a));
  if (bad.length) console.error(`${stack.who}: ${bad.length} unexpected answers, e.g. ${bad[0].status} ${bad[0].body.slice(0, 300)}`);
  // Each distinct outcome of them once, with how many had it: its `result:` line (ours) or last line (the old script's).
  const why = new Map<string, number>();
  for (const a of bad) {
    const line = /^result: +(.*)$/m.exec(a.body)?.[1] ?? a.body.trim().split('\n').at(-1) ?? '';
    why.set(line, (why.get(line) ?? 0) + 1);
  }
  for (const [line, n] of why) console.error(`  ${n} × ${line.slice(0, 400)}`);
  await rolledOut();
  const after = await quiet(stack.counter);
  const cpu = cpuTime(pid);
  const landed = (await deployments()).filter((d) => appImage(d) === image(d.metadata.name, tag)).length;
  return {
    patchedS: (patchedAt - t0) / 1000,
    retried: answers.reduce((sum, a) => sum + a.retries, 0),
    answeredS: (Math.max(...answers.map((a) => a.at)) - t0) / 1000,
    landed,
    requests: after.dispatched - before.dispatched + after.rejected - before.rejected,
    rejected: after.rejected - before.rejected,
    anonMB: memory.anon,
    // One process: the kernel's own peak; a tree: the sampled peak of the sum.
    rssMB: stack.who === 'ours' ? rss(pid).hwm : memory.rss,
    processes: memory.processes,
    cpuS: (cpu.self - cpuBefore.self + cpu.children - cpuBefore.children) / 1000,
  };
}

// ---------------------------------------------------------------------------------------------
// Set-up, the runs, the table
// ---------------------------------------------------------------------------------------------

/** A directory for the old stack's PATH with the cluster's own kubectl in it, before the system's jq. */
function oldStackPath(): string {
  const bin = path.join(work, 'bin');
  fs.mkdirSync(bin);
  fs.symlinkSync(cluster!.kubectl, path.join(bin, 'kubectl'));
  return `${bin}:/usr/local/bin:/usr/bin:/bin`;
}

/** What set-up created, undone in reverse order at the end (KEEP_NAMESPACE=1 keeps it). */
const cleanUps: (() => Promise<unknown>)[] = [];

/**
 * The test cluster's kwok nodes hold 110 pods each (a kubelet's default); a release of more pods
 * than they hold gets a fake node of its own that holds them all (kwok keeps it Ready), removed
 * at the end.
 */
async function roomFor(k: Kubectl, pods: number): Promise<void> {
  const nodes = JSON.parse(await k(['get', 'nodes', '-o', 'json'])).items;
  const room = nodes.reduce((sum: number, n: any) => sum + Number(n.status?.allocatable?.pods ?? 0), 0);
  // A rolling update surges: each Deployment's new pod runs beside its old one for a while.
  if (2 * pods + 50 <= room) return;
  const name = `bench-${ns}`;
  const capacity = { cpu: '1000', memory: '4Ti', pods: String(2 * pods + 100) };
  await k(['create', '-f', '-'], JSON.stringify({
    apiVersion: 'v1', kind: 'Node',
    metadata: { name, annotations: { 'kwok.x-k8s.io/node': 'fake', 'node.alpha.kubernetes.io/ttl': '0' },
      labels: { type: 'kwok', 'kubernetes.io/hostname': name, 'kubernetes.io/role': 'agent' } },
    spec: {}, status: { allocatable: capacity, capacity },
  }));
  cleanUps.push(() => k(['delete', 'node', name, '--wait=false']));
}

async function setUp(k: Kubectl): Promise<{ ours: Stack; old: Stack }> {
  if (!process.env.BENCH_NAMESPACE) await k(['create', 'namespace', ns]);
  cleanUps.push(() => k(['delete', 'namespace', ns, '--wait=false']));
  await roomFor(k, PUSHES * REPLICAS);
  const items = names.map((n) => deployment(n, [{ name: 'app', image: image(n, 'v0') }], { replicas: REPLICAS }));
  await k(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
  // The token outlives the whole run: setting up 2,000 Deployments and their rollouts take some 20 minutes.
  const tokenDuration = `${Math.ceil((2 * RUN_TIMEOUT_MS) / 60_000) + 30}m`;
  const sa = await shippedServiceAccount(k, cluster!, ns, [path.join(ROOT, 'deploy', 'serviceaccount.yaml'),
    path.join(ROOT, 'deploy', 'rbac-cluster.yaml')], work, tokenDuration);
  cleanUps.push(sa.remove);
  const old = await namespaceAdminAccount(k, cluster!, ns, 'old-webhook', path.join(work, 'old-kubeconfig.json'));
  const oursCounter = await apiRequestCounter(k, ns, 'webhook', loadKubeconfig(sa.kubeconfig));
  cleanUps.push(oursCounter.remove);
  const oldCounter = await apiRequestCounter(k, ns, 'old-webhook', loadKubeconfig(old.kubeconfig));
  cleanUps.push(oldCounter.remove);
  const oldEnv = { PATH: oldStackPath(), HOME: path.join(work, 'home'), KUBECONFIG: old.kubeconfig };
  // kubectl's discovery cache, warm as in an old container that has served a push before.
  spawnSync('kubectl', ['get', 'deployments', '-o', 'name'], { env: { ...process.env, ...oldEnv } });
  const adnanh = await adnanhBinary();
  const box = cpuBox(ns);
  cleanUps.push(box.remove);
  const memory = MEMORY_MB > 0 ? memoryBox(ns) : undefined;
  if (memory) cleanUps.push(async () => memory.remove());
  const boxed = (who: 'ours' | 'adnanh', bin: string, hooks: string, env: Record<string, string>) => {
    const m = who === 'ours' ? memory?.command(bin) : undefined;
    const c = box.command(m?.bin ?? bin);
    // Every push of the release may be in flight at once (each waits its turn at the client's rate).
    return startServer(who, c.bin, hooks, false, [...c.prefix, ...(m?.prefix ?? [])], env, Math.max(1000, PUSHES));
  };
  const oursHooks = writeHooks(path.join(ROOT, 'webhooks.sh'));
  const oldHooks = writeHooks(path.join(ROOT, 'bench', 'old-webhooks.sh'));
  return {
    ours: {
      who: 'ours',
      // The image's environment (Dockerfile): malloc's setting included.
      start: () => boxed('ours', OURS, oursHooks, { KUBECONFIG: sa.kubeconfig, MALLOC_MMAP_THRESHOLD_: '65536' }),
      counter: oursCounter,
      landed: (a) => a.status === 200 && /^action: +image updated$/m.test(a.body),
      oomKills: memory?.oomKills,
    },
    old: {
      who: 'old stack',
      start: () => boxed('adnanh', adnanh, oldHooks, oldEnv),
      counter: oldCounter,
      landed: (a) => a.status === 200 && / image updated$/m.test(a.body),
    },
  };
}

function table(ours: RunResult[], old: RunResult[]): string {
  const median = (xs: number[]) => {
    const s = [...xs].sort((a, b) => a - b);
    return (s[(s.length - 1) >> 1] + s[s.length >> 1]) / 2;
  };
  const rows: [string, (r: RunResult) => number, number, string?][] = [
    [`until all ${PUSHES} patched (s)`, (r) => r.patchedS, 1],
    [`until all ${PUSHES} answered (s)`, (r) => r.answeredS, 1],
    [`pushes landed (of ${PUSHES})`, (r) => r.landed, 0, ''],
    ['API requests', (r) => r.requests, 0],
    ['  of which 429 (APF)', (r) => r.rejected, 0, ''],
    ['peak private memory, RssAnon (MB)', (r) => r.anonMB, 0],
    ['peak resident memory (MB)', (r) => r.rssMB, 0],
    ['peak processes', (r) => r.processes, 0, ''],
    ['CPU time (s)', (r) => r.cpuS, 1],
  ];
  const lines = [`${''.padEnd(36)}${'ours'.padStart(10)}${'old stack'.padStart(12)}${'old/ours'.padStart(10)}`];
  if (old.length === 0) lines[0] = `${''.padEnd(36)}${'ours'.padStart(10)}${'per push'.padStart(12)}`;
  for (const [label, f, digits, ratio] of rows) {
    const a = median(ours.map(f));
    if (old.length === 0) {
      lines.push(`${label.padEnd(36)}${a.toFixed(digits).padStart(10)}${(label === 'API requests' ? (a / PUSHES).toFixed(2) : '').padStart(12)}`);
      continue;
    }
    const b = median(old.map(f));
    const r = ratio ?? (a > 0 ? `${(b / a).toFixed(1)}x` : '-');
    lines.push(`${label.padEnd(36)}${a.toFixed(digits).padStart(10)}${b.toFixed(digits).padStart(12)}${r.padStart(10)}`);
  }
  return lines.join('\n');
}

const results = { ours: [] as RunResult[], old: [] as RunResult[] };
try {
  const { ours, old } = await setUp(kubectl);
  await rolledOut();
  for (let round = 0; round < ROUNDS; round++) {
    const order = (round % 2 === 0 ? [ours, old] : [old, ours]).filter((st) => STACKS.includes(st === ours ? 'ours' : 'old'));
    for (const stack of order) {
      const r = await run(stack, `r${round}-${stack === ours ? 'ours' : 'old'}`);
      (stack === ours ? results.ours : results.old).push(r);
      console.error(`round ${round + 1}, ${stack.who}: ${JSON.stringify(r)}`);
      if (stack.oomKills) console.error(`memory limit ${MEMORY_MB} MB: the OOM killer acted ${stack.oomKills()} time(s)`);
    }
  }
} finally {
  if (!process.env.KEEP_NAMESPACE) for (const undo of cleanUps.reverse()) await undo().catch(() => undefined);
  fs.rmSync(work, { recursive: true, force: true });
}
console.log(`${PUSHES} pushes at once for ${PUSHES} Deployments (${REPLICAS} replica(s) each) on the kwok test cluster, ` +
  `each stack limited to ${CPUS || 'unlimited'} CPU, median of ${ROUNDS} round(s):`);
console.log(table(results.ours, results.old));
