// A real MTA for the mail tests: Debian's exim4, started on loopback in a private temp directory.
//
// What it gives a test (see `Mta`): a STARTTLS port (plain SMTP until STARTTLS), an implicit-TLS
// port, AUTH PLAIN / LOGIN / CRAM-MD5 for one fixed user (offered only after TLS), a CA that signed
// the server certificate (SAN DNS:localhost, IP:127.0.0.1), a second unrelated CA, a Maildir the
// test reads delivered messages from, and two recipients that get a 451 and a 550. Options narrow
// the AUTH mechanisms offered, take STARTTLS away, or delay the greeting. Also two stand-ins for
// broken servers: one that accepts and never answers (or only greets), and a port nothing listens on.
//
// exim is a real external program, never a mock (DESIGN.md). When it is missing it is installed
// with apt-get; when that or the start fails, startMta throws: in CI the mail tests must fail,
// never skip.
//
// Pitfalls this file handles:
// - exim refuses a configuration file (-C) that is not owned by root or is writable by others;
//   it is written by root with mode 0644.
// - The daemon runs as root only to bind ports; reception and delivery run as Debian-exim, so the
//   spool, the log directory, the Maildir and the TLS key must belong to that user, and the temp
//   directory (mkdtemp makes it 0700) must be traversable (0755).
// - Debian's exim never delivers as root (never_users = root is compiled in), and a process that
//   exim re-executes with -C as Debian-exim drops privilege ("exim user lost privilege for using
//   -C option" in the log), so delivery cannot switch users: the transport runs as Debian-exim.
// - exim writes Maildir files with LF line endings (its spool format), not the CRLF of the wire.
// - A private spool_directory, log_file_path and pid_file_path keep concurrent runs apart; the
//   default ones belong to the system exim.
// - exim cannot listen on port 0, so free ports are found first by binding port 0 and releasing
//   it; a lost race ("Address already in use") is retried with fresh ports.
// - host_lookup and rfc1413_hosts are emptied: reverse DNS and ident lookups on 127.0.0.1 can
//   stall each connection on a machine without a resolver.

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { readdir, readFile, rm, stat, unlink } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { aptInstall } from './harness.ts';

export interface MtaOptions {
  /** SMTP user name; by default an address, so it can double as the sender. */
  user?: string;
  /** Must not contain `$`, `\`, `{` or `}`: it is written into exim's expansion strings. */
  password?: string;
  /** Which AUTH mechanisms exim offers; all three by default. */
  authMechanisms?: readonly AuthMechanism[];
  /**
   * false: a server without TLS on its STARTTLS port, which then offers AUTH in the clear (to test
   * the client's refusal to send a password unencrypted, and the operator's override).
   */
  offerStartTls?: boolean;
  /**
   * Whole seconds exim waits before its greeting on the STARTTLS port (a connect ACL `delay`, as
   * servers that look up or throttle clients first behave). Input sent before the greeting makes exim
   * answer "554 SMTP synchronization error" and hang up.
   */
  greetingDelaySeconds?: number;
  /** How long to wait for the daemon's first greeting. */
  startTimeoutMs?: number;
}

export type AuthMechanism = 'PLAIN' | 'LOGIN' | 'CRAM-MD5';

export interface Mta {
  host: string;
  starttlsPort: number;
  tlsPort: number;
  user: string;
  password: string;
  /** The CA that signed the server certificate. */
  caPem: string;
  /** A CA that signed nothing the server presents. */
  otherCaPem: string;
  /** The Maildir exim delivers into (messages land in `new/`). */
  maildir: string;
  /** exim's main log: tells which authenticator accepted a message (A=plain_server:…). */
  mainLog: string;
  /** RCPT TO this address gets a 451 (try again later). */
  deferredRecipient: string;
  /** RCPT TO this address gets a 550. */
  rejectedRecipient: string;
  /** Raw delivered messages (one per recipient), oldest first. */
  messages(): Promise<string[]>;
  /** Resolves with the messages once at least `n` are delivered; throws after `timeoutMs`. */
  waitForMessages(n: number, timeoutMs?: number): Promise<string[]>;
  /** Removes delivered messages, so the next test counts from zero. */
  clear(): Promise<void>;
  stop(): Promise<void>;
}

const DEFAULT_USER = 'webhook@sender.test';
// Contains characters that need care in AUTH PLAIN and in shells, but none exim's expander treats
// specially.
const DEFAULT_PASSWORD = 'Pw-7!q%z:Ä&x"y';
// A cold exim start (GnuTLS initialisation, spool creation) takes well under a second here; 15 s
// leaves room for a loaded CI machine.
const START_TIMEOUT_MS = 15_000;
const EXIM_USER = 'Debian-exim';
const DEFERRED_LOCAL_PART = 'tempfail';
const REJECTED_LOCAL_PART = 'reject';
// Three tries at fresh ports: losing the bind race twice in a row would point at something else.
const PORT_ATTEMPTS = 3;

export async function startMta(opts: MtaOptions = {}): Promise<Mta> {
  const user = opts.user ?? DEFAULT_USER;
  const password = opts.password ?? DEFAULT_PASSWORD;
  if (/[$\\{}\r\n]/.test(user + password)) {
    throw new Error('startMta: user and password must not contain $, \\, {, } or line breaks');
  }
  if (process.getuid?.() !== 0) {
    throw new Error('startMta: must run as root (exim binds as root and delivers as Debian-exim)');
  }
  const exim = ensureExim();
  const owner = eximOwner();

  const dir = mkdtempSync(join(tmpdir(), 'webhook-mta-'));
  try {
    chmodSync(dir, 0o755);
    const certs = makeCertificates(dir);
    for (const sub of ['spool', 'log', 'Maildir']) {
      mkdirSync(join(dir, sub));
      chownSync(join(dir, sub), owner.uid, owner.gid);
    }
    chownSync(certs.keyFile, owner.uid, owner.gid);

    let lastFailure = '';
    for (let attempt = 0; attempt < PORT_ATTEMPTS; attempt++) {
      const [starttlsPort, tlsPort] = await freePortPair();
      const confFile = join(dir, 'exim.conf');
      const config = eximConfig({
        dir, starttlsPort, tlsPort, user, password, ...certs,
        authMechanisms: opts.authMechanisms ?? ['PLAIN', 'LOGIN', 'CRAM-MD5'],
        offerStartTls: opts.offerStartTls ?? true,
        greetingDelaySeconds: opts.greetingDelaySeconds ?? 0,
      });
      writeFileSync(confFile, config);
      // Explicitly, whatever the umask: exim refuses a group- or world-writable configuration.
      chmodSync(confFile, 0o644);

      const child = spawn(exim, ['-C', confFile, '-bdf'], { stdio: ['ignore', 'pipe', 'pipe'] });
      let output = '';
      child.stdout.on('data', (chunk) => (output += chunk));
      child.stderr.on('data', (chunk) => (output += chunk));
      // A test process that dies without calling stop() must not leave a daemon or its files behind.
      const cleanUpOnExit = () => {
        child.kill('SIGKILL');
        rmSync(dir, { recursive: true, force: true });
      };
      process.once('exit', cleanUpOnExit);

      const greetingDelayMs = (opts.greetingDelaySeconds ?? 0) * 1000;
      const startTimeoutMs = (opts.startTimeoutMs ?? START_TIMEOUT_MS) + greetingDelayMs;
      const started = await waitForGreeting(child, starttlsPort, startTimeoutMs, greetingDelayMs);
      if (started === true) {
        return makeMta({ dir, child, cleanUpOnExit, starttlsPort, tlsPort, user, password, caPem: certs.caPem, otherCaPem: certs.otherCaPem });
      }
      await stopChild(child);
      process.removeListener('exit', cleanUpOnExit);
      lastFailure = `${started}\n${output}${readLogs(dir)}`;
      if (!/address already in use/i.test(lastFailure)) break;
    }
    throw new Error(`startMta: exim did not start: ${lastFailure.trim()}`);
  } catch (error) {
    await rm(dir, { recursive: true, force: true });
    throw error;
  }
}

export interface StubServer {
  port: number;
  /** Resolves when the first connection is accepted. */
  connected: Promise<void>;
  /** Resolves when a client first sends anything (a command, a TLS hello), on any connection. */
  heard: Promise<void>;
  close(): Promise<void>;
}

/**
 * The MAIL_* variables of a service that mails through `mta` (by default on its STARTTLS port),
 * logged in as its user and trusting its CA, base64-encoded as the old image took them.
 */
export function serviceMailEnv(mta: Mta, port = mta.starttlsPort): Record<string, string> {
  const b64 = (text: string) => Buffer.from(text, 'utf8').toString('base64');
  return {
    MAIL_SMTP_SERVER: b64('localhost'), MAIL_SMTP_PORT: String(port), MAIL_FROM: b64(mta.user), MAIL_PASSWORD: b64(mta.password),
    MAIL_CACERT: b64(mta.caPem),
  };
}

/** Subject (RFC 2047 B-words decoded) and base64 body of a delivered message. */
export function readMail(raw: string): { subject: string; to: string; body: string } {
  const [head, body] = raw.replace(/\r\n/g, '\n').split('\n\n');
  const subject = /^Subject: (.*(?:\n[ \t].*)*)/m.exec(head)![1].replace(/\n[ \t]/g, '')
    .replace(/=\?UTF-8\?B\?([^?]*)\?=/g, (_, b: string) => Buffer.from(b, 'base64').toString('utf8'));
  const to = /^To: (.*)$/m.exec(head)?.[1] ?? '';
  return { subject, to, body: Buffer.from(body.replace(/\s+/g, ''), 'base64').toString('utf8') };
}


/** A TCP server that accepts connections and never says a word (or only its greeting). */
export function startSilentServer(opts: { greeting?: string } = {}): Promise<StubServer> {
  return startScriptedServer(opts);
}

/**
 * A TCP server that sends `greeting`, then answers each line it receives with what `answer`
 * returns (nothing when it returns undefined). Only for misbehaviour no real MTA can be made to
 * show: a hung peer, a reply echoing credentials, data injected after STARTTLS, a non-SMTP peer.
 */
export async function startScriptedServer(opts: {
  greeting?: string;
  answer?: (line: string) => string | undefined;
  /** Close the connection right after the greeting (or at once, without one). */
  hangUp?: boolean;
}): Promise<StubServer> {
  const sockets = new Set<net.Socket>();
  let connectedFirst = () => {};
  const connected = new Promise<void>((resolve) => (connectedFirst = resolve));
  let heardFirst = () => {};
  const heard = new Promise<void>((resolve) => (heardFirst = resolve));
  const server = net.createServer((socket) => {
    connectedFirst();
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => {});
    if (opts.greeting !== undefined) socket.write(opts.greeting);
    if (opts.hangUp) socket.end();
    let received = '';
    socket.on('data', (chunk) => {
      heardFirst();
      received += chunk.toString('utf8');
      for (let end = received.indexOf('\r\n'); end !== -1; end = received.indexOf('\r\n')) {
        const reply = opts.answer?.(received.slice(0, end));
        received = received.slice(end + 2);
        if (reply !== undefined) socket.write(reply);
      }
    });
  });
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(0, '127.0.0.1', resolve));
  const port = (server.address() as net.AddressInfo).port;
  return {
    port,
    connected,
    heard,
    close: () => {
      for (const socket of sockets) socket.destroy();
      return new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** A loopback port nothing listens on (connections are refused). */
export async function findClosedPort(): Promise<number> {
  const [port] = await freePortPair();
  return port;
}

// ---- implementation ----

function ensureExim(): string {
  aptInstall(['exim4-daemon-light'], () => findExim() !== undefined, 'startMta: exim4');
  return findExim()!;
}

function findExim(): string | undefined {
  for (const dir of [...(process.env.PATH ?? '').split(':'), '/usr/sbin', '/usr/bin']) {
    if (dir && existsSync(join(dir, 'exim4'))) return join(dir, 'exim4');
  }
  return undefined;
}

function eximOwner(): { uid: number; gid: number } {
  const line = readFileSync('/etc/passwd', 'utf8')
    .split('\n')
    .find((entry) => entry.startsWith(`${EXIM_USER}:`));
  if (!line) throw new Error(`startMta: user ${EXIM_USER} does not exist (is exim4 installed correctly?)`);
  const [, , uid, gid] = line.split(':');
  return { uid: Number(uid), gid: Number(gid) };
}

interface Certificates {
  caPem: string;
  otherCaPem: string;
  certFile: string;
  keyFile: string;
}

function makeCertificates(dir: string): Certificates {
  const path = (name: string) => join(dir, name);
  // P-256 keys: quick to generate, accepted by GnuTLS and by Node's default security level.
  const keyArgs = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  const caArgs = (key: string, cert: string, cn: string) => [
    'req', '-x509', ...keyArgs, '-keyout', path(key), '-out', path(cert), '-days', '2', '-subj', `/CN=${cn}`,
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign',
  ];
  openssl(caArgs('ca.key', 'ca.pem', 'webhook test CA'));
  openssl(caArgs('other-ca.key', 'other-ca.pem', 'webhook unrelated CA'));
  openssl(['req', '-new', ...keyArgs, '-keyout', path('server.key'), '-out', path('server.csr'), '-subj', '/CN=localhost']);
  writeFileSync(
    path('server.ext'),
    'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' +
      'keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n',
  );
  openssl([
    'x509', '-req', '-in', path('server.csr'), '-CA', path('ca.pem'), '-CAkey', path('ca.key'), '-CAcreateserial',
    '-days', '2', '-out', path('server.pem'), '-extfile', path('server.ext'),
  ]);
  return {
    caPem: readFileSync(path('ca.pem'), 'utf8'),
    otherCaPem: readFileSync(path('other-ca.pem'), 'utf8'),
    certFile: path('server.pem'),
    keyFile: path('server.key'),
  };
}

function openssl(args: string[]): void {
  const run = spawnSync('openssl', args, { encoding: 'utf8' });
  if (run.error || run.status !== 0) {
    throw new Error(`startMta: openssl ${args[0]} failed: ${run.error?.message ?? run.stderr}`);
  }
}

interface ConfigValues extends Certificates {
  dir: string;
  starttlsPort: number;
  tlsPort: number;
  user: string;
  password: string;
  authMechanisms: readonly AuthMechanism[];
  offerStartTls: boolean;
  greetingDelaySeconds: number;
}

function eximConfig(v: ConfigValues): string {
  const authenticators: Record<AuthMechanism, string> = {
    PLAIN: `plain_server:
  driver = plaintext
  public_name = PLAIN
  server_prompts = :
  server_condition = \${if and {{eq{$auth2}{${v.user}}}{eq{$auth3}{${v.password}}}}}
  server_set_id = $auth2
`,
    LOGIN: `login_server:
  driver = plaintext
  public_name = LOGIN
  server_prompts = Username:: : Password::
  server_condition = \${if and {{eq{$auth1}{${v.user}}}{eq{$auth2}{${v.password}}}}}
  server_set_id = $auth1
`,
    'CRAM-MD5': `cram_md5_server:
  driver = cram_md5
  public_name = CRAM-MD5
  server_secret = \${if eq{$auth1}{${v.user}}{${v.password}}fail}
  server_set_id = $auth1
`,
  };
  // With TLS, AUTH is offered only once the connection is encrypted, as real submission servers do.
  const tlsSettings = v.offerStartTls
    ? `tls_advertise_hosts = *
auth_advertise_hosts = \${if def:tls_in_cipher {*}{}}`
    : `tls_advertise_hosts =
auth_advertise_hosts = *`;
  // Only on the STARTTLS port: the implicit-TLS port greets inside TLS, after the client's hello.
  const delayed = v.greetingDelaySeconds > 0;
  const connectAcl = delayed ? 'acl_smtp_connect = acl_check_connect\n' : '';
  const connectAclBody = delayed
    ? `acl_check_connect:
  accept  condition = \${if eq{$received_port}{${v.starttlsPort}}}
          delay = ${v.greetingDelaySeconds}s
  accept

`
    : '';
  return `# Written by test/mta.ts for one test run; see that file for why each setting is here.
primary_hostname = mta.webhook.test
spool_directory = ${v.dir}/spool
log_file_path = ${v.dir}/log/%slog
pid_file_path = ${v.dir}/exim.pid
log_selector = +smtp_protocol_error +smtp_syntax_error +tls_peerdn
keep_environment =
host_lookup =
rfc1413_hosts =
local_interfaces = <; 127.0.0.1
daemon_smtp_ports = ${v.starttlsPort} : ${v.tlsPort}
tls_on_connect_ports = ${v.tlsPort}
tls_certificate = ${v.certFile}
tls_privatekey = ${v.keyFile}
${tlsSettings}
acl_smtp_rcpt = acl_check_rcpt
${connectAcl}
begin acl

${connectAclBody}acl_check_rcpt:
  deny    !authenticated = *
          message = authentication required
  defer   local_parts = ${DEFERRED_LOCAL_PART}
          message = mailbox busy, try again later
  deny    local_parts = ${REJECTED_LOCAL_PART}
          message = no such mailbox
  accept

begin routers

everything_to_maildir:
  driver = accept
  transport = maildir_delivery

begin transports

maildir_delivery:
  driver = appendfile
  directory = ${v.dir}/Maildir
  maildir_format
  create_directory
  envelope_to_add
  return_path_add
  user = ${EXIM_USER}
  group = ${EXIM_USER}
  mode = 0644

begin retry

# Tests wait seconds, not hours: a delivery that fails is left for the log, not retried soon.
*   *   F,1h,1m

begin authenticators

${v.authMechanisms.map((name) => authenticators[name]).join('\n')}`;
}

/** Two distinct free loopback ports: both are held open until both are known. */
async function freePortPair(): Promise<[number, number]> {
  const listen = () => {
    const server = net.createServer();
    return new Promise<net.Server>((resolve, reject) => server.once('error', reject).listen(0, '127.0.0.1', () => resolve(server)));
  };
  const servers = [await listen(), await listen()] as const;
  const ports = servers.map((server) => (server.address() as net.AddressInfo).port);
  await Promise.all(servers.map((server) => new Promise((resolve) => server.close(resolve))));
  return [ports[0]!, ports[1]!];
}

/** true once the daemon greets on `port` (`delayMs` late, on purpose), or a description of why it did not. */
async function waitForGreeting(
  child: ChildProcess,
  port: number,
  timeoutMs: number,
  delayMs: number,
): Promise<true | string> {
  let exited: string | undefined;
  child.once('exit', (code, signal) => (exited = `exim exited (${signal ?? `status ${code}`})`));
  const giveUpAt = Date.now() + timeoutMs;
  while (Date.now() < giveUpAt) {
    if (exited) return exited;
    if (await greets(port, delayMs)) return true;
    await sleep(50);
  }
  return exited ?? `no SMTP greeting on port ${port} within ${timeoutMs} ms`;
}

function greets(port: number, greetingDelayMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    const done = (result: boolean) => {
      socket.destroy();
      resolve(result);
    };
    socket.setTimeout(1000 + greetingDelayMs, () => done(false));
    socket.once('error', () => done(false));
    socket.once('data', (chunk) => done(chunk.toString('latin1').startsWith('220')));
  });
}

function readLogs(dir: string): string {
  return ['mainlog', 'paniclog', 'rejectlog']
    .map((name) => join(dir, 'log', name))
    .filter((file) => existsSync(file))
    .map((file) => `\n--- ${file}\n${readFileSync(file, 'utf8')}`)
    .join('');
}

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
  await exited;
  clearTimeout(timer);
}

interface RunningMta extends Pick<Mta, 'starttlsPort' | 'tlsPort' | 'user' | 'password' | 'caPem' | 'otherCaPem'> {
  dir: string;
  child: ChildProcess;
  cleanUpOnExit: () => void;
}

function makeMta(run: RunningMta): Mta {
  const maildir = join(run.dir, 'Maildir');
  const newDir = join(maildir, 'new');
  // Maildir names start with the delivery time in seconds, so sort by modification time first.
  const deliveredFiles = async (): Promise<string[]> => {
    const names = await readdir(newDir).catch(() => [] as string[]);
    const files = await Promise.all(names.map(async (name) => ({ name, mtime: (await stat(join(newDir, name))).mtimeMs })));
    return files.sort((a, b) => a.mtime - b.mtime || a.name.localeCompare(b.name)).map((file) => join(newDir, file.name));
  };
  const messages = async () => Promise.all((await deliveredFiles()).map((file) => readFile(file, 'utf8')));
  return {
    host: '127.0.0.1',
    starttlsPort: run.starttlsPort,
    tlsPort: run.tlsPort,
    user: run.user,
    password: run.password,
    caPem: run.caPem,
    otherCaPem: run.otherCaPem,
    maildir,
    mainLog: join(run.dir, 'log', 'mainlog'),
    deferredRecipient: `${DEFERRED_LOCAL_PART}@recipient.test`,
    rejectedRecipient: `${REJECTED_LOCAL_PART}@recipient.test`,
    messages,
    async waitForMessages(n, timeoutMs = 10_000) {
      const giveUpAt = Date.now() + timeoutMs;
      for (;;) {
        const found = await messages();
        if (found.length >= n) return found;
        if (Date.now() >= giveUpAt) {
          throw new Error(`waitForMessages: ${found.length} of ${n} messages delivered after ${timeoutMs} ms${readLogs(run.dir)}`);
        }
        await sleep(50);
      }
    },
    async clear() {
      await Promise.all((await deliveredFiles()).map((file) => unlink(file)));
    },
    async stop() {
      await stopChild(run.child);
      process.removeListener('exit', run.cleanUpOnExit);
      await rm(run.dir, { recursive: true, force: true });
    },
  };
}
