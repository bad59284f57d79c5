/*
 * The deliveries page, through the built executable over real HTTP: it lives on the admin
 * listener (-metrics-listen) only, asks for -admin-token when one is set, keeps a bounded ring,
 * and shows no secret. Then, on the real test cluster, pushes of every kind (applied, same image
 * restarted, a test ping, a refused push, a failing rollout, one superseded by a later push) are
 * read back in a real headless chromium: the rows, the outcomes, the page reloading itself while a
 * rollout runs and stopping once nothing does, one push's report and pods, a phone-width layout;
 * screenshots are kept in test-artifacts/ (git-ignored).
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { browserOrSkip, type Browser, type Page } from './browser.ts';
import { acrImage, acrPayload, clusterOrSkip, deployment, freshNamespaceName, kubectlFor, removeNamespace } from './cluster/kube.ts';
import {
  adminPort, freePort, httpRequest, makeTempDir, spawnWebhook, startWebhook, waitFor, waitForOutput, type Webhook, webhookPool,
} from './harness.ts';
import { startReceiver, type Receiver } from './receiver.ts';

const REPO = path.join(import.meta.dirname, '..');
const ARTIFACTS = path.join(REPO, 'test-artifacts');
const TOKEN = 'deliveries-token-5b2e91c4d7';
const ADMIN_TOKEN = 'admin-token-0c8f3e6a1d94';
const NOTIFY_SECRET = 'SECdeliveries-7e4a1f03b2';
const ROBOT_KEY = 'robot-key-93d0c5e2f8a1';
const MAIL_PASSWORD = 'mail-pass-2f7c9e41a0';

const { start: started, stopAll: stopStarted } = webhookPool();

const echoHook = (id: string, more: object = {}) => ({
  id, 'execute-command': '/bin/echo', 'pass-arguments-to-command': [{ source: 'string', name: 'done' }],
  'include-command-output-in-response': true, ...more,
});

describe('the page on the admin listener, through the executable', () => {
  after(stopStarted);

  test('served on -metrics-listen only, never on the hook port; HTML without script or outside asset, and JSON', async () => {
    const w = await started({ hooks: [echoHook('echo')] });
    const port = await adminPort(w);
    const pushed = await w.request('/hooks/echo', { method: 'POST' });
    assert.equal(pushed.status, 200);
    for (const p of ['/deliveries', '/deliveries.json', '/deliveries/1', '/deliveries/1.json', '/metrics']) {
      const onHookPort = await w.request(p);
      assert.equal(onHookPort.status, 404, `${p} on the hook port`);
      assert.equal(onHookPort.body, '404 page not found\n');
    }
    const page = await httpRequest(port, '/deliveries');
    assert.equal(page.status, 200);
    assert.equal(page.headers['content-type'], 'text/html; charset=utf-8');
    assert.match(String(page.headers['content-security-policy']), /^default-src 'none'; style-src 'unsafe-inline'/);
    assert.doesNotMatch(page.body, /<script|<link|<img|<iframe|https?:\/\//i);
    assert.match(page.body, /<meta name="viewport" content="width=device-width, initial-scale=1">/);
    assert.match(page.body, new RegExp(`<td data-label="Time" class="time"><a href="deliveries/1">[^<]+</a></td><td data-label="Hook">echo</td><td data-label="Request"><code>${pushed.headers['x-request-id']}</code>`));
    const doc = JSON.parse((await httpRequest(port, '/deliveries.json')).body);
    assert.equal(doc.schema, 'webhook.deliveries/v1');
    assert.equal(doc.deliveries.length, 1);
    assert.deepEqual(
      [doc.deliveries[0].seq, doc.deliveries[0].hook, doc.deliveries[0].request_id, doc.deliveries[0].decision, doc.deliveries[0].outcome, doc.deliveries[0].report],
      [1, 'echo', pushed.headers['x-request-id'], 'ran', 'succeeded', 'done\n'],
    );
    const one = await httpRequest(port, '/deliveries/1');
    assert.equal(one.status, 200);
    assert.match(one.body, /<h2>Report<\/h2><pre>done\n<\/pre>/);
    assert.deepEqual(JSON.parse((await httpRequest(port, '/deliveries/1.json')).body), doc.deliveries[0]);
    assert.equal((await httpRequest(port, '/deliveries/2')).status, 404);
    assert.equal((await httpRequest(port, '/deliveriesx')).status, 404);
    assert.equal((await httpRequest(port, '/deliveries', { method: 'POST', headers: { Origin: `http://127.0.0.1:${port}` } })).status, 404);
  });

  test('-admin-token: asked for as a Basic password (any user) or a Bearer token; /metrics stays open for scrapers', async () => {
    const w = await started({ hooks: [echoHook('echo')], args: ['-admin-token', ADMIN_TOKEN] });
    const port = await adminPort(w);
    await waitForOutput(w, 'serving deliveries on http://127.0.0.1:' + port + '/deliveries (asking for the -admin-token)');
    const basic = (user: string, pass: string) => `Basic ${Buffer.from(`${user}:${pass}`).toString('base64')}`;
    for (const [what, headers] of [
      ['none', {}], ['a wrong password', { Authorization: basic('ops', 'wrong') }], ['a wrong bearer', { Authorization: 'Bearer nope' }],
      ['the token as user name', { Authorization: basic(ADMIN_TOKEN, '') }],
    ] as const) {
      for (const p of ['/deliveries', '/deliveries.json']) {
        const res = await httpRequest(port, p, { headers });
        assert.equal(res.status, 401, `${what} ${p}`);
        assert.equal(res.headers['www-authenticate'], 'Basic realm="webhook admin", charset="UTF-8"');
        assert.ok(!res.body.includes(ADMIN_TOKEN));
      }
    }
    assert.equal((await httpRequest(port, '/deliveries', { headers: { Authorization: basic('anyone', ADMIN_TOKEN) } })).status, 200);
    assert.equal((await httpRequest(port, '/deliveries.json', { headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } })).status, 200);
    assert.equal((await httpRequest(port, '/metrics')).status, 200);
  });

  test('without -admin-token (loopback): only a Host naming the listener is answered; a form needs its own Origin or Sec-Fetch-Site', async () => {
    const w = await started({ hooks: [echoHook('echo')] });
    const port = await adminPort(w);
    const form = (headers: Record<string, string>) => httpRequest(port, '/deliveries/replay', {
      method: 'POST', body: 'seq=99&name=x', headers: { 'Content-Type': 'application/x-www-form-urlencoded', ...headers },
    });
    for (const host of [`127.0.0.1:${port}`, `localhost:${port}`, `LOCALHOST:${port}`]) {
      for (const p of ['/deliveries', '/deliveries.json', '/metrics']) assert.equal((await httpRequest(port, p, { headers: { Host: host } })).status, 200, `${host} ${p}`);
    }
    // DNS rebinding: a site whose name resolves to 127.0.0.1 is, to the browser, the origin of this listener.
    for (const host of [`evil.example:${port}`, 'evil.example', `127.0.0.1:${port + 1}`, `localhost`, `127.0.0.1.evil.example:${port}`]) {
      for (const p of ['/deliveries', '/deliveries.json', '/deliveries/1', '/metrics']) {
        const res = await httpRequest(port, p, { headers: { Host: host } });
        assert.equal(res.status, 403, `${host} ${p}`);
        assert.equal(res.body, `Forbidden: the Host ${JSON.stringify(host)} does not name this listener (127.0.0.1:${port} or localhost:${port}).\n`);
      }
      const posted = await form({ Host: host, Origin: `http://${host}`, 'Sec-Fetch-Site': 'same-origin' });
      assert.equal(posted.status, 403, `a form through ${host}`);
    }
    const noHost = await httpRequest(port, '/deliveries', { noHost: true });
    assert.ok(noHost.status === 400 || noHost.status === 403, `no Host at all: ${noHost.status}`);
    // A form with neither Origin nor Sec-Fetch-Site (a browser's form of old, or a script) is not taken.
    const bare = await form({});
    assert.equal(bare.status, 403);
    assert.equal(bare.body, "Forbidden: a form is taken only from this listener's own page (Origin, or Sec-Fetch-Site: same-origin).\n");
    assert.equal((await form({ Origin: 'null' })).status, 403);
    assert.equal((await form({ Origin: 'http://evil.example' })).status, 403);
    assert.equal((await form({ 'Sec-Fetch-Site': 'cross-site' })).status, 403);
    assert.equal((await form({ 'Sec-Fetch-Site': 'same-site' })).status, 403);
    // From its own page: taken (and answered: there is no push 99 to deploy again).
    const ownPage: Record<string, string>[] = [{ Origin: `http://127.0.0.1:${port}` }, { 'Sec-Fetch-Site': 'same-origin' }, { Host: `localhost:${port}`, Origin: `http://localhost:${port}` }];
    for (const headers of ownPage) {
      const taken = await form(headers);
      assert.equal(taken.status, 404, JSON.stringify(headers));
      assert.match(taken.body, /No such past push on this page/);
    }
    // With -admin-token the listener may be reached by any name (a Service, a pod IP): the token guards it.
    const guarded = await started({ hooks: [echoHook('echo')], args: ['-admin-token', ADMIN_TOKEN] });
    const guardedPort = await adminPort(guarded);
    const byName = await httpRequest(guardedPort, '/deliveries.json', { headers: { Host: 'webhook-admin.cattle-system.svc:9100', Authorization: `Bearer ${ADMIN_TOKEN}` } });
    assert.equal(byName.status, 200);
  });

  test('the ring keeps the last -deliveries pushes, newest first; -deliveries 0 serves no page', async () => {
    const w = await started({ hooks: [echoHook('echo')], args: ['-deliveries', '2'] });
    const port = await adminPort(w);
    const ids = [];
    for (let i = 0; i < 3; i++) ids.push((await w.request('/hooks/echo', { method: 'POST' })).headers['x-request-id']);
    const doc = await waitFor(async () => {
      const d = JSON.parse((await httpRequest(port, '/deliveries.json')).body);
      return d.deliveries.every((x: any) => x.state === 'done') ? d : undefined;
    });
    assert.deepEqual(doc.deliveries.map((d: any) => [d.seq, d.request_id]), [[3, ids[2]], [2, ids[1]]]);
    assert.equal((await httpRequest(port, '/deliveries/1')).status, 404);
    const off = await started({ hooks: [echoHook('echo')], args: ['-deliveries', '0'] });
    const metrics = await off.metrics();
    assert.equal(metrics.status, 200);
    const metricsPort = Number(/serving metrics on http:\/\/127\.0\.0\.1:(\d+)/.exec(off.output())![1]);
    assert.equal((await httpRequest(metricsPort, '/deliveries')).status, 404);
    assert.ok(!off.output().includes('serving deliveries'));
  });

  test('a command\'s long output is cut on the page (the answer keeps all of it)', async () => {
    const w = await started({ hooks: [{ id: 'long', 'execute-command': '/usr/bin/seq', 'pass-arguments-to-command': [{ source: 'string', name: '30000' }], 'include-command-output-in-response': true }] });
    const port = await adminPort(w);
    const res = await w.request('/hooks/long', { method: 'POST' });
    const full = Array.from({ length: 30000 }, (_, i) => `${i + 1}\n`).join('');
    assert.equal(res.body, full);
    const d = await waitFor(async () => JSON.parse((await httpRequest(port, '/deliveries/1.json')).body), { what: 'the entry' });
    assert.equal(d.report, `${full.slice(0, 65536)}\n[… ${full.length - 65536} more characters]\n`);
  });

  test('bad flags are refused with the reason, and nothing starts', async () => {
    for (const [args, message] of [
      [['-deliveries', '-1'], 'invalid value for flag -deliveries: must be between 0 and 10000'],
      [['-deliveries', '10001'], 'invalid value for flag -deliveries: must be between 0 and 10000'],
      [['-admin-token', 'has space'], 'invalid value for flag -admin-token: no spaces or control characters'],
      [['-max-notifications-per-hook', '0'], 'invalid value for flag -max-notifications-per-hook: must be at least 1'],
    ] as const) {
      const s = await spawnWebhook({ hooks: [echoHook('echo')], args: [...args] });
      const exit = await s.exited;
      assert.equal(exit.code, 2, s.output());
      assert.ok(s.stderr().startsWith(`${message}\n`), s.stderr());
    }
  });

  test('on an address other hosts reach, the page needs a token: refused to start without one, saying how; -admin-token-file gives it', async () => {
    const how = 'would serve the deliveries page to other hosts without a token: give -admin-token-file FILE (or -admin-token TOKEN), ' +
      'listen on loopback (-metrics-listen 127.0.0.1:PORT), or turn the page off with -deliveries 0';
    for (const listen of [':0', '0.0.0.0:0', '[::]:0']) {
      const s = await spawnWebhook({ hooks: [echoHook('echo')], args: ['-metrics-listen', listen] });
      assert.equal((await s.exited).code, 2, s.output());
      assert.ok(s.stderr().startsWith(`-metrics-listen ${listen} ${how}\n`), s.stderr());
    }
    const dir = makeTempDir('deliveries-token-file-');
    const tokenFile = path.join(dir, 'admin-token');
    for (const [content, why] of [
      ['', 'the file must hold one token'], ['two words\n', 'the file must hold one token'],
      // As deploy/secret.yaml ships it: a token everyone can read guards nothing.
      ['<admin-token>\n', 'the file still holds the placeholder "<admin-token>"; replace it'],
    ]) {
      fs.writeFileSync(tokenFile, content);
      const s = await spawnWebhook({ hooks: [echoHook('echo')], args: ['-metrics-listen', '0.0.0.0:0', '-admin-token-file', tokenFile] });
      assert.equal((await s.exited).code, 2, s.output());
      assert.ok(s.stderr().startsWith(`invalid value "${tokenFile}" for flag -admin-token-file: ${why}`), s.stderr());
      assert.ok(!s.stderr().includes('two words'), 'the file\'s content is not shown');
    }
    const missing = await spawnWebhook({ hooks: [echoHook('echo')], args: ['-admin-token-file', path.join(dir, 'none')] });
    assert.equal((await missing.exited).code, 2);
    assert.match(missing.stderr(), /^invalid value ".*none" for flag -admin-token-file: cannot read it \(ENOENT\)/);
    fs.writeFileSync(tokenFile, `${ADMIN_TOKEN}\n`);
    const port = await freePort();
    const w = await started({ hooks: [echoHook('echo')], args: ['-metrics-listen', `0.0.0.0:${port}`, '-admin-token-file', tokenFile, '-deliveries', '5'] });
    await waitForOutput(w, '(asking for the -admin-token)');
    assert.equal((await httpRequest(port, '/deliveries')).status, 401);
    assert.equal((await httpRequest(port, '/deliveries.json', { headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } })).status, 200);
    // Loopback needs no token, as before.
    const local = await started({ hooks: [echoHook('echo')], args: ['-metrics-listen', '127.0.0.1:0'] });
    await waitForOutput(local, /serving deliveries on http:\/\/127\.0\.0\.1:\d+\/deliveries\n/);
  });

  test('no secret on the pages or in the log: hook token, notification key and secret, SMTP password, admin token', async () => {
    const dir = makeTempDir('deliveries-secrets-');
    const file = path.join(dir, 'hooks.json');
    fs.writeFileSync(file, JSON.stringify([echoHook('secret', {
      'trigger-rule': { match: { type: 'value', value: '{{ getenv "HOOK_TOKEN" }}', parameter: { source: 'url', name: 'token' } } },
      'pass-environment-to-command': [
        { envname: 'NOTIFY_URL', source: 'string', name: `https://127.0.0.1:9/robot/send?access_token=${ROBOT_KEY}` },
        { envname: 'NOTIFY_FORMAT', source: 'string', name: 'dingtalk' },
        { envname: 'NOTIFY_SECRET', source: 'string', name: '{{ getenv "DING_SECRET" }}' },
        { envname: 'MAIL_TO', source: 'string', name: 'ops@example.com' },
      ],
    })]));
    const b64 = (s: string) => Buffer.from(s).toString('base64');
    const w = await started({
      hooks: file, args: ['-template', '-admin-token', ADMIN_TOKEN],
      env: {
        HOOK_TOKEN: TOKEN, DING_SECRET: NOTIFY_SECRET, MAIL_SMTP_SERVER: b64('127.0.0.1'), MAIL_SMTP_PORT: '9',
        MAIL_FROM: b64('webhook@example.com'), MAIL_PASSWORD: b64(MAIL_PASSWORD),
      },
    });
    const port = await adminPort(w);
    const ok = await w.request(`/hooks/secret?token=${TOKEN}`, { method: 'POST' });
    assert.equal(ok.status, 200);
    assert.equal((await w.request(`/hooks/secret?token=wrong-${TOKEN}`, { method: 'POST' })).status, 200);
    const auth = { Authorization: `Bearer ${ADMIN_TOKEN}` };
    const d = await waitFor(async () => {
      const doc = JSON.parse((await httpRequest(port, '/deliveries.json', { headers: auth })).body);
      const entry = doc.deliveries[0];
      return entry?.notifications.length === 2 && entry.notifications.every((n: any) => n.state !== 'pending') ? entry : undefined;
    }, { timeoutMs: 60_000, what: 'the mail and the notification to fail' });
    assert.deepEqual(d.notifications.map((n: any) => [n.channel, n.state]), [['mail', 'failed'], ['dingtalk 127.0.0.1:9', 'failed']]);
    const pages = [];
    for (const p of ['/deliveries', '/deliveries.json', `/deliveries/${d.seq}`, `/deliveries/${d.seq}.json`])
      pages.push((await httpRequest(port, p, { headers: auth })).body);
    const all = `${pages.join('\n')}\n${w.output()}`;
    for (const secret of [TOKEN, ADMIN_TOKEN, NOTIFY_SECRET, ROBOT_KEY, MAIL_PASSWORD, b64(MAIL_PASSWORD)])
      assert.ok(!all.includes(secret), `${secret} is shown`);
    // What is shown instead: the receiver by host, the request by id.
    assert.ok(pages[0].includes('dingtalk 127.0.0.1:9: failed'));
    assert.ok(pages[0].includes(String(ok.headers['x-request-id'])));
  });
});

const cluster = await clusterOrSkip();
const browser: Browser | undefined = cluster ? await browserOrSkip() : undefined;

describe('pushes on the real cluster, read in a real headless chromium', () => {
  const skip = !cluster ? 'no cluster' : !browser ? 'no browser' : false;
  const ns = freshNamespaceName('deliveries');
  let kubectl: ReturnType<typeof kubectlFor>;
  let w: Webhook;
  let rx: Receiver;
  let admin: number;
  let page: Page;
  let hooksFile: string;
  const pushes: Record<string, string> = {};
  const push = async (name: string, workload: string, repoType: string, body: string) => {
    const query = new URLSearchParams({ token: TOKEN, ns, workload, container: 'app', repo_type: repoType });
    const res = await w.request(`/hooks/deploy?${query}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body });
    pushes[name] = String(res.headers['x-request-id']);
    return res;
  };
  const deliveries = async () => JSON.parse((await httpRequest(admin, '/deliveries.json')).body).deliveries as any[];
  const settled = (name: string) => waitFor(async () => {
    const d = (await deliveries()).find((x) => x.request_id === pushes[name]);
    return d?.state === 'done' && d.notifications.every((n: any) => n.state !== 'pending') ? d : undefined;
  }, { timeoutMs: 90_000, what: `push ${name} to settle` });

  before(async () => {
    if (skip) return;
    fs.mkdirSync(ARTIFACTS, { recursive: true });
    kubectl = kubectlFor(cluster!);
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
      deployment('web', [{ name: 'app', image: acrImage('v1') }]),
      deployment('broken', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 }, { 'webhook-test/unready': 'true' }),
    ] }));
    await kubectl(['-n', ns, 'rollout', 'status', 'deployment/web', '--timeout=90s']);
    rx = await startReceiver({ status: 200, body: 'ok' });
    const hook = {
      id: 'deploy', 'execute-command': path.join(REPO, 'webhooks.sh'), 'include-command-output-in-response': true,
      'include-command-output-in-response-on-error': true,
      'pass-arguments-to-command': [{ source: 'entire-payload' }],
      'pass-environment-to-command': [
        ...['ns:APP_NS', 'workload:APP_WORKLOAD', 'container:APP_CONTAINER', 'repo_type:REPO_TYPE']
          .map((p) => ({ envname: p.split(':')[1], source: 'url', name: p.split(':')[0] })),
        { envname: 'NOTIFY_URL', source: 'string', name: `${rx.base}/results` },
        { envname: 'NOTIFY_SECRET', source: 'string', name: NOTIFY_SECRET },
      ],
      'trigger-rule': { match: { type: 'value', value: TOKEN, parameter: { source: 'url', name: 'token' } } },
    };
    hooksFile = path.join(makeTempDir('deliveries-hooks-'), 'hooks.json');
    fs.writeFileSync(hooksFile, JSON.stringify([hook]));
    w = await started({
      hooks: hooksFile, args: ['-rollout-follow', '8s'],
      env: { KUBECONFIG: cluster!.kubeconfigPath, NOTIFY_CACERT: Buffer.from(rx.certPem).toString('base64') },
    });
    admin = await adminPort(w);
  });
  after(async () => {
    await stopStarted();
    await page?.close();
    await browser?.close();
    await rx?.close();
    if (!skip) await removeNamespace(kubectl, ns);
  });

  test('pushes of every kind, their rollouts followed, their results posted', { skip }, async () => {
    assert.equal((await push('applied', 'deployment/web', 'regionalregistry', acrPayload('v2'))).status, 200);
    const applied = await settled('applied');
    assert.deepEqual([applied.decision, applied.outcome, applied.rollout.state], ['applied', 'succeeded', 'complete']);
    assert.equal((await push('restarted', 'deployment/web', 'regionalregistry', acrPayload('v2'))).status, 200);
    assert.equal((await settled('restarted')).decision, 'same image restarted');
    const ping = fs.readFileSync(path.join(REPO, 'test', 'fixtures', 'upgrade', 'dockerhub-test-ping.json'), 'utf8');
    assert.equal((await push('ping', 'deployment/web', 'publicregistry', ping)).status, 200);
    assert.equal((await push('refused', 'deployment/web', 'regionalregistry', acrPayload('v9', 'evil/backdoor'))).status, 500);
    assert.equal((await push('superseded', 'deployment/broken', 'regionalregistry', acrPayload('t1'))).status, 200);
    assert.equal((await push('failing', 'deployment/broken', 'regionalregistry', acrPayload('t2'))).status, 200);

    // The JSON receiver got the real upgrade's result, signed.
    const posted = await waitFor(() => rx.requests.map((r) => JSON.parse(r.body)).find((d) => d.request_id === pushes.applied), { what: 'the applied push\'s result' });
    assert.deepEqual(
      [posted.schema, posted.decision, posted.registry, posted.namespace, posted.workload, posted.container, posted.image_before, posted.image_after, posted.rollout.state],
      ['webhook.result/v1', 'applied', 'regionalregistry', ns, 'deployment/web', 'app', acrImage('v1'), acrImage('v2'), 'complete'],
    );
    assert.equal(posted.pods.length, 2);
    assert.ok(posted.pods.every((p: any) => p.ready === true && p.phase === 'Running' && p.image === acrImage('v2')), JSON.stringify(posted.pods));
  });

  test('the page in chromium: the rows and outcomes, reloading itself while a rollout runs, then stopping', { skip }, async () => {
    page = await browser!.open(`http://127.0.0.1:${admin}/deliveries`);
    await page.viewport(1400, 900);
    const row = (name: string) => `[...document.querySelectorAll('tbody tr')].find((r) => r.textContent.includes(${JSON.stringify(pushes[name])}))`;
    const state = (name: string) => page.evaluate<{ tone: string; decision: string; rollout: string }>(
      `(() => { const r = ${row(name)}; return r && { tone: r.className, decision: r.querySelector('[data-label=Decision] .tag').textContent,` +
      ` rollout: r.querySelector('[data-label=Rollout]').textContent }; })()`);
    // Right after the answer, the last push's rollout is being followed: the page says so and refreshes.
    const first = await state('failing');
    assert.deepEqual([first.tone, first.decision], ['running', 'applied']);
    assert.match(first.rollout, /^progressing/);
    assert.equal(await page.evaluate(`document.querySelector('meta[http-equiv=refresh]')?.content`), '3');
    const loadsBefore = page.loads();
    // No navigation from here on: the page must reload itself to show the rollout's end.
    const end = await waitFor(async () => {
      const s = await state('failing');
      return s?.tone === 'failed' ? s : undefined;
    }, { timeoutMs: 60_000, what: 'the page to show the failed rollout by itself' });
    assert.match(end.rollout, /^(failed|timed out)/);
    assert.ok(page.loads() > loadsBefore, 'the page reloaded itself');
    await waitFor(async () => (await page.evaluate(`document.querySelector('meta[http-equiv=refresh]') === null`)) === true,
      { timeoutMs: 60_000, what: 'the page to stop refreshing once nothing runs' });
    const decisions = await page.evaluate<string[]>(`[...document.querySelectorAll('tbody tr [data-label=Decision] .tag')].map((t) => t.textContent)`);
    assert.deepEqual(decisions, ['applied', 'superseded', 'refused', 'no-op', 'same image restarted', 'applied']);
    const tones = await page.evaluate<string[]>(`[...document.querySelectorAll('tbody tr')].map((r) => r.className)`);
    assert.deepEqual(tones, ['failed', 'ok', 'failed', 'quiet', 'ok', 'ok']);
    const refused = await page.evaluate<string>(`${row('refused')}.querySelector('[data-label=Decision]').textContent`);
    assert.match(refused, /evil\/backdoor/);
    const applied = await page.evaluate<string>(`${row('applied')}.textContent`);
    for (const part of [acrImage('v1'), acrImage('v2'), 'complete', 'regionalregistry', `deployment/web / app${ns}`, `json 127.0.0.1:${rx.port}: sent`])
      assert.ok(applied.includes(part), `${part} in ${applied}`);
    fs.writeFileSync(path.join(ARTIFACTS, 'deliveries.png'), await page.screenshot());
  });

  test('at SIGTERM a rollout still followed ends, and its result is still posted before the exit', { skip }, async () => {
    const hook = JSON.parse(fs.readFileSync(hooksFile, 'utf8'))[0];
    const second = await startWebhook({
      hooks: [{ ...hook, id: 'stopping' }], metrics: true, args: ['-rollout-follow', '5m'],
      env: { KUBECONFIG: cluster!.kubeconfigPath, NOTIFY_CACERT: Buffer.from(rx.certPem).toString('base64') },
    });
    const query = new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/broken', container: 'app', repo_type: 'regionalregistry' });
    const res = await second.request(`/hooks/stopping?${query}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload('t3') });
    assert.equal(res.status, 200, res.body);
    const id = String(res.headers['x-request-id']);
    const port = await adminPort(second);
    await waitFor(async () => {
      const d = JSON.parse((await httpRequest(port, '/deliveries.json')).body).deliveries[0];
      return d.state === 'following' && d.rollout?.state === 'progressing';
    }, { timeoutMs: 30_000, what: 'the rollout to be followed' });
    const exit = await second.stop();
    assert.equal(exit.code, 0, second.output());
    const posted = rx.requests.map((r) => JSON.parse(r.body)).find((d) => d.request_id === id);
    assert.ok(posted, `no result posted for ${id} before the exit:\n${second.output()}`);
    assert.equal(posted.outcome, 'failed');
    assert.match(posted.rollout.state, /^(failed|timed out)$/);
  });

  test('one push opens to its full report and its pods\' states; the table becomes cards on a phone', { skip }, async () => {
    const href = await page.evaluate<string>(`${`[...document.querySelectorAll('tbody tr')].find((r) => r.textContent.includes(${JSON.stringify(pushes.applied)}))`}.querySelector('a').href`);
    await page.goto(href);
    assert.match(await page.evaluate<string>('document.querySelector("h1").textContent'), /^Push \d+: deploy$/);
    const pods = await page.evaluate<string[][]>(`[...document.querySelectorAll('h2 + table tbody tr')].map((r) => [...r.cells].map((c) => c.textContent))`);
    assert.equal(pods.length, 2, JSON.stringify(pods));
    for (const p of pods) assert.deepEqual(p.slice(1, 4), ['Running', 'ready', acrImage('v2')]);
    const report = await page.evaluate<string>('document.querySelector("pre").textContent');
    assert.match(report, new RegExp(`^image after: +${acrImage('v2').replace(/\./g, '\\.')}$`, 'm'));
    assert.match(report, /^rollout: +complete/m);
    fs.writeFileSync(path.join(ARTIFACTS, 'delivery.png'), await page.screenshot());
    await page.goto(`http://127.0.0.1:${admin}/deliveries`);
    await page.viewport(390, 844, 2, true);
    // On a phone each push is a card: cells stacked, each labelled, and nothing wider than the screen.
    const layout = await page.evaluate<{ display: string; label: string; overflow: boolean }>(
      `(() => { const td = document.querySelector('tbody td'); return { display: getComputedStyle(td).display,` +
      ` label: getComputedStyle(td, '::before').content, overflow: document.documentElement.scrollWidth > window.innerWidth }; })()`);
    assert.deepEqual(layout, { display: 'block', label: '"Time"', overflow: false });
    fs.writeFileSync(path.join(ARTIFACTS, 'deliveries-phone.png'), await page.screenshot());
  });
});
