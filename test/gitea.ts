/*
 * A real Gitea forge as a test peer: its REST API (repositories, branch protection, pull requests)
 * and git's smart HTTP, on loopback. Built from the Go module proxy like the cluster's binaries and
 * cached beside them, keyed by version (`${XDG_CACHE_HOME:-~/.cache}/webhook-test/bin/gitea-<version>`).
 *
 * Gitea's go.mod has replace directives (and names its module gitea.dev, not the path the proxy
 * serves it under), so `go install pkg@version` cannot build it: its source is downloaded as a
 * module, copied to a writable directory and built there as the main module.
 *
 *   const gitea = await startGitea();
 *   const repo = await gitea.createRepo('app', { 'README.md': 'hello\n' });
 *   await gitea.protectBranch(repo.name, 'main');
 *   git(work, ['push', repo.pushUrl, 'HEAD:refs/heads/topic']);
 *   await gitea.close();
 *
 *   node test/gitea.ts     # builds it (about 4 minutes the first time) and prints its path
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { binPath, buildInto, GO_ENV, goBuildWithProgress } from './cluster/cluster.ts';
import { freePort, httpRequest, peerOrSkip, waitFor } from './harness.ts';

/** The newest Gitea release the module proxy serves whose go.mod (go 1.26.4) the machine's Go builds. */
export const GITEA_VERSION = 'v1.27.3';
const GITEA_MODULE = 'code.gitea.io/gitea';
/**
 * The assets the binary embeds (`bindata`), each generated from a directory of the source into
 * `bindata.dat` beside its package by that package's `go:generate` line. Without them Gitea reads
 * options/ (its locales, .gitignore and licence templates), templates/ and the migration schemas
 * from its source tree at run time, which the build directory is not kept for.
 */
const BINDATA_PACKAGES = ['./modules/options', './modules/templates', './modules/public', './modules/migration'];

/** How long a started Gitea may take to answer GET /api/v1/version (about 1 s here). */
const READY_TIMEOUT_MS = 60_000;
/** How long close() waits after SIGTERM before SIGKILL. */
const STOP_GRACE_MS = 5_000;
/** How much of Gitea's log a Gitea keeps, to quote when it fails. */
const LOG_KEEP = 64 << 10;

function log(message: string): void {
  process.stderr.write(`[gitea] ${message}\n`);
}

/** Runs a command to its end; its stdout, or an error quoting its output. */
function run(command: string, args: string[], options: { cwd?: string; env?: Record<string, string> } = {}): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(command, args, { cwd: options.cwd, env: { ...process.env, ...options.env }, maxBuffer: 64 << 20 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`${command} ${args.join(' ')} failed: ${`${stderr}\n${stdout}`.trim() || error.message}`));
      else resolve(stdout);
    });
  });
}

// ---------------------------------------------------------------------------------------------
// Building

/** Gitea's source at `version`, copied from the module cache (read-only there) into `dir`. */
async function giteaSource(version: string, dir: string): Promise<void> {
  const downloaded = JSON.parse(await run('go', ['mod', 'download', '-json', `${GITEA_MODULE}@${version}`], { cwd: tmpdir(), env: GO_ENV })) as { Dir: string };
  await run('cp', ['-R', downloaded.Dir, dir]);
  await run('chmod', ['-R', 'u+w', dir]);
}

let built: Promise<string> | undefined;

/** The path of the gitea binary, built on first use. */
export function ensureGitea(): Promise<string> {
  built ??= buildInto(['gitea'], GITEA_VERSION, async (outDir) => {
    const src = join(outDir, 'src');
    log(`downloading the source of Gitea ${GITEA_VERSION} and generating its embedded assets`);
    await giteaSource(GITEA_VERSION, src);
    await run('go', ['generate', '-tags', 'bindata', ...BINDATA_PACKAGES], { cwd: src, env: GO_ENV });
    // Measured on 2 shared cores with nothing cached (no modules, no build cache): 4 min 11 s in all,
    // 48 s of it downloading the modules and generating the assets; the largest compiler process
    // (the link) peaked at 1.5 GB. No tag picks the SQLite driver: since 1.27 Gitea's default is
    // modernc.org/sqlite, pure Go (mattn's cgo driver needs `sqlite_mattn`).
    await goBuildWithProgress(`Gitea ${GITEA_VERSION}`, '4 minutes', {
      args: [
        'build', '-v', '-trimpath', '-tags', 'bindata',
        // Stamped as Gitea's Makefile does a release: the version the API's /version answers.
        '-ldflags', `-s -w -X main.Version=${GITEA_VERSION.slice(1)} -X main.Tags=bindata`,
        '-o', join(outDir, 'gitea'), '.',
      ],
      cwd: src,
      env: GO_ENV,
      packages: ['-tags', 'bindata', '.'],
    });
  }).then(() => binPath('gitea', GITEA_VERSION));
  built.catch(() => (built = undefined));
  return built;
}

/**
 * Gitea's binary, or undefined locally (with a loud message) when it cannot be built; in CI the
 * failure fails the tests that need it.
 */
export function giteaOrSkip(): Promise<string | undefined> {
  return peerOrSkip(ensureGitea, 'gitea', 'forge tests');
}

// ---------------------------------------------------------------------------------------------
// Running

export interface ApiResult {
  status: number;
  /** The answer's body parsed as JSON, or its text when it is not JSON (undefined when empty). */
  json: any;
}

export interface GiteaRepo {
  /** The repository's name; its owner is the Gitea's user. */
  name: string;
  /** `<user>/<name>` */
  fullName: string;
  /** Its clone URL over smart HTTP, without credentials. */
  cloneUrl: string;
  /** The clone URL with `user:token` in it, for git to fetch and push with. */
  pushUrl: string;
}

export interface Gitea {
  /** http://127.0.0.1:<port> */
  base: string;
  /** The site administrator the API calls and pushes act as. */
  user: string;
  password: string;
  /** An API token of `user` with every scope; also git's password over smart HTTP. */
  token: string;
  /** Gitea's log so far (its last 64 KiB). */
  log(): string;
  /** A call to `/api/v1<path>` with the token; `body` is sent as JSON. */
  api(method: string, path: string, body?: unknown): Promise<ApiResult>;
  /** A repository of `user` whose default branch, main, holds `files` in one commit. */
  createRepo(name: string, files: Record<string, string>): Promise<GiteaRepo>;
  /** Protects `branch` of `repo` so that no one may push to it: changes come by pull request. */
  protectBranch(repo: string, branch: string): Promise<void>;
  /** Opens a pull request of `head` into `base`; its number. */
  openPull(repo: string, pull: { head: string; base: string; title: string; body?: string }): Promise<number>;
  /** Merges pull request `index` with a merge commit. */
  mergePull(repo: string, index: number): Promise<void>;
  /** The text of `path` on `ref` of `repo`. */
  fileAt(repo: string, ref: string, path: string): Promise<string>;
  /** Stops Gitea and removes its directory. */
  close(): Promise<void>;
}

/** A fixed secret: the forge lives for one test process on loopback and holds nothing of value. */
const SECRET_KEY = 'webhook-test-gitea-secret-key-0123456789';
const INTERNAL_TOKEN = 'webhook-test-gitea-internal-token-0123456789abcdef';

/** The configuration of a Gitea whose every file is under `dir`, listening on 127.0.0.1:`port`. */
function appIni(dir: string, port: number): string {
  return `APP_NAME = webhook-test
RUN_MODE = prod
WORK_PATH = ${dir}
; The tests run as root, which Gitea refuses unless told (a key of the root section, or
; GITEA_I_AM_BEING_UNSAFE_RUNNING_AS_ROOT=true) and unless RUN_USER is the user it runs as.
I_AM_BEING_UNSAFE_RUNNING_AS_ROOT = true
RUN_USER = root

[server]
PROTOCOL = http
HTTP_ADDR = 127.0.0.1
HTTP_PORT = ${port}
ROOT_URL = http://127.0.0.1:${port}/
DISABLE_SSH = true
START_SSH_SERVER = false
LFS_START_SERVER = false
; No CDN, no Gravatar: nothing leaves the machine.
OFFLINE_MODE = true

[database]
DB_TYPE = sqlite3
PATH = ${dir}/gitea.db

[repository]
ROOT = ${dir}/repositories
DEFAULT_BRANCH = main

[security]
INSTALL_LOCK = true
SECRET_KEY = ${SECRET_KEY}
INTERNAL_TOKEN = ${INTERNAL_TOKEN}

[service]
DISABLE_REGISTRATION = true

[mailer]
ENABLED = false

; Without it Gitea generates a JWT secret and writes it back into this file.
[oauth2]
ENABLED = false

[actions]
ENABLED = false

[indexer]
ISSUE_INDEXER_TYPE = db

; On by default, and it asks Gitea's site for the newest release.
[cron.update_checker]
ENABLED = false

[log]
MODE = console
LEVEL = warn
`;
}

/** Starts `binary` web; resolves once it answers GET /api/v1/version, rejects (quoting its log) if it exits first. */
async function startWeb(binary: string, dir: string, ini: string, port: number): Promise<{ proc: ChildProcess; log: () => string }> {
  const proc = spawn(binary, ['web', '-c', ini], { cwd: dir, env: { ...process.env, HOME: dir }, stdio: ['ignore', 'pipe', 'pipe'] });
  let text = '';
  const keep = (chunk: string) => (text = (text + chunk).slice(-LOG_KEEP));
  proc.stdout!.setEncoding('utf8').on('data', keep);
  proc.stderr!.setEncoding('utf8').on('data', keep);
  let exited: string | undefined;
  proc.on('exit', (code, signal) => (exited = signal ?? `exit ${code}`));
  try {
    await waitFor(
      async () => {
        if (exited) throw new Error(`gitea web ended (${exited}) before it answered:\n${text}`);
        const res = await httpRequest(port, '/api/v1/version').catch(() => undefined);
        return res?.status === 200;
      },
      { timeoutMs: READY_TIMEOUT_MS, what: `gitea on port ${port}` },
    );
  } catch (e) {
    proc.kill('SIGKILL');
    throw new Error(`${(e as Error).message}\n${exited ? '' : text}`);
  }
  return { proc, log: () => text };
}

/** Ends `proc`: SIGTERM, SIGKILL after a grace; resolves once it has exited and its pipes closed. */
function stop(proc: ChildProcess): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => proc.kill('SIGKILL'), STOP_GRACE_MS);
    proc.on('close', () => {
      clearTimeout(timer);
      resolve();
    });
    proc.kill('SIGTERM');
  });
}

/** `body` parsed as JSON, or its text when it is not JSON. */
function parse(body: string): unknown {
  if (body === '') return undefined;
  try {
    return JSON.parse(body);
  } catch {
    return body;
  }
}

/** Throws, quoting the answer, unless `result` has one of the `expected` statuses. */
function expect(what: string, result: ApiResult, ...expected: number[]): ApiResult {
  if (!expected.includes(result.status)) throw new Error(`${what}: HTTP ${result.status} ${JSON.stringify(result.json)}`);
  return result;
}

/**
 * A fresh Gitea in a temporary directory on a free loopback port, with a site administrator and an
 * API token of theirs with every scope.
 */
export async function startGitea(): Promise<Gitea> {
  const binary = await ensureGitea();
  const dir = await mkdtemp(join(tmpdir(), 'gitea-test-'));
  const ini = join(dir, 'app.ini');
  try {
    const port = await freePort();
    await writeFile(ini, appIni(dir, port));
    const web = await startWeb(binary, dir, ini, port);
    const close = async () => {
      await stop(web.proc);
      await rm(dir, { recursive: true, force: true });
    };
    try {
      return await withUser(binary, dir, ini, port, web.log, close);
    } catch (e) {
      await close();
      throw new Error(`${(e as Error).message}\n${web.log()}`);
    }
  } catch (e) {
    await rm(dir, { recursive: true, force: true });
    throw e;
  }
}

/** The administrator (created with `gitea admin user create`, as Gitea's docs do it), a token, and the helpers. */
async function withUser(binary: string, dir: string, ini: string, port: number, giteaLog: () => string, close: () => Promise<void>): Promise<Gitea> {
  const user = 'webhook-admin';
  const password = 'webhook-test-password-1';
  await run(binary, ['admin', 'user', 'create', '--admin', '--username', user, '--password', password, '--email', `${user}@example.com`, '--must-change-password=false', '-c', ini], {
    cwd: dir,
    env: { HOME: dir },
  });
  const base = `http://127.0.0.1:${port}`;
  const call = async (method: string, path: string, authorization: string, body?: unknown): Promise<ApiResult> => {
    const headers: Record<string, string> = { Authorization: authorization, Accept: 'application/json' };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const res = await httpRequest(port, `/api/v1${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    return { status: res.status, json: parse(res.body) };
  };
  // Tokens are made with the password (basic auth); `all` is every scope, read and write.
  const basic = `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;
  const made = expect('creating the API token', await call('POST', `/users/${user}/tokens`, basic, { name: 'webhook-test', scopes: ['all'] }), 201);
  const token = made.json.sha1 as string;
  const api = (method: string, path: string, body?: unknown) => call(method, path, `token ${token}`, body);
  const repoPath = (repo: string) => `/repos/${user}/${repo}`;

  return {
    base,
    user,
    password,
    token,
    log: giteaLog,
    api,
    close,
    async createRepo(name, files) {
      expect(`creating repository ${name}`, await api('POST', '/user/repos', { name, default_branch: 'main', auto_init: false, private: false }), 201);
      // One commit of every file, through the contents API, which also makes main of the empty repository.
      const changes = Object.entries(files).map(([path, text]) => ({ operation: 'create', path, content: Buffer.from(text).toString('base64') }));
      expect(`adding files to ${name}`, await api('POST', `${repoPath(name)}/contents`, { branch: 'main', message: 'initial files', files: changes }), 201);
      const cloneUrl = `${base}/${user}/${name}.git`;
      return { name, fullName: `${user}/${name}`, cloneUrl, pushUrl: cloneUrl.replace('://', `://${user}:${token}@`) };
    },
    async protectBranch(repo, branch) {
      // rule_name is the branch (or a glob); enable_push false refuses every push, the administrator's too.
      expect(`protecting ${branch} of ${repo}`, await api('POST', `${repoPath(repo)}/branch_protections`, { rule_name: branch, enable_push: false }), 201);
    },
    async openPull(repo, pull) {
      return expect(`opening a pull request on ${repo}`, await api('POST', `${repoPath(repo)}/pulls`, pull), 201).json.number as number;
    },
    async mergePull(repo, index) {
      const pull = `${repoPath(repo)}/pulls/${index}`;
      // Gitea checks a request for conflicts in the background after each push to its branch, and answers a merge
      // with 405 "Please try again later" until that check is done: merged once checked at the branch's head.
      const head = await waitFor(async () => {
        const p = (await api('GET', pull)).json;
        const branch = (await api('GET', `${repoPath(repo)}/branches/${p.head.ref}`)).json;
        return p.mergeable === true && p.head.sha === branch.commit?.id ? String(p.head.sha) : undefined;
      }, { timeoutMs: 60_000, what: `pull request ${index} of ${repo} checked as mergeable at its branch's head` });
      // A check queued again meanwhile (the request's update runs one too) is the same 405: asked again once it is done.
      await waitFor(async () => {
        const merged = await api('POST', `${pull}/merge`, { Do: 'merge', head_commit_id: head });
        if (merged.status === 405 && /try again later/i.test(JSON.stringify(merged.json))) return false;
        return expect(`merging pull request ${index} of ${repo}`, merged, 200) !== undefined;
      }, { timeoutMs: 60_000, what: `pull request ${index} of ${repo} merged` });
    },
    async fileAt(repo, ref, path) {
      const got = expect(`reading ${path} on ${ref} of ${repo}`, await api('GET', `${repoPath(repo)}/contents/${path}?ref=${encodeURIComponent(ref)}`), 200);
      return Buffer.from(got.json.content as string, 'base64').toString('utf8');
    },
  };
}

if (import.meta.main) process.stdout.write(`${await ensureGitea()}\n`);
