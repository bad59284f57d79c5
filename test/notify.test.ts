/*
 * NOTIFY_URL notifications through the built executable over real HTTP, to a local HTTPS receiver
 * (test/receiver.ts: a self-signed certificate made with openssl, trusted through NOTIFY_CACERT):
 * the exact body of each format (json, dingtalk, wecom, feishu, slack) as its platform documents
 * it; teams, discord, googlechat, telegram and lark each to a receiver that checks the message against
 * its vendor's documented shape and limits and answers as the vendor does (test/chat-shapes.ts), a
 * tag and repository full of markup arriving inert, Discord's and Telegram's 429 retry_after
 * honoured, the Telegram bot token kept out of every log line, page and answer; the signatures
 * (the JSON header's HMAC, DingTalk's signed URL, Feishu's signed body), the timing (after the command, never holding the answer), retries, refusals, the per-hook cap, the
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
import { notifyRequest, resultSettings } from '../webhook.ts';
import { CHAT_SHAPES, formatOf, NEW_FORMATS, type NewFormat, telegramShown, vendorAnswer } from './chat-shapes.ts';
import { startReceiver, type Receiver } from './receiver.ts';
import { upgradeHook } from './upgrade-hooks.ts';

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
    let r = await refusedAtLoad([chatHook('x', { NOTIFY_URL: 'https://example.test/x', NOTIFY_FORMAT: 'hipchat' })]);
    assert.match(r.output, /hook "x": pass-environment-to-command\[5\]\.name: NOTIFY_FORMAT "hipchat" is not one of json, dingtalk, wecom, feishu, slack, teams, discord, googlechat, telegram or lark/);
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
    '<at id=all></at> <font color="red">x</font> &lt;b&gt;\n### injected approve-now.evil-example.com';
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
    for (const live of ['](', '[click]', '![', '<!channel>', '<@U024BE7LH>', '<at id=all>', '<font', '://', '\n### injected',
      'evil.example', 'approve-now.evil-example.com'])
      assert.ok(!text.includes(live), `${format}: ${JSON.stringify(live)} is live in ${JSON.stringify(text)}`);
    // Shown as it was, but for the zero-width space after each "." that a bare host name would be linked by.
    assert.match(text, /approve-now\.\u200Bevil-example\.\u200Bcom/, `${format}: the text is still shown`);
  };

  test('dingtalk and wecom: markdown with the request\'s brackets, tags and entities in full-width forms, on one line', async () => {
    const d = await markupOf('dingtalk', '/robot/send');
    assertInert(d.markdown.text, 'dingtalk');
    assert.match(d.markdown.text, /container app ［click］\(https:\u200B\/\/evil\.\u200Bexample\/x\) !［i］/);
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

describe('teams, discord, googlechat, telegram and lark: each message as its vendor documents it', () => {
  const LARK_SECRET = 'lark-secret-0d93b1f2c7';
  const CHAT = '-1001234567890';
  // A tag and a repository full of each chat's markup: HTML, emphasis, a javascript: link, mentions of everyone.
  const HOSTILE = '<b>**bold**</b>[x](javascript:alert(1))@everyone<users/all>approve-now.evil-example.com';
  let rx: Receiver;
  let w: Webhook;
  const larkSecrets: Record<string, string> = {};
  /** A hook's receiver: the format's documented path after a prefix naming the hook. */
  const notifyEnv = (f: NewFormat, prefix: string): Record<string, string> => {
    const url = `${rx.base}/${prefix}${CHAT_SHAPES[f].path}`;
    if (f === 'lark') larkSecrets[new URL(url).pathname] = LARK_SECRET;
    return {
      NOTIFY_URL: url, NOTIFY_FORMAT: f,
      ...(f === 'lark' ? { NOTIFY_SECRET: LARK_SECRET } : {}), ...(f === 'telegram' ? { NOTIFY_TELEGRAM_CHAT: CHAT } : {}),
    };
  };
  /** An ACR push whose payload the upgrade refuses (400) before it reads the cluster. */
  const refusedPush = (hook: string, tag: string, repo: string) => {
    const q = new URLSearchParams({ token: TOKEN, ns: 'prod', workload: 'deployment/web', container: 'app', repo_type: 'regionalregistry' });
    const payload = { push_data: { digest: `sha256:${'a'.repeat(64)}`, pushed_at: new Date().toISOString(), tag }, repository: { name: 'web', namespace: 'shop', region: 'cn-hangzhou', repo_full_name: repo, repo_type: 'PRIVATE' } };
    return w.request(`/hooks/${hook}?${q}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(payload) });
  };
  /** The message a hook's notification posted (its body parsed), once the vendor took it. */
  const taken = async (prefix: string, requestId: string) => {
    const d = await settledDelivery(w, requestId);
    assert.equal(d.notifications[0].state, 'sent', `${prefix}: ${d.notifications[0].detail}`);
    const r = rx.requests.filter((x) => x.url.startsWith(`/${prefix}/`)).at(-1)!;
    return JSON.parse(r.body);
  };

  before(async () => {
    rx = await startReceiver();
    rx.answerFor = (r) => vendorAnswer(r, larkSecrets);
    w = await startWebhook({
      hooks: NEW_FORMATS.flatMap((f) => [
        chatHook(`result-${f}`, notifyEnv(f, `result-${f}`)),
        upgradeHook(`refused-${f}`, TOKEN, notifyEnv(f, `refused-${f}`)),
      ]),
      metrics: true, args: ['-deliveries', '50'],
      env: { NOTIFY_CACERT: Buffer.from(rx.certPem).toString('base64'), KUBECONFIG: '/nonexistent/kubeconfig' },
    });
    stopAll.push(w);
  });
  after(async () => {
    await stopStarted();
    await rx.close();
  });

  test('a result: the vendor takes each message (fields, types, buttons, lengths, size), which tells the facts of the record', async () => {
    for (const f of NEW_FORMATS) {
      const { requestId, status } = await push(w, `result-${f}`);
      assert.equal(status, 200);
      const body = await taken(`result-${f}`, requestId);
      const text = CHAT_SHAPES[f].texts(body).join('\n');
      for (const fact of [`result-${f}`, requestId, 'deployment/web in prod, container app', 'ran (exit status 0)'])
        assert.ok(text.includes(fact), `${f}: ${fact} in ${text}`);
      assert.deepEqual(CHAT_SHAPES[f].buttons(body), [], `${f}: a result has no buttons`);
    }
    const bodies = Object.fromEntries(NEW_FORMATS.map((f) => [f, JSON.parse(rx.requests.find((r) => r.url.startsWith(`/result-${f}/`))!.body)]));
    assert.deepEqual(bodies.teams.attachments[0].content.body[0], { type: 'TextBlock', text: TITLE, weight: 'Bolder', size: 'Medium', wrap: true, color: 'Good' });
    assert.deepEqual(bodies.teams.attachments[0].content.body[1].facts.map((x: any) => x.title), ['hook', 'request', 'workload', 'decision']);
    assert.deepEqual([bodies.discord.embeds[0].title, bodies.discord.embeds[0].color, bodies.discord.allowed_mentions], [TITLE, 0x2e7d32, { parse: [] }]);
    assert.deepEqual(bodies.googlechat.cardsV2[0].card.header, { title: TITLE, subtitle: 'ran' });
    assert.deepEqual([bodies.telegram.chat_id, bodies.telegram.parse_mode, bodies.telegram.link_preview_options], [CHAT, 'HTML', { is_disabled: true }]);
    assert.match(bodies.telegram.text, /^<b>Webhooks通知: prod-deployment\/web-app 更新结果: succeeded<\/b>\n<b>hook<\/b> <code>result-telegram<\/code>\n/);
    assert.equal(bodies.lark.card.header.template, 'green');
    assert.equal(bodies.lark.sign, createHmac('sha256', `${bodies.lark.timestamp}\n${LARK_SECRET}`).update('').digest('base64'));
    assert.ok(rx.requests.filter((r) => r.url.startsWith('/result-lark/')).every((r) => r.url.endsWith('/open-apis/bot/v2/hook/lark-hook-6a0e')));
  });

  test('a refused push whose tag, then repository, is full of each chat\'s markup: every message says failed, and the markup arrives inert', async () => {
    const tagged = Object.fromEntries(await Promise.all(NEW_FORMATS.map(async (f) => [f, await refusedPush(`refused-${f}`, `v2${HOSTILE}`, 'shop/web')])));
    for (const f of NEW_FORMATS) assert.equal(tagged[f].status, 400, tagged[f].body);
    const named = Object.fromEntries(await Promise.all(NEW_FORMATS.map(async (f) => [f, await refusedPush(`refused-${f}`, 'v2', `shop/web${HOSTILE}`)])));
    for (const f of NEW_FORMATS) {
      for (const res of [tagged[f], named[f]]) {
        const body = await taken(`refused-${f}`, String(res.headers['x-request-id']));
        const text = CHAT_SHAPES[f].texts(body).join('\n');
        assert.match(text, /failed/, `${f}: the decision`);
        assert.match(text, /javascript/, `${f}: the text is still shown`);
        assert.match(text, /everyone/, `${f}: the text is still shown`);
        assertChatInert(f, text);
      }
    }
    const last = (f: string) => JSON.parse(rx.requests.filter((r) => r.url.startsWith(`/refused-${f}/`)).at(-1)!.body);
    assert.equal(last('discord').embeds[0].color, 0xc62828);
    assert.equal(last('teams').attachments[0].content.body[0].color, 'Attention');
    assert.equal(last('lark').card.header.template, 'red');
  });

  /** No markup of the chat's own from the request's text: what each would render, checked where it would. */
  function assertChatInert(f: NewFormat, text: string): void {
    const live: Record<NewFormat, string[]> = {
      teams: ['<', '**bold**', '[x]', '](', '_'],
      discord: ['<', '**bold**', '[x]', '](', '@everyone'],
      googlechat: ['<'],
      telegram: ['<a', '<users', '<b>*'],
      lark: ['<', '**bold**', '[x]', '](', '<at'],
    };
    for (const markup of [...live[f], 'approve-now.evil-example.com'])
      assert.ok(!text.includes(markup), `${f}: ${JSON.stringify(markup)} is live in ${JSON.stringify(text)}`);
    // A bare host name (where it was not cut) is shown with a zero-width space after each ".": nothing links it.
    assert.ok(!/approve-now\.(?!\u200B)|evil-example\.(?!\u200B)/.test(text), `${f}: a bare host name is live in ${JSON.stringify(text)}`);
    if (f === 'telegram') {
      assert.deepEqual(telegramShown(text).problems, []);
      assert.deepEqual([...new Set([...text.matchAll(/<\/?([a-z-]+)/g)].map((m) => m[1]))].sort(), ['b', 'code'], 'only our tags');
      assert.ok(!text.replace(/<code>[^<]*<\/code>/g, '').includes('@everyone'), 'a mention outside code');
    }
  }

  test('a value too long for a chat is cut, saying so; every message stays within its vendor\'s limits', () => {
    // What a request could put in a result at most, every character one that its chats escape.
    const long = (n: number) => '<&>*_@[]'.repeat(n / 8);
    const result = {
      seq: 1, state: 'done' as const, notifications: [], action: 'none', settings: resultSettings(() => undefined),
      hookId: 'long', requestId: 'r-long', receivedAt: new Date(), finishedAt: new Date(), outcome: 'failed' as const,
      decision: 'failed' as const, changed: false, result: 'failed' as const, notes: [], detail: long(4096), registry: 'regionalregistry', cluster: long(256), namespace: long(64),
      workload: `deployment/${long(2048)}`, container: long(8192), imageBefore: `r.example/${long(2048)}`, imageAfter: `r.example/${long(2048)}`,
      rollout: { state: 'failed' as const, detail: long(4096), pods: [] }, pods: [{ name: 'p', ready: false, phase: 'Pending' }] as any, report: '',
      waiting: { entry: { waitsFor: 'approval', until: '' } as any, links: { approve: `https://w.example/approval/${'a'.repeat(900)}`, reject: `https://w.example/approval/${'b'.repeat(900)}`, deployNow: `https://w.example/approval/${'c'.repeat(900)}` } },
    };
    for (const f of NEW_FORMATS) {
      const target = { url: new URL(`https://chat.example/x${CHAT_SHAPES[f].path}`), format: f, chat: CHAT, secret: f === 'lark' ? LARK_SECRET : undefined };
      const request = notifyRequest(result, target);
      const body = JSON.parse(request.body);
      const received = { method: 'POST', url: `${request.url.pathname}${request.url.search}`, headers: {}, body: request.body, at: 0 };
      assert.deepEqual(CHAT_SHAPES[f].problems(body, received, f === 'lark' ? LARK_SECRET : undefined), [], f);
      assert.equal(CHAT_SHAPES[f].buttons(body).length, 3, `${f}: its three buttons`);
      assert.match(CHAT_SHAPES[f].texts(body).join('\n'), / … \(cut\)/, `${f}: a cut says so`);
    }
  });

  test('Discord\'s and Telegram\'s 429 with retry_after in its body: the next try waits that long, not the backoff', async () => {
    const throttled: Record<string, boolean> = {};
    const previous = rx.answerFor;
    rx.answerFor = (r) => {
      const f = formatOf(r);
      if (!r.url.startsWith('/result-') || (f !== 'discord' && f !== 'telegram') || throttled[f]) return previous!(r);
      throttled[f] = true;
      return f === 'discord'
        ? { status: 429, body: '{"message":"You are being rate limited.","retry_after":5.5,"global":false}' }
        : { status: 429, body: '{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 6","parameters":{"retry_after":6}}' };
    };
    try {
      const sent = await Promise.all(['discord', 'telegram'].map(async (f) => {
        const before = rx.requests.length;
        const { requestId } = await push(w, `result-${f}`);
        const d = await settledDelivery(w, requestId);
        return { f, d, tries: rx.requests.slice(before).filter((r) => r.url.startsWith(`/result-${f}/`)) };
      }));
      for (const { f, d, tries } of sent) {
        assert.deepEqual(d.notifications.map((n: any) => [n.state, n.detail]), [['sent', 'attempt 2']], f);
        const waited = tries[1].at - tries[0].at;
        // The backoff alone would try again after 2 s; the answer asked for 5.5 s (Discord) and 6 s (Telegram).
        assert.ok(waited >= (f === 'discord' ? 5_500 : 6_000), `${f} tried again after ${waited} ms`);
      }
    } finally {
      rx.answerFor = previous;
    }
  });
});

describe('the Telegram bot token is a secret', () => {
  const TELEGRAM_PATH = '/bot4839574812:AAFq-telegram-token_x9/sendMessage';
  const BOT_TOKEN = '4839574812:AAFq-telegram-token_x9';
  after(stopStarted);

  test('never in a log line, the deliveries page, an answer or -validate, even when the Bot API\'s answer repeats it', async () => {
    const rx = await startReceiver({ status: 401, body: JSON.stringify({ ok: false, error_code: 401, description: `Unauthorized: bot${BOT_TOKEN} is revoked (token ${BOT_TOKEN}, ${encodeURIComponent(BOT_TOKEN)})` }) });
    try {
      const env = { NOTIFY_URL: `${rx.base}${TELEGRAM_PATH}`, NOTIFY_FORMAT: 'telegram', NOTIFY_TELEGRAM_CHAT: '@release_channel' };
      const w = await started([chatHook('tg', env)], rx, ['-verbose']);
      const res = await push(w, 'tg');
      const d = await settledDelivery(w, res.requestId);
      assert.deepEqual([d.notifications[0].channel, d.notifications[0].state], [`telegram 127.0.0.1:${rx.port}`, 'failed']);
      // Its URL's key and the bot token are taken out of the answer before it is quoted.
      assert.match(d.notifications[0].detail, /^HTTP 401: .*Unauthorized: REDACTED is revoked \(token REDACTED, REDACTED\).* \(after 1 attempt\(s\)\)$/);
      assert.equal(rx.requests.length, 1, 'a 401 is final');
      assert.equal(JSON.parse(rx.requests[0].body).chat_id, '@release_channel');
      await waitForOutput(w, /telegram notification to 127\.0\.0\.1:\d+ not sent: HTTP 401/);
      const admin = await adminPort(w);
      const page = (await httpRequest(admin, '/deliveries')).body + (await httpRequest(admin, '/deliveries.json')).body;
      const dir = makeTempDir('notify-telegram-');
      fs.writeFileSync(path.join(dir, 'hooks.json'), JSON.stringify([upgradeHook('tg', TOKEN, env)]));
      const validated = spawnSync(defaultBinary(), ['-validate', '-hooks', path.join(dir, 'hooks.json')], { encoding: 'utf8', env: { PATH: process.env.PATH } });
      assert.equal(validated.status, 0, validated.stderr);
      assert.match(validated.stdout, /^ +notify: telegram 127\.0\.0\.1:\d+ \(chat @release_channel\)$/m);
      for (const [where, text] of [['log', w.output()], ['page', page], ['answer', res.body], ['-validate', validated.stdout + validated.stderr]])
        for (const secret of [BOT_TOKEN, '4839574812', 'AAFq-telegram-token_x9', encodeURIComponent(BOT_TOKEN)])
          assert.ok(!text.includes(secret), `the ${where} shows ${secret}`);
    } finally {
      await rx.close();
    }
  });

  test('what a telegram receiver needs: NOTIFY_TELEGRAM_CHAT (an id or @channel, checked at load) and a /bot<token>/sendMessage URL', async () => {
    const dir = makeTempDir('notify-telegram-bad-');
    const file = path.join(dir, 'hooks.json');
    fs.writeFileSync(file, JSON.stringify([chatHook('x', { NOTIFY_URL: `https://api.telegram.org${TELEGRAM_PATH}`, NOTIFY_FORMAT: 'telegram', NOTIFY_TELEGRAM_CHAT: 'ops room' })]));
    const s = await spawnWebhook({ hooks: file });
    assert.notEqual((await s.exited).code, 0);
    assert.match(s.output(), /pass-environment-to-command\[6\]\.name: NOTIFY_TELEGRAM_CHAT "ops" is not a chat id \(an integer\) or a @channelusername/);
    const cases: [Record<string, string>, string][] = [
      [{ NOTIFY_URL: `https://api.telegram.org${TELEGRAM_PATH}`, NOTIFY_FORMAT: 'telegram' }, 'NOTIFY_FORMAT telegram (URL 1) needs NOTIFY_TELEGRAM_CHAT: the chat to post in'],
      [{ NOTIFY_URL: `https://api.telegram.org/bot${BOT_TOKEN}/getMe`, NOTIFY_FORMAT: 'telegram', NOTIFY_TELEGRAM_CHAT: '-100' }, 'NOTIFY_URL item 1 (telegram) is not a Bot API URL: https://<host>/bot<token>/sendMessage'],
      [{ NOTIFY_URL: 'https://hooks.slack.com/services/x', NOTIFY_FORMAT: 'slack', NOTIFY_TELEGRAM_CHAT: '-100' }, 'NOTIFY_TELEGRAM_CHAT is set, but no NOTIFY_URL is telegram'],
      [{ NOTIFY_URL: `https://a.example${TELEGRAM_PATH} https://b.example${TELEGRAM_PATH}`, NOTIFY_FORMAT: 'telegram', NOTIFY_TELEGRAM_CHAT: '-1 -2 -3' }, 'NOTIFY_TELEGRAM_CHAT has 3 values for 2 URLs: give one, or one per URL'],
      [{ NOTIFY_URL: 'https://x.example/workflows/1', NOTIFY_FORMAT: 'teams', NOTIFY_SECRET: 'sig-secret' }, 'NOTIFY_SECRET is set, but teams (URL 1) does not sign its requests'],
      // A chat URL carries its key: never in clear, but to this machine.
      [{ NOTIFY_URL: `http://api.telegram.org${TELEGRAM_PATH}`, NOTIFY_FORMAT: 'telegram', NOTIFY_TELEGRAM_CHAT: '-100' }, 'NOTIFY_URL item 1 (telegram) is http://: its key would go in clear; use https:// (http:// only for a loopback host)'],
      [{ NOTIFY_URL: 'https://x.example/j http://hooks.slack.example/services/T/B/key', NOTIFY_FORMAT: 'json,slack' }, 'NOTIFY_URL item 2 (slack) is http://: its key would go in clear; use https:// (http:// only for a loopback host)'],
      [{ NOTIFY_URL: `https://a.example${TELEGRAM_PATH},https://discord.com/api/webhooks/1/t`, NOTIFY_FORMAT: 'telegram,discord', NOTIFY_TELEGRAM_CHAT: '@ops_channel' }, ''],
    ];
    fs.writeFileSync(file, JSON.stringify(cases.map(([env], i) => upgradeHook(`h${i}`, TOKEN, env))));
    const r = spawnSync(defaultBinary(), ['-validate', '-hooks', file], { encoding: 'utf8', env: { PATH: process.env.PATH } });
    assert.equal(r.status, 0, r.stderr);
    for (const [, message] of cases.slice(0, -1)) assert.ok(r.stdout.includes(`notify: none will be sent: ${message}`), `${message}\n${r.stdout}`);
    assert.match(r.stdout, /^ +notify: telegram a\.example \(chat @ops_channel\), discord discord\.com$/m);
    assert.ok(!r.stdout.includes(BOT_TOKEN), r.stdout);
  });
});
