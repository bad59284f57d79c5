/*
 * npm run bench:git — Git write-back under load, through the built executable on the test cluster: 200 pushes at
 * once for 200 Deployments whose manifests live in one repository of 10,000 files (served by git's own
 * http-backend, test/git-server.ts), each hook committing its own manifest. Printed: pushes committed, commits on
 * the branch, seconds from the first push to the last answer, requests to the Git server, and the service's peak
 * memory (VmHWM). Then the same against a repository with a large history (BENCH_GIT_HISTORY_MB, 200 by default,
 * of incompressible blobs since deleted): a depth-1 fetch without blobs must not follow the history's size.
 *
 * BENCH_GIT_PUSHES (200) and BENCH_GIT_FILES (10,000) change the sizes.
 */
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { acrImage, acrPayload, clusterOrSkip, deployment, freshNamespaceName, kubectlFor } from '../test/cluster/kube.ts';
import { git, makeRepository, startGitServer } from '../test/git-server.ts';
import { makeTempDir, startWebhook } from '../test/harness.ts';
import { upgradeHook } from '../test/upgrade-hooks.ts';

const PUSHES = Number(process.env.BENCH_GIT_PUSHES ?? 200);
const FILES = Number(process.env.BENCH_GIT_FILES ?? 10_000);
const HISTORY_MB = Number(process.env.BENCH_GIT_HISTORY_MB ?? 200);
const HOOK_TOKEN = 'bench-git-hook-8c1f';
const GIT_TOKEN = 'bench-git-token-2b7d';

const cluster = await clusterOrSkip();
if (!cluster) process.exit(1);
const kubectl = kubectlFor(cluster);
const ns = freshNamespaceName('bench-git');
await kubectl(['create', 'namespace', ns]);
const names = Array.from({ length: PUSHES }, (_, i) => `app-${i}`);
const items = names.map((n) => deployment(n, [{ name: 'app', image: acrImage('v1') }], { replicas: 1 }));
await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));

const manifest = (name: string) =>
  `# ${name}\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: ${name}\nspec:\n  template:\n    spec:\n` +
  `      containers:\n        - name: app\n          image: ${acrImage('v1')} # by webhook\n`;

/** A repository of FILES files, PUSHES of them the manifests; `history` MB of deleted blobs behind its head. */
function repository(root: string, name: string, historyMb: number): string {
  const files: Record<string, string> = {};
  for (const n of names) files[`apps/${n}.yaml`] = manifest(n);
  for (let i = Object.keys(files).length; i < FILES; i++) files[`other/${Math.floor(i / 1000)}/file-${i}.yaml`] = `n: ${i}\n`;
  const bare = makeRepository(root, name, files, 1);
  if (historyMb > 0) {
    const work = path.join(root, `${name}-work`);
    for (let mb = 0; mb < historyMb; mb += 10) {
      fs.writeFileSync(path.join(work, 'history.bin'), randomBytes(10 * 1024 * 1024));
      git(work, ['add', 'history.bin']);
      git(work, ['commit', '-qm', `history ${mb}`]);
    }
    git(work, ['rm', '-q', 'history.bin']);
    git(work, ['commit', '-qm', 'history removed']);
    git(work, ['push', '-q', bare, 'main']);
    git(bare, ['gc', '-q']);
  }
  return bare;
}

async function run(label: string, historyMb: number): Promise<string> {
  const root = makeTempDir('bench-git-');
  const bare = repository(root, 'deploy', historyMb);
  const packed = git(bare, ['count-objects', '-vH']).match(/size-pack: (.*)/)?.[1] ?? '?';
  const server = await startGitServer(root, 'x-access-token', GIT_TOKEN);
  const repo = `${server.base}/deploy.git`;
  const hooks = names.map((n) => upgradeHook(n, HOOK_TOKEN, { APP_NS: ns, APP_WORKLOAD: `deployment/${n}`, GIT_REPO: repo, GIT_PATH: `apps/${n}.yaml`, GIT_TOKEN }));
  const wh = await startWebhook({ hooks, env: { KUBECONFIG: cluster!.kubeconfigPath, PATH: '/nonexistent' }, verbose: false });
  const before = Number(git(bare, ['rev-list', '--count', 'main']).trim());
  const started = Date.now();
  const answers = await Promise.all(names.map((n) => wh.request(`/hooks/${n}?${new URLSearchParams({
    token: HOOK_TOKEN, ns, workload: `deployment/${n}`, container: 'app', repo_type: 'regionalregistry',
  })}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload('v2') })));
  const seconds = (Date.now() - started) / 1000;
  const committed = answers.filter((a) => /^action: +committed /m.test(a.body)).length;
  const commits = Number(git(bare, ['rev-list', '--count', 'main']).trim()) - before;
  const peak = Number(/^VmHWM:\s+(\d+) kB$/m.exec(fs.readFileSync(`/proc/${wh.proc.pid}/status`, 'utf8'))![1]);
  const failed = answers.find((a) => !/^action: +committed /m.test(a.body));
  if (failed) console.error(`a push not committed:\n${failed.body}`);
  await wh.stop();
  await server.close();
  fs.rmSync(root, { recursive: true, force: true });
  const row = [label, packed, `${committed}/${PUSHES}`, commits, seconds.toFixed(1), server.requests.length,
    `${Math.round(peak / 1024)} MiB`];
  return `| ${row.join(' | ')} |`;
}

console.log(`| repository (${FILES} files) | packed | committed | commits | seconds | requests to git | peak memory |`);
console.log('|---|---|---|---|---|---|---|');
console.log(await run('short history', 0));
await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
console.log(await run(`${HISTORY_MB} MB of history`, HISTORY_MB));
await kubectl(['delete', 'namespace', ns, '--wait=false']);
