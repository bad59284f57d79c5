/*
 * GIT_PULL_REQUEST: a commit goes to a branch of the workload's own and a request into GIT_BRANCH is opened, or
 * the open one updated, over the forge's REST API (openRequest). Each forge's calls as its documentation gives them
 * (method, path and query, headers, body), checked by an HTTPS receiver of the test's own standing in for the forge,
 * as the chat tests check each vendor's shape; a refusal is named, the token nowhere in it. Then, through the
 * executable on the test cluster, a real forge (Gitea, built from the Go module proxy: test/gitea.ts) whose main
 * refuses direct pushes: a direct push fails, a push opens one request with the one-line change, a newer push
 * updates it, its merge (applied as a GitOps tool would) is followed to the rollout and the result, and the
 * token appears nowhere.
 * Outside CI the cluster tests are skipped when Gitea or the cluster cannot start; with CI=true they fail.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import {
  acrImage, acrPayload, clusterOrSkip, containerImage, crashLoopInForce, deployment, freshNamespaceName, kubectlFor, removeNamespace,
} from './cluster/kube.ts';
import { giteaOrSkip, startGitea, type Gitea, type GiteaRepo } from './gitea.ts';
import { adminPort, httpRequest, makeTempDir, startWebhook, waitFor, type Webhook } from './harness.ts';
import { startReceiver, type Receiver } from './receiver.ts';
import { upgradeHook } from './upgrade-hooks.ts';
import { openRequest, requestApiBase, type ForgeName } from '../webhook.ts';

const TOKEN = 'forge-token-7c1e93ab5d20';

/** Each forge: its repository URL, the calls of a first request (none open: listed, then opened) and of a second (updated). */
const SHAPES: Record<ForgeName, { repo: string; find: string; open: [string, string, object]; update: [string, string, object]; listed: object; opened: object; url: string; auth: string; extra?: Record<string, string> }> = {
  github: {
    repo: 'https://github.com/shop/deploy.git',
    find: '/repos/shop/deploy/pulls?state=open&head=shop%3Awebhook%2Fshop%2Fdeployment-web%2Fapp&base=main',
    open: ['POST', '/repos/shop/deploy/pulls', { title: 'Deploy it', head: 'webhook/shop/deployment-web/app', base: 'main', body: 'why' }],
    update: ['PATCH', '/repos/shop/deploy/pulls/7', { title: 'Deploy it', body: 'why' }],
    listed: [{ number: 7, html_url: 'https://github.com/shop/deploy/pull/7' }],
    opened: { number: 7, html_url: 'https://github.com/shop/deploy/pull/7' },
    url: 'https://github.com/shop/deploy/pull/7',
    auth: `Bearer ${TOKEN}`,
    extra: { accept: 'application/vnd.github+json', 'x-github-api-version': '2022-11-28' },
  },
  gitlab: {
    repo: 'https://gitlab.example.com/shop/apps/deploy.git',
    find: '/projects/shop%2Fapps%2Fdeploy/merge_requests?state=opened&source_branch=webhook%2Fshop%2Fdeployment-web%2Fapp&target_branch=main',
    open: ['POST', '/projects/shop%2Fapps%2Fdeploy/merge_requests', { source_branch: 'webhook/shop/deployment-web/app', target_branch: 'main', title: 'Deploy it', description: 'why', remove_source_branch: true }],
    update: ['PUT', '/projects/shop%2Fapps%2Fdeploy/merge_requests/7', { title: 'Deploy it', description: 'why' }],
    listed: [{ iid: 7, web_url: 'https://gitlab.example.com/shop/apps/deploy/-/merge_requests/7' }],
    opened: { iid: 7, web_url: 'https://gitlab.example.com/shop/apps/deploy/-/merge_requests/7' },
    url: 'https://gitlab.example.com/shop/apps/deploy/-/merge_requests/7',
    auth: '',
    extra: { 'private-token': TOKEN },
  },
  gitea: {
    repo: 'https://git.example.com/shop/deploy.git',
    find: '/repos/shop/deploy/pulls?state=open&limit=50',
    open: ['POST', '/repos/shop/deploy/pulls', { title: 'Deploy it', head: 'webhook/shop/deployment-web/app', base: 'main', body: 'why' }],
    update: ['PATCH', '/repos/shop/deploy/pulls/7', { title: 'Deploy it', body: 'why' }],
    listed: [{ number: 3, html_url: 'x', head: { ref: 'other' }, base: { ref: 'main' } },
      { number: 7, html_url: 'https://git.example.com/shop/deploy/pulls/7', head: { ref: 'webhook/shop/deployment-web/app' }, base: { ref: 'main' } }],
    opened: { number: 7, html_url: 'https://git.example.com/shop/deploy/pulls/7' },
    url: 'https://git.example.com/shop/deploy/pulls/7',
    auth: `token ${TOKEN}`,
  },
  bitbucket: {
    repo: 'https://bitbucket.org/shop/deploy.git',
    find: `/repositories/shop/deploy/pullrequests?state=OPEN&q=${encodeURIComponent('source.branch.name="webhook/shop/deployment-web/app" AND destination.branch.name="main"')}`,
    open: ['POST', '/repositories/shop/deploy/pullrequests', { title: 'Deploy it', description: 'why', source: { branch: { name: 'webhook/shop/deployment-web/app' } }, destination: { branch: { name: 'main' } }, close_source_branch: true }],
    update: ['PUT', '/repositories/shop/deploy/pullrequests/7', { title: 'Deploy it', description: 'why' }],
    listed: { values: [{ id: 7, links: { html: { href: 'https://bitbucket.org/shop/deploy/pull-requests/7' } } }] },
    opened: { id: 7, links: { html: { href: 'https://bitbucket.org/shop/deploy/pull-requests/7' } } },
    url: 'https://bitbucket.org/shop/deploy/pull-requests/7',
    auth: `Bearer ${TOKEN}`,
  },
  azure: {
    repo: 'https://dev.azure.com/contoso/shop/_git/deploy',
    find: '/contoso/shop/_apis/git/repositories/deploy/pullrequests?searchCriteria.sourceRefName=refs%2Fheads%2Fwebhook%2Fshop%2Fdeployment-web%2Fapp&searchCriteria.targetRefName=refs%2Fheads%2Fmain&searchCriteria.status=active&api-version=7.1',
    open: ['POST', '/contoso/shop/_apis/git/repositories/deploy/pullrequests?api-version=7.1', { sourceRefName: 'refs/heads/webhook/shop/deployment-web/app', targetRefName: 'refs/heads/main', title: 'Deploy it', description: 'why' }],
    update: ['PATCH', '/contoso/shop/_apis/git/repositories/deploy/pullrequests/7?api-version=7.1', { title: 'Deploy it', description: 'why' }],
    listed: { count: 1, value: [{ pullRequestId: 7 }] },
    opened: { pullRequestId: 7 },
    url: 'https://dev.azure.com/contoso/shop/_git/deploy/pullrequest/7',
    auth: `Basic ${Buffer.from(`:${TOKEN}`).toString('base64')}`,
  },
};

describe('openRequest: each forge as its documentation gives it', () => {
  let rx: Receiver;
  before(async () => (rx = await startReceiver({ status: 500, body: 'unexpected' })));
  after(() => rx.close());
  const request = (forge: ForgeName, repo: string) => ({
    forge, api: `${rx.base}/api`, remote: { url: new URL(repo), username: 'x-access-token', token: TOKEN, ca: rx.certPem },
    head: 'webhook/shop/deployment-web/app', base: 'main', title: 'Deploy it', description: 'why',
  });

  test("each forge's API base for a repository's URL, self-hosted or not", () => {
    assert.equal(requestApiBase('github', new URL(SHAPES.github.repo)), 'https://api.github.com');
    assert.equal(requestApiBase('github', new URL('https://ghe.example.com/shop/deploy.git')), 'https://ghe.example.com/api/v3');
    assert.equal(requestApiBase('gitlab', new URL(SHAPES.gitlab.repo)), 'https://gitlab.example.com/api/v4');
    assert.equal(requestApiBase('gitea', new URL('https://example.com/git/shop/deploy.git')), 'https://example.com/git/api/v1');
    assert.equal(requestApiBase('bitbucket', new URL(SHAPES.bitbucket.repo)), 'https://api.bitbucket.org/2.0');
    assert.equal(requestApiBase('azure', new URL(SHAPES.azure.repo)), 'https://dev.azure.com');
  });

  for (const [forge, shape] of Object.entries(SHAPES) as [ForgeName, (typeof SHAPES)[ForgeName]][])
    test(`${forge}: none open is listed, then opened; one open is updated`, async () => {
      rx.requests.length = 0;
      const empty = forge === 'bitbucket' ? { values: [] } : forge === 'azure' ? { count: 0, value: [] } : [];
      rx.answers.push({ status: 200, body: JSON.stringify(empty) }, { status: 201, body: JSON.stringify(shape.opened) });
      assert.deepEqual(await openRequest(request(forge, shape.repo)), { id: '7', url: shape.url, opened: true });
      rx.answers.push({ status: 200, body: JSON.stringify(shape.listed) }, { status: 200, body: '{}' });
      assert.deepEqual(await openRequest(request(forge, shape.repo)), { id: '7', url: shape.url, opened: false });
      const calls = rx.requests.map((r) => [r.method, r.url.replace(/^\/api/, ''), r.body ? JSON.parse(r.body) : undefined]);
      assert.deepEqual(calls, [['GET', shape.find, undefined], [...shape.open], ['GET', shape.find, undefined], [...shape.update]]);
      for (const r of rx.requests) {
        if (shape.auth) assert.equal(r.headers.authorization, shape.auth);
        for (const [name, value] of Object.entries(shape.extra ?? {})) assert.equal(r.headers[name], value, name);
        if (r.method !== 'GET') assert.equal(r.headers['content-type'], 'application/json');
        assert.match(String(r.headers['user-agent']), /^webhook\//);
      }
    });

  test('a request another replica opened in between (the forge refuses a second one): updated instead', async () => {
    rx.requests.length = 0;
    const shape = SHAPES.github;
    rx.answers.push({ status: 200, body: '[]' }, { status: 422, body: '{"message":"Validation Failed","errors":[{"message":"A pull request already exists for shop:webhook/shop/deployment-web/app."}]}' },
      { status: 200, body: JSON.stringify(shape.listed) }, { status: 200, body: '{}' });
    assert.deepEqual(await openRequest(request('github', shape.repo)), { id: '7', url: shape.url, opened: false });
    assert.deepEqual(rx.requests.map((r) => r.method), ['GET', 'POST', 'GET', 'PATCH']);
  });

  test("a refusal names the forge, the call, the status and the forge's words, never the token; an answer that is not JSON is named", async () => {
    rx.answers.push({ status: 403, body: `{"message":"Resource not accessible by integration","token":"${TOKEN}"}` });
    await assert.rejects(openRequest(request('github', SHAPES.github.repo)), (e: Error) => {
      assert.match(e.message, /^github GET https:\/\/127\.0\.0\.1:\d+\/api\/repos\/shop\/deploy\/pulls: 403: .*Resource not accessible by integration.* \(see https:\/\/docs\.github\.com\/en\/rest\/pulls\/pulls\)$/);
      assert.ok(!e.message.includes(TOKEN), e.message);
      return true;
    });
    rx.answers.push({ status: 200, body: '<html>login</html>' });
    await assert.rejects(openRequest(request('gitea', SHAPES.gitea.repo)), /^Error: gitea GET \S+\/api\/repos\/shop\/deploy\/pulls: the answer is not JSON$/);
  });
});

const gitea = await giteaOrSkip();
const cluster = gitea ? await clusterOrSkip() : undefined;

describe('a protected branch, through the executable, a real forge and the cluster', { skip: gitea && cluster ? false : 'no gitea or no cluster' }, () => {
  const kubectl = kubectlFor(cluster!);
  const ns = freshNamespaceName('pulls');
  const HOOK_TOKEN = 'pulls-hook-token-3a8d';
  const manifest = (tag: string) =>
    `apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  template:\n    spec:\n      containers:\n        - name: app\n          image: ${acrImage(tag)}\n`;
  let forge: Gitea;
  let repo: GiteaRepo;
  let wh: Webhook;
  const push = (hook: string, tag: string, workload = 'deployment/web') =>
    wh.request(`/hooks/${hook}?${new URLSearchParams({ token: HOOK_TOKEN, ns, workload, container: 'app', repo_type: 'regionalregistry' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag),
    });
  const actionOf = (body: string) => /^action: +(.*)$/m.exec(body)?.[1] ?? body;
  const branch = (name = 'web') => `webhook/${ns}/deployment-${name}/app`;
  const openPulls = async () => (await forge.api('GET', `/repos/${repo.fullName}/pulls?state=open`)).json as any[];
  /** The deliveries page's record of the push `res` answered, once it is done (its rollout followed and reported). */
  const reported = async (res: { headers: Record<string, unknown> }, what: string) => {
    const admin = await adminPort(wh);
    const id = String(res.headers['x-request-id']);
    return waitFor(async () => {
      const d = JSON.parse((await httpRequest(admin, '/deliveries.json')).body).deliveries.find((x: any) => x.request_id === id);
      return d?.state === 'done' ? d : undefined;
    }, { timeoutMs: 120_000, what });
  };

  before(async () => {
    forge = await startGitea();
    repo = await forge.createRepo('deploy', { 'apps/web.yaml': manifest('v1'), 'apps/api.yaml': manifest('v1').replace('name: web', 'name: api'), 'README.md': 'deploy\n' });
    await forge.protectBranch(repo.name, 'main');
    await kubectl(['create', 'namespace', ns]);
    for (const name of ['web', 'api'])
      await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment(name, [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })));
    const tokenFile = path.join(makeTempDir('pulls-token-'), 'token');
    fs.writeFileSync(tokenFile, forge.token);
    const git = { APP_NS: ns, APP_WORKLOAD: 'deployment/web', GIT_REPO: repo.cloneUrl, GIT_PATH: 'apps/web.yaml', GIT_TOKEN: tokenFile, GIT_USERNAME: forge.user };
    wh = await startWebhook({
      hooks: [
        upgradeHook('direct', HOOK_TOKEN, git),
        upgradeHook('request', HOOK_TOKEN, { ...git, GIT_PULL_REQUEST: 'gitea', GIT_SYNC_TIMEOUT: '5m' }),
        // A pod stuck 5 s fails the rollout (only pods of :broken images are ever stuck here).
        upgradeHook('revert', HOOK_TOKEN, { ...git, APP_WORKLOAD: 'deployment/api', GIT_PATH: 'apps/api.yaml', GIT_PULL_REQUEST: 'forgejo',
          GIT_SYNC_TIMEOUT: '5m', ROLLBACK_ON_FAILURE: 'true', ROLLOUT_STUCK_TIMEOUT: '5s' }),
      ],
      // No git program on PATH: the service speaks git's protocol and the forge's API itself.
      env: { KUBECONFIG: cluster!.kubeconfigPath, PATH: makeTempDir('no-git-path-') },
      args: ['-deliveries', '50'],
      metrics: true,
    });
  });
  after(async () => {
    await wh?.stop();
    await forge?.close();
    await removeNamespace(kubectl, ns);
  });

  test('a direct push to the protected main fails and writes nothing; a push opens one request with the one-line change; a newer push updates it', async () => {
    const direct = await push('direct', 'v2');
    assert.notEqual(direct.status, 200);
    assert.match(direct.body, /^result: +failed: Git write-back: .*the server refused the push to main/m, direct.body);
    assert.equal(await forge.fileAt(repo.name, 'main', 'apps/web.yaml'), manifest('v1'));

    const first = await push('request', 'v2');
    assert.equal(first.status, 200, first.body);
    assert.match(actionOf(first.body), new RegExp(`^committed [0-9a-f]{7} to ${branch()} of ${repo.cloneUrl.replace(/[.]/g, '\\.')}; pull request #(\\d+) opened: ${forge.base}/\\S+/pulls/\\d+$`));
    let pulls = await openPulls();
    assert.equal(pulls.length, 1);
    assert.equal(pulls[0].head.ref, branch());
    assert.equal(pulls[0].base.ref, 'main');
    assert.match(pulls[0].title, /^Deploy \S+:v2 to /);
    const changed = String((await forge.api('GET', `/repos/${repo.fullName}/pulls/${pulls[0].number}/files`)).json.map((f: any) => `${f.filename}:${f.additions}+${f.deletions}-`));
    assert.equal(changed, 'apps/web.yaml:1+1-');
    assert.equal(await forge.fileAt(repo.name, 'main', 'apps/web.yaml'), manifest('v1'), 'main is not written before the merge');
    assert.equal(containerImage(JSON.parse(await kubectl(['-n', ns, 'get', 'deployment/web', '-o', 'json'])), 'app'), acrImage('v1'));

    const second = await push('request', 'v3');
    assert.match(actionOf(second.body), new RegExp(`; pull request #${pulls[0].number} updated: `), second.body);
    pulls = await openPulls();
    assert.equal(pulls.length, 1, 'the newer push updated the open request, it opened no other');
    assert.match(pulls[0].title, /^Deploy \S+:v3 to /);
    assert.equal(await forge.fileAt(repo.name, branch(), 'apps/web.yaml'), manifest('v3'));
    const commits = (await forge.api('GET', `/repos/${repo.fullName}/pulls/${pulls[0].number}/commits`)).json;
    assert.equal(commits.length, 1, 'one commit on the branch: the newer push replaced the older one');

    // The merge, then the GitOps tool applying main: followed to the rollout and the result.
    await forge.mergePull(repo.name, pulls[0].number);
    assert.equal(await forge.fileAt(repo.name, 'main', 'apps/web.yaml'), manifest('v3'));
    await kubectl(['-n', ns, 'set', 'image', 'deployment/web', `app=${acrImage('v3')}`, '--field-manager=argocd-controller']);
    const done = await reported(second, 'the merged request followed to its rollout');
    assert.equal(done.rollout.state, 'complete', JSON.stringify(done));
    assert.match(done.report, /applied after \d+s by Argo CD/);
    assert.match(done.report, /pull request #\d+ updated: http/);

    for (const text of [direct.body, first.body, second.body, wh.output(), JSON.stringify(done)])
      assert.ok(!text.includes(forge.token), 'the token appears nowhere');
  });

  test('ROLLBACK_ON_FAILURE: a failed rollout of a merged request opens the revert as a request of its own', async () => {
    const policy = `webhook-test-crashloop-${ns}`;
    await crashLoopInForce(kubectl, ns);
    try {
      const res = await push('revert', 'broken1', 'deployment/api');
      assert.match(actionOf(res.body), /; pull request #\d+ opened: /, res.body);
      const [pull] = (await openPulls()).filter((p) => p.head.ref === branch('api'));
      await forge.mergePull(repo.name, pull.number);
      await kubectl(['-n', ns, 'set', 'image', 'deployment/api', `app=${acrImage('broken1')}`, '--field-manager=argocd-controller']);
      const done = await reported(res, 'the failed rollout reported');
      assert.match(done.report, new RegExp(`^rollback: +rolled back to ${acrImage('v1').replace(/[.]/g, '\\.')}: .*; the revert committed as [0-9a-f]{7} to ${branch('api')}-revert of .*; pull request #\\d+ opened: `, 'm'), done.report);
      const reverts = (await openPulls()).filter((p) => p.head.ref === `${branch('api')}-revert`);
      assert.equal(reverts.length, 1);
      assert.match(reverts[0].title, /^Revert to \S+:v1 to /);
      assert.equal(await forge.fileAt(repo.name, `${branch('api')}-revert`, 'apps/api.yaml'), manifest('v1').replace('name: web', 'name: api'));
      assert.equal(await forge.fileAt(repo.name, 'main', 'apps/api.yaml'), manifest('broken1').replace('name: web', 'name: api'), 'main waits for the revert\'s merge');
    } finally {
      await kubectl(['delete', 'mutatingadmissionpolicybinding,mutatingadmissionpolicy', policy, '--ignore-not-found']).catch(() => '');
    }
  });
});
