/**
 * The container image of dist/webhook, built with no Docker daemon and no registry.
 *
 *   node scripts/image.ts build [archive]          # dist/webhook → OCI archive (default dist/webhook-image.tar)
 *   node scripts/image.ts rootfs <dir>             # write the image's root filesystem into <dir>
 *   node scripts/image.ts unpack <archive> <dir>   # an OCI archive's root filesystem; prints its config
 *
 * Two ways to the same image, both from the Dockerfile. Builders with registry access run it as it
 * is: its first stage pulls node:26, runs `npm ci && npm run build` and then `scripts/image.ts
 * rootfs /rootfs`; its final stage is `FROM scratch`, that tree, and the image's settings (user,
 * port, entrypoint, default arguments). This script is the daemonless, offline equivalent for CI and
 * air-gapped build hosts, where nothing can be pulled (not even node:26): it writes the same tree
 * from this machine's dist/webhook with the same `rootfs` code, and has Debian's buildah build the
 * Dockerfile's final stage with the build stage replaced by that tree (`--build-context
 * build=<dir>`: the named context stands in for the stage, which is then never built or pulled).
 * So the settings exist only in the Dockerfile, and the two images cannot drift apart.
 *
 * buildah runs as root with its own storage under .cache/image, with the vfs driver (no overlay
 * support needed from the kernel, which nested containers and CI sandboxes often lack). The final
 * stage has no RUN, so nothing is executed inside the image and no --isolation is needed.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';

const root = path.resolve(import.meta.dirname, '..');

/** Where the executable lives in the image (the Dockerfile's ENTRYPOINT); /webhooks.sh links to it. */
export const EXECUTABLE = '/usr/local/bin/webhook';
/** The image's user (the Dockerfile's USER): not root; the number distroless images use for "nonroot". */
export const UID = 65532;
export const USER_NAME = 'webhook';

/** The name in the archive's index (org.opencontainers.image.ref.name); deploy/ uses it too. */
export const IMAGE_NAME = 'webhook:latest';
export const DEFAULT_ARCHIVE = path.join(root, 'dist', 'webhook-image.tar');
export const DOCKERFILE = path.join(root, 'Dockerfile');

// ---------------------------------------------------------------------------------------------
// The root filesystem

/**
 * The shared libraries `file` links, and its dynamic loader, as absolute paths: what `ldd` names.
 * (glibc, libstdc++, libgcc_s, libatomic and glibc's compatibility stubs libdl, libm, libpthread
 * for Node 26's official build; linux-vdso is the kernel's and has no file.)
 */
export function sharedLibraries(file: string): string[] {
  const out = execFileSync('ldd', [file], { encoding: 'utf8' });
  const libs: string[] = [];
  for (const line of out.split('\n')) {
    // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
    const m = /^\s*(?:\S+\s+=>\s+)?(\/\S+)\s+\(0x[0-9a-f]+\)\s*$/.exec(line);
    if (m) libs.push(m[1]);
    else if (/not found/.test(line)) throw new Error(`ldd ${file}: ${line.trim()}`);
  }
  if (!libs.some((l) => /\/ld-linux[^/]*\.so/.test(l))) throw new Error(`ldd ${file} named no dynamic loader:\n${out}`);
  return libs;
}

const PASSWD = `root:x:0:0:root:/root:/sbin/nologin
${USER_NAME}:x:${UID}:${UID}:${USER_NAME}:/home:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
`;
const GROUP = `root:x:0:
${USER_NAME}:x:${UID}:
nobody:x:65534:
`;
/**
 * glibc's resolver reads this for host names (SMTP server, a kubeconfig's API server); without it
 * glibc would try DNS before /etc/hosts, which the kubelet writes.
 */
const NSSWITCH = `hosts: files dns
`;
export const CA_CERTIFICATES = '/etc/ssl/certs/ca-certificates.crt';

/**
 * Writes the image's whole root filesystem into `dir` (which must not exist or be empty):
 *
 *   /usr/local/bin/webhook               the executable (not stripped: that corrupts the SEA blob)
 *   /webhooks.sh -> /usr/local/bin/webhook
 *   /lib…/…                              the libraries ldd names, at the paths ldd names them
 *   /etc/ssl/certs/ca-certificates.crt   the system CA store (Node trusts its bundled roots unless
 *                                        NODE_OPTIONS=--use-system-ca or NODE_EXTRA_CA_CERTS says so)
 *   /etc/passwd, /etc/group              root, webhook (65532), nobody
 *   /etc/nsswitch.conf
 *   /etc/webhook/source                  the default hooks directory (a ConfigMap is mounted here)
 *   /home                                the seed hook's working directory
 *   /tmp                                 1777; read-only root filesystems mount an emptyDir here
 *
 * No shell: /webhooks.sh is the executable itself, which runs the upgrade when started under
 * that name, and the runner runs it in-process anyway (it recognises its own executable).
 */
export function writeRootfs(dir: string, executable = path.join(root, 'dist', 'webhook')): void {
  fs.mkdirSync(dir, { recursive: true });
  if (fs.readdirSync(dir).length > 0) throw new Error(`${dir} is not empty`);
  const put = (file: string, mode: number, data: string | Buffer) => {
    const target = path.join(dir, file);
    fs.mkdirSync(path.dirname(target), { recursive: true, mode: 0o755 });
    fs.writeFileSync(target, data, { mode });
    fs.chmodSync(target, mode); // not narrowed by the umask
  };
  const mkdir = (d: string, mode = 0o755) => {
    const target = path.join(dir, d);
    fs.mkdirSync(target, { recursive: true, mode: 0o755 });
    fs.chmodSync(target, mode);
  };
  // Libraries are copied with their symlinks resolved, under the name the loader looks for
  // (the loader under the path the executable's PT_INTERP names).
  for (const lib of sharedLibraries(executable)) put(lib, fs.statSync(lib).mode & 0o777, fs.readFileSync(lib));
  fs.mkdirSync(path.join(dir, path.dirname(EXECUTABLE)), { recursive: true, mode: 0o755 });
  fs.copyFileSync(executable, path.join(dir, EXECUTABLE));
  fs.chmodSync(path.join(dir, EXECUTABLE), 0o755);
  fs.symlinkSync(EXECUTABLE, path.join(dir, 'webhooks.sh'));
  put(CA_CERTIFICATES, 0o644, fs.readFileSync(CA_CERTIFICATES));
  put('/etc/passwd', 0o644, PASSWD);
  put('/etc/group', 0o644, GROUP);
  put('/etc/nsswitch.conf', 0o644, NSSWITCH);
  mkdir('/etc/webhook/source');
  mkdir('/home');
  // Every directory 0755 whatever the umask was (a 077 umask would lock the user out of /lib).
  for (const e of fs.readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (e.isDirectory()) fs.chmodSync(path.join(e.parentPath, e.name), 0o755);
  }
  fs.chmodSync(dir, 0o755);
  mkdir('/tmp', 0o1777);
}

// ---------------------------------------------------------------------------------------------
// buildah

function sha256File(file: string): string {
  const hash = createHash('sha256');
  const fd = fs.openSync(file, 'r');
  try {
    const buf = Buffer.alloc(1 << 20);
    for (let n; (n = fs.readSync(fd, buf, 0, buf.length, null)) > 0;) hash.update(buf.subarray(0, n));
  } finally {
    fs.closeSync(fd);
  }
  return hash.digest('hex');
}

/** What the archive is built from: the executable, the Dockerfile, and this script (the tree). */
export function inputsKey(executable = path.join(root, 'dist', 'webhook')): string {
  return createHash('sha256')
    .update(sha256File(executable))
    .update(fs.readFileSync(DOCKERFILE))
    .update(fs.readFileSync(import.meta.filename))
    .digest('hex');
}

/** buildah with its own storage, so builds neither need nor touch the machine's image store. */
function buildah(args: string[]): string {
  const storage = path.join(root, '.cache', 'image');
  return execFileSync('buildah', ['--root', path.join(storage, 'storage'), '--runroot', path.join(storage, 'run'), '--storage-driver', 'vfs', ...args], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
    maxBuffer: 16 << 20,
  }).trim();
}

export interface BuildResult {
  archive: string;
  /** False when the archive of the same inputs was already there. */
  built: boolean;
  bytes: number;
}

/**
 * Builds the OCI archive from dist/webhook, or keeps the existing one when it was built from the
 * same executable, Dockerfile and script (the key is stored beside it in `<archive>.key`).
 */
export function buildImage(archive = DEFAULT_ARCHIVE, executable = path.join(root, 'dist', 'webhook')): BuildResult {
  if (!fs.existsSync(executable)) throw new Error(`${executable} does not exist: run \`npm run build\` first`);
  fs.mkdirSync(path.dirname(archive), { recursive: true });
  const work = fs.mkdtempSync(path.join(path.dirname(archive), '.image-'));
  let imageId: string | undefined;
  try {
    // A private copy: `npm run build` may replace dist/webhook while this runs, and the key must
    // describe exactly the bytes that go into the image.
    const snapshot = path.join(work, 'webhook');
    fs.copyFileSync(executable, snapshot);
    const key = inputsKey(snapshot);
    const keyFile = `${archive}.key`;
    if (fs.existsSync(archive) && fs.existsSync(keyFile) && fs.readFileSync(keyFile, 'utf8').trim() === key) {
      return { archive, built: false, bytes: fs.statSync(archive).size };
    }
    // What the build stage would have left behind: /rootfs, here <work>/stage/rootfs.
    const stage = path.join(work, 'stage');
    writeRootfs(path.join(stage, 'rootfs'), snapshot);
    fs.rmSync(snapshot);
    // The final stage copies only from the build stage, so the main context can be empty.
    const context = path.join(work, 'context');
    fs.mkdirSync(context);
    const iidFile = path.join(work, 'iid');
    buildah(['bud', '--file', DOCKERFILE, '--build-context', `build=${stage}`, '--layers=false', '--iidfile', iidFile, '--quiet', context]);
    imageId = fs.readFileSync(iidFile, 'utf8').trim();
    const tmp = path.join(work, 'image.tar');
    // Layers are gzip-compressed on the way out (156 MB → 53 MB).
    buildah(['push', '--quiet', '--format', 'oci', imageId, `oci-archive:${tmp}:${IMAGE_NAME}`]);
    fs.renameSync(tmp, archive);
    fs.writeFileSync(keyFile, `${key}\n`);
    return { archive, built: true, bytes: fs.statSync(archive).size };
  } finally {
    if (imageId) {
      try { buildah(['rmi', '--force', imageId]); } catch { /* best effort */ }
    }
    fs.rmSync(work, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------------------------------------
// Unpacking an OCI archive (only tar; no skopeo or umoci needed)

export interface OciImageConfig {
  architecture: string;
  os: string;
  config: { User?: string; ExposedPorts?: Record<string, object>; Env?: string[]; Entrypoint?: string[]; Cmd?: string[]; WorkingDir?: string; Labels?: Record<string, string> };
}

/**
 * Unpacks an OCI image archive's root filesystem into `dir` (index.json → manifest → layers, in
 * order) and returns the image's config. Layers may be plain or gzip tar (GNU tar detects which);
 * whiteouts are not handled: the image has one layer.
 */
export function unpackImage(archive: string, dir: string): { config: OciImageConfig; layers: number; manifestDigest: string } {
  const layout = fs.mkdtempSync(path.join(path.dirname(path.resolve(dir)), '.oci-'));
  try {
    execFileSync('tar', ['-xf', archive, '-C', layout]);
    const blob = (digest: string) => path.join(layout, 'blobs', ...digest.split(':'));
    const json = (file: string) => JSON.parse(fs.readFileSync(file, 'utf8'));
    const index = json(path.join(layout, 'index.json'));
    if (index.manifests?.length !== 1) throw new Error(`${archive}: expected one manifest in index.json, found ${index.manifests?.length}`);
    const manifestDigest: string = index.manifests[0].digest;
    const manifest = json(blob(manifestDigest));
    fs.mkdirSync(dir, { recursive: true });
    for (const layer of manifest.layers) {
      execFileSync('tar', ['-xf', blob(layer.digest), '-C', dir, '--numeric-owner', '--same-permissions', '--same-owner']);
    }
    return { config: json(blob(manifest.config.digest)), layers: manifest.layers.length, manifestDigest };
  } finally {
    fs.rmSync(layout, { recursive: true, force: true });
  }
}

/** Bytes under `dir`, files counted once, symlinks as themselves. */
export function treeBytes(dir: string): number {
  let total = 0;
  for (const entry of fs.readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (entry.isFile()) total += fs.lstatSync(path.join(entry.parentPath, entry.name)).size;
  }
  return total;
}

// ---------------------------------------------------------------------------------------------

if (import.meta.main) {
  const [command, ...args] = process.argv.slice(2);
  const mb = (n: number) => `${(n / 1e6).toFixed(1)} MB`;
  try {
    if (command === 'rootfs' && args.length === 1) {
      writeRootfs(path.resolve(args[0]));
      console.log(`wrote the image's root filesystem to ${args[0]} (${mb(treeBytes(args[0]))})`);
    } else if (command === 'build' && args.length <= 1) {
      const r = buildImage(args[0] ? path.resolve(args[0]) : DEFAULT_ARCHIVE);
      console.log(`${r.built ? 'built' : 'up to date:'} ${path.relative(process.cwd(), r.archive)} (${mb(r.bytes)}), image ${IMAGE_NAME}`);
    } else if (command === 'unpack' && args.length === 2) {
      const r = unpackImage(args[0], args[1]);
      console.log(JSON.stringify(r.config, null, 2));
    } else {
      process.stderr.write('usage: node scripts/image.ts rootfs <dir> | build [archive] | unpack <archive> <dir>\n');
      process.exitCode = 2;
    }
  } catch (e) {
    const err = e as Error & { stderr?: string };
    process.stderr.write(`${err.message}${err.stderr ? `\n${err.stderr}` : ''}\n`);
    process.exitCode = 1;
  }
}
