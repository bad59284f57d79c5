/*
 * The container image, proven without a Docker daemon: scripts/image.ts builds the Dockerfile's
 * final stage with buildah into dist/webhook-image.tar (or reuses it when dist/webhook, the
 * Dockerfile and the script are unchanged), the test unpacks the archive's root filesystem with tar
 * and starts the executable in it the way a container runtime would:
 *
 *   a private mount namespace and PID namespace (the executable is PID 1, as in a pod), the root
 *   filesystem bind-mounted READ-ONLY (readOnlyRootFilesystem), proc, a minimal /dev, a tmpfs at
 *   /tmp (the Deployment's emptyDir), the hooks directory bind-mounted read-only at
 *   /etc/webhook/source (the ConfigMap), then chroot as the image's user with the image's
 *   entrypoint, default arguments and environment, and nothing from the host's environment.
 *
 * The network is the host's, so the test reaches the server on 127.0.0.1; the port is moved off
 * 9000 through WEBHOOK_CMD (which the executable appends to its arguments) so runs cannot clash.
 *
 * Needs root (buildah, mount namespaces, chroot) and Debian's buildah. With CI=true a missing
 * prerequisite or a failed build fails the run (buildah is installed with apt-get when missing);
 * locally the tests are skipped with a loud message saying what is missing.
 */
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { buildImage, DEFAULT_ARCHIVE, EXECUTABLE, sharedLibraries, treeBytes, UID, unpackImage, type OciImageConfig } from '../scripts/image.ts';
import { freePort, httpRequest, makeTempDir, REPO_ROOT, waitFor } from './harness.ts';
import { fixedSettings } from './upgrade-hooks.ts';

const CI = Boolean(process.env.CI);
const fixture = (name: string) => fs.readFileSync(path.join(REPO_ROOT, 'test', 'fixtures', 'upgrade', name), 'utf8');
const PING = fixture('dockerhub-test-ping.json');

// ---------------------------------------------------------------------------------------------
// Prerequisites

function which(tool: string): string | undefined {
  for (const dir of (process.env.PATH ?? '').split(':').concat(['/usr/sbin', '/sbin', '/usr/bin', '/bin'])) {
    const p = path.join(dir || '.', tool);
    try {
      fs.accessSync(p, fs.constants.X_OK);
      return p;
    } catch { /* next */ }
  }
  return undefined;
}

/** Why the image tests cannot run here, or undefined when they can. Installs buildah in CI. */
function missingPrerequisite(): string | undefined {
  if (process.platform !== 'linux') return 'not Linux';
  if (process.getuid?.() !== 0) return 'not root (buildah, mount namespaces and chroot need root)';
  for (const tool of ['unshare', 'chroot', 'mount', 'tar', 'ldd', 'env']) if (!which(tool)) return `${tool} not found`;
  if (!which('buildah')) {
    if (!CI) return 'buildah not installed (apt-get install -y buildah)';
    const install = spawnSync('sh', ['-c', 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah'], { encoding: 'utf8' });
    if (install.status !== 0 || !which('buildah')) return `buildah could not be installed: ${install.stderr || install.stdout}`;
  }
  return undefined;
}

const missing = missingPrerequisite();
if (missing) {
  if (CI) throw new Error(`image tests cannot run: ${missing}`);
  process.stderr.write(`\n#### image tests SKIPPED: ${missing}\n\n`);
}

// ---------------------------------------------------------------------------------------------
// Running the image's root filesystem like a container runtime

const tool = (name: string) => which(name)!;

/** What the runtime mounts; created as mount points in the unpacked tree (runc does the same). */
const RUNTIME_MOUNT_POINTS = ['proc', 'dev'];

/**
 * Mounts, from the new mount namespace: $1 = rootfs, then source/target pairs up to `--`, then the
 * command. Every mount is private to the namespace and gone when its last process exits.
 */
const RUNTIME_SCRIPT = `set -eu
r=$1; shift
mount --bind "$r" "$r"
mount -o remount,bind,ro "$r"
mount -t proc -o nosuid,nodev,noexec proc "$r/proc"
mount -t tmpfs -o nosuid,noexec,mode=755,size=64k tmpfs "$r/dev"
for d in null zero full random urandom; do : > "$r/dev/$d"; mount --bind "/dev/$d" "$r/dev/$d"; done
mount -t tmpfs -o nosuid,nodev,mode=1777,size=64m tmpfs "$r/tmp"
while [ "$1" != -- ]; do mount --bind -o ro "$1" "$r$2"; shift 2; done
shift
exec "$@"
`;

interface Container {
  /** The contained process's PID on the host (PID 1 inside). */
  pid: number;
  output(): string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  kill(signal?: NodeJS.Signals): void;
}

interface RunOptions {
  /** Replaces the image's ENTRYPOINT + CMD (like `docker run --entrypoint`). */
  argv?: string[];
  /** Added to the image's Env. */
  env?: Record<string, string>;
  /** Host directory → path in the image, read-only. */
  mounts?: Record<string, string>;
  /** A command that may end before its process is seen (runToEnd): not an error, there is no pid then. */
  mayEndAtOnce?: boolean;
}

function imageUser(config: OciImageConfig): { uid: number; gid: number } {
  const [user, group] = (config.config.User ?? '0').split(':');
  return { uid: Number(user), gid: Number(group ?? user) };
}

/** Starts the image's entrypoint + cmd (or `argv`) in `rootfs` as the image's user. */
async function runImage(rootfs: string, config: OciImageConfig, opts: RunOptions = {}): Promise<Container> {
  const { uid, gid } = imageUser(config);
  const argv = opts.argv ?? [...(config.config.Entrypoint ?? []), ...(config.config.Cmd ?? [])];
  // The runtime's environment: the image's Env, HOME from the image's /etc/passwd, the pod's.
  const home = fs.readFileSync(path.join(rootfs, 'etc', 'passwd'), 'utf8').split('\n').map((l) => l.split(':')).find((f) => Number(f[2]) === uid)?.[5] ?? '/';
  const env = [...(config.config.Env ?? []), `HOME=${home}`, `HOSTNAME=webhook-test`, ...Object.entries(opts.env ?? {}).map(([k, v]) => `${k}=${v}`)];
  for (const d of [...RUNTIME_MOUNT_POINTS, ...Object.values(opts.mounts ?? {})]) fs.mkdirSync(path.join(rootfs, d), { recursive: true });
  const proc: ChildProcess = spawn(tool('unshare'), [
    '--mount', '--propagation', 'private', '--pid', '--fork', '--kill-child',
    tool('sh'), '-c', RUNTIME_SCRIPT, 'runtime', rootfs,
    ...Object.entries(opts.mounts ?? {}).flat(), '--',
    tool('env'), '-i', ...env,
    tool('chroot'), `--userspec=${uid}:${gid}`, `--groups=${gid}`, rootfs, ...argv,
  ], { stdio: ['ignore', 'pipe', 'pipe'], env: {} });
  let out = '';
  proc.stdout!.setEncoding('utf8').on('data', (c: string) => (out += c));
  proc.stderr!.setEncoding('utf8').on('data', (c: string) => (out += c));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => proc.on('close', (code, signal) => resolve({ code, signal })));
  // unshare --fork has one child: the runtime script, which becomes the executable (exec keeps the PID).
  const pid = await waitFor(() => {
    if (proc.exitCode !== null && opts.mayEndAtOnce) return 0;
    if (proc.exitCode !== null) throw new Error(`the container exited at once (${proc.exitCode}):\n${out}`);
    // Gone already (its exit not yet seen here): the next round sees the exit code.
    let children = '';
    try {
      children = fs.readFileSync(`/proc/${proc.pid}/task/${proc.pid}/children`, 'utf8').trim();
    } catch {
      return undefined;
    }
    return children ? Number(children.split(/\s+/)[0]) : undefined;
  }, { what: 'the contained process' });
  return {
    pid,
    output: () => out,
    exited,
    kill: (signal: NodeJS.Signals = 'SIGTERM') => { try { if (pid > 0) process.kill(pid, signal); } catch { /* gone */ } },
  };
}

/** Runs `argv` in the image to completion. */
async function runToEnd(rootfs: string, config: OciImageConfig, opts: RunOptions): Promise<{ code: number | null; output: string }> {
  const c = await runImage(rootfs, config, { ...opts, mayEndAtOnce: true });
  const timer = setTimeout(() => c.kill('SIGKILL'), 30_000);
  const { code } = await c.exited;
  clearTimeout(timer);
  return { code, output: c.output() };
}

function procStatus(pid: number, field: string): string {
  const line = fs.readFileSync(`/proc/${pid}/status`, 'utf8').split('\n').find((l) => l.startsWith(`${field}:`));
  return line?.slice(field.length + 1).trim() ?? '';
}

/** Every entry under `dir`, as image paths ("/etc/passwd"), with a type suffix: "/" dir, "@" symlink. */
function listTree(dir: string): string[] {
  return fs.readdirSync(dir, { withFileTypes: true, recursive: true }).map((e) => {
    const p = `/${path.relative(dir, path.join(e.parentPath, e.name))}`;
    return e.isDirectory() ? `${p}/` : e.isSymbolicLink() ? `${p}@` : p;
  }).sort();
}

// ---------------------------------------------------------------------------------------------

describe('the container image', { skip: missing ? `image tests skipped: ${missing}` : false }, () => {
  let rootfs = '';
  let config: OciImageConfig;
  let pristine: string[] = [];
  const hooksDir = makeTempDir('image-hooks-');

  before(() => {
    if (!fs.existsSync(path.join(REPO_ROOT, 'dist', 'webhook'))) {
      execFileSync(process.execPath, ['--disable-warning=ExperimentalWarning', path.join(REPO_ROOT, 'scripts', 'build.ts')], { stdio: 'inherit' });
    }
    const started = Date.now();
    const built = buildImage();
    rootfs = path.join(makeTempDir('image-rootfs-'), 'rootfs');
    ({ config } = unpackImage(DEFAULT_ARCHIVE, rootfs));
    pristine = listTree(rootfs);
    const mb = (n: number) => `${(n / 1e6).toFixed(1)} MB`;
    process.stderr.write(`# image ${built.built ? 'built' : 'reused'} in ${Date.now() - started} ms: archive ${mb(built.bytes)}, unpacked ${mb(treeBytes(rootfs))}\n`);
    // The seed hook as shipped, and a hook that hands a file to its command (it goes to /tmp).
    fs.copyFileSync(path.join(REPO_ROOT, 'examples', 'hooks', 'web.json'), path.join(hooksDir, 'web.json'));
    fs.writeFileSync(path.join(hooksDir, 'file.json'), JSON.stringify([{
      id: 'file', 'execute-command': '/webhooks.sh', 'include-command-output-in-response': true,
      'pass-arguments-to-command': [{ source: 'entire-payload' }],
      'pass-environment-to-command': fixedSettings({ APP_NS: 'prod', APP_WORKLOAD: 'deployment/web', APP_CONTAINER: 'app', REPO_TYPE: 'publicregistry' }),
      'pass-file-to-command': [{ source: 'raw-request-body', envname: 'PAYLOAD_FILE' }],
      'trigger-rule': { match: { type: 'value', value: '{{ getenv "HOOK_TOKEN" }}', parameter: { source: 'url', name: 'token' } } },
    }]));
    // As a ConfigMap volume: readable by everyone (mkdtemp made it 0700).
    fs.chmodSync(hooksDir, 0o755);
    for (const f of fs.readdirSync(hooksDir)) fs.chmodSync(path.join(hooksDir, f), 0o644);
  });

  test('its settings: non-root user, port 9000, the executable as entrypoint with the old start script\'s arguments', () => {
    assert.equal(config.os, 'linux');
    assert.equal(config.architecture, { x64: 'amd64', arm64: 'arm64' }[process.arch as string] ?? process.arch);
    assert.equal(config.config.User, `${UID}:${UID}`);
    assert.deepEqual(config.config.ExposedPorts, { '9000/tcp': {} });
    assert.deepEqual(config.config.Entrypoint, [EXECUTABLE]);
    assert.deepEqual(config.config.Cmd, ['-hooks', '/etc/webhook/source', '-hotreload', '-verbose']);
    assert.equal(config.config.WorkingDir, '/');
    assert.ok(config.config.Env?.includes('MALLOC_MMAP_THRESHOLD_=65536'), `Env: ${config.config.Env}`);
  });

  test('its root filesystem: the executable, the libraries it links, CA certificates, users, and nothing else', () => {
    const libraries = sharedLibraries(path.join(rootfs, EXECUTABLE));
    const files = [
      EXECUTABLE, ...libraries, '/etc/ssl/certs/ca-certificates.crt', '/etc/passwd', '/etc/group', '/etc/nsswitch.conf',
    ];
    const dirs = new Set<string>(['/etc/webhook/source/', '/home/', '/tmp/']);
    for (const p of [...files, ...dirs]) for (let d = path.dirname(p); d !== '/'; d = path.dirname(d)) dirs.add(`${d}/`);
    assert.deepEqual(pristine, [...files, ...dirs, '/webhooks.sh@'].sort());
    // Node 26's official build links glibc (with its compatibility stubs libdl, libm, libpthread),
    // libstdc++, libgcc_s and libatomic; plus the dynamic loader.
    const names = libraries.map((l) => path.basename(l));
    for (const lib of ['libatomic.so.1', 'libc.so.6', 'libdl.so.2', 'libgcc_s.so.1', 'libm.so.6', 'libpthread.so.0', 'libstdc++.so.6']) assert.ok(names.includes(lib), `${lib} in ${names}`);
    assert.equal(names.length, 8, `${names}`);
    // No shell, no package manager: /webhooks.sh is the executable under another name.
    assert.equal(fs.readlinkSync(path.join(rootfs, 'webhooks.sh')), EXECUTABLE);
    assert.ok(!fs.existsSync(path.join(rootfs, 'bin')));
    // Not stripped: the single-executable blob is still in it.
    assert.ok(fs.readFileSync(path.join(rootfs, EXECUTABLE)).includes('NODE_SEA_BLOB'));
    for (const p of pristine) {
      const st = fs.lstatSync(path.join(rootfs, p.replace(/[/@]$/, '')));
      assert.equal(`${st.uid}:${st.gid}`, '0:0', `${p} is owned by root`);
      if (!st.isSymbolicLink() && p !== '/tmp/') assert.equal(st.mode & 0o022, 0, `${p} is writable only by root`);
      if (!st.isSymbolicLink()) assert.equal(st.mode & (st.isDirectory() ? 0o005 : 0o004), st.isDirectory() ? 0o005 : 0o004, `${p} is readable by the image's user`);
    }
    assert.equal(fs.statSync(path.join(rootfs, 'tmp')).mode & 0o7777, 0o1777);
    assert.match(fs.readFileSync(path.join(rootfs, 'etc', 'passwd'), 'utf8'), new RegExp(`^webhook:x:${UID}:${UID}:`, 'm'));
    assert.match(fs.readFileSync(path.join(rootfs, 'etc', 'group'), 'utf8'), new RegExp(`^webhook:x:${UID}:`, 'm'));
  });

  test('the image\'s own dynamic loader resolves every library inside the image', async () => {
    const loader = sharedLibraries(path.join(rootfs, EXECUTABLE)).find((l) => /\/ld-linux/.test(l))!;
    const r = await runToEnd(rootfs, config, { argv: [loader, '--list', EXECUTABLE] });
    assert.equal(r.code, 0, r.output);
    assert.doesNotMatch(r.output, /not found/);
    assert.equal(r.output.match(/=> \/lib/g)?.length, sharedLibraries(path.join(rootfs, EXECUTABLE)).length - 1, r.output);
  });

  describe('started with the image\'s entrypoint and arguments, read-only, as its user', () => {
    let c: Container;
    let port = 0;
    const token = 'image-test-token-3c9d';

    before(async () => {
      port = await freePort();
      c = await runImage(rootfs, config, {
        // What the Deployment sets (WEBHOOK_CMD=-template, HOOK_TOKEN from the Secret), plus a free port.
        env: { WEBHOOK_CMD: `-template -port ${port}`, HOOK_TOKEN: token },
        mounts: { [hooksDir]: '/etc/webhook/source' },
      });
      let exited = false;
      void c.exited.then(() => (exited = true));
      await waitFor(async () => {
        if (exited) throw new Error(`the server exited:\n${c.output()}`);
        return (await httpRequest(port, '/healthz').catch(() => undefined))?.status === 200;
      }, { timeoutMs: 10_000, what: 'GET /healthz in the image' }).catch((e: Error) => { throw new Error(`${e.message}\n${c.output()}`); });
    });
    after(async () => {
      c?.kill('SIGKILL');
      await c?.exited;
    });

    test('GET /healthz answers OK', async () => {
      const r = await httpRequest(port, '/healthz');
      assert.equal(r.status, 200);
      assert.equal(r.body, 'OK');
    });

    test('runs as the image\'s user, as PID 1, on a read-only root filesystem', () => {
      assert.match(procStatus(c.pid, 'Uid'), new RegExp(`^${UID}\\s+${UID}\\s+${UID}\\s+${UID}$`));
      assert.match(procStatus(c.pid, 'Gid'), new RegExp(`^${UID}\\s+${UID}\\s+${UID}\\s+${UID}$`));
      assert.equal(procStatus(c.pid, 'NSpid').split(/\s+/).at(-1), '1');
      const root = fs.readFileSync(`/proc/${c.pid}/mountinfo`, 'utf8').split('\n').map((l) => l.split(' ')).filter((f) => f[4] === '/').at(-1)!;
      assert.match(root[5], /(^|,)ro(,|$)/, `the root is mounted ${root[5]}`);
      // Only what a runtime adds: the image's files are as they were unpacked.
      assert.deepEqual(listTree(rootfs).filter((p) => !RUNTIME_MOUNT_POINTS.some((m) => p.startsWith(`/${m}/`))), pristine);
    });

    test('the seed hook runs /webhooks.sh (the upgrade, in-process): a Docker Hub test ping is a no-op', async () => {
      const r = await httpRequest(port, `/hooks/web?token=${token}&ns=prod&workload=deployment/web&container=app&repo_type=publicregistry`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: PING,
      });
      assert.equal(r.status, 200, r.body);
      assert.match(r.body, /^action: +none \(test ping: /m);
      assert.match(r.body, /^result: +ok$/m);
      assert.equal(r.headers['access-control-allow-origin'], '*');
      await waitFor(() => /executing \/webhooks\.sh \(the upgrade, in-process\)/.test(c.output()), { what: 'the log line of the in-process upgrade' });
      const wrong = await httpRequest(port, '/hooks/web?token=wrong&ns=prod&workload=deployment/web&container=app', { method: 'POST', body: PING });
      assert.equal(wrong.status, 500);
      assert.equal(wrong.body, 'Hook rules were not satisfied.');
    });

    test('a hook that passes a file to its command writes it to /tmp, the one writable place', async () => {
      const r = await httpRequest(port, `/hooks/file?token=${token}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: PING });
      assert.equal(r.status, 200, `${r.body}\n${c.output()}`);
      assert.match(r.body, /^result: +ok$/m);
    });

    test('logs no secret and no error; SIGTERM stops it cleanly', async () => {
      // Reported for the record (memory is measured by the benchmarks, not asserted here).
      const rssMB = Number(procStatus(c.pid, 'VmRSS').split(/\s+/)[0]) / 1024;
      const peakMB = Number(procStatus(c.pid, 'VmHWM').split(/\s+/)[0]) / 1024;
      process.stderr.write(`# in the image: RSS ${rssMB.toFixed(0)} MB, peak ${peakMB.toFixed(0)} MB\n`);
      c.kill('SIGTERM');
      const exit = await c.exited;
      assert.equal(exit.code, 0, c.output());
      assert.match(c.output(), /stopped\n/);
      assert.ok(!c.output().includes(token), 'the token is not logged');
      assert.doesNotMatch(c.output(), /^\[webhook\] \S+ \S+ error:|placeholder/m, c.output());
    });
  });

  test('/webhooks.sh, run directly, is the upgrade: a test ping exits 0, a push without cluster credentials exits 1', async () => {
    const env = { APP_NS: 'prod', APP_WORKLOAD: 'deployment/web', APP_CONTAINER: 'app', REPO_TYPE: 'publicregistry' };
    const ping = await runToEnd(rootfs, config, { argv: ['/webhooks.sh', PING], env });
    assert.equal(ping.code, 0, ping.output);
    assert.match(ping.output, /^action: +none \(test ping: /m);
    assert.match(ping.output, /^result: +ok$/m);
    const push = await runToEnd(rootfs, config, { argv: ['/webhooks.sh', fixture('acr-push-lowercase.json')], env: { ...env, REPO_TYPE: 'regionalregistry' } });
    assert.equal(push.code, 1, push.output);
    assert.match(push.output, /^image after: +registry\.cn-hangzhou\.aliyuncs\.com\/shop\/web-api:v2\.3\.1$/m);
    assert.match(push.output, /^result: +failed: no Kubernetes credentials/m);
  });
});
