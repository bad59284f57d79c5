/*
 * `npm start`: the webhook serving the example hooks (examples/hooks) against a real cluster, and
 * a ready-to-paste curl per registry type that upgrades a workload through it.
 *
 *   HOOK_TOKEN=change-me npm start                 # the project's local test cluster, a demo Deployment
 *   KUBECONFIG=~/.kube/config HOOK_TOKEN=… npm start    # a cluster of yours: nothing is created
 *   npm start -- -port 9001 -hooks my-hooks/       # any flag of the executable
 *
 * Without KUBECONFIG (and outside a pod) it starts the local test cluster of test/cluster (built
 * from the Go module proxy the first time, with progress), creates what each upgrade hook accepts
 * (the example seed hook: namespace prod, deployment/web, container app) and serves a copy of the
 * hooks that also allows the demo repository of each registry type (the image pin would refuse a
 * push naming another repository than the container's), with that cluster's kubeconfig. With
 * KUBECONFIG the hooks are served as they are. They are read by webhook.ts itself, so the demo follows
 * them: a rule's required values become the curl's query, and the workload it names is created.
 * Ctrl-C stops the service (gracefully, like SIGTERM); the local cluster keeps running for the
 * next start (`npm run cluster:down` deletes it).
 */
import { execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { ensureCluster } from '../test/cluster/cluster.ts';
import {
  listHookFiles, Logger, loadSnapshot, parseCommandLine, requiredMatches, resolveHookCommand, UpgradeService, upgradeInput, UsageError,
  type Hook, type Options, type Param,
} from '../webhook.ts';

const ROOT = path.resolve(import.meta.dirname, '..');
const EXECUTABLE = path.join(ROOT, 'dist', 'webhook');
const EXAMPLES = path.relative(process.cwd(), path.join(ROOT, 'examples', 'hooks')) || '.';
/** What the demo uses where a hook leaves the namespace, workload or container to the request. */
const DEMO = { namespace: 'webhook-demo', workload: 'deployment/web', container: 'app' };
/** The repository the demo Deployment starts with (tag v1); each curl pushes another tag of it. */
const DEMO_REPOSITORY = { host: 'registry.cn-hangzhou.aliyuncs.com', namespace: 'demo', name: 'web' };
/**
 * The demo repository under each registry type's host. The image pin lets a push change only the
 * tag of the repository a container runs, so for the demo's one container to take a push of each
 * type, the demo's hooks allow these repositories (ALLOW_IMAGES) — on the local cluster only.
 */
const DEMO_ALLOWED = `docker.io/${DEMO_REPOSITORY.namespace}/${DEMO_REPOSITORY.name} ${DEMO_REPOSITORY.host}/${DEMO_REPOSITORY.namespace}/${DEMO_REPOSITORY.name}`;
/** How long the service may take to answer /healthz after it was started. */
const READY_TIMEOUT_MS = 15_000;

type Env = Record<string, string | undefined>;

/** One curl the demo prints: what it pushes, where. */
interface Push {
  label: string;
  url: string;
  payload: string;
}

/** A hook running the bundled upgrade: what it changes and the query a request needs to pass its rule. */
interface Target {
  hook: Hook;
  namespace: string;
  kind: string;
  name: string;
  container: string;
  query: Map<string, string>;
  /** The url parameter naming the registry type, or the one type the hook fixes. */
  repoType: { param: string } | { fixed: string } | undefined;
}

function say(text: string): void {
  process.stdout.write(`${text}\n`);
}

/** The executable's arguments: the example hooks unless -hooks is given, -template and -verbose. */
function serviceArguments(userArgs: string[]): string[] {
  const namesHooks = userArgs.some((a) => /^--?hooks(=|$)/.test(a));
  return [...(namesHooks ? [] : ['-hooks', EXAMPLES]), '-template', '-verbose', ...userArgs];
}

/** The arguments without their -hooks flags (`-hooks X`, `--hooks X`, `-hooks=X`). */
function withoutHooks(args: string[]): string[] {
  return args.filter((a, i) => !/^--?hooks(=|$)/.test(a) && !(i > 0 && /^--?hooks$/.test(args[i - 1])));
}

/** Where the upgrade's credentials come from, and the kubectl to create the demo with (local cluster only). */
async function chooseCluster(o: Options, env: Env): Promise<{ kubeconfig?: string; kubectl?: string; what: string }> {
  if (o.kubeconfig || env.KUBECONFIG) return { what: `the cluster of ${o.kubeconfig || env.KUBECONFIG} (nothing is created)` };
  if (env.KUBERNETES_SERVICE_HOST && fs.existsSync('/var/run/secrets/kubernetes.io/serviceaccount/token'))
    return { what: "this pod's cluster, as its service account (nothing is created)" };
  say('No KUBECONFIG: starting the local test cluster (kube-apiserver, controllers, scheduler, kwok fake nodes).');
  try {
    const cluster = await ensureCluster();
    return { kubeconfig: cluster.kubeconfigPath, kubectl: cluster.kubectl, what: 'the local test cluster' };
  } catch (e) {
    throw new Error(
      `the local test cluster could not start: ${(e as Error).message}\n` +
        'It is built with Go from the Go module proxy the first time. Or set KUBECONFIG to a kubeconfig ' +
        '(YAML or JSON, as kubectl reads it: KUBECONFIG=~/.kube/config) to use a cluster of your own.',
    );
  }
}

/** What an upgrade hook changes and how to call it; undefined when a request could not drive it from the URL. */
function targetOf(hook: Hook): Target | undefined {
  const query = new Map<string, string>();
  for (const m of requiredMatches(hook.rule)) {
    if (m.pinned === undefined || !m.param) continue;
    if (m.param.source !== 'url') return undefined;
    query.set(m.param.name, m.pinned);
  }
  const input = (envname: string, fallback: string): string | undefined => {
    const v = upgradeInput(hook, envname);
    if (typeof v === 'string') return v;
    if (!v || v.source !== 'url') return undefined;
    if (!query.has(v.name)) query.set(v.name, fallback);
    return query.get(v.name);
  };
  const namespace = input('APP_NS', DEMO.namespace);
  const workload = input('APP_WORKLOAD', DEMO.workload);
  const container = input('APP_CONTAINER', DEMO.container);
  if (!namespace || !workload || !container || !workload.includes('/')) return undefined;
  const repo = upgradeInput(hook, 'REPO_TYPE');
  const repoType =
    typeof repo === 'string' ? { fixed: repo } : repo && (repo as Param).source === 'url' ? { param: repo.name } : undefined;
  const [kind, name] = workload.split('/');
  return { hook, namespace, kind: kind.toLowerCase(), name, container, query, repoType };
}

/** A push notification of each registry type, each naming another tag of the demo repository. */
function payloads(): Array<{ type: string; label: string; payload: object }> {
  const { host, namespace, name } = DEMO_REPOSITORY;
  return [
    {
      type: 'regionalregistry',
      label: 'Aliyun ACR',
      payload: {
        push_data: { tag: 'v2' },
        repository: { name, namespace, region: 'cn-hangzhou', repo_full_name: `${namespace}/${name}` },
      },
    },
    {
      type: 'publicregistry',
      label: 'Docker Hub',
      payload: { push_data: { tag: 'v3' }, repository: { repo_name: `${namespace}/${name}`, name, namespace } },
    },
    {
      type: 'custom',
      label: 'a build job',
      payload: { push_data: { tag: 'v4' }, repository: { repo_url: host, namespace, name } },
    },
  ];
}

function pushesFor(t: Target, base: string, urlprefix: string): Push[] {
  const enc = (s: string) => encodeURIComponent(s).replace(/%2F/g, '/');
  return payloads()
    .filter((p) => !t.repoType || !('fixed' in t.repoType) || t.repoType.fixed === p.type)
    .map((p) => {
      const query = new Map(t.query);
      if (t.repoType && 'param' in t.repoType) query.set(t.repoType.param, p.type);
      const q = [...query].map(([k, v]) => `${enc(k)}=${enc(v)}`).join('&');
      return {
        label: `${p.label} (repo_type=${p.type})`,
        url: `${base}/${urlprefix}/${enc(t.hook.id)}${q ? `?${q}` : ''}`,
        payload: JSON.stringify(p.payload),
      };
    });
}

/**
 * The hook files as served on the local cluster: copies, in the same order, in which every JSON
 * hook passing an environment also passes ALLOW_IMAGES=DEMO_ALLOWED (first, so a hook's own
 * ALLOW_IMAGES still wins). The files are otherwise untouched, templates included.
 */
function demoHookFiles(paths: string[]): string {
  const dir = fs.mkdtempSync(path.join(tmpdir(), 'webhook-demo-hooks-'));
  process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  const allow = `{ "envname": "ALLOW_IMAGES", "source": "string", "name": ${JSON.stringify(DEMO_ALLOWED)} },`;
  paths.flatMap(listHookFiles).forEach((file, i) => {
    let text = fs.readFileSync(file, 'utf8');
    if (file.endsWith('.json')) text = text.replace(/"pass-environment-to-command"\s*:\s*\[/g, (m) => `${m} ${allow}`);
    fs.writeFileSync(path.join(dir, `${String(i).padStart(3, '0')}-${path.basename(file)}`), text, { mode: 0o600 });
  });
  return dir;
}

function kubectlRun(kubectl: string, kubeconfig: string, args: string[], input?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = execFile(kubectl, ['--kubeconfig', kubeconfig, ...args], (error, stdout, stderr) => {
      if (error) reject(new Error(`kubectl ${args.join(' ')}: ${stderr || error.message}`));
      else resolve(stdout);
    });
    if (input !== undefined) child.stdin!.end(input);
  });
}

/**
 * The demo workloads on the local cluster: each hook's namespace and Deployment, its container
 * running the demo repository's v1: created afresh on every start (records included), so each start's
 * first curl deploys v2 again.
 */
async function createDemo(targets: Target[], kubectl: string, kubeconfig: string): Promise<void> {
  const image = `${DEMO_REPOSITORY.host}/${DEMO_REPOSITORY.namespace}/${DEMO_REPOSITORY.name}:v1`;
  for (const t of targets) {
    const labels = { app: t.name, 'app.kubernetes.io/part-of': 'webhook-demo' };
    const objects = [
      { apiVersion: 'v1', kind: 'Namespace', metadata: { name: t.namespace } },
      {
        apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: t.name, namespace: t.namespace, labels },
        spec: {
          replicas: 2, selector: { matchLabels: { app: t.name } },
          template: {
            metadata: { labels },
            spec: { terminationGracePeriodSeconds: 0, containers: [{ name: t.container, image }] },
          },
        },
      },
    ];
    const list = JSON.stringify({ apiVersion: 'v1', kind: 'List', items: objects });
    // A fresh Deployment each start: one left by an earlier start holds that run's push records,
    // which would make the first curl a "repeated notification" of the push it already applied.
    await kubectlRun(kubectl, kubeconfig, ['-n', t.namespace, 'delete', 'deployment', t.name, '--ignore-not-found', '--wait=true'])
      .catch(() => undefined);
    await kubectlRun(kubectl, kubeconfig, ['apply', '--server-side', '--force-conflicts', '--field-manager=webhook-demo', '-f', '-'], list);
    await kubectlRun(kubectl, kubeconfig, ['-n', t.namespace, 'rollout', 'status', `deployment/${t.name}`, '--timeout=120s']);
    say(`demo: deployment/${t.name} in namespace ${t.namespace}, 2 pods on fake nodes, container ${t.container} = ${image}`);
  }
}

function healthy(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const req = http.get({ host, port, path: '/healthz', agent: false, timeout: 1_000 }, (res) => {
      res.resume();
      resolve(res.statusCode === 200);
    });
    req.on('error', () => resolve(false));
    req.on('timeout', () => req.destroy());
  });
}

/** Starts the executable with its log on our stderr; resolves once it answers /healthz. */
async function startService(args: string[], env: Env, o: Options) {
  const child = spawn(EXECUTABLE, args, { env: env as NodeJS.ProcessEnv, stdio: ['ignore', 'inherit', 'inherit'] });
  const exited = new Promise<number>((resolve) => child.on('close', (code, signal) => resolve(code ?? (signal ? 1 : 0))));
  let gone: number | undefined;
  exited.then((code) => (gone = code));
  const host = o.ip === '0.0.0.0' || o.ip === '' ? '127.0.0.1' : o.ip;
  const deadline = Date.now() + READY_TIMEOUT_MS;
  while (gone === undefined && !(await healthy(host, o.port))) {
    if (Date.now() > deadline) throw new Error(`${EXECUTABLE} did not answer /healthz within ${READY_TIMEOUT_MS / 1000} s`);
    await sleep(100);
  }
  return { child, exited, ready: gone === undefined, base: `http://${host === '127.0.0.1' ? 'localhost' : host}:${o.port}` };
}

function printPushes(targets: Target[], pushes: Push[][]): void {
  say('');
  say('Ready. Paste a push; each upgrades the workload named below, and the log shows the report and then');
  say("the rollout's end. Ctrl-C stops the service.");
  targets.forEach((t, i) => {
    say('');
    say(`# hook "${t.hook.id}": container ${t.container} of ${t.kind}/${t.name} in namespace ${t.namespace}`);
    for (const p of pushes[i]) {
      say(`# ${p.label}`);
      say(`curl -sS -X POST -H 'Content-Type: application/json' '${p.url}' -d '${p.payload}'`);
    }
  });
  say('');
}

async function main(userArgs: string[], env: Env): Promise<number> {
  const args = serviceArguments(userArgs);
  let o: Options;
  try {
    o = parseCommandLine(args, env);
  } catch (e) {
    if (!(e instanceof UsageError)) throw e;
    process.stderr.write(`npm start: ${e.message || 'the flags of dist/webhook -help'}\n`);
    return 2;
  }
  if (o.socket) throw new Error('npm start serves on -ip/-port; -socket is not supported here');
  const serviceEnv: Env = { ...env };
  if (!serviceEnv.HOOK_TOKEN) {
    serviceEnv.HOOK_TOKEN = randomBytes(12).toString('hex');
    say(`HOOK_TOKEN is not set: using ${serviceEnv.HOOK_TOKEN} for this run.`);
  }
  const snapshot = loadSnapshot({ paths: o.hooks, template: o.template, env: serviceEnv, commandTimeoutMs: o.commandTimeoutMs });
  const upgrade = new UpgradeService(undefined, serviceEnv, 0, new Logger(false, false, () => undefined));
  const upgradeHooks = [...snapshot.hooks.values()].filter((h) => resolveHookCommand(h, env.PATH ?? '', upgrade).inProcess);
  const targets = upgradeHooks.flatMap((h) => targetOf(h) ?? []);
  for (const h of upgradeHooks.filter((h) => !targets.some((t) => t.hook === h)))
    say(`note: hook "${h.id}" runs the upgrade, but not for a namespace and workload a URL can name: no curl for it`);

  const cluster = await chooseCluster(o, env);
  if (cluster.kubectl && cluster.kubeconfig) {
    const deployments = targets.filter((t) => t.kind === 'deployment' || t.kind === 'deploy' || t.kind === 'deployments');
    for (const t of targets.filter((t) => !deployments.includes(t)))
      say(`note: the demo creates Deployments only; hook "${t.hook.id}" names ${t.kind}/${t.name}`);
    await createDemo(deployments, cluster.kubectl, cluster.kubeconfig);
  }
  let serviceArgs = args;
  if (cluster.kubectl && cluster.kubeconfig) {
    const served = demoHookFiles(o.hooks);
    serviceArgs = ['-hooks', served, ...withoutHooks(args), '-kubeconfig', cluster.kubeconfig];
    say(`demo: the hooks may also deploy ${DEMO_ALLOWED} (ALLOW_IMAGES, added to their copy in ${served})`);
  }
  say(`Serving ${o.hooks.join(', ')} with ${cluster.what}.`);
  const service = await startService(serviceArgs, serviceEnv, o);
  const stop = (signal: NodeJS.Signals) => service.child.kill(signal);
  process.on('SIGINT', () => stop('SIGINT'));
  process.on('SIGTERM', () => stop('SIGTERM'));
  if (service.ready) printPushes(targets, targets.map((t) => pushesFor(t, service.base, o.urlprefix)));
  const code = await service.exited;
  if (cluster.kubectl) say('The local test cluster keeps running for the next start (npm run cluster:down deletes it).');
  return code;
}

main(process.argv.slice(2), process.env).then(
  (code) => process.exit(code),
  (e: Error) => {
    process.stderr.write(`npm start: ${e.message}\n`);
    process.exit(1);
  },
);
