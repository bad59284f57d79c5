/*
 * The Gitea test peer (test/gitea.ts) does what the forge tests need of a forge: a repository made
 * by API serves git's smart HTTP with the token as password; a protected main refuses a push; a
 * branch pushed beside it becomes a pull request that is opened, updated, listed and merged by API,
 * and main then holds the branch's change.
 * Outside CI the test is skipped when Gitea cannot be built; with CI=true it fails.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'node:test';
import { git } from './git-server.ts';
import { giteaOrSkip, startGitea } from './gitea.ts';
import { makeTempDir } from './harness.ts';

const gitea = await giteaOrSkip();

test('a protected main takes changes only by a pull request merged through the API', { skip: gitea ? false : 'no gitea' }, async () => {
  const forge = await startGitea();
  try {
    const version = await forge.api('GET', '/version');
    assert.equal(version.status, 200);
    assert.equal(version.json.version, '1.27.3');

    const repo = await forge.createRepo('app', { 'deploy/values.yaml': 'image: app:1.0.0\n', 'README.md': 'app\n' });
    await forge.protectBranch(repo.name, 'main');
    const rules = await forge.api('GET', `/repos/${repo.fullName}/branch_protections`);
    assert.equal(rules.status, 200);
    assert.deepEqual(rules.json.map((r: { rule_name: string; enable_push: boolean }) => [r.rule_name, r.enable_push]), [['main', false]]);

    // Smart HTTP with user:token: the clone has main and its files.
    const work = path.join(makeTempDir('gitea-work-'), 'app');
    git(path.dirname(work), ['clone', '-q', repo.pushUrl, work]);
    assert.equal(git(work, ['rev-parse', '--abbrev-ref', 'HEAD']).trim(), 'main');
    assert.equal(fs.readFileSync(path.join(work, 'deploy/values.yaml'), 'utf8'), 'image: app:1.0.0\n');

    // A push to main is refused by Gitea's pre-receive hook, the administrator's included.
    fs.writeFileSync(path.join(work, 'deploy/values.yaml'), 'image: app:1.1.0\n');
    git(work, ['commit', '-q', '-am', 'bump app to 1.1.0']);
    const refused = pushFails(work, repo.pushUrl, 'HEAD:refs/heads/main');
    assert.match(refused, /protected|declined|not allowed/i);
    assert.equal(await forge.fileAt(repo.name, 'main', 'deploy/values.yaml'), 'image: app:1.0.0\n');

    // The same commit on a branch of its own is taken, and proposed.
    git(work, ['push', '-q', repo.pushUrl, 'HEAD:refs/heads/bump-app']);
    const index = await forge.openPull(repo.name, { head: 'bump-app', base: 'main', title: 'Bump app to 1.1.0', body: 'by the test' });
    const edited = await forge.api('PATCH', `/repos/${repo.fullName}/pulls/${index}`, { title: 'Bump app to 1.1.0 (edited)', body: 'edited by the test' });
    assert.equal(edited.status, 201);
    assert.equal(edited.json.title, 'Bump app to 1.1.0 (edited)');
    const open = await forge.api('GET', `/repos/${repo.fullName}/pulls?state=open`);
    assert.equal(open.status, 200);
    assert.deepEqual(open.json.map((p: { number: number; head: { ref: string } }) => [p.number, p.head.ref]), [[index, 'bump-app']]);

    // Merged by API (not a push), main has the change and the pull request is closed.
    await forge.mergePull(repo.name, index);
    assert.equal(await forge.fileAt(repo.name, 'main', 'deploy/values.yaml'), 'image: app:1.1.0\n');
    const merged = await forge.api('GET', `/repos/${repo.fullName}/pulls/${index}`);
    assert.equal(merged.json.merged, true);
    assert.equal(merged.json.state, 'closed');
    git(work, ['fetch', '-q', repo.pushUrl, 'main']);
    assert.equal(git(work, ['show', 'FETCH_HEAD:deploy/values.yaml']), 'image: app:1.1.0\n');
  } finally {
    await forge.close();
  }
});

/** The stderr of a `git push` (test/git-server.ts's git) that must fail. */
function pushFails(cwd: string, url: string, refspec: string): string {
  try {
    git(cwd, ['push', url, refspec]);
  } catch (e) {
    return String((e as { stderr?: string }).stderr);
  }
  assert.fail(`git push ${refspec} was accepted`);
}
