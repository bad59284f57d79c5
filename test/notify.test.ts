/*
 * NOTIFY_URL notifications through the built executable over real HTTP, to a local HTTPS receiver
 * (test/receiver.ts: a self-signed certificate made with openssl, trusted through NOTIFY_CACERT):
 * the exact body of each format (json, dingtalk, wecom, feishu, slack) as its platform documents
 * it, the signatures (the JSON header's HMAC, DingTalk's signed URL, Feishu's signed body), the
 * timing (after the command, never holding the answer), retries, refusals, the per-hook cap, the
 * metric, and bad settings refused at load with the file and field named.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createHmac } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import {
  adminPort, defaultBinary, httpRequest, makeTempDir, spawnWebhook, startWebhook, waitFor, waitForOutput, type Webhook,
} from './harness.ts';
import { startReceiver, type Receiver } from './receiver.ts';

const SECRET = 'SECnotify-3f9a2c7e51d04b8a';
const ROBOT_KEY = 'robotkey-6d1e0f9c2b7a4e53';
const TOKEN = 'notify-hook-token-84c1e2';

// Stopped by each suite's own after(): a file-level after() does not run when a name filter
// leaves a suite's tests out, and a webhook left running keeps the test process alive.
const stopAll: Webhook[] = [];
const stopStarted = () => Promise.all(stopAll.splice(0).map((w) => w.stop()));

/** The environment a hook passes: fixed strings, as the load-time checks demand. */
function fixedEnv(env: Record<string, string>) {
  return Object.entries(env).map(([envname, name]) => ({ envname, source: 'string', name }));
}

/** A hook that runs /bin/echo with the upgrade's usual variables, answering with the output. */
function chatHook(id: string, env: Record<string, string>) {
  return {
    id,
    'execute-command': '/bin/echo',
    'pass-arguments-to-command': [{ source: 'string', name: 'rolled out' }],
    'include-command-output-in-response': true,
    'trigger-rule': { match: { type: 'value', value: TOKEN, parameter: { source: 'url', name: 'token' } } },
    'pass-environment-to-command': fixedEnv({
      APP_NS: 'prod', APP_WORKLOAD: 'deployment/web', APP_CONTAINER: 'app', REPO_TYPE: 'regionalregistry', ...env,
    }),
  };
}

async function started(hooks: object[], rx: Receiver, args: string[] = []): Promise<Webhook> {
  const w = await startWebhook({
    hooks, metrics: true, args: ['-deliveries', '50', ...args],
    env: { NOTIFY_CACERT: Buffer.from(rx.certPem).toString('base64') },
  });
  stopAll.push(w);
  return w;
}

async function push(w: Webhook, hook: string): Promise<{ status: number; requestId: string; body: string }> {
  const res = await w.request(`/hooks/${hook}?token=${TOKEN}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{}' });
  return { status: res.status, requestId: String(res.headers['x-request-id']), body: res.body };
}

/** The deliveries entry of a request, once its notifications have an outcome. */
async function settledDelivery(w: Webhook, requestId: string): Promise<any> {
  const port = await adminPort(w);
  return waitFor(async () => {
    const doc = JSON.parse((await httpRequest(port, '/deliveries.json')).body);
    const d = doc.deliveries.find((x: any) => x.request_id === requestId);
    return d && d.state === 'done' && d.notifications.every((n: any) => n.state !== 'pending') ? d : undefined;
  }, { timeoutMs: 30_000, what: `the notifications of ${requestId}` });
}

function metricValue(text: string, labels: string): number {
  const m = new RegExp(`^webhook_notifications_total\\{${labels.replace(/[{}]/g, '\\$&')}\\} (\\d+)$`, 'm').exec(text);
  return m ? Number(m[1]) : 0;
}

const TITLE = 'Webhooks通知: prod-deployment/web-app 更新结果: succeeded';

describe('each format\'s exact body, signed as its platform documents', () => {
  let rx: Receiver;
  let w: Webhook;
  before(async () => {
    rx = await startReceiver();
    const url = (p: string) => `${rx.base}${p}`;
    w = await started([
      chatHook('json', { NOTIFY_URL: url(`/json?key=${ROBOT_KEY}`), NOTIFY_SECRET: SECRET }),
      chatHook('dingtalk', { NOTIFY_URL: url(`/robot/send?access_token=${ROBOT_KEY}`), NOTIFY_FORMAT: 'dingtalk', NOTIFY_SECRET: SECRET }),
      chatHook('wecom', { NOTIFY_URL: url(`/cgi-bin/webhook/send?key=${ROBOT_KEY}`), NOTIFY_FORMAT: 'wecom' }),
      chatHook('feishu', { NOTIFY_URL: url(`/open-apis/bot/v2/hook/${ROBOT_KEY}`), NOTIFY_FORMAT: 'feishu', NOTIFY_SECRET: SECRET }),
      chatHook('slack', { NOTIFY_URL: url(`/services/T0/B0/${ROBOT_KEY}`), NOTIFY_FORMAT: 'slack' }),
      chatHook('both', { NOTIFY_URL: `${url('/a')} ${url('/b')}`, NOTIFY_FORMAT: 'json,wecom' }),
    ], rx);
  });
  after(async () => {
    await stopStarted();
    await rx.close();
  });

  const requestFor = async (pathStart: string) => {
    const found = await waitFor(() => rx.requests.find((r) => r.url.startsWith(pathStart)), { timeoutMs: 30_000, what: `a request to ${pathStart}` });
    assert.equal(found.method, 'POST');
    assert.match(String(found.headers['content-type']), /^application\/json/);
    return found;
  };

  test('json: the webhook.result/v1 document, its HMAC-SHA256 in X-Webhook-Signature-256', async () => {
    const { requestId, status, body } = await push(w, 'json');
    assert.equal(status, 200);
    assert.equal(body, 'rolled out\n');
    const r = await requestFor('/json');
    assert.equal(r.url, `/json?key=${ROBOT_KEY}`);
    assert.equal(r.headers['x-webhook-signature-256'], `sha256=${createHmac('sha256', SECRET).update(r.body).digest('hex')}`);
    assert.equal(r.headers['x-webhook-event'], 'push-result');
    assert.equal(r.headers['x-webhook-delivery'], requestId);
    const doc = JSON.parse(r.body);
    assert.match(doc.received_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    assert.ok(doc.finished_at >= doc.received_at);
    assert.deepEqual(doc, {
      schema: 'webhook.result/v1', hook: 'json', request_id: requestId, received_at: doc.received_at, finished_at: doc.finished_at,
      outcome: 'succeeded', decision: 'ran', detail: 'exit status 0', registry: 'regionalregistry', namespace: 'prod',
      workload: 'deployment/web', container: 'app', image_before: null, image_after: null, rollout: null, pods: [],
      report: 'rolled out\n',
    });
    // The keys in the documented order (README), so a reader of the raw body sees them so.
    assert.deepEqual(Object.keys(doc).slice(0, 3), ['schema', 'hook', 'request_id']);
  });

  test('dingtalk: markdown message; timestamp and sign (base64 HMAC-SHA256 of "timestamp\\nsecret") in the URL', async () => {
    const { requestId } = await push(w, 'dingtalk');
    const r = await requestFor('/robot/send');
    const url = new URL(r.url, rx.base);
    assert.equal(url.searchParams.get('access_token'), ROBOT_KEY);
    const timestamp = url.searchParams.get('timestamp')!;
    assert.match(timestamp, /^\d{13}$/);
    assert.equal(url.searchParams.get('sign'), createHmac('sha256', SECRET).update(`${timestamp}\n${SECRET}`).digest('base64'));
    // The sign is URL-encoded on the wire (base64's + / = escaped).
    assert.doesNotMatch(r.url.split('sign=')[1], /[+/=]/);
    assert.deepEqual(JSON.parse(r.body), {
      msgtype: 'markdown',
      markdown: {
        title: TITLE,
        text: `### ${TITLE}\n\n**hook** dingtalk · **request** ${requestId}\n\n**workload** deployment/web in prod, container app\n\n` +
          '**decision** ran (exit status 0)',
      },
    });
  });

  test('wecom: markdown content, no signature', async () => {
    const { requestId } = await push(w, 'wecom');
    const r = await requestFor('/cgi-bin/webhook/send');
    assert.equal(r.url, `/cgi-bin/webhook/send?key=${ROBOT_KEY}`);
    assert.deepEqual(JSON.parse(r.body), {
      msgtype: 'markdown',
      markdown: {
        content: `### ${TITLE}\n**hook** wecom · **request** ${requestId}\n**workload** deployment/web in prod, container app\n` +
          '**decision** ran (exit status 0)',
      },
    });
  });

  test('feishu: an interactive card with markdown; timestamp and sign (HMAC-SHA256 keyed "timestamp\\nsecret" of "") in the body', async () => {
    const { requestId } = await push(w, 'feishu');
    const r = await requestFor('/open-apis/bot/v2/hook/');
    const body = JSON.parse(r.body);
    assert.match(body.timestamp, /^\d{10}$/);
    assert.equal(body.sign, createHmac('sha256', `${body.timestamp}\n${SECRET}`).update('').digest('base64'));
    assert.deepEqual(body, {
      timestamp: body.timestamp, sign: body.sign, msg_type: 'interactive',
      card: {
        header: { title: { tag: 'plain_text', content: TITLE }, template: 'green' },
        elements: [{ tag: 'markdown', content: `**hook** feishu · **request** ${requestId}\n**workload** deployment/web in prod, container app\n**decision** ran (exit status 0)` }],
      },
    });
  });

  test('slack: the message as text and as one mrkdwn section block', async () => {
    const { requestId } = await push(w, 'slack');
    const r = await requestFor('/services/T0/B0/');
    const text = `*${TITLE}*\n*hook* slack · *request* ${requestId}\n*workload* deployment/web in prod, container app\n*decision* ran (exit status 0)`;
    assert.deepEqual(JSON.parse(r.body), { text, blocks: [{ type: 'section', text: { type: 'mrkdwn', text } }] });
  });

  test('several URLs, one format each; the deliveries page records each channel by host only', async () => {
    const { requestId } = await push(w, 'both');
    const a = await requestFor('/a');
    const b = await requestFor('/b');
    assert.equal(JSON.parse(a.body).schema, 'webhook.result/v1');
    assert.equal(JSON.parse(b.body).msgtype, 'markdown');
    assert.equal(a.headers['x-webhook-signature-256'], undefined, 'no NOTIFY_SECRET, no signature');
    const d = await settledDelivery(w, requestId);
    assert.deepEqual(d.notifications.map((n: any) => [n.channel, n.state]), [[`json 127.0.0.1:${rx.port}`, 'sent'], [`wecom 127.0.0.1:${rx.port}`, 'sent']]);
    const metrics = (await w.metrics()).body;
    assert.ok(metricValue(metrics, 'format="wecom",result="sent"') >= 2, metrics);
    assert.ok(metricValue(metrics, 'format="json",result="sent"') >= 2, metrics);
  });
});

describe('timing, retries, refusals and the cap', () => {
  let rx: Receiver;
  before(async () => {
    rx = await startReceiver({ status: 200, body: '{"errcode":0}' });
  });
  after(async () => {
    await stopStarted();
    await rx.close();
  });

  test('the answer never waits for a notification: it arrives while the receiver still holds its answer', async () => {
    let release!: () => void;
    rx.answers.push({ hold: new Promise<void>((r) => (release = r)) });
    const w = await started([chatHook('held', { NOTIFY_URL: `${rx.base}/held` })], rx);
    const { status, body, requestId } = await push(w, 'held');
    assert.equal(status, 200);
    assert.equal(body, 'rolled out\n');
    await rx.waitForRequests(1);
    assert.equal(rx.answered, 0, 'the receiver has not answered yet');
    const port = await adminPort(w);
    const pending = JSON.parse((await httpRequest(port, `/deliveries.json`)).body).deliveries[0];
    assert.equal(pending.request_id, requestId);
    assert.deepEqual(pending.notifications.map((n: any) => n.state), ['pending']);
    release();
    assert.equal((await settledDelivery(w, requestId)).notifications[0].state, 'sent');
    rx.requests.length = 0;
  });

  test('transient failures (503, then 429) are retried; the result is counted once', async () => {
    rx.answers.push({ status: 503, body: 'busy' }, { status: 429, body: 'slow down' });
    const w = await started([chatHook('retried', { NOTIFY_URL: `${rx.base}/retried` })], rx);
    const { requestId } = await push(w, 'retried');
    const d = await settledDelivery(w, requestId);
    assert.deepEqual(d.notifications.map((n: any) => [n.state, n.detail]), [['sent', 'attempt 3']]);
    assert.equal(rx.requests.filter((r) => r.url === '/retried').length, 3);
    const metrics = (await w.metrics()).body;
    assert.equal(metricValue(metrics, 'format="json",result="sent"'), 1, metrics);
    rx.requests.length = 0;
  });

  test('a refusal is not retried: HTTP 400, and DingTalk\'s 200 with a non-zero errcode; logs and page keep the key out', async () => {
    rx.answers.push({ status: 400, body: 'bad' }, { status: 200, body: '{"errcode":310000,"errmsg":"sign not match"}' });
    const w = await started([
      chatHook('refused', { NOTIFY_URL: `${rx.base}/refused/${ROBOT_KEY}` }),
      chatHook('ding', { NOTIFY_URL: `${rx.base}/robot/send?access_token=${ROBOT_KEY}`, NOTIFY_FORMAT: 'dingtalk', NOTIFY_SECRET: SECRET }),
    ], rx);
    const first = await push(w, 'refused');
    const a = await settledDelivery(w, first.requestId);
    const second = await push(w, 'ding');
    const b = await settledDelivery(w, second.requestId);
    assert.equal(a.notifications[0].state, 'failed');
    assert.match(a.notifications[0].detail, /^HTTP 400: "bad" \(after 1 attempt\(s\)\)$/);
    assert.equal(b.notifications[0].state, 'failed');
    assert.match(b.notifications[0].detail, /refused: errcode 310000: sign not match \(after 1 attempt\(s\)\)/);
    assert.equal(rx.requests.length, 2, 'one request each');
    await waitForOutput(w, /dingtalk notification to 127\.0\.0\.1:\d+ not sent: refused: errcode 310000/);
    const metrics = (await w.metrics()).body;
    assert.equal(metricValue(metrics, 'format="json",result="failed"'), 1, metrics);
    assert.equal(metricValue(metrics, 'format="dingtalk",result="failed"'), 1, metrics);
    const page = (await httpRequest(await adminPort(w), '/deliveries')).body + (await httpRequest(await adminPort(w), '/deliveries.json')).body;
    for (const secret of [ROBOT_KEY, SECRET, TOKEN]) {
      assert.ok(!w.output().includes(secret), `the log shows ${secret}`);
      assert.ok(!page.includes(secret), `the page shows ${secret}`);
    }
    rx.requests.length = 0;
  });

  test('-max-notifications-per-hook: the results beyond are recorded as held and counted as capped, not sent', async () => {
    const w = await started([chatHook('capped', { NOTIFY_URL: `${rx.base}/capped` })], rx, ['-max-notifications-per-hook', '2']);
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await push(w, 'capped')).requestId);
    const states = [];
    for (const id of ids) states.push((await settledDelivery(w, id)).notifications[0]);
    assert.deepEqual(states.map((n) => n.state).sort(), ['held', 'sent', 'sent']);
    assert.match(states.find((n) => n.state === 'held').detail, /^not sent: hook capped reached 2 per 10m0s$/);
    assert.equal(rx.requests.filter((r) => r.url === '/capped').length, 2);
    const metrics = (await w.metrics()).body;
    assert.equal(metricValue(metrics, 'format="json",result="capped"'), 1, metrics);
    await waitForOutput(w, /hook capped sent 2 notification\(s\) within 10m0s/);
    rx.requests.length = 0;
  });

  test('without NOTIFY_CACERT the self-signed receiver is not trusted: the notification fails, saying why', async () => {
    const w = await startWebhook({ hooks: [chatHook('untrusted', { NOTIFY_URL: `${rx.base}/untrusted` })], metrics: true });
    stopAll.push(w);
    const { requestId } = await push(w, 'untrusted');
    const d = await settledDelivery(w, requestId);
    assert.equal(d.notifications[0].state, 'failed');
    assert.match(d.notifications[0].detail, /^self-signed certificate \(a private CA is trusted with NOTIFY_CACERT\) \(after 1 attempt\(s\)\)$/);
    assert.equal(rx.requests.filter((r) => r.url === '/untrusted').length, 0);
  });
});

describe('bad settings are refused with the place named, and nothing starts', () => {
  after(stopStarted);

  const refusedAtLoad = async (hooks: object[], env: Record<string, string> = {}) => {
    const dir = makeTempDir('notify-bad-');
    const file = path.join(dir, 'hooks.json');
    fs.writeFileSync(file, JSON.stringify(hooks, null, 1));
    const s = await spawnWebhook({ hooks: file, env });
    const exit = await s.exited;
    assert.notEqual(exit.code, 0, s.output());
    return { output: s.output(), file };
  };

  test('an unknown NOTIFY_FORMAT, a NOTIFY_URL that is not http(s), one the request could choose', async () => {
    let r = await refusedAtLoad([chatHook('x', { NOTIFY_URL: 'https://example.test/x', NOTIFY_FORMAT: 'teams' })]);
    assert.match(r.output, /hook "x": pass-environment-to-command\[5\]\.name: NOTIFY_FORMAT "teams" is not one of json, dingtalk, wecom, feishu or slack/);
    r = await refusedAtLoad([chatHook('x', { NOTIFY_URL: `ftp://example.test/${ROBOT_KEY}` })]);
    assert.match(r.output, /pass-environment-to-command\[4\]\.name: NOTIFY_URL item 1 is not an http or https URL \(ftp:\)/);
    assert.ok(!r.output.includes(ROBOT_KEY), r.output);
    const fromRequest = chatHook('x', {});
    fromRequest['pass-environment-to-command'].push({ envname: 'NOTIFY_URL', source: 'url', name: 'notify' });
    r = await refusedAtLoad([fromRequest]);
    assert.match(r.output, /pass-environment-to-command\[4\]\.source: NOTIFY_URL must be fixed in the hook file/);
  });

  test('-validate names each receiver by format and host only, and what stops one', () => {
    const dir = makeTempDir('notify-validate-');
    const upgrade = (id: string, env: Record<string, string>) => ({
      id, 'execute-command': '/webhooks.sh', 'pass-arguments-to-command': [{ source: 'entire-payload' }],
      'pass-environment-to-command': fixedEnv({ APP_NS: 'prod', APP_WORKLOAD: 'deployment/web', APP_CONTAINER: 'app', ...env }),
    });
    fs.writeFileSync(path.join(dir, 'hooks.json'), JSON.stringify([
      upgrade('chat', { NOTIFY_URL: `https://oapi.dingtalk.com/robot/send?access_token=${ROBOT_KEY} https://hooks.example.com/${ROBOT_KEY}`, NOTIFY_FORMAT: 'dingtalk,json', NOTIFY_SECRET: SECRET }),
      upgrade('unsigned', { NOTIFY_URL: `https://hooks.slack.com/services/${ROBOT_KEY}`, NOTIFY_FORMAT: 'slack', NOTIFY_SECRET: SECRET }),
      upgrade('templated', { DEPLOY_KEY: '{{ getenv "DEPLOY_KEY" }}' }),
    ]));
    const env = { PATH: process.env.PATH, DEPLOY_KEY: `deploy-${ROBOT_KEY}` };
    const r = spawnSync(defaultBinary(), ['-validate', '-template', '-hooks', dir], { encoding: 'utf8', env });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^ +notify: dingtalk oapi\.dingtalk\.com \(signed\), json hooks\.example\.com \(signed\)$/m);
    assert.match(r.stdout, /^ +notify: none will be sent: NOTIFY_SECRET is set, but slack \(URL 1\) does not sign its requests$/m);
    assert.match(r.stdout, /^ +NOTIFY_SECRET = string \(not shown: it holds a key\)$/m);
    assert.match(r.stdout, /^ +DEPLOY_KEY = string \(inserted by the template, not shown\)$/m);
    assert.ok(!r.stdout.includes(ROBOT_KEY) && !r.stdout.includes(SECRET), r.stdout);
  });

  test('a NOTIFY_CACERT that holds no certificate', async () => {
    const r = await refusedAtLoad([chatHook('x', {})], { NOTIFY_CACERT: Buffer.from('not a certificate').toString('base64') });
    assert.match(r.output, /notifications: NOTIFY_CACERT holds no PEM certificate/);
  });

  test('a NOTIFY_SECRET for a format that does not sign: nothing is sent, the page and the log say why', async () => {
    const rx = await startReceiver();
    try {
      const w = await started([chatHook('unsigned', { NOTIFY_URL: `${rx.base}/${ROBOT_KEY}`, NOTIFY_FORMAT: 'slack', NOTIFY_SECRET: SECRET })], rx);
      const d = await settledDelivery(w, (await push(w, 'unsigned')).requestId);
      assert.deepEqual(d.notifications.map((n: any) => [n.channel, n.state, n.detail]),
        [['notify', 'failed', 'NOTIFY_SECRET is set, but slack (URL 1) does not sign its requests']]);
      await waitForOutput(w, /notifications for hook unsigned not sent: NOTIFY_SECRET is set, but slack \(URL 1\) does not sign/);
      assert.equal(rx.requests.length, 0);
      assert.ok(!w.output().includes(SECRET) && !w.output().includes(ROBOT_KEY), w.output());
    } finally {
      await rx.close();
    }
  });

  test('NOTIFY_* of the service\'s own environment reach no command, and are not used: a hook passes them', async () => {
    const rx = await startReceiver();
    try {
      const dir = makeTempDir('notify-env-');
      const hook = { id: 'env', 'execute-command': '/usr/bin/env', 'include-command-output-in-response': true };
      const again = await startWebhook({ hooks: [hook], metrics: true, cwd: dir, env: { NOTIFY_URL: `${rx.base}/service`, NOTIFY_SECRET: SECRET } });
      stopAll.push(again);
      const res = await again.request('/hooks/env', { method: 'POST' });
      assert.equal(res.status, 200);
      assert.doesNotMatch(res.body, /^NOTIFY_/m);
      await waitForOutput(again, 'warning: NOTIFY_URL in the service\'s environment is not used: a hook passes it');
      await settledDelivery(again, String(res.headers['x-request-id']));
      assert.equal(rx.requests.length, 0);
    } finally {
      await rx.close();
    }
  });
});

describe('request-derived text is made inert in each chat format (no link, image, mention or tag from a request)', () => {
  let rx: Receiver;
  let w: Webhook;
  // What a token holder can put in the URL: a link, an image, mentions and tags of each chat, and a new line.
  const HOSTILE = 'app [click](https://evil.example/x) ![i](http://evil.example/p.png) <!channel> <@U024BE7LH> ' +
    '<at id=all></at> <font color="red">x</font> &lt;b&gt;\n### injected';
  /** A hook whose workload and container come from the URL, as the seed hook's do. */
  const hostileHook = (id: string, env: Record<string, string>) => {
    const hook = chatHook(id, env) as any;
    hook['pass-environment-to-command'] = [
      ...hook['pass-environment-to-command'].filter((e: any) => e.envname !== 'APP_CONTAINER'),
      { envname: 'APP_CONTAINER', source: 'url', name: 'container' },
    ];
    return hook;
  };
  before(async () => {
    rx = await startReceiver();
    const url = (p: string) => `${rx.base}${p}`;
    w = await started([
      hostileHook('dingtalk', { NOTIFY_URL: url(`/robot/send?access_token=${ROBOT_KEY}`), NOTIFY_FORMAT: 'dingtalk' }),
      hostileHook('wecom', { NOTIFY_URL: url(`/cgi-bin/webhook/send?key=${ROBOT_KEY}`), NOTIFY_FORMAT: 'wecom' }),
      hostileHook('feishu', { NOTIFY_URL: url(`/open-apis/bot/v2/hook/${ROBOT_KEY}`), NOTIFY_FORMAT: 'feishu' }),
      hostileHook('slack', { NOTIFY_URL: url(`/services/T0/B0/${ROBOT_KEY}`), NOTIFY_FORMAT: 'slack' }),
    ], rx);
  });
  after(async () => {
    await stopStarted();
    await rx.close();
  });

  const markupOf = async (hook: string, pathStart: string) => {
    const q = new URLSearchParams({ token: TOKEN, container: HOSTILE });
    assert.equal((await w.request(`/hooks/${hook}?${q}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{}' })).status, 200);
    const r = await waitFor(() => rx.requests.find((x) => x.url.startsWith(pathStart)), { timeoutMs: 30_000, what: `a request to ${pathStart}` });
    return JSON.parse(r.body);
  };
  const assertInert = (text: string, format: string) => {
    for (const live of ['](', '[click]', '![', '<!channel>', '<@U024BE7LH>', '<at id=all>', '<font', '://', '\n### injected'])
      assert.ok(!text.includes(live), `${format}: ${JSON.stringify(live)} is live in ${JSON.stringify(text)}`);
    assert.match(text, /evil\.example/, `${format}: the text is still shown`);
  };

  test('dingtalk and wecom: markdown with the request\'s brackets, tags and entities in full-width forms, on one line', async () => {
    const d = await markupOf('dingtalk', '/robot/send');
    assertInert(d.markdown.text, 'dingtalk');
    assert.match(d.markdown.text, /container app ［click］\(https:\u200B\/\/evil\.example\/x\) !［i］/);
    assert.ok(!d.markdown.title.includes('\n'), 'the title is one line');
    const c = (await markupOf('wecom', '/cgi-bin/webhook/send')).markdown.content;
    assertInert(c, 'wecom');
    assert.match(c, /＜@U024BE7LH＞ ＜at id=all＞＜\/at＞ ＜font color="red"＞x＜\/font＞ ＆lt;b＆gt; ### injected/);
  });

  test('feishu: the card\'s markdown inert; its plain-text title on one line', async () => {
    const card = (await markupOf('feishu', '/open-apis/bot/v2/hook/')).card;
    assertInert(card.elements[0].content, 'feishu');
    assert.ok(!card.header.title.content.includes('\n'));
  });

  test('slack: &, < and > escaped as Slack documents, so no link or mention', async () => {
    const body = await markupOf('slack', '/services/T0/B0/');
    assertInert(body.text, 'slack');
    assert.equal(body.blocks[0].text.text, body.text);
    assert.match(body.text, /&lt;!channel&gt; &lt;@U024BE7LH&gt; &lt;at id=all&gt;&lt;\/at&gt;/);
    assert.match(body.text, /&amp;lt;b&amp;gt;/);
  });
});
