/*
 * The first five minutes: `npm start` run as a person runs it (HOOK_TOKEN=change-me, no
 * KUBECONFIG), on the real test cluster. It must create the demo Deployment the example seed
 * hook names, print one curl per registry type, and each printed curl, run by the shell exactly as
 * printed, must change the Deployment's image while the log shows the report and the rollout's
 * end; Ctrl-C (SIGINT to the whole process group, as a terminal sends it) stops it cleanly. The
 * seed hook is served as shipped but for its namespace, which is this run's fresh one (the
 * cluster is shared), passed with `npm start -- -hooks DIR`. With KUBECONFIG set, nothing is created.
 */
import assert from 'node:assert/strict';
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { clusterOrSkip, containerImage, freshNamespaceName, kubectlFor, removeNamespace } from './cluster/kube.ts';
import { freePort, makeTempDir, REPO_ROOT, waitFor } from './harness.ts';

const cluster = await clusterOrSkip();

/** How long npm start may take to print its curls: a build of dist/webhook, then the demo's rollout. */
const READY_MS = 180_000;

interface Started {
  proc: ChildProcess;
  output(): string;
  stdout(): string;
  /** Resolves when every process holding its output has exited: the exit code, or the signal's name. */
  exited: Promise<number | string>;
}

/** A command in its own process group (so a SIGINT to the group is what Ctrl-C in a terminal sends). */
function startGroup(command: string, args: string[], env: NodeJS.ProcessEnv): Started {
  const proc = spawn(command, args, { cwd: REPO_ROOT, env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let stdout = '';
  proc.stdout!.setEncoding('utf8').on('data', (s: string) => ((out += s), (stdout += s)));
  proc.stderr!.setEncoding('utf8').on('data', (s: string) => (out += s));
  const exited = new Promise<number | string>((resolve) => proc.on('close', (code, signal) => resolve(code ?? signal!)));
  return { proc, output: () => out, stdout: () => stdout, exited };
}

/** No process of the group is left. */
function groupGone(s: Started): boolean {
  try {
    process.kill(-s.proc.pid!, 0);
    return false;
  } catch {
    return true;
  }
}

async function interrupt(s: Started): Promise<number | string> {
  if (!groupGone(s)) process.kill(-s.proc.pid!, 'SIGINT');
  const timer = setTimeout(() => process.kill(-s.proc.pid!, 'SIGKILL'), 30_000);
  try {
    return await s.exited;
  } finally {
    clearTimeout(timer);
  }
}

/** The example hooks, the seed hook's namespace replaced by `ns`. */
function exampleHooks(ns: string): string {
  const dir = makeTempDir('start-hooks-');
  for (const f of fs.readdirSync(path.join(REPO_ROOT, 'examples', 'hooks'))) {
    const text = fs.readFileSync(path.join(REPO_ROOT, 'examples', 'hooks', f), 'utf8');
    fs.writeFileSync(path.join(dir, f), text.replace('"value": "prod"', `"value": ${JSON.stringify(ns)}`));
  }
  return dir;
}

function baseEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, HOOK_TOKEN: 'change-me' };
  delete env.KUBECONFIG;
  delete env.KUBERNETES_SERVICE_HOST;
  return env;
}

function sh(commandLine: string): Promise<string> {
  return new Promise((resolve, reject) =>
    execFile('sh', ['-c', commandLine], (error, stdout, stderr) => (error ? reject(new Error(`${commandLine}: ${stderr}`)) : resolve(stdout))),
  );
}

describe('npm start', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('start');
  const kubectl = kubectlFor(cluster!);
  let run: Started;
  let curls: string[] = [];

  before(async () => {
    const port = await freePort();
    run = startGroup('npm', ['start', '--', '-port', String(port), '-hooks', exampleHooks(ns)], baseEnv());
    await waitFor(() => /^curl .*repo_type=custom.*$/m.test(run.stdout()) || run.proc.exitCode !== null, {
      timeoutMs: READY_MS,
      what: 'npm start to print its curls',
    });
    curls = run.stdout().split('\n').filter((l) => l.startsWith('curl '));
  });
  after(async () => {
    if (run) await interrupt(run);
    await removeNamespace(kubectl, ns);
  });

  test('creates the demo Deployment the seed hook names and prints one curl per registry type', async () => {
    assert.equal(curls.length, 3, run.output());
    assert.match(run.output(), new RegExp(`^demo: deployment/web in namespace ${ns}, 2 pods on fake nodes, container app = registry\\.cn-hangzhou\\.aliyuncs\\.com/demo/web:v1$`, 'm'));
    // The image pin lets a push change only the tag of the container's repository: the demo's
    // hooks allow the demo repository of each registry type, and say so.
    assert.match(run.output(), /^demo: the hooks may also deploy docker\.io\/demo\/web registry\.cn-hangzhou\.aliyuncs\.com\/demo\/web \(ALLOW_IMAGES/m);
    for (const [i, type] of ['regionalregistry', 'publicregistry', 'custom'].entries()) {
      assert.ok(curls[i].includes(`/hooks/web?token=change-me&ns=${ns}&workload=deployment/web&container=app&repo_type=${type}'`), curls[i]);
    }
    const d = JSON.parse(await kubectl(['-n', ns, 'get', 'deployment/web', '-o', 'json']));
    assert.equal(containerImage(d, 'app'), 'registry.cn-hangzhou.aliyuncs.com/demo/web:v1');
    assert.equal(d.status.availableReplicas, 2);
  });

  test('each printed curl, run as printed, changes the image; the log shows the report and the rollout complete', async () => {
    const expected = ['registry.cn-hangzhou.aliyuncs.com/demo/web:v2', 'demo/web:v3', 'registry.cn-hangzhou.aliyuncs.com/demo/web:v4'];
    for (const [i, curl] of curls.entries()) {
      const logBefore = run.output().length;
      const answer = await sh(curl);
      assert.match(answer, new RegExp(`^image after: +${expected[i].replace(/[./]/g, '\\$&')}$`, 'm'));
      assert.match(answer, /^result: +ok$/m);
      const d = JSON.parse(await kubectl(['-n', ns, 'get', 'deployment/web', '-o', 'json']));
      assert.equal(containerImage(d, 'app'), expected[i]);
      const log = await waitFor(() => {
        const since = run.output().slice(logBefore);
        return /deployment\/web in \S+: rollout complete \(2\/2 pods updated and available\)/.test(since) && since;
      }, { timeoutMs: 90_000, what: `the rollout after push ${i + 1}` });
      assert.match(log, /command output: workload: +deployment\/web in namespace/);
      assert.ok(log.includes(`image after:  ${expected[i]}`), log);
      assert.doesNotMatch(log, /change-me/, 'the token is not logged');
    }
  });

  test('started again at once, the first curl deploys v2 again on a fresh demo Deployment', async () => {
    const logBefore = run.output().length;
    const answer = await sh(curls[0]);
    assert.match(answer, /^action: +image updated$/m);
    assert.match(answer, /^image after: +registry\.cn-hangzhou\.aliyuncs\.com\/demo\/web:v2$/m);
    await waitFor(() => /deployment\/web in \S+: rollout complete/.test(run.output().slice(logBefore)), {
      timeoutMs: 90_000,
      what: 'the rollout of the first push',
    });
    await interrupt(run);
    const port = await freePort();
    // The driver npm start runs, without the build the first start made.
    run = startGroup(process.execPath, ['--disable-warning=ExperimentalWarning', 'scripts/start.ts', '-port', String(port), '-hooks', exampleHooks(ns)], baseEnv());
    await waitFor(() => /^curl .*repo_type=custom.*$/m.test(run.stdout()) || run.proc.exitCode !== null, {
      timeoutMs: READY_MS,
      what: 'the second start to print its curls',
    });
    const again = await sh(run.stdout().split('\n').filter((l) => l.startsWith('curl '))[0]);
    assert.match(again, /^action: +image updated$/m, again);
    assert.match(again, /^image before: +registry\.cn-hangzhou\.aliyuncs\.com\/demo\/web:v1$/m);
    const d = JSON.parse(await kubectl(['-n', ns, 'get', 'deployment/web', '-o', 'json']));
    assert.equal(containerImage(d, 'app'), 'registry.cn-hangzhou.aliyuncs.com/demo/web:v2');
  });

  test('Ctrl-C stops it cleanly', async () => {
    // npm itself ends by the signal, as it does on Ctrl-C; what it ran stops gracefully and exits 0.
    assert.match(String(await interrupt(run)), /^(0|SIGINT)$/);
    assert.match(run.output(), /caught SIGINT, shutting down/);
    assert.match(run.output(), /^\[webhook\] \S+ \S+ stopped$/m);
    assert.match(run.output(), /^The local test cluster keeps running for the next start/m);
    assert.ok(groupGone(run), 'nothing it started is left running');
  });
});

describe('npm start with KUBECONFIG', { skip: cluster ? false : 'no cluster' }, () => {
  test('uses that cluster and creates nothing', async () => {
    const ns = freshNamespaceName('start-kc');
    const port = await freePort();
    // The same driver npm start runs, without the build the test above already made.
    const run = startGroup(process.execPath, ['--disable-warning=ExperimentalWarning', 'scripts/start.ts', '-port', String(port), '-hooks', exampleHooks(ns)], {
      ...baseEnv(),
      KUBECONFIG: cluster!.kubeconfigPath,
    });
    try {
      await waitFor(() => /^curl .*repo_type=custom/m.test(run.stdout()) || run.proc.exitCode !== null, { timeoutMs: 60_000, what: 'the curls' });
      assert.match(run.output(), new RegExp(`Serving .* with the cluster of ${cluster!.kubeconfigPath.replace(/[./]/g, '\\$&')} \\(nothing is created\\)`));
      assert.doesNotMatch(run.output(), /^demo:/m);
      await assert.rejects(kubectl(['get', 'namespace', ns]), /NotFound/);
    } finally {
      assert.equal(await interrupt(run), 0, run.output());
    }
    function kubectl(args: string[]) {
      return kubectlFor(cluster!)(args);
    }
  });
});
