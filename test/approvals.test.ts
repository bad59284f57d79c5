/*
 * Approvals and change windows through the built executable, on the real test cluster: a push that needs an
 * approval answers 202 and changes nothing but its pending entry (webhook/pending); its notifications carry the
 * links in each chat's documented shape (DingTalk ActionCard, Feishu card buttons, WeCom template card, Slack
 * buttons, JSON approveUrl/rejectUrl) and in the mail; chromium opens the approve link, the form decides, the
 * workload changes and the result is told; Teams, Discord, Google Chat, Telegram and Lark carry the three links
 * (Approve, Deploy now, Reject) in the shape test/chat-shapes.ts checks, chromium approves from Teams' card and
 * deploys now from Telegram's keyboard, and a push the image pin refuses is told in each; a reject, a used, expired or tampered link, a GET alone; a newer push
 * replacing a waiting one; the replica that recorded a push killed and another approving it; a replica that starts
 * later expiring what another left; change windows that open a few seconds after the push, and far from UTC; the
 * deliveries page's waiting rows and "Deploy again" in chromium; a decided link used again answered 410 without
 * an API request (the metrics count them); "Deploy again" of a hook that requires approvals waiting for one.
 * Screenshots are kept in test-artifacts/ (git-ignored); with UPDATE_DOCS_SCREENSHOTS=1 they also replace the ones
 * docs/approvals.md shows.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { approvalToken, sealPendingEntry } from '../webhook.ts';
import { browserOrSkip, type Browser } from './browser.ts';
import { type Button, CHAT_SHAPES, formatOf, NEW_FORMATS, vendorAnswer } from './chat-shapes.ts';
import { acrImage, acrPayload, clusterOrSkip, containerImage, deployment, freshNamespaceName, kubectlFor, namespacedGetter, removeNamespace } from './cluster/kube.ts';
import {
  adminPort, httpRequest, makeTempDir, spawnWebhook, waitFor, waitForOutput, type Webhook, webhookPool,
} from './harness.ts';
import { readMail, serviceMailEnv, startMta, type Mta } from './mta.ts';
import { startReceiver, type Receiver } from './receiver.ts';
import { fixedSettings, upgradeHook } from './upgrade-hooks.ts';

const REPO = path.join(import.meta.dirname, '..');
const TOKEN = 'approvals-token-4c1e7b93a2';
const KEY = 'approval-key-6f0d2a9c4b7e1f3a8d5c2b9e0a7f4c1d';
const PUBLIC_URL = 'https://webhook.example.test';
const FORMATS = ['json', 'dingtalk', 'wecom', 'feishu', 'slack'];
// The other chats go to a hook of their own: a hook posts to at most 5 URLs.
const CHAT_FORMATS = NEW_FORMATS;

/** A screenshot for test-artifacts/, and for docs/ when asked to refresh the documentation's. */
function keepScreenshot(name: string, png: Buffer): void {
  const artifacts = path.join(REPO, 'test-artifacts');
  fs.mkdirSync(artifacts, { recursive: true });
  fs.writeFileSync(path.join(artifacts, name), png);
  if (process.env.UPDATE_DOCS_SCREENSHOTS === '1') fs.writeFileSync(path.join(REPO, 'docs', name), png);
}

const { start: started, stopAll: stopStarted } = webhookPool();

function keyFile(content = KEY): string {
  const file = path.join(makeTempDir('approval-key-'), 'key');
  fs.writeFileSync(file, `${content}\n`);
  return file;
}

describe('flags, loading and -validate', () => {
  test('-public-url and -approval-key-file go together, a short key or a bad URL is refused; usage lists them', async () => {
    const hooks = [upgradeHook('deploy', TOKEN)];
    for (const [args, message] of [
      [['-public-url', PUBLIC_URL], 'give -public-url and -approval-key-file together: approval links need both'],
      [['-public-url', 'ftp://x', '-approval-key-file', keyFile()], 'invalid value "ftp://x" for flag -public-url: give the http(s) address'],
      [['-public-url', `${PUBLIC_URL}?a=1`, '-approval-key-file', keyFile()], `invalid value "${PUBLIC_URL}?a=1" for flag -public-url`],
      [['-public-url', PUBLIC_URL, '-approval-key-file', keyFile('short-key')], 'the key is 9 bytes; use at least 32 (openssl rand -hex 32)'],
      [['-public-url', PUBLIC_URL, '-approval-key-file', keyFile('<approval-key>')], 'the file still holds a placeholder'],
    ] as const) {
      const s = await spawnWebhook({ hooks, args: [...args] });
      assert.equal((await s.exited).code, 2, s.output());
      assert.ok(s.stderr().includes(message), s.stderr());
      assert.ok(!s.stderr().includes('short-key'), 'the key is never shown');
      assert.match(s.stderr(), /-public-url string\n\s+the address people reach this service at/);
      assert.match(s.stderr(), /-approval-key-file string\n\s+file holding the key that signs approval links/);
    }
  });

  test('a hook that requires approvals does not start without links, saying how', async () => {
    const s = await spawnWebhook({ hooks: [upgradeHook('deploy', TOKEN, { REQUIRE_APPROVAL: 'true' })] });
    assert.equal((await s.exited).code, 1, s.output());
    assert.match(s.output(), /hook "deploy" sets REQUIRE_APPROVAL=true, but approval links cannot be made: start the service with -public-url URL \(the address people reach it at\) and -approval-key-file FILE/);
  });

  test('a malformed window or approval setting is a load error naming file, line and field', async () => {
    const dir = makeTempDir('approvals-load-');
    const file = path.join(dir, 'hooks.json');
    const hook = upgradeHook('deploy', TOKEN, { DEPLOY_WINDOW: 'Mon-Fri 09:00-18:00 Mars/Olympus' });
    fs.writeFileSync(file, JSON.stringify([hook], null, 2));
    const line = fs.readFileSync(file, 'utf8').split('\n').findIndex((l) => l.includes('Mars/Olympus')) + 1;
    const s = await spawnWebhook({ hooks: file });
    assert.equal((await s.exited).code, 1, s.output());
    assert.ok(s.output().includes(`${file}:${line}`), s.output());
    assert.match(s.output(), /pass-environment-to-command\[\d\]\.name: DEPLOY_WINDOW "Mon-Fri 09:00-18:00 Mars\/Olympus": range 1 "Mon-Fri 09:00-18:00 Mars\/Olympus": "Mars\/Olympus" is not an IANA time zone/);
    const window = Array(17).fill('Sat 09:00-10:00 UTC').join(';');
    fs.writeFileSync(file, JSON.stringify([upgradeHook('deploy', TOKEN, { DEPLOY_WINDOW: window })], null, 2));
    const wide = await spawnWebhook({ hooks: file });
    assert.equal((await wide.exited).code, 1, wide.output());
    assert.match(wide.output(), /DEPLOY_WINDOW "Sat 09:00-10:00 UTC;[^"]*"… \(339 characters\): more than 16 ranges \(17\)/);
    fs.writeFileSync(file, JSON.stringify([{ ...hook, 'pass-environment-to-command': [
      { envname: 'REQUIRE_APPROVAL', source: 'url', name: 'approve' }] }], null, 2));
    const fromUrl = await spawnWebhook({ hooks: file });
    assert.equal((await fromUrl.exited).code, 1);
    assert.match(fromUrl.output(), /REQUIRE_APPROVAL must be fixed in the hook file \("source": "string"\)/);
  });
});

const cluster = await clusterOrSkip();
const browser: Browser | undefined = cluster ? await browserOrSkip() : undefined;

/**
 * The annotation of an approval-required push another replica left for `hook` on deployment/<name> in `ns` (sealed
 * with the key where it sits, as a replica writes it), expired an hour after it came.
 */
function expiredEntry(ns: string, name: string, id: string, hook: string, image: string): string {
  const hourAgo = new Date(Date.now() - 3_600_000).toISOString();
  const entry = {
    id, hook, request: `${id}-request`, image, push: 'sha256:x|t', pushedAt: hourAgo, timeFrom: 'payload' as const, receivedAt: hourAgo,
    waitsFor: 'approval' as const, until: new Date(Date.now() - 1000).toISOString(), decides: 'whoever opens its links',
  };
  const place = { cluster: undefined, namespace: ns, kind: 'deployment', name, container: 'app' };
  return `webhook/pending=${JSON.stringify({ app: sealPendingEntry(Buffer.from(KEY), place, entry) })}`;
}

/** A daily change window (UTC) that opens `ms` from now, on the minute, for half an hour: closed until then. */
function windowOpeningIn(ms: number): string {
  const opens = new Date(Math.ceil((Date.now() + ms) / 60_000) * 60_000);
  return `daily ${opens.toISOString().slice(11, 16)}-${new Date(opens.getTime() + 1_800_000).toISOString().slice(11, 16)} UTC`;
}

/** The token of a link made for -public-url, to be opened on a replica's own port. */
const linkPath = (link: string) => {
  assert.ok(link.startsWith(`${PUBLIC_URL}/approval/`), link);
  return link.slice(PUBLIC_URL.length);
};

describe('approvals and windows on the real cluster', () => {
  const skip = !cluster ? 'no cluster' : false;
  const ns = freshNamespaceName('approvals');
  let kubectl: ReturnType<typeof kubectlFor>;
  let get: (what: string) => Promise<any>;
  let rx: Receiver;
  let mta: Mta;
  let a: Webhook;
  let b: Webhook;
  let hooksFile: string;
  let key: string;
  const args = () => ['-public-url', PUBLIC_URL, '-approval-key-file', key, '-rollout-follow', '0s'];
  const push = (w: Webhook, hook: string, workload: string, tag: string) => {
    const q = new URLSearchParams({ token: TOKEN, ns, workload: `deployment/${workload}`, container: 'app', repo_type: 'regionalregistry' });
    return w.request(`/hooks/${hook}?${q}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag) });
  };
  const image = async (name: string) => containerImage(await get(`deployment/${name}`), 'app');
  const pending = async (name: string) => {
    const raw = (await get(`deployment/${name}`)).metadata.annotations?.['webhook/pending'];
    return raw ? JSON.parse(raw) : {};
  };
  /** The JSON result posted for a request (or any result whose decision is given). */
  const posted = (match: (d: any) => boolean, what: string) => waitFor(
    () => rx.requests.filter((r) => r.url.startsWith('/json')).map((r) => JSON.parse(r.body)).find(match),
    { timeoutMs: 60_000, what },
  );

  before(async () => {
    if (skip) return;
    kubectl = kubectlFor(cluster!);
    get = namespacedGetter(kubectl, ns);
    await kubectl(['create', 'namespace', ns]);
    const names = ['web', 'other', 'kill', 'win', 'far', 'page', 'left', 'late', 'wide', 'chats'];
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items:
      names.map((n) => deployment(n, [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })) }));
    [rx, mta] = await Promise.all([startReceiver(), startMta()]);
    // The newer chats' receivers check each message as their vendors do, and answer as they do.
    rx.answerFor = (r) => vendorAnswer(r);
    key = keyFile();
    const notify = {
      NOTIFY_URL: FORMATS.map((f) => `${rx.base}/${f}`).join(' '),
      NOTIFY_FORMAT: FORMATS.join(','),
      MAIL_TO: 'ops@example.com',
    };
    hooksFile = path.join(makeTempDir('approvals-hooks-'), 'hooks.json');
    fs.writeFileSync(hooksFile, JSON.stringify([
      upgradeHook('deploy', TOKEN, { REQUIRE_APPROVAL: 'true', ...notify }),
      upgradeHook('plain', TOKEN, { NOTIFY_URL: `${rx.base}/json` }),
      // Approval, a window closed for two hours, and "Deploy now": a waiting push's three links.
      upgradeHook('chats', TOKEN, {
        NOTIFY_URL: CHAT_FORMATS.map((f) => `${rx.base}/chats${CHAT_SHAPES[f].path}`).join(' '),
        NOTIFY_FORMAT: CHAT_FORMATS.join(','), NOTIFY_TELEGRAM_CHAT: '-1001234567890',
        REQUIRE_APPROVAL: 'true', APPROVAL_OVERRIDE: 'true', DEPLOY_WINDOW: windowOpeningIn(2 * 3_600_000),
      }),
      // Reaches one workload: a replica that starts finds what waits there.
      { ...upgradeHook('fixed', TOKEN), 'pass-environment-to-command': fixedSettings({
        APP_NS: ns, APP_WORKLOAD: 'deployment/left', APP_CONTAINER: 'app', REQUIRE_APPROVAL: 'true', NOTIFY_URL: `${rx.base}/json` }) },
    ]));
    const env = { KUBECONFIG: cluster!.kubeconfigPath, NOTIFY_CACERT: Buffer.from(rx.certPem).toString('base64'), ...serviceMailEnv(mta) };
    [a, b] = await Promise.all([0, 1].map(() => started({ hooks: hooksFile, args: args(), env })));
  });
  after(async () => {
    await stopStarted();
    await browser?.close();
    await rx?.close();
    await mta?.stop();
    if (!skip) await removeNamespace(kubectl, ns);
  });

  let first: { approve: string; reject: string; request: string };

  // A push made first that waits for a window opening within a minute; the tests in between run while it waits, and
  // the last test here waits for its opening.
  let win: { w: Webhook; opens: number; window: string } | undefined;

  test('a window that opens within a minute of the push: it waits (the last test here sees it apply)', { skip }, async () => {
    // The next minute at least 8 s away: windows are given in minutes.
    let opens = Math.ceil(Date.now() / 60_000) * 60_000;
    if (opens - Date.now() < 8_000) opens += 60_000;
    const hhmm = (ms: number) => new Date(ms).toISOString().slice(11, 16);
    const window = `daily ${hhmm(opens)}-${hhmm(opens + 10 * 60_000)} UTC`;
    const file = path.join(makeTempDir('approvals-window-'), 'hooks.json');
    // Its results to a path of their own: the tests in between count what comes to /json.
    fs.writeFileSync(file, JSON.stringify([upgradeHook('win', TOKEN, { DEPLOY_WINDOW: window, NOTIFY_URL: `${rx.base}/window` })]));
    const env = { KUBECONFIG: cluster!.kubeconfigPath, NOTIFY_CACERT: Buffer.from(rx.certPem).toString('base64') };
    const w = await started({ hooks: file, args: args(), env });
    const res = await push(w, 'win', 'win', 'v7');
    assert.equal(res.status, 202, res.body);
    assert.ok(res.body.includes(`action:`) && res.body.includes(`waiting for the change window ${window}, opens ${new Date(opens).toISOString()}`), res.body);
    assert.equal(await image('win'), acrImage('v1'));
    win = { w, opens, window };
  });

  test('an approval-required push answers 202, changes nothing but its pending entry, and every message carries the links', { skip }, async () => {
    const res = await push(a, 'deploy', 'web', 'v2');
    assert.equal(res.status, 202, res.body);
    assert.match(res.body, /action: +waiting for approval until \d{4}-\d\d-\d\dT[\d:.]+Z\n/);
    assert.equal(await image('web'), acrImage('v1'));
    const entry = (await pending('web')).app;
    assert.deepEqual([entry.image, entry.waitsFor, entry.hook, entry.request], [acrImage('v2'), 'approval', 'deploy', res.headers['x-request-id']]);
    const request = String(res.headers['x-request-id']);
    const bodies = await waitFor(() => {
      // A chat shows the image with a zero-width space after each "." (no host name is linked): compared without.
      const got = Object.fromEntries(FORMATS.map((f) => [f, rx.requests.find((r) => r.url === `/${f}` &&
        r.body.replaceAll('\u200B', '').includes(entry.image.split(':')[0]))]));
      return Object.values(got).every(Boolean) ? Object.fromEntries(Object.entries(got).map(([f, r]) => [f, JSON.parse(r!.body)])) : undefined;
    }, { timeoutMs: 60_000, what: 'the five notifications' });
    const json = bodies.json;
    assert.deepEqual([json.decision, json.request_id, json.waiting.for], ['waiting', request, 'approval']);
    const { approveUrl, rejectUrl } = json;
    linkPath(approveUrl);
    linkPath(rejectUrl);
    assert.notEqual(approveUrl, rejectUrl);
    // DingTalk: an ActionCard with independent buttons (title, actionURL).
    assert.equal(bodies.dingtalk.msgtype, 'actionCard');
    assert.deepEqual(bodies.dingtalk.actionCard.btns, [{ title: 'Approve', actionURL: approveUrl }, { title: 'Reject', actionURL: rejectUrl }]);
    assert.equal(bodies.dingtalk.actionCard.btnOrientation, '1');
    // Feishu: an interactive card whose action element holds buttons that open URLs.
    assert.equal(bodies.feishu.msg_type, 'interactive');
    const action = bodies.feishu.card.elements.find((e: any) => e.tag === 'action');
    assert.deepEqual(action.actions.map((x: any) => [x.tag, x.text.content, x.type, x.url]),
      [['button', 'Approve', 'primary', approveUrl], ['button', 'Reject', 'danger', rejectUrl]]);
    // WeCom: a text_notice template card with URL jumps (type 1) and its required card_action.
    assert.equal(bodies.wecom.msgtype, 'template_card');
    assert.equal(bodies.wecom.template_card.card_type, 'text_notice');
    assert.deepEqual(bodies.wecom.template_card.jump_list, [{ type: 1, title: 'Approve', url: approveUrl }, { type: 1, title: 'Reject', url: rejectUrl }]);
    assert.deepEqual(bodies.wecom.template_card.card_action, { type: 1, url: approveUrl });
    // Slack: an actions block of link buttons.
    const actions = bodies.slack.blocks.find((x: any) => x.type === 'actions');
    assert.deepEqual(actions.elements.map((x: any) => [x.type, x.text.text, x.style, x.url]),
      [['button', 'Approve', 'primary', approveUrl], ['button', 'Reject', 'danger', rejectUrl]]);
    const mail = await waitFor(async () => (await mta.messages()).map(readMail).find((m) => m.body.includes(approveUrl)), { timeoutMs: 60_000, what: 'the mail' });
    assert.ok(mail.body.includes(`reject: ${rejectUrl}`), mail.body);
    // The links are keys: never in a log line.
    assert.ok(!a.output().includes(linkPath(approveUrl).split('/')[2]), 'the approve link is logged');
    assert.ok(!`${a.output()}${b.output()}${JSON.stringify(bodies)}${mail.body}`.includes(KEY), 'the signing key is shown');
    first = { approve: approveUrl, reject: rejectUrl, request };
  });

  test('a GET alone never approves; a tampered, expired or foreign link is refused', { skip }, async () => {
    for (let i = 0; i < 3; i++) {
      const page = await a.request(linkPath(first.approve));
      assert.equal(page.status, 200);
      assert.match(page.body, /<h1>Approve this push\?<\/h1>/);
      assert.match(String(page.headers['content-security-policy']), /form-action 'self'/);
      assert.equal(page.headers['referrer-policy'], 'no-referrer');
      assert.equal((await a.request(linkPath(first.approve), { method: 'HEAD' })).status, 200);
    }
    assert.equal(await image('web'), acrImage('v1'));
    assert.equal((await pending('web')).app.request, first.request);
    const [body, signature] = linkPath(first.approve).slice('/approval/'.length).split('.');
    const claims = JSON.parse(Buffer.from(body, 'base64url').toString());
    const forged = Buffer.from(JSON.stringify({ ...claims, name: 'other' })).toString('base64url');
    const tampered = await a.request(`/approval/${forged}.${signature}`, { method: 'POST', body: 'name=eve', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
    assert.equal(tampered.status, 403);
    assert.match(tampered.body, /not signed by this service/);
    const expired = approvalToken(Buffer.from(KEY), { ...claims, exp: Date.now() - 1000 });
    const late = await a.request(`/approval/${expired}`, { method: 'POST', body: 'name=eve', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
    assert.equal(late.status, 410);
    assert.match(late.body, /the link expired at/);
    const other = approvalToken(Buffer.from(KEY.replace('a', 'b')), claims);
    assert.equal((await a.request(`/approval/${other}`)).status, 403);
    const noName = await a.request(linkPath(first.approve), { method: 'POST', body: 'name=', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
    assert.equal(noName.status, 400);
    assert.match(noName.body, /Give your name/);
    assert.equal(await image('web'), acrImage('v1'));
  });

  test('a link is taken only as it was signed: padding, stray or non-canonical characters get 403 and decide nothing', { skip }, async () => {
    const link = linkPath(first.approve);
    const signature = link.split('.')[1];
    const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
    // 32 bytes in 43 characters: the last one's two low bits are unused, so the next character decodes the same.
    const sameBytes = `${link.slice(0, -1)}${alphabet[alphabet.indexOf(signature.at(-1)!) + 1]}`;
    assert.deepEqual(Buffer.from(sameBytes.split('.')[1], 'base64url'), Buffer.from(signature, 'base64url'));
    for (const variant of [`${link}!!`, `${link}=`, `${link}%21`, `${link}*`, `${link.slice(0, -5)}!${link.slice(-5)}`, sameBytes]) {
      for (const method of ['GET', 'POST']) {
        const res = await a.request(variant, { method, body: method === 'POST' ? 'name=eve' : undefined, headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
        assert.equal(res.status, 403, `${method} ${variant}`);
        assert.match(res.body, /not signed by this service/);
      }
    }
    assert.equal(await image('web'), acrImage('v1'));
    assert.equal((await pending('web')).app.request, first.request);
  });

  test('a name that would forge the attribution, reorder the text or break a line is refused (400), nothing decided', { skip }, async () => {
    const cases: Array<[string, RegExp]> = [
      ['Alice (10.0.0.9, admin token)', /may not hold brackets \(&quot;\(&quot; U\+0028 at character 7\): what follows a name in brackets is the service&#39;s\./],
      ['Alice［admin token］', /may not hold brackets \(&quot;［&quot; U\+FF3B at character 6\)/],
      ['Ali\u202Ece', /may not hold control, line-separator or bidirectional characters \(U\+202E at character 4\)/],
      ['Bob\u2066x\u2069', /bidirectional characters \(U\+2066 at character 4\)/],
      ['Eve\u200F', /bidirectional characters \(U\+200F at character 4\)/],
      ['Line\u2028two', /\(U\+2028 at character 5\)/],
      ['Para\u2029two', /\(U\+2029 at character 5\)/],
      ['Next\u0085line', /\(U\+0085 at character 5\)/],
      ['Tab\tname', /\(U\+0009 at character 4\)/],
    ];
    for (const [name, message] of cases) {
      const res = await a.request(linkPath(first.approve), { method: 'POST', body: new URLSearchParams({ name }).toString(), headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
      assert.equal(res.status, 400, JSON.stringify(name));
      assert.match(res.body, message);
    }
    assert.equal(await image('web'), acrImage('v1'));
    assert.equal((await pending('web')).app.request, first.request);
  });

  test('chromium opens the approve link, the form decides: the workload changes, the result is told; the link works once', { skip: skip || !browser ? 'no cluster or browser' : false }, async () => {
    const page = await browser!.open(`${a.url}${linkPath(first.approve)}`);
    await page.viewport(900, 700);
    keepScreenshot('approval-confirmation.png', await page.screenshot());
    const loads = page.loads();
    await page.evaluate(`document.querySelector('input[name=name]').value = 'Li Lei'; document.querySelector('form button').click()`);
    await waitFor(() => page.loads() > loads, { timeoutMs: 30_000, what: 'the form to be posted' });
    assert.match(await page.evaluate<string>('document.querySelector("h1").textContent'), /^Approved$/);
    await page.close();
    await waitFor(async () => (await image('web')) === acrImage('v2'), { timeoutMs: 30_000, what: 'the approved image' });
    assert.deepEqual(await pending('web'), {});
    const told = await posted((d) => d.decision === 'applied' && d.workload === 'deployment/web', 'the approved result');
    assert.match(told.report, /note: +approved by Li Lei \(127\.0\.0\.1, by link\)/);
    const again = await a.request(linkPath(first.approve), { method: 'POST', body: 'name=again', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
    assert.equal(again.status, 410);
    assert.match(again.body, /the link works once/);
    assert.equal((await b.request(linkPath(first.reject))).status, 410, 'another replica finds nothing either');
  });

  /** The message each of the newer chats was sent for one push (its body parsed), once all five are in. */
  const chatMessages = (match: (text: string) => boolean, what: string) => waitFor(() => {
    const found = CHAT_FORMATS.map((f) => rx.requests.filter((r) => r.url.startsWith('/chats/') && formatOf(r) === f)
      .map((r) => ({ r, body: JSON.parse(r.body) })).find(({ body }) => match(CHAT_SHAPES[f].texts(body).join('\n'))));
    return found.every(Boolean) ? Object.fromEntries(CHAT_FORMATS.map((f, i) => [f, found[i]!])) : undefined;
  }, { timeoutMs: 60_000, what });
  /** Opens a link in chromium and decides it under `name`, as a person does. */
  const decideInChromium = async (link: string, name: string) => {
    const page = await browser!.open(`${a.url}${linkPath(link)}`);
    const loads = page.loads();
    await page.evaluate(`document.querySelector('input[name=name]').value = ${JSON.stringify(name)}; document.querySelector('form button').click()`);
    await waitFor(() => page.loads() > loads, { timeoutMs: 30_000, what: 'the form to be posted' });
    const heading = await page.evaluate<string>('document.querySelector("h1")?.textContent ?? ""');
    await page.close();
    return heading;
  };

  test('teams, discord, googlechat, telegram and lark carry a waiting push\'s three links as documented; chromium approves from Teams\' card, then deploys now from Telegram\'s keyboard', { skip: skip || !browser ? 'no cluster or browser' : false }, async () => {
    const res = await push(a, 'chats', 'chats', 'v13');
    assert.equal(res.status, 202, res.body);
    const waiting = await chatMessages((text) => text.includes(String(res.headers['x-request-id'])), 'the five waiting messages');
    let links: Button[] | undefined;
    for (const f of CHAT_FORMATS) {
      const { r, body } = waiting[f];
      assert.deepEqual(CHAT_SHAPES[f].problems(body, r), [], f);
      const buttons = CHAT_SHAPES[f].buttons(body);
      assert.deepEqual(buttons.map((b) => b.label), ['Approve', 'Deploy now', 'Reject'], f);
      for (const b of buttons) linkPath(b.url);
      links ??= buttons;
      assert.deepEqual(buttons, links, `${f}: the links every other chat carries`);
    }
    // The window is closed: approved from Teams' card, the push waits for it.
    assert.match(await decideInChromium(CHAT_SHAPES.teams.buttons(waiting.teams.body)[0].url, 'Chen Jie'), /Approved/);
    await waitFor(async () => (await pending('chats')).app?.waitsFor === 'window', { timeoutMs: 30_000, what: 'the approved push waiting for its window' });
    assert.equal(await image('chats'), acrImage('v1'));
    const approved = await chatMessages((text) => /\bapproved\b/.test(text) && text.includes('deployment/chats'), 'the five approved messages');
    for (const f of CHAT_FORMATS) assert.deepEqual(CHAT_SHAPES[f].buttons(approved[f].body).map((b) => b.label), ['Deploy now', 'Reject'], f);
    await decideInChromium(CHAT_SHAPES.telegram.buttons(approved.telegram.body)[0].url, 'Chen Jie');
    await waitFor(async () => (await image('chats')) === acrImage('v13'), { timeoutMs: 30_000, what: 'the push deployed now' });
  });

  test('a push the image pin refuses is told in each of the newer chats, in its documented shape, without links', { skip }, async () => {
    const q = new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/chats', container: 'app', repo_type: 'regionalregistry' });
    const res = await a.request(`/hooks/chats?${q}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload('v14', 'other/thing') });
    const refused = await chatMessages((text) => text.includes(String(res.headers['x-request-id'])), 'the five refusals');
    for (const f of CHAT_FORMATS) {
      const { r, body } = refused[f];
      assert.deepEqual(CHAT_SHAPES[f].problems(body, r), [], f);
      assert.match(CHAT_SHAPES[f].texts(body).join('\n'), /refused/, f);
      assert.deepEqual(CHAT_SHAPES[f].buttons(body), [], f);
    }
    assert.equal(refused.discord.body.embeds[0].color, 0xc62828);
    assert.equal(refused.teams.body.attachments[0].content.body[0].color, 'Attention');
    assert.equal(await image('chats'), acrImage('v13'));
  });

  test('a reject leaves the workload and is told; a newer push replaces a waiting one', { skip }, async () => {
    const older = await push(a, 'deploy', 'other', 'v3');
    assert.equal(older.status, 202);
    const olderLinks = await posted((d) => d.request_id === older.headers['x-request-id'], 'the waiting v3');
    const newer = await push(a, 'deploy', 'other', 'v4');
    assert.equal(newer.status, 202);
    assert.match(newer.body, new RegExp(`note: +the waiting push of ${acrImage('v3').replace(/[.]/g, '\\.')} \\(request ${older.headers['x-request-id']}, pushed at [^)]+\\) is superseded`));
    const superseded = await posted((d) => d.request_id === older.headers['x-request-id'] && d.decision !== 'waiting', 'the older push reported');
    assert.match(superseded.detail, new RegExp(`^superseded: a newer push, .*:v4 \\(request ${newer.headers['x-request-id']}\\), replaced it while it waited$`));
    const gone = await a.request(linkPath(olderLinks.approveUrl), { method: 'POST', body: 'name=x', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
    assert.equal(gone.status, 410);
    const newerLinks = await posted((d) => d.request_id === newer.headers['x-request-id'], 'the waiting v4');
    const rejected = await b.request(linkPath(newerLinks.rejectUrl), { method: 'POST', body: 'name=Han+Meimei', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
    assert.equal(rejected.status, 200, rejected.body);
    assert.match(rejected.body, /<h1 class="ok">Rejected<\/h1>/);
    assert.equal(await image('other'), acrImage('v1'));
    assert.deepEqual(await pending('other'), {});
    const told = await posted((d) => d.decision === 'rejected' && d.workload === 'deployment/other', 'the rejection');
    assert.match(told.detail, /rejected by Han Meimei \(127\.0\.0\.1, by link\)/);
  });

  test('an approved push goes through the same checks: a policy set meanwhile skips it, and it no longer waits', { skip }, async () => {
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('policy', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })));
    const res = await push(a, 'deploy', 'policy', 'v12');
    assert.equal(res.status, 202);
    const links = await posted((d) => d.request_id === res.headers['x-request-id'], 'the waiting v12');
    await kubectl(['-n', ns, 'annotate', 'deployment/policy', 'webhook/policy=glob:release-*']);
    const approved = await a.request(linkPath(links.approveUrl), { method: 'POST', body: 'name=Sun', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
    assert.equal(approved.status, 200, approved.body);
    const told = await posted((d) => d.decision === 'skipped by policy' && d.workload === 'deployment/policy', 'the skipped approval');
    assert.match(told.detail, /glob:release-\*/);
    assert.equal(await image('policy'), acrImage('v1'));
    assert.deepEqual(await pending('policy'), {}, 'decided: it waits no more');
  });

  test('the replica that recorded the pending push is killed; another approves it', { skip }, async () => {
    const res = await push(a, 'deploy', 'kill', 'v5');
    assert.equal(res.status, 202);
    const links = await posted((d) => d.request_id === res.headers['x-request-id'], 'the waiting v5');
    a.proc.kill('SIGKILL');
    await a.exited;
    const approved = await b.request(linkPath(links.approveUrl), { method: 'POST', body: 'name=Wang', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
    assert.equal(approved.status, 200, approved.body);
    await waitFor(async () => (await image('kill')) === acrImage('v5'), { timeoutMs: 30_000, what: 'the image approved on b' });
  });

  test('a replica that starts finds what another left on the workloads its hooks reach: an expired push is told', { skip }, async () => {
    await kubectl(['-n', ns, 'annotate', 'deployment/left', expiredEntry(ns, 'left', 'left-1', 'fixed', acrImage('v6'))]);
    const env = { KUBECONFIG: cluster!.kubeconfigPath, NOTIFY_CACERT: Buffer.from(rx.certPem).toString('base64') };
    const c = await started({ hooks: hooksFile, args: args(), env });
    const told = await posted((d) => d.decision === 'expired' && d.workload === 'deployment/left', 'the expired push');
    assert.match(told.detail, /expired: nobody decided by/);
    assert.deepEqual(await pending('left'), {});
    assert.equal(await image('left'), acrImage('v1'));
    await c.stop();
  });

  test('outside a window in a zone far from UTC (Asia/Kathmandu, +05:45) the push waits for its local opening', { skip }, async () => {
    // A window that opens two hours from now, written in Kathmandu's wall clock.
    const opens = Math.ceil((Date.now() + 2 * 3_600_000) / 60_000) * 60_000;
    const local = new Date(opens + (5 * 60 + 45) * 60_000).toISOString().slice(11, 16);
    const end = new Date(opens + (5 * 60 + 45) * 60_000 + 30 * 60_000).toISOString().slice(11, 16);
    const window = `daily ${local}-${end} Asia/Kathmandu`;
    const q = new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/far', container: 'app', repo_type: 'regionalregistry' });
    await kubectl(['-n', ns, 'annotate', 'deployment/far', `webhook/window=${window}`]);
    const res = await b.request(`/hooks/plain?${q}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload('v8') });
    assert.equal(res.status, 202, res.body);
    assert.ok(res.body.includes(`waiting for the change window ${window}, opens ${new Date(opens).toISOString()}`), res.body);
    assert.equal(await image('far'), acrImage('v1'));
    assert.equal((await pending('far')).app.opensAt, new Date(opens).toISOString());
    await kubectl(['-n', ns, 'annotate', 'deployment/far', 'webhook/window=Mon 09:00-10:00 Mars/Olympus', '--overwrite']);
    const bad = await b.request(`/hooks/plain?${q}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload('v9') });
    assert.equal(bad.status, 500);
    assert.match(bad.body, /annotation webhook\/window "Mon 09:00-10:00 Mars\/Olympus": range 1 .*"Mars\/Olympus" is not an IANA time zone/);
  });

  test('a window over 1,024 characters or 16 ranges is refused before it is read: 500 naming the annotation, nothing changed', { skip }, async () => {
    const q = new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/wide', container: 'app', repo_type: 'regionalregistry' });
    const annotate = async (window: string) => {
      // Too long for a command line: the merge patch goes in a file.
      const file = path.join(makeTempDir('approvals-wide-'), 'patch.json');
      fs.writeFileSync(file, JSON.stringify({ metadata: { annotations: { 'webhook/window': window } } }));
      await kubectl(['-n', ns, 'patch', 'deployment/wide', '--type', 'merge', '--patch-file', file]);
    };
    // The issue's window: 5,000 ranges, each a different spelling of one zone (Intl ignores case), 245 KB.
    const zone = 'America/Argentina/ComodRivadavia';
    const spelling = (i: number) => [...zone].map((c, k) => ((i >> (k % 12)) & 1 ? c.toUpperCase() : c.toLowerCase())).join('');
    const huge = Array.from({ length: 5000 }, (_, i) => `Mon 00:00-00:01 ${spelling(i)}`).join(';');
    const many = Array(17).fill('Sat 09:00-10:00 UTC').join(';');
    for (const [window, why] of [[huge, `longer than 1024 characters \\(${huge.length}\\)`], [many, 'more than 16 ranges \\(17\\)']]) {
      await annotate(window);
      const before = await get('deployment/wide');
      const res = await b.request(`/hooks/plain?${q}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload('v2') });
      assert.equal(res.status, 500, res.body);
      assert.match(res.body, new RegExp(`annotation webhook/window "[^"]*"… \\(${window.length} characters\\): ${why}|annotation webhook/window "[^"]*": ${why}`));
      assert.ok(res.body.length < 8 * 1024, `the answer quotes the window cut: ${res.body.length} characters`);
      const after = await get('deployment/wide');
      // All the service writes is in the annotations (its records) and the spec (the image): neither moved. The
      // resourceVersion may, as the Deployment controller writes its status after the test's annotation.
      const written = (d: any) => JSON.stringify([d.metadata.annotations, d.spec]);
      assert.equal(written(after), written(before), 'nothing written');
      assert.equal(await image('wide'), acrImage('v1'));
    }
  });

  test('approvals required after a push hold the next push to the same replica, whose copy of the workload predates them', { skip }, async () => {
    const q = new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/late', container: 'app', repo_type: 'regionalregistry' });
    const push = (tag: string) => b.request(`/hooks/plain?${q}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag) });
    const applied = await push('v2');
    assert.equal(applied.status, 200, applied.body);
    await kubectl(['-n', ns, 'annotate', 'deployment/late', 'webhook/approval=required']);
    const res = await push('v3');
    assert.equal(res.status, 202, res.body);
    assert.match(res.body, /^action: +waiting for approval until /m);
    assert.equal(await image('late'), acrImage('v2'));
  });

  test('approved while the window is closed, a push waits for the window; "Deploy now" (APPROVAL_OVERRIDE) deploys it at once', { skip }, async () => {
    // A window that opens in two hours: closed now.
    const opens = new Date(Math.ceil((Date.now() + 2 * 3_600_000) / 60_000) * 60_000);
    const window = `daily ${opens.toISOString().slice(11, 16)}-${new Date(opens.getTime() + 1_800_000).toISOString().slice(11, 16)} UTC`;
    const file = path.join(makeTempDir('approvals-override-'), 'hooks.json');
    fs.writeFileSync(file, JSON.stringify([upgradeHook('now', TOKEN, {
      REQUIRE_APPROVAL: 'true', DEPLOY_WINDOW: window, APPROVAL_OVERRIDE: 'true', NOTIFY_URL: `${rx.base}/json` })]));
    const env = { KUBECONFIG: cluster!.kubeconfigPath, NOTIFY_CACERT: Buffer.from(rx.certPem).toString('base64') };
    const w = await started({ hooks: file, args: args(), env });
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('now', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })));
    const res = await push(w, 'now', 'now', 'v11');
    assert.equal(res.status, 202, res.body);
    assert.match(res.body, new RegExp(`waiting for approval until [^,]+, then for the change window ${window}, opens ${opens.toISOString()}`));
    const waiting = await posted((d) => d.request_id === res.headers['x-request-id'], 'the waiting push');
    assert.ok(waiting.approveUrl && waiting.rejectUrl && waiting.deployNowUrl, JSON.stringify(waiting));
    const form = { method: 'POST', body: 'name=Zhao', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } };
    const approved = await w.request(linkPath(waiting.approveUrl), form);
    assert.equal(approved.status, 200, approved.body);
    assert.equal(await image('now'), acrImage('v1'), 'approved, but the window is closed');
    const entry = (await pending('now')).app;
    assert.deepEqual([entry.waitsFor, entry.approvedBy], ['window', 'Zhao (127.0.0.1, by link)']);
    const told = await posted((d) => d.decision === 'approved' && d.workload === 'deployment/now', 'the approval told');
    assert.equal((await w.request(linkPath(waiting.deployNowUrl), form)).status, 410, 'the first links were used up');
    const now = await w.request(linkPath(told.deployNowUrl), form);
    assert.equal(now.status, 200, now.body);
    await waitFor(async () => (await image('now')) === acrImage('v11'), { timeoutMs: 30_000, what: 'the push deployed now' });
  });

  test('the deliveries page lists waiting pushes with Approve and Reject; "Deploy again" replays a past push; refused without the admin token', { skip: skip || !browser ? 'no cluster or browser' : false }, async () => {
    const res = await push(b, 'deploy', 'page', 'v10');
    assert.equal(res.status, 202);
    const admin = await adminPort(b);
    const page = await browser!.open(`http://127.0.0.1:${admin}/deliveries`);
    await page.viewport(1400, 900);
    await waitFor(async () => (await page.evaluate<number>(`document.querySelectorAll('table.waiting tbody tr').length`)) > 0
      || (await page.goto(`http://127.0.0.1:${admin}/deliveries`), false), { timeoutMs: 30_000, what: 'the waiting row' });
    keepScreenshot('approval-waiting.png', await page.screenshot());
    const row = `[...document.querySelectorAll('table.waiting tbody tr')].find((r) => r.textContent.includes('deployment/page'))`;
    const buttons = await page.evaluate<string[]>(`[...${row}.querySelectorAll('button')].map((b) => b.textContent)`);
    assert.deepEqual(buttons, ['Approve', 'Reject']);
    // The push waiting for its window only (deployment/far) may be rejected, not approved.
    const far = `[...document.querySelectorAll('table.waiting tbody tr')].find((r) => r.textContent.includes('deployment/far'))`;
    const farButtons = await page.evaluate<string[] | null>(`(${far}) ? [...${far}.querySelectorAll('button')].map((b) => b.textContent) : null`);
    if (farButtons) assert.deepEqual(farButtons, ['Reject']);
    let loads = page.loads();
    await page.evaluate(`${row}.querySelector('input[name=name]').value = 'Ops Zhang'; ${row}.querySelector('button[value=approve]').click()`);
    await waitFor(() => page.loads() > loads, { timeoutMs: 30_000, what: 'the approval to be posted' });
    assert.equal(await page.evaluate<string>('document.querySelector("h1")?.textContent ?? document.body.innerText'), 'Approved');
    await waitFor(async () => (await image('page')) === acrImage('v10'), { timeoutMs: 30_000, what: 'the approved image' });
    // Deploy again: set the image back by hand, then replay the approved push from the page.
    await kubectl(['-n', ns, 'set', 'image', 'deployment/page', `app=${acrImage('v1')}`]);
    await page.goto(`http://127.0.0.1:${admin}/deliveries`);
    const replayable = await waitFor(() => page.evaluate<number>(`document.querySelectorAll('form[action="deliveries/replay"]').length`), { what: 'a Deploy again button' });
    assert.ok(replayable > 0);
    loads = page.loads();
    await page.evaluate(`(() => { const f = [...document.querySelectorAll('form[action="deliveries/replay"]')]
      .find((f) => f.closest('tr').textContent.includes('deployment/page')); f.querySelector('input[name=name]').value = 'Ops Zhang'; f.querySelector('button').click(); })()`);
    await waitFor(() => page.loads() > loads, { timeoutMs: 30_000, what: 'the replay to be posted' });
    const replayed = await page.evaluate<string>('document.querySelector("pre").textContent');
    await page.close();
    // The replay goes through a push's checks: the hold (ON_OUTSIDE_CHANGE=hold), then the approval it waits for.
    assert.match(replayed, /action: +(waiting for approval until|none \(held)/);
    if (/action: +waiting/.test(replayed)) assert.match(replayed, /note: +asked to deploy again by Ops Zhang \(127\.0\.0\.1, admin token\)/);
    // Without the admin token a replica that asks for one refuses the form.
    const guarded = await started({ hooks: hooksFile, args: [...args(), '-admin-token', 'admin-token-81f2c9'], env: { KUBECONFIG: cluster!.kubeconfigPath } });
    const guardedAdmin = await adminPort(guarded);
    const refused = await httpRequest(guardedAdmin, '/deliveries/replay', { method: 'POST', body: 'seq=1&name=x', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
    assert.equal(refused.status, 401);
    const elsewhere = await httpRequest(guardedAdmin, '/deliveries/decide', { method: 'POST', body: 'name=x', headers: {
      'Content-Type': 'application/x-www-form-urlencoded', Authorization: 'Bearer admin-token-81f2c9', Origin: 'https://evil.example' } });
    assert.equal(elsewhere.status, 403);
  });

  test('the push the window held is applied once the window opens, and told', { skip }, async () => {
    assert.ok(win, 'the push waiting for its window (the first test here)');
    await waitFor(async () => (await image('win')) === acrImage('v7'), { timeoutMs: 90_000, what: 'the window to open and the push to apply' });
    assert.ok(Date.now() >= win.opens, 'applied before the window opened');
    const told = await waitFor(() => rx.requests.filter((r) => r.url === '/window').map((r) => JSON.parse(r.body))
      .find((d) => d.decision === 'applied'), { timeoutMs: 60_000, what: 'the applied push' });
    assert.match(told.report, /note: +applied by the change window daily/);
  });
});

describe('pending entries are used only as this service wrote them', () => {
  const skip = !cluster ? 'no cluster' : false;
  const ns = freshNamespaceName('approvals-forged');
  const form = { method: 'POST', body: 'name=Qian', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } };
  const evil = 'evil.example.net/x/backdoor:1';
  let kubectl: ReturnType<typeof kubectlFor>;
  let get: (what: string) => Promise<any>;
  let rx: Receiver;
  let w: Webhook;
  let env: Record<string, string>;
  const fixed = (id: string, settings: Record<string, string>) => ({ ...upgradeHook(id, TOKEN),
    'pass-environment-to-command': fixedSettings({ APP_NS: ns, NOTIFY_URL: `${rx.base}/json`, ...settings }) });
  const hooks = () => [
    // The hook of deployment/api, whose pin lets it deploy evil.example.net/x/*.
    fixed('api', { APP_WORKLOAD: 'deployment/api', APP_CONTAINER: 'app', ALLOW_IMAGES: 'evil.example.net/x/*' }),
    // deployment/victim's own hook: the service reads that workload's pending entries.
    fixed('victim', { APP_WORKLOAD: 'deployment/victim' }),
    fixed('gate', { APP_WORKLOAD: 'deployment/gate', REQUIRE_APPROVAL: 'true', DEPLOY_WINDOW: 'daily 00:00-24:00 UTC' }),
    // No NOTIFY_URL, MAIL_TO of its own: its pushes notify nobody, approved or not.
    upgradeHook('quiet', TOKEN, { REQUIRE_APPROVAL: 'true' }),
  ];
  const place = (name: string, container: string) => ({ cluster: undefined, namespace: ns, kind: 'deployment', name, container });
  /** An entry as a replica writes one, waiting for the window that opened a minute ago. */
  const windowEntry = (id: string, hook: string, image: string) => {
    const ago = new Date(Date.now() - 60_000).toISOString();
    return { id, hook, request: `${id}-request`, image, push: `sha256:${id}|t`, pushedAt: ago, timeFrom: 'received' as const,
      receivedAt: ago, waitsFor: 'window' as const, window: 'daily 00:00-24:00 UTC', opensAt: ago,
      until: new Date(Date.now() + 3_600_000).toISOString(), decides: 'the change window' };
  };
  const annotate = (name: string, entries: object) =>
    kubectl(['-n', ns, 'annotate', '--overwrite', `deployment/${name}`, `webhook/pending=${JSON.stringify(entries)}`]);
  const pending = async (name: string) => JSON.parse((await get(`deployment/${name}`)).metadata.annotations?.['webhook/pending'] ?? '{}');
  /** The Warning Events UpgradeRefused on deployment/<name> whose message includes `text`. */
  const refusals = (name: string, text: string) => waitFor(async () => {
    const list = JSON.parse(await kubectl(['-n', ns, 'get', 'events', '--field-selector', `involvedObject.name=${name},reason=UpgradeRefused`, '-o', 'json']));
    const found = (list.items as any[]).filter((e) => e.type === 'Warning' && e.message.includes(text));
    return found.length > 0 ? found : undefined;
  }, { timeoutMs: 60_000, what: `the UpgradeRefused Event on ${name}: ${text}` });
  /** The link a person would get for the entry waiting on deployment/<name>, made with the key. */
  const link = (name: string, entry: any, claims: Record<string, unknown> = {}) => `/approval/${approvalToken(Buffer.from(KEY), {
    namespace: ns, kind: 'deployment', name, container: 'app', id: entry.id, hook: entry.hook, image: entry.image,
    action: 'approve', exp: Date.parse(entry.until), ...claims })}`;
  const quietPush = async (name: string, tag: string) => {
    const q = new URLSearchParams({ token: TOKEN, ns, workload: `deployment/${name}`, container: 'app', repo_type: 'regionalregistry' });
    const res = await w.request(`/hooks/quiet?${q}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag) });
    assert.equal(res.status, 202, res.body);
    return (await pending(name)).app;
  };

  before(async () => {
    if (skip) return;
    kubectl = kubectlFor(cluster!);
    get = namespacedGetter(kubectl, ns);
    await kubectl(['create', 'namespace', ns]);
    const two = [{ name: 'app', image: acrImage('v1') }, { name: 'sidecar', image: acrImage('v1') }];
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
      ...['api', 'gate', 'edited', 'bound', 'told'].map((n) => deployment(n, [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })),
      deployment('victim', two, { replicas: 1 })] }));
    rx = await startReceiver();
    const file = path.join(makeTempDir('approvals-forged-'), 'hooks.json');
    fs.writeFileSync(file, JSON.stringify(hooks()));
    // The service's own NOTIFY_URL is never a push's, approved or not (docs/notifications.md).
    env = { KUBECONFIG: cluster!.kubeconfigPath, NOTIFY_CACERT: Buffer.from(rx.certPem).toString('base64'), NOTIFY_URL: `${rx.base}/service-env` };
    w = await started({ hooks: file, args: ['-public-url', PUBLIC_URL, '-approval-key-file', keyFile(), '-rollout-follow', '0s', '-deliveries', '50'], env });
  });
  after(async () => {
    await stopStarted();
    await rx?.close();
    if (!skip) await removeNamespace(kubectl, ns);
  });

  test('a forged entry naming another workload\'s hook is dropped with a warning and an Event, sealed or not; nothing is deployed', { skip }, async () => {
    // Unsealed, as an editor writes one (or a version before entries had a MAC): the hook api, its pin, the sidecar.
    await annotate('victim', { sidecar: windowEntry('forged-1', 'api', evil) });
    const [unsealed] = await refusals('victim', 'its MAC does not verify');
    assert.match(unsealed.message, /^container sidecar: the waiting push of "?evil\.example\.net\/x\/backdoor:1"? \(hook "?api"?\) dropped, not deployed: /);
    assert.ok(w.output().includes(`deployment/victim in ${ns}: container sidecar: the waiting push of`), 'the warning is logged');
    await waitFor(async () => Object.keys(await pending('victim')).length === 0, { timeoutMs: 30_000, what: 'the forged entry taken off' });
    // Sealed with the key where it sits, but api upgrades deployment/api only.
    await annotate('victim', { sidecar: sealPendingEntry(Buffer.from(KEY), place('victim', 'sidecar'), windowEntry('forged-2', 'api', evil)) });
    await refusals('victim', 'hook "api" deploys to deployment/api, not deployment/victim');
    // Sealed for the sidecar, copied to the app container: the MAC names where it sits.
    await annotate('api', { app: { ...sealPendingEntry(Buffer.from(KEY), place('api', 'sidecar'), windowEntry('forged-3', 'api', evil)) } });
    await refusals('api', 'its MAC does not verify');
    const victim = await get('deployment/victim');
    assert.deepEqual([containerImage(victim, 'app'), containerImage(victim, 'sidecar')], [acrImage('v1'), acrImage('v1')]);
    assert.equal(containerImage(await get('deployment/api'), 'app'), acrImage('v1'));
  });

  test('a window\'s opening does not clear a needed approval: the push waits for one', { skip }, async () => {
    // An entry that waited for the window alone (sealed, as written before the hook required approvals).
    await annotate('gate', { app: sealPendingEntry(Buffer.from(KEY), place('gate', 'app'), windowEntry('gate-1', 'gate', acrImage('v2'))) });
    const entry = await waitFor(async () => {
      const e = (await pending('gate')).app;
      return e && e.id !== 'gate-1' ? e : undefined;
    }, { timeoutMs: 60_000, what: 'the window decision' });
    assert.deepEqual([entry.waitsFor, entry.image, entry.approvedBy], ['approval', acrImage('v2'), undefined]);
    assert.equal(containerImage(await get('deployment/gate'), 'app'), acrImage('v1'), 'deployed with no approval');
  });

  test('an approval link binds the image and the hook; an entry edited under a live link is not deployed', { skip }, async () => {
    const entry = await quietPush('bound', 'v3');
    assert.ok(entry.mac, 'the entry is sealed');
    for (const other of [{ image: evil }, { hook: 'api' }, { image: undefined, hook: undefined }]) {
      const res = await w.request(link('bound', entry, other), form);
      assert.equal(res.status, 403, `${JSON.stringify(other)}: ${res.body}`);
      assert.match(res.body, /the link was made for another push/);
    }
    assert.equal(containerImage(await get('deployment/bound'), 'app'), acrImage('v1'));
    // The entry's image rewritten by hand (to a tag nobody approved); the link the approver holds names the entry.
    const edited = await quietPush('edited', 'v4');
    await annotate('edited', { app: { ...edited, image: acrImage('v66') } });
    const res = await w.request(link('edited', edited), form);
    assert.equal(res.status, 410, res.body);
    assert.match(res.body, /not used: its MAC does not verify/);
    await refusals('edited', 'its MAC does not verify');
    assert.equal(containerImage(await get('deployment/edited'), 'app'), acrImage('v1'));
    assert.deepEqual(await pending('edited'), {});
  });

  test('an approved push notifies as its hook says, never the service\'s own NOTIFY_URL', { skip }, async () => {
    const entry = await quietPush('told', 'v5');
    const res = await w.request(link('told', entry), form);
    assert.equal(res.status, 200, res.body);
    assert.equal(containerImage(await get('deployment/told'), 'app'), acrImage('v5'));
    const admin = await adminPort(w);
    const delivery = await waitFor(async () => JSON.parse((await httpRequest(admin, '/deliveries.json')).body).deliveries
      .find((d: any) => d.workload === 'deployment/told' && d.decision === 'applied' && d.state === 'done'), { timeoutMs: 30_000, what: 'the approved delivery' });
    assert.deepEqual(delivery.notifications, [], 'no notification channel');
    assert.deepEqual(rx.requests.filter((r) => r.url === '/service-env'), [], 'the service\'s NOTIFY_URL got the result');
  });

  test('an entry gone from the workload is forgotten, not tried again every second', { skip }, async () => {
    // One workload alone: read once at start, then every 30 s (no watch), so what this replica knows gets stale.
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('solo', [{ name: 'app', image: acrImage('v1') }, { name: 'side', image: acrImage('v1') }], { replicas: 1 })));
    const file = path.join(makeTempDir('approvals-solo-'), 'hooks.json');
    fs.writeFileSync(file, JSON.stringify([fixed('solo', { APP_WORKLOAD: 'deployment/solo' })]));
    const opens = (ms: number, id: string, container: string) => sealPendingEntry(Buffer.from(KEY), place('solo', container),
      { ...windowEntry(id, 'solo', acrImage('v6')), opensAt: new Date(Date.now() + ms).toISOString() });
    const side = opens(16_000, 'solo-side', 'side');
    await annotate('solo', { app: opens(10_000, 'solo-app', 'app'), side });
    const solo = await started({ hooks: file, args: ['-public-url', PUBLIC_URL, '-approval-key-file', keyFile(), '-rollout-follow', '0s'], env });
    const admin = await adminPort(solo);
    await waitFor(async () => (await httpRequest(admin, '/deliveries')).body.includes('value="solo-app"'), { timeoutMs: 30_000, what: 'the entry learnt' });
    // Taken off by someone else before its window: this replica still knows it until its next read.
    await annotate('solo', { side });
    await waitForOutput(solo, new RegExp(`\\] deployment/solo in ${ns}: image updated`), 60_000);
    const tries = solo.output().split('\n').filter((l) => l.includes(`deployment/solo in ${ns}: the waiting push was decided already`));
    assert.equal(tries.length, 1, tries.join('\n'));
    await solo.stop();
  });
});

describe('a decided link, and "Deploy again", on a replica of their own', () => {
  const skip = !cluster ? 'no cluster' : false;
  const ns = freshNamespaceName('approvals-again');
  let kubectl: ReturnType<typeof kubectlFor>;
  let get: (what: string) => Promise<any>;
  let rx: Receiver;
  let wh: Webhook;
  const form = (name: string) => ({ method: 'POST', body: `name=${name}`, headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
  const image = async (name: string) => containerImage(await get(`deployment/${name}`), 'app');
  const push = (workload: string, tag: string) => wh.request(`/hooks/deploy?${new URLSearchParams({
    token: TOKEN, ns, workload: `deployment/${workload}`, container: 'app', repo_type: 'regionalregistry' })}`,
  { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag) });
  const posted = (match: (d: any) => boolean, what: string) => waitFor(
    () => rx.requests.map((r) => JSON.parse(r.body)).find(match), { timeoutMs: 60_000, what });
  before(async () => {
    if (skip) return;
    kubectl = kubectlFor(cluster!);
    get = namespacedGetter(kubectl, ns);
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items:
      ['reuse', 'again'].map((n) => deployment(n, [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })) }));
    rx = await startReceiver();
    // Its hooks fix no workload: nothing is read in the background, so every API request is a push's or a link's.
    wh = await started({
      hooks: [upgradeHook('deploy', TOKEN, { REQUIRE_APPROVAL: 'true', NOTIFY_URL: `${rx.base}/json` })],
      args: ['-public-url', PUBLIC_URL, '-approval-key-file', keyFile(), '-rollout-follow', '0s'],
      env: { KUBECONFIG: cluster!.kubeconfigPath, NOTIFY_CACERT: Buffer.from(rx.certPem).toString('base64') },
      metrics: true,
    });
  });
  after(async () => {
    await stopStarted();
    await rx?.close();
    if (!skip) await removeNamespace(kubectl, ns);
  });

  test('a link used again after its decision is answered 410 without a request to the API server', { skip }, async () => {
    const requests = async () => (await wh.metrics()).body.split('\n').filter((l) => l.startsWith('webhook_kubernetes_requests_total{'))
      .reduce((sum, l) => sum + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
    const res = await push('reuse', 'v2');
    assert.equal(res.status, 202, res.body);
    const links = await posted((d) => d.request_id === res.headers['x-request-id'], 'the waiting push');
    const approved = await wh.request(linkPath(links.approveUrl), form('Ops+Qian'));
    assert.equal(approved.status, 200, approved.body);
    await posted((d) => d.decision === 'applied' && d.workload === 'deployment/reuse', 'the approved result');
    // The result is posted before its Event is written (after the answer): the count starts once the Event is there.
    await waitFor(async () => JSON.parse(await kubectl(['-n', ns, 'get', 'events', '--field-selector',
      'involvedObject.name=reuse,reason=ImageUpdated', '-o', 'json'])).items.length > 0, { timeoutMs: 60_000, what: 'the ImageUpdated Event' });
    const before = await requests();
    for (const link of [links.approveUrl, links.rejectUrl, links.approveUrl]) {
      for (const opts of [form('Eve'), {}, form('Eve')]) {
        const again = await wh.request(linkPath(link), opts);
        assert.equal(again.status, 410, again.body);
        assert.match(again.body, /the link works once/);
      }
    }
    const after = await requests();
    console.log(`# API requests: ${before} before nine uses of the decided links, ${after} after`);
    assert.equal(after, before, 'a decided link costs no API request');
    assert.equal(await image('reuse'), acrImage('v2'));
  });

  test('"Deploy again" of a hook that requires approvals waits for one, and is applied once approved', { skip }, async () => {
    const res = await push('again', 'v3');
    const links = await posted((d) => d.request_id === res.headers['x-request-id'], 'the waiting push');
    assert.equal((await wh.request(linkPath(links.approveUrl), form('Ops+Sun'))).status, 200);
    await waitFor(async () => (await image('again')) === acrImage('v3'), { what: 'the approved image' });
    await kubectl(['-n', ns, 'set', 'image', 'deployment/again', `app=${acrImage('v1')}`]);
    const admin = await adminPort(wh);
    const past = await waitFor(async () => JSON.parse((await httpRequest(admin, '/deliveries.json')).body).deliveries
      .find((d: any) => d.decision === 'applied' && d.workload === 'deployment/again' && d.state === 'done'), { what: 'the applied record' });
    const replayed = await httpRequest(admin, '/deliveries/replay', { method: 'POST', body: `seq=${past.seq}&name=Ops+Zhou&action=replay`,
      headers: { 'Content-Type': 'application/x-www-form-urlencoded', Origin: `http://127.0.0.1:${admin}` } });
    assert.equal(replayed.status, 200, replayed.body);
    assert.match(replayed.body, /<h1>Waiting<\/h1>/);
    assert.match(replayed.body, /action: +waiting for approval until /);
    assert.match(replayed.body, /note: +asked to deploy again by Ops Zhou \(127\.0\.0\.1, admin token\)/);
    assert.equal(await image('again'), acrImage('v1'), 'nothing deployed before the approval');
    const entry = JSON.parse((await get('deployment/again')).metadata.annotations['webhook/pending']).app;
    assert.deepEqual([entry.image, entry.waitsFor, entry.approvedBy], [acrImage('v3'), 'approval', undefined]);
    const waiting = await posted((d) => d.request_id === entry.request, 'the replay waiting, with its links');
    const approved = await wh.request(linkPath(waiting.approveUrl), form('Ops+Sun'));
    assert.equal(approved.status, 200, approved.body);
    assert.match(approved.body, /note: +approved by Ops Sun \(127\.0\.0\.1, by link\)/);
    assert.equal(await image('again'), acrImage('v3'));
  });
});

describe('the approvals keep a watch on the workloads their hooks reach', () => {
  const skip = !cluster ? 'no cluster' : false;
  const ns = freshNamespaceName('approvals-watch');
  let kubectl: ReturnType<typeof kubectlFor>;
  let rx: Receiver;
  before(async () => {
    if (skip) return;
    kubectl = kubectlFor(cluster!);
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items:
      ['wx', 'wy'].map((n) => deployment(n, [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })) }));
    rx = await startReceiver();
  });
  after(async () => {
    await stopStarted();
    await rx?.close();
    if (!skip) await removeNamespace(kubectl, ns);
  });

  test('what another replica leaves on them is learnt from the watch: no LIST after the first', { skip }, async () => {
    const fixed = (id: string, workload: string) => ({ ...upgradeHook(id, TOKEN), 'pass-environment-to-command': fixedSettings({
      APP_NS: ns, APP_WORKLOAD: `deployment/${workload}`, APP_CONTAINER: 'app', REQUIRE_APPROVAL: 'true', NOTIFY_URL: `${rx.base}/json` }) });
    const env = { KUBECONFIG: cluster!.kubeconfigPath, NOTIFY_CACERT: Buffer.from(rx.certPem).toString('base64') };
    const args = ['-public-url', PUBLIC_URL, '-approval-key-file', keyFile(), '-rollout-follow', '0s'];
    const wh = await started({ hooks: [fixed('fx', 'wx'), fixed('fy', 'wy')], args, env, metrics: true });
    const requests = async (verb: string) => {
      const line = (await wh.metrics()).body.split('\n').find((l) => l.startsWith(`webhook_kubernetes_requests_total{cluster="",verb="${verb}"} `));
      return Number(line?.slice(line.lastIndexOf(' ') + 1) ?? 0);
    };
    const told = (workload: string) => waitFor(() => rx.requests.map((r) => JSON.parse(r.body))
      .find((d) => d.decision === 'expired' && d.workload === `deployment/${workload}`), { timeoutMs: 60_000, what: `${workload}'s expired push told` });
    await kubectl(['-n', ns, 'annotate', 'deployment/wx', expiredEntry(ns, 'wx', 'wx-1', 'fx', acrImage('v2'))]);
    await told('wx');
    const listed = await requests('list');
    assert.ok(listed >= 1 && (await requests('watch')) >= 1, 'listed once and watching');
    // Learnt from the watch's event, not from a rescan's LIST (which came every 30 s).
    await kubectl(['-n', ns, 'annotate', 'deployment/wy', expiredEntry(ns, 'wy', 'wy-1', 'fy', acrImage('v2'))]);
    await told('wy');
    assert.equal(await requests('list'), listed);
  });
});

describe('the record ledger: an entry put back on its workload after it was decided is stale', () => {
  const skip = !cluster ? 'no cluster' : false;
  const ns = freshNamespaceName('approvals-ledger');
  const form = { method: 'POST', body: 'name=Zhao', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } };
  let kubectl: ReturnType<typeof kubectlFor>;
  let get: (what: string) => Promise<any>;
  let rx: Receiver;
  let run: (() => Promise<Webhook>) | undefined;
  const image = async () => containerImage(await get('deployment/back'), 'app');
  const raw = async () => (await get('deployment/back')).metadata.annotations?.['webhook/pending'];
  const ledger = async () => JSON.parse(await kubectl(['-n', ns, 'get', 'configmap', 'webhook-records', '-o', 'json'])).data ?? {};
  const push = async (w: Webhook, tag: string) => {
    const q = new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/back', container: 'app', repo_type: 'regionalregistry' });
    const res = await w.request(`/hooks/ask?${q}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag) });
    assert.equal(res.status, 202, res.body);
    return waitFor(() => rx.requests.map((r) => JSON.parse(r.body))
      .find((d) => d.request_id === res.headers['x-request-id'] && d.approveUrl), { timeoutMs: 60_000, what: `the waiting ${tag}'s links` });
  };

  before(async () => {
    if (skip) return;
    kubectl = kubectlFor(cluster!);
    get = namespacedGetter(kubectl, ns);
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('back', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })));
    rx = await startReceiver();
    const env = { KUBECONFIG: cluster!.kubeconfigPath, NOTIFY_CACERT: Buffer.from(rx.certPem).toString('base64') };
    const hooks = [upgradeHook('ask', TOKEN, { REQUIRE_APPROVAL: 'true', NOTIFY_URL: `${rx.base}/json` })];
    // The ledger in the test's namespace, as a pod's own namespace holds it (-record-store auto).
    const args = ['-public-url', PUBLIC_URL, '-approval-key-file', keyFile(), '-rollout-follow', '0s', '-record-store', `${ns}/webhook-records`];
    run = () => started({ hooks, args, env });
  });
  after(async () => {
    await stopStarted();
    await rx?.close();
    if (!skip) await removeNamespace(kubectl, ns);
  });

  test('rejected, then put back as it was: after a restart its approve link deploys nothing, with a warning and an Event', { skip }, async () => {
    const a = await run!();
    const links = await push(a, 'v2');
    const entry = await raw();
    assert.equal(Object.keys(await ledger()).length, 1, 'the waiting entry is named in the ledger');
    const rejected = await a.request(linkPath(links.rejectUrl), form);
    assert.equal(rejected.status, 200, rejected.body);
    assert.deepEqual(await ledger(), {}, 'taken off: the ledger names nothing there');
    // A workload editor puts the entry back byte for byte: its MAC verifies where it sits.
    await kubectl(['-n', ns, 'annotate', '--overwrite', 'deployment/back', `webhook/pending=${entry}`]);
    await a.stop();
    const b = await run!();
    const approved = await b.request(linkPath(links.approveUrl), form);
    assert.equal(approved.status, 410, approved.body);
    assert.match(approved.body, /the record ledger [\w.-]+\/webhook-records does not name it live there/);
    const events = await waitFor(async () => {
      const list = JSON.parse(await kubectl(['-n', ns, 'get', 'events', '--field-selector', 'involvedObject.name=back,reason=UpgradeRefused', '-o', 'json']));
      return (list.items as any[]).find((e) => e.type === 'Warning' && e.message.includes('does not name it live'));
    }, { timeoutMs: 60_000, what: 'the Warning Event of the stale entry' });
    assert.match(events.message, /^container app: the waiting push of .*:v2"? \(hook "?ask"?\) dropped, not deployed: /);
    assert.match(b.output(), /deployment\/back in [\w-]+: container app: the waiting push of .* dropped, not deployed: the record ledger/);
    assert.equal(await image(), acrImage('v1'), 'nothing deployed');
    assert.equal(await raw(), '{}', 'the stale entry is taken off');
  });

  test('a live entry survives a restart: another replica approves it, and the ledger lets it go', { skip }, async () => {
    const a = await run!();
    const links = await push(a, 'v3');
    await a.stop();
    const b = await run!();
    const approved = await b.request(linkPath(links.approveUrl), form);
    assert.equal(approved.status, 200, approved.body);
    await waitFor(async () => (await image()) === acrImage('v3'), { timeoutMs: 30_000, what: 'v3 approved on the restarted replica' });
    assert.deepEqual(await ledger(), {}, 'applied: the ledger names nothing there');
  });
});

describe('without -approval-key-file a waiting push is resumed only by the replica that wrote it', () => {
  const skip = !cluster ? 'no cluster' : false;
  const ns = freshNamespaceName('approvals-keyless');
  let kubectl: ReturnType<typeof kubectlFor>;
  let get: (what: string) => Promise<any>;

  before(async () => {
    if (skip) return;
    kubectl = kubectlFor(cluster!);
    get = namespacedGetter(kubectl, ns);
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('nokey', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })));
  });
  after(async () => {
    await stopStarted();
    if (!skip) await removeNamespace(kubectl, ns);
  });

  test('an entry it did not write (another replica\'s, or one written by hand) whose window opened is not deployed, and it says so at start', { skip }, async () => {
    const ago = new Date(Date.now() - 60_000).toISOString();
    // What an editor of the workload can write, and what another replica without a key writes: no MAC.
    const entry = { id: 'nokey-1', hook: 'windowed', request: 'nokey-request', image: acrImage('v7'), push: 'sha256:x|t', pushedAt: ago,
      timeFrom: 'received', receivedAt: ago, waitsFor: 'window', window: 'daily 00:00-24:00 UTC', opensAt: ago,
      until: new Date(Date.now() + 3_600_000).toISOString(), decides: 'the change window' };
    await kubectl(['-n', ns, 'annotate', 'deployment/nokey', `webhook/pending=${JSON.stringify({ app: entry })}`]);
    const hook = { ...upgradeHook('windowed', TOKEN), 'pass-environment-to-command': fixedSettings({
      APP_NS: ns, APP_WORKLOAD: 'deployment/nokey', APP_CONTAINER: 'app', DEPLOY_WINDOW: 'Mon-Fri 09:00-18:00 UTC' }) };
    const w = await started({ hooks: [hook], args: ['-rollout-follow', '0s'], env: { KUBECONFIG: cluster!.kubeconfigPath } });
    await waitForOutput(w, 'hook "windowed": without -approval-key-file a push waiting for its change window (DEPLOY_WINDOW) is written unsealed', 30_000);
    await waitForOutput(w, `deployment/nokey in ${ns}: container app: the waiting push of "${acrImage('v7')}" (hook "windowed") is not resumed here: without a key its entry cannot be told from one written by hand`, 60_000);
    assert.equal(containerImage(await get('deployment/nokey'), 'app'), acrImage('v1'), 'nothing deployed');
    assert.equal(JSON.parse((await get('deployment/nokey')).metadata.annotations['webhook/pending']).app.id, 'nokey-1', 'left to expire');
  });
});
