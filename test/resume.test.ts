/*
 * Follows survive the replica that started them: the image's PATCH records the follow on the
 * workload (webhook/follow: request, hook, deadline, MAIL_TO); a replica that starts later finds
 * it for the hooks it serves and follows the rollout to its end; of several such replicas, only
 * the one whose PATCH takes the record off reports it, so exactly one mail goes out. Built
 * executable, real test cluster, real exim. A paused Deployment holds its rollout open until the
 * test resumes it, so "mid-follow" is a state the test sets, not a moment it guesses.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { adminPort, httpRequest, startWebhook, waitFor, waitForOutput, type Webhook } from './harness.ts';
import { readMail, serviceMailEnv, startMta, type Mta } from './mta.ts';
import {
  acrImage, acrPayload, clusterOrSkip, containerImage, deployment, freshNamespaceName, kubectlFor, namespacedGetter,
  removeNamespace,
} from './cluster/kube.ts';
import { upgradeHook } from './upgrade-hooks.ts';

const TOKEN = 'resume-token-3be81f';
const cluster = await clusterOrSkip();

/** The hook pinned to one workload (as deploy/hooks/web.json is): what a starting replica resumes. */
function pinnedHook(ns: string): object {
  const hook = upgradeHook('slow', TOKEN, { MAIL_TO: 'ops@example.com' }) as Record<string, unknown>;
  const rule = (name: string, value: string) => ({ match: { type: 'value', value, parameter: { source: 'url', name } } });
  hook['trigger-rule'] = { and: [rule('token', TOKEN), rule('ns', ns), rule('workload', 'deployment/slow'), rule('container', 'app')] };
  return hook;
}

describe('a follow outlives the replica that started it', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('resume');
  const kubectl = kubectlFor(cluster!);
  const getJson = namespacedGetter(kubectl, ns);
  let mta: Mta;
  const started: Webhook[] = [];
  const start = async (args: string[] = []) => {
    const wh = await startWebhook({
      hooks: [pinnedHook(ns), pairHook(ns)],
      metrics: true,
      args,
      env: {
        KUBECONFIG: cluster!.kubeconfigPath,
        ...serviceMailEnv(mta),
      },
    });
    started.push(wh);
    return wh;
  };
  const push = (wh: Webhook, tag: string) =>
    wh.request(`/hooks/slow?${new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/slow', container: 'app', repo_type: 'regionalregistry' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag),
    });

  before(async () => {
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('slow', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })));
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('pair', [{ name: 'app', image: acrImage('v1') }, { name: 'side', image: acrImage('v1') }], { replicas: 1 })));
    for (const w of ['slow', 'pair']) await kubectl(['-n', ns, 'rollout', 'status', `deployment/${w}`, '--timeout=90s']);
    mta = await startMta();
  });
  after(async () => {
    await Promise.all(started.map((w) => w.stop()));
    await mta?.stop();
    await removeNamespace(kubectl, ns);
  });

  test('a replica killed mid-follow: of two replicas started after it, one finishes the follow and exactly one mail goes out', async () => {
    await kubectl(['-n', ns, 'rollout', 'pause', 'deployment/slow']);
    const first = await start();
    const res = await push(first, 'v2');
    assert.equal(res.status, 200, res.body);
    assert.match(res.body, /^rollout: +progressing/m);
    const follows = JSON.parse((await getJson('deployment/slow')).metadata.annotations['webhook/follow']);
    const request = follows.app.request;
    assert.equal(follows.app.hook, 'slow');
    assert.equal(follows.app.mailTo, 'ops@example.com');
    assert.ok(Date.parse(follows.app.deadline) > Date.now());
    first.proc.kill('SIGKILL');
    await first.exited;

    const [b, c] = await Promise.all([start(), start()]);
    for (const wh of [b, c]) await waitForOutput(wh, `[${request}] deployment/slow in ${ns}: resuming the rollout's follow`, 30_000);
    await kubectl(['-n', ns, 'rollout', 'resume', 'deployment/slow']);
    const [raw] = await mta.waitForMessages(1, 90_000);
    // Both replicas have settled: one sent the mail, the other saw the record taken.
    const sent = new RegExp(`\\[${request}\\] mail sent to ops@example\\.com`);
    const yielded = `[${request}] deployment/slow in ${ns}: another replica reported the rollout's end`;
    await waitFor(() => (sent.test(b.output()) && c.output().includes(yielded)) || (sent.test(c.output()) && b.output().includes(yielded)),
      { timeoutMs: 60_000, what: 'one replica to mail and the other to find the record taken' });
    assert.equal((await mta.messages()).length, 1, 'exactly one mail');
    // The replica that ended the follow keeps its record like any push's: on its deliveries page, final.
    const mailer = sent.test(b.output()) ? b : c;
    const page = JSON.parse((await httpRequest(await adminPort(mailer), '/deliveries.json')).body);
    const resumed = page.deliveries.find((x: { request_id: string }) => x.request_id === request);
    assert.ok(resumed, `the resumed follow is on the page: ${JSON.stringify(page)}`);
    assert.deepEqual([resumed.hook, resumed.decision, resumed.outcome, resumed.rollout.state, resumed.workload],
      ['slow', 'applied', 'succeeded', 'complete', 'deployment/slow']);
    const mail = readMail(raw);
    assert.equal(mail.subject, `Webhooks通知: ${ns}-deployment/slow-app 更新结果: succeeded`);
    assert.match(mail.body, new RegExp(`^request: ${request}$`, 'm'));
    assert.match(mail.body, new RegExp(`^image after: +${acrImage('v2').replace(/\./g, '\\.')}$`, 'm'));
    assert.match(mail.body, /^rollout: +complete/m);
    assert.match(mail.body, /^note: +the rollout was followed to its end by a replica started after the one that applied the push$/m);
    const d = await getJson('deployment/slow');
    assert.deepEqual(JSON.parse(d.metadata.annotations['webhook/follow']), {});
    assert.equal(containerImage(d, 'app'), acrImage('v2'));
    await mta.clear();
  });

  test('a replica stopped with SIGTERM mid-follow leaves the follow to the next one instead of mailing "timed out"', async () => {
    await kubectl(['-n', ns, 'rollout', 'pause', 'deployment/slow']);
    const [leaving] = started.filter((w) => w.proc.exitCode === null && w.proc.signalCode === null);
    const res = await push(leaving, 'v3');
    assert.match(res.body, /^rollout: +progressing/m);
    const request = JSON.parse((await getJson('deployment/slow')).metadata.annotations['webhook/follow']).app.request;
    await leaving.stop();
    assert.match(leaving.output(), new RegExp(`\\[${request}\\] deployment/slow in ${ns}: stopping; the rollout's follow is left to the replica that starts next`));
    assert.doesNotMatch(leaving.output(), new RegExp(`\\[${request}\\] mail sent`));
    const next = await start();
    await waitForOutput(next, `[${request}] deployment/slow in ${ns}: resuming the rollout's follow`, 30_000);
    await kubectl(['-n', ns, 'rollout', 'resume', 'deployment/slow']);
    const [raw] = await mta.waitForMessages(1, 90_000);
    const mail = readMail(raw);
    assert.match(mail.body, new RegExp(`^request: ${request}$`, 'm'));
    assert.match(mail.body, /^rollout: +complete/m);
  });

  test('a push to another container of the workload supersedes a follow in the same replica, which takes its record off', async () => {
    await mta.clear();
    await kubectl(['-n', ns, 'rollout', 'pause', 'deployment/pair']);
    const wh = started.find((w) => w.proc.exitCode === null && w.proc.signalCode === null)!;
    const pushPair = (container: string, tag: string) =>
      wh.request(`/hooks/pair?${new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/pair', container, repo_type: 'regionalregistry' })}`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag),
      });
    assert.match((await pushPair('app', 'v2')).body, /^rollout: +progressing/m);
    assert.deepEqual(Object.keys(JSON.parse((await getJson('deployment/pair')).metadata.annotations['webhook/follow'])), ['app']);
    assert.match((await pushPair('side', 'v2')).body, /^rollout: +progressing/m);
    await waitFor(async () => Object.keys(JSON.parse((await getJson('deployment/pair')).metadata.annotations['webhook/follow'])).join() === 'side',
      { timeoutMs: 60_000, what: "the superseded follow's record to be taken off" });
    await kubectl(['-n', ns, 'rollout', 'resume', 'deployment/pair']);
    // Both pushes are mailed (the first as superseded), and the next test counts mails from zero.
    const mails = (await mta.waitForMessages(2, 90_000)).map((raw) => readMail(raw));
    const superseded = mails.find((m) => m.subject.includes('deployment/pair-app'));
    assert.match(superseded?.body ?? '', /^rollout: +progressing \(superseded by a later push/m);
    assert.match(mails.find((m) => m.subject.includes('deployment/pair-side'))?.body ?? '', /^rollout: +complete/m);
  });

  test('forged follow records: resumed only for the hook that fixes the workload, mailed to that hook\'s MAIL_TO; the rest dropped with a warning', async () => {
    await mta.clear();
    const soon = new Date(Date.now() + 60_000).toISOString();
    const annotate = (workload: string, records: object) =>
      kubectl(['-n', ns, 'annotate', '--overwrite', workload, `webhook/follow=${JSON.stringify(records)}`]);
    // What anyone who may edit the workloads can write: their own recipients and rollback, a hook for
    // another workload, a container the workload lacks, and a deadline that is not a time.
    await annotate('deployment/slow', {
      app: { request: 'forged-1', hook: 'slow', deadline: soon, mailTo: 'attacker@evil.example', rollback: true },
      ghost: { request: 'forged-2', hook: 'slow', deadline: soon },
      side: 'not a record',
    });
    await annotate('deployment/pair', {
      app: { request: 'forged-3', hook: 'slow', deadline: soon, mailTo: 'attacker@evil.example' },
      side: { request: 'forged-4', hook: 'pair', deadline: 'soon' },
    });
    const wh = await start();
    await waitForOutput(wh, `[forged-1] deployment/slow in ${ns}: resuming the rollout's follow`, 30_000);
    for (const line of [
      `deployment/slow in ${ns}: follow record of container "ghost" dropped: hook "slow" upgrades container app only`,
      `deployment/slow in ${ns}: follow record "side" dropped: malformed`,
      `deployment/pair in ${ns}: follow record of container "app" dropped: hook "slow" is not a hook this replica serves for this workload`,
      `deployment/pair in ${ns}: follow record of container "side" dropped: deadline "soon" is not a time`,
    ]) await waitForOutput(wh, line, 30_000);
    const [raw] = await mta.waitForMessages(1, 90_000);
    assert.match(raw, /^To: ops@example\.com/m);
    assert.doesNotMatch(raw, /attacker/);
    await waitFor(() => /\[forged-1\] mail sent to ops@example\.com/.test(wh.output()), { timeoutMs: 30_000, what: 'the mail to be logged' });
    for (const request of ['forged-2', 'forged-3', 'forged-4']) assert.ok(!wh.output().includes(`[${request}] `), `${request} was resumed`);
    assert.doesNotMatch(wh.output(), /attacker@evil\.example/);
    assert.equal((await mta.messages()).length, 1, 'one mail, to the hook\'s recipients');
  });

  test('with -approval-key-file a follow record is sealed: a replica resumes the one a replica wrote, never one written by hand', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'resume-key-'));
    fs.writeFileSync(path.join(dir, 'key'), 'resume-seal-key-8d2f4a6c1e9b3d5f7a0c2e4b6d8f1a3c\n');
    const keyed = ['-public-url', 'https://webhook.example.test', '-approval-key-file', path.join(dir, 'key')];
    await kubectl(['-n', ns, 'rollout', 'pause', 'deployment/slow']);
    const first = await start(keyed);
    const res = await push(first, 'v4');
    assert.equal(res.status, 200, res.body);
    const request = res.headers['x-request-id'];
    const record = await waitFor(async () => JSON.parse((await getJson('deployment/slow')).metadata.annotations['webhook/follow'] ?? '{}').app,
      { timeoutMs: 30_000, what: 'the follow record' });
    assert.equal(record.request, request);
    assert.match(record.mac, /^[\w-]{43}$/, 'sealed');
    first.proc.kill('SIGKILL');
    await first.exited;
    const second = await start(keyed);
    await waitForOutput(second, `[${request}] deployment/slow in ${ns}: resuming the rollout's follow`, 30_000);
    await kubectl(['-n', ns, 'rollout', 'resume', 'deployment/slow']);
    await waitFor(async () => JSON.parse((await getJson('deployment/slow')).metadata.annotations['webhook/follow']).app === undefined,
      { timeoutMs: 90_000, what: 'the resumed follow to end' });
    await second.stop();
    // Written by hand, as anyone who may edit the workload can: no MAC, or the real one moved to another request.
    const soon = new Date(Date.now() + 60_000).toISOString();
    await kubectl(['-n', ns, 'annotate', '--overwrite', 'deployment/slow', `webhook/follow=${JSON.stringify({
      app: { ...record, request: 'forged-6', deadline: soon } })}`]);
    const third = await start(keyed);
    await waitForOutput(third, `deployment/slow in ${ns}: follow record of container "app" dropped: its MAC does not verify`, 30_000);
    assert.ok(!third.output().includes('[forged-6] '), 'the forged record is not resumed');
  });
});

/** A hook for deployment/pair whose container comes from the URL. */
function pairHook(ns: string): object {
  const hook = upgradeHook('pair', TOKEN, { MAIL_TO: 'ops@example.com' }) as Record<string, unknown>;
  const rule = (name: string, value: string) => ({ match: { type: 'value', value, parameter: { source: 'url', name } } });
  hook['trigger-rule'] = { and: [rule('token', TOKEN), rule('ns', ns), rule('workload', 'deployment/pair')] };
  return hook;
}

