/*
 * kubeconfig read as kubectl reads it: YAML, a KUBECONFIG list merged by kubectl's rules, contexts
 * and their namespaces, errors that name the file, the context and the field (never a credential),
 * and credentials that change: a tokenFile rewritten, and an exec credential plugin (a small shell
 * script that counts its runs) run once, again only after its expirationTimestamp or a 401. The
 * credential tests run against the real test cluster's API server.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';
import * as net from 'node:net';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import {
  contextCredentials, credentialsFromEnvironment, KubeClient, KubeConfigError, KubeError, loadKubeconfig, readKubeconfig,
} from '../webhook.ts';
import { leaks, makeTempDir, waitFor, webhookPool } from './harness.ts';
import { selfSignedCertificate } from './receiver.ts';
import { acrPayload, clusterOrSkip, freshNamespaceName, kubectlFor, namespaceAdminAccount, removeNamespace } from './cluster/kube.ts';

const cluster = await clusterOrSkip();
const SECRET = `kc-secret-${randomBytes(6).toString('hex')}`;
const dir = makeTempDir('kubeconfig-');
const write = (name: string, text: string) => {
  const file = path.join(dir, name);
  fs.writeFileSync(file, text, { mode: 0o700 });
  return file;
};

/** A YAML kubeconfig as kubectl and Rancher write them: comments, block lists, a context namespace. */
const yamlConfig = (current: string, user: string, token: string, server = 'https://10.0.0.1:6443') => `# written by hand
apiVersion: v1
kind: Config
current-context: ${current}
clusters:
- name: k-${current}
  cluster:
    server: "${server}"
contexts:
- name: ${current}
  context:
    cluster: k-${current}
    user: ${user}
    namespace: ns-${current}
users:
- name: ${user}
  user:
    token: ${token}
`;

/**
 * An exec credential plugin: counts its runs in `<dir>/count`, keeps what it was told
 * (KUBERNETES_EXEC_INFO) in `<dir>/info`, and prints the token on line <run> of `<dir>/tokens`
 * (the last line once past the end), valid until $EXPIRES.
 */
const PLUGIN = `#!/bin/sh
n=$(cat "$PLUGIN_DIR/count" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$PLUGIN_DIR/count"
printf '%s' "$KUBERNETES_EXEC_INFO" > "$PLUGIN_DIR/info"
token=$(sed -n "\${n}p" "$PLUGIN_DIR/tokens"); [ -n "$token" ] || token=$(tail -n 1 "$PLUGIN_DIR/tokens")
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s","expirationTimestamp":"%s"}}' "$token" "$EXPIRES"
`;

/** A kubeconfig whose user runs `command` (relative to the kubeconfig) with these env entries. */
function execConfig(name: string, server: string, ca: string | undefined, command: string, env: Record<string, string>) {
  return write(name, JSON.stringify({
    'current-context': 'p',
    contexts: [{ name: 'p', context: { cluster: 'k', user: 'u' } }],
    clusters: [{ name: 'k', cluster: { server, 'certificate-authority-data': ca } }],
    users: [{ name: 'u', user: { exec: {
      apiVersion: 'client.authentication.k8s.io/v1', command, args: ['--flag'], interactiveMode: 'Never',
      env: Object.entries(env).map(([n, value]) => ({ name: n, value })),
    } } }],
  }));
}

after(() => fs.rmSync(dir, { recursive: true, force: true }));

describe('kubeconfig files', () => {
  test('YAML with a context namespace, read like kubectl', () => {
    const c = loadKubeconfig(write('a.yaml', yamlConfig('a', 'ua', SECRET, 'https://rancher.example.com/k8s/clusters/c-m-x1/')));
    assert.equal(c.server, 'https://rancher.example.com/k8s/clusters/c-m-x1');
    assert.equal(c.namespace, 'ns-a');
    assert.equal(c.token, SECRET);
    assert.match(c.source, /context "a", user "ua"/);
    assert.doesNotMatch(c.source, new RegExp(SECRET));
  });

  test('a KUBECONFIG list merges by kubectl\'s rules: first file wins each entry and the current context', () => {
    const a = write('m1.yaml', yamlConfig('a', 'shared', 'token-from-first'));
    const b = write('m2.yaml', yamlConfig('b', 'shared', 'token-from-second'));
    const env = { KUBECONFIG: [path.join(dir, 'missing.yaml'), a, b, a].join(path.delimiter) };
    const first = credentialsFromEnvironment(env);
    assert.equal(first.namespace, 'ns-a', 'current-context from the first file that sets it');
    const second = credentialsFromEnvironment(env, undefined, 'b');
    assert.equal(second.namespace, 'ns-b', 'a context of the second file, by name');
    assert.equal(second.token, 'token-from-first', 'user "shared" is the first file\'s, whole');
    const merged = readKubeconfig([a, b]);
    assert.deepEqual([...merged.contexts.keys()], ['a', 'b']);
    assert.throws(() => credentialsFromEnvironment({ KUBECONFIG: path.join(dir, 'none.yaml') }), /none of its files exists/);
  });

  test('a missing context is named, with the file and the contexts there are', () => {
    const a = write('ctx.yaml', yamlConfig('a', 'ua', SECRET));
    assert.throws(() => contextCredentials(readKubeconfig([a]), 'prod'), (e: Error) =>
      e instanceof KubeConfigError && e.message.includes(a) && /no entry named "prod" \(the context asked for; contexts: "a"\)/.test(e.message));
    assert.throws(() => credentialsFromEnvironment({}, undefined, 'prod'), /no kubeconfig .* to find the context "prod" in/);
  });

  test('errors name the file, the context and the field, never a credential', () => {
    const bad = (name: string, user: Record<string, unknown>, cluster: Record<string, unknown> = {}) => write(name, JSON.stringify({
      'current-context': 'c', contexts: [{ name: 'c', context: { cluster: 'k', user: 'u' } }],
      clusters: [{ name: 'k', cluster: { server: 'https://10.0.0.1:6443', ...cluster } }], users: [{ name: 'u', user }],
    }));
    const cases: Array<[string, RegExp]> = [
      [bad('basic.json', { username: 'admin', password: SECRET }), /context "c": users\["u"\]\.user\.username: basic authentication is not supported/],
      [bad('socks.json', { token: SECRET }, { 'proxy-url': `socks5://u:${SECRET}@proxy:1080` }), /clusters\["k"\]\.cluster\.proxy-url: not an http:\/\/ or https:\/\/ URL/],
      [bad('both.json', { token: SECRET }, { 'insecure-skip-tls-verify': true, 'certificate-authority-data': 'QQ==' }), /insecure-skip-tls-verify and a certificate-authority together/],
      [bad('v1.json', { exec: { apiVersion: 'client.authentication.k8s.io/v1', command: 'aws' } }), /users\["u"\]\.user\.exec\.interactiveMode: required/],
      [bad('always.json', { exec: { apiVersion: 'client.authentication.k8s.io/v1beta1', command: 'x', interactiveMode: 'Always' } }), /needs a terminal/],
      [write('broken.yaml', `users:\n- name: u\n  user: {token: ${SECRET}\n`), /not a YAML or JSON kubeconfig \(line \d+, column \d+\)/],
      [bad('userinfo.json', { token: 'x' }, { server: `https://admin:${SECRET}@10.0.0.1:6443` }), /clusters\["k"\]\.cluster\.server: a user name or password in the URL \(user:password@host\) is not accepted/],
      [bad('userinfo-http.json', { token: 'x' }, { server: `http://admin:${SECRET}@10.0.0.1` }), /clusters\["k"\]\.cluster\.server: a user name or password in the URL/],
      [bad('user-only.json', { token: 'x' }, { server: `https://${SECRET}@10.0.0.1:6443/path` }), /cluster\.server: a user name or password in the URL/],
    ];
    for (const [file, expected] of cases) {
      assert.throws(() => loadKubeconfig(file), (e: Error) => {
        assert.match(e.message, expected);
        assert.ok(e.message.includes(file), `${e.message} names the file`);
        assert.doesNotMatch(e.message, new RegExp(SECRET));
        return true;
      });
    }
  });

  test('proxy-url: an IPv6 API server is named in brackets in the CONNECT, [::1]:6443, as RFC 9110 writes it', async () => {
    const asked: Array<{ target: string; host: string | undefined }> = [];
    const proxy = http.createServer((_req, res) => res.writeHead(405).end());
    proxy.on('connect', (req: http.IncomingMessage, client: net.Socket) => {
      asked.push({ target: req.url ?? '', host: req.headers.host });
      client.end('HTTP/1.1 403 Forbidden\r\n\r\n');
    });
    await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
    const file = write('proxied-v6.yaml', [
      'current-context: c',
      'contexts: [{name: c, context: {cluster: k, user: u}}]',
      `clusters: [{name: k, cluster: {server: "https://[::1]:6443", proxy-url: "http://127.0.0.1:${(proxy.address() as net.AddressInfo).port}"}}]`,
      'users: [{name: u, user: {token: t}}]',
    ].join('\n'));
    try {
      const client = new KubeClient(loadKubeconfig(file), { retryBudgetMs: 0 });
      await assert.rejects(client.get({ group: '', version: 'v1', resource: 'configmaps', namespace: 'default', name: 'x' }), /CONNECT \[::1\]:6443 refused: HTTP\/1\.1 403 Forbidden/);
      assert.deepEqual(asked, [{ target: '[::1]:6443', host: '[::1]:6443' }]);
      client.close();
    } finally {
      await new Promise((resolve) => proxy.close(resolve));
    }
  });

  test('insecure-skip-tls-verify is honoured with a warning; tokenFile beside a token wins', () => {
    fs.writeFileSync(path.join(dir, 'tok'), SECRET);
    const file = write('insecure.json', JSON.stringify({
      'current-context': 'c', contexts: [{ name: 'c', context: { cluster: 'k', user: 'u' } }],
      clusters: [{ name: 'k', cluster: { server: 'https://10.0.0.1:6443', 'insecure-skip-tls-verify': true } }],
      users: [{ name: 'u', user: { token: 'old', tokenFile: 'tok' } }],
    }));
    const c = loadKubeconfig(file);
    assert.equal(c.insecureSkipTlsVerify, true);
    assert.match(c.warnings!.join('\n'), /insecure-skip-tls-verify: the API server's certificate is not checked/);
    assert.equal(c.tokenFile, path.join(dir, 'tok'));
    assert.equal(c.token, undefined);
  });

  test('a plugin that fails, or prints garbage, is a clear error that quotes nothing it printed', async () => {
    write('fails.sh', `#!/bin/sh\necho "token expired, run: login --sso" >&2\nexit 3\n`);
    write('garbage.sh', `#!/bin/sh\necho "${SECRET} not json"\n`);
    write('nostatus.sh', `#!/bin/sh\necho '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential"}'\n`);
    const cases: Array<[string, RegExp]> = [
      ['./fails.sh', /exec plugin ".*fails\.sh" \(.*users\["u"\]\.user\.exec\) exited 3: token expired, run: login --sso/],
      ['./garbage.sh', /did not print an ExecCredential \(its output is not JSON\)/],
      ['./nostatus.sh', /its ExecCredential has no status/],
      ['no-such-plugin-here', /exec plugin "no-such-plugin-here" .*: not found/],
    ];
    for (const [command, expected] of cases) {
      const c = loadKubeconfig(execConfig(`${command.replace(/\W/g, '')}.json`, 'https://10.0.0.1:6443', undefined, command, {}));
      await assert.rejects(c.plugin!.credential(), (e: Error) => {
        assert.match(e.message, expected);
        assert.doesNotMatch(e.message, new RegExp(SECRET));
        return true;
      });
    }
  });

  test('a server posing as the API server that echoes the bearer token in its Status: no run of it in the error', async () => {
    const token = 'eyJhbGciOiJSUzI1NiJ9.c2VydmljZWFjY291bnQ.sig-4d9c1f7a2b8e';
    const cert = selfSignedCertificate();
    // The token after a prefix in the message, and again in a cause: wherever a cut of the quote would fall.
    const server = https.createServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
      res.writeHead(400, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ kind: 'Status', status: 'Failure', reason: 'BadRequest', code: 400,
        message: `${'no '.repeat(1360)}you sent ${req.headers.authorization}`,
        details: { causes: [{ field: 'token', message: `was ${String(req.headers.authorization).slice(7)}` }] } }));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const file = write('posing.json', JSON.stringify({
        'current-context': 'c', contexts: [{ name: 'c', context: { cluster: 'k', user: 'u' } }],
        clusters: [{ name: 'k', cluster: { server: `https://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
          'insecure-skip-tls-verify': true } }],
        users: [{ name: 'u', user: { token } }],
      }));
      const client = new KubeClient(loadKubeconfig(file), { retryBudgetMs: 0 });
      const e = await client.get({ group: '', version: 'v1', resource: 'configmaps', namespace: 'default', name: 'x' })
        .catch((x) => x);
      client.close();
      assert.ok(e instanceof KubeError, String(e));
      assert.match(e.message, /^cannot get configmaps "x" .*: HTTP 400 BadRequest: no no /);
      const quoted = [e.message, ...(e.causes ?? [])].join('\n');
      assert.ok(quoted.length < 3 * 4096, `${quoted.length} characters`);
      assert.equal(leaks(quoted, token), undefined, quoted.slice(-300));
    } finally {
      server.close();
    }
  });
});

describe('credentials that change, against the API server', { skip: cluster ? false : 'no cluster' }, () => {
  const kubectl = kubectlFor(cluster!);
  const ns = freshNamespaceName('kubeconfig');
  let admin: any;
  let token = '';
  const pluginDir = path.join(dir, 'plugin');
  const resource = { group: '', version: 'v1', resource: 'configmaps', namespace: ns, name: 'kube-root-ca.crt' };

  before(async () => {
    await kubectl(['create', 'namespace', ns]);
    ({ token } = await namespaceAdminAccount(kubectl, cluster!, ns, 'reader', path.join(dir, 'sa.json')));
    admin = JSON.parse(fs.readFileSync(cluster!.kubeconfigPath, 'utf8'));
    fs.mkdirSync(pluginDir);
    write('plugin/credential.sh', PLUGIN);
  });
  after(() => removeNamespace(kubectl, ns));

  /** A client whose plugin hands out `tokens` (one per run) valid until `expires`; and its run count. */
  const pluginClient = (tokens: string[], expires: string) => {
    fs.rmSync(path.join(pluginDir, 'count'), { force: true });
    fs.writeFileSync(path.join(pluginDir, 'tokens'), `${tokens.join('\n')}\n`);
    const server = admin.clusters[0].cluster;
    const file = execConfig('exec.json', server.server, server['certificate-authority-data'], './plugin/credential.sh', {
      PLUGIN_DIR: pluginDir, EXPIRES: expires,
    });
    const client = new KubeClient(loadKubeconfig(file), { retryBudgetMs: 0 });
    const runs = () => Number(fs.readFileSync(path.join(pluginDir, 'count'), 'utf8'));
    return { client, runs };
  };

  test('an exec plugin runs once while its credential is valid, and is told it is not interactive', async () => {
    const { client, runs } = pluginClient([token], new Date(Date.now() + 3_600_000).toISOString());
    await client.get(resource);
    await client.get(resource);
    assert.equal(runs(), 1);
    const info = JSON.parse(fs.readFileSync(path.join(pluginDir, 'info'), 'utf8'));
    assert.deepEqual(info, { apiVersion: 'client.authentication.k8s.io/v1', kind: 'ExecCredential', spec: { interactive: false } });
    client.close();
  });

  test('an expired credential runs the plugin again', async () => {
    const { client, runs } = pluginClient([token], new Date(Date.now() - 1_000).toISOString());
    await client.get(resource);
    await client.get(resource);
    assert.equal(runs(), 2);
    client.close();
  });

  test('a 401 runs the plugin again, once', async () => {
    const { client, runs } = pluginClient(['revoked-token', token], new Date(Date.now() + 3_600_000).toISOString());
    await client.get(resource);
    assert.equal(runs(), 2, 'the rejected token was renewed');
    await client.get(resource);
    assert.equal(runs(), 2);
    const bad = pluginClient(['revoked-token'], new Date(Date.now() + 3_600_000).toISOString());
    await assert.rejects(bad.client.get(resource), (e: Error) => e instanceof KubeError && e.status === 401);
    assert.equal(bad.runs(), 2, 'renewed once, then the 401 is the answer');
    client.close();
    bad.client.close();
  });

  test('an exec plugin\'s client certificate (v1beta1) is used for the TLS connection', async () => {
    const user = admin.users[0].user;
    const pem = (b64: string) => Buffer.from(b64, 'base64').toString('utf8');
    fs.writeFileSync(path.join(pluginDir, 'cert.json'), JSON.stringify({
      apiVersion: 'client.authentication.k8s.io/v1beta1', kind: 'ExecCredential',
      status: { clientCertificateData: pem(user['client-certificate-data']), clientKeyData: pem(user['client-key-data']) },
    }));
    write('plugin/cert.sh', '#!/bin/sh\ncat "$PLUGIN_DIR/cert.json"\n');
    const server = admin.clusters[0].cluster;
    const file = write('cert-plugin.yaml', [
      'current-context: c',
      'contexts: [{name: c, context: {cluster: k, user: u}}]',
      `clusters: [{name: k, cluster: {server: "${server.server}", certificate-authority-data: "${server['certificate-authority-data']}"}}]`,
      'users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: ./plugin/cert.sh,',
      `  env: [{name: PLUGIN_DIR, value: "${pluginDir}"}]}}}]`,
    ].join('\n'));
    const client = new KubeClient(loadKubeconfig(file), { retryBudgetMs: 0 });
    const cm = await client.get<{ metadata: { name: string } }>(resource);
    assert.equal(cm.metadata.name, 'kube-root-ca.crt');
    client.close();
  });

  test('proxy-url: every connection tunnels through the HTTP proxy (CONNECT) with its credentials; a refusal is named', async () => {
    const tunnels: Array<{ target: string; auth: string | undefined }> = [];
    let refuse = false;
    const proxy = http.createServer((_req, res) => res.writeHead(405).end());
    proxy.on('connect', (req: http.IncomingMessage, client: net.Socket, head: Buffer) => {
      tunnels.push({ target: req.url ?? '', auth: req.headers['proxy-authorization'] });
      if (refuse) return client.end('HTTP/1.1 403 Forbidden\r\n\r\n');
      const [host, port] = (req.url ?? '').split(':');
      const upstream = net.connect(Number(port), host, () => {
        client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
        upstream.write(head);
        upstream.pipe(client).pipe(upstream);
      });
      upstream.on('error', () => client.destroy());
      client.on('error', () => upstream.destroy());
    });
    await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
    const proxyPort = (proxy.address() as net.AddressInfo).port;
    const server = admin.clusters[0].cluster;
    const file = write('proxied.yaml', [
      'current-context: c',
      'contexts: [{name: c, context: {cluster: k, user: u}}]',
      `clusters: [{name: k, cluster: {server: "${server.server}", certificate-authority-data: "${server['certificate-authority-data']}",`,
      `  proxy-url: "http://tunnel:p%40ss-${SECRET}@127.0.0.1:${proxyPort}"}}]`,
      `users: [{name: u, user: {token: "${token}"}}]`,
    ].join('\n'));
    try {
      const client = new KubeClient(loadKubeconfig(file), { retryBudgetMs: 0 });
      await client.get(resource);
      const api = new URL(server.server);
      assert.deepEqual(tunnels, [{ target: `${api.hostname}:${api.port}`, auth: `Basic ${Buffer.from(`tunnel:p@ss-${SECRET}`).toString('base64')}` }]);
      client.close();
      refuse = true;
      const refused = new KubeClient(loadKubeconfig(file), { retryBudgetMs: 0 });
      await assert.rejects(refused.get(resource), (e: Error) => {
        assert.match(e.message, new RegExp(`proxy 127\\.0\\.0\\.1:${proxyPort}: CONNECT ${api.hostname.replace(/\./g, '\\.')}:${api.port} refused: HTTP/1\\.1 403 Forbidden`));
        assert.doesNotMatch(e.message, new RegExp(SECRET));
        return true;
      });
      refused.close();
    } finally {
      await new Promise((resolve) => proxy.close(resolve));
    }
  });

  test('a tokenFile rewritten is read on the next request', async () => {
    const tokenFile = path.join(dir, 'rotating-token');
    fs.writeFileSync(tokenFile, 'not-a-token-yet');
    const server = admin.clusters[0].cluster;
    const file = write('tokenfile.yaml', [
      'current-context: t',
      'contexts: [{name: t, context: {cluster: k, user: u}}]',
      `clusters: [{name: k, cluster: {server: "${server.server}", certificate-authority-data: "${server['certificate-authority-data']}"}}]`,
      'users: [{name: u, user: {tokenFile: rotating-token}}]',
    ].join('\n'));
    const client = new KubeClient(loadKubeconfig(file), { retryBudgetMs: 0 });
    await assert.rejects(client.get(resource), (e: Error) => e instanceof KubeError && e.status === 401);
    fs.writeFileSync(tokenFile, `${token}\n`);
    const cm = await client.get<{ metadata: { name: string } }>(resource);
    assert.equal(cm.metadata.name, 'kube-root-ca.crt');
    client.close();
  });
});

describe('kubeconfig material through the executable', () => {
  const { start, stopAll } = webhookPool();
  after(stopAll);
  const HOOK_TOKEN = `hook-token-${randomBytes(6).toString('hex')}`;
  const WEB_TOKEN = `web-token-${randomBytes(6).toString('hex')}`;
  const MAIL_PASSWORD = `mail-pass-${randomBytes(6).toString('hex')}`;
  const KEY = `aws-secret-${randomBytes(6).toString('hex')}`;
  const upgradeHook = {
    id: 'web', 'execute-command': path.join(import.meta.dirname, '..', 'webhooks.sh'),
    'include-command-output-in-response': true, 'include-command-output-in-response-on-error': true,
    'pass-arguments-to-command': [{ source: 'entire-payload' }],
    'pass-environment-to-command': [
      { envname: 'APP_NS', source: 'string', name: 'prod' }, { envname: 'APP_WORKLOAD', source: 'string', name: 'deployment/web' },
      { envname: 'APP_CONTAINER', source: 'string', name: 'app' }, { envname: 'REPO_TYPE', source: 'string', name: 'regionalregistry' },
    ],
    'trigger-rule': { match: { type: 'value', value: '{{ getenv "HOOK_TOKEN_WEB" }}', parameter: { source: 'url', name: 'token' } } },
  };
  const acr = acrPayload('v2');
  const serve = (kubeconfig: string) => start({
    hooks: [upgradeHook], args: ['-template'],
    env: { KUBECONFIG: kubeconfig, HOOK_TOKEN, HOOK_TOKEN_WEB: WEB_TOKEN, MAIL_PASSWORD, MAIL_SMTP_HOST: 'smtp.invalid' },
  });

  test('a password in the server URL is refused, naming the field; the password is in no answer or log line', async () => {
    const file = write('userinfo-exe.json', JSON.stringify({
      'current-context': 'c', contexts: [{ name: 'c', context: { cluster: 'k', user: 'u' } }],
      clusters: [{ name: 'k', cluster: { server: `https://admin:${SECRET}@127.0.0.1:1` } }], users: [{ name: 'u', user: { token: 'x' } }],
    }));
    const w = await serve(file);
    const res = await w.request(`/hooks/web?token=${WEB_TOKEN}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acr });
    assert.equal(res.status, 500, res.body);
    assert.match(res.body, /clusters\["k"\]\.cluster\.server: a user name or password in the URL \(user:password@host\) is not accepted/);
    await waitFor(() => w.output().includes('finished handling web') || undefined, { what: 'the push to be logged' });
    for (const text of [res.body, w.output()]) assert.ok(!text.includes(SECRET), text);
  });

  test('an exec plugin gets the commands\' environment plus its own env, never the service\'s secrets; its stderr is scrubbed', async () => {
    const pluginDir = makeTempDir('exec-env-');
    // A plugin that keeps its environment, then fails saying a secret it read elsewhere (a file of the service's).
    // The service may run it again after answering (a later call of the push): each run replaces the file whole, so
    // that the test never reads one half written.
    fs.writeFileSync(path.join(pluginDir, 'leak'), `${MAIL_PASSWORD} ${HOOK_TOKEN} ${WEB_TOKEN}`);
    const plugin = write('env-plugin.sh', `#!/bin/sh\nenv > "$PLUGIN_DIR/env.$$" && mv "$PLUGIN_DIR/env.$$" "$PLUGIN_DIR/env"\necho "sts: denied for $AWS_SECRET_ACCESS_KEY ($(cat "$PLUGIN_DIR/leak"))" >&2\nexit 1\n`);
    const file = execConfig('env-exe.json', 'https://127.0.0.1:1', undefined, plugin, { PLUGIN_DIR: pluginDir, AWS_SECRET_ACCESS_KEY: KEY });
    const w = await serve(file);
    const res = await w.request(`/hooks/web?token=${WEB_TOKEN}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acr });
    assert.equal(res.status, 500, res.body);
    assert.match(res.body, /exec plugin ".*env-plugin\.sh" \(.*users\["u"\]\.user\.exec\) exited 1: sts: denied for \S+ \(\S+ \S+ \S+\)/);
    const env = Object.fromEntries(fs.readFileSync(path.join(pluginDir, 'env'), 'utf8').trim().split('\n').map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
    for (const name of ['HOOK_TOKEN', 'HOOK_TOKEN_WEB', 'MAIL_PASSWORD', 'MAIL_SMTP_HOST', 'KUBECONFIG']) assert.equal(env[name], undefined, name);
    assert.equal(env.AWS_SECRET_ACCESS_KEY, KEY, 'the kubeconfig\'s env');
    assert.equal(env.PATH, process.env.PATH, 'the commands\' environment');
    assert.match(env.KUBERNETES_EXEC_INFO, /"interactive":false/);
    await waitFor(() => w.output().includes('finished handling web') || undefined, { what: 'the push to be logged' });
    for (const text of [res.body, w.output()]) {
      for (const secret of [KEY, MAIL_PASSWORD, HOOK_TOKEN, WEB_TOKEN]) assert.ok(!text.includes(secret), `${secret} in ${text}`);
    }
  });
});
