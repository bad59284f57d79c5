/*
 * The peer: the real adnanh/webhook, built on demand, so that the compatibility tests can prove they
 * encode its real behaviour (`WEBHOOK_BIN=$(…adnanhBinary…) PEER=adnanh node --test test/compat.test.ts`).
 *
 * Where the binary comes from, in order:
 *   1. `$ADNANH_WEBHOOK_BIN`, when set (an operator's own build).
 *   2. The Go module proxy: `go install github.com/adnanh/webhook@latest`. adnanh's tags lack the
 *      `v` prefix, so `@latest` resolves to a pseudo-version; it keys the cache. The proxy may
 *      refuse the module outright (it answers 403 on this workplace), so this is only a first try.
 *   3. Debian's source package `webhook` (2.8.0 in bookworm and trixie): its upstream tarball is
 *      adnanh's pristine release with every dependency vendored, so `go build -mod=vendor` needs no
 *      network. The deb-src entry is derived from the machine's own apt sources (no host named here).
 *      The tree is kept (`adnanh-<version>/source`, see adnanhSource()): it also holds adnanh's own
 *      test suite, which test/adnanh-suite.test.ts runs against our executable.
 *   4. Debian's binary package `webhook` (`apt-get download` + `dpkg-deb -x`) as a last resort.
 *
 * Everything lands in `~/.cache/webhook-test/adnanh-<version>/webhook`, outside the clone, written
 * to a temporary name first and renamed, so concurrent callers never see half a binary.
 */

import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export const ADNANH_MODULE = 'github.com/adnanh/webhook';
/** The Debian package name and the version its source package carries. */
const DEBIAN_PACKAGE = 'webhook';

/**
 * The test cache the cluster's binaries share (test/cluster/cluster.ts): `${XDG_CACHE_HOME:-~/.cache}/webhook-test`,
 * or WEBHOOK_TEST_CACHE; one directory, so that emptying it makes a run cold.
 */
export function peerCacheRoot(): string {
  const xdg = process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache');
  return process.env.WEBHOOK_TEST_CACHE ?? path.join(xdg, 'webhook-test');
}

function cacheDir(version: string): string {
  return path.join(peerCacheRoot(), `adnanh-${version.replace(/[^A-Za-z0-9._+-]/g, '_')}`);
}

function isExecutable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return fs.statSync(file).isFile();
  } catch {
    return false;
  }
}

/** Go builds need no toolchain download and must not pick up a surrounding module. */
function goEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  return { ...process.env, GOTOOLCHAIN: 'local', GO111MODULE: 'on', GOFLAGS: '-buildvcs=false', ...extra };
}

/** Moves a freshly built binary into place atomically and returns its final path. */
async function install(built: string, version: string): Promise<string> {
  const dir = cacheDir(version);
  await fsp.mkdir(dir, { recursive: true });
  const final = path.join(dir, 'webhook');
  const tmp = `${final}.tmp-${process.pid}`;
  await fsp.copyFile(built, tmp);
  await fsp.chmod(tmp, 0o755);
  await fsp.rename(tmp, final);
  return final;
}

async function fromGoProxy(): Promise<string | undefined> {
  let version: string;
  try {
    const { stdout } = await run('go', ['list', '-m', '-json', `${ADNANH_MODULE}@latest`], {
      env: goEnv(),
      cwd: os.tmpdir(),
      timeout: 120_000,
    });
    version = JSON.parse(stdout).Version;
  } catch {
    return undefined; // the proxy refused the module or is unreachable: try the next source
  }
  const cached = path.join(cacheDir(version), 'webhook');
  if (isExecutable(cached)) return cached;
  const gobin = await fsp.mkdtemp(path.join(os.tmpdir(), 'adnanh-gobin-'));
  try {
    await run('go', ['install', `${ADNANH_MODULE}@${version}`], {
      env: goEnv({ GOBIN: gobin, CGO_ENABLED: '0' }),
      cwd: os.tmpdir(),
      timeout: 900_000,
    });
    return await install(path.join(gobin, 'webhook'), version);
  } catch {
    return undefined;
  } finally {
    await fsp.rm(gobin, { recursive: true, force: true });
  }
}

/**
 * One `deb-src` line per Debian archive the machine already uses (deb822 `.sources` files and the
 * one-line `sources.list`), for the private apt state used to fetch the source package.
 */
function debSrcLines(): string[] {
  const lines: string[] = [];
  const listFiles = ['/etc/apt/sources.list'];
  try {
    for (const f of fs.readdirSync('/etc/apt/sources.list.d')) listFiles.push(path.join('/etc/apt/sources.list.d', f));
  } catch {
    /* no directory: only sources.list */
  }
  for (const file of listFiles) {
    let text: string;
    try {
      text = fs.readFileSync(file, 'utf8');
    } catch {
      continue;
    }
    if (file.endsWith('.sources')) {
      for (const stanza of text.split(/\n\s*\n/)) {
        const field = (name: string) => stanza.match(new RegExp(`^${name}:\\s*(.+)$`, 'mi'))?.[1].trim() ?? '';
        if (!/\bdeb\b/.test(field('Types')) || !/debian-archive-keyring/.test(field('Signed-By'))) continue;
        if (/^no$/i.test(field('Enabled'))) continue;
        const signedBy = field('Signed-By');
        for (const uri of field('URIs').split(/\s+/).filter(Boolean)) {
          for (const suite of field('Suites').split(/\s+/).filter(Boolean)) {
            if (/-(security|updates|backports)$/.test(suite) || /security/.test(uri)) continue;
            lines.push(`deb-src [signed-by=${signedBy}] ${uri} ${suite} main`);
          }
        }
      }
    } else if (file.endsWith('.list')) {
      for (const line of text.split('\n')) {
        const m = line.match(/^\s*deb\s+(\[[^\]]*\]\s+)?(\S+)\s+(\S+)\s+.*\bmain\b/);
        if (!m || /security/.test(m[2]) || /-(security|updates|backports)$/.test(m[3])) continue;
        lines.push(`deb-src ${m[1] ?? ''}${m[2]} ${m[3]} main`);
      }
    }
  }
  return [...new Set(lines)];
}

/** apt-get/apt-cache options that keep every piece of state under `root`, away from the system's. */
function privateApt(root: string, sourcesList: string): string[] {
  return [
    '-o', `Dir::Etc::sourcelist=${sourcesList}`,
    '-o', 'Dir::Etc::sourceparts=-',
    '-o', `Dir::State::Lists=${path.join(root, 'lists')}`,
    '-o', `Dir::Cache=${path.join(root, 'cache')}`,
    '-o', 'APT::Sandbox::User=root',
    '-o', 'Debug::NoLocking=1',
  ];
}

/**
 * Downloads Debian's upstream tarball of `webhook` into `work`, through a private apt state there.
 * Returns its file name, or undefined when the machine has no Debian archive or the download failed.
 */
async function downloadDebianOrig(work: string): Promise<string | undefined> {
  const lines = debSrcLines();
  if (lines.length === 0) return undefined;
  const sourcesList = path.join(work, 'sources.list');
  await fsp.writeFile(sourcesList, lines.join('\n') + '\n');
  await fsp.mkdir(path.join(work, 'lists', 'partial'), { recursive: true });
  await fsp.mkdir(path.join(work, 'cache', 'archives', 'partial'), { recursive: true });
  const apt = privateApt(work, sourcesList);
  await run('apt-get', [...apt, '-qq', 'update'], { timeout: 300_000 }).catch(() => undefined);
  // The Debian packaging tarball may be missing from the mirror; only the upstream tarball matters.
  await run('apt-get', [...apt, '-qq', 'source', '--download-only', DEBIAN_PACKAGE], {
    cwd: work,
    timeout: 300_000,
  }).catch(() => undefined);
  return (await fsp.readdir(work)).find((f) => /^webhook_[\d.]+\.orig\.tar\.(gz|xz)$/.test(f));
}

/** The `version` constant of adnanh's webhook.go in a source tree (`2.8.0`), or undefined. */
function sourceVersion(dir: string): string | undefined {
  try {
    return fs.readFileSync(path.join(dir, 'webhook.go'), 'utf8').match(/^\s*version\s*=\s*"([^"]+)"/m)?.[1];
  } catch {
    return undefined;
  }
}

export interface SourceTree {
  /** The unpacked tree (go.mod, webhook.go, webhook_test.go, test/, vendor/). */
  dir: string;
  /** adnanh's version as its webhook.go states it, e.g. `2.8.0`. */
  version: string;
}

/** Unpacks Debian's upstream tarball once into `adnanh-<version>/source` in the cache. */
async function debianSourceTree(): Promise<SourceTree | undefined> {
  const work = await fsp.mkdtemp(path.join(os.tmpdir(), 'adnanh-debsrc-'));
  try {
    const orig = await downloadDebianOrig(work);
    if (!orig) return undefined;
    const version = orig.match(/^webhook_([\d.]+)\.orig/)![1];
    const final = path.join(cacheDir(version), 'source');
    if (sourceVersion(final)) return { dir: final, version };
    await run('tar', ['-xf', orig], { cwd: work });
    await fsp.mkdir(cacheDir(version), { recursive: true });
    // Unpacked beside its final place and renamed, so concurrent callers never see half a tree.
    const tmp = `${final}.tmp-${process.pid}`;
    await fsp.rm(tmp, { recursive: true, force: true });
    await fsp.cp(path.join(work, `webhook-${version}`), tmp, { recursive: true });
    try {
      await fsp.rename(tmp, final);
    } catch (e) {
      await fsp.rm(tmp, { recursive: true, force: true });
      if (!sourceVersion(final)) throw e; // not a concurrent caller that won the race
    }
    return { dir: final, version };
  } catch {
    return undefined;
  } finally {
    await fsp.rm(work, { recursive: true, force: true });
  }
}

let pendingSource: Promise<SourceTree> | undefined;

/**
 * adnanh/webhook's pristine source tree, with its own tests (`webhook_test.go`, `test/`) and every
 * dependency vendored: `$ADNANH_WEBHOOK_SRC` when set (an unpacked tree), else Debian's upstream
 * tarball, unpacked once into `~/.cache/webhook-test/adnanh-<version>/source`. Treat it as
 * read-only. Throws when no source can provide it.
 */
export function adnanhSource(): Promise<SourceTree> {
  pendingSource ??= (async () => {
    const override = process.env.ADNANH_WEBHOOK_SRC;
    if (override) {
      const version = sourceVersion(override);
      if (!version) throw new Error(`ADNANH_WEBHOOK_SRC=${override} is not an adnanh/webhook source tree (no webhook.go version)`);
      return { dir: path.resolve(override), version };
    }
    // Whatever was unpacked once is reused without asking the archive again.
    const sticky = path.join(peerCacheRoot(), 'adnanh-source-resolved');
    try {
      const previous = fs.readFileSync(sticky, 'utf8').trim();
      const version = sourceVersion(previous);
      if (version) return { dir: previous, version };
    } catch {
      /* first run */
    }
    const tree = await debianSourceTree();
    if (!tree) {
      throw new Error(
        "could not obtain adnanh/webhook's source: Debian's source package could not be fetched; " +
          'set ADNANH_WEBHOOK_SRC to an unpacked source tree (with vendor/)',
      );
    }
    await fsp.writeFile(sticky, tree.dir + '\n');
    return tree;
  })();
  return pendingSource;
}

async function fromDebianSource(): Promise<string | undefined> {
  let tree: SourceTree;
  try {
    tree = await adnanhSource();
  } catch {
    return undefined;
  }
  const cached = path.join(cacheDir(tree.version), 'webhook');
  if (isExecutable(cached)) return cached;
  const work = await fsp.mkdtemp(path.join(os.tmpdir(), 'adnanh-debsrc-'));
  try {
    await run('go', ['build', '-mod=vendor', '-trimpath', '-o', path.join(work, 'webhook.bin'), '.'], {
      cwd: tree.dir,
      env: goEnv({ CGO_ENABLED: '0', GOFLAGS: '-buildvcs=false -mod=vendor', GOPROXY: 'off' }),
      timeout: 900_000,
    });
    return await install(path.join(work, 'webhook.bin'), tree.version);
  } catch {
    return undefined;
  } finally {
    await fsp.rm(work, { recursive: true, force: true });
  }
}

async function fromDebianBinary(): Promise<string | undefined> {
  const work = await fsp.mkdtemp(path.join(os.tmpdir(), 'adnanh-debbin-'));
  try {
    await run('apt-get', ['-qq', '-o', 'APT::Sandbox::User=root', 'download', DEBIAN_PACKAGE], { cwd: work, timeout: 300_000 });
    const deb = (await fsp.readdir(work)).find((f) => f.endsWith('.deb'));
    if (!deb) return undefined;
    const version = `deb-${deb.split('_')[1]}`;
    await run('dpkg-deb', ['-x', deb, 'root'], { cwd: work });
    return await install(path.join(work, 'root', 'usr', 'bin', 'webhook'), version);
  } catch {
    return undefined;
  } finally {
    await fsp.rm(work, { recursive: true, force: true });
  }
}

let pending: Promise<string> | undefined;

/**
 * Path of a real adnanh/webhook executable, built on first use and cached outside the clone.
 * Throws when no source can provide it.
 */
export function adnanhBinary(): Promise<string> {
  pending ??= (async () => {
    const override = process.env.ADNANH_WEBHOOK_BIN;
    if (override) {
      if (!isExecutable(override)) throw new Error(`ADNANH_WEBHOOK_BIN=${override} is not an executable file`);
      return override;
    }
    // Whatever was resolved once is reused without asking any registry again.
    const sticky = path.join(peerCacheRoot(), 'adnanh-resolved');
    try {
      const previous = fs.readFileSync(sticky, 'utf8').trim();
      if (isExecutable(previous)) return previous;
    } catch {
      /* first run */
    }
    for (const source of [fromGoProxy, fromDebianSource, fromDebianBinary]) {
      const bin = await source();
      if (bin) {
        await fsp.mkdir(peerCacheRoot(), { recursive: true });
        await fsp.writeFile(sticky, bin + '\n');
        return bin;
      }
    }
    throw new Error(
      'could not obtain adnanh/webhook: the Go module proxy refused it and Debian\'s package could not be fetched; ' +
        'set ADNANH_WEBHOOK_BIN to a built binary',
    );
  })();
  return pending;
}

/** `webhook version 2.8.0` → `2.8.0`. */
export async function binaryVersion(bin: string): Promise<string> {
  const { stdout } = await run(bin, ['-version'], { timeout: 10_000 });
  return stdout.trim().replace(/^webhook version\s+/, '');
}

// `node test/peer.ts` prints the path (and builds it first if needed): handy in shell scripts.
if (import.meta.url === `file://${process.argv[1]}`) {
  const started = Date.now();
  const bin = await adnanhBinary();
  process.stderr.write(`adnanh/webhook ${await binaryVersion(bin)} ready in ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
  process.stdout.write(bin + '\n');
}
