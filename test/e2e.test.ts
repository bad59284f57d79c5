/*
 * End to end: registry pushes over HTTP to the built executable, serving the seed hook (loaded from
 * a directory through WEBHOOK_CMD=-template), whose /webhooks.sh is the bundled entry point run
 * in-process; each test checks the workloads on the real test cluster afterwards.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { defaultBinary, httpRequest, makeTempDir, spawnWebhook, startWebhook, waitFor, waitForOutput, type Webhook } from './harness.ts';
import { serviceMailEnv, startMta, type Mta } from './mta.ts';
import {
  acrImage, acrPayload, clusterOrSkip, containerImage, cronJob, daemonSet, deployment, freshNamespaceName,
  kubectlFor, namespacedGetter, pushedState, removeNamespace, shippedServiceAccount, statefulSet,
} from './cluster/kube.ts';

const REPO = path.join(import.meta.dirname, '..');
const TOKEN = 'e2e-token-9a41c7d2';
const cluster = await clusterOrSkip();

/**
 * The seed hook as shipped, pointed at this repository's webhooks.sh and this run's namespace, and
 * a few variants of it: "any" (token only, for other workloads), "pinned" (PIN_DIGEST=true),
 * "tracked" (ROLLOUT_TIMEOUT=60s: the answer waits for the rollout) and "widened" (ALLOW_IMAGES
 * lets it deploy one more repository).
 */
function hookDirectory(ns: string): string {
  const dir = makeTempDir('e2e-hooks-');
  const seedText = fs.readFileSync(path.join(REPO, 'examples', 'hooks', 'web.json'), 'utf8')
    .replace('"/webhooks.sh"', JSON.stringify(path.join(REPO, 'webhooks.sh')))
    .replace('"/home"', JSON.stringify(dir))
    .replace('"value": "prod"', `"value": ${JSON.stringify(ns)}`);
  fs.writeFileSync(path.join(dir, 'web.json'), seedText);
  const seed = JSON.parse(seedText.replace('{{ getenv \\"HOOK_TOKEN\\" }}', TOKEN))[0];
  const tokenOnly = { match: { type: 'value', value: '{{ getenv "HOOK_TOKEN" }}', parameter: { source: 'url', name: 'token' } } };
  const variant = (id: string, env: Record<string, string>) => ({
    ...seed, id, 'trigger-rule': tokenOnly,
    'pass-environment-to-command': [...seed['pass-environment-to-command'], ...Object.entries(env).map(([envname, name]) => ({ envname, source: 'string', name }))],
  });
  fs.writeFileSync(path.join(dir, 'variants.json'), JSON.stringify([
    variant('any', {}), variant('pinned', { PIN_DIGEST: 'true' }), variant('tracked', { ROLLOUT_TIMEOUT: '60s' }),
    variant('widened', { ALLOW_IMAGES: 'evil.example:5000/x/backdoor' }),
  ], null, 1));
  return dir;
}

describe('the image pin settings through the executable', () => {
  test('a malformed ALLOW_IMAGES, or one the request could set, stops the load with file, line and field', async () => {
    for (const [setting, field, problem] of [
      [{ envname: 'ALLOW_IMAGES', source: 'string', name: 'registry.cn-hangzhou.aliyuncs.com/shop/web-*' }, 'name',
        'ALLOW_IMAGES pattern "registry.cn-hangzhou.aliyuncs.com/shop/web-*" has a "*" that is not a trailing "/*"'],
      [{ envname: 'ALLOW_IMAGES', source: 'url', name: 'allow' }, 'source', 'ALLOW_IMAGES must be fixed in the hook file ("source": "string")'],
    ] as const) {
      const dir = makeTempDir('e2e-pin-hooks-');
      const seed = JSON.parse(fs.readFileSync(path.join(REPO, 'examples', 'hooks', 'web.json'), 'utf8'));
      seed[0]['pass-environment-to-command'].push(setting);
      const text = JSON.stringify(seed, null, 2);
      fs.writeFileSync(path.join(dir, 'web.json'), text);
      const lines = text.split('\n');
      const item = lines.findIndex((l) => l.includes('"envname": "ALLOW_IMAGES"'));
      const line = lines.findIndex((l, i) => i > item && l.includes(`"${field}": `)) + 1;
      const s = await spawnWebhook({ hooks: dir, env: { WEBHOOK_CMD: '-template', HOOK_TOKEN: TOKEN } });
      let exit: { code: number | null } | undefined;
      void s.exited.then((e) => (exit = e));
      // Either it stops at the load, or it loaded the hook and serves: then the check is missing.
      while (!exit) {
        if ((await httpRequest(s.port, '/').catch(() => undefined))?.status === 200) {
          s.proc.kill('SIGKILL');
          assert.fail(`the hook loaded and is served:\n${s.output()}`);
        }
        await new Promise((r) => setTimeout(r, 50));
      }
      assert.notEqual(exit.code, 0, s.output());
      assert.ok(s.output().includes(`${path.join(dir, 'web.json')}:${line}: hook "web": pass-environment-to-command[6].${field}: ${problem}`), s.output());
    }
  });
});

describe('pushes through the running executable, on a real cluster', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('e2e');
  const kubectl = kubectlFor(cluster!);
  const getJson = namespacedGetter(kubectl, ns);
  let wh: Webhook;
  const push = (hook: string, query: Record<string, string>, body: string) =>
    wh.request(`/hooks/${hook}?${new URLSearchParams({ token: TOKEN, ns, ...query })}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body });
  const seedQuery = (more: Record<string, string> = {}) => ({ workload: 'deployment/web', container: 'app', repo_type: 'regionalregistry', ...more });

  before(async () => {
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
      deployment('web', [{ name: 'app-sidecar', image: 'busybox:1.36' }, { name: 'app', image: acrImage('v1') }]),
      daemonSet('agent', [{ name: 'app', image: 'shopteam/web-api:v1' }]),
      statefulSet('db', 1, [{ name: 'app', image: 'harbor.example.com:8443/shop/web-api:1.4.1' }]),
      cronJob('nightly', [{ name: 'app', image: acrImage('v1') }]),
      deployment('broken', [{ name: 'app', image: acrImage('v1') }], { progressDeadlineSeconds: 3, replicas: 1 }, { 'webhook-test/unready': 'true' }),
      deployment('busy', [{ name: 'app', image: acrImage('v0') }], { replicas: 1 }),
      deployment('edge', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 }),
    ] }));
    for (const w of ['deployment/web', 'daemonset/agent', 'statefulset/db', 'deployment/busy']) await kubectl(['-n', ns, 'rollout', 'status', w, '--timeout=90s']);
    wh = await startWebhook({ hooks: hookDirectory(ns), env: { WEBHOOK_CMD: '-template', HOOK_TOKEN: TOKEN, KUBECONFIG: cluster!.kubeconfigPath } });
  });
  after(async () => {
    await wh?.stop();
    await removeNamespace(kubectl, ns);
  });

  test('ACR push with each net_type through the seed hook: only the named container changes', async () => {
    for (const [netType, tag] of [['', 'v2'], ['vpc', 'v3'], ['internal', 'v4']] as const) {
      const res = await push('web', seedQuery(netType ? { net_type: netType } : {}), acrPayload(tag));
      assert.equal(res.status, 200, res.body);
      assert.equal(res.headers['access-control-allow-origin'], '*');
      assert.match(res.body, new RegExp(`^image after: +${acrImage(tag, netType).replace(/\./g, '\\.')}$`, 'm'));
      assert.match(res.body, /^action: +image updated$/m);
      const d = await getJson('deployment/web');
      assert.equal(containerImage(d, 'app'), acrImage(tag, netType));
      assert.equal(containerImage(d, 'app-sidecar'), 'busybox:1.36');
    }
  });

  test('the rollout is followed after the answer: logged and recorded as an Event', async () => {
    await waitForOutput(wh, new RegExp(`deployment/web in ${ns}: rollout complete`), 60_000);
    const events = (await getJson('events')).items.filter((e: { reason: string; involvedObject: { name: string } }) => e.involvedObject.name === 'web');
    assert.ok(events.some((e: { reason: string }) => e.reason === 'RolloutComplete'));
  });

  test('the Events of the changes are recorded after the answers', async () => {
    const reasons = async () => (await getJson('events')).items
      .filter((e: { involvedObject: { name: string } }) => e.involvedObject.name === 'web')
      .map((e: { reason: string; message: string }) => `${e.reason} ${e.message}`);
    await waitFor(async () => ((await reasons()).filter((r: string) => r.startsWith('ImageUpdated')).length >= 3 ? true : undefined), { what: 'three ImageUpdated Events' });
    assert.ok((await reasons()).some((r: string) => r.includes(`→ ${acrImage('v4', 'internal')}`)));
  });

  test('a workload changed behind the service\'s back is read again before it is patched', async () => {
    // The service keeps the workload as its last PATCH returned it; that copy is now stale.
    await kubectl(['-n', ns, 'set', 'image', 'deployment/web', `app=${acrImage('side', 'internal')}`]);
    const res = await push('web', seedQuery({ net_type: 'internal' }), acrPayload('v5'));
    assert.equal(res.status, 200, res.body);
    assert.match(res.body, new RegExp(`^image before: +${acrImage('side', 'internal').replace(/\./g, '\\.')}$`, 'm'));
    assert.equal(containerImage(await getJson('deployment/web'), 'app'), acrImage('v5', 'internal'));
    // Back to the tag the next tests expect.
    assert.equal((await push('web', seedQuery({ net_type: 'internal' }), acrPayload('v4'))).status, 200);
  });

  test('the same tag again restarts the rollout so the tag is re-pulled', async () => {
    const restartedBefore = (await getJson('deployment/web')).spec.template.metadata.annotations?.['kubectl.kubernetes.io/restartedAt'];
    const res = await push('web', seedQuery({ net_type: 'internal' }), acrPayload('v4'));
    assert.equal(res.status, 200, res.body);
    assert.match(res.body, /^action: +rollout restarted \(same image re-pulled\)$/m);
    const d = await getJson('deployment/web');
    const restarted = d.spec.template.metadata.annotations['kubectl.kubernetes.io/restartedAt'];
    assert.ok(restarted && restarted !== restartedBefore, `restartedAt ${restarted}, before ${restartedBefore}`);
    assert.equal(d.spec.template.spec.containers.find((c: { name: string }) => c.name === 'app').imagePullPolicy, 'Always');
  });

  test('Docker Hub push to a daemonset; Docker Hub test ping is acknowledged and changes nothing', async () => {
    const hub = fs.readFileSync(path.join(REPO, 'test', 'fixtures', 'upgrade', 'dockerhub-push.json'), 'utf8');
    const res = await push('any', { workload: 'daemonset/agent', container: 'app', repo_type: 'publicregistry' }, hub);
    assert.equal(res.status, 200, res.body);
    assert.equal(containerImage(await getJson('daemonset/agent'), 'app'), 'shopteam/web-api:v2.3.1');
    const generation = (await getJson('daemonset/agent')).metadata.generation;
    const ping = fs.readFileSync(path.join(REPO, 'test', 'fixtures', 'upgrade', 'dockerhub-test-ping.json'), 'utf8');
    const pinged = await push('any', { workload: 'daemonset/agent', container: 'app', repo_type: 'publicregistry' }, ping);
    assert.equal(pinged.status, 200, pinged.body);
    assert.match(pinged.body, /^action: +none \(test ping/m);
    assert.equal((await getJson('daemonset/agent')).metadata.generation, generation);
  });

  test('a build job (custom) upgrades a statefulset; a cronjob gets the new image for its next run', async () => {
    const custom = fs.readFileSync(path.join(REPO, 'test', 'fixtures', 'upgrade', 'custom-push.json'), 'utf8');
    assert.equal((await push('any', { workload: 'statefulset/db', container: 'app', repo_type: 'custom' }, custom)).status, 200);
    assert.equal(containerImage(await getJson('statefulset/db'), 'app'), 'harbor.example.com:8443/shop/web-api:1.4.2');
    assert.equal((await push('any', { workload: 'cronjob/nightly', container: 'app', repo_type: 'regionalregistry' }, acrPayload('v7'))).status, 200);
    const cj = await getJson('cronjob/nightly');
    assert.equal(containerImage(cj, 'app', cj.spec.jobTemplate.spec.template), acrImage('v7'));
  });

  test('digest pinning', async () => {
    const payload = acrPayload('v8');
    const res = await push('pinned', seedQuery(), payload);
    assert.equal(res.status, 200, res.body);
    assert.equal(containerImage(await getJson('deployment/web'), 'app'), `${acrImage('v8')}@${JSON.parse(payload).push_data.digest}`);
  });

  test('bad input: a clear error, 500, and the cluster unchanged', async () => {
    const before = await getJson('deployment/web');
    const cases: [Record<string, string>, string, RegExp][] = [
      [seedQuery(), acrPayload('v 1'), /push_data\.tag "v 1" is not a valid tag/],
      [seedQuery(), acrPayload('$(id)'), /push_data\.tag "\$\(id\)" is not a valid tag/],
      [seedQuery(), fs.readFileSync(path.join(REPO, 'test', 'fixtures', 'upgrade', 'acr-push.json'), 'utf8'), /OCI repository names are lower-case, and "repoTest" is not/],
      [seedQuery(), acrPayload('x'.repeat(200)), /is 200 characters long/],
      [seedQuery({ repo_type: 'artifactory' }), acrPayload('v9'), /REPO_TYPE "artifactory" is not supported/],
      [seedQuery(), '{"push_data": {"tag": "v9"', /payload is not JSON/],
    ];
    for (const [query, body, message] of cases) {
      const res = await push('web', query, body);
      // The sender's mistake: 400, so that a registry does not send it again.
      assert.equal(res.status, 400, res.body);
      assert.match(res.body, /^action: +none \(nothing was changed\)$/m);
      assert.match(res.body, message);
    }
    const missingWorkload = await push('any', seedQuery({ workload: 'deployment/nope' }), acrPayload('v9'));
    assert.equal(missingWorkload.status, 500);
    assert.match(missingWorkload.body, /^result: +failed: deployment "nope" not found in namespace "[^"]+"$/m);
    // The namespace's other workloads are not listed to whoever holds the URL.
    assert.doesNotMatch(missingWorkload.body, /\b(busy|broken)\b/);
    const missingContainer = await push('any', seedQuery({ container: 'ap' }), acrPayload('v9'));
    assert.equal(missingContainer.status, 500);
    assert.match(missingContainer.body, /container "ap" not found in deployment\/web \(containers: app-sidecar, app\)/);
    assert.equal(pushedState(await getJson('deployment/web')), pushedState(before));
  });

  test('the image pin: a build job cannot deploy another registry\'s image through the seed hook', async () => {
    const evil = JSON.stringify({ push_data: { tag: 'pwn' }, repository: { repo_url: 'evil.example:5000', namespace: 'x', name: 'backdoor' } });
    const message = 'image pin: container "app" runs repository "registry.cn-hangzhou.aliyuncs.com/shop/web-api", and the push names ' +
      'repository "evil.example:5000/x/backdoor"; a push may change only the tag and digest, unless the hook setting ALLOW_IMAGES lists the repository';
    for (const [hook, workload] of [['web', 'web'], ['any', 'edge']]) {
      const before = await getJson(`deployment/${workload}`);
      const res = await push(hook, seedQuery({ workload: `deployment/${workload}`, repo_type: 'custom' }), evil);
      assert.equal(res.status, 500, res.body);
      assert.match(res.body, /^action: +none \(nothing was changed\)$/m);
      assert.ok(res.body.includes(`result:       failed: ${message}\n`), res.body);
      const after = await getJson(`deployment/${workload}`);
      assert.equal(containerImage(after, 'app'), containerImage(before, 'app'));
      assert.equal(pushedState(after), pushedState(before));
      const refusals = (await getJson('events')).items.filter((e: any) => e.involvedObject.name === workload && e.reason === 'UpgradeRefused');
      assert.equal(refusals.length, 1);
      assert.equal(refusals[0].type, 'Warning');
      assert.match(refusals[0].message, new RegExp(`; asked by hook "${hook}", request \\S+$`));
      assert.ok(refusals[0].message.startsWith(message));
      // Logged as an error, whatever the verbosity.
      await waitForOutput(wh, `hook ${hook}: push to deployment/${workload} in ${ns} refused: ${message}`);
    }
    // The hook that lists the repository in ALLOW_IMAGES applies the same push.
    const widened = await push('widened', seedQuery({ workload: 'deployment/edge', repo_type: 'custom' }), evil);
    assert.equal(widened.status, 200, widened.body);
    assert.match(widened.body, /^action: +image updated$/m);
    assert.match(widened.body, /^note: +image pin: "evil\.example:5000\/x\/backdoor" allowed by ALLOW_IMAGES pattern/m);
    assert.equal(containerImage(await getJson('deployment/edge'), 'app'), 'evil.example:5000/x/backdoor:pwn');
  });

  test('a rollout that completes and one that fails, when the hook waits for it', async () => {
    const ok = await push('tracked', { workload: 'deployment/busy', container: 'app', repo_type: 'regionalregistry' }, acrPayload('t1'));
    assert.equal(ok.status, 200, ok.body);
    assert.match(ok.body, /^rollout: +complete \(1\/1 pods updated and available\)$/m);
    const failed = await push('tracked', { workload: 'deployment/broken', container: 'app', repo_type: 'regionalregistry' }, acrPayload('t1'));
    assert.equal(failed.status, 500, failed.body);
    assert.match(failed.body, /^result: +failed: the rollout failed \(see rollout\)$/m);
    assert.match(failed.body, /^rollout: +failed: ProgressDeadlineExceeded/m);
    assert.match(failed.body, /^pod broken-\S+: Running, not ready, .*CrashLoopBackOff; last exit 1 \(Error\)$/m);
  });

  test('20 concurrent pushes to one workload apply one after another and end on the last one received', async () => {
    await kubectl(['-n', ns, 'rollout', 'status', 'deployment/busy', '--timeout=60s']);
    const start = containerImage(await getJson('deployment/busy'), 'app');
    const tags = Array.from({ length: 20 }, (_, i) => `c${i}`);
    const answers = await Promise.all(tags.map((t) => push('any', { workload: 'deployment/busy', container: 'app', repo_type: 'regionalregistry' }, acrPayload(t))));
    const steps = answers.map((a) => {
      assert.equal(a.status, 200, a.body);
      return { before: /^image before: +(\S+)$/m.exec(a.body)![1], after: /^image after: +(\S+)$/m.exec(a.body)![1] };
    });
    // Never interleaved: the pushes form one chain, each starting from the image the one before left.
    let current = start;
    for (let i = 0; i < steps.length; i++) {
      const next = steps.find((s) => s.before === current);
      assert.ok(next, `no push continued from ${current}: ${JSON.stringify(steps)}`);
      current = next.after;
    }
    assert.equal(containerImage(await getJson('deployment/busy'), 'app'), current, 'the workload ends on the last push applied');
  });

  test('started as a process (the shim, or a webhooks.sh symlink to the executable) it behaves the same', async () => {
    const link = path.join(makeTempDir('e2e-link-'), 'webhooks.sh');
    fs.symlinkSync(path.join(REPO, 'dist', 'webhook'), link);
    const env = { ...process.env, KUBECONFIG: cluster!.kubeconfigPath, APP_NS: ns, APP_WORKLOAD: 'deployment/busy', APP_CONTAINER: 'app', REPO_TYPE: 'regionalregistry', WEBHOOK_BIN: path.join(REPO, 'dist', 'webhook') };
    const run = (file: string, payload: string) => new Promise<{ code: number; out: string }>((resolve) => {
      execFile(file, [payload], { env }, (error, stdout, stderr) => resolve({ code: error ? Number(error.code) : 0, out: stdout + stderr }));
    });
    for (const [file, tag] of [[path.join(REPO, 'webhooks.sh'), 'proc1'], [link, 'proc2']]) {
      const ok = await run(file, acrPayload(tag));
      assert.equal(ok.code, 0, ok.out);
      assert.match(ok.out, /^action: +image updated$/m);
      assert.equal(containerImage(await getJson('deployment/busy'), 'app'), acrImage(tag));
      const bad = await run(file, acrPayload('$(id)'));
      assert.equal(bad.code, 1, bad.out);
      const inProcess = await push('any', { workload: 'deployment/busy', container: 'app', repo_type: 'regionalregistry' }, acrPayload('$(id)'));
      assert.equal(bad.out, inProcess.body, 'same output as the in-process upgrade');
    }
  });

  describe('result mails', () => {
    let mta: Mta;
    let mailing: Webhook;
    /** Subject (RFC 2047 B-words decoded) and base64 body of a delivered message. */
    const read = (raw: string) => {
      const [head, body] = raw.replace(/\r\n/g, '\n').split('\n\n');
      const subject = /^Subject: (.*(?:\n[ \t].*)*)/m.exec(head)![1].replace(/\n[ \t]/g, '')
        .replace(/=\?UTF-8\?B\?([^?]*)\?=/g, (_, b: string) => Buffer.from(b, 'base64').toString('utf8'));
      return { subject, body: Buffer.from(body.replace(/\s+/g, ''), 'base64').toString('utf8') };
    };
    before(async () => {
      mta = await startMta();
      mailing = await startWebhook({ hooks: hookDirectory(ns), env: {
        WEBHOOK_CMD: '-template', HOOK_TOKEN: TOKEN, KUBECONFIG: cluster!.kubeconfigPath,
        ...serviceMailEnv(mta),
      } });
    });
    after(async () => {
      await mailing?.stop();
      await mta?.stop();
    });
    const mailPush = (body: string, query: Record<string, string> = {}) =>
      mailing.request(`/hooks/web?${new URLSearchParams({ token: TOKEN, ns, ...seedQuery(query) })}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body });

    test('after an upgrade the mail waits for the rollout and reports its outcome', async () => {
      await mta.clear();
      assert.equal((await mailPush(acrPayload('m1'))).status, 200);
      const [raw] = await mta.waitForMessages(1, 60_000);
      const mail = read(raw);
      assert.equal(mail.subject, `Webhooks通知: ${ns}-deployment/web-app 更新结果: succeeded`);
      assert.match(mail.body, /outcome: succeeded \(image updated\)/);
      assert.match(mail.body, new RegExp(`image after: +${acrImage('m1').replace(/\./g, '\\.')}`));
      assert.match(mail.body, /rollout: +complete \(2\/2 pods updated and available\)/);
      assert.match(mail.body, /pod web-\S+: Running, ready/);
    });

    test('a newer push to the same workload takes over following the rollout', async () => {
      await mta.clear();
      assert.equal((await mailPush(acrPayload('m2'))).status, 200);
      assert.equal((await mailPush(acrPayload('m3'))).status, 200);
      const mails = (await mta.waitForMessages(2, 60_000)).map(read);
      const first = mails.find((m) => m.body.includes(`image after:  ${acrImage('m2')}`));
      const second = mails.find((m) => m.body.includes(`image after:  ${acrImage('m3')}`));
      assert.match(first!.body, /rollout: +progressing \(superseded by a later push to this workload/);
      assert.match(second!.body, /rollout: +complete/);
    });

    test('a Docker Hub test ping is mailed as no change', async () => {
      await mta.clear();
      const ping = fs.readFileSync(path.join(REPO, 'test', 'fixtures', 'upgrade', 'dockerhub-test-ping.json'), 'utf8');
      assert.equal((await mailPush(ping, { repo_type: 'publicregistry' })).status, 200);
      const [raw] = await mta.waitForMessages(1, 30_000);
      assert.equal(read(raw).subject, `Webhooks通知: ${ns}-deployment/web-app 更新结果: no change`);
    });
  });

  describe('as the ServiceAccount of deploy/, with the cluster-wide option rbac-cluster.yaml', () => {
    const dir = makeTempDir('e2e-rbac-');
    let sa: Awaited<ReturnType<typeof shippedServiceAccount>>;
    let asSa: Webhook;
    before(async () => {
      sa = await shippedServiceAccount(kubectl, cluster!, ns, [path.join(REPO, 'deploy', 'serviceaccount.yaml'), path.join(REPO, 'deploy', 'rbac-cluster.yaml')], dir);
      asSa = await startWebhook({ hooks: hookDirectory(ns), env: { WEBHOOK_CMD: '-template', HOOK_TOKEN: TOKEN, KUBECONFIG: sa.kubeconfig } });
    });
    after(async () => {
      await asSa?.stop();
      await sa?.remove();
    });
    const pushAsSa = (tag: string) => asSa.request(`/hooks/web?${new URLSearchParams({ token: TOKEN, ns, ...seedQuery() })}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag) });

    test('succeeds with the shipped role', async () => {
      const res = await pushAsSa('sa1');
      assert.equal(res.status, 200, res.body);
      assert.equal(containerImage(await getJson('deployment/web'), 'app'), acrImage('sa1'));
    });

    test('without its binding: a clear 403 message, and no token anywhere', async () => {
      await sa.unbind();
      let res = await pushAsSa('sa2');
      // The authorizer's cache follows the deletion within moments.
      for (let i = 0; i < 50 && res.status === 200; i++) {
        await new Promise((r) => setTimeout(r, 200));
        res = await pushAsSa(`sa2-${i}`);
      }
      assert.equal(res.status, 500, res.body);
      assert.match(res.body, /^result: +failed: forbidden: the service account "webhook" of namespace "[^"]+" cannot "(?:get|patch)" deployments\.apps "web" in namespace "[^"]+" — grant it with the RBAC that `webhook -print-rbac` prints for the hooks$/m);
      await asSa.stop();
      assert.equal((res.body + asSa.output()).includes(sa.token), false);
      assert.equal(asSa.output().includes(TOKEN), false);
    });
  });

  // After the cluster-wide option above: its binding is gone (its last test waited for the API
  // server to refuse), so the ServiceAccount holds only what -print-rbac grants here.
  describe('as the ServiceAccount of deploy/, with the Roles `webhook -print-rbac` generates from the hooks', () => {
    const dir = makeTempDir('e2e-generated-rbac-');
    const hooks = hookDirectory(ns);
    let sa: Awaited<ReturnType<typeof shippedServiceAccount>>;
    let asSa: Webhook;
    let printed: { yaml: string; notes: string };
    before(async () => {
      sa = await shippedServiceAccount(kubectl, cluster!, ns, [path.join(REPO, 'deploy', 'serviceaccount.yaml')], dir);
      const run = (args: string[]) => new Promise<{ yaml: string; notes: string }>((resolve, reject) => {
        execFile(defaultBinary(), args, { env: { ...process.env, HOOK_TOKEN: TOKEN } }, (error, stdout, stderr) =>
          error ? reject(new Error(stderr || error.message)) : resolve({ yaml: stdout, notes: stderr }));
      });
      printed = await run(['-print-rbac', '-template', '-hooks', hooks, '-rbac-service-account', `${ns}/webhook`]);
      await kubectl(['apply', '-f', '-'], printed.yaml);
      // Added after the RBAC was generated: the same seed hook, pinned to another workload of the namespace.
      const seed = JSON.parse(fs.readFileSync(path.join(hooks, 'web.json'), 'utf8'))[0];
      seed.id = 'busy';
      seed['trigger-rule'].and[2].match.value = 'deployment/busy';
      fs.writeFileSync(path.join(hooks, 'busy.json'), JSON.stringify([seed]));
      asSa = await startWebhook({ hooks, env: { WEBHOOK_CMD: '-template', HOOK_TOKEN: TOKEN, KUBECONFIG: sa.kubeconfig } });
    });
    after(async () => {
      await asSa?.stop();
      await kubectl(['-n', ns, 'delete', 'role,rolebinding', 'webhook', '--ignore-not-found']).catch(() => '');
      await sa?.remove();
    });
    const pushAs = (hook: string, workload: string, tag: string) =>
      asSa.request(`/hooks/${hook}?${new URLSearchParams({ token: TOKEN, ns, ...seedQuery({ workload }) })}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag) });

    test('it grants get and patch on the seed hook\'s workload only, and names the hooks whose workload the URL chooses', () => {
      assert.match(printed.yaml, /^  - apiGroups: \["apps"\]\n    resources: \["deployments"\]\n    resourceNames: \["web"\]\n    verbs: \["get", "patch", "list", "watch"\]$/m);
      assert.equal(printed.yaml.match(/^kind: Role$/gm)?.length, 1);
      for (const id of ['any', 'pinned', 'tracked']) {
        assert.match(printed.yaml, new RegExp(`^#   hook "${id}": NOT COVERED: its namespace and workload come from the url parameter "ns" and the url parameter "workload", which no value rule pins$`, 'm'));
        assert.match(printed.notes, new RegExp(`hook "${id}" is not covered: .*deploy/rbac-cluster\\.yaml`));
      }
      assert.equal(printed.yaml.includes(TOKEN), false);
    });

    test('with them, the hook upgrades its workload, records its Event and follows the rollout', async () => {
      let res = await pushAs('web', 'deployment/web', 'gen1');
      // The API server's authorizer picks up the new Role within moments.
      for (let i = 0; i < 50 && res.status === 500 && /forbidden/.test(res.body); i++) {
        await new Promise((r) => setTimeout(r, 200));
        res = await pushAs('web', 'deployment/web', `gen1-${i}`);
      }
      assert.equal(res.status, 200, res.body);
      assert.match(res.body, /^action: +image updated$/m);
      assert.doesNotMatch(res.body, /^note:/m, 'the Event was recorded');
      const image = /^image after: +(\S+)$/m.exec(res.body)![1];
      assert.equal(containerImage(await getJson('deployment/web'), 'app'), image);
      await waitForOutput(asSa, new RegExp(`deployment/web in ${ns}: rollout complete`), 60_000);
    });

    test('a hook pointed at another workload of the namespace is refused by the API server, with our 403 message', async () => {
      const before = containerImage(await getJson('deployment/busy'), 'app');
      const res = await pushAs('busy', 'deployment/busy', 'gen2');
      assert.equal(res.status, 500, res.body);
      assert.match(res.body, new RegExp(`^result: +failed: forbidden: the service account "webhook" of namespace "${ns}" cannot "get" deployments\\.apps "busy" in namespace "${ns}" — grant it with the RBAC that \`webhook -print-rbac\` prints for the hooks$`, 'm'));
      assert.equal(containerImage(await getJson('deployment/busy'), 'app'), before);
    });
  });
});
