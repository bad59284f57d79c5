/*
 * Update policies: the values parsePolicy reads and refuses, policyDecision's table (which pushed tag each policy
 * takes over which running one, where the policy comes from), and through the executable on the test cluster with
 * real ACR payloads: what a push outside the policy answers and leaves, the annotations' precedence, a malformed
 * annotation's error, and two replicas agreeing.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { adminPort, defaultBinary, httpRequest, makeTempDir, startWebhook, waitFor, type Webhook } from './harness.ts';
import { startReceiver, type Receiver } from './receiver.ts';
import { acrImage, acrPayload, clusterOrSkip, containerImage, deployment, freshNamespaceName, kubectlFor, pushedState } from './cluster/kube.ts';
import { TARGET_FROM_URL, upgradeHook } from './upgrade-hooks.ts';
import { DECISIONS, HOOK_SETTINGS, parsePolicy, policyDecision, type UpdatePolicy } from '../webhook.ts';

const image = (tag: string) => `reg.example/shop/app:${tag}`;
const annotated = (annotations: Record<string, string>) => ({ metadata: { annotations } });
/** The verdict on pushing `pushed` over `running` under `policy` (the hook's, no annotation). */
const verdict = (policy: string, running: string, pushed: string) =>
  policyDecision(parsePolicy(policy), annotated({}), 'app', image(running), image(pushed), 'deployment/web');
const takes = (policy: string, running: string, pushed: string) => verdict(policy, running, pushed).kind === 'allowed';

describe('parsePolicy', () => {
  test('each form', () => {
    assert.equal(parsePolicy('all').kind, 'all');
    assert.equal(parsePolicy('  minor ').kind, 'minor');
    const s = parsePolicy('semver:>=1.4.0 <2.0.0') as Extract<UpdatePolicy, { kind: 'semver' }>;
    assert.deepEqual([s.kind, s.allowDowngrade, s.text], ['semver', false, 'semver:>=1.4.0 <2.0.0']);
    assert.equal((parsePolicy('semver:^1.4,allow-downgrade') as Extract<UpdatePolicy, { kind: 'semver' }>).allowDowngrade, true);
    assert.equal((parsePolicy('patch,allow-downgrade') as Extract<UpdatePolicy, { allowDowngrade: boolean }>).allowDowngrade, true);
    assert.equal(parsePolicy('glob:release-*').kind, 'glob');
    assert.equal(parsePolicy('regexp:^v\\d+\\.\\d+\\.\\d+$').kind, 'regexp');
  });
  test('what is wrong, said', () => {
    const cases: [string, RegExp][] = [
      ['', /empty; use one of all, semver:<range>, major, minor, patch/],
      ['newest', /not one of all, semver:<range>/],
      ['All', /not one of/],
      ['semver:', /semver: needs a range/],
      ['semver:>=1.4 <<2', /semver range ">=1\.4 <<2": "<<2": not a comparator$/],
      ['semver:>= 1.2, < 3', /semver range .*minor "2," is not a number/],
      ['semver:1.x || ', /alternative of "\|\|" is empty/],
      ['glob:', /glob: needs a pattern$/],
      ['regexp:(', /regexp: missing closing \)/],
      ['regexp:(a{2,100}){2,100}', /regexp: .*(linear-time|invalid repeat count)/],
      ['regexp:(?<=a)b', /regexp: /],
      ['x'.repeat(100 * 1024), /longer than 1024 characters \(102400\)$/],
    ];
    for (const [value, why] of cases) assert.throws(() => parsePolicy(value), why, value.slice(0, 40));
  });
  test('a policy text is compiled once: the same text gives the same compiled policy, a malformed one the same error', () => {
    const text = `regexp:^(${Array.from({ length: 40 }, (_, i) => `v${i}\\.[0-9]+`).join('|')})$`;
    const first = parsePolicy(text);
    assert.equal(parsePolicy(text), first);
    assert.notEqual(parsePolicy(` ${text}`), first, 'another text is compiled on its own');
    for (let i = 0; i < 2; i++) assert.throws(() => parsePolicy('regexp:('), /regexp: missing closing \)/);
  });
  test('a catastrophic regexp runs in linear time (a bare backtracking engine takes minutes on this)', () => {
    const p = parsePolicy('regexp:^([a-z0-9]+-?)+$') as Extract<UpdatePolicy, { pattern: RegExp }>;
    assert.equal(p.pattern.test(`${'a'.repeat(120)}!`), false);
  });
  test('UPDATE_POLICY: unset is all; malformed names the setting; NOTIFY_ON_SKIP defaults to true', () => {
    assert.equal(HOOK_SETTINGS.UPDATE_POLICY.parse(undefined).kind, 'all');
    assert.throws(() => HOOK_SETTINGS.UPDATE_POLICY.parse('semver:nope'), /UPDATE_POLICY "semver:nope" is not a policy: semver range "nope": "nope": major "nope"/);
    assert.equal(HOOK_SETTINGS.UPDATE_POLICY.fixed, true);
    assert.equal(HOOK_SETTINGS.NOTIFY_ON_SKIP.parse(undefined), true);
    assert.equal(HOOK_SETTINGS.NOTIFY_ON_SKIP.parse('false'), false);
    assert.throws(() => HOOK_SETTINGS.NOTIFY_ON_SKIP.parse('sometimes'), /NOTIFY_ON_SKIP "sometimes" is not a boolean/);
    assert.equal(DECISIONS['skipped by policy'].published, 'skipped by policy');
  });
});

describe('policyDecision', () => {
  // [policy, running tag, pushed tag, taken]
  const table: [string, string, string, boolean][] = [
    ['all', 'v1.4.2', 'dev-123', true],
    ['all', 'v1.4.2', 'v1.0.0', true],
    ['semver:>=1.4.0 <2.0.0', 'v1.4.2', 'v1.5.0', true],
    ['semver:>=1.4.0 <2.0.0', 'v1.4.2', 'v1.4.2', true],
    ['semver:>=1.4.0 <2.0.0', 'v1.4.2', 'v1.4.1', false],
    ['semver:>=1.4.0 <2.0.0,allow-downgrade', 'v1.4.2', 'v1.4.1', true],
    ['semver:>=1.4.0 <2.0.0', 'v1.4.2', 'v2.0.0', false],
    ['semver:>=1.4.0 <2.0.0', 'v1.4.2', 'v1.6.0-rc.1', false],
    ['semver:>=1.6.0-rc.1 <2.0.0', 'v1.4.2', 'v1.6.0-rc.2', true],
    ['semver:>=1.4.0 <2.0.0', 'v1.4.2', 'latest', false],
    ['semver:^1.4', 'latest', 'v1.9.0', true],
    ['major', '1.4.5', '1.4.6', true],
    ['major', '1.4.5', '2.4.5', true],
    ['minor', '1.4.5', '1.5.5', true],
    ['minor', '1.4.5', '2.4.5', false],
    ['patch', '1.4.5', '1.4.6', true],
    ['patch', '1.4.5', '1.5.5', false],
    ['patch', '1.4.5', '1.4.3', false],
    ['major', '1.4.5', '1.4.3', false],
    ['major,allow-downgrade', '1.4.5', '1.4.3', true],
    ['minor', '1.4.5', '1.5.0-rc.1', false],
    ['minor', '1.5.0-rc.1', '1.5.0-rc.2', true],
    ['minor', '1.5.0-rc.1', '1.5.0', true],
    ['major', 'latest', '3.0.0', true],
    ['major', 'latest', 'nightly', false],
    ['glob:release-*', 'release-1', 'release-2', true],
    ['glob:release-*', 'release-1', 'dev-2', false],
    ['glob:v1.?.*', 'v1.0.0', 'v1.4.0', true],
    ['glob:v1.?.*', 'v1.0.0', 'v1x4.0', false],
    ['regexp:^v1\\.', 'v1.0.0', 'v1.4.0', true],
    ['regexp:^v1\\.', 'v1.0.0', 'v2.0.0', false],
    ['regexp:-prod$', 'a', 'build-7-prod', true],
  ];
  for (const [policy, running, pushed, taken] of table)
    test(`${policy}: ${running} → ${pushed} ${taken ? 'taken' : 'skipped'}`, () => assert.equal(takes(policy, running, pushed), taken));
  test('the message says the tag, the policy, the workload and why', () => {
    assert.deepEqual(verdict('semver:>=1.4.0 <2.0.0', 'v1.4.2', 'v2.0.0'), {
      kind: 'skipped', message: "policy: v2.0.0 is outside semver:>=1.4.0 <2.0.0 of deployment/web (the hook's UPDATE_POLICY)",
    });
    assert.match((verdict('semver:^1', 'v1.4.2', 'v1.4.1') as { message: string }).message, /: lower than the running 1\.4\.2; ",allow-downgrade" in the policy allows that$/);
    assert.match((verdict('semver:^1', 'v1.4.2', 'dev-1') as { message: string }).message, /^policy: dev-1 is outside semver:\^1 .*: not a semver version$/);
    assert.match((verdict('semver:^1', 'v1.4.2', 'v1.5.0-rc.1') as { message: string }).message, /: a pre-release, which a range takes only when it names one/);
    assert.match((verdict('minor', 'v1.4.2', 'v2.0.0') as { message: string }).message, /: another major version than the running 1\.4\.2$/);
  });
  test('the container annotation beats the workload annotation, which beats the hook', () => {
    const hook = parsePolicy('all');
    const both = annotated({ 'webhook/policy': 'semver:^2', 'webhook/policy.app': 'semver:^1' });
    const decide = (w: unknown, container = 'app') => policyDecision(hook, w, container, image('v1.0.0'), image('v2.0.0'), 'deployment/web');
    assert.deepEqual(decide(both), { kind: 'skipped', message: 'policy: v2.0.0 is outside semver:^1 of container app of deployment/web' });
    assert.deepEqual(decide(both, 'sidecar'), { kind: 'allowed' }, "another container: the workload's ^2");
    assert.deepEqual(decide(annotated({ 'webhook/policy': 'semver:^1' })), { kind: 'skipped', message: 'policy: v2.0.0 is outside semver:^1 of deployment/web' });
  });
  test('a malformed annotation is named, its value cut, what is wrong said', () => {
    const hook = parsePolicy('all');
    const long = `semver:${'1'.repeat(100 * 1024)}`;
    const r = policyDecision(hook, annotated({ 'webhook/policy': long }), 'app', image('v1'), image('v2'), 'deployment/web');
    assert.equal(r.kind, 'malformed');
    assert.match((r as { message: string }).message, /^annotation webhook\/policy of deployment\/web: "semver:1{73}"… \(102407 characters\) is not a policy: longer than 1024 characters \(102407\)$/);
    const bad = policyDecision(hook, annotated({ 'webhook/policy.app': 'semver:>=1 <<2' }), 'app', image('v1'), image('v2'), 'deployment/web');
    assert.deepEqual(bad, { kind: 'malformed', message: 'annotation webhook/policy.app of deployment/web: "semver:>=1 <<2" is not a policy: semver range ">=1 <<2": "<<2": not a comparator' });
  });
  test('a push by digest alone names no tag: within every policy', () => {
    const digest = `reg.example/shop/app@sha256:${'a'.repeat(64)}`;
    assert.deepEqual(policyDecision(parsePolicy('semver:^1'), annotated({}), 'app', image('v1.0.0'), digest, 'deployment/web'), { kind: 'allowed' });
    assert.equal(policyDecision(parsePolicy('semver:^1'), annotated({}), 'app', image('v1.0.0'), `${image('v2.0.0')}@sha256:${'a'.repeat(64)}`, 'deployment/web').kind, 'skipped', 'a tag with a digest is the tag');
  });
});

describe('-validate', () => {
  const validate = (hooks: object[]) => {
    const file = path.join(makeTempDir(), 'hooks.json');
    fs.writeFileSync(file, JSON.stringify(hooks));
    const r = spawnSync(defaultBinary(), ['-validate', '-hooks', file], { env: { PATH: process.env.PATH }, encoding: 'utf8' });
    return { code: r.status, stdout: r.stdout, stderr: r.stderr };
  };
  test("prints each hook's policy", () => {
    const r = validate([upgradeHook('pinned', 'tok', { UPDATE_POLICY: 'semver:^1.4' }), upgradeHook('open', 'tok')]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /hook "pinned"[\s\S]*^ +policy: semver:\^1\.4; the workload's annotations webhook\/policy, webhook\/policy\.<container> override it$[\s\S]*hook "open"/m);
    assert.match(r.stdout, /hook "open"[\s\S]*^ +policy: all \(the default: any tag\); the workload's annotations/m);
  });
  test('a malformed UPDATE_POLICY, or one from the request, is refused at load, naming the setting', () => {
    const bad = validate([upgradeHook('bad', 'tok', { UPDATE_POLICY: 'semver:>=1 <<2' })]);
    assert.equal(bad.code, 1, bad.stdout);
    assert.match(bad.stderr, /hook "bad".*UPDATE_POLICY "semver:>=1 <<2" is not a policy: semver range ">=1 <<2": "<<2": not a comparator/);
    const fromUrl = upgradeHook('url', 'tok') as { 'pass-environment-to-command': object[] };
    fromUrl['pass-environment-to-command'] = [...TARGET_FROM_URL, { envname: 'UPDATE_POLICY', source: 'url', name: 'policy' }];
    const r = validate([fromUrl]);
    assert.equal(r.code, 1, r.stdout);
    assert.match(r.stderr, /UPDATE_POLICY must be fixed in the hook file/);
  });
});

const cluster = await clusterOrSkip();
const TOKEN = 'policy-token-7d2f41';

describe('update policies through the executable on the test cluster', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('policy');
  const kubectl = kubectlFor(cluster!);
  const replicas: Webhook[] = [];
  let rx: Receiver;
  const get = async (name: string) => JSON.parse(await kubectl(['-n', ns, 'get', `deployment/${name}`, '-o', 'json']));
  const annotate = (name: string, annotation: string) => kubectl(['-n', ns, 'annotate', '--overwrite', `deployment/${name}`, annotation]);
  const push = (tag: string, { workload = 'web', container = 'app', hook = 'deploy', replica = 0 } = {}) =>
    replicas[replica].request(`/hooks/${hook}?${new URLSearchParams({ token: TOKEN, ns, workload: `deployment/${workload}`, container, repo_type: 'regionalregistry' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag),
    });
  const actionOf = (body: string) => /^action: +(.*)$/m.exec(body)?.[1];
  /** Pushes a tag the policy does not take: 200, the action says why, nothing on the workload changed. */
  const skipped = async (tag: string, why: RegExp, opts: Parameters<typeof push>[1] = {}) => {
    const name = opts.workload ?? 'web';
    const before = pushedState(await get(name));
    const res = await push(tag, opts);
    assert.equal(res.status, 200, res.body);
    assert.match(actionOf(res.body) ?? res.body, why);
    assert.equal(pushedState(await get(name)), before, `${tag}: the workload is unchanged`);
    return res;
  };
  const applied = async (tag: string, opts: Parameters<typeof push>[1] = {}) => {
    const res = await push(tag, opts);
    assert.equal(res.status, 200, res.body);
    assert.equal(actionOf(res.body), 'image updated', res.body);
    assert.equal(containerImage(await get(opts.workload ?? 'web'), opts.container ?? 'app'), acrImage(tag));
    return res;
  };
  const settledDelivery = async (w: Webhook, requestId: string) => {
    const port = await adminPort(w);
    return waitFor(async () => {
      const d = JSON.parse((await httpRequest(port, '/deliveries.json')).body).deliveries.find((x: any) => x.request_id === requestId);
      return d?.state === 'done' && d.notifications.every((n: any) => n.state !== 'pending') ? d : undefined;
    }, { timeoutMs: 30_000, what: `the delivery of ${requestId}` });
  };

  before(async () => {
    rx = await startReceiver();
    await kubectl(['create', 'namespace', ns]);
    const web = deployment('web', [{ name: 'app', image: acrImage('v1.4.2') }], { replicas: 1 });
    (web.metadata as any).annotations = { 'webhook/policy': 'semver:>=1.4.0 <2.0.0' };
    const multi = deployment('multi', [{ name: 'app', image: acrImage('v1.0.0') }, { name: 'sidecar', image: acrImage('v1.0.0') }], { replicas: 1 });
    (multi.metadata as any).annotations = { 'webhook/policy': 'semver:^2', 'webhook/policy.app': 'semver:^1' };
    const plain = deployment('plain', [{ name: 'app', image: acrImage('v1.0.0') }], { replicas: 1 });
    for (const d of [web, multi, plain]) await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(d));
    const notify = { NOTIFY_URL: `${rx.base}/result` };
    const hooks = [
      upgradeHook('deploy', TOKEN, notify),
      upgradeHook('quiet', TOKEN, { ...notify, NOTIFY_ON_SKIP: 'false' }),
      upgradeHook('minor', TOKEN, { UPDATE_POLICY: 'minor' }),
    ];
    const env = { KUBECONFIG: cluster!.kubeconfigPath, NOTIFY_CACERT: Buffer.from(rx.certPem).toString('base64') };
    for (let i = 0; i < 2; i++) replicas.push(await startWebhook({ hooks, env, metrics: true, args: ['-deliveries', '50'] }));
  });
  after(async () => {
    await Promise.all(replicas.map((r) => r.stop()));
    await rx?.close();
    if (!process.env.KEEP_NAMESPACE) await kubectl(['delete', 'namespace', ns, '--wait=false']).catch(() => undefined);
  });

  test('semver:>=1.4.0 <2.0.0 takes a higher 1.x and refuses a lower release, 2.0.0, a pre-release and a non-semver tag', async () => {
    await applied('v1.5.0');
    await skipped('v1.4.1', /^none \(policy: v1\.4\.1 is outside semver:>=1\.4\.0 <2\.0\.0 of deployment\/web: lower than the running 1\.5\.0; ",allow-downgrade" in the policy allows that\)$/);
    const res = await skipped('v2.0.0', /^none \(policy: v2\.0\.0 is outside semver:>=1\.4\.0 <2\.0\.0 of deployment\/web\)$/);
    assert.match(res.body, /^image after: +\S+:v1\.5\.0$/m, 'the image after is the one still running');
    await skipped('v1.6.0-rc.1', /^none \(policy: v1\.6\.0-rc\.1 is outside .*: a pre-release, which a range takes only when it names one/);
    await skipped('dev-123', /^none \(policy: dev-123 is outside semver:>=1\.4\.0 <2\.0\.0 of deployment\/web: not a semver version\)$/);
    await applied('v1.6.0');
    const events = JSON.parse(await kubectl(['-n', ns, 'get', 'events', '--field-selector', 'involvedObject.name=web,reason=UpgradeSkipped', '-o', 'json'])).items;
    assert.ok(events.some((e: any) => e.type === 'Normal' && /^policy: v2\.0\.0 is outside semver:>=1\.4\.0 <2\.0\.0 of deployment\/web; asked by hook "deploy"/.test(e.message)),
      JSON.stringify(events.map((e: any) => e.message)));
  });

  test('a skipped push is on the deliveries page and notified as "skipped by policy"; with NOTIFY_ON_SKIP=false it is not sent', async () => {
    const loud = await skipped('v3.0.0', /^none \(policy: v3\.0\.0 is outside/);
    const id = String(loud.headers['x-request-id']);
    const d = await settledDelivery(replicas[0], id);
    assert.equal(d.decision, 'skipped by policy');
    assert.match(d.detail, /^policy: v3\.0\.0 is outside semver:>=1\.4\.0 <2\.0\.0 of deployment\/web$/);
    const sent = await waitFor(() => rx.requests.map((r) => JSON.parse(r.body)).find((doc) => doc.request_id === id), { timeoutMs: 30_000, what: 'the notification' });
    assert.equal(sent.decision, 'skipped by policy');
    assert.equal(sent.outcome, 'no change');
    const quiet = await skipped('v3.0.1', /^none \(policy: v3\.0\.1 is outside/, { hook: 'quiet' });
    const q = await settledDelivery(replicas[0], String(quiet.headers['x-request-id']));
    assert.equal(q.decision, 'skipped by policy');
    assert.deepEqual(q.notifications, [], 'NOTIFY_ON_SKIP=false: neither mailed nor posted');
  });

  test('a malformed annotation: 500 naming webhook/policy, its value and what is wrong; nothing changed', async () => {
    await annotate('web', 'webhook/policy=semver:>=1.4 <<2');
    const before = pushedState(await get('web'));
    const res = await push('v1.7.0');
    assert.equal(res.status, 500, res.body);
    assert.match(res.body, /annotation webhook\/policy of deployment\/web: "semver:>=1\.4 <<2" is not a policy: semver range ">=1\.4 <<2": "<<2": not a comparator; nothing was changed/);
    await annotate('web', `webhook/policy=semver:${'1'.repeat(100 * 1024)}`);
    const long = await push('v1.7.0');
    assert.equal(long.status, 500, long.body);
    assert.match(long.body, /annotation webhook\/policy of deployment\/web: "semver:1+"… \(102407 characters\) is not a policy: longer than 1024 characters/);
    assert.ok(long.body.length < 4096, 'the value is cut, not echoed');
    await annotate('web', 'webhook/policy=regexp:(a{2,100}){2,100}');
    const catastrophic = await push('v1.7.0');
    assert.equal(catastrophic.status, 500, catastrophic.body);
    assert.match(catastrophic.body, /annotation webhook\/policy of deployment\/web: "regexp:\(a\{2,100\}\)\{2,100\}" is not a policy: regexp: /);
    assert.equal(pushedState(await get('web')), before, 'nothing changed');
    const warnings = JSON.parse(await kubectl(['-n', ns, 'get', 'events', '--field-selector', 'involvedObject.name=web,reason=UpgradeFailed', '-o', 'json'])).items;
    assert.ok(warnings.some((e: any) => e.type === 'Warning' && /annotation webhook\/policy of deployment\/web/.test(e.message)));
  });

  test('glob and regexp policies match the tag', async () => {
    await annotate('web', 'webhook/policy=glob:release-*');
    await applied('release-7');
    await skipped('dev-7', /^none \(policy: dev-7 is outside glob:release-\* of deployment\/web\)$/);
    await annotate('web', 'webhook/policy=regexp:^v\\d+\\.\\d+\\.\\d+$');
    await applied('v1.0.0');
    await skipped('v1.0.0-hotfix', /^none \(policy: v1\.0\.0-hotfix is outside regexp:\^v\\d\+\\\.\\d\+\\\.\\d\+\$ of deployment\/web\)$/);
  });

  test("a container's annotation beats the workload's", async () => {
    await skipped('v2.1.0', /^none \(policy: v2\.1\.0 is outside semver:\^1 of container app of deployment\/multi: lower|^none \(policy: v2\.1\.0 is outside semver:\^1 of container app of deployment\/multi\)$/, { workload: 'multi' });
    await applied('v1.1.0', { workload: 'multi' });
    await applied('v2.1.0', { workload: 'multi', container: 'sidecar' });
    await skipped('v1.2.0', /^none \(policy: v1\.2\.0 is outside semver:\^2 of deployment\/multi\)$/, { workload: 'multi', container: 'sidecar' });
  });

  test("the hook's UPDATE_POLICY, when no annotation overrides it", async () => {
    await skipped('v2.0.0', /^none \(policy: v2\.0\.0 is outside minor of deployment\/plain \(the hook's UPDATE_POLICY\): another major version than the running 1\.0\.0\)$/, { workload: 'plain', hook: 'minor' });
    await applied('v1.3.0', { workload: 'plain', hook: 'minor' });
    await applied('v2.0.0', { workload: 'plain' });
  });

  test('a policy annotated after a push holds for the next push to the same replica, whose copy of the workload predates it', async () => {
    await applied('v2.1.0', { workload: 'plain' });
    await annotate('plain', 'webhook/policy=semver:^2');
    await skipped('v3.0.0', /^none \(policy: v3\.0\.0 is outside semver:\^2 of deployment\/plain\)$/, { workload: 'plain' });
  });

  test('two replicas agree: the same push is skipped by both, the same one taken by either', async () => {
    await annotate('web', 'webhook/policy=semver:^1');
    const running = containerImage(await get('web'), 'app');
    const [a, b] = await Promise.all([push('v2.5.0', { replica: 0 }), push('v2.5.0', { replica: 1 })]);
    for (const res of [a, b]) assert.equal(actionOf(res.body), 'none (policy: v2.5.0 is outside semver:^1 of deployment/web)', res.body);
    assert.equal(containerImage(await get('web'), 'app'), running);
    await applied('v1.9.0', { replica: 1 });
    await skipped('v1.8.0', /^none \(policy: v1\.8\.0 is outside semver:\^1 of deployment\/web: lower than the running 1\.9\.0/, { replica: 0 });
  });
});
