// Tests for the chapters "smtp client" and "mail" of webhook.ts: configuration, composition (golden
// files), and SMTP transactions against a real exim started by test/mta.ts. The exim tests fail, never skip, when
// exim cannot be installed or started.

import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import tls from 'node:tls';
import { inspect } from 'node:util';

import { makeTempDir, startWebhook, waitForOutput, type Response, type Webhook } from './harness.ts';
import { findClosedPort, serviceMailEnv, startMta, startScriptedServer, startSilentServer, type Mta } from './mta.ts';
import {
  composeMessage,
  dotStuff,
  formatRfc5322Date,
  newMessageId,
  parseMailConfig,
  parseRecipients,
  sendMail,
  sendWithRetry,
  type MailConfig,
  type SendResult,
} from '../webhook.ts';

const FIXTURES = join(import.meta.dirname, 'fixtures', 'mail');
const CHINESE_SUBJECT = 'Webhooks通知: prod-web-app 更新结果';
const b64 = (text: string) => Buffer.from(text, 'utf8').toString('base64');

// ---- a reader for delivered messages, independent of the composer ----

interface Delivered {
  headers: Map<string, string[]>;
  body: string;
}

/** Splits a delivered message (exim stores LF endings) into unfolded headers and a decoded body. */
function readDelivered(raw: string): Delivered {
  const text = raw.replace(/\r\n/g, '\n');
  const split = text.indexOf('\n\n');
  const headers = new Map<string, string[]>();
  for (const field of text.slice(0, split).replace(/\n[ \t]/g, (fold) => fold.slice(1)).split('\n')) {
    const colon = field.indexOf(':');
    const name = field.slice(0, colon).toLowerCase();
    headers.set(name, [...(headers.get(name) ?? []), field.slice(colon + 1).trim()]);
  }
  const encoded = text.slice(split + 2);
  assert.equal(headers.get('content-transfer-encoding')?.[0], 'base64');
  assert.match(headers.get('content-type')?.[0] ?? '', /^text\/plain; charset=utf-8$/i);
  return { headers, body: Buffer.from(encoded.replace(/\s+/g, ''), 'base64').toString('utf8') };
}

/** RFC 2047 decoding: encoded-words (B or Q, UTF-8), whitespace between adjacent ones dropped. */
function decodeHeader(value: string): string {
  const word = /=\?([^?]+)\?([BbQq])\?([^?]*)\?=/g;
  return value.replace(/(=\?[^?]+\?[BbQq]\?[^?]*\?=)\s+(?==\?)/g, '$1').replace(word, (_, charset: string, encoding: string, data: string) => {
    assert.equal(charset.toLowerCase(), 'utf-8');
    const bytes =
      encoding.toUpperCase() === 'B'
        ? Buffer.from(data, 'base64')
        : Buffer.from(data.replace(/_/g, ' ').replace(/=([0-9A-F]{2})/gi, (_m, hex: string) => String.fromCharCode(parseInt(hex, 16))), 'latin1');
    return bytes.toString('utf8');
  });
}

const header = (message: Delivered, name: string) => message.headers.get(name.toLowerCase())?.[0] ?? '';

// ---- configuration ----

describe('parseMailConfig', () => {
  const valid = {
    MAIL_SMTP_SERVER: b64('smtp.example.com'),
    MAIL_FROM: b64('Webhook@Example.com'),
    MAIL_PASSWORD: b64('s3cret pa$$'),
    MAIL_SMTP_PORT: '587',
  };

  test('mail is off, silently, without MAIL_SMTP_SERVER', () => {
    assert.deepEqual(parseMailConfig({}), { errors: [] });
    assert.deepEqual(parseMailConfig({ MAIL_SMTP_SERVER: ' ', MAIL_FROM: 'garbage!' }), { errors: [] });
  });

  test('decodes the variables; user defaults to the sender; on 587 the server is asked (auto)', () => {
    const { config, errors } = parseMailConfig(valid);
    assert.deepEqual(errors, []);
    assert.equal(config?.host, 'smtp.example.com');
    assert.equal(config?.port, 587);
    assert.equal(config?.security, 'auto');
    assert.equal(config?.from, 'Webhook@Example.com');
    assert.equal(config?.user, 'Webhook@Example.com');
    assert.equal(config?.password?.reveal(), 's3cret pa$$');
    assert.equal(config?.verifyCertificate, true);
    assert.equal(config?.allowPlaintextAuth, false);
    assert.equal(config?.ca, undefined);
  });

  test('port 465 (and an unset port, as with the old image) means implicit TLS', () => {
    assert.equal(parseMailConfig({ ...valid, MAIL_SMTP_PORT: '465' }).config?.security, 'implicit-tls');
    const { config } = parseMailConfig({ ...valid, MAIL_SMTP_PORT: undefined });
    assert.equal(config?.port, 465);
    assert.equal(config?.security, 'implicit-tls');
  });

  test('MAIL_TLS_MODE forces a mode on any port, in any case; unset, only 465 is decided by its number', () => {
    const security = (env: Record<string, string>) => parseMailConfig({ ...valid, ...env }).config?.security;
    assert.equal(security({ MAIL_SMTP_PORT: '994' }), 'auto');
    assert.equal(security({ MAIL_SMTP_PORT: '25' }), 'auto');
    assert.equal(security({ MAIL_SMTP_PORT: '994', MAIL_TLS_MODE: 'implicit' }), 'implicit-tls');
    assert.equal(security({ MAIL_SMTP_PORT: '465', MAIL_TLS_MODE: ' STARTTLS ' }), 'starttls');
    assert.equal(security({ MAIL_SMTP_PORT: '465', MAIL_TLS_MODE: 'auto' }), 'auto');
  });

  test('optional user, TLS check off, plaintext AUTH allowed', () => {
    const { config } = parseMailConfig({
      ...valid,
      MAIL_SMTP_USER: b64('relay-user'),
      MAIL_TLS_CHECK: 'false',
      MAIL_ALLOW_PLAINTEXT_AUTH: 'TRUE',
    });
    assert.equal(config?.user, 'relay-user');
    assert.equal(config?.verifyCertificate, false);
    assert.equal(config?.allowPlaintextAuth, true);
  });

  test('the trailing newline of `echo value | base64` is dropped; wrapped base64 is accepted', () => {
    const { config, errors } = parseMailConfig({
      ...valid,
      MAIL_PASSWORD: b64('secret\n'),
      MAIL_FROM: `${b64('webhook@example.com\n').slice(0, 8)}\n  ${b64('webhook@example.com\n').slice(8)}`,
    });
    assert.deepEqual(errors, []);
    assert.equal(config?.password?.reveal(), 'secret');
    assert.equal(config?.from, 'webhook@example.com');
  });

  test('a CA bundle of PEM certificates is accepted', () => {
    const bundle = tls.rootCertificates.slice(0, 5).join('\n');
    const { config, errors } = parseMailConfig({ ...valid, MAIL_CACERT: b64(bundle) });
    assert.deepEqual(errors, []);
    assert.equal(config?.ca, bundle);
  });

  test('each bad value is reported by name, never by value, and leaves mail off', () => {
    const secretish = 'TOPSECRET';
    const cases: Array<[Record<string, string>, string]> = [
      [{ MAIL_PASSWORD: `${b64(secretish)}!` }, 'MAIL_PASSWORD: not valid base64'],
      [{ MAIL_PASSWORD: b64(secretish).slice(0, -1) }, 'MAIL_PASSWORD: not valid base64'],
      [{ MAIL_PASSWORD: Buffer.from([0xff, 0xfe, 0x54]).toString('base64') }, 'MAIL_PASSWORD: not valid base64'],
      [{ MAIL_SMTP_SERVER: secretish }, 'MAIL_SMTP_SERVER: not valid base64'],
      [{ MAIL_SMTP_SERVER: b64(`${secretish} smtp`) }, 'MAIL_SMTP_SERVER: not a host name'],
      [{ MAIL_FROM: b64(`${secretish} <x@y>`) }, 'MAIL_FROM: not an e-mail address'],
      [{ MAIL_FROM: '' }, 'MAIL_FROM: required'],
      [{ MAIL_CACERT: b64(secretish) }, 'MAIL_CACERT: not PEM'],
      [{ MAIL_CACERT: b64(`-----BEGIN CERTIFICATE-----\n${b64(secretish)}\n-----END CERTIFICATE-----\n`) }, 'MAIL_CACERT: not PEM'],
      [{ MAIL_SMTP_PORT: '0' }, 'MAIL_SMTP_PORT: not a port'],
      [{ MAIL_SMTP_PORT: '65536' }, 'MAIL_SMTP_PORT: not a port'],
      [{ MAIL_SMTP_PORT: '25x' }, 'MAIL_SMTP_PORT: not a port'],
      [{ MAIL_SMTP_PORT: '-1' }, 'MAIL_SMTP_PORT: not a port'],
      [{ MAIL_TLS_CHECK: 'yes' }, 'MAIL_TLS_CHECK: must be "true" or "false"'],
      [{ MAIL_ALLOW_PLAINTEXT_AUTH: '1' }, 'MAIL_ALLOW_PLAINTEXT_AUTH: must be "true" or "false"'],
      [{ MAIL_TLS_MODE: 'smtps' }, 'MAIL_TLS_MODE: must be "implicit", "starttls" or "auto"'],
    ];
    for (const [override, expected] of cases) {
      const result = parseMailConfig({ ...valid, ...override });
      assert.equal(result.config, undefined, expected);
      assert.equal(result.errors.length, 1, `${expected}: ${result.errors.join('; ')}`);
      const [error = ''] = result.errors;
      assert.ok(error.startsWith(expected), `${error} should start with ${expected}`);
      assert.ok(!error.includes(secretish), error);
      for (const value of Object.values(override)) if (value.length > 3) assert.ok(!error.includes(value));
    }
  });

  test('the password never shows when the config is logged', () => {
    const { config } = parseMailConfig(valid);
    assert.ok(!JSON.stringify(config).includes('s3cret'));
    assert.ok(!inspect(config, { depth: 5, showHidden: true }).includes('s3cret'));
    assert.ok(!`${config?.password}`.includes('s3cret'));
  });
});

describe('parseRecipients', () => {
  test('comma-separated, trimmed, case kept, duplicates and empty entries dropped', () => {
    assert.deepEqual(parseRecipients(' Ops@Example.com ,dev.lead@example.org,, ops@example.com '), ['Ops@Example.com', 'dev.lead@example.org']);
  });

  test('refuses header or command injection, display names and empty lists', () => {
    for (const bad of ['a@x.com\r\nBcc: evil@x.com', 'a@x.com>\r\nRCPT TO:<evil@x.com', 'Ops <ops@x.com>', 'no-at-sign', 'a@@x.com', 'a@x..com', ' , ']) {
      assert.throws(() => parseRecipients(bad), /MAIL_TO/, JSON.stringify(bad));
    }
  });
});

// ---- composition: golden files ----

interface FixtureInput {
  from: string;
  to: string[];
  subject: string;
  body: string;
  date: string;
  messageId: string;
}

/** UPDATE_GOLDEN=1 rewrites the expected files; review the diff before committing it. */
/** Compares with a golden file; UPDATE_GOLDEN=1 writes it instead. A missing golden file fails. */
function assertGolden(actual: string, expectedFile: string): void {
  if (process.env.UPDATE_GOLDEN === '1') writeFileSync(expectedFile, actual);
  assert.ok(existsSync(expectedFile), `${expectedFile} is missing (UPDATE_GOLDEN=1 writes it from the current output)`);
  assert.equal(actual, readFileSync(expectedFile, 'utf8'));
}

describe('composeMessage (golden files in fixtures/)', () => {
  for (const name of readdirSync(FIXTURES).filter((file) => file.endsWith('.input.json'))) {
    test(name, () => {
      const input = JSON.parse(readFileSync(join(FIXTURES, name), 'utf8')) as FixtureInput;
      const message = composeMessage({ ...input, date: new Date(input.date) });
      assertGolden(message, join(FIXTURES, name.replace('.input.json', '.expected.eml')));

      const [head = '', body = ''] = message.split('\r\n\r\n');
      assert.ok(!/(^|[^\r])\n|\r(?!\n)/.test(message), 'only CRLF line breaks');
      for (const line of head.split('\r\n')) {
        assert.ok(/^[\x20-\x7e]*$/.test(line), `header line is printable ASCII: ${line}`);
        assert.ok(line.length <= 78, `header line ≤ 78: ${line}`);
        assert.ok(!/^\s*$/.test(line), 'no blank folded line');
        const words = line.match(/=\?[^?]+\?B\?[^?]*\?=/g) ?? [];
        if (words.length > 0) assert.ok(line.length <= 76, `a line with encoded-words ≤ 76: ${line}`);
        for (const word of words) {
          assert.ok(word.length <= 75, `encoded-word ≤ 75: ${word}`);
          const bytes = Buffer.from(word.slice('=?UTF-8?B?'.length, -2), 'base64');
          assert.doesNotThrow(() => new TextDecoder('utf-8', { fatal: true }).decode(bytes), `whole characters in ${word}`);
        }
      }
      for (const line of body.split('\r\n')) assert.ok(line.length <= 76);

      const parsed = readDelivered(message);
      assert.equal(decodeHeader(header(parsed, 'Subject')), input.subject.replace(/\s+/g, ' ').trim());
      assert.equal(header(parsed, 'From'), input.from);
      assert.equal(header(parsed, 'To'), input.to.join(', '));
      assert.equal(parsed.body, input.body.replace(/\r\n|\r|\n/g, '\r\n'));
    });
  }

  test('dot-stuffing (fixtures/dot-stuffing.*)', () => {
    const input = readFileSync(join(FIXTURES, 'dot-stuffing.input.txt'), 'utf8');
    assertGolden(dotStuff(input), join(FIXTURES, 'dot-stuffing.expected.txt'));
  });

  test('Date in RFC 5322 form, UTC', () => {
    assert.equal(formatRfc5322Date(new Date('2026-11-22T04:12:00Z')), 'Sun, 22 Nov 2026 04:12:00 +0000');
    assert.equal(formatRfc5322Date(new Date('2027-02-03T09:08:07+08:00')), 'Wed, 03 Feb 2027 01:08:07 +0000');
  });

  test('a subject of any length and script reads back exactly; no line over the limits', () => {
    const subjects = ['', 'plain', CHINESE_SUBJECT, '😀'.repeat(100), 'a'.repeat(1200), `${'é'.repeat(50)} x ${'中'.repeat(50)}`, 'tab\there\r\nand newline'];
    for (const subject of subjects) {
      const message = composeMessage({ from: 'a@b.c', to: ['d@e.f'], subject, body: 'x', date: new Date(0), messageId: 'id@b.c' });
      const [head = ''] = message.split('\r\n\r\n');
      for (const line of head.split('\r\n')) assert.ok(line.length <= 998, `line ≤ 998 for ${subject.slice(0, 20)}`);
      assert.equal(decodeHeader(header(readDelivered(message), 'Subject')), subject.replace(/\s+/g, ' ').trim());
    }
  });

  test('refuses addresses and Message-IDs that would inject headers', () => {
    const base = { from: 'a@b.c', to: ['d@e.f'], subject: 's', body: '', date: new Date(0), messageId: 'id@b.c' };
    assert.throws(() => composeMessage({ ...base, to: ['d@e.f\r\nBcc: x@y.z'] }));
    assert.throws(() => composeMessage({ ...base, from: 'a@b.c\nX: y' }));
    assert.throws(() => composeMessage({ ...base, messageId: 'id@b.c>\r\nBcc: x@y.z' }));
  });

  test('newMessageId is unique and in the sender domain', () => {
    const id = newMessageId('Webhook@Example.COM');
    assert.match(id, /^<[0-9a-f-]{36}@Example\.COM>$/);
    assert.notEqual(id, newMessageId('Webhook@Example.COM'));
  });
});

// ---- SMTP against a real exim ----

interface Servers {
  /** Every mechanism, STARTTLS and implicit TLS. */
  full: Mta;
  /** AUTH LOGIN only. */
  loginOnly: Mta;
  /** No STARTTLS; AUTH offered in the clear. */
  clear: Mta;
}

describe('sendMail against a real exim', () => {
  let mta: Servers;
  const results: SendResult[] = [];

  before(async () => {
    const [full, loginOnly, clear] = await Promise.all([
      startMta(),
      startMta({ authMechanisms: ['LOGIN'] }),
      startMta({ offerStartTls: false }),
    ]);
    mta = { full, loginOnly, clear };
  });

  after(async () => {
    await Promise.all(Object.values(mta ?? {}).map((server) => server.stop()));
  });

  /** A config as parseMailConfig makes it from MAIL_* variables pointing at `server`. */
  function configFor(server: Mta, security: 'implicit-tls' | 'starttls', env: Record<string, string | undefined> = {}): MailConfig {
    const { config, errors } = parseMailConfig({
      MAIL_SMTP_SERVER: b64(server.host),
      MAIL_FROM: b64(server.user),
      MAIL_PASSWORD: b64(server.password),
      MAIL_CACERT: b64(server.caPem),
      // exim listens on free high ports, so 465 only selects implicit TLS; the real port follows.
      MAIL_SMTP_PORT: security === 'implicit-tls' ? '465' : String(server.starttlsPort),
      ...env,
    });
    assert.deepEqual(errors, []);
    assert.ok(config);
    return { ...config, port: security === 'implicit-tls' ? server.tlsPort : server.starttlsPort };
  }

  async function send(config: MailConfig, to: string[], subject = CHINESE_SUBJECT, timeouts = {}): Promise<{ result: SendResult; messageId: string }> {
    const messageId = newMessageId(config.from);
    const message = composeMessage({ from: config.from, to, subject, body: 'hello', date: new Date(), messageId });
    const result = await sendMail(config, message, { to, timeouts });
    results.push(result);
    return { result, messageId };
  }

  /** Which exim authenticator accepted the message with this Message-ID. */
  function authenticatorFor(server: Mta, messageId: string): string | undefined {
    const line = readFileSync(server.mainLog, 'utf8')
      .split('\n')
      .find((entry) => entry.includes(' <= ') && entry.includes(`id=${messageId.slice(1, -1)}`));
    return / A=([a-z0-9_]+):/.exec(line ?? '')?.[1];
  }

  test('implicit TLS, AUTH PLAIN, trusted through MAIL_CACERT: two recipients get the whole message', async () => {
    await mta.full.clear();
    const date = new Date('2026-11-22T04:12:00Z');
    const body = ['升级报告', '.a line starting with a dot', '.', `long:${'x'.repeat(2000)}`, '..two dots', 'end'].join('\n');
    const to = ['Ops.Team@Example.test', 'dev@example.test'];
    const config = configFor(mta.full, 'implicit-tls');
    const messageId = newMessageId(config.from);
    const result = await sendMail(config, composeMessage({ from: config.from, to, subject: CHINESE_SUBJECT, body, date, messageId }), { to });
    results.push(result);
    assert.equal(result.ok, true, JSON.stringify(result));
    assert.match(result.reply, /^250 /);

    const delivered = (await mta.full.waitForMessages(2)).map(readDelivered);
    assert.deepEqual(delivered.map((message) => header(message, 'Envelope-to')).sort(), to.slice().sort());
    for (const message of delivered) {
      assert.equal(decodeHeader(header(message, 'Subject')), CHINESE_SUBJECT);
      assert.equal(header(message, 'To'), 'Ops.Team@Example.test, dev@example.test');
      assert.equal(header(message, 'From'), mta.full.user);
      assert.equal(header(message, 'Date'), 'Sun, 22 Nov 2026 04:12:00 +0000');
      assert.match(header(message, 'Date'), /^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} [+-]\d{4}$/);
      assert.equal(header(message, 'Message-ID'), messageId);
      assert.equal(header(message, 'MIME-Version'), '1.0');
      assert.equal(message.body, body.replace(/\n/g, '\r\n'));
      assert.match(header(message, 'Received'), /esmtpsa/, 'received over TLS, authenticated');
    }
    assert.equal(authenticatorFor(mta.full, messageId), 'plain_server');
  });

  test('STARTTLS, AUTH PLAIN', async () => {
    await mta.full.clear();
    const { result, messageId } = await send(configFor(mta.full, 'starttls'), ['ops@example.test']);
    assert.equal(result.ok, true, JSON.stringify(result));
    const [raw = ''] = await mta.full.waitForMessages(1);
    const message = readDelivered(raw);
    assert.equal(decodeHeader(header(message, 'Subject')), CHINESE_SUBJECT);
    assert.match(header(message, 'Received'), /with esmtpsa .*TLS/);
    assert.equal(authenticatorFor(mta.full, messageId), 'plain_server');
  });

  for (const security of ['implicit-tls', 'starttls'] as const) {
    test(`${security}, AUTH LOGIN (the only mechanism offered)`, async () => {
      await mta.loginOnly.clear();
      const { result, messageId } = await send(configFor(mta.loginOnly, security), ['ops@example.test']);
      assert.equal(result.ok, true, JSON.stringify(result));
      await mta.loginOnly.waitForMessages(1);
      assert.equal(authenticatorFor(mta.loginOnly, messageId), 'login_server');
    });
  }

  test('host given by name: SNI and the DNS SAN are checked', async () => {
    await mta.full.clear();
    const { result } = await send(configFor(mta.full, 'implicit-tls', { MAIL_SMTP_SERVER: b64('localhost') }), ['ops@example.test']);
    assert.equal(result.ok, true, JSON.stringify(result));
  });

  test('MAIL_TLS_CHECK=false delivers although nothing vouches for the certificate', async () => {
    await mta.full.clear();
    for (const security of ['implicit-tls', 'starttls'] as const) {
      const config = configFor(mta.full, security, { MAIL_TLS_CHECK: 'false', MAIL_CACERT: undefined });
      const { result } = await send(config, ['ops@example.test']);
      assert.equal(result.ok, true, `${security}: ${JSON.stringify(result)}`);
    }
    await mta.full.waitForMessages(2);
  });

  // ---- which TLS: MAIL_TLS_MODE, or asked of the server ----

  /** A config for exim's real `port` (a free high port, never 465), as the MAIL_* variables give it. */
  function configForPort(server: Mta, port: number, env: Record<string, string | undefined> = {}): MailConfig {
    // configFor parses with the MAIL_SMTP_PORT given in env, then sets a port of its own: put the real one back.
    return { ...configFor(server, 'starttls', { MAIL_SMTP_PORT: String(port), ...env }), port };
  }

  /**
   * The message with this Message-ID, read back from the Maildir: whole, and received over TLS. An
   * earlier test's message may still be arriving, so it is found by its id, not by its place.
   */
  async function assertDeliveredOverTls(server: Mta, messageId: string): Promise<void> {
    let message: Delivered | undefined;
    for (let count = 1; !message; count++) {
      const delivered = (await server.waitForMessages(count)).map(readDelivered);
      message = delivered.find((candidate) => header(candidate, 'Message-ID') === messageId);
    }
    assert.equal(decodeHeader(header(message, 'Subject')), CHINESE_SUBJECT);
    assert.match(header(message, 'Received'), /with esmtpsa /, 'received over TLS, authenticated');
  }

  /** The failure's [stage, transient], or false when the mail went out. */
  const failedAt = (result: SendResult) => result.ok === false && [result.stage, result.transient];
  const TO = ['ops@example.test'];

  /**
   * Whether `client` (a send to the port it is given) makes a server hear from it before the
   * detection silence is over: the silence of an auto-mode send started just before it, to a server
   * that says nothing, which then sends its TLS hello. The clock is the product's own wait, on the
   * same event loop as the client, so a slow machine slows both alike: no figure in milliseconds.
   */
  async function heardBeforeDetectionSilence(client: (port: number) => Promise<unknown>, greeting?: string): Promise<boolean> {
    const silent = await startSilentServer();
    const observed = await startSilentServer({ greeting });
    const detecting = send(configForPort(mta.full, silent.port), TO, 's');
    await silent.connected;
    const sending = client(observed.port);
    try {
      return await Promise.race([observed.heard.then(() => true), silent.heard.then(() => false)]);
    } finally {
      await Promise.all([silent.close(), observed.close()]);
      await Promise.all([detecting, sending]);
    }
  }

  test('no MAIL_TLS_MODE: implicit TLS on a port other than 465 is detected (the old image worked there)', async () => {
    await mta.full.clear();
    const config = configForPort(mta.full, mta.full.tlsPort);
    assert.equal(config.security, 'auto');
    assert.notEqual(config.port, 465);
    const started = Date.now();
    const { result, messageId } = await send(config, TO);
    assert.deepEqual([result.ok, result.security], [true, 'implicit TLS (detected)'], JSON.stringify(result));
    assert.ok(Date.now() - started >= 1_900, 'TLS is started only after the server stayed silent');
    await assertDeliveredOverTls(mta.full, messageId);
    assert.equal(authenticatorFor(mta.full, messageId), 'plain_server');
  });

  test('no MAIL_TLS_MODE: a server that greets at once gets STARTTLS, without waiting', async () => {
    await mta.full.clear();
    const { result, messageId } = await send(configForPort(mta.full, mta.full.starttlsPort), TO);
    assert.deepEqual([result.ok, result.security], [true, 'STARTTLS (detected)'], JSON.stringify(result));
    await assertDeliveredOverTls(mta.full, messageId);
    // Without waiting: the greeting ends the wait, so EHLO goes out before the detection silence is over.
    const greetsAtOnce = (port: number) => send(configForPort(mta.full, port), TO, 's');
    assert.equal(await heardBeforeDetectionSilence(greetsAtOnce, '220 stub ESMTP\r\n'), true, 'EHLO only after the detection silence');
  });

  test('MAIL_TLS_MODE still forces the mode, on any port, and no detection happens', async () => {
    const { tlsPort, starttlsPort } = mta.full;
    const forced = [[tlsPort, 'implicit', 'implicit TLS'], [starttlsPort, 'starttls', 'STARTTLS']] as const;
    for (const [port, mode, used] of forced) {
      await mta.full.clear();
      const { result, messageId } = await send(configForPort(mta.full, port, { MAIL_TLS_MODE: mode }), TO);
      assert.deepEqual([result.ok, result.security], [true, used], JSON.stringify(result));
      await assertDeliveredOverTls(mta.full, messageId);
    }
    // No detection: forced implicit TLS sends its TLS hello to a silent server before the detection silence is over.
    const forcedImplicit = (port: number) => send(configForPort(mta.full, port, { MAIL_TLS_MODE: 'implicit' }), TO, 's');
    assert.equal(await heardBeforeDetectionSilence(forcedImplicit), true, 'implicit: TLS hello only after the detection silence');
    // Forced the wrong way round, the setting still wins over what the server does.
    const timeouts = { replyMs: 500 };
    const implicitOnPlain = configForPort(mta.full, starttlsPort, { MAIL_TLS_MODE: 'implicit' });
    const forcedTls = await send(implicitOnPlain, TO, 's', timeouts);
    assert.equal(forcedTls.result.ok === false && forcedTls.result.stage, 'connect', JSON.stringify(forcedTls.result));
    assert.doesNotMatch(forcedTls.result.reply, /was tried/);
    const forcedPlain = await send(configForPort(mta.full, tlsPort, { MAIL_TLS_MODE: 'starttls' }), TO, 's', timeouts);
    assert.deepEqual(failedAt(forcedPlain.result), ['greeting', true]);
    assert.equal(forcedPlain.result.reply, 'no reply within 500 ms');
  });

  test('no MAIL_TLS_MODE, a server that never answers: fails within its deadlines, saying what was tried', async () => {
    const silent = await startSilentServer();
    const guess = 'no SMTP greeting within (\\d+) ms, so implicit TLS was tried';
    try {
      const config = configForPort(mta.full, silent.port);
      const cases = [
        // Two seconds of silence, then the TLS handshake gets what is left of the connect budget.
        {
          timeouts: { connectMs: 3_000, replyMs: 300, totalMs: 10_000 },
          min: 2_900,
          reply: new RegExp(`^${guess.replace('(\\d+)', '2000')}: TLS handshake not finished within (\\d+) ms$`),
          budgetMs: 1_000,
        },
        // The whole-transaction deadline cuts the wait itself short.
        {
          timeouts: { connectMs: 10_000, replyMs: 10_000, totalMs: 500 },
          min: 450,
          reply: new RegExp(`^${guess}: no time left for its handshake$`),
          budgetMs: 500,
        },
      ];
      for (const { timeouts, min, reply, budgetMs } of cases) {
        const started = Date.now();
        const { result } = await send(config, TO, 's', timeouts);
        const elapsed = Date.now() - started;
        assert.deepEqual(failedAt(result), ['connect', true], JSON.stringify(result));
        assert.match(result.reply, reply);
        // The reply names the wait the deadline left (the handshake's, or the silence's): at most the budget.
        const [, leftMs] = reply.exec(result.reply)!;
        assert.ok(Number(leftMs) <= budgetMs, result.reply);
        // Not the longer deadlines (10 s) nor the defaults.
        assert.ok(elapsed >= min && elapsed < 5_000, `gave up after ${elapsed} ms`);
      }
    } finally {
      await silent.close();
    }
  });

  test('no MAIL_TLS_MODE, a server that speaks first but not SMTP, or hangs up: a clear error, no TLS', async () => {
    const ssh = await startScriptedServer({ greeting: 'SSH-2.0-OpenSSH_9.6\r\n' });
    const hangsUp = await startScriptedServer({ hangUp: true });
    try {
      const notSmtp = await send(configForPort(mta.full, ssh.port), TO);
      assert.deepEqual(failedAt(notSmtp.result), ['greeting', false]);
      assert.equal(notSmtp.result.reply, 'not an SMTP reply: "SSH-2.0-OpenSSH_9.6"');
      assert.equal(notSmtp.result.security, 'no TLS (detected)');
      const closed = await send(configForPort(mta.full, hangsUp.port), TO);
      assert.deepEqual(failedAt(closed.result), ['greeting', true]);
      assert.equal(closed.result.reply, 'connection closed by the server before its greeting');
    } finally {
      await Promise.all([ssh.close(), hangsUp.close()]);
    }
  });

  test('a server greeting after the 2 s wait: the failure names MAIL_TLS_MODE=starttls, which delivers', async () => {
    const slow = await startMta({ greetingDelaySeconds: 3 });
    try {
      const guessed = await send(configForPort(slow, slow.starttlsPort), TO);
      assert.deepEqual(failedAt(guessed.result), ['connect', true]);
      // What TLS makes of the late greeting is OpenSSL's wording; the guess and the way out are ours.
      assert.match(guessed.result.reply, /^no SMTP greeting within 2000 ms, so implicit TLS was tried: /);
      assert.match(guessed.result.reply, /\(a server that greets this late needs MAIL_TLS_MODE=starttls\)$/);
      const forced = await send(configForPort(slow, slow.starttlsPort, { MAIL_TLS_MODE: 'starttls' }), TO);
      assert.deepEqual([forced.result.ok, forced.result.security], [true, 'STARTTLS'], JSON.stringify(forced.result));
      await assertDeliveredOverTls(slow, forced.messageId);
    } finally {
      await slow.stop();
    }
  });

  test('an untrusted certificate is refused, permanently, before any credential is sent', async () => {
    const authenticationsLogged = () => readFileSync(mta.full.mainLog, 'utf8').split('\n').filter((line) => / A=|authenticator/.test(line)).length;
    const before = authenticationsLogged();
    for (const [security, stage] of [['implicit-tls', 'connect'], ['starttls', 'starttls']] as const) {
      for (const env of [{ MAIL_CACERT: b64(mta.full.otherCaPem) }, { MAIL_CACERT: undefined }]) {
        const { result } = await send(configFor(mta.full, security, env), ['ops@example.test']);
        assert.equal(result.ok, false);
        assert.equal(result.ok === false && result.transient, false, JSON.stringify(result));
        assert.equal(result.ok === false && result.stage, stage);
        assert.match(result.reply, /certificate not trusted/);
      }
    }
    assert.equal(authenticationsLogged(), before);
  });

  test('a wrong password gets 535: permanent, and neither password appears in the result', async () => {
    const wrong = 'Wr0ng-Pa55word';
    const cases = [
      [mta.full, 'implicit-tls', 'implicit TLS'],
      [mta.loginOnly, 'starttls', 'STARTTLS (detected)'],
    ] as const;
    for (const [server, security, used] of cases) {
      const { result } = await send(configFor(server, security, { MAIL_PASSWORD: b64(wrong) }), ['ops@example.test']);
      const expected = { ok: false, transient: false, stage: 'auth', reply: '535 ', security: used };
      assert.deepEqual({ ...result, reply: result.reply.slice(0, 4) }, expected);
      for (const secret of [wrong, b64(wrong), server.password, b64(server.password)]) {
        assert.ok(!JSON.stringify(result).includes(secret), JSON.stringify(result));
      }
    }
  });

  test('no STARTTLS offered: the password is not sent in clear text unless the operator allows it', async () => {
    await mta.clear.clear();
    const refused = await send(configFor(mta.clear, 'starttls', { MAIL_CACERT: undefined }), ['ops@example.test']);
    assert.equal(refused.result.ok, false);
    assert.deepEqual(
      refused.result.ok === false && [refused.result.stage, refused.result.transient],
      ['auth', false],
    );
    assert.match(refused.result.reply, /STARTTLS.*MAIL_ALLOW_PLAINTEXT_AUTH/);
    assert.doesNotMatch(readFileSync(mta.clear.mainLog, 'utf8'), /authenticator/);

    const allowed = await send(configFor(mta.clear, 'starttls', { MAIL_ALLOW_PLAINTEXT_AUTH: 'true' }), ['ops@example.test']);
    assert.equal(allowed.result.ok, true, JSON.stringify(allowed.result));
    await mta.clear.waitForMessages(1);
    // Without TLS the client prefers the mechanism that does not reveal the password.
    assert.equal(authenticatorFor(mta.clear, allowed.messageId), 'cram_md5_server');
  });

  test('a 4xx for a recipient is transient, a 5xx permanent; either stops before DATA', async () => {
    await mta.full.clear();
    const config = configFor(mta.full, 'starttls');
    const deferred = await send(config, ['ops@example.test', mta.full.deferredRecipient]);
    assert.deepEqual(deferred.result.ok === false && [deferred.result.transient, deferred.result.stage], [true, 'rcpt']);
    assert.match(deferred.result.reply, /^451 .*try again later/);
    const rejected = await send(config, ['ops@example.test', mta.full.rejectedRecipient]);
    assert.deepEqual(rejected.result.ok === false && [rejected.result.transient, rejected.result.stage], [false, 'rcpt']);
    assert.match(rejected.result.reply, /^550 /);
    assert.deepEqual(await mta.full.messages(), []);
  });

  test('sendWithRetry tries transient failures again, a bounded number of times, and permanent ones once', async () => {
    const config = configFor(mta.full, 'starttls');
    const message = composeMessage({ from: config.from, to: [mta.full.deferredRecipient], subject: 's', body: 'b', date: new Date(), messageId: newMessageId(config.from) });
    const started = Date.now();
    const transient = await sendWithRetry(config, message, { to: [mta.full.deferredRecipient] }, 3, 20);
    assert.equal(transient.attempts, 3);
    assert.ok(Date.now() - started >= 20 + 40, 'backs off between attempts');
    const permanent = await sendWithRetry(config, message, { to: [mta.full.rejectedRecipient] }, 3, 20);
    assert.equal(permanent.attempts, 1);
    assert.equal(permanent.ok, false);
    results.push(transient, permanent);
  });

  test('a closed port fails at once, transient', async () => {
    const config = { ...configFor(mta.full, 'starttls'), port: await findClosedPort() };
    const { result } = await send(config, ['ops@example.test']);
    assert.deepEqual(result.ok === false && [result.transient, result.stage], [true, 'connect']);
    assert.match(result.reply, /ECONNREFUSED/);
  });

  test('a server that stops answering cannot hold the mail past its deadlines', async () => {
    const silent = await startSilentServer();
    const greetsOnly = await startSilentServer({ greeting: '220 hello, and then nothing\r\n' });
    const timeouts = { connectMs: 300, replyMs: 300, totalMs: 30_000 };
    try {
      const cases = [
        { server: silent, security: 'starttls', stage: 'greeting', timeouts },
        { server: silent, security: 'implicit-tls', stage: 'connect', timeouts },
        { server: greetsOnly, security: 'starttls', stage: 'ehlo', timeouts },
        // The whole-transaction deadline cuts a step short even when the step's own is longer.
        { server: greetsOnly, security: 'starttls', stage: 'ehlo', timeouts: { connectMs: 5_000, replyMs: 5_000, totalMs: 300 } },
      ] as const;
      for (const { server, security, stage, timeouts } of cases) {
        const config: MailConfig = { ...configFor(mta.full, 'starttls'), security, port: server.port };
        const started = Date.now();
        const { result } = await send(config, ['ops@example.test'], 's', timeouts);
        const elapsed = Date.now() - started;
        assert.deepEqual(result.ok === false && [result.transient, result.stage], [true, stage], JSON.stringify(result));
        // The step that gave up names its deadline: the 300 ms one, not a longer one (5 s, 30 s) nor a default.
        assert.ok(Number(/within (\d+) ms$/.exec(result.ok === false ? result.reply : '')?.[1]) <= 300, JSON.stringify(result));
        assert.ok(elapsed >= 250 && elapsed < 5_000, `gave up after ${elapsed} ms`);
      }
    } finally {
      await Promise.all([silent.close(), greetsOnly.close()]);
    }
  });

  test('misbehaving peers: an echo of the credentials is redacted; garbage and STARTTLS injection are refused', async () => {
    const ehlo = (extensions: string[]) => [`250-stub`, ...extensions.map((e, i) => `250${i === extensions.length - 1 ? ' ' : '-'}${e}`)].join('\r\n') + '\r\n';
    const echoing = (mechanism: string) =>
      startScriptedServer({
        greeting: '220 stub\r\n',
        answer: (line) => {
          if (line.startsWith('EHLO')) return ehlo([`AUTH ${mechanism}`]);
          if (line === 'AUTH LOGIN' || line === b64(mta.full.user)) return '334 go on\r\n';
          // Careless servers quote the offending line in their error, sometimes decoded.
          const payload = line.replace(/^AUTH PLAIN /, '');
          return `535 5.7.8 rejected ${line} (${Buffer.from(payload, 'base64').toString('utf8')})\r\n`;
        },
      });
    for (const mechanism of ['PLAIN', 'LOGIN']) {
      const server = await echoing(mechanism);
      try {
        const config = { ...configFor(mta.full, 'starttls', { MAIL_ALLOW_PLAINTEXT_AUTH: 'true' }), port: server.port };
        const { result } = await send(config, ['ops@example.test']);
        assert.deepEqual(result.ok === false && [result.stage, result.transient], ['auth', false]);
        assert.match(result.reply, /^535 5\.7\.8 rejected.*\[redacted\]/);
        assert.ok(!result.reply.includes(mta.full.password) && !result.reply.includes(b64(mta.full.password)), result.reply);
      } finally {
        await server.close();
      }
    }

    const http = await startScriptedServer({ greeting: 'HTTP/1.1 400 Bad Request\r\n\r\n' });
    const injecting = await startScriptedServer({
      greeting: '220 stub\r\n',
      answer: (line) => (line.startsWith('EHLO') ? ehlo(['STARTTLS']) : line === 'STARTTLS' ? '220 go ahead\r\n250 injected\r\n' : undefined),
    });
    try {
      const notSmtp = await send({ ...configFor(mta.full, 'starttls'), port: http.port }, ['ops@example.test']);
      assert.deepEqual(notSmtp.result.ok === false && [notSmtp.result.stage, notSmtp.result.transient], ['greeting', false]);
      assert.match(notSmtp.result.reply, /not an SMTP reply/);
      const injected = await send({ ...configFor(mta.full, 'starttls'), port: injecting.port }, ['ops@example.test']);
      assert.deepEqual(injected.result.ok === false && [injected.result.stage, injected.result.transient], ['starttls', false]);
      assert.match(injected.result.reply, /data after its STARTTLS reply/);
    } finally {
      await Promise.all([http.close(), injecting.close()]);
    }
  });

  test('no result carries the password, in any form', () => {
    assert.ok(results.length > 10);
    const text = JSON.stringify(results);
    for (const server of Object.values(mta)) {
      for (const secret of [server.password, b64(server.password), b64(`\0${server.user}\0${server.password}`)]) {
        assert.ok(!text.includes(secret));
      }
    }
  });
});

// ---- result mails from the running service (the built executable over real HTTP and SMTP) ----

describe('result mails from the running service', () => {
  let mta: Mta;
  const started: Webhook[] = [];
  before(async () => { mta = await startMta(); });
  after(async () => {
    await Promise.all(started.map((w) => w.stop()));
    await mta.stop();
  });

  /** A hook like the seed: APP_* from the URL, MAIL_TO a literal; its command prints a report. */
  function serve(mailEnv: Record<string, string>, extraArgs: string[] = [], exitCode = 0): Promise<Webhook> {
    const dir = makeTempDir();
    const script = join(dir, 'report.sh');
    writeFileSync(script, `#!/bin/sh\necho "image after: registry.example.com/ns/app:v2"\necho ".a line starting with a dot"\nexit ${exitCode}\n`, { mode: 0o755 });
    const hooks = [{
      id: 'web', 'execute-command': script, 'include-command-output-in-response': true, 'include-command-output-in-response-on-error': true,
      'pass-environment-to-command': [
        { envname: 'APP_NS', source: 'url', name: 'ns' }, { envname: 'APP_WORKLOAD', source: 'url', name: 'workload' },
        { envname: 'APP_CONTAINER', source: 'url', name: 'container' }, { envname: 'MAIL_TO', source: 'string', name: 'ops@example.com, Dev@Example.com' },
      ],
    }];
    return startWebhook({ hooks, env: mailEnv, args: extraArgs, metrics: true }).then((w) => { started.push(w); return w; });
  }
  const env = (port: number, overrides: Record<string, string> = {}) => ({ ...serviceMailEnv(mta, port), ...overrides });
  const push = (wh: Webhook) => wh.request('/hooks/web?ns=prod&workload=deployment/web&container=app', { method: 'POST' });
  const metric = async (wh: Webhook, result: string) => Number(/webhook_mails_total\{result="(\w+)"\} (\d+)/g.exec((await wh.metrics()).body)?.[1] === result ? 1 : 0);

  test('a finished command is mailed over STARTTLS: subject, recipients, Date, body; no password anywhere', async () => {
    await mta.clear();
    const wh = await serve(env(mta.starttlsPort));
    const res = await push(wh);
    assert.equal(res.status, 200);
    // One delivered file per recipient; waiting for both keeps a late copy out of the next test.
    const [raw] = await mta.waitForMessages(2, 15_000);
    const message = readDelivered(raw);
    assert.equal(decodeHeader(header(message, 'Subject')), 'Webhooks通知: prod-deployment/web-app 更新结果: succeeded');
    assert.equal(header(message, 'To'), 'ops@example.com, Dev@Example.com');
    assert.match(header(message, 'Date'), /^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{2} (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d{2}:\d{2}:\d{2} \+0000$/);
    assert.match(message.body, new RegExp(`hook: web\\r\\nrequest: ${res.headers['x-request-id']}\\r\\n`));
    assert.match(message.body, /outcome: succeeded \(exit status 0\)/);
    assert.match(message.body, /\r\n\.a line starting with a dot\r\n/);
    await waitForOutput(wh, 'mail sent to ops@example.com, Dev@Example.com over STARTTLS (detected): 250 ');
    await wh.stop();
    assert.equal(wh.output().includes(mta.password), false);
    assert.equal(wh.output().includes(b64(mta.password)), false);
  });

  test('implicit TLS works too, and a failed command says so in the subject', async () => {
    await mta.clear();
    const wh = await serve(env(mta.tlsPort, { MAIL_TLS_MODE: 'implicit' }), [], 4);
    assert.equal((await push(wh)).status, 500);
    const [raw] = await mta.waitForMessages(2, 15_000);
    assert.equal(decodeHeader(header(readDelivered(raw), 'Subject')), 'Webhooks通知: prod-deployment/web-app 更新结果: failed');
    assert.match(readDelivered(raw).body, /outcome: failed \(exit status 4\)/);
  });

  test('implicit TLS on a port other than 465, no MAIL_TLS_MODE (old-image setups): detected and logged', async () => {
    await mta.clear();
    const wh = await serve(env(mta.tlsPort));
    assert.equal((await push(wh)).status, 200);
    const [raw] = await mta.waitForMessages(2, 15_000);
    const subject = decodeHeader(header(readDelivered(raw), 'Subject'));
    assert.equal(subject, 'Webhooks通知: prod-deployment/web-app 更新结果: succeeded');
    await waitForOutput(wh, 'mail sent to ops@example.com, Dev@Example.com over implicit TLS (detected): 250 ', 15_000);
  });

  test('a wrong password (535) is logged with the reply and counted; the answer is unaffected', async () => {
    await mta.clear();
    const wh = await serve(env(mta.starttlsPort, { MAIL_PASSWORD: b64('not-the-password') }));
    const res = await push(wh);
    assert.deepEqual([res.status, res.body], [200, 'image after: registry.example.com/ns/app:v2\n.a line starting with a dot\n']);
    const logged = /mail for hook web not sent: auth failed after 1 attempt\(s\) over STARTTLS \(detected\): 535/;
    const out = await waitForOutput(wh, logged, 15_000);
    assert.equal(out.includes('not-the-password'), false);
    assert.equal(await metric(wh, 'failed'), 1);
    assert.deepEqual(await mta.messages(), []);
  });

  test('an untrusted certificate with checking on fails cleanly; MAIL_TLS_CHECK=false then delivers', async () => {
    await mta.clear();
    const strict = await serve(env(mta.starttlsPort, { MAIL_CACERT: b64(mta.otherCaPem) }));
    assert.equal((await push(strict)).status, 200);
    await waitForOutput(strict, /mail for hook web not sent: starttls failed .*certificate not trusted/, 15_000);
    const lax = await serve(env(mta.starttlsPort, { MAIL_CACERT: '', MAIL_TLS_CHECK: 'false' }));
    assert.equal((await push(lax)).status, 200);
    await mta.waitForMessages(2, 15_000);
  });

  test('a closed port and a server that never answers do not delay the answer', async () => {
    const closed = await serve(env(await findClosedPort()));
    const silent = await startSilentServer();
    const hung = await serve(env(silent.port));
    try {
      // The server that never answers: the mail, finding it silent, sends a TLS hello once the
      // detection silence is over; by then the answer has come.
      let answer: Response | undefined;
      const answered = push(hung).then((res) => (answer = res));
      await silent.heard;
      assert.equal(answer?.status, 200, 'the HTTP answer does not wait for SMTP');
      await answered;
      // The closed port: three tries, seconds apart; the answer is logged before their outcome.
      const res = await push(closed);
      assert.equal(res.status, 200);
      const out = await waitForOutput(closed, /mail for hook web not sent: connect failed after 3 attempt\(s\): .*ECONNREFUSED/, 20_000);
      const answerLine = out.indexOf(`[${res.headers['x-request-id']}] 127.0.0.1:`);
      assert.ok(answerLine !== -1 && answerLine < out.indexOf('mail for hook web not sent'), 'the HTTP answer does not wait for SMTP');
    } finally {
      await silent.close();
    }
  });

  test('MAIL_* values that do not decode are reported by name, never value; hooks keep working', async () => {
    const wh = await serve({ MAIL_SMTP_SERVER: b64('localhost'), MAIL_FROM: 'not base64 at all!', MAIL_SMTP_PORT: '70000', MAIL_PASSWORD: b64('pw-xyz-123') });
    assert.match(wh.output(), /mail is off: MAIL_FROM: not valid base64/);
    assert.match(wh.output(), /mail is off: MAIL_SMTP_PORT: not a port number/);
    assert.equal(wh.output().includes('not base64 at all!'), false);
    assert.equal(wh.output().includes('70000'), false);
    assert.equal((await push(wh)).status, 200);
  });

  /** Each delivered file (one per recipient) as its decoded subject and body. */
  const delivered = async (n: number, timeoutMs = 15_000) =>
    (await mta.waitForMessages(n, timeoutMs)).map(readDelivered).map((m) => ({ subject: decodeHeader(header(m, 'Subject')), body: m.body }));
  const SUCCEEDED = 'Webhooks通知: prod-deployment/web-app 更新结果: succeeded';

  test('a burst beyond -max-mails-per-hook becomes one summary mail when the window closes', async () => {
    await mta.clear();
    const wh = await serve(env(mta.starttlsPort), ['-max-mails-per-hook', '1', '-mail-window', '3s']);
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const res = await push(wh);
      assert.equal(res.status, 200);
      ids.push(String(res.headers['x-request-id']));
    }
    // One mail, then the summary of the other two; each to both recipients.
    const mails = await delivered(4, 30_000);
    assert.deepEqual(mails.map((m) => m.subject).sort(), [SUCCEEDED, SUCCEEDED, 'Webhooks通知: web 更新结果: summary of 2 more', 'Webhooks通知: web 更新结果: summary of 2 more'].sort());
    assert.match(mails.find((m) => m.subject === SUCCEEDED)!.body, new RegExp(`request: ${ids[0]}`));
    const summary = mails.find((m) => m.subject !== SUCCEEDED)!.body;
    for (const id of ids.slice(1)) assert.match(summary, new RegExp(`^request ${id}: prod-deployment/web-app: succeeded \\(exit status 0\\)\r?$`, 'm'));
    assert.match(wh.output(), /warning: \[[^\]]+\] hook web sent 1 mail\(s\) to ops@example\.com, Dev@Example\.com within 3s; further results go into one summary mail/);
    assert.match((await wh.metrics()).body, /webhook_mails_total\{result="summarized"\} 2/);
  });

  test('results held back for a summary are mailed at SIGTERM: nothing is dropped', async () => {
    await mta.clear();
    const wh = await serve(env(mta.starttlsPort), ['-max-mails-per-hook', '2', '-mail-window', '1h']);
    for (let i = 0; i < 5; i++) assert.equal((await push(wh)).status, 200);
    wh.proc.kill('SIGTERM');
    assert.equal((await wh.exited).code, 0);
    const mails = await delivered(6);
    assert.equal(mails.filter((m) => m.subject === SUCCEEDED).length, 4);
    const summaries = mails.filter((m) => m.subject === 'Webhooks通知: web 更新结果: summary of 3 more');
    assert.equal(summaries.length, 2);
    assert.equal(summaries[0].body.match(/^request \S+: prod-deployment\/web-app: succeeded/gm)?.length, 3);
  });

  test('a mail still being sent at SIGTERM is flushed before exit', async () => {
    await mta.clear();
    const wh = await serve(env(mta.starttlsPort));
    assert.equal((await push(wh)).status, 200);
    wh.proc.kill('SIGTERM');
    assert.equal((await wh.exited).code, 0);
    // One delivered file per recipient.
    const delivered = await mta.waitForMessages(2, 5_000);
    assert.equal(decodeHeader(header(readDelivered(delivered[0]), 'Subject')), 'Webhooks通知: prod-deployment/web-app 更新结果: succeeded');
  });
});
