/*
 * The registry watch through the executable, on the test cluster, against real registries (Debian's
 * docker-registry over TLS, test/registry.ts) that send no notification: workloads annotated webhook/poll and
 * webhook/hook take what is pushed. A semver workload takes a new 1.x tag and not a 2.x; a `latest` pushed again
 * is deployed at its new digest, pinned; a tag pushed while the service was stopped is deployed after it starts;
 * two workloads on one repository share one tag listing per interval (counted in the registry's own log); a
 * registry answering 429 with Retry-After is not asked again before that time; an unreachable registry is a
 * warning; a watch and a notification of the same push give one rollout, also when the notification names no
 * digest and deploys the tag unpinned (the watch asks the pods which digest they pulled: the one it found, nothing
 * more is rolled out; an older one, the found digest is deployed pinned); bad annotations are Warning Events.
 * Two workloads in two clusters (the second test cluster, webhook-test-b, and a hook with CLUSTERS) share one tag
 * listing per interval; a watch and a notification of the same push send one mail (counted at a real exim).
 * Every wait is for an event (an image, a log line, a metric), within a bound of several intervals.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as https from 'node:https';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import {
  adminPort, defaultBinary, freePort, httpRequest, makeTempDir, spawnWebhook, startWebhook, waitFor, waitForOutput,
  type Spawned, type Webhook,
} from './harness.ts';
import { makeCertificate, ociArchive, startRegistry, type Registry } from './registry.ts';
import { git, makeRepository, startGitServer, type GitServer } from './git-server.ts';
import {
  clusterOrSkip, containerImage, deployment, freshNamespaceName, kubectlFor, namespacedGetter, removeNamespace,
  renamedKubeconfig, reportPulled, type Cluster,
} from './cluster/kube.ts';
import { ensureCluster } from './cluster/cluster.ts';
import { readMail, serviceMailEnv, startMta, type Mta } from './mta.ts';
import { fixedSettings, registryHook, upgradeHook } from './upgrade-hooks.ts';
import { newestAllowedTag, nextTagPage, parsePolicy, pollInterval } from '../webhook.ts';

const cluster = await clusterOrSkip();
/** The second test cluster (test/clusters.test.ts starts it under the same name): a workload in each. */
const second: Cluster | undefined = cluster ? await ensureCluster('webhook-test-b') : undefined;
const TOKEN = 'registry-watch-token-81be';
const NOTIFY_AUTH = 'Bearer registry-watch-notify-3f0a';
// A look every 2 s (the service runs with -poll-min-interval 1s: the registries are on this machine); a change is
// deployed within a few of them.
const INTERVAL = '2s';
const FAST = ['-poll-min-interval', '1s'];
// The interval of two workloads on one repository, whose looks share a listing when they come within 90% of it of
// each other: long enough that a look delayed on a loaded machine still falls in that share.
const SHARED_INTERVAL = '5s';
const WITHIN = 90_000;
// The interval of the workloads a notification deploys to first: long enough for the push, the notification, its
// rollout and the pods' report (about 1 s here, a few on a loaded machine) to fall between two looks; each of those
// tests waits about two intervals.
const SLOW_INTERVAL = '10s';
const LOGIN = { user: 'watcher', password: 'registry-watch-password-6c2e' };

/** A Deployment whose pods pull with the secret `pull`. */
function withPullSecret(d: object) {
  (d as { spec: { template: { spec: Record<string, unknown> } } }).spec.template.spec.imagePullSecrets = [{ name: 'pull' }];
  return d;
}

/**
 * What the watch logs at its look at a push a notification deployed: delivered already, or the tag still at its
 * digest; or (the look came while the notification's push was being applied, the two queued on the workload) a repeat
 * of it, decided already at the looks after. None deploys anything again.
 */
function lookedPast(ns: string, name: string, registry: Registry, digest: string): RegExp {
  const found = `${registry.host}/acme/${name}:latest@${digest}`.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  return new RegExp(`deployment/${name} in ${ns}, container app: (?:.*delivered already|.*acme/${name}:latest is still ` +
    `${digest}|${found}: (?:repeat|decided already) )`);
}

/** The digest host/repo:tag has now (HEAD, as the watch asks), trusting the registry's CA. */
function digestOf(registry: Registry, repoTag: string): Promise<string> {
  const [repo, tag] = repoTag.split(':');
  return new Promise((resolve, reject) => {
    const req = https.request(`https://${registry.host}/v2/${repo}/manifests/${tag}`, {
      method: 'HEAD', ca: registry.caPem,
      headers: { Accept: 'application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json' },
    }, (res) => {
      res.resume();
      const d = res.headers['docker-content-digest'];
      if (typeof d === 'string') resolve(d);
      else reject(new Error(`no digest for ${repoTag}: ${res.statusCode}`));
    });
    req.on('error', reject);
    req.end();
  });
}

/**
 * A TLS server standing in for a registry that misbehaves: every request 429 with Retry-After (`/v2/acme/slow/`),
 * a tag list of 10,001 tags (`acme/many`), one of 50 MB (`acme/huge`); it keeps when each request came.
 */
async function misbehaving(retryAfterSeconds: number) {
  const certs = makeCertificate(makeTempDir('registry-watch-fake-'));
  const seen: number[] = [];
  const server = https.createServer({ cert: fs.readFileSync(certs.certFile), key: fs.readFileSync(certs.keyFile) }, (req, res) => {
    if (req.url?.startsWith('/v2/acme/many/')) {
      const tags = Array.from({ length: 10_001 }, (_, i) => `1.0.${i}`);
      return void res.writeHead(200, { 'Content-Type': 'application/json' }).end(JSON.stringify({ name: 'acme/many', tags }));
    }
    if (req.url?.startsWith('/v2/acme/huge/')) {
      res.writeHead(200, { 'Content-Type': 'application/json' });
      const chunk = Buffer.alloc(1024 * 1024, 0x20);
      let sent = 0;
      const more = () => {
        while (sent < 50 && res.write(chunk)) sent++;
        if (sent >= 50) res.end();
      };
      res.on('drain', () => { sent++; more(); });
      res.on('close', () => (sent = 50));
      return more();
    }
    seen.push(Date.now());
    res.writeHead(429, { 'Retry-After': String(retryAfterSeconds), 'Content-Type': 'application/json' });
    res.end('{"errors":[{"code":"TOOMANYREQUESTS"}]}');
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { host: `127.0.0.1:${(server.address() as AddressInfo).port}`, caPem: certs.caPem, seen, close: () => server.close() };
}

describe('the registry watch through the executable', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('registry-watch');
  const kubectl = kubectlFor(cluster!);
  const getJson = namespacedGetter(kubectl, ns);
  let work: string;
  let quiet: Registry;
  let notifying: Registry;
  let locked: Registry;
  let limited: Awaited<ReturnType<typeof misbehaving>>;
  let oversized: Awaited<ReturnType<typeof misbehaving>>;
  let service: Spawned;
  let port: number;
  let hooksFile: string;
  let env: Record<string, string>;

  const image = async (name: string) => containerImage(await getJson(`deployment/${name}`), 'app');
  const annotated = (name: string, img: string, annotations: Record<string, string>) => {
    const d = deployment(name, [{ name: 'app', image: img }], { replicas: 1 }) as { metadata: Record<string, unknown> };
    d.metadata.annotations = annotations;
    return d;
  };
  const watched = (hook = 'watch', more: Record<string, string> = {}) =>
    ({ 'webhook/poll': INTERVAL, 'webhook/hook': hook, ...more });
  const start = async () => {
    service = await spawnWebhook({ hooks: hooksFile, env, metrics: true, args: FAST }, port);
    await waitFor(async () => (await httpRequest(port, '/').catch(() => undefined))?.status === 200,
      { timeoutMs: 15_000, what: 'the service' });
  };
  const stop = async () => {
    service.proc.kill('SIGTERM');
    await service.exited;
  };
  const admin = async (page: string) => {
    const m = /serving metrics on http:\/\/127\.0\.0\.1:(\d+)\/metrics/.exec(service.output());
    return m ? (await httpRequest(Number(m[1]), page).catch(() => undefined))?.body ?? '' : '';
  };
  const metric = async (pattern: RegExp) => {
    const text = await admin('/metrics');
    return text.split('\n').filter((l) => pattern.test(l)).reduce((sum, l) => sum + Number(l.split(' ').at(-1)), 0);
  };
  const events = async (name: string, reason: string) => {
    const list = JSON.parse(await kubectl(['-n', ns, 'get', 'events', '--field-selector',
      `involvedObject.name=${name},reason=${reason}`, '-o', 'json']));
    return (list.items as { message: string }[]).map((e) => e.message);
  };
  const rollouts = async (name: string) =>
    (await events(name, 'ImageUpdated')).length + (await events(name, 'RolloutRestarted')).length;
  type Look = { target: { name: string }; lastLookAt?: number; lastResult?: string };
  /** The result of the watch's first look at `name` after `since` (ms), as /deliveries/watched.json shows it. */
  const lookAfter = (name: string, since: number) => waitFor(async () => {
    const text = await admin('/deliveries/watched.json');
    const w = text ? (JSON.parse(text).watched as Look[]).find((l) => l.target.name === name) : undefined;
    return w?.lastLookAt !== undefined && w.lastLookAt > since ? w : undefined;
  }, { timeoutMs: WITHIN, what: `a look at ${name}` });
  /** A build job's notification (repo_type custom) of `<quiet>/acme/<name>:latest`: a tag, and no digest. */
  const notifyTag = async (name: string) => {
    const query = new URLSearchParams({ token: TOKEN, ns, workload: `deployment/${name}`, container: 'app', repo_type: 'custom' });
    const payload = { push_data: { tag: 'latest' }, repository: { repo_url: `https://${quiet.host}/`, namespace: 'acme', name } };
    const res = await httpRequest(port, `/hooks/watch?${query}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(payload) });
    assert.equal(res.status, 200, res.body);
  };
  /** The workload's rollout is over: one pod, of its current template, ready, and no other left. */
  const rolledOut = (name: string) => waitFor(async () => {
    const d = await getJson(`deployment/${name}`);
    const pods = JSON.parse(await kubectl(['-n', ns, 'get', 'pods', '-l', `app=${name}`, '-o', 'json'])).items;
    const done = d.status?.observedGeneration >= d.metadata.generation && d.status?.updatedReplicas === 1 &&
      d.status?.readyReplicas === 1 && d.status?.replicas === 1;
    return done && pods.length === 1 && !pods[0].metadata.deletionTimestamp;
  }, { timeoutMs: WITHIN, what: `the rollout of ${name}` });

  before(async () => {
    work = makeTempDir('registry-watch-');
    port = await freePort();
    quiet = await startRegistry({ tls: true });
    locked = await startRegistry({ tls: true, auth: LOGIN });
    const query = new URLSearchParams({ ns, workload: 'deployment/both', container: 'app', token: TOKEN });
    notifying = await startRegistry({
      tls: true, notify: { url: `http://127.0.0.1:${port}/hooks/notified?${query}`, headers: { Authorization: NOTIFY_AUTH } },
    });
    limited = await misbehaving(40);
    // Another host: the 429s of the first leave this one alone.
    oversized = await misbehaving(40);
    const ca = (name: string, pem: string) => {
      fs.writeFileSync(path.join(work, name), pem);
      return path.join(work, name);
    };
    const notifiedHook = registryHook('notified', { match: { type: 'value', value: NOTIFY_AUTH,
      parameter: { source: 'header', name: 'Authorization' } } }, 'distribution') as Record<string, object[]>;
    notifiedHook['pass-environment-to-command'].push({ envname: 'REGISTRY_CA', source: 'string', name: ca('notifying.pem', notifying.caPem!) });
    notifiedHook['pass-environment-to-command'].push({ envname: 'ANNOTATION_NAMESPACES', source: 'string', name: ns });
    hooksFile = path.join(work, 'hooks.json');
    fs.writeFileSync(hooksFile, JSON.stringify([
      upgradeHook('watch', TOKEN, { REGISTRY_CA: ca('quiet.pem', quiet.caPem! + locked.caPem!), ANNOTATION_NAMESPACES: ns }),
      upgradeHook('fixed', TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/fixed', APP_CONTAINER: 'app', POLL_INTERVAL: INTERVAL,
        REGISTRY_CA: path.join(work, 'quiet.pem') }),
      upgradeHook('limited', TOKEN, { REGISTRY_CA: ca('limited.pem', limited.caPem + oversized.caPem), ANNOTATION_NAMESPACES: ns }),
      notifiedHook,
    ]));
    env = { KUBECONFIG: cluster!.kubeconfigPath };
    await locked.push(ociArchive(work, 'private 1.0.0').path, 'acme/private:1.0.0');
    for (const [tag, day] of [['main-1', '01'], ['main-2', '02'], ['other-9', '09']])
      await quiet.push(ociArchive(work, `builds ${tag}`, undefined, { created: `2026-01-${day}T00:00:00Z` }).path, `acme/builds:${tag}`);
    for (const [repo, tag] of [['acme/semver', '1.0.0'], ['acme/latest', 'latest'], ['acme/shared', '1.0.0'], ['acme/both', 'latest'],
      ['acme/fixed', 'latest'], ['acme/tagged', 'latest'], ['acme/stale', 'latest']]) {
      await (repo === 'acme/both' ? notifying : quiet).push(ociArchive(work, `${repo} ${tag}`).path, `${repo}:${tag}`);
    }
    const latest = await digestOf(quiet, 'acme/latest:latest');
    const both = await digestOf(notifying, 'acme/both:latest');
    const fixed = await digestOf(quiet, 'acme/fixed:latest');
    const builds = await digestOf(quiet, 'acme/builds:main-2');
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
      annotated('semver', `${quiet.host}/acme/semver:1.0.0`, watched('watch', { 'webhook/policy': 'semver:^1' })),
      annotated('latest', `${quiet.host}/acme/latest:latest@${latest}`, watched()),
      annotated('twin-a', `${quiet.host}/acme/shared:1.0.0`,
        watched('watch', { 'webhook/policy': 'minor', 'webhook/poll': SHARED_INTERVAL })),
      annotated('twin-b', `${quiet.host}/acme/shared:1.0.0`,
        watched('watch', { 'webhook/policy': 'minor', 'webhook/poll': SHARED_INTERVAL })),
      annotated('limited', `${limited.host}/acme/slow:1.0.0`, watched('limited', { 'webhook/policy': 'minor' })),
      annotated('many', `${oversized.host}/acme/many:1.0.0`, watched('limited', { 'webhook/policy': 'minor' })),
      annotated('huge', `${oversized.host}/acme/huge:1.0.0`, watched('limited', { 'webhook/policy': 'minor' })),
      annotated('gone', `127.0.0.1:${await freePort()}/acme/gone:1.0.0`, watched()),
      { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'pull' }, type: 'kubernetes.io/dockerconfigjson', data: {
        '.dockerconfigjson': Buffer.from(JSON.stringify({ auths: { [locked.host]: { username: LOGIN.user, password: LOGIN.password } } })).toString('base64') } },
      withPullSecret(annotated('private', `${locked.host}/acme/private:1.0.0`, watched('watch', { 'webhook/policy': 'minor' }))),
      annotated('fixed', `${quiet.host}/acme/fixed:latest@${fixed}`, {}),
      annotated('builds', `${quiet.host}/acme/builds:main-2@${builds}`, watched('watch', { 'webhook/policy': 'glob:main-*' })),
      annotated('both', `${notifying.host}/acme/both:latest@${both}`, watched('notified')),
      // Unpinned, as a notification that names no digest deploys a tag.
      annotated('tagged', `${quiet.host}/acme/tagged:latest`, watched('watch', { 'webhook/poll': SLOW_INTERVAL })),
      annotated('stale', `${quiet.host}/acme/stale:latest`, watched('watch', { 'webhook/poll': SLOW_INTERVAL })),
      annotated('bad-ms', `${quiet.host}/acme/semver:1.0.0`, { 'webhook/poll': '1ms', 'webhook/hook': 'watch' }),
      annotated('bad-forever', `${quiet.host}/acme/semver:1.0.0`, { 'webhook/poll': 'forever', 'webhook/hook': 'watch' }),
      annotated('bad-hook', `${quiet.host}/acme/semver:1.0.0`, { 'webhook/poll': INTERVAL, 'webhook/hook': 'nope' }),
      annotated('no-hook', `${quiet.host}/acme/semver:1.0.0`, { 'webhook/poll': INTERVAL }),
    ] }));
    await start();
  });

  after(async () => {
    if (service && service.proc.exitCode === null) await stop();
    await quiet?.stop();
    await notifying?.stop();
    await locked?.stop();
    limited?.close();
    oversized?.close();
    await removeNamespace(kubectl, ns);
  });

  test('a semver workload takes a new 1.x tag and not a 2.x', async () => {
    await quiet.push(ociArchive(work, 'semver 2.0.0').path, 'acme/semver:2.0.0');
    await quiet.push(ociArchive(work, 'semver nightly').path, 'acme/semver:nightly');
    await quiet.push(ociArchive(work, 'semver 1.1.0').path, 'acme/semver:1.1.0');
    const digest = await digestOf(quiet, 'acme/semver:1.1.0');
    await waitFor(async () => (await image('semver')) === `${quiet.host}/acme/semver:1.1.0@${digest}`,
      { timeoutMs: WITHIN, what: 'the watch to deploy 1.1.0' });
    // Once the watch has seen the workload at 1.1.0, nothing above it is allowed: 2.0.0 stays out. Of the listing
    // the look kept only 1.0.0 and 1.1.0, what semver:^1 could take (not 2.0.0, not nightly).
    await waitForOutput(service, new RegExp(`deployment/semver in ${ns}, container app: no tag above the running one that ` +
      'semver:\\^1 allows \\(it could take 2 of the 4 tags listed\\)'), WITHIN);
    assert.equal(await image('semver'), `${quiet.host}/acme/semver:1.1.0@${digest}`);
    assert.equal((await events('semver', 'ImageUpdated')).length, 1);
  });

  test('the deliveries page lists what is watched, how often, when last looked at, and the watch\'s delivery', async () => {
    const doc = JSON.parse(await admin('/deliveries/watched.json'));
    const semver = doc.watched.find((w: { target: { name: string } }) => w.target.name === 'semver');
    assert.equal(semver.intervalMs, 2_000);
    assert.equal(semver.hook, 'watch');
    assert.equal(semver.from, 'annotation webhook/poll');
    assert.ok(semver.lastLookAt > 0, JSON.stringify(semver));
    assert.ok(!doc.watched.some((w: { target: { name: string } }) => w.target.name.startsWith('bad-')));
    const page = await admin('/deliveries');
    assert.match(page, /<h2>Registry watch<\/h2>/);
    assert.match(page, new RegExp(`deployment/semver in ${ns}, app</td><td>[^<]*</td><td>2s \\(annotation webhook/poll\\)</td><td>watch</td>`));
    const deliveries = JSON.parse(await admin('/deliveries.json')).deliveries as { workload: string; decision: string }[];
    assert.ok(deliveries.some((d) => d.workload === 'deployment/semver' && d.decision === 'applied'), JSON.stringify(deliveries));
  });

  test('latest pushed again is deployed at its new digest, pinned', async () => {
    await quiet.push(ociArchive(work, 'latest again').path, 'acme/latest:latest');
    const digest = await digestOf(quiet, 'acme/latest:latest');
    await waitFor(async () => (await image('latest')) === `${quiet.host}/acme/latest:latest@${digest}`,
      { timeoutMs: WITHIN, what: 'the new digest of latest' });
  });

  test('a registry that asks for a login is read with the workload\'s pull secret, which never appears in the log', async () => {
    await locked.push(ociArchive(work, 'private 1.1.0').path, 'acme/private:1.1.0');
    await waitFor(async () => (await image('private'))?.startsWith(`${locked.host}/acme/private:1.1.0@sha256:`),
      { timeoutMs: WITHIN, what: 'the watch to deploy 1.1.0 with the pull secret' });
    assert.ok(!service.output().includes(LOGIN.password));
  });

  test('a hook that fixes its workload watches it every POLL_INTERVAL, with no annotation', async () => {
    await quiet.push(ociArchive(work, 'fixed again').path, 'acme/fixed:latest');
    const digest = await digestOf(quiet, 'acme/fixed:latest');
    await waitFor(async () => (await image('fixed')) === `${quiet.host}/acme/fixed:latest@${digest}`,
      { timeoutMs: WITHIN, what: 'the new digest of fixed' });
    const doc = JSON.parse(await admin('/deliveries/watched.json'));
    const entry = doc.watched.find((w: { target: { name: string } }) => w.target.name === 'fixed');
    assert.equal(entry.from, 'POLL_INTERVAL of hook "fixed"');
    assert.equal(entry.hook, 'fixed');
  });

  test('a glob policy takes the newest build among the matching tags, by creation time, not by name', async () => {
    // main-0 sorts first by name and was built last; main-3 sorts last and was built before it; other-9 does not match.
    await quiet.push(ociArchive(work, 'builds main-3', undefined, { created: '2026-01-03T00:00:00Z' }).path, 'acme/builds:main-3');
    await quiet.push(ociArchive(work, 'builds main-0', undefined, { created: '2026-01-04T00:00:00Z' }).path, 'acme/builds:main-0');
    const digest = await digestOf(quiet, 'acme/builds:main-0');
    await waitFor(async () => (await image('builds')) === `${quiet.host}/acme/builds:main-0@${digest}`,
      { timeoutMs: WITHIN, what: 'the newest build main-0' });
    await waitForOutput(service, new RegExp(`deployment/builds in ${ns}, container app: the newest build glob:main-\\* allows runs already \\(main-0`), WITHIN);
  });

  test('bad annotations are Warning Events, and nothing is changed', async () => {
    for (const [name, why] of [
      ['bad-ms', /not watched: annotation webhook\/poll "1ms" is outside 1s to 24h/],
      ['bad-forever', /not watched: annotation webhook\/poll "forever" is not a Go duration/],
      ['bad-hook', /not watched: annotation webhook\/hook: no hook is named "nope"/],
      ['no-hook', /not watched: annotation webhook\/poll names no hook: annotate webhook\/hook/],
    ] as const) {
      const found = await waitFor(async () => (await events(name, 'RegistryWatchRefused')).find((m) => why.test(m)),
        { timeoutMs: WITHIN, what: `the Warning Event of ${name}` });
      assert.ok(found);
      assert.equal(await image(name), `${quiet.host}/acme/semver:1.0.0`);
    }
  });

  test('two workloads on one repository: one tag listing per interval', async () => {
    const looks = () => metric(new RegExp(`^webhook_registry_watch_looks_total\\{repository="${quiet.host}/acme/shared"`));
    const listings = () => quiet.log().split('\n').filter((l) => l.includes('/v2/acme/shared/tags/list') && /response completed/.test(l)).length;
    const from = { looks: await looks(), listings: listings() };
    await waitFor(async () => (await looks()) - from.looks >= 8, { timeoutMs: WITHIN, what: 'eight looks of acme/shared' });
    const made = { looks: (await looks()) - from.looks, listings: listings() - from.listings };
    // Two workloads, each looking once an interval: one listing serves both looks of an interval.
    assert.ok(made.listings <= Math.ceil(made.looks / 2) + 1, JSON.stringify(made));
    assert.ok(made.listings >= 2, JSON.stringify(made));
  });

  test('a registry answering 429 with Retry-After is not asked again before that time', async () => {
    await waitFor(() => limited.seen.length > 0, { timeoutMs: WITHIN, what: 'the first request' });
    const first = limited.seen[0];
    const looks = () => metric(/^webhook_registry_watch_looks_total\{repository="127\.0\.0\.1:\d+\/acme\/slow",result="not asked"/);
    await waitFor(async () => (await looks()) >= 2, { timeoutMs: WITHIN, what: 'two looks not asked' });
    assert.ok(limited.seen.every((t) => t === first || t >= first + 40_000), JSON.stringify(limited.seen));
    assert.match(service.output(), /acme\/slow: its tag list: the registry answered 429; 127\.0\.0\.1:\d+ is not asked again before/);
  });

  test('a tag list of 10,000 tags or of 50 MB is refused, naming the limit, and nothing is changed', async () => {
    await waitForOutput(service, /acme\/many: more than 5000 tags: refused, none read/, WITHIN);
    await waitForOutput(service, /acme\/huge: a page of its tag list is larger than 1048576 bytes: refused/, WITHIN);
    assert.equal(await image('many'), `${oversized.host}/acme/many:1.0.0`);
    assert.equal(await image('huge'), `${oversized.host}/acme/huge:1.0.0`);
  });

  test('an unreachable registry is a warning, not a crash', async () => {
    await waitForOutput(service, new RegExp(`deployment/gone in ${ns}, container app: failed: `), WITHIN);
    assert.equal((await httpRequest(port, '/')).status, 200);
    assert.equal(service.proc.exitCode, null);
  });

  test('a watch and a notification of the same push give one rollout and one delivery (what is mailed and posted)', async () => {
    // The registry delivers the notification of the first push once the service answers: wait until it has.
    const rollouts = async () => (await events('both', 'ImageUpdated')).length + (await events('both', 'RolloutRestarted')).length;
    await waitForOutput(service, /POST \/hooks\/notified\?[^"]*" 200/, WITHIN);
    await waitFor(async () => (await rollouts()) > 0, { timeoutMs: WITHIN, what: 'the first push deployed' });
    // What is mailed and posted is one per delivery: those of this workload since the push that named an image (a
    // notification's blobs name none; a watch's look that handed the push over again would).
    type Doc = { workload: string; received_at: string; image_after: string | null };
    const since = new Date().toISOString();
    const delivered = async () => (JSON.parse(await admin('/deliveries.json')).deliveries as Doc[])
      .filter((d) => d.workload === 'deployment/both' && d.received_at >= since && d.image_after !== null).length;
    const before = await rollouts();
    await notifying.push(ociArchive(work, 'both again').path, 'acme/both:latest');
    const digest = await digestOf(notifying, 'acme/both:latest');
    await waitFor(async () => (await rollouts()) > before, { timeoutMs: WITHIN, what: 'the push to be deployed' });
    // The watch has looked at it since (or did first).
    await waitForOutput(service, lookedPast(ns, 'both', notifying, digest), WITHIN);
    assert.equal(await rollouts(), before + 1, (await events('both', 'ImageUpdated')).join('\n'));
    assert.equal(await delivered(), 1, await admin('/deliveries.json'));
  });

  /**
   * `latest` pushed again and announced by a notification naming no digest, which deploys the tag unpinned (a
   * restart); the kubelet (played here: kwok reports no imageID) reports the digest it pulled; then the watch looks.
   */
  const pushedAndNotified = async (name: string, pulled: (digest: string) => string) => {
    // A look has just been made: the push, the notification, its rollout and the pods' report fall before the next.
    const first = await lookAfter(name, 0);
    await lookAfter(name, first.lastLookAt!);
    const before = await rollouts(name);
    await quiet.push(ociArchive(work, `${name} again`).path, `acme/${name}:latest`);
    const digest = await digestOf(quiet, `acme/${name}:latest`);
    await notifyTag(name);
    await waitFor(async () => (await rollouts(name)) > before, { timeoutMs: WITHIN, what: 'the notification deployed' });
    await rolledOut(name);
    await reportPulled(kubectl, ns, name, `${quiet.host}/acme/${name}@${pulled(digest)}`);
    return { before, digest, look: await lookAfter(name, Date.now()) };
  };

  test('a tag a notification deployed unpinned, whose pods report its digest, is not rolled out again by the watch', async () => {
    const { before, digest, look } = await pushedAndNotified('tagged', (d) => d);
    assert.match(look.lastResult!, new RegExp(`acme/tagged:latest@${digest}: delivered already \\(.*its pods report having pulled ${digest}`));
    assert.equal(await image('tagged'), `${quiet.host}/acme/tagged:latest`);
    assert.equal(await rollouts('tagged'), before + 1, (await events('tagged', 'ImageUpdated')).join('\n'));
  });

  test('a tag a notification deployed unpinned, whose pods report an older digest, is deployed pinned by the watch', async () => {
    const old = await digestOf(quiet, 'acme/stale:latest');
    // The node kept the image it had (imagePullPolicy IfNotPresent): its pods still run the older digest.
    const { digest } = await pushedAndNotified('stale', () => old);
    await waitFor(async () => (await image('stale')) === `${quiet.host}/acme/stale:latest@${digest}`,
      { timeoutMs: WITHIN, what: 'the watch to deploy the new digest, pinned' });
  });

  test('a tag pushed while the service was stopped is deployed after it starts', async () => {
    await stop();
    await quiet.push(ociArchive(work, 'semver 1.2.0').path, 'acme/semver:1.2.0');
    const digest = await digestOf(quiet, 'acme/semver:1.2.0');
    await start();
    await waitFor(async () => (await image('semver')) === `${quiet.host}/acme/semver:1.2.0@${digest}`,
      { timeoutMs: WITHIN, what: 'the catch-up to deploy 1.2.0' });
  });
});

describe('the registry watch over two clusters', { skip: cluster && second ? false : 'no clusters' }, () => {
  const ns = freshNamespaceName('registry-watch-two');
  const kubectls = [kubectlFor(cluster!), kubectlFor(second!)];
  let registry: Registry;
  let service: Webhook;

  before(async () => {
    const work = makeTempDir('registry-watch-two-');
    registry = await startRegistry({ tls: true });
    const ca = path.join(work, 'registry.pem');
    fs.writeFileSync(ca, registry.caPem!);
    await registry.push(ociArchive(work, 'fleet 1.0.0').path, 'acme/fleet:1.0.0');
    const fleet = deployment('fleet', [{ name: 'app', image: `${registry.host}/acme/fleet:1.0.0` }], { replicas: 1 }) as
      { metadata: Record<string, unknown> };
    fleet.metadata.annotations = { 'webhook/poll': SHARED_INTERVAL, 'webhook/hook': 'fleet', 'webhook/policy': 'minor' };
    for (const kubectl of kubectls) {
      await kubectl(['create', 'namespace', ns]);
      await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(fleet));
    }
    const kubeconfigs = [renamedKubeconfig(cluster!, 'prod', path.join(work, 'prod.json')),
      renamedKubeconfig(second!, 'staging', path.join(work, 'staging.json'))];
    service = await startWebhook({
      hooks: [upgradeHook('fleet', TOKEN, { CLUSTERS: 'prod staging', REGISTRY_CA: ca, ANNOTATION_NAMESPACES: ns })],
      env: { KUBECONFIG: kubeconfigs.join(path.delimiter) }, metrics: true, args: FAST,
    });
  });
  after(async () => {
    await service?.stop();
    await registry?.stop();
    await Promise.all(kubectls.map((kubectl) => removeNamespace(kubectl, ns)));
  });

  test('two workloads in two clusters on one repository: one tag listing per interval', async () => {
    const watched = async () => JSON.parse((await httpRequest(await adminPort(service), '/deliveries/watched.json')).body)
      .watched.filter((w: { target: { name: string } }) => w.target.name === 'fleet').map((w: { cluster: string }) => w.cluster).sort();
    await waitFor(async () => (await watched()).length === 2, { timeoutMs: WITHIN, what: 'the workload of each cluster watched' });
    assert.deepEqual(await watched(), ['prod', 'staging']);
    const looks = async () => (await service.metrics()).body.split('\n')
      .filter((l) => l.startsWith(`webhook_registry_watch_looks_total{repository="${registry.host}/acme/fleet"`))
      .reduce((sum, l) => sum + Number(l.split(' ').at(-1)), 0);
    const listings = () => registry.log().split('\n')
      .filter((l) => l.includes('/v2/acme/fleet/tags/list') && /response completed/.test(l)).length;
    const from = { looks: await looks(), listings: listings() };
    await waitFor(async () => (await looks()) - from.looks >= 8, { timeoutMs: WITHIN, what: 'eight looks of acme/fleet' });
    const made = { looks: (await looks()) - from.looks, listings: listings() - from.listings };
    // One workload in each cluster, each looking once an interval: one listing serves both looks of an interval.
    assert.ok(made.listings <= Math.ceil(made.looks / 2) + 1, JSON.stringify(made));
    assert.ok(made.listings >= 2, JSON.stringify(made));
  });
});

describe('a watch and a notification of the same push, mailed', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('registry-watch-mail');
  const kubectl = kubectlFor(cluster!);
  const auth = 'Bearer registry-watch-mail-9b27';
  let work: string;
  let registry: Registry;
  let mta: Mta;
  let service: Spawned;
  let admin: number;

  const events = async (reason: string) => (JSON.parse(await kubectl(['-n', ns, 'get', 'events', '--field-selector',
    `involvedObject.name=mailed,reason=${reason}`, '-o', 'json'])).items as unknown[]).length;
  const rollouts = async () => (await events('ImageUpdated')) + (await events('RolloutRestarted'));
  type Doc = { state: string; notifications: { channel: string; state: string }[] };
  /** Every delivery so far is done and its mail sent (or not): the MTA holds each mail sent (how many is returned). */
  const settledMails = () => waitFor(async () => {
    const all = JSON.parse((await httpRequest(admin, '/deliveries.json')).body).deliveries as Doc[];
    const mails = all.flatMap((d) => d.notifications.filter((n) => n.channel.startsWith('mail')));
    if (all.some((d) => d.state !== 'done') || mails.some((n) => n.state === 'pending' || n.state === 'held')) return undefined;
    const delivered = await mta.messages();
    return delivered.length >= mails.filter((n) => n.state === 'sent').length ? delivered.length : undefined;
  }, { timeoutMs: WITHIN, what: 'every delivery done and its mail at the MTA' });

  before(async () => {
    work = makeTempDir('registry-watch-mail-');
    mta = await startMta();
    const port = await freePort();
    const query = new URLSearchParams({ ns, workload: 'deployment/mailed', container: 'app', token: TOKEN });
    registry = await startRegistry({ tls: true, notify: { url: `http://127.0.0.1:${port}/hooks/mailed?${query}`, headers: { Authorization: auth } } });
    const ca = path.join(work, 'registry.pem');
    fs.writeFileSync(ca, registry.caPem!);
    const hook = registryHook('mailed', { match: { type: 'value', value: auth, parameter: { source: 'header', name: 'Authorization' } } },
      'distribution') as Record<string, object[]>;
    hook['pass-environment-to-command'].push(...fixedSettings({ REGISTRY_CA: ca, MAIL_TO: 'ops@example.com', ANNOTATION_NAMESPACES: ns }));
    const hooks = path.join(work, 'hooks.json');
    fs.writeFileSync(hooks, JSON.stringify([hook]));
    await registry.push(ociArchive(work, 'mailed first').path, 'acme/mailed:latest');
    const first = await digestOf(registry, 'acme/mailed:latest');
    const mailed = deployment('mailed', [{ name: 'app', image: `${registry.host}/acme/mailed:latest@${first}` }], { replicas: 1 }) as
      { metadata: Record<string, unknown> };
    mailed.metadata.annotations = { 'webhook/poll': INTERVAL, 'webhook/hook': 'mailed' };
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(mailed));
    // The registry notifies of every blob pushed and manifest read, each a delivery mailed: none is summed up.
    const args = ['-max-mails-per-hook', '1000', ...FAST];
    service = await spawnWebhook({ hooks, env: { KUBECONFIG: cluster!.kubeconfigPath, ...serviceMailEnv(mta) }, metrics: true, args }, port);
    await waitFor(async () => (await httpRequest(port, '/').catch(() => undefined))?.status === 200,
      { timeoutMs: 15_000, what: 'the service' });
    admin = await adminPort(service);
  });
  after(async () => {
    if (service && service.proc.exitCode === null) {
      service.proc.kill('SIGTERM');
      await service.exited;
    }
    await registry?.stop();
    await mta?.stop();
    await removeNamespace(kubectl, ns);
  });

  test('one rollout and one mail, counted at the MTA', async () => {
    // The registry delivers the notification of the first push once the service answers; its mails come first.
    await waitForOutput(service, /POST \/hooks\/mailed\?[^"]*" 200/, WITHIN);
    await waitFor(async () => (await rollouts()) > 0, { timeoutMs: WITHIN, what: 'the first push deployed' });
    const earlier = await settledMails();
    const before = await rollouts();
    await registry.push(ociArchive(work, 'mailed again').path, 'acme/mailed:latest');
    const digest = await digestOf(registry, 'acme/mailed:latest');
    await waitFor(async () => (await rollouts()) > before, { timeoutMs: WITHIN, what: 'the push to be deployed' });
    // The watch has looked at it since (or did first).
    await waitForOutput(service, lookedPast(ns, 'mailed', registry, digest), WITHIN);
    // The mail of the change (sent once its rollout has ended), then every delivery's mail: one says a change.
    const changed = (raw: string[]) => raw.slice(earlier).map(readMail).filter((m) => /^action:\s+(?!none)\S/m.test(m.body));
    await waitFor(async () => changed(await mta.messages()).length > 0, { timeoutMs: WITHIN, what: 'the mail of the change' });
    await settledMails();
    const changes = changed(await mta.messages());
    assert.equal(await rollouts(), before + 1);
    assert.equal(changes.length, 1, changes.map((m) => `${m.subject}\n${m.body}`).join('\n---\n'));
  });
});

describe('the gate: an annotation cannot borrow another team\'s hook', { skip: cluster ? false : 'no cluster' }, () => {
  const [nsA, nsB] = [freshNamespaceName('team-a'), freshNamespaceName('team-b')];
  const kubectl = kubectlFor(cluster!);
  const GIT_USER = 'x-access-token';
  const GIT_TOKEN = 'team-a-git-token-5c0e91';
  let work: string;
  let registry: Registry;
  let server: GitServer;
  let bare: string;
  let wh: Webhook;
  const events = async (ns: string, name: string) =>
    (JSON.parse(await kubectl(['-n', ns, 'get', 'events', '--field-selector', `involvedObject.name=${name},reason=RegistryWatchRefused`,
      '-o', 'json'])).items as { type: string; message: string }[]);

  before(async () => {
    work = makeTempDir('registry-watch-gate-');
    registry = await startRegistry({ tls: true });
    for (const [repo, tag] of [['team-a/web', '1.0.0'], ['evil/backdoor', '1.0.0'], ['evil/backdoor', '1.0.1']])
      await registry.push(ociArchive(work, `${repo} ${tag}`).path, `${repo}:${tag}`);
    const caFile = path.join(work, 'ca.pem');
    fs.writeFileSync(caFile, registry.caPem!);
    const manifest = JSON.stringify(deployment('web', [{ name: 'app', image: `${registry.host}/team-a/web:1.0.0` }], { replicas: 1 }));
    bare = makeRepository(work, 'team-a', { 'apps/web.yaml': manifest.replace('"metadata":{', `"metadata":{"namespace":"${nsA}",`) });
    server = await startGitServer(work, GIT_USER, GIT_TOKEN);
    const tokenFile = path.join(work, 'git-token');
    fs.writeFileSync(tokenFile, GIT_TOKEN);
    for (const ns of [nsA, nsB]) await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', nsA, 'apply', '-f', '-'], manifest);
    // Team B may edit its own namespace only: its workload asks for team A's hook, on a registry of its own.
    const borrow = (name: string, hook: string) => {
      const d = deployment(name, [{ name: 'app', image: `${registry.host}/evil/backdoor:1.0.0` }], { replicas: 1 }) as any;
      d.metadata.annotations = { 'webhook/poll': INTERVAL, 'webhook/hook': hook, 'webhook/policy': 'semver:^1' };
      return d;
    };
    await kubectl(['-n', nsB, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List',
      items: [borrow('web', 'team-a'), borrow('mailer', 'team-a-mail'), borrow('borrower', 'open')] }));
    const hooks = [
      // Team A's hook fixes its workload (a hook that writes one Git file must) and commits to team A's repository.
      upgradeHook('team-a', TOKEN, { APP_NS: nsA, APP_WORKLOAD: 'deployment/web', REGISTRY_CA: caFile,
        GIT_REPO: `${server.base}/team-a.git`, GIT_PATH: 'apps/web.yaml', GIT_TOKEN: tokenFile }),
      // Team A's hook that fixes its namespace and leaves the workload to the URL (its mail and chat are team A's).
      upgradeHook('team-a-mail', TOKEN, { APP_NS: nsA, REGISTRY_CA: caFile, MAIL_TO: 'team-a@example.com' }),
      // An open hook (namespace and workload from the URL) that lists no ANNOTATION_NAMESPACES.
      upgradeHook('open', TOKEN, { REGISTRY_CA: caFile }),
    ];
    wh = await startWebhook({ hooks, env: { KUBECONFIG: cluster!.kubeconfigPath }, metrics: true, args: FAST });
  });
  after(async () => {
    await wh?.stop();
    await server?.close();
    await registry?.stop();
    for (const ns of [nsA, nsB]) await removeNamespace(kubectl, ns);
    fs.rmSync(work, { recursive: true, force: true });
  });

  test('a workload in team-b naming team-a\'s hook is not watched: no commit, no PATCH, a Warning Event and a log line', async () => {
    const head = git(bare, ['rev-parse', 'main']).trim();
    // The Event this service records (another service watching the same cluster may record its own).
    const refusal = (name: string, message: string) => waitFor(async () => (await events(nsB, name)).find((e) => e.message === message),
      { timeoutMs: WITHIN, what: `the RegistryWatchRefused Event on team-b's ${name}: ${message}` });
    // Without Git: team A's hook fixes only its namespace; the annotation does not move it into team B's.
    await refusal('mailer', `not watched: hook "team-a-mail" deploys to namespace ${nsA} in the default cluster, not ${nsB}`);
    const refused = await refusal('web', `not watched: hook "team-a" deploys to namespace ${nsA} in the default cluster, not ${nsB}`);
    assert.equal(refused.type, 'Warning');
    await waitForOutput(wh, new RegExp(`registry watch: deployment/web in ${nsB} is not watched: hook "team-a" deploys to namespace ${nsA}`), WITHIN);
    await refusal('borrower', `not watched: hook "open" leaves its namespace and workload to the request, and an annotation ` +
      `may choose them only in a namespace its ANNOTATION_NAMESPACES lists (it lists none), not ${nsB}`);
    // Both were seen by the same scan: nothing of either is watched, listed or deployed.
    const watched = JSON.parse((await httpRequest(await adminPort(wh), '/deliveries/watched.json')).body).watched as unknown[];
    assert.deepEqual(watched, []);
    assert.equal(git(bare, ['rev-parse', 'main']).trim(), head, 'nothing committed to team A\'s repository');
    assert.equal(server.requests.length, 0, 'team A\'s Git server was not even asked');
    for (const name of ['web', 'mailer', 'borrower'])
      assert.equal(containerImage(JSON.parse(await kubectl(['-n', nsB, 'get', `deployment/${name}`, '-o', 'json'])), 'app'),
        `${registry.host}/evil/backdoor:1.0.0`);
    assert.equal(containerImage(JSON.parse(await kubectl(['-n', nsA, 'get', 'deployment/web', '-o', 'json'])), 'app'),
      `${registry.host}/team-a/web:1.0.0`);
    assert.doesNotMatch(wh.output(), new RegExp(GIT_TOKEN));
  });

  test('-validate says which workloads may name a hook by annotation', () => {
    const file = path.join(work, 'validate.json');
    fs.writeFileSync(file, JSON.stringify([upgradeHook('open', TOKEN), upgradeHook('listed', TOKEN, { ANNOTATION_NAMESPACES: `${nsB}, ${nsA}` }),
      upgradeHook('pinned', TOKEN, { APP_NS: nsA, APP_WORKLOAD: 'deployment/web' })]));
    const r = spawnSync(defaultBinary(), ['-validate', '-hooks', file], { encoding: 'utf8', env: { PATH: process.env.PATH } });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /registry watch: no workload may name it in webhook\/hook \(it leaves its workload to the request, and ANNOTATION_NAMESPACES lists no namespace\)/);
    assert.match(r.stdout, new RegExp(`webhook/hook: listed are watched with its settings \\(in ${nsB}, ${nsA}\\)`));
    assert.match(r.stdout, /webhook\/hook: pinned are watched with its settings \(the workload it fixes\)/);
    const refused = (hook: object) => {
      const bad = path.join(work, 'bad.json');
      fs.writeFileSync(bad, JSON.stringify([hook]));
      const b = spawnSync(defaultBinary(), ['-validate', '-hooks', bad], { encoding: 'utf8', env: { PATH: process.env.PATH } });
      assert.equal(b.status, 1, b.stdout);
      return b.stderr;
    };
    assert.match(refused(upgradeHook('bad', TOKEN, { ANNOTATION_NAMESPACES: 'Team_B' })),
      /hook "bad": pass-environment-to-command\[\d+\]\.name: ANNOTATION_NAMESPACES "Team_B" is not a namespace name/);
    // What the gate would refuse to serve is refused at load, naming the setting.
    assert.match(refused(upgradeHook('one-file', TOKEN, { APP_NS: nsA, GIT_REPO: 'https://git.example.com/deploy.git',
      GIT_PATH: 'apps/web.yaml', GIT_TOKEN: 'token' })), /hook "one-file": pass-environment-to-command\[\d+\]\.name: GIT_PATH is one file, but its workload comes from the url parameter "workload", which no value rule pins: a push for any workload a request names would be written into it/);
    assert.match(refused(upgradeHook('wider', TOKEN, { APP_NS: nsA, ANNOTATION_NAMESPACES: `${nsA} ${nsB}` })),
      new RegExp(`hook "wider": pass-environment-to-command\\[\\d+\\]\\.name: ANNOTATION_NAMESPACES lists ${nsB}, but the hook fixes APP_NS "${nsA}": it reaches no other namespace`));
  });
});

describe('watch slots per namespace: one namespace cannot take them all', { skip: cluster ? false : 'no cluster' }, () => {
  const [crowded, other] = [freshNamespaceName('crowded'), freshNamespaceName('uncrowded')];
  const kubectl = kubectlFor(cluster!);
  let wh: Webhook;

  before(async () => {
    // Nothing answers at this registry: each look fails, once a day; what is asserted is what is watched.
    const d = (name: string) => {
      const w = deployment(name, [{ name: 'app', image: '127.0.0.1:1/acme/crowd:1.0.0' }], { replicas: 0 }) as
        { metadata: Record<string, unknown> };
      w.metadata.annotations = { 'webhook/poll': '24h', 'webhook/hook': 'crowd' };
      return w;
    };
    for (const [ns, names] of [[crowded, ['w-0', 'w-1', 'w-2']], [other, ['w-0']]] as const) {
      await kubectl(['create', 'namespace', ns]);
      await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: names.map(d) }));
    }
    const hooks = [upgradeHook('crowd', TOKEN, { ANNOTATION_NAMESPACES: `${crowded} ${other}` })];
    wh = await startWebhook({ hooks, env: { KUBECONFIG: cluster!.kubeconfigPath }, metrics: true,
      args: ['-max-watched-per-namespace', '2'] });
  });
  after(async () => {
    await wh?.stop();
    for (const ns of [crowded, other]) await removeNamespace(kubectl, ns);
  });

  test('past -max-watched-per-namespace a workload gets a RegistryWatchRefused Event naming the limit; another namespace is watched', async () => {
    const message = `not watched: more than 2 workloads are watched in namespace ${crowded} (-max-watched-per-namespace)`;
    const refused = async () => (JSON.parse(await kubectl(['-n', crowded, 'get', 'events', '--field-selector',
      'reason=RegistryWatchRefused', '-o', 'json'])).items as { message: string; involvedObject: { name: string } }[])
      .filter((e) => e.message === message).map((e) => e.involvedObject.name);
    const names = await waitFor(async () => ((await refused()).length > 0 ? refused() : undefined),
      { timeoutMs: WITHIN, what: `the RegistryWatchRefused Event in ${crowded}` });
    assert.equal(names.length, 1, names.join(', '));
    const watched = JSON.parse((await httpRequest(await adminPort(wh), '/deliveries/watched.json')).body)
      .watched as { target: { namespace: string; name: string } }[];
    const count = (ns: string) => watched.filter((w) => w.target.namespace === ns).length;
    assert.deepEqual([count(crowded), count(other)], [2, 1], JSON.stringify(watched));
    assert.ok(!watched.some((w) => w.target.namespace === crowded && w.target.name === names[0]));
  });
});

describe('one rate for all registries: an annotation naming many hosts cannot make the watch flood them', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('many-hosts');
  const kubectl = kubectlFor(cluster!);
  const HOSTS = 24;
  let wh: Webhook;

  before(async () => {
    // 24 hosts that refuse (127.0.0.<n>, port 1): each look is one request to a host of its own, failing at once.
    const d = (n: number) => {
      const w = deployment(`w-${n}`, [{ name: 'app', image: `127.0.0.${n + 1}:1/acme/many:1.0.0` }], { replicas: 0 }) as
        { metadata: Record<string, unknown> };
      w.metadata.annotations = { 'webhook/poll': '24h', 'webhook/hook': 'many' };
      return w;
    };
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: Array.from({ length: HOSTS }, (_, n) => d(n)) }));
    const hooks = [upgradeHook('many', TOKEN, { ANNOTATION_NAMESPACES: ns })];
    wh = await startWebhook({ hooks, env: { KUBECONFIG: cluster!.kubeconfigPath }, metrics: true, args: ['-registry-watch-rate', '1'] });
  });
  after(async () => {
    await wh?.stop();
    await removeNamespace(kubectl, ns);
  });

  test('-registry-watch-rate 1: the first looks (spread over 10 s) wait for the rate across hosts, never for a host\'s own; every one is made', async () => {
    const metric = async (prefix: string) => (await wh.metrics()).body.split('\n').filter((l) => l.startsWith(prefix))
      .reduce((sum, l) => sum + Number(l.split(' ').at(-1)), 0);
    const looks = () => metric('webhook_registry_watch_looks_total{repository="127.0.0.');
    await waitFor(async () => (await looks()) >= HOSTS, { timeoutMs: WITHIN, what: `a look at each of the ${HOSTS} hosts` });
    // 24 requests within 10 s, against 2 at once and 1 a second: at least a dozen waited for their turn.
    assert.ok((await metric('webhook_registry_watch_waits_total{limit="all registries"}')) >= HOSTS / 2 - 2);
    assert.equal(await metric('webhook_registry_watch_waits_total{limit="host"}'), 0, 'one request per host');
  });
});

describe('the registry watch, pure parts', () => {
  test('-validate says what each hook watches, and refuses a POLL_INTERVAL under 10s', () => {
    const dir = makeTempDir('registry-watch-validate-');
    const file = path.join(dir, 'hooks.json');
    const fixed = (id: string, every: string) => ({ ...upgradeHook(id, TOKEN), 'pass-environment-to-command': [
      { envname: 'APP_NS', source: 'string', name: 'shop' }, { envname: 'APP_WORKLOAD', source: 'string', name: 'deployment/web' },
      { envname: 'POLL_INTERVAL', source: 'string', name: every }] });
    fs.writeFileSync(file, JSON.stringify([fixed('fixed', '1m'), upgradeHook('open', TOKEN)]));
    const ok = spawnSync(defaultBinary(), ['-validate', '-hooks', file], { encoding: 'utf8', env: { PATH: process.env.PATH } });
    assert.equal(ok.status, 0, ok.stderr);
    assert.match(ok.stdout, /registry watch: deployment\/web in shop every 1m0s \(POLL_INTERVAL\); workloads annotated webhook\/poll and webhook\/hook: fixed are watched/);
    // An open hook is named by no annotation unless it lists the namespaces whose workloads may (the gate).
    assert.match(ok.stdout, /registry watch: no workload may name it in webhook\/hook \(it leaves its workload to the request, and ANNOTATION_NAMESPACES lists no namespace\)/);
    fs.writeFileSync(file, JSON.stringify([fixed('fast', '5s')]));
    const bad = spawnSync(defaultBinary(), ['-validate', '-hooks', file], { encoding: 'utf8', env: { PATH: process.env.PATH } });
    assert.notEqual(bad.status, 0);
    assert.match(bad.stderr, /POLL_INTERVAL "5s" is outside 10s to 24h0m0s/);
    // -poll-min-interval moves the minimum (a registry beside the service), not below 1s.
    const lowered = spawnSync(defaultBinary(), ['-validate', '-poll-min-interval', '2s', '-hooks', file],
      { encoding: 'utf8', env: { PATH: process.env.PATH } });
    assert.equal(lowered.status, 0, lowered.stderr);
    assert.match(lowered.stdout, /registry watch: deployment\/web in shop every 5s \(POLL_INTERVAL\)/);
    const raised = spawnSync(defaultBinary(), ['-validate', '-poll-min-interval', '1m', '-hooks', file],
      { encoding: 'utf8', env: { PATH: process.env.PATH } });
    assert.match(raised.stderr, /POLL_INTERVAL "5s" is outside 1m0s to 24h0m0s/);
    const floor = spawnSync(defaultBinary(), ['-validate', '-poll-min-interval', '500ms', '-hooks', file],
      { encoding: 'utf8', env: { PATH: process.env.PATH } });
    assert.equal(floor.status, 2);
    assert.match(floor.stderr, /invalid value for flag -poll-min-interval: must be between 1s and 24h0m0s/);
  });

  test('an interval is a Go duration from 10s to 24h; anything else is refused naming where it was written', () => {
    assert.equal(pollInterval('30s', 'annotation webhook/poll'), 30_000);
    assert.equal(pollInterval(' '), undefined);
    assert.throws(() => pollInterval('1ms', 'annotation webhook/poll'), /^Error: annotation webhook\/poll "1ms" is outside 10s to 24h/);
    assert.throws(() => pollInterval('forever'), /POLL_INTERVAL "forever" is not a Go duration/);
    assert.throws(() => pollInterval('25h'), /outside 10s to 24h/);
    assert.equal(pollInterval('2s', 'annotation webhook/poll', 1_000), 2_000);
    assert.throws(() => pollInterval('30s', 'annotation webhook/poll', 60_000), /"30s" is outside 1m0s to 24h/);
  });

  test('the next page of a tag list is followed on the registry itself only', () => {
    assert.equal(nextTagPage('</v2/acme/web/tags/list?n=2&last=b>; rel="next"', 'acme/web', 'r:5000'), 'n=2&last=b');
    assert.equal(nextTagPage('<https://r:5000/v2/acme/web/tags/list?last=b>; rel="next"', 'acme/web', 'r:5000'), 'last=b');
    assert.equal(nextTagPage('<https://evil:5000/v2/acme/web/tags/list?last=b>; rel="next"', 'acme/web', 'r:5000'), undefined);
    assert.equal(nextTagPage('</v2/other/tags/list?last=b>; rel="next"', 'acme/web', 'r:5000'), undefined);
    assert.equal(nextTagPage(undefined, 'acme/web', 'r:5000'), undefined);
  });

  test('a semver policy takes the highest tag it allows above the running one, never one outside it', () => {
    const tags = ['1.0.0', '1.2.0', '1.10.1', '2.0.0', 'latest', '1.11.0-rc.1', '0.9.0'];
    const take = (policy: string, running: string) =>
      newestAllowedTag(tags, parsePolicy(policy), {}, 'app', `r.io/acme/web:${running}`, 'deployment/web');
    assert.equal(take('semver:^1', '1.0.0'), '1.10.1');
    assert.equal(take('major', '1.0.0'), '2.0.0');
    assert.equal(take('patch', '1.2.0'), undefined);
    assert.equal(take('minor', '2.0.0'), undefined);
    const annotated = { metadata: { annotations: { 'webhook/policy': 'semver:~1.2' } } };
    assert.equal(newestAllowedTag(tags, parsePolicy('all'), annotated, 'app', 'r.io/acme/web:1.2.0', 'deployment/web'), undefined);
  });
});
