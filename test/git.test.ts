/*
 * Git write-back without a git program. The pure parts against git's own output: pkt-lines, packs git wrote (OFS
 * and REF deltas), packs and trees this file writes checked by git, the edit of one YAML scalar in a manifest, a
 * kustomization and a Helm values file. Then the smart-HTTP client against git's own `git http-backend` (a CGI
 * behind test/git-server.ts, basic auth, a history packed by `git gc --aggressive`): a fetch with and without
 * filters, a refusal, a wrong token, garbage and a truncated pack, a 50 MB file. Then through the built
 * executable, with no git on its PATH, on the test cluster: an applied push committed instead of patched (checked
 * with git: one commit, parent the old head, only the image line changed, `git fsck --strict` clean), a
 * kustomization and a Helm values file, a commit made by a pre-receive hook between the read and the push, a push
 * refused by a pre-receive hook and a wrong token (a clear error, nothing changed, no token in the answer or log),
 * a tree 10,000 entries wide and a truncated pack; the commit recorded on the workload (its push record, an
 * ImageCommitted Event, an approved push's pending entry taken off); under ON_OUTSIDE_CHANGE=hold, the test playing
 * the GitOps tool is no outside change and a person's kubectl set image is; the wait for the sync watching the
 * workload, and the tool that applied the commit named by its field manager.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import * as zlib from 'node:zlib';
import { after, before, describe, test } from 'node:test';
import {
  approvalToken, commitMessage, editGitFile, fetchGitFile, fetchGitFiles, gitObjectId, gitopsApplier, gitopsOwner, GitError, holdDecision, imageFieldPath, HOOK_SETTINGS, locatedYaml, parsePktLines, pktLine,
  pushGitCommit, WorkloadQueue, readPack, readSshSigningKey, readTree, replaceInTree, writePack, type GitEdit, type GitRemote, type PushEdit,
} from '../webhook.ts';
import { git, makeRepository, startGitServer, type GitServer } from './git-server.ts';
import { adminPort, httpRequest, leaks, makeTempDir, startWebhook, waitFor, type Webhook } from './harness.ts';
import { acrImage, acrPayload, clusterOrSkip, containerImage, crashLoopInForce, deployment, freshNamespaceName, kubectlFor, removeNamespace } from './cluster/kube.ts';
import { upgradeHook } from './upgrade-hooks.ts';

/** A 50 MB file committed to `bare`'s main through its working copy `<root>/deploy-work`. */
function commitBigFile(root: string, bare: string): void {
  const work = path.join(root, 'deploy-work');
  git(work, ['pull', '-q', bare, 'main']);
  fs.writeFileSync(path.join(work, 'big.yaml'), Buffer.alloc(50 * 1024 * 1024, 'a'));
  git(work, ['add', 'big.yaml']);
  git(work, ['commit', '-qm', 'a big file']);
  git(work, ['push', '-q', bare, 'main']);
}

const MANIFEST = `# the web app: its image is written by webhook
apiVersion: v1
kind: Service
metadata:
  name: web
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web   # the workload
  namespace: shop
spec:
  template:
    spec:
      initContainers:
        - name: app
          image: "reg.example/shop/init:v1"
      containers:
        - name: sidecar
          image: reg.example/shop/proxy:v9
        - name: app
          # pinned by CI
          image: 'reg.example/shop/app:v1'   # keep this comment
          ports: [{ containerPort: 80 }]
`;

const edit = (over: Partial<GitEdit>): string =>
  editGitFile({
    file: 'apps/web.yaml',
    text: MANIFEST,
    target: { kind: 'deployment', name: 'web', namespace: 'shop' },
    container: 'app',
    image: 'reg.example/shop/app:v2',
    field: undefined,
    ...over,
  });

/** The lines of `after` that differ from `before` (same number of lines). */
const changedLines = (before: string, after: string) => {
  const a = before.split('\n');
  const b = after.split('\n');
  return b.map((line, i) => [a[i], line]).filter(([x, y]) => x !== y);
};

describe('a workload a GitOps tool owns', () => {
  test("Argo CD's, Flux's and Fleet's labels and annotations are recognised; Helm's own labels are not", () => {
    const meta = (metadata: object) => ({ metadata });
    assert.equal(gitopsOwner(meta({ annotations: { 'argocd.argoproj.io/tracking-id': 'web:apps/Deployment:shop/web' } })),
      'Argo CD (annotation argocd.argoproj.io/tracking-id)');
    assert.equal(gitopsOwner(meta({ labels: { 'helm.toolkit.fluxcd.io/name': 'web' } })), 'Flux (label helm.toolkit.fluxcd.io/name)');
    assert.equal(gitopsOwner(meta({ managedFields: [{ manager: 'kustomize-controller' }] })), undefined, 'a copy has no managedFields');
    assert.equal(gitopsOwner(meta({ labels: { 'objectset.rio.cattle.io/hash': 'abc' } })), 'Fleet (label objectset.rio.cattle.io/hash)');
    assert.equal(gitopsOwner(meta({ labels: { 'app.kubernetes.io/instance': 'web', 'app.kubernetes.io/managed-by': 'Helm' } })), undefined);
    assert.equal(HOOK_SETTINGS.ON_GITOPS_OWNER.parse(undefined), 'refuse');
    assert.throws(() => HOOK_SETTINGS.ON_GITOPS_OWNER.parse('ignore'), /ON_GITOPS_OWNER "ignore" is not refuse or patch/);
  });
  /** A Deployment whose container app runs `image`, its image set last by `manager` (after kubectl's apply). */
  const appliedBy = (manager: string, image = 'reg.example/shop/app:v2') => ({
    metadata: { managedFields: [
      { manager: 'kubectl-client-side-apply', operation: 'Update', time: '2026-11-27T10:00:00Z', fieldsV1: { 'f:metadata': {} } },
      { manager, operation: 'Apply', time: '2026-11-27T09:00:00Z', fieldsV1: { 'f:spec': { 'f:template': { 'f:spec': { 'f:containers': {
        'k:{"name":"app"}': { 'f:image': {} } } } } } } },
    ] },
    spec: { template: { spec: { containers: [{ name: 'app', image }] } } },
  });
  test("who applied a commit is named by the GitOps tool whose field manager set the image, from GITOPS_MARKS' managers", () => {
    assert.equal(gitopsApplier(appliedBy('argocd-controller'), 'deployment', 'app'), 'Argo CD (manager argocd-controller)');
    assert.equal(gitopsApplier(appliedBy('kustomize-controller'), 'deployment', 'app'), 'Flux (manager kustomize-controller)');
    assert.equal(gitopsApplier(appliedBy('helm-controller'), 'deployment', 'app'), 'Flux (manager helm-controller)');
    assert.equal(gitopsApplier(appliedBy('fleet-agent'), 'deployment', 'app'), 'Fleet (manager fleet-agent)');
    assert.equal(gitopsApplier(appliedBy('kubectl-set'), 'deployment', 'app'), 'manager kubectl-set', 'not the newest entry: the owner of the image');
    assert.equal(gitopsApplier({ spec: appliedBy('x').spec }, 'deployment', 'app'), 'an unknown manager');
  });
  test('a committed push on its record: the image before it and the image committed are not changes made outside webhook', () => {
    const record = { pushedAt: '2026-11-27T08:00:00Z', timeFrom: 'payload' as const, image: 'reg.example/shop/app:v2', push: 'sha256:a|t',
      previous: 'reg.example/shop/app:v1', appliedAt: '2026-11-27T08:00:01Z', commit: 'c0ffee'.padEnd(40, '0') };
    const push = { image: 'reg.example/shop/app:build-7', pushedAtMs: Date.parse('2026-11-27T08:30:00Z'), timeFrom: 'payload' as const, push: 'sha256:b|t' };
    const at = { workload: 'deployment/web', container: 'app', fieldPath: imageFieldPath('deployment', 'containers', 'app') };
    const decideOn = (running: string, r: object = record) =>
      holdDecision(r as typeof record, running, appliedBy('argocd-controller', running).metadata.managedFields, push, Date.parse('2026-11-27T12:00:00Z'), at).kind;
    assert.equal(decideOn('reg.example/shop/app:v1'), 'none', 'not applied yet');
    assert.equal(decideOn('reg.example/shop/app:v2'), 'none', 'applied by the GitOps tool');
    assert.equal(decideOn('reg.example/shop/app:v0'), 'held', 'a change of its own');
    assert.equal(decideOn('reg.example/shop/app:v1', { ...record, commit: undefined }), 'held', 'a patched push: its previous image is no longer ours');
  });
});

describe('pushes waiting for one branch are committed together (WorkloadQueue.batch)', () => {
  test('items of one turn make one call; those arriving during a call the next; at most max a call; a throw fails its items', async () => {
    const queue = new WorkloadQueue();
    const calls: number[][] = [];
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const run = async (items: number[]) => {
      calls.push(items);
      if (calls.length === 1) await gate;
      return items.map((i) => i * 10);
    };
    const first = [1, 2, 3].map((i) => queue.batch('main', i, run, 4));
    await new Promise((r) => setImmediate(r));
    const later = [4, 5, 6, 7, 8, 9].map((i) => queue.batch('main', i, run, 4));
    const other = queue.batch('other', 100, run, 4);
    release();
    assert.deepEqual(await Promise.all([...first, ...later, other]), [10, 20, 30, 40, 50, 60, 70, 80, 90, 1000]);
    assert.deepEqual(calls.toSorted((a, b) => a[0] - b[0]), [[1, 2, 3], [4, 5, 6, 7], [8, 9], [100]]);
    const failing = queue.batch('main', 1, async () => { throw new Error('the branch is protected'); }, 4);
    await assert.rejects(failing, /the branch is protected/);
  });
});

describe('a commit\'s message', () => {
  test('a value that holds a line break stays on its line: it adds no trailer that newest wins would read back', () => {
    // The image the cluster ran, as a namespace editor can set it.
    const before = 'reg.example/shop/app:v1\nWebhook-Workload: shop/deployment/web/app\nWebhook-Pushed-At: 2099-01-01T00:00:00.000Z';
    const edit = { push: { image: 'reg.example/shop/app:v2', target: { namespace: 'shop', kind: 'deployment', name: 'web' },
      pushedAtMs: Date.parse('2026-12-01T00:00:00Z'), hookId: 'deploy' }, config: { container: 'app' }, before } as unknown as PushEdit;
    const message = commitMessage([edit]);
    assert.deepEqual(message.split('\n').filter((l) => /^Webhook-(Workload|Pushed-At): /.test(l)),
      ['Webhook-Workload: shop/deployment/web/app', 'Webhook-Pushed-At: 2026-12-01T00:00:00.000Z']);
    assert.ok(message.includes(`ran ${JSON.stringify(before)}.`), message);
    assert.match(commitMessage([{ ...edit, before: 'reg.example/shop/app:v1' }]), /ran reg\.example\/shop\/app:v1\.$/m);
  });
});

describe('pkt-lines', () => {
  test('a line, a flush, a delimiter; garbage and a cut line are errors naming the answer', () => {
    const bytes = Buffer.concat([pktLine('version 2\n'), Buffer.from('0000'), pktLine('x'), Buffer.from('0001')]);
    const lines = parsePktLines(bytes, 'info/refs');
    assert.deepEqual(lines.map((l) => (typeof l === 'string' ? l : l.toString())), ['version 2\n', 'flush', 'x', 'delim']);
    assert.throws(() => parsePktLines(Buffer.from('<html>'), 'info/refs'), /info\/refs: not the git protocol \("<htm"/);
    assert.throws(() => parsePktLines(Buffer.from('0010abc'), 'fetch'), /fetch: the answer is cut off inside a pkt-line/);
  });
});

describe('packs and trees, checked against git', () => {
  const root = makeTempDir('git-pack-');
  const files: Record<string, string> = {};
  for (let i = 0; i < 20; i++) files[`dir${i % 4}/file${i}.yaml`] = `name: file${i}\n${'line of text\n'.repeat(50)}`;
  const bare = makeRepository(root, 'packs', files, 8);
  const objects = git(bare, ['cat-file', '--batch-all-objects', '--batch-check=%(objectname)']).trim().split('\n').sort();
  const packOf = (ofs: boolean) => {
    const list = git(bare, ['rev-list', '--objects', '--all']);
    return execFileSync('git', ['pack-objects', '--stdout', '--window=50', ...(ofs ? ['--delta-base-offset'] : [])], { cwd: bare, input: list, maxBuffer: 64 << 20 });
  };
  const deltaTypes = (pack: Buffer) => {
    const index = path.join(root, `check-${Math.random()}.pack`);
    fs.writeFileSync(index, pack);
    git(root, ['index-pack', index]);
    return git(root, ['verify-pack', '-v', index]);
  };

  test('a pack with OFS_DELTA objects (git gc --aggressive, --delta-base-offset) reads to every object git has', () => {
    const pack = packOf(true);
    assert.match(deltaTypes(pack), /chain length = [1-9]/, 'the pack holds deltas');
    const read = readPack(pack, 'test pack').all();
    assert.deepEqual([...read.keys()].sort(), objects);
    for (const [id, o] of read) assert.equal(gitObjectId(o.type, o.data), id);
  });
  test('a pack with REF_DELTA objects (no --delta-base-offset) reads the same', () => {
    const pack = packOf(false);
    assert.deepEqual([...readPack(pack, 'test pack').all().keys()].sort(), objects);
  });
  test("of a pack's deltas only those the objects asked for need are applied (the head commit and its root tree)", () => {
    const pack = packOf(true);
    // verify-pack -v: a deltified object's line ends with its depth and its base's id.
    const deltas = (deltaTypes(pack).match(/^[0-9a-f]{40} +\w+ +\d+ \d+ \d+ \d+ [0-9a-f]{40}$/gm) ?? []).length;
    assert.ok(deltas > 0, 'the pack holds deltas');
    const read = readPack(pack, 'test pack');
    const [head, tree] = git(bare, ['rev-parse', 'HEAD', 'HEAD^{tree}']).trim().split('\n');
    assert.equal(read.get(head)?.type, 'commit');
    assert.equal(read.get(tree)?.type, 'tree');
    assert.ok(read.deltasApplied < deltas, `${read.deltasApplied} of ${deltas} deltas applied`);
    assert.equal(read.all().size, objects.length);
    assert.equal(read.deltasApplied, deltas);
  });
  test('a pack whose deltas inflate past 64 MiB in all (each copying an 8 MiB base) is refused before it is made', () => {
    const varint = (n: number) => {
      const bytes = [];
      for (; n >= 0x80; n = Math.floor(n / 128)) bytes.push((n & 0x7f) | 0x80);
      return [...bytes, n];
    };
    const header = (type: number, size: number) => {
      const bytes = [(type << 4) | (size & 15) | (size >= 16 ? 0x80 : 0)];
      for (size = Math.floor(size / 16); size > 0; size = Math.floor(size / 128)) bytes.push((size & 0x7f) | (size >= 128 ? 0x80 : 0));
      return Buffer.from(bytes);
    };
    // An OFS_DELTA's distance back to its base, as git writes it (each further byte adds one before the shift).
    const back = (n: number) => {
      const bytes = [n & 0x7f];
      for (n = Math.floor(n / 128); n > 0; n = Math.floor(n / 128)) bytes.unshift(0x80 | (--n & 0x7f));
      return Buffer.from(bytes);
    };
    const MIB8 = 8 * 1024 * 1024;
    // Source and target 8 MiB, one copy of 8 MiB from offset 0 (only the third size byte: 0x80).
    const raw = Buffer.from([...varint(MIB8), ...varint(MIB8), 0xc0, 0x80]);
    const delta = zlib.deflateSync(raw);
    const parts = [Buffer.from('PACK\0\0\0\x02\0\0\0\x0b', 'latin1'), header(3, MIB8), zlib.deflateSync(Buffer.alloc(MIB8))];
    const base = 12;
    let at = parts.reduce((n, b) => n + b.length, 0);
    for (let i = 0; i < 10; i++) {
      const entry = Buffer.concat([header(6, raw.length), back(at - base), delta]);
      parts.push(entry);
      at += entry.length;
    }
    const body = Buffer.concat(parts);
    const pack = Buffer.concat([body, createHash('sha1').update(body).digest()]);
    assert.ok(pack.length < 64 * 1024, `${pack.length} bytes`);
    // Read, its deltas not applied; looking for an object it does not hold applies them, and the budget refuses.
    const read = readPack(pack, 'the fetch');
    assert.throws(() => read.get('0'.repeat(40)), (e: Error) => e instanceof GitError &&
      /^the fetch: the pack inflates to more than 67108864 bytes: refused$/.test(e.message));
  });
  test('a truncated pack, garbage and a corrupt object are clear errors', () => {
    const pack = packOf(true);
    assert.throws(() => readPack(pack.subarray(0, pack.length - 1000), 'fetch'), /fetch: the pack is truncated/);
    assert.throws(() => readPack(Buffer.from('<html>not a pack</html> and more bytes than 32'), 'fetch'), /fetch: not a pack/);
    const corrupt = Buffer.from(pack);
    corrupt[40] ^= 0xff;
    assert.throws(() => readPack(corrupt, 'fetch'), /fetch: the pack is truncated \(its checksum does not match\)/);
  });
  test('a pack written here is indexed by git; a tree rewritten here has the id git gives it', () => {
    const blob = Buffer.from('hello\n');
    const pack = writePack([{ type: 'blob', data: blob }]);
    assert.match(deltaTypes(pack), new RegExp(gitObjectId('blob', blob)));
    assert.equal(gitObjectId('blob', blob), git(root, ['hash-object', '--stdin'], 'hello\n').trim());
    const read = readPack(packOf(true), 'pack');
    const head = git(bare, ['rev-parse', 'HEAD^{tree}']).trim();
    const entries = readTree(read.get(head)!.data, 'root');
    assert.deepEqual(entries.map((e) => e.name), ['dir0', 'dir1', 'dir2', 'dir3']);
    const blobId = git(bare, ['hash-object', '-w', '--stdin'], 'new\n').trim();
    const { root: newRoot, trees } = replaceInTree(read, head, new Map([['dir1/file1.yaml', blobId]]));
    for (const t of trees) git(bare, ['hash-object', '-w', '-t', 'tree', '--stdin'], t);
    assert.equal(git(bare, ['rev-parse', `${newRoot}:dir1/file1.yaml`]).trim(), blobId);
    assert.equal(git(bare, ['rev-parse', `${newRoot}:dir2`]).trim(), git(bare, ['rev-parse', 'HEAD:dir2']).trim());
  });
});

describe('the edit of one scalar', () => {
  test('a manifest: the container of that name in the document of that kind and name; comments and quoting kept', () => {
    const out = edit({});
    assert.deepEqual(changedLines(MANIFEST, out), [
      ["          image: 'reg.example/shop/app:v1'   # keep this comment", "          image: 'reg.example/shop/app:v2'   # keep this comment"],
    ]);
    assert.deepEqual(changedLines(MANIFEST, edit({ container: 'sidecar' })), [
      ['          image: reg.example/shop/proxy:v9', '          image: reg.example/shop/app:v2'],
    ]);
  });
  test('a shared file: the document of the workload\'s namespace (or of none); another team\'s is never edited, two matches are refused', () => {
    const teamB = MANIFEST.replace('namespace: shop', 'namespace: team-b').replace(/^# the web app.*\n/, '');
    const shared = `${MANIFEST}---\n${teamB.replace(/^apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n---\n/, '')}`;
    // The push for team-b/web edits team-b's document only: the second Deployment, not the first (shop's).
    const out = edit({ text: shared, target: { kind: 'deployment', name: 'web', namespace: 'team-b' } });
    const changed = changedLines(shared, out);
    assert.equal(changed.length, 1);
    assert.ok(out.indexOf("app:v2'") > out.indexOf('namespace: team-b'), 'the edit is in team-b\'s document');
    assert.throws(() => edit({ target: { kind: 'deployment', name: 'web', namespace: 'team-c' } }),
      /^Error: apps\/web\.yaml: no document of kind Deployment named "web" in namespace team-c \(only in namespace shop\)$/);
    // A document that names no namespace is the workload's, where its tool applies it; two of them are refused.
    const unnamed = MANIFEST.replace('  namespace: shop\n', '');
    assert.equal(changedLines(unnamed, edit({ text: unnamed, target: { kind: 'deployment', name: 'web', namespace: 'any' } })).length, 1);
    assert.throws(() => edit({ text: `${unnamed}---\n${unnamed}` }),
      /^Error: apps\/web\.yaml: 2 documents of kind Deployment named "web" in namespace shop \(lines \d+, \d+\): which one to edit is not known$/);
  });
  test('what is missing is named: the document, the container, the image', () => {
    assert.throws(() => edit({ target: { kind: 'deployment', name: 'api', namespace: 'shop' } }), /^Error: apps\/web\.yaml: no document of kind Deployment named "api" in namespace shop$/);
    assert.throws(() => edit({ container: 'db' }), /apps\/web\.yaml: Deployment "web": no container "db" in spec\.template\.spec\.containers/);
    assert.throws(() => edit({ text: MANIFEST.replace("image: 'reg.example/shop/app:v1'   # keep this comment", 'imagePullPolicy: Always') }), /spec\.template\.spec\.containers\[1\] has no image/);
    assert.throws(() => edit({ text: 'a\0b' }), /apps\/web\.yaml: a binary file, not YAML/);
    assert.throws(() => edit({ text: 'a: [' }), /apps\/web\.yaml: not YAML: line/);
  });
  const kustomization = `# overlay for production
resources:
  - ../../base
images:
  - name: reg.example/shop/other
    newTag: "1.0"
  - name: reg.example/shop/app   # the app
    newTag: v1
`;
  const kedit = (text: string, image = 'reg.example/shop/app:v2') => edit({ file: 'overlays/prod/kustomization.yaml', text, image });
  test('a kustomization: the entry named as the repository gets newTag, and digest when pinned; one is added when missing', () => {
    assert.deepEqual(changedLines(kustomization, kedit(kustomization)), [['    newTag: v1', '    newTag: v2']]);
    const digest = `sha256:${'a'.repeat(64)}`;
    assert.equal(kedit(kustomization, `reg.example/shop/app:v3@${digest}`),
      kustomization.replace('newTag: v1', 'newTag: v3').replace('- name: reg.example/shop/app   # the app', `- name: reg.example/shop/app   # the app\n    digest: ${digest}`));
    assert.equal(kedit(kustomization, 'reg.example/shop/new:1.10'), `${kustomization}  - name: reg.example/shop/new\n    newTag: "1.10"\n`);
    assert.equal(kedit('resources:\n- a.yaml\n'), 'resources:\n- a.yaml\nimages:\n- name: reg.example/shop/app\n  newTag: v2\n');
    const parsed = locatedYaml(kedit(kustomization, 'reg.example/shop/new:1.10'));
    assert.equal(parsed.length, 1);
  });
  const values = `# values for the web chart
replicaCount: 2
image:
  registry: reg.example
  repository: shop/app
  tag: "v1"   # set by webhook
  pullPolicy: IfNotPresent
`;
  test('a Helm values file: GIT_FIELD names the tag field; a repository beside it must be the pushed one', () => {
    assert.deepEqual(changedLines(values, edit({ file: 'values.yaml', text: values, field: 'image.tag' })), [
      ['  tag: "v1"   # set by webhook', '  tag: "v2"   # set by webhook'],
    ]);
    assert.throws(() => edit({ file: 'values.yaml', text: values, field: 'image.tag', image: 'reg.example/shop/evil:v2' }),
      /values\.yaml: image\.repository names "reg\.example\/shop\/app", not the pushed repository "reg\.example\/shop\/evil": the push is refused/);
    assert.throws(() => edit({ file: 'values.yaml', text: values, field: 'app.image.tag' }), /values\.yaml: GIT_FIELD app\.image\.tag: no app$/);
    assert.throws(() => edit({ file: 'values.yaml', text: values, field: 'image.digest' }), /values\.yaml: GIT_FIELD image\.digest: no image\.digest$/);
  });
  test('GIT_* settings are checked: https only (http for loopback), no credentials in the URL, a relative path', () => {
    assert.equal(HOOK_SETTINGS.GIT_REPO.parse('https://git.example/org/deploy.git')?.href, 'https://git.example/org/deploy.git');
    assert.equal(HOOK_SETTINGS.GIT_REPO.parse('http://127.0.0.1:3000/deploy.git')?.host, '127.0.0.1:3000');
    assert.throws(() => HOOK_SETTINGS.GIT_REPO.parse('http://git.example/deploy.git'), /GIT_REPO "http:\/\/git\.example\/deploy\.git" is not https:\/\/ \(http:\/\/ only for a loopback host\)/);
    assert.throws(() => HOOK_SETTINGS.GIT_REPO.parse('https://bot:tok@git.example/x.git'), /GIT_REPO holds credentials/);
    assert.throws(() => HOOK_SETTINGS.GIT_PATH.parse('../etc/passwd'), /GIT_PATH "\.\.\/etc\/passwd" is not a path relative/);
    assert.throws(() => HOOK_SETTINGS.GIT_BRANCH.parse('main..x'), /GIT_BRANCH "main\.\.x" is not a branch name/);
    assert.equal(HOOK_SETTINGS.GIT_BRANCH.parse(undefined), 'main');
    assert.equal(HOOK_SETTINGS.GIT_USERNAME.parse(''), 'x-access-token');
    assert.equal(HOOK_SETTINGS.GIT_AUTHOR.parse(undefined), 'webhook <webhook@localhost>');
    assert.equal(HOOK_SETTINGS.GIT_TOKEN.secret, true);
  });
});

describe('the smart-HTTP client against git http-backend', () => {
  const root = makeTempDir('git-http-');
  const TOKEN = 'glpat-client-3b7e1c55';
  let server: GitServer;
  let bare: string;
  const remote = (over: Partial<GitRemote> = {}): GitRemote =>
    ({ url: new URL(`${server.base}/deploy.git`), username: 'bot', token: TOKEN, ca: undefined, ...over });
  before(async () => {
    bare = makeRepository(root, 'deploy', { 'apps/web.yaml': MANIFEST, 'big/notes.txt': 'x\n'.repeat(1000) });
    server = await startGitServer(root, 'bot', TOKEN);
  });
  after(() => server.close());

  test('the file read with filter blob:none is the head\'s; without filters the whole depth-1 pack is read', async () => {
    const head = git(bare, ['rev-parse', 'main']).trim();
    const file = await fetchGitFile(remote(), 'main', 'apps/web.yaml');
    assert.equal(file.head, head);
    assert.equal(file.content.toString(), MANIFEST);
    assert.equal([...file.objects.all().values()].filter((o) => o.type === 'blob').length, 1, 'only the file\'s blob was fetched');
    git(bare, ['config', 'uploadpack.allowFilter', 'false']);
    try {
      const whole = await fetchGitFile(remote(), 'main', 'apps/web.yaml');
      assert.equal(whole.content.toString(), MANIFEST);
      assert.ok([...whole.objects.all().values()].some((o) => o.type === 'blob'));
    } finally {
      git(bare, ['config', 'uploadpack.allowFilter', 'true']);
    }
  });
  test('a tree 10,000 entries wide is read and rewritten', async () => {
    const files: Record<string, string> = { 'apps/web.yaml': MANIFEST };
    for (let i = 0; i < 10_000; i++) files[`wide/app-${i}.yaml`] = `n: ${i}\n`;
    makeRepository(root, 'wide', files, 1);
    const wide = remote({ url: new URL(`${server.base}/wide.git`) });
    const file = await fetchGitFile(wide, 'main', 'wide/app-9999.yaml');
    assert.equal(file.content.toString(), 'n: 9999\n');
    const text = { message: 'edit\n', author: 'webhook <webhook@localhost>', whenSeconds: 1_700_000_000 };
    await pushGitCommit(wide, 'main', file, new Map([['wide/app-9999.yaml', Buffer.from('n: 10000\n')]]), text);
    const bareWide = path.join(root, 'wide.git');
    assert.equal(git(bareWide, ['show', 'main:wide/app-9999.yaml']), 'n: 10000\n');
    assert.equal(git(bareWide, ['ls-tree', 'main:wide']).trim().split('\n').length, 10_000);
    assert.equal(git(bareWide, ['fsck', '--strict']), '');
  });
  test('a commit signed with GIT_SIGNING_KEY (SSH ed25519) is accepted by git verify-commit', async () => {
    const key = path.join(root, 'signing');
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'webhook', '-f', key]);
    const allowed = path.join(root, 'allowed_signers');
    fs.writeFileSync(allowed, `webhook@localhost ${fs.readFileSync(`${key}.pub`, 'utf8')}`);
    const signingKey = readSshSigningKey(key)!;
    assert.deepEqual(readSshSigningKey(fs.readFileSync(key, 'utf8'))!.publicBlob, signingKey.publicBlob);
    const file = await fetchGitFile(remote(), 'main', 'apps/web.yaml');
    const text = { message: 'signed\n', author: 'webhook <webhook@localhost>', whenSeconds: 1_700_000_100, signingKey };
    const id = await pushGitCommit(remote(), 'main', file, new Map([['apps/web.yaml', Buffer.from(edit({ image: 'reg.example/shop/app:v9' }))]]), text);
    const verified = execFileSync('git', ['-c', 'gpg.format=ssh', '-c', `gpg.ssh.allowedSignersFile=${allowed}`, 'verify-commit', '-v', id],
      { cwd: bare, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
    assert.match(git(bare, ['cat-file', 'commit', id]), /^gpgsig -----BEGIN SSH SIGNATURE-----$/m);
    assert.equal(typeof verified, 'string');
    assert.equal(git(bare, ['fsck', '--strict']), '');
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', 'passphrase', '-f', `${key}-locked`]);
    assert.throws(() => readSshSigningKey(`${key}-locked`), /^Error: GIT_SIGNING_KEY: the key is encrypted/);
    assert.throws(() => readSshSigningKey('/nonexistent/key'), /GIT_SIGNING_KEY: the key file "\/nonexistent\/key" cannot be read/);
  });
  test('several files read at once: each file\'s failure is its own', async () => {
    const read = await fetchGitFiles(remote(), 'main', ['apps/web.yaml', 'apps/nothing.yaml', 'apps']);
    assert.equal(read.files.get('apps/web.yaml')?.toString().includes('kind: Deployment'), true);
    assert.match(String(read.files.get('apps/nothing.yaml')), /no "nothing\.yaml" in apps/);
    assert.match(String(read.files.get('apps')), /apps: not a file/);
  });
  test('a wrong token: the server\'s refusal, named, without the token', async () => {
    const e = await fetchGitFile(remote({ token: 'wrong-token-77' }), 'main', 'apps/web.yaml').catch((x) => x);
    assert.ok(e instanceof GitError);
    assert.match(e.message, /the server refused the credentials of "bot" \(HTTP 401: "Authentication failed"\); check GIT_TOKEN/);
    assert.doesNotMatch(e.message, /wrong-token-77/);
  });
  test('a server that echoes the Authorization header in its refusal: no run of the token, or of its base64, in the error', async () => {
    // The header after a prefix, so that a cut of the quoted answer would fall inside it.
    const echo = http.createServer((req, res) => {
      res.writeHead(403, { 'Content-Type': 'text/plain' });
      res.end(`${'denied '.repeat(6)}you sent ${req.headers.authorization} with token ${TOKEN}`);
    });
    await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
    try {
      const url = new URL(`http://127.0.0.1:${(echo.address() as AddressInfo).port}/deploy.git`);
      const e = await fetchGitFile(remote({ url }), 'main', 'apps/web.yaml').catch((x) => x);
      assert.ok(e instanceof GitError, String(e));
      assert.match(e.message, /the server refused the credentials of "bot" \(HTTP 403: "denied denied /);
      assert.equal(leaks(e.message, TOKEN, 'bot:'), undefined, e.message);
    } finally {
      echo.close();
    }
  });
  test('a missing branch, a missing file, a directory are named', async () => {
    await assert.rejects(fetchGitFile(remote(), 'prod', 'apps/web.yaml'), /there is no branch "prod"/);
    await assert.rejects(fetchGitFile(remote(), 'main', 'apps/api.yaml'), /apps\/api\.yaml: no "api\.yaml" in apps/);
    await assert.rejects(fetchGitFile(remote(), 'main', 'apps'), /apps: not a file \(mode 40000\)/);
  });
  test('garbage and a truncated pack from the server are clear errors', async () => {
    const uploadPack = (p: string) => p.startsWith('/deploy.git/git-upload-pack');
    try {
      server.answer = (p, body) => (uploadPack(p) ? Buffer.from('<html>proxy error</html>') : body);
      await assert.rejects(fetchGitFile(remote(), 'main', 'apps/web.yaml'), /ls-refs: not the git protocol \("<htm" at byte 0/);
      let posts = 0;
      server.answer = (p, body) => (uploadPack(p) && ++posts === 2 ? body.subarray(0, body.length - 200) : body);
      await assert.rejects(fetchGitFile(remote(), 'main', 'apps/web.yaml'), /fetch of main: (the answer is cut off inside a pkt-line|the pack is truncated)/);
    } finally {
      server.answer = undefined;
    }
  });
  test('a 50 MB file at the path: refused by its size, memory bounded', async () => {
    commitBigFile(root, bare);
    const heap = process.memoryUsage().rss;
    await assert.rejects(fetchGitFile(remote(), 'main', 'big.yaml'), /an object of 52428800 bytes is larger than 8388608/);
    assert.ok(process.memoryUsage().rss - heap < 200 * 1024 * 1024, 'memory stayed bounded');
  });
  test('a pre-receive hook that prints the token, its Basic base64 and a run of it across the quote\'s cut: none of them in the error', async () => {
    const basic = Buffer.from(`bot:${TOKEN}`).toString('base64');
    // 490 characters first: the 500-character cut of the quoted message would fall inside the token.
    // And a line whose token would straddle two side-band packets were they read one by one.
    const said = [`${'x'.repeat(490)}${TOKEN}`, `${'y'.repeat(120)}${TOKEN}`, `you sent Basic ${basic}`, `token ${TOKEN} is not allowed here`];
    const script = `#!/bin/sh\n${said.map((l) => `echo '${l}' >&2`).join('\n')}\nexit 1\n`;
    fs.writeFileSync(path.join(bare, 'hooks', 'pre-receive'), script, { mode: 0o755 });
    try {
      const file = await fetchGitFile(remote(), 'main', 'apps/web.yaml');
      const next = new Map([['apps/web.yaml', Buffer.from(edit({ image: 'reg.example/shop/app:v4' }))]]);
      const text = { message: 'deploy v4\n', author: 'webhook <webhook@localhost>', whenSeconds: 1_700_000_000 };
      const refused = await pushGitCommit(remote(), 'main', file, next, text).catch((e) => e);
      assert.ok(refused instanceof GitError && refused.kind === 'refused', String(refused));
      assert.match(refused.message, /pre-receive hook declined; the server said: x{400}/);
      assert.match(refused.message, /is not allowed here/, 'the rest of what the server said is quoted');
      assert.equal(leaks(refused.message, TOKEN, 'bot:'), undefined, refused.message);
      assert.doesNotMatch(refused.message, new RegExp(basic.slice(0, 12)));
    } finally {
      fs.rmSync(path.join(bare, 'hooks', 'pre-receive'));
    }
  });
  test('a commit pushed with the head read as expected value; a moved branch is reported as moved; a pre-receive refusal carries its message', async () => {
    const file = await fetchGitFile(remote(), 'main', 'apps/web.yaml');
    const text = { message: 'deploy v2\n', author: 'webhook <webhook@localhost>', whenSeconds: 1_700_000_000 };
    const next = new Map([['apps/web.yaml', Buffer.from(edit({}))]]);
    const id = await pushGitCommit(remote(), 'main', file, next, text);
    assert.equal(git(bare, ['rev-parse', 'main']).trim(), id);
    assert.equal(git(bare, ['rev-parse', 'main^']).trim(), file.head);
    assert.equal(git(bare, ['fsck', '--strict']), '');
    const again = await pushGitCommit(remote(), 'main', file, next, text).catch((e) => e);
    assert.ok(again instanceof GitError && again.kind === 'moved', String(again));
    fs.writeFileSync(path.join(bare, 'hooks', 'pre-receive'), '#!/bin/sh\necho "branch main is protected: open a merge request" >&2\nexit 1\n', { mode: 0o755 });
    try {
      const fresh = await fetchGitFile(remote(), 'main', 'apps/web.yaml');
      const refused = await pushGitCommit(remote(), 'main', fresh, new Map([['apps/web.yaml', Buffer.from(edit({ image: 'reg.example/shop/app:v3' }))]]), text).catch((e) => e);
      assert.ok(refused instanceof GitError && refused.kind === 'refused', String(refused));
      assert.match(refused.message, /the server refused the push to main: pre-receive hook declined; the server said: branch main is protected: open a merge request/);
      assert.equal(git(bare, ['rev-parse', 'main']).trim(), id, 'nothing changed');
    } finally {
      fs.rmSync(path.join(bare, 'hooks', 'pre-receive'));
    }
  });
});

const cluster = await clusterOrSkip();

describe('an applied push committed to Git through the executable', { skip: cluster ? false : 'no cluster' }, () => {
  const kubectl = kubectlFor(cluster!);
  const ns = freshNamespaceName('git');
  // Its own namespace: no rollout followed there opens the watch of its Deployments before the sync wait does.
  const watchedNs = freshNamespaceName('git-watched');
  const root = makeTempDir('git-e2e-');
  const HOOK_TOKEN = 'git-hook-token-91ac';
  const GIT_TOKEN = 'ghp-e2e-secret-5d0f2a7c';
  const tokenFile = path.join(root, 'git-token');
  const noGit = makeTempDir('no-git-path-');
  const signingKey = path.join(root, 'signing-key');
  let server: GitServer;
  let wh: Webhook;
  /** The deliveries page's record of the push `res` answered, once it is done (its rollout followed and reported). */
  const reported = async (res: { headers: Record<string, unknown> }, timeoutMs: number, what: string) => {
    const port = await adminPort(wh);
    const id = String(res.headers['x-request-id']);
    return waitFor(async () => {
      const d = JSON.parse((await httpRequest(port, '/deliveries.json')).body).deliveries.find((x: any) => x.request_id === id);
      return d?.state === 'done' ? d : undefined;
    }, { timeoutMs, what });
  };
  let second: Webhook;
  let bare: string;
  const manifest = MANIFEST.replace(/reg\.example\/shop\/app:v1/, acrImage('v1')).replace('namespace: shop', `namespace: ${ns}`);
  /** The manifest of deployment/<name> instead of deployment/web. */
  const manifestOf = (name: string) => manifest.replace('name: web   # the workload', `name: ${name}`);
  const APPROVAL_KEY = 'git-approval-key-0b8e5d2c7a9f4e1b6c3d8a5f2e7b4c91';
  const PUBLIC_URL = 'https://webhook.example.test';
  const kustomization = `images:\n  - name: ${acrImage('v1').split(':v1')[0]}\n    newTag: v1 # by webhook\n`;
  const values = `image:\n  repository: ${acrImage('v1').split(':v1')[0]}\n  tag: v1\n`;
  const push = (hook: string, tag: string, pushedAt = new Date(), replica = () => wh, workload = 'deployment/web') =>
    replica().request(`/hooks/${hook}?${new URLSearchParams({ token: HOOK_TOKEN, ns, workload, container: 'app', repo_type: 'regionalregistry' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag, undefined, { pushed_at: pushedAt.toISOString() }),
    });
  const actionOf = (body: string) => /^action: +(.*)$/m.exec(body)?.[1];
  const runningImage = async () => containerImage(JSON.parse(await kubectl(['-n', ns, 'get', 'deployment/web', '-o', 'json'])), 'app');

  before(async () => {
    fs.writeFileSync(tokenFile, `${GIT_TOKEN}\n`);
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'webhook', '-f', signingKey]);
    bare = makeRepository(root, 'deploy', { 'apps/web.yaml': manifest, 'overlays/prod/kustomization.yaml': kustomization, 'chart/values.yaml': values, 'logo.yaml': 'GIF89a\0\0\x01',
      'apps/held.yaml': manifestOf('held'), 'apps/gated.yaml': manifestOf('gated'), 'apps/watched.yaml': manifestOf('watched').replace(`namespace: ${ns}`, `namespace: ${watchedNs}`),
      'apps/pinned.yaml': manifestOf('pinned') });
    server = await startGitServer(root, 'x-access-token', GIT_TOKEN);
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['create', 'namespace', watchedNs]);
    await kubectl(['-n', watchedNs, 'apply', '-f', '-'], JSON.stringify(deployment('watched', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })));
    // Another namespace's workload of the same name as the file's: a push for it is not written into ns's document.
    await kubectl(['-n', watchedNs, 'apply', '-f', '-'], JSON.stringify(deployment('web', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })));
    for (const name of ['web', 'held', 'gated', 'pinned'])
      await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment(name, [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })));
    const flux = deployment('flux-web', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 });
    Object.assign(flux.metadata, { labels: { 'kustomize.toolkit.fluxcd.io/name': 'apps' } });
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(flux));
    const argo = deployment('argo-web', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 });
    Object.assign(argo.metadata, { annotations: { 'argocd.argoproj.io/tracking-id': 'web:apps/Deployment:shop/argo-web' } });
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(argo));
    const repo = `${server.base}/deploy.git`;
    const hooks = [
      upgradeHook('manifest', HOOK_TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/web', GIT_REPO: repo, GIT_PATH: 'apps/web.yaml', GIT_TOKEN: tokenFile }),
      upgradeHook('kustomize', HOOK_TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/web', GIT_REPO: repo, GIT_PATH: 'overlays/prod/kustomization.yaml', GIT_TOKEN: tokenFile }),
      upgradeHook('helm', HOOK_TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/web', GIT_REPO: repo, GIT_PATH: 'chart/values.yaml', GIT_FIELD: 'image.tag', GIT_TOKEN: tokenFile, GIT_AUTHOR: 'Deploy Bot <deploy@example.com>' }),
      upgradeHook('wrong', HOOK_TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/web', GIT_REPO: repo, GIT_PATH: 'apps/web.yaml', GIT_TOKEN: 'not-the-token-3e9' }),
      upgradeHook('binary', HOOK_TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/web', GIT_REPO: repo, GIT_PATH: 'logo.yaml', GIT_TOKEN: tokenFile }),
      upgradeHook('big', HOOK_TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/web', GIT_REPO: repo, GIT_PATH: 'big.yaml', GIT_TOKEN: tokenFile }),
      upgradeHook('synced', HOOK_TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/web', GIT_REPO: repo, GIT_PATH: 'apps/web.yaml', GIT_TOKEN: tokenFile, GIT_SYNC_TIMEOUT: '2m' }),
      upgradeHook('revert', HOOK_TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/web', GIT_REPO: repo, GIT_PATH: 'apps/web.yaml', GIT_TOKEN: tokenFile, GIT_SYNC_TIMEOUT: '2m', ROLLBACK_ON_FAILURE: 'true',
        // A pod stuck 5 s fails the rollout (30 s by default; only pods of :broken images are ever stuck here): the test
        // waits for the failure, not for the default.
        ROLLOUT_STUCK_TIMEOUT: '5s' }),
      upgradeHook('cluster', HOOK_TOKEN),
      upgradeHook('patch-anyway', HOOK_TOKEN, { ON_GITOPS_OWNER: 'patch' }),
      upgradeHook('signed', HOOK_TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/web', GIT_REPO: repo, GIT_PATH: 'apps/web.yaml', GIT_TOKEN: tokenFile, GIT_SIGNING_KEY: signingKey }),
      upgradeHook('held-git', HOOK_TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/held', GIT_REPO: repo, GIT_PATH: 'apps/held.yaml', GIT_TOKEN: tokenFile }),
      upgradeHook('approve', HOOK_TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/gated', GIT_REPO: repo, GIT_PATH: 'apps/gated.yaml', GIT_TOKEN: tokenFile, REQUIRE_APPROVAL: 'true' }),
      upgradeHook('wide', HOOK_TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/web', GIT_REPO: repo, GIT_PATH: 'wide/web.yaml', GIT_TOKEN: tokenFile }),
      upgradeHook('watched', HOOK_TOKEN, { APP_NS: watchedNs, APP_WORKLOAD: 'deployment/watched', GIT_REPO: repo, GIT_PATH: 'apps/watched.yaml', GIT_TOKEN: tokenFile, GIT_SYNC_TIMEOUT: '2m' }),
      // A hook for another namespace's deployment/web whose GIT_PATH holds only ns's: its push edits nothing.
      upgradeHook('other-ns', HOOK_TOKEN, { APP_NS: watchedNs, APP_WORKLOAD: 'deployment/web', GIT_REPO: repo, GIT_PATH: 'apps/web.yaml', GIT_TOKEN: tokenFile }),
      upgradeHook('pinned-git', HOOK_TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/pinned', GIT_REPO: repo, GIT_PATH: 'apps/pinned.yaml', GIT_TOKEN: tokenFile, ON_OUTSIDE_CHANGE: 'follow' }),
    ];
    const env = { KUBECONFIG: cluster!.kubeconfigPath, PATH: noGit };
    const keyFile = path.join(root, 'approval-key');
    fs.writeFileSync(keyFile, `${APPROVAL_KEY}\n`);
    const args = ['-deliveries', '50', '-public-url', PUBLIC_URL, '-approval-key-file', keyFile];
    [wh, second] = await Promise.all([0, 1].map(() => startWebhook({ hooks, env, args, metrics: true })));
  });
  after(async () => {
    await kubectl(['delete', 'mutatingadmissionpolicybinding,mutatingadmissionpolicy', `webhook-test-crashloop-${ns}`]).catch(() => undefined);
    await wh?.stop();
    await second?.stop();
    await server?.close();
    await removeNamespace(kubectl, ns);
    await removeNamespace(kubectl, watchedNs);
  });

  test('the file is what is checked: another namespace\'s document is never edited; a hand edit in the cluster does not pass the pin', async () => {
    const old = git(bare, ['rev-parse', 'main']).trim();
    // deployment/web in another namespace: apps/web.yaml holds only ns's web, which this push must not change.
    const q = new URLSearchParams({ token: HOOK_TOKEN, ns: watchedNs, workload: 'deployment/web', container: 'app', repo_type: 'regionalregistry' });
    const other = await wh.request(`/hooks/other-ns?${q}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload('v90') });
    assert.equal(other.status, 500, other.body);
    assert.match(other.body, new RegExp(`no document of kind Deployment named "web" in namespace ${watchedNs} \\(only in namespace ${ns}\\)`));
    // A hand edit in the cluster (which the GitOps tool would revert) to another repository, then a push of it.
    const evil = 'registry.cn-hangzhou.aliyuncs.com/evil/backdoor';
    await kubectl(['-n', ns, 'set', 'image', 'deployment/pinned', `app=${evil}:1.0.0`]);
    const res = await wh.request(`/hooks/pinned-git?${new URLSearchParams({ token: HOOK_TOKEN, ns, workload: 'deployment/pinned', container: 'app', repo_type: 'regionalregistry' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload('1.0.1', 'evil/backdoor') });
    assert.equal(res.status, 500, res.body);
    assert.match(res.body, new RegExp(`^result: +failed: Git write-back: apps/pinned\\.yaml deploys "${acrImage('v1').replace(/[.]/g, '\\.')}": image pin: container "app" runs repository ".*shop/web-api", and the push names repository ".*evil/backdoor"`, 'm'));
    assert.equal(git(bare, ['rev-parse', 'main']).trim(), old, 'nothing committed');
    const events = JSON.parse(await kubectl(['-n', ns, 'get', 'events', '--field-selector', 'involvedObject.name=pinned,reason=UpgradeRefused', '-o', 'json'])).items;
    assert.ok(events.some((e: any) => e.type === 'Warning' && e.message.includes('nothing was committed')), JSON.stringify(events));
    assert.match(wh.output(), /hook pinned-git: push to deployment\/pinned in \S+ refused: Git write-back: apps\/pinned\.yaml deploys/);
  });
  test('a manifest: one commit on the old head, only the image line changed, fsck clean; the workload unchanged', async () => {
    const old = git(bare, ['rev-parse', 'main']).trim();
    const res = await push('manifest', 'v2');
    assert.equal(res.status, 200, res.body);
    const head = git(bare, ['rev-parse', 'main']).trim();
    assert.equal(actionOf(res.body), `committed ${head.slice(0, 7)} to main of ${server.base}/deploy.git`);
    assert.equal(git(bare, ['rev-parse', 'main^']).trim(), old);
    const diff = git(bare, ['diff', '-U0', old, head]);
    assert.deepEqual(diff.split('\n').filter((l) => /^[-+] /.test(l)), [
      `-          image: '${acrImage('v1')}'   # keep this comment`,
      `+          image: '${acrImage('v2')}'   # keep this comment`,
    ]);
    assert.equal(git(bare, ['fsck', '--strict']), '');
    const message = git(bare, ['log', '-1', '--format=%an <%ae>%n%B', head]);
    assert.match(message, /^webhook <webhook@localhost>\nDeploy .*:v2 to .*\/deployment\/web/);
    assert.match(message, /^Webhook-Image: .*:v2$/m);
    assert.match(message, /^Webhook-Asked-By: hook "manifest", request /m);
    assert.equal(await runningImage(), acrImage('v1'), 'the cluster is not patched');
    console.log(git(bare, ['show', '--stat', head]));
  });
  test('a signed commit (GIT_SIGNING_KEY): git verify-commit accepts it', async () => {
    const res = await push('signed', 'v2s');
    assert.match(actionOf(res.body) ?? res.body, /^committed [0-9a-f]{7} to main of /, res.body);
    const allowed = path.join(root, 'allowed_signers');
    fs.writeFileSync(allowed, `webhook@localhost ${fs.readFileSync(`${signingKey}.pub`, 'utf8')}`);
    const out = execFileSync('git', ['-c', 'gpg.format=ssh', '-c', `gpg.ssh.allowedSignersFile=${allowed}`, 'verify-commit', 'main'],
      { cwd: bare, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
    assert.equal(out, '');
  });
  test('a kustomization entry updated, a Helm values field set', async () => {
    const res = await push('kustomize', 'v3');
    assert.match(actionOf(res.body) ?? res.body, /^committed [0-9a-f]{7} to main of /);
    assert.equal(git(bare, ['show', 'main:overlays/prod/kustomization.yaml']), kustomization.replace('newTag: v1', 'newTag: v3'));
    const helm = await push('helm', 'v4');
    assert.match(actionOf(helm.body) ?? helm.body, /^committed [0-9a-f]{7} to main of /);
    assert.equal(git(bare, ['show', 'main:chart/values.yaml']), values.replace('tag: v1', 'tag: v4'));
    assert.equal(git(bare, ['log', '-1', '--format=%an <%ae>', 'main']).trim(), 'Deploy Bot <deploy@example.com>');
  });
  test('a commit made by the server between the read and the push: the push is made again on it, both kept', async () => {
    const work = path.join(root, 'deploy-work');
    git(work, ['pull', '-q', bare, 'main']);
    fs.writeFileSync(path.join(work, 'README.md'), 'someone else\'s change\n');
    git(work, ['add', 'README.md']);
    git(work, ['commit', '-qm', 'a concurrent change']);
    const theirs = git(work, ['rev-parse', 'HEAD']).trim();
    git(work, ['push', '-q', bare, `${theirs}:refs/pending/theirs`]);
    const marker = path.join(root, 'raced');
    const hook = `#!/bin/sh\nif [ ! -e ${marker} ]; then touch ${marker}; unset GIT_QUARANTINE_PATH GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES; git update-ref refs/heads/main ${theirs}; fi\nexit 0\n`;
    fs.writeFileSync(path.join(bare, 'hooks', 'pre-receive'), hook, { mode: 0o755 });
    try {
      const res = await push('manifest', 'v5');
      assert.match(actionOf(res.body) ?? res.body, /^committed [0-9a-f]{7} to main of /, res.body);
      assert.ok(fs.existsSync(marker), 'the hook raced the push');
      assert.equal(git(bare, ['rev-parse', 'main^']).trim(), theirs, 'the commit sits on the concurrent one');
      assert.equal(git(bare, ['show', 'main:README.md']), 'someone else\'s change\n');
      assert.match(git(bare, ['show', 'main:apps/web.yaml']), /:v5'/);
      // The first attempt's commit, received but refused by the ref's compare-and-set, is left dangling.
      assert.equal(git(bare, ['fsck', '--strict', '--no-dangling']), '');
    } finally {
      fs.rmSync(path.join(bare, 'hooks', 'pre-receive'));
    }
  });
  test('a push refused by a pre-receive hook, and a wrong token: a clear error, nothing changed, no token shown', async () => {
    const head = git(bare, ['rev-parse', 'main']).trim();
    fs.writeFileSync(path.join(bare, 'hooks', 'pre-receive'), '#!/bin/sh\necho "main is protected: use a merge request" >&2\nexit 1\n', { mode: 0o755 });
    try {
      const res = await push('manifest', 'v6');
      assert.equal(res.status, 500, res.body);
      assert.match(res.body, /pre-receive hook declined; the server said: main is protected: use a merge request/);
      assert.match(res.body, /^action: +none \(nothing was changed\)\nresult: +failed: Git write-back: http:\/\/127\.0\.0\.1:\d+\/deploy\.git: the server refused the push to main/m);
    } finally {
      fs.rmSync(path.join(bare, 'hooks', 'pre-receive'));
    }
    const wrong = await push('wrong', 'v7');
    assert.equal(wrong.status, 500, wrong.body);
    assert.match(wrong.body, /the server refused the credentials of "x-access-token" \(HTTP 401/);
    assert.equal(git(bare, ['rev-parse', 'main']).trim(), head, 'nothing committed');
    assert.equal(await runningImage(), acrImage('v1'), 'nothing patched');
    for (const text of [wrong.body, wh.output()]) {
      assert.doesNotMatch(text, new RegExp(GIT_TOKEN));
      assert.doesNotMatch(text, /not-the-token-3e9/);
    }
  });

  test('newest wins in Git: an older push after a newer commit is superseded; two replicas at once lose no commit', async () => {
    const now = Date.now();
    const newer = await push('manifest', 'v21', new Date(now));
    assert.match(actionOf(newer.body) ?? newer.body, /^committed /);
    const head = git(bare, ['rev-parse', 'main']).trim();
    const older = await push('manifest', 'v20', new Date(now - 60_000));
    assert.equal(older.status, 200, older.body);
    // The workload's record names the commit: newest wins there before Git is asked.
    assert.match(actionOf(older.body) ?? older.body, new RegExp(`^none \\(superseded: a newer push, .*:v21 pushed at \\S+, was committed to Git \\(${head.slice(0, 7)}\\) already\\)$`));
    assert.equal(git(bare, ['rev-parse', 'main']).trim(), head, 'nothing committed');
    const before = Number(git(bare, ['rev-list', '--count', 'main']).trim());
    const [a, b] = await Promise.all([push('manifest', 'v30', new Date(now + 1_000)), push('manifest', 'v31', new Date(now + 2_000), () => second)]);
    assert.match(actionOf(b.body) ?? b.body, /^committed /, b.body);
    assert.match(actionOf(a.body) ?? a.body, /^(committed |none \(superseded by the commit |none \(superseded: a newer push, .*:v31 )/, a.body);
    assert.match(git(bare, ['show', 'main:apps/web.yaml']), /:v31'/, 'the newest push is in the file');
    const commits = Number(git(bare, ['rev-list', '--count', 'main']).trim()) - before;
    assert.equal(commits, /^committed /.test(actionOf(a.body) ?? '') ? 2 : 1, 'every committed push is in the history');
    assert.equal(git(bare, ['fsck', '--strict', '--no-dangling']), '');
  });

  const re = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  /** The Events of `reason` on deployment/<name>, once one's message matches `message`. */
  const eventsOn = (name: string, reason: string, message: RegExp) => waitFor(async () => {
    const list = JSON.parse(await kubectl(['-n', ns, 'get', 'events', '--field-selector', `involvedObject.name=${name},reason=${reason}`, '-o', 'json']));
    return (list.items as any[]).some((e) => message.test(e.message)) ? list.items as any[] : undefined;
  }, { timeoutMs: 60_000, what: `the ${reason} Event on ${name} matching ${message}` });
  const recordOf = async (name: string) =>
    JSON.parse(JSON.parse(await kubectl(['-n', ns, 'get', `deployment/${name}`, '-o', 'json'])).metadata.annotations['webhook/last-push']).app;

  test('under ON_OUTSIDE_CHANGE=hold, the GitOps tool applying a commit is no outside change; a person\'s kubectl set image holds', async () => {
    const at = (seconds: number) => new Date(Date.now() - 600_000 + seconds * 1000);
    const pushHeld = (hook: string, tag: string, seconds: number) => push(hook, tag, at(seconds), () => wh, 'deployment/held');
    // Patched once before the workload moved to Git: its record names an image webhook set itself.
    assert.equal(actionOf((await pushHeld('cluster', 'build-a', 0)).body), 'image updated');
    const committed = await pushHeld('held-git', 'build-b', 10);
    assert.match(actionOf(committed.body) ?? committed.body, /^committed /, committed.body);
    const commit = git(bare, ['rev-parse', 'main']).trim();
    assert.equal((await recordOf('held')).commit, commit, 'the record names the commit');
    await eventsOn('held', 'ImageCommitted', new RegExp(`^container app: image ${re(acrImage('build-a'))} → ${re(acrImage('build-b'))} committed as ` +
      `${commit.slice(0, 7)} to main of ${re(server.base)}/deploy\\.git; asked by hook "held-git", request ${committed.headers['x-request-id']}$`));
    // The GitOps tool applies the commit, under its own field manager, after the pushes below were pushed.
    await kubectl(['-n', ns, 'set', 'image', 'deployment/held', `app=${acrImage('build-b')}`, '--field-manager=argocd-controller']);
    const next = await pushHeld('held-git', 'build-c', 20);
    assert.match(actionOf(next.body) ?? next.body, /^committed /, next.body);
    assert.doesNotMatch(next.body, /outside webhook/);
    // Committed, not applied yet: the image before the commit is no outside change either.
    const before = await pushHeld('held-git', 'build-d', 30);
    assert.match(actionOf(before.body) ?? before.body, /^committed /, before.body);
    assert.match(git(bare, ['show', 'main:apps/held.yaml']), new RegExp(`image: '${re(acrImage('build-d'))}'`));
    await kubectl(['-n', ns, 'set', 'image', 'deployment/held', `app=${acrImage('build-h')}`]);
    const head = git(bare, ['rev-parse', 'main']).trim();
    const held = await pushHeld('held-git', 'build-e', 40);
    assert.equal(held.status, 200, held.body);
    assert.match(held.body, new RegExp(`^action: +none \\(held: deployment/held was set to ${re(acrImage('build-h'))} outside webhook by kubectl-set \\(kubectl set\\) at `, 'm'));
    assert.equal(git(bare, ['rev-parse', 'main']).trim(), head, 'nothing committed');
  });

  test('a push that waited for approval, approved: committed, its pending entry taken off, the commit recorded and told in an Event', async () => {
    const pendingOn = async () => JSON.parse(JSON.parse(await kubectl(['-n', ns, 'get', 'deployment/gated', '-o', 'json'])).metadata.annotations?.['webhook/pending'] ?? '{}');
    const res = await push('approve', 'v2', new Date(), () => wh, 'deployment/gated');
    assert.equal(res.status, 202, res.body);
    const entry = (await pendingOn()).app;
    assert.equal(entry.image, acrImage('v2'));
    const link = `/approval/${approvalToken(Buffer.from(APPROVAL_KEY), { namespace: ns, kind: 'deployment', name: 'gated', container: 'app',
      id: entry.id, hook: entry.hook, image: entry.image, action: 'approve', exp: Date.parse(entry.until) })}`;
    const approved = await second.request(link, { method: 'POST', body: 'name=Li Lei', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
    assert.equal(approved.status, 200, approved.body);
    await waitFor(async () => Object.keys(await pendingOn()).length === 0, { timeoutMs: 60_000, what: 'the pending entry taken off' });
    const head = git(bare, ['rev-parse', 'main']).trim();
    assert.match(git(bare, ['show', 'main:apps/gated.yaml']), new RegExp(`image: '${re(acrImage('v2'))}'`));
    assert.match(git(bare, ['log', '-1', '--format=%B', 'main']), /^Webhook-Workload: .*\/deployment\/gated\/app$/m);
    assert.equal((await recordOf('gated')).commit, head);
    await eventsOn('gated', 'ImageCommitted', new RegExp(` committed as ${head.slice(0, 7)} to main of ${re(server.base)}/deploy\\.git; `));
    const image = containerImage(JSON.parse(await kubectl(['-n', ns, 'get', 'deployment/gated', '-o', 'json'])), 'app');
    assert.equal(image, acrImage('v1'), 'not patched: the GitOps tool applies the commit');
  });

  test('bad input: a binary file, a 50 MB file, a server answering garbage: a clear error, nothing written', async () => {
    const head = git(bare, ['rev-parse', 'main']).trim();
    // Later than the pushes the tests before committed, so that none is superseded by them.
    const later = new Date(Date.now() + 10_000);
    const binary = await push('binary', 'v40', later);
    assert.equal(binary.status, 500, binary.body);
    assert.match(binary.body, /^result: +failed: Git write-back: logo\.yaml: a binary file, not YAML$/m);
    commitBigFile(root, bare);
    const bigHead = git(bare, ['rev-parse', 'main']).trim();
    const big = await push('big', 'v41', later);
    assert.equal(big.status, 500, big.body);
    assert.match(big.body, /^result: +failed: Git write-back: .*fetch of big\.yaml: an object of 52428800 bytes is larger than 8388608$/m);
    const peak = Number(/^VmHWM:\s+(\d+) kB$/m.exec(fs.readFileSync(`/proc/${wh.proc.pid}/status`, 'utf8'))![1]) * 1024;
    assert.ok(peak < 300 * 1024 * 1024, `the service's peak memory stayed bounded (${Math.round(peak / 1048576)} MiB)`);
    server.answer = (p, body) => (p.endsWith('/git-upload-pack') ? Buffer.from('HTTP/1.1 502 Bad Gateway') : body);
    try {
      const garbage = await push('manifest', 'v42', later);
      assert.equal(garbage.status, 500, garbage.body);
      assert.match(garbage.body, /^result: +failed: Git write-back: .*ls-refs: not the git protocol \("HTTP" at byte 0 is not a pkt-line length\)$/m);
    } finally {
      server.answer = undefined;
    }
    assert.notEqual(head, bigHead);
    assert.equal(git(bare, ['rev-parse', 'main']).trim(), bigHead, 'nothing committed');
    assert.equal(await runningImage(), acrImage('v1'), 'nothing patched');
  });

  test('through the executable: a tree 10,000 entries wide is committed; a pack the server truncates is a clear error, nothing written', async () => {
    const work = path.join(root, 'deploy-work');
    git(work, ['pull', '-q', bare, 'main']);
    fs.mkdirSync(path.join(work, 'wide'));
    for (let i = 0; i < 10_000; i++) fs.writeFileSync(path.join(work, 'wide', `app-${i}.yaml`), `n: ${i}\n`);
    fs.writeFileSync(path.join(work, 'wide', 'web.yaml'), manifest);
    git(work, ['add', 'wide']);
    git(work, ['commit', '-qm', 'a wide directory']);
    git(work, ['push', '-q', bare, 'main']);
    const later = new Date(Date.now() + 12_000);
    const wide = await push('wide', 'v45', later);
    assert.match(actionOf(wide.body) ?? wide.body, /^committed [0-9a-f]{7} to main of /, wide.body);
    assert.deepEqual(git(bare, ['diff', '--stat', 'main^', 'main']).trim().split('\n').slice(0, 1).map((l) => l.trim()), ['wide/web.yaml | 2 +-']);
    assert.equal(git(bare, ['ls-tree', 'main:wide']).trim().split('\n').length, 10_001);
    assert.equal(git(bare, ['fsck', '--strict', '--no-dangling']), '');
    const head = git(bare, ['rev-parse', 'main']).trim();
    let posts = 0;
    // The second upload-pack request is the fetch: its pack cut 200 bytes short.
    server.answer = (p, body) => (p.endsWith('/git-upload-pack') && ++posts === 2 ? body.subarray(0, body.length - 200) : body);
    try {
      const cut = await push('wide', 'v46', new Date(later.getTime() + 1_000));
      assert.equal(cut.status, 500, cut.body);
      assert.match(cut.body, /^result: +failed: Git write-back: .*fetch of main: (the answer is cut off inside a pkt-line|the pack is truncated)/m);
      assert.doesNotMatch(cut.body + wh.output(), new RegExp(GIT_TOKEN));
    } finally {
      server.answer = undefined;
    }
    assert.equal(git(bare, ['rev-parse', 'main']).trim(), head, 'nothing committed');
    assert.equal(await runningImage(), acrImage('v1'), 'nothing patched');
    const peak = Number(/^VmHWM:\s+(\d+) kB$/m.exec(fs.readFileSync(`/proc/${wh.proc.pid}/status`, 'utf8'))![1]) * 1024;
    assert.ok(peak < 300 * 1024 * 1024, `the service's peak memory stayed bounded (${Math.round(peak / 1048576)} MiB)`);
  });

  test('without GIT_REPO, a workload Flux or Argo CD deploys is refused, naming the tool; ON_GITOPS_OWNER=patch patches it', async () => {
    const later = new Date(Date.now() + 20_000);
    const flux = await push('cluster', 'v50', later, () => wh, 'deployment/flux-web');
    assert.equal(flux.status, 500, flux.body);
    assert.match(flux.body, /^result: +failed: deployment\/flux-web is deployed by Flux \(label kustomize\.toolkit\.fluxcd\.io\/name\): its next sync would undo a PATCH\. Set GIT_REPO/m);
    const argo = await push('cluster', 'v50', later, () => wh, 'deployment/argo-web');
    assert.match(argo.body, /deployment\/argo-web is deployed by Argo CD \(annotation argocd\.argoproj\.io\/tracking-id\)/);
    const again = await push('cluster', 'v52', later, () => wh, 'deployment/argo-web');
    assert.match(again.body, /is deployed by Argo CD/, 'refused again, on the copy the service keeps');
    const get = async (name: string) => containerImage(JSON.parse(await kubectl(['-n', ns, 'get', `deployment/${name}`, '-o', 'json'])), 'app');
    assert.equal(await get('flux-web'), acrImage('v1'), 'nothing patched');
    const patched = await push('patch-anyway', 'v51', later, () => wh, 'deployment/flux-web');
    assert.equal(actionOf(patched.body), 'image updated', patched.body);
    assert.equal(await get('flux-web'), acrImage('v51'));
  });

  test('GIT_SYNC_TIMEOUT: after the answer, the service waits for the GitOps tool to apply the commit, then follows and reports the rollout', async () => {
    const later = new Date(Date.now() + 30_000);
    const res = await push('synced', 'v60', later);
    assert.match(actionOf(res.body) ?? res.body, /^committed [0-9a-f]{7} to main of /, res.body);
    assert.match(res.body, /^rollout: +progressing \(committed to Git: the GitOps tool deploying the branch applies it; waited for up to 2m0s, then followed\)$/m);
    const commit = git(bare, ['rev-parse', '--short=7', 'main']).trim();
    // The GitOps tool: applies the committed image, as Argo CD's controller would.
    const committed = /image: '([^']+)'/.exec(git(bare, ['show', 'main:apps/web.yaml']))![1];
    assert.equal(committed, acrImage('v60'));
    await kubectl(['-n', ns, 'set', 'image', 'deployment/web', `app=${committed}`, '--field-manager=argocd-controller']);
    const done = await reported(res, 60_000, 'the synced rollout reported');
    assert.equal(done.rollout.state, 'complete', JSON.stringify(done));
    assert.ok(done.pods.every((p: any) => p.image === acrImage('v60')), 'the pods run the committed image');
    assert.match(done.report, new RegExp(`note: +commit ${commit} applied after \\d+s by Argo CD \\(manager argocd-controller\\)`));
  });

  test('the wait for the sync watches the workload (no read every 2 s); Fleet applying the commit is named', async () => {
    const count = async (verb: string) =>
      Number(new RegExp(`^webhook_kubernetes_requests_total\\{cluster="",verb="${verb}"\\} (\\d+)$`, 'm').exec((await wh.metrics()).body)?.[1] ?? 0);
    const q = new URLSearchParams({ token: HOOK_TOKEN, ns: watchedNs, workload: 'deployment/watched', container: 'app', repo_type: 'regionalregistry' });
    const res = await wh.request(`/hooks/watched?${q}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload('v70') });
    assert.match(actionOf(res.body) ?? res.body, /^committed [0-9a-f]{7} to main of /, res.body);
    // The hook fixes its workload, so the service holds a WATCH of the Deployments of its namespace from the start
    // (the approvals learn waiting pushes from it): the sync wait subscribes to it, it opens no second one.
    await waitFor(async () => (await count('watch')) > 0, { timeoutMs: 60_000, what: 'a WATCH of the Deployments the service waits on' });
    const reads = await count('get');
    await kubectl(['-n', watchedNs, 'set', 'image', 'deployment/watched', `app=${acrImage('v70')}`, '--field-manager=fleet-agent']);
    const done = await reported(res, 60_000, 'the synced rollout reported');
    assert.equal(done.rollout.state, 'complete', JSON.stringify(done));
    assert.match(done.report, /note: +commit [0-9a-f]{7} applied after \d+s by Fleet \(manager fleet-agent\)/);
    // Woken by the watch's event: one read of the workload then, not one every 2 s while it waited.
    assert.ok((await count('get')) - reads <= 3, `reads while waiting: ${(await count('get')) - reads}`);
  });

  test('ROLLBACK_ON_FAILURE: a failed rollout of a commit is reverted by a commit, not a PATCH', async () => {
    // As test/rollback.test.ts does: pods of `:broken…` images are labelled to crash-loop (kwok's stage) in this namespace.
    await crashLoopInForce(kubectl, ns);
    const running = await runningImage();
    const res = await push('revert', 'broken1', new Date(Date.now() + 40_000));
    assert.match(actionOf(res.body) ?? res.body, /^committed [0-9a-f]{7} to main of /, res.body);
    await kubectl(['-n', ns, 'set', 'image', 'deployment/web', `app=${acrImage('broken1')}`, '--field-manager=argocd-controller']);
    const done = await reported(res, 120_000, 'the failed rollout reported');
    const head = git(bare, ['rev-parse', '--short=7', 'main']).trim();
    assert.match(done.report, new RegExp(`^rollback: +rolled back to ${running!.replace(/\./g, '\\.')}: the rollout of \\S+:broken1 failed: .*; the revert committed as ${head} to main of `, 'm'), done.report);
    assert.match(git(bare, ['log', '-1', '--format=%s', 'main']), new RegExp(`^Revert to ${running!.replace(/\./g, '\\.')} to `));
    assert.match(git(bare, ['show', 'main:apps/web.yaml']), new RegExp(`image: '${running!.replace(/\./g, '\\.')}'`));
    assert.equal(await runningImage(), acrImage('broken1'), 'the cluster is not patched back: the GitOps tool applies the revert');
  });
});
