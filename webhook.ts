/*
 * webhook — an image-push webhook receiver for Kubernetes.
 *
 * A drop-in replacement for adnanh/webhook 2.8 (same command line, same hook files, same URLs,
 * same answers) in one file with no runtime dependencies beyond Node's built-ins. It serves
 * `POST /hooks/<id>`, checks the hook's trigger rule and runs the hook's command. The command
 * every deployment uses, /webhooks.sh, is built in: it upgrades the named container of the named
 * workload to the image the registry just pushed, over the Kubernetes API, and the result is
 * mailed when the hook passes MAIL_TO.
 *
 * Chapters, in order. Part I holds the libraries the program needs and has no dependency for; they use
 * nothing of the service. Part II is the service, in the order a push travels: main (45) opens the
 * listeners (21) with the http server's handler (20), which uses the request, rule and hook chapters
 * above it and hands the command to the runner (19), whose in-process command is the upgrade (22-38): the
 * model (22) names its vocabulary, a boundary builds the push, the decision (31) decides it, the executor (32)
 * carries it out. After the answer the result travels on in order too: the approvals (39) learn of waiting pushes
 * and decide them, the rollout follower (38) follows the rollout and
 * hands each step to the result (40), which records it and, once final, sends it to the mail (41) and
 * the chat and JSON receivers (42); the deliveries page (43) renders the records. No chapter uses a name a later one
 * defines; where an earlier chapter hands work on, it declares the small interface it needs
 * (InProcessCommand, CommandListener, AdminPages, ApprovalPages, ResultListener, ResultChannel, HookSettingChecks)
 * and main() wires the later chapter in.
 *
 * Part I — libraries
 *   1. reading text ............... formatGoDuration, isObject, JsonNumber, MONTHS
 *   2. yaml scanner ............... Scanner, YamlError, LineMap
 *   3. yaml parser ................ parseYaml, scalarAsGoString
 *   4. go template ................ renderTemplate, TemplateEnv
 *   5. go regexp .................. compileGoRegex
 *   6. semver ..................... compareVersions, parseRange, parseVersion, satisfiesRange
 *   7. outbound calls ............. outboundRequest, retrying, Scrubber, TokenBucket, withDeadline
 *   8. smtp client ................ composeMessage, DEFAULT_SMTP_PORT, IMPLICIT_TLS_PORT, isAddress
 *   9. kubernetes client .......... describeResource, JsonPatchOperation, KubeClient, KubeCredentials
 *  10. kubeconfig ................. contextCredentials, credentialsFromEnvironment, readKubeconfig
 *  11. oci registry client ........ RegistryLogin, resolveManifestTag, readCosignSignatures, verifyCosignSignatures
 *  12. html ....................... cell, escapeHtml, pageShell, shownTime
 * Part II — the service
 *  13. command line & settings .... LIMITS, Options, parseCommandLine, parseGoBool
 *  14. logging & metrics .......... escapeControls, Logger, Metrics
 *  15. hook files ................. CompileSinks, ConfigError, FieldReader, Fields
 *  16. requests ................... applyJsonParameters, compileParam, firstValues, headersFromRaw
 *  17. trigger rules .............. compileRule, evaluateRule, evaluateRuleBeforeBody, Match
 *  18. hooks & reload ............. Hook, HookSettingChecks, HookStore, LoadSettings
 *  19. commands ................... CommandResult, CommandRunner, decodeBase64Strict, InProcessCommand
 *  20. http server ................ AdminPages, allowedMethods, answerClientError, CommandListener
 *  21. listeners .................. openListener, openAdminListener, tlsOptions
 *  22. the model .................. DECISIONS, ANNOTATIONS, PENDING_ANNOTATION
 *  23. registry payloads .......... parsePushPayload, parsePushHeaders, PayloadFields, PushEvent
 *  24. cloud registry payloads .... REGISTRIES, REPO_TYPES, registryFor, recognisedRepoType
 *  25. image reference & pin ...... checkImagePin, chooseCandidate, composeImageRef, readImagePin
 *  26. change windows & approvals  nextOpening, parseDeployWindows, PendingEntry, approvalLinks
 *  27. workloads .................. WORKLOAD_KINDS, parseWorkload, locateContainer, rolloutStatus
 *  28. update policies ............ parsePolicy, policyDecision, UpdatePolicy
 *  29. hook settings .............. HOOK_SETTINGS, fixedSettingChecks
 *  30. upgrade decision ........... decidePush, holdDecision, pushEvent, readPushRecords, verifiedRef
 *  31. the decision ............... decide, Decision, DecisionInput, waitingAction
 *  32. the cluster executor ....... carryOut, recordDecision
 *  33. the report ................. formatForcedRollback, formatReport, formatRollback, formatRollout
 *  34. rollout follow ............. claimFollow, followRollout, resumedReport, rolloutEvent
 *  35. rollback ................... rollBackFailedRollout
 *  36. least privilege ............ formatRbac, hookReach, HookReach, upgradeInput
 *  37. the upgrade ................ runUpgrade, runDecidedPush, upgradeResult
 *  38. the upgrade service ........ UpgradeService, RolloutFollower, hookClusters
 *  39. approvals .................. approvalHooksProblem, ApprovalService, WaitingPush
 *  40. the result ................. DeliveryLog, ResultDispatcher, pushResult, ResultChannel
 *  41. mail ....................... Mailer, parseMailConfig
 *  42. chat & json notifications .. Notifier, NOTIFY_FORMATS, resultDocument
 *  43. deliveries page ............ deliveryPages
 *  44. -validate & -print-rbac .... hookLoadSettings, validate
 *  45. main ....................... main
 *
 * Each banner's "Exports" lists the names later chapters use and "Tests" the test files that cover it
 * (test/structure.test.ts checks both).
 * `export` on any other name makes it reachable from the tests, nothing more.
 *
 * Invariants:
 *   - Configuration is an immutable snapshot swapped atomically on reload; a request sees exactly
 *     one snapshot from start to end, and a snapshot that fails validation never replaces a good one.
 *   - No global is mutated after start-up; state lives in the objects main() wires together.
 *   - Secrets (values a template inserted such as the token, HMAC and Scalr secrets, the SMTP
 *     password, the service-account token) never appear in a log line, an error message or a
 *     response; query parameters compared by `value` rules are redacted in the access log.
 *   - Every wait has a deadline: request headers and bodies, commands, Kubernetes and SMTP calls,
 *     shutdown.
 *   - A request body is kept only when the hook uses it, and never beyond -max-body-size; a request
 *     that fails the rule's body-free matches is answered before its body is read.
 *   - Hook regexes run in linear time; nothing from the environment adds code (scripts/build.ts).
 */

import { spawn, type ChildProcess } from 'node:child_process';
import {
  constants as cryptoConstants, createHash, createHmac, createPublicKey, hash, type KeyObject, randomBytes, randomUUID,
  timingSafeEqual, verify as cryptoVerify, X509Certificate,
} from 'node:crypto';
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as http from 'node:http';
import * as https from 'node:https';
import * as net from 'node:net';
import { hostname, tmpdir } from 'node:os';
import * as path from 'node:path';
import * as tls from 'node:tls';
import { isSea } from 'node:sea';
import type { Duplex } from 'node:stream';
import { StringDecoder } from 'node:string_decoder';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { getHeapStatistics, setFlagsFromString } from 'node:v8';

const VERSION = '0.1.0';


// ################################################################################################
// Part I — libraries: general code written by hand because the program has no runtime dependencies.
// No chapter of Part I uses a name of Part II; each could be lifted out as it is.
// ################################################################################################

// ================================================================================================
// 1. reading text — small readers and writers every later chapter shares: TextCursor (a position in a text read by
//    hand), JSON with every number kept as its literal text (JsonNumber, as Go's json.Number keeps it), XML read into
//    a map the way adnanh's mxj library does, values quoted for messages (showValue: JSON-escaped and truncated,
//    since payload values are untrusted) and lists of them cut to a line (listWithin), Go durations written the way
//    Go prints them.
//    Exports: formatGoDuration, isObject, JsonNumber, listWithin, MONTHS, parseJsonKeepingNumbers, parseXml,
//    previewValue, showValue, TextCursor.
//    Tests: test/unit.test.ts, test/upgrade.test.ts.
// ================================================================================================

export function formatGoDuration(ms: number): string {
  if (ms === 0) return '0s';
  const h = Math.floor(ms / 3_600_000);
  const m = Math.floor((ms % 3_600_000) / 60_000);
  const s = (ms % 60_000) / 1000;
  return (h ? `${h}h` : '') + (h || m ? `${m}m` : '') + `${s}s`;
}

/** English month abbreviations, as Go's time layouts and RFC 5322 dates spell them. */
export const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];

/** A position in a text read by hand (the XML reader, the Go regex translator). */
export class TextCursor {
  protected readonly text: string;
  protected at = 0;

  constructor(text: string) {
    this.text = text;
  }

  atEnd(): boolean {
    return this.at >= this.text.length;
  }
}

// Payload values are untrusted and can be long (a README); messages show at most this much.
const MAX_SHOWN_VALUE_LENGTH = 80;

/** A value quoted for a message: JSON-escaped (no control characters reach a log), truncated. */
export function showValue(value: string): string {
  if (value.length <= MAX_SHOWN_VALUE_LENGTH) return JSON.stringify(value);
  return `${previewValue(value)} (${value.length} characters)`;
}

/** showValue without the length, for messages that state the length themselves. */
function previewValue(value: string): string {
  return value.length <= MAX_SHOWN_VALUE_LENGTH
    ? JSON.stringify(value)
    : `${JSON.stringify(value.slice(0, MAX_SHOWN_VALUE_LENGTH))}…`;
}

// A list built from payload data (why a batch's events were ignored, the images one delivery announced) is shown up
// to this many characters: a reason is one line a person reads in an answer, a log line and the deliveries page,
// whatever the payload holds (a 1 MiB body of empty events once made an 8.8 MB reason); the rest is counted.
const MAX_LISTED_CHARS = 1024;

/** Items joined by `separator` up to MAX_LISTED_CHARS, then `… and N more`. Pure. */
export function listWithin(items: readonly string[], separator = ', '): string {
  let text = '';
  for (const [i, item] of items.entries()) {
    const next = i === 0 ? item : `${text}${separator}${item}`;
    if (next.length <= MAX_LISTED_CHARS) {
      text = next;
      continue;
    }
    const shown = i === 0 ? `${item.slice(0, MAX_LISTED_CHARS)}…` : text;
    const rest = items.length - Math.max(i, 1);
    return rest > 0 ? `${shown} … and ${rest} more` : shown;
  }
  return text;
}

/** A JSON number kept as its literal text ("1.50" stays "1.50"), as Go's json.Number does. */
export class JsonNumber {
  readonly text: string;
  constructor(text: string) {
    this.text = text;
  }
}

/**
 * JSON.parse, with every number kept as its literal text (JsonNumber). The native parser checks
 * the text (so what it refuses, and how, stays JSON.parse's); a document that holds a number is
 * then read again by JsonReader, which is several times faster than JSON.parse with a reviver
 * reading each number's source text (bench/json.ts). ACR payloads hold no number at all.
 */
export function parseJsonKeepingNumbers(text: string): unknown {
  const plain: unknown = JSON.parse(text);
  if (!containsNumber(plain)) return plain;
  return new JsonReader(text).value();
}

function containsNumber(value: unknown): boolean {
  if (typeof value === 'number') return true;
  if (value === null || typeof value !== 'object') return false;
  for (const v of Array.isArray(value) ? value : Object.values(value)) if (containsNumber(v)) return true;
  return false;
}

/**
 * Reads a text JSON.parse has already accepted, keeping numbers as JsonNumber: it needs no error
 * handling of its own. Objects are built as JSON.parse builds them (a repeated key's last value
 * wins; "__proto__" is an own property, never the prototype).
 */
class JsonReader extends TextCursor {
  /** Where the next backslash is, at or after the cursor (Infinity: none): found once, not per string. */
  private backslash = -1;

  value(): unknown {
    const c = this.skipSpace();
    if (c === 0x7b) return this.object();
    if (c === 0x5b) return this.array();
    if (c === 0x22) return this.string();
    if (c === 0x74 || c === 0x6e) return this.word(c === 0x74 ? true : null, 4);
    if (c === 0x66) return this.word(false, 5);
    return this.number();
  }

  private skipSpace(): number {
    let c = this.text.charCodeAt(this.at);
    while (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) c = this.text.charCodeAt(++this.at);
    return c;
  }

  private word(value: boolean | null, length: number): boolean | null {
    this.at += length;
    return value;
  }

  /** Digits, sign, point and exponent: the literal as written. */
  private number(): JsonNumber {
    const start = this.at;
    let c = this.text.charCodeAt(this.at);
    while ((c >= 0x30 && c <= 0x39) || c === 0x2d || c === 0x2b || c === 0x2e || c === 0x65 || c === 0x45)
      c = this.text.charCodeAt(++this.at);
    return new JsonNumber(this.text.slice(start, this.at));
  }

  /** A string: sliced as it is when it has no escape, else its token decoded by JSON.parse. */
  private string(): string {
    const start = this.at + 1;
    let end = this.text.indexOf('"', start);
    if (this.backslash < start) {
      const found = this.text.indexOf('\\', start);
      this.backslash = found < 0 ? Infinity : found;
    }
    if (this.backslash > end) {
      this.at = end + 1;
      return this.text.slice(start, end);
    }
    for (end = this.backslash; this.text.charCodeAt(end) !== 0x22; ) end += this.text.charCodeAt(end) === 0x5c ? 2 : 1;
    this.at = end + 1;
    return JSON.parse(this.text.slice(start - 1, end + 1)) as string;
  }

  private array(): unknown[] {
    const out: unknown[] = [];
    this.at++;
    if (this.skipSpace() === 0x5d) {
      this.at++;
      return out;
    }
    for (;;) {
      out.push(this.value());
      const c = this.skipSpace();
      this.at++;
      if (c === 0x5d) return out;
    }
  }

  private object(): Record<string, unknown> {
    const out: Record<string, unknown> = {};
    this.at++;
    if (this.skipSpace() === 0x7d) {
      this.at++;
      return out;
    }
    for (;;) {
      this.skipSpace();
      const key = this.string();
      this.skipSpace();
      this.at++;
      const value = this.value();
      const own = { value, writable: true, enumerable: true, configurable: true };
      if (key === '__proto__') Object.defineProperty(out, key, own);
      else out[key] = value;
      const c = this.skipSpace();
      this.at++;
      if (c === 0x7d) return out;
    }
  }
}

/**
 * XML to a map the way adnanh's mxj library does it: the root element is the single top key,
 * attributes become "-name", text beside attributes or children becomes "#text", repeated
 * elements become arrays, all values are strings.
 */
export function parseXml(text: string): Record<string, unknown> {
  const reader = new XmlReader(text);
  reader.skipMisc();
  const [rootName, root] = reader.element();
  reader.skipMisc();
  if (!reader.atEnd()) reader.fail('content after the root element');
  return { [rootName]: root };
}

const XML_ENTITIES: Record<string, string> = { lt: '<', gt: '>', amp: '&', quot: '"', apos: "'" };

class XmlReader extends TextCursor {
  fail(what: string): never {
    throw new Error(`${what} at offset ${this.at}`);
  }

  private static decode(s: string): string {
    return s.replace(/&(#x[0-9A-Fa-f]+|#\d+|[a-z]+);/g, (all, e: string) =>
      e[0] === '#'
        ? String.fromCodePoint(e[1] === 'x' ? parseInt(e.slice(2), 16) : Number(e.slice(1)))
        : (XML_ENTITIES[e] ?? all),
    );
  }

  private static localName(n: string): string {
    return n.slice(n.indexOf(':') + 1);
  }

  private skipPast(close: string, what: string): void {
    const e = this.text.indexOf(close, this.at);
    if (e < 0) this.fail(`unterminated ${what}`);
    this.at = e + close.length;
  }

  /** Whitespace, processing instructions, comments and a DOCTYPE. */
  skipMisc(): void {
    for (;;) {
      while (/\s/.test(this.text[this.at] ?? '')) this.at++;
      if (this.text.startsWith('<?', this.at)) this.skipPast('?>', 'processing instruction');
      else if (this.text.startsWith('<!--', this.at)) this.skipPast('-->', 'comment');
      else if (this.text.startsWith('<!DOCTYPE', this.at)) this.skipPast('>', 'DOCTYPE');
      else return;
    }
  }

  /** One element as [name, value]: its text, or a map of attributes, children and "#text". */
  element(): [string, unknown] {
    const m = /^<([A-Za-z_][\w.:-]*)/.exec(this.text.slice(this.at, this.at + 256));
    if (!m) this.fail('expected an element');
    this.at += m[0].length;
    const name = XmlReader.localName(m[1]);
    const node: Record<string, unknown> = {};
    if (this.attributes(node)) return [name, Object.keys(node).length ? node : ''];
    const textContent = this.content(name, node).trim();
    if (Object.keys(node).length === 0) return [name, textContent];
    if (textContent !== '') node['#text'] = textContent;
    return [name, node];
  }

  /** Reads attributes into node as "-name"; true when the element closed itself (`/>`). */
  private attributes(node: Record<string, unknown>): boolean {
    for (;;) {
      while (/\s/.test(this.text[this.at] ?? '')) this.at++;
      if (this.text.startsWith('/>', this.at)) {
        this.at += 2;
        return true;
      }
      if (this.text[this.at] === '>') {
        this.at++;
        return false;
      }
      const a = /^([A-Za-z_][\w.:-]*)\s*=\s*("([^"]*)"|'([^']*)')/.exec(this.text.slice(this.at, this.at + 65536));
      if (!a) this.fail('malformed attribute');
      this.at += a[0].length;
      if (!a[1].startsWith('xmlns')) node['-' + XmlReader.localName(a[1])] = XmlReader.decode(a[3] ?? a[4]);
    }
  }

  /** Children (repeated names become arrays) into node, up to the closing tag; returns the text. */
  private content(name: string, node: Record<string, unknown>): string {
    let text = '';
    for (;;) {
      if (this.atEnd()) this.fail(`unterminated element <${name}>`);
      if (this.text.startsWith('</', this.at)) {
        const e = this.text.indexOf('>', this.at);
        if (e < 0 || XmlReader.localName(this.text.slice(this.at + 2, e).trim()) !== name)
          this.fail(`mismatched closing tag for <${name}>`);
        this.at = e + 1;
        return text;
      }
      if (this.text.startsWith('<![CDATA[', this.at)) {
        const e = this.text.indexOf(']]>', this.at);
        if (e < 0) this.fail('unterminated CDATA');
        text += this.text.slice(this.at + 9, e);
        this.at = e + 3;
      } else if (this.text.startsWith('<!--', this.at) || this.text.startsWith('<?', this.at)) {
        this.skipMisc();
      } else if (this.text[this.at] === '<') {
        const [childName, child] = this.element();
        const existing = node[childName];
        if (existing === undefined) node[childName] = child;
        else if (Array.isArray(existing)) existing.push(child);
        else node[childName] = [existing, child];
      } else {
        const e = this.text.indexOf('<', this.at);
        text += XmlReader.decode(this.text.slice(this.at, e < 0 ? this.text.length : e));
        this.at = e < 0 ? this.text.length : e;
      }
    }
  }
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

// ================================================================================================
// 2. yaml scanner — hook files are read as adnanh reads them. adnanh reads every hooks file (JSON ones too) with
//    github.com/ghodss/yaml, which runs gopkg.in/yaml.v2 (the 2017 revision eb3733d vendored in 2.8.0, a Go port of
//    libyaml 0.1) and turns the result into JSON, so this reader follows that code closely in three stages. This
//    chapter is the first: the Scanner turns characters into tokens, with libyaml's indentation stack and "simple
//    key" bookkeeping, because that is where YAML's context rules (and most of its error cases) live. Error messages
//    carry a position and never the text of a scalar: hook files hold secrets.
//    Exports: failAt, LineMap, Mark, MAX_DEPTH, MAX_NODES, readChars, Scanner, Token, TokenType, YamlError.
//    Tests: test/yaml.test.ts.
// ================================================================================================

/** Line numbers of every key (objects) and index (arrays) of a parsed document. */
export type LineMap = WeakMap<object, Map<string, number>>;

export class YamlError extends Error {
  readonly line: number;
  readonly column: number;
  constructor(line: number, column: number, what: string) {
    super(`line ${line}, column ${column}: ${what}`);
    this.name = 'YamlError';
    this.line = line;
    this.column = column;
  }
}

/** A position, all counted from 0; `index` counts characters (code points) from the start. */
interface Mark {
  index: number;
  line: number;
  column: number;
}

function failAt(mark: Mark, what: string, context?: string, contextMark?: Mark): never {
  const at = contextMark && `line ${contextMark.line + 1}, column ${contextMark.column + 1}`;
  const where = context && at ? ` (${context} at ${at})` : '';
  throw new YamlError(mark.line + 1, mark.column + 1, what + where);
}

// Nesting deeper than this is refused, so that a hostile file cannot exhaust the JS stack.
const MAX_DEPTH = 1000;
// Aliases may not blow a document up past this many nodes ("billion laughs").
const MAX_NODES = 1_000_000;

// ---------------------------------------------------------------------------------------------
// Characters

function isBreak(c: string): boolean {
  return c === '\n' || c === '\r' || c === '\u0085' || c === '\u2028' || c === '\u2029';
}
function isBlank(c: string): boolean {
  return c === ' ' || c === '\t';
}
/** '\0' marks the end of the input: the reader has refused every real NUL. */
function isBreakZ(c: string): boolean {
  return c === '\0' || isBreak(c);
}
function isBlankZ(c: string): boolean {
  return isBlank(c) || isBreakZ(c);
}
/** The characters of anchor names and tag handles. */
function isAlpha(c: string): boolean {
  return /^[0-9A-Za-z_-]$/.test(c);
}
function isHex(c: string): boolean {
  return /^[0-9A-Fa-f]$/.test(c);
}
/** How many bytes a UTF-8 sequence starting with this byte has; 0 if it cannot start one. */
function utf8Width(octet: number): number {
  if (octet < 0x80) return 1;
  if ((octet & 0xe0) === 0xc0) return 2;
  if ((octet & 0xf0) === 0xe0) return 3;
  return (octet & 0xf8) === 0xf0 ? 4 : 0;
}

/** What libyaml's reader lets through: printable characters, tab and line breaks. */
function isAllowedChar(c: string): boolean {
  const v = c.codePointAt(0) ?? 0;
  if (v === 0x09 || v === 0x0a || v === 0x0d || v === 0x85) return true;
  if (v >= 0xd800 && v <= 0xdfff) return false; // a lone surrogate: not a character
  return (v >= 0x20 && v <= 0x7e) || (v >= 0xa0 && v <= 0xfffd) || (v >= 0x10000 && v <= 0x10ffff);
}

/**
 * The input as code points with a '\0' sentinel, after refusing what libyaml's reader refuses.
 * libyaml counts columns in characters, hence code points rather than UTF-16 units. A text without
 * surrogate pairs is its own code points, read in place: an array of them costs 8 bytes a character
 * (a 2,000-hook file's 4 MB would hold 32 MB, and twice that while the array grows).
 */
function readChars(text: string): ArrayLike<string> {
  const source = text.startsWith('\uFEFF') ? text.slice(1) : text;
  const input = source === '' ? '\n' : source; // yaml.v2 reads an empty input as "\n"
  const chars = /[\uD800-\uDBFF][\uDC00-\uDFFF]/.test(input) ? Array.from(input) : input;
  let line = 0;
  let column = 0;
  for (let i = 0; i < chars.length; i++) {
    const c = chars[i];
    if (!isAllowedChar(c)) failAt({ index: i, line, column }, 'control characters are not allowed');
    const lineEnds = isBreak(c) && !(c === '\r' && chars[i + 1] === '\n');
    line += lineEnds ? 1 : 0;
    column = lineEnds ? 0 : column + 1;
  }
  if (typeof chars === 'string') return `${chars}\0`;
  chars.push('\0');
  return chars;
}

// ---------------------------------------------------------------------------------------------
// Tokens

type TokenType =
  | 'stream-start'
  | 'stream-end'
  | 'version-directive'
  | 'tag-directive'
  | 'document-start'
  | 'document-end'
  | 'block-sequence-start'
  | 'block-mapping-start'
  | 'block-end'
  | 'flow-sequence-start'
  | 'flow-sequence-end'
  | 'flow-mapping-start'
  | 'flow-mapping-end'
  | 'block-entry'
  | 'flow-entry'
  | 'key'
  | 'value'
  | 'alias'
  | 'anchor'
  | 'tag'
  | 'scalar';

type ScalarStyle = 'plain' | 'single' | 'double' | 'literal' | 'folded' | '';

interface Token {
  type: TokenType;
  start: Mark;
  end: Mark;
  /** Scalar text, anchor or alias name, tag handle, %TAG handle, or "major.minor" of %YAML. */
  value: string;
  /** Tag suffix, or %TAG prefix. */
  suffix: string;
  style: ScalarStyle;
}

function newToken(type: TokenType, start: Mark, end: Mark, value = '', suffix = '', style: ScalarStyle = ''): Token {
  return { type, start, end, value: flatString(value), suffix, style };
}

/**
 * The string laid out flat. A scalar read a character at a time is, to V8, a rope of one piece per
 * character (some 30 bytes each) until something reads it whole; converting it to a number is such a
 * read, and V8 then keeps the text in one piece (as the flatstr package does). Without it, the node
 * tree of a 4 MB hooks file read by these stages held some 10 MB more until its values were decoded.
 */
function flatString(s: string): string {
  if (s.length > 12) Number(s);
  return s;
}

/** A place where a "key:" may turn out to have started (libyaml's simple key). */
interface SimpleKey {
  possible: boolean;
  required: boolean;
  tokenNumber: number;
  mark: Mark;
}

/** The whitespace and line breaks pending between two runs of text in a flow or plain scalar. */
interface Folding {
  text: string;
  whitespaces: string;
  leadingBreak: string;
  trailingBreaks: string;
  leadingBlanks: boolean;
}

function newFolding(): Folding {
  return { text: '', whitespaces: '', leadingBreak: '', trailingBreaks: '', leadingBlanks: false };
}

/** Folds pending line breaks into one space (or keeps the empty lines), or keeps the spaces. */
function joinFolding(f: Folding): void {
  if (f.leadingBlanks) {
    if (f.leadingBreak.startsWith('\n')) f.text += f.trailingBreaks === '' ? ' ' : f.trailingBreaks;
    else f.text += f.leadingBreak + f.trailingBreaks;
    f.leadingBreak = '';
    f.trailingBreaks = '';
    f.leadingBlanks = false;
  } else {
    f.text += f.whitespaces;
  }
  f.whitespaces = '';
}

const SIMPLE_ESCAPES: Record<string, string> = {
  '0': '\0',
  a: '\x07',
  b: '\b',
  t: '\t',
  '\t': '\t',
  n: '\n',
  v: '\v',
  f: '\f',
  r: '\r',
  e: '\x1b',
  ' ': ' ',
  '"': '"',
  "'": "'",
  '\\': '\\',
  N: '\u0085',
  _: '\u00a0',
  L: '\u2028',
  P: '\u2029',
};
const HEX_ESCAPE_LENGTH: Record<string, number> = { x: 2, u: 4, U: 8 };
// Characters that may appear in a tag URI (libyaml's list, '%' starting an escape).
const URI_CHARS = ";/?:@&=+$,.!~*'()[]%";

// ---------------------------------------------------------------------------------------------
// Scanner: a port of libyaml's, pull-based like it, so that the parser meets the same errors in
// the same order (which matters: yaml.v2 stops right after the first document's end).

class Scanner {
  private readonly cs: ArrayLike<string>;
  private pos = 0;
  private line = 0;
  private column = 0;
  private tokens: Token[] = [];
  private head = 0;
  private tokensParsed = 0;
  private tokenAvailable = false;
  private streamStartProduced = false;
  private indent = -1;
  private readonly indents: number[] = [];
  private simpleKeyAllowed = false;
  private readonly simpleKeys: SimpleKey[] = [];
  private flowLevel = 0;

  constructor(chars: ArrayLike<string>) {
    this.cs = chars;
  }

  /** The next token, scanning as far ahead as a pending simple key requires. */
  peek(): Token {
    if (!this.tokenAvailable) this.fetchMoreTokens();
    return this.tokens[this.head];
  }

  skipToken(): void {
    this.tokenAvailable = false;
    this.tokensParsed++;
    this.head++;
    if (this.head > 256 && this.head === this.tokens.length) {
      this.tokens = []; // positions are relative to head, so the queue may be emptied
      this.head = 0;
    }
  }

  // --- characters

  private ch(k = 0): string {
    return this.cs[this.pos + k] ?? '\0';
  }
  private mark(): Mark {
    return { index: this.pos, line: this.line, column: this.column };
  }
  private skip(): void {
    this.pos++;
    this.column++;
  }
  private read(): string {
    const c = this.ch();
    this.skip();
    return c;
  }
  private skipLine(): void {
    if (!isBreak(this.ch())) return;
    this.pos += this.ch() === '\r' && this.ch(1) === '\n' ? 2 : 1;
    this.line++;
    this.column = 0;
  }
  /** Consumes a line break; CR LF, CR and NEL all read as "\n", LS and PS stay themselves. */
  private readLine(): string {
    const c = this.ch();
    if (!isBreak(c)) return '';
    this.skipLine();
    return c === '\u2028' || c === '\u2029' ? c : '\n';
  }
  private atDocumentIndicator(): boolean {
    const three = this.ch() + this.ch(1) + this.ch(2);
    return this.column === 0 && (three === '---' || three === '...') && isBlankZ(this.ch(3));
  }

  // --- the token queue

  private insertToken(at: number, t: Token): void {
    if (at < 0) this.tokens.push(t);
    else this.tokens.splice(this.head + at, 0, t);
  }

  private fetchMoreTokens(): void {
    for (;;) {
      let need = this.head === this.tokens.length;
      if (!need) {
        this.staleSimpleKeys();
        need = this.simpleKeys.some((k) => k.possible && k.tokenNumber === this.tokensParsed);
      }
      if (!need) break;
      this.fetchNextToken();
    }
    this.tokenAvailable = true;
  }

  private fetchNextToken(): void {
    if (!this.streamStartProduced) return this.fetchStreamStart();
    this.scanToNextToken();
    this.staleSimpleKeys();
    this.unrollIndent(this.column);
    const c = this.ch();
    if (c === '\0') return this.fetchStreamEnd();
    if (this.column === 0 && c === '%') return this.fetchDirective();
    if (this.atDocumentIndicator()) return this.fetchDocumentIndicator(c === '-' ? 'document-start' : 'document-end');
    if (this.fetchIndicator(c)) return;
    if (this.canStartPlainScalar(c)) return this.fetchPlainScalar();
    failAt(this.mark(), 'found character that cannot start any token');
  }

  private fetchIndicator(c: string): boolean {
    const next = this.ch(1);
    if (c === '[') this.fetchFlowCollectionStart('flow-sequence-start');
    else if (c === '{') this.fetchFlowCollectionStart('flow-mapping-start');
    else if (c === ']') this.fetchFlowCollectionEnd('flow-sequence-end');
    else if (c === '}') this.fetchFlowCollectionEnd('flow-mapping-end');
    else if (c === ',') this.fetchFlowEntry();
    else if (c === '-' && isBlankZ(next)) this.fetchBlockEntry();
    else if (c === '?' && (this.flowLevel > 0 || isBlankZ(next))) this.fetchKey();
    else if (c === ':' && (this.flowLevel > 0 || isBlankZ(next))) this.fetchValue();
    else if (c === '*' || c === '&') this.fetchAnchor(c === '*' ? 'alias' : 'anchor');
    else if (c === '!') this.fetchTag();
    else if ((c === '|' || c === '>') && this.flowLevel === 0) this.fetchBlockScalar(c === '|');
    else if (c === "'" || c === '"') this.fetchFlowScalar(c === "'");
    else return false;
    return true;
  }

  private canStartPlainScalar(c: string): boolean {
    const next = this.ch(1);
    if (!(isBlankZ(c) || '-?:,[]{}#&*!|>\'"%@`'.includes(c))) return true;
    if (c === '-' && !isBlank(next)) return true;
    return this.flowLevel === 0 && (c === '?' || c === ':') && !isBlankZ(next);
  }

  /** Skips spaces, comments and line breaks; tabs only where they cannot be indentation. */
  private scanToNextToken(): void {
    for (;;) {
      while (this.ch() === ' ' || ((this.flowLevel > 0 || !this.simpleKeyAllowed) && this.ch() === '\t')) {
        this.skip();
      }
      if (this.ch() === '#') while (!isBreakZ(this.ch())) this.skip();
      if (!isBreak(this.ch())) return;
      this.skipLine();
      if (this.flowLevel === 0) this.simpleKeyAllowed = true;
    }
  }

  // --- simple keys and indentation

  /** A simple key must sit on one line and be under 1024 characters. */
  private staleSimpleKeys(): void {
    for (const key of this.simpleKeys) {
      if (key.possible && (key.mark.line < this.line || key.mark.index + 1024 < this.pos)) {
        if (key.required) failAt(key.mark, "could not find expected ':' after this key");
        key.possible = false;
      }
    }
  }

  private saveSimpleKey(): void {
    if (!this.simpleKeyAllowed) return;
    const required = this.flowLevel === 0 && this.indent === this.column;
    const tokenNumber = this.tokensParsed + (this.tokens.length - this.head);
    this.removeSimpleKey();
    this.simpleKeys[this.simpleKeys.length - 1] = { possible: true, required, tokenNumber, mark: this.mark() };
  }

  private removeSimpleKey(): void {
    const key = this.simpleKeys[this.simpleKeys.length - 1];
    if (key.possible && key.required) failAt(key.mark, "could not find expected ':' after this key");
    key.possible = false;
  }

  private rollIndent(column: number, tokenNumber: number, type: TokenType, mark: Mark): void {
    if (this.flowLevel > 0 || this.indent >= column) return;
    this.indents.push(this.indent);
    this.indent = column;
    this.insertToken(tokenNumber > -1 ? tokenNumber - this.tokensParsed : -1, newToken(type, mark, mark));
  }

  private unrollIndent(column: number): void {
    if (this.flowLevel > 0) return;
    while (this.indent > column) {
      this.insertToken(-1, newToken('block-end', this.mark(), this.mark()));
      this.indent = this.indents.pop() ?? -1;
    }
  }

  private newSimpleKey(): SimpleKey {
    return { possible: false, required: false, tokenNumber: 0, mark: this.mark() };
  }

  // --- fetchers: each decides what may follow, then appends its token

  private pushIndicator(type: TokenType): void {
    const start = this.mark();
    this.skip();
    this.insertToken(-1, newToken(type, start, this.mark()));
  }

  private fetchStreamStart(): void {
    this.indent = -1;
    this.simpleKeys.push(this.newSimpleKey());
    this.simpleKeyAllowed = true;
    this.streamStartProduced = true;
    this.insertToken(-1, newToken('stream-start', this.mark(), this.mark()));
  }

  private fetchStreamEnd(): void {
    if (this.column !== 0) {
      this.column = 0;
      this.line++;
    }
    this.unrollIndent(-1);
    this.removeSimpleKey();
    this.simpleKeyAllowed = false;
    this.insertToken(-1, newToken('stream-end', this.mark(), this.mark()));
  }

  private fetchDirective(): void {
    this.unrollIndent(-1);
    this.removeSimpleKey();
    this.simpleKeyAllowed = false;
    this.insertToken(-1, this.scanDirective());
  }

  private fetchDocumentIndicator(type: TokenType): void {
    this.unrollIndent(-1);
    this.removeSimpleKey();
    this.simpleKeyAllowed = false;
    const start = this.mark();
    this.skip();
    this.skip();
    this.skip();
    this.insertToken(-1, newToken(type, start, this.mark()));
  }

  private fetchFlowCollectionStart(type: TokenType): void {
    this.saveSimpleKey();
    this.simpleKeys.push(this.newSimpleKey());
    this.flowLevel++;
    this.simpleKeyAllowed = true;
    this.pushIndicator(type);
  }

  private fetchFlowCollectionEnd(type: TokenType): void {
    this.removeSimpleKey();
    if (this.flowLevel > 0) {
      this.flowLevel--;
      this.simpleKeys.pop();
    }
    this.simpleKeyAllowed = false;
    this.pushIndicator(type);
  }

  private fetchFlowEntry(): void {
    this.removeSimpleKey();
    this.simpleKeyAllowed = true;
    this.pushIndicator('flow-entry');
  }

  private fetchBlockEntry(): void {
    if (this.flowLevel === 0) {
      if (!this.simpleKeyAllowed) failAt(this.mark(), 'block sequence entries are not allowed in this context');
      this.rollIndent(this.column, -1, 'block-sequence-start', this.mark());
    }
    this.removeSimpleKey();
    this.simpleKeyAllowed = true;
    this.pushIndicator('block-entry');
  }

  private fetchKey(): void {
    if (this.flowLevel === 0) {
      if (!this.simpleKeyAllowed) failAt(this.mark(), 'mapping keys are not allowed in this context');
      this.rollIndent(this.column, -1, 'block-mapping-start', this.mark());
    }
    this.removeSimpleKey();
    this.simpleKeyAllowed = this.flowLevel === 0;
    this.pushIndicator('key');
  }

  /** ':' either completes a pending simple key (inserting KEY before it) or follows a '?' key. */
  private fetchValue(): void {
    const key = this.simpleKeys[this.simpleKeys.length - 1];
    if (key.possible) {
      this.insertToken(key.tokenNumber - this.tokensParsed, newToken('key', key.mark, key.mark));
      this.rollIndent(key.mark.column, key.tokenNumber, 'block-mapping-start', key.mark);
      key.possible = false;
      this.simpleKeyAllowed = false;
    } else {
      if (this.flowLevel === 0) {
        if (!this.simpleKeyAllowed) failAt(this.mark(), 'mapping values are not allowed in this context');
        this.rollIndent(this.column, -1, 'block-mapping-start', this.mark());
      }
      this.simpleKeyAllowed = this.flowLevel === 0;
    }
    this.pushIndicator('value');
  }

  private fetchAnchor(type: 'anchor' | 'alias'): void {
    this.saveSimpleKey();
    this.simpleKeyAllowed = false;
    this.insertToken(-1, this.scanAnchor(type));
  }

  private fetchTag(): void {
    this.saveSimpleKey();
    this.simpleKeyAllowed = false;
    this.insertToken(-1, this.scanTag());
  }

  private fetchBlockScalar(literal: boolean): void {
    this.removeSimpleKey();
    this.simpleKeyAllowed = true;
    this.insertToken(-1, this.scanBlockScalar(literal));
  }

  private fetchFlowScalar(single: boolean): void {
    this.saveSimpleKey();
    this.simpleKeyAllowed = false;
    this.insertToken(-1, this.scanFlowScalar(single));
  }

  private fetchPlainScalar(): void {
    this.saveSimpleKey();
    this.simpleKeyAllowed = false;
    this.insertToken(-1, this.scanPlainScalar());
  }

  // --- directives, anchors, tags

  private skipToLineEnd(context: string, start: Mark): void {
    while (isBlank(this.ch())) this.skip();
    if (this.ch() === '#') while (!isBreakZ(this.ch())) this.skip();
    if (!isBreakZ(this.ch())) failAt(this.mark(), 'did not find expected comment or line break', context, start);
    this.skipLine();
  }

  private scanDirective(): Token {
    const start = this.mark();
    const context = 'while scanning a directive';
    this.skip();
    let name = '';
    while (isAlpha(this.ch())) name += this.read();
    if (name === '') failAt(this.mark(), 'could not find expected directive name', context, start);
    if (!isBlankZ(this.ch())) failAt(this.mark(), 'found unexpected non-alphabetical character', context, start);
    let t: Token;
    if (name === 'YAML') t = this.scanVersionDirective(start);
    else if (name === 'TAG') t = this.scanTagDirective(start);
    else failAt(start, 'found unknown directive name', context, start);
    this.skipToLineEnd(context, start);
    return t;
  }

  private scanVersionDirective(start: Mark): Token {
    while (isBlank(this.ch())) this.skip();
    const major = this.scanVersionNumber(start);
    if (this.ch() !== '.') failAt(this.mark(), "did not find expected digit or '.' character");
    this.skip();
    const minor = this.scanVersionNumber(start);
    return newToken('version-directive', start, this.mark(), `${major}.${minor}`);
  }

  private scanVersionNumber(start: Mark): number {
    const context = 'while scanning a %YAML directive';
    let digits = '';
    while (/[0-9]/.test(this.ch())) {
      if (digits.length === 2) failAt(this.mark(), 'found extremely long version number', context, start);
      digits += this.read();
    }
    if (digits === '') failAt(this.mark(), 'did not find expected version number', context, start);
    return Number(digits);
  }

  private scanTagDirective(start: Mark): Token {
    const context = 'while scanning a %TAG directive';
    while (isBlank(this.ch())) this.skip();
    const handle = this.scanTagHandle(true, start);
    if (!isBlank(this.ch())) failAt(this.mark(), 'did not find expected whitespace', context, start);
    while (isBlank(this.ch())) this.skip();
    const prefix = this.scanTagUri(true, '', start);
    if (!isBlankZ(this.ch())) failAt(this.mark(), 'did not find expected whitespace or line break', context, start);
    return newToken('tag-directive', start, this.mark(), handle, prefix);
  }

  private scanAnchor(type: 'anchor' | 'alias'): Token {
    const start = this.mark();
    this.skip();
    let name = '';
    while (isAlpha(this.ch())) name += this.read();
    const end = this.mark();
    if (name === '' || !(isBlankZ(this.ch()) || '?:,]}%@`'.includes(this.ch()))) {
      const context = type === 'anchor' ? 'while scanning an anchor' : 'while scanning an alias';
      failAt(this.mark(), 'did not find expected alphabetic or numeric character', context, start);
    }
    return newToken(type, start, end, name);
  }

  /** `!suffix`, `!handle!suffix`, `!<verbatim>` or a lone `!`; value is the handle. */
  private scanTag(): Token {
    const start = this.mark();
    const context = 'while scanning a tag';
    let handle: string;
    let suffix: string;
    if (this.ch(1) === '<') {
      this.skip();
      this.skip();
      handle = '';
      suffix = this.scanTagUri(false, '', start);
      if (this.ch() !== '>') failAt(this.mark(), "did not find the expected '>'", context, start);
      this.skip();
    } else {
      handle = this.scanTagHandle(false, start);
      if (handle.length > 1 && handle.startsWith('!') && handle.endsWith('!')) {
        suffix = this.scanTagUri(false, '', start);
      } else {
        suffix = this.scanTagUri(false, handle, start);
        handle = '!';
        if (suffix === '') [handle, suffix] = ['', '!']; // the non-specific tag '!'
      }
    }
    if (!isBlankZ(this.ch())) failAt(this.mark(), 'did not find expected whitespace or line break', context, start);
    return newToken('tag', start, this.mark(), handle, suffix);
  }

  private scanTagHandle(directive: boolean, start: Mark): string {
    const context = directive ? 'while parsing a %TAG directive' : 'while parsing a tag';
    if (this.ch() !== '!') failAt(this.mark(), "did not find expected '!'", context, start);
    let handle = this.read();
    while (isAlpha(this.ch())) handle += this.read();
    if (this.ch() === '!') handle += this.read();
    else if (directive && handle !== '!') failAt(this.mark(), "did not find expected '!'", context, start);
    return handle;
  }

  /** A tag URI; `head` is what scanTagHandle already took (its '!' is dropped). */
  private scanTagUri(directive: boolean, head: string, start: Mark): string {
    let uri = head.slice(1);
    let found = head.length > 0;
    const bytes: number[] = [];
    while (isAlpha(this.ch()) || URI_CHARS.includes(this.ch())) {
      if (this.ch() === '%') {
        this.scanUriEscapes(directive, start, bytes);
        uri += new TextDecoder().decode(new Uint8Array(bytes.splice(0)));
      } else {
        uri += this.read();
      }
      found = true;
    }
    const context = directive ? 'while parsing a %TAG directive' : 'while parsing a tag';
    if (!found) failAt(this.mark(), 'did not find expected tag URI', context, start);
    return uri;
  }

  /** One UTF-8 character written as %XX escapes. */
  private scanUriEscapes(directive: boolean, start: Mark, bytes: number[]): void {
    const context = directive ? 'while parsing a %TAG directive' : 'while parsing a tag';
    let width = 0;
    do {
      if (!(this.ch() === '%' && isHex(this.ch(1)) && isHex(this.ch(2)))) {
        failAt(this.mark(), 'did not find URI escaped octet', context, start);
      }
      const octet = parseInt(this.ch(1) + this.ch(2), 16);
      if (bytes.length === 0) {
        width = utf8Width(octet);
        if (width === 0) failAt(this.mark(), 'found an incorrect leading UTF-8 octet', context, start);
      } else if ((octet & 0xc0) !== 0x80) {
        failAt(this.mark(), 'found an incorrect trailing UTF-8 octet', context, start);
      }
      bytes.push(octet);
      this.skip();
      this.skip();
      this.skip();
    } while (bytes.length < width);
  }

  // --- scalars

  private scanPlainScalar(): Token {
    const f = newFolding();
    const indent = this.indent + 1;
    const start = this.mark();
    let end = this.mark();
    for (;;) {
      if (this.atDocumentIndicator() || this.ch() === '#') break;
      end = this.scanPlainRun(f, start, end);
      if (!(isBlank(this.ch()) || isBreak(this.ch()))) break;
      this.scanBlanks(f, start, indent);
      if (this.flowLevel === 0 && this.column < indent) break; // a less indented line ends it
    }
    if (f.leadingBlanks) this.simpleKeyAllowed = true; // it ended on a new line: a key may start
    return newToken('scalar', start, end, f.text, '', 'plain');
  }

  /** The non-blank characters of a plain scalar, up to an indicator that ends it. */
  private scanPlainRun(f: Folding, start: Mark, end: Mark): Mark {
    while (!isBlankZ(this.ch())) {
      const c = this.ch();
      if (this.flowLevel > 0 && c === ':' && !isBlankZ(this.ch(1))) {
        failAt(this.mark(), "found unexpected ':'", 'while scanning a plain scalar', start);
      }
      if ((c === ':' && isBlankZ(this.ch(1))) || (this.flowLevel > 0 && ',:?[]{}'.includes(c))) break;
      if (f.leadingBlanks || f.whitespaces !== '') joinFolding(f);
      f.text += this.read();
      end = this.mark();
    }
    return end;
  }

  /**
   * Blanks and line breaks inside a flow or plain scalar: spaces are kept until we know text follows,
   * the first line break is kept apart from the following ones so that it can fold into a space.
   */
  private scanBlanks(f: Folding, start: Mark, plainIndent: number): void {
    while (isBlank(this.ch()) || isBreak(this.ch())) {
      if (isBreak(this.ch())) {
        if (f.leadingBlanks) {
          f.trailingBreaks += this.readLine();
        } else {
          f.whitespaces = '';
          f.leadingBreak = this.readLine();
          f.leadingBlanks = true;
        }
      } else {
        if (plainIndent >= 0 && f.leadingBlanks && this.column < plainIndent && this.ch() === '\t') {
          failAt(
            this.mark(),
            'found a tab character that violates indentation',
            'while scanning a plain scalar',
            start,
          );
        }
        if (f.leadingBlanks) this.skip();
        else f.whitespaces += this.read();
      }
    }
  }

  private scanFlowScalar(single: boolean): Token {
    const start = this.mark();
    const context = 'while scanning a quoted scalar';
    const quote = single ? "'" : '"';
    this.skip();
    const f = newFolding();
    for (;;) {
      if (this.atDocumentIndicator()) failAt(this.mark(), 'found unexpected document indicator', context, start);
      if (this.ch() === '\0') failAt(this.mark(), 'found unexpected end of stream', context, start);
      f.leadingBlanks = false;
      this.scanQuotedRun(f, single, start);
      if (this.ch() === quote) break;
      this.scanBlanks(f, start, -1);
      joinFolding(f);
    }
    this.skip();
    return newToken('scalar', start, this.mark(), f.text, '', single ? 'single' : 'double');
  }

  /** The non-blank characters of a quoted scalar, with its escapes. */
  private scanQuotedRun(f: Folding, single: boolean, start: Mark): void {
    while (!isBlankZ(this.ch())) {
      const c = this.ch();
      if (single && c === "'" && this.ch(1) === "'") {
        f.text += "'";
        this.skip();
        this.skip();
      } else if (c === (single ? "'" : '"')) {
        return;
      } else if (!single && c === '\\' && isBreak(this.ch(1))) {
        this.skip(); // an escaped line break: the line joins the next one without a space
        this.skipLine();
        f.leadingBlanks = true;
        return;
      } else if (!single && c === '\\') {
        f.text += this.scanEscape(start);
      } else {
        f.text += this.read();
      }
    }
  }

  private scanEscape(start: Mark): string {
    const context = 'while parsing a quoted scalar';
    const at = this.mark();
    const e = this.ch(1);
    const length = HEX_ESCAPE_LENGTH[e] ?? 0;
    if (length === 0 && !Object.hasOwn(SIMPLE_ESCAPES, e)) failAt(at, 'found unknown escape character', context, start);
    this.skip();
    this.skip();
    if (length === 0) return SIMPLE_ESCAPES[e];
    let value = 0;
    for (let k = 0; k < length; k++) {
      if (!isHex(this.ch(k))) failAt(at, 'did not find expected hexadecimal number', context, start);
      value = value * 16 + parseInt(this.ch(k), 16);
    }
    if ((value >= 0xd800 && value <= 0xdfff) || value > 0x10ffff) {
      failAt(at, 'found invalid Unicode character escape code', context, start);
    }
    for (let k = 0; k < length; k++) this.skip();
    return String.fromCodePoint(value);
  }

  private scanBlockScalar(literal: boolean): Token {
    const start = this.mark();
    this.skip();
    const { chomping, increment } = this.scanBlockScalarHeader(start);
    let indent = increment > 0 ? (this.indent >= 0 ? this.indent + increment : increment) : 0;
    let breaks = this.scanBlockScalarBreaks(indent, start);
    indent = breaks.indent;
    let text = '';
    let leadingBreak = '';
    let leadingBlank = false;
    while (this.column === indent && this.ch() !== '\0') {
      const trailingBlank = isBlank(this.ch());
      // Folding: a single line break between two lines that start without blanks becomes a space.
      if (!literal && !leadingBlank && !trailingBlank && leadingBreak.startsWith('\n')) {
        if (breaks.text === '') text += ' ';
      } else {
        text += leadingBreak;
      }
      text += breaks.text;
      leadingBlank = isBlank(this.ch());
      while (!isBreakZ(this.ch())) text += this.read();
      leadingBreak = this.readLine();
      breaks = this.scanBlockScalarBreaks(indent, start);
    }
    if (chomping !== -1) text += leadingBreak; // clip and keep end with the last line break
    if (chomping === 1) text += breaks.text; // keep keeps the trailing empty lines too
    return newToken('scalar', start, this.mark(), text, '', literal ? 'literal' : 'folded');
  }

  /** `|` or `>` then chomping (`+`/`-`) and indentation (1-9) indicators in either order. */
  private scanBlockScalarHeader(start: Mark): { chomping: number; increment: number } {
    const context = 'while scanning a block scalar';
    let chomping = 0;
    let increment = 0;
    const chomp = (): void => {
      if (this.ch() !== '+' && this.ch() !== '-') return;
      chomping = this.read() === '+' ? 1 : -1;
    };
    const indentation = (): void => {
      if (!/[0-9]/.test(this.ch())) return;
      if (this.ch() === '0') failAt(this.mark(), 'found an indentation indicator equal to 0', context, start);
      increment = Number(this.read());
    };
    if (this.ch() === '+' || this.ch() === '-') {
      chomp();
      indentation();
    } else {
      indentation();
      chomp();
    }
    this.skipToLineEnd(context, start);
    return { chomping, increment };
  }

  /** Empty lines and indentation before a line of a block scalar; finds the indentation if unknown. */
  private scanBlockScalarBreaks(indent: number, start: Mark): { indent: number; text: string } {
    let text = '';
    let maxIndent = 0;
    for (;;) {
      while ((indent === 0 || this.column < indent) && this.ch() === ' ') this.skip();
      maxIndent = Math.max(maxIndent, this.column);
      if ((indent === 0 || this.column < indent) && this.ch() === '\t') {
        const what = 'found a tab character where an indentation space is expected';
        failAt(this.mark(), what, 'while scanning a block scalar', start);
      }
      if (!isBreak(this.ch())) break;
      text += this.readLine();
    }
    if (indent === 0) indent = Math.max(maxIndent, this.indent + 1, 1);
    return { indent, text };
  }
}

// ================================================================================================
// 3. yaml parser — the second and third stages of the YAML reader. The Parser turns tokens into a node tree for the
//    FIRST document only, as yaml.Unmarshal does; the Decoder turns nodes into plain values, resolving scalars (YAML
//    1.1 booleans, Go integer syntax), aliases and `<<` merges the way yaml.v2 does, and map keys the way ghodss
//    does. On purpose stricter than adnanh: a mapping may not repeat a key (a second "trigger-rule" would silently
//    replace the first), aliases may not expand a document past a million nodes, nesting is limited, `!!binary` is
//    refused. parseYaml also returns every key's line, for located errors. A JSON document (most hook files) is read
//    in one pass by readJson to exactly what the stages give, which read whatever it leaves them.
//    Exports: parseYaml, scalarAsGoString.
//    Tests: test/chart.test.ts, test/unit.test.ts, test/yaml-hooks.test.ts, test/yaml.test.ts.
// ================================================================================================

// ---------------------------------------------------------------------------------------------
// Parser: tokens -> nodes, following libyaml's grammar (including its "indentless" sequences,
// `key:\n- item`, and single-pair mappings inside flow sequences, `[a: b]`).

interface YamlNode {
  kind: 'scalar' | 'mapping' | 'sequence' | 'alias';
  mark: Mark;
  /** The resolved tag ('' when none was written). */
  tag: string;
  /** A scalar's text, or the anchor an alias names. */
  value: string;
  /** A plain scalar (or one tagged '!'): its type comes from its text. */
  implicit: boolean;
  children: YamlNode[];
}

function newNode(kind: YamlNode['kind'], mark: Mark, tag = '', value = '', implicit = false): YamlNode {
  return { kind, mark, tag, value, implicit, children: [] };
}

function emptyScalar(mark: Mark): YamlNode {
  return newNode('scalar', mark, '', '', true);
}

const DEFAULT_TAG_HANDLES: [string, string][] = [
  ['!', '!'],
  ['!!', 'tag:yaml.org,2002:'],
];

class Parser {
  private readonly scanner: Scanner;
  /** Anchors of the document: the last definition of a name wins, even for earlier aliases. */
  readonly anchors = new Map<string, YamlNode>();
  private tagHandles = new Map<string, string>();
  private depth = 0;

  constructor(scanner: Scanner) {
    this.scanner = scanner;
  }

  private peek(): Token {
    return this.scanner.peek();
  }
  private skip(): void {
    this.scanner.skipToken();
  }

  /** The first document's root, or null for a stream without documents. */
  parseFirstDocument(): YamlNode | null {
    this.peek(); // stream-start
    this.skip();
    let t = this.peek();
    if (t.type === 'stream-end') return null;
    let root: YamlNode;
    if (t.type !== 'version-directive' && t.type !== 'tag-directive' && t.type !== 'document-start') {
      this.processDirectives();
      root = this.parseNode(true, false);
    } else {
      root = this.explicitDocument();
    }
    t = this.peek();
    if (t.type === 'document-end') this.skip();
    this.tagHandles = new Map();
    this.checkNextDocumentStart();
    return root;
  }

  private explicitDocument(): YamlNode {
    this.processDirectives();
    let t = this.peek();
    if (t.type !== 'document-start') failAt(t.start, 'did not find expected <document start>');
    this.skip();
    t = this.peek();
    const ends = ['version-directive', 'tag-directive', 'document-start', 'document-end', 'stream-end'];
    return ends.includes(t.type) ? emptyScalar(t.start) : this.parseNode(true, false);
  }

  /**
   * yaml.v2 reads one event past the first document: the start of the next one. So what follows
   * the first document must be `---` (or nothing); the rest of a second document is never read.
   */
  private checkNextDocumentStart(): void {
    let t = this.peek();
    while (t.type === 'document-end') {
      this.skip();
      t = this.peek();
    }
    if (t.type === 'stream-end') return;
    this.processDirectives();
    t = this.peek();
    if (t.type !== 'document-start') failAt(t.start, 'did not find expected <document start>');
  }

  private processDirectives(): void {
    let versionSeen = false;
    for (let t = this.peek(); t.type === 'version-directive' || t.type === 'tag-directive'; t = this.peek()) {
      if (t.type === 'version-directive') {
        if (versionSeen) failAt(t.start, 'found duplicate %YAML directive');
        if (t.value !== '1.1') failAt(t.start, 'found incompatible YAML document');
        versionSeen = true;
      } else {
        if (this.tagHandles.has(t.value)) failAt(t.start, 'found duplicate %TAG directive');
        this.tagHandles.set(t.value, t.suffix);
      }
      this.skip();
    }
    for (const [handle, prefix] of DEFAULT_TAG_HANDLES) {
      if (!this.tagHandles.has(handle)) this.tagHandles.set(handle, prefix);
    }
  }

  private parseNode(block: boolean, indentless: boolean): YamlNode {
    if (++this.depth > MAX_DEPTH) failAt(this.peek().start, `nesting deeper than ${MAX_DEPTH} levels is refused`);
    try {
      const t = this.peek();
      if (t.type === 'alias') {
        this.skip();
        return newNode('alias', t.start, '', t.value);
      }
      return this.parseNodeContent(block, indentless);
    } finally {
      this.depth--;
    }
  }

  /** Anchor and tag (in either order), then the content they belong to. */
  private parseNodeContent(block: boolean, indentless: boolean): YamlNode {
    let t = this.peek();
    const start = t.start;
    let anchor: string | undefined;
    let tagToken: Token | undefined;
    for (let i = 0; i < 2; i++) {
      if (t.type === 'anchor' && anchor === undefined) anchor = t.value;
      else if (t.type === 'tag' && tagToken === undefined) tagToken = t;
      else break;
      this.skip();
      t = this.peek();
    }
    const tag = tagToken ? this.resolveTag(tagToken, start) : '';
    const node = this.startNode(t, start, block, indentless, tag, anchor !== undefined);
    if (anchor !== undefined) this.anchors.set(anchor, node); // before its children, as yaml.v2 does
    if (node.kind === 'mapping' || node.kind === 'sequence') this.parseCollection(node, t, block, indentless);
    return node;
  }

  private resolveTag(t: Token, start: Mark): string {
    if (t.value === '') return t.suffix;
    const prefix = this.tagHandles.get(t.value);
    if (prefix === undefined) failAt(t.start, 'found undefined tag handle', 'while parsing a node', start);
    return prefix + t.suffix;
  }

  /**
   * The node that token `t` starts, placed at `start`, where its anchor or tag (if any) begins.
   * Collections get their children from parseCollection.
   */
  private startNode(
    t: Token,
    start: Mark,
    block: boolean,
    indentless: boolean,
    tag: string,
    anchored: boolean,
  ): YamlNode {
    if (indentless && t.type === 'block-entry') return newNode('sequence', start, tag);
    if (t.type === 'scalar') {
      this.skip();
      const implicit = (tag === '' && t.style === 'plain') || tag === '!';
      return newNode('scalar', start, tag, t.value, implicit);
    }
    if (t.type === 'flow-sequence-start' || (block && t.type === 'block-sequence-start')) {
      return newNode('sequence', start, tag);
    }
    if (t.type === 'flow-mapping-start' || (block && t.type === 'block-mapping-start')) {
      return newNode('mapping', start, tag);
    }
    if (anchored || tag !== '') return newNode('scalar', start, tag, '', tag === '');
    failAt(t.start, 'did not find expected node content');
  }

  private parseCollection(node: YamlNode, t: Token, block: boolean, indentless: boolean): void {
    if (indentless && t.type === 'block-entry') this.indentlessSequence(node);
    else if (t.type === 'flow-sequence-start') this.flowSequence(node);
    else if (t.type === 'flow-mapping-start') this.flowMapping(node);
    else if (block && t.type === 'block-sequence-start') this.blockSequence(node);
    else this.blockMapping(node);
  }

  /** After '-', '?' or ':' in block context: a node, or an empty scalar when none follows. */
  private blockChild(after: Token, stops: TokenType[], indentless: boolean): YamlNode {
    const t = this.peek();
    return stops.includes(t.type) ? emptyScalar(after.end) : this.parseNode(true, indentless);
  }

  private blockSequence(node: YamlNode): void {
    this.skip();
    for (;;) {
      const t = this.peek();
      if (t.type === 'block-end') return this.skip();
      if (t.type !== 'block-entry') {
        failAt(t.start, "did not find expected '-' indicator", 'while parsing a block collection', node.mark);
      }
      this.skip();
      node.children.push(this.blockChild(t, ['block-entry', 'block-end'], false));
    }
  }

  /** `key:\n- a\n- b`: a sequence at the indentation of its key, ended by whatever is not '-'. */
  private indentlessSequence(node: YamlNode): void {
    for (let t = this.peek(); t.type === 'block-entry'; t = this.peek()) {
      this.skip();
      node.children.push(this.blockChild(t, ['block-entry', 'key', 'value', 'block-end'], false));
    }
  }

  private blockMapping(node: YamlNode): void {
    const stops: TokenType[] = ['key', 'value', 'block-end'];
    this.skip();
    for (;;) {
      let t = this.peek();
      if (t.type === 'block-end') return this.skip();
      if (t.type !== 'key') failAt(t.start, 'did not find expected key', 'while parsing a block mapping', node.mark);
      this.skip();
      node.children.push(this.blockChild(t, stops, true));
      t = this.peek();
      if (t.type === 'value') {
        this.skip();
        node.children.push(this.blockChild(t, stops, true));
      } else {
        node.children.push(emptyScalar(t.start));
      }
    }
  }

  private flowSequence(node: YamlNode): void {
    this.flowCollection(node, 'flow-sequence-end', ']', 'sequence', (t) =>
      node.children.push(t.type === 'key' ? this.flowPair(t) : this.parseNode(false, false)),
    );
  }

  /** `[…]` or `{…}`: entries separated by commas (a trailing one allowed), up to the end token. */
  private flowCollection(node: YamlNode, end: TokenType, close: string, what: string, entry: (t: Token) => void): void {
    this.skip();
    for (let first = true; ; first = false) {
      let t = this.peek();
      if (!first && t.type !== end) {
        if (t.type !== 'flow-entry') {
          failAt(t.start, `did not find expected ',' or '${close}'`, `while parsing a flow ${what}`, node.mark);
        }
        this.skip();
        t = this.peek();
      }
      if (t.type === end) return this.skip();
      entry(t);
    }
  }

  /** A single-pair mapping inside a flow sequence: `[a: b]` (libyaml's quirks kept). */
  private flowPair(keyToken: Token): YamlNode {
    const pair = newNode('mapping', keyToken.start);
    this.skip();
    let t = this.peek();
    if (t.type !== 'value' && t.type !== 'flow-entry' && t.type !== 'flow-sequence-end') {
      pair.children.push(this.parseNode(false, false));
    } else {
      this.skip(); // libyaml consumes this token here, whatever it is
      pair.children.push(emptyScalar(t.end));
    }
    t = this.peek();
    if (t.type === 'value') {
      this.skip();
      const next = this.peek();
      if (next.type !== 'flow-entry' && next.type !== 'flow-sequence-end') {
        pair.children.push(this.parseNode(false, false));
        return pair;
      }
    }
    pair.children.push(emptyScalar(t.start));
    return pair;
  }

  private flowMapping(node: YamlNode): void {
    this.flowCollection(node, 'flow-mapping-end', '}', 'mapping', (t) => this.flowMappingEntry(node, t));
  }

  private flowMappingEntry(node: YamlNode, t: Token): void {
    const stops: TokenType[] = ['value', 'flow-entry', 'flow-mapping-end'];
    if (t.type !== 'key') {
      node.children.push(this.parseNode(false, false)); // `{a, b}`: keys without values
      node.children.push(emptyScalar(this.peek().start));
      return;
    }
    this.skip();
    t = this.peek();
    node.children.push(stops.includes(t.type) ? emptyScalar(t.start) : this.parseNode(false, false));
    t = this.peek();
    if (t.type === 'value') {
      this.skip();
      t = this.peek();
      if (t.type !== 'flow-entry' && t.type !== 'flow-mapping-end') {
        node.children.push(this.parseNode(false, false));
        return;
      }
    }
    node.children.push(emptyScalar(t.start));
  }
}

// ---------------------------------------------------------------------------------------------
// Scalars: yaml.v2's resolve.go (YAML 1.1 words, Go's integer syntax) and ghodss's renderings.

const TAG = 'tag:yaml.org,2002:';
const STR_TAG = TAG + 'str';
const INT_TAG = TAG + 'int';
const FLOAT_TAG = TAG + 'float';
const BOOL_TAG = TAG + 'bool';
const NULL_TAG = TAG + 'null';
const MERGE_TAG = TAG + 'merge';
const BINARY_TAG = TAG + 'binary';
const RESOLVABLE_TAGS = new Set(['', STR_TAG, INT_TAG, FLOAT_TAG, BOOL_TAG, NULL_TAG]);

type Kind = 'null' | 'bool' | 'int' | 'uint' | 'float' | 'str' | 'merge';

interface Resolved {
  kind: Kind;
  value: unknown;
  /** How ghodss writes a number or boolean into a Go string field. */
  go?: string;
}

const KIND_TAG: Record<Kind, string> = {
  null: NULL_TAG,
  bool: BOOL_TAG,
  int: INT_TAG,
  uint: INT_TAG,
  float: FLOAT_TAG,
  str: STR_TAG,
  merge: MERGE_TAG,
};

function resolvedBool(value: boolean): Resolved {
  return { kind: 'bool', value, go: String(value) };
}
function float(value: number): Resolved {
  return { kind: 'float', value, go: formatFloat32(value) };
}

/** yaml.v2's table of words; note that v2 (YAML 1.1) reads y/n/yes/no/on/off as booleans. */
const WORDS = new Map<string, Resolved>();
for (const [words, r] of [
  ['y Y yes Yes YES true True TRUE on On ON', resolvedBool(true)],
  ['n N no No NO false False FALSE off Off OFF', resolvedBool(false)],
  ['~ null Null NULL', { kind: 'null', value: null }],
  ['.nan .NaN .NAN', float(NaN)],
  ['.inf .Inf .INF +.inf +.Inf +.INF', float(Infinity)],
  ['-.inf -.Inf -.INF', float(-Infinity)],
  ['<<', { kind: 'merge', value: '<<' }],
] as [string, Resolved][]) {
  for (const w of words.split(' ')) WORDS.set(w, r);
}
WORDS.set('', { kind: 'null', value: null });

/** The first character decides what a plain scalar may be: S sign, D digit, M word, '.' float. */
function hintOf(text: string): string | undefined {
  if (text === '') return 'M';
  const c = text[0];
  if (c === '+' || c === '-') return 'S';
  if (c >= '0' && c <= '9') return 'D';
  if ('yYnNtTfFoO~'.includes(c)) return 'M';
  return c === '.' ? '.' : undefined;
}

const INT64_MIN = -(2n ** 63n);
const INT64_LIMIT = 2n ** 63n;
const UINT64_LIMIT = 2n ** 64n;
const DIGITS_OF_BASE: Record<number, RegExp> = { 2: /^[01]*$/, 8: /^[0-7]*$/, 10: /^[0-9]+$/, 16: /^[0-9a-fA-F]*$/ };

/** Go's strconv.ParseInt(s, 0, 64) syntax: sign, then 0x / 0o / 0b / leading-0 octal / decimal. */
function parseGoInteger(s: string): { value: bigint; signed: boolean } | undefined {
  const signed = s.startsWith('+') || s.startsWith('-');
  const body = signed ? s.slice(1) : s;
  if (body === '') return undefined;
  let base = 10;
  let digits = body;
  if (body[0] === '0') {
    const prefix = body.length >= 3 ? body[1].toLowerCase() : '';
    base = prefix === 'b' ? 2 : prefix === 'x' ? 16 : 8;
    digits = prefix === 'b' || prefix === 'o' || prefix === 'x' ? body.slice(2) : body.slice(1);
  }
  if (!DIGITS_OF_BASE[base].test(digits)) return undefined;
  let value = 0n;
  for (const d of digits) value = value * BigInt(base) + BigInt(parseInt(d, 16));
  return { value: s.startsWith('-') ? -value : value, signed };
}

// yaml.v2's float syntax: note the exponent needs a sign, so `1e3` stays a string.
const YAML_FLOAT = /^[-+]?[0-9]*\.?[0-9]+([eE][-+][0-9]+)?$/;

/** A plain scalar starting with a digit or a sign: int64, then uint64, then float, else a string. */
function resolveNumber(text: string): Resolved | undefined {
  const plain = text.replaceAll('_', '');
  const int = parseGoInteger(plain);
  if (int && int.value >= INT64_MIN && int.value < INT64_LIMIT) {
    return { kind: 'int', value: Number(int.value), go: int.value.toString() };
  }
  if (int && !int.signed && int.value < UINT64_LIMIT) {
    return { kind: 'uint', value: Number(int.value), go: int.value.toString() };
  }
  if (YAML_FLOAT.test(plain) && Number.isFinite(Number(plain))) return float(Number(plain));
  return undefined;
}

/**
 * Go's strconv.ParseFloat for a text starting with '.': `.5`, `.5e-3`, and `_` between digits
 * (`.5_0`); not `._5`, nor values out of range (`.5e999`).
 */
function parseGoFloat(text: string): number | undefined {
  if (!/^\.[0-9_]*[0-9][0-9_]*([eE][-+]?[0-9_]*[0-9][0-9_]*)?$/.test(text)) return undefined;
  if (/(^|[^0-9])_|_($|[^0-9])/.test(text)) return undefined; // Go: '_' only between digits
  const value = Number(text.replaceAll('_', ''));
  return Number.isFinite(value) ? value : undefined;
}

function resolvePlain(text: string): Resolved {
  const hint = hintOf(text);
  if (hint === undefined) return { kind: 'str', value: text };
  const word = WORDS.get(text);
  if (word) return word;
  if (hint === '.') {
    const value = parseGoFloat(text);
    if (value !== undefined) return float(value);
  }
  if (hint === 'S' || hint === 'D') return resolveNumber(text) ?? { kind: 'str', value: text };
  return { kind: 'str', value: text };
}

function shortTag(tag: string): string {
  return tag.startsWith(TAG) ? '!!' + tag.slice(TAG.length) : tag;
}

function resolveScalar(n: YamlNode): Resolved {
  if (n.tag === '' && !n.implicit) return { kind: 'str', value: n.value }; // quoted: always a string
  if (n.tag === BINARY_TAG) failAt(n.mark, '!!binary scalars are not supported');
  if (!RESOLVABLE_TAGS.has(n.tag)) return { kind: 'str', value: n.value }; // '!', '!local', ...: the text
  const r = n.tag === STR_TAG ? { kind: 'str' as const, value: n.value } : resolvePlain(n.value);
  if (n.tag !== '' && n.tag !== STR_TAG && KIND_TAG[r.kind] !== n.tag) {
    failAt(n.mark, `cannot decode a ${shortTag(KIND_TAG[r.kind])} scalar as ${shortTag(n.tag)}`);
  }
  return r;
}

/**
 * Go's strconv.FormatFloat(v, 'g', -1, 32), which ghodss uses for floats in string fields and for
 * float map keys: the shortest decimal that reads back as the same float32, exponent form when the
 * exponent is below -4 or at least 6 (`1.234567e+06`, `1e-05`), and Go's spelling of the specials.
 */
function formatFloat32(v: number): string {
  const f = Math.fround(v);
  if (Number.isNaN(f)) return 'NaN';
  if (f === Infinity || f === -Infinity) return f > 0 ? '+Inf' : '-Inf';
  if (f === 0) return Object.is(f, -0) ? '-0' : '0';
  const { digits, point } = shortestFloat32(Math.abs(f));
  const sign = f < 0 ? '-' : '';
  const exp = point - 1;
  if (exp < -4 || exp >= 6) {
    const mantissa = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    return `${sign}${mantissa}e${exp < 0 ? '-' : '+'}${String(Math.abs(exp)).padStart(2, '0')}`;
  }
  if (point <= 0) return `${sign}0.${'0'.repeat(-point)}${digits}`;
  if (point >= digits.length) return sign + digits + '0'.repeat(point - digits.length);
  return `${sign}${digits.slice(0, point)}.${digits.slice(point)}`;
}

/** x as digits × 10^exp10, exactly (every double is a finite decimal). */
function exactDecimal(x: number): { digits: bigint; exp10: number } {
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, x);
  const bits = view.getBigUint64(0);
  const biased = Number((bits >> 52n) & 0x7ffn);
  const fraction = bits & ((1n << 52n) - 1n);
  const mantissa = biased === 0 ? fraction : fraction | (1n << 52n);
  const exp2 = biased === 0 ? -1074 : biased - 1075;
  if (exp2 >= 0) return { digits: mantissa << BigInt(exp2), exp10: 0 };
  return { digits: mantissa * 5n ** BigInt(-exp2), exp10: exp2 }; // 2^-k = 5^k / 10^k
}

/**
 * Shortest digits d1d2… and decimal point position p such that 0.d1d2… × 10^p reads back as the
 * float32 x; among equally short ones the nearest to x, ties to an even last digit, as Go does.
 */
function shortestFloat32(x: number): { digits: string; point: number } {
  const exact = exactDecimal(x);
  const length = exact.digits.toString().length;
  for (let precision = 1; precision <= 9; precision++) {
    const drop = Math.max(length - precision, 0);
    const unit = 10n ** BigInt(drop);
    let rounded = exact.digits / unit;
    const rest = exact.digits % unit;
    const half = unit / 2n;
    if (drop > 0 && (rest > half || (rest === half && rounded % 2n === 1n))) rounded++;
    const scale = exact.exp10 + drop;
    // Its neighbours matter next to a power of two, where the rounding interval is lopsided.
    const fits = [rounded, rounded - 1n, rounded + 1n].filter(
      (c) => c > 0n && Math.fround(Number(`${c}e${scale}`)) === x,
    );
    if (fits.length === 0) continue;
    const distance = (c: bigint): bigint => {
      const d = c * unit - exact.digits;
      return d < 0n ? -d : d;
    };
    const closer = (a: bigint, b: bigint): number => (distance(a) < distance(b) ? -1 : 1);
    fits.sort((a, b) => (distance(a) === distance(b) ? Number(a % 2n) - Number(b % 2n) : closer(a, b)));
    const text = fits[0].toString();
    return { digits: text.replace(/0+$/, ''), point: text.length + scale };
  }
  throw new Error('unreachable: 9 digits always identify a float32');
}

/** How ghodss turns a map key into a JSON object key (yaml.v2 gives ints, floats, bools...). */
function keyString(r: Resolved, n: YamlNode): string {
  switch (r.kind) {
    case 'str':
    case 'merge':
      return r.value as string;
    case 'int':
    case 'bool':
      return r.go as string;
    case 'float': {
      const s = r.go as string;
      return s === '+Inf' ? '.inf' : s === '-Inf' ? '-.inf' : s === 'NaN' ? '.nan' : s;
    }
    case 'null':
      return failAt(n.mark, 'a mapping key may not be null or empty');
    case 'uint':
      return failAt(n.mark, 'an integer mapping key must fit in a signed 64-bit integer');
  }
}

// ---------------------------------------------------------------------------------------------
// Decoder: nodes -> values, as yaml.v2 decodes into interface{} and ghodss converts to JSON.

/** For objects and arrays from parseYaml: key -> how Go would render that number or boolean. */
const goStrings = new WeakMap<object, Map<string, string>>();

interface Item {
  value: unknown;
  go?: string;
}

interface Target {
  object: Record<string, unknown>;
  lines: Map<string, number>;
}

class Decoder {
  readonly lines: LineMap = new WeakMap();
  private readonly anchors: Map<string, YamlNode>;
  private readonly expanding = new Set<string>();
  private nodes = 0;
  private depth = 0;

  constructor(anchors: Map<string, YamlNode>) {
    this.anchors = anchors;
  }

  decode(n: YamlNode): Item {
    if (++this.nodes > MAX_NODES) failAt(n.mark, `aliases expand the document past ${MAX_NODES} nodes`);
    if (++this.depth > MAX_DEPTH) failAt(n.mark, `nesting deeper than ${MAX_DEPTH} levels is refused`);
    try {
      if (n.kind === 'alias') return this.viaAlias(n, (target) => this.decode(target));
      if (n.kind === 'sequence') return { value: this.sequence(n) };
      if (n.kind === 'mapping') return { value: this.mapping(n, this.newTarget()).object };
      const r = resolveScalar(n);
      return { value: r.value, go: r.go };
    } finally {
      this.depth--;
    }
  }

  /** Every alias is expanded afresh (a copy, as in Go); an anchor may not contain itself. */
  private viaAlias<T>(n: YamlNode, use: (target: YamlNode) => T): T {
    const target = this.anchors.get(n.value);
    if (!target) failAt(n.mark, `unknown anchor '${n.value}' referenced`);
    if (this.expanding.has(n.value)) failAt(n.mark, `anchor '${n.value}' value contains itself`);
    this.expanding.add(n.value);
    try {
      return use(target);
    } finally {
      this.expanding.delete(n.value);
    }
  }

  private newTarget(): Target {
    const target = { object: {}, lines: new Map<string, number>() };
    this.lines.set(target.object, target.lines);
    return target;
  }

  private sequence(n: YamlNode): unknown[] {
    const array: unknown[] = [];
    const lines = new Map<string, number>();
    this.lines.set(array, lines);
    for (const child of n.children) {
      const key = String(array.length);
      const item = this.decode(child);
      array.push(item.value);
      lines.set(key, child.mark.line + 1);
      if (item.go !== undefined) goStringsOf(array).set(key, item.go);
    }
    return array;
  }

  /**
   * Writes the pairs of mapping `n` into `into`. Later writes win, merges included, in the order
   * written (yaml.v2's rule); but one mapping may not write the same key twice (ours).
   */
  private mapping(n: YamlNode, into: Target): Target {
    const seen = new Set<string>();
    for (let i = 0; i < n.children.length; i += 2) {
      const keyNode = n.children[i];
      if (isMerge(keyNode)) {
        this.merge(n.children[i + 1], into);
        continue;
      }
      const key = this.key(keyNode);
      if (seen.has(key)) failAt(keyNode.mark, `duplicate key ${JSON.stringify(key)}`);
      seen.add(key);
      const item = this.decode(n.children[i + 1]);
      // As JSON.parse does: an own data property, even for "__proto__".
      Object.defineProperty(into.object, key, {
        value: item.value,
        writable: true,
        enumerable: true,
        configurable: true,
      });
      into.lines.set(key, keyNode.mark.line + 1);
      if (item.go !== undefined) goStringsOf(into.object).set(key, item.go);
      else goStrings.get(into.object)?.delete(key);
    }
    return into;
  }

  private key(n: YamlNode): string {
    if (n.kind === 'alias') return this.viaAlias(n, (target) => this.key(target));
    if (n.kind !== 'scalar') failAt(n.mark, 'a mapping or a sequence cannot be a mapping key');
    return keyString(resolveScalar(n), n);
  }

  /** `<<: *base` or `<<: [*a, *b]`: the earlier mappings of a list take precedence. */
  private merge(value: YamlNode, into: Target): void {
    const wantMap = (): never => failAt(value.mark, 'map merge requires map or sequence of maps as the value');
    const check = (n: YamlNode): void => {
      const target = n.kind === 'alias' ? this.anchors.get(n.value) : n;
      if (target && target.kind !== 'mapping') wantMap();
    };
    if (value.kind === 'sequence') {
      for (const n of value.children) if (n.kind !== 'alias' && n.kind !== 'mapping') wantMap();
      for (const n of [...value.children].reverse()) {
        check(n);
        this.mergeOne(n, into);
      }
    } else if (value.kind === 'mapping' || value.kind === 'alias') {
      check(value);
      this.mergeOne(value, into);
    } else {
      wantMap();
    }
  }

  private mergeOne(n: YamlNode, into: Target): void {
    if (n.kind === 'alias') this.viaAlias(n, (target) => this.mapping(target, into));
    else this.mapping(n, into);
  }
}

function isMerge(n: YamlNode): boolean {
  return n.kind === 'scalar' && n.value === '<<' && (n.implicit || n.tag === MERGE_TAG);
}

function goStringsOf(holder: object): Map<string, string> {
  let map = goStrings.get(holder);
  if (!map) goStrings.set(holder, (map = new Map()));
  return map;
}

// ---------------------------------------------------------------------------------------------
// JSON read directly. Most hook files are JSON, which the three stages read as YAML flow syntax;
// on a cold start that costs some 2 ms per kilobyte (the stages run character by character in
// V8's interpreter), the largest part of starting up (docs/results.md#start-up). readJson reads a
// JSON document in one pass to exactly what the stages give for it: the same values, the same
// LineMap, the same Go renderings (scalars are resolved by resolvePlain). Wherever YAML reads a
// JSON text its own way or refuses it, it gives up (undefined) and the stages read the text: tabs
// outside the outermost brackets, line breaks YAML has and JSON has not (U+0085, U+2028, U+2029),
// control and non-BMP characters, a byte order mark, the escapes `\/` (yaml.v2 refuses it) and
// `\u` of a surrogate, a key whose ':' is on a later line or over 1024 characters away (YAML's
// simple-key limit), a repeated key, deep nesting, and anything that is not JSON (comments,
// trailing commas, more documents).

/** A double-quoted string without the escapes YAML reads otherwise (`\/`, `\u` of a surrogate): its content. */
const JSON_STRING = String.raw`"((?:[^"\\\x00-\x1f]|\\["\\bfnrt]|\\u(?![dD][89a-fA-F])[0-9a-fA-F]{4})*)"`;
/** A JSON number or word: a plain scalar to YAML. */
const JSON_PLAIN = String.raw`(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|true|false|null)`;
/** One token and the blanks before it: punctuation, a string or a plain scalar. */
const JSON_TOKEN = new RegExp(String.raw`([ \t\n\r]*)(?:([[\]{},:])|${JSON_STRING}|${JSON_PLAIN})`, 'y');
/** What YAML reads as JSON reads it: a collection with only spaces and line breaks before it (and after: atEnd). */
const JSON_START = /^[ \n\r]*[[{]/;
/** Characters the direct reader leaves to the stages (see above). */
const NOT_DIRECT_JSON = /[^\t\n\r\x20-\x7e\u00a0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd]/;
/** Nesting past this is left to the stages, which refuse it past MAX_DEPTH with the place. */
const DIRECT_JSON_DEPTH = 100;
/** libyaml's simple-key limit: a key's ':' at most this many characters after the key's start. */
const SIMPLE_KEY_REACH = 1024;

interface JsonToken {
  /** '[', ']', '{', '}', ',', ':', '"' (a string) or 'plain'. */
  kind: string;
  /** A string's value (escapes decoded) or a plain scalar's text. */
  text: string;
  /** 1-based, as LineMap counts. */
  line: number;
  index: number;
}

/** Thrown inside DirectJsonReader when the stages must read the text instead. */
const NOT_DIRECT = new Error('not read directly');

class DirectJsonReader {
  readonly lines: LineMap = new WeakMap();
  private readonly text: string;
  private pos = 0;
  private line = 1;
  private nodes = 0;

  constructor(text: string) {
    this.text = text;
  }

  token(): JsonToken {
    JSON_TOKEN.lastIndex = this.pos;
    const m = JSON_TOKEN.exec(this.text);
    if (!m) throw NOT_DIRECT;
    // Line breaks as YAML counts them: \n, \r\n and a lone \r.
    const blanks = m[1];
    for (let i = 0; i < blanks.length; i++) {
      if (blanks[i] === '\n' || (blanks[i] === '\r' && blanks[i + 1] !== '\n')) this.line++;
    }
    const index = this.pos + m[1].length;
    this.pos += m[0].length;
    if (m[2] !== undefined) return { kind: m[2], text: m[2], line: this.line, index };
    if (m[3] !== undefined) {
      // A match of 13 characters or more is, to V8, a slice that keeps the whole file alive as long as
      // the value lives (the hooks do): such strings, and those with escapes, are made anew.
      const text = m[3].length >= 13 || m[3].includes('\\') ? (JSON.parse(`"${m[3]}"`) as string) : m[3];
      return { kind: '"', text, line: this.line, index };
    }
    return { kind: 'plain', text: m[4], line: this.line, index };
  }

  /** The value that starts with token `t`, as Decoder.decode gives it. */
  value(t: JsonToken, depth: number): Item {
    if (++this.nodes > MAX_NODES || depth > DIRECT_JSON_DEPTH) throw NOT_DIRECT;
    if (t.kind === '[') return { value: this.sequence(depth) };
    if (t.kind === '{') return { value: this.mapping(depth) };
    if (t.kind === '"') return { value: t.text };
    if (t.kind !== 'plain') throw NOT_DIRECT;
    const r = resolvePlain(t.text);
    return { value: r.value, go: r.go };
  }

  private sequence(depth: number): unknown[] {
    const array: unknown[] = [];
    const lines = new Map<string, number>();
    this.lines.set(array, lines);
    let t = this.token();
    if (t.kind === ']') return array;
    for (;;) {
      const key = String(array.length);
      const item = this.value(t, depth + 1);
      array.push(item.value);
      lines.set(key, t.line);
      if (item.go !== undefined) goStringsOf(array).set(key, item.go);
      const after = this.token();
      if (after.kind === ']') return array;
      if (after.kind !== ',') throw NOT_DIRECT;
      t = this.token();
    }
  }

  private mapping(depth: number): object {
    const object = {};
    const lines = new Map<string, number>();
    this.lines.set(object, lines);
    let key = this.token();
    if (key.kind === '}') return object;
    for (;;) {
      const colon = this.token();
      const simpleKey = colon.line === key.line && colon.index - key.index <= SIMPLE_KEY_REACH;
      if (key.kind !== '"' || colon.kind !== ':' || !simpleKey || lines.has(key.text)) throw NOT_DIRECT;
      const item = this.value(this.token(), depth + 1);
      // As the Decoder (and JSON.parse) does: an own data property, even for "__proto__".
      Object.defineProperty(object, key.text, {
        value: item.value,
        writable: true,
        enumerable: true,
        configurable: true,
      });
      lines.set(key.text, key.line);
      if (item.go !== undefined) goStringsOf(object).set(key.text, item.go);
      const after = this.token();
      if (after.kind === '}') return object;
      if (after.kind !== ',') throw NOT_DIRECT;
      key = this.token();
    }
  }

  /** Only spaces and line breaks may follow the document. */
  atEnd(): boolean {
    return /^[ \n\r]*$/.test(this.text.slice(this.pos));
  }
}

/** A JSON document read directly, as the stages would read it; undefined when the stages must read it. */
export function readJson(text: string): { value: unknown; lines: LineMap } | undefined {
  if (!JSON_START.test(text) || NOT_DIRECT_JSON.test(text)) return undefined;
  const reader = new DirectJsonReader(text);
  try {
    const { value } = reader.value(reader.token(), 1);
    return reader.atEnd() ? { value, lines: reader.lines } : undefined;
  } catch (e) {
    if (e === NOT_DIRECT) return undefined;
    throw e;
  }
}

// ---------------------------------------------------------------------------------------------
// API

/**
 * Reads the first document of a YAML stream (JSON included) as adnanh/webhook 2.8 does, into
 * plain values: objects, arrays, strings, numbers, booleans and null. Throws YamlError.
 */
export function parseYaml(text: string): { value: unknown; lines: LineMap } {
  return readJson(text) ?? readYaml(text);
}

/** parseYaml through the three stages, whatever the text. */
export function readYaml(text: string): { value: unknown; lines: LineMap } {
  const parser = new Parser(new Scanner(readChars(text)));
  const root = parser.parseFirstDocument();
  const decoder = new Decoder(parser.anchors);
  const value = root === null ? null : decoder.decode(root).value;
  return { value, lines: decoder.lines };
}

/**
 * What a Go string field receives for this scalar (ghodss/yaml converts numbers and booleans:
 * 1 -> "1", true -> "true", 1.5 -> "1.5", floats through float32 as in `1.234567e+06`).
 * A string is itself; null and collections give undefined (Go leaves the field empty).
 * Pass the holder and key it was read from to get Go's exact text, which a JS number cannot
 * always carry: `1234567.0` (a float) and `1234567` (an int) both read as 1234567 but render
 * differently, and integers past 2^53 lose digits.
 */
export function scalarAsGoString(v: unknown, holder?: object, key?: string | number): string | undefined {
  if (holder !== undefined && key !== undefined) {
    const recorded = goStrings.get(holder)?.get(String(key));
    if (recorded !== undefined && Object.is((holder as Record<string, unknown>)[String(key)], v)) return recorded;
  }
  if (typeof v === 'string') return v;
  if (typeof v === 'boolean') return String(v);
  if (typeof v !== 'number') return undefined;
  return Number.isSafeInteger(v) && !Object.is(v, -0) ? String(v) : formatFloat32(v);
}

// ================================================================================================
// 4. go template — the subset of Go's text/template that hook files use under -template: actions with pipelines of
//    getenv, cat, credential, js, html and urlquery, quoted and raw strings, parentheses, comments and trim markers.
//    renderTemplate returns the text and the values the functions inserted, which are secrets from then on; anything
//    else is a TemplateError naming the line.
//    Exports: goJsEscape, goQueryEscape, renderTemplate, TemplateEnv.
//    Tests: test/unit.test.ts.
// ================================================================================================

// ---- the Go text/template subset ---------------------------------------------------------------

export interface TemplateEnv {
  getenv(name: string): string | undefined;
  readFile(path: string): string | undefined;
}

const TEMPLATE_FUNCTIONS = ['getenv', 'cat', 'credential', 'js', 'html', 'urlquery'];

/**
 * Renders the subset of Go's text/template that hook files use: actions with pipelines of
 * getenv/cat/credential/js/html/urlquery, quoted and raw strings, parentheses, comments and
 * `{{-`/`-}}` trim markers. Returns the text and the values the functions inserted (they are
 * treated as secrets). Anything else is an error naming the line.
 */
/** A template that does not render; the message names the line. */
class TemplateError extends Error {}

export function renderTemplate(text: string, env: TemplateEnv): { output: string; inserted: string[] } {
  const inserted: string[] = [];
  let out = '';
  let at = 0;
  const lineAt = (i: number) => text.slice(0, i).split('\n').length;
  while (at < text.length) {
    const open = text.indexOf('{{', at);
    if (open < 0) {
      out += text.slice(at);
      break;
    }
    let literal = text.slice(at, open);
    let bodyStart = open + 2;
    if (/^-[ \t\r\n]/.test(text.slice(bodyStart, bodyStart + 2))) {
      literal = literal.replace(/[ \t\r\n]+$/, '');
      bodyStart += 1;
    }
    out += literal;
    const close = text.indexOf('}}', bodyStart);
    if (close < 0) throw new TemplateError(`line ${lineAt(open)}: template: unclosed action (missing "}}")`);
    let bodyEnd = close;
    let trimAfter = false;
    if (/[ \t\r\n]-$/.test(text.slice(close - 2, close))) {
      bodyEnd = close - 1;
      trimAfter = true;
    }
    const body = text.slice(bodyStart, bodyEnd).trim();
    at = close + 2;
    if (trimAfter) while (at < text.length && ' \t\r\n'.includes(text[at])) at++;
    if (body.startsWith('/*')) {
      if (!body.endsWith('*/')) throw new TemplateError(`line ${lineAt(open)}: template: unclosed comment`);
      continue;
    }
    try {
      out += evaluateTemplateAction(body, env, inserted);
    } catch (e) {
      throw new TemplateError(`line ${lineAt(open)}: template: ${(e as Error).message}`);
    }
  }
  return { output: out, inserted };
}

function evaluateTemplateAction(body: string, env: TemplateEnv, inserted: string[]): string {
  const tokens: string[] = [];
  // A string may also be written with JSON-escaped quotes (\"X\"): hook files are often kept valid
  // JSON before templating, so the action sits inside a JSON string.
  const re =
    /\s*(?:("(?:[^"\\\n]|\\.)*"|\\"(?:[^"\\\n]|\\[^"])*\\")|(`[^`]*`)|([|()])|([A-Za-z_][A-Za-z0-9_]*)|(\S))/gy;
  let m: RegExpExecArray | null;
  while (re.lastIndex < body.length && (m = re.exec(body))) {
    if (m[5] !== undefined)
      throw new Error(
        `unexpected ${JSON.stringify(m[5])} in action (only ${TEMPLATE_FUNCTIONS.join(', ')}, strings, "|" and ` +
          `parentheses are supported)`,
      );
    tokens.push(m[0].trim());
  }
  let pos = 0;
  const pipeline = (): string => {
    let value = command(undefined);
    while (tokens[pos] === '|') {
      pos++;
      value = command(value);
    }
    return value;
  };
  const operand = (): string => {
    const t = tokens[pos++];
    if (t === undefined) throw new Error('missing argument');
    if (t === '(') {
      const v = pipeline();
      if (tokens[pos++] !== ')') throw new Error('missing ")"');
      return v;
    }
    if (t.startsWith('\\"')) return JSON.parse(t.slice(1, -2) + '"') as string;
    if (t.startsWith('"')) return JSON.parse(t) as string;
    if (t.startsWith('`')) return t.slice(1, -1);
    throw new Error(`expected a string, got ${JSON.stringify(t)}`);
  };
  const command = (piped: string | undefined): string => {
    const t = tokens[pos];
    if (t === undefined) throw new Error('empty command');
    if (!/^[A-Za-z_]/.test(t)) {
      if (piped !== undefined) throw new Error(`cannot pipe into ${JSON.stringify(t)}`);
      return operand();
    }
    pos++;
    if (!TEMPLATE_FUNCTIONS.includes(t))
      throw new Error(`function "${t}" not defined (supported: ${TEMPLATE_FUNCTIONS.join(', ')})`);
    const args: string[] = [];
    while (pos < tokens.length && tokens[pos] !== '|' && tokens[pos] !== ')') args.push(operand());
    if (piped !== undefined) args.push(piped);
    if (args.length !== 1) throw new Error(`wrong number of args for ${t}: want 1 got ${args.length}`);
    const value = applyTemplateFunction(t, args[0], env);
    if (['getenv', 'cat', 'credential'].includes(t) && value !== '') inserted.push(value);
    return value;
  };
  const value = pipeline();
  if (pos < tokens.length) throw new Error(`unexpected ${JSON.stringify(tokens[pos])} in action`);
  return value;
}

function applyTemplateFunction(name: string, arg: string, env: TemplateEnv): string {
  const cat = (p: string) => {
    const c = env.readFile(p);
    return c === undefined ? '' : c.replace(/\n$/, '');
  };
  switch (name) {
    case 'getenv':
      return env.getenv(arg) ?? '';
    case 'cat':
      return cat(arg);
    case 'credential': {
      const dir = env.getenv('CREDENTIALS_DIRECTORY') ?? '';
      return dir === '' ? (env.getenv(arg) ?? '') : cat(path.join(dir, arg));
    }
    case 'js':
      return goJsEscape(arg);
    case 'html':
      return arg.replace(
        /[\0"'&<>]/g,
        (c) => ({ '\0': '\uFFFD', '"': '&#34;', "'": '&#39;', '&': '&amp;', '<': '&lt;', '>': '&gt;' })[c]!,
      );
    default:
      return goQueryEscape(arg);
  }
}

/** Go's text/template `js` escaping (template.JSEscapeString). */
export function goJsEscape(s: string): string {
  let out = '';
  for (const ch of s) {
    const c = ch.codePointAt(0)!;
    const special: Record<string, string> = {
      '\\': '\\\\',
      "'": "\\'",
      '"': '\\"',
      '<': '\\u003C',
      '>': '\\u003E',
      '&': '\\u0026',
      '=': '\\u003D',
    };
    if (special[ch]) out += special[ch];
    else if (c < 0x20) out += '\\u00' + c.toString(16).toUpperCase().padStart(2, '0');
    else if (c >= 0x80 && !/[\p{L}\p{M}\p{N}\p{P}\p{S}\u0020]/u.test(ch))
      out += '\\u' + c.toString(16).toUpperCase().padStart(4, '0');
    else out += ch;
  }
  return out;
}

/** Go's url.QueryEscape. */
export function goQueryEscape(s: string): string {
  return encodeURIComponent(s)
    .replace(/[!'()*]/g, (c) => '%' + c.charCodeAt(0).toString(16).toUpperCase())
    .replace(/%20/g, '+');
}

// ================================================================================================
// 5. go regexp — hook regexes are Go (RE2) syntax; compileGoRegex translates them for V8's linear-time engine (the
//    `l` flag), so no pattern backtracks whatever the request holds. Go's classes, flags, repeat limits and Unicode
//    rules are kept; a pattern Go would refuse is refused with Go's message.
//    Exports: compileGoRegex.
//    Tests: test/unit.test.ts.
// ================================================================================================

// ---- Go regular expressions on V8's linear-time engine ---------------------------------------

/**
 * Compiles a Go (RE2) regular expression for V8's linear-time engine (the `l` flag), so no request
 * can make a hook's regex take more than linear time, whatever the pattern (RE2 guarantees the
 * same). That engine takes neither the `u` nor the `i` flag, so the pattern is translated piece by
 * piece (GoRegexTranslator). What Go refuses, and what the linear engine cannot run, is an error.
 */
export function compileGoRegex(source: string): RegExp {
  const translator = new GoRegexTranslator(source);
  const translated = translator.translate();
  const flags = translator.multiline ? 'ml' : 'l';
  try {
    return linearRegExp(translated, flags);
  } catch (e) {
    const message = (e as Error).message;
    if (/linear time/.test(message))
      throw new Error(
        "V8's linear-time engine cannot run it: a group's counted repeat ({n,m}), times those around " +
          'it, may be at most 16',
      );
    throw new Error(message.slice(message.lastIndexOf(': ') + 2));
  }
}

/**
 * The executable starts with the linear engine enabled (scripts/build.ts puts the V8 flag in its
 * options); run from source (the tests, plain node), the flag is set before the first pattern. V8
 * reads it when it parses a pattern's flags, so setting it then is enough.
 */
function linearRegExp(source: string, flags: string): RegExp {
  try {
    return new RegExp(source, flags);
  } catch (e) {
    if (!/Invalid flags/.test((e as Error).message)) throw e;
  }
  setFlagsFromString('--enable-experimental-regexp-engine');
  return new RegExp(source, flags);
}

/** Code point ranges of a character class, [first, last], both included. */
type CharRanges = [number, number][];

const LAST_BMP = 0xffff;
/** Ranges written as pairs of first and last characters: "09AZ" is 0-9 and A-Z. */
function rangePairs(pairs: string): CharRanges {
  const out: CharRanges = [];
  for (let i = 0; i < pairs.length; i += 2) out.push([pairs.charCodeAt(i), pairs.charCodeAt(i + 1)]);
  return out;
}

const PERL_CLASSES: Record<string, CharRanges> = {
  d: rangePairs('09'),
  w: rangePairs('09AZ__az'),
  // Go's \s is ASCII white space without \v; JavaScript's also has \v and the Unicode spaces.
  s: rangePairs('\t\n\f\r  '),
};
const POSIX_CLASSES: Record<string, CharRanges> = {
  alnum: rangePairs('09AZaz'),
  alpha: rangePairs('AZaz'),
  ascii: rangePairs('\x00\x7f'),
  blank: rangePairs('\t\t  '),
  cntrl: rangePairs('\x00\x1f\x7f\x7f'),
  digit: rangePairs('09'),
  graph: rangePairs('!~'),
  lower: rangePairs('az'),
  print: rangePairs(' ~'),
  punct: rangePairs('!/:@[`{~'),
  space: rangePairs('\t\r  '),
  upper: rangePairs('AZ'),
  word: rangePairs('09AZ__az'),
  xdigit: rangePairs('09AFaf'),
};
const CHAR_ESCAPES: Record<string, number> = { a: 7, f: 12, t: 9, n: 10, r: 13, v: 11 };
/** Go refuses larger repeat counts. */
const GO_MAX_REPEAT = 1000;
/** V8's linear engine copies a counted repeat's body, and refuses more than this many copies. */
const LINEAR_MAX_REPEAT = 16;

/** Sorted, with overlapping and adjacent ranges merged. */
function normalizeRanges(ranges: CharRanges): CharRanges {
  const sorted = ranges.map(([a, b]): [number, number] => [a, b]).sort((x, y) => x[0] - y[0]);
  const out: CharRanges = [];
  for (const r of sorted) {
    const last = out[out.length - 1];
    if (last && r[0] <= last[1] + 1) last[1] = Math.max(last[1], r[1]);
    else out.push(r);
  }
  return out;
}

function complementRanges(ranges: CharRanges): CharRanges {
  const out: CharRanges = [];
  let next = 0;
  for (const [a, b] of normalizeRanges(ranges)) {
    if (a > next) out.push([next, a - 1]);
    next = b + 1;
  }
  if (next <= LAST_BMP) out.push([next, LAST_BMP]);
  return out;
}

/** One character as pattern text: itself when plainly literal, else escaped. */
function patternChar(cp: number): string {
  if (/^[A-Za-z0-9 _!"#%&',:;<=>@`~]$/.test(String.fromCharCode(cp))) return String.fromCharCode(cp);
  if (cp < 0x80 && /[\\^$.|?*+()[\]{}/-]/.test(String.fromCharCode(cp))) return '\\' + String.fromCharCode(cp);
  return '\\u' + cp.toString(16).padStart(4, '0');
}

/** A character class as JavaScript pattern text (no `u` flag: every character is one code unit). */
function classSource(ranges: CharRanges, negated: boolean): string {
  const items = normalizeRanges(ranges).map(([a, b]) =>
    a === b ? patternChar(a) : `${patternChar(a)}${b > a + 1 ? '-' : ''}${patternChar(b)}`,
  );
  return `[${negated ? '^' : ''}${items.join('')}]`;
}

interface GoRegexFlags {
  /** (?i): case-insensitive. */
  i: boolean;
  /** (?s): `.` matches \n too. */
  s: boolean;
}

/** A translated piece: its text, whether a repeat may follow, whether it is a single character. */
interface RegexPiece {
  text: string;
  repeatable: boolean;
  single: boolean;
}

interface RegexRepeat {
  min: number;
  max: number;
  lazy: boolean;
  text: string;
}

/**
 * Go's syntax, rewritten for a JavaScript pattern without the `u` and `i` flags: case-insensitive
 * letters become classes of every case (by Unicode simple case folding, as Go's), `.` and `\s` get
 * Go's meaning, `\A`, `\z`, `\Q…\E`, `\x{…}`, octal escapes, POSIX classes and `(?P<name>…)` are
 * written in JavaScript's terms, and a long counted repeat of one character is written out in
 * full (the linear engine copies a repeat's body, and refuses more than 16 copies). Refused, with
 * what Go or the linear engine would say: lookarounds and backreferences (not RE2), Unicode
 * classes (`\pL` needs the `u` flag), characters beyond U+FFFF in a class, (?U), and (?m) anywhere
 * but at the start (it becomes JavaScript's m flag, for the whole pattern).
 */
class GoRegexTranslator extends TextCursor {
  /** (?m) at the start: ^ and $ match at line breaks. */
  multiline = false;
  /** Inside \Q…\E. */
  private quoting = false;
  /** Every character up to U+FFFF, read by case folding; made on the first (?i). */
  private everyChar: string | undefined;

  fail(what: string): never {
    throw new Error(what);
  }

  translate(): string {
    const out = this.alternatives({ i: false, s: false }, 0);
    if (!this.atEnd()) this.fail(`unexpected ): \`${this.text}\``);
    return out;
  }

  /** Alternatives up to the end of the current group (or of the pattern). */
  private alternatives(outer: GoRegexFlags, depth: number): string {
    const flags = { ...outer };
    let out = '';
    let atom: { start: number; single: boolean } | undefined;
    while (!this.atEnd() && (this.quoting || this.text[this.at] !== ')')) {
      const repeat = this.quoting ? undefined : this.repeat();
      if (repeat) {
        if (!atom) this.fail(`missing argument to repetition operator: \`${repeat.text}\``);
        out = out.slice(0, atom.start) + this.repeated(out.slice(atom.start), atom.single, repeat);
        atom = undefined;
        continue;
      }
      const piece = this.piece(flags, depth, depth === 0 && out === '');
      if (piece.text === '') continue;
      atom = piece.repeatable ? { start: out.length, single: piece.single } : undefined;
      out += piece.text;
    }
    return out;
  }

  private piece(flags: GoRegexFlags, depth: number, atStart: boolean): RegexPiece {
    const anchor = (text: string) => ({ text, repeatable: false, single: false });
    if (this.quoting) {
      if (!this.text.startsWith('\\E', this.at)) return this.literal(this.codePoint(), flags);
      this.at += 2;
      this.quoting = false;
      return anchor('');
    }
    const c = this.text[this.at++];
    if (c === '(') return this.group(flags, depth, atStart);
    if (c === '|') return anchor('|');
    if (c === '^' || c === '$') return anchor(c);
    if (c === '.') return { text: flags.s ? '[\\s\\S]' : '[^\\n]', repeatable: true, single: true };
    if (c === '[') {
      const cls = this.charClass();
      return this.classPiece(cls.ranges, cls.negated, flags);
    }
    if (c === '\\') return this.escape(flags);
    this.at--;
    return this.literal(this.codePoint(), flags);
  }

  /** The code point at the cursor (a surrogate pair is one), consumed. */
  private codePoint(): number {
    const cp = this.text.codePointAt(this.at)!;
    this.at += cp > LAST_BMP ? 2 : 1;
    return cp;
  }

  private literal(cp: number, flags: GoRegexFlags): RegexPiece {
    if (cp > LAST_BMP) return { text: `(?:${String.fromCodePoint(cp)})`, repeatable: true, single: true };
    if (flags.i) return this.classPiece([[cp, cp]], false, flags);
    return { text: patternChar(cp), repeatable: true, single: true };
  }

  private classPiece(ranges: CharRanges, negated: boolean, flags: GoRegexFlags): RegexPiece {
    const all = flags.i ? this.caseFolded(ranges) : normalizeRanges(ranges);
    if (all.some(([, b]) => b > LAST_BMP))
      this.fail('a character beyond U+FFFF in a class needs Unicode mode, which the linear engine does not run');
    const text =
      !negated && all.length === 1 && all[0][0] === all[0][1] ? patternChar(all[0][0]) : classSource(all, negated);
    return { text, repeatable: true, single: true };
  }

  /** The ranges with every character Unicode simple case folding (Go's (?i)) makes equal to one of them. */
  private caseFolded(ranges: CharRanges): CharRanges {
    const bmp = ranges.filter(([a]) => a <= LAST_BMP).map(([a, b]): [number, number] => [a, Math.min(b, LAST_BMP)]);
    if (bmp.length === 0) return normalizeRanges(ranges);
    this.everyChar ??=
      Array.from({ length: 0xd800 }, (_, cp) => String.fromCharCode(cp)).join('') +
      Array.from({ length: LAST_BMP - 0xdfff }, (_, i) => String.fromCharCode(0xe000 + i)).join('');
    // The `iu` flags make V8 fold cases by Unicode's simple case folding; a class has no backtracking.
    const folded = this.everyChar.match(new RegExp(classSource(bmp, false), 'giu')) ?? [];
    return normalizeRanges([...ranges, ...folded.map((ch): [number, number] => [ch.charCodeAt(0), ch.charCodeAt(0)])]);
  }

  /** After `(`: a group, or a flag setting `(?i)` (empty text; the flags change to the group's end). */
  private group(flags: GoRegexFlags, depth: number, atStart: boolean): RegexPiece {
    let open = '(';
    let inner = flags;
    if (this.text[this.at] === '?') {
      const rest = this.text.slice(this.at, this.at + 260);
      const m = /^\?(?:P?<([A-Za-z0-9_]+)>|(:)|([imsU]*(?:-[imsU]*)?)([:)]))/.exec(rest);
      if (/^\?<?[=!]/.test(rest)) this.fail('lookaround assertions are not RE2 syntax');
      if (!m || m[3] === '' || m[3] === '-') this.fail(`invalid or unsupported Perl syntax: \`(${rest.slice(0, 3)}\``);
      this.at += m[0].length;
      if (m[1] !== undefined) open = `(?<${m[1]}>`;
      else if (m[2] !== undefined) open = '(?:';
      else if (m[4] === ')') {
        this.setFlags(flags, m[3], atStart);
        return { text: '', repeatable: false, single: false };
      } else {
        inner = { ...flags };
        this.setFlags(inner, m[3], false);
        open = '(?:';
      }
    }
    const body = this.alternatives(inner, depth + 1);
    if (this.text[this.at] !== ')') this.fail(`missing closing ): \`${this.text}\``);
    this.at++;
    return { text: `${open}${body})`, repeatable: true, single: false };
  }

  private setFlags(flags: GoRegexFlags, spec: string, atStart: boolean): void {
    const [on, off = ''] = spec.split('-');
    if (spec.includes('U')) this.fail('the (?U) flag is not supported');
    if (on.includes('m')) {
      if (!atStart) this.fail('(?m) is supported only at the start of the pattern');
      this.multiline = true;
    }
    for (const f of ['i', 's'] as const) {
      if (on.includes(f)) flags[f] = true;
      if (off.includes(f)) flags[f] = false;
    }
  }

  /** A repetition operator at the cursor (consumed), or undefined; a `{` that is not one is a literal. */
  private repeat(): RegexRepeat | undefined {
    const m = /^(?:([*+?])|\{(\d+)(?:(,)(\d*))?\})(\??)/.exec(this.text.slice(this.at, this.at + 20));
    if (!m) return undefined;
    const simple: Record<string, [number, number]> = { '*': [0, Infinity], '+': [1, Infinity], '?': [0, 1] };
    const [min, max] = m[1]
      ? simple[m[1]]
      : [Number(m[2]), m[3] === undefined ? Number(m[2]) : m[4] === '' ? Infinity : Number(m[4])];
    if (min > GO_MAX_REPEAT || (max !== Infinity && (max > GO_MAX_REPEAT || max < min)))
      this.fail(`invalid repeat count: \`${m[0]}\``);
    this.at += m[0].length;
    return { min, max, lazy: m[5] === '?', text: m[0] };
  }

  /** A repeated atom; one character repeated more often than the linear engine copies is written out. */
  private repeated(atom: string, single: boolean, r: RegexRepeat): string {
    const long = r.min > LINEAR_MAX_REPEAT || (r.max !== Infinity && r.max > LINEAR_MAX_REPEAT);
    if (!long || !single) return atom + r.text;
    const lazy = r.lazy ? '?' : '';
    const optional = r.max === Infinity ? `${atom}*${lazy}` : `${atom}?${lazy}`.repeat(r.max - r.min);
    return atom.repeat(r.min) + optional;
  }

  /** After a backslash outside a class. */
  private escape(flags: GoRegexFlags): RegexPiece {
    const c = this.text[this.at];
    const anchor = (text: string) => ({ text, repeatable: false, single: false });
    if (c === undefined) this.fail('trailing backslash at end of expression');
    if ('AzbBQ'.includes(c)) this.at++;
    if (c === 'A') return anchor(this.multiline ? '(?<![\\s\\S])' : '^');
    if (c === 'z') {
      // Without (?m), JavaScript's $ is the end of the text, as \z is; with it, only a lookahead says so.
      if (this.multiline) this.fail('\\z after (?m) needs a lookahead, which the linear engine does not run');
      return anchor('$');
    }
    if (c === 'b' || c === 'B') return anchor(`\\${c}`);
    if (c === 'Q') {
      this.quoting = true;
      return anchor('');
    }
    const perl = this.perlClass();
    if (perl) return this.classPiece(perl.ranges, perl.negated, flags);
    return this.literal(this.escapedChar(), flags);
  }

  /** \d \D \w \W \s \S at the cursor (consumed); \p and \P are refused. */
  private perlClass(): { ranges: CharRanges; negated: boolean } | undefined {
    const c = this.text[this.at];
    if (c === 'p' || c === 'P')
      this.fail(`Unicode classes (\\${c}) need Unicode mode, which the linear engine does not run`);
    const ranges = PERL_CLASSES[c?.toLowerCase()];
    if (!ranges) return undefined;
    this.at++;
    return { ranges, negated: c !== c.toLowerCase() };
  }

  /** A character written as an escape (after the backslash): \n, \x41, \x{263a}, \101, \. … */
  private escapedChar(): number {
    const c = this.text[this.at++];
    if (c in CHAR_ESCAPES) return CHAR_ESCAPES[c];
    if (c === 'x') {
      const m = /^(?:\{([0-9A-Fa-f]{1,6})\}|([0-9A-Fa-f]{2}))/.exec(this.text.slice(this.at, this.at + 8));
      if (!m || parseInt(m[1] ?? m[2], 16) > 0x10ffff) this.fail('invalid escape sequence: `\\x`');
      this.at += m[0].length;
      return parseInt(m[1] ?? m[2], 16);
    }
    if (c >= '0' && c <= '7') {
      const m = /^[0-7]{0,2}/.exec(this.text.slice(this.at, this.at + 2))![0];
      // A single digit other than 0 would be a backreference in Perl; Go refuses it.
      if (c !== '0' && !/^[0-7]/.test(this.text[this.at] ?? '')) this.fail('backreferences are not RE2 syntax');
      this.at += m.length;
      return parseInt(c + m, 8);
    }
    if (c !== undefined && c < '\x80' && !/[A-Za-z0-9]/.test(c)) return c.charCodeAt(0);
    return this.fail(`invalid escape sequence: \`\\${c ?? ''}\``);
  }

  /** After `[`: the class's ranges and whether it is negated, up to and past the closing `]`. */
  private charClass(): { ranges: CharRanges; negated: boolean } {
    const negated = this.text[this.at] === '^';
    if (negated) this.at++;
    const ranges: CharRanges = [];
    for (let first = true; ; first = false) {
      if (this.atEnd()) this.fail(`missing closing ]: \`${this.text}\``);
      if (this.text[this.at] === ']' && !first) break;
      const named = this.classMember();
      if (named) {
        ranges.push(...named);
        continue;
      }
      const lo = this.classChar();
      if (this.text[this.at] !== '-' || this.text[this.at + 1] === ']' || this.at + 1 >= this.text.length) {
        ranges.push([lo, lo]);
        continue;
      }
      this.at++;
      const hi = this.classChar();
      if (hi < lo) this.fail('invalid character class range');
      ranges.push([lo, hi]);
    }
    this.at++;
    return { ranges, negated };
  }

  /** A POSIX class [:alpha:] or a Perl class \d inside a class (consumed), as ranges; else undefined. */
  private classMember(): CharRanges | undefined {
    const posix = /^\[:(\^?)([a-z]+):\]/.exec(this.text.slice(this.at, this.at + 12));
    if (posix) {
      const ranges = POSIX_CLASSES[posix[2]] ?? this.fail(`invalid character class range: \`${posix[0]}\``);
      this.at += posix[0].length;
      return posix[1] ? complementRanges(ranges) : ranges;
    }
    if (this.text[this.at] !== '\\') return undefined;
    this.at++;
    const perl = this.perlClass();
    if (perl) return perl.negated ? complementRanges(perl.ranges) : perl.ranges;
    this.at--;
    return undefined;
  }

  private classChar(): number {
    if (this.text[this.at] !== '\\') return this.codePoint();
    this.at++;
    return this.escapedChar();
  }
}

// ================================================================================================
// 6. semver — versions and ranges as Semantic Versioning 2.0.0 and npm define them: parseVersion reads a version
//    (a leading `v` allowed, as tags write it), compareVersions orders two by the spec's precedence (§11:
//    pre-release identifiers compared one by one, numeric below alphanumeric; build metadata ignored);
//    parseRange reads npm's range syntax (comparators, `^`, `~`, x-ranges, hyphen ranges, `||`) into sets of
//    plain comparators, and satisfiesRange applies them with npm's pre-release rule (a pre-release matches only
//    when a comparator of the same set names a pre-release of its major.minor.patch).
//    Exports: compareVersions, formatVersion, parseRange, parseVersion, satisfiesRange, SemverRange, Version.
//    Tests: test/semver.test.ts.
// ================================================================================================

/** A version: major.minor.patch, the pre-release identifiers and the build metadata (which orders nothing). */
export interface Version {
  major: number;
  minor: number;
  patch: number;
  /** Dot-separated identifiers after `-`, as written; none for a release. */
  pre: string[];
  build: string[];
}

// npm's own bound on a version's length: a tag is at most 128 characters, a range item no longer.
const MAX_VERSION_LENGTH = 256;
// A range is a line an operator writes; longer is a mistake (or an attack on the parser's time).
const MAX_RANGE_LENGTH = 1024;

const NUMERIC_IDENTIFIER = /^(?:0|[1-9]\d*)$/;
const IDENTIFIER = /^[0-9A-Za-z-]+$/;

/** A number of the core; undefined when it is not one (leading zero, beyond 2^53). */
function coreNumber(text: string): number | undefined {
  if (!NUMERIC_IDENTIFIER.test(text)) return undefined;
  const n = Number(text);
  return Number.isSafeInteger(n) ? n : undefined;
}

/** What is wrong with dot-separated identifiers (pre-release: numeric ones without leading zeros). */
function identifiersProblem(text: string, what: 'pre-release' | 'build'): string | undefined {
  for (const id of text.split('.')) {
    if (!IDENTIFIER.test(id)) return `${what} identifier ${JSON.stringify(id)} is not [0-9A-Za-z-]+`;
    if (what === 'pre-release' && /^\d+$/.test(id) && !NUMERIC_IDENTIFIER.test(id))
      return `numeric pre-release identifier ${JSON.stringify(id)} has a leading zero`;
  }
  return undefined;
}

/** Splits `core-pre+build` (the first `-` after the core starts the pre-release, the first `+` the build). */
function splitQualifiers(text: string): { core: string; pre?: string; build?: string } {
  const plus = text.indexOf('+');
  const build = plus < 0 ? undefined : text.slice(plus + 1);
  const rest = plus < 0 ? text : text.slice(0, plus);
  const dash = rest.indexOf('-');
  return dash < 0 ? { core: rest, build } : { core: rest.slice(0, dash), pre: rest.slice(dash + 1), build };
}

/**
 * A version as semver 2.0.0 writes it, with or without one leading `v` (a tag's `v1.4.2` is the version 1.4.2).
 * Returns what is wrong instead when it is not one. Pure.
 */
export function readVersion(text: string): Version | string {
  if (text.length > MAX_VERSION_LENGTH) return `longer than ${MAX_VERSION_LENGTH} characters`;
  const { core, pre, build } = splitQualifiers(text.startsWith('v') ? text.slice(1) : text);
  const parts = core.split('.');
  if (parts.length !== 3) return 'not major.minor.patch';
  const numbers = parts.map(coreNumber);
  const bad = numbers.indexOf(undefined);
  if (bad >= 0)
    return `${['major', 'minor', 'patch'][bad]} ${JSON.stringify(parts[bad])} is not a number without leading zeros`;
  const problem =
    (pre !== undefined ? identifiersProblem(pre, 'pre-release') : undefined) ??
    (build !== undefined ? identifiersProblem(build, 'build') : undefined);
  if (problem !== undefined) return problem;
  const [major, minor, patch] = numbers as number[];
  return { major, minor, patch, pre: pre === undefined ? [] : pre.split('.'), build: build?.split('.') ?? [] };
}

/** The version a tag names, or undefined when it names none. Pure. */
export function parseVersion(text: string): Version | undefined {
  const v = readVersion(text);
  return typeof v === 'string' ? undefined : v;
}

/** The version as semver writes it (no `v`). */
export function formatVersion(v: Version): string {
  return `${v.major}.${v.minor}.${v.patch}${v.pre.length ? `-${v.pre.join('.')}` : ''}`;
}

function signOf(n: number): -1 | 0 | 1 {
  return n < 0 ? -1 : n > 0 ? 1 : 0;
}

/** Two pre-release identifiers (§11.4): numeric ones numerically and below alphanumeric ones (ASCII order). */
function compareIdentifiers(a: string, b: string): -1 | 0 | 1 {
  const an = /^\d+$/.test(a);
  const bn = /^\d+$/.test(b);
  if (an && bn) return a.length !== b.length ? signOf(a.length - b.length) : a < b ? -1 : a > b ? 1 : 0;
  if (an !== bn) return an ? -1 : 1;
  return a < b ? -1 : a > b ? 1 : 0;
}

/**
 * Semver 2.0.0 precedence (§11): major, minor, patch numerically; a pre-release below its release; pre-releases
 * identifier by identifier, the longer winning when all shared ones are equal. Build metadata is ignored. Pure.
 */
export function compareVersions(a: Version, b: Version): -1 | 0 | 1 {
  const core = signOf(a.major - b.major) || signOf(a.minor - b.minor) || signOf(a.patch - b.patch);
  if (core !== 0) return core;
  if (a.pre.length === 0 || b.pre.length === 0) return signOf(b.pre.length - a.pre.length);
  for (let i = 0; i < Math.min(a.pre.length, b.pre.length); i++) {
    const c = compareIdentifiers(a.pre[i], b.pre[i]);
    if (c !== 0) return c;
  }
  return signOf(a.pre.length - b.pre.length);
}

// ---- ranges ----------------------------------------------------------------------------------

type Operator = '<' | '<=' | '>' | '>=' | '=';

/** One plain comparator: `>=1.2.0`, `<2.0.0-0`. */
interface Comparator {
  op: Operator;
  version: Version;
}

/** A range: alternatives (`||`), each a set of comparators that must all hold. */
export interface SemverRange {
  sets: Comparator[][];
}

/** A partial version of a range (`1`, `1.2`, `1.x`, `*`, `1.2.3-rc.1`): undefined parts are wildcards. */
interface PartialVersion {
  major?: number;
  minor?: number;
  patch?: number;
  pre: string[];
}

const WILDCARD = /^[xX*]$/;

/** A partial version, or throws saying what is wrong with it. */
function readPartial(text: string): PartialVersion {
  const fail = (why: string) => {
    throw new Error(`${JSON.stringify(text)}: ${why}`);
  };
  if (text.length > MAX_VERSION_LENGTH) fail(`longer than ${MAX_VERSION_LENGTH} characters`);
  const { core, pre, build } = splitQualifiers(text.startsWith('v') ? text.slice(1) : text);
  const parts = core.split('.');
  if (core === '' || parts.length > 3) fail('not a version (major[.minor[.patch]], each a number, x or *)');
  const numbers: (number | undefined)[] = [];
  for (const [i, part] of parts.entries()) {
    const wild = WILDCARD.test(part) || numbers.includes(undefined);
    const n = coreNumber(part);
    if (!WILDCARD.test(part) && n === undefined)
      fail(`${['major', 'minor', 'patch'][i]} ${JSON.stringify(part)} is not a number without leading zeros, x or *`);
    numbers.push(wild ? undefined : n);
  }
  if (pre !== undefined && (parts.length < 3 || numbers.includes(undefined)))
    fail('a pre-release needs a whole major.minor.patch');
  const problem =
    (pre !== undefined ? identifiersProblem(pre, 'pre-release') : undefined) ??
    (build !== undefined ? identifiersProblem(build, 'build') : undefined);
  if (problem !== undefined) fail(problem);
  return { major: numbers[0], minor: numbers[1], patch: numbers[2], pre: pre?.split('.') ?? [] };
}

function makeVersion(major: number, minor: number, patch: number, pre: string[] = []): Version {
  return { major, minor, patch, pre, build: [] };
}

/** The lowest version a partial names (wildcards as 0). */
function floor(p: PartialVersion): Version {
  return makeVersion(p.major ?? 0, p.minor ?? 0, p.patch ?? 0, p.pre);
}

// Upper bounds are written `<X.Y.Z-0`: below every pre-release of X.Y.Z, so none of them slips in.
const BELOW = ['0'];

/** `<` the first version after the partial's last given part: 1.2 → <1.3.0-0; 1 → <2.0.0-0. */
function pastPartial(p: PartialVersion): Comparator {
  if (p.minor === undefined) return { op: '<', version: makeVersion(p.major! + 1, 0, 0, BELOW) };
  return { op: '<', version: makeVersion(p.major!, p.minor + 1, 0, BELOW) };
}

const ANY: Comparator[] = [{ op: '>=', version: makeVersion(0, 0, 0) }];
const NOTHING: Comparator[] = [{ op: '<', version: makeVersion(0, 0, 0, BELOW) }];

/** An x-range or exact version (`1.2.3`, `=1.2`, `1.x`, `*`). */
function xRange(p: PartialVersion): Comparator[] {
  if (p.major === undefined) return ANY;
  if (p.patch !== undefined) return [{ op: '=', version: floor(p) }];
  return [{ op: '>=', version: floor(p) }, pastPartial(p)];
}

/** `~`: patch changes when minor is given, minor changes otherwise. */
function tildeRange(p: PartialVersion): Comparator[] {
  if (p.major === undefined) return ANY;
  if (p.minor === undefined) return [{ op: '>=', version: floor(p) }, pastPartial(p)];
  return [{ op: '>=', version: floor(p) }, { op: '<', version: makeVersion(p.major, p.minor + 1, 0, BELOW) }];
}

/** `^`: changes that keep the left-most non-zero part given. */
function caretRange(p: PartialVersion): Comparator[] {
  if (p.major === undefined) return ANY;
  const lower: Comparator = { op: '>=', version: floor(p) };
  if (p.major > 0 || p.minor === undefined) return [lower, { op: '<', version: makeVersion(p.major + 1, 0, 0, BELOW) }];
  if (p.minor > 0 || p.patch === undefined)
    return [lower, { op: '<', version: makeVersion(0, p.minor + 1, 0, BELOW) }];
  return [lower, { op: '<', version: makeVersion(0, 0, p.patch + 1, BELOW) }];
}

/** `<`, `<=`, `>`, `>=` on a partial, as npm desugars them (`>1.2` is `>=1.3.0`, `<=1.2` is `<1.3.0-0`). */
function primitiveRange(op: Operator, p: PartialVersion): Comparator[] {
  if (op === '=') return xRange(p);
  if (p.major === undefined) return op === '<' || op === '>' ? NOTHING : ANY;
  if (p.patch !== undefined) return [{ op, version: floor(p) }];
  if (op === '>=') return [{ op, version: floor(p) }];
  if (op === '<') return [{ op, version: makeVersion(p.major, p.minor ?? 0, 0, BELOW) }];
  const past = pastPartial(p).version;
  return op === '<=' ? [{ op: '<', version: past }] : [{ op: '>=', version: { ...past, pre: [] } }];
}

/** `A - B`: from A's floor to B (whole: `<=B`; partial: below the next version after it). */
function hyphenRange(from: PartialVersion, to: PartialVersion): Comparator[] {
  const lower = from.major === undefined ? ANY : [{ op: '>=' as const, version: floor(from) }];
  if (to.major === undefined) return lower;
  const upper = to.patch !== undefined ? { op: '<=' as const, version: floor(to) } : pastPartial(to);
  return [...lower, upper];
}

const ITEM = /^(<=|>=|<|>|=|~>|~|\^)?\s*(\S+)$/;

/** One set of a range (no `||`): a hyphen range, or comparators separated by spaces. */
function readSet(text: string): Comparator[] {
  const hyphen = /^(\S+)\s+-\s+(\S+)$/.exec(text);
  if (hyphen) return hyphenRange(readPartial(hyphen[1]), readPartial(hyphen[2]));
  // An operator may stand apart from its version: `>= 1.2.3`.
  const items = text.replace(/(<=|>=|<|>|=|~>|~|\^)\s+/g, '$1').split(/\s+/);
  return items.flatMap((item) => {
    const m = ITEM.exec(item);
    if (!m || /^[<>=~^]/.test(m[2])) throw new Error(`${JSON.stringify(item)}: not a comparator`);
    const p = readPartial(m[2]);
    const op = m[1] ?? '';
    if (op === '~' || op === '~>') return tildeRange(p);
    if (op === '^') return caretRange(p);
    return op === '' ? xRange(p) : primitiveRange(op as Operator, p);
  });
}

/**
 * A range in npm's syntax: sets joined by `||`, each a hyphen range (`1.2 - 2.3.4`) or comparators separated by
 * spaces (`>=1.2.7 <1.3.0`, `^1.4`, `~1.4.2`, `1.x`, `*`); versions may carry a leading `v`. An empty range is
 * `*`. Throws an Error saying which item is wrong and why (commas are not separators, as in npm). Pure.
 */
export function parseRange(text: string): SemverRange {
  if (text.length > MAX_RANGE_LENGTH) throw new Error(`longer than ${MAX_RANGE_LENGTH} characters`);
  const alternatives = text.split('||').map((s) => s.trim());
  if (alternatives.length === 1 && alternatives[0] === '') return { sets: [ANY] };
  if (alternatives.includes('')) throw new Error('an alternative of "||" is empty');
  return { sets: alternatives.map(readSet) };
}

function holds(c: Comparator, v: Version): boolean {
  const order = compareVersions(v, c.version);
  if (c.op === '=') return order === 0;
  if (c.op === '<') return order < 0;
  if (c.op === '<=') return order <= 0;
  if (c.op === '>') return order > 0;
  return order >= 0;
}

/**
 * Whether a version is in a range: it holds every comparator of some set, and, when it is a pre-release, that set
 * names a pre-release of the same major.minor.patch (npm's rule: `>=1.2.3-0` takes 1.2.3-beta, not 1.3.0-beta). Pure.
 */
export function satisfiesRange(v: Version, range: SemverRange): boolean {
  return range.sets.some(
    (set) =>
      set.every((c) => holds(c, v)) &&
      (v.pre.length === 0 ||
        set.some(
          (c) =>
            c.version.pre.length > 0 &&
            c.version.major === v.major &&
            c.version.minor === v.minor &&
            c.version.patch === v.patch,
        )),
  );
}

// ================================================================================================
// 7. outbound calls — what every call to another server shares. outboundRequest makes one HTTP(S) request under a
//    TOTAL deadline (connecting, sending, the answer's headers and its whole body: a server that dribbles bytes cannot
//    hold a call past it) and a cap on the answer's size. retrying runs attempts by one retry policy (retryDelay: which
//    failures are transient, exponential backoff with jitter, a Retry-After honoured, all within a budget). The token
//    bucket bounds one client's request rate, in arrival order, so that none starves. clientTlsOptions says how a
//    server is trusted (extra CAs added to Node's default set, the verification switch, the server name);
//    withDeadline bounds any other wait (the SMTP client's socket steps). Scrubber takes known secrets out of text
//    leaving the program, in every form an encoding may have given them (URL, base64, JSON, HTML). Used by the SMTP,
//    Kubernetes and registry clients and the notifications.
//    Exports: Attempt, clientTlsOptions, OutboundAnswer, OutboundError, outboundRequest, RETRY_BACKOFF,
//    retryAfterSeconds, retryDelay, retrying, Scrubber, TokenBucket, withDeadline.
//    Tests: test/burst.test.ts, test/outbound.test.ts, test/upgrade.test.ts.
// ================================================================================================

// ---- the retry policy ---------------------------------------------------------------------------

/**
 * Backoff between attempts, unless a Retry-After asks for longer: 200 ms doubling to 5 s, so a
 * refused connection is retried quickly at first without hammering a server that is coming back up.
 */
const RETRY_BACKOFF = { initialMs: 200, maxMs: 5_000 };

/** What went wrong with one attempt, as far as the retry policy cares. */
interface AttemptFailure {
  /** What was asked: a 409 Conflict is worth another try for a `patch` only (it is re-planned). */
  verb?: string;
  /** HTTP status, or undefined when no answer came. */
  status?: number;
  /** Node's error code (ECONNREFUSED, ECONNRESET, ETIMEDOUT…) when no answer came. */
  code?: string;
  retryAfterSeconds?: number;
  /**
   * Whether another try could help, for callers whose failures the status and code do not tell
   * (an SMTP reply, a chat robot's refusal in a 200): it overrides the table below.
   */
  transient?: boolean;
}

const TRANSIENT_NETWORK_CODES = [
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EPIPE',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'UND_ERR_SOCKET',
];

/**
 * How long to wait before attempt `attempt + 1`, or undefined to give up. A Retry-After is the
 * least wait, plus a random part of the backoff: the API server gives every request it throttles
 * at once the same Retry-After, and callers that all retried on the second would collide again,
 * round after round, each round letting only a few through. Pure given `random`.
 */
export function retryDelay(
  failure: AttemptFailure,
  attempt: number,
  remainingMs: number,
  random: () => number = Math.random,
  backoffMs: { initialMs: number; maxMs: number } = RETRY_BACKOFF,
): number | undefined {
  const s = failure.status;
  const transient =
    failure.transient ??
    (s === undefined
      ? TRANSIENT_NETWORK_CODES.includes(failure.code ?? '')
      : s >= 500 || s === 429 || (s === 409 && failure.verb === 'patch'));
  if (!transient) return undefined;
  const backoff = Math.min(backoffMs.maxMs, backoffMs.initialMs * 2 ** attempt);
  const delay =
    failure.retryAfterSeconds !== undefined && failure.retryAfterSeconds >= 0
      ? failure.retryAfterSeconds * 1000 + Math.floor(random() * backoff)
      : backoff;
  return delay <= remainingMs ? delay : undefined;
}

/** A Retry-After header's wait in seconds: delay-seconds, or an HTTP-date (RFC 9110 10.2.3). Pure given `nowMs`. */
export function retryAfterSeconds(header: string | string[] | undefined, nowMs = Date.now()): number | undefined {
  const value = String(header ?? '').trim();
  if (/^\d+$/.test(value)) return Number(value);
  const at = /[a-z]/i.test(value) ? Date.parse(value) : NaN;
  return Number.isNaN(at) ? undefined : Math.max(0, Math.ceil((at - nowMs) / 1000));
}

/** How a caller retries: within a time budget, at most so many attempts, with its own backoff if it has one. */
interface RetryPolicy {
  /** The time all attempts and the waits between them may take, from the first attempt's start. */
  budgetMs: number;
  /** At most this many attempts in all; by default as many as the budget allows. */
  attempts?: number;
  /** The first wait and the longest; RETRY_BACKOFF by default. */
  backoff?: { initialMs: number; maxMs: number };
}

/** One attempt's end: its value, or its failure (for the policy) and the error to report if it is the last. */
export type Attempt<T, E> = { ok: true; value: T } | { ok: false; failure: AttemptFailure; error: E };

/** How the attempts ended: the value, or the last error; how many attempts, and how long they took in all. */
type Retried<T, E> =
  | { ok: true; value: T; attempts: number }
  | { ok: false; error: E; attempts: number; elapsedMs: number };

/**
 * Runs `attemptOnce` (0, 1, 2…; given the previous attempt's error) until it succeeds or the
 * policy gives up: a permanent failure, the last attempt, or a wait that would overrun the budget.
 * An attempt that throws ends the whole call with that exception.
 */
export async function retrying<T, E>(
  policy: RetryPolicy,
  attemptOnce: (attempt: number, previous: E | undefined) => Promise<Attempt<T, E>>,
  random: () => number = Math.random,
): Promise<Retried<T, E>> {
  const started = Date.now();
  let previous: E | undefined;
  for (let attempt = 0; ; attempt++) {
    const outcome = await attemptOnce(attempt, previous);
    if (outcome.ok) return { ok: true, value: outcome.value, attempts: attempt + 1 };
    const elapsedMs = Date.now() - started;
    const last = policy.attempts !== undefined && attempt + 1 >= policy.attempts;
    const remainingMs = policy.budgetMs - elapsedMs;
    const delay = last ? undefined : retryDelay(outcome.failure, attempt, remainingMs, random, policy.backoff);
    if (delay === undefined) return { ok: false, error: outcome.error, attempts: attempt + 1, elapsedMs };
    previous = outcome.error;
    await sleep(delay);
  }
}

/**
 * A token bucket: `burst` requests may start at once, then `perSecond` a second. A reservation
 * takes a token that may not exist yet (debt), so callers are served in the order they asked and
 * none starves; one that would wait longer than it may takes nothing. Pure apart from its clock.
 */
export class TokenBucket {
  readonly perSecond: number;
  readonly burst: number;
  private readonly now: () => number;
  private tokens: number;
  private updatedAt: number;

  constructor(perSecond: number, burst: number, now: () => number = () => performance.now()) {
    this.perSecond = perSecond;
    this.burst = burst;
    this.now = now;
    this.tokens = burst;
    this.updatedAt = now();
  }

  /** Reserves one request: the ms to wait before sending it, or undefined when over maxWaitMs. */
  reserve(maxWaitMs: number): number | undefined {
    const now = this.now();
    const tokens = this.available(now);
    const wait = tokens >= 1 ? 0 : ((1 - tokens) * 1000) / this.perSecond;
    if (wait > maxWaitMs) return undefined;
    this.tokens = tokens - 1;
    this.updatedAt = now;
    return wait;
  }

  /**
   * For a request that can wait (a rollout poll): takes a token only while more than `headroom`
   * are left for the others and returns 0; else takes nothing and returns the ms until there are.
   */
  takeAbove(headroom: number): number {
    const now = this.now();
    const tokens = this.available(now);
    if (tokens < 1 + headroom) return ((1 + headroom - tokens) * 1000) / this.perSecond;
    this.tokens = tokens - 1;
    this.updatedAt = now;
    return 0;
  }

  /** The tokens there are at `now`: those left, refilled at perSecond since, up to burst (or a debt). */
  private available(now: number): number {
    return Math.min(this.burst, this.tokens + ((now - this.updatedAt) * this.perSecond) / 1000);
  }
}

// ---- TLS trust and deadlines --------------------------------------------------------------------

/** How a server's certificate is trusted. */
interface TlsTrust {
  /** PEM certificates trusted besides Node's default set (a private CA: REGISTRY_CA, NOTIFY_CACERT, MAIL_CACERT). */
  extraCa?: string | readonly string[];
  /** Trusted instead of the default set: a cluster's own CA (kubectl trusts only certificate-authority). */
  onlyCa?: Buffer;
  /** false: any certificate is accepted (the operator's explicit switch). */
  verify?: boolean;
  /** The name the certificate must carry, when not the host's (SNI; kubeconfig's tls-server-name). */
  servername?: string;
  /** A client certificate and its key. */
  cert?: Buffer;
  key?: Buffer;
}

/**
 * The TLS options for `host`. `ca` replaces Node's trusted set, so the default one (bundled roots,
 * NODE_EXTRA_CA_CERTS, --use-system-ca) is passed along with extra CAs. SNI carries names only: for
 * an IP address no servername is sent and Node checks the certificate's IP SANs against the host.
 */
export function clientTlsOptions(host: string, trust: TlsTrust = {}): tls.ConnectionOptions {
  const extra = trust.extraCa === undefined ? [] : [trust.extraCa].flat();
  const name = trust.servername ?? (net.isIP(host.replace(/^\[|\]$/g, '')) === 0 ? host.replace(/\.$/, '') : undefined);
  return {
    ca: trust.onlyCa ?? (extra.length > 0 ? [...tls.getCACertificates('default'), ...extra] : undefined),
    rejectUnauthorized: trust.verify ?? true,
    servername: name,
    cert: trust.cert,
    key: trust.key,
  };
}

/** `work`, or `timeoutError()` once `waitMs` have passed; the timer is cleared either way. */
export function withDeadline<T>(work: Promise<T>, waitMs: number, timeoutError: () => Error): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(timeoutError()), waitMs);
  });
  return Promise.race([work, expired]).finally(() => clearTimeout(timer));
}

// ---- one request ------------------------------------------------------------------------------

interface OutboundRequest {
  method: string;
  headers?: Record<string, string>;
  body?: string;
  /** The whole call: connecting, sending, the answer's headers and all of its body. */
  deadlineMs: number;
  /** The most of the answer's body that is read. */
  maxResponseBytes: number;
  /** Past maxResponseBytes: `fail` ends the call (E2BIG); `cut` keeps what fits and ends the answer there. */
  overLimit?: 'fail' | 'cut';
  /** https: how the server is trusted (with no agent; an agent carries its own). */
  trust?: TlsTrust;
  /** A keep-alive agent of the caller's (it carries its TLS options). */
  agent?: http.Agent;
}

export interface OutboundAnswer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
  /** The body's bytes, as received (a digest is checked over them, not over the decoded text). */
  bytes?: Buffer;
}

/** A call that got no complete answer. `code`: Node's (ECONNREFUSED, CERT_…), ETIMEDOUT, or E2BIG. */
export class OutboundError extends Error {
  readonly code: string;
  constructor(message: string, code: string) {
    super(message);
    this.code = code;
  }
}

/**
 * One HTTP or HTTPS request, its answer read whole (up to the cap) under ONE deadline. Resolves with
 * any HTTP answer (the caller judges the status); rejects with an OutboundError.
 */
export function outboundRequest(url: URL, o: OutboundRequest): Promise<OutboundAnswer> {
  const client = url.protocol === 'http:' ? http : https;
  const headers: Record<string, string> = { 'User-Agent': `webhook/${VERSION}`, ...o.headers };
  if (o.body !== undefined) headers['Content-Length'] = String(Buffer.byteLength(o.body));
  const secure = client === https && o.agent === undefined ? clientTlsOptions(url.hostname, o.trust) : {};
  return new Promise((resolve, reject) => {
    let settled = false;
    const settle = (finish: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      finish();
    };
    const fail = (e: Error & { code?: string }) =>
      settle(() =>
        reject(
          e instanceof OutboundError ? e : new OutboundError(e.message || e.code || 'connection failed', e.code ?? ''),
        ),
      );
    const end = (e: OutboundError) => {
      fail(e);
      req.destroy(e);
    };
    const req = client.request(url, { method: o.method, headers, agent: o.agent, ...secure });
    const timer = setTimeout(
      () => end(new OutboundError(`no complete answer within ${formatGoDuration(o.deadlineMs)}`, 'ETIMEDOUT')),
      o.deadlineMs,
    );
    req.on('error', fail);
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      const done = () =>
        settle(() => {
          const bytes = Buffer.concat(chunks);
          // A keep-alive TLS socket keeps the request it was opened for (and so this closure) for its
          // whole life (node:https's session listener): the answer's pieces are let go here.
          chunks.length = 0;
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: bytes.toString('utf8'), bytes });
        });
      res.on('data', (chunk: Buffer) => {
        if (size + chunk.length <= o.maxResponseBytes) {
          size += chunk.length;
          chunks.push(chunk);
        } else if (o.overLimit === 'cut') {
          chunks.push(chunk.subarray(0, o.maxResponseBytes - size));
          done();
          req.destroy();
        } else {
          end(new OutboundError(`answer larger than ${o.maxResponseBytes} bytes`, 'E2BIG'));
        }
      });
      res.on('end', done);
      res.on('error', fail);
    });
    req.end(o.body);
  });
}

// ---- secrets ----------------------------------------------------------------------------------

// An encoded form shorter than this (a base64 stem of a short secret) is too likely to occur in
// ordinary text to be taken out of it; the secret itself is always taken out, whatever its length.
const MIN_SCRUBBED_FORM_LENGTH = 6;

/** HTML escapes in both spellings a secret may meet: this program's pages and Go's `html`. */
const HTML_ESCAPES: Record<string, string>[] = [
  { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' },
  { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&#34;', "'": '&#39;' },
];

/**
 * base64 of a secret wherever it sits in a longer encoded text: each 3-byte alignment gives a
 * different text, and only the characters wholly made of the secret's bits are certain. The whole
 * encoding (padded, and URL-safe) is kept too, so a lone encoded secret goes entirely.
 */
function base64Forms(secret: string): string[] {
  const bytes = Buffer.from(secret, 'utf8');
  const forms = [bytes.toString('base64'), bytes.toString('base64url')];
  for (let offset = 0; offset < 3; offset++) {
    const text = Buffer.concat([Buffer.alloc(offset), bytes])
      .toString('base64')
      .replace(/=+$/, '');
    const total = offset + bytes.length;
    const stem = text.slice(offset === 0 ? 0 : offset + 1, total % 3 === 0 ? undefined : -1);
    forms.push(stem, stem.replace(/\+/g, '-').replace(/\//g, '_'));
  }
  return forms;
}

/** The forms a secret may take in text: as it is, URL-, JSON-/JavaScript-, HTML- and base64-encoded. */
function encodedForms(secret: string): string[] {
  const encoded = [
    encodeURIComponent(secret),
    goQueryEscape(secret),
    JSON.stringify(secret).slice(1, -1),
    goJsEscape(secret),
    ...HTML_ESCAPES.map((table) => secret.replace(/[&<>"']/g, (c) => table[c])),
    ...base64Forms(secret),
  ].filter((form) => form.length >= MIN_SCRUBBED_FORM_LENGTH);
  return [...new Set([secret, ...encoded])];
}

/**
 * Takes a set of secrets out of text: each one and each of its encoded forms becomes `replacement`.
 * Longer forms are tried first, so a form that holds another is taken out whole.
 */
export class Scrubber {
  private readonly pattern: RegExp | undefined;
  private readonly replacement: string;

  constructor(secrets: Iterable<string>, replacement = 'REDACTED') {
    const forms = [...new Set([...secrets].filter((s) => s !== '').flatMap(encodedForms))];
    forms.sort((a, b) => b.length - a.length);
    const literal = (s: string) => s.replace(/[.*+?^${}()|[\]\\/-]/g, '\\$&');
    this.pattern = forms.length > 0 ? new RegExp(forms.map(literal).join('|'), 'g') : undefined;
    this.replacement = replacement;
  }

  scrub(text: string): string {
    return this.pattern === undefined ? text : text.replace(this.pattern, () => this.replacement);
  }
}

// ================================================================================================
// 8. smtp client — a small hand-written SMTP client: messages composed by RFC 5322, MIME and RFC 2047
//    (composeMessage), sent over implicit TLS or STARTTLS with AUTH PLAIN, LOGIN or CRAM-MD5, every step under a
//    deadline (sendMail, withDeadline), tried again after transient failures (sendWithRetry, by the retry policy of
//    the outbound-calls chapter). The password lives in a Secret and every reply or error text leaving this chapter is
//    scrubbed of it (Scrubber: also its base64 in AUTH payloads).
//    Exports: composeMessage, DEFAULT_SMTP_PORT, IMPLICIT_TLS_PORT, isAddress, isHostName, isPemCertificates,
//    MailConfig, newMessageId, Secret, sendWithRetry, SmtpTimeouts.
//    Tests: test/mail.test.ts.
// ================================================================================================

/** A value that must never be printed: it shows as "[redacted]" in logs, JSON and inspection. */
export class Secret {
  #value: string;
  constructor(value: string) {
    this.#value = value;
  }
  reveal(): string {
    return this.#value;
  }
  toString(): string {
    return '[redacted]';
  }
  toJSON(): string {
    return '[redacted]';
  }
  [Symbol.for('nodejs.util.inspect.custom')](): string {
    return '[redacted]';
  }
}

export interface MailConfig {
  readonly host: string;
  readonly port: number;
  /**
   * implicit-tls: TLS from the first byte. starttls: STARTTLS, required whenever offered. auto: the
   * server's first move decides (a greeting in clear: STARTTLS; silence: implicit TLS).
   */
  readonly security: 'implicit-tls' | 'starttls' | 'auto';
  /** Envelope sender and From header. */
  readonly from: string;
  /** AUTH user name: MAIL_SMTP_USER, or the sender address. */
  readonly user: string;
  /** No password: no AUTH. */
  readonly password: Secret | undefined;
  /** Extra trusted CA certificates (PEM), added to Node's default ones. */
  readonly ca: string | undefined;
  readonly verifyCertificate: boolean;
  /** Send credentials over a connection that has no TLS, when the server offers no STARTTLS. */
  readonly allowPlaintextAuth: boolean;
}

/** The old image spoke implicit TLS only (curl, smtps://), so an unset port keeps to its 465. */
const DEFAULT_SMTP_PORT = 465;
const IMPLICIT_TLS_PORT = 465;

const PEM_CERTIFICATE = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

function isPemCertificates(text: string): boolean {
  const blocks = text.match(PEM_CERTIFICATE) ?? [];
  if (blocks.length === 0) return false;
  try {
    for (const block of blocks) new X509Certificate(block);
    return true;
  } catch {
    return false;
  }
}

const HOST_LABEL = '[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?';
const HOST_NAME = new RegExp(`^${HOST_LABEL}(?:\\.${HOST_LABEL})*\\.?$`);
const ATOM = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+";
// The dot-atom form of RFC 5322's addr-spec; quoted local parts and address literals are not
// accepted, and neither is non-ASCII (that would need SMTPUTF8).
const ADDRESS = new RegExp(`^${ATOM}(?:\\.${ATOM})*@${HOST_LABEL}(?:\\.${HOST_LABEL})*$`);

function isHostName(text: string): boolean {
  return text.length <= 253 && HOST_NAME.test(text);
}

function isAddress(text: string): boolean {
  const at = text.lastIndexOf('@');
  return text.length <= 254 && at <= 64 && ADDRESS.test(text);
}

// ---- message composition ----

interface MailMessage {
  from: string;
  to: readonly string[];
  subject: string;
  /** Plain text; any line-break convention. */
  body: string;
  date: Date;
  /** With or without the angle brackets. */
  messageId: string;
}

// RFC 5322 asks for lines of at most 78 characters (998 is the hard limit); RFC 2047 limits a line
// holding encoded-words to 76 and one encoded-word to 75.
const HEADER_LINE_SOFT_LIMIT = 78;
const LINE_HARD_LIMIT = 998;
const ENCODED_WORD_LINE_LIMIT = 76;
const BASE64_LINE_LENGTH = 76;

const DAYS = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'];

/** RFC 5322 date-time in UTC, e.g. "Sun, 22 Nov 2026 04:12:00 +0000". */
export function formatRfc5322Date(date: Date): string {
  const two = (n: number) => String(n).padStart(2, '0');
  return (
    `${DAYS[date.getUTCDay()]}, ${two(date.getUTCDate())} ${MONTHS[date.getUTCMonth()]} ${date.getUTCFullYear()} ` +
    `${two(date.getUTCHours())}:${two(date.getUTCMinutes())}:${two(date.getUTCSeconds())} +0000`
  );
}

/** A fresh Message-ID in the sender's domain (random, so not pure; kept beside its only use). */
export function newMessageId(from: string): string {
  return `<${randomUUID()}@${from.slice(from.lastIndexOf('@') + 1)}>`;
}

/**
 * The whole message, CRLF line endings. The body goes base64-encoded: it survives any content
 * (NUL bytes, lines of any length, lines starting with "." or "From ") and every line stays 76
 * characters. Addresses are written as given (their case is kept).
 */
export function composeMessage(message: MailMessage): string {
  for (const address of [message.from, ...message.to]) {
    if (!isAddress(address)) throw new Error(`composeMessage: ${JSON.stringify(address)} is not an e-mail address`);
  }
  const messageId = message.messageId.replace(/^<(.*)>$/, '$1');
  if (!/^[\x21-\x3b\x3d\x3f\x41-\x7e]+@[\x21-\x3b\x3d\x3f\x41-\x7e]+$/.test(messageId)) {
    throw new Error(`composeMessage: ${JSON.stringify(message.messageId)} is not a Message-ID`);
  }
  const headers = [
    `Date: ${formatRfc5322Date(message.date)}`,
    `From: ${message.from}`,
    foldHeader('To', message.to.join(', ')),
    encodeHeader('Subject', message.subject),
    `Message-ID: <${messageId}>`,
    'MIME-Version: 1.0',
    'Content-Type: text/plain; charset=utf-8',
    'Content-Transfer-Encoding: base64',
  ];
  const body = Buffer.from(message.body.replace(/\r\n|\r|\n/g, '\r\n'), 'utf8').toString('base64');
  const bodyLines = body.match(new RegExp(`.{1,${BASE64_LINE_LENGTH}}`, 'g')) ?? [];
  return [...headers, '', ...bodyLines].join('\r\n') + '\r\n';
}

/**
 * An unstructured header (Subject): as it is when it is printable ASCII that folds into legal lines,
 * otherwise wholly as RFC 2047 encoded-words. Whitespace runs (line breaks included) become one space
 * first: a header value has no line breaks of its own.
 */
function encodeHeader(name: string, value: string): string {
  const text = value.replace(/\s+/g, ' ').trim();
  if (/^[\x20-\x7e]*$/.test(text) && !text.includes('=?')) {
    const folded = foldHeader(name, text);
    if (folded.split('\r\n').every((line) => line.length <= LINE_HARD_LIMIT)) return folded;
  }
  return encodedWords(name, text);
}

/** Folds before spaces so that lines keep under 78 characters where the words allow it. */
function foldHeader(name: string, value: string): string {
  const lines: string[] = [];
  let line = `${name}:`;
  for (const word of value.split(' ')) {
    if (line.length + 1 + word.length > HEADER_LINE_SOFT_LIMIT && line.length > name.length + 1) {
      lines.push(line);
      line = '';
    }
    line += ` ${word}`;
  }
  lines.push(line);
  return lines.join('\r\n');
}

/**
 * "=?UTF-8?B?…?=" words, each on its own line: the first after the header name, the rest on folded
 * lines. Words are cut between characters (code points), never inside one's UTF-8 bytes, and every
 * line stays within RFC 2047's 76 characters. The folding white space between encoded-words is not
 * part of the decoded text, so the value reads back exactly.
 */
function encodedWords(name: string, text: string): string {
  const wordOverhead = '=?UTF-8?B??='.length;
  // Bytes of UTF-8 that fit in one word when the line already holds `used` characters.
  const capacity = (used: number) => Math.floor((ENCODED_WORD_LINE_LIMIT - used - wordOverhead) / 4) * 3;
  const lines: string[] = [];
  let prefix = `${name}: `;
  let chunk = '';
  const flush = () => {
    lines.push(`${prefix}=?UTF-8?B?${Buffer.from(chunk, 'utf8').toString('base64')}?=`);
    prefix = ' ';
    chunk = '';
  };
  for (const character of text) {
    if (chunk !== '' && Buffer.byteLength(chunk + character, 'utf8') > capacity(prefix.length)) flush();
    chunk += character;
  }
  if (chunk !== '' || lines.length === 0) flush();
  return lines.join('\r\n');
}

/**
 * The DATA payload before the terminating ".": every line break made CRLF (a bare LF or CR is never
 * sent, so no "SMTP smuggling" reading of it), a final CRLF, and a "." doubled at the start of every
 * line that has one (RFC 5321 4.5.2), so no line of the message can end the DATA early.
 */
export function dotStuff(message: string): string {
  const crlf = message.replace(/\r\n|\r|\n/g, '\r\n');
  const terminated = crlf.endsWith('\r\n') ? crlf : `${crlf}\r\n`;
  return terminated.replace(/^\./gm, '..');
}

// ---- the SMTP client ----

export interface SmtpTimeouts {
  /** TCP connect, plus the TLS handshake for implicit TLS (and, in auto mode, the wait that tells which). */
  connectMs: number;
  /** Each reply, and the STARTTLS handshake. */
  replyMs: number;
  /** The whole transaction, from connect to the reply after the message. */
  totalMs: number;
}

// A hook's mail is a few kilobytes: a healthy server answers each step in well under a second. The
// budgets leave room for a slow relay and greylisting delays, and bound how long a hung server keeps
// a mail (and a graceful shutdown that flushes mails) waiting.
const SMTP_TIMEOUTS: Readonly<SmtpTimeouts> = Object.freeze({
  connectMs: 10_000,
  replyMs: 30_000,
  totalMs: 120_000,
});
// The message is already accepted when QUIT goes out; a slow goodbye must not make it look failed.
const QUIT_TIMEOUT_MS = 2_000;
// Auto mode: an SMTP server greets the moment it accepts (within a round trip, well under a second
// even across continents, plus the name lookup some servers make first); an implicit-TLS server
// says nothing until the client's TLS hello. Silence this long therefore means TLS. Only that path
// pays the wait (a STARTTLS server ends it with its greeting), once per mail and in the background,
// so headroom is cheap, while a server greeting later than this would be mistaken for a TLS one.
const TLS_DETECTION_SILENCE_MS = 2_000;
// An SMTP reply line is at most 512 octets (RFC 5321 4.5.3.1.5); an EHLO reply has a few dozen. A
// server sending more than this without completing a reply is not speaking SMTP.
const MAX_REPLY_CHARS = 64 * 1024;

interface SendOptions {
  to: readonly string[];
  timeouts?: Partial<SmtpTimeouts>;
  /** EHLO name; by default the host name when it is a valid one, else the local address literal. */
  heloName?: string;
}

/** `security` says how the connection was protected, for the log: see securityReport. */
export type SendResult =
  | { ok: true; reply: string; security: string }
  | { ok: false; transient: boolean; reply: string; stage: string; security?: string };

/** Why a transaction stopped, with the server's reply or the local reason. */
class SmtpFailure extends Error {
  transient: boolean;
  stage: string;
  constructor(stage: string, transient: boolean, reply: string) {
    super(reply);
    this.stage = stage;
    this.transient = transient;
  }
}

interface SmtpReply {
  code: number;
  lines: string[];
}

function formatReply(reply: SmtpReply): string {
  return `${reply.code} ${reply.lines.join(' ')}`.trim();
}

/**
 * The reply, when its code is one of `codes`. Otherwise the transaction stops there: a 4xx means the
 * server asks to try later; a 5xx, or any code out of place, means trying again will not help.
 */
function expectReply(stage: string, reply: SmtpReply, ...codes: number[]): SmtpReply {
  if (!codes.includes(reply.code))
    throw new SmtpFailure(stage, reply.code >= 400 && reply.code < 500, formatReply(reply));
  return reply;
}

/**
 * One complete reply at the start of `received` (lines "250-…" continue, "250 …" ends), or undefined
 * while it is incomplete. Throws on text that is not an SMTP reply.
 */
function takeReply(received: string): { reply: SmtpReply; rest: string } | undefined {
  const lines: string[] = [];
  let start = 0;
  for (let end = received.indexOf('\n'); end !== -1; end = received.indexOf('\n', start)) {
    const line = received.slice(start, end).replace(/\r$/, '');
    start = end + 1;
    const match = /^([2-5]\d\d)(?:([ -])(.*))?$/.exec(line);
    if (!match) throw new Error(`not an SMTP reply: ${JSON.stringify(line.slice(0, 80))}`);
    lines.push(match[3] ?? '');
    if (match[2] !== '-') return { reply: { code: Number(match[1]), lines }, rest: received.slice(start) };
  }
  if (received.length > MAX_REPLY_CHARS) throw new Error(`reply longer than ${MAX_REPLY_CHARS} characters`);
  return undefined;
}

/**
 * The conversation over one socket (swapped for its TLS wrapper after STARTTLS): write a line, read
 * the next reply within the step's deadline. One command is outstanding at a time (no pipelining).
 */
class SmtpSession {
  socket: net.Socket;
  /** How the conversation is protected: as connectSmtp left it, then "STARTTLS" once that succeeds. */
  security: 'implicit TLS' | 'STARTTLS' | 'no TLS';
  #received = '';
  #decoder = new StringDecoder('utf8');
  #failure: Error | undefined;
  #changed: (() => void) | undefined;
  #deadlineAt: number;
  #timeouts: SmtpTimeouts;
  #onData = (chunk: Buffer) => {
    this.#received += this.#decoder.write(chunk);
    this.#changed?.();
  };
  #onError = (error: Error) => {
    this.#failure ??= error;
    this.#changed?.();
  };
  #onClose = () => this.#onError(new Error('connection closed by the server'));

  constructor(socket: net.Socket, deadlineAt: number, timeouts: SmtpTimeouts) {
    this.socket = socket;
    this.security = socket instanceof tls.TLSSocket ? 'implicit TLS' : 'no TLS';
    this.#deadlineAt = deadlineAt;
    this.#timeouts = timeouts;
    this.#listen(socket);
  }

  #listen(socket: net.Socket): void {
    socket.on('data', this.#onData).on('error', this.#onError).on('close', this.#onClose);
  }

  /** The time a step may take: its own limit, cut short by what is left of the transaction. */
  stepMs(limitMs: number): number {
    return Math.max(0, Math.min(limitMs, this.#deadlineAt - Date.now()));
  }

  async read(stage: string, limitMs = this.#timeouts.replyMs): Promise<SmtpReply> {
    const waitMs = this.stepMs(limitMs);
    try {
      return await withDeadline(
        new Promise<SmtpReply>((resolve, reject) => {
          const attempt = () => {
            try {
              const taken = takeReply(this.#received);
              if (taken) {
                this.#received = taken.rest;
                resolve(taken.reply);
              } else if (this.#failure) {
                reject(this.#failure);
              } else {
                return;
              }
            } catch (error) {
              // Not SMTP (an HTTP or TLS server on that port, say): a setup problem, not a passing one.
              reject(new SmtpFailure(stage, false, (error as Error).message));
            }
            this.#changed = undefined;
          };
          this.#changed = attempt;
          attempt();
        }),
        waitMs,
        () => new SmtpFailure(stage, true, `no reply within ${waitMs} ms`),
      );
    } finally {
      this.#changed = undefined;
    }
  }

  async command(stage: string, line: string, limitMs?: number): Promise<SmtpReply> {
    this.socket.write(`${line}\r\n`);
    return this.read(stage, limitMs);
  }

  /** Sends `line`; the reply if its code is one of `codes`, else the failure that reply means. */
  async step(stage: string, line: string, ...codes: number[]): Promise<SmtpReply> {
    return expectReply(stage, await this.command(stage, line), ...codes);
  }

  /** Replaces the plain socket by a TLS one over it, after the server's "220" to STARTTLS. */
  async startTls(config: MailConfig): Promise<void> {
    // Anything the server sent after its 220 would be read as if it came over TLS: an injection
    // (CVE-2011-0411 and kin), so it is refused rather than carried over.
    if (this.#received !== '') throw new SmtpFailure('starttls', false, 'server sent data after its STARTTLS reply');
    const plain = this.socket;
    plain
      .removeListener('data', this.#onData)
      .removeListener('error', this.#onError)
      .removeListener('close', this.#onClose);
    this.socket = await startTlsOn(plain, config, 'starttls', this.stepMs(this.#timeouts.replyMs));
    this.#listen(this.socket);
    this.#decoder = new StringDecoder('utf8');
    this.security = 'STARTTLS';
  }

  close(): void {
    this.socket.destroy();
  }
}

function smtpTlsOptions(config: MailConfig): tls.ConnectionOptions {
  const trust = { extraCa: config.ca, verify: config.verifyCertificate };
  const options = clientTlsOptions(config.host, trust);
  return Object.assign(options, { host: config.host });
}

/**
 * TLS over a connected socket (implicit TLS, detected implicit TLS, STARTTLS), verified as
 * smtpTlsOptions says; the TLS socket once its handshake is done, else destroyed.
 */
async function startTlsOn(plain: net.Socket, config: MailConfig, stage: string, waitMs: number): Promise<net.Socket> {
  // Errors now surface on the TLS socket; this keeps a late one on the plain socket from being
  // an unhandled 'error' event.
  plain.on('error', () => {});
  const secure = tls.connect({ ...smtpTlsOptions(config), socket: plain });
  try {
    await handshake(secure, stage, waitMs);
    return secure;
  } catch (error) {
    secure.destroy();
    throw error;
  }
}

/** Resolves once `socket` has finished its TLS handshake; a rejected certificate is not transient. */
function handshake(socket: tls.TLSSocket, stage: string, waitMs: number): Promise<void> {
  return withDeadline(
    new Promise<void>((resolve, reject) => {
      socket.once('secureConnect', resolve);
      socket.once('error', (error) => {
        // Node records why verification failed before it destroys the socket; that is a setup
        // problem (wrong CA, wrong name), not a network one.
        if (socket.authorizationError) {
          reject(
            new SmtpFailure(
              stage,
              false,
              `server certificate not trusted: ${error.message} (${socket.authorizationError})`,
            ),
          );
        } else {
          reject(error);
        }
      });
    }),
    waitMs,
    () => new SmtpFailure(stage, true, `TLS handshake not finished within ${waitMs} ms`),
  );
}

/**
 * A connection ready for the server's greeting: plain, or with TLS already started when
 * MAIL_TLS_MODE (or port 465) says implicit TLS or, in auto mode, the server waits for the client.
 */
async function connectSmtp(config: MailConfig, waitMs: number): Promise<net.Socket> {
  const deadlineAt = Date.now() + waitMs;
  const socket = net.connect({ host: config.host, port: config.port });
  try {
    await withDeadline(
      new Promise<void>((resolve, reject) => socket.once('connect', resolve).once('error', reject)),
      waitMs,
      () => new SmtpFailure('connect', true, `no connection within ${waitMs} ms`),
    );
    if (config.security === 'starttls') return socket;
    const leftMs = () => Math.max(0, deadlineAt - Date.now());
    if (config.security === 'implicit-tls') return await startTlsOn(socket, config, 'connect', leftMs());
    return await startTlsUnlessGreeted(socket, config, deadlineAt);
  } catch (error) {
    socket.destroy();
    throw error;
  }
}

/**
 * Auto mode: anything the server sends first means plain SMTP (left unread: the greeting step reads
 * it, and refuses what is not SMTP); silence for TLS_DETECTION_SILENCE_MS means implicit TLS, started
 * on the same connection. A failure then says that TLS was a guess, and how to force STARTTLS.
 */
async function startTlsUnlessGreeted(socket: net.Socket, config: MailConfig, deadlineAt: number): Promise<net.Socket> {
  const silenceMs = Math.max(0, Math.min(TLS_DETECTION_SILENCE_MS, deadlineAt - Date.now()));
  if (!(await staysSilent(socket, silenceMs))) return socket;
  const guess = `no SMTP greeting within ${silenceMs} ms, so implicit TLS was tried`;
  // A wait shorter than the constant was cut by the deadline: nothing is left for a handshake.
  if (silenceMs < TLS_DETECTION_SILENCE_MS) {
    throw new SmtpFailure('connect', true, `${guess}: no time left for its handshake`);
  }
  try {
    return await startTlsOn(socket, config, 'connect', Math.max(0, deadlineAt - Date.now()));
  } catch (error) {
    if (error instanceof SmtpFailure) throw new SmtpFailure(error.stage, error.transient, `${guess}: ${error.message}`);
    // Not TLS and not a timeout: typically a server whose greeting came after the wait and met our TLS hello.
    const why = (error instanceof Error ? error.message : String(error)).trim();
    const hint = 'a server that greets this late needs MAIL_TLS_MODE=starttls';
    throw new SmtpFailure('connect', true, `${guess}: ${why} (${hint})`);
  }
}

/**
 * true when nothing arrives within `waitMs`; false as soon as something does, which stays in the
 * socket's buffer ('readable', unlike 'data', consumes nothing) for the session to read.
 */
function staysSilent(socket: net.Socket, waitMs: number): Promise<boolean> {
  return new Promise<boolean>((resolve, reject) => {
    const settle = (finish: () => void) => {
      clearTimeout(timer);
      socket.off('readable', onReadable).off('error', onError);
      finish();
    };
    // 'readable' with nothing buffered is the end of the stream: the server hung up without a word.
    const closed = () => new SmtpFailure('greeting', true, 'connection closed by the server before its greeting');
    const onReadable = () => settle(() => (socket.readableLength > 0 ? resolve(false) : reject(closed())));
    const onError = (error: Error) => settle(() => reject(error));
    const timer = setTimeout(() => settle(() => resolve(true)), waitMs);
    socket.on('readable', onReadable).on('error', onError);
  });
}

/** EHLO keywords (upper case) → their parameters; "AUTH=LOGIN" (pre-standard servers) counts as AUTH. */
function parseCapabilities(reply: SmtpReply): Map<string, string[]> {
  const capabilities = new Map<string, string[]>();
  for (const line of reply.lines.slice(1)) {
    const [keyword = '', ...params] = line.trim().toUpperCase().split(/\s+/);
    const [name, inline] = keyword.startsWith('AUTH=') ? ['AUTH', [keyword.slice(5)]] : [keyword, []];
    capabilities.set(name, [...(capabilities.get(name) ?? []), ...inline, ...params]);
  }
  return capabilities;
}

function defaultHeloName(socket: net.Socket): string {
  const name = hostname();
  if (isHostName(name) && name.includes('.')) return name;
  const address = socket.localAddress ?? '127.0.0.1';
  return net.isIPv6(address) ? `[IPv6:${address}]` : `[${address}]`;
}

const toBase64 = (text: string) => Buffer.from(text, 'utf8').toString('base64');

/**
 * AUTH with the first mechanism both sides know. Over TLS PLAIN is preferred (one round trip);
 * without TLS (only when the operator allowed it) CRAM-MD5 first, as it does not reveal the password.
 */
async function authenticate(
  session: SmtpSession,
  config: MailConfig,
  password: string,
  offered: string[],
  secure: boolean,
): Promise<void> {
  const preference = secure ? ['PLAIN', 'LOGIN', 'CRAM-MD5'] : ['CRAM-MD5', 'PLAIN', 'LOGIN'];
  const mechanism = preference.find((name) => offered.includes(name));
  if (mechanism === undefined) {
    const list = offered.length > 0 ? offered.join(' ') : 'none';
    throw new SmtpFailure('auth', false, `no supported AUTH mechanism offered (server offers: ${list})`);
  }
  if (mechanism === 'PLAIN') {
    await session.step('auth', `AUTH PLAIN ${toBase64(`\0${config.user}\0${password}`)}`, 235);
  } else if (mechanism === 'LOGIN') {
    await session.step('auth', 'AUTH LOGIN', 334);
    await session.step('auth', toBase64(config.user), 334);
    await session.step('auth', toBase64(password), 235);
  } else {
    const challenge = Buffer.from((await session.step('auth', 'AUTH CRAM-MD5', 334)).lines[0] ?? '', 'base64');
    const digest = createHmac('md5', password).update(challenge).digest('hex');
    await session.step('auth', toBase64(`${config.user} ${digest}`), 235);
  }
}

/** Removes the password (in any encoding: AUTH payloads carry it in base64) from text about to leave this chapter. */
function redact(text: string, config: MailConfig): string {
  const password = config.password?.reveal();
  if (!password) return text;
  return new Scrubber([`\0${config.user}\0${password}`, password], '[redacted]').scrub(text);
}

/**
 * One SMTP transaction delivering `message` (as composeMessage made it) to `to`. Never throws: the
 * result says whether the server accepted the mail, and otherwise at which stage it stopped, with
 * the server's reply (or the local reason) and whether trying again later could help. Any recipient
 * refused stops the transaction before DATA, so a retry never mails anyone twice.
 */
export async function sendMail(config: MailConfig, message: string, options: SendOptions): Promise<SendResult> {
  const timeouts = { ...SMTP_TIMEOUTS, ...options.timeouts };
  const deadlineAt = Date.now() + timeouts.totalMs;
  // The step under way, for the result and for a failure's message.
  const at = { stage: 'envelope' };
  let session: SmtpSession | undefined;
  try {
    const bad = [config.from, ...options.to].find((address) => !isAddress(address));
    if (bad !== undefined) throw new SmtpFailure(at.stage, false, `not an e-mail address: ${JSON.stringify(bad)}`);
    if (options.to.length === 0) throw new SmtpFailure(at.stage, false, 'no recipient');
    at.stage = 'connect';
    const socket = await connectSmtp(config, Math.min(timeouts.connectMs, timeouts.totalMs));
    session = new SmtpSession(socket, deadlineAt, timeouts);
    await openSession(session, config, options.heloName ?? defaultHeloName(session.socket), at);
    at.stage = 'mail';
    await session.step(at.stage, `MAIL FROM:<${config.from}>`, 250);
    at.stage = 'rcpt';
    for (const recipient of options.to) await session.step(at.stage, `RCPT TO:<${recipient}>`, 250, 251);
    at.stage = 'data';
    await session.step(at.stage, 'DATA', 354);
    at.stage = 'message';
    const accepted = await session.step(at.stage, `${dotStuff(message)}.`, 250);
    await session.command('quit', 'QUIT', QUIT_TIMEOUT_MS).catch(() => undefined);
    return { ok: true, reply: redact(formatReply(accepted), config), security: securityReport(session, config) };
  } catch (error) {
    return failedResult(error, at.stage, config, session);
  } finally {
    session?.close();
  }
}

/** Greeting, EHLO, STARTTLS whenever offered (then EHLO again), and AUTH when there is a password. */
async function openSession(
  session: SmtpSession,
  config: MailConfig,
  heloName: string,
  at: { stage: string },
): Promise<void> {
  at.stage = 'greeting';
  expectReply(at.stage, await session.read(at.stage), 220);
  at.stage = 'ehlo';
  let capabilities = parseCapabilities(await session.step(at.stage, `EHLO ${heloName}`, 250));
  let secure = session.security === 'implicit TLS';
  if (!secure && capabilities.has('STARTTLS')) {
    at.stage = 'starttls';
    await session.step(at.stage, 'STARTTLS', 220);
    await session.startTls(config);
    secure = true;
    at.stage = 'ehlo';
    capabilities = parseCapabilities(await session.step(at.stage, `EHLO ${heloName}`, 250));
  }
  const password = config.password?.reveal();
  if (!password) return;
  at.stage = 'auth';
  if (!secure && !config.allowPlaintextAuth) {
    const why =
      'server offers no STARTTLS; refusing to send the password in clear text (MAIL_ALLOW_PLAINTEXT_AUTH=true ' +
      'allows it)';
    throw new SmtpFailure(at.stage, false, why);
  }
  await authenticate(session, config, password, capabilities.get('AUTH') ?? [], secure);
}

/** A transaction that stopped at `stage`: an error other than an SmtpFailure counts as transient. */
function failedResult(error: unknown, stage: string, config: MailConfig, session: SmtpSession | undefined): SendResult {
  const why = error instanceof Error ? error.message : String(error);
  const failure = error instanceof SmtpFailure ? error : new SmtpFailure(stage, true, why);
  const security = session ? { security: securityReport(session, config) } : {};
  const reply = redact(failure.message, config);
  return { ok: false, transient: failure.transient, reply, stage: failure.stage, ...security };
}

/** The mode a session used, for the log: "implicit TLS", "STARTTLS" or "no TLS", "(detected)" in auto mode. */
function securityReport(session: SmtpSession, config: MailConfig): string {
  return `${session.security}${config.security === 'auto' ? ' (detected)' : ''}`;
}

/**
 * sendMail, tried again after transient failures (4xx, connection trouble, deadlines), at most
 * `attempts` times in all, waiting `backoffMs`, then twice that, and so on, between tries.
 */
export async function sendWithRetry(
  config: MailConfig,
  message: string,
  options: SendOptions,
  attempts: number,
  backoffMs: number,
): Promise<SendResult & { attempts: number }> {
  // No time budget of its own: each transaction is bounded by its deadlines, and the attempts by `attempts`.
  const policy = { budgetMs: Infinity, attempts, backoff: { initialMs: backoffMs, maxMs: Infinity } };
  const sent = await retrying<SendResult, SendResult>(policy, async () => {
    const result = await sendMail(config, message, options);
    return result.ok
      ? { ok: true, value: result }
      : { ok: false, failure: { transient: result.transient }, error: result };
  });
  return { ...(sent.ok ? sent.value : sent.error), attempts: sent.attempts };
}

// ================================================================================================
// 9. kubernetes client — a small client for the Kubernetes REST API over node:https. Credentials (KubeCredentials) come
//    from a kubeconfig's context or, inside a pod, from the service account (the kubeconfig chapter: a token, a token
//    file re-read on every request so rotated tokens keep working, a client certificate, or a credential plugin asked
//    before each request and renewed once after a 401). A server URL's path (Rancher's cluster proxy)
//    is kept on every request; a proxy-url's connections tunnel with CONNECT. Every request is one outboundRequest
//    under a total deadline; transient failures are retried by the policy of the outbound-calls chapter (retrying)
//    inside a bounded total time, and every call of one client waits its turn in one token bucket (client-go's QPS and
//    burst). Failures become KubeErrors that name the verb and the resource, and for 403 the permission missing. The
//    token is only ever put in the Authorization header. Watches are shared (KubeClient.watch): one WATCH per
//    collection or object and selector, resumed from the last resourceVersion, re-listed (in pages) on 410, closed
//    when unused, its objects trimmed and indexed (client-go's informers' transform and indexers).
//    Exports: CredentialPlugin, describeResource, JsonPatchOperation, KubeClient, KubeConfigError, KubeCredentials,
//    KubeError, PluginCredential, ResourceRef, WatchScope.
//    Tests: test/burst.test.ts, test/kubeconfig.test.ts, test/rollback.test.ts, test/upgrade.test.ts,
//    test/watch.test.ts.
// ================================================================================================

export const KUBE_LIMITS = {
  // A GET or PATCH answers in milliseconds; a loaded control plane takes seconds. Past 10 s the
  // connection is taken as hung and the request is tried again.
  requestTimeoutMs: 10_000,
  // An API server restart or leader failover, or a burst of throttling, clears within seconds.
  // Retrying for up to 20 s rides that out while the push's HTTP answer still comes back within
  // about half a minute (the worst case is this budget plus one request deadline).
  retryBudgetMs: 20_000,
  // Answers we read are one object or a bounded list; anything larger is not an answer we asked for.
  maxResponseBytes: 32 * 1024 * 1024,
  // The client's own bound on its request rate (client-go's QPS and burst), shared by every call
  // of one client: reads, patches, Events and rollout polls of all pushes. client-go's defaults
  // (5/s, burst 10) suit a controller's steady trickle; a monorepo release pushes hundreds of
  // images at once, each costing a read, a patch and an Event before its answer. 50/s with a
  // burst of 100 are kube-scheduler's own defaults, the busiest ordinary client of a cluster: a
  // replica never asks more of the API server than the scheduler does, and 200 pushes land in
  // about ten seconds, well inside each call's retry budget (a call waits at most for the calls
  // queued before it, one per push or rollout in progress: 256 + 256 at 50/s is about 10 s).
  requestsPerSecond: 50,
  requestBurst: 100,
  // Connections open at once for calls (watches have their own): each TLS connection holds some 100 KB, and a
  // release's calls at a loaded API server opened about 150 for 600 pushes. At 50/s, 32 in flight is 0.6 s a call.
  maxConnections: 32,
};

export interface KubeCredentials {
  /** https://host:port, possibly with a path prefix (Rancher's cluster proxy URLs have one). */
  server: string;
  ca?: Buffer;
  cert?: Buffer;
  key?: Buffer;
  tlsServerName?: string;
  insecureSkipTlsVerify?: boolean;
  token?: string;
  /** Read again before every request: service-account tokens are rotated. */
  tokenFile?: string;
  /** Where the credentials came from, for messages (never the token itself). */
  source: string;
  /** The namespace of the context or of the pod, when known. */
  namespace?: string;
  /** A credential plugin (kubeconfig `exec`): asked before each request, instead of token and tokenFile. */
  plugin?: CredentialPlugin;
  /** An HTTP or HTTPS proxy the connections tunnel through (HTTP CONNECT). */
  proxyUrl?: URL;
  /** What the caller should warn about (certificate checks turned off). */
  warnings?: string[];
}

/** A credential a plugin gave: a bearer token, or a client certificate and key. */
export interface PluginCredential {
  token?: string;
  cert?: Buffer;
  key?: Buffer;
}

/**
 * Where a client gets a credential it may not keep forever (the kubeconfig chapter's exec plugins):
 * `credential` gives the current one (running the plugin when there is none still valid), `rejected`
 * tells that the API server answered 401 to it, so the next call renews it.
 */
export interface CredentialPlugin {
  credential(): Promise<PluginCredential>;
  rejected(c: PluginCredential): void;
}

export class KubeConfigError extends Error {}

/** A failed API call. status is 0 when no HTTP answer came (connection or deadline failure). */
export class KubeError extends Error {
  readonly status: number;
  readonly reason: string;
  /** Field causes of a 422; empty when the server gave none (a failed JSON-patch test). */
  readonly causes: string[];
  constructor(message: string, status: number, reason: string, causes: string[] = []) {
    super(message);
    this.status = status;
    this.reason = reason;
    this.causes = causes;
  }
}

/** A namespaced resource, or a collection of them when name is undefined. */
export interface ResourceRef {
  /** API group, '' for the core API. */
  group: string;
  version: string;
  /** Plural, lower-case: deployments, pods, events. */
  resource: string;
  /** '' for a cluster-scoped resource (a SelfSubjectAccessReview). */
  namespace: string;
  name?: string;
}

type KubeVerb = 'get' | 'list' | 'watch' | 'patch' | 'create' | 'delete';

/** `deployments.apps "web" in namespace "prod"`: how kubectl and RBAC name a resource. */
export function describeResource(r: ResourceRef): string {
  const kind = r.group ? `${r.resource}.${r.group}` : r.resource;
  const where = r.namespace === '' ? '' : ` in namespace ${JSON.stringify(r.namespace)}`;
  return `${kind}${r.name === undefined ? '' : ` ${JSON.stringify(r.name)}`}${where}`;
}

function resourcePath(r: ResourceRef): string {
  const base = r.group === '' ? `/api/${r.version}` : `/apis/${r.group}/${r.version}`;
  const name = r.name === undefined ? '' : `/${encodeURIComponent(r.name)}`;
  const namespace = r.namespace === '' ? '' : `/namespaces/${encodeURIComponent(r.namespace)}`;
  return `${base}${namespace}/${r.resource}${name}`;
}

interface KubeClientOptions {
  requestTimeoutMs?: number;
  retryBudgetMs?: number;
  /** The bound on the request rate; by default requestsPerSecond and requestBurst of KUBE_LIMITS. */
  rate?: TokenBucket;
  /** How long the API server keeps one watch open before it is resumed; by default WATCH_LIMITS.timeoutSeconds. */
  watchTimeoutSeconds?: number;
  /** Told each request sent (every try of a call, every WATCH): what the service counts in its metrics. */
  onRequest?: (verb: KubeVerb) => void;
}

export class KubeClient {
  readonly server: string;
  readonly source: string;
  readonly namespace: string | undefined;
  private readonly credentials: KubeCredentials;
  private agents: ReturnType<typeof kubeAgents>;
  /** The plugin's credential the current agents were made with (its client certificate), and the last one used. */
  private pluginCredential: PluginCredential | undefined;
  private readonly requestTimeoutMs: number;
  private readonly retryBudgetMs: number;
  private readonly rate: TokenBucket;
  private readonly onRequest: (verb: KubeVerb) => void;
  readonly watchTimeoutSeconds: number;
  /** This client's shared watches by scope (each cluster's client has its own), and those refused until when. */
  private readonly watches = new Map<string, SharedWatch>();
  private readonly refusedWatches = new Map<string, { until: number; error: KubeError }>();

  constructor(credentials: KubeCredentials, options: KubeClientOptions = {}) {
    this.credentials = credentials;
    this.server = credentials.server;
    this.source = credentials.source;
    this.namespace = credentials.namespace;
    this.requestTimeoutMs = options.requestTimeoutMs ?? KUBE_LIMITS.requestTimeoutMs;
    this.retryBudgetMs = options.retryBudgetMs ?? KUBE_LIMITS.retryBudgetMs;
    this.rate = options.rate ?? new TokenBucket(KUBE_LIMITS.requestsPerSecond, KUBE_LIMITS.requestBurst);
    this.watchTimeoutSeconds = options.watchTimeoutSeconds ?? WATCH_LIMITS.timeoutSeconds;
    this.onRequest = options.onRequest ?? (() => undefined);
    this.agents = kubeAgents(credentials, credentials.cert, credentials.key);
  }

  /** `background`: a read that can wait (a rollout poll) yields to the others under load (takeAbove). */
  get<T>(r: ResourceRef, o: { background?: boolean } = {}): Promise<T> {
    return this.call<T>('get', 'GET', r, o);
  }

  list<T>(r: ResourceRef, query: Record<string, string> = {}): Promise<T> {
    return this.call<T>('list', 'GET', { ...r, name: undefined }, { query });
  }

  /** A JSON patch (RFC 6902), recorded under fieldManager. */
  patch<T>(r: ResourceRef, operations: JsonPatchOperation[], fieldManager: string): Promise<T> {
    return this.call<T>('patch', 'PATCH', r, {
      query: { fieldManager },
      body: JSON.stringify(operations),
      contentType: 'application/json-patch+json',
    });
  }

  create<T>(r: ResourceRef, object: unknown): Promise<T> {
    const o = { body: JSON.stringify(object), contentType: 'application/json' };
    return this.call<T>('create', 'POST', { ...r, name: undefined }, o);
  }

  /** Deletes the object only while it is still the one with this uid (a precondition; else 409). */
  delete<T>(r: ResourceRef, uid: string): Promise<T> {
    const options = { kind: 'DeleteOptions', apiVersion: 'v1', preconditions: { uid } };
    return this.call<T>('delete', 'DELETE', r, { body: JSON.stringify(options), contentType: 'application/json' });
  }

  /**
   * A background request's turn: taken once half the burst is left for the others, or false after
   * half the retry budget, when it queues like any other (so it is delayed, never starved).
   */
  private async yieldToOthers(started: number): Promise<boolean> {
    for (;;) {
      const wait = this.rate.takeAbove(this.rate.burst / 2);
      if (wait === 0) return true;
      if (Date.now() - started + wait > this.retryBudgetMs / 2) return false;
      await sleep(wait);
    }
  }

  /** Closes the watches and idle keep-alive connections. */
  close(): void {
    for (const w of this.watches.values()) w.close();
    this.watches.clear();
    for (const agent of Object.values(this.agents)) agent.destroy();
  }

  /**
   * Subscribes to the changes of a collection (or of one object) from `resourceVersion` on (from a
   * list when undefined), through the one WATCH this client shares among every subscriber of the
   * same scope; the function returned unsubscribes, and the last to leave closes the watch. A
   * watch refused (403) is remembered for WATCH_LIMITS.refusedMemoryMs: `failed` is called at once.
   */
  watch(scope: WatchScope, resourceVersion: string | undefined, subscriber: WatchSubscriber): () => void {
    const key = watchKey(scope);
    const refused = this.refusedWatches.get(key);
    if (refused && refused.until > Date.now()) {
      queueMicrotask(() => subscriber.failed(refused.error));
      return () => undefined;
    }
    let shared = this.watches.get(key);
    if (!shared) {
      const created = new SharedWatch(this, scope, resourceVersion, (e) => {
        if (this.watches.get(key) === created) this.watches.delete(key);
        if (e.status !== 403) return;
        this.refusedWatches.set(key, { until: Date.now() + WATCH_LIMITS.refusedMemoryMs, error: e });
      });
      this.watches.set(key, (shared = created));
    }
    const w = shared;
    if (!w.coversFrom(resourceVersion)) queueMicrotask(() => subscriber.behind?.());
    if (w.listed) queueMicrotask(() => subscriber.synced?.());
    w.add(subscriber);
    return () => {
      if (w.remove(subscriber)) return;
      w.close();
      if (this.watches.get(key) === w) this.watches.delete(key);
    };
  }

  /** The objects the running watch of this scope has seen by name (what a subscriber joining late starts from). */
  watched(scope: WatchScope): ReadonlyMap<string, Record<string, unknown>> | undefined {
    return this.watches.get(watchKey(scope))?.objects;
  }

  /** The objects the running watch of this scope has seen under one index key (scope.indexBy), by name. */
  watchedBy(scope: WatchScope, key: string): ReadonlyMap<string, Record<string, unknown>> | undefined {
    const w = this.watches.get(watchKey(scope));
    return w && (w.indexed.get(key) ?? new Map());
  }

  /** When the running watch of this scope last heard from the API server (0: none, or not yet). */
  watchHeardAt(scope: WatchScope): number {
    return this.watches.get(watchKey(scope))?.heardAt ?? 0;
  }

  /** Whether the running watch of this scope has had its whole collection listed. */
  watchSynced(scope: WatchScope): boolean {
    return this.watches.get(watchKey(scope))?.listed === true;
  }

  /** The scopes watched now and the requests each has made (watches, resumptions, re-lists). */
  watchesOpen(): { scope: string; requests: number }[] {
    return [...this.watches].map(([scope, w]) => ({ scope, requests: w.requests }));
  }

  /** One WATCH request, its turn taken like any call's: the streaming answer, or a KubeError for an error answer. */
  async openWatch(
    r: ResourceRef,
    query: Record<string, string>,
    onRequest: (req: http.ClientRequest) => void,
  ): Promise<{ req: http.ClientRequest; res: http.IncomingMessage }> {
    const turn = this.rate.reserve(this.retryBudgetMs);
    if (turn === undefined) throw this.rateLimited('watch', r);
    if (turn > 0) await sleep(turn);
    const url = new URL(`${this.server}${resourcePath({ ...r, name: undefined })}?${new URLSearchParams(query)}`);
    const headers: Record<string, string> = { Accept: 'application/json', 'User-Agent': `webhook/${VERSION}` };
    const authorization = await this.authorization('watch', r);
    if (authorization !== undefined) headers.Authorization = authorization;
    this.onRequest('watch');
    return new Promise((resolve, reject) => {
      const req = https.request(url, { method: 'GET', headers, agent: this.agents.watches });
      onRequest(req);
      const timer = setTimeout(() => req.destroy(new Error('no answer')), this.requestTimeoutMs);
      req.on('error', (e: NodeJS.ErrnoException) => {
        clearTimeout(timer);
        const why = `the API server ${this.server} did not answer (${e.code ?? e.message})`;
        reject(new KubeError(`cannot watch ${describeResource(r)}: ${why}`, 0, e.code ?? 'ECONNRESET'));
      });
      req.on('response', (res) => {
        clearTimeout(timer);
        if (res.statusCode === 200) return resolve({ req, res });
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const answer = { status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() };
          reject(this.answerError('watch', r, answer));
        });
      });
      req.end();
    });
  }

  private async call<T>(
    verb: KubeVerb,
    method: string,
    r: ResourceRef,
    o: {
      query?: Record<string, string>;
      body?: string;
      contentType?: string;
      background?: boolean;
      renewed?: boolean;
    } = {},
  ): Promise<T> {
    const query = new URLSearchParams(o.query ?? {}).toString();
    const url = new URL(`${this.server}${resourcePath(r)}${query ? `?${query}` : ''}`);
    const started = Date.now();
    const called = await retrying<T, KubeError>({ budgetMs: this.retryBudgetMs }, async (attempt, previous) => {
      // Every attempt, retries included, waits for its turn; the wait counts against the budget.
      const yielded = o.background && attempt === 0 && (await this.yieldToOthers(started));
      // A free turn is always taken, even when the budget is spent (a single-try client's is 0).
      const turn = yielded ? 0 : this.rate.reserve(Math.max(0, this.retryBudgetMs - (Date.now() - started)));
      if (turn === undefined) {
        throw previous ? exhausted(previous, attempt, Date.now() - started) : this.rateLimited(verb, r);
      }
      if (turn > 0) await sleep(turn);
      return this.attempt<T>(verb, r, url, method, o);
    });
    if (called.ok) return called.value;
    const used = this.pluginCredential;
    // A plugin's credential the API server no longer takes (revoked, expired early): renewed once.
    if (called.error.status === 401 && used && this.credentials.plugin && !o.renewed) {
      this.credentials.plugin.rejected(used);
      return this.call<T>(verb, method, r, { ...o, renewed: true });
    }
    throw exhausted(called.error, called.attempts, called.elapsedMs);
  }

  /** One request: the parsed answer, or the failure (for the retry policy) and its KubeError. */
  private async attempt<T>(
    verb: KubeVerb,
    r: ResourceRef,
    url: URL,
    method: string,
    o: { body?: string; contentType?: string },
  ): Promise<Attempt<T, KubeError>> {
    const headers: Record<string, string> = { Accept: 'application/json' };
    const authorization = await this.authorization(verb, r);
    if (authorization !== undefined) headers.Authorization = authorization;
    if (o.body !== undefined) headers['Content-Type'] = o.contentType ?? 'application/json';
    let answer: OutboundAnswer;
    this.onRequest(verb);
    try {
      answer = await outboundRequest(url, {
        method,
        headers,
        body: o.body,
        deadlineMs: this.requestTimeoutMs,
        maxResponseBytes: KUBE_LIMITS.maxResponseBytes,
        agent: this.agents.calls,
      });
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code ?? '';
      // A proxy's refusal says more than its code: it is the proxy's answer, naming it (never its credentials).
      const cause = code && code !== 'EPROXY' ? code : (e as Error).message;
      const why = `the API server ${this.server} did not answer (${cause})`;
      return {
        ok: false,
        failure: { verb, code },
        error: new KubeError(`cannot ${verb} ${describeResource(r)}: ${why}`, 0, code),
      };
    }
    if (answer.status >= 200 && answer.status < 300) return { ok: true, value: this.parseAnswer<T>(verb, r, answer) };
    const failure = {
      verb,
      status: answer.status,
      retryAfterSeconds: retryAfterSeconds(answer.headers['retry-after']),
    };
    return { ok: false, failure, error: this.answerError(verb, r, answer) };
  }

  /** A call that found no turn within its budget: more calls are queued than the rate clears in time. */
  private rateLimited(verb: KubeVerb, r: ResourceRef): KubeError {
    const limit = `this client's own rate limit (${this.rate.perSecond} requests/s, burst ${this.rate.burst})`;
    const why = `${limit} has no turn for it within ${formatGoDuration(this.retryBudgetMs)}`;
    return new KubeError(`cannot ${verb} ${describeResource(r)}: ${why}`, 0, 'ClientRateLimited');
  }

  /** The Authorization header value, or undefined for client-certificate credentials. */
  private async authorization(verb: KubeVerb, r: ResourceRef): Promise<string | undefined> {
    if (this.credentials.plugin) return this.pluginAuthorization(verb, r, this.credentials.plugin);
    if (this.credentials.token !== undefined) return `Bearer ${this.credentials.token}`;
    if (this.credentials.tokenFile === undefined) return undefined;
    try {
      // Re-read every time: the kubelet rotates projected service-account tokens (hourly by default).
      return `Bearer ${(await fsp.readFile(this.credentials.tokenFile, 'utf8')).trim()}`;
    } catch (e) {
      throw new KubeError(
        `cannot ${verb} ${describeResource(r)}: cannot read the token file ${this.credentials.tokenFile} ` +
          `(${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`,
        0,
        'TokenUnreadable',
      );
    }
  }

  /**
   * The plugin's credential: its token as the header, or its client certificate in the agent (a new
   * agent when the certificate changes, so connections made with the old one are not reused).
   */
  private async pluginAuthorization(verb: KubeVerb, r: ResourceRef, plugin: CredentialPlugin) {
    let c: PluginCredential;
    try {
      c = await plugin.credential();
    } catch (e) {
      // Not status 0: a plugin that fails is no API server away; the push fails and says why.
      throw new KubeError(`cannot ${verb} ${describeResource(r)}: ${(e as Error).message}`, 401, 'CredentialPlugin');
    }
    if (c.cert && c.cert !== this.pluginCredential?.cert) {
      for (const agent of Object.values(this.agents)) agent.destroy();
      this.agents = kubeAgents(this.credentials, c.cert, c.key);
    }
    this.pluginCredential = c;
    return c.token === undefined ? undefined : `Bearer ${c.token}`;
  }

  private parseAnswer<T>(verb: KubeVerb, r: ResourceRef, answer: OutboundAnswer): T {
    try {
      return JSON.parse(answer.body) as T;
    } catch {
      throw new KubeError(
        `cannot ${verb} ${describeResource(r)}: the answer from ${this.server} is not JSON (HTTP ${answer.status}; ` +
          `is this a Kubernetes API server?)`,
        answer.status,
        'NotJSON',
      );
    }
  }

  /** The error for an HTTP error answer: verb, resource, and what to do about it. */
  private answerError(verb: KubeVerb, r: ResourceRef, answer: OutboundAnswer): KubeError {
    const { serverMessage, reason, causes } = statusDetails(answer);
    const what = describeResource(r);
    const api = `${r.group ? `${r.resource}.${r.group}` : r.resource} (${r.group || 'core'}/${r.version})`;
    const said = (before: string, after = '') => (serverMessage ? `${before}${serverMessage}${after}` : '');
    const messages: Record<number, string> = {
      401:
        `unauthorized: the API server rejected the credentials from ${this.source} (to ${verb} ${what}): the ` +
        'token has expired or been revoked, or the client certificate is not trusted',
      403:
        `forbidden: ${forbiddenSubject(serverMessage)} cannot "${verb}" ${what} — grant it with the RBAC that ` +
        '`webhook -print-rbac` prints for the hooks',
      404: r.name === undefined ? `the API server has no ${api} API` : `${what} not found`,
      409: `conflict: cannot ${verb} ${what}: ${serverMessage}`,
      422: `invalid: cannot ${verb} ${what}: ${causes.length ? causes.join('; ') : serverMessage}`,
      429: `throttled: the API server answered 429 Too Many Requests to ${verb} ${what}${said(' (', ')')}`,
    };
    const known = messages[answer.status];
    const other = `cannot ${verb} ${what}: HTTP ${answer.status}${reason ? ` ${reason}` : ''}${said(': ')}`;
    // Field causes come with a 422, or with a status this client has no words of its own for.
    const withCauses = known === undefined || answer.status === 422;
    return new KubeError(known ?? other, answer.status, reason, withCauses ? causes : []);
  }
}

/**
 * A client's keep-alive agents (a TLS handshake per connection, not per call): calls share at most maxConnections;
 * watches, which stay open and would take every turn under that bound, have their own.
 */
function kubeAgents(credentials: KubeCredentials, cert?: Buffer, key?: Buffer) {
  const { ca: onlyCa, tlsServerName: servername, insecureSkipTlsVerify } = credentials;
  const trust = { onlyCa, cert, key, servername, verify: !insecureSkipTlsVerify };
  const tls = () => clientTlsOptions(new URL(credentials.server).hostname, trust);
  const agent = (maxSockets: number): https.Agent => {
    const options = Object.assign(tls(), { keepAlive: true, maxSockets });
    return credentials.proxyUrl ? tunnelAgent(credentials.proxyUrl, options) : new https.Agent(options);
  };
  return { calls: agent(KUBE_LIMITS.maxConnections), watches: agent(Infinity) };
}

const TUNNEL_LIMITS = {
  // A proxy's answer to CONNECT is a status line and a few headers; more is not such an answer.
  maxAnswerBytes: 16 * 1024,
};

/**
 * An agent whose connections go through an HTTP or HTTPS proxy (kubeconfig proxy-url): a CONNECT to the API server's
 * host and port (an IPv6 address in brackets, RFC 9110 §9.3.6: [::1]:6443), then TLS to the API server inside the
 * tunnel, so the proxy sees neither the requests nor the credentials. Its user and password: Proxy-Authorization.
 */
function tunnelAgent(proxy: URL, agentOptions: https.AgentOptions): https.Agent {
  // An instance whose createConnection is replaced, not a subclass: a class extending https.Agent would load
  // node:https when this file is evaluated, which the start-up snapshot cannot hold.
  const agent = new https.Agent(agentOptions);
  agent.createConnection = (options, done) => tunnelConnection(proxy, options, done);
  return agent;
}

function tunnelConnection(
  p: URL,
  options: http.ClientRequestArgs,
  done?: (err: Error | null, stream: Duplex) => void,
): undefined {
  const target = `${net.isIP(String(options.host)) === 6 ? `[${options.host}]` : options.host}:${options.port}`;
  const secure = p.protocol === 'https:';
  const port = Number(p.port) || (secure ? 443 : 80);
  const socket = secure
    ? tls.connect({ host: p.hostname, port, servername: p.hostname })
    : net.connect(port, p.hostname);
  let settled = false;
  const fail = (why: string) => {
    socket.destroy();
    if (!settled) done?.(Object.assign(new Error(`proxy ${p.host}: ${why}`), { code: 'EPROXY' }), socket);
    settled = true;
  };
  socket.setTimeout(KUBE_LIMITS.requestTimeoutMs, () => fail(`no answer to CONNECT ${target}`));
  socket.once('error', (e: NodeJS.ErrnoException) => fail(e.code ?? e.message));
  socket.once(secure ? 'secureConnect' : 'connect', () => {
    const auth = p.username
      ? `Proxy-Authorization: Basic ${Buffer.from(
          `${decodeURIComponent(p.username)}:` + `${decodeURIComponent(p.password)}`,
        ).toString('base64')}\r\n`
      : '';
    socket.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n${auth}\r\n`);
  });
  let answer = Buffer.alloc(0);
  const read = (chunk: Buffer) => {
    answer = Buffer.concat([answer, chunk]);
    const end = answer.indexOf('\r\n\r\n');
    if (end < 0) return answer.length > TUNNEL_LIMITS.maxAnswerBytes ? fail('answer to CONNECT too long') : undefined;
    socket.off('data', read);
    socket.setTimeout(0);
    const status = answer.subarray(0, answer.indexOf('\r\n')).toString('latin1');
    if (!/^HTTP\/1\.[01] 2\d\d /.test(`${status} `))
      return fail(`CONNECT ${target} refused: ${status.slice(0, 100)}`);
    settled = true;
    done?.(null, tls.connect({ ...(options as tls.ConnectionOptions), socket }));
  };
  socket.on('data', read);
  return undefined;
}

/** The last failure of a call that is given up, with how many attempts it took and how long. */
function exhausted(e: KubeError, attempts: number, elapsedMs: number): KubeError {
  if (attempts <= 1) return e;
  return new KubeError(
    `${e.message} (after ${attempts} attempts in ${formatGoDuration(Math.round(elapsedMs / 100) * 100)})`,
    e.status,
    e.reason,
    e.causes,
  );
}

/** What a Status answer says: its message (or the start of a non-Status body), reason and causes. */
function statusDetails(answer: OutboundAnswer): { serverMessage: string; reason: string; causes: string[] } {
  let status: Record<string, unknown> = {};
  try {
    const parsed: unknown = JSON.parse(answer.body);
    if (isObject(parsed)) status = parsed;
  } catch {
    /* not a Status object: a proxy's page; the status code says enough */
  }
  const details = isObject(status.details) ? status.details : {};
  const causes = Array.isArray(details.causes)
    ? details.causes.filter(isObject).map((c) => {
        const field = typeof c.field === 'string' ? `${c.field}: ` : '';
        return `${field}${typeof c.message === 'string' ? c.message : ''}`;
      })
    : [];
  return {
    serverMessage: typeof status.message === 'string' ? status.message : answer.body.slice(0, 200).trim(),
    reason: typeof status.reason === 'string' ? status.reason : '',
    causes,
  };
}

/** Who a 403 names: a service account with its namespace, a user, or just "these credentials". */
function forbiddenSubject(serverMessage: string): string {
  const user = /User "([^"]*)"/.exec(serverMessage)?.[1];
  const sa = user ? /^system:serviceaccount:([^:]+):(.+)$/.exec(user) : null;
  if (sa) return `the service account "${sa[2]}" of namespace "${sa[1]}"`;
  return user ? `user "${user}"` : 'these credentials';
}

export type JsonPatchOperation =
  | { op: 'test' | 'add' | 'replace'; path: string; value: unknown }
  | { op: 'remove'; path: string };

// ---- watches ----------------------------------------------------------------------------------

const WATCH_LIMITS = {
  // The API server ends a watch after timeoutSeconds; client-go's reflectors ask for 5 to 10
  // minutes. The watch then goes on from the last resourceVersion seen: one request per shared
  // watch every 5 minutes, whatever the number of follows it serves.
  timeoutSeconds: 300,
  // Nothing at all (not even a bookmark, which the API server sends about once a minute) for this
  // long past the watch's own timeout: the connection is taken as dead and the watch resumed.
  silenceMs: 360_000,
  // A watch that ends sooner than this was not a watch the API server kept open (a proxy cut it).
  shortestMs: 1_000,
  // A watch refused (403) is not asked for again for this long: its follows poll meanwhile, each
  // without a refused request first; past it, a grant given since is used.
  refusedMemoryMs: 10 * 60_000,
  // Objects per request of a (re-)list: an answer costs some four times its size on its way, so a page of 100 pods
  // or workloads is a couple of MiB at once, however many there are (pages of 500 were a 20 MB rise at 2,000).
  listPageSize: 100,
};

/** A change of one object of a watched collection; a re-list sends every listed object as MODIFIED. */
interface WatchEvent {
  type: 'ADDED' | 'MODIFIED' | 'DELETED';
  object: Record<string, unknown>;
}

/** What a subscriber of a watch is told. */
interface WatchSubscriber {
  /** Told only the changes of the object of this name (a follow of one workload in a watched collection). */
  name?: string;
  /** Told each change; a subscriber that only reads `watched` has none. */
  event?(e: WatchEvent): void;
  /**
   * The watch it joins started after the resourceVersion it asked for: changes in between were
   * sent before it joined (`watched` has the objects as they are since), so it reads its object.
   */
  behind?(): void;
  /** The watch has the whole collection (its first list is in `watched`): told once, at once if it had it. */
  synced?(): void;
  /** The watch cannot go on (refused: 403 without the watch verb; the API is gone: 404): no more events come. */
  failed(e: KubeError): void;
}

/** A watched collection: `ref` without a name is the namespace's collection, with one that object alone. */
interface WatchScope {
  ref: ResourceRef;
  labelSelector?: string;
  /** What is kept (and handed on) of each object, as client-go's informers' transform: what its readers use. */
  keep?: (o: Record<string, unknown>) => Record<string, unknown>;
  /** The index keys of an object, as client-go's indexers: watchedBy finds the objects under one key without a scan. */
  indexBy?: (o: Record<string, unknown>) => string[];
}

function watchQuery(scope: WatchScope): Record<string, string> {
  const q: Record<string, string> = {};
  if (scope.labelSelector) q.labelSelector = scope.labelSelector;
  // A name is asked for as a field selector: RBAC grants it through resourceNames, as it does a get.
  if (scope.ref.name !== undefined) q.fieldSelector = `metadata.name=${scope.ref.name}`;
  return q;
}

const metaOf = (o: unknown, field: string): string | undefined => {
  const meta = isObject(o) && isObject(o.metadata) ? o.metadata : {};
  return typeof meta[field] === 'string' ? meta[field] : undefined;
};

/**
 * One WATCH of a collection, shared by every subscriber of the same scope on one client: started
 * at a resourceVersion (the caller's, from an answer it has; else from a list), resumed from the
 * last resourceVersion seen (bookmarks on) when the API server ends it or the connection drops,
 * with the outbound-calls backoff (retryDelay) between failed tries; re-listed on 410 Gone; ended
 * for good on 401/403/404 (failed()) or when its last subscriber leaves (close()). The objects
 * seen are kept by name (`objects`), so a subscriber that joins late reads the present state.
 */
class SharedWatch {
  private readonly subscribers = new Set<WatchSubscriber>();
  /** The subscribers by the name they follow (undefined: every object's changes). */
  private readonly byName = new Map<string | undefined, Set<WatchSubscriber>>();
  readonly objects = new Map<string, Record<string, unknown>>();
  /** The objects by index key (scope.indexBy), then by name. */
  readonly indexed = new Map<string, Map<string, Record<string, unknown>>>();
  /** Requests this watch made (watches and re-lists): tests and the metrics read it. */
  requests = 0;
  /** Whether a list has given it the whole collection (it began with one). */
  listed = false;
  /** When the API server last said anything on this watch (a change, a bookmark, a list): it is alive up to then. */
  heardAt = 0;
  private resourceVersion: string | undefined;
  /** The resourceVersion the watch started at (after its first list, if it needed one). */
  private startedAt: string | undefined;
  private failures = 0;
  private closed = false;
  private stream?: http.ClientRequest;
  private retryTimer?: NodeJS.Timeout;
  private readonly client: KubeClient;
  private readonly scope: WatchScope;
  private readonly onFailed: (e: KubeError) => void;

  constructor(client: KubeClient, scope: WatchScope, rv: string | undefined, onFailed: (e: KubeError) => void) {
    this.client = client;
    this.scope = scope;
    this.resourceVersion = this.startedAt = rv;
    this.onFailed = onFailed;
    void this.connect();
  }

  /**
   * Whether every change after `rv` reaches a subscriber that joins now: the watch started at or
   * before it. resourceVersions are etcd's revisions, compared as numbers; anything else is taken
   * as not covered (the subscriber reads its object once: safe, one request).
   */
  coversFrom(rv: string | undefined): boolean {
    if (rv === undefined || this.startedAt === undefined) return false;
    if (!/^\d+$/.test(rv) || !/^\d+$/.test(this.startedAt)) return rv === this.startedAt;
    return BigInt(this.startedAt) <= BigInt(rv);
  }

  close(): void {
    this.closed = true;
    clearTimeout(this.retryTimer);
    this.stream?.destroy();
  }

  add(s: WatchSubscriber): void {
    this.subscribers.add(s);
    this.byName.set(s.name, (this.byName.get(s.name) ?? new Set()).add(s));
  }

  /** Takes a subscriber off; whether any is left. */
  remove(s: WatchSubscriber): boolean {
    const named = this.byName.get(s.name);
    if (named?.delete(s) && named.size === 0) this.byName.delete(s.name);
    this.subscribers.delete(s);
    return this.subscribers.size > 0;
  }

  /** A change, kept and told to the subscribers of every object's changes and to those of this one. */
  private deliver(e: WatchEvent): void {
    const name = metaOf(e.object, 'name');
    if (name !== undefined) this.store(name, e.type === 'DELETED' ? undefined : e.object);
    const named = name === undefined ? [] : (this.byName.get(name) ?? []);
    for (const s of [...(this.byName.get(undefined) ?? []), ...named]) s.event?.(e);
  }

  /** Keeps an object (undefined: takes it off), in `objects` and under its index keys. */
  private store(name: string, object: Record<string, unknown> | undefined): void {
    const keys = (o: Record<string, unknown> | undefined) => (o && this.scope.indexBy ? this.scope.indexBy(o) : []);
    for (const key of keys(this.objects.get(name))) {
      const under = this.indexed.get(key);
      if (under?.delete(name) && under.size === 0) this.indexed.delete(key);
    }
    if (object === undefined) return void this.objects.delete(name);
    this.objects.set(name, object);
    for (const key of keys(object)) this.indexed.set(key, (this.indexed.get(key) ?? new Map()).set(name, object));
  }

  private fail(e: KubeError): void {
    this.close();
    this.onFailed(e);
    for (const s of [...this.subscribers]) s.failed(e);
  }

  /** The next try after a failure, later each time (retryDelay's backoff; the budget is the watch's life). */
  private retry(failure: { status?: number; code?: string; retryAfterSeconds?: number }): void {
    if (this.closed) return;
    const wait = retryDelay({ ...failure, transient: true }, this.failures++, Infinity) ?? RETRY_BACKOFF.maxMs;
    this.retryTimer = setTimeout(() => void this.connect(), wait);
  }

  /** A list of the scope in pages: its objects sent as MODIFIED, those gone as DELETED; the watch goes on from it. */
  private async relist(): Promise<boolean> {
    try {
      const listed = new Set<string>();
      let page: { next?: string; resourceVersion?: string } = {};
      do {
        page = await this.listPage(page.next, listed);
        if (this.closed) return false;
      } while (page.next);
      for (const [name, object] of [...this.objects]) if (!listed.has(name)) this.deliver({ type: 'DELETED', object });
      this.heardAt = Date.now();
      this.resourceVersion = page.resourceVersion;
      this.startedAt ??= this.resourceVersion;
      if (!this.listed) {
        this.listed = true;
        for (const s of [...this.subscribers]) s.synced?.();
      }
      return true;
    } catch (e) {
      const k = e instanceof KubeError ? e : new KubeError(String(e), 0, '');
      if ([401, 403, 404].includes(k.status)) this.fail(k);
      else this.retry({ status: k.status || undefined, code: k.reason });
      return false;
    }
  }

  /**
   * One page of a re-list, its objects kept (scope.keep) and sent as MODIFIED; what it says of the next. The page is
   * let go before the next is asked for: a page held across that wait outlives the young generation.
   */
  private async listPage(next: string | undefined, listed: Set<string>) {
    type List = { items?: Record<string, unknown>[]; metadata?: { resourceVersion?: string; continue?: string } };
    this.requests++;
    const query = { ...watchQuery(this.scope), limit: String(WATCH_LIMITS.listPageSize) };
    const page = await this.client.list<List>(this.scope.ref, next ? { ...query, continue: next } : query);
    if (this.closed) return {};
    for (const item of page.items ?? []) {
      const object = this.scope.keep ? this.scope.keep(item) : item;
      listed.add(metaOf(object, 'name') ?? '');
      this.deliver({ type: 'MODIFIED', object });
    }
    return { next: page.metadata?.continue, resourceVersion: page.metadata?.resourceVersion };
  }

  private async connect(): Promise<void> {
    if (this.closed) return;
    if (this.resourceVersion === undefined && !(await this.relist())) return;
    const query = {
      ...watchQuery(this.scope),
      watch: '1',
      allowWatchBookmarks: 'true',
      resourceVersion: this.resourceVersion ?? '',
      timeoutSeconds: String(this.client.watchTimeoutSeconds),
    };
    this.requests++;
    let opened: Awaited<ReturnType<KubeClient['openWatch']>>;
    try {
      opened = await this.client.openWatch(this.scope.ref, query, (req) => (this.stream = req));
    } catch (e) {
      if (e instanceof KubeError && e.status === 410) {
        this.resourceVersion = undefined;
        return void this.connect();
      }
      if (e instanceof KubeError && [401, 403, 404].includes(e.status)) return this.fail(e);
      const k = e as KubeError;
      return this.retry({ status: k.status || undefined, code: k.reason });
    }
    if (this.closed) opened.req.destroy();
    else this.read(opened.res, opened.req);
  }

  /** Reads the stream's lines (one event each) until it ends, then resumes. */
  private read(res: http.IncomingMessage, req: http.ClientRequest): void {
    let buffered = '';
    let gone = false;
    const silence = () => setTimeout(() => req.destroy(new Error('watch silent')), WATCH_LIMITS.silenceMs);
    let timer = silence();
    res.setEncoding('utf8');
    res.on('data', (chunk: string) => {
      clearTimeout(timer);
      timer = silence();
      buffered += chunk;
      for (let nl = buffered.indexOf('\n'); nl >= 0 && !gone; nl = buffered.indexOf('\n')) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        gone = this.line(line) === 'gone';
        if (gone) req.destroy();
      }
    });
    let ended = false;
    const opened = Date.now();
    const end = (failed: boolean) => {
      clearTimeout(timer);
      if (ended || this.closed) return void (ended = true);
      ended = true;
      if (gone) this.resourceVersion = undefined;
      // A watch that ends at once, without error, is retried with the backoff too: never a busy loop.
      if (!gone && (failed || Date.now() - opened < WATCH_LIMITS.shortestMs)) return this.retry({ code: 'ECONNRESET' });
      void this.connect();
    };
    res.on('end', () => end(false));
    res.on('error', () => end(true));
    req.on('error', () => end(true));
    req.on('close', () => end(!res.complete));
  }

  /** One line of the stream; 'gone' when the API server no longer has the resourceVersion (410). */
  private line(text: string): 'gone' | undefined {
    if (text.trim() === '') return undefined;
    let e: { type?: string; object?: Record<string, unknown> };
    try {
      e = JSON.parse(text);
    } catch {
      return undefined;
    }
    const object = isObject(e.object) ? e.object : {};
    this.heardAt = Date.now();
    if (e.type === 'ERROR') return object.code === 410 ? 'gone' : undefined;
    const rv = metaOf(object, 'resourceVersion');
    if (rv !== undefined) this.resourceVersion = rv;
    this.failures = 0;
    if (e.type === 'ADDED' || e.type === 'MODIFIED' || e.type === 'DELETED')
      this.deliver({ type: e.type, object: this.scope.keep ? this.scope.keep(object) : object });
    return undefined;
  }
}

/** The key of a shared watch: the collection (or one object of it) and the label selector. */
function watchKey(scope: WatchScope): string {
  return `${resourcePath({ ...scope.ref, name: undefined })}?${new URLSearchParams(watchQuery(scope))}`;
}

// ================================================================================================
// 10. kubeconfig — kubeconfig files read as kubectl reads them (client-go's clientcmd), and the credentials of one of
//    their contexts. YAML or JSON; -kubeconfig is one file, KUBECONFIG a list merged by kubectl's rules (the first
//    file to name a cluster, user or context wins it whole; current-context comes from the first file that sets it;
//    missing files are skipped); with neither, the pod's service account. A context gives its namespace, its cluster
//    (the server with its path, the CA, tls-server-name, insecure-skip-tls-verify with a warning, an http or https
//    proxy-url) and its user: a client certificate, a token, a tokenFile (re-read on every request, and preferred to a
//    token beside it, as client-go does), or an exec credential plugin run as client-go runs it
//    (client.authentication.k8s.io/v1 or v1beta1, KUBERNETES_EXEC_INFO, never interactive, its env and args, its
//    credential kept until its expirationTimestamp and renewed after a 401), started from the environment the caller
//    gives (ExecEnvironment), never this process's. Paths are relative to the file that names them; a plugin's bare
//    command is looked up on PATH. Basic auth (a password in the server's URL too), auth-provider and impersonation
//    are refused. Errors name the file, the context and the field, never a credential.
//    Exports: credentialsFromEnvironment, ExecEnvironment.
//    Tests: test/burst.test.ts, test/clusters.test.ts, test/kubeconfig.test.ts, test/rollback.test.ts,
//    test/upgrade.test.ts, test/watch.test.ts.
// ================================================================================================

const EXEC_LIMITS = {
  // A plugin that asks a cloud's token service answers in a second or two; one that has not
  // answered in 30 s is hung (client-go waits for ever, which a push's answer cannot).
  timeoutMs: 30_000,
  // An ExecCredential is a token or a certificate and key: a few KiB.
  maxOutputBytes: 1024 * 1024,
  // What of a failed plugin's standard error a message quotes: its last words, not its whole log.
  stderrChars: 300,
  // A value shorter than this (a region, "1") is too likely an ordinary word to take out of what a plugin says.
  minScrubbedChars: 6,
};

/**
 * What exec credential plugins start from, instead of the service's whole environment: `env` (the caller's choice:
 * the commands' environment, without the service's own secrets), to which each plugin's kubeconfig `env` is added;
 * and `secrets`, values taken out of the standard error a message quotes (besides the kubeconfig `env` values).
 */
export interface ExecEnvironment {
  env: Readonly<Record<string, string | undefined>>;
  secrets: readonly string[];
}

/** Where no environment is given (a kubeconfig read by itself): a plugin inherits nothing of this process's. */
const BARE_EXEC_ENVIRONMENT: ExecEnvironment = { env: {}, secrets: [] };

/** One cluster, user or context entry, with the file that named it (paths in it are relative to that file). */
interface KubeconfigEntry {
  body: Record<string, unknown>;
  file: string;
}

/** Kubeconfig files merged by kubectl's rules (see the banner). */
interface Kubeconfig {
  files: string[];
  currentContext?: string;
  contexts: Map<string, KubeconfigEntry>;
  clusters: Map<string, KubeconfigEntry>;
  users: Map<string, KubeconfigEntry>;
}

/** The sections of a kubeconfig, each a list of `{name, <inner>: {...}}`. */
const KUBECONFIG_SECTIONS = [
  ['clusters', 'cluster'],
  ['users', 'user'],
  ['contexts', 'context'],
] as const;

/** The files to read: -kubeconfig alone, else KUBECONFIG's list (missing ones skipped), else none (in-cluster). */
function kubeconfigFiles(env: Record<string, string | undefined>, flag?: string): string[] | undefined {
  if (flag) return [flag];
  const listed = (env.KUBECONFIG ?? '').split(path.delimiter).filter((f) => f.trim() !== '');
  if (listed.length === 0) return undefined;
  const files = [...new Set(listed)].filter((f) => fs.existsSync(f));
  if (files.length === 0)
    throw new KubeConfigError(`KUBECONFIG ${JSON.stringify(env.KUBECONFIG)}: none of its files exists`);
  return files;
}

/** How messages name the configuration: the one file, or KUBECONFIG's list. */
function kubeconfigWhere(files: string[]): string {
  return files.length === 1 ? `kubeconfig ${files[0]}` : `KUBECONFIG ${files.join(path.delimiter)}`;
}

/** The files read and merged: the first file to name an entry wins it, whole, as does the first current-context. */
export function readKubeconfig(files: string[]): Kubeconfig {
  const merged: Kubeconfig = { files, contexts: new Map(), clusters: new Map(), users: new Map() };
  for (const file of files) {
    const config = readKubeconfigFile(file);
    const current = config['current-context'];
    if (merged.currentContext === undefined && typeof current === 'string' && current !== '')
      merged.currentContext = current;
    for (const [list, inner] of KUBECONFIG_SECTIONS) {
      const items = config[list] ?? [];
      if (!Array.isArray(items)) throw new KubeConfigError(`kubeconfig ${file}: ${list} is not a list`);
      items.forEach((item: unknown, i) => {
        const name = isObject(item) ? item.name : undefined;
        if (typeof name !== 'string' || name === '' || !isObject(item) || !isObject(item[inner] ?? {}))
          throw new KubeConfigError(`kubeconfig ${file}: ${list}[${i}]: needs a name and a ${inner} object`);
        const entries = merged[list];
        if (!entries.has(name)) entries.set(name, { body: (item[inner] ?? {}) as Record<string, unknown>, file });
      });
    }
  }
  return merged;
}

/** One file as an object: JSON when it starts with `{`, else YAML (parse errors give the place, never the text). */
function readKubeconfigFile(file: string): Record<string, unknown> {
  const where = `kubeconfig ${file}`;
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new KubeConfigError(
      `${where}: cannot read it (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`,
    );
  }
  let config: unknown;
  try {
    config = text.trimStart().startsWith('{') ? JSON.parse(text) : parseYaml(text).value;
  } catch (e) {
    // The parsers' messages may quote file content, which can be a credential: only the place is passed on.
    const at = e instanceof YamlError ? ` (line ${e.line}, column ${e.column})` : '';
    throw new KubeConfigError(`${where}: not a YAML or JSON kubeconfig${at}`);
  }
  if (config === null || config === undefined) return {};
  if (!isObject(config)) throw new KubeConfigError(`${where}: not a kubeconfig (the top level must be a mapping)`);
  return config;
}

/** Credentials of one kubeconfig file's current context (or of `context`). */
export function loadKubeconfig(file: string, context?: string, exec?: ExecEnvironment): KubeCredentials {
  return contextCredentials(readKubeconfig([file]), context, exec);
}

/**
 * The credentials of a context: `name`, else the current context; its exec plugin starts from `exec`. Throws a
 * KubeConfigError naming the file, the context and the field.
 */
export function contextCredentials(
  config: Kubeconfig,
  name?: string,
  exec: ExecEnvironment = BARE_EXEC_ENVIRONMENT,
): KubeCredentials {
  const where = kubeconfigWhere(config.files);
  const contextName = name ?? config.currentContext;
  if (contextName === undefined)
    throw new KubeConfigError(`${where}: current-context is not set, and no context was named`);
  const from = name === undefined ? `from current-context ${JSON.stringify(contextName)}` : 'the context asked for';
  const context = config.contexts.get(contextName);
  if (!context) {
    const known = [...config.contexts.keys()].map((c) => JSON.stringify(c)).join(', ') || 'none';
    throw new KubeConfigError(
      `${where}: contexts: no entry named ${JSON.stringify(contextName)} (${from}; contexts: ${known})`,
    );
  }
  const at = `kubeconfig ${context.file}: context ${JSON.stringify(contextName)}`;
  const named = (list: 'clusters' | 'users', field: 'cluster' | 'user'): KubeconfigEntry & { where: string } => {
    const entryName = context.body[field];
    const entry = typeof entryName === 'string' ? config[list].get(entryName) : undefined;
    if (!entry)
      throw new KubeConfigError(`${at}: context.${field}: no ${list} entry named ${JSON.stringify(entryName ?? '')}`);
    return { ...entry, where: `${at}: ${list}[${JSON.stringify(entryName)}].${field}` };
  };
  const cluster = clusterSettings(named('clusters', 'cluster'));
  const userEntry = named('users', 'user');
  const namespace = context.body.namespace;
  return {
    ...cluster,
    ...userCredentials(userEntry.body, userEntry.where, path.dirname(path.resolve(userEntry.file)), cluster, exec),
    source: `${where} (context ${JSON.stringify(contextName)}, user ${JSON.stringify(context.body.user)})`,
    namespace: typeof namespace === 'string' && namespace !== '' ? namespace : undefined,
  };
}

type ClusterSettings = Pick<
  KubeCredentials,
  'server' | 'ca' | 'tlsServerName' | 'insecureSkipTlsVerify' | 'proxyUrl' | 'warnings'
>;

/** A cluster entry: the server (https, its path kept), how it is trusted, and the proxy to it. */
function clusterSettings(entry: KubeconfigEntry & { where: string }): ClusterSettings {
  const { body: cluster, where } = entry;
  const server = cluster.server;
  if (typeof server !== 'string' || server === '') throw new KubeConfigError(`${where}.server is missing`);
  // Neither quoted nor kept: the URL is in every API error, and the password would be too.
  if (/^[^/?#]*:\/\/[^/?#]*@/.test(server))
    throw new KubeConfigError(
      `${where}.server: a user name or password in the URL (user:password@host) is not accepted: the server's ` +
        'address appears in every API error; give the user a token, a client certificate or an exec plugin',
    );
  if (!server.startsWith('https://'))
    throw new KubeConfigError(`${where}.server ${JSON.stringify(server)}: only https:// API servers are supported`);
  const dir = path.dirname(path.resolve(entry.file));
  const ca = kubeconfigMaterial(cluster, where, 'certificate-authority', dir);
  const insecure = cluster['insecure-skip-tls-verify'] === true;
  if (insecure && ca)
    throw new KubeConfigError(
      `${where}: insecure-skip-tls-verify and a certificate-authority together: one says to check the server's ` +
        'certificate, the other not to (kubectl refuses this too)',
    );
  const tlsServerName = cluster['tls-server-name'];
  return {
    server: server.replace(/\/+$/, ''),
    ca,
    tlsServerName: typeof tlsServerName === 'string' && tlsServerName !== '' ? tlsServerName : undefined,
    insecureSkipTlsVerify: insecure,
    proxyUrl: proxyUrl(cluster['proxy-url'], where),
    warnings: insecure
      ? [
          `${where}.insecure-skip-tls-verify: the API server's certificate is not checked; anyone on the way can ` +
            'read and change what is sent, credentials included',
        ]
      : [],
  };
}

/** proxy-url: an http or https proxy (socks5, which kubectl also takes, is not supported). */
function proxyUrl(value: unknown, where: string): URL | undefined {
  if (value === undefined || value === '') return undefined;
  let url: URL | undefined;
  try {
    url = typeof value === 'string' ? new URL(value) : undefined;
  } catch {
    url = undefined;
  }
  if (!url || (url.protocol !== 'http:' && url.protocol !== 'https:'))
    // Only the scheme is quoted: a proxy URL can carry a password.
    throw new KubeConfigError(
      `${where}.proxy-url: not an http:// or https:// URL (scheme ${JSON.stringify(url?.protocol ?? '')}; ` +
        'socks5 proxies are not supported)',
    );
  return url;
}

/** A certificate or key: inline base64 `<field>-data`, else a file path relative to the kubeconfig. */
function kubeconfigMaterial(
  section: Record<string, unknown>,
  at: string,
  field: string,
  dir: string,
): Buffer | undefined {
  const inline = section[`${field}-data`];
  if (typeof inline === 'string' && inline !== '') return Buffer.from(inline, 'base64');
  const ref = section[field];
  if (typeof ref !== 'string' || ref === '') return undefined;
  const full = path.resolve(dir, ref);
  try {
    return fs.readFileSync(full);
  } catch (e) {
    throw new KubeConfigError(`${at}.${field}: cannot read ${full} (${(e as NodeJS.ErrnoException).code})`);
  }
}

/** User fields this program refuses, and why (a message each). */
const REFUSED_USER_FIELDS: Record<string, string> = {
  username: 'basic authentication is not supported (Kubernetes removed it in 1.19): use a token',
  password: 'basic authentication is not supported (Kubernetes removed it in 1.19): use a token',
  'auth-provider':
    'auth-provider plugins were removed from kubectl in 1.26: use the exec plugin your provider ships ' +
    '(gke-gcloud-auth-plugin, kubelogin, …)',
  as: 'impersonation is not supported: give the credentials of the account itself',
  'as-groups': 'impersonation is not supported: give the credentials of the account itself',
  'as-uid': 'impersonation is not supported: give the credentials of the account itself',
};

/** A user entry's exec plugin, tokenFile, token or client certificate. */
function userCredentials(
  user: Record<string, unknown>,
  userWhere: string,
  dir: string,
  cluster: ClusterSettings,
  exec: ExecEnvironment,
): Pick<KubeCredentials, 'token' | 'tokenFile' | 'cert' | 'key' | 'plugin'> {
  for (const [field, why] of Object.entries(REFUSED_USER_FIELDS))
    if (user[field] !== undefined) throw new KubeConfigError(`${userWhere}.${field}: ${why}`);
  const cert = kubeconfigMaterial(user, userWhere, 'client-certificate', dir);
  const key = kubeconfigMaterial(user, userWhere, 'client-key', dir);
  if ((cert === undefined) !== (key === undefined))
    throw new KubeConfigError(`${userWhere}: client-certificate and client-key must be given together`);
  if (user.exec !== undefined) {
    const plugin = new ExecPlugin(execSpec(user.exec, `${userWhere}.exec`, dir), cluster, exec);
    return { cert, key, plugin };
  }
  const token = typeof user.token === 'string' && user.token !== '' ? user.token : undefined;
  // Both given: client-go re-reads the file and uses it over the token; so does this program.
  const tokenFile =
    typeof user.tokenFile === 'string' && user.tokenFile !== '' ? path.resolve(dir, user.tokenFile) : undefined;
  if (token === undefined && tokenFile === undefined && cert === undefined) {
    throw new KubeConfigError(`${userWhere}: no credentials (token, tokenFile, client-certificate-data or exec)`);
  }
  return { token: tokenFile === undefined ? token : undefined, tokenFile, cert, key };
}

/** The ExecCredential versions a plugin may speak (v1alpha1 was removed from client-go in 1.24). */
const EXEC_API_VERSIONS = ['client.authentication.k8s.io/v1', 'client.authentication.k8s.io/v1beta1'];

interface ExecSpec {
  command: string;
  args: string[];
  env: Record<string, string>;
  apiVersion: string;
  provideClusterInfo: boolean;
  installHint?: string;
  /** For messages: the user entry's place. */
  where: string;
}

/** A user's `exec` section, checked as client-go checks it. */
function execSpec(exec: unknown, where: string, dir: string): ExecSpec {
  if (!isObject(exec)) throw new KubeConfigError(`${where}: not a mapping`);
  const { command, args = [], env = [], apiVersion, interactiveMode } = exec;
  if (typeof command !== 'string' || command === '') throw new KubeConfigError(`${where}.command is missing`);
  if (!Array.isArray(args) || !args.every((a) => typeof a === 'string'))
    throw new KubeConfigError(`${where}.args: not a list of strings`);
  if (typeof apiVersion !== 'string' || !EXEC_API_VERSIONS.includes(apiVersion))
    throw new KubeConfigError(
      `${where}.apiVersion ${JSON.stringify(apiVersion ?? '')}: not ${EXEC_API_VERSIONS.join(' or ')}`,
    );
  if (interactiveMode === undefined && apiVersion.endsWith('/v1'))
    throw new KubeConfigError(`${where}.interactiveMode: required for ${apiVersion} (Never, IfAvailable or Always)`);
  if (interactiveMode !== undefined && !['Never', 'IfAvailable', 'Always'].includes(String(interactiveMode)))
    throw new KubeConfigError(
      `${where}.interactiveMode ${JSON.stringify(interactiveMode)}: not Never, IfAvailable or Always`,
    );
  // The service has no terminal: a plugin that must ask someone can never run here.
  if (interactiveMode === 'Always')
    throw new KubeConfigError(
      `${where}.interactiveMode Always: the plugin needs a terminal, and this service has none`,
    );
  if (!Array.isArray(env)) throw new KubeConfigError(`${where}.env: not a list of {name, value}`);

  const vars: Record<string, string> = {};
  env.forEach((v: unknown, i) => {
    if (!isObject(v) || typeof v.name !== 'string' || typeof v.value !== 'string')
      throw new KubeConfigError(`${where}.env[${i}]: needs a name and a value`);
    vars[v.name] = v.value;
  });
  return {
    // A command with a path separator is relative to the kubeconfig; a bare one is looked up on PATH.
    command: command.includes('/') ? path.resolve(dir, command) : command,
    args: args as string[],
    env: vars,
    apiVersion,
    provideClusterInfo: exec.provideClusterInfo === true,
    installHint: typeof exec.installHint === 'string' ? exec.installHint : undefined,
    where,
  };
}

/**
 * An exec credential plugin: run when there is no credential, or the one it gave has reached its
 * expirationTimestamp, or the API server rejected it (401). Concurrent requests share one run.
 */
class ExecPlugin implements CredentialPlugin {
  private readonly spec: ExecSpec;
  private readonly cluster: ClusterSettings;
  private readonly exec: ExecEnvironment;
  private cached: { credential: PluginCredential; expiresAt?: number } | undefined;
  private running: Promise<PluginCredential> | undefined;

  constructor(spec: ExecSpec, cluster: ClusterSettings, exec: ExecEnvironment) {
    this.spec = spec;
    this.cluster = cluster;
    this.exec = exec;
  }

  credential(): Promise<PluginCredential> {
    const c = this.cached;
    if (c && (c.expiresAt === undefined || Date.now() < c.expiresAt)) return Promise.resolve(c.credential);
    this.running ??= this.run().finally(() => (this.running = undefined));
    return this.running;
  }

  rejected(c: PluginCredential): void {
    if (this.cached?.credential === c) this.cached = undefined;
  }

  private async run(): Promise<PluginCredential> {
    const s = this.spec;
    // As client-go does, but from the environment given, not this process's (HOOK_TOKEN, MAIL_PASSWORD…).
    const env = { ...this.exec.env, ...s.env, KUBERNETES_EXEC_INFO: JSON.stringify(this.execInfo()) };
    const secrets = [...this.exec.secrets, ...Object.values(s.env)];
    const out = await runPlugin(s, env, new Scrubber(secrets.filter((v) => v.length >= EXEC_LIMITS.minScrubbedChars)));
    const parsed = parseExecCredential(out, s);
    this.cached = parsed;
    return parsed.credential;
  }

  /** What the plugin is told (KUBERNETES_EXEC_INFO): never interactive; the cluster when it asks for it. */
  private execInfo(): Record<string, unknown> {
    const c = this.cluster;
    const cluster = {
      server: c.server,
      'tls-server-name': c.tlsServerName,
      'insecure-skip-tls-verify': c.insecureSkipTlsVerify || undefined,
      'certificate-authority-data': c.ca?.toString('base64'),
      'proxy-url': c.proxyUrl?.href,
    };
    const spec = { interactive: false, ...(this.spec.provideClusterInfo ? { cluster } : {}) };
    return { apiVersion: this.spec.apiVersion, kind: 'ExecCredential', spec };
  }
}

/**
 * Runs the plugin with no standard input under a deadline: its standard output, or an error saying why, which quotes
 * the last line of its standard error with `scrubber`'s secrets taken out.
 */
function runPlugin(s: ExecSpec, env: NodeJS.ProcessEnv, scrubber: Scrubber): Promise<string> {
  const name = `exec plugin ${JSON.stringify(s.command)} (${s.where})`;
  return new Promise((resolve, reject) => {
    const child = spawn(s.command, s.args, { env, stdio: ['ignore', 'pipe', 'pipe'], timeout: EXEC_LIMITS.timeoutMs });
    let out = '';
    let err = '';
    child.stdout!.setEncoding('utf8').on('data', (d: string) => {
      out += d;
      if (out.length > EXEC_LIMITS.maxOutputBytes) child.kill();
    });
    child.stderr!.setEncoding('utf8').on('data', (d: string) => (err = (err + d).slice(-EXEC_LIMITS.stderrChars)));
    child.on('error', (e: NodeJS.ErrnoException) =>
      reject(
        new KubeConfigError(
          e.code === 'ENOENT'
            ? `${name}: not found${s.installHint ? ` (${s.installHint.trim()})` : ''}`
            : `${name}: cannot run it (${e.code ?? e.message})`,
        ),
      ),
    );
    child.on('close', (code, signal) => {
      if (code === 0) return resolve(out);
      const why = signal
        ? `was stopped (${signal}${signal === 'SIGTERM' ? ', over its time limit' : ''})`
        : `exited ${code}`;
      const said = scrubber.scrub(err).trim().split('\n').at(-1)?.trim();
      reject(new KubeConfigError(`${name} ${why}${said ? `: ${said}` : ''}`));
    });
  });
}

/** A plugin's standard output read as client-go reads it: an ExecCredential of the asked version, with a status. */
function parseExecCredential(out: string, s: ExecSpec): { credential: PluginCredential; expiresAt?: number } {
  const name = `exec plugin ${JSON.stringify(s.command)} (${s.where})`;
  let doc: unknown;
  try {
    doc = JSON.parse(out);
  } catch {
    // What it printed is not quoted: it may hold a credential.
    throw new KubeConfigError(`${name}: did not print an ExecCredential (its output is not JSON)`);
  }
  if (!isObject(doc) || doc.kind !== 'ExecCredential')
    throw new KubeConfigError(`${name}: did not print an ExecCredential (kind is not ExecCredential)`);
  if (doc.apiVersion !== s.apiVersion)
    throw new KubeConfigError(`${name}: printed apiVersion ${JSON.stringify(doc.apiVersion)}, not ${s.apiVersion}`);
  const status = doc.status;
  if (!isObject(status)) throw new KubeConfigError(`${name}: its ExecCredential has no status`);
  const text = (v: unknown) => (typeof v === 'string' && v !== '' ? v : undefined);
  const token = text(status.token);
  const cert = text(status.clientCertificateData);
  const key = text(status.clientKeyData);
  if ((cert === undefined) !== (key === undefined))
    throw new KubeConfigError(`${name}: status has one of clientCertificateData and clientKeyData without the other`);
  if (token === undefined && cert === undefined)
    throw new KubeConfigError(`${name}: status has neither a token nor a client certificate`);
  let expiresAt: number | undefined;
  if (status.expirationTimestamp !== undefined) {
    expiresAt = typeof status.expirationTimestamp === 'string' ? Date.parse(status.expirationTimestamp) : NaN;
    if (Number.isNaN(expiresAt))
      throw new KubeConfigError(`${name}: status.expirationTimestamp is not an RFC 3339 time`);
  }
  const credential = {
    token,
    cert: cert === undefined ? undefined : Buffer.from(cert),
    key: key === undefined ? undefined : Buffer.from(key),
  };
  return { credential, expiresAt };
}

const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

/** Credentials of the pod's service account (the in-cluster configuration). */
export function inClusterCredentials(
  env: Record<string, string | undefined>,
  dir: string = SERVICE_ACCOUNT_DIR,
): KubeCredentials {
  const host = env.KUBERNETES_SERVICE_HOST;
  const port = env.KUBERNETES_SERVICE_PORT;
  if (!host || !port) {
    throw new KubeConfigError(
      'no Kubernetes credentials: not running in a pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not ' +
        'set); outside a cluster use -kubeconfig or KUBECONFIG',
    );
  }
  const tokenFile = path.join(dir, 'token');
  const caFile = path.join(dir, 'ca.crt');
  try {
    fs.accessSync(tokenFile, fs.constants.R_OK);
  } catch (e) {
    throw new KubeConfigError(
      `in-cluster credentials: cannot read ${tokenFile} (${(e as NodeJS.ErrnoException).code}): is ` +
        `automountServiceAccountToken disabled for this pod?`,
    );
  }
  let ca: Buffer;
  try {
    ca = fs.readFileSync(caFile);
  } catch (e) {
    throw new KubeConfigError(`in-cluster credentials: cannot read ${caFile} (${(e as NodeJS.ErrnoException).code})`);
  }
  let namespace: string | undefined;
  try {
    namespace = fs.readFileSync(path.join(dir, 'namespace'), 'utf8').trim() || undefined;
  } catch {
    namespace = undefined;
  }
  return {
    server: `https://${host.includes(':') ? `[${host}]` : host}:${port}`,
    ca,
    tokenFile,
    source: `the service account token ${tokenFile}`,
    namespace,
  };
}

/**
 * -kubeconfig, else KUBECONFIG, else the pod's service account; `context` names one (else the current one); an
 * exec plugin starts from `exec`.
 */
export function credentialsFromEnvironment(
  env: Record<string, string | undefined>,
  kubeconfigFlag?: string,
  context?: string,
  exec?: ExecEnvironment,
): KubeCredentials {
  const files = kubeconfigFiles(env, kubeconfigFlag);
  if (files) return contextCredentials(readKubeconfig(files), context, exec);
  if (context !== undefined)
    throw new KubeConfigError(
      `no kubeconfig (neither -kubeconfig nor KUBECONFIG) to find the context ${JSON.stringify(context)} in; ` +
        "without one the only cluster is the one of the pod's service account",
    );
  return inClusterCredentials(env);
}

// ================================================================================================
// 11. oci registry client — asks a registry which digest a tag points at (HEAD /v2/<repo>/manifests/<tag> over
//    HTTPS): anonymously, or with basic auth, or with a bearer token from the registry's token service, trusting an
//    extra CA when given (each request one outboundRequest under a total deadline). The pull secret's login goes only
//    to the registry's own host or a token host allowed (tokenHostAllowed: REGISTRY_TOKEN_HOSTS, the well-known
//    registries'); a realm elsewhere is asked anonymously. A refusal is a RegistryError saying which and why. Cosign
//    signatures, offline: readCosignSignatures looks for a valid signature of a digest where cosign stores them (the
//    sha256-<hex>.sig tag; the OCI 1.1 referrers API, else the referrers tag schema's sha256-<hex> index), each
//    manifest and blob read once and checked against its digest, each signature checked as it arrives, stopping at
//    the first valid one, within SIGNATURE_LIMITS (sizes, counts, one deadline); verifyCosignSignatures (pure)
//    checks each simple-signing payload's signature with node:crypto under the keys given (parseCosignKeys: ECDSA
//    P-256, Ed25519, RSA; Ed25519ph, which cosign signs with and node:crypto lacks, by hand after RFC 8032), and
//    that it names the digest, the repository and the annotations required. No transparency log, no Fulcio: a
//    keyless signature is refused.
//    Exports: CosignKey, parseCosignKeys, readCosignSignatures, registryAway, RegistryLogin, resolveManifestTag,
//    SignatureVerdict.
//    Tests: test/outbound.test.ts, test/registry-e2e.test.ts, test/clouds.test.ts, test/cosign-verify.test.ts,
//    test/signed-images.test.ts.
// ================================================================================================

// ---- verifying the pushed image on its registry (VERIFY_IMAGE) ------------------------------------

/** A registry that refused or could not answer; the message says which and why, `status` the answer's when one came. */
class RegistryError extends Error {
  readonly status: number | undefined;
  constructor(message: string, status?: number) {
    super(message);
    this.status = status;
  }
}

/**
 * Whether a registry call failed as a registry that is away does (no answer, a 5xx, a 429: what
 * another try later could mend), rather than one that answered with a refusal (401, 404, a bad
 * certificate, a digest that does not match). Pure.
 */
export function registryAway(e: unknown): boolean {
  if (e instanceof OutboundError) return retryDelay({ verb: 'get', code: e.code }, 0, Infinity) !== undefined;
  const status = e instanceof RegistryError ? e.status : undefined;
  return status !== undefined && retryDelay({ verb: 'get', status }, 0, Infinity) !== undefined;
}

const VERIFY_LIMITS = {
  // A registry answers a HEAD of a manifest in milliseconds; a token service a little slower. The
  // whole verification (token and HEAD) must fit well within a registry's delivery timeout.
  requestTimeoutMs: 10_000,
  // A token or manifest answer larger than this is not one.
  maxBodyBytes: 64 * 1024,
};

/** What a manifest HEAD accepts: every manifest and index type, so the digest is the tag's own. */
const MANIFEST_TYPES = [
  'application/vnd.oci.image.index.v1+json',
  'application/vnd.oci.image.manifest.v1+json',
  'application/vnd.docker.distribution.manifest.list.v2+json',
  'application/vnd.docker.distribution.manifest.v2+json',
].join(', ');

/** One HTTPS request to a registry or its token service, under its deadline; the CA from REGISTRY_CA. */
function registryRequest(
  url: URL,
  method: string,
  headers: Record<string, string>,
  ca?: string,
): Promise<OutboundAnswer> {
  return outboundRequest(url, {
    method,
    headers,
    deadlineMs: VERIFY_LIMITS.requestTimeoutMs,
    maxResponseBytes: VERIFY_LIMITS.maxBodyBytes,
    overLimit: 'cut',
    trust: { extraCa: ca },
  });
}

/** The parameters of a WWW-Authenticate challenge: scheme and key="value" pairs. */
function parseChallenge(header: string): { scheme: string; params: Record<string, string> } {
  const space = header.indexOf(' ');
  const scheme = (space < 0 ? header : header.slice(0, space)).toLowerCase();
  const params: Record<string, string> = {};
  for (const m of header.slice(space + 1).matchAll(/([a-zA-Z_]+)="([^"]*)"/g)) params[m[1].toLowerCase()] = m[2];
  return { scheme, params };
}

/** A user and password for a registry, from a pull secret; never logged, never in a message. */
interface RegistryLogin {
  user: string;
  password: string;
  /** The secret it came from, for messages. */
  secret: string;
}

/**
 * Registries whose token service lives on another host than the registry itself, and that host.
 * The others (ghcr.io, quay.io, *.azurecr.io, gcr.io, *-docker.pkg.dev, public.ecr.aws, Harbor,
 * Distribution) name a realm on their own host, which needs no entry.
 */
const WELL_KNOWN_TOKEN_HOSTS: { registry: RegExp; tokenHost: (m: RegExpExecArray) => string }[] = [
  // Docker Hub: the registry is registry-1.docker.io, its token service auth.docker.io.
  { registry: /^(?:registry-1\.|index\.)?docker\.io$/, tokenHost: () => 'auth.docker.io' },
  // Aliyun ACR (personal edition): registry[-vpc].<region>.aliyuncs.com → dockerauth[-vpc].<region>.aliyuncs.com.
  {
    registry: /^registry(-vpc)?\.([a-z]{2}-[a-z0-9-]+)\.aliyuncs\.com$/,
    tokenHost: (m) => `dockerauth${m[1] ?? ''}.${m[2]}.aliyuncs.com`,
  },
  // GitLab.com's registry asks gitlab.com for its tokens.
  { registry: /^registry\.gitlab\.com$/, tokenHost: () => 'gitlab.com' },
];

/**
 * Whether a pull secret's login may go to the token service on `realmHost`: the registry's own host
 * name (any port), a host the operator allowed (REGISTRY_TOKEN_HOSTS: names, or "*.suffix"), or the
 * token host of a well-known registry. A realm elsewhere is the registry's word only, and a registry
 * (or whoever answers for it) could name any host to collect the login. Pure.
 */
export function tokenHostAllowed(realmHost: string, registryHost: string, allowed: readonly string[]): boolean {
  const name = (host: string) => host.toLowerCase().replace(/\.$/, '');
  const realm = name(realmHost);
  const registry = name(new URL(`https://${registryHost}`).hostname);
  if (realm === registry) return true;
  if (allowed.some((a) => (a.startsWith('*.') ? realm.endsWith(name(a.slice(1))) : realm === name(a)))) return true;
  return WELL_KNOWN_TOKEN_HOSTS.some((known) => {
    const m = known.registry.exec(registry);
    return m !== null && known.tokenHost(m) === realm;
  });
}

/**
 * Registries whose login is the answer of their cloud's own token exchange, which needs that cloud's credentials
 * (not a registry login a pull secret can hold for long): what a pull secret must hold for them, said when the
 * login is missing or refused instead of a bare 401. `anonymous`: whether the registry may serve without a login.
 */
const CLOUD_LOGINS: { registry: RegExp; anonymous: boolean; needs: string }[] = [
  {
    registry: /^\d{12}\.dkr\.ecr(?:-fips)?\.[a-z0-9-]+\.amazonaws\.com(?:\.cn)?$/,
    anonymous: false,
    needs:
      'an Amazon ECR login is a token from its GetAuthorizationToken call, an AWS API call signed with AWS ' +
      'credentials this service does not hold, valid 12 hours: give the workload a pull secret (user AWS, password ' +
      'the token) that a job holding those credentials refreshes',
  },
  {
    registry: /^(?:[a-z0-9-]+-docker\.pkg\.dev|(?:[a-z]+\.)?gcr\.io)$/,
    anonymous: true,
    needs:
      'a Google Artifact Registry login is a service account key (user _json_key, password the key file) or an ' +
      'OAuth access token (user oauth2accesstoken, valid an hour), which needs Google credentials this service ' +
      'does not hold: give the workload a pull secret with a key, or one a job refreshes',
  },
];

/** What a cloud registry's login needs, for its refusals; undefined for other registries. Pure. */
export function cloudLoginNeeds(host: string): { anonymous: boolean; needs: string } | undefined {
  return CLOUD_LOGINS.find((c) => c.registry.test(host.toLowerCase()));
}

/** A refusal of `host`, with what its cloud's login needs when it is a cloud registry. */
function registryRefusal(host: string, message: string): RegistryError {
  const cloud = cloudLoginNeeds(host);
  return new RegistryError(cloud ? `${message} (${cloud.needs})` : message);
}

/** What to send a registry: its Authorization, and why the login was withheld from its token service, if it was. */
interface RegistryAuthorization {
  authorization: string;
  withheld?: string;
}

/**
 * The Authorization a registry's challenge asks for: Basic with the login, or a Bearer token from its
 * realm, asked for with the login only where tokenHostAllowed says (anonymously elsewhere).
 */
async function authorizationFor(
  challenge: string,
  login: RegistryLogin | undefined,
  registry: { host: string; repository: string; ca: string | undefined; tokenHosts: readonly string[] },
): Promise<RegistryAuthorization> {
  const { scheme, params } = parseChallenge(challenge);
  const basic = login ? `Basic ${Buffer.from(`${login.user}:${login.password}`).toString('base64')}` : undefined;
  if (scheme === 'basic') {
    if (!basic)
      throw registryRefusal(
        registry.host,
        'the registry asks for a login and the workload names no pull secret for it',
      );
    return { authorization: basic };
  }
  if (scheme !== 'bearer' || !params.realm) throw new RegistryError(`the registry asks for ${showValue(challenge)}`);
  let url: URL;
  try {
    url = new URL(params.realm);
  } catch {
    throw new RegistryError(`the registry's token realm ${showValue(params.realm)} is not a URL`);
  }
  if (url.protocol !== 'https:')
    throw new RegistryError(`the registry's token realm ${showValue(params.realm)} is not an https URL`);
  if (params.service) url.searchParams.set('service', params.service);
  url.searchParams.set('scope', params.scope ?? `repository:${registry.repository}:pull`);
  const withheld =
    basic !== undefined && !tokenHostAllowed(url.hostname, registry.host, registry.tokenHosts)
      ? `the login of pull secret "${login!.secret}" was not sent to the token service on ${url.hostname}: ` +
        `it is not the registry's host, a well-known registry's token host or one REGISTRY_TOKEN_HOSTS names`
      : undefined;
  const sent: Record<string, string> = withheld === undefined && basic !== undefined ? { Authorization: basic } : {};
  const answer = await registryRequest(url, 'GET', sent, registry.ca);
  const also = withheld === undefined ? '' : ` to an anonymous request (${withheld})`;
  if (answer.status !== 200)
    throw new RegistryError(`the registry's token service ${url.host} answered ${answer.status}${also}`, answer.status);
  let token: unknown;
  try {
    const parsed = JSON.parse(answer.body) as Record<string, unknown>;
    token = parsed.token ?? parsed.access_token;
  } catch {
    /* refused below */
  }
  if (typeof token !== 'string' || token === '')
    throw new RegistryError(`the registry's token service ${url.host} sent no token${also}`);
  return { authorization: `Bearer ${token}`, withheld };
}

/**
 * The digest the registry has for host/repository:tag (HEAD /v2/<repo>/manifests/<tag>), undefined
 * when it has no such tag, and the login used. The login is looked up only when the registry asks
 * for one, so a public image needs no pull secret (and no permission to read one).
 */
export async function resolveManifestTag(
  host: string,
  repository: string,
  tag: string,
  loginFor: () => Promise<RegistryLogin | undefined>,
  ca?: string,
  tokenHosts: readonly string[] = [],
): Promise<{ digest: string | undefined; login: RegistryLogin | undefined }> {
  let login: RegistryLogin | undefined;
  let withheld: string | undefined;
  const url = new URL(`https://${host}/v2/${repository}/manifests/${encodeURIComponent(tag)}`);
  const head = (authorization?: string) =>
    registryRequest(
      url,
      'HEAD',
      { Accept: MANIFEST_TYPES, ...(authorization ? { Authorization: authorization } : {}) },
      ca,
    );
  // A registry that never serves anonymously is not asked without its login: the refusal says what it needs.
  if (cloudLoginNeeds(host)?.anonymous === false) {
    login = await loginFor();
    if (login === undefined) throw registryRefusal(host, `the workload names no pull secret for ${host}`);
  }
  let answer = await head();
  const challenge = answer.headers['www-authenticate'];
  if (answer.status === 401 && typeof challenge === 'string') {
    login ??= await loginFor();
    const asked = await authorizationFor(challenge, login, { host, repository, ca, tokenHosts });
    withheld = asked.withheld;
    answer = await head(asked.authorization);
  }
  if (answer.status === 404) return { digest: undefined, login: withheld ? undefined : login };
  if (answer.status === 401 || answer.status === 403) {
    const how = withheld
      ? `an anonymous token (${withheld})`
      : login
        ? `the login of pull secret "${login.secret}"`
        : 'no login (the workload names no pull secret for it)';
    throw registryRefusal(host, `the registry refused ${how}: ${answer.status}`);
  }
  const digest = answer.headers['docker-content-digest'];
  if (answer.status !== 200 || typeof digest !== 'string')
    throw new RegistryError(
      `the registry answered ${answer.status}${typeof digest === 'string' ? '' : ' without a digest'}`,
      answer.status,
    );
  return { digest, login: withheld ? undefined : login };
}

// ---- reading cosign signatures from the registry (VERIFY_SIGNATURE) -------------------------------

const SIGNATURE_LIMITS = {
  // A signature manifest or a referrers index is a few KiB; a tag signed a thousand times is still
  // under this. Anything larger is not one, and is refused rather than cut.
  maxBodyBytes: 1024 * 1024,
  // A blob may be served from elsewhere (a bucket behind a CDN): a short chain of redirects, no loop.
  maxRedirects: 3,
  // Signature manifests read for one digest, over the .sig tag and the referrers, each digest once; and the
  // layers looked at in each: more is a registry answering with junk, and each one costs requests.
  maxManifests: 20,
  // A simple-signing payload names a digest, a repository and a few annotations: a few hundred bytes. A layer
  // whose payload is larger is not a signature, and is refused without being read past this.
  maxPayloadBytes: 64 * 1024,
  // Payload blobs read for one digest, each digest once, and their bytes together: a digest signed by
  // a handful of keys and pipelines needs a handful.
  maxPayloads: 20,
  maxPayloadTotalBytes: 256 * 1024,
  // Signatures (a payload and its signature) checked for one digest, each pair once: an Ed25519ph check
  // is some milliseconds of the event loop, which is let go between two.
  maxSignatures: 20,
  // The whole check, every request and signature in it: a registry that is this slow is away (the push
  // waits for it under ON_REGISTRY_AWAY=keep) rather than holding a request for each manifest and blob.
  checkTimeoutMs: 30_000,
};

/** The annotation of a cosign signature layer that holds the base64 signature of the layer (its payload). */
const COSIGN_SIGNATURE_ANNOTATION = 'dev.cosignproject.cosign/signature';
/** What cosign adds to a keyless signature: the Fulcio certificate of its one-time key. */
const COSIGN_CERTIFICATE_ANNOTATION = 'dev.sigstore.cosign/certificate';
/** The artifactType of a signature cosign stores as a referrer (--registry-referrers-mode=oci-1-1). */
const COSIGN_SIGNATURE_ARTIFACT = 'application/vnd.dev.cosign.artifact.sig.v1+json';
/** Sigstore bundles (cosign's --new-bundle-format) as referrers: a DSSE envelope, not a simple-signing payload. */
const SIGSTORE_BUNDLE_ARTIFACT = /^application\/vnd\.dev\.sigstore\.bundle/;
const OCI_INDEX = 'application/vnd.oci.image.index.v1+json';
// A registry without the referrers API answers 404 (OCI distribution-spec 1.1); some answer as for a route or
// method they do not know. Either way the referrers tag schema is where such a registry's clients keep them.
const REFERRERS_API_ABSENT = [400, 404, 405, 501];

/** One signature layer: where it was found (for messages), its payload and its annotations. */
interface CosignSignatureLayer {
  where: string;
  payload: Buffer;
  annotations: Record<string, string>;
}

/** The signatures found for a digest: the layers, where the reader looked, and Sigstore bundles it cannot verify. */
export interface CosignSignatures {
  layers: CosignSignatureLayer[];
  looked: string[];
  bundles: string[];
}

/** A repository of a registry, and how to reach it: the CA that signed its certificate, the token hosts allowed. */
interface RegistryRepository {
  host: string;
  repository: string;
  ca: string | undefined;
  tokenHosts: readonly string[];
}

/**
 * Reads one repository of a registry (GET of manifests, blobs and the referrers API): the login is
 * looked up on the first challenge only, and the Authorization it earned is kept for the later requests.
 * Each answer is read whole up to SIGNATURE_LIMITS.maxBodyBytes; a blob is checked against its digest.
 */
class RepositoryReader {
  private authorization: string | undefined;
  private login: RegistryLogin | undefined;
  /** Why the login was not sent to the registry's token service, when it was not (tokenHostAllowed). */
  private withheld: string | undefined;
  private readonly where: string;
  private readonly registry: RegistryRepository;
  private readonly loginFor: () => Promise<RegistryLogin | undefined>;
  /** performance.now() past which no request starts and none goes on (SIGNATURE_LIMITS.checkTimeoutMs). */
  private readonly expiresAt: number;

  constructor(registry: RegistryRepository, loginFor: () => Promise<RegistryLogin | undefined>, expiresAt: number) {
    this.registry = registry;
    this.loginFor = loginFor;
    this.where = `${registry.host}/${registry.repository}`;
    this.expiresAt = expiresAt;
  }

  /** GET /v2/<repository>/<path>; the answer (404 included), after at most one challenge. */
  async get(path: string, accept: string, maxBytes = SIGNATURE_LIMITS.maxBodyBytes): Promise<OutboundAnswer> {
    const url = new URL(`https://${this.registry.host}/v2/${this.registry.repository}/${path}`);
    let answer = await this.follow(url, accept, maxBytes);
    const challenge = answer.headers['www-authenticate'];
    if (answer.status === 401 && typeof challenge === 'string' && this.authorization === undefined) {
      this.login ??= await this.loginFor();
      const asked = await authorizationFor(challenge, this.login, this.registry);
      this.authorization = asked.authorization;
      this.withheld = asked.withheld;
      answer = await this.follow(url, accept, maxBytes);
    }
    if (answer.status === 401 || answer.status === 403) {
      const how = this.withheld
        ? `an anonymous token (${this.withheld})`
        : this.login
          ? `the login of pull secret "${this.login.secret}"`
          : 'no login';
      throw registryRefusal(this.registry.host, `the registry refused ${how} for ${path}: ${answer.status}`);
    }
    return answer;
  }

  /** One GET, following redirects; the Authorization goes to the registry's own host only. */
  private async follow(url: URL, accept: string, maxBytes: number): Promise<OutboundAnswer> {
    for (let hops = 0; ; hops++) {
      const own = url.host === this.registry.host;
      const headers: Record<string, string> = { Accept: accept };
      if (own && this.authorization) headers.Authorization = this.authorization;
      const deadlineMs = this.deadlineMs();
      const answer = await outboundRequest(url, {
        method: 'GET',
        headers,
        deadlineMs,
        maxResponseBytes: maxBytes,
        overLimit: 'fail',
        trust: { extraCa: this.registry.ca },
      }).catch((e: unknown) => {
        // A request given what was left of the check, and out of it: the check is.
        const cut = deadlineMs < VERIFY_LIMITS.requestTimeoutMs && e instanceof OutboundError && e.code === 'ETIMEDOUT';
        throw cut ? signatureCheckTimeout() : e;
      });
      const location = answer.headers.location;
      if (answer.status < 300 || answer.status > 399 || typeof location !== 'string') return answer;
      if (hops >= SIGNATURE_LIMITS.maxRedirects)
        throw new RegistryError(
          `${this.where}: more than ${SIGNATURE_LIMITS.maxRedirects} redirects for ${url.pathname}`,
        );
      url = new URL(location, url);
      if (url.protocol !== 'https:') throw new RegistryError(`${this.where}: a redirect to ${url.protocol} for a blob`);
    }
  }

  /** What is left of the check's time for one more request, at most a request's own; throws when none is. */
  private deadlineMs(): number {
    const left = Math.floor(this.expiresAt - performance.now());
    if (left <= 0) throw signatureCheckTimeout();
    return Math.min(VERIFY_LIMITS.requestTimeoutMs, left);
  }

  /**
   * A manifest by tag or digest (a digest is checked against the bytes) and the digest of its bytes, or undefined
   * when the registry has none.
   */
  async manifest(
    reference: string,
    accept = MANIFEST_TYPES,
  ): Promise<{ json: Record<string, unknown>; digest: string } | undefined> {
    const answer = await this.get(`manifests/${encodeURIComponent(reference)}`, accept);
    if (answer.status === 404) return undefined;
    if (answer.status !== 200)
      throw new RegistryError(
        `${this.where}: manifest ${reference}: the registry answered ${answer.status}`,
        answer.status,
      );
    const digest = `sha256:${createHash('sha256').update(answer.bytes!).digest('hex')}`;
    if (reference.startsWith('sha256:')) this.checkDigest(answer.bytes!, reference, `manifest ${reference}`);
    return { json: this.json(answer.bytes!, `manifest ${reference}`), digest };
  }

  /** A blob of at most `maxBytes` (more fails the GET: OutboundError E2BIG), checked against its digest. */
  async blob(digest: string, maxBytes: number): Promise<Buffer> {
    const answer = await this.get(`blobs/${digest}`, '*/*', maxBytes);
    if (answer.status !== 200)
      throw new RegistryError(`${this.where}: blob ${digest}: the registry answered ${answer.status}`, answer.status);
    this.checkDigest(answer.bytes!, digest, `blob ${digest}`);
    return answer.bytes!;
  }

  /**
   * The referrers of a digest: the OCI 1.1 referrers API, or where the registry has none (REFERRERS_API_ABSENT),
   * the referrers tag schema's index at tag sha256-<hex>. Returns the descriptors and where they were read.
   */
  async referrers(digest: string): Promise<{ from: string; descriptors: unknown[] }> {
    const answer = await this.get(`referrers/${digest}`, OCI_INDEX);
    if (answer.status === 200)
      return {
        from: 'the referrers API',
        descriptors: asList(this.json(answer.bytes!, `the referrers of ${digest}`).manifests),
      };
    if (!REFERRERS_API_ABSENT.includes(answer.status))
      throw new RegistryError(
        `${this.where}: the referrers of ${digest}: the registry answered ${answer.status}`,
        answer.status,
      );
    const tag = digest.replace(':', '-');
    const index = await this.manifest(tag, OCI_INDEX);
    return { from: `the referrers tag ${tag}`, descriptors: asList(index?.json.manifests) };
  }

  private checkDigest(bytes: Buffer, digest: string, what: string): void {
    const actual = `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
    if (actual !== digest)
      throw new RegistryError(`${this.where}: ${what} does not match its digest (it is ${actual})`);
  }

  private json(bytes: Buffer, what: string): Record<string, unknown> {
    try {
      const parsed: unknown = JSON.parse(bytes.toString('utf8'));
      if (isObject(parsed)) return parsed;
    } catch {
      /* refused below */
    }
    throw new RegistryError(`${this.where}: ${what} is not a JSON object`);
  }
}

function asList(value: unknown): unknown[] {
  return Array.isArray(value) ? value : [];
}

/** The string annotations of a descriptor or manifest. */
function annotationsOf(value: unknown): Record<string, string> {
  const a = isObject(value) && isObject(value.annotations) ? value.annotations : {};
  return Object.fromEntries(Object.entries(a).filter((e): e is [string, string] => typeof e[1] === 'string'));
}

/** The check ran out of SIGNATURE_LIMITS.checkTimeoutMs: as a request that got no answer, the registry is away. */
function signatureCheckTimeout(): OutboundError {
  const limit = formatGoDuration(SIGNATURE_LIMITS.checkTimeoutMs);
  return new OutboundError(`the registry did not give the signatures within ${limit}`, 'ETIMEDOUT');
}

/** A signature's verdict: the key it is valid under and where it was found, or why no signature is. */
export type SignatureVerdict = { ok: true; key: CosignKey; where: string } | { ok: false; problem: string };

/**
 * Looks for a valid cosign signature of `want.digest` in host/repository, where cosign stores them: the layers of
 * the manifest at tag sha256-<hex>.sig, then of each referrer whose artifactType is a cosign signature (OCI 1.1
 * referrers API, else the referrers tag schema); Sigstore bundles among the referrers are named, not read. Each
 * manifest and payload blob is read once (by digest), each signature checked once as it arrives, and the search
 * stops at the first valid one, within SIGNATURE_LIMITS (payload size, count and bytes, signatures, one deadline
 * for the whole check, which when passed is an OutboundError ETIMEDOUT: registryAway). Throws a RegistryError when
 * the registry refuses or answers with something else.
 */
export async function readCosignSignatures(
  registry: RegistryRepository,
  want: SignatureExpectation,
  loginFor: () => Promise<RegistryLogin | undefined>,
): Promise<SignatureVerdict> {
  if (!/^sha256:[0-9a-f]{64}$/.test(want.digest))
    throw new RegistryError(`${showValue(want.digest)} is not a sha256 digest`);
  const expiresAt = performance.now() + SIGNATURE_LIMITS.checkTimeoutMs;
  const search = new SignatureSearch(new RepositoryReader(registry, loginFor, expiresAt), want);
  return withDeadline(search.run(), SIGNATURE_LIMITS.checkTimeoutMs, signatureCheckTimeout).finally(() =>
    search.stop(),
  );
}

/** One search for a valid signature: what was read and checked so far, so nothing is read or checked twice. */
class SignatureSearch {
  private readonly reader: RepositoryReader;
  private readonly want: SignatureExpectation;
  private readonly found: Omit<CosignSignatures, 'layers'> = { looked: [], bundles: [] };
  private readonly problems: string[] = [];
  private readonly manifests = new Set<string>();
  /** Payloads read, by blob digest (at most maxPayloadTotalBytes in all), or why one was not. */
  private readonly payloads = new Map<string, Buffer | string>();
  private payloadBytes = 0;
  /** Signatures checked: the payload's digest and the signature. */
  private readonly checked = new Set<string>();
  /** Why the search stopped short of every layer listed, when it did. */
  private cut: string | undefined;
  private stopped = false;

  constructor(reader: RepositoryReader, want: SignatureExpectation) {
    this.reader = reader;
    this.want = want;
  }

  /** The deadline passed: nothing more is read or checked. */
  stop(): void {
    this.stopped = true;
  }

  async run(): Promise<SignatureVerdict> {
    const tag = `${this.want.digest.replace(':', '-')}.sig`;
    this.found.looked.push(`tag ${tag}`);
    const sig = await this.reader.manifest(tag);
    const atTag = sig && (await this.manifest(sig, `tag ${tag}`));
    if (atTag) return atTag;
    const referrers = await this.reader.referrers(this.want.digest);
    this.found.looked.push(referrers.from);
    for (const d of referrers.descriptors)
      if (isObject(d) && typeof d.artifactType === 'string' && SIGSTORE_BUNDLE_ARTIFACT.test(d.artifactType))
        this.found.bundles.push(String(d.digest));
    for (const d of referrers.descriptors) {
      if (this.cut !== undefined || this.stopped) break;
      if (!isObject(d) || d.artifactType !== COSIGN_SIGNATURE_ARTIFACT) continue;
      const ref = typeof d.digest === 'string' ? d.digest : '';
      if (!/^sha256:[0-9a-f]{64}$/.test(ref) || this.manifests.has(ref)) continue;
      if (this.manifests.size >= SIGNATURE_LIMITS.maxManifests) {
        this.cut ??= `more than ${SIGNATURE_LIMITS.maxManifests} signature manifests: the rest were not read`;
        break;
      }
      const referrer = await this.reader.manifest(ref);
      const atReferrer = referrer && (await this.manifest(referrer, `referrer ${ref}`));
      if (atReferrer) return atReferrer;
    }
    if (this.cut) this.problems.push(this.cut);
    return noValidSignature(this.problems, { layers: [], ...this.found });
  }

  /** The signature layers of one manifest, each checked as it is read: the first valid one, else undefined. */
  private async manifest(
    read: { json: Record<string, unknown>; digest: string },
    where: string,
  ): Promise<SignatureVerdict | undefined> {
    if (this.manifests.has(read.digest)) return undefined;
    this.manifests.add(read.digest);
    for (const [i, layer] of asList(read.json.layers).slice(0, SIGNATURE_LIMITS.maxManifests).entries()) {
      const annotations = annotationsOf(layer);
      const signature = annotations[COSIGN_SIGNATURE_ANNOTATION];
      if (signature === undefined || !isObject(layer)) continue;
      if (typeof layer.digest !== 'string' || !/^sha256:[0-9a-f]{64}$/.test(layer.digest)) continue;
      if (this.checked.has(`${layer.digest} ${signature}`)) continue;
      if (this.stopped || this.cut) return undefined;
      if (this.checked.size >= SIGNATURE_LIMITS.maxSignatures) {
        this.cut = `more than ${SIGNATURE_LIMITS.maxSignatures} signatures: the rest were not checked`;
        return undefined;
      }
      this.checked.add(`${layer.digest} ${signature}`);
      const payload = await this.payload(layer.digest, layer.size);
      const at = `${where}, layer ${i + 1}`;
      const verdict =
        typeof payload === 'string' ? payload : signatureProblem({ where: at, payload, annotations }, this.want);
      if (typeof verdict !== 'string') return { ok: true, key: verdict, where: at };
      this.problems.push(`${at}: ${verdict}`);
      // A check holds the event loop; the requests and pushes waiting for it go first.
      await new Promise((resolve) => setImmediate(resolve));
    }
    return undefined;
  }

  /** A layer's payload, read once per digest within the limits, or why it is not read. */
  private async payload(digest: string, declared: unknown): Promise<Buffer | string> {
    const kept = this.payloads.get(digest);
    if (kept !== undefined) return kept;
    const { maxPayloadBytes: max, maxPayloads, maxPayloadTotalBytes: maxTotal } = SIGNATURE_LIMITS;
    let payload: Buffer | string;
    if (typeof declared === 'number' && declared > max)
      payload = `its payload is ${declared} bytes, more than a signing payload's ${max}: not read`;
    else if (this.payloads.size >= maxPayloads || this.payloadBytes >= maxTotal)
      payload = `not read: one digest's signatures get at most ${maxPayloads} payloads and ${maxTotal} bytes`;
    else
      try {
        payload = await this.reader.blob(digest, max);
        this.payloadBytes += payload.length;
      } catch (e) {
        if (!(e instanceof OutboundError && e.code === 'E2BIG')) throw e;
        payload = `its payload is larger than a signing payload's ${max} bytes: refused`;
      }
    this.payloads.set(digest, payload);
    return payload;
  }
}

// ---- verifying cosign signatures (pure) -------------------------------------------------------------

/** The payload type of cosign's simple-signing format (containers/image "atomic" signatures). */
const COSIGN_PAYLOAD_TYPE = 'cosign container image signature';
// Shorter RSA keys are breakable; cosign itself refuses to make them.
const MIN_RSA_BITS = 2048;

/** A public key a hook trusts: the key, its fingerprint (sha256 of its SubjectPublicKeyInfo DER) and its kind. */
export interface CosignKey {
  key: KeyObject;
  fingerprint: string;
  kind: string;
}

/** What a signature must say besides being valid: the digest, the repository and the annotations required. */
interface SignatureExpectation {
  digest: string;
  /** host/path, as cosign writes critical.identity.docker-reference. */
  repository: string;
  keys: readonly CosignKey[];
  annotations: Readonly<Record<string, string>>;
}

/**
 * The public keys in PEM text (one or more PUBLIC KEY blocks, as `cosign generate-key-pair` writes
 * cosign.pub): ECDSA P-256, Ed25519, or RSA of at least MIN_RSA_BITS. Throws, naming `where`, the
 * block and its line, on anything else (a private key, a certificate, another curve). Pure.
 */
export function parseCosignKeys(pem: string, where: string): CosignKey[] {
  const blocks = [...pem.matchAll(/-----BEGIN ([A-Z0-9 ]+)-----[\s\S]*?-----END \1-----/g)];
  if (blocks.length === 0) throw new Error(`${where}: no PEM public key (-----BEGIN PUBLIC KEY-----)`);
  return blocks.map((m, i) => {
    const at = `${where}: PEM block ${i + 1} (line ${pem.slice(0, m.index).split('\n').length})`;
    if (m[1] !== 'PUBLIC KEY')
      throw new Error(`${at} is ${m[1]}, not PUBLIC KEY (give the public key, e.g. cosign.pub, never the private)`);
    let key: KeyObject;
    try {
      key = createPublicKey(m[0]);
    } catch (e) {
      throw new Error(`${at} is not a public key: ${(e as Error).message}`);
    }
    const kind = keyKind(key);
    if (typeof kind !== 'string') throw new Error(`${at}: ${kind.problem}`);
    const der = key.export({ type: 'spki', format: 'der' });
    return { key, kind, fingerprint: `sha256:${createHash('sha256').update(der).digest('hex')}` };
  });
}

/** ECDSA P-256, Ed25519 or RSA (≥ MIN_RSA_BITS), as cosign signs with them; else what is wrong. Pure. */
function keyKind(key: KeyObject): string | { problem: string } {
  const d = key.asymmetricKeyDetails ?? {};
  if (key.asymmetricKeyType === 'ec' && d.namedCurve === 'prime256v1') return 'ECDSA P-256';
  if (key.asymmetricKeyType === 'ed25519') return 'Ed25519';
  if (key.asymmetricKeyType === 'rsa' && (d.modulusLength ?? 0) >= MIN_RSA_BITS) return `RSA ${d.modulusLength}`;
  if (key.asymmetricKeyType === 'rsa')
    return { problem: `an RSA key of ${d.modulusLength} bits (at least ${MIN_RSA_BITS})` };
  const what = key.asymmetricKeyType === 'ec' ? `an EC key on ${d.namedCurve}` : `a ${key.asymmetricKeyType} key`;
  return { problem: `${what}; cosign keys are ECDSA P-256, Ed25519 or RSA` };
}

// ---- Ed25519ph (RFC 8032 §5.1), which cosign signs with Ed25519 keys and node:crypto does not offer ----

/** The curve's constants, as RFC 8032 §5.1 gives them: the field prime, d, sqrt(-1), the group order L. */
const ED25519 = (() => {
  const p = 2n ** 255n - 19n;
  const pow = (b: bigint, e: bigint): bigint => {
    let r = 1n;
    for (b %= p; e > 0n; e >>= 1n, b = (b * b) % p) if (e & 1n) r = (r * b) % p;
    return r;
  };
  const inv = (a: bigint) => pow(a, p - 2n);
  return {
    p,
    pow,
    d: (((-121665n * inv(121666n)) % p) + p) % p,
    sqrtM1: pow(2n, (p - 1n) / 4n),
    L: 2n ** 252n + 27742317777372353535851937790883648493n,
    baseY: (4n * inv(5n)) % p,
  };
})();

/** A point in extended coordinates (X:Y:Z:T), x = X/Z, y = Y/Z, xy = T/Z. */
type EdPoint = [bigint, bigint, bigint, bigint];

const edMod = (a: bigint) => ((a % ED25519.p) + ED25519.p) % ED25519.p;

/** Point addition (RFC 8032 §5.1.4); complete, so it doubles too. Pure. */
function edAdd([x1, y1, z1, t1]: EdPoint, [x2, y2, z2, t2]: EdPoint): EdPoint {
  const a = edMod((y1 - x1) * (y2 - x2));
  const b = edMod((y1 + x1) * (y2 + x2));
  const c = edMod(t1 * 2n * ED25519.d * t2);
  const d = edMod(z1 * 2n * z2);
  const [e, f, g, h] = [b - a, d - c, d + c, b + a];
  return [edMod(e * f), edMod(g * h), edMod(f * g), edMod(e * h)];
}

function edMultiply(point: EdPoint, scalar: bigint): EdPoint {
  let result: EdPoint = [0n, 1n, 1n, 0n];
  for (let q = point; scalar > 0n; scalar >>= 1n, q = edAdd(q, q)) if (scalar & 1n) result = edAdd(result, q);
  return result;
}

/** The point a 32-byte encoding names (RFC 8032 §5.1.3), or undefined when it names none. Pure. */
function edDecode(bytes: Buffer): EdPoint | undefined {
  const { p, pow, d, sqrtM1 } = ED25519;
  const n = BigInt(`0x${Buffer.from(bytes).reverse().toString('hex')}`);
  const y = n & ((1n << 255n) - 1n);
  const sign = n >> 255n;
  if (y >= p) return undefined;
  const u = edMod(y * y - 1n);
  const v = edMod(d * y * y + 1n);
  let x = edMod(u * pow(v, 3n) * pow(u * pow(v, 7n), (p - 5n) / 8n));
  if (edMod(v * x * x) === edMod(-u)) x = edMod(x * sqrtM1);
  else if (edMod(v * x * x) !== u) return undefined;
  if (x === 0n && sign === 1n) return undefined;
  if ((x & 1n) !== sign) x = p - x;
  return [x, y, 1n, edMod(x * y)];
}

/**
 * Whether `signature` is an Ed25519ph signature (empty context) of `message` under the raw 32-byte
 * public key: [S]B = R + [k]A, k = SHA-512(dom2(1, "") || R || A || SHA-512(message)) mod L. Pure.
 */
export function verifyEd25519ph(publicKey: Buffer, message: Buffer, signature: Buffer): boolean {
  if (publicKey.length !== 32 || signature.length !== 64) return false;
  const a = edDecode(publicKey);
  const r = edDecode(signature.subarray(0, 32));
  const s = BigInt(`0x${Buffer.from(signature.subarray(32)).reverse().toString('hex')}`);
  const base = edDecode(Buffer.from(ED25519.baseY.toString(16).padStart(64, '0'), 'hex').reverse());
  if (!a || !r || !base || s >= ED25519.L) return false;
  const dom2 = Buffer.concat([Buffer.from('SigEd25519 no Ed25519 collisions'), Buffer.from([1, 0])]);
  const prehash = createHash('sha512').update(message).digest();
  const h = createHash('sha512').update(Buffer.concat([dom2, signature.subarray(0, 32), publicKey, prehash])).digest();
  const k = BigInt(`0x${Buffer.from(h).reverse().toString('hex')}`) % ED25519.L;
  const [x1, y1, z1] = edMultiply(base, s);
  const [x2, y2, z2] = edAdd(r, edMultiply(a, k));
  return edMod(x1 * z2 - x2 * z1) === 0n && edMod(y1 * z2 - y2 * z1) === 0n;
}

/** Whether `signature` is `key`'s over `payload`: ECDSA and RSA (PKCS#1 v1.5, else PSS) over SHA-256, Ed25519(ph). */
function signedBy(k: CosignKey, payload: Buffer, signature: Buffer): boolean {
  try {
    if (k.kind === 'Ed25519') {
      // cosign signs with an Ed25519 key as Ed25519ph; a pure Ed25519 signature is taken too.
      const raw = Buffer.from(k.key.export({ format: 'jwk' }).x ?? '', 'base64url');
      return verifyEd25519ph(raw, payload, signature) || cryptoVerify(null, payload, k.key, signature);
    }
    if (cryptoVerify('sha256', payload, k.key, signature)) return true;
    return (
      k.kind.startsWith('RSA') &&
      cryptoVerify('sha256', payload, { key: k.key, padding: cryptoConstants.RSA_PKCS1_PSS_PADDING }, signature)
    );
  } catch {
    return false;
  }
}

/** Hosts that all name Docker Hub in an image reference. */
const DOCKER_HUB_HOSTS = new Set(['docker.io', 'index.docker.io', 'registry-1.docker.io']);

/** host/path with Docker Hub's host and `library/` spelled one way, for comparing repositories. Pure. */
function canonicalRepository(reference: string): string {
  const slash = reference.indexOf('/');
  const host = reference.slice(0, slash).toLowerCase();
  if (!DOCKER_HUB_HOSTS.has(host)) return `${host}${reference.slice(slash)}`;
  const path = reference.slice(slash + 1);
  return `docker.io/${path.includes('/') ? path : `library/${path}`}`;
}

/** What is wrong with one signature layer, or the key it is valid under when it says what is expected. Pure. */
function signatureProblem(layer: CosignSignatureLayer, want: SignatureExpectation): string | CosignKey {
  const encoded = layer.annotations[COSIGN_SIGNATURE_ANNOTATION] ?? '';
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(encoded)) return 'its signature annotation is not base64';
  const key = want.keys.find((k) => signedBy(k, layer.payload, Buffer.from(encoded, 'base64')));
  if (!key) {
    if (layer.annotations[COSIGN_CERTIFICATE_ANNOTATION] !== undefined)
      return (
        'signed keyless (a Fulcio certificate, no key): checking it needs Fulcio and Rekor online; a key is needed ' +
        'offline (cosign sign --key)'
      );
    return `not signed by a key VERIFY_SIGNATURE names (${want.keys.map((k) => k.fingerprint).join(', ')})`;
  }
  let payload: unknown;
  try {
    payload = JSON.parse(layer.payload.toString('utf8'));
  } catch {
    return `signed by ${key.fingerprint}, but its payload is not JSON`;
  }
  const critical = isObject(payload) && isObject(payload.critical) ? payload.critical : {};
  const digest = isObject(critical.image) ? critical.image['docker-manifest-digest'] : undefined;
  const reference = isObject(critical.identity) ? critical.identity['docker-reference'] : undefined;
  const shown = (v: unknown) => showValue(typeof v === 'string' ? v : JSON.stringify(v ?? null));
  const by = `signed by ${key.fingerprint}`;
  if (critical.type !== COSIGN_PAYLOAD_TYPE)
    return `${by}, but its payload is not a ${JSON.stringify(COSIGN_PAYLOAD_TYPE)}`;
  if (digest !== want.digest)
    return `${by}, but for ${shown(digest)}, not this digest (a signature copied from another image)`;
  if (typeof reference !== 'string' || canonicalRepository(reference) !== canonicalRepository(want.repository))
    return `${by}, but for the repository ${shown(reference)}, not ${want.repository}`;
  const optional = isObject(payload) && isObject(payload.optional) ? payload.optional : {};
  for (const [name, value] of Object.entries(want.annotations)) {
    const has = optional[name];
    if (has === undefined) return `${by}, but without the annotation ${name}=${value}`;
    // cosign writes each annotation as a string: 1, true or ["release"] is another value, not the one required.
    if (typeof has !== 'string')
      return `${by}, but with the annotation ${name}=${showValue(JSON.stringify(has))} (not a string), not ${value}`;
    if (has !== value) return `${by}, but with the annotation ${name}=${showValue(has)}, not ${value}`;
  }
  return key;
}

/**
 * The cosign verdict on a digest's signatures: the first layer that is valid under one of the keys,
 * names the digest and the repository and carries the annotations required; else why none is, one
 * reason per layer (or that there is none). Pure.
 */
export function verifyCosignSignatures(found: CosignSignatures, want: SignatureExpectation): SignatureVerdict {
  const problems: string[] = [];
  for (const layer of found.layers) {
    const verdict = signatureProblem(layer, want);
    if (typeof verdict !== 'string') return { ok: true, key: verdict, where: layer.where };
    problems.push(`${layer.where}: ${verdict}`);
  }
  return noValidSignature(problems, found);
}

/** The verdict when no layer is valid: each layer's problem, each bundle, or that there is none. Pure. */
function noValidSignature(problems: string[], found: CosignSignatures): { ok: false; problem: string } {
  for (const bundle of found.bundles)
    problems.push(
      `referrer ${bundle}: a Sigstore bundle, not a simple-signing signature (sign with --new-bundle-format=false)`,
    );
  if (problems.length === 0)
    return { ok: false, problem: `no cosign signature (looked at ${found.looked.join(' and ')})` };
  return { ok: false, problem: problems.join('; ') };
}
// ================================================================================================
// 12. html — what the admin pages share: escaping, one cell of a table, and the page shell and style
//    (server-rendered, no script, no external asset, one card per row on a phone).
//    Exports: cell, escapeHtml, pageShell, shownTime.
//    Tests: test/deliveries.test.ts.
// ================================================================================================

// ---- pages ------------------------------------------------------------------------------------

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);
}

/** 2026-11-23 13:05:09 UTC */
function shownTime(d: Date | undefined): string {
  return d ? `${d.toISOString().slice(0, 19).replace('T', ' ')} UTC` : '';
}

/** One cell: its label shown before it on a phone, where the table becomes one card per push. */
function cell(label: string, html: string, className = ''): string {
  return `<td data-label="${label}"${className ? ` class="${className}"` : ''}>${html}</td>`;
}

const PAGE_STYLE = [
  'body{font:15px/1.4 system-ui,sans-serif;margin:0;padding:12px;color:#1b1f23;background:#f6f8fa}',
  'h1{font-size:20px;margin:0 0 4px}p.meta{margin:0 0 12px;color:#57606a}a{color:#0550ae}',
  'table{border-collapse:collapse;width:100%;background:#fff}th,td{padding:6px 8px;border-bottom:1px solid #d0d7de;',
  'text-align:left;vertical-align:top}th{background:#eaeef2;font-weight:600}',
  'code{font-size:13px;overflow-wrap:anywhere}',
  'td.image{min-width:24em}td.time{white-space:nowrap}',
  '.tag{display:inline-block;padding:1px 6px;border-radius:10px;font-size:13px;font-weight:600}',
  '.ok .tag{background:#dafbe1;color:#116329}.failed .tag{background:#ffebe9;color:#a40e26}',
  '.running .tag{background:#fff8c5;color:#7d4e00}.quiet .tag{background:#eaeef2;color:#424a53}',
  'tr.failed td:first-child{border-left:4px solid #cf222e}tr.ok td:first-child{border-left:4px solid #1a7f37}',
  'tr.running td:first-child{border-left:4px solid #bf8700}pre{white-space:pre-wrap;word-break:break-all;',
  'background:#fff;padding:8px;border:1px solid #d0d7de}.muted{color:#57606a}',
  '@media (max-width:760px){thead{display:none}table,tbody,tr,td{display:block;width:auto}',
  'tr{margin:0 0 10px;border:1px solid #d0d7de}td{border:0;padding:3px 8px}td.image{min-width:0}',
  'td::before{content:attr(data-label);display:block;font-size:12px;color:#57606a}}',
].join('');

/** A whole page; `refreshSeconds` makes the browser load it again after that long. */
function pageShell(title: string, refreshSeconds: number | undefined, body: string): string {
  return [
    '<!doctype html>',
    '<html lang="en"><head><meta charset="utf-8">',
    '<meta name="viewport" content="width=device-width, initial-scale=1">',
    ...(refreshSeconds ? [`<meta http-equiv="refresh" content="${refreshSeconds}">`] : []),
    `<title>${escapeHtml(title)}</title><style>${PAGE_STYLE}</style></head>`,
    `<body>${body}</body></html>`,
    '',
  ].join('\n');
}


// ################################################################################################
// Part II — the service, in the order a push travels: from the command line to the answer, the upgrade, its
// rollout and its result.
// ################################################################################################

// ================================================================================================
// 13. command line & settings — the adnanh/webhook command line in Go `flag` syntax (parseCommandLine, usage), Go's
//    durations and booleans, and our safety limits (LIMITS), each with why it has that value.
//    Exports: LIMITS, Options, parseCommandLine, parseGoBool, parseGoDuration, parseListenAddress, PLACEHOLDER,
//    readAdminTokenFile, readApprovalKeyFile, usage, UsageError.
//    Tests: test/runner.test.ts, test/unit.test.ts.
// ================================================================================================

export interface Options {
  hooks: string[];
  template: boolean;
  hotreload: boolean;
  ip: string;
  port: number;
  urlprefix: string;
  headers: [string, string][];
  httpMethods: string[];
  verbose: boolean;
  debug: boolean;
  nopanic: boolean;
  secure: boolean;
  cert: string;
  key: string;
  tlsMinVersion: string;
  cipherSuites: string;
  listCipherSuites: boolean;
  xRequestId: boolean;
  xRequestIdLimit: number;
  pidfile: string;
  logfile: string;
  maxMultipartMem: number;
  setuid: number;
  setgid: number;
  socket: string;
  version: boolean;
  validate: boolean;
  /** -validate also asks each hook's cluster whether it answers and allows the upgrade. */
  checkClusters: boolean;
  maxBodyBytes: number;
  readHeaderTimeoutMs: number;
  readTimeoutMs: number;
  bodyIdleTimeoutMs: number;
  /** Request body bytes held in memory at once, across all requests. */
  maxBodyMemoryBytes: number;
  /** How long a request waits, unread, for room under maxBodyMemoryBytes before its 503. */
  bodyQueueTimeoutMs: number;
  /** Connections open at once on the hook port; more are closed as they arrive. */
  maxConnections: number;
  commandTimeoutMs: number;
  maxConcurrentCommands: number;
  shutdownGraceMs: number;
  /** On SIGTERM, how long /healthz says "not ready" while hooks are still served. */
  shutdownDelayMs: number;
  /** How long a push the API server did not answer is kept and tried again. */
  applyDeadlineMs: number;
  kubeconfig: string;
  rolloutFollowMs: number;
  /** host:port of the listener serving /metrics; '' serves none. */
  metricsListen: string;
  maxMailsPerHook: number;
  mailWindowMs: number;
  /** Pushes the deliveries page keeps; 0 serves no page. */
  deliveries: number;
  /** What the deliveries pages ask for (HTTP Basic password or Bearer token); '' asks for nothing. */
  adminToken: string;
  /** A file holding the admin token (read at start: readAdminTokenFile), so it is on no command line. */
  adminTokenFile: string;
  /** The service's external address, which approval links point at ('' : no links). */
  publicUrl: string;
  /** A file holding the key that signs approval links (a Secret, the same on every replica). */
  approvalKeyFile: string;
  /** The key read from -approval-key-file at start (readApprovalKeyFile). */
  approvalKey?: Buffer;
  maxNotificationsPerHook: number;
  notifyWindowMs: number;
  printRbac: boolean;
  /** `<namespace>/<name>` of the ServiceAccount -print-rbac binds. */
  rbacServiceAccount: string;
}

type FlagKind = 'bool' | 'string' | 'list' | 'int' | 'duration' | 'bytes';
interface FlagSpec {
  kind: FlagKind;
  key: keyof Options;
  help: string;
  def: string;
}

// Defaults for the limits adnanh lacks. Each is a flag; the comment says why this value.
export const LIMITS = {
  // Registry payloads are a few KiB; Docker Hub's carries the repository's README, which Docker
  // Hub caps at 25,000 characters: 300 KiB even were every one a \uXXXX surrogate pair, a few
  // tens of KiB in practice. 1 MiB fits it with room to spare, and bounds what a request can cost.
  maxBodyBytes: 1024 * 1024,
  // Slowloris protection: a client gets this long to send its headers, and then the whole request.
  readHeaderTimeoutMs: 10_000,
  readTimeoutMs: 60_000,
  // A body that stops arriving holds a connection (and whatever was received) for nothing. A
  // registry sends its payload in one go; 30 s without a byte is a stalled or hostile client.
  bodyIdleTimeoutMs: 30_000,
  // Request bodies held in memory at once, process-wide, from the first byte read until their
  // request (and its command) is done. A kept body costs many times its size on its way (its text,
  // the parsed payload, the command's argument, the upgrade's own reading of it: ~15× for a 1 MiB
  // payload through the upgrade), so 8 MiB keeps a burst of the largest pushes well under the
  // manifests' 256 Mi limit, while registry payloads of a few KiB fit by the thousand.
  maxBodyMemoryBytes: 8 * 1024 * 1024,
  // A request whose body does not fit waits, unread (its client held by TCP), this long for room
  // before 503 with Retry-After: a burst of large pushes is served in turn, and a registry that
  // gives up after 10 s (GitHub) still gets an answer.
  bodyQueueTimeoutMs: 5_000,
  // Each connection is a file descriptor. Idle connections cost little (8,000 are served), yet a
  // flood of slow clients must not use up the descriptors commands, outbound calls and hook
  // files need: connections past this many are closed as they arrive.
  maxConnections: 10_000,
  // An upgrade with rollout tracking takes minutes at most; a command still running after
  // 10 minutes is stuck, and it holds one of the command slots.
  commandTimeoutMs: 10 * 60_000,
  // Each command is a process (or an in-process upgrade); 16 at once covers bursts from a
  // registry pushing many tags while capping fork storms.
  maxConcurrentCommands: 16,
  // A connection closed while its client may still be sending a body (an answer that did not need
  // it) stays open this long at most, so that the client reads the answer before the reset that
  // closing on unread input causes. The answer is sent first, so an event-driven client has it
  // within a round trip; Go's server waits 500 ms.
  closeLingerMs: 2_000,
  // Kubernetes gives a pod 30 s between SIGTERM and SIGKILL by default; stay under that.
  shutdownGraceMs: 25_000,
  // A command's combined output is kept in memory for the response and the log; beyond this the
  // rest is dropped with a marker, so a chatty command cannot exhaust memory.
  maxCommandOutputBytes: 1024 * 1024,
  // In-process upgrades waiting for their workload's earlier pushes: each is a small closure, so
  // a generous bound covers any registry's burst while a flood still gets 503.
  maxPendingUpgrades: 256,
  // At shutdown, pending mails get at least this long even when commands used the whole grace.
  minMailFlushMs: 3_000,
  // A form posted to the admin pages is a few hundred bytes: a browser sends it at once.
  adminFormTimeoutMs: 10_000,
  // After the grace period a command gets SIGTERM, then this long before SIGKILL.
  killAfterTermMs: 3_000,
  // Reload debounce: editors and ConfigMap updates produce bursts of events; wait for quiet.
  reloadDebounceMs: 150,
  // Values shorter than this are too likely to be ordinary words to scrub from log lines
  // (the access log redacts compared parameters whatever their length).
  minScrubbedSecretLength: 6,
  // Hook regexes run on V8's linear-time engine outright (compileGoRegex); the program's own
  // patterns fall back to it after this many backtracks, should one ever meet input that makes
  // it backtrack badly.
  regexBacktracksBeforeFallback: 10_000,
  // Result mails one hook sends to the same recipients per window. A person reads a handful of
  // upgrade reports at a time; a burst beyond that (a build pushing many tags, a leaked URL called
  // in a loop) would bury them and use up the SMTP account's sending quota, so the rest of the
  // window's results go out as one summary mail when the window closes.
  maxMailsPerHook: 5,
  mailWindowMs: 10 * 60_000,
  // The deliveries page: the last pushes an operator asks about are today's, a few dozen at most;
  // an upgrade's entry is a few KiB (its report and pod lines), so 200 stay around a MiB (a plain
  // command's output is cut at 64 KiB for the page: 13 MiB at worst).
  deliveries: 200,
  maxDeliveries: 10_000,
  // Chat and JSON notifications one hook sends per window. A chat group reads more than a mailbox
  // (one line per push), yet a build pushing many tags would still bury it, and chat services
  // throttle a robot that posts too often (DingTalk: 20 a minute); the rest are recorded, not sent.
  maxNotificationsPerHook: 20,
  notifyWindowMs: 10 * 60_000,
};

const FLAGS: Record<string, FlagSpec> = {
  hooks: {
    kind: 'list',
    key: 'hooks',
    def: 'hooks.json',
    help: 'path to a hooks file or a directory of *.json, *.yaml and *.yml hook files (repeatable)',
  },
  template: { kind: 'bool', key: 'template', def: 'false', help: 'parse hooks files as Go text/templates' },
  hotreload: {
    kind: 'bool',
    key: 'hotreload',
    def: 'false',
    help: 'reload hooks when their files or directories change',
  },
  ip: { kind: 'string', key: 'ip', def: '0.0.0.0', help: 'IP address the webhook should serve hooks on' },
  port: { kind: 'int', key: 'port', def: '9000', help: 'port the webhook should serve hooks on' },
  urlprefix: {
    kind: 'string',
    key: 'urlprefix',
    def: 'hooks',
    help: 'url prefix to use for served hooks (protocol://yourserver:port/PREFIX/:hook-id)',
  },
  header: {
    kind: 'list',
    key: 'headers',
    def: '',
    help: 'response header to return, specified in format name=value, use multiple times to set multiple headers',
  },
  'http-methods': {
    kind: 'string',
    key: 'httpMethods',
    def: '',
    help: 'set default allowed HTTP methods (ie. "POST"); separate methods with comma',
  },
  verbose: { kind: 'bool', key: 'verbose', def: 'false', help: 'show verbose output (errors are always logged)' },
  debug: { kind: 'bool', key: 'debug', def: 'false', help: 'show debug output' },
  nopanic: { kind: 'bool', key: 'nopanic', def: 'false', help: 'do not exit if no hooks can be loaded' },
  secure: { kind: 'bool', key: 'secure', def: 'false', help: 'use HTTPS instead of HTTP' },
  cert: { kind: 'string', key: 'cert', def: 'cert.pem', help: 'path to the HTTPS certificate pem file' },
  key: { kind: 'string', key: 'key', def: 'key.pem', help: 'path to the HTTPS certificate private key pem file' },
  'tls-min-version': {
    kind: 'string',
    key: 'tlsMinVersion',
    def: '1.2',
    help: 'minimum TLS version (1.0, 1.1, 1.2, 1.3)',
  },
  'cipher-suites': {
    kind: 'string',
    key: 'cipherSuites',
    def: '',
    help: 'comma-separated list of supported TLS cipher suites',
  },
  'list-cipher-suites': {
    kind: 'bool',
    key: 'listCipherSuites',
    def: 'false',
    help: 'list available TLS cipher suites',
  },
  'x-request-id': {
    kind: 'bool',
    key: 'xRequestId',
    def: 'false',
    help: 'use X-Request-Id header, if present, as request ID',
  },
  'x-request-id-limit': {
    kind: 'int',
    key: 'xRequestIdLimit',
    def: '0',
    help: 'truncate X-Request-Id header to limit; default no limit',
  },
  pidfile: { kind: 'string', key: 'pidfile', def: '', help: 'create PID file at the given path' },
  logfile: {
    kind: 'string',
    key: 'logfile',
    def: '',
    help: 'send log output to a file; implicitly enables verbose logging',
  },
  'max-multipart-mem': {
    kind: 'int',
    key: 'maxMultipartMem',
    def: '1048576',
    help: 'maximum memory in bytes for parsing multipart form data before disk caching',
  },
  setuid: {
    kind: 'int',
    key: 'setuid',
    def: '0',
    help: 'set user ID after opening listening port; must be used with setgid',
  },
  setgid: {
    kind: 'int',
    key: 'setgid',
    def: '0',
    help: 'set group ID after opening listening port; must be used with setuid',
  },
  socket: {
    kind: 'string',
    key: 'socket',
    def: '',
    help: 'path to a Unix socket on which to serve hooks (instead of ip:port)',
  },
  version: { kind: 'bool', key: 'version', def: 'false', help: 'display webhook version and quit' },
  validate: {
    kind: 'bool',
    key: 'validate',
    def: 'false',
    help: 'load and check the hooks as the service would, print what each matches and does, and quit (1: refused)',
  },
  'check-clusters': {
    kind: 'bool',
    key: 'checkClusters',
    def: 'false',
    help: "with -validate: ask each hook's cluster whether it answers and allows get and patch on the workload",
  },
  'max-body-size': {
    kind: 'bytes',
    key: 'maxBodyBytes',
    def: String(LIMITS.maxBodyBytes),
    help: 'largest request body accepted, in bytes (larger → 413)',
  },
  'read-header-timeout': {
    kind: 'duration',
    key: 'readHeaderTimeoutMs',
    def: formatGoDuration(LIMITS.readHeaderTimeoutMs),
    help: 'time a client has to send the request headers',
  },
  'read-timeout': {
    kind: 'duration',
    key: 'readTimeoutMs',
    def: formatGoDuration(LIMITS.readTimeoutMs),
    help: 'time a client has to send the whole request',
  },
  'body-idle-timeout': {
    kind: 'duration',
    key: 'bodyIdleTimeoutMs',
    def: formatGoDuration(LIMITS.bodyIdleTimeoutMs),
    help: 'time a request body may go without data before the connection is dropped (0: no limit)',
  },
  'max-body-memory': {
    kind: 'bytes',
    key: 'maxBodyMemoryBytes',
    def: String(LIMITS.maxBodyMemoryBytes),
    help:
      'request body bytes held in memory at once, all requests together; a request that does not fit waits ' +
      '-body-queue-timeout, then gets 503 with Retry-After (at least -max-body-size)',
  },
  'body-queue-timeout': {
    kind: 'duration',
    key: 'bodyQueueTimeoutMs',
    def: formatGoDuration(LIMITS.bodyQueueTimeoutMs),
    help: 'time a request waits, unread, for room under -max-body-memory before 503',
  },
  'max-connections': {
    kind: 'int',
    key: 'maxConnections',
    def: String(LIMITS.maxConnections),
    help: 'connections open at once on the hook port; more are closed as they arrive (keep below ulimit -n)',
  },
  'command-timeout': {
    kind: 'duration',
    key: 'commandTimeoutMs',
    def: formatGoDuration(LIMITS.commandTimeoutMs),
    help: 'default time a command may run before its process group is killed (hook field "command-timeout" overrides)',
  },
  'max-concurrent-commands': {
    kind: 'int',
    key: 'maxConcurrentCommands',
    def: String(LIMITS.maxConcurrentCommands),
    help: 'commands allowed to run at once; further triggered requests get 503 with Retry-After',
  },
  'shutdown-grace': {
    kind: 'duration',
    key: 'shutdownGraceMs',
    def: formatGoDuration(LIMITS.shutdownGraceMs),
    help: 'on SIGTERM, time running commands get to finish before they are killed',
  },
  'shutdown-delay': {
    kind: 'duration',
    key: 'shutdownDelayMs',
    def: '0s',
    help:
      'on SIGTERM, time /healthz answers 503 (not ready) while hooks are still served, so that a Service ' +
      'stops sending before the listener closes (in Kubernetes: a few seconds)',
  },
  kubeconfig: {
    kind: 'string',
    key: 'kubeconfig',
    def: '',
    help: 'kubeconfig for the upgrade, as kubectl reads it (default: $KUBECONFIG, else the in-cluster service account)',
  },
  'apply-deadline': {
    kind: 'duration',
    key: 'applyDeadlineMs',
    def: '10m0s',
    help:
      'a push the Kubernetes API server does not answer is answered 202, kept (the newest per container) and ' +
      'applied when the API server answers again, for up to this long; then it is reported as failed (0: ' +
      'answered 500 at once)',
  },
  'rollout-follow': {
    kind: 'duration',
    key: 'rolloutFollowMs',
    def: '10m0s',
    help:
      "after answering, how long an upgrade's rollout is followed for the log, an Event and the mail (0: not " +
      'followed)',
  },
  'metrics-listen': {
    kind: 'string',
    key: 'metricsListen',
    def: '',
    help: 'host:port (or :port) serving /metrics, apart from the hook port (default: no metrics)',
  },
  'max-mails-per-hook': {
    kind: 'int',
    key: 'maxMailsPerHook',
    def: String(LIMITS.maxMailsPerHook),
    help: 'result mails one hook sends per -mail-window; the results beyond go out in one summary mail',
  },
  'mail-window': {
    kind: 'duration',
    key: 'mailWindowMs',
    def: formatGoDuration(LIMITS.mailWindowMs),
    help: 'the window -max-mails-per-hook counts in',
  },
  deliveries: {
    kind: 'int',
    key: 'deliveries',
    def: String(LIMITS.deliveries),
    help: 'pushes the deliveries page on the -metrics-listen listener keeps (0: no page)',
  },
  'admin-token': {
    kind: 'string',
    key: 'adminToken',
    def: '',
    help: 'token the deliveries pages ask for, as HTTP Basic password or Bearer token (default: none)',
  },
  'admin-token-file': {
    kind: 'string',
    key: 'adminTokenFile',
    def: '',
    help: 'file holding the -admin-token (e.g. a mounted Secret), so the token is on no command line',
  },
  'public-url': {
    kind: 'string',
    key: 'publicUrl',
    def: '',
    help: 'the address people reach this service at (https://webhook.example.com), which approval links point at',
  },
  'approval-key-file': {
    kind: 'string',
    key: 'approvalKeyFile',
    def: '',
    help: 'file holding the key that signs approval links (a Secret mounted on every replica; at least 32 bytes)',
  },
  'max-notifications-per-hook': {
    kind: 'int',
    key: 'maxNotificationsPerHook',
    def: String(LIMITS.maxNotificationsPerHook),
    help: 'NOTIFY_URL notifications one hook sends per -notify-window; the results beyond are recorded, not sent',
  },
  'notify-window': {
    kind: 'duration',
    key: 'notifyWindowMs',
    def: formatGoDuration(LIMITS.notifyWindowMs),
    help: 'the window -max-notifications-per-hook counts in',
  },
  'print-rbac': {
    kind: 'bool',
    key: 'printRbac',
    def: 'false',
    help: 'print the Roles and RoleBindings the hooks need (get/patch on the workloads they name) as YAML, and quit',
  },
  'rbac-service-account': {
    kind: 'string',
    key: 'rbacServiceAccount',
    def: 'cattle-system/webhook',
    help: 'namespace/name of the ServiceAccount the RoleBindings of -print-rbac bind',
  },
};

export class UsageError extends Error {}

/** Parses a Go duration ("1h2m3.5s", "300ms"); returns milliseconds, or throws. */
export function parseGoDuration(text: string): number {
  const units: Record<string, number> = { ns: 1e-6, us: 1e-3, µs: 1e-3, ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
  if (text === '0') return 0;
  const re = /(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)/y;
  let total = 0;
  let at = 0;
  while (at < text.length) {
    re.lastIndex = at;
    const m = re.exec(text);
    if (!m) throw new UsageError(`invalid duration "${text}" (use e.g. 30s, 5m, 1h30m)`);
    total += Number(m[1]) * units[m[2]];
    at = re.lastIndex;
  }
  if (text.length === 0) throw new UsageError('invalid duration "" (use e.g. 30s, 5m, 1h30m)');
  return total;
}

function defaultOptions(): Options {
  const o = {} as Record<string, unknown>;
  for (const spec of Object.values(FLAGS)) o[spec.key] = spec.kind === 'list' ? [] : convertFlag(spec, spec.def, '');
  return o as unknown as Options;
}

const GO_BOOLS = new Map(
  Object.entries({
    '1': true,
    t: true,
    T: true,
    TRUE: true,
    true: true,
    True: true,
    '0': false,
    f: false,
    F: false,
    FALSE: false,
    false: false,
    False: false,
  }),
);

/** Go's strconv.ParseBool: the spellings Go's flags (and our hook settings) accept; else undefined. */
export function parseGoBool(value: string): boolean | undefined {
  return GO_BOOLS.get(value);
}

function convertFlag(spec: FlagSpec, value: string, name: string): unknown {
  const bad = (what: string) => new UsageError(`invalid value "${value}" for flag -${name}: ${what}`);
  switch (spec.kind) {
    case 'bool': {
      const v = parseGoBool(value);
      if (v === undefined) throw bad('parse error');
      return v;
    }
    case 'int':
    case 'bytes': {
      if (!/^[+-]?\d+$/.test(value)) throw bad('parse error');
      return Number(value);
    }
    case 'duration':
      try {
        return parseGoDuration(value);
      } catch {
        throw bad('parse error');
      }
    case 'string':
      return spec.key === 'httpMethods' ? splitMethods(value) : value;
    case 'list':
      return value;
  }
}

function splitMethods(value: string): string[] {
  return value
    .split(',')
    .map((m) => m.trim().toUpperCase())
    .filter((m) => m !== '');
}

/**
 * Parses arguments the way Go's `flag` package does: `-f`, `--f`, `-f=v`, `-f v` (not for bools),
 * stopping at the first non-flag or `--`. `WEBHOOK_CMD` (the old image's way to add `-template`)
 * is split on whitespace and appended.
 */
export function parseCommandLine(argv: string[], env: Record<string, string | undefined> = {}): Options {
  const args = [...argv, ...(env.WEBHOOK_CMD ?? '').split(/\s+/).filter((a) => a !== '')];
  const opts = defaultOptions() as unknown as Record<string, unknown>;
  const lists: Record<string, string[]> = {};
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    if (arg === '--') break;
    if (arg.length < 2 || arg[0] !== '-') throw new UsageError(`unexpected argument "${arg}" (flags start with -)`);
    const body = arg.startsWith('--') ? arg.slice(2) : arg.slice(1);
    if (body === '' || body[0] === '-' || body[0] === '=') throw new UsageError(`bad flag syntax: ${arg}`);
    const eq = body.indexOf('=');
    const name = eq < 0 ? body : body.slice(0, eq);
    if (name === 'h' || name === 'help') throw new UsageError('');
    const spec = FLAGS[name];
    if (!spec) throw new UsageError(`flag provided but not defined: -${name}`);
    let value: string;
    if (eq >= 0) value = body.slice(eq + 1);
    else if (spec.kind === 'bool') value = 'true';
    else if (i + 1 < args.length) value = args[++i];
    else throw new UsageError(`flag needs an argument: -${name}`);
    const converted = convertFlag(spec, value, name);
    if (spec.kind === 'list') (lists[spec.key] ??= []).push(value);
    else opts[spec.key] = converted;
  }
  const o = opts as unknown as Options;
  o.hooks = lists.hooks ?? ['hooks.json'];
  o.headers = (lists.headers ?? []).map((h) => {
    const eq = h.indexOf('=');
    if (eq <= 0) throw new UsageError(`invalid value "${h}" for flag -header: use name=value`);
    return [h.slice(0, eq), h.slice(eq + 1)];
  });
  if (o.logfile !== '') o.verbose = true;
  if (o.port < 0 || o.port > 65535) throw new UsageError(`invalid value "${o.port}" for flag -port: not a port number`);
  if (o.maxConcurrentCommands < 1)
    throw new UsageError('invalid value for flag -max-concurrent-commands: must be at least 1');
  checkRequestLimits(o);
  if ((o.setuid !== 0) !== (o.setgid !== 0)) throw new UsageError('-setuid and -setgid must be used together');
  if (o.metricsListen !== '') parseListenAddress(o.metricsListen);
  if (o.maxMailsPerHook < 1) throw new UsageError('invalid value for flag -max-mails-per-hook: must be at least 1');
  if (o.deliveries < 0 || o.deliveries > LIMITS.maxDeliveries)
    throw new UsageError(`invalid value for flag -deliveries: must be between 0 and ${LIMITS.maxDeliveries}`);
  if (o.maxNotificationsPerHook < 1)
    throw new UsageError('invalid value for flag -max-notifications-per-hook: must be at least 1');
  if (/[\s\x00-\x1f\x7f]/.test(o.adminToken))
    throw new UsageError('invalid value for flag -admin-token: no spaces or control characters');
  if (o.adminToken && o.adminTokenFile) throw new UsageError('give -admin-token or -admin-token-file, not both');
  const exposed = exposedDeliveries(o);
  if (exposed) throw new UsageError(exposed);
  if (o.publicUrl !== '') checkPublicUrl(o.publicUrl);
  if (!/^[a-z0-9-]+\/[a-z0-9.-]+$/.test(o.rbacServiceAccount))
    throw new UsageError(`invalid value "${o.rbacServiceAccount}" for flag -rbac-service-account: use namespace/name`);
  return o;
}

/**
 * An unreplaced placeholder from the shipped examples and manifests: `<token>`, `<hook-token>`,
 * `<admin-token>`. The hook files chapter refuses one where a rule compares against it; the
 * -admin-token-file refuses one, since a token everyone can read in the manifests guards nothing.
 */
export const PLACEHOLDER = /<[A-Za-z][A-Za-z0-9_.-]*>/;

/** Hosts of -metrics-listen that only this machine (this pod) reaches. */
const LOOPBACK_HOST = /^(?:localhost|127(?:\.\d{1,3}){3}|::1|::ffff:127(?:\.\d{1,3}){3})$/i;

/**
 * Why the deliveries page may not be served as asked, or undefined: on an address other hosts
 * reach, it shows every hook's pushes to anyone in the cluster unless a token guards it. Pure.
 */
function exposedDeliveries(o: Options): string | undefined {
  if (o.deliveries === 0 || o.metricsListen === '' || o.adminToken || o.adminTokenFile) return undefined;
  const { host } = parseListenAddress(o.metricsListen);
  if (host !== undefined && LOOPBACK_HOST.test(host)) return undefined;
  return (
    `-metrics-listen ${o.metricsListen} would serve the deliveries page to other hosts without a token: give ` +
    '-admin-token-file FILE (or -admin-token TOKEN), listen on loopback (-metrics-listen 127.0.0.1:PORT), or turn ' +
    'the page off with -deliveries 0'
  );
}

/**
 * -admin-token-file: the token it holds (one trailing newline ignored, as `echo` and Secrets
 * leave it) becomes -admin-token. Throws a UsageError naming the file when it cannot be read, is
 * empty, holds spaces or control characters, or still holds a placeholder (`<admin-token>`).
 */
export function readAdminTokenFile(o: Options): void {
  if (!o.adminTokenFile) return;
  let text: string;
  try {
    text = fs.readFileSync(o.adminTokenFile, 'utf8');
  } catch (e) {
    const why = (e as NodeJS.ErrnoException).code ?? (e as Error).message;
    throw new UsageError(`invalid value "${o.adminTokenFile}" for flag -admin-token-file: cannot read it (${why})`);
  }
  const token = text.replace(/\r?\n$/, '');
  if (token === '' || /[\s\x00-\x1f\x7f]/.test(token))
    throw new UsageError(
      `invalid value "${o.adminTokenFile}" for flag -admin-token-file: the file must hold one token, no spaces or ` +
        'control characters',
    );
  const placeholder = PLACEHOLDER.exec(token);
  if (placeholder)
    throw new UsageError(
      `invalid value "${o.adminTokenFile}" for flag -admin-token-file: the file still holds ` +
        `${placeholder[0] === token ? `the placeholder "${token}"` : 'a placeholder'}; replace it`,
    );
  o.adminToken = token;
}

/** -public-url: an http(s) URL with no query, fragment or credentials (links are built on it). */
function checkPublicUrl(text: string): void {
  let url: URL | undefined;
  try {
    url = new URL(text);
  } catch {
    url = undefined;
  }
  if (!url || !/^https?:$/.test(url.protocol) || url.search || url.hash || url.username || url.password)
    throw new UsageError(
      `invalid value "${text}" for flag -public-url: give the http(s) address people reach the service at, ` +
        'with no query, fragment or credentials (e.g. https://webhook.example.com)',
    );
}

// A signing key shorter than SHA-256's block of output could be guessed more easily than the links forged.
const MIN_APPROVAL_KEY_BYTES = 32;

/**
 * -approval-key-file: the key that signs approval links (one trailing newline ignored), kept as -approvalKey.
 * Throws a UsageError naming the file when it cannot be read, is shorter than MIN_APPROVAL_KEY_BYTES or still
 * holds a placeholder; -public-url and -approval-key-file go together.
 */
export function readApprovalKeyFile(o: Options): void {
  if ((o.publicUrl === '') !== (o.approvalKeyFile === ''))
    throw new UsageError('give -public-url and -approval-key-file together: approval links need both');
  if (!o.approvalKeyFile) return;
  const where = `invalid value "${o.approvalKeyFile}" for flag -approval-key-file`;
  let key: Buffer;
  try {
    key = fs.readFileSync(o.approvalKeyFile);
  } catch (e) {
    throw new UsageError(`${where}: cannot read it (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
  }
  if (key.at(-1) === 0x0a) key = key.subarray(0, -1);
  if (PLACEHOLDER.test(key.toString('latin1'))) throw new UsageError(`${where}: the file still holds a placeholder`);
  if (key.length < MIN_APPROVAL_KEY_BYTES)
    throw new UsageError(
      `${where}: the key is ${key.length} bytes; use at least ${MIN_APPROVAL_KEY_BYTES} (openssl rand -hex 32)`,
    );
  o.approvalKey = key;
}

/** The limits on what requests hold: a body the memory limit could never hold would wait for nothing. */
function checkRequestLimits(o: Options): void {
  const memory = o.maxBodyMemoryBytes;
  if (memory < o.maxBodyBytes)
    throw new UsageError(
      `invalid value for flag -max-body-memory: ${memory} is less than -max-body-size (${o.maxBodyBytes})`,
    );
  if (o.maxConnections < 1) throw new UsageError('invalid value for flag -max-connections: must be at least 1');
}

/** `host:port`, `:port` (every address) or `[v6]:port`, as Go's net.Listen takes them. */
export function parseListenAddress(text: string): { host: string | undefined; port: number } {
  const m = /^(?:\[([0-9A-Fa-f:.]+)\]|([^:\[\]]*)):(\d{1,5})$/.exec(text);
  const port = Number(m?.[3]);
  if (!m || port > 65535) throw new UsageError(`invalid listen address "${text}" (use host:port or :port)`);
  const host = m[1] ?? m[2];
  return { host: host === '' ? undefined : host, port };
}

export function usage(): string {
  const lines = ['Usage of webhook:'];
  for (const [name, spec] of Object.entries(FLAGS)) {
    const arg =
      spec.kind === 'bool'
        ? ''
        : spec.kind === 'duration'
          ? ' duration'
          : spec.kind === 'string' || spec.kind === 'list'
            ? ' string'
            : ' int';
    lines.push(`  -${name}${arg}`);
    const def =
      spec.kind === 'bool' || spec.def === ''
        ? ''
        : ` (default ${spec.kind === 'string' || spec.kind === 'list' ? `"${spec.def}"` : spec.def})`;
    lines.push(`    \t${spec.help}${def}`);
  }
  lines.push('', 'Environment: WEBHOOK_CMD adds arguments (e.g. WEBHOOK_CMD=-template).');
  return lines.join('\n') + '\n';
}

// ================================================================================================
// 14. logging & metrics — log lines in adnanh's shape ("[webhook] 2006/01/02 15:04:05 …"), errors always, the rest
//    with -verbose/-debug, every line scrubbed of known secrets; counters, gauges and histograms rendered in the
//    Prometheus text format.
//    Exports: escapeControls, Logger, Metrics.
//    Tests: test/compat.test.ts, test/runner.test.ts, test/unit.test.ts.
// ================================================================================================

export class Logger {
  private scrubber = new Scrubber([]);
  /** Callers test this before building an expensive verbose-only line (the access log). */
  readonly verbose: boolean;
  private readonly debugOn: boolean;
  private readonly write: (text: string) => void;
  private pending: string[] = [];
  private readonly afterWrite: (() => void)[] = [];

  constructor(verbose: boolean, debug: boolean, write: (text: string) => void) {
    this.verbose = verbose || debug;
    this.debugOn = debug;
    this.write = write;
  }

  /**
   * Writes what is pending, synchronously, then lets out the answers waiting for it (whenWritten).
   * Lines are batched per event-loop turn: requests log several lines each, and one write(2) for
   * all of them is much cheaper. Answers wait for the write and errors are written at once, so a
   * process killed right after answering has logged everything about that request.
   */
  flush(): void {
    if (this.pending.length > 0) {
      const text = this.pending.join('');
      this.pending = [];
      this.write(text);
    }
    for (const send of this.afterWrite.splice(0)) send();
  }

  /**
   * Runs `send` (an answer going out) once every line logged so far is written: at once when none
   * is pending, else at the batch's write, so answers in one event-loop turn share one write(2).
   */
  whenWritten(send: () => void): void {
    if (this.pending.length === 0) send();
    else this.afterWrite.push(send);
  }

  setSecrets(secrets: string[]): void {
    this.scrubber = new Scrubber(secrets);
  }

  /** Replaces every known secret in `text`, in any of its encoded forms, by REDACTED (log lines, command output). */
  scrub(text: string): string {
    return this.scrubber.scrub(text);
  }

  private emit(message: string): void {
    const line = this.scrub(message);
    const d = new Date();
    const p = (n: number) => String(n).padStart(2, '0');
    if (this.pending.length === 0) setImmediate(() => this.flush());
    this.pending.push(
      `[webhook] ${d.getFullYear()}/${p(d.getMonth() + 1)}/${p(d.getDate())} ` +
        `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())} ${line}\n`,
    );
  }

  error(m: string): void {
    this.emit(`error: ${m}`);
    this.flush();
  }
  warn(m: string): void {
    this.emit(`warning: ${m}`);
  }
  /** Start-up, reload and shutdown: always shown, like errors. */
  notice(m: string): void {
    this.emit(m);
  }
  info(m: string): void {
    if (this.verbose) this.emit(m);
  }
  debug(m: string): void {
    if (this.debugOn) this.emit(m);
  }
}

/**
 * Text a request chose (a hook id from the URL, a header, a parameter, a body's parse error) made
 * safe for one log line: control characters (C0, DEL, C1, and the Unicode line and paragraph
 * separators) become \xNN or \uNNNN escapes, so a request can neither start a forged log line nor
 * send escape sequences to the terminal that shows the log.
 */
export function escapeControls(text: string): string {
  return text.replace(/[\x00-\x1f\x7f-\x9f\u2028\u2029]/g, (c) => {
    const code = c.charCodeAt(0);
    return code < 0x100 ? `\\x${code.toString(16).padStart(2, '0')}` : `\\u${code.toString(16)}`;
  });
}

const HISTOGRAM_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600];
const METRIC_HELP: Record<string, [string, string]> = {
  webhook_requests_total: ['counter', 'HTTP requests by hook id ("" for other paths) and status code.'],
  webhook_commands_total: ['counter', 'Hook commands run, by hook and result (success, failure, timeout).'],
  webhook_command_timeouts_total: ['counter', 'Hook commands killed for running past their timeout.'],
  webhook_commands_rejected_total: [
    'counter',
    'Triggered requests refused with 503 because all command slots were busy.',
  ],
  webhook_commands_running: ['gauge', 'Hook commands running now.'],
  webhook_bodies_parsed_total: ['counter', 'Request bodies parsed (their signatures and body-free rules passed).'],
  webhook_bodies_refused_total: ['counter', 'Requests refused with 503 because -max-body-memory was full.'],
  webhook_command_duration_seconds: ['histogram', 'Wall time of hook commands.'],
  webhook_reloads_total: ['counter', 'Hook reloads by result (success, failure).'],
  webhook_config_last_reload_successful: ['gauge', '1 if the last reload succeeded, 0 if it was rejected.'],
  webhook_hooks_loaded: ['gauge', 'Hooks in the snapshot being served.'],
  webhook_mails_total: [
    'counter',
    'Result mails by result (sent, failed after retries, summarized: beyond the per-hook cap, in one summary).',
  ],
  webhook_upgrades_total: [
    'counter',
    'Upgrade results once final, by hook, cluster (the kubeconfig context; "" for the default) and decision.',
  ],
  webhook_kubernetes_requests_total: [
    'counter',
    'Requests to the Kubernetes API server, every try and WATCH, by cluster ("" for the default) and verb.',
  ],
  webhook_notifications_total: [
    'counter',
    'NOTIFY_URL notifications by format and result (sent, failed after retries, capped: beyond the per-hook cap).',
  ],
};

export class Metrics {
  private readonly values = new Map<string, Map<string, number>>();
  private readonly histograms = new Map<string, Map<string, { buckets: number[]; sum: number; count: number }>>();

  private static key(labels: Record<string, string>): string {
    return Object.entries(labels)
      .map(([k, v]) => `${k}="${v.replace(/[\\"\n]/g, (c) => (c === '\n' ? '\\n' : '\\' + c))}"`)
      .join(',');
  }

  inc(name: string, labels: Record<string, string>, by = 1): void {
    const series = this.values.get(name) ?? new Map<string, number>();
    this.values.set(name, series);
    const k = Metrics.key(labels);
    series.set(k, (series.get(k) ?? 0) + by);
  }

  setGauge(name: string, labels: Record<string, string>, value: number): void {
    const series = this.values.get(name) ?? new Map<string, number>();
    this.values.set(name, series);
    series.set(Metrics.key(labels), value);
  }

  observe(name: string, labels: Record<string, string>, value: number): void {
    const series = this.histograms.get(name) ?? new Map();
    this.histograms.set(name, series);
    const k = Metrics.key(labels);
    const h = series.get(k) ?? { buckets: HISTOGRAM_BUCKETS.map(() => 0), sum: 0, count: 0 };
    series.set(k, h);
    HISTOGRAM_BUCKETS.forEach((b, i) => {
      if (value <= b) h.buckets[i]++;
    });
    h.sum += value;
    h.count++;
  }

  reloaded(ok: boolean, hooks: number): void {
    this.inc('webhook_reloads_total', { result: ok ? 'success' : 'failure' });
    this.setGauge('webhook_config_last_reload_successful', {}, ok ? 1 : 0);
    this.setGauge('webhook_hooks_loaded', {}, hooks);
  }

  render(): string {
    const lines: string[] = [];
    const head = (name: string) => {
      const [type, help] = METRIC_HELP[name] ?? ['untyped', name];
      lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
    };
    for (const [name, series] of this.values) {
      head(name);
      for (const [k, v] of series) lines.push(`${name}${k ? `{${k}}` : ''} ${v}`);
    }
    for (const [name, series] of this.histograms) {
      head(name);
      for (const [k, h] of series) {
        const sep = k ? `${k},` : '';
        HISTOGRAM_BUCKETS.forEach((b, i) => lines.push(`${name}_bucket{${sep}le="${b}"} ${h.buckets[i]}`));
        lines.push(
          `${name}_bucket{${sep}le="+Inf"} ${h.count}`,
          `${name}_sum${k ? `{${k}}` : ''} ${h.sum}`,
          `${name}_count${k ? `{${k}}` : ''} ${h.count}`,
        );
      }
    }
    return lines.join('\n') + '\n';
  }
}

// ================================================================================================
// 15. hook files — the reading every compiler below shares. A hooks file is rendered as a Go template when -template
//    asks, read as YAML (duplicate keys are errors; every key's line is kept), and then read through Fields: unknown
//    keys and wrong types are errors that name file, line, hook and field path (`hooks/web.json:12: hook "web":
//    trigger-rule.and[2]: …`).
//    Exports: CompileSinks, ConfigError, FieldReader, Fields, Place, suggest, typeName.
//    Tests: test/unit.test.ts, test/validate.test.ts, test/yaml-hooks.test.ts.
// ================================================================================================

/** An error in a hooks file; its message names the place (file:line: hook "id": field.path: what). */
export class ConfigError extends Error {}

// ---- reading fields --------------------------------------------------------------------------

/** What compiled hooks leave for the snapshot besides the hooks themselves. */
export interface CompileSinks {
  /** Values never to be logged (HMAC secrets); template-inserted values are added by the loader. */
  secrets: string[];
  /** `url:<name>` and `header:<lower-case name>` parameters compared by value rules. */
  redactedParams: string[];
  warnings: string[];
  /** Errors that keep the file from loading but need not stop the reading: every one is reported. */
  refusals: string[];
}

/** Where a value sits in the document: its parent object or array, its key there, its path. */
export interface Place {
  parent: object | undefined;
  key: string;
  path: string;
}

export function typeName(v: unknown): string {
  return v === null ? 'null' : Array.isArray(v) ? 'an array' : typeof v === 'object' ? 'an object' : `a ${typeof v}`;
}

/** Reads one hook of a parsed file; every error names file, line, hook and field path. */
export class FieldReader {
  readonly file: string;
  readonly sinks: CompileSinks;
  /** `hook "web"` once the id is known, `hook #3` before. */
  hookName: string;
  private readonly lines: LineMap;
  private readonly hookLine: number;

  constructor(file: string, lines: LineMap, hook: Place & { index: number }, sinks: CompileSinks) {
    this.file = file;
    this.lines = lines;
    this.sinks = sinks;
    this.hookLine = this.lineOf(hook.parent, hook.key) ?? 1;
    this.hookName = `hook #${hook.index + 1}`;
  }

  private lineOf(parent: object | undefined, key: string): number | undefined {
    return parent ? this.lines.get(parent)?.get(key) : undefined;
  }

  where(at: Place): string {
    return `${this.file}:${this.lineOf(at.parent, at.key) ?? this.hookLine}: ${this.hookName}: ${at.path}`;
  }

  fail(at: Place, what: string): never {
    throw new ConfigError(`${this.where(at)}: ${what}`);
  }

  warn(at: Place, what: string): void {
    this.sinks.warnings.push(`${this.where(at)}: ${what}`);
  }

  /** An error reported with every other one of the file: the file does not load. */
  refuse(at: Place, what: string): void {
    this.sinks.refusals.push(`${this.where(at)}: ${what}`);
  }

  /** The object at a place, refusing keys not in `allowed` (with a suggestion for a misspelling). */
  object(value: unknown, at: Place, allowed: readonly string[]): Fields {
    if (value === null || typeof value !== 'object' || Array.isArray(value))
      return this.fail(at, `expected an object, got ${typeName(value)}`);
    const fields = new Fields(this, value as Record<string, unknown>, at.path);
    for (const k of Object.keys(value)) if (!allowed.includes(k)) fields.fail(k, `unknown field${suggest(k, allowed)}`);
    return fields;
  }
}

/** One object of a hook being read: typed getters with defaults, and located errors. */
export class Fields {
  readonly raw: Record<string, unknown>;
  readonly path: string;
  readonly reader: FieldReader;

  constructor(reader: FieldReader, raw: Record<string, unknown>, path: string) {
    this.reader = reader;
    this.raw = raw;
    this.path = path;
  }

  place(key: string): Place {
    // A missing key is reported at the line where the object's first key is.
    const lineKey = Object.hasOwn(this.raw, key) ? key : (Object.keys(this.raw)[0] ?? key);
    return { parent: this.raw, key: lineKey, path: this.path ? `${this.path}.${key}` : key };
  }

  has(key: string): boolean {
    return this.raw[key] !== undefined;
  }
  fail(key: string, what: string): never {
    return this.reader.fail(this.place(key), what);
  }
  warn(key: string, what: string): void {
    this.reader.warn(this.place(key), what);
  }

  private typed<T>(key: string, ok: (v: unknown) => boolean, expected: string, def: T): T {
    const v = this.raw[key];
    if (v === undefined) return def;
    if (!ok(v)) this.fail(key, `expected ${expected}, got ${typeName(v)}`);
    return v as T;
  }

  /** A string; a number or boolean becomes its text, as adnanh's YAML loader gives it ("value": 1). */
  string(key: string, def = ''): string {
    const v = this.raw[key];
    if (typeof v === 'number' || typeof v === 'boolean') return scalarAsGoString(v, this.raw, key)!;
    return this.typed(key, (x) => typeof x === 'string', 'a string', def);
  }
  boolean(key: string, def = false): boolean {
    return this.typed(key, (v) => typeof v === 'boolean', 'a boolean', def);
  }
  integer(key: string, def: number): number {
    return this.typed(key, Number.isInteger, 'an integer', def);
  }

  /** A string the field's type needs: missing is an error naming what needs it. */
  required(key: string, neededBy: string): string {
    if (!this.has(key)) this.fail(key, `required for ${neededBy}`);
    return this.string(key);
  }

  /** A string that must not be empty, checked for a leftover placeholder. */
  nonEmpty(key: string, what = 'required, and must not be empty'): string {
    const s = this.string(key);
    if (s === '') this.fail(key, what);
    this.warnPlaceholder(key, s);
    return s;
  }

  warnPlaceholder(key: string, value: string): void {
    const m = PLACEHOLDER.exec(value);
    if (m) this.warn(key, `still holds the placeholder "${m[0]}"; replace it before use`);
  }

  /**
   * A value a trigger rule compares against: a leftover placeholder fails closed (with the shipped
   * HOOK_TOKEN=<hook-token>, `?token=<hook-token>` would otherwise be let in). A placeholder is no
   * secret, so it is named; in a secret field only when it is the whole value.
   */
  refusePlaceholder(key: string, value: string, secret = false): boolean {
    const m = PLACEHOLDER.exec(value);
    if (!m) return false;
    const which = !secret || m[0] === value ? `the placeholder "${m[0]}"` : 'a placeholder';
    this.reader.refuse(this.place(key), `still holds ${which}; replace it (a rule never compares against one)`);
    return true;
  }

  /** The items of an array field, each with its place (`key[i]`). */
  items(key: string): { value: unknown; at: Place }[] {
    const list = this.typed<unknown[]>(key, Array.isArray, 'an array', []);
    const path = this.place(key).path;
    return list.map((value, i) => ({ value, at: { parent: list, key: String(i), path: `${path}[${i}]` } }));
  }

  /** The object in a field. */
  object(key: string, allowed: readonly string[]): Fields {
    return this.reader.object(this.raw[key], this.place(key), allowed);
  }
}

/** Suggests a known name for a misspelt one (case difference or edit distance ≤ 2). */
export function suggest(name: string, known: readonly string[]): string {
  const best =
    known.find((k) => k.toLowerCase() === name.toLowerCase()) ?? known.find((k) => editDistance(name, k) <= 2);
  return best ? ` (did you mean "${best}"?)` : '';
}

function editDistance(a: string, b: string): number {
  const d = Array.from({ length: b.length + 1 }, (_, i) => i);
  for (let i = 1; i <= a.length; i++) {
    let prev = d[0];
    d[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const cur = d[j];
      d[j] = Math.min(d[j] + 1, d[j - 1] + 1, prev + (a[i - 1] === b[j - 1] ? 0 : 1));
      prev = cur;
    }
  }
  return d[b.length];
}

// ================================================================================================
// 16. requests — turns an HTTP request into the structures hook parameters address: headers (Go-canonical names),
//    query, payload (from JSON, form, XML or multipart bodies) and the raw body, with adnanh's dotted-path lookup and
//    Go's JSON serialisation; compileParam reads how a hook names a value of the request.
//    Exports: applyJsonParameters, asMarshalled, compileParam, firstValues, headersFromRaw, HookRequest,
//    isParsedContentType, MultipartError, Param, ParameterNotFound, paramReadsBody, parsePayload, resolveParameter.
//    Tests: test/adnanh-suite.test.ts, test/compat.test.ts, test/unit.test.ts, test/upgrade.test.ts.
// ================================================================================================

export interface HookRequest {
  id: string;
  method: string;
  /** Go's RemoteAddr form: "10.0.0.1:5678" or "[fd00::1]:5678". */
  remoteAddr: string;
  remoteIp: string;
  headers: Record<string, unknown>;
  query: Record<string, unknown>;
  payload: Record<string, unknown> | undefined;
  /** The raw body as received (what signatures cover); empty until it is read. */
  body: Buffer;
  /**
   * A multipart/form-data body: the raw-request-body parameter is then empty, as in adnanh (whose
   * form parser consumed the body); signatures still cover the raw bytes senders signed.
   */
  multipart?: boolean;
}

export class ParameterNotFound extends Error {
  constructor(key: string) {
    super(`parameter node not found: ${key}`);
  }
}

/** Thrown for a multipart body that cannot be parsed (adnanh answers 500 for it). */
export class MultipartError extends Error {}

/** Go's textproto.CanonicalMIMEHeaderKey: "x-hub-signature" → "X-Hub-Signature". */
function canonicalHeaderKey(name: string): string {
  if (!/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(name)) return name;
  return name.toLowerCase().replace(/(^|-)([a-z])/g, (_, dash: string, c: string) => dash + c.toUpperCase());
}

/** First value of each header, Go-canonical names, without Host (Go keeps it out of r.Header). */
export function headersFromRaw(rawHeaders: string[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const key = canonicalHeaderKey(rawHeaders[i]);
    if (key !== 'Host' && !(key in out)) out[key] = rawHeaders[i + 1];
  }
  return out;
}

/** First value of each key, as Go's url.Values would give it. */
export function firstValues(params: URLSearchParams): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of params) if (!(k in out)) out[k] = v;
  return out;
}

/**
 * Parses a body by content type as adnanh does: "json" (an array becomes {"root": […]}),
 * "x-www-form-urlencoded", "xml", "multipart/form-data;". Returns the payload (undefined when the
 * body does not parse; that never fails the request) and a note for the log.
 */
export function parsePayload(
  contentType: string,
  body: Buffer,
  jsonFileParts: string[],
): { payload: Record<string, unknown> | undefined; note?: string } {
  if (contentType.startsWith('multipart/form-data;'))
    return { payload: parseMultipart(contentType, body, jsonFileParts) };
  if (!isParsedContentType(contentType))
    return {
      payload: undefined,
      note: `error parsing body payload due to unsupported content type header: ${contentType}`,
    };
  try {
    if (contentType.includes('json')) {
      const text = body.toString('utf8');
      const value = parseJsonKeepingNumbers(text);
      if (Array.isArray(value)) return { payload: { root: value } };
      if (value === null) return { payload: undefined };
      if (typeof value !== 'object')
        return { payload: undefined, note: 'error parsing JSON payload: not an object or array' };
      return { payload: value as Record<string, unknown> };
    }
    if (contentType.includes('x-www-form-urlencoded'))
      return { payload: firstValues(new URLSearchParams(body.toString('utf8'))) };
    return { payload: parseXml(body.toString('utf8')) };
  } catch (e) {
    return {
      payload: undefined,
      note: `error parsing ${contentType.includes('json') ? 'JSON' : 'XML'} payload: ${(e as Error).message}`,
    };
  }
}

/** Content types with a payload parser (multipart aside). */
export function isParsedContentType(contentType: string): boolean {
  return contentType.includes('json') || contentType.includes('x-www-form-urlencoded') || contentType.includes('xml');
}

/**
 * multipart/form-data: value parts become payload keys (first value wins); file parts are parsed
 * as JSON when their Content-Type is application/json or the hook lists them in
 * parse-parameters-as-json; other file parts are ignored, as adnanh does.
 */
export function parseMultipart(
  contentType: string,
  body: Buffer,
  jsonFileParts: string[],
): Record<string, unknown> | undefined {
  const m = /;\s*boundary=(?:"([^"]+)"|([^\s;]+))/i.exec(contentType);
  if (!m) throw new MultipartError('no multipart boundary param in Content-Type');
  const delimiter = Buffer.from(`--${m[1] ?? m[2]}`);
  let payload: Record<string, unknown> | undefined;
  let at = body.indexOf(delimiter);
  if (at < 0) throw new MultipartError('multipart: NextPart: EOF');
  // Like Go's mime/multipart: the first boundary line says whether lines end in CRLF or bare LF.
  const nl = body[at + delimiter.length] === 0x0a ? '\n' : '\r\n';
  const nextDelimiter = Buffer.concat([Buffer.from(nl), delimiter]);
  for (;;) {
    at += delimiter.length;
    if (body.subarray(at, at + 2).toString() === '--') return payload;
    if (body.subarray(at, at + nl.length).toString() !== nl) {
      throw new MultipartError(`multipart: boundary not followed by ${nl === '\n' ? 'LF' : 'CRLF'}`);
    }
    at += nl.length;
    const headerEnd = body.indexOf(nl + nl, at);
    if (headerEnd < 0) throw new MultipartError('multipart: unterminated part headers');
    const headers = body.subarray(at, headerEnd).toString('utf8').split(nl);
    const contentStart = headerEnd + 2 * nl.length;
    const next = body.indexOf(nextDelimiter, contentStart);
    if (next < 0) throw new MultipartError('multipart: NextPart: EOF');
    at = next + nl.length;
    payload = addMultipartPart(payload ?? {}, headers, body.subarray(contentStart, next), jsonFileParts);
  }
}

/** One part: a value part becomes a payload key (first value wins); a JSON file part its object. */
function addMultipartPart(
  payload: Record<string, unknown>,
  headers: string[],
  content: Buffer,
  jsonFileParts: string[],
): Record<string, unknown> | undefined {
  const header = (n: string) =>
    headers
      .find((h) => h.toLowerCase().startsWith(n + ':'))
      ?.slice(n.length + 1)
      .trim() ?? '';
  const disposition = header('content-disposition');
  const name = /(?:^|;)\s*name="([^"]*)"/i.exec(disposition)?.[1];
  if (name === undefined || name in payload) return Object.keys(payload).length ? payload : undefined;
  const isFile = /;\s*filename="[^"]/i.test(disposition);
  if (!isFile) payload[name] = content.toString('utf8');
  else if (jsonFileParts.includes(name) || header('content-type') === 'application/json') {
    try {
      const v = parseJsonKeepingNumbers(content.toString('utf8'));
      if (v !== null && typeof v === 'object' && !Array.isArray(v)) payload[name] = v;
    } catch {
      /* adnanh logs and leaves the part out; so do we */
    }
  }
  return payload;
}

/** adnanh's dotted lookup: try the whole key first, else split at the first dot and descend. */
export function lookupParameter(key: string, params: unknown): unknown {
  if (params === undefined) throw new ParameterNotFound(key);
  if (Array.isArray(params)) {
    const dot = key.indexOf('.');
    const head = dot < 0 ? key : key.slice(0, dot);
    const index = /^\d+$/.test(head) ? Number(head) : NaN;
    if (!(index < params.length)) throw new ParameterNotFound(key);
    return dot < 0 ? params[index] : lookupParameter(key.slice(dot + 1), params[index]);
  }
  if (params !== null && typeof params === 'object' && !(params instanceof JsonNumber)) {
    const map = params as Record<string, unknown>;
    if (Object.hasOwn(map, key)) return map[key];
    const dot = key.indexOf('.');
    if (dot >= 0 && Object.hasOwn(map, key.slice(0, dot)))
      return lookupParameter(key.slice(dot + 1), map[key.slice(0, dot)]);
  }
  throw new ParameterNotFound(key);
}

/** Sets the value at a dotted key, if that key exists (adnanh's ReplaceParameter). */
export function replaceParameter(key: string, params: unknown, value: unknown): boolean {
  if (params === null || typeof params !== 'object' || params instanceof JsonNumber) return false;
  const dot = key.indexOf('.');
  if (Array.isArray(params)) {
    if (dot < 0 || !/^\d+$/.test(key.slice(0, dot)) || Number(key.slice(0, dot)) >= params.length) return false;
    return replaceParameter(key.slice(dot + 1), params[Number(key.slice(0, dot))], value);
  }
  const map = params as Record<string, unknown>;
  if (dot >= 0)
    return Object.hasOwn(map, key.slice(0, dot)) && replaceParameter(key.slice(dot + 1), map[key.slice(0, dot)], value);
  if (!Object.hasOwn(map, key)) return false;
  map[key] = value;
  return true;
}

/** Go's encoding/json Marshal: sorted keys, HTML-safe escapes, json.Number literals. */
export function goJsonMarshal(value: unknown): string {
  if (value === null || value === undefined) return 'null';
  if (value instanceof JsonNumber) return value.text;
  if (typeof value === 'string') {
    return (
      '"' +
      value.toWellFormed().replace(/["\\\u0000-\u001f<>&\u2028\u2029]/g, (c) => {
        const short: Record<string, string> = {
          '"': '\\"',
          '\\': '\\\\',
          '\n': '\\n',
          '\r': '\\r',
          '\t': '\\t',
          '\b': '\\b',
          '\f': '\\f',
        };
        return short[c] ?? '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0');
      }) +
      '"'
    );
  }
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  if (Array.isArray(value)) return '[' + value.map(goJsonMarshal).join(',') + ']';
  const map = value as Record<string, unknown>;
  return (
    '{' +
    Object.keys(map)
      .sort()
      .map((k) => goJsonMarshal(k) + ':' + goJsonMarshal(map[k]))
      .join(',') +
    '}'
  );
}

/**
 * What JSON.parse(goJsonMarshal(value)) reads back, without the text: numbers as JSON reads them, strings well
 * formed, an object's keys in Go's sorted order, each an own property (`__proto__` too). The in-process command is
 * given a request's entire payload so, as a command reads its argument. Pure; throws on a number JSON cannot write.
 */
export function asMarshalled(value: unknown): unknown {
  if (value === null || value === undefined) return null;
  if (value instanceof JsonNumber) return JSON.parse(value.text);
  if (typeof value === 'string') return value.toWellFormed();
  if (typeof value === 'number') return JSON.parse(String(value));
  if (typeof value === 'boolean') return value;
  if (Array.isArray(value)) return value.map(asMarshalled);
  const map = value as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  for (const k of Object.keys(map).sort()) {
    const property = { value: asMarshalled(map[k]), enumerable: true, writable: true, configurable: true };
    Object.defineProperty(out, k.toWellFormed(), property);
  }
  return out;
}

/** A looked-up value as the string adnanh would pass on (objects as JSON, null as "<nil>"). */
function parameterString(value: unknown): string {
  if (value === null || value === undefined) return '<nil>';
  if (typeof value === 'object' && !(value instanceof JsonNumber)) return goJsonMarshal(value);
  return value instanceof JsonNumber ? value.text : String(value);
}

/** The value of one hook parameter for this request; throws ParameterNotFound when absent. */
export function resolveParameter(p: Param, req: HookRequest): string {
  switch (p.source) {
    case 'string':
      return p.name;
    case 'raw-request-body':
      return req.multipart ? '' : req.body.toString('utf8');
    case 'request':
      return p.name.toLowerCase() === 'method' ? req.method : req.remoteAddr;
    case 'entire-payload':
      return goJsonMarshal(req.payload);
    case 'entire-headers':
      return goJsonMarshal(req.headers);
    case 'entire-query':
      return goJsonMarshal(req.query);
    case 'header':
      return parameterString(lookupParameter(canonicalHeaderKey(p.name), req.headers));
    case 'url':
      return parameterString(lookupParameter(p.name, req.query));
    case 'payload':
      return parameterString(lookupParameter(p.name, req.payload));
  }
}

/** parse-parameters-as-json: replaces each listed string parameter by the object it encodes. */
export function applyJsonParameters(jsonParams: Param[], req: HookRequest): string[] {
  const errors: string[] = [];
  for (const p of jsonParams) {
    let parsed: unknown;
    try {
      parsed = parseJsonKeepingNumbers(resolveParameter(p, req));
      if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) throw new Error('not a JSON object');
    } catch (e) {
      errors.push(`error parsing JSON parameter ${p.source}:${p.name}: ${(e as Error).message}`);
      continue;
    }
    const target =
      p.source === 'header'
        ? req.headers
        : p.source === 'url'
          ? req.query
          : p.source === 'payload'
            ? req.payload
            : undefined;
    replaceParameter(p.source === 'header' ? canonicalHeaderKey(p.name) : p.name, target, parsed);
  }
  return errors;
}

// ---- parameters: how a hook names a value of the request -------------------------------------

type Source =
  | 'url'
  | 'header'
  | 'payload'
  | 'request'
  | 'string'
  | 'raw-request-body'
  | 'entire-payload'
  | 'entire-headers'
  | 'entire-query';
export interface Param {
  source: Source;
  name: string;
  envname: string;
  base64decode: boolean;
}

/** Whether a parameter's value comes from the body (so the body must be read to resolve it). */
export function paramReadsBody(p: Param): boolean {
  return p.source === 'payload' || p.source === 'raw-request-body' || p.source === 'entire-payload';
}

const SOURCES = [
  'url',
  'query',
  'header',
  'payload',
  'request',
  'string',
  'raw-request-body',
  'entire-payload',
  'entire-headers',
  'entire-query',
];
const PARAM_FIELDS = ['source', 'name', 'envname', 'base64decode'];

/**
 * A parameter as a hook file writes it ({"source": "url", "name": "token"}). "query" is adnanh's
 * other name for "url". A file parameter without an envname gets HOOK_<NAME>.
 */
export function compileParam(reader: FieldReader, value: unknown, at: Place, fileParam: boolean): Param {
  const o = reader.object(value, at, PARAM_FIELDS);
  let source = o.string('source');
  const known = `(one of ${SOURCES.join(', ')})`;
  if (!SOURCES.includes(source))
    o.fail(
      'source',
      source === '' ? `required ${known}` : `unknown source "${source}"${suggest(source, SOURCES)} ${known}`,
    );
  if (source === 'query') source = 'url';
  const name = o.string('name');
  if (name === '' && ['url', 'header', 'payload', 'request'].includes(source))
    o.fail('name', `required for source "${source}"`);
  if (source === 'request' && !['method', 'remote-addr'].includes(name.toLowerCase())) {
    o.fail('name', `unsupported request key "${name}" (use "method" or "remote-addr")`);
  }
  // A string parameter's name is its value: a placeholder there is only worth a warning for the
  // environment (MAIL_TO's recipients, say), which the caller decides.
  if (source !== 'string' || at.path.startsWith('pass-environment-to-command')) o.warnPlaceholder('name', name);
  let envname = o.string('envname');
  if (fileParam && envname === '') envname = 'HOOK_' + name.toUpperCase();
  return { source: source as Source, name, envname, base64decode: o.boolean('base64decode') };
}

// ================================================================================================
// 17. trigger rules — one table, RULE_TYPES, holds each match type side by side: its fields, whether it compares a
//    request parameter, whether it reads the headers or the body, which field holds a secret, how it compiles and how
//    it tests a request. and/or/not combine matches with adnanh's semantics: a missing parameter makes a match false
//    (inside `or` it is passed over, inside `and` the rule fails); a bad signature is an evaluation error unless the
//    hook allows soft failures. Secrets compare in constant time. A rule is first evaluated without the body, in the
//    same order, up to the first match that needs it: a request that fails before then is answered unread; then on the
//    raw body, signatures checked before anything is parsed (evaluateRuleBeforeParse). CIDRs for ip-whitelist are
//    parsed here too.
//    Exports: compileRule, evaluateRule, evaluateRuleBeforeBody, evaluateRuleBeforeParse, Match, Rule, ruleMatches,
//    RuleResult.
//    Tests: test/adnanh-suite.test.ts, test/compat.test.ts, test/exposure.test.ts, test/unit.test.ts.
// ================================================================================================

class SignatureError extends Error {}
export interface RuleResult {
  ok: boolean;
  error?: Error;
}

/** A compiled match: what it reads of a request, and its test. */
export interface Match {
  type: string;
  param: Param | undefined;
  readsHeaders: boolean;
  /** The one value the parameter must have for the match to pass (value rules): -print-rbac and -validate read it. */
  pinned?: string;
  /** What passes, for people (-validate): the type's own fields, quoted, or a note for a secret. */
  shown: string;
  /** The test reads the body (a signature); the parameter may too (paramReadsBody). */
  readsBody: boolean;
  /** `value` is the parameter's value ("" for types without one). */
  test(req: HookRequest, value: string, now: Date): RuleResult;
}
export type Rule = { and: Rule[] } | { or: Rule[] } | { not: Rule } | { match: Match };

interface RuleType {
  /** The match's own fields besides "type" (and "parameter" when it compares one). */
  fields: readonly string[];
  /** Compares a parameter of the request: "parameter" is required. */
  parameter: boolean;
  /** Reads the request headers beyond any parameter (so the request step must collect them). */
  readsHeaders: boolean;
  /** Reads the body beyond any parameter (a signature over it): evaluated only once it is read. */
  readsBody: boolean;
  /** The field holding a secret: required, never quoted, scrubbed from every log line. */
  secret?: string;
  /** The compared parameter is redacted in the access log (it is the token). */
  redactsParameter?: boolean;
  /** The field naming the one value the parameter must have to pass (Match.pinned). */
  pins?: string;
  /** Reads the type's fields; returns the test. `secret` is the secret field's value. */
  compile(m: Fields, type: string, secret: string): Match['test'];
}

const RULE_TYPES: Record<string, RuleType> = {
  value: {
    fields: ['value'],
    parameter: true,
    readsHeaders: false,
    readsBody: false,
    redactsParameter: true,
    pins: 'value',
    compile(m, type) {
      const value = m.required('value', `type "${type}"`);
      m.refusePlaceholder('value', value);
      // An empty value usually means a template read an unset variable; it would let `?token=`
      // through, so it is refused rather than compared. The value itself is not scrubbed from
      // every line: value rules also pin routing values (namespace, workload) that reports must
      // show; a token comes from a template, whose values are scrubbed (loadSnapshot).
      if (value === '') m.fail('value', 'empty (is the environment variable the template reads unset?)');
      const digest = secretDigest(value);
      return (_req, v) => ({ ok: timingSafeEqual(secretDigest(v), digest) });
    },
  },
  regex: {
    fields: ['regex'],
    parameter: true,
    readsHeaders: false,
    readsBody: false,
    compile(m, type) {
      const source = m.required('regex', `type "${type}"`);
      m.refusePlaceholder('regex', source);
      // An empty pattern matches everything: like an empty value, a template read an unset variable.
      if (source === '') m.fail('regex', 'empty (is the environment variable the template reads unset?)');
      let regex: RegExp;
      try {
        regex = compileGoRegex(source);
      } catch (e) {
        return m.fail('regex', `invalid regular expression: ${(e as Error).message}`);
      }
      return (_req, v) => ({ ok: regex.test(v) });
    },
  },
  ...hmacRuleTypes(),
  'ip-whitelist': {
    fields: ['ip-range'],
    parameter: false,
    readsHeaders: false,
    readsBody: false,
    compile(m, type) {
      const text = m.required('ip-range', `type "${type}"`);
      // Refused with the file's other placeholders, not as an invalid range.
      if (m.refusePlaceholder('ip-range', text)) return () => ({ ok: false });
      const ranges = text
        .split(/\s+/)
        .filter((r) => r !== '')
        .map((r) => {
          const cidr = parseCidr(r);
          if (!cidr)
            m.fail('ip-range', `invalid IP range "${r}" (use CIDR notation such as 10.0.0.0/8, or a single address)`);
          return cidr!;
        });
      if (ranges.length === 0) m.fail('ip-range', 'empty');
      return (req) => ({ ok: ranges.some((r) => cidrContains(r, req.remoteIp)) });
    },
  },
  'scalr-signature': {
    fields: ['secret'],
    parameter: false,
    readsHeaders: true,
    readsBody: true,
    secret: 'secret',
    compile: (_m, _type, secret) => (req, _v, now) => checkScalrSignature(req, secret, now),
  },
};

/** payload-hmac-sha1/256/512, and adnanh's older names for them, payload-hash-*. */
function hmacRuleTypes(): Record<string, RuleType> {
  const types: Record<string, RuleType> = {};
  for (const prefix of ['payload-hmac-', 'payload-hash-']) {
    for (const algorithm of ['sha1', 'sha256', 'sha512']) {
      types[prefix + algorithm] = {
        fields: ['secret'],
        parameter: true,
        readsHeaders: false,
        readsBody: true,
        secret: 'secret',
        compile: (_m, _type, secret) => (req, v) => checkPayloadSignature(req.body, algorithm, secret, v),
      };
    }
  }
  return types;
}

const MATCH_FIELDS = ['type', 'parameter', ...new Set(Object.values(RULE_TYPES).flatMap((t) => t.fields))];
const RULE_TYPE_NAMES = Object.keys(RULE_TYPES);

/**
 * Secrets are compared through keyed digests (a random per-process key, then SHA-256), so the
 * comparison takes the same time whatever the lengths and contents. A one-shot hash is half the
 * cost of an HMAC object, and this runs on every request. The key is made at its first use, in the
 * running process: the executable starts from a snapshot of this file's evaluated top level
 * (scripts/build.ts), which every process shares, so a key made there would be the same in all.
 */
let compareKey: string | undefined;
function secretDigest(value: string): Buffer {
  compareKey ??= randomBytes(32).toString('hex');
  return hash('sha256', compareKey + value, 'buffer');
}

/** A trigger-rule: exactly one of and, or, not, match. */
export function compileRule(reader: FieldReader, value: unknown, at: Place): Rule {
  const o = reader.object(value, at, ['and', 'or', 'not', 'match']);
  const keys = Object.keys(o.raw);
  if (keys.length !== 1) {
    const quoted = keys.map((k) => `"${k}"`).join(' and ');
    reader.fail(
      at,
      keys.length === 0
        ? 'a rule needs one of "and", "or", "not", "match"'
        : `a rule takes exactly one of "and", "or", "not", "match", got ${quoted}`,
    );
  }
  const kind = keys[0];
  if (kind === 'and' || kind === 'or') {
    const items = o.items(kind);
    if (items.length === 0)
      o.fail(kind, `an empty "${kind}" list (it would ${kind === 'and' ? 'always' : 'never'} match)`);
    const rules = items.map((item) => compileRule(reader, item.value, item.at));
    return kind === 'and' ? { and: rules } : { or: rules };
  }
  if (kind === 'not') return { not: compileRule(reader, o.raw.not, o.place('not')) };
  return { match: compileMatch(reader, o.raw.match, o.place('match')) };
}

function compileMatch(reader: FieldReader, value: unknown, at: Place): Match {
  const m = reader.object(value, at, MATCH_FIELDS);
  const type = m.string('type');
  const ruleType = Object.hasOwn(RULE_TYPES, type) ? RULE_TYPES[type] : undefined;
  if (!ruleType)
    return m.fail(
      'type',
      type === ''
        ? `required (one of ${RULE_TYPE_NAMES.join(', ')})`
        : `unknown type "${type}"${suggest(type, RULE_TYPE_NAMES)}`,
    );
  const secret = ruleType.secret ? readSecret(m, ruleType.secret) : '';
  const test = ruleType.compile(m, type, secret);
  let param: Param | undefined;
  if (ruleType.parameter) {
    if (!m.has('parameter')) m.fail('parameter', `required for type "${type}"`);
    param = compileParam(reader, m.raw.parameter, m.place('parameter'), false);
    const named = `${param.source}:${param.source === 'header' ? param.name.toLowerCase() : param.name}`;
    if (ruleType.redactsParameter && (param.source === 'url' || param.source === 'header'))
      reader.sinks.redactedParams.push(named);
  }
  const pinned = ruleType.pins ? m.string(ruleType.pins) : undefined;
  const shown = ruleType.secret
    ? 'a valid signature (its secret not shown)'
    : ruleType.fields.map((f) => JSON.stringify(m.string(f))).join(', ');
  return { type, param, readsHeaders: ruleType.readsHeaders, readsBody: ruleType.readsBody, pinned, shown, test };
}

/** A secret field: required, not empty, and no placeholder (named only when it is the whole value). */
function readSecret(m: Fields, key: string): string {
  const secret = m.required(key, `type "${m.string('type')}"`);
  if (secret === '') m.fail(key, 'must not be empty');
  m.refusePlaceholder(key, secret, true);
  m.reader.sinks.secrets.push(secret);
  return secret;
}


/** Every match of a rule, depth first. */
export function ruleMatches(rule: Rule | undefined): Match[] {
  if (!rule) return [];
  if ('and' in rule) return rule.and.flatMap(ruleMatches);
  if ('or' in rule) return rule.or.flatMap(ruleMatches);
  if ('not' in rule) return ruleMatches(rule.not);
  return [rule.match];
}

export function evaluateRule(rule: Rule, req: HookRequest, soft: boolean, now: Date = new Date()): RuleResult {
  return evaluateWith(rule, soft, (m) => evaluateMatch(m, req, now))!;
}

/**
 * The rule before the body is read: the same evaluation in the same order, stopping at the first
 * match that needs the body (undefined: the body decides). Nothing after that match is looked
 * at, so a result here is exactly the one evaluateRule gives once the body is read (including a
 * missing parameter's error, which adnanh logs), and the request can be answered without it.
 */
export function evaluateRuleBeforeBody(
  rule: Rule,
  req: HookRequest,
  soft: boolean,
  now: Date = new Date(),
): RuleResult | undefined {
  return evaluateWith(rule, soft, (m) => {
    if (m.param && paramReadsBody(m.param)) return undefined;
    if (!m.readsBody) return evaluateMatch(m, req, now);
    // A signature's header is resolved before the digest is computed: a missing one is known now.
    try {
      if (m.param) resolveParameter(m.param, req);
    } catch (e) {
      return { ok: false, error: e as Error };
    }
    return undefined;
  });
}

// A rule decided before its body is parsed tries every outcome of the matches that read the parsed
// payload: three each (passes, fails, its parameter missing). Rules name a handful; past this many,
// the body is parsed and the rule evaluated as usual.
const MAX_UNDECIDED_MATCHES = 6;

/**
 * The rule once the raw body is in, before it is parsed: signatures are checked on the raw bytes,
 * and the matches that read the parsed payload are undecided. A result comes back when it does
 * not depend on them: the rule reads no parsed payload (the exact result), or no outcome of them
 * satisfies it (the refusal a request whose payload matches gets, typically the signature's
 * error; only for a rule with a signature). Undefined when the payload may decide: the body is then parsed and
 * evaluateRule decides.
 * So a body is parsed only for a request that its body-free and signature matches let through.
 */
export function evaluateRuleBeforeParse(
  rule: Rule,
  req: HookRequest,
  soft: boolean,
  now: Date = new Date(),
): RuleResult | undefined {
  const matches = ruleMatches(rule);
  const undecided = matches.filter((m) => m.param && paramReadsBody(m.param));
  // Without a signature the raw body decides nothing new: the rule is evaluated in order once parsed, as adnanh
  // does (a missing payload parameter it reaches first is logged).
  const signed = matches.some((m) => m.readsBody && !(m.param && paramReadsBody(m.param)));
  if (undecided.length > (signed ? MAX_UNDECIDED_MATCHES : 0)) return undefined;
  const known = new Map<Match, RuleResult>();
  const decided = (m: Match) => known.get(m) ?? known.set(m, evaluateMatch(m, req, now)).get(m)!;
  const outcomes = (m: Match): RuleResult[] => [
    { ok: true },
    { ok: false },
    { ok: false, error: new ParameterNotFound(m.param!.name) },
  ];
  let passing: RuleResult | undefined;
  const choices = undecided.map(() => 0);
  for (;;) {
    const chosen = new Map(undecided.map((m, i) => [m, outcomes(m)[choices[i]]]));
    const result = evaluateWith(rule, soft, (m) => chosen.get(m) ?? decided(m))!;
    if (result.ok && (!result.error || result.error instanceof ParameterNotFound))
      return undecided.length === 0 ? result : undefined;
    passing ??= result;
    // The next combination of outcomes, the first match's changing fastest; done after the last.
    let i = 0;
    while (i < choices.length && ++choices[i] === 3) choices[i++] = 0;
    if (i === choices.length) return passing;
  }
}

/** and/or/not over the matches' results; undefined (a match that cannot be decided yet) ends it. */
function evaluateWith(rule: Rule, soft: boolean, match: (m: Match) => RuleResult | undefined): RuleResult | undefined {
  if ('and' in rule) {
    for (const r of rule.and) {
      const res = evaluateWith(r, soft, match);
      if (!res) return undefined;
      if (res.error) return { ok: false, error: res.error };
      if (!res.ok) return { ok: false };
    }
    return { ok: true };
  }
  if ('or' in rule) {
    for (const r of rule.or) {
      const res = evaluateWith(r, soft, match);
      if (!res) return undefined;
      const forgiven = res.error instanceof ParameterNotFound || (soft && res.error instanceof SignatureError);
      if (res.error && !forgiven) return { ok: false, error: res.error };
      if (res.ok) return { ok: true };
    }
    return { ok: false };
  }
  if ('not' in rule) {
    const res = evaluateWith(rule.not, soft, match);
    return res && { ok: !res.ok, error: res.error };
  }
  return match(rule.match);
}

function evaluateMatch(m: Match, req: HookRequest, now: Date): RuleResult {
  let value = '';
  if (m.param) {
    try {
      value = resolveParameter(m.param, req);
    } catch (e) {
      return { ok: false, error: e as Error };
    }
  }
  return m.test(req, value, now);
}

/** Signatures in a header: "sha256=abc" or several, comma-separated; any one may match. */
export function extractSignatures(header: string, prefix: string): string[] {
  if (!header.includes(',')) return [header.startsWith(prefix) ? header.slice(prefix.length) : header];
  return header
    .split(',')
    .filter((p) => p.startsWith(prefix))
    .map((p) => p.slice(prefix.length));
}

export function checkPayloadSignature(body: Buffer, algorithm: string, secret: string, header: string): RuleResult {
  const expected = createHmac(algorithm, secret).update(body).digest('hex');
  const signatures = extractSignatures(header, `${algorithm}=`);
  const expectedDigest = secretDigest(expected);
  if (signatures.some((s) => timingSafeEqual(secretDigest(s), expectedDigest))) return { ok: true };
  return { ok: false, error: new SignatureError(`invalid payload signature ${signatures.join(',')}`) };
}

/** Scalr: HMAC-SHA1 of body + Date header, and the Date within 5 minutes of now. */
export function checkScalrSignature(req: HookRequest, secret: string, now: Date): RuleResult {
  const signature = req.headers['X-Signature'];
  const date = req.headers.Date;
  if (typeof signature !== 'string' || typeof date !== 'string') return { ok: false };
  const expected = createHmac('sha1', secret).update(req.body).update(date).digest('hex');
  if (!timingSafeEqual(secretDigest(signature), secretDigest(expected)))
    return { ok: false, error: new SignatureError(`invalid payload signature ${signature}`) };
  // The format Scalr sends: "Fri 08 Sep 2017 11:24:32 UTC" (Go layout "Mon 02 Jan 2006 15:04:05 MST").
  const m = /^[A-Z][a-z]{2} (\d{2}) ([A-Z][a-z]{2}) (\d{4}) (\d{2}):(\d{2}):(\d{2}) [A-Z]{3,4}$/.exec(date);
  const month = m ? MONTHS.indexOf(m[2]) : -1;
  if (!m || month < 0)
    return { ok: false, error: new Error(`parsing time "${date}" as "Mon 02 Jan 2006 15:04:05 MST": cannot parse`) };
  const sent = Date.UTC(Number(m[3]), month, Number(m[1]), Number(m[4]), Number(m[5]), Number(m[6]));
  if (Math.abs(now.getTime() - sent) > 300_000)
    return { ok: false, error: new SignatureError('invalid payload signature outdated') };
  return { ok: true };
}

interface Cidr {
  family: 4 | 6;
  bytes: Buffer;
  prefix: number;
}

/** Parses "10.0.0.0/8", "fd00::/8" or a single address (a /32 or /128). */
export function parseCidr(text: string): Cidr | undefined {
  const [addr, prefixText, extra] = text.split('/');
  if (extra !== undefined) return undefined;
  const bytes = ipBytes(addr);
  if (!bytes) return undefined;
  const family = bytes.length === 4 ? 4 : 6;
  const max = family === 4 ? 32 : 128;
  if (prefixText !== undefined && !/^\d{1,3}$/.test(prefixText)) return undefined;
  const prefix = prefixText === undefined ? max : Number(prefixText);
  if (prefix > max) return undefined;
  return { family, bytes, prefix };
}

function ipBytes(addr: string): Buffer | undefined {
  const kind = net.isIP(addr);
  if (kind === 4) return Buffer.from(addr.split('.').map(Number));
  if (kind !== 6) return undefined;
  const sock = new net.SocketAddress({ address: addr, family: 'ipv6' });
  const halves = sock.address.split('::');
  const parse = (s: string) => (s === '' ? [] : s.split(':'));
  const head = parse(halves[0]);
  const tail = halves.length > 1 ? parse(halves[1]) : [];
  // Each side of "::" as 16-bit groups; an embedded IPv4 address (::ffff:1.2.3.4) is two of them.
  const toGroups = (parts: string[]) => parts.flatMap((g) => (g.includes('.') ? v4Groups(g) : [parseInt(g, 16)]));
  const groups = toGroups(head);
  const tailGroups = toGroups(tail);
  while (groups.length + tailGroups.length < 8) groups.push(0);
  const out = Buffer.alloc(16);
  [...groups, ...tailGroups].forEach((g, i) => out.writeUInt16BE(g, i * 2));
  return out;
}

function v4Groups(v4: string): number[] {
  const b = v4.split('.').map(Number);
  return [(b[0] << 8) | b[1], (b[2] << 8) | b[3]];
}

export function cidrContains(cidr: Cidr, addr: string): boolean {
  let bytes = ipBytes(addr);
  if (!bytes) return false;
  // An IPv4 client on a dual-stack socket shows up as ::ffff:a.b.c.d.
  if (
    bytes.length === 16 &&
    cidr.family === 4 &&
    bytes.subarray(0, 12).equals(Buffer.from([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]))
  )
    bytes = bytes.subarray(12);
  if (bytes.length !== cidr.bytes.length) return false;
  let bits = cidr.prefix;
  for (let i = 0; bits > 0; i++, bits -= 8) {
    const mask = bits >= 8 ? 0xff : (0xff << (8 - bits)) & 0xff;
    if ((bytes[i] & mask) !== (cidr.bytes[i] & mask)) return false;
  }
  return true;
}

// ================================================================================================
// 18. hooks & reload — a hooks file's text (already templated) compiled into hooks, once, so the request path only
//    evaluates: the hook's fields read in one list, its parameters and trigger rule compiled, and the hook settings
//    a hook must fix (those HOOK_SETTINGS marks fixed) checked through the HookSettingChecks main() hands
//    over. Every -hooks path (a file, or a directory of *.json, *.yaml and *.yml files merged in name order) becomes
//    one immutable Snapshot. Reloads watch directories, not file inodes, so in-place edits, `mv` over a file, delete
//    + re-create and a ConfigMap's `..data` symlink swap are all seen; a snapshot that fails is rejected whole.
//    Exports: Hook, HookSettingChecks, HookStore, LoadSettings, loadSnapshot, Snapshot.
//    Tests: test/runner.test.ts, test/unit.test.ts, test/upgrade.test.ts, test/validate.test.ts.
// ================================================================================================

export interface Hook {
  id: string;
  file: string;
  command: string;
  workingDirectory: string;
  responseMessage: string;
  responseHeaders: [string, string][];
  successCode: number;
  mismatchCode: number;
  contentType: string;
  methods: string[];
  captureOutput: boolean;
  captureOutputOnError: boolean;
  args: Param[];
  env: Param[];
  files: Param[];
  jsonParams: Param[];
  rule: Rule | undefined;
  softSignatureFailures: boolean;
  /** The hook's command-timeout, else -command-timeout. */
  commandTimeoutMs: number;
  /** Whether any parameter reads the payload / the headers: otherwise the request skips building them. */
  readsPayload: boolean;
  readsHeaders: boolean;
  /**
   * The service's environment variables the hook files' templates read (set by the loader): their
   * values are treated as secrets, so the command does not inherit them.
   */
  templateVariables: ReadonlySet<string>;
  /**
   * Whether the command's arguments, environment or files, or parse-parameters-as-json, read the
   * body. What the trigger rule needs shows when it is evaluated before the body.
   */
  usesBody: boolean;
}

/**
 * Checks of hook settings: environment variables, keyed by envname, that a hook passes to its
 * command and a later chapter reads. Each returns what is wrong with a value, or undefined. The
 * settings named here widen what a request may do, so a hook must fix them in the file
 * (`"source": "string"`): a value the request supplied would let whoever calls the hook choose it.
 */
export type HookSettingChecks = Record<string, (value: string) => string | undefined>;

/** What one hooks file contributes to a snapshot. */
interface CompiledFile extends CompileSinks {
  hooks: Hook[];
}

const HOOK_FIELDS = [
  'id',
  'execute-command',
  'command-working-directory',
  'response-message',
  'response-headers',
  'success-http-response-code',
  'incoming-payload-content-type',
  'http-methods',
  'include-command-output-in-response',
  'include-command-output-in-response-on-error',
  'pass-arguments-to-command',
  'pass-environment-to-command',
  'pass-file-to-command',
  'parse-parameters-as-json',
  'trigger-rule',
  'trigger-rule-mismatch-http-response-code',
  'trigger-signature-soft-failures',
  'command-timeout',
];

/** Compiles one hooks file's text (already templated) into hooks, or throws a located ConfigError. */
export function compileHooksFile(
  file: string,
  text: string,
  defaults: { commandTimeoutMs: number; settingChecks?: HookSettingChecks },
): CompiledFile {
  let doc: { value: unknown; lines: LineMap };
  try {
    doc = parseYaml(text);
  } catch (e) {
    throw new ConfigError(`${file}: ${(e as Error).message}`);
  }
  const { value, lines } = doc;
  if (!Array.isArray(value))
    throw new ConfigError(`${file}: line 1: the top level must be a list (JSON array) of hooks`);
  const result: CompiledFile = { hooks: [], secrets: [], redactedParams: [], warnings: [], refusals: [] };
  const seen = new Set<string>();
  value.forEach((raw, index) => {
    const at = { parent: value, key: String(index), path: '', index };
    const hook = compileHook(raw, new FieldReader(file, lines, at, result), at, defaults);
    if (seen.has(hook.id))
      throw new ConfigError(
        `${file}:${lines.get(value)?.get(String(index)) ?? 1}: hook "${hook.id}": id: duplicate id (already defined ` +
          `in this file)`,
      );
    seen.add(hook.id);
    result.hooks.push(hook);
  });
  if (result.refusals.length > 0) throw new ConfigError(result.refusals.join('; '));
  return result;
}

function compileHook(
  raw: unknown,
  reader: FieldReader,
  at: Place,
  defaults: { commandTimeoutMs: number; settingChecks?: HookSettingChecks },
): Hook {
  // Name the hook in every error, including those about fields that come before "id".
  const rawId = (raw as { id?: unknown } | null)?.id;
  if (typeof rawId === 'string' && rawId !== '') reader.hookName = `hook "${rawId}"`;
  const h = reader.object(raw, at, HOOK_FIELDS);
  const id = h.nonEmpty('id');
  reader.hookName = `hook "${id}"`;
  const params = (key: string) =>
    h.items(key).map((item) => compileParam(reader, item.value, item.at, key === 'pass-file-to-command'));
  const workingDirectory = h.string('command-working-directory');
  h.warnPlaceholder('command-working-directory', workingDirectory);
  const hook: Hook = {
    id,
    file: reader.file,
    command: h.nonEmpty('execute-command'),
    workingDirectory,
    responseMessage: h.string('response-message'),
    responseHeaders: compileResponseHeaders(h),
    successCode: statusCode(h, 'success-http-response-code'),
    mismatchCode: statusCode(h, 'trigger-rule-mismatch-http-response-code'),
    contentType: h.string('incoming-payload-content-type'),
    methods: compileMethods(h),
    captureOutput: h.boolean('include-command-output-in-response'),
    captureOutputOnError: h.boolean('include-command-output-in-response-on-error'),
    args: params('pass-arguments-to-command'),
    env: params('pass-environment-to-command'),
    files: params('pass-file-to-command'),
    jsonParams: params('parse-parameters-as-json'),
    rule: h.has('trigger-rule') ? compileRule(reader, h.raw['trigger-rule'], h.place('trigger-rule')) : undefined,
    softSignatureFailures: h.boolean('trigger-signature-soft-failures'),
    commandTimeoutMs: commandTimeout(h) ?? defaults.commandTimeoutMs,
    readsPayload: false,
    readsHeaders: false,
    templateVariables: new Set(),
    usesBody: false,
  };
  checkHookSettings(h, hook.env, defaults.settingChecks ?? {});
  const matches = ruleMatches(hook.rule);
  const everyParam = [
    ...hook.args,
    ...hook.env,
    ...hook.files,
    ...hook.jsonParams,
    ...matches.flatMap((m) => (m.param ? [m.param] : [])),
  ];
  hook.readsPayload = everyParam.some((p) => p.source === 'payload' || p.source === 'entire-payload');
  hook.readsHeaders =
    everyParam.some((p) => p.source === 'header' || p.source === 'entire-headers') ||
    matches.some((m) => m.readsHeaders);
  hook.usesBody = [...hook.args, ...hook.env, ...hook.files, ...hook.jsonParams].some(paramReadsBody);
  return hook;
}

/** The hook's environment parameters that HookSettingChecks name: fixed in the file, and valid. */
function checkHookSettings(h: Fields, env: Param[], checks: HookSettingChecks): void {
  const items = h.items('pass-environment-to-command');
  env.forEach((p, i) => {
    if (!Object.hasOwn(checks, p.envname)) return;
    const item = new Fields(h.reader, items[i].value as Record<string, unknown>, items[i].at.path);
    if (p.source !== 'string')
      item.fail(
        'source',
        `${p.envname} must be fixed in the hook file ("source": "string"): from the request, whoever calls the ` +
          `hook would choose it`,
      );
    const problem = checks[p.envname](p.name);
    if (problem !== undefined) item.fail('name', problem);
  });
}

/** adnanh answers 200 for a status code it does not know; so do we, and say so at load. */
function statusCode(h: Fields, key: string): number {
  const code = h.integer(key, 200);
  if (http.STATUS_CODES[code]) return code;
  h.warn(key, `${code} is not a known HTTP status code; 200 is used`);
  return 200;
}

function compileResponseHeaders(h: Fields): [string, string][] {
  return h.items('response-headers').map((item) => {
    const o = h.reader.object(item.value, item.at, ['name', 'value']);
    const name = o.string('name');
    if (!/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(name)) o.fail('name', 'not a valid header name');
    const value = o.string('value');
    if (/[\r\n\0]/.test(value)) o.fail('value', 'a header value cannot contain line breaks');
    return [name, value];
  });
}

function compileMethods(h: Fields): string[] {
  return h
    .items('http-methods')
    .map((item) => {
      const method = scalarAsGoString(item.value, item.at.parent, item.at.key);
      if (method === undefined) return h.reader.fail(item.at, `expected a string, got ${typeName(item.value)}`);
      return method.trim().toUpperCase();
    })
    .filter((m) => m !== '');
}

function commandTimeout(h: Fields): number | undefined {
  const text = h.string('command-timeout');
  if (text === '') return undefined;
  try {
    return parseGoDuration(text);
  } catch {
    return h.fail('command-timeout', `invalid duration "${text}" (use e.g. 30s, 5m)`);
  }
}


export interface Snapshot {
  hooks: Map<string, Hook>;
  files: string[];
  /** Strings scrubbed from every log line (secrets of at least minScrubbedSecretLength). */
  secrets: string[];
  /** Every value a template inserted, whatever its length: -validate shows none of them. */
  inserted: Set<string>;
  /** `url:<name>` and `header:<lower-case name>` parameters compared by value rules. */
  redactedParams: Set<string>;
  warnings: string[];
  /** Hash of the files' contents: a reload that finds the same bytes changes nothing. */
  digest: string;
  /** The service's environment variables the files' templates read (each hook's templateVariables). */
  templateVariables: ReadonlySet<string>;
}

export interface LoadSettings {
  paths: string[];
  template: boolean;
  env: Record<string, string | undefined>;
  commandTimeoutMs: number;
  /** Hook settings a hook must fix, checked at load (HOOK_SETTINGS' fixed entries, handed over by main()). */
  settingChecks?: HookSettingChecks;
}

/** The files a hooks directory contributes: adnanh reads JSON and YAML alike. */
const HOOK_FILE_EXTENSIONS = ['.json', '.yaml', '.yml'];

/** Lists the hook files a -hooks path names: the file itself, or a directory's hook files in name order. */
export function listHookFiles(p: string): string[] {
  let stat: fs.Stats;
  try {
    stat = fs.statSync(p);
  } catch (e) {
    throw new ConfigError(`${p}: cannot read: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
  if (!stat.isDirectory()) return [p];
  // Names starting with "." are a ConfigMap's internals (..data, ..2026_11_22…) or editor files.
  return fs
    .readdirSync(p)
    .filter((n) => HOOK_FILE_EXTENSIONS.some((ext) => n.endsWith(ext)) && !n.startsWith('.'))
    .sort()
    .map((n) => path.join(p, n));
}

/** What templates read: the service's environment (each name read is noted) and files. */
function templateEnvironment(env: Record<string, string | undefined>, read: Set<string>): TemplateEnv {
  return {
    getenv: (name) => {
      read.add(name);
      return env[name];
    },
    readFile: (file) => {
      try {
        return fs.readFileSync(file, 'utf8');
      } catch {
        return undefined;
      }
    },
  };
}

/** Reads, templates, parses and validates every hook file into one snapshot, or throws ConfigError. */
export function loadSnapshot(settings: LoadSettings): Snapshot {
  const files = settings.paths.flatMap(listHookFiles);
  const hooks = new Map<string, Hook>();
  const secrets = new Set<string>();
  const inserted = new Set<string>();
  const redacted = new Set<string>();
  const warnings: string[] = [];
  const digest = createHash('sha256');
  const templateVariables = new Set<string>();
  const templateEnv = templateEnvironment(settings.env, templateVariables);
  for (const file of files) {
    let text: string;
    try {
      text = fs.readFileSync(file, 'utf8');
    } catch (e) {
      throw new ConfigError(`${file}: cannot read: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
    }
    digest.update(file).update('\0').update(text).update('\0');
    if (settings.template) {
      try {
        const rendered = renderTemplate(text, templateEnv);
        text = rendered.output;
        for (const s of rendered.inserted) {
          secrets.add(s);
          inserted.add(s);
        }
      } catch (e) {
        throw new ConfigError(`${file}: ${(e as Error).message}`);
      }
    }
    const compiled = compileHooksFile(file, text, settings);
    for (const hook of compiled.hooks) {
      const other = hooks.get(hook.id);
      if (other) throw new ConfigError(`${file}: hook "${hook.id}": id: duplicate id (also defined in ${other.file})`);
      hooks.set(hook.id, hook);
    }
    compiled.secrets.forEach((s) => secrets.add(s));
    compiled.redactedParams.forEach((r) => redacted.add(r));
    warnings.push(...compiled.warnings);
  }
  if (settings.template) digest.update(JSON.stringify([...secrets].sort()));
  const scrubbed = [...secrets]
    .filter((s) => s.length >= LIMITS.minScrubbedSecretLength)
    .sort((a, b) => b.length - a.length);
  const scrubber = new Scrubber(scrubbed);
  for (const hook of hooks.values()) withholdSecrets(hook, scrubber, templateVariables);
  return {
    hooks,
    files,
    secrets: scrubbed,
    inserted,
    redactedParams: redacted,
    templateVariables,
    warnings,
    digest: digest.digest('hex'),
  };
}

/**
 * What a template read stays in the service: the variables it read are not passed on to the
 * hook's command, and a value it inserted into the hook's fixed answer (response-message, a
 * response header) is sent as REDACTED, as it is logged.
 */
function withholdSecrets(hook: Hook, scrubber: Scrubber, templateVariables: ReadonlySet<string>): void {
  const scrub = (text: string) => scrubber.scrub(text);
  hook.templateVariables = templateVariables;
  hook.responseMessage = scrub(hook.responseMessage);
  hook.responseHeaders = hook.responseHeaders.map(([name, value]) => [name, scrub(value)]);
}

/**
 * Holds the current snapshot and replaces it on reload. Readers take `store.current` once per
 * request; a reload builds a whole new snapshot first, so nobody ever sees a half-loaded set.
 */
export class HookStore {
  current: Snapshot;
  private readonly settings: LoadSettings;
  private readonly log: Logger;
  private readonly metrics: Metrics;
  private watchers: fs.FSWatcher[] = [];
  private timer: NodeJS.Timeout | undefined;

  constructor(settings: LoadSettings, initial: Snapshot, log: Logger, metrics: Metrics) {
    this.settings = settings;
    this.current = initial;
    this.log = log;
    this.metrics = metrics;
    metrics.reloaded(true, initial.hooks.size);
  }

  /** Rebuilds the snapshot; on failure keeps the old one and logs why. Returns whether it changed. */
  reload(reason: string): boolean {
    let next: Snapshot;
    try {
      next = loadSnapshot(this.settings);
    } catch (e) {
      this.metrics.reloaded(false, this.current.hooks.size);
      this.log.error(
        `reload (${reason}) rejected, still serving the previous ${this.current.hooks.size} hook(s): ` +
          `${(e as Error).message}`,
      );
      return false;
    }
    if (next.digest === this.current.digest) return false;
    for (const w of next.warnings) this.log.warn(w);
    const before = new Set(this.current.hooks.keys());
    this.current = next;
    this.log.setSecrets(next.secrets);
    this.metrics.reloaded(true, next.hooks.size);
    const added = [...next.hooks.keys()].filter((id) => !before.has(id));
    const removed = [...before].filter((id) => !next.hooks.has(id));
    this.log.info(
      `reloaded ${next.hooks.size} hook(s) from ${next.files.length} file(s) (${reason})` +
        (added.length ? `; added: ${added.join(', ')}` : '') +
        (removed.length ? `; removed: ${removed.join(', ')}` : ''),
    );
    return true;
  }

  /**
   * Watches the directories that hold the hook files (for a file path, its parent), so a file
   * replaced by rename or a swapped `..data` symlink is seen. Events are debounced.
   */
  watch(): void {
    const dirs = new Set<string>();
    for (const p of this.settings.paths) {
      let isDir = false;
      try {
        isDir = fs.statSync(p).isDirectory();
      } catch {
        /* watched through its parent */
      }
      dirs.add(isDir ? p : path.dirname(p));
    }
    for (const dir of dirs) {
      try {
        const w = fs.watch(dir, { persistent: false }, () => this.schedule());
        w.on('error', (e) => this.log.error(`watching ${dir}: ${e.message}`));
        this.watchers.push(w);
        this.log.info(`watching ${dir} for changes`);
      } catch (e) {
        this.log.error(`cannot watch ${dir}: ${(e as Error).message}`);
      }
    }
  }

  private schedule(): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.reload('files changed'), LIMITS.reloadDebounceMs);
  }

  close(): void {
    clearTimeout(this.timer);
    for (const w of this.watchers) w.close();
  }
}

// ================================================================================================
// 19. commands — resolves execute-command as adnanh does (absolute; else relative to command-working-directory, never
//    searched on PATH then; else on PATH), passes arguments, environment and temp files, and runs the command in its
//    own process group under a deadline and a cap on concurrent commands. Output is stdout and stderr combined in
//    arrival order. A command that is an InProcessCommand's entry point (the bundled /webhooks.sh: the upgrade) is
//    not started as a process: it runs in this process with the same inputs, output and exit status.
//    A kubeconfig's exec credential plugins start from the same environment (execEnvironment).
//    Exports: CommandResult, CommandRunner, decodeBase64Strict, execEnvironment, inheritedEnvironment,
//    InProcessCommand, resolveHookCommand.
//    Tests: test/compat.test.ts, test/runner.test.ts, test/unit.test.ts, test/kubeconfig.test.ts.
// ================================================================================================

type Environment = Record<string, string | undefined>;

/** A command's result; `R`, what the in-process command reports besides its output (the upgrade: its report). */
export interface CommandResult<R = unknown> {
  output: string;
  /** The environment the command ran with (or would have). */
  env: Readonly<Environment>;
  ok: boolean;
  exitCode: number | null;
  timedOut: boolean;
  /** Why the command could not start, or how it ended when not by exit 0. */
  error?: string;
  /** What an in-process command reported besides its output; only its CommandListener reads it. */
  report?: R;
  /** An in-process command took the work but finishes it later: the answer is 202 Accepted. */
  accepted?: boolean;
  /** An in-process command refused its input as malformed: the answer is 400 Bad Request, not 500. */
  badInput?: boolean;
}

/**
 * A command that runs inside this process instead of as a child: the same arguments and
 * environment in, the same output and exit status out, plus a report of its own.
 */
export interface InProcessCommand<R = unknown> {
  /** What the log calls it. */
  readonly name: string;
  /**
   * The absolute path hook files run it by (/webhooks.sh). Where no file is there (a machine other
   * than the image: `npm start`, CI) that execute-command still means this command.
   */
  readonly command: string;
  /** Whether a resolved execute-command is this command's entry point. */
  handles(file: string): boolean;
  /** payload: argument 1 when the hook passes the request's entire payload, as its JSON value (asMarshalled). */
  run(
    args: string[],
    env: Environment,
    requestId: string,
    hook: Hook,
    payload?: { value: unknown },
  ): Promise<{ output: string; exitCode: number; report: R | undefined; accepted?: boolean; badInput?: boolean }>;
}

/** Go's exec.LookPath on adnanh's candidate; returns the path or the error text Go would print. */
function resolveCommand(
  command: string,
  workingDirectory: string,
  envPath: string,
): { path?: string; error?: string } {
  const candidate =
    path.isAbsolute(command) || workingDirectory === '' ? command : path.join(workingDirectory, command);
  const check = (p: string): string | undefined => {
    try {
      const st = fs.statSync(p);
      if (st.isDirectory()) return 'is a directory';
      if ((st.mode & 0o111) === 0) return 'permission denied';
      return undefined;
    } catch (e) {
      return (
        `stat ${p}: ` +
        `${(e as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file or directory' : (e as Error).message}`
      );
    }
  };
  if (candidate.includes('/')) {
    const problem = check(candidate);
    return problem ? { error: `exec: ${JSON.stringify(candidate)}: ${problem}` } : { path: candidate };
  }
  for (const dir of envPath.split(':')) {
    const p = path.join(dir === '' ? '.' : dir, candidate);
    if (check(p) === undefined) return { path: p };
  }
  return { error: `exec: ${JSON.stringify(candidate)}: executable file not found in $PATH` };
}

/**
 * The service's own settings, which no command inherits unless its hook passes them by name
 * (pass-environment-to-command): every MAIL_* and NOTIFY_* variable (the SMTP password and the
 * notification secrets among them), the hook and admin tokens, the service's own arguments
 * (WEBHOOK_CMD, which may carry -admin-token), and the paths to the service's credentials (its
 * kubeconfig, systemd's credentials).
 */
const SERVICE_ONLY_VARIABLES = ['HOOK_TOKEN', 'ADMIN_TOKEN', 'KUBECONFIG', 'CREDENTIALS_DIRECTORY', 'WEBHOOK_CMD'];
const SERVICE_ONLY_PREFIXES = ['MAIL_', 'NOTIFY_'];

/** The environment a command starts from: the service's, without its own settings and the template's. */
export function inheritedEnvironment(env: Environment, templateVariables: ReadonlySet<string>): Environment {
  const inherited: Environment = {};
  for (const [name, value] of Object.entries(env)) {
    const serviceOnly =
      SERVICE_ONLY_PREFIXES.some((prefix) => name.startsWith(prefix)) || SERVICE_ONLY_VARIABLES.includes(name);
    if (!serviceOnly && !templateVariables.has(name)) inherited[name] = value;
  }
  return inherited;
}

/**
 * What a kubeconfig's exec credential plugins start from: the commands' environment (inheritedEnvironment), and the
 * values withheld from it (the service's own secrets, the template's), taken out of what a plugin's error quotes.
 */
export function execEnvironment(env: Environment, templateVariables: ReadonlySet<string>): ExecEnvironment {
  const inherited = inheritedEnvironment(env, templateVariables);
  const withheld = Object.entries(env).filter(([name, value]) => value && !Object.hasOwn(inherited, name));
  return { env: inherited, secrets: withheld.map(([, value]) => value!) };
}

/** A taken command slot: the command as resolved for this request, and which pool it came from. */
interface Slot {
  resolved: { path?: string; error?: string };
  inProcess: boolean;
}

/** A hook's command as the runner will run it: resolved as adnanh does, or as the in-process command. */
export function resolveHookCommand(hook: Hook, envPath: string, inProcess: InProcessCommand | undefined): Slot {
  const resolved = resolveCommand(hook.command, hook.workingDirectory, envPath);
  if (!inProcess) return { resolved, inProcess: false };
  if (resolved.path !== undefined) return { resolved, inProcess: inProcess.handles(resolved.path) };
  const missing = hook.command === inProcess.command && !fs.existsSync(hook.command);
  return missing ? { resolved: { path: hook.command }, inProcess: true } : { resolved, inProcess: false };
}

/** What a command is started with, resolved from the hook's parameters for one request. */
interface CommandInputs {
  args: string[];
  env: Environment;
  envNames: string[];
  tempFiles: string[];
  /** An in-process command's argument 1 when it is the request's entire payload: its JSON value, no text made. */
  payload?: { value: unknown };
}

/** A request's entire payload as its JSON value (asMarshalled); undefined when JSON could not write it. */
function payloadValue(payload: unknown): { value: unknown } | undefined {
  try {
    return { value: asMarshalled(payload) };
  } catch {
    return undefined;
  }
}

export class CommandRunner<R = unknown> {
  private processes = 0;
  private inProcessRunning = 0;
  private readonly children = new Set<ChildProcess>();
  private readonly idleWaiters: (() => void)[] = [];
  private readonly max: number;
  private readonly env: Environment;
  /** inheritedEnvironment per hook (keyed by its template variables), computed once, never changed. */
  private readonly inherited = new WeakMap<ReadonlySet<string>, Readonly<Environment>>();
  private readonly log: Logger;
  private readonly metrics: Metrics;
  private readonly inProcess: InProcessCommand<R> | undefined;

  /**
   * `env` is the service's environment: the PATH commands are found on, and what they inherit less
   * the service's own settings (inheritedEnvironment).
   */
  constructor(max: number, env: Environment, log: Logger, metrics: Metrics, inProcess?: InProcessCommand<R>) {
    this.max = max;
    this.env = env;
    this.log = log;
    this.metrics = metrics;
    this.inProcess = inProcess;
  }

  /** Whether a command run in-process (or else as a process) finds a slot now. */
  private roomFor(inProcess: boolean): boolean {
    return inProcess ? this.inProcessRunning < LIMITS.maxPendingUpgrades : this.processes < this.max;
  }

  /** Whether a command of this hook finds a slot now (none is taken): a busy answer can come before the body. */
  hasRoom(hook: Hook): boolean {
    // The hook's command is resolved (a stat) only when that decides it: one kind has room and the other has none.
    if (!this.inProcess || this.roomFor(true) === this.roomFor(false)) return this.roomFor(false);
    return this.roomFor(resolveHookCommand(hook, this.env.PATH ?? '', this.inProcess).inProcess);
  }

  /**
   * Takes a slot for the hook's command; undefined when all are busy (the caller answers 503).
   * Processes and in-process commands are bounded separately: the cap on processes bounds forks,
   * while an upgrade waiting behind its workload's earlier pushes costs only memory.
   */
  tryAcquire(hook: Hook): Slot | undefined {
    const { resolved, inProcess } = resolveHookCommand(hook, this.env.PATH ?? '', this.inProcess);
    if (!this.roomFor(inProcess)) return undefined;
    if (inProcess) this.inProcessRunning++;
    else this.processes++;
    this.metrics.setGauge('webhook_commands_running', {}, this.processes + this.inProcessRunning);
    return { resolved, inProcess };
  }

  private release(slot: Slot): void {
    if (slot.inProcess) this.inProcessRunning--;
    else this.processes--;
    this.metrics.setGauge('webhook_commands_running', {}, this.processes + this.inProcessRunning);
    if (this.processes + this.inProcessRunning === 0) this.idleWaiters.splice(0).forEach((w) => w());
  }

  /**
   * The environment one request's command starts from: an object of its own for the variables the hook adds, whose
   * prototype is the inherited environment, shared by every request (never written: a variable the hook sets is
   * the request's own property). A follow keeps its command's environment until its mail goes, so a release's
   * thousands of follows would otherwise each hold a copy of the service's whole environment. child_process takes
   * inherited properties too, and every reader here reads variables by name.
   */
  private inheritedFor(hook: Hook): Environment {
    const key = hook.templateVariables;
    let env = this.inherited.get(key);
    if (!env) this.inherited.set(key, (env = inheritedEnvironment(this.env, key)));
    return Object.create(env) as Environment;
  }

  /** Runs the hook's command for this request in the slot the caller took; released here. */
  async run(hook: Hook, req: HookRequest, slot: Slot): Promise<CommandResult<R>> {
    const started = process.hrtime.bigint();
    const tag = `[${req.id}]`;
    const inputs: CommandInputs = { args: [], env: this.inheritedFor(hook), envNames: [], tempFiles: [] };
    try {
      const result = await this.start(hook, req, slot, inputs).catch(
        (e: Error): CommandResult<R> => ({
          output: '',
          env: inputs.env,
          ok: false,
          exitCode: null,
          timedOut: false,
          error: e.message,
        }),
      );
      this.metrics.inc('webhook_commands_total', {
        hook: hook.id,
        result: result.ok ? 'success' : result.timedOut ? 'timeout' : 'failure',
      });
      if (result.timedOut) this.metrics.inc('webhook_command_timeouts_total', { hook: hook.id });
      return result;
    } finally {
      for (const f of inputs.tempFiles) {
        this.log.debug(`${tag} removing file ${f}`);
        await fsp
          .rm(f, { force: true })
          .catch((e: Error) => this.log.error(`${tag} error removing file ${f}: ${e.message}`));
      }
      const seconds = Number(process.hrtime.bigint() - started) / 1e9;
      this.metrics.observe('webhook_command_duration_seconds', { hook: hook.id }, seconds);
      this.log.info(`${tag} finished handling ${hook.id}`);
      this.release(slot);
    }
  }

  private async start(hook: Hook, req: HookRequest, slot: Slot, inputs: CommandInputs): Promise<CommandResult<R>> {
    const tag = `[${req.id}]`;
    const resolved = slot.resolved;
    if (!resolved.path) {
      this.log.error(`${tag} error in ${resolved.error}`);
      if (hook.command.includes(' '))
        this.log.error(`${tag} use 'pass-arguments-to-command' to specify args for '${hook.command.split(/\s+/)[0]}'`);
      return { output: '', env: inputs.env, ok: false, exitCode: null, timedOut: false, error: resolved.error };
    }
    await this.resolveInputs(hook, req, inputs, slot.inProcess);
    const how = slot.inProcess ? `${this.inProcess!.name}, in-process` : resolved.path;
    const env = inputs.envNames.join(', ') || '(none added)';
    this.log.info(
      `${tag} executing ${hook.command} (${how}) with ${inputs.args.length} argument(s) and environment ${env} ` +
        `using ${hook.workingDirectory || '(current directory)'} as cwd`,
    );
    const timeoutMs = hook.commandTimeoutMs;
    const result = slot.inProcess
      ? await this.runInProcess(inputs, timeoutMs, req.id, hook)
      : await this.spawnCommand(resolved.path, hook.command, inputs, hook.workingDirectory, timeoutMs, tag);
    this.log.info(`${tag} command output: ${result.output}`);
    if (!result.ok) this.log.error(`${tag} hook ${hook.id}: command ${hook.command} failed: ${result.error}`);
    return result;
  }

  /** Arguments, environment variables and temp files from the hook's parameters, as adnanh does. */
  private async resolveInputs(hook: Hook, req: HookRequest, inputs: CommandInputs, inProcess: boolean): Promise<void> {
    const tag = `[${req.id}]`;
    inputs.payload = inProcess && hook.args[0]?.source === 'entire-payload' ? payloadValue(req.payload) : undefined;
    inputs.args = hook.args.map((p, i) => {
      // The in-process command reads the payload itself: no JSON text is written for it to parse again.
      if (i === 0 && inputs.payload) return '';
      try {
        return resolveParameter(p, req);
      } catch (e) {
        this.log.info(
          `${tag} error extracting command arguments: couldn't retrieve argument for ${JSON.stringify(p)}: ` +
            `${(e as Error).message}`,
        );
        return '';
      }
    });
    for (const p of hook.env) {
      try {
        const name = p.envname || `HOOK_${p.name}`;
        inputs.env[name] = resolveParameter(p, req);
        inputs.envNames.push(name);
      } catch (e) {
        this.log.info(`${tag} error extracting command arguments for environment: ${(e as Error).message}`);
      }
    }
    for (const p of hook.files) {
      let data: Buffer;
      try {
        const value = resolveParameter(p, req);
        data = p.base64decode ? decodeBase64Strict(value) : Buffer.from(value);
      } catch (e) {
        this.log.info(`${tag} error extracting command arguments for file: ${(e as Error).message}`);
        continue;
      }
      const file = path.join(hook.workingDirectory || tmpdir(), `${p.envname}${randomBytes(6).readUIntBE(0, 6)}`);
      try {
        await fsp.writeFile(file, data, { mode: 0o600, flag: 'wx' });
      } catch (e) {
        // As adnanh: the command runs without this file.
        this.log.error(`${tag} error creating temp file [${(e as Error).message}]`);
        continue;
      }
      inputs.tempFiles.push(file);
      inputs.env[p.envname] = file;
      inputs.envNames.push(p.envname);
      this.log.debug(`${tag} writing env ${p.envname} file ${file}`);
    }
  }

  /** An in-process command under the hook's timeout; it bounds its own calls and finishes in order. */
  private async runInProcess(
    inputs: CommandInputs,
    timeoutMs: number,
    requestId: string,
    hook: Hook,
  ): Promise<CommandResult<R>> {
    const env = inputs.env;
    const running = this.inProcess!.run(inputs.args, env, requestId, hook, inputs.payload);
    // This only stops the answer from waiting longer than the hook allows.
    const timedOut =
      timeoutMs > 0
        ? sleep(timeoutMs, undefined, { ref: false }).then(() => undefined)
        : new Promise<undefined>(() => {});
    const r = await Promise.race([running, timedOut]);
    if (!r)
      return {
        output: '',
        env,
        ok: false,
        exitCode: null,
        timedOut: true,
        error: `timed out after ${formatGoDuration(timeoutMs)}`,
      };
    const error = r.exitCode === 0 ? undefined : `exit status ${r.exitCode}`;
    return {
      output: this.log.scrub(r.output),
      env,
      ok: r.exitCode === 0,
      exitCode: r.exitCode,
      timedOut: false,
      error,
      report: r.report,
      accepted: r.accepted,
      badInput: r.badInput,
    };
  }

  private spawnCommand(
    file: string,
    argv0: string,
    inputs: CommandInputs,
    cwd: string,
    timeoutMs: number,
    tag: string,
  ): Promise<CommandResult<never>> {
    const env = inputs.env;
    return new Promise((resolve) => {
      let child: ChildProcess;
      try {
        // detached: the command leads its own process group, so a timeout or shutdown can kill
        // everything it started, not just the first process.
        child = spawn(file, inputs.args, {
          argv0,
          cwd: cwd || undefined,
          env,
          detached: true,
          stdio: ['ignore', 'pipe', 'pipe'],
        });
      } catch (e) {
        resolve({ output: '', env, ok: false, exitCode: null, timedOut: false, error: (e as Error).message });
        return;
      }
      this.children.add(child);
      const output = collectOutput(child);
      let timedOut = false;
      let spawnError: string | undefined;
      const timer =
        timeoutMs > 0
          ? setTimeout(() => {
              timedOut = true;
              this.log.error(
                `${tag} command ${argv0} timed out after ${formatGoDuration(timeoutMs)}; killing its process group`,
              );
              this.killGroup(child);
            }, timeoutMs)
          : undefined;
      child.on('error', (e) => {
        spawnError = e.message;
      });
      child.on('close', (code, signal) => {
        clearTimeout(timer);
        this.children.delete(child);
        // A command that prints its environment would show values a template read (the token).
        const text = this.log.scrub(output());
        const error =
          spawnError ??
          (timedOut
            ? `timed out after ${formatGoDuration(timeoutMs)}`
            : signal
              ? `signal: ${signal}`
              : code !== 0
                ? `exit status ${code}`
                : undefined);
        resolve({ output: text, env, ok: error === undefined, exitCode: code, timedOut, error });
      });
    });
  }

  /** SIGTERM to the whole process group, then SIGKILL if it is still there. */
  private killGroup(child: ChildProcess): void {
    const signal = (s: NodeJS.Signals) => {
      try {
        process.kill(-child.pid!, s);
      } catch {
        /* already gone */
      }
    };
    signal('SIGTERM');
    setTimeout(() => signal('SIGKILL'), LIMITS.killAfterTermMs).unref();
  }

  /** Waits for running commands up to graceMs, then kills what is left. */
  async drain(graceMs: number): Promise<void> {
    const running = this.processes + this.inProcessRunning;
    if (running === 0) return;
    this.log.notice(`waiting up to ${formatGoDuration(graceMs)} for ${running} running command(s)`);
    const idle = new Promise<void>((r) => this.idleWaiters.push(r));
    const timedOut = await Promise.race([
      idle.then(() => false),
      new Promise<boolean>((r) => setTimeout(() => r(true), graceMs).unref()),
    ]);
    if (!timedOut) return;
    this.log.error(`grace period over; killing ${this.children.size} command(s)`);
    for (const child of this.children) this.killGroup(child);
    await Promise.race([idle, new Promise((r) => setTimeout(r, LIMITS.killAfterTermMs + 1000).unref())]);
  }
}

/**
 * Collects a child's stdout and stderr in arrival order, up to maxCommandOutputBytes (the rest
 * is dropped with a marker, so a chatty command cannot exhaust memory). Returns a reader.
 */
function collectOutput(child: ChildProcess): () => string {
  const chunks: Buffer[] = [];
  let size = 0;
  let truncated = false;
  const collect = (chunk: Buffer) => {
    if (size >= LIMITS.maxCommandOutputBytes) {
      truncated = true;
      return;
    }
    chunks.push(chunk.subarray(0, LIMITS.maxCommandOutputBytes - size));
    size += chunk.length;
  };
  child.stdout!.on('data', collect);
  child.stderr!.on('data', collect);
  return () =>
    Buffer.concat(chunks).toString('utf8') +
    (truncated ? `\n[output truncated at ${LIMITS.maxCommandOutputBytes} bytes]` : '');
}

/**
 * Strict standard base64 with correct padding; whitespace (line wrapping) is ignored. Buffer.from
 * would silently skip characters outside the alphabet, so "pa$$word" would decode to something.
 */
export function decodeBase64Strict(text: string): Buffer {
  const compact = text.replace(/\s+/g, '');
  if (!/^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/.test(compact))
    throw new Error('illegal base64 data');
  return Buffer.from(compact, 'base64');
}

// ================================================================================================
// 20. http server — routes `/`, `/healthz` and `/<urlprefix>/<id>` and answers with adnanh's exact strings. A hook
//    request is a list of steps: route, admit, prepare (all but the body), evaluate what the rule can decide without
//    the body, read the body if the hook uses it, evaluate the rest, dispatch, answer. A body is never kept when it
//    is not used, and one left unread is dropped as it arrives, within the size and idle limits. Every outcome is one
//    entry of ANSWERS; errors thrown by a step map to an entry in one place (answerForError). Every response carries
//    X-Request-Id; bodies are plain text and never sniffed. A finished command goes to the CommandListener main()
//    wires in (the rollout follow and the result). `/metrics` and the deliveries pages (AdminPages) have a listener
//    of their own (createMetricsHandler).
//    Approval links (`/approval/<token>`) are answered by the ApprovalPages main() wires in (the approvals chapter).
//    Exports: AdminPages, allowedMethods, answerClientError, ApprovalPages, CommandListener, createHandler,
//    createMetricsHandler, HandlerContext, PageAnswer.
//    Tests: test/adnanh-suite.test.ts, test/compat.test.ts, test/exposure.test.ts, test/runner.test.ts,
//    test/unit.test.ts.
// ================================================================================================

/** One way a request can end: status, body and headers (a step may override status and body). */
interface Answer {
  status: number;
  body: string;
  headers?: Record<string, string>;
  closeConnection?: boolean;
  /** A 503 that asks the client to come back: it carries Retry-After (retryAfter). */
  retry?: boolean;
}

/**
 * Retry-After of a 503 that asks the client to come back (slots busy, body memory full): 5 to 9 s, in turn. A
 * release's burst is refused in hundreds at once, and registries that honour Retry-After would all come back on
 * the same second, as one wave of connections whose objects outlive the young generation; spread, they come back
 * a fifth at a time, as slots free up.
 */
const RETRY_AFTER = { seconds: 5, spread: 5 };
let retryTurn = 0;
function retryAfter(): string {
  const seconds = RETRY_AFTER.seconds + retryTurn;
  retryTurn = (retryTurn + 1) % RETRY_AFTER.spread;
  return String(seconds);
}

const ANSWERS = {
  ok: { status: 200, body: 'OK' },
  pageNotFound: { status: 404, body: '404 page not found\n' },
  shuttingDown: { status: 503, body: 'Shutting down.', closeConnection: true },
  hookNotFound: { status: 404, body: 'Hook not found.' },
  methodNotAllowed: { status: 405, body: '' },
  bodyTooLarge: { status: 413, body: 'Request body too large.', closeConnection: true },
  bodyTimeout: { status: 408, body: 'Request body not received in time.', closeConnection: true },
  multipartError: { status: 500, body: 'Error occurred while parsing multipart form.' },
  ruleError: { status: 500, body: 'Error occurred while evaluating hook rules.' },
  // The status is the hook's trigger-rule-mismatch-http-response-code.
  notSatisfied: { status: 200, body: 'Hook rules were not satisfied.' },
  busy: { status: 503, body: 'Too many commands running; retry later.', retry: true },
  // The body is left unread: the connection closes.
  bodyMemoryFull: {
    status: 503,
    body: 'Too many request bodies in memory; retry later.',
    retry: true,
    closeConnection: true,
  },
  // Status and body are the hook's success-http-response-code and response-message or output.
  triggered: { status: 200, body: '' },
  commandFailed: {
    status: 500,
    body: "Error occurred while executing the hook's command. Please check your logs for more details.",
  },
  internalError: { status: 500, body: 'Internal error.' },
  // The admin listener's pages with -admin-token: a browser then asks for it (any user name).
  adminUnauthorized: {
    status: 401,
    body: 'Unauthorized: this page needs the -admin-token.',
    headers: { 'WWW-Authenticate': 'Basic realm="webhook admin", charset="UTF-8"', 'Cache-Control': 'no-store' },
  },
} satisfies Record<string, Answer>;

type AnswerName = keyof typeof ANSWERS;

/** Told of every command as it starts and when it has finished: the answer never waits for what it does. */
export interface CommandListener<R = unknown> {
  started?(hook: Hook, req: HookRequest): void;
  finished(hook: Hook, req: HookRequest, result: CommandResult<R>): void;
}

export interface HandlerContext<R = unknown> {
  options: Options;
  store: { current: Snapshot };
  runner: CommandRunner<R>;
  listener: CommandListener<R>;
  log: Logger;
  metrics: Metrics;
  isShuttingDown(): boolean;
  /** Whether SIGTERM has come and /healthz says "not ready", while hooks are still served. */
  isDraining?(): boolean;
  /** The approval links' pages, when the service signs links (-public-url, -approval-key-file). */
  approvals?: ApprovalPages;
}

/** One request on its way through the steps. */
interface Exchange {
  id: string;
  req: http.IncomingMessage;
  res: http.ServerResponse;
  snapshot: Snapshot;
  method: string;
  remote: { ip: string; addr: string };
  started: bigint;
  /** The hook, once admitted: it labels the request metric. */
  hook?: Hook;
  bodyLimits: BodyLimits;
  /** The body is being (or has been) read for the hook: an answer then has nothing left to drop. */
  bodyTaken?: boolean;
  /** The command run for the request, once dispatched: its body stays counted until it is done. */
  running?: Promise<unknown>;
}

interface BodyLimits {
  maxBodyBytes: number;
  bodyIdleTimeoutMs: number;
  /** What all requests share: the memory their bodies hold, and the turns bodies are parsed in. */
  shared: { memory: BodyMemory; parser: ParseTurns; queueTimeoutMs: number };
}

/**
 * Request body bytes held in memory, process-wide (-max-body-memory). A request reserves room for
 * its body before reading any of it; one that does not fit waits, in arrival order, up to a
 * deadline. Room is given back when the request and its command are done.
 */
class BodyMemory {
  private used = 0;
  private readonly waiting: { bytes: number; grant: () => void }[] = [];
  readonly limit: number;

  constructor(limit: number) {
    this.limit = limit;
  }

  /** Room for `bytes`: resolves with the function that gives it back, or undefined after `waitMs` without room. */
  reserve(bytes: number, waitMs: number): Promise<(() => void) | undefined> {
    return new Promise((resolve) => {
      const giveBack = () => {
        this.used -= bytes;
        this.grantWaiting();
      };
      const grant = () => {
        clearTimeout(timer);
        this.used += bytes;
        resolve(giveBack);
      };
      const entry = { bytes, grant };
      const timer = setTimeout(() => {
        this.waiting.splice(this.waiting.indexOf(entry), 1);
        resolve(undefined);
        this.grantWaiting();
      }, waitMs);
      this.waiting.push(entry);
      this.grantWaiting();
    });
  }

  private grantWaiting(): void {
    while (this.waiting.length > 0 && this.used + this.waiting[0].bytes <= this.limit) this.waiting.shift()!.grant();
  }
}

// Bodies are parsed in turns of the event loop, at most this many bytes a turn (one body however
// large): the new reader parses 256 KiB in a few milliseconds, so between turns the server goes
// on answering (GET /, other hooks) whatever the number of bodies waiting.
const PARSE_TURN_BYTES = 256 * 1024;

/** Parses bodies one turn at a time, process-wide, so that parsing never holds the event loop for long. */
class ParseTurns {
  private readonly jobs: { bytes: number; run: () => void }[] = [];
  private scheduled = false;

  /** `work`'s result, once its turn has come (the works of one turn run in the same task). */
  parse<T>(bytes: number, work: () => T): Promise<T> {
    const { promise, resolve } = Promise.withResolvers<void>();
    this.jobs.push({ bytes, run: resolve });
    this.schedule();
    return promise.then(work);
  }

  private schedule(): void {
    if (this.scheduled || this.jobs.length === 0) return;
    this.scheduled = true;
    setImmediate(() => this.turn());
  }

  private turn(): void {
    this.scheduled = false;
    let spent = 0;
    do {
      const job = this.jobs.shift()!;
      spent += job.bytes;
      job.run();
    } while (this.jobs.length > 0 && spent + this.jobs[0].bytes <= PARSE_TURN_BYTES);
    this.schedule();
  }
}

class BodyTooLarge extends Error {}
/** No room under -max-body-memory within -body-queue-timeout: 503 with Retry-After. */
class BodyMemoryFull extends Error {}
class BodyTimeout extends Error {}
/** A rule that could not be evaluated (a bad signature, a malformed date): adnanh answers 500. */
class RuleEvaluationError extends Error {}

/** The request id: a fresh UUID, or the client's X-Request-Id (made log-safe) with -x-request-id. */
function requestIdFor(req: http.IncomingMessage, o: Options): string {
  const incoming = req.headers['x-request-id'];
  if (o.xRequestId && typeof incoming === 'string' && incoming !== '') {
    const safe = incoming.replace(/[^A-Za-z0-9._:/+=-]/g, '_');
    return o.xRequestIdLimit > 0 ? safe.slice(0, o.xRequestIdLimit) : safe;
  }
  return randomUUID();
}

/** The request line for the access log, with compared parameters (the token) redacted. */
export function redactUrl(rawUrl: string, redacted: Set<string>): string {
  const q = rawUrl.indexOf('?');
  if (q < 0) return rawUrl;
  const parts = rawUrl
    .slice(q + 1)
    .split('&')
    .map((pair) => {
      const eq = pair.indexOf('=');
      if (eq < 0) return pair;
      let name: string;
      try {
        name = decodeURIComponent(pair.slice(0, eq).replace(/\+/g, ' '));
      } catch {
        name = pair.slice(0, eq);
      }
      return redacted.has(`url:${name}`) || name === 'token' ? `${pair.slice(0, eq)}=REDACTED` : pair;
    });
  return `${rawUrl.slice(0, q)}?${parts.join('&')}`;
}

/** The body length the request declares (Content-Length), or undefined. */
function declaredLength(req: http.IncomingMessage): number | undefined {
  const n = Number(req.headers['content-length']);
  return Number.isFinite(n) ? n : undefined;
}

/**
 * Receives what is left of the body: kept for the hook (beyond `budget`, -max-body-size, it is
 * BodyTooLarge), or read and dropped (`keep` false) after an answer that did not need it, up to
 * `budget` bytes. A body that goes -body-idle-timeout without data is BodyTimeout; on any error,
 * reading stops.
 */
function receiveBody(ex: Exchange, keep: boolean, budget = ex.bodyLimits.maxBodyBytes): Promise<Buffer> {
  const { req } = ex;
  const idleMs = ex.bodyLimits.bodyIdleTimeoutMs;
  const tooLarge = () => new BodyTooLarge(`request body larger than ${budget} bytes refused`);
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const finish = (error?: Error) => {
      clearTimeout(idle);
      req.off('data', onData).off('end', onEnd).off('close', onClose);
      if (!error) return resolve(Buffer.concat(chunks));
      req.pause();
      reject(error);
    };
    const idleFor = formatGoDuration(idleMs);
    const idle =
      idleMs > 0
        ? setTimeout(() => finish(new BodyTimeout(`no body data for ${idleFor}: request dropped`)), idleMs)
        : undefined;
    const onData = (c: Buffer) => {
      idle?.refresh();
      size += c.length;
      if (size > budget) return finish(tooLarge());
      if (keep) chunks.push(c);
    };
    const onEnd = () => finish();
    const onClose = () => finish(new Error('the connection closed before the body was complete'));
    if (keep && (declaredLength(req) ?? 0) > budget) return finish(tooLarge());
    req.on('data', onData).on('end', onEnd).on('close', onClose);
  });
}

function remoteAddress(socket: net.Socket): { ip: string; addr: string } {
  let ip = socket.remoteAddress ?? '';
  if (ip.startsWith('::ffff:') && net.isIPv4(ip.slice(7))) ip = ip.slice(7);
  const port = socket.remotePort ?? 0;
  if (ip === '') return { ip: '@', addr: '@' };
  return { ip, addr: net.isIPv6(ip) ? `[${ip}]:${port}` : `${ip}:${port}` };
}

export function createHandler<R>(cx: HandlerContext<R>): (req: http.IncomingMessage, res: http.ServerResponse) => void {
  const o = cx.options;
  const memory = new BodyMemory(o.maxBodyMemoryBytes);
  const shared = { memory, parser: new ParseTurns(), queueTimeoutMs: o.bodyQueueTimeoutMs };
  return (req, res) => {
    const ex: Exchange = {
      id: requestIdFor(req, cx.options),
      req,
      res,
      snapshot: cx.store.current,
      method: req.method ?? 'GET',
      remote: remoteAddress(req.socket),
      started: process.hrtime.bigint(),
      bodyLimits: { maxBodyBytes: o.maxBodyBytes, bodyIdleTimeoutMs: o.bodyIdleTimeoutMs, shared },
    };
    res.setHeader('X-Request-Id', ex.id);
    countWhenFinished(cx, ex);
    handleRequest(cx, ex).catch((e: unknown) => sendAnswer(cx, ex, answerForError(cx, ex, e)));
  };
}

/** The Allow header of a 405 from a hook that lists no methods (HEAD and OPTIONS need listing). */
const DEFAULT_ALLOW = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE'];

/** The methods a hook takes: its own list, else -http-methods; empty means any but HEAD and OPTIONS. */
function allowedMethods(hook: Hook, o: Options): string[] {
  return hook.methods.length ? hook.methods : o.httpMethods;
}

/** The Allow header a hook's 405 carries. */
function allowHeader(hook: Hook, o: Options): string {
  const allowed = allowedMethods(hook, o);
  return (allowed.length ? allowed : DEFAULT_ALLOW).join(', ');
}

/** The path hooks are served under: `/<urlprefix>/`, or `/` with an empty -urlprefix. */
function hookPathPrefix(o: Options): string {
  return o.urlprefix === '' ? '/' : `/${o.urlprefix}/`;
}

/** A URL path decoded as Go's router sees it; a malformed escape is kept as written. */
function decodePath(p: string): string {
  try {
    return decodeURIComponent(p);
  } catch {
    return p;
  }
}

/** What Node sends for a request its parser refused, by the parser's error code (else 400). */
const CLIENT_ERROR_STATUS: Record<string, number> = {
  HPE_HEADER_OVERFLOW: 431,
  HPE_CHUNK_EXTENSIONS_OVERFLOW: 413,
  ERR_HTTP_REQUEST_TIMEOUT: 408,
};

/**
 * A request Node's parser refused before any handler ran. Go takes any token as a method (`Get`)
 * and adnanh answers it at a hook's path with 405, while Node's parser knows only the registered
 * upper-case methods: so the request line is read here and a hook path answered as adnanh does.
 * Anything else gets the status Node itself would send.
 */
export function answerClientError(
  cx: HandlerContext,
  err: Error & { code?: string; rawPacket?: Buffer },
  socket: net.Socket,
): void {
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  const line = /^([!#$%&'*+.^_`|~0-9A-Za-z-]+) (\S+) HTTP\/1\.[01]\r?\n/.exec(err.rawPacket?.toString('latin1') ?? '');
  const prefix = hookPathPrefix(cx.options);
  if (err.code !== 'HPE_INVALID_METHOD' || !line || !line[2].startsWith(prefix)) {
    const status = CLIENT_ERROR_STATUS[err.code ?? ''] ?? 400;
    socket.end(`HTTP/1.1 ${status} ${http.STATUS_CODES[status]}\r\nConnection: close\r\n\r\n`);
    return;
  }
  const id = randomUUID();
  const method = line[1];
  const hookId = decodePath(line[2].slice(prefix.length).split('?')[0]);
  cx.log.info(`[${id}] incoming HTTP ${method} request from ${remoteAddress(socket).addr}`);
  const hook = cx.store.current.hooks.get(hookId);
  if (hook) cx.log.info(`[${id}] HTTP ${method} method not allowed for hook ${JSON.stringify(hook.id)}`);
  else cx.log.info(`[${id}] error: hook not found: ${escapeControls(hookId)}`);
  const entry: Answer = ANSWERS[hook ? 'methodNotAllowed' : 'hookNotFound'];
  const head = [
    `HTTP/1.1 ${entry.status} ${http.STATUS_CODES[entry.status]}`,
    ...(hook ? [`Allow: ${allowHeader(hook, cx.options)}`] : []),
    `X-Request-Id: ${id}`,
    'Content-Type: text/plain; charset=utf-8',
    'X-Content-Type-Options: nosniff',
    `Content-Length: ${Buffer.byteLength(entry.body)}`,
    'Connection: close',
  ];
  cx.metrics.inc('webhook_requests_total', { hook: hook?.id ?? '', code: String(entry.status) });
  cx.log.whenWritten(() => socket.end(`${head.join('\r\n')}\r\n\r\n${entry.body}`));
}

/** Counts every answer once it has gone. */
function countWhenFinished(cx: HandlerContext, ex: Exchange): void {
  ex.res.on('finish', () => {
    cx.metrics.inc('webhook_requests_total', { hook: ex.hook?.id ?? '', code: String(ex.res.statusCode) });
  });
}

/** With -verbose, the access-log line (written with the request's other lines, before its answer). */
function logAccess(cx: HandlerContext, ex: Exchange, entry: Answer): void {
  if (cx.log.verbose) {
    const ms = Number(process.hrtime.bigint() - ex.started) / 1e6;
    const requestLine = escapeControls(`${ex.method} ${redactUrl(ex.req.url ?? '', ex.snapshot.redactedParams)}`);
    const line = `"${requestLine}" ${entry.status}`;
    cx.log.info(`[${ex.id}] ${ex.remote.addr} ${line} ${Buffer.byteLength(entry.body)}B ${ms.toFixed(1)}ms`);
  }
}

async function handleRequest(cx: HandlerContext, ex: Exchange): Promise<void> {
  if (cx.isShuttingDown()) return sendAnswer(cx, ex, 'shuttingDown');
  const approvals = cx.approvals;
  if (approvals && (ex.req.url ?? '').startsWith(approvals.prefix)) return answerApproval(cx, ex, approvals);
  const route = routeOf(cx, ex);
  if (route.kind === 'answer') return sendAnswer(cx, ex, route.name, route.override);
  const hook = admit(cx, ex, route.hookId);
  if (typeof hook === 'string') return sendAnswer(cx, ex, hook);
  const hookReq = prepareRequest(cx, ex, hook, route.url);
  const notSatisfied = () => sendAnswer(cx, ex, 'notSatisfied', { status: hook.mismatchCode });
  const soft = hook.softSignatureFailures;
  const early = hook.rule ? evaluateRuleBeforeBody(hook.rule, hookReq, soft) : { ok: true };
  if (early && !satisfied(cx, ex, hook, early)) return notSatisfied();
  // A command that would find every slot busy is answered so before its body is read, kept and parsed.
  if (early && !cx.runner.hasRoom(hook)) return answerBusy(cx, ex, hook);
  const kept = await readRequestBody(ex, hook, hookReq, !early);
  // Signatures are checked on the raw bytes: a body is parsed only for a request they let through.
  const beforeParse = early ?? evaluateRuleBeforeParse(hook.rule!, hookReq, soft);
  if (beforeParse && !satisfied(cx, ex, hook, beforeParse)) return notSatisfied();
  if (kept) await parseRequestBody(cx, ex, hook, hookReq);
  if (!beforeParse && !satisfied(cx, ex, hook, evaluateRule(hook.rule!, hookReq, soft))) return notSatisfied();
  return dispatch(cx, ex, hook, hookReq);
}

type Route =
  | { kind: 'answer'; name: AnswerName; override?: Partial<Answer> }
  | { kind: 'hook'; hookId: string; url: URL };

/** Step 1, route: the fixed paths answer at once; a path under the prefix names a hook. */
function routeOf(cx: HandlerContext, ex: Exchange): Route {
  const o = cx.options;
  const url = new URL(ex.req.url ?? '/', 'http://localhost');
  const pathname = decodePath(url.pathname);
  if (pathname === '/healthz') return { kind: 'answer', name: cx.isDraining?.() ? 'shuttingDown' : 'ok' };
  if (pathname === '/') return { kind: 'answer', name: 'ok', override: { headers: Object.fromEntries(o.headers) } };
  const prefix = hookPathPrefix(o);
  if (!pathname.startsWith(prefix)) return { kind: 'answer', name: 'pageNotFound' };
  return { kind: 'hook', hookId: pathname.slice(prefix.length), url };
}

/** Step 2, admit: the hook exists and takes this method. Returns the hook or the answer's name. */
function admit(cx: HandlerContext, ex: Exchange, hookId: string): Hook | AnswerName {
  const tag = `[${ex.id}]`;
  cx.log.info(`${tag} incoming HTTP ${ex.method} request from ${ex.remote.addr}`);
  const hook = ex.snapshot.hooks.get(hookId);
  if (!hook) {
    cx.log.info(`${tag} error: hook not found: ${escapeControls(hookId)}`);
    return 'hookNotFound';
  }
  ex.hook = hook;
  // adnanh lets any method trigger a hook with no methods configured; HEAD and OPTIONS (link
  // checkers, CORS preflights) must then not run a command, so they need listing explicitly.
  const allowed = allowedMethods(hook, cx.options);
  if (allowed.length ? !allowed.includes(ex.method) : ex.method === 'HEAD' || ex.method === 'OPTIONS') {
    cx.log.info(`${tag} HTTP ${ex.method} method not allowed for hook ${JSON.stringify(hook.id)}`);
    ex.res.setHeader('Allow', allowHeader(hook, cx.options));
    return 'methodNotAllowed';
  }
  cx.log.info(`${tag} ${hook.id} got matched`);
  for (const [name, value] of cx.options.headers) ex.res.setHeader(name, value);
  return hook;
}

/**
 * Step 3, prepare: the request without its body — headers, query, what parse-parameters-as-json
 * makes of them — which is all the rule needs until it reaches a match that reads the body.
 */
function prepareRequest(cx: HandlerContext, ex: Exchange, hook: Hook, url: URL): HookRequest {
  const contentType = requestContentType(ex, hook);
  const hookReq: HookRequest = {
    id: ex.id,
    method: ex.method,
    remoteAddr: ex.remote.addr,
    remoteIp: ex.remote.ip,
    headers: hook.readsHeaders ? headersFromRaw(ex.req.rawHeaders) : {},
    query: firstValues(url.searchParams),
    payload: undefined,
    body: Buffer.alloc(0),
    multipart: contentType.startsWith('multipart/form-data;'),
  };
  // adnanh logs an unsupported content type before it evaluates the rules; the type alone says so.
  if (!hookReq.multipart && !isParsedContentType(contentType)) {
    const { note } = parsePayload(contentType, hookReq.body, []);
    if (note) cx.log.info(`[${ex.id}] ${escapeControls(note)}`);
  }
  for (const err of applyJsonParameters(
    hook.jsonParams.filter((p) => !paramReadsBody(p)),
    hookReq,
  ))
    cx.log.info(`[${ex.id}] ${escapeControls(err)}`);
  return hookReq;
}

function requestContentType(ex: Exchange, hook: Hook): string {
  return hook.contentType || (ex.req.headers['content-type'] ?? '');
}

/**
 * Steps 4 and 6, a rule's result as adnanh reports it (a missing parameter is logged): false when
 * not satisfied; throws when the rule could not be evaluated.
 */
function satisfied(cx: HandlerContext, ex: Exchange, hook: Hook, result: RuleResult): boolean {
  // A signature or date error quotes what the request sent.
  const why = result.error ? escapeControls(result.error.message) : '';
  if (result.error && !(result.error instanceof ParameterNotFound)) throw new RuleEvaluationError(why);
  if (result.error) cx.log.info(`[${ex.id}] ${why}`);
  if (!result.ok)
    cx.log.info(
      `[${ex.id}] ${hook.id} got matched, but didn't get triggered because the trigger rules were not satisfied`,
    );
  return result.ok;
}

/**
 * Step 5, read: the body, when the rule (`ruleNeedsIt`) or the command uses it (true: it was kept).
 * A multipart body is kept whatever the hook uses, since a malformed one is answered with 500 (as
 * adnanh does). An unused body is still received to its end (and dropped), so no command runs
 * for a request that never completes; one declared larger than -max-body-size is refused even
 * when unused. A kept body first takes room under -max-body-memory, until the request and its
 * command are done; none within -body-queue-timeout is BodyMemoryFull.
 */
async function readRequestBody(
  ex: Exchange,
  hook: Hook,
  hookReq: HookRequest,
  ruleNeedsIt: boolean,
): Promise<boolean> {
  const { maxBodyBytes, shared } = ex.bodyLimits;
  if ((declaredLength(ex.req) ?? 0) > maxBodyBytes)
    throw new BodyTooLarge(`request body larger than ${maxBodyBytes} bytes refused`);
  const keep = ruleNeedsIt || hook.usesBody || hookReq.multipart === true;
  if (keep) {
    const release = await shared.memory.reserve(declaredLength(ex.req) ?? maxBodyBytes, shared.queueTimeoutMs);
    if (!release)
      throw new BodyMemoryFull(
        `no room for the request body within ${formatGoDuration(shared.queueTimeoutMs)} ` +
          `(-max-body-memory ${shared.memory.limit} bytes in use); answering 503`,
      );
    // 'close' comes once per response: the room is given back once.
    ex.res.once('close', () => void (ex.running ?? Promise.resolve()).then(release, release));
  }
  ex.bodyTaken = true;
  // A client waiting for `100 Continue` is asked for its body only now; an answer given before
  // this point never invites it.
  if (/^100-continue$/i.test(ex.req.headers.expect ?? '')) ex.res.writeContinue();
  const body = await receiveBody(ex, keep);
  if (keep) hookReq.body = body;
  return keep;
}

/**
 * Step 6, parse: the payload from a kept body, in the process-wide parse turns (ParseTurns), and
 * the parameters parse-parameters-as-json takes from it. A hook that never reads the payload
 * does not pay for parsing it.
 */
async function parseRequestBody(cx: HandlerContext, ex: Exchange, hook: Hook, hookReq: HookRequest): Promise<void> {
  const contentType = requestContentType(ex, hook);
  const jsonParts = hook.jsonParams.filter((p) => p.source === 'payload').map((p) => p.name);
  if (hookReq.multipart || (hook.readsPayload && isParsedContentType(contentType))) {
    const parse = () => parsePayload(contentType, hookReq.body, jsonParts);
    const parsed = await ex.bodyLimits.shared.parser.parse(hookReq.body.length, parse);
    cx.metrics.inc('webhook_bodies_parsed_total', { hook: hook.id });
    hookReq.payload = parsed.payload;
    if (parsed.note) cx.log.info(`[${ex.id}] ${parsed.note}`);
  }
  for (const err of applyJsonParameters(hook.jsonParams.filter(paramReadsBody), hookReq))
    cx.log.info(`[${ex.id}] ${err}`);
}

/** Step 7, dispatch: a command slot, the command, and the answer adnanh gives for its outcome. */
async function dispatch(cx: HandlerContext, ex: Exchange, hook: Hook, hookReq: HookRequest): Promise<void> {
  const slot = cx.runner.tryAcquire(hook);
  if (!slot) return answerBusy(cx, ex, hook);
  cx.log.info(`[${ex.id}] ${hook.id} hook triggered successfully`);
  for (const [name, value] of hook.responseHeaders) ex.res.setHeader(name, value);
  cx.listener.started?.(hook, hookReq);
  const running = cx.runner.run(hook, hookReq, slot);
  const told = running.then((r) => {
    // What follows the command (a rollout followed for minutes, its record, its mail) needs neither the body nor
    // the payload: a release's thousands of follows would each hold them.
    hookReq.body = Buffer.alloc(0);
    hookReq.payload = undefined;
    cx.listener.finished(hook, hookReq, r);
    return r;
  });
  ex.running = told;
  if (!hook.captureOutput) {
    told.catch((e: Error) => cx.log.error(`[${ex.id}] ${e.message}`));
    return sendAnswer(cx, ex, 'triggered', { status: hook.successCode, body: hook.responseMessage });
  }
  const result = await told;
  if (result.ok)
    return sendAnswer(cx, ex, 'triggered', { status: result.accepted ? 202 : hook.successCode, body: result.output });
  // A malformed push is the sender's to fix: 400 tells a registry not to send it again.
  const status = result.badInput ? { status: 400 } : {};
  return sendAnswer(cx, ex, 'commandFailed', hook.captureOutputOnError ? { ...status, body: result.output } : status);
}

function answerBusy(cx: HandlerContext, ex: Exchange, hook: Hook): void {
  cx.metrics.inc('webhook_commands_rejected_total', { hook: hook.id });
  cx.log.error(`[${ex.id}] ${hook.id}: all command slots are busy; answering 503`);
  sendAnswer(cx, ex, 'busy');
}

/** The answer for an error a step threw, logged as adnanh logs it. */
function answerForError(cx: HandlerContext, ex: Exchange, e: unknown): AnswerName {
  const tag = `[${ex.id}]`;
  const message = e instanceof Error ? e.message : String(e);
  if (e instanceof BodyTooLarge) {
    cx.log.error(`${tag} ${ex.hook?.id}: ${message}`);
    return 'bodyTooLarge';
  }
  if (e instanceof BodyTimeout) {
    cx.log.error(`${tag} ${ex.hook?.id}: ${message}`);
    return 'bodyTimeout';
  }
  if (e instanceof BodyMemoryFull) {
    cx.log.error(`${tag} ${ex.hook?.id}: ${message}`);
    cx.metrics.inc('webhook_bodies_refused_total', { hook: ex.hook?.id ?? '' });
    return 'bodyMemoryFull';
  }
  if (e instanceof MultipartError) {
    cx.log.error(`${tag} error parsing multipart form: ${escapeControls(message)}`);
    return 'multipartError';
  }
  if (e instanceof RuleEvaluationError) {
    cx.log.error(`${tag} error evaluating hook: ${message}`);
    return 'ruleError';
  }
  cx.log.error(`${tag} internal error: ${escapeControls(e instanceof Error ? (e.stack ?? message) : message)}`);
  return 'internalError';
}

/** An approval link's answer: a small HTML page, and its status. */
export interface PageAnswer {
  status: number;
  body: string;
  headers: Record<string, string>;
}

/**
 * The approval links on the hook port (the approvals chapter): GET shows what the link decides and a form;
 * only its POST decides, so a chat's link preview or crawler never approves anything.
 */
export interface ApprovalPages {
  /** The path links live under ("/approval/"); the rest of the path is the signed token. */
  readonly prefix: string;
  answer(
    method: 'GET' | 'POST',
    token: string,
    form: URLSearchParams | undefined,
    remoteIp: string,
  ): Promise<PageAnswer>;
}

// A confirmation form holds a name and a button: more is not a form of ours.
const MAX_APPROVAL_FORM_BYTES = 4096;

/** A small url-encoded form body, or undefined when it is larger than `max` or does not arrive in time. */
async function readSmallForm(
  req: http.IncomingMessage,
  max: number,
  idleMs: number,
): Promise<URLSearchParams | undefined> {
  if ((declaredLength(req) ?? 0) > max) return undefined;
  const chunks: Buffer[] = [];
  let size = 0;
  const read = (async () => {
    for await (const chunk of req as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > max) return false;
      chunks.push(chunk);
    }
    return true;
  })();
  const timeout = sleep(idleMs, false, { ref: false });
  if (!(await Promise.race([read, timeout]))) return undefined;
  return new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
}

/** Step 1 for an approval link: GET the page, POST its form; the token is kept out of the access log. */
async function answerApproval(cx: HandlerContext, ex: Exchange, pages: ApprovalPages): Promise<void> {
  const token = decodePath(new URL(ex.req.url ?? '/', 'http://localhost').pathname).slice(pages.prefix.length);
  ex.req.url = `${pages.prefix}…`;
  if (ex.method !== 'GET' && ex.method !== 'HEAD' && ex.method !== 'POST')
    return sendAnswer(cx, ex, 'methodNotAllowed', { headers: { Allow: 'GET, HEAD, POST' } });
  let form: URLSearchParams | undefined;
  if (ex.method === 'POST') {
    ex.bodyTaken = true;
    form = await readSmallForm(ex.req, MAX_APPROVAL_FORM_BYTES, cx.options.bodyIdleTimeoutMs);
    if (!form) return sendAnswer(cx, ex, 'bodyTooLarge');
  }
  const page = await pages.answer(ex.method === 'POST' ? 'POST' : 'GET', token, form, ex.remote.ip);
  return sendAnswer(cx, ex, 'ok', {
    status: page.status,
    body: ex.method === 'HEAD' ? '' : page.body,
    headers: page.headers,
  });
}

/**
 * Pages the admin listener serves besides /metrics (the deliveries page), behind
 * -admin-token when one is set.
 */
export interface AdminPages {
  /** The path the pages live under ("/deliveries"); longer paths start with it and a "/" or ".". */
  readonly prefix: string;
  /** The -admin-token ('' asks for none). */
  readonly token: string;
  /** The page at this path, or undefined (404). */
  page(pathname: string): { body: string; contentType: string; headers?: Record<string, string> } | undefined;
  /** A form posted to this path (Approve, Reject, Deploy again), or undefined (404). */
  action?(pathname: string, form: URLSearchParams, remoteIp: string): Promise<PageAnswer | undefined>;
}

/**
 * A form posted to the admin pages, once the token allowed it: the browser's Origin, when it sends one, must be
 * this listener's own (a page elsewhere cannot make a logged-in browser post).
 */
async function postedAdminForm(pages: AdminPages, req: http.IncomingMessage, pathname: string): Promise<Answer> {
  const origin = req.headers.origin;
  if (origin !== undefined && origin !== `http://${req.headers.host}` && origin !== `https://${req.headers.host}`)
    return { status: 403, body: 'Forbidden: the form was posted from another site.' };
  const form = await readSmallForm(req, MAX_APPROVAL_FORM_BYTES, LIMITS.adminFormTimeoutMs);
  if (!form) return ANSWERS.bodyTooLarge;
  const page = await pages.action!(pathname, form, remoteAddress(req.socket).ip);
  return page ?? ANSWERS.pageNotFound;
}

/**
 * Why a request to admin pages without -admin-token is refused, or undefined. They rest on the listener being
 * loopback, which a browser reaches too: a site whose name resolves to 127.0.0.1 (DNS rebinding) is the origin of
 * what answers there. So the Host must name this listener (its address or localhost, with its port), and a form
 * come from its own page (its Origin, or Sec-Fetch-Site: same-origin where none is sent).
 */
function tokenlessAdminRefusal(req: http.IncomingMessage): string | undefined {
  const host = req.headers.host ?? '';
  const address = (req.socket.localAddress ?? '').replace(/^::ffff:(?=[\d.]+$)/i, '').toLowerCase();
  const port = req.socket.localPort;
  const names = [address.includes(':') ? `[${address}]` : address, 'localhost'].map((n) => `${n}:${port}`);
  if (!names.includes(host.toLowerCase()) && !(port === 80 && names.includes(`${host.toLowerCase()}:80`)))
    return `Forbidden: the Host ${showValue(host)} does not name this listener (${names.join(' or ')}).`;
  const origin = req.headers.origin?.toLowerCase();
  if (req.method !== 'POST' || origin === `http://${host.toLowerCase()}`) return undefined;
  if (origin !== undefined || req.headers['sec-fetch-site'] !== 'same-origin')
    return "Forbidden: a form is taken only from this listener's own page (Origin, or Sec-Fetch-Site: same-origin).";
}

/**
 * The admin listener (-metrics-listen): /metrics, and the deliveries pages when given. It is apart
 * from the hook port, so publishing the hooks (an Ingress, a NodePort) does not publish the hook
 * ids, request counts, failures and pushes these reveal.
 */
function createMetricsHandler(metrics: Metrics, pages?: AdminPages): http.RequestListener {
  return (req, res) => {
    const pathname = new URL(req.url ?? '/', 'http://localhost').pathname;
    const readable = req.method === 'GET' || req.method === 'HEAD';
    let entry: Answer = ANSWERS.pageNotFound;
    let contentType = 'text/plain; charset=utf-8';
    const refused = pages?.token === '' ? tokenlessAdminRefusal(req) : undefined;
    if (refused) return writeAdminAnswer(req, res, { status: 403, body: `${refused}\n` }, contentType);
    if (pages?.action && req.method === 'POST' && isAdminPagePath(pages, pathname)) {
      const acting: Answer | Promise<Answer> = adminAuthorized(pages, req)
        ? postedAdminForm(pages, req, pathname)
        : ANSWERS.adminUnauthorized;
      void Promise.resolve(acting).then(
        (a: Answer) => writeAdminAnswer(req, res, a, a.headers?.['Content-Type'] ?? contentType),
        () => writeAdminAnswer(req, res, ANSWERS.internalError, contentType),
      );
      return;
    }
    if (pathname === '/metrics' && readable) {
      entry = { ...ANSWERS.ok, body: metrics.render() };
      contentType = 'text/plain; version=0.0.4; charset=utf-8';
    } else if (pages && readable && isAdminPagePath(pages, pathname)) {
      const allowed = adminAuthorized(pages, req);
      const page = allowed ? pages.page(pathname) : undefined;
      if (!allowed) entry = ANSWERS.adminUnauthorized;
      else if (page) {
        entry = { ...ANSWERS.ok, body: page.body, headers: page.headers };
        contentType = page.contentType;
      }
    }
    writeAdminAnswer(req, res, entry, contentType);
  };
}

function writeAdminAnswer(req: http.IncomingMessage, res: http.ServerResponse, entry: Answer, contentType: string) {
  for (const [name, value] of Object.entries(entry.headers ?? {})) res.setHeader(name, value);
  res.setHeader('Content-Type', contentType);
  res.setHeader('X-Content-Type-Options', 'nosniff');
  res.setHeader('Content-Length', Buffer.byteLength(entry.body));
  if (!req.complete) res.setHeader('Connection', 'close');
  res.writeHead(entry.status);
  res.end(req.method === 'HEAD' ? undefined : entry.body);
}

function isAdminPagePath(pages: AdminPages, pathname: string): boolean {
  return pathname === pages.prefix || /^[/.]/.test(pathname.slice(pages.prefix.length, pages.prefix.length + 1));
}

/** Whether the request carries -admin-token (any user name with it as password, or as a Bearer token). */
function adminAuthorized(pages: AdminPages, req: http.IncomingMessage): boolean {
  if (pages.token === '') return true;
  const auth = req.headers.authorization ?? '';
  let offered = '';
  const bearer = /^Bearer +(\S+)$/i.exec(auth);
  const basic = /^Basic +([A-Za-z0-9+/=]+)$/i.exec(auth);
  if (bearer) offered = bearer[1];
  else if (basic) {
    const decoded = Buffer.from(basic[1], 'base64').toString('utf8');
    offered = decoded.slice(decoded.indexOf(':') + 1);
  }
  // Compared as digests, so neither the time taken nor an early exit tells the token's length.
  const digest = (t: string) => createHash('sha256').update(t).digest();
  return timingSafeEqual(digest(offered), digest(pages.token));
}

/** Step 8, answer: writes the named entry, with a step's status, body and headers over it. */
function sendAnswer(cx: HandlerContext, ex: Exchange, name: AnswerName, override: Partial<Answer> = {}): void {
  const res = ex.res;
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const entry: Answer = { ...ANSWERS[name], ...override };
  for (const [header, value] of Object.entries(entry.headers ?? {})) res.setHeader(header, value);
  if (entry.retry) res.setHeader('Retry-After', retryAfter());
  if (!res.hasHeader('Content-Type')) res.setHeader('Content-Type', 'text/plain; charset=utf-8');
  res.setHeader('X-Content-Type-Options', 'nosniff');
  res.setHeader('Content-Length', Buffer.byteLength(entry.body));
  const unread = !ex.req.complete;
  const close = entry.closeConnection === true || (unread && !mayDrainUnreadBody(ex));
  if (close) res.setHeader('Connection', 'close');
  if (unread) settleUnreadBody(ex, close);
  res.writeHead(entry.status);
  logAccess(cx, ex, entry);
  cx.log.whenWritten(() => res.end(entry.body));
}

/**
 * Whether an answer given before the body was read (the rule failed without it, or the hook does
 * not use it) may keep the connection: the rest of the body is then read and dropped as it
 * arrives, within the size and idle limits. Not after a body the hook was reading failed, nor for
 * one declared larger than the limit, nor for one the client sends only after `100 Continue`.
 */
function mayDrainUnreadBody(ex: Exchange): boolean {
  const declared = declaredLength(ex.req) ?? 0;
  return (
    !ex.bodyTaken && declared <= ex.bodyLimits.maxBodyBytes && !/^100-continue$/i.test(ex.req.headers.expect ?? '')
  );
}

/**
 * What is left of a body the answer did not need. When the connection stays, it is read and
 * dropped, never kept: Node drains a body of declared length itself (no more than -max-body-size
 * then, and its keep-alive timeout drops one that stalls), and one of unknown length is read here,
 * within the size and idle limits. When the connection closes, nothing more is read.
 */
function settleUnreadBody(ex: Exchange, close: boolean): void {
  const declared = declaredLength(ex.req) !== undefined;
  if (!close && declared && ex.res.shouldKeepAlive) return;
  let draining = !close;
  const closeGracefully = closeWithoutReset(ex, () => draining);
  if (draining && declared) return;
  // Read here, so that Node does not drain it unbounded; past the budget (none when closing), reading stops.
  receiveBody(ex, false, draining ? ex.bodyLimits.maxBodyBytes : 0).catch(() => {
    draining = false;
    closeGracefully();
  });
}

/**
 * Makes the connection close without a reset, whoever closes it (this answer, or the client that
 * asked to): Node ends such an exchange with the socket's destroySoon(), which closes at once, and
 * unread input then makes the kernel reset the connection, so a client still sending its body
 * loses the answer. This socket's destroySoon first waits for the body to end while it is still
 * read (`draining`), and at most LIMITS.closeLingerMs in any case. Returns it.
 */
function closeWithoutReset(ex: Exchange, draining: () => boolean): () => void {
  const { req } = ex;
  const socket = req.socket;
  let closing = false;
  socket.destroySoon = () => {
    if (closing || socket.destroyed) return;
    closing = true;
    const linger = setTimeout(() => socket.destroy(), LIMITS.closeLingerMs);
    socket.once('close', () => clearTimeout(linger));
    if (req.complete) socket.end();
    else if (draining()) req.once('end', () => socket.end());
  };
  return socket.destroySoon;
}

// ================================================================================================
// 21. listeners — the sockets the service serves on: the hook port (TCP, or a unix socket with -socket; TLS with
//    -secure, in Go's cipher-suite names, from -cert and -key, re-read on SIGHUP), and the admin listener of
//    -metrics-listen, which serves /metrics and the deliveries pages and is never the hook port.
//    Exports: GO_CIPHER_SUITES, openAdminListener, openListener.
//    Tests: test/compat.test.ts, test/deliveries.test.ts, test/runner.test.ts.
// ================================================================================================

const GO_CIPHER_SUITES: Record<string, string> = {
  TLS_AES_128_GCM_SHA256: 'TLS_AES_128_GCM_SHA256',
  TLS_AES_256_GCM_SHA384: 'TLS_AES_256_GCM_SHA384',
  TLS_CHACHA20_POLY1305_SHA256: 'TLS_CHACHA20_POLY1305_SHA256',
  TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256: 'ECDHE-ECDSA-AES128-GCM-SHA256',
  TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256: 'ECDHE-RSA-AES128-GCM-SHA256',
  TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384: 'ECDHE-ECDSA-AES256-GCM-SHA384',
  TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384: 'ECDHE-RSA-AES256-GCM-SHA384',
  TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256: 'ECDHE-ECDSA-CHACHA20-POLY1305',
  TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256: 'ECDHE-RSA-CHACHA20-POLY1305',
  TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA: 'ECDHE-ECDSA-AES128-SHA',
  TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA: 'ECDHE-RSA-AES128-SHA',
  TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA: 'ECDHE-ECDSA-AES256-SHA',
  TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA: 'ECDHE-RSA-AES256-SHA',
  TLS_RSA_WITH_AES_128_GCM_SHA256: 'AES128-GCM-SHA256',
  TLS_RSA_WITH_AES_256_GCM_SHA384: 'AES256-GCM-SHA384',
  TLS_RSA_WITH_AES_128_CBC_SHA: 'AES128-SHA',
  TLS_RSA_WITH_AES_256_CBC_SHA: 'AES256-SHA',
};

function tlsOptions(o: Options): https.ServerOptions {
  const versions: Record<string, tls.SecureVersion> = {
    '1.0': 'TLSv1',
    '1.1': 'TLSv1.1',
    '1.2': 'TLSv1.2',
    '1.3': 'TLSv1.3',
  };
  const minVersion = versions[o.tlsMinVersion];
  if (!minVersion)
    throw new UsageError(`invalid value "${o.tlsMinVersion}" for flag -tls-min-version (use 1.0, 1.1, 1.2 or 1.3)`);
  const ciphers =
    o.cipherSuites === ''
      ? undefined
      : o.cipherSuites
          .split(',')
          .map((c) => {
            const name = GO_CIPHER_SUITES[c.trim()];
            if (!name) throw new UsageError(`unknown cipher suite "${c.trim()}" (see -list-cipher-suites)`);
            return name;
          })
          .join(':');
  return { cert: fs.readFileSync(o.cert), key: fs.readFileSync(o.key), minVersion, ciphers };
}

/** The HTTP(S) server listening on -ip/-port or -socket, privileges dropped, pid file written. */
async function openListener(o: Options, handler: http.RequestListener, log: Logger): Promise<http.Server | undefined> {
  const serverOptions: http.ServerOptions = {
    requestTimeout: o.readTimeoutMs,
    // Node refuses a header timeout longer than the whole-request timeout.
    headersTimeout: Math.min(o.readHeaderTimeoutMs, o.readTimeoutMs),
    keepAliveTimeout: 5_000,
    // Node enforces the two timeouts above only when it checks (every 30 s by default).
    connectionsCheckingInterval: Math.max(50, Math.min(1_000, o.readHeaderTimeoutMs / 2, o.readTimeoutMs / 2)),
  };
  let server: http.Server;
  try {
    server = o.secure
      ? https.createServer({ ...serverOptions, ...tlsOptions(o) }, handler)
      : http.createServer(serverOptions, handler);
  } catch (e) {
    log.error(`cannot start ${o.secure ? 'HTTPS' : 'the HTTP server'}: ${(e as Error).message}`);
    return undefined;
  }
  const failed = await new Promise<Error | undefined>((resolve) => {
    server.once('error', resolve);
    if (o.socket) server.listen(o.socket, () => resolve(undefined));
    else server.listen(o.port, o.ip, () => resolve(undefined));
  });
  if (failed) {
    log.error(`cannot listen: ${failed.message}`);
    return undefined;
  }
  // A client that waits for `100 Continue` before sending its body gets it only from a hook that
  // reads the body (createHandler); Node would otherwise send it at once, inviting every body.
  server.on('checkContinue', handler);
  limitConnections(server, o.maxConnections, log);
  if (o.setgid) {
    process.setgid!(o.setgid);
    process.setuid!(o.setuid);
  }
  if (o.pidfile) fs.writeFileSync(o.pidfile, `${process.pid}\n`);
  const address = server.address();
  const where =
    typeof address === 'string'
      ? `unix:${address}`
      : `${o.secure ? 'https' : 'http'}://${o.ip}:${address?.port}/${o.urlprefix}/{id}`;
  log.notice(`serving hooks on ${where}`);
  return server;
}

// A flood of connections past -max-connections is logged once per this long, not once per connection.
const DROPPED_CONNECTIONS_LOG_INTERVAL_MS = 10_000;

/** At most `max` connections at once (-max-connections): Node closes each one past it as it arrives. */
function limitConnections(server: net.Server, max: number, log: Logger): void {
  server.maxConnections = max;
  let dropped = 0;
  let quietUntil = 0;
  server.on('drop', () => {
    dropped++;
    if (Date.now() < quietUntil) return;
    quietUntil = Date.now() + DROPPED_CONNECTIONS_LOG_INTERVAL_MS;
    log.error(`-max-connections ${max} reached: closed a new connection (${dropped} so far)`);
  });
}

/** The admin listener (-metrics-listen) with the deliveries pages; undefined when off, false when it failed. */
async function openAdminListener(
  o: Options,
  metrics: Metrics,
  log: Logger,
  pages: AdminPages | undefined,
): Promise<http.Server | undefined | false> {
  if (o.adminToken && !o.metricsListen) log.warn('-admin-token has no page to protect without -metrics-listen');
  if (!o.metricsListen) return undefined;
  return (await openMetricsListener(o.metricsListen, metrics, log, pages)) ?? false;
}

/** The metrics listener: its own address, so publishing the hook port does not publish /metrics. */
async function openMetricsListener(
  address: string,
  metrics: Metrics,
  log: Logger,
  pages: AdminPages | undefined,
): Promise<http.Server | undefined> {
  const { host, port } = parseListenAddress(address);
  const handler = createMetricsHandler(metrics, pages);
  const server = http.createServer({ requestTimeout: 10_000, headersTimeout: 10_000 }, handler);
  const failed = await new Promise<Error | undefined>((resolve) => {
    server.once('error', resolve);
    server.listen(port, host, () => resolve(undefined));
  });
  if (failed) {
    log.error(`cannot listen for metrics on ${address}: ${failed.message}`);
    return undefined;
  }
  const bound = server.address() as net.AddressInfo;
  const shown = bound.family === 'IPv6' ? `[${bound.address}]` : bound.address;
  log.notice(`serving metrics on http://${shown}:${bound.port}/metrics`);
  if (pages)
    log.notice(
      `serving deliveries on http://${shown}:${bound.port}${pages.prefix}` +
        `${pages.token ? ' (asking for the -admin-token)' : ''}`,
    );
  return server;
}

// ================================================================================================
// 22. the model — the upgrade's vocabulary, declared before the chapters that use it: the closed list of what can
//    become of a push (DECISIONS: its code, the word published for it, how the answer says it), and the workload
//    annotations (ANNOTATIONS), the only state the service has. Those the service writes live on the workload they
//    are about, each written in the same PATCH as what it records and guarded by a test of the value read, so that
//    replicas and restarts agree with no store of their own; those an operator writes steer one workload. Anyone
//    who may edit the workload can write any of them, so each is read as untrusted input. The docs' table of them
//    is written from ANNOTATIONS (scripts/docs.ts).
//    Exports: APPROVAL_ANNOTATION, DecisionCode, DECISIONS, FOLLOW_ANNOTATION, LAST_PUSH_ANNOTATION,
//    PENDING_ANNOTATION, POLICY_ANNOTATION, PublishedDecision, WINDOW_ANNOTATION.
//    Tests: test/decision.test.ts, test/docs.test.ts, test/policy.test.ts, test/records.test.ts.
// ================================================================================================

/** Every `webhook/*` annotation: its key, who writes it, and what it holds (docs/upgrade.md's table). */
export const ANNOTATIONS = {
  lastPush: {
    key: 'webhook/last-push',
    by: 'the service',
    holds:
      'Per container, the last push applied: its image and the one it replaced, its identity, when it was pushed ' +
      'and applied, by which request, and whether it was rolled back. Newest wins, a repeat, a hold and a rollback ' +
      'read it; it is written in the PATCH that sets the image.',
  },
  follow: {
    key: 'webhook/follow',
    by: 'the service',
    holds:
      'Per container, a rollout followed after the answer (request, hook, deadline, where its result goes), so ' +
      'that another replica finishes the follow when this one is gone; the replica whose PATCH takes it off ' +
      'reports the end.',
  },
  pending: {
    key: 'webhook/pending',
    by: 'the service',
    holds:
      'Per container, the push waiting for an approval or a change window, sealed (with -approval-key-file) with a ' +
      'MAC over it and where it sits; any replica completes it, an entry that does not verify is dropped with a ' +
      'warning.',
  },
  policy: {
    key: 'webhook/policy',
    by: 'an operator',
    holds:
      "The workload's update policy (which tags it takes), over the hook's UPDATE_POLICY; " +
      '`webhook/policy.<container>` sets one container\'s.',
  },
  approval: {
    key: 'webhook/approval',
    by: 'an operator',
    holds: '`required`: every push to the workload waits for a person; `none`: none does, whatever the hook asks.',
  },
  window: {
    key: 'webhook/window',
    by: 'an operator',
    holds: "The workload's change window (as DEPLOY_WINDOW, which it overrides): pushes outside it wait for it.",
  },
} as const;

/** The keys, as the chapters that read and write them name them. */
export const LAST_PUSH_ANNOTATION = ANNOTATIONS.lastPush.key;
export const FOLLOW_ANNOTATION = ANNOTATIONS.follow.key;
export const PENDING_ANNOTATION = ANNOTATIONS.pending.key;
export const POLICY_ANNOTATION = ANNOTATIONS.policy.key;
export const APPROVAL_ANNOTATION = ANNOTATIONS.approval.key;
export const WINDOW_ANNOTATION = ANNOTATIONS.window.key;

/**
 * What became of a push, from one closed list. Every report of it (the answer, the log line, the Event, the mail, the
 * chat and JSON notifications, the deliveries page) renders this code and its reason as data. `published` is the JSON
 * document's "decision" (schema 1); `action`, how the answer says it: the change, `none (<reason>)` or the reason.
 */
export const DECISIONS = {
  /** The container's image was changed to the pushed one. */
  applied: { published: 'applied', action: 'change' },
  /** The same image again: the rollout was restarted so the tag is pulled again. */
  're-pulled': { published: 'same image restarted', action: 'change' },
  /** A newer push was applied already, or arrived while this one was kept. */
  superseded: { published: 'no-op', action: 'none' },
  /** The same push was applied already: a repeated notification. */
  repeat: { published: 'no-op', action: 'none' },
  /** Nothing to change: a test ping, a push by digest the container runs, a payload that names no image. */
  'no-op': { published: 'no-op', action: 'none' },
  /** The image pin (or VERIFY_IMAGE) refused the push: nothing was written. */
  refused: { published: 'refused', action: 'none' },
  /** VERIFY_SIGNATURE refused the push: the digest has no cosign signature valid as required; nothing was written. */
  'refused: unsigned': { published: 'refused: unsigned', action: 'none' },
  /** The container's image was changed outside webhook and the push is not newer (ON_OUTSIDE_CHANGE=hold). */
  held: { published: 'held', action: 'none' },
  /** The tag is outside the container's update policy (UPDATE_POLICY, webhook/policy): nothing was written. */
  'skipped by policy': { published: 'skipped by policy', action: 'none' },
  /** The push could not be applied: nothing is known to be written. */
  failed: { published: 'failed', action: 'none' },
  /** The API server (or, under ON_REGISTRY_AWAY=keep, the registry) did not answer: kept, applied when it does. */
  kept: { published: 'no-op', action: 'none' },
  /** It waits on the workload (webhook/pending) for an approval or the change window: answered 202. */
  waiting: { published: 'waiting', action: 'reason' },
  /** Approved while the change window is closed: it waits for the window. */
  approved: { published: 'approved', action: 'reason' },
  /** A person rejected the waiting push: only its pending entry was taken off. */
  rejected: { published: 'rejected', action: 'none' },
  /** Nobody decided before APPROVAL_TIMEOUT: its pending entry was taken off. */
  expired: { published: 'expired', action: 'none' },
  /** An applied push whose rollout a later push took over following: the later one's record tells how it ended. */
  'taken over': { published: 'superseded', action: 'change' },
  /** A delivery to several clusters (CLUSTERS): each cluster's push is a record of its own. */
  'fanned out': { published: 'fanned out', action: 'none' },
  /** A hook whose command is not the upgrade ran and exited 0 (a command that fails is `failed`). */
  ran: { published: 'ran', action: 'none' },
  /** Not finished yet (the deliveries page only). */
  running: { published: 'running', action: 'none' },
} as const;
export type DecisionCode = keyof typeof DECISIONS;
/** A word the deliveries page and the result document publish as `decision`: only ever one of DECISIONS'. */
export type PublishedDecision = (typeof DECISIONS)[DecisionCode]['published'];

// ================================================================================================
// 23. registry payloads — a registry's push notification (Aliyun ACR, Docker Hub, a build job, Harbor, Quay, GHCR,
//    Azure, CNCF Distribution, Artifactory, Nexus, Gitea, CloudEvents) read into PushEvents (host, repository, tag,
//    digest, pushed-at), an acknowledged no-op (a pull, a test ping, a push by digest, a signature tag), or a
//    handshake's answer (Event Grid's, CloudEvents' validation). Pure functions: no I/O, no clock. Each registry is
//    one entry of REGISTRIES (next chapter): its reader, and how REPO_TYPE=auto recognises it. The hook's settings
//    (PushReading, read once at a push's boundary) choose the composition: REPO_TYPE (a key of REGISTRIES, any case,
//    or auto); NET_TYPE (regionalregistry only: public, vpc or internal endpoint); REGISTRY_HOST (host[:port]
//    replacing the registry host for every REPO_TYPE; required for Artifactory and Nexus); PIN_DIGEST (true:
//    `repo:tag@sha256:…` when the payload carries the digest).
//    Any missing or malformed field is an error naming the field; nothing is lower-cased or repaired.
//    Exports: ACR_PUSH_TYPES, acrEndpointPrefix, acrHost, acrPush, azureRead, checkedRepository, ComposedRef,
//    customRegistryAddress, distributionRead, domainProblem, eventsRead, fieldAt, ghcrRead, giteaRead, harborPush,
//    harborRead, ignoredEvents, ImageRef, jfrogRead, MAX_IMAGE_NAME_LENGTH, nexusRead, parseBoolSetting,
//    parsePushHeaders, parsePushPayload, PayloadArgument, PayloadFields, pushDataEvent, pushDataTestPing, PushEvent,
//    PushHeaders, pushHost, pushPayload, PushReading, quayRead, Reading, REFERENCE_GRAMMAR, Registry, RegistrySettings,
//    repositoryPathProblem, splitImageAddress, stripSchemeAndSlashes, tagProblem, webhookValidation.
//    Tests: test/registries.test.ts, test/registry-e2e.test.ts, test/upgrade.test.ts, test/clouds.test.ts,
//    test/envelopes.test.ts.
// ================================================================================================

/**
 * How a push's payload is read: the hook's REPO_TYPE, NET_TYPE, REGISTRY_HOST and PIN_DIGEST, read once at the push's
 * boundary (chapter 29's readHookConfig). REPO_TYPE and NET_TYPE stay text: auto needs the payload, and NET_TYPE is
 * read for regionalregistry only, so each is checked where a payload is read, as it always was.
 */
export interface PushReading {
  repoType: string | undefined;
  netType: string | undefined;
  /** REGISTRY_HOST, validated: when set, the host of every push. */
  registryHost: string | undefined;
  /** PIN_DIGEST, or why it is not a boolean: refused when a push is composed (a ping or a handshake never was). */
  pinDigest: boolean | Error;
}

export type ComposedRef =
  /**
   * pushId identifies this push (digest and pushed_at) so a repeated notification is recognised;
   * pushedAt is the payload's own time as it was sent ('' when it has none).
   * candidates: every distinct reference when one delivery announces several (a Quay push of two
   * tags, an envelope of pushes to several repositories); ref is then the last of them, and
   * chooseCandidate picks the one for a container. digest: the one the payload announced (valid,
   * pinned or not), for VERIFY_IMAGE to compare with the registry's.
   */
  | {
      kind: 'ref';
      ref: string;
      notes: string[];
      pushId: string;
      pushedAt: string;
      candidates?: string[];
      digest?: string;
    }
  | { kind: 'noop'; reason: string }
  /** A handshake the sender expects answered with this exact body (Event Grid's validation). */
  | { kind: 'answer'; body: string; reason: string }
  | { kind: 'error'; message: string };

/** A parsed reference; domain is undefined when the reference names none (Docker Hub). */
export interface ImageRef {
  domain: string | undefined;
  path: string;
  tag: string | undefined;
  digest: string | undefined;
}

const REFERENCE_HOST_LABEL = '[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?';
// The grammar of github.com/distribution/reference (regexp.go), anchored piece by piece so an
// error can say which piece is wrong.
const REFERENCE_GRAMMAR = {
  // host (DNS name, or bracketed IPv6) with an optional port. Hostnames may be upper-case.
  domain: new RegExp(`^(?:${REFERENCE_HOST_LABEL}(?:\\.${REFERENCE_HOST_LABEL})*|\\[[a-fA-F0-9:.]+\\])(?::[0-9]+)?$`),
  // One path component: lower-case alphanumerics joined by ".", "_", "__" or a run of "-".
  pathComponent: /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/,
  tag: /^\w[\w.-]{0,127}$/,
  digest: /^sha256:[a-f0-9]{64}$/,
  region: /^[a-z0-9]+(?:-[a-z0-9]+)*$/,
};
// distribution's NameTotalLengthMax: the name (domain and path, without tag or digest).
const MAX_IMAGE_NAME_LENGTH = 255;
const MAX_TAG_LENGTH = 128;
/** Parses argument 1 of /webhooks.sh: the request body as the hook's entire-payload passes it. */
export function parsePushPayload(
  text: string | undefined,
): { kind: 'payload'; payload: Record<string, unknown> | unknown[] } | { kind: 'error'; message: string } {
  if (text === undefined || text.trim() === '') {
    return {
      kind: 'error',
      message:
        'payload is empty: argument 1 must be the request body (the hook passes it with pass-arguments-to-command ' +
        '[{"source": "entire-payload"}])',
    };
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    return { kind: 'error', message: `payload is not JSON: ${(e as Error).message}` };
  }
  return pushPayload(value);
}

/**
 * Argument 1 as its JSON value: the in-process command is given a request's entire payload so (asMarshalled), a
 * process parses its text (parsePushPayload). Refused as parsePushPayload refuses it.
 */
export function pushPayload(
  value: unknown,
): { kind: 'payload'; payload: Record<string, unknown> | unknown[] } | { kind: 'error'; message: string } {
  // Through the runner, an entire-payload of null means the request body did not parse.
  if (value === null)
    return {
      kind: 'error',
      message:
        'payload is not JSON: the request body was empty or did not parse as JSON (send it with Content-Type: ' +
        'application/json)',
    };
  // An array is a batch (Azure Event Grid); whether the registry takes one is composeImageRef's call.
  if (!isObject(value) && !Array.isArray(value))
    return { kind: 'error', message: `payload is not a JSON object (got ${typeName(value)})` };
  return { kind: 'payload', payload: value };
}

/** Request headers as the hook passes them (argument 2, its entire-headers), by lower-case name. */
export type PushHeaders = Record<string, string>;

/** Argument 1: its text (a process's, or a parameter other than the entire payload), or the payload's JSON value. */
export type PayloadArgument = { text: string | undefined } | { value: unknown };

/**
 * The CloudEvents webhook validation handshake (abuse protection), as Azure Event Grid sends it for
 * its CloudEvents schema: an OPTIONS request with WebHook-Request-Origin and no body. It is answered
 * by the hook (http-methods with OPTIONS, a WebHook-Allowed-Origin response header); the upgrade
 * only acknowledges it. The reason, or undefined for any other request.
 */
export function webhookValidation(headers: PushHeaders, payload: PayloadArgument): string | undefined {
  const origin = headers['webhook-request-origin'];
  const empty =
    'value' in payload
      ? payload.value === null || (isObject(payload.value) && Object.keys(payload.value).length === 0)
      : payload.text === undefined || ['', 'null', '{}'].includes(payload.text.trim());
  if (origin === undefined || !empty) return undefined;
  return `CloudEvents webhook validation from ${showValue(origin)}: the hook's WebHook-Allowed-Origin answers it`;
}

/** Parses argument 2 of /webhooks.sh when the hook passes it: entire-headers, a JSON object. */
export function parsePushHeaders(text: string | undefined): PushHeaders {
  if (text === undefined || text.trim() === '') return {};
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new Error(
      `argument 2 is not JSON (the hook passes the headers with {"source": "entire-headers"}): ${(e as Error).message}`,
    );
  }
  if (!isObject(value)) throw new Error(`argument 2 is not the headers' JSON object (got ${typeName(value)})`);
  const out: PushHeaders = {};
  for (const [k, v] of Object.entries(value)) if (typeof v === 'string') out[k.toLowerCase()] = v;
  return out;
}

/**
 * A boolean hook setting (PIN_DIGEST, VERIFY_IMAGE, ROLLBACK_ON_FAILURE…): unset or blank is false, else
 * Go's ParseBool spellings; `use` ends the message, as each setting has always worded it.
 */
function parseBoolSetting(name: string, value: string | undefined, use = 'use true or false'): boolean {
  if (value === undefined || value.trim() === '') return false;
  const v = parseGoBool(value.trim());
  if (v === undefined) throw new Error(`${name} ${showValue(value)} is not a boolean (${use})`);
  return v;
}

function tagProblem(tag: string): string | undefined {
  if (tag.length > MAX_TAG_LENGTH) return `is ${tag.length} characters long (a tag has at most ${MAX_TAG_LENGTH})`;
  if (!REFERENCE_GRAMMAR.tag.test(tag))
    return 'is not a valid tag (letters, digits, "_", "." and "-", not starting with "." or "-")';
  return undefined;
}

function repositoryPathProblem(repoPath: string): string | undefined {
  if (repoPath === '') return 'is empty';
  for (const component of repoPath.split('/')) {
    if (component === '') return 'is not a valid repository name (empty path component)';
    if (REFERENCE_GRAMMAR.pathComponent.test(component)) continue;
    if (REFERENCE_GRAMMAR.pathComponent.test(component.toLowerCase())) {
      // Lower-casing it would name another repository, which the registry does not have.
      return (
        `is not a valid repository name: OCI repository names are lower-case, and ${showValue(component)} is ` +
        `not (rename the repository in the registry)`
      );
    }
    return (
      `is not a valid repository name: ${showValue(component)} must be lower-case letters and digits separated ` +
      `by ".", "_", "__" or "-"`
    );
  }
  return undefined;
}

function domainProblem(domain: string): string | undefined {
  return REFERENCE_GRAMMAR.domain.test(domain) ? undefined : 'is not a valid registry host (host[:port])';
}

/** "https://Reg.example.com:5000/" → "Reg.example.com:5000": build jobs send either form. */
function stripSchemeAndSlashes(address: string): string {
  return address
    .trim()
    .replace(/^[a-zA-Z][a-zA-Z0-9+.-]*:\/\//, '')
    .replace(/\/+$/, '');
}

/** Reads a payload by dotted paths; a numeric segment indexes an array (`events.0.target.tag`). */
class PayloadFields {
  private readonly payload: unknown;
  constructor(payload: unknown) {
    this.payload = payload;
  }

  /** The value at a dotted path ("" is the root); undefined when a step is absent or null; throws for a wrong shape. */
  value(field: string): unknown {
    let at: unknown = this.payload;
    const parts = field === '' ? [] : field.split('.');
    for (const [i, part] of parts.entries()) {
      if (at === undefined || at === null) return undefined;
      if (Array.isArray(at) && /^\d+$/.test(part)) {
        at = at[Number(part)];
        continue;
      }
      if (!isObject(at)) throw new Error(`${parts.slice(0, i).join('.')} must be an object, got ${typeName(at)}`);
      at = at[part];
    }
    return at;
  }

  /** The string at a dotted path; undefined when absent, null or ""; throws for other types. */
  optional(field: string): string | undefined {
    const v = this.value(field);
    if (v === undefined || v === null || v === '') return undefined;
    if (typeof v !== 'string') throw new Error(`${field} must be a string, got ${typeName(v)}`);
    return v;
  }

  required(field: string, what: string): string {
    const v = this.optional(field);
    if (v === undefined) throw new Error(`${field} is missing (${what})`);
    return v;
  }

  /** A repository path, checked by the reference grammar (never lower-cased or repaired). */
  repository(field: string, what: string): string {
    const value = this.required(field, what);
    const problem = repositoryPathProblem(value);
    if (problem) throw new Error(`${field} ${showValue(value)} ${problem}`);
    return value;
  }

  /** A time as the registry sends it (a string, or a number of seconds); "" when absent. */
  time(field: string): string {
    const v = this.value(field);
    return typeof v === 'string' || typeof v === 'number' ? String(v) : '';
  }

  /** The names of the fields, among `fields`, that are absent or empty. */
  absent(fields: string[]): string[] {
    return fields.filter((f) => this.optional(f) === undefined);
  }

  /** The length of the array at a dotted path; 0 when absent; throws for another type. */
  count(field: string): number {
    const v = this.value(field);
    if (v === undefined || v === null) return 0;
    if (!Array.isArray(v)) throw new Error(`${field || 'the payload'} must be an array, got ${typeName(v)}`);
    return v.length;
  }

  /** Whether the value at a dotted path is present (not undefined or null); false for a wrong shape. */
  has(field: string): boolean {
    try {
      const v = this.value(field);
      return v !== undefined && v !== null;
    } catch {
      return false;
    }
  }
}

/** `base.rest`, or `rest` at the root: readers take the place their registry's object sits. */
const fieldAt = (base: string, rest: string) => (base === '' ? rest : `${base}.${rest}`);

/** A registry's push, normalised: what composing, pinning and validating the reference need. */
interface PushEvent {
  /** host[:port]; undefined for Docker Hub, whose references name no host. */
  host: string | undefined;
  repository: string;
  tag: string;
  /** The field the tag came from, for messages. */
  tagField: string;
  digest: string | undefined;
  digestField: string;
  /** When it was pushed, as the payload says: with the digest it identifies a repeated delivery. */
  pushedAt: string;
}

/** The hook settings a registry's reader may use. REGISTRY_HOST is validated before it is given. */
interface RegistrySettings {
  /** REGISTRY_HOST: when set, the host of every push, whatever the payload says. */
  registryHost: string | undefined;
  netType: string | undefined;
}

/** What a registry's reader makes of a delivery: one push, several, an acknowledged no-op, or a handshake. */
type Reading = PushEvent | PushEvent[] | { noop: string } | { answer: string; reason: string };

interface Registry {
  /** Who sends this payload, for messages and docs. */
  sender: string;
  /** How REPO_TYPE=auto recognises this sender: what it looks for (for the refusal) and the test. */
  recognise?: { looksFor: string; test(p: PayloadFields, h: PushHeaders): boolean };
  /** Whether the payload may be a JSON array (a batch of events). */
  batches?: boolean;
  /** Why this payload announces no image (a registry's test ping), or undefined for a push. */
  testPing?(p: PayloadFields): string | undefined;
  read(p: PayloadFields, s: RegistrySettings, h: PushHeaders): Reading;
}

/** The `push_data`/`repository` shape ACR, Docker Hub and build jobs share. */
function pushDataEvent(p: PayloadFields, host: string | undefined, repository: string): PushEvent {
  return {
    host,
    repository,
    tag: p.required('push_data.tag', 'the pushed tag'),
    tagField: 'push_data.tag',
    digest: p.optional('push_data.digest'),
    digestField: 'push_data.digest',
    pushedAt: p.time('push_data.pushed_at'),
  };
}

/** Docker Hub's test ping, sent when a webhook is created, has none of these. */
function pushDataTestPing(p: PayloadFields): string | undefined {
  const absent = p.absent(['push_data.tag', 'repository.name', 'repository.namespace']);
  return absent.length ? `test ping: the payload has no ${absent.join(', ')}, so there is no pushed image` : undefined;
}

/** An image address as registries write it (`https://host:port/path:tag@digest`): host (when it names one) and path. */
function splitImageAddress(text: string): { host: string | undefined; path: string } {
  let rest = stripSchemeAndSlashes(text);
  const atSign = rest.indexOf('@');
  if (atSign >= 0) rest = rest.slice(0, atSign);
  const colon = rest.lastIndexOf(':');
  if (colon > rest.lastIndexOf('/')) rest = rest.slice(0, colon);
  const slash = rest.indexOf('/');
  const first = slash < 0 ? '' : rest.slice(0, slash);
  // As docker does: the first component is a registry host when it looks like one.
  const isHost = first.includes('.') || first.includes(':') || first === 'localhost';
  return isHost ? { host: first, path: rest.slice(slash + 1) } : { host: undefined, path: rest };
}

/** The registry host of a push: REGISTRY_HOST, else the payload's, else an error saying what to set. */
function pushHost(s: RegistrySettings, fromPayload: string | undefined, field: string, sender: string): string {
  const host = s.registryHost ?? fromPayload;
  if (host === undefined)
    throw new Error(
      `${field} names no registry host: set REGISTRY_HOST in the hook to the host[:port] ${sender} serves images on`,
    );
  const problem = domainProblem(host);
  if (problem) throw new Error(`${field}: registry host ${showValue(host)} ${problem}`);
  return host;
}

/** A repository path from a payload value that is not a field of its own (part of a URL). */
function checkedRepository(value: string, field: string): string {
  const problem = repositoryPathProblem(value);
  if (problem) throw new Error(`${field}: repository ${showValue(value)} ${problem}`);
  return value;
}

// The events of one batch (a Distribution envelope, an Event Grid or CloudEvents batch; also a Harbor event's
// resources, a Quay push's tags) a reader looks at; the rest are counted as not read. Event Grid sends at most 5,000
// events in a batch (maxEventsPerBatch; one by default) and Distribution one or a few per envelope, so a real
// delivery is read whole; a 1 MiB body holds 340,000 empty events, each of which would otherwise cost a reading and
// a line of its reason.
const MAX_BATCH_EVENTS = 5_000;

/** How many of a batch's `total` events a reader looks at. */
const eventsRead = (total: number) => Math.min(total, MAX_BATCH_EVENTS);

/**
 * Harbor's push (default format at event_data, CloudEvents format at data): one event per tagged resource.
 * `sender` names the registry in messages (TCR Enterprise sends Harbor's default format).
 */
function harborPush(p: PayloadFields, s: RegistrySettings, base: string, pushedAt: string, sender = 'Harbor'): Reading {
  const pushes: PushEvent[] = [];
  const resources = fieldAt(base, 'resources');
  for (let i = 0; i < eventsRead(p.count(resources)); i++) {
    const r = `${resources}.${i}`;
    const tag = p.optional(`${r}.tag`);
    // Pushed by digest, Harbor leaves the tag empty or (in its CloudEvents format) repeats the digest there.
    if (tag === undefined || tag.startsWith('sha256:')) continue;
    const url = p.optional(`${r}.resource_url`);
    const address = url === undefined ? undefined : splitImageAddress(url);
    const fullName = p.optional(fieldAt(base, 'repository.repo_full_name'));
    const repository = fullName
      ? p.repository(fieldAt(base, 'repository.repo_full_name'), 'the project/repository')
      : checkedRepository(address?.path ?? '', `${r}.resource_url`);
    const host = pushHost(s, address?.host, `${r}.resource_url ${showValue(url ?? '')}`, sender);
    pushes.push({
      host,
      repository,
      tag,
      tagField: `${r}.tag`,
      digest: p.optional(`${r}.digest`),
      digestField: `${r}.digest`,
      pushedAt,
    });
  }
  if (pushes.length > 0) return pushes;
  if (p.count(resources) === 0) throw new Error(`${resources} is missing or empty (the pushed artifacts)`);
  return {
    noop: `pushed by digest, without a tag (${resources}[].tag is empty or the digest): there is no tag to deploy`,
  };
}

const HARBOR_PUSH_TYPES = ['PUSH_ARTIFACT', 'pushImage'];

function harborRead(p: PayloadFields, s: RegistrySettings): Reading {
  if (p.optional('specversion') !== undefined) {
    const type = p.required('type', 'the CloudEvents type');
    if (type !== 'harbor.artifact.pushed') return { noop: `Harbor event ${showValue(type)} is not a push` };
    return harborPush(p, s, 'data', p.time('time'));
  }
  const type = p.required('type', 'the Harbor event type, e.g. PUSH_ARTIFACT');
  if (!HARBOR_PUSH_TYPES.includes(type))
    return { noop: `Harbor event ${showValue(type)} is not a push (PUSH_ARTIFACT, or pushImage before Harbor 2.0)` };
  return harborPush(p, s, 'event_data', p.time('occur_at'));
}

/** Quay's repo_push: docker_url and updated_tags, a list (now) or an object of tag → image id (before). */
function quayRead(p: PayloadFields, s: RegistrySettings): Reading {
  const url = p.optional('docker_url');
  const address = url === undefined ? undefined : splitImageAddress(url);
  const repository = address
    ? checkedRepository(address.path, `docker_url ${showValue(url!)}`)
    : p.repository('repository', 'the namespace/repository');
  const host = pushHost(s, address?.host ?? 'quay.io', 'docker_url', 'Quay');
  const tags = p.value('updated_tags');
  const names = Array.isArray(tags) ? tags : isObject(tags) ? Object.keys(tags) : undefined;
  if (names === undefined) throw new Error('updated_tags is missing (the tags pushed: a list, or an object)');
  if (names.length === 0) return { noop: 'updated_tags is empty: no tag was pushed' };
  return names.slice(0, eventsRead(names.length)).map((tag, i) => {
    if (typeof tag !== 'string') throw new Error(`updated_tags[${i}] must be a string, got ${typeName(tag)}`);
    return { host, repository, tag, tagField: 'updated_tags', digest: undefined, digestField: '', pushedAt: '' };
  });
}

// package_v2 and the action "create" are what GitHub sent container package hooks before "published".
const GITHUB_PACKAGE_EVENTS = ['package', 'registry_package', 'package_v2'];
const GITHUB_PUBLISH_ACTIONS = ['published', 'create'];

/** GitHub's package (or older registry_package) event for a container package version. */
function ghcrRead(p: PayloadFields, s: RegistrySettings, h: PushHeaders): Reading {
  const event = h['x-github-event'];
  if (event !== undefined && !GITHUB_PACKAGE_EVENTS.includes(event))
    return { noop: `GitHub event ${showValue(event)} is not a package event` };
  const key = p.has('registry_package') && !p.has('package') ? 'registry_package' : 'package';
  if (!p.has(key)) throw new Error('package is missing (GitHub sends it with X-GitHub-Event: package)');
  const action = p.optional('action') ?? '';
  if (!GITHUB_PUBLISH_ACTIONS.includes(action))
    return { noop: `GitHub package action ${showValue(action)} is not a publication` };
  const kind = [p.optional(`${key}.package_type`), p.optional(`${key}.ecosystem`)].map((t) => (t ?? '').toLowerCase());
  if (!kind.some((t) => t === 'container' || t === 'docker'))
    return { noop: `GitHub package type ${showValue(p.optional(`${key}.package_type`) ?? '')} is not a container` };
  const v = `${key}.package_version`;
  const tag = p.optional(`${v}.container_metadata.tag.name`);
  if (tag === undefined)
    return {
      noop: 'the container version has no tag (a per-platform manifest or a push by digest): nothing to deploy',
    };
  const url = p.optional(`${v}.package_url`);
  // GHCR's namespace is the owner's login in lower case (GitHub's own mapping, not a repair).
  // GitHub's earlier `create` shape names the owner as package.namespace.
  const owner = () => p.optional(`${key}.namespace`) ?? p.required(`${key}.owner.login`, 'the owner');
  const name = url
    ? splitImageAddress(url)
    : { host: 'ghcr.io', path: `${owner()}/${p.required(`${key}.name`, 'name')}` };
  const repository = checkedRepository(name.path.toLowerCase(), url ? `${v}.package_url` : `${key}.name`);
  const host = pushHost(s, name.host ?? 'ghcr.io', `${v}.package_url`, 'GHCR');
  const digestField = `${v}.container_metadata.tag.digest`;
  return {
    host,
    repository,
    tag,
    tagField: `${v}.container_metadata.tag.name`,
    digest: p.optional(digestField),
    digestField,
    pushedAt: p.time(`${v}.created_at`),
  };
}

const EVENT_GRID_VALIDATION = 'Microsoft.EventGrid.SubscriptionValidationEvent';
const ACR_IMAGE_PUSHED = 'Microsoft.ContainerRegistry.ImagePushed';
// Event Grid's documented examples name the push by its full type and by the short one.
const ACR_PUSH_TYPES = [ACR_IMAGE_PUSHED, 'ImagePushed'];
// Event Grid's validation codes are GUIDs; anything else is not echoed back.
const VALIDATION_CODE = /^[A-Za-z0-9-]{1,100}$/;

/** Azure Container Registry's push (its webhook at the root, or an Event Grid event's data). */
function acrPush(p: PayloadFields, s: RegistrySettings, base: string): PushEvent | { noop: string } {
  const action = p.optional(fieldAt(base, 'action')) ?? '';
  if (action !== 'push') return { noop: `Azure Container Registry action ${showValue(action)} is not an image push` };
  const tag = p.optional(fieldAt(base, 'target.tag'));
  if (tag === undefined) return { noop: `pushed by digest, without a tag (${fieldAt(base, 'target.tag')} is empty)` };
  return {
    host: pushHost(
      s,
      p.optional(fieldAt(base, 'request.host')),
      fieldAt(base, 'request.host'),
      'Azure Container Registry',
    ),
    repository: p.repository(fieldAt(base, 'target.repository'), 'the repository'),
    tag,
    tagField: fieldAt(base, 'target.tag'),
    digest: p.optional(fieldAt(base, 'target.digest')),
    digestField: fieldAt(base, 'target.digest'),
    pushedAt: p.time(fieldAt(base, 'timestamp')),
  };
}

/**
 * Why a batch announces no push, in one line: a single event's reason, else each reason with its count, the events
 * past MAX_BATCH_EVENTS counted as not read (`340000 events ignored: 5000 unknown action of a blob, 335000 past the
 * first 5000 not read`), cut by listWithin. `reasons`: one per event read. Pure.
 */
function ignoredEvents(reasons: readonly string[], total: number): string {
  if (total === 1 && reasons.length === 1) return reasons[0];
  const counts = new Map<string, number>();
  for (const reason of reasons) counts.set(reason, (counts.get(reason) ?? 0) + 1);
  const counted = [...counts].map(([reason, n]) => `${n} ${reason}`);
  const unread = total - reasons.length;
  if (unread > 0) counted.push(`${unread} past the first ${MAX_BATCH_EVENTS} not read`);
  return `${total} events ignored: ${listWithin(counted)}`;
}

/** A word from a payload (an event type, an action) as a reason shows it: as sent when plain and short, else quoted. */
const shownWord = (word: string) => (/^[\w.:/-]{1,80}$/.test(word) ? word : showValue(word));

/** Event Grid delivers a batch: a JSON array of events (Event Grid or CloudEvents schema). */
function eventGridRead(p: PayloadFields, s: RegistrySettings): Reading {
  const pushes: PushEvent[] = [];
  const seen: string[] = [];
  for (let i = 0; i < eventsRead(p.count('')); i++) {
    const type = p.optional(`${i}.eventType`) ?? p.required(`${i}.type`, 'the event type');
    if (type === EVENT_GRID_VALIDATION) {
      const code = p.required(`${i}.data.validationCode`, 'the code Event Grid expects back');
      if (!VALIDATION_CODE.test(code)) throw new Error(`${i}.data.validationCode ${showValue(code)} is not a code`);
      return { answer: JSON.stringify({ validationResponse: code }), reason: 'Event Grid subscription validated' };
    }
    seen.push(shownWord(type));
    if (!ACR_PUSH_TYPES.includes(type)) continue;
    const push = acrPush(p, s, `${i}.data`);
    if (!('noop' in push)) pushes.push(push);
  }
  if (pushes.length) return pushes;
  return { noop: `no image push among the events (${seen.length ? ignoredEvents(seen, p.count('')) : 'none'})` };
}

function azureRead(p: PayloadFields, s: RegistrySettings): Reading {
  if (Array.isArray(p.value(''))) return eventGridRead(p, s);
  if (p.has('eventType') || p.has('specversion')) {
    const type = p.optional('eventType') ?? p.required('type', 'the event type');
    if (type === EVENT_GRID_VALIDATION || ACR_PUSH_TYPES.includes(type))
      return eventGridRead(new PayloadFields([p.value('')]), s);
    return { noop: `Event Grid event ${showValue(type)} is not an image push` };
  }
  return acrPush(p, s, '');
}

/** A CNCF Distribution envelope: only the push of a tagged manifest announces an image. */
function distributionRead(p: PayloadFields, s: RegistrySettings): Reading {
  const n = p.count('events');
  if (n === 0) throw new Error('events is missing or empty (the registry sends an envelope of events)');
  const pushes: PushEvent[] = [];
  const ignored: string[] = [];
  for (let i = 0; i < eventsRead(n); i++) {
    const e = `events.${i}`;
    const action = p.optional(`${e}.action`) ?? '';
    const mediaType = p.optional(`${e}.target.mediaType`) ?? '';
    const tag = p.optional(`${e}.target.tag`);
    const manifest = /manifest|image\.index/.test(mediaType);
    if (action !== 'push' || !manifest || tag === undefined) {
      const what = manifest ? (tag ? 'a manifest' : 'an untagged manifest') : 'a blob';
      ignored.push(`${action ? shownWord(action) : 'unknown action'} of ${what}`);
      continue;
    }
    const host = pushHost(s, p.optional(`${e}.request.host`), `${e}.request.host`, 'the registry');
    // No time in the identity: the same manifest announced again (a retry, another envelope) is one push.
    pushes.push({
      host,
      repository: p.repository(`${e}.target.repository`, 'the repository'),
      tag,
      tagField: `${e}.target.tag`,
      digest: p.optional(`${e}.target.digest`),
      digestField: `${e}.target.digest`,
      pushedAt: '',
    });
  }
  if (pushes.length) return pushes;
  return { noop: `no push of a tagged manifest in the envelope (${ignoredEvents(ignored, n)})` };
}

/** JFrog Artifactory's Docker `pushed` event: at the root (legacy webhooks) or under data (platform webhooks). */
function jfrogRead(p: PayloadFields, s: RegistrySettings): Reading {
  const base = p.has('data.image_name') ? 'data' : '';
  const type = p.optional(fieldAt(base, 'event_type')) ?? p.optional('event_type') ?? '';
  if (type !== 'pushed') return { noop: `Artifactory Docker event ${showValue(type)} is not a push` };
  const sha = p.optional(fieldAt(base, 'sha256'));
  return {
    host: pushHost(s, undefined, 'the Artifactory payload', 'Artifactory (its Docker access host)'),
    repository: p.repository(fieldAt(base, 'image_name'), 'the image name'),
    tag: p.required(fieldAt(base, 'tag'), 'the pushed tag'),
    tagField: fieldAt(base, 'tag'),
    digest: sha === undefined ? undefined : `sha256:${sha}`,
    digestField: fieldAt(base, 'sha256'),
    pushedAt: '',
  };
}

/** Sonatype Nexus's repository component event: a docker component created (or updated). */
function nexusRead(p: PayloadFields, s: RegistrySettings, h: PushHeaders): Reading {
  const id = h['x-nexus-webhook-id'];
  if (id !== undefined && id !== 'rm:repository:component')
    return { noop: `Nexus webhook ${showValue(id)} is not a component event` };
  const action = p.optional('action') ?? '';
  if (action !== 'CREATED' && action !== 'UPDATED')
    return { noop: `Nexus component action ${showValue(action)} is not a push` };
  const format = p.optional('component.format') ?? '';
  if (format !== 'docker') return { noop: `Nexus component format ${showValue(format)} is not docker` };
  return {
    host: pushHost(s, undefined, 'the Nexus payload', 'the Nexus Docker connector'),
    repository: p.repository('component.name', 'the image name'),
    tag: p.required('component.version', 'the pushed tag'),
    tagField: 'component.version',
    digest: undefined,
    digestField: '',
    pushedAt: p.time('timestamp'),
  };
}

/** Gitea's package event for a container package. */
function giteaRead(p: PayloadFields, s: RegistrySettings, h: PushHeaders): Reading {
  const event = h['x-gitea-event'];
  if (event !== undefined && event !== 'package')
    return { noop: `Gitea event ${showValue(event)} is not a package event` };
  const action = p.optional('action') ?? '';
  if (action !== 'created') return { noop: `Gitea package action ${showValue(action)} is not a publication` };
  const type = p.optional('package.type') ?? '';
  if (type !== 'container') return { noop: `Gitea package type ${showValue(type)} is not a container` };
  const tag = p.required('package.version', 'the pushed version (the tag)');
  if (tag.startsWith('sha256:')) return { noop: 'the container version is a digest (an untagged manifest)' };
  const url = p.optional('package.html_url');
  const host = pushHost(s, url ? splitImageAddress(url).host : undefined, 'package.html_url', 'Gitea');
  const owner = p.required('package.owner.login', 'the package owner');
  const name = p.required('package.name', 'the image name');
  // Gitea's container registry serves <owner>/<image> in lower case, whatever the login's case.
  return {
    host,
    repository: checkedRepository(`${owner}/${name}`.toLowerCase(), 'package.owner.login/package.name'),
    tag,
    tagField: 'package.version',
    digest: undefined,
    digestField: '',
    pushedAt: p.time('package.created_at'),
  };
}

function acrHost(fields: PayloadFields, netType: string | undefined): string {
  const region = fields.required('repository.region', 'ACR names the region, e.g. cn-hangzhou, or set REGISTRY_HOST');
  if (!REFERENCE_GRAMMAR.region.test(region))
    throw new Error(`repository.region ${showValue(region)} is not a valid region (e.g. cn-hangzhou)`);
  return `${acrEndpointPrefix(netType)}.${region}.aliyuncs.com`;
}

/** NET_TYPE: which ACR endpoint (public, vpc, internal; unset is public), as its host's prefix. */
function acrEndpointPrefix(netType: string | undefined): string {
  const prefixes: Record<string, string> = {
    '': 'registry',
    public: 'registry',
    vpc: 'registry-vpc',
    internal: 'registry-internal',
  };
  const prefix = prefixes[(netType ?? '').trim().toLowerCase()];
  if (prefix === undefined)
    throw new Error(
      `NET_TYPE ${showValue(netType ?? '')} is not supported (use vpc or internal, or leave it unset for the public ` +
        `endpoint)`,
    );
  return prefix;
}

function customRegistryAddress(repoUrl: string): string {
  const address = stripSchemeAndSlashes(repoUrl);
  const [host, ...rest] = address.split('/');
  if (domainProblem(host))
    throw new Error(
      `repository.repo_url ${showValue(repoUrl)} does not start with a valid registry host (host[:port])`,
    );
  if (rest.length > 0 && repositoryPathProblem(rest.join('/'))) {
    throw new Error(
      `repository.repo_url ${showValue(repoUrl)} has an invalid path after the host: ` +
        `${repositoryPathProblem(rest.join('/'))}`,
    );
  }
  return address;
}

// ================================================================================================
// 24. cloud registry payloads — the clouds' own registries, whose pushes arrive as their event buses' events: AWS ECR
//    (an EventBridge "ECR Image Action" event sent by an API destination, or its CloudEvents form), Google Artifact
//    Registry (a Pub/Sub push envelope whose message.data is the base64 of {action, digest, tag}), Tencent Cloud TCR
//    Enterprise (its trigger sends Harbor's default format, pushImage, from a tencentcloudcr.com host); CloudEvents 1.0
//    (structured, binary, or a batch), whose types name the reader of their data; and REGISTRIES, the table of every
//    registry a hook's REPO_TYPE names, which comes last because it names every reader. REPO_TYPE=auto recognises a
//    payload by its shape alone, each registry by fields no other sends (recognisedRepoType says which it chose).
//    Exports: registryFor, REPO_TYPES, repoTypeSetting.
//    Tests: test/registries.test.ts, test/registry-e2e.test.ts, test/upgrade.test.ts, test/clouds.test.ts,
//    test/envelopes.test.ts.
// ================================================================================================

/** A CloudEvents attribute of the event being read: its value, and where it was (a field, or a ce-* header). */
interface EventAttribute {
  value: string | undefined;
  field: string;
}

/** Reads a CloudEvent's data at `base`; `attribute` gives the event's own attributes (source, time). */
type CloudEventReader = (
  p: PayloadFields,
  s: RegistrySettings,
  base: string,
  attribute: (name: string) => EventAttribute,
) => Reading;

// ---- AWS ECR ------------------------------------------------------------------------------------

const ECR_IMAGE_ACTION = 'ECR Image Action';
// The detail.action-type and detail.result values ECR documents for an ECR Image Action.
const ECR_ACTIONS = ['PUSH', 'DELETE'];
const ECR_RESULTS = ['SUCCESS', 'FAILURE'];
const AWS_ACCOUNT = /^\d{12}$/;
// The CloudEvents source of an ECR push: urn:aws:ecr:<region>:<account>:repository/<name> (or the ARN).
const ECR_SOURCE = /^(?:urn|arn):aws[a-z-]*:ecr:([a-z0-9-]+):(\d{12}):repository\/(.+)$/;

/** An ECR private registry's host; China's regions are served under amazonaws.com.cn. */
function ecrHost(account: EventAttribute, region: EventAttribute): string {
  if (account.value === undefined) throw new Error(`${account.field} is missing (the AWS account id of the registry)`);
  if (!AWS_ACCOUNT.test(account.value))
    throw new Error(`${account.field} ${showValue(account.value)} is not an AWS account id (12 digits)`);
  if (region.value === undefined) throw new Error(`${region.field} is missing (the AWS region of the registry)`);
  if (!REFERENCE_GRAMMAR.region.test(region.value))
    throw new Error(`${region.field} ${showValue(region.value)} is not an AWS region (e.g. us-west-2)`);
  const domain = region.value.startsWith('cn-') ? 'amazonaws.com.cn' : 'amazonaws.com';
  return `${account.value}.dkr.ecr.${region.value}.${domain}`;
}

/** A cloud's announced digest, pinned only when valid: the field is then named with why it is not used. */
function validDigest(digest: string | undefined, field: string): { digest: string | undefined; digestField: string } {
  if (digest === undefined || REFERENCE_GRAMMAR.digest.test(digest)) return { digest, digestField: field };
  return { digest: undefined, digestField: `${field} (${previewValue(digest)} is not a valid digest)` };
}

/** The EventBridge event ECR sends for an image action: only a successful PUSH of a tag announces an image. */
function ecrEventBridgeRead(p: PayloadFields, s: RegistrySettings): Reading {
  const detailType = p.required('detail-type', `the EventBridge event type, ${showValue(ECR_IMAGE_ACTION)}`);
  if (detailType !== ECR_IMAGE_ACTION) return { noop: `ECR event ${showValue(detailType)} is not an image action` };
  if (!p.has('detail'))
    throw new Error('detail is missing (the image action: action-type, result, repository-name, image-tag)');
  const action = p.required('detail.action-type', ECR_ACTIONS.join(' or '));
  if (!ECR_ACTIONS.includes(action))
    throw new Error(`detail.action-type ${showValue(action)} is not one ECR sends (${ECR_ACTIONS.join(', ')})`);
  const result = p.required('detail.result', ECR_RESULTS.join(' or '));
  if (!ECR_RESULTS.includes(result))
    throw new Error(`detail.result ${showValue(result)} is not one ECR sends (${ECR_RESULTS.join(', ')})`);
  if (action !== 'PUSH') return { noop: `ECR image action ${showValue(action)} is not a push` };
  if (result !== 'SUCCESS') return { noop: `ECR image push ${showValue(result)}: nothing was pushed` };
  const repository = p.repository('detail.repository-name', 'the repository');
  const tag = p.optional('detail.image-tag');
  if (tag === undefined)
    return { noop: 'pushed by digest, without a tag (detail.image-tag is empty): nothing to deploy' };
  const at = (field: string): EventAttribute => ({ value: p.optional(field), field });
  const host = pushHost(s, s.registryHost ?? ecrHost(at('account'), at('region')), 'account/region', 'ECR');
  return {
    host,
    repository,
    tag,
    tagField: 'detail.image-tag',
    ...validDigest(p.optional('detail.image-digest'), 'detail.image-digest'),
    pushedAt: p.time('time'),
  };
}

/** The CloudEvents form of an ECR push (com.amazon.ecr.image.push, as Argo CD Image Updater's relay sends it). */
const ecrCloudEvent: CloudEventReader = (p, s, base, attribute) => {
  const source = attribute('source');
  const urn = source.value === undefined ? null : ECR_SOURCE.exec(source.value);
  if (urn === null)
    throw new Error(
      `${source.field} ${source.value === undefined ? 'is missing' : `${showValue(source.value)} is not`} an ECR ` +
        'repository URN (urn:aws:ecr:<region>:<account>:repository/<name>)',
    );
  const repository = p.repository(fieldAt(base, 'repositoryName'), 'the repository');
  const tag = p.optional(fieldAt(base, 'imageTag'));
  if (tag === undefined)
    return { noop: `pushed by digest, without a tag (${fieldAt(base, 'imageTag')} is empty): nothing to deploy` };
  const registryId = fieldAt(base, 'registryId');
  const account = { value: p.optional(registryId) ?? urn[2], field: p.has(registryId) ? registryId : source.field };
  const host = s.registryHost ?? ecrHost(account, { value: urn[1], field: source.field });
  return {
    host: pushHost(s, host, source.field, 'ECR'),
    repository,
    tag,
    tagField: fieldAt(base, 'imageTag'),
    ...validDigest(p.optional(fieldAt(base, 'imageDigest')), fieldAt(base, 'imageDigest')),
    pushedAt: attribute('time').value ?? '',
  };
};

// ---- Google Artifact Registry -------------------------------------------------------------------

// The hosts Artifact Registry (and Container Registry, which it now serves) names images on.
const GOOGLE_REGISTRY_HOST = /^(?:[a-z0-9-]+-docker\.pkg\.dev|(?:[a-z]+\.)?gcr\.io)$/;
// The actions Artifact Registry's notifications document.
const GAR_ACTIONS = ['INSERT', 'DELETE'];

/** message.data of a Pub/Sub push: base64 of the notification's JSON, read as message.data.* fields. */
function pubSubMessageData(p: PayloadFields): PayloadFields {
  const data = p.required('message.data', 'the base64 of the Artifact Registry notification');
  let text: string;
  try {
    text = decodeBase64Strict(data).toString('utf8');
  } catch {
    throw new Error('message.data is not base64 (Pub/Sub sends the notification base64-encoded)');
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new Error(`message.data is not the base64 of JSON: ${(e as Error).message}`);
  }
  if (!isObject(value)) throw new Error(`message.data decodes to ${typeName(value)}, not the notification's object`);
  return new PayloadFields({ message: { data: value } });
}

/** An image reference of a notification (host/path:tag or host/path@digest) on a Google registry host. */
function googleImage(field: string, text: string, s: RegistrySettings): { host: string; path: string } {
  const { host, path: repoPath } = splitImageAddress(text);
  if (host === undefined || !GOOGLE_REGISTRY_HOST.test(host))
    throw new Error(
      `${field} ${showValue(text)} does not name an Artifact Registry host (<location>-docker.pkg.dev, gcr.io)`,
    );
  return { host: pushHost(s, host, field, 'Artifact Registry'), path: checkedRepository(repoPath, field) };
}

/** Artifact Registry's notification in a Pub/Sub push envelope: an INSERT with a tag announces an image. */
function garRead(p: PayloadFields, s: RegistrySettings): Reading {
  const d = pubSubMessageData(p);
  const action = d.required('message.data.action', GAR_ACTIONS.join(' or '));
  if (!GAR_ACTIONS.includes(action))
    throw new Error(
      `message.data.action ${showValue(action)} is not one Artifact Registry sends (${GAR_ACTIONS.join(', ')})`,
    );
  if (action !== 'INSERT') return { noop: `Artifact Registry action ${showValue(action)} is not an image push` };
  const tagRef = d.optional('message.data.tag');
  if (tagRef === undefined)
    return { noop: 'an image inserted by digest, without a tag (message.data.tag is absent): nothing to deploy' };
  const digestRef = d.optional('message.data.digest');
  // The tag field is the whole reference; a relay that sends the tag alone leaves the image to the digest field.
  const colon = tagRef.lastIndexOf(':');
  const whole = colon > tagRef.lastIndexOf('/') && tagRef.includes('/');
  const named = whole ? tagRef : digestRef;
  if (named === undefined) throw new Error('message.data.digest is missing (the image the tag was added to)');
  const image = googleImage(whole ? 'message.data.tag' : 'message.data.digest', named, s);
  const tag = whole ? tagRef.slice(colon + 1) : tagRef;
  const at = digestRef?.lastIndexOf('@') ?? -1;
  const digest = at < 0 ? undefined : digestRef!.slice(at + 1);
  if (digestRef !== undefined && splitImageAddress(digestRef).path !== image.path)
    throw new Error(`message.data.digest ${showValue(digestRef)} names another image than ${showValue(named)}`);
  return {
    host: image.host,
    repository: image.path,
    tag,
    tagField: 'message.data.tag',
    ...validDigest(digest, 'message.data.digest'),
    pushedAt: p.time('message.publishTime'),
  };
}

// ---- Tencent Cloud TCR ---------------------------------------------------------------------------

// A TCR Enterprise instance's own domain, <instance>.tencentcloudcr.com, as its trigger's resource_url names it.
const TCR_HOST = /^[a-z0-9][a-z0-9-]*\.tencentcloudcr\.com$/;
// The trigger action of an image push, as TCR's trigger logs and trigger API name it (Harbor 1.x's name).
const TCR_PUSH = 'pushImage';

/** A TCR Enterprise trigger's delivery: Harbor's default format whose resources are on a tencentcloudcr.com host. */
function isTcrDelivery(p: PayloadFields): boolean {
  const resources = p.has('event_data.resources') ? p.value('event_data.resources') : undefined;
  if (!Array.isArray(resources)) return false;
  return resources.some(
    (r) =>
      isObject(r) && typeof r.resource_url === 'string' && TCR_HOST.test(splitImageAddress(r.resource_url).host ?? ''),
  );
}

/** TCR Enterprise's trigger (触发器): a pushImage announces the pushed tags, one push per tagged resource. */
function tcrRead(p: PayloadFields, s: RegistrySettings): Reading {
  const type = p.required('type', `the trigger action, ${showValue(TCR_PUSH)} for an image push`);
  if (type !== TCR_PUSH) return { noop: `TCR trigger action ${showValue(type)} is not an image push (${TCR_PUSH})` };
  if (!p.has('event_data')) throw new Error('event_data is missing (the pushed resources and their repository)');
  return harborPush(p, s, 'event_data', p.time('occur_at'), 'TCR');
}

// ---- CloudEvents ----------------------------------------------------------------------------------

/** The CloudEvents types whose data this receiver reads, by type: the reader of the data at `base`. */
const CLOUDEVENT_TYPES: Record<string, CloudEventReader> = {
  'harbor.artifact.pushed': (p, s, base) => harborPush(p, s, base, p.time(fieldAt(base, 'occur_at'))),
  ...Object.fromEntries(
    ACR_PUSH_TYPES.map((type): [string, CloudEventReader] => [type, (p, s, b) => acrPush(p, s, b)]),
  ),
  'com.amazon.ecr.image.push': ecrCloudEvent,
};
// Types of the senders above that announce something other than a push: acknowledged, not refused.
const CLOUDEVENT_OTHER_TYPES = /^(?:harbor\.|Microsoft\.ContainerRegistry\.|com\.amazon\.ecr\.|Image[A-Z])/;

/** CloudEvents 1.0: structured mode (the event is the body), binary mode (ce-* headers, body = data), or a batch. */
function cloudEventsRead(p: PayloadFields, s: RegistrySettings, h: PushHeaders): Reading {
  return Array.isArray(p.value('')) ? cloudEventsBatchRead(p, s) : cloudEventRead(p, s, h, '');
}

/** One CloudEvent: the body (`at` ""), or the event at index `at` of a batch. */
function cloudEventRead(p: PayloadFields, s: RegistrySettings, h: PushHeaders, at: string): Reading {
  const binary = at === '' && p.optional('specversion') === undefined;
  const attribute = (name: string): EventAttribute =>
    binary
      ? { value: h[`ce-${name}`], field: `the ce-${name} header` }
      : { value: p.optional(fieldAt(at, name)), field: fieldAt(at, name) };
  const version = attribute('specversion').value;
  if (version === undefined)
    throw new Error("neither the payload's specversion nor the ce-specversion header is set (CloudEvents 1.0)");
  if (version !== '1.0') throw new Error(`CloudEvents specversion ${showValue(version)} is not supported (1.0)`);
  const type = binary ? h['ce-type'] : p.required(fieldAt(at, 'type'), 'the CloudEvents type');
  if (type === undefined) throw new Error('the ce-type header is missing (CloudEvents binary mode)');
  const reader = Object.hasOwn(CLOUDEVENT_TYPES, type) ? CLOUDEVENT_TYPES[type] : undefined;
  if (reader) return reader(p, s, binary ? '' : fieldAt(at, 'data'), attribute);
  if (CLOUDEVENT_OTHER_TYPES.test(type)) return { noop: `CloudEvents type ${showValue(type)} is not a push` };
  throw new Error(
    `CloudEvents type ${showValue(type)} is not one this receiver reads (${Object.keys(CLOUDEVENT_TYPES).join(', ')})`,
  );
}

/** A CloudEvents batch (application/cloudevents-batch+json): a JSON array of structured events. */
function cloudEventsBatchRead(p: PayloadFields, s: RegistrySettings): Reading {
  const n = p.count('');
  if (n === 0) throw new Error('the CloudEvents batch is empty (a JSON array of events)');
  const pushes: PushEvent[] = [];
  const others: string[] = [];
  for (let i = 0; i < eventsRead(n); i++) {
    const reading = cloudEventRead(p, s, {}, String(i));
    if (Array.isArray(reading)) pushes.push(...reading);
    else if ('noop' in reading) others.push(reading.noop);
    else if ('answer' in reading) return reading;
    else pushes.push(reading);
  }
  return pushes.length ? pushes : { noop: `no image push in the CloudEvents batch (${ignoredEvents(others, n)})` };
}

/** An Event Grid delivery: an array whose events are all Event Grid's (eventType, or a Microsoft or short type). */
function isEventGridBatch(p: PayloadFields): boolean {
  const events = p.value('');
  if (!Array.isArray(events) || events.length === 0) return false;
  return events.every((e) => {
    if (!isObject(e)) return false;
    const type = e.eventType ?? e.type;
    return (
      typeof type === 'string' &&
      (e.eventType !== undefined || /^Microsoft\./.test(type) || ACR_PUSH_TYPES.includes(type))
    );
  });
}

/** A CloudEvent (or a batch of them) whose type is one of `prefix`'s: the sender is known by its event types. */
function cloudEventOfType(p: PayloadFields, prefix: RegExp): boolean {
  const root = p.value('');
  const events = Array.isArray(root) ? root : [root];
  return (
    events.length > 0 &&
    events.every((e) => isObject(e) && typeof e.specversion === 'string' && prefix.test(String(e.type)))
  );
}

/** The registries a hook's REPO_TYPE (the URL's repo_type) names. Adding one is one entry plus its fixture. */
const REGISTRIES: Record<string, Registry> = {
  regionalregistry: {
    sender: 'Aliyun Container Registry (ACR)',
    recognise: {
      looksFor: 'push_data with repository.region and repo_full_name',
      test: (p) => p.has('push_data') && p.has('repository.region') && p.has('repository.repo_full_name'),
    },
    testPing: pushDataTestPing,
    read(p, s) {
      const repository = p.repository('repository.repo_full_name', 'ACR names the repository as namespace/name there');
      return pushDataEvent(p, s.registryHost ?? acrHost(p, s.netType), repository);
    },
  },
  publicregistry: {
    sender: 'Docker Hub',
    recognise: {
      looksFor: 'push_data with repository.repo_name',
      test: (p) => p.has('push_data') && p.has('repository.repo_name'),
    },
    testPing: pushDataTestPing,
    read: (p, s) =>
      pushDataEvent(
        p,
        s.registryHost,
        p.repository('repository.repo_name', 'Docker Hub names the repository as namespace/name there'),
      ),
  },
  custom: {
    sender: 'a build job (the ACR payload shape, with repository.repo_url)',
    recognise: {
      looksFor: 'push_data with repository.repo_url',
      test: (p) => p.has('push_data') && p.has('repository.repo_url'),
    },
    testPing: pushDataTestPing,
    read(p, s) {
      const host =
        s.registryHost ??
        customRegistryAddress(p.required('repository.repo_url', 'the registry address, or set REGISTRY_HOST'));
      const namespace = p.repository('repository.namespace', 'the repository namespace');
      const name = p.repository('repository.name', 'the repository name');
      return pushDataEvent(p, host, `${namespace}/${name}`);
    },
  },
  harbor: {
    sender: 'Harbor',
    recognise: {
      looksFor: 'event_data.resources (not on a tencentcloudcr.com host), or a CloudEvent of type harbor.*',
      test: (p) =>
        (p.has('event_data.resources') && !isTcrDelivery(p)) ||
        /^harbor\./.test(String(p.has('specversion') && p.value('type'))),
    },
    read: harborRead,
  },
  quay: {
    sender: 'Quay',
    recognise: { looksFor: 'docker_url with updated_tags', test: (p) => p.has('docker_url') && p.has('updated_tags') },
    read: quayRead,
  },
  ghcr: {
    sender: 'GitHub Container Registry (GitHub package events)',
    recognise: {
      looksFor: 'the X-GitHub-Event header, or package.package_type or registry_package',
      test: (p, h) =>
        // Gitea sends X-GitHub-Event too, for compatibility; its own header tells them apart.
        (h['x-github-event'] !== undefined && h['x-gitea-event'] === undefined) ||
        p.has('package.package_type') ||
        p.has('package.ecosystem') ||
        p.has('registry_package'),
    },
    read: ghcrRead,
  },
  azure: {
    sender: 'Azure Container Registry (its webhook, or Event Grid)',
    batches: true,
    recognise: {
      looksFor: 'a JSON array of Event Grid events, eventType, or action with target.repository and request.host',
      test: (p) =>
        isEventGridBatch(p) ||
        p.has('eventType') ||
        (p.has('target.repository') && p.has('request.host') && !p.has('events')),
    },
    read: azureRead,
  },
  distribution: {
    sender: "a CNCF Distribution registry (registry:2, GitLab's container registry)",
    recognise: { looksFor: 'an envelope of events[]', test: (p) => p.has('events') },
    read: distributionRead,
  },
  jfrog: {
    sender: 'JFrog Artifactory',
    recognise: {
      looksFor: 'image_name with event_type (or data.image_name)',
      test: (p) => (p.has('image_name') && p.has('event_type')) || p.has('data.image_name'),
    },
    read: jfrogRead,
  },
  nexus: {
    sender: 'Sonatype Nexus Repository',
    recognise: {
      looksFor: 'the X-Nexus-Webhook-Id header, or component.format with repositoryName',
      test: (p, h) => h['x-nexus-webhook-id'] !== undefined || (p.has('component.format') && p.has('repositoryName')),
    },
    read: nexusRead,
  },
  gitea: {
    sender: 'Gitea',
    recognise: {
      looksFor: 'the X-Gitea-Event header, or package.type with package.owner',
      test: (p, h) => h['x-gitea-event'] !== undefined || (p.has('package.type') && p.has('package.owner')),
    },
    read: giteaRead,
  },
  ecr: {
    sender: 'Amazon ECR (an EventBridge rule with an API destination, or its CloudEvents form)',
    batches: true,
    recognise: {
      looksFor: 'source "aws.ecr" with detail-type, or CloudEvents of type com.amazon.ecr.*',
      test: (p) =>
        (p.has('detail-type') &&
          isObject(p.value('')) &&
          (p.value('') as Record<string, unknown>).source === 'aws.ecr') ||
        cloudEventOfType(p, /^com\.amazon\.ecr\./),
    },
    read: (p, s, h) =>
      p.has('specversion') || Array.isArray(p.value('')) ? cloudEventsRead(p, s, h) : ecrEventBridgeRead(p, s),
  },
  gar: {
    sender: 'Google Artifact Registry (a Pub/Sub push subscription to the topic gcr)',
    recognise: {
      looksFor: 'a Pub/Sub push envelope: message.data with subscription',
      test: (p) => p.has('message.data') && p.has('subscription'),
    },
    read: garRead,
  },
  tcr: {
    sender: 'Tencent Cloud TCR Enterprise Edition (a trigger, 触发器)',
    recognise: {
      looksFor: 'event_data.resources whose resource_url is on a <instance>.tencentcloudcr.com host',
      test: isTcrDelivery,
    },
    read: tcrRead,
  },
  cloudevents: {
    sender: 'a CloudEvents 1.0 producer (structured or binary mode, or a batch)',
    batches: true,
    recognise: {
      looksFor: 'specversion (or a JSON array of events with it), or the ce-specversion header',
      test: (p, h) => p.has('specversion') || h['ce-specversion'] !== undefined || cloudEventOfType(p, /./),
    },
    read: cloudEventsRead,
  },
};

const AUTO = 'auto';
export const REPO_TYPES = [...Object.keys(REGISTRIES), AUTO];

/** REPO_TYPE=auto: the first registry whose headers or payload this is, else an error naming what it looked for. */
function recogniseRegistry(p: PayloadFields, h: PushHeaders): Registry {
  return REGISTRIES[recognisedRepoType(p.value(''), h)];
}

/** The REPO_TYPE auto takes a payload for; throws an error naming what it looked for when none fits. */
export function recognisedRepoType(payload: unknown, h: PushHeaders): string {
  const p = new PayloadFields(payload);
  for (const [type, registry] of Object.entries(REGISTRIES)) if (registry.recognise?.test(p, h)) return type;
  const lookedFor = Object.entries(REGISTRIES).map(
    ([type, r]) => `${type}: ${r.recognise?.looksFor ?? 'never guessed'}`,
  );
  throw new Error(
    `REPO_TYPE auto: the payload is not one this receiver recognises; looked for ${lookedFor.join('; ')}`,
  );
}

function registryFor(value: string | undefined, p: PayloadFields, h: PushHeaders): Registry {
  const repoType = repoTypeSetting(value);
  return repoType === AUTO ? recogniseRegistry(p, h) : REGISTRIES[repoType];
}

/** REPO_TYPE: a key of REGISTRIES or auto, in any case; lower-cased. */
function repoTypeSetting(value: string | undefined): string {
  const repoType = (value ?? '').trim().toLowerCase();
  const known = REPO_TYPES.join(', ');
  if (repoType === '')
    throw new Error(`REPO_TYPE is not set (the hook passes it from the URL parameter repo_type: ${known})`);
  if (repoType !== AUTO && !Object.hasOwn(REGISTRIES, repoType))
    throw new Error(`REPO_TYPE ${showValue(value ?? '')} is not supported (use ${known})`);
  return repoType;
}

// ================================================================================================
// 25. image reference & pin — composes the reference the cluster will pull (composeImageRef; chooseCandidate picks
//    the container's among several), validates it against the OCI distribution reference grammar before anything is
//    sent to Kubernetes, and applies the image pin (checkImagePin): whoever holds a hook's URL writes the payload, so
//    a push may change only the tag and digest of the repository the container runs now. Endpoints of one registry
//    count as the same (REGISTRY_ENDPOINTS), and so does the hook's REGISTRY_HOST; anything else needs ALLOW_IMAGES
//    (`host/path`, `host/path/*`, `host/*`; Docker Hub's may omit the host). Both widen what a request may deploy, so
//    HOOK_SETTINGS (hook settings) has them refused at load unless they are fixed strings, and valid.
//    Exports: allowedImages, checkImagePin, chooseCandidate, composeImageRef, imagePin, ImagePin, normalizeImageRef,
//    problemOf, readImagePin, registryHostSetting, registryOf, validateImageRef.
//    Tests: test/registries.test.ts, test/upgrade.test.ts, test/clouds.test.ts.
// ================================================================================================

/**
 * The image reference a push announces, a no-op (a test ping, another kind of event), an answer to
 * a handshake, or an error naming the field. `headers` are the request's (argument 2), when passed.
 */
export function composeImageRef(body: unknown, reading: PushReading, headers: PushHeaders = {}): ComposedRef {
  // Through a hook's entire-payload a JSON array body arrives as {"root": [...]}, as adnanh passes it.
  const payload = isObject(body) && Object.keys(body).length === 1 && Array.isArray(body.root) ? body.root : body;
  try {
    if (!isObject(payload) && !Array.isArray(payload))
      return { kind: 'error', message: `payload is not a JSON object (got ${typeName(payload)})` };
    const fields = new PayloadFields(payload);
    const registry = registryFor(reading.repoType, fields, headers);
    if (Array.isArray(payload) && !registry.batches)
      return { kind: 'error', message: `payload is not a JSON object (got ${typeName(payload)})` };
    const ping = registry.testPing?.(fields);
    if (ping !== undefined) return { kind: 'noop', reason: ping };
    const { registryHost, netType } = reading;
    return composeReading(registry.read(fields, { registryHost, netType }, headers), reading);
  } catch (e) {
    return { kind: 'error', message: (e as Error).message };
  }
}

/** One reading → one ComposedRef: several pushes become one reference with candidates. */
function composeReading(read: Reading, settings: PushReading): ComposedRef {
  if ('noop' in read) return { kind: 'noop', reason: read.noop };
  if ('answer' in read) return { kind: 'answer', body: read.answer, reason: read.reason };
  if (!Array.isArray(read)) return composeFromPush(read, settings);
  const composed = newestPerRepository(read).map((push) => composeFromPush(push, settings));
  const failed = composed.find((c) => c.kind === 'error');
  if (failed) return failed;
  const refs = composed.filter((c) => c.kind === 'ref');
  if (refs.length === 0) return composed[0];
  const distinct = [...new Set(refs.map((r) => r.ref))];
  const last = refs[refs.length - 1];
  // Which announced digest belongs to the container's image is not known: VERIFY_IMAGE then compares none.
  return distinct.length > 1 ? { ...last, candidates: distinct, digest: undefined } : last;
}

/** When a time orders pushes (a batch of events); a push without a readable time is older than any with one. */
const batchPushTime = (push: PushEvent) => Date.parse(push.pushedAt) || -Infinity;

/**
 * Of several pushes to one repository in one delivery (an Event Grid or CloudEvents batch), the newest by the
 * payload's own times: an older push never wins over a newer one for the same container. Pushes with equal times (or
 * none, as Quay's tags of one push) all stay, for chooseCandidate to pick among. Pure.
 */
function newestPerRepository(pushes: PushEvent[]): PushEvent[] {
  const newest = new Map<string, number>();
  const key = (push: PushEvent) => `${push.host ?? ''}/${push.repository}`;
  for (const push of pushes) newest.set(key(push), Math.max(newest.get(key(push)) ?? -Infinity, batchPushTime(push)));
  return pushes.filter((push) => batchPushTime(push) === newest.get(key(push)));
}

/**
 * Of several references one delivery announced, the one for a container that runs `current`: the
 * same repository and tag, else the same repository (the last such), else the first the image pin
 * allows, else the last (which the pin then refuses with its message). Pure.
 */
export function chooseCandidate(container: string, current: string, candidates: string[], pin: ImagePin): string {
  const now = validateImageRef(current.trim());
  const parsed = candidates.map((ref) => ({ ref, parsed: validateImageRef(ref) }));
  if (now.ok) {
    const from = repositoryOf(now.ref);
    const same = parsed.filter(
      (c) => c.parsed.ok && showRepository(repositoryOf(c.parsed.ref)) === showRepository(from),
    );
    const sameTag = same.find((c) => c.parsed.ok && c.parsed.ref.tag === (now.ref.tag ?? 'latest'));
    if (sameTag || same.length) return (sameTag ?? same[same.length - 1]).ref;
  }
  const allowed = candidates.find((ref) => checkImagePin(container, current, ref, pin).allowed);
  return allowed ?? candidates[candidates.length - 1];
}

function registryHostSetting(value: string | undefined): string | undefined {
  if (!value?.trim()) return undefined;
  const host = stripSchemeAndSlashes(value);
  if (domainProblem(host)) {
    throw new Error(
      `REGISTRY_HOST ${showValue(value)} is not a valid registry host (host[:port], e.g. ` +
        `myinstance-registry.cn-hangzhou.cr.aliyuncs.com)`,
    );
  }
  return host;
}

const SIGNATURE_TAG = /^sha256-[a-f0-9]{64}\.(?:sig|att|sbom)$/;

/** Registry-independent: the reference from a push, pinned to its digest when PIN_DIGEST asks. */
function composeFromPush(push: PushEvent, reading: PushReading): ComposedRef {
  // cosign stores signatures, attestations and SBOMs as tags of the image's repository.
  if (SIGNATURE_TAG.test(push.tag))
    return { kind: 'noop', reason: `tag ${showValue(push.tag)} is a signature, attestation or SBOM, not an image` };
  const tagIssue = tagProblem(push.tag);
  if (tagIssue) return { kind: 'error', message: `${push.tagField} ${previewValue(push.tag)} ${tagIssue}` };
  const name = push.host === undefined ? push.repository : `${push.host}/${push.repository}`;
  if (name.length > MAX_IMAGE_NAME_LENGTH) {
    return {
      kind: 'error',
      message: `image name ${previewValue(name)} is ${name.length} characters long (at most ${MAX_IMAGE_NAME_LENGTH})`,
    };
  }
  const notes: string[] = [];
  let ref = `${name}:${push.tag}`;
  if (reading.pinDigest instanceof Error) throw reading.pinDigest;
  if (reading.pinDigest) {
    if (push.digest === undefined)
      notes.push(`PIN_DIGEST is true but the payload carries no ${push.digestField}: the tag is used unpinned`);
    else if (!REFERENCE_GRAMMAR.digest.test(push.digest)) {
      return {
        kind: 'error',
        message:
          `${push.digestField} ${showValue(push.digest)} is not a valid digest (sha256: and 64 lower-case ` +
          `hex digits)`,
      };
    } else ref += `@${push.digest}`;
  }
  // Belt and braces: every piece was checked above, so this only fails if composition is wrong.
  const check = validateImageRef(ref);
  if (!check.ok) return { kind: 'error', message: check.message };
  const digest = push.digest !== undefined && REFERENCE_GRAMMAR.digest.test(push.digest) ? push.digest : undefined;
  const pushId = `${push.digest ?? ''}|${push.pushedAt}`;
  return { kind: 'ref', ref, notes, pushId, pushedAt: push.pushedAt, ...(digest ? { digest } : {}) };
}

/** Parses a reference by the distribution grammar; the message names the offending piece. */
export function validateImageRef(ref: string): { ok: true; ref: ImageRef } | { ok: false; message: string } {
  const fail = (message: string) => ({ ok: false as const, message: `image reference ${showValue(ref)}: ${message}` });
  if (ref === '') return fail('is empty');
  let rest = ref;
  let digest: string | undefined;
  const at = rest.indexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!REFERENCE_GRAMMAR.digest.test(digest))
      return fail(`digest ${showValue(digest)} is not valid (sha256: and 64 lower-case hex digits)`);
  }
  let tag: string | undefined;
  const colon = rest.lastIndexOf(':');
  if (colon > rest.lastIndexOf('/')) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    const problem = tagProblem(tag);
    if (problem) return fail(`tag ${previewValue(tag)} ${problem}`);
  }
  if (rest.length > MAX_IMAGE_NAME_LENGTH)
    return fail(`the name is ${rest.length} characters long (at most ${MAX_IMAGE_NAME_LENGTH})`);
  let domain: string | undefined;
  const slash = rest.indexOf('/');
  const first = slash >= 0 ? rest.slice(0, slash) : '';
  // As docker does: the first component is a registry host when it looks like one.
  if (slash >= 0 && (first.includes('.') || first.includes(':') || first === 'localhost' || first.startsWith('['))) {
    domain = first;
    rest = rest.slice(slash + 1);
    const problem = domainProblem(domain);
    if (problem) return fail(`registry host ${showValue(domain)} ${problem}`);
  }
  const problem = repositoryPathProblem(rest);
  if (problem) return fail(`repository ${showValue(rest)} ${problem}`);
  return { ok: true, ref: { domain, path: rest, tag, digest } };
}

/**
 * The canonical form used to compare images: Docker Hub's implicit domain and `library/` made
 * explicit, `index.docker.io` spelt `docker.io`, a missing tag read as `latest` (unless a digest
 * pins it), the host lower-cased. An invalid reference is returned unchanged.
 */
export function normalizeImageRef(ref: string): string {
  const parsed = validateImageRef(ref.trim());
  if (!parsed.ok) return ref;
  const r = parsed.ref;
  let domain = (r.domain ?? 'docker.io').toLowerCase();
  if (domain === 'index.docker.io') domain = 'docker.io';
  const repoPath = domain === 'docker.io' && !r.path.includes('/') ? `library/${r.path}` : r.path;
  const tag = r.tag ?? (r.digest ? undefined : 'latest');
  return `${domain}/${repoPath}${tag ? `:${tag}` : ''}${r.digest ? `@${r.digest}` : ''}`;
}

// ---- the image pin ----------------------------------------------------------------------------

/**
 * Hosts that are endpoints of one registry, reached from different networks, each with the one
 * name the pin compares (a host with a port is its own registry). Adding a registry's endpoints
 * is one entry.
 */
const REGISTRY_ENDPOINTS: [RegExp, string][] = [
  // Docker Hub: what a reference without a host means, and the names its clients resolve that to.
  [/^(?:index\.|registry-1\.)?docker\.io$/, 'docker.io'],
  // ACR's shared registry of a region: public, VPC and classic-network endpoints.
  [/^registry(?:-vpc|-internal)?\.([a-z0-9-]+)\.aliyuncs\.com$/, 'registry.$1.aliyuncs.com'],
  // An ACR Enterprise Edition instance: public and VPC endpoints.
  [/^([a-z0-9-]+)-registry(?:-vpc)?\.([a-z0-9-]+)\.cr\.aliyuncs\.com$/, '$1-registry.$2.cr.aliyuncs.com'],
  // An ACR Personal Edition instance (created since 2024-09): public and VPC endpoints.
  [/^crpi-([a-z0-9]+)(?:-vpc)?\.([a-z0-9-]+)\.personal\.cr\.aliyuncs\.com$/, 'crpi-$1.$2.personal.cr.aliyuncs.com'],
];

/** The registry a host names: lower-cased, one name for every endpoint of one registry. Pure. */
export function registryOf(host: string | undefined): string {
  const h = (host ?? 'docker.io').toLowerCase();
  for (const [endpoint, name] of REGISTRY_ENDPOINTS) if (endpoint.test(h)) return h.replace(endpoint, name);
  return h;
}

/** A repository as the pin compares it: its registry, and its path (Docker Hub's `library/` explicit). */
interface Repository {
  registry: string;
  path: string;
}

function repositoryOf(ref: { domain: string | undefined; path: string }): Repository {
  const registry = registryOf(ref.domain);
  return { registry, path: registry === 'docker.io' && !ref.path.includes('/') ? `library/${ref.path}` : ref.path };
}

const showRepository = (r: Repository) => showValue(`${r.registry}/${r.path}`);

/** One ALLOW_IMAGES entry: a repository, or every repository under a prefix (a trailing `/*`). */
interface ImagePattern {
  text: string;
  registry: string;
  /** The repository's path, or the prefix's ("" for a whole registry). */
  path: string;
  under: boolean;
}

/** Parses one ALLOW_IMAGES pattern; throws an Error naming the setting and the pattern. */
function parseImagePattern(text: string): ImagePattern {
  const problem = (why: string) => new Error(`ALLOW_IMAGES pattern ${showValue(text)} ${why}`);
  const under = text.endsWith('/*');
  const name = under ? text.slice(0, -2) : text;
  if (name.includes('*'))
    throw problem('has a "*" that is not a trailing "/*" (host/path/* allows every repository under host/path)');
  if (name === '') throw problem('names no registry (write host/* to allow every repository of a registry)');
  const slash = name.indexOf('/');
  const first = slash < 0 ? name : name.slice(0, slash);
  // As in a reference, the first component is a registry host when it looks like one; alone, its
  // ":" may also start a tag (nginx:1), so there it needs a "." or to be localhost.
  const looksLikeHost =
    slash < 0 ? /^(?:\[|localhost(?::|$))/.test(first) || first.split(':')[0].includes('.') : /[.:[]/.test(first);
  const host = looksLikeHost || first === 'localhost' ? first : undefined;
  const repoPath = host === undefined ? name : name.slice(first.length + 1);
  if (host !== undefined && slash < 0 && !under)
    throw problem(`names only a registry host (write ${showValue(`${host}/*`)} for every repository of it)`);
  if (host !== undefined && domainProblem(host))
    throw problem(`names an invalid registry host ${showValue(host)} (host[:port])`);
  if (/[:@]/.test(repoPath))
    throw problem('names a tag or digest: a pattern names repositories, whose tags and digests are always allowed');
  const pathIssue = repoPath === '' && under ? undefined : repositoryPathProblem(repoPath);
  if (pathIssue) throw problem(`names an invalid repository: its path ${pathIssue}`);
  const repository = under
    ? { registry: registryOf(host), path: repoPath }
    : repositoryOf({ domain: host, path: repoPath });
  return { text, ...repository, under };
}

function patternMatches(p: ImagePattern, r: Repository): boolean {
  if (p.registry !== r.registry) return false;
  return !p.under ? r.path === p.path : p.path === '' || r.path.startsWith(`${p.path}/`);
}

/** What the pin allows besides the container's own repository: the hook's REGISTRY_HOST and ALLOW_IMAGES. */
export interface ImagePin {
  /** REGISTRY_HOST's registry: it counts as the registry of every container. */
  registryHost: string | undefined;
  allowImages: ImagePattern[];
}

/** The pin of a validated REGISTRY_HOST (registryHostSetting) and ALLOW_IMAGES's patterns (allowedImages). */
export function imagePin(registryHost: string | undefined, allowImages: ImagePattern[] = []): ImagePin {
  return { registryHost: registryHost === undefined ? undefined : registryOf(registryHost), allowImages };
}

/** ALLOW_IMAGES: patterns separated by spaces; throws an Error naming a malformed one. */
export function allowedImages(value: string | undefined): ImagePattern[] {
  return (value ?? '').split(/\s+/).filter((p) => p !== '').map(parseImagePattern);
}

/** The pin from the texts of REGISTRY_HOST and ALLOW_IMAGES; throws an Error naming a malformed one. */
export function readImagePin(registryHost?: string, allowImages?: string): ImagePin {
  return imagePin(registryHostSetting(registryHost), allowedImages(allowImages));
}

type PinDecision = { allowed: true; note?: string } | { allowed: false; message: string };

/**
 * The image pin: whether a push may set a container that runs `current` to `pushed`. It may when
 * the pushed repository is the container's, on the same registry or on the hook's REGISTRY_HOST,
 * or when ALLOW_IMAGES names it; tags and digests are always free. The refusal names both
 * repositories and the setting that would allow the push. Pure.
 */
export function checkImagePin(container: string, current: string, pushed: string, pin: ImagePin): PinDecision {
  const next = validateImageRef(pushed);
  if (!next.ok) return { allowed: false, message: next.message };
  const to = repositoryOf(next.ref);
  const now = validateImageRef(current.trim());
  const from = now.ok ? repositoryOf(now.ref) : undefined;
  if (from && to.path === from.path && (to.registry === from.registry || to.registry === pin.registryHost)) {
    if (to.registry === from.registry) return { allowed: true };
    return { allowed: true, note: `image pin: the registry changes to the hook's REGISTRY_HOST (${to.registry})` };
  }
  const pattern = pin.allowImages.find((p) => patternMatches(p, to));
  if (pattern)
    return {
      allowed: true,
      note: `image pin: ${showRepository(to)} allowed by ALLOW_IMAGES pattern ${showValue(pattern.text)}`,
    };
  const runs = from
    ? `runs repository ${showRepository(from)}`
    : `runs ${showValue(current)}, which is not a valid image reference`;
  return {
    allowed: false,
    message:
      `image pin: container ${showValue(container)} ${runs}, and the push names repository ${showRepository(to)}; ` +
      `a push may change only the tag and digest, unless the hook setting ALLOW_IMAGES lists the repository`,
  };
}

/** Why `check` throws for a value, or undefined when it does not. */
function problemOf(check: () => unknown): string | undefined {
  try {
    check();
    return undefined;
  } catch (e) {
    return (e as Error).message;
  }
}

// ================================================================================================
// 26. change windows & approval links — when a push may go out, as pure functions. A change window
//    (DEPLOY_WINDOW, annotation webhook/window) is one or more ranges `Mon-Fri 09:00-18:00 Asia/Shanghai`, read by
//    parseDeployWindows; windowOpen says whether an instant is inside one and nextOpening when the next one opens,
//    in the range's IANA zone through Intl (daylight saving time included; a range whose end is before its start
//    crosses midnight). A push that must wait is recorded on the workload (PENDING_ANNOTATION, one PendingEntry per
//    container, sealed with a MAC over it and where it sits: sealPendingEntry, pendingEntrySealed); an approval link
//    names one such entry by its id, hook and image, the action and an expiry, signed with HMAC-SHA256
//    (approvalToken, readApprovalToken), so any replica holding the same key can check it.
//    Exports: APPROVAL_PATH, ApprovalClaims, approvalLinks, ApprovalLinks, DeployWindow, describeWindows, nextOpening,
//    parseDeployWindows, PendingEntry, pendingEntrySealed, readApprovalToken, readPendingEntries, sealPendingEntry,
//    windowOpen.
//    Tests: test/approvals.test.ts, test/clusters.test.ts, test/signed-images.test.ts, test/unit.test.ts,
//    test/windows.test.ts.
// ================================================================================================

/** One range of a change window: the weekdays it starts on (0 = Sunday), its minutes of the day, its zone. */
export interface DeployWindow {
  days: Set<number>;
  /** Minutes after local midnight; `end` <= `start` crosses midnight into the next day. */
  start: number;
  end: number;
  zone: string;
  text: string;
}

const WEEKDAYS = ['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat'];

/** `Mon`, `Mon-Fri`, `Fri-Mon` (wrapping), `Sat,Sun`, `daily` or `*`: the weekdays a range starts on. */
function parseWindowDays(text: string): Set<number> {
  if (text === '*' || text.toLowerCase() === 'daily') return new Set([0, 1, 2, 3, 4, 5, 6]);
  const days = new Set<number>();
  for (const part of text.split(',')) {
    const [from, to = from, extra] = part.split('-').map((d) => WEEKDAYS.indexOf(d.toLowerCase().slice(0, 3)));
    const named = part
      .split('-')
      .every((d) => /^[A-Za-z]{3,9}$/.test(d) && WEEKDAYS.includes(d.toLowerCase().slice(0, 3)));
    if (!named || extra !== undefined || from < 0 || to < 0)
      throw new Error(`${showValue(part)} is not a weekday or a range of weekdays (Mon, Mon-Fri, Sat,Sun, daily)`);
    for (let d = from; ; d = (d + 1) % 7) {
      days.add(d);
      if (d === to) break;
    }
  }
  return days;
}

/** `09:00` → 540; `24:00` is allowed as an end. */
function parseWindowTime(text: string, isEnd: boolean): number {
  const m = /^(\d{1,2}):(\d{2})$/.exec(text);
  const minutes = m ? Number(m[1]) * 60 + Number(m[2]) : NaN;
  if (!m || Number(m[2]) > 59 || minutes > (isEnd ? 1440 : 1439))
    throw new Error(`${showValue(text)} is not a time of day (HH:MM, 00:00 to ${isEnd ? '24:00' : '23:59'})`);
  return minutes;
}

/**
 * The zone as Intl spells it (Asia/Shanghai for asia/SHANGHAI: Intl ignores case, so one zone has a great many
 * spellings), or undefined when Intl does not know it.
 */
function canonicalZone(zone: string): string | undefined {
  try {
    return new Intl.DateTimeFormat('en-US', { timeZone: zone }).resolvedOptions().timeZone;
  } catch {
    return undefined;
  }
}

// A change window is one line an operator writes, like a policy (MAX_POLICY_LENGTH): a week's ranges in a few
// zones fit easily. Longer is a mistake or an attack (an annotation may hold 256 KiB), refused before it is read.
const MAX_WINDOW_LENGTH = 1024;
// Ranges in one window: a different range for each day of the week, twice over, still fits.
const MAX_WINDOW_RANGES = 16;

/**
 * DEPLOY_WINDOW and webhook/window: ranges separated by `;`, each `<days> <HH:MM>-<HH:MM> [<IANA zone>]` (zone
 * UTC when left out), at most MAX_WINDOW_LENGTH characters and MAX_WINDOW_RANGES ranges. Throws an Error naming the
 * range and what is wrong with it. A range's zone is kept as Intl spells it. Pure.
 */
export function parseDeployWindows(text: string): DeployWindow[] {
  if (text.length > MAX_WINDOW_LENGTH) throw new Error(`longer than ${MAX_WINDOW_LENGTH} characters (${text.length})`);
  const ranges = text.split(';').map((r) => r.trim());
  if (ranges.length > MAX_WINDOW_RANGES) throw new Error(`more than ${MAX_WINDOW_RANGES} ranges (${ranges.length})`);
  if (ranges.every((r) => r === '')) throw new Error('no range given (e.g. "Mon-Fri 09:00-18:00 Asia/Shanghai")');
  return ranges.map((range, i) => {
    const where = `range ${i + 1} ${showValue(range)}`;
    const words = range.split(/\s+/);
    if (range === '' || words.length < 2 || words.length > 3)
      throw new Error(`${where}: expected "<days> <HH:MM>-<HH:MM> [<zone>]", e.g. "Mon-Fri 09:00-18:00 Asia/Shanghai"`);
    const [dayText, hours, zone = 'UTC'] = words;
    try {
      const days = parseWindowDays(dayText);
      const [from, to, extra] = hours.split('-');
      if (to === undefined || extra !== undefined) throw new Error(`${showValue(hours)} is not HH:MM-HH:MM`);
      const start = parseWindowTime(from, false);
      const end = parseWindowTime(to, true);
      if (start === end) throw new Error(`${showValue(hours)} is empty: it starts where it ends`);
      const canonical = canonicalZone(zone);
      if (canonical === undefined)
        throw new Error(`${showValue(zone)} is not an IANA time zone (e.g. Asia/Shanghai, UTC)`);
      return { days, start, end, zone: canonical, text: range };
    } catch (e) {
      throw new Error(`${where}: ${(e as Error).message}`);
    }
  });
}

/** The windows as an operator wrote them, for messages. */
export function describeWindows(windows: DeployWindow[]): string {
  return windows.map((w) => w.text).join('; ');
}

// One formatter per zone in use, kept between pushes (making one costs far more than using it); each holds tens of
// KiB. Windows name a handful of zones; past this many the one made longest ago goes.
const MAX_ZONE_FORMATS = 64;

/** The formatters wallClock keeps, by the zone as Intl spells it (canonicalZone), never as a window spells it. */
const zoneFormats = new Map<string, Intl.DateTimeFormat>();

/** How many zone formatters are kept (for tests: many spellings of one zone keep one). */
export function keptZoneFormats(): number {
  return zoneFormats.size;
}

/** The formatter of `zone`'s wall clock: kept by its canonical name, so a spelling of a kept zone adds none. */
function zoneFormat(zone: string): Intl.DateTimeFormat {
  const kept = zoneFormats.get(zone);
  if (kept) return kept;
  const options = { timeZone: zone, hourCycle: 'h23', weekday: 'short', year: 'numeric', minute: 'numeric' } as const;
  const made = new Intl.DateTimeFormat('en-US', { ...options, month: 'numeric', day: 'numeric', hour: 'numeric' });
  const canonical = made.resolvedOptions().timeZone;
  const known = zoneFormats.get(canonical);
  if (known) return known;
  if (zoneFormats.size >= MAX_ZONE_FORMATS) zoneFormats.delete(zoneFormats.keys().next().value!);
  zoneFormats.set(canonical, made);
  return made;
}

/** The wall clock in `zone` at `ms`: year, month (1-12), day, weekday (0 = Sunday), minutes of the day. */
function wallClock(ms: number, zone: string): { y: number; mo: number; d: number; weekday: number; minutes: number } {
  const f = zoneFormat(zone);
  const parts: Record<string, string> = {};
  for (const p of f.formatToParts(ms)) parts[p.type] = p.value;
  const weekday = WEEKDAYS.indexOf(parts.weekday.toLowerCase().slice(0, 3));
  return { y: +parts.year, mo: +parts.month, d: +parts.day, weekday, minutes: +parts.hour * 60 + +parts.minute };
}

/** Whether `ms` is inside one of the windows. Pure. */
export function windowOpen(windows: DeployWindow[], ms: number): boolean {
  return windows.some((w) => {
    const { weekday, minutes } = wallClock(ms, w.zone);
    if (w.start < w.end) return w.days.has(weekday) && minutes >= w.start && minutes < w.end;
    // Crossing midnight: the evening of a listed day, or the early hours after one.
    return (w.days.has(weekday) && minutes >= w.start) || (w.days.has((weekday + 6) % 7) && minutes < w.end);
  });
}

/**
 * The instant the wall clock in `zone` first reads the day and minute given at or after it: the offset is
 * found from a first guess and checked; a time that daylight saving time skips opens when the clocks jump. Pure.
 */
function zonedInstant(y: number, mo: number, d: number, minutes: number, zone: string): number {
  const wall = Date.UTC(y, mo - 1, d, 0, minutes);
  const offsetAt = (ms: number) => {
    const c = wallClock(ms, zone);
    return Date.UTC(c.y, c.mo - 1, c.d, 0, c.minutes) - Math.floor(ms / 60_000) * 60_000;
  };
  let t = wall - offsetAt(wall);
  t = wall - offsetAt(t);
  const c = wallClock(t, zone);
  if (Date.UTC(c.y, c.mo - 1, c.d, 0, c.minutes) === wall) return t;
  // Skipped (a spring-forward gap): the first minute whose wall clock is past the time asked for.
  let lo = t - 3 * 3_600_000;
  let hi = t + 3 * 3_600_000;
  while (hi - lo > 60_000) {
    const mid = lo + Math.floor((hi - lo) / 120_000) * 60_000;
    const m = wallClock(mid, zone);
    if (Date.UTC(m.y, m.mo - 1, m.d, 0, m.minutes) >= wall) hi = mid;
    else lo = mid;
  }
  return hi;
}

/** When a push at `fromMs` may go out: `fromMs` inside a window, else the next opening (within 8 days). Pure. */
export function nextOpening(windows: DeployWindow[], fromMs: number): number {
  if (windowOpen(windows, fromMs)) return fromMs;
  let best = Infinity;
  for (const w of windows) {
    const today = wallClock(fromMs, w.zone);
    for (let k = -1; k <= 8; k++) {
      const day = new Date(Date.UTC(today.y, today.mo - 1, today.d + k));
      if (!w.days.has(day.getUTCDay())) continue;
      const t = zonedInstant(day.getUTCFullYear(), day.getUTCMonth() + 1, day.getUTCDate(), w.start, w.zone);
      if (t > fromMs && t < best) best = t;
    }
  }
  return best;
}

// ---- pending pushes and approval links ----------------------------------------------------------

/** A push that waits, as recorded on the workload: any replica can complete it. */
export interface PendingEntry {
  /** Random: names this entry in its links; taken off with the entry, so a link works once. */
  id: string;
  hook: string;
  request: string;
  image: string;
  /** The registry's identity of the push (digest|pushed_at) and its time, as the newest-wins rule compares them. */
  push: string;
  pushedAt: string;
  timeFrom: 'payload' | 'received';
  receivedAt: string;
  /** What it waits for: an approval, the change window, or both. */
  waitsFor: 'approval' | 'window' | 'approval and window';
  window?: string;
  /** ISO 8601: when the window opens (waiting for a window). */
  opensAt?: string;
  /** ISO 8601: when the push expires (APPROVAL_TIMEOUT after it was received). */
  until: string;
  /** Who may decide: whoever holds a link, or the admin token on the deliveries page. */
  decides: string;
  /** An approval link may deploy at once, outside the window (APPROVAL_OVERRIDE). */
  override?: boolean;
  /** Approved while the window was closed: by whom, from where, when. */
  approvedBy?: string;
  /** The entry's MAC where it sits (pendingEntryMac), when the service signs links: anything else is not its own. */
  mac?: string;
}

/** Where a pending entry sits; its MAC covers this, so an entry moved to another workload or container fails. */
interface PendingPlace {
  /** The hook's CLUSTER, undefined for the service's default cluster. */
  cluster: string | undefined;
  namespace: string;
  kind: string;
  name: string;
  container: string;
}

/**
 * A pending entry's MAC: HMAC-SHA256 with the links' key over a tag of its own (no link's text is one), where the
 * entry sits and each of its fields but `mac`, names sorted (an entry a newer version wrote with more fields
 * still verifies). Pure.
 */
export function pendingEntryMac(key: Buffer, place: PendingPlace, entry: PendingEntry): string {
  const fields = Object.entries(entry)
    .filter(([name]) => name !== 'mac')
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const where = [place.cluster ?? '', place.namespace, place.kind, place.name, place.container];
  return createHmac('sha256', key).update(JSON.stringify([PENDING_ANNOTATION, where, fields])).digest('base64url');
}

/** The entry with its MAC where it sits; without a key (no links), as it is. Pure. */
export function sealPendingEntry(key: Buffer | undefined, place: PendingPlace, entry: PendingEntry): PendingEntry {
  return key ? { ...entry, mac: pendingEntryMac(key, place, entry) } : entry;
}

/**
 * Whether an entry carries the MAC `key` gives it where it sits: exactly encoded, compared in constant time.
 * Without a key nothing can be checked (an entry is then taken as written). Pure.
 */
export function pendingEntrySealed(key: Buffer | undefined, place: PendingPlace, entry: PendingEntry): boolean {
  if (!key) return true;
  if (typeof entry.mac !== 'string') return false;
  const given = Buffer.from(entry.mac, 'base64url');
  const expected = Buffer.from(pendingEntryMac(key, place, entry), 'base64url');
  const exact = given.toString('base64url') === entry.mac;
  return exact && given.length === expected.length && timingSafeEqual(given, expected);
}

/** The workload's pending entries: the annotation as read (for a patch's test) and parsed. Pure. */
export function readPendingEntries(workload: unknown): {
  raw: string | undefined;
  entries: Record<string, PendingEntry>;
} {
  const metadata = isObject(workload) && isObject(workload.metadata) ? workload.metadata : {};
  const raw = isObject(metadata.annotations) ? metadata.annotations[PENDING_ANNOTATION] : undefined;
  const entries: Record<string, PendingEntry> = {};
  if (typeof raw !== 'string') return { raw: undefined, entries };
  try {
    const parsed: unknown = JSON.parse(raw);
    if (isObject(parsed))
      for (const [name, e] of Object.entries(parsed))
        if (isObject(e) && ['id', 'hook', 'image', 'push', 'pushedAt', 'until'].every((f) => typeof e[f] === 'string'))
          entries[name] = e as unknown as PendingEntry;
  } catch {
    // Edited by hand into something else: nothing waits, and a patch's test still guards the value.
  }
  return { raw, entries };
}

/** What one approval link names: one pending push, what to do with it, until when. */
export interface ApprovalClaims {
  namespace: string;
  kind: string;
  name: string;
  container: string;
  /** The kubeconfig context (CLUSTER) whose workload holds the entry; absent: the service's default cluster. */
  cluster?: string;
  /** The pending entry's id, its hook and image: a link decides that push only (another is refused). */
  id: string;
  hook: string;
  image: string;
  action: 'approve' | 'reject' | 'deploy-now';
  /** Expiry, epoch milliseconds. */
  exp: number;
}

/** The links of a waiting push's notifications: each names the pending entry, one action, its expiry. */
export interface ApprovalLinks {
  approve: string;
  reject: string;
  /** Approve and deploy at once, outside the change window (APPROVAL_OVERRIDE). */
  deployNow?: string;
}

/** The path approval links are served under on the hook port. */
export const APPROVAL_PATH = '/approval/';

/** The links of a waiting push: `<-public-url>/approval/<token>` for each action the entry allows. Pure. */
export function approvalLinks(
  publicUrl: string,
  key: Buffer,
  claims: Omit<ApprovalClaims, 'action'>,
  deployNow: boolean,
): ApprovalLinks {
  const link = (action: ApprovalClaims['action']) =>
    `${publicUrl.replace(/\/+$/, '')}${APPROVAL_PATH}${approvalToken(key, { ...claims, action })}`;
  return { approve: link('approve'), reject: link('reject'), ...(deployNow ? { deployNow: link('deploy-now') } : {}) };
}

/** base64url(JSON claims) "." base64url(HMAC-SHA256(key, that text)). Pure. */
export function approvalToken(key: Buffer, claims: ApprovalClaims): string {
  const body = Buffer.from(JSON.stringify(claims)).toString('base64url');
  return `${body}.${createHmac('sha256', key).update(body).digest('base64url')}`;
}

/**
 * The claims of a link signed with `key`, or why it is refused: malformed, tampered with (the signature is
 * compared in constant time) or expired. Pure.
 */
export function readApprovalToken(
  key: Buffer,
  token: string,
  nowMs: number,
): { claims: ApprovalClaims } | { refused: string } {
  const [body, signature, extra] = token.split('.');
  if (!body || !signature || extra !== undefined) return { refused: 'the link is not an approval link' };
  const expected = createHmac('sha256', key).update(body).digest();
  const given = Buffer.from(signature, 'base64url');
  // Exactly as signed: Buffer.from skips what is not base64url, so `<link>!!` would decode as the link itself.
  const exact = given.toString('base64url') === signature;
  if (!exact || given.length !== expected.length || !timingSafeEqual(given, expected))
    return { refused: 'the link is not signed by this service (changed, or signed with another key)' };
  let claims: ApprovalClaims;
  try {
    claims = JSON.parse(Buffer.from(body, 'base64url').toString('utf8')) as ApprovalClaims;
  } catch {
    return { refused: 'the link is not an approval link' };
  }
  if (!(claims.exp > nowMs)) return { refused: `the link expired at ${new Date(claims.exp).toISOString()}` };
  return { claims };
}

// ================================================================================================
// 27. workloads — what the upgrade knows of Kubernetes workloads. Each kind is one entry of WORKLOAD_KINDS (API
//    resource, names, pod template, kubectl's rollout viewer, whether it has a rollout, how its pods are owned);
//    parseWorkload reads APP_WORKLOAD (deployment, daemonset, statefulset, cronjob; any case, plurals, short names,
//    kind.group) and locateContainer finds APP_CONTAINER (containers, then initContainers). rolloutStatus applies
//    kubectl's rollout-status rules, summarizePod says how a pod is doing, Events are recorded on the workload, and
//    one WorkloadQueue per workload keeps its pushes in order. UpgradeReport is what one push did so far; UpgradeDeps
//    is what an upgrade is given (client, clock, queue, the workloads it last saw).
//    Exports: annotationOps, asArray, DNS_LABEL, FollowOptions, ForcedRollback, K8sObject, KEPT_SUPERSEDED, kindSpec,
//    KnownWorkloads, labelSelector, leanWorkload, locateContainer, LocatedContainer, missingContainerMessage,
//    newReport, numberAt, orList, ownedBy, parseWorkload, PayloadError, PlannedChange, planPatch, PodSummary,
//    readWorkload, recordWorkloadEvent, RollbackOutcome, RolloutOutcome, rolloutStatus, roundedToSeconds,
//    STUCK_REASONS, summarizePod, unchanged, UPGRADE_LIMITS, UpgradeDeps, UpgradeError, UpgradeReport, valueAt,
//    WORKLOAD_KINDS, WorkloadEvent, WorkloadKind, workloadPods, WorkloadQueue, workloadResource, WorkloadTarget.
//    Tests: test/decision.test.ts, test/e2e.test.ts, test/policy.test.ts, test/records.test.ts, test/rolling.test.ts,
//    test/upgrade.test.ts.
// ================================================================================================

export const UPGRADE_LIMITS = {
  // One GET per second while following a rollout: cheap for the API server, and as quick to
  // notice the end as a person watching `kubectl rollout status`.
  rolloutPollMs: 1_000,
  // A DaemonSet on hundreds of nodes would bury the answer (and the mail) in pod lines.
  maxPodLines: 20,
  // The pods listed for the summary; a workload with more is summarised from the first ones.
  podListLimit: 500,
  // A failed precondition means someone else edited the workload between our read and our
  // patch; re-reading and re-planning a few times settles it, more means something is fighting us.
  maxPatchAttempts: 5,
  // Workloads whose last known state the service keeps, to patch without reading first: a few KiB
  // each (a release of 2,000 workloads keeps some 20 MB); beyond this many the oldest is forgotten
  // (and read again when next pushed to).
  maxKnownWorkloads: 2_500,
  // Registries retry a delivery they think failed within seconds to a minute. A real new push of
  // the same tag carries a new digest or pushed_at, so it is not mistaken for a repeat.
  duplicateWindowMs: 60_000,
  // events.k8s.io caps an event's note at 1 KiB; stay within it through the core API too.
  maxEventMessageLength: 1024,
  // The field manager and event source: `kubectl get -o yaml --show-managed-fields` shows it.
  fieldManager: 'webhook',
  // Pushes kept while the API server does not answer (one per container, newest wins): a release
  // of a hundred services during an outage. Each holds its payload: a few KiB (Docker Hub's, with
  // its README, up to ~300 KiB), at most -max-body-size; beyond this many, pushes are answered as
  // failed (500), as without keeping.
  maxKeptPushes: 100,
  // While pushes are kept, the API server is tried again this often (each try may itself take the
  // client's 20 s retry budget when it still does not answer).
  keptRetryMs: 5_000,
  // A new pod stuck this long in CrashLoopBackOff, ImagePullBackOff or the like fails the rollout
  // before its deadline: the kubelet's back-off (10 s, doubling) has by then restarted or pulled
  // again two or three times, and a Deployment's own progress deadline (600 s by default), a
  // DaemonSet's or StatefulSet's (none) would leave a broken image running far longer.
  stuckPodFailMs: 30_000,
  // A forced rollback deletes stuck pods only once the StatefulSet controller has seen the template
  // set back (else it could recreate them broken); it does so within a second or two, unless it is down.
  rollbackObservedMs: 30_000,
  // How often a follow lists the pods to see whether any is stuck: a list of pods (and of a
  // Deployment's ReplicaSets) costs more than the once-a-second GET of the workload.
  stuckPodCheckMs: 5_000,
  // How long a follow waits for the shared watch of the pods to have listed them before it lists
  // them itself for its summary (a stuck-pod check waits for the next look instead): a request's own deadline.
  podWatchSyncMs: 10_000,
};

/** The action of a push kept while the API server was away and replaced by a newer one (KeptPushes). */
const KEPT_SUPERSEDED = 'superseded: a newer push to this container arrived while the API server was away';

interface KindSpec {
  kind: string;
  group: string;
  version: string;
  resource: string;
  /** What APP_WORKLOAD may call it (any case, optionally with `.<group>`): singular, plural, short. */
  names: string[];
  /** JSON-pointer segments of the pod template. */
  template: string[];
  /** kubectl rollout status's viewer for this kind: its verdict on one observation. Pure. */
  rollout(obj: unknown): RolloutStatus;
  /** Whether a change starts a rollout to restart and follow (a CronJob's next run just uses it). */
  hasRollout: boolean;
  /** The kind its pods are owned through, besides the workload itself (a Deployment's ReplicaSets). */
  podsOwnedThrough?: { group: string; version: string; resource: string };
  /** The report's action when the same image is pushed again. */
  sameImageAction: string;
  /**
   * A rollback must delete the pods the failed update left stuck (a StatefulSet's "forced
   * rollback": its controller waits for them to become ready first), which needs `delete` on pods.
   */
  forcedRollback?: boolean;
}

const RESTARTED = 'rollout restarted (same image re-pulled)';

/** The workload kinds an upgrade can change. Adding one is one entry here. */
const WORKLOAD_KINDS = {
  deployment: {
    kind: 'Deployment',
    group: 'apps',
    version: 'v1',
    resource: 'deployments',
    names: ['deployment', 'deployments', 'deploy'],
    template: ['spec', 'template'],
    rollout: deploymentRollout,
    hasRollout: true,
    sameImageAction: RESTARTED,
    podsOwnedThrough: { group: 'apps', version: 'v1', resource: 'replicasets' },
  },
  daemonset: {
    kind: 'DaemonSet',
    group: 'apps',
    version: 'v1',
    resource: 'daemonsets',
    names: ['daemonset', 'daemonsets', 'ds'],
    template: ['spec', 'template'],
    rollout: daemonSetRollout,
    hasRollout: true,
    sameImageAction: RESTARTED,
  },
  statefulset: {
    kind: 'StatefulSet',
    group: 'apps',
    version: 'v1',
    resource: 'statefulsets',
    names: ['statefulset', 'statefulsets', 'sts'],
    template: ['spec', 'template'],
    rollout: statefulSetRollout,
    hasRollout: true,
    sameImageAction: RESTARTED,
    forcedRollback: true,
  },
  cronjob: {
    kind: 'CronJob',
    group: 'batch',
    version: 'v1',
    resource: 'cronjobs',
    names: ['cronjob', 'cronjobs', 'cj'],
    template: ['spec', 'jobTemplate', 'spec', 'template'],
    hasRollout: false,
    rollout: () => ({ state: 'untracked', message: 'cronjob: the next run uses the new image' }),
    sameImageAction: 'next run re-pulls the image (same image; imagePullPolicy: Always)',
  },
} satisfies Record<string, KindSpec>;

export type WorkloadKind = keyof typeof WORKLOAD_KINDS;

function kindSpec(kind: WorkloadKind): KindSpec {
  return WORKLOAD_KINDS[kind];
}

/** "a, b, c or d" */
function orList(items: string[]): string {
  return items.length < 2 ? items.join('') : `${items.slice(0, -1).join(', ')} or ${items[items.length - 1]}`;
}

export class UpgradeError extends Error {}
/** A push whose payload (or REPO_TYPE) cannot be read: the sender's mistake, answered 400. */
export class PayloadError extends UpgradeError {}

const DNS_LABEL = /^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*$/;

/** `deploy/web`, `Deployments.apps/web`, `cj/nightly` → kind and name. */
export function parseWorkload(text: string | undefined): { kind: WorkloadKind; name: string } {
  const kinds = Object.keys(WORKLOAD_KINDS) as WorkloadKind[];
  const example = `e.g. deployment/web; kinds: ${kinds.join(', ')}`;
  if (text === undefined || text.trim() === '') {
    throw new UpgradeError(
      `APP_WORKLOAD is not set (the hook passes it from the URL parameter workload: <kind>/<name>, ${example})`,
    );
  }
  const slash = text.indexOf('/');
  if (slash < 0) throw new UpgradeError(`APP_WORKLOAD ${showValue(text)} must be <kind>/<name> (${example})`);
  const kindText = text.slice(0, slash).trim().toLowerCase();
  const name = text.slice(slash + 1).trim();
  for (const kind of kinds) {
    const spec = kindSpec(kind);
    if (!spec.names.some((n) => kindText === n || kindText === `${n}.${spec.group}`)) continue;
    if (!(name.length <= 253 && DNS_SUBDOMAIN.test(name))) {
      throw new UpgradeError(
        `APP_WORKLOAD ${showValue(text)}: ${showValue(name)} is not a valid ${kind} name (lower-case letters, ` +
          `digits, "-" and ".")`,
      );
    }
    return { kind, name };
  }
  const shortNames = kinds.map((k) => kindSpec(k).names[2]).join(', ');
  throw new UpgradeError(
    `APP_WORKLOAD ${showValue(text)}: unknown kind ${showValue(kindText)} (use ${orList(kinds)}, or ${shortNames})`,
  );
}

/** The workload an upgrade acts on; uid and generation are known once it has been read. */
export interface WorkloadTarget {
  kind: WorkloadKind;
  name: string;
  namespace: string;
  uid?: string;
  /** metadata.generation after our patch: the rollout to follow. */
  generation?: number;
  /** metadata.resourceVersion of our patch's answer: the rollout's follow watches from it on. */
  resourceVersion?: string;
}

export function workloadResource(t: { kind: WorkloadKind; name?: string; namespace: string }): ResourceRef {
  const spec = kindSpec(t.kind);
  return { group: spec.group, version: spec.version, resource: spec.resource, namespace: t.namespace, name: t.name };
}

type K8sObject = Record<string, unknown>;

function valueAt(obj: unknown, segments: string[]): unknown {
  let v = obj;
  for (const s of segments) v = isObject(v) ? v[s] : undefined;
  return v;
}

function pointer(segments: (string | number)[]): string {
  return segments.map((s) => `/${String(s).replace(/~/g, '~0').replace(/\//g, '~1')}`).join('');
}

interface LocatedContainer {
  list: 'containers' | 'initContainers';
  index: number;
  image: string;
  pullPolicy: string | undefined;
}

function containerNames(podSpec: unknown, list: string): string[] {
  const items = valueAt(podSpec, [list]);
  return Array.isArray(items) ? items.map((c) => String(valueAt(c, ['name']))) : [];
}

/** The container by exact name: regular containers first, then init containers. */
export function locateContainer(podSpec: unknown, name: string): LocatedContainer | undefined {
  for (const list of ['containers', 'initContainers'] as const) {
    const items = valueAt(podSpec, [list]);
    if (!Array.isArray(items)) continue;
    const index = items.findIndex((c) => isObject(c) && c.name === name);
    if (index >= 0) {
      const c = items[index] as Record<string, unknown>;
      return {
        list,
        index,
        image: typeof c.image === 'string' ? c.image : '',
        pullPolicy: typeof c.imagePullPolicy === 'string' ? c.imagePullPolicy : undefined,
      };
    }
  }
  return undefined;
}

/**
 * Ops that set annotations, creating the metadata or annotations map only if it is absent; `expect`
 * adds a `test` that an annotation still has the value read (null: still absent) before it is set.
 */
function annotationOps(
  obj: K8sObject,
  metadataSegments: string[],
  values: Record<string, string>,
  expect: Record<string, string | null> = {},
): JsonPatchOperation[] {
  const metadata = valueAt(obj, metadataSegments);
  // A `test` against null passes only while the member is absent, so a map someone else creates
  // in the meantime is never replaced by ours.
  if (!isObject(metadata))
    return [
      { op: 'test', path: pointer(metadataSegments), value: null },
      { op: 'add', path: pointer(metadataSegments), value: { annotations: values } },
    ];
  if (!isObject(metadata.annotations))
    return [
      { op: 'test', path: pointer([...metadataSegments, 'annotations']), value: null },
      { op: 'add', path: pointer([...metadataSegments, 'annotations']), value: values },
    ];
  const at = (key: string) => pointer([...metadataSegments, 'annotations', key]);
  return [
    ...Object.entries(expect).map(([key, value]): JsonPatchOperation => ({ op: 'test', path: at(key), value })),
    ...Object.entries(values).map(([key, value]): JsonPatchOperation => ({ op: 'add', path: at(key), value })),
  ];
}

export interface PlannedChange {
  /** The new image, or undefined to keep it (a restart). */
  image?: string;
  /** Set imagePullPolicy: Always on the container. */
  pullAlways?: boolean;
  /** RFC 3339 time for kubectl.kubernetes.io/restartedAt on the pod template. */
  restartedAt?: string;
  changeCause: string;
  /**
   * Workload annotations written under a test: per key, the value to write and the value read
   * (undefined: it was absent), so that two replicas deciding on the same read cannot both write.
   */
  guarded?: Record<string, { value: string; read: string | undefined }>;
  /** Workload annotations the patch only tests, as read (null: absent): what the decision was made on. */
  tested?: Record<string, string | null>;
}

/** The JSON patch for a change to one container, guarded by tests of its name and image. Pure. */
export function planPatch(
  obj: K8sObject,
  kind: WorkloadKind,
  containerName: string,
  located: LocatedContainer,
  change: PlannedChange,
): JsonPatchOperation[] {
  const template = kindSpec(kind).template;
  const c = [...template, 'spec', located.list, String(located.index)];
  const ops: JsonPatchOperation[] = [
    { op: 'test', path: pointer([...c, 'name']), value: containerName },
    { op: 'test', path: pointer([...c, 'image']), value: located.image },
  ];
  if (change.image !== undefined) ops.push({ op: 'replace', path: pointer([...c, 'image']), value: change.image });
  if (change.pullAlways && located.pullPolicy !== 'Always')
    ops.push({ op: 'add', path: pointer([...c, 'imagePullPolicy']), value: 'Always' });
  if (change.restartedAt !== undefined)
    ops.push(
      ...annotationOps(obj, [...template, 'metadata'], { 'kubectl.kubernetes.io/restartedAt': change.restartedAt }),
    );
  const values: Record<string, string> = { 'kubernetes.io/change-cause': change.changeCause };
  const expect: Record<string, string | null> = { ...change.tested };
  for (const [key, { value, read }] of Object.entries(change.guarded ?? {})) {
    values[key] = value;
    expect[key] = read ?? null;
  }
  ops.push(...annotationOps(obj, ['metadata'], values, expect));
  return ops;
}

// ---- rollout status (kubectl's rules) ----------------------------------------------------------

interface RolloutStatus {
  state: 'done' | 'waiting' | 'failed' | 'untracked';
  message: string;
}

function numberAt(obj: unknown, segments: string[], fallback = 0): number {
  const v = valueAt(obj, segments);
  return typeof v === 'number' ? v : fallback;
}

/** kubectl rollout status's verdict for one observation of the workload. Pure. */
export function rolloutStatus(kind: WorkloadKind, obj: unknown): RolloutStatus {
  return kindSpec(kind).rollout(obj);
}

const waiting = (message: string): RolloutStatus => ({ state: 'waiting', message });
const ON_DELETE: RolloutStatus = {
  state: 'untracked',
  message: 'OnDelete update strategy: pods change when they are deleted',
};

/** The controller has not yet seen the latest change. */
function unobserved(obj: unknown): boolean {
  return numberAt(obj, ['metadata', 'generation']) > numberAt(obj, ['status', 'observedGeneration']);
}

function deploymentRollout(obj: unknown): RolloutStatus {
  if (unobserved(obj)) return waiting('waiting for the deployment controller to observe the change');
  const conditions = valueAt(obj, ['status', 'conditions']);
  const progressing = Array.isArray(conditions)
    ? conditions.find((c) => valueAt(c, ['type']) === 'Progressing')
    : undefined;
  if (valueAt(progressing, ['reason']) === 'ProgressDeadlineExceeded') {
    const message = String(valueAt(progressing, ['message']) ?? 'the deployment exceeded its progress deadline');
    return { state: 'failed', message: `ProgressDeadlineExceeded: ${message}` };
  }
  const replicas = numberAt(obj, ['spec', 'replicas'], 1);
  const updated = numberAt(obj, ['status', 'updatedReplicas']);
  const total = numberAt(obj, ['status', 'replicas']);
  const available = numberAt(obj, ['status', 'availableReplicas']);
  if (updated < replicas) return waiting(`${updated} of ${replicas} pods updated`);
  if (total > updated)
    return waiting(`${total - updated} old pod${total - updated === 1 ? '' : 's'} pending termination`);
  if (available < updated) return waiting(`${available} of ${updated} updated pods available`);
  return { state: 'done', message: `${updated}/${replicas} pods updated and available` };
}

function daemonSetRollout(obj: unknown): RolloutStatus {
  if (valueAt(obj, ['spec', 'updateStrategy', 'type']) === 'OnDelete') return ON_DELETE;
  if (unobserved(obj)) return waiting('waiting for the daemonset controller to observe the change');
  const desired = numberAt(obj, ['status', 'desiredNumberScheduled']);
  const updated = numberAt(obj, ['status', 'updatedNumberScheduled']);
  const available = numberAt(obj, ['status', 'numberAvailable']);
  if (updated < desired) return waiting(`${updated} of ${desired} pods updated`);
  if (available < desired) return waiting(`${available} of ${desired} updated pods available`);
  return { state: 'done', message: `${updated}/${desired} pods updated and available` };
}

function statefulSetRollout(obj: unknown): RolloutStatus {
  if (valueAt(obj, ['spec', 'updateStrategy', 'type']) === 'OnDelete') return ON_DELETE;
  if (numberAt(obj, ['status', 'observedGeneration']) === 0 || unobserved(obj)) {
    return waiting('waiting for the statefulset controller to observe the change');
  }
  const replicas = numberAt(obj, ['spec', 'replicas'], 1);
  const ready = numberAt(obj, ['status', 'readyReplicas']);
  if (ready < replicas) return waiting(`${ready} of ${replicas} pods ready`);
  const partition = valueAt(obj, ['spec', 'updateStrategy', 'rollingUpdate', 'partition']);
  const updated = numberAt(obj, ['status', 'updatedReplicas']);
  if (typeof partition === 'number' && partition > 0) {
    if (updated < replicas - partition)
      return waiting(`${updated} of ${replicas - partition} pods updated (partition ${partition})`);
    return { state: 'done', message: `${updated}/${replicas - partition} pods updated (partition ${partition})` };
  }
  if (valueAt(obj, ['status', 'updateRevision']) !== valueAt(obj, ['status', 'currentRevision'])) {
    return waiting(`${updated} of ${replicas} pods updated`);
  }
  return { state: 'done', message: `${replicas}/${replicas} pods updated and ready` };
}

// ---- pods -------------------------------------------------------------------------------------

export interface PodSummary {
  name: string;
  /** The pod's phase, or Terminating while it is being deleted. */
  phase: string;
  ready: boolean;
  /** The named container's image and restarts (the first container's when it has no such one). */
  image: string;
  restarts: number;
  /** A waiting or terminated reason of a container that is not ready (CrashLoopBackOff…). */
  reason?: string;
}

/** Reasons that mean a pod will not become ready without a change: the rollout has failed. */
const STUCK_REASONS = [
  'CrashLoopBackOff',
  'ImagePullBackOff',
  'ErrImagePull',
  'InvalidImageName',
  'ErrImageNeverPull',
  'CreateContainerConfigError',
  'CreateContainerError',
  'RunContainerError',
];

/** A pod reduced to what an operator needs; never env values, commands or messages. Pure. */
export function summarizePod(pod: unknown, containerName: string): PodSummary {
  const statuses = [
    ...asArray(valueAt(pod, ['status', 'initContainerStatuses'])),
    ...asArray(valueAt(pod, ['status', 'containerStatuses'])),
  ];
  const own =
    statuses.find((s) => valueAt(s, ['name']) === containerName) ??
    asArray(valueAt(pod, ['status', 'containerStatuses']))[0];
  const specContainer = locateContainer(valueAt(pod, ['spec']), containerName);
  const conditions = asArray(valueAt(pod, ['status', 'conditions']));
  let reason: string | undefined;
  for (const s of statuses) {
    if (valueAt(s, ['ready']) === true) continue;
    const r = valueAt(s, ['state', 'waiting', 'reason']) ?? valueAt(s, ['state', 'terminated', 'reason']);
    if (typeof r === 'string' && r !== '') {
      reason = r;
      if (STUCK_REASONS.includes(r)) break;
    }
  }
  // A pod that was never scheduled has no container statuses; its condition says why.
  const scheduled = conditions.find((c) => valueAt(c, ['type']) === 'PodScheduled');
  if (
    reason === undefined &&
    valueAt(scheduled, ['status']) === 'False' &&
    typeof valueAt(scheduled, ['reason']) === 'string'
  )
    reason = String(valueAt(scheduled, ['reason']));
  return {
    name: String(valueAt(pod, ['metadata', 'name']) ?? ''),
    phase: valueAt(pod, ['metadata', 'deletionTimestamp'])
      ? 'Terminating'
      : String(valueAt(pod, ['status', 'phase']) ?? 'Unknown'),
    ready: conditions.some((c) => valueAt(c, ['type']) === 'Ready' && valueAt(c, ['status']) === 'True'),
    image: String(valueAt(own, ['image']) ?? specContainer?.image ?? ''),
    restarts: numberAt(own, ['restartCount']),
    reason,
  };
}

function asArray(v: unknown): unknown[] {
  return Array.isArray(v) ? v : [];
}

/** matchLabels and matchExpressions as a labelSelector query value. */
export function labelSelector(selector: unknown): string {
  const parts: string[] = [];
  const labels = valueAt(selector, ['matchLabels']);
  if (isObject(labels)) for (const [k, v] of Object.entries(labels)) parts.push(`${k}=${String(v)}`);
  for (const e of asArray(valueAt(selector, ['matchExpressions']))) {
    const key = String(valueAt(e, ['key']));
    const values = asArray(valueAt(e, ['values']))
      .map(String)
      .join(',');
    switch (valueAt(e, ['operator'])) {
      case 'In':
        parts.push(`${key} in (${values})`);
        break;
      case 'NotIn':
        parts.push(`${key} notin (${values})`);
        break;
      case 'Exists':
        parts.push(key);
        break;
      case 'DoesNotExist':
        parts.push(`!${key}`);
        break;
    }
  }
  return parts.join(',');
}

function ownedBy(obj: unknown, uids: Set<string>): boolean {
  return asArray(valueAt(obj, ['metadata', 'ownerReferences'])).some((o) => uids.has(String(valueAt(o, ['uid']))));
}

/** The workload's own pods (through its ReplicaSets, for a Deployment), sorted by name. */
async function workloadPods(
  client: KubeClient,
  target: WorkloadTarget,
  workload: K8sObject,
  containerName: string,
): Promise<PodSummary[]> {
  const selector = labelSelector(valueAt(workload, ['spec', 'selector']));
  const owners = new Set<string>([String(target.uid ?? valueAt(workload, ['metadata', 'uid']))]);
  const query = { labelSelector: selector, limit: String(UPGRADE_LIMITS.podListLimit) };
  const through = kindSpec(target.kind).podsOwnedThrough;
  if (through) {
    const sets = await client.list<{ items: unknown[] }>({ ...through, namespace: target.namespace }, query);
    for (const rs of sets.items) if (ownedBy(rs, owners)) owners.add(String(valueAt(rs, ['metadata', 'uid'])));
  }
  const pods = await client.list<{ items: unknown[] }>(
    { group: '', version: 'v1', resource: 'pods', namespace: target.namespace },
    query,
  );
  return pods.items
    .filter((p) => ownedBy(p, owners))
    .map((p) => summarizePod(p, containerName))
    .sort((a, b) => a.name.localeCompare(b.name));
}

export interface RolloutOutcome {
  state: 'progressing' | 'complete' | 'failed' | 'timed out' | 'not tracked';
  detail: string;
  /** A later push to the workload took the rollout over; its report follows it. */
  superseded?: true;
  pods: PodSummary[];
}

export interface FollowOptions {
  /** How long to follow; 0 looks once. */
  timeoutMs: number;
  /** The container whose image and restarts the pod summary shows. */
  container: string;
  /** The image rolled out: only pods running it count as stuck (undefined: every pod). */
  image?: string;
  pollMs?: number;
  /** The workload as the PATCH answered it: the follow watches from its resourceVersion on (else it polls). */
  initial?: Record<string, unknown>;
  /** Told when the follow polls because its watch was refused. */
  warn?: (message: string) => void;
  /** Told the workload at each watched change, and as last seen at the end (the follow record is taken off with it). */
  seen?: (workload: Record<string, unknown>) => void;
  /** How long a new pod may be stuck before the rollout counts as failed. */
  stuckFailMs?: number;
  signal?: AbortSignal;
  /** Told the rollout's state at each look while it is still progressing (the deliveries page). */
  onProgress?: (outcome: RolloutOutcome) => void;
}

const roundedToSeconds = (ms: number) => Math.max(0, Math.round(ms / 1000)) * 1000;

// ---- events -----------------------------------------------------------------------------------

export interface WorkloadEvent {
  type: 'Normal' | 'Warning';
  /** UpperCamelCase, one of PUSH_EVENTS' reasons. */
  reason: string;
  message: string;
}

/** Records a core/v1 Event on the workload (what `kubectl describe` and `kubectl events` show). */
export async function recordWorkloadEvent(
  client: KubeClient,
  target: WorkloadTarget,
  event: WorkloadEvent,
  now: Date = new Date(),
): Promise<void> {
  const spec = kindSpec(target.kind);
  const time = now.toISOString().replace(/\.\d{3}Z$/, 'Z');
  const message =
    event.message.length > UPGRADE_LIMITS.maxEventMessageLength
      ? `${event.message.slice(0, UPGRADE_LIMITS.maxEventMessageLength - 1)}…`
      : event.message;
  await client.create(
    { group: '', version: 'v1', resource: 'events', namespace: target.namespace },
    {
      apiVersion: 'v1',
      kind: 'Event',
      // client-go's recorder names events <object>.<unique suffix> too.
      metadata: { name: `${target.name}.${randomBytes(8).toString('hex')}`, namespace: target.namespace },
      involvedObject: {
        apiVersion: `${spec.group}/${spec.version}`,
        kind: spec.kind,
        name: target.name,
        namespace: target.namespace,
        uid: target.uid,
      },
      reason: event.reason,
      message,
      type: event.type,
      source: { component: UPGRADE_LIMITS.fieldManager },
      firstTimestamp: time,
      lastTimestamp: time,
      count: 1,
    },
  );
}

// ---- ordering and duplicates ------------------------------------------------------------------

/**
 * Runs tasks for the same key one after another, in the order they were queued (a per-key
 * promise chain): within one process, pushes to one workload do not race each other's patches.
 * Which push wins is decided on the workload itself (decidePush), across processes.
 */
export class WorkloadQueue {
  private readonly tails = new Map<string, Promise<unknown>>();

  /** Queues task behind every task queued earlier for key; call it in arrival order. */
  run<T>(key: string, task: () => Promise<T>): Promise<T> {
    const previous = this.tails.get(key) ?? Promise.resolve();
    const result = previous.then(task);
    const tail = result.then(
      () => undefined,
      () => undefined,
    );
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return result;
  }
}

/** A push that changed nothing, as its report holds it: the action reads `none (<reason>)` or the reason. Pure. */
export function unchanged(
  decision: DecisionCode,
  reason: string,
): Pick<UpgradeReport, 'decision' | 'reason' | 'action'> {
  return { decision, reason, action: DECISIONS[decision].action === 'reason' ? reason : `none (${reason})` };
}

export interface UpgradeReport {
  /** What became of the push; `action` is its text in the answer. */
  decision: DecisionCode;
  /** Why a push changed nothing, or what it waits for, as data (unchanged renders it as the action). */
  reason?: string;
  namespace?: string;
  /** `deployment/web`, as given (canonical kind). */
  workload?: string;
  container?: string;
  imageBefore?: string;
  imageAfter?: string;
  /** image updated | rollout restarted (same image re-pulled) | none (<why>) */
  action: string;
  /** Whether the workload was changed. */
  changed: boolean;
  result: 'ok' | 'failed';
  error?: string;
  rollout?: RolloutOutcome;
  notes: string[];
  /** The workload, for followRollout after the answer; set once the workload has been read. */
  target?: WorkloadTarget;
  /** Whether the image pin refused the push (error says why). */
  refused?: boolean;
  /**
   * The change's Event, when it is recorded after the answer (UpgradeDeps.eventAfterAnswer):
   * resolves with the note saying it could not be, or undefined once it is recorded.
   */
  afterAnswer?: Promise<string | undefined>;
  /** LAST_PUSH_ANNOTATION as this upgrade wrote it: a rollback first tests that it is unchanged. */
  lastPush?: string;
  /** Whether the change's PATCH recorded the follow after the answer on the workload (FOLLOW_ANNOTATION). */
  followRecorded?: boolean;
  /** The hook's ROLLBACK_ON_FAILURE: a failed rollout of this change is rolled back. */
  rollbackOnFailure?: boolean;
  /** The hook's image pin, which the image a rollback returns to must pass as a push would. */
  imagePin?: ImagePin;
  /** What became of a failed rollout under ROLLBACK_ON_FAILURE. */
  rollback?: RollbackOutcome;
  /** When the push was pushed (or received), as the newest-wins rule compares it. */
  pushedAtMs?: number;
  /**
   * Who gave no answer, so that nothing is known to be written: the API server (within the client's
   * retry budget), or the registry when the hook keeps such pushes (ON_REGISTRY_AWAY=keep).
   */
  unreachable?: 'the API server' | 'the registry';
  /** The payload (or REPO_TYPE) could not be read: nothing was asked of the cluster. */
  badInput?: boolean;
  /** A push kept while the API server is away (UpgradeService): resolves with its final report. */
  pending?: Promise<UpgradeReport>;
  /** The hook's CLUSTER: the kubeconfig context the workload is in (undefined: the service's default). */
  cluster?: string;
  /** A decided push found its pending entry gone: another replica (or person) decided it first. */
  gone?: boolean;
  /** The push that waited on this container and that this one replaced (it is reported superseded). */
  replaced?: PendingEntry;
  /** A push that waits on the workload: its pending entry and, for an approval, the links that decide it. */
  waiting?: { entry: PendingEntry; links?: ApprovalLinks };
}

/** The report of a push before anything is known of it: nothing changed (yet). */
export function newReport(): UpgradeReport {
  return { ...unchanged('no-op', 'nothing was changed'), changed: false, result: 'ok', notes: [] };
}

/** A rollback: the image returned to and its rollout, or why there was none. */
export interface RollbackOutcome {
  /** Why it was rolled back: the failed rollout. */
  reason: string;
  image?: string;
  rollout?: RolloutOutcome;
  /** A StatefulSet's forced rollback: the stuck pods deleted, or left to delete by hand. */
  forced?: ForcedRollback;
  /** Why nothing was rolled back. */
  notDone?: string;
}

/** A StatefulSet's forced rollback: the stuck pods deleted, and those left to delete by hand and why. */
export interface ForcedRollback {
  namespace: string;
  deleted: string[];
  byHand: string[];
  /** Why pods are left to delete by hand (the first refusal, or why none could be looked at). */
  why?: string;
}

export interface UpgradeDeps {
  client?: KubeClient;
  /** The -kubeconfig flag, used when no client is given. */
  kubeconfig?: string;
  /** The service's credentials for the push's cluster, when no client is given (else read from the env). */
  credentials?: () => KubeCredentials;
  now?: () => Date;
  requestId?: string;
  hookId?: string;
  /** Shared by all upgrades of one process: per-workload ordering and duplicate detection. */
  queue?: WorkloadQueue;
  /**
   * Record the change's Event after answering (the service): it cannot change the answer, and the
   * API call it costs is a third of the answer's time. The caller awaits report.afterAnswer.
   */
  eventAfterAnswer?: boolean;
  /**
   * The workloads as this process last saw them (the service): a push patches straight away,
   * since its patch tests the container's name and image and so fails on a stale copy, which
   * is then read again. Saves the GET that would otherwise precede every PATCH.
   */
  known?: KnownWorkloads;
  /**
   * The service follows the rollout after answering for followMs: the PATCH records that on the
   * workload (FOLLOW_ANNOTATION), with the hook's MAIL_TO, so another replica can finish it.
   */
  followAfter?: { followMs: number; mailTo?: string };
  /** A kept push replaced by a newer one (KeptPushes): if not written yet, it is not written at all. */
  abandon?: AbortSignal;
  /** The service's -public-url and -approval-key-file: what signs the links of a push that waits for approval. */
  approvals?: { publicUrl: string; key: Buffer };
  /**
   * A waiting push decided (a link, the deliveries page, its window opening) or a past push deployed again: the
   * pending entry `id` it completes (taken off in the same patch, so a second use finds nothing) and who decided.
   */
  decided?: { id?: string; action: 'approve' | 'deploy-now' | 'window' | 'replay'; by: string };
}

/** The last state seen of each workload, by namespace/kind/name; the oldest beyond a bound is dropped. */
export class KnownWorkloads {
  private readonly objects = new Map<string, K8sObject>();

  get(key: string): K8sObject | undefined {
    return this.objects.get(key);
  }

  /** Kept lean (leanWorkload): a hold decided on the copy reads the workload again. */
  set(key: string, obj: K8sObject | undefined): void {
    this.objects.delete(key);
    if (obj === undefined) return;
    this.objects.set(key, leanWorkload(obj));
    if (this.objects.size > UPGRADE_LIMITS.maxKnownWorkloads) this.objects.delete(this.objects.keys().next().value!);
  }
}

/** kubectl apply's copy of the whole manifest, on every object it applied: nothing here reads it. */
const LAST_APPLIED_ANNOTATION = 'kubectl.kubernetes.io/last-applied-configuration';

/**
 * A workload as the service keeps it (its copies, the watched ones): without metadata.managedFields, which is
 * often half its size and read only by the hold step (holdDecision, on a fresh read: a copy without them sends a
 * hold back to one), and without kubectl apply's last-applied-configuration annotation, the manifest once more.
 * A patch sets annotations one by one, never the map whole, so nothing written comes from the copy's. Pure.
 */
export function leanWorkload(obj: K8sObject): K8sObject {
  const metadata = obj.metadata;
  if (!isObject(metadata)) return obj;
  const { managedFields, ...rest } = metadata;
  const annotations = isObject(rest.annotations) ? rest.annotations : {};
  const applied = LAST_APPLIED_ANNOTATION in annotations;
  if (managedFields === undefined && !applied) return obj;
  if (applied) {
    const { [LAST_APPLIED_ANNOTATION]: _, ...kept } = annotations;
    rest.annotations = kept;
  }
  return { ...obj, metadata: rest };
}

/**
 * The workload, or an error naming it. A missing one is not followed by a list of what the
 * namespace holds: the report is the answer to whoever holds the hook's URL.
 */
async function readWorkload(client: KubeClient, target: WorkloadTarget): Promise<K8sObject> {
  try {
    return await client.get<K8sObject>(workloadResource(target));
  } catch (e) {
    if (!(e instanceof KubeError && e.status === 404)) throw e;
    throw new UpgradeError(`${target.kind} "${target.name}" not found in namespace "${target.namespace}"`);
  }
}

function missingContainerMessage(podSpec: unknown, name: string, workload: string): string {
  const containers = containerNames(podSpec, 'containers');
  const inits = containerNames(podSpec, 'initContainers');
  const lists = [
    `containers: ${containers.join(', ') || '(none)'}`,
    ...(inits.length ? [`init containers: ${inits.join(', ')}`] : []),
  ];
  return `container "${name}" not found in ${workload} (${lists.join('; ')})`;
}

// ================================================================================================
// 28. update policies — which tags a workload takes. The hook setting UPDATE_POLICY gives a hook's policy; the
//    workload's annotation webhook/policy overrides it, and webhook/policy.<container> overrides both for one
//    container. parsePolicy reads a value (all, semver:<range>, major, minor, patch, glob:<pattern>,
//    regexp:<pattern>; the semver ones never go down unless `,allow-downgrade` follows); policyDecision, pure, says
//    whether a push is within the policy in effect, why not, or what is wrong with an annotation. A push by digest
//    alone names no tag and is outside no policy.
//    Exports: parsePolicy, policyDecision, tagOf, UpdatePolicy.
//    Tests: test/policy.test.ts.
// ================================================================================================

// A policy is one line an operator writes; longer is a mistake, and is not read further (an
// annotation may hold 256 KiB).
const MAX_POLICY_LENGTH = 1024;

const ALLOW_DOWNGRADE = ',allow-downgrade';

/** A policy as parsed: `text` is the value as written, for messages. */
export type UpdatePolicy = { text: string } & (
  | { kind: 'all' }
  | { kind: 'semver'; range: SemverRange; allowDowngrade: boolean }
  | { kind: 'major' | 'minor' | 'patch'; allowDowngrade: boolean }
  | { kind: 'glob' | 'regexp'; pattern: RegExp }
);

const POLICY_FORMS =
  'all, semver:<range>, major, minor, patch (each of these four optionally followed by ",allow-downgrade"), ' +
  'glob:<pattern> or regexp:<pattern>';

/** A glob on tags: `*` any run of characters, `?` one; anything else itself. As a linear-time regex. */
function globRegex(glob: string): RegExp {
  const source = [...glob].map((c) => (c === '*' ? '.*' : c === '?' ? '.' : c.replace(/[\\^$.|+()[\]{}]/g, '\\$&')));
  return compileGoRegex(`^${source.join('')}$`);
}

/** The policy's pattern (glob: or regexp:), or throws saying what is wrong with it. */
function patternPolicy(kind: 'glob' | 'regexp', pattern: string, text: string): UpdatePolicy {
  if (pattern === '') throw new Error(`${kind}: needs a pattern`);
  try {
    return { text, kind, pattern: kind === 'glob' ? globRegex(pattern) : compileGoRegex(pattern) };
  } catch (e) {
    throw new Error(`${kind}: ${(e as Error).message}`);
  }
}

/**
 * A policy value; throws an Error saying what is wrong (the caller names where it was written). Keywords are
 * lower-case; the whole is trimmed. Pure.
 */
export function parsePolicy(value: string): UpdatePolicy {
  const kept = compiledPolicies.get(value);
  if (kept !== undefined) {
    if ('problem' in kept) throw new Error(kept.problem);
    return kept;
  }
  let compiled: UpdatePolicy | { problem: string };
  try {
    compiled = compilePolicy(value);
  } catch (e) {
    compiled = { problem: (e as Error).message };
  }
  if (value.length <= MAX_POLICY_LENGTH) {
    if (compiledPolicies.size >= MAX_COMPILED_POLICIES) compiledPolicies.delete(compiledPolicies.keys().next().value!);
    compiledPolicies.set(value, compiled);
  }
  if ('problem' in compiled) throw new Error(compiled.problem);
  return compiled;
}

// A policy annotation is read on every push to its workload, and compiling a pattern can take a large part of a
// second (the linear engine copies repeats): each text is compiled once. Past this many texts (a fleet's
// policies are a few dozen), the one kept longest goes; each is at most MAX_POLICY_LENGTH characters.
const MAX_COMPILED_POLICIES = 256;

/** The policies compiled, by their text as written, or why the text is not a policy. */
const compiledPolicies = new Map<string, UpdatePolicy | { problem: string }>();

/** parsePolicy's work, uncached. */
function compilePolicy(value: string): UpdatePolicy {
  if (value.length > MAX_POLICY_LENGTH)
    throw new Error(`longer than ${MAX_POLICY_LENGTH} characters (${value.length})`);
  const text = value.trim();
  if (text === '') throw new Error(`empty; use one of ${POLICY_FORMS}`);
  if (text === 'all') return { text, kind: 'all' };
  for (const kind of ['glob', 'regexp'] as const)
    if (text.startsWith(`${kind}:`)) return patternPolicy(kind, text.slice(kind.length + 1), text);
  const allowDowngrade = text.endsWith(ALLOW_DOWNGRADE);
  const body = allowDowngrade ? text.slice(0, -ALLOW_DOWNGRADE.length).trim() : text;
  if (body === 'major' || body === 'minor' || body === 'patch') return { text, kind: body, allowDowngrade };
  if (body.startsWith('semver:')) {
    const range = body.slice('semver:'.length).trim();
    if (range === '') throw new Error('semver: needs a range (e.g. ^1.4, ~1.4.2, >=1.4.0 <2.0.0, 1.x)');
    try {
      return { text, kind: 'semver', range: parseRange(range), allowDowngrade };
    } catch (e) {
      throw new Error(`semver range ${showValue(range)}: ${(e as Error).message}`);
    }
  }
  throw new Error(`not one of ${POLICY_FORMS}`);
}

/** The policy of a push: allowed, skipped (why), or a malformed annotation (what is wrong). */
type PolicyVerdict =
  | { kind: 'allowed' }
  | { kind: 'skipped'; message: string }
  | { kind: 'malformed'; message: string };

/** The tag of an image reference (`latest` when it names none), or undefined for a reference by digest alone. */
function tagOf(ref: string): string | undefined {
  const parsed = validateImageRef(ref);
  if (!parsed.ok) return undefined;
  return parsed.ref.tag ?? (parsed.ref.digest === undefined ? 'latest' : undefined);
}

/** The policy in effect for a container: its annotation, the workload's, else the hook's; where it was read. */
function policyInEffect(
  workload: unknown,
  container: string,
  hookPolicy: UpdatePolicy,
  name: string,
): { policy: UpdatePolicy; of: string } | { malformed: string } {
  for (const [key, of] of [
    [`${POLICY_ANNOTATION}.${container}`, `container ${container} of ${name}`],
    [POLICY_ANNOTATION, name],
  ]) {
    const value = valueAt(workload, ['metadata', 'annotations', key]);
    if (typeof value !== 'string') continue;
    try {
      return { policy: parsePolicy(value), of };
    } catch (e) {
      const why = (e as Error).message;
      return { malformed: `annotation ${key} of ${name}: ${showValue(value)} is not a policy: ${why}` };
    }
  }
  return { policy: hookPolicy, of: `${name} (the hook's UPDATE_POLICY)` };
}

/** Why a version is outside a semver-ordered policy, or undefined when it is within. Pure. */
function versionProblem(policy: UpdatePolicy, pushed: Version, running: Version | undefined): string | undefined {
  if (policy.kind === 'semver' && !satisfiesRange(pushed, policy.range))
    return pushed.pre.length > 0 ? 'a pre-release, which a range takes only when it names one of the same version' : '';
  if (policy.kind === 'major' || policy.kind === 'minor' || policy.kind === 'patch') {
    const sameTuple = running && compareVersions({ ...pushed, pre: [] }, { ...running, pre: [] }) === 0;
    if (pushed.pre.length > 0 && !(running && running.pre.length > 0 && sameTuple))
      return `a pre-release, which ${policy.kind} takes only over a pre-release of the same version`;
    if (running && policy.kind !== 'major' && pushed.major !== running.major)
      return `another major version than the running ${formatVersion(running)}`;
    if (running && policy.kind === 'patch' && pushed.minor !== running.minor)
      return `another minor version than the running ${formatVersion(running)}`;
  }
  if ('allowDowngrade' in policy && !policy.allowDowngrade && running && compareVersions(pushed, running) < 0)
    return `lower than the running ${formatVersion(running)}; "${ALLOW_DOWNGRADE}" in the policy allows that`;
  return undefined;
}

/**
 * Whether a push is within the policy in effect for the container (its annotation, the workload's, the hook's
 * UPDATE_POLICY): the pushed tag, against the version the container runs for the semver policies. A push by digest
 * alone is within every policy (it names no tag). `name` is the workload as messages name it. Pure.
 */
export function policyDecision(
  hookPolicy: UpdatePolicy,
  workload: unknown,
  container: string,
  running: string,
  pushed: string,
  name: string,
): PolicyVerdict {
  const effect = policyInEffect(workload, container, hookPolicy, name);
  if ('malformed' in effect) return { kind: 'malformed', message: effect.malformed };
  const { policy, of } = effect;
  const tag = tagOf(pushed);
  if (policy.kind === 'all' || tag === undefined) return { kind: 'allowed' };
  const outside = (why: string) => ({
    kind: 'skipped' as const,
    message: `policy: ${tag} is outside ${policy.text} of ${of}${why ? `: ${why}` : ''}`,
  });
  if (policy.kind === 'glob' || policy.kind === 'regexp')
    return policy.pattern.test(tag) ? { kind: 'allowed' } : outside('');
  const version = parseVersion(tag);
  if (!version) return outside('not a semver version');
  const runningTag = tagOf(running);
  const why = versionProblem(policy, version, runningTag === undefined ? undefined : parseVersion(runningTag));
  return why === undefined ? { kind: 'allowed' } : outside(why);
}

// ================================================================================================
// 29. hook settings — HOOK_SETTINGS, the one table of the settings of the upgrade, its mail and its notifications:
//    each one's source (the hook, or the service's own environment), type, default, whether a hook must give it as a
//    fixed string (checked at load: fixedSettingChecks), whether it holds a key, its validation, its meaning, and its
//    parse, which is the only reader of its text and throws the message operators know. The settings tables of
//    docs/configuration.md are written from it (scripts/settings-doc.ts), and -validate describes hooks from it. A
//    push's boundary reads its hook's settings once, into a typed HookConfig (readHookConfig: the workload, the
//    checks, the decision's settings, its cluster, how its payload is read); nothing after the boundary reads them.
//    Exports: configuredReport, deployWindowSetting, fixedSettingChecks, HOOK_SETTINGS, HookConfig, HookSetting,
//    HookSettingName, notifyCa, NotifyFormatName, readHookConfig, UpgradeSettings.
//    Tests: test/clouds.test.ts, test/cosign-verify.test.ts, test/decision.test.ts, test/hold.test.ts,
//    test/mail.test.ts, test/policy.test.ts, test/registries.test.ts, test/settings.test.ts, test/upgrade.test.ts,
//    test/windows.test.ts.
// ================================================================================================

/**
 * One setting of the upgrade, its mail and its notifications: an environment variable a hook passes
 * to /webhooks.sh (pass-environment-to-command), or, `from: 'service'`, one of the service's own. Its
 * parse is the only reader of its text: it returns the typed value (the default when unset) or
 * throws an Error whose message names the setting and what is wrong. `fixed`: the setting widens what
 * a request may do, so a hook must give it as a fixed string, checked at every load (HookSettingChecks).
 * `secret`: the value holds a key, so -validate never shows it. The settings tables of
 * docs/configuration.md are written from this table (scripts/settings-doc.ts); test/settings.test.ts
 * checks that they agree.
 */
export interface HookSetting<T> {
  from: 'hook' | 'service';
  type: string;
  default: string;
  fixed: boolean;
  secret: boolean;
  validation: string;
  meaning: string;
  parse(value: string | undefined): T;
}

/** The formats NOTIFY_FORMAT may name, in the order messages list them; each is one NOTIFY_FORMATS entry. */
const NOTIFY_FORMAT_NAMES = [
  'json',
  'dingtalk',
  'wecom',
  'feishu',
  'slack',
  'teams',
  'discord',
  'googlechat',
  'telegram',
  'lark',
] as const;
export type NotifyFormatName = (typeof NOTIFY_FORMAT_NAMES)[number];

// One hook posting to more places than this is a mistake in its file.
const MAX_NOTIFY_URLS = 5;

/** A hook setting with its defaults filled in: most are per hook, not fixed, not secret. */
function setting<T>(row: Partial<HookSetting<T>> & Pick<HookSetting<T>, 'type' | 'validation' | 'meaning' | 'parse'>) {
  return { from: 'hook' as const, default: 'unset', fixed: false, secret: false, ...row };
}

// A push fanned out waits for every cluster's answer; a delivery to more clusters than this is a
// mistake in the hooks file (one per region and stage is a handful).
const MAX_CLUSTERS = 16;
// kubeconfig context names are free text; these bounds keep them readable in logs and labels.
const CONTEXT_NAME = /^[^\s\p{Cc}]{1,253}$/u;

/** CLUSTER (at most 1) and CLUSTERS: context names separated by spaces; unset or blank is none. */
function clusterNames(name: string, value: string | undefined, max: number): string[] {
  const names = [...new Set((value ?? '').split(/\s+/).filter((n) => n !== ''))];
  for (const n of names)
    if (!CONTEXT_NAME.test(n)) throw new UpgradeError(`${name} ${showValue(n)} is not a kubeconfig context name`);
  if (names.length > max)
    throw new UpgradeError(
      max === 1
        ? `${name} names one context (${names.length} given; several clusters are CLUSTERS)`
        : `${name} names ${names.length} contexts, more than ${max}`,
    );
  return names;
}

/** A text setting; unset or blank is '' (readers treat it as unset). */
function trimmed(value: string | undefined): string {
  return value?.trim() ?? '';
}

/** APP_NS and APP_CONTAINER: required DNS labels; `what` is the name's kind, `parameter` the URL's. */
function dnsLabelSetting(name: string, what: string, parameter: string) {
  return (value: string | undefined): string => {
    const label = trimmed(value);
    if (label === '')
      throw new UpgradeError(`${name} is not set (the hook passes it from the URL parameter ${parameter})`);
    if (!DNS_LABEL.test(label))
      throw new UpgradeError(
        `${name} ${showValue(label)} is not a valid ${what} name (lower-case letters, digits and "-", at most 63)`,
      );
    return label;
  };
}

/** ROLLOUT_TIMEOUT: a Go duration; unset or blank is 0 (the push is not followed). */
function rolloutTimeoutSetting(value: string | undefined): number {
  if (!value?.trim()) return 0;
  try {
    return parseGoDuration(value.trim());
  } catch {
    throw new UpgradeError(`ROLLOUT_TIMEOUT ${showValue(value)} is not a duration (e.g. 0, 60s, 5m)`);
  }
}

// A push may wait at most this long by default: a working day and a night for someone to answer.
const DEFAULT_APPROVAL_TIMEOUT_MS = 24 * 3_600_000;
// Shorter than this, a link expires before anyone could open it.
const MIN_APPROVAL_TIMEOUT_MS = 60_000;

/** APPROVAL_TIMEOUT: a Go duration of at least MIN_APPROVAL_TIMEOUT_MS; unset or blank is 24h. */
function approvalTimeoutSetting(value: string | undefined): number {
  if (!value?.trim()) return DEFAULT_APPROVAL_TIMEOUT_MS;
  let ms: number;
  try {
    ms = parseGoDuration(value.trim());
  } catch {
    throw new UpgradeError(`APPROVAL_TIMEOUT ${showValue(value)} is not a duration (e.g. 30m, 24h)`);
  }
  if (ms < MIN_APPROVAL_TIMEOUT_MS) throw new UpgradeError(`APPROVAL_TIMEOUT ${showValue(value)} is less than 1m`);
  return ms;
}

/** DEPLOY_WINDOW (or the annotation webhook/window): the windows, or an error naming the setting and range. */
export function deployWindowSetting(name: string, value: string): DeployWindow[] {
  try {
    return parseDeployWindows(value);
  } catch (e) {
    throw new UpgradeError(`${name} ${showValue(value)}: ${(e as Error).message}`);
  }
}

/** ON_REGISTRY_AWAY: fail (unset or blank) or keep, any case. */
function registryAwaySetting(value: string | undefined): 'fail' | 'keep' {
  const mode = (value?.trim() || 'fail').toLowerCase();
  if (mode === 'fail' || mode === 'keep') return mode;
  throw new UpgradeError(`ON_REGISTRY_AWAY ${showValue(value ?? '')} is not fail or keep`);
}

/** ON_OUTSIDE_CHANGE: hold (unset or blank) or follow, any case. */
function outsideChangeSetting(value: string | undefined): 'hold' | 'follow' {
  const mode = (value?.trim() || 'hold').toLowerCase();
  if (mode === 'hold' || mode === 'follow') return mode;
  throw new UpgradeError(`ON_OUTSIDE_CHANGE ${showValue(value ?? '')} is not hold or follow`);
}

/**
 * REGISTRY_TOKEN_HOSTS: host names (or "*.example.com"), separated by spaces, of token services
 * besides the registry's own host (and the well-known registries' token hosts) that may be sent
 * the pull secret's login. Throws, naming the item, on anything else (a URL, a port).
 */
function registryTokenHosts(value: string | undefined): string[] {
  const hosts = (value ?? '').split(/\s+/).filter((h) => h !== '');
  hosts.forEach((h, i) => {
    if (!isHostName(h.replace(/^\*\./, '')))
      throw new UpgradeError(
        `REGISTRY_TOKEN_HOSTS item ${i + 1} ${showValue(h)} is not a host name (e.g. auth.example.com or ` +
          '*.example.com, without scheme or port)',
      );
  });
  return hosts;
}

/** REGISTRY_CA: PEM text, or the path of a PEM file. */
function registryCa(value: string | undefined): string | undefined {
  if (!value?.trim()) return undefined;
  if (value.includes('-----BEGIN')) return value;
  try {
    return fs.readFileSync(value.trim(), 'utf8');
  } catch (e) {
    throw new UpgradeError(
      `REGISTRY_CA ${showValue(value)} is neither PEM nor a readable file: ${(e as Error).message}`,
    );
  }
}

/**
 * VERIFY_SIGNATURE: one or more `cosign:<key>` items separated by spaces, each the PEM text of public
 * keys or the path of a file holding them (read when the hooks load, and when a push is checked);
 * unset or blank is none: signatures are not checked. Throws, naming the item (and the file and PEM
 * block), on anything else.
 */
function signatureKeysSetting(value: string | undefined): CosignKey[] {
  const text = value?.trim() ?? '';
  if (text === '') return [];
  return text.split(/\s+(?=cosign:)/).flatMap((item, i) => {
    const at = `VERIFY_SIGNATURE item ${i + 1}`;
    if (!item.startsWith('cosign:'))
      throw new UpgradeError(
        `${at} ${showValue(item.split(/\s/)[0])} is not cosign:<public key PEM or file> (cosign is the only ` +
          'signature format checked)',
      );
    const key = item.slice('cosign:'.length).trim();
    try {
      if (key.includes('-----BEGIN')) return parseCosignKeys(key, at);
      let pem: string;
      try {
        pem = fs.readFileSync(key, 'utf8');
      } catch (e) {
        throw new Error(`${at}: the key file ${showValue(key)} cannot be read: ${(e as Error).message}`);
      }
      return parseCosignKeys(pem, `${at}: key file ${key}`);
    } catch (e) {
      throw new UpgradeError((e as Error).message);
    }
  });
}

/** VERIFY_SIGNATURE_ANNOTATIONS: `key=value` items separated by spaces, each required in a signature's payload. */
function signatureAnnotationsSetting(value: string | undefined): Record<string, string> {
  const required: Record<string, string> = {};
  for (const [i, item] of (value ?? '').split(/\s+/).filter((a) => a !== '').entries()) {
    const eq = item.indexOf('=');
    if (eq <= 0)
      throw new UpgradeError(
        `VERIFY_SIGNATURE_ANNOTATIONS item ${i + 1} ${showValue(item)} is not key=value (as cosign sign -a key=value)`,
      );
    required[item.slice(0, eq)] = item.slice(eq + 1);
  }
  return required;
}

/**
 * MAIL_TO as the hook gives it: comma-separated addresses. Empty entries ("a@x,") are ignored and
 * repeated addresses kept once; anything that is not a plain address (a display name, a line break
 * smuggling a header or an SMTP command) throws, naming the entry.
 */
export function parseRecipients(mailTo: string): string[] {
  const recipients: string[] = [];
  for (const entry of mailTo.split(',')) {
    const address = entry.trim();
    if (address === '') continue;
    if (!isAddress(address)) throw new Error(`MAIL_TO: ${JSON.stringify(address)} is not an e-mail address`);
    if (!recipients.some((known) => known.toLowerCase() === address.toLowerCase())) recipients.push(address);
  }
  if (recipients.length === 0) throw new Error('MAIL_TO: no recipient');
  return recipients;
}

/**
 * A MAIL_* value given in base64 (as the old image took them): the decoded text, undefined when unset,
 * and `check` (what is wrong with the decoded text, or undefined) run on it. Trailing line breaks are
 * dropped, as the old image's `$(echo … | base64 -d)` did: `echo secret | base64` is how they are made.
 */
function mailBase64(name: string, check: (text: string) => string | undefined = () => undefined) {
  return (value: string | undefined): string | undefined => {
    if (value === undefined || value.trim() === '') return undefined;
    let text: string;
    try {
      text = new TextDecoder('utf-8', { fatal: true }).decode(decodeBase64Strict(value)).replace(/[\r\n]+$/, '');
    } catch {
      throw new Error(`${name}: not valid base64 (or not UTF-8 once decoded)`);
    }
    const problem = check(text);
    if (problem !== undefined) throw new Error(`${name}: ${problem}`);
    return text;
  };
}

/** A MAIL_* switch: "true" or "false" in any case; unset or blank is `fallback`. */
function mailBoolean(name: string, fallback: boolean) {
  return (value: string | undefined): boolean => {
    const raw = value?.trim().toLowerCase();
    if (raw === undefined || raw === '') return fallback;
    if (raw === 'true' || raw === 'false') return raw === 'true';
    throw new Error(`${name}: must be "true" or "false"`);
  };
}

function mailPort(value: string | undefined): number {
  const raw = value?.trim();
  if (!raw) return DEFAULT_SMTP_PORT;
  const port = /^\d{1,5}$/.test(raw) ? Number(raw) : 0;
  if (port < 1 || port > 65535) throw new Error('MAIL_SMTP_PORT: not a port number (1-65535)');
  return port;
}

/** MAIL_TLS_MODE forced, or undefined: the port then chooses (parseMailConfig). */
function mailTlsMode(value: string | undefined): 'implicit' | 'starttls' | 'auto' | undefined {
  const mode = value?.trim().toLowerCase();
  if (!mode) return undefined;
  if (mode !== 'implicit' && mode !== 'starttls' && mode !== 'auto')
    throw new Error('MAIL_TLS_MODE: must be "implicit", "starttls" or "auto"');
  return mode;
}

/** NOTIFY_URL: one or more http(s) URLs, separated by spaces or commas; unset is none, blank is refused. */
function notifyUrls(value: string | undefined): URL[] {
  if (value === undefined) return [];
  const items = value.split(/[\s,]+/).filter((u) => u !== '');
  if (items.length === 0) throw new Error('NOTIFY_URL is empty');
  if (items.length > MAX_NOTIFY_URLS)
    throw new Error(`NOTIFY_URL lists ${items.length} URLs; at most ${MAX_NOTIFY_URLS}`);
  return items.map((item, i) => {
    let url: URL;
    try {
      url = new URL(item);
    } catch {
      throw new Error(`NOTIFY_URL item ${i + 1} is not a URL`);
    }
    if (url.protocol !== 'https:' && url.protocol !== 'http:')
      throw new Error(`NOTIFY_URL item ${i + 1} is not an http or https URL (${url.protocol})`);
    return url;
  });
}

/** NOTIFY_FORMAT: one format for every URL, or one per URL (comma separated); default json. */
function notifyFormats(value: string | undefined): NotifyFormatName[] {
  const formats = (value ?? '').split(',').map((f) => f.trim().toLowerCase());
  for (const f of formats)
    if (f !== '' && !(NOTIFY_FORMAT_NAMES as readonly string[]).includes(f))
      throw new Error(`NOTIFY_FORMAT ${showValue(f)} is not one of ${orList([...NOTIFY_FORMAT_NAMES])}`);
  return formats.map((f) => (f || 'json') as NotifyFormatName);
}

// A Telegram chat: its numeric id (groups and channels negative), or a public channel's @username
// (5 to 32 letters, digits and underscores), as the Bot API's chat_id takes it.
const TELEGRAM_CHAT = /^(?:-?\d{1,20}|@[A-Za-z][A-Za-z0-9_]{4,31})$/;

/** NOTIFY_TELEGRAM_CHAT: chat ids separated by spaces or commas; unset is none, blank is refused. */
function telegramChats(value: string | undefined): string[] {
  if (value === undefined) return [];
  const chats = value.split(/[\s,]+/).filter((c) => c !== '');
  if (chats.length === 0) throw new Error('NOTIFY_TELEGRAM_CHAT is empty');
  for (const c of chats)
    if (!TELEGRAM_CHAT.test(c))
      throw new Error(`NOTIFY_TELEGRAM_CHAT ${showValue(c)} is not a chat id (an integer) or a @channelusername`);
  return chats;
}

/** NOTIFY_CACERT (PEM, or base64 of PEM) as CAs trusted besides Node's own; throws when it is neither. */
export function notifyCa(value: string | undefined): string[] | undefined {
  if (!value?.trim()) return undefined;
  const pem = value.trim().startsWith('-----BEGIN') ? value : decodeBase64Strict(value).toString('utf8');
  const certificates = pem.match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g) ?? [];
  if (certificates.length === 0) throw new Error('NOTIFY_CACERT holds no PEM certificate (PEM text, or base64 of it)');
  for (const c of certificates) new X509Certificate(c);
  return [...tls.rootCertificates, ...certificates];
}

/** UPDATE_POLICY: a policy (parsePolicy); unset or blank is all, today's behaviour. */
function updatePolicySetting(value: string | undefined): UpdatePolicy {
  if (!value?.trim()) return parsePolicy('all');
  try {
    return parsePolicy(value);
  } catch (e) {
    throw new UpgradeError(`UPDATE_POLICY ${showValue(value)} is not a policy: ${(e as Error).message}`);
  }
}

/**
 * Every setting of the upgrade, the mail and the notifications: the one place each is parsed and
 * described. Adding a setting is one entry here, its reader, and a line the doc generator writes.
 */
export const HOOK_SETTINGS = {
  // -- what to upgrade: the hook passes these from the URL's parameters
  APP_NS: setting({
    type: 'namespace',
    default: 'required',
    validation: 'a DNS label: lower-case letters, digits and "-", at most 63',
    meaning: 'The namespace of the workload to upgrade (URL parameter ns).',
    parse: dnsLabelSetting('APP_NS', 'namespace', 'ns'),
  }),
  APP_WORKLOAD: setting({
    type: '<kind>/<name>',
    default: 'required',
    validation: `a kind of ${orList(Object.keys(WORKLOAD_KINDS))} (or its short name), a DNS name`,
    meaning: 'The workload to upgrade (URL parameter workload), e.g. deployment/web.',
    parse: parseWorkload,
  }),
  APP_CONTAINER: setting({
    type: 'container name',
    default: 'required',
    validation: 'a DNS label: lower-case letters, digits and "-", at most 63',
    meaning: 'The container of the workload whose image the push sets (URL parameter container).',
    parse: dnsLabelSetting('APP_CONTAINER', 'container', 'container'),
  }),
  // -- where: the cluster, a context of the service's kubeconfig
  CLUSTER: setting({
    type: 'kubeconfig context',
    default: 'the current context (or the pod\'s service account)',
    fixed: true,
    validation: 'a context name: no spaces, at most 253 characters',
    meaning: 'The cluster the workload is in: a context of the kubeconfig the service reads (-kubeconfig, KUBECONFIG).',
    parse: (value: string | undefined) => clusterNames('CLUSTER', value, 1)[0],
  }),
  CLUSTERS: setting({
    type: 'kubeconfig contexts',
    default: 'unset (one cluster: CLUSTER)',
    fixed: true,
    validation: `context names separated by spaces, at most ${MAX_CLUSTERS}; not with CLUSTER`,
    meaning: 'Several clusters, each upgraded by the same push: each its own result, record, follow and Event.',
    parse: (value: string | undefined) => clusterNames('CLUSTERS', value, MAX_CLUSTERS),
  }),
  // -- reading the push
  REPO_TYPE: setting({
    type: 'registry type',
    default: 'required',
    validation: `one of ${REPO_TYPES.join(', ')} (any case)`,
    meaning: 'Which registry sent the push (URL parameter repo_type); auto recognises it from the payload.',
    parse: repoTypeSetting,
  }),
  NET_TYPE: setting({
    type: 'endpoint',
    default: 'public',
    validation: 'public, vpc or internal (any case); read for regionalregistry only',
    meaning: 'Which endpoint of Aliyun ACR the cluster pulls from (URL parameter net_type).',
    parse: acrEndpointPrefix,
  }),
  REGISTRY_HOST: setting({
    type: 'host[:port]',
    fixed: true,
    validation: 'a registry host, with or without scheme and trailing slashes',
    meaning:
      'Replaces the registry host of every push (required for Artifactory and Nexus); the image pin ' +
      'counts it as the registry of every container.',
    parse: registryHostSetting,
  }),
  PIN_DIGEST: setting({
    type: 'boolean',
    default: 'false',
    validation: 'Go booleans: true, false, 1, 0, t, f (any case)',
    meaning: 'Deploy repo:tag@sha256:… when the payload carries the digest.',
    parse: (value: string | undefined) => parseBoolSetting('PIN_DIGEST', value),
  }),
  UPDATE_POLICY: setting({
    type: 'update policy',
    default: 'all',
    fixed: true,
    validation:
      'all, semver:<range>, major, minor or patch (",allow-downgrade" may follow these four), glob:<pattern>, ' +
      'regexp:<pattern>',
    meaning:
      'Which tags a push may set (docs/policies.md); the annotations webhook/policy and webhook/policy.<container> ' +
      'override it.',
    parse: updatePolicySetting,
  }),
  ALLOW_IMAGES: setting({
    type: 'list of image patterns',
    default: 'none',
    fixed: true,
    validation: "space-separated host/path, host/path/* or host/*; Docker Hub's may omit the host",
    meaning: 'Repositories a push may set besides the one the container runs (the image pin).',
    parse: allowedImages,
  }),
  VERIFY_IMAGE: setting({
    type: 'boolean',
    default: 'false',
    validation: 'Go booleans: true, false, 1, 0, t, f (any case)',
    meaning: 'Before the patch, resolve the tag on its registry and deploy repo:tag@sha256:… (the digest it has).',
    parse: (value: string | undefined) => parseBoolSetting('VERIFY_IMAGE', value),
  }),
  REGISTRY_CA: setting({
    type: 'PEM or file path',
    validation: 'PEM text, or the path of a readable PEM file',
    meaning: "The CA that signed the registry's certificate, for VERIFY_IMAGE.",
    parse: registryCa,
  }),
  REGISTRY_TOKEN_HOSTS: setting({
    type: 'list of host names',
    default: 'none',
    fixed: true,
    validation: 'space-separated host names or *.suffix, without scheme or port',
    meaning: "Token services besides the registry's own host that VERIFY_IMAGE may send the pull secret's login to.",
    parse: registryTokenHosts,
  }),
  VERIFY_SIGNATURE: setting({
    type: 'list of cosign keys',
    default: 'not checked',
    fixed: true,
    secret: true,
    validation:
      'cosign:<key> items separated by spaces, each PEM text or the path of a PEM file of ECDSA P-256, Ed25519 or ' +
      'RSA public keys',
    meaning:
      "Deploy only a digest with a cosign signature valid under one of the keys (any one suffices), found offline on " +
      'the registry; implies VERIFY_IMAGE.',
    parse: signatureKeysSetting,
  }),
  VERIFY_SIGNATURE_ANNOTATIONS: setting({
    type: 'list of key=value',
    default: 'none',
    fixed: true,
    validation: 'key=value items separated by spaces',
    meaning: 'Annotations a signature must carry (cosign sign -a key=value), for VERIFY_SIGNATURE.',
    parse: signatureAnnotationsSetting,
  }),
  ON_REGISTRY_AWAY: setting({
    type: 'fail or keep',
    default: 'fail',
    fixed: true,
    validation: 'fail or keep (any case)',
    meaning:
      'When the registry cannot be reached for VERIFY_IMAGE or VERIFY_SIGNATURE: fail answers 500 and changes ' +
      'nothing; keep answers 202 and applies the push once the registry answers (within -apply-deadline).',
    parse: registryAwaySetting,
  }),
  ON_OUTSIDE_CHANGE: setting({
    type: 'hold or follow',
    default: 'hold',
    fixed: true,
    validation: 'hold or follow (any case)',
    meaning:
      'When the image was changed outside webhook (kubectl, Helm, Argo CD, Rancher): hold applies only a push ' +
      'newer than the image replaced; follow applies every push.',
    parse: outsideChangeSetting,
  }),
  REQUIRE_APPROVAL: setting({
    type: 'boolean',
    default: 'false',
    fixed: true,
    validation: 'Go booleans: true, false, 1, 0, t, f (any case)',
    meaning:
      'A push waits for a person to approve it (links in the notifications, the deliveries page); the annotation ' +
      'webhook/approval: required asks the same of one workload (docs/approvals.md).',
    parse: (value: string | undefined) => parseBoolSetting('REQUIRE_APPROVAL', value),
  }),
  APPROVAL_TIMEOUT: setting({
    type: 'duration',
    default: '24h',
    fixed: true,
    validation: 'a Go duration of at least 1m: 30m, 24h, 72h',
    meaning: 'How long a waiting push may wait for its approval (or, past its window opening, for a replica).',
    parse: approvalTimeoutSetting,
  }),
  DEPLOY_WINDOW: setting({
    type: 'change window',
    default: 'always',
    fixed: true,
    validation:
      'ranges "<days> <HH:MM>-<HH:MM> [<IANA zone>]" separated by ";", e.g. "Mon-Fri 09:00-18:00 Asia/Shanghai"',
    meaning:
      'A push outside the window waits and is applied when it opens; the annotation webhook/window overrides it.',
    parse: (value: string | undefined) => (value?.trim() ? deployWindowSetting('DEPLOY_WINDOW', value) : undefined),
  }),
  APPROVAL_OVERRIDE: setting({
    type: 'boolean',
    default: 'false',
    fixed: true,
    validation: 'Go booleans: true, false, 1, 0, t, f (any case)',
    meaning: 'The approval of a push waiting for the change window may deploy it at once ("Deploy now").',
    parse: (value: string | undefined) => parseBoolSetting('APPROVAL_OVERRIDE', value),
  }),
  // -- after the patch
  ROLLOUT_TIMEOUT: setting({
    type: 'duration',
    default: '0 (not followed)',
    validation: 'a Go duration: 0, 60s, 5m, 1h30m',
    meaning: 'How long the answer waits for the rollout; it fails if the rollout fails or does not finish.',
    parse: rolloutTimeoutSetting,
  }),
  ROLLBACK_ON_FAILURE: setting({
    type: 'boolean',
    default: 'false',
    validation: 'Go booleans: true, false, 1, 0, t, f (any case)',
    meaning: 'A followed rollout that fails is rolled back to the image the container ran before the push.',
    parse: (value: string | undefined) => parseBoolSetting('ROLLBACK_ON_FAILURE', value, 'true or false'),
  }),
  // -- telling people
  MAIL_TO: setting({
    type: 'list of addresses',
    default: 'no mail',
    validation: 'comma-separated plain e-mail addresses (no display names)',
    meaning: 'Who is mailed the result (through the MAIL_* server of the service).',
    parse: (value: string | undefined) => (value ? parseRecipients(value) : []),
  }),
  NOTIFY_ON_SKIP: setting({
    type: 'boolean',
    default: 'true',
    fixed: true,
    validation: 'Go booleans: true, false, 1, 0, t, f (any case)',
    meaning: 'Whether a push the update policy skipped is mailed and posted (the deliveries page shows it anyway).',
    parse: (value: string | undefined) => (value?.trim() ? parseBoolSetting('NOTIFY_ON_SKIP', value) : true),
  }),
  NOTIFY_URL: setting({
    type: 'list of URLs',
    default: 'no notification',
    fixed: true,
    secret: true,
    validation: `http or https URLs separated by spaces or commas, at most ${MAX_NOTIFY_URLS}`,
    meaning: 'Where the result is posted (chat robots, a JSON receiver).',
    parse: notifyUrls,
  }),
  NOTIFY_FORMAT: setting({
    type: 'list of formats',
    default: 'json',
    fixed: true,
    validation: `${orList([...NOTIFY_FORMAT_NAMES])}: one for every URL, or one per URL (comma-separated)`,
    meaning: 'The body posted to each NOTIFY_URL.',
    parse: notifyFormats,
  }),
  NOTIFY_SECRET: setting({
    type: 'list of secrets',
    fixed: true,
    secret: true,
    validation: 'one for every URL, or one per URL (space-separated); only for formats that sign',
    meaning: 'Signs the posts: json (a header), dingtalk (the URL), feishu and lark (the body).',
    parse: (value: string | undefined): (string | undefined)[] =>
      value?.trim() ? value.trim().split(/\s+/) : [undefined],
  }),
  NOTIFY_TELEGRAM_CHAT: setting({
    type: 'list of chat ids',
    fixed: true,
    validation:
      'an integer chat id (groups and channels are negative) or @channelusername; one for every telegram URL, ' +
      'or one per telegram URL (space-separated)',
    meaning: "The chat NOTIFY_FORMAT=telegram posts in (the Bot API's chat_id).",
    parse: telegramChats,
  }),
  // -- the service's own environment
  NOTIFY_CACERT: setting({
    from: 'service',
    type: 'PEM or base64 of PEM',
    validation: 'one or more PEM certificates',
    meaning: "CAs trusted for NOTIFY_URL besides Node's own.",
    parse: notifyCa,
  }),
  MAIL_SMTP_SERVER: setting({
    from: 'service',
    type: 'base64 text',
    default: 'mail off',
    validation: 'a host name or IP address once decoded',
    meaning: 'The SMTP server results are mailed through; unset turns mail off.',
    parse: mailBase64('MAIL_SMTP_SERVER', (text) => {
      const host = text.trim().replace(/^\[(.*)\]$/, '$1');
      return isHostName(host) || net.isIP(host) !== 0 ? undefined : 'not a host name or IP address once decoded';
    }),
  }),
  MAIL_SMTP_PORT: setting({
    from: 'service',
    type: 'port',
    default: String(DEFAULT_SMTP_PORT),
    validation: '1-65535',
    meaning: "The SMTP server's port.",
    parse: mailPort,
  }),
  MAIL_TLS_MODE: setting({
    from: 'service',
    type: 'TLS mode',
    default: `implicit on port ${IMPLICIT_TLS_PORT}, else auto`,
    validation: 'implicit, starttls or auto (any case)',
    meaning: 'implicit or starttls forces that mode on any port; auto asks the server.',
    parse: mailTlsMode,
  }),
  MAIL_TLS_CHECK: setting({
    from: 'service',
    type: 'boolean',
    default: 'true',
    validation: 'true or false (any case)',
    meaning: "Whether the SMTP server's certificate is verified.",
    parse: mailBoolean('MAIL_TLS_CHECK', true),
  }),
  MAIL_CACERT: setting({
    from: 'service',
    type: 'base64 PEM',
    validation: 'PEM certificates once decoded',
    meaning: 'Extra CA certificates to trust for the SMTP server (added to the system roots).',
    parse: mailBase64('MAIL_CACERT', (text) =>
      isPemCertificates(text) ? undefined : 'not PEM certificates once decoded',
    ),
  }),
  MAIL_FROM: setting({
    from: 'service',
    type: 'base64 address',
    default: 'required with MAIL_SMTP_SERVER',
    validation: 'an e-mail address once decoded',
    meaning: 'The sender of result mails; also the AUTH user name unless MAIL_SMTP_USER is set.',
    parse: mailBase64('MAIL_FROM', (text) =>
      isAddress(text.trim()) ? undefined : 'not an e-mail address once decoded',
    ),
  }),
  MAIL_SMTP_USER: setting({
    from: 'service',
    type: 'base64 text',
    default: 'MAIL_FROM',
    validation: 'no control characters once decoded',
    meaning: 'The AUTH user name, where it differs from the sender.',
    parse: mailBase64('MAIL_SMTP_USER', (text) =>
      /[\x00-\x1f\x7f]/.test(text.trim()) ? 'contains control characters once decoded' : undefined,
    ),
  }),
  MAIL_PASSWORD: setting({
    from: 'service',
    type: 'base64 text',
    default: 'no login',
    secret: true,
    validation: 'base64 of UTF-8 text',
    meaning: 'The AUTH password; unset, no AUTH.',
    parse: mailBase64('MAIL_PASSWORD'),
  }),
  MAIL_ALLOW_PLAINTEXT_AUTH: setting({
    from: 'service',
    type: 'boolean',
    default: 'false',
    validation: 'true or false (any case)',
    meaning: 'Lets the password go over a connection without TLS when the server offers no STARTTLS.',
    parse: mailBoolean('MAIL_ALLOW_PLAINTEXT_AUTH', false),
  }),
} satisfies Record<string, HookSetting<unknown>>;

export type HookSettingName = keyof typeof HOOK_SETTINGS;

/**
 * The load-time checks of the settings a hook must fix in its file (chapter 18's HookSettingChecks,
 * handed over by main()): every `fixed` entry, or those of `names`.
 */
export function fixedSettingChecks(names?: HookSettingName[]): HookSettingChecks {
  const checks: HookSettingChecks = {};
  for (const [name, s] of Object.entries(HOOK_SETTINGS) as [HookSettingName, HookSetting<unknown>][])
    if (s.fixed && (names === undefined || names.includes(name)))
      checks[name] = (value) => problemOf(() => s.parse(value));
  return checks;
}

/** The image pin's settings: what a hook must fix to widen the repositories a push may set. */
export const IMAGE_PIN_SETTINGS = fixedSettingChecks(['REGISTRY_HOST', 'ALLOW_IMAGES']);

// ---- a push's settings, read once ------------------------------------------------------------

interface UpgradeSettings {
  namespace: string;
  workload: { kind: WorkloadKind; name: string };
  container: string;
  rolloutTimeoutMs: number;
  pin: ImagePin;
  /** VERIFY_IMAGE: resolve the tag on the registry and deploy the digest it has. */
  verifyImage: boolean;
  /** REGISTRY_CA: the CA that signed the registry's certificate (PEM). */
  registryCa: string | undefined;
  /** REGISTRY_TOKEN_HOSTS: token services besides the registry's own host that may be given its login. */
  registryTokenHosts: string[];
  rollbackOnFailure: boolean;
  /** ON_OUTSIDE_CHANGE: whether a change made outside webhook holds older pushes off. */
  onOutsideChange: 'hold' | 'follow';
  /** VERIFY_SIGNATURE (and its annotations): the keys one of which must have signed the digest deployed. */
  signature: { keys: CosignKey[]; annotations: Record<string, string> } | undefined;
  /** ON_REGISTRY_AWAY: whether a push the registry cannot be asked about is kept (RegistryAway) or fails. */
  onRegistryAway: 'fail' | 'keep';
  /** UPDATE_POLICY: the hook's update policy, which the workload's annotations override. */
  policy: UpdatePolicy;
  /** REQUIRE_APPROVAL, APPROVAL_TIMEOUT, DEPLOY_WINDOW, APPROVAL_OVERRIDE (the workload's annotations may add). */
  requireApproval: boolean;
  approvalTimeoutMs: number;
  windows: DeployWindow[] | undefined;
  approvalOverride: boolean;
}

/**
 * Every setting one push's upgrade reads, parsed once from the hook's environment at the push's boundary: the
 * workload, the checks and the decision's settings (UpgradeSettings), its cluster, and how its payload is read.
 */
export interface HookConfig extends UpgradeSettings {
  /** CLUSTER: a context of the service's kubeconfig; undefined: the default cluster. */
  cluster: string | undefined;
  reading: PushReading;
  /** MAIL_TO as given: the mail checks it when it writes (resultMail); a follow left to resume names it. */
  mailTo: string | undefined;
}

/**
 * A push's HookConfig from the hook's environment, each setting read by its HOOK_SETTINGS entry, in the order their
 * errors are reported; what is known before an error (the cluster, the workload) is in the report.
 */
export function readHookConfig(env: Record<string, string | undefined>, report: UpgradeReport): HookConfig {
  const cluster = (report.cluster = HOOK_SETTINGS.CLUSTER.parse(env.CLUSTER));
  const { registryHost, ...settings } = readSettings(env, report);
  return { ...settings, cluster, reading: pushReadingOf(env, registryHost), mailTo: env.MAIL_TO };
}

/** A push's new report once its HookConfig is read: what readHookConfig tells a report, in the same order. */
export function configuredReport(config: HookConfig): UpgradeReport {
  return Object.assign(newReport(), {
    cluster: config.cluster,
    namespace: config.namespace,
    workload: `${config.workload.kind}/${config.workload.name}`,
    container: config.container,
    rollbackOnFailure: config.rollbackOnFailure || undefined,
    imagePin: config.pin,
  });
}

/** How a push's payload is read, from the hook's environment alone (a reader's tests; a push: readHookConfig). */
export function readPushReading(env: Record<string, string | undefined>): PushReading {
  return pushReadingOf(env, HOOK_SETTINGS.REGISTRY_HOST.parse(env.REGISTRY_HOST));
}

/** REPO_TYPE and NET_TYPE as given (PushReading says why), REGISTRY_HOST as validated, PIN_DIGEST or its Error. */
function pushReadingOf(env: Record<string, string | undefined>, registryHost: string | undefined): PushReading {
  let pinDigest: boolean | Error;
  try {
    pinDigest = HOOK_SETTINGS.PIN_DIGEST.parse(env.PIN_DIGEST);
  } catch (e) {
    pinDigest = e as Error;
  }
  return { repoType: env.REPO_TYPE, netType: env.NET_TYPE, registryHost, pinDigest };
}

/** The upgrade's settings, each read by its HOOK_SETTINGS entry, in the order their errors are reported. */
function readSettings(
  env: Record<string, string | undefined>,
  report: UpgradeReport,
): UpgradeSettings & { registryHost: string | undefined } {
  const read = HOOK_SETTINGS;
  const namespace = read.APP_NS.parse(env.APP_NS);
  report.namespace = namespace;
  const workload = read.APP_WORKLOAD.parse(env.APP_WORKLOAD);
  report.workload = `${workload.kind}/${workload.name}`;
  const container = read.APP_CONTAINER.parse(env.APP_CONTAINER);
  report.container = container;
  const rolloutTimeoutMs = read.ROLLOUT_TIMEOUT.parse(env.ROLLOUT_TIMEOUT);
  const rollback = read.ROLLBACK_ON_FAILURE.parse(env.ROLLBACK_ON_FAILURE);
  report.rollbackOnFailure = rollback || undefined;
  // A malformed pin setting (REGISTRY_HOST, ALLOW_IMAGES) refuses every push, before the cluster is asked anything.
  const registryHost = read.REGISTRY_HOST.parse(env.REGISTRY_HOST);
  const pin = imagePin(registryHost, read.ALLOW_IMAGES.parse(env.ALLOW_IMAGES));
  report.imagePin = pin;
  const keys = read.VERIFY_SIGNATURE.parse(env.VERIFY_SIGNATURE);
  const annotations = read.VERIFY_SIGNATURE_ANNOTATIONS.parse(env.VERIFY_SIGNATURE_ANNOTATIONS);
  if (keys.length === 0 && Object.keys(annotations).length > 0)
    throw new UpgradeError('VERIFY_SIGNATURE_ANNOTATIONS is set but VERIFY_SIGNATURE names no key to check them with');
  return {
    namespace,
    workload,
    container,
    rolloutTimeoutMs,
    pin,
    registryHost,
    rollbackOnFailure: rollback,
    // A signature is checked on the digest the registry has for the tag: VERIFY_SIGNATURE implies VERIFY_IMAGE.
    verifyImage: read.VERIFY_IMAGE.parse(env.VERIFY_IMAGE) || keys.length > 0,
    signature: keys.length > 0 ? { keys, annotations } : undefined,
    registryCa: read.REGISTRY_CA.parse(env.REGISTRY_CA),
    registryTokenHosts: read.REGISTRY_TOKEN_HOSTS.parse(env.REGISTRY_TOKEN_HOSTS),
    onRegistryAway: read.ON_REGISTRY_AWAY.parse(env.ON_REGISTRY_AWAY),
    onOutsideChange: read.ON_OUTSIDE_CHANGE.parse(env.ON_OUTSIDE_CHANGE),
    policy: read.UPDATE_POLICY.parse(env.UPDATE_POLICY),
    requireApproval: read.REQUIRE_APPROVAL.parse(env.REQUIRE_APPROVAL),
    approvalTimeoutMs: read.APPROVAL_TIMEOUT.parse(env.APPROVAL_TIMEOUT),
    windows: read.DEPLOY_WINDOW.parse(env.DEPLOY_WINDOW),
    approvalOverride: read.APPROVAL_OVERRIDE.parse(env.APPROVAL_OVERRIDE),
  };
}

// ================================================================================================
// 30. upgrade decision — whether and what a push may change, before anything is written, from the push's
//    HookConfig (read once at its boundary, previous chapter); the push is checked against the
//    container's current image (a refusal changes nothing, fails, is logged and recorded as a Warning Event);
//    several replicas agree through the workload: LAST_PUSH_ANNOTATION records when each container's last push was
//    pushed, what it applied and the image before, so decidePush lets the newest push win and recognises a repeat
//    across replicas and restarts (a push time from the future counts as the time received). VERIFY_IMAGE=true
//    resolves the tag on its registry with the login of the workload's first imagePullSecret that names the host, and
//    deploys `repo:tag@<digest>`; a tag the registry lacks or a different digest is refused. What became of a push
//    that changes nothing is written into its report by recordUnchanged. The decision (next chapter) takes the steps
//    in order: the pin, the update policy (policyDecision, its own chapter), the hold, newest wins. A container whose
//    image is not the one the record says webhook last applied was changed outside it: holdDecision
//    (ON_OUTSIDE_CHANGE=hold) reads who and when from managedFields and holds every push not strictly newer than the
//    image replaced (semver precedence, else push time). VERIFY_SIGNATURE (which implies VERIFY_IMAGE) then requires
//    a cosign signature of the resolved digest valid under one of the hook's keys (checkSignature); an unsigned or
//    wrongly signed digest is refused (SignatureRefusal, decided `refused: unsigned`, a Warning Event UpgradeRefused).
//    A registry that does not answer fails the push closed, or under ON_REGISTRY_AWAY=keep has it kept (RegistryAway).
//    Every Event a push writes on its workload is rendered by pushEvent from one table (PUSH_EVENTS: its type, reason
//    and message, from the push's decision and facts); recordEventQuietly records one without failing the push.
//    Exports: decidePush, decisionReason, FollowRecord, FUTURE_PUSH_SKEW_MS, holdDecision, imageFieldPath,
//    IncomingPush, newPushRecord, pullSecretNames, pushEvent, PushRecord, pushTime, readFollowRecords, readPushRecords,
//    recordEventQuietly, recordUnchanged, RegistryAway, SignatureRefusal, verifiedRef, whoAsked, withPushRecord,
//    workloadPodSpec.
//    Tests: test/clouds.test.ts, test/decision.test.ts, test/hold.test.ts, test/records.test.ts,
//    test/registries.test.ts, test/registry-e2e.test.ts, test/replicas.test.ts, test/upgrade.test.ts.
// ================================================================================================

/** One container's last applied push, as recorded in LAST_PUSH_ANNOTATION. */
export interface PushRecord {
  /** When it was pushed (the payload's own time) or, when the payload has none, received: ISO 8601. */
  pushedAt: string;
  timeFrom: 'payload' | 'received';
  /** The image it set (or, for the same image, re-pulled). */
  image: string;
  /** The registry's identity of the push (digest|pushed_at); "|" when the payload has neither. */
  push: string;
  /** The image the container ran before: what a rollback returns to. */
  previous: string;
  appliedAt: string;
  request?: string;
  /** Set once a failed rollout of it was rolled back: why. */
  rolledBack?: string;
}

/** A push as the newest-wins rule sees it. */
export interface IncomingPush {
  pushedAtMs: number;
  timeFrom: 'payload' | 'received';
  image: string;
  push: string;
}

type PushDecision =
  | { kind: 'apply'; replacesFuture?: PushRecord }
  | { kind: 'repeat'; record: PushRecord }
  | { kind: 'superseded'; record: PushRecord };

// A registry's clock may run a little ahead of ours; more than this is a push from the future, which would
// make every real push after it look older ("superseded") until that time came.
export const FUTURE_PUSH_SKEW_MS = 5 * 60_000;

/**
 * When a push was pushed: the payload's time (Docker Hub's epoch seconds; ISO 8601; ACR's
 * "YYYY-MM-DD HH:MM:SS", which names no zone and is read as UTC), else the time it was received.
 * A payload time more than FUTURE_PUSH_SKEW_MS after receipt is replaced by the time received
 * (`future` keeps what the payload said, for the report). Pure.
 */
export function pushTime(
  payloadTime: string,
  receivedAt: Date,
): { ms: number; from: 'payload' | 'received'; future?: number } {
  const text = payloadTime.trim();
  let ms = NaN;
  if (/^\d+(?:\.\d+)?$/.test(text)) {
    const n = Number(text);
    // Epoch seconds until the year 5138; a larger number is already milliseconds.
    ms = n < 1e11 ? n * 1000 : n;
  } else if (/^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:\.\d+)?$/.test(text)) {
    ms = Date.parse(`${text.replace(' ', 'T')}Z`);
  } else if (text !== '') {
    ms = Date.parse(text);
  }
  const received = receivedAt.getTime();
  if (!Number.isFinite(ms) || ms <= 0) return { ms: received, from: 'received' };
  if (ms > received + FUTURE_PUSH_SKEW_MS) return { ms: received, from: 'received', future: ms };
  return { ms, from: 'payload' };
}

/**
 * A per-container JSON annotation of the workload: its text as read (for a patch's test) and the
 * entries that have the string fields named. Pure.
 */
function readContainerAnnotation<T>(
  workload: unknown,
  key: string,
  stringFields: string[],
): { raw: string | undefined; entries: Record<string, T>; dropped: string[] } {
  const raw = valueAt(workload, ['metadata', 'annotations', key]);
  if (typeof raw !== 'string') return { raw: undefined, entries: {}, dropped: [] };
  const entries: Record<string, T> = {};
  const dropped: string[] = [];
  try {
    const parsed: unknown = JSON.parse(raw);
    if (!isObject(parsed)) return { raw, entries, dropped: ['(the annotation is not a JSON object)'] };
    for (const [name, r] of Object.entries(parsed))
      if (isObject(r) && stringFields.every((f) => typeof r[f] === 'string')) entries[name] = r as T;
      else dropped.push(name);
  } catch {
    // Edited by hand into something else: no entries, and a patch's test still guards the value.
    dropped.push('(the annotation is not JSON)');
  }
  return { raw, entries, dropped };
}

/** The workload's last-push records: the annotation as read (for the patch's test) and parsed. */
export function readPushRecords(workload: unknown): { raw: string | undefined; records: Record<string, PushRecord> } {
  const { raw, entries } = readContainerAnnotation<PushRecord>(workload, LAST_PUSH_ANNOTATION, [
    'pushedAt',
    'image',
    'push',
  ]);
  return { raw, records: entries };
}

/**
 * Newest push wins: a push older than the recorded one is superseded; the recorded push itself
 * again is a repeat (a registry's retry). A push whose payload carries neither digest nor time
 * cannot be told from a new push of the same tag, so it counts as a repeat only within
 * UPGRADE_LIMITS.duplicateWindowMs of being applied. Equal times apply in arrival order, and so do
 * a payload's time and a receipt time: a registry's clock or zone (ACR names none) need not agree
 * with ours, and a push must not be held off by another clock's hours. Pure.
 */
export function decidePush(recorded: PushRecord | undefined, push: IncomingPush, nowMs: number): PushDecision {
  if (!recorded) return { kind: 'apply' };
  const samePush = recorded.push === push.push && normalizeImageRef(recorded.image) === normalizeImageRef(push.image);
  const identified = push.push !== '|';
  if (samePush && (identified || nowMs - Date.parse(recorded.appliedAt) < UPGRADE_LIMITS.duplicateWindowMs))
    return { kind: 'repeat', record: recorded };
  // A record from the future (written before FUTURE_PUSH_SKEW_MS was enforced, or by hand) holds
  // nothing off: it is replaced, and the caller says so.
  if (Date.parse(recorded.pushedAt) > nowMs + FUTURE_PUSH_SKEW_MS) return { kind: 'apply', replacesFuture: recorded };
  const comparable = push.timeFrom === (recorded.timeFrom ?? 'payload');
  if (comparable && push.pushedAtMs < Date.parse(recorded.pushedAt)) return { kind: 'superseded', record: recorded };
  return { kind: 'apply' };
}

/** What a replica needs to finish another's follow. */
export interface FollowRecord {
  request: string;
  hook: string;
  /** ISO 8601: when following ends (-rollout-follow after the push was applied). */
  deadline: string;
  /**
   * The hook's MAIL_TO and ROLLBACK_ON_FAILURE when the push was applied. Written for people
   * reading the workload; a replica that resumes the follow takes both from the hook as it is now
   * (anyone who may edit the workload may edit its annotations).
   */
  mailTo?: string;
  rollback?: boolean;
}

/** The workload's follow records; `dropped` names the entries that are not follow records. */
export function readFollowRecords(workload: unknown): {
  raw: string | undefined;
  entries: Record<string, FollowRecord>;
  dropped: string[];
} {
  return readContainerAnnotation<FollowRecord>(workload, FOLLOW_ANNOTATION, ['request', 'hook', 'deadline']);
}

/**
 * Records what became of a push that changed nothing: its decision and its reason (unchanged) and, when the
 * container was read, the image it runs as the image after (a push that was not applied did not
 * become the container's image).
 */
export function recordUnchanged(report: UpgradeReport, decision: DecisionCode, reason: string, running?: string): void {
  Object.assign(report, unchanged(decision, reason));
  if (running !== undefined) report.imageAfter = running;
}

/** Why a push the record holds off changes nothing: superseded by a newer push, or a repeat. Pure. */
export function decisionReason(decision: Exclude<PushDecision, { kind: 'apply' }>, nowMs: number): string {
  const r = decision.record;
  if (decision.kind === 'superseded')
    return `superseded: a newer push, ${r.image} pushed at ${r.pushedAt}, was applied already`;
  const ago = formatGoDuration(roundedToSeconds(nowMs - Date.parse(r.appliedAt)));
  const rolledBack = r.rolledBack ? ' and rolled back' : '';
  return `the same push was applied ${ago} ago${rolledBack}: a repeated notification`;
}

/** The annotation's new value: the records read with this container's replaced. Pure. */
export function withPushRecord(records: Record<string, PushRecord>, container: string, record: PushRecord): string {
  return JSON.stringify({ ...records, [container]: record });
}

// ---- the Events of a push ---------------------------------------------------------------------

/** What an Event of a push is made of: each entry of PUSH_EVENTS picks the facts its message tells. */
interface EventFacts {
  container: string;
  /** The image the push brings (for RolledBack, the image returned to; for a rollout, unused). */
  image: string;
  /** The image the container ran before the push. */
  before: string;
  /** Why, as data: a refusal, a hold's or a rollback's reason, what a push waits for, a rollout's detail. */
  why: string;
  /** Who asked for the push (whoAsked). */
  asked: string;
  /** The hook a waiting push names. */
  hook: string;
  /** A rollout's pods: the first five not ready are named. */
  pods: PodSummary[];
}
type Facts<K extends keyof EventFacts> = Pick<EventFacts, K>;

/** The first pods of a rollout that are not ready, as an Event names them: ` (web-1 ErrImagePull, …)`. Pure. */
function podsNotReady(pods: PodSummary[]): string {
  const stuck = pods.filter((p) => !p.ready).slice(0, 5);
  return stuck.length ? ` (${stuck.map((p) => `${p.name} ${p.reason ?? 'not ready'}`).join(', ')})` : '';
}

/**
 * Every Event a push writes on its workload, by what it tells: its type, its reason and how its message reads from
 * the push's decision and report (pushEvent renders one). Operators and tests read these words: they do not change.
 */
export const PUSH_EVENTS = {
  /** The container's image was changed to the pushed one (decision `applied`). */
  applied: { type: 'Normal', reason: 'ImageUpdated', message: (f: Facts<'container' | 'before' | 'image' | 'asked'>) =>
    `container ${f.container}: image ${f.before} → ${f.image}; asked by ${f.asked}` },
  /** The same image again: its rollout restarted (decision `re-pulled`). */
  're-pulled': { type: 'Normal', reason: 'RolloutRestarted', message: (f: Facts<'container' | 'image' | 'asked'>) =>
    `container ${f.container}: ${f.image} pulled again (same image, rollout restarted); asked by ${f.asked}` },
  /** A change made outside webhook holds the push (decision `held`). */
  held: { type: 'Warning', reason: 'UpgradeHeld', message: (f: Facts<'container' | 'image' | 'why' | 'asked'>) =>
    `container ${f.container}: ${f.image} ${f.why}; asked by ${f.asked}` },
  /** The push waits on the workload for an approval or the change window (`waiting`, `approved`). */
  waiting: { type: 'Normal', reason: 'UpgradeWaiting', message: (f: Facts<'container' | 'image' | 'why' | 'asked'>) =>
    `container ${f.container}: ${f.image} ${f.why}; asked by ${f.asked}` },
  /** The update policy does not take the tag (decision `skipped by policy`). */
  'skipped by policy': { type: 'Normal', reason: 'UpgradeSkipped', message: (f: Facts<'why' | 'asked'>) =>
    `${f.why}; asked by ${f.asked}` },
  /** The image pin or VERIFY_SIGNATURE refused the push (`refused`, `refused: unsigned`). */
  refused: { type: 'Warning', reason: 'UpgradeRefused', message: (f: Facts<'why' | 'asked'>) =>
    `${f.why}; asked by ${f.asked}` },
  /** Not applied: no such container, a malformed policy, an outside change of unknown origin (`failed`). */
  failed: { type: 'Warning', reason: 'UpgradeFailed', message: (f: Facts<'why' | 'asked'>) =>
    `${f.why}; asked by ${f.asked}` },
  /** A waiting push dropped, not deployed: its entry was not written by this service, or its hook no longer fits. */
  dropped: { type: 'Warning', reason: 'UpgradeRefused', message: (f: Facts<'container' | 'image' | 'hook' | 'why'>) =>
    `container ${f.container}: the waiting push of ${showValue(f.image)} (hook ${showValue(f.hook)}) dropped, ` +
    `not deployed: ${f.why}` },
  /** A person rejected the waiting push (decision `rejected`). */
  rejected: { type: 'Normal', reason: 'UpgradeRejected', message: (f: Facts<'container' | 'image' | 'why'>) =>
    `container ${f.container}: ${f.image} not deployed: ${f.why}` },
  /** Nobody decided the waiting push in time (decision `expired`). */
  expired: { type: 'Normal', reason: 'UpgradeExpired', message: (f: Facts<'container' | 'image' | 'why'>) =>
    `container ${f.container}: ${f.image} not deployed: ${f.why}` },
  /** ROLLBACK_ON_FAILURE set a failed rollout back to the image before the push. */
  'rolled back': { type: 'Warning', reason: 'RolledBack',
    message: (f: Facts<'container' | 'image' | 'why' | 'asked'>) =>
      `container ${f.container}: rolled back to ${f.image}: ${f.why}; ${f.asked}` },
  /** The change's rollout completed. */
  'rollout complete': { type: 'Normal', reason: 'RolloutComplete', message: (f: Facts<'container' | 'why'>) =>
    `container ${f.container}: rollout complete: ${f.why}` },
  /** The change's rollout failed. */
  'rollout failed': { type: 'Warning', reason: 'RolloutFailed', message: (f: Facts<'container' | 'why' | 'pods'>) =>
    `container ${f.container}: rollout failed: ${f.why}${podsNotReady(f.pods)}` },
  /** The change's rollout did not complete in the time it was followed. */
  'rollout timed out': { type: 'Warning', reason: 'RolloutTimedOut',
    message: (f: Facts<'container' | 'why' | 'pods'>) =>
      `container ${f.container}: rollout timed out ${f.why}${podsNotReady(f.pods)}` },
} as const;
type PushEventKind = keyof typeof PUSH_EVENTS;

/** The Event of a push, rendered from its facts by PUSH_EVENTS: the one place an Event's words are made. Pure. */
export function pushEvent<K extends PushEventKind>(
  kind: K,
  facts: Parameters<(typeof PUSH_EVENTS)[K]['message']>[0],
): WorkloadEvent {
  const e = PUSH_EVENTS[kind];
  return { type: e.type, reason: e.reason, message: (e.message as (f: typeof facts) => string)(facts) };
}

/**
 * Records a push's Event; one that cannot be recorded is a note on its report, or told to `told` when that is a
 * function (the change stands without it).
 */
async function recordEventQuietly(
  client: KubeClient,
  target: WorkloadTarget,
  event: WorkloadEvent,
  now: Date,
  told: UpgradeReport | ((note: string) => void),
): Promise<string | undefined> {
  try {
    await recordWorkloadEvent(client, target, event, now);
    return undefined;
  } catch (e) {
    // The change stands without its Event; say so rather than fail the upgrade.
    const note = `event not recorded: ${(e as Error).message}`;
    if (typeof told === 'function') told(note);
    else told.notes.push(note);
    return note;
  }
}

// ---- changes made outside the service ---------------------------------------------------------

/**
 * The field managers the tools that change workloads record (who set a field, in managedFields):
 * kubectl's subcommands name themselves; a request that names no manager records its User-Agent's
 * program (kubectl rollout undo and apply --server-side record plain `kubectl`); Helm, Argo CD and
 * Rancher record these. Shown beside the manager in a hold's answer; an unknown manager is shown as it is.
 */
const MANAGER_TOOLS: Record<string, string> = {
  'kubectl-set': 'kubectl set',
  'kubectl-edit': 'kubectl edit',
  'kubectl-patch': 'kubectl patch',
  'kubectl-replace': 'kubectl replace',
  'kubectl-client-side-apply': 'kubectl apply',
  kubectl: 'kubectl rollout undo, apply --server-side or another kubectl call',
  helm: 'Helm',
  'argocd-controller': 'Argo CD',
  rancher: 'Rancher',
};

/** Who last set a container's image, from the managedFields entry that owns it. */
interface ImageWriter {
  manager: string;
  operation: string;
  /** ISO 8601, as the API server recorded it. */
  time: string;
  /** Its index in metadata.managedFields (for messages). */
  index: number;
}

/** What a push meets when the container's image was changed outside the service (holdDecision). */
type HoldDecision =
  | { kind: 'none' }
  | { kind: 'newer'; note: string }
  | { kind: 'held'; reason: string }
  | { kind: 'malformed'; message: string };

/**
 * Semver precedence (semver 2.0.0 §11) of two tags, each with or without a leading `v`; build
 * metadata is ignored. Undefined when either is not a semantic version. Pure.
 */
export function compareSemverTags(a: string, b: string): number | undefined {
  const x = parseVersion(a);
  const y = parseVersion(b);
  return x && y ? compareVersions(x, y) : undefined;
}

/** The managedFields path of a container's image in a workload of this kind (FieldsV1: `f:` fields, `k:` keys). */
export function imageFieldPath(kind: WorkloadKind, list: LocatedContainer['list'], container: string): string[] {
  const fields = [...kindSpec(kind).template, 'spec', list].map((f) => `f:${f}`);
  return [...fields, `k:{"name":${JSON.stringify(container)}}`, 'f:image'];
}

/** Whether a FieldsV1 set holds the path; a `k:` segment matches any key of the same fields. Pure. */
function ownsField(fields: unknown, path: string[]): boolean {
  let at = fields;
  for (const segment of path) {
    if (!isObject(at)) return false;
    const key = segment.startsWith('k:') ? Object.keys(at).find((k) => sameListKey(k, segment)) : segment;
    if (key === undefined || !Object.hasOwn(at, key)) return false;
    at = at[key];
  }
  return true;
}

/** `k:{"name":"app"}` and `k:{ "name": "app" }` name the same list item. Pure. */
function sameListKey(key: string, wanted: string): boolean {
  if (!key.startsWith('k:')) return false;
  try {
    return JSON.stringify(JSON.parse(key.slice(2))) === JSON.stringify(JSON.parse(wanted.slice(2)));
  } catch {
    return false;
  }
}

/**
 * The managedFields entries that own the field at `path`, or what is wrong with managedFields: an
 * entry that owns it must name its manager and the time it set it (the API server writes both). Pure.
 */
export function imageWriters(managedFields: unknown, path: string[]): { writers: ImageWriter[] } | { problem: string } {
  if (managedFields === undefined) return { writers: [] };
  if (!Array.isArray(managedFields)) return { problem: 'metadata.managedFields is not a list' };
  const writers: ImageWriter[] = [];
  for (const [index, entry] of managedFields.entries()) {
    const where = `metadata.managedFields[${index}]`;
    if (!isObject(entry)) return { problem: `${where} is not an object` };
    if (entry.fieldsV1 !== undefined && !isObject(entry.fieldsV1))
      return { problem: `${where}.fieldsV1 is not an object` };
    if (!ownsField(entry.fieldsV1, path)) continue;
    const { manager, operation, time } = entry;
    if (typeof manager !== 'string' || manager === '')
      return { problem: `${where} owns the image but names no manager` };
    const who = `${where} (manager ${JSON.stringify(manager)})`;
    if (typeof time !== 'string') return { problem: `${who} owns the image but records no time` };
    if (!Number.isFinite(Date.parse(time))) return { problem: `${who}.time ${showValue(time)} is not a time` };
    writers.push({ manager, operation: typeof operation === 'string' ? operation : 'Update', time, index });
  }
  return { writers };
}

/** `kubectl-set (kubectl set)`: a manager and, when known, the tool that records it. Pure. */
function describeManager(manager: string): string {
  const tool = Object.hasOwn(MANAGER_TOOLS, manager) ? MANAGER_TOOLS[manager] : undefined;
  return tool ? `${manager} (${tool})` : manager;
}

/** Where the hold looks: the workload and container (for messages) and the image's managedFields path. */
interface HoldTarget {
  workload: string;
  container: string;
  fieldPath: string[];
}

/**
 * ON_OUTSIDE_CHANGE=hold: when the container's image is not the one the service last applied (the
 * record's image, or after a rollback the image it rolled back to), someone else set it, and
 * managedFields say who and when. A push is then applied only when strictly newer than the image
 * replaced (or the image set, when that is the newer version): by semver precedence when both tags
 * are versions, else when pushed after the change. An image last set by the service itself holds
 * nothing. Malformed managedFields, a writer's time from the future, or no writer at all: nothing
 * can be said of the change, and the push is not applied. Pure.
 */
export function holdDecision(
  record: PushRecord | undefined,
  running: string,
  managedFields: unknown,
  push: IncomingPush,
  nowMs: number,
  at: HoldTarget,
): HoldDecision {
  const applied = record && (record.rolledBack ? record.previous : record.image);
  if (applied === undefined || normalizeImageRef(applied) === normalizeImageRef(running)) return { kind: 'none' };
  const found = imageWriters(managedFields, at.fieldPath);
  const malformed = (why: string): HoldDecision => ({
    kind: 'malformed',
    message:
      `${at.workload}: container ${at.container} runs ${running}, not ${applied} as webhook last set it, and ${why}: ` +
      'who changed it outside webhook, and when, is not known, so the push is not applied (ON_OUTSIDE_CHANGE=follow ' +
      'deploys it anyway); nothing was changed',
  });
  if ('problem' in found) return malformed(found.problem);
  if (found.writers.some((w) => w.manager === UPGRADE_LIMITS.fieldManager)) return { kind: 'none' };
  const writer = found.writers.sort((a, b) => Date.parse(a.time) - Date.parse(b.time)).at(-1);
  if (!writer) return malformed('metadata.managedFields names no owner of its image');
  const changedMs = Date.parse(writer.time);
  if (changedMs > nowMs + FUTURE_PUSH_SKEW_MS)
    return malformed(`metadata.managedFields[${writer.index}].time ${writer.time} is in the future`);
  const replacedTag = tagOf(applied) ?? '';
  const newerSet = (compareSemverTags(tagOf(running) ?? '', replacedTag) ?? 0) > 0;
  const threshold = newerSet ? running : applied;
  const byVersion = compareSemverTags(tagOf(push.image) ?? '', tagOf(threshold) ?? '');
  const newer = byVersion === undefined ? push.pushedAtMs > changedMs : byVersion > 0;
  const who = describeManager(writer.manager);
  const change = `${at.workload} was set to ${running} outside webhook by ${who} at ${writer.time}`;
  const pushedAt = new Date(push.pushedAtMs).toISOString();
  if (newer)
    return {
      kind: 'newer',
      note:
        `${change}; ${push.image} ` +
        (byVersion === undefined ? `was pushed after that (${pushedAt})` : `is newer than ${threshold}`) +
        ', so it is applied and ends the hold',
    };
  const only =
    byVersion === undefined
      ? `only a push pushed after that is applied (this one was pushed at ${pushedAt})`
      : `only a push newer than ${threshold} is applied`;
  return { kind: 'held', reason: `held: ${change}; ${only}` };
}

// ---- the upgrade ------------------------------------------------------------------------------

function whoAsked(by: { hookId?: string; requestId?: string }): string {
  const parts = [
    by.hookId ? `hook ${JSON.stringify(by.hookId)}` : '',
    by.requestId ? `request ${by.requestId}` : '',
  ].filter(Boolean);
  return parts.length ? parts.join(', ') : 'an image push';
}

/** The record of a push applied now: LAST_PUSH_ANNOTATION's entry for its container. Pure. */
function newPushRecord(push: IncomingPush, previous: string, nowMs: number, requestId: string | undefined): PushRecord {
  return {
    pushedAt: new Date(push.pushedAtMs).toISOString(),
    timeFrom: push.timeFrom,
    image: push.image,
    push: push.push,
    previous,
    appliedAt: new Date(nowMs).toISOString(),
    ...(requestId ? { request: requestId } : {}),
  };
}

/** "https://reg.example.com/v1/" → "reg.example.com": how docker config files name a registry. */
function dockerConfigHost(key: string): string {
  return stripSchemeAndSlashes(key).split('/')[0].toLowerCase();
}

/** The login a pull secret holds for `host` (.dockerconfigjson or the older .dockercfg), if any. */
function loginFromPullSecret(secret: unknown, host: string, name: string): RegistryLogin | undefined {
  const data = valueAt(secret, ['data']);
  if (!isObject(data)) return undefined;
  const encoded = data['.dockerconfigjson'] ?? data['.dockercfg'];
  if (typeof encoded !== 'string') return undefined;
  let config: unknown;
  try {
    config = JSON.parse(Buffer.from(encoded, 'base64').toString('utf8'));
  } catch {
    return undefined;
  }
  const auths = isObject(config) && isObject(config.auths) ? config.auths : config;
  if (!isObject(auths)) return undefined;
  const entry = Object.entries(auths).find(([key]) => dockerConfigHost(key) === host.toLowerCase())?.[1];
  if (!isObject(entry)) return undefined;
  if (typeof entry.username === 'string' && typeof entry.password === 'string')
    return { user: entry.username, password: entry.password, secret: name };
  if (typeof entry.auth !== 'string') return undefined;
  const decoded = Buffer.from(entry.auth, 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  return colon < 0 ? undefined : { user: decoded.slice(0, colon), password: decoded.slice(colon + 1), secret: name };
}

/** The pod spec of a workload of this kind. */
export function workloadPodSpec(workload: unknown, kind: WorkloadKind): unknown {
  return valueAt(workload, [...kindSpec(kind).template, 'spec']);
}

/** The pull secrets a pod spec names (imagePullSecrets), in order. */
export function pullSecretNames(podSpec: unknown): string[] {
  return asArray(valueAt(podSpec, ['imagePullSecrets']))
    .map((s) => valueAt(s, ['name']))
    .filter((n): n is string => typeof n === 'string' && n !== '');
}

/** The first of the workload's pull secrets that holds a login for `host`. */
async function workloadLogin(
  client: KubeClient,
  namespace: string,
  names: string[],
  host: string,
): Promise<RegistryLogin | undefined> {
  for (const name of names) {
    let secret: unknown;
    try {
      secret = await client.get({ group: '', version: 'v1', resource: 'secrets', namespace, name });
    } catch (e) {
      if (e instanceof KubeError && e.status === 404) continue;
      throw e;
    }
    const login = loginFromPullSecret(secret, host, name);
    if (login) return login;
  }
  return undefined;
}

/**
 * VERIFY_IMAGE: the tag resolved on the registry, and the reference pinned to what it has
 * (`repo:tag@sha256:…`). Only after the image pin allowed the push, so neither a request nor its
 * payload can send the workload's pull secrets to a registry of its choosing; a login is used only
 * for the host its secret names. A tag the registry lacks, or another digest than the payload's, is
 * refused: nothing is written.
 */
async function verifiedRef(
  client: KubeClient,
  s: UpgradeSettings,
  ref: string,
  announced: string | undefined,
  report: UpgradeReport,
  deps: UpgradeDeps,
): Promise<string> {
  const target: WorkloadTarget = { ...s.workload, namespace: s.namespace };
  const podSpec = valueAt(await readWorkload(client, target), [...kindSpec(target.kind).template, 'spec']);
  const located = locateContainer(podSpec, s.container);
  // The upgrade refuses these with its own messages, before anything is asked of the registry.
  if (!located || !checkImagePin(s.container, located.image, ref, s.pin).allowed) return ref;
  const parsed = validateImageRef(ref);
  if (!parsed.ok) return ref;
  const { domain, path: repository, tag } = parsed.ref;
  const digest = parsed.ref.digest ?? announced;
  const host = domain === undefined || registryOf(domain) === 'docker.io' ? 'registry-1.docker.io' : domain;
  const loginFor = () => workloadLogin(client, s.namespace, pullSecretNames(podSpec), host);
  const signed = { client, s, report, deps, host, repository, loginFor };
  if (tag === undefined) {
    // A push by digest alone deploys that digest: only its signature is left to check.
    if (s.signature) await checkSignature(signed, digest);
    return ref;
  }
  const where = `${host}/${repository}:${tag}`;
  let resolved: string | undefined;
  let login: RegistryLogin | undefined;
  try {
    ({ digest: resolved, login } = await resolveManifestTag(
      host,
      repository,
      tag,
      loginFor,
      s.registryCa,
      s.registryTokenHosts,
    ));
  } catch (e) {
    const message = `VERIFY_IMAGE: could not resolve ${where}: ${(e as Error).message}`;
    throw registryFailure(s, e, `${message}; nothing was changed`);
  }
  if (resolved === undefined)
    throw new UpgradeError(
      `VERIFY_IMAGE: the registry has no tag ${showValue(tag)} in ${host}/${repository}; nothing was changed`,
    );
  if (digest !== undefined && digest !== resolved)
    throw new UpgradeError(
      `VERIFY_IMAGE: the payload announced ${digest} but the registry's ${where} is ${resolved}; nothing was changed`,
    );
  report.notes.push(
    `VERIFY_IMAGE: ${where} is ${resolved} on the registry` +
      (login ? ` (login from pull secret "${login.secret}")` : ''),
  );
  if (s.signature) await checkSignature(signed, resolved);
  return `${ref.split('@')[0]}@${resolved}`;
}

/** A push VERIFY_SIGNATURE refused (unsigned, or not signed as required): its decision is `refused: unsigned`. */
export class SignatureRefusal extends UpgradeError {}

/** A push whose registry did not answer (registryAway) under ON_REGISTRY_AWAY=keep: kept, and tried again. */
export class RegistryAway extends UpgradeError {}

/**
 * A registry call's failure as the push's: RegistryAway when the registry is away and the hook keeps
 * such pushes; otherwise the push fails closed, nothing written.
 */
function registryFailure(s: UpgradeSettings, e: unknown, message: string): UpgradeError {
  return registryAway(e) && s.onRegistryAway === 'keep' ? new RegistryAway(message) : new UpgradeError(message);
}

/** Where checkSignature looks, and what it reports to. */
interface SignatureCheck {
  client: KubeClient;
  s: UpgradeSettings;
  report: UpgradeReport;
  deps: UpgradeDeps;
  host: string;
  repository: string;
  loginFor: () => Promise<RegistryLogin | undefined>;
}

/**
 * VERIFY_SIGNATURE: the digest about to be deployed must carry a cosign signature, found on its
 * registry (readCosignSignatures), valid under one of the hook's keys, naming that digest and its
 * repository and carrying the annotations required (verifyCosignSignatures). An unsigned or wrongly
 * signed digest is refused (SignatureRefusal) and recorded as a Warning Event UpgradeRefused; a
 * registry whose signatures cannot be read fails closed. Nothing is written either way.
 */
async function checkSignature(c: SignatureCheck, digest: string | undefined): Promise<void> {
  const now = c.deps.now ?? (() => new Date());
  const image = `${c.host}/${c.repository}@${digest ?? '(no digest)'}`;
  const keys = c.s.signature!.keys;
  const registry = { host: c.host, repository: c.repository, ca: c.s.registryCa, tokenHosts: c.s.registryTokenHosts };
  let problem: string;
  if (digest === undefined) problem = 'the push names no digest, and without one no signature can be checked';
  else {
    const want = { digest, repository: `${c.host}/${c.repository}`, keys, annotations: c.s.signature!.annotations };
    let verdict: SignatureVerdict;
    try {
      verdict = await readCosignSignatures(registry, want, c.loginFor);
    } catch (e) {
      const message = `signature: could not read the signatures of ${image}: ${(e as Error).message}`;
      throw registryFailure(c.s, e, `${message}; nothing was changed`);
    }
    if (verdict.ok) {
      c.report.notes.push(
        `signature: ${image} is signed by ${verdict.key.kind} key ${verdict.key.fingerprint} (${verdict.where})`,
      );
      return;
    }
    problem = verdict.problem;
  }
  const message = `signature: ${image} is not signed as VERIFY_SIGNATURE requires: ${problem}`;
  c.report.refused = true;
  const target: WorkloadTarget = { ...c.s.workload, namespace: c.s.namespace };
  const event = pushEvent('refused', { why: message, asked: whoAsked(c.deps) });
  await recordEventQuietly(c.client, target, event, now(), c.report);
  throw new SignatureRefusal(`${message}; nothing was changed`);
}

// ================================================================================================
// 31. the decision — what one push does to one workload, decided by one pure function: decide(push, its hook's
//    settings, the workload as read, now) → Decision, a value from the closed list (DECISIONS) carrying its reason
//    as data and, for what is written, the planned change, its Event and the pending entry. The registry's facts
//    (the digest a tag resolves to, a signature) are established before it (previous chapter) and arrive in the
//    push's image. The steps, each a pure function that decides or lets the push on: the image pin, the update
//    policy (policyDecision), a digest already running, a change made outside webhook (holdDecision, under
//    ON_OUTSIDE_CHANGE=hold), newest wins (decidePush, over LAST_PUSH_ANNOTATION), then the waiting step: a push
//    that needs an approval (REQUIRE_APPROVAL, annotation webhook/approval) or comes outside its change window
//    (DEPLOY_WINDOW, annotation webhook/window) waits on the workload (PENDING_ANNOTATION, sealed with the approval
//    key), with the links that decide it; a newer push replaces a waiting one, an older one is superseded by it; a
//    decided push completes only the entry it names. What passes every step is applied: one JSON patch
//    (fieldManager=webhook) that tests the container's name and current image, so a concurrent edit fails it
//    instead of being overwritten; a different image replaces only that container's image, the same image restarts
//    the rollout as `kubectl rollout restart` does (plus imagePullPolicy: Always), and the same patch sets
//    kubernetes.io/change-cause, the push record and, when the service follows the rollout after answering, the
//    follow record, each under a `test` of the value read. A copy of the workload kept from an earlier push is just
//    another workload as read: the executor (next chapter) decides which decisions it takes on one.
//    Exports: decide, Decision, DecisionInput, futureTimeNote, PendingGone, Push, waitingAction.
//    Tests: test/decision.test.ts, test/e2e.test.ts, test/records.test.ts, test/replicas.test.ts,
//    test/upgrade.test.ts.
// ================================================================================================

/**
 * One push, as each source of pushes builds it at its boundary (a registry's notification over HTTP or as its own
 * process, an approval's decision, a replay from the page, a kept push tried again): the image it brings and when it
 * was pushed (IncomingPush, what newest wins compares), the workload it is for, and who asked.
 */
export interface Push extends IncomingPush {
  target: WorkloadTarget;
  /** The kubeconfig context the workload is in (undefined: the service's default). */
  cluster: string | undefined;
  /** The request that brought the push and the hook it came through: its records and Events name them. */
  requestId?: string;
  hookId?: string;
  /** A waiting push decided, or a past push deployed again: the entry it completes and who decided. */
  decided?: UpgradeDeps['decided'];
}

/** Everything the decision of one push on one workload depends on: a value, so that deciding is pure. */
export interface DecisionInput {
  push: Push;
  /** The hook's settings, read once at the push's boundary. */
  config: UpgradeSettings;
  /** The workload as read, or the copy last seen of it. */
  workload: K8sObject;
  nowMs: number;
  /** What signs a waiting push's links, and where the service follows a rollout after answering. */
  approvals?: UpgradeDeps['approvals'];
  followAfter?: UpgradeDeps['followAfter'];
  /** The id a pending entry written now gets (the caller draws it: decide itself draws nothing). */
  entryId: string;
}

/** What every decision carries: the notes its answer adds, the image the container runs, a waiting push replaced. */
interface DecidedFacts {
  notes: string[];
  /** The container's image as read (undefined when there is no such container). */
  before?: string;
  /** The push that waited on this container and that this one replaces (it is reported superseded). */
  replaced?: PendingEntry;
}

/**
 * What becomes of one push on one workload: a code of the closed list (DECISIONS), its reason as data, and what
 * the executor writes for it. `refused` and `failed` write nothing but their Event, and fail the push.
 */
export type Decision = DecidedFacts &
  (
    | {
        code: 'applied' | 're-pulled';
        before: string;
        container: LocatedContainer;
        /** The patch planned: image or restart, change-cause, and the annotations written under a test. */
        change: PlannedChange;
        lastPush: string;
        followRecorded: boolean;
        event: WorkloadEvent;
      }
    | {
        code: 'waiting' | 'approved';
        reason: string;
        entry: PendingEntry;
        links?: ApprovalLinks;
        /** PENDING_ANNOTATION's new text, and its text as read (the patch's test). */
        pending: { value: string; read: string | undefined };
        event: WorkloadEvent;
      }
    | { code: 'held' | 'skipped by policy'; reason: string; event: WorkloadEvent }
    | { code: 'no-op' | 'repeat' | 'superseded'; reason: string }
    | { code: 'refused' | 'failed'; reason: string; event?: WorkloadEvent; gone?: boolean }
  );

/** A decided push whose pending entry is no longer on the workload: decided already, replaced or expired. */
export class PendingGone extends UpgradeError {}

/**
 * The decision of one push on one workload, step by step: the pin, the update policy, a digest already running, a
 * change made outside webhook, newest wins, the waiting step; what passes them all is applied. Pure.
 */
export function decide(input: DecisionInput): Decision {
  const notes: string[] = [];
  const container = pinStep(input, notes);
  if ('code' in container) return container;
  const facts: DecidedFacts = { notes, before: container.image };
  const decided =
    policyStep(input, facts) ??
    sameDigestStep(input, facts) ??
    holdStep(input, facts) ??
    newestStep(input, facts) ??
    waitStep(input, facts);
  return 'code' in decided ? decided : applyStep(input, container, facts, decided);
}

/** `deployment/web`: the workload as messages name it. */
function workloadName(t: WorkloadTarget): string {
  return `${t.kind}/${t.name}`;
}

/** The container the push is for, when the image pin lets the push there; else the decision refusing it. Pure. */
function pinStep(input: DecisionInput, notes: string[]): LocatedContainer | Decision {
  const { config: s, push } = input;
  const target = push.target;
  const podSpec = workloadPodSpec(input.workload, target.kind);
  const located = locateContainer(podSpec, s.container);
  const asked = whoAsked(input.push);
  if (!located) {
    const reason = missingContainerMessage(podSpec, s.container, workloadName(target));
    return { code: 'failed', reason, notes, event: pushEvent('failed', { why: reason, asked }) };
  }
  const pin = checkImagePin(s.container, located.image, push.image, s.pin);
  if (!pin.allowed) {
    const event = pushEvent('refused', { why: pin.message, asked });
    return { code: 'refused', reason: pin.message, notes, before: located.image, event };
  }
  if (pin.note !== undefined) notes.push(pin.note);
  return located;
}

/** A tag the update policy does not take: skipped, with an Event; a malformed policy annotation fails. Pure. */
function policyStep(input: DecisionInput, facts: DecidedFacts): Decision | undefined {
  const { config: s, push } = input;
  const name = workloadName(input.push.target);
  const verdict = policyDecision(s.policy, input.workload, s.container, facts.before!, push.image, name);
  if (verdict.kind === 'allowed') return undefined;
  const asked = whoAsked(input.push);
  const event = pushEvent(verdict.kind === 'skipped' ? 'skipped by policy' : 'failed', { why: verdict.message, asked });
  if (verdict.kind === 'skipped') return { ...facts, code: 'skipped by policy', reason: verdict.message, event };
  return { ...facts, code: 'failed', reason: `${verdict.message}; nothing was changed`, event };
}

/** A push by digest of the digest the container runs changes nothing. Pure. */
function sameDigestStep(input: DecisionInput, facts: DecidedFacts): Decision | undefined {
  const ref = input.push.image;
  if (!ref.includes('@') || normalizeImageRef(facts.before!) !== normalizeImageRef(ref)) return undefined;
  return { ...facts, code: 'no-op', reason: 'already running this digest' };
}

/**
 * The hold step (holdDecision, under ON_OUTSIDE_CHANGE=hold): a change made outside webhook holds the push off,
 * with an UpgradeHeld Event; managedFields that cannot say who changed the image fail the push. Pure.
 */
function holdStep(input: DecisionInput, facts: DecidedFacts): Decision | undefined {
  const { config: s, workload, push } = input;
  const target = push.target;
  if (s.onOutsideChange === 'follow') return undefined;
  const podSpec = workloadPodSpec(workload, target.kind);
  const at = {
    workload: workloadName(target),
    container: s.container,
    fieldPath: imageFieldPath(target.kind, locateContainer(podSpec, s.container)!.list, s.container),
  };
  const record = readPushRecords(workload).records[s.container];
  const managed = valueAt(workload, ['metadata', 'managedFields']);
  const hold = holdDecision(record, facts.before!, managed, push, input.nowMs, at);
  const asked = whoAsked(input.push);
  switch (hold.kind) {
    case 'none':
      return undefined;
    case 'newer':
      facts.notes.push(hold.note);
      return undefined;
    case 'malformed': {
      const event = pushEvent('failed', { why: hold.message, asked });
      return { ...facts, code: 'failed', reason: hold.message, event };
    }
    case 'held': {
      const event = pushEvent('held', { container: s.container, image: push.image, why: hold.reason, asked });
      return { ...facts, code: 'held', reason: hold.reason, event };
    }
  }
}

/** Newest wins (decidePush): a push older than the one recorded is superseded, the same one a repeat. Pure. */
function newestStep(input: DecisionInput, facts: DecidedFacts): Decision | undefined {
  const record = readPushRecords(input.workload).records[input.config.container];
  const newest = decidePush(record, input.push, input.nowMs);
  if (newest.kind !== 'apply') return { ...facts, code: newest.kind, reason: decisionReason(newest, input.nowMs) };
  const future = newest.replacesFuture;
  if (future) facts.notes.push(futureTimeNote('record', Date.parse(future.pushedAt), input.nowMs, future.image));
  return undefined;
}

/** What the waiting step lets through: the pending entries the patch writes back, and the waiting push replaced. */
interface WaitPassed {
  guarded: PlannedChange['guarded'];
  replaced?: PendingEntry;
}

/**
 * The waiting step, after newest wins and before the patch: a push that needs an approval, or comes outside the
 * change window, waits on the workload (a pending entry, sealed where it sits, so any replica completes it) with
 * the links that decide it. A newer push replaces a waiting one; an older one (or the same again) is superseded (or
 * a repeat). A decided push completes only the entry it names, which the patch takes off, so a second use finds
 * nothing. An entry whose MAC does not verify where it sits counts as none. Pure.
 */
function waitStep(input: DecisionInput, facts: DecidedFacts): Decision | WaitPassed {
  const { config: s, workload, nowMs } = input;
  const { raw, entries } = readPendingEntries(workload);
  const place = { ...input.push.target, cluster: input.push.cluster, container: s.container };
  const found = entries[s.container];
  const key = input.approvals?.key;
  const queued = found && pendingEntrySealed(key, place, found) ? found : undefined;
  const d = input.push.decided;
  // The decision of a waiting entry; a replay completes none and waits as a new push does.
  const decided = d?.id !== undefined ? d : undefined;
  const failed = (reason: string, gone?: boolean): Decision => ({ ...facts, code: 'failed', reason, gone });
  if (decided && queued?.id !== decided.id)
    return failed(
      'the waiting push was decided already, replaced by a newer push or expired; nothing was changed',
      true,
    );
  let needs: WaitNeeds;
  try {
    needs = waitNeeds(workload, s, d, queued, nowMs);
  } catch (e) {
    return failed((e as Error).message);
  }
  const replaced = queued && !decided ? queued : undefined;
  const rest = JSON.stringify(Object.fromEntries(Object.entries(entries).filter(([c]) => c !== s.container)));
  if (!needs.approval && !needs.closed) {
    if (d) facts.notes.push(decidedNote(d, nowMs));
    if (replaced) facts.notes.push(supersededNote(replaced));
    return { guarded: found ? { [PENDING_ANNOTATION]: { value: rest, read: raw } } : {}, replaced };
  }
  if (replaced) {
    const older = olderThanWaiting(replaced, input.push, facts);
    if (older) return older;
  }
  const entry = sealPendingEntry(key, place, pendingEntry(input, needs, decided, queued));
  const links = entryLinks(entry, place, s, needs, input.approvals);
  if (typeof links === 'string') return failed(links);
  if (replaced) facts.notes.push(supersededNote(replaced));
  if (d && !decided) facts.notes.push(`asked to deploy again by ${d.by} at ${new Date(nowMs).toISOString()}`);
  const reason = waitingAction(entry);
  const pending = { value: JSON.stringify({ ...JSON.parse(rest), [s.container]: entry }), read: raw };
  const told = { container: s.container, image: input.push.image, why: reason, asked: whoAsked(input.push) };
  const event = pushEvent('waiting', told);
  const code = entry.approvedBy !== undefined ? 'approved' : 'waiting';
  return { ...facts, code, reason, entry, ...(links ? { links } : {}), pending, replaced, event };
}

/** What passes every step: the patch that sets the image (or restarts the rollout) and records the push. Pure. */
function applyStep(input: DecisionInput, container: LocatedContainer, facts: DecidedFacts, wait: WaitPassed): Decision {
  const { config: s, workload, push, nowMs } = input;
  const before = container.image;
  const { raw, records } = readPushRecords(workload);
  const sameImage = normalizeImageRef(before) === normalizeImageRef(push.image);
  const lastPush = withPushRecord(records, s.container, newPushRecord(push, before, nowMs, push.requestId));
  const follow = followToRecord(input);
  const guarded = { [LAST_PUSH_ANNOTATION]: { value: lastPush, read: raw }, ...wait.guarded, ...follow };
  const change = { ...plannedChange(input, sameImage), guarded };
  const code = sameImage ? 're-pulled' : 'applied';
  const told = { container: s.container, before, image: push.image, asked: whoAsked(input.push) };
  const event = pushEvent(code, told);
  const followRecorded = FOLLOW_ANNOTATION in follow;
  return { ...facts, code, before, container, change, lastPush, followRecorded, event, replaced: wait.replaced };
}

/** The change a push makes: the new image, or for the same image a restart that pulls it again. Pure. */
function plannedChange(input: DecisionInput, sameImage: boolean): PlannedChange {
  const { config: s, push } = input;
  const asked = whoAsked(input.push);
  if (!sameImage)
    return { image: push.image, changeCause: `webhook: set ${s.container} image to ${push.image} (${asked})` };
  return {
    pullAlways: true,
    // A CronJob has no rollout to restart: Always makes its next run pull the tag again.
    restartedAt: kindSpec(push.target.kind).hasRollout
      ? new Date(input.nowMs).toISOString().replace(/\.\d{3}Z$/, 'Z')
      : undefined,
    changeCause: `webhook: restart ${s.container} to re-pull ${push.image} (${asked})`,
  };
}

/** The follow record this change's PATCH writes, when the service follows the rollout after answering. Pure. */
function followToRecord(input: DecisionInput): Record<string, { value: string; read: string | undefined }> {
  const { config: s, followAfter: after } = input;
  if (!after || s.rolloutTimeoutMs !== 0 || !kindSpec(s.workload.kind).hasRollout) return {};
  const { raw, entries } = readFollowRecords(input.workload);
  const record: FollowRecord = {
    request: input.push.requestId ?? '',
    hook: input.push.hookId ?? '',
    deadline: new Date(input.nowMs + after.followMs).toISOString(),
    ...(after.mailTo?.trim() ? { mailTo: after.mailTo.trim() } : {}),
    ...(s.rollbackOnFailure ? { rollback: true } : {}),
  };
  return { [FOLLOW_ANNOTATION]: { value: JSON.stringify({ ...entries, [s.container]: record }), read: raw } };
}

/** The report's note for a push time or record from the future (FUTURE_PUSH_SKEW_MS). Pure. */
export function futureTimeNote(kind: 'payload' | 'record', futureMs: number, nowMs: number, image?: string): string {
  const skew = formatGoDuration(FUTURE_PUSH_SKEW_MS);
  const when = new Date(futureMs).toISOString();
  const ahead = formatGoDuration(roundedToSeconds(futureMs - nowMs));
  return kind === 'payload'
    ? `the payload's push time ${when} is ${ahead} after it was received (more than ${skew} ahead): ` +
        'the time received is recorded instead'
    : `the recorded push (${image}, pushed at ${when}) is ${ahead} in the future (more than ${skew} ahead): ` +
        'it holds no push off and is replaced';
}

// ---- the waiting step's parts ------------------------------------------------------------------

/** What a push waits for before the patch, or nothing: the hook's settings with the workload's annotations. */
interface WaitNeeds {
  approval: boolean;
  windows: DeployWindow[] | undefined;
  /** The window is closed now (and no "deploy now" overrides it). */
  closed: boolean;
}
/**
 * The wait a push meets on this workload now; a malformed annotation throws, naming it. A person's decision (or the
 * admin's replay) clears the approval; a window's opening clears it only for the entry a person approved before.
 */
function waitNeeds(
  workload: K8sObject,
  s: UpgradeSettings,
  decided: UpgradeDeps['decided'],
  queued: PendingEntry | undefined,
  nowMs: number,
): WaitNeeds {
  const annotations = valueAt(workload, ['metadata', 'annotations']);
  const asked = isObject(annotations) ? annotations[APPROVAL_ANNOTATION] : undefined;
  if (asked !== undefined && asked !== 'required' && asked !== 'none')
    throw new UpgradeError(`annotation ${APPROVAL_ANNOTATION} ${showValue(String(asked))} is not "required" or "none"`);
  const windowText = isObject(annotations) ? annotations[WINDOW_ANNOTATION] : undefined;
  const windows =
    typeof windowText === 'string' ? deployWindowSetting(`annotation ${WINDOW_ANNOTATION}`, windowText) : s.windows;
  // A replay ("Deploy again") is a new push, asked for by the admin: it needs an approval like one.
  const replay = decided?.action === 'replay';
  const approvedBefore =
    decided !== undefined && !replay && (decided.action !== 'window' || queued?.approvedBy !== undefined);
  const approval = (asked === 'required' || (asked === undefined && s.requireApproval)) && !approvedBefore;
  const closed = windows !== undefined && decided?.action !== 'deploy-now' && !windowOpen(windows, nowMs);
  return { approval, windows, closed };
}


/** Who decided a push, and when: `approved by Li Lei (10.0.3.7, by link) at 2026-…`. Pure. */
function decidedNote(d: NonNullable<UpgradeDeps['decided']>, nowMs: number): string {
  const verb = d.action === 'replay' ? 'deployed again' : d.action === 'window' ? 'applied' : 'approved';
  return `${verb} by ${d.by} at ${new Date(nowMs).toISOString()}`;
}

/** The report's note for a waiting push that another one replaces. Pure. */
function supersededNote(queued: PendingEntry): string {
  return `the waiting push of ${queued.image} (request ${queued.request}, pushed at ${queued.pushedAt}) is superseded`;
}

/** A push older than (or the same as) the one waiting: superseded (or a repeat), nothing written. Pure. */
function olderThanWaiting(queued: PendingEntry, push: IncomingPush, facts: DecidedFacts): Decision | undefined {
  const same =
    queued.push === push.push && push.push !== '|' && normalizeImageRef(queued.image) === normalizeImageRef(push.image);
  if (same) return { ...facts, code: 'repeat', reason: `the same push is waiting already: ${waitingAction(queued)}` };
  if (queued.timeFrom !== push.timeFrom || push.pushedAtMs >= Date.parse(queued.pushedAt)) return undefined;
  const reason = `superseded: a newer push, ${queued.image} pushed at ${queued.pushedAt}, is waiting`;
  return { ...facts, code: 'superseded', reason };
}

/** The entry a waiting push leaves; `d`, the decision of the entry it completes (not a replay's). Pure. */
function pendingEntry(
  input: DecisionInput,
  needs: WaitNeeds,
  d: Push['decided'],
  queued: PendingEntry | undefined,
): PendingEntry {
  const { config: s, push, nowMs } = input;
  // A window's opening approves nothing: only the approval a person gave the entry before carries over.
  const approvedBy = d && d.action !== 'window' ? d.by : d ? queued?.approvedBy : undefined;
  const opensAt = needs.closed ? nextOpening(needs.windows!, nowMs) : undefined;
  const waitsFor = needs.approval ? (needs.closed ? 'approval and window' : 'approval') : 'window';
  const untilMs = (waitsFor === 'window' && opensAt !== undefined ? opensAt : nowMs) + s.approvalTimeoutMs;
  const iso = (ms: number) => new Date(ms).toISOString();
  return {
    id: input.entryId,
    hook: push.hookId ?? '',
    request: push.requestId ?? '',
    image: push.image,
    push: push.push,
    pushedAt: iso(push.pushedAtMs),
    timeFrom: push.timeFrom,
    receivedAt: iso(nowMs),
    waitsFor,
    ...(needs.windows ? { window: describeWindows(needs.windows) } : {}),
    ...(opensAt !== undefined && Number.isFinite(opensAt) ? { opensAt: iso(opensAt) } : {}),
    until: iso(untilMs),
    decides: needs.approval
      ? 'whoever opens its links, or the admin token on the deliveries page'
      : 'the change window',
    ...(s.approvalOverride ? { override: true } : {}),
    ...(approvedBy !== undefined ? { approvedBy } : {}),
  };
}

/**
 * The links of a waiting entry, when a person may decide it; for a push that needs an approval while the service
 * has no -public-url, the reason it cannot wait. Pure.
 */
function entryLinks(
  entry: PendingEntry,
  target: WorkloadTarget & { cluster: string | undefined },
  s: UpgradeSettings,
  needs: WaitNeeds,
  a: UpgradeDeps['approvals'],
): ApprovalLinks | undefined | string {
  if (needs.approval && !a)
    return (
      'the push needs an approval, but the service was started without -public-url and -approval-key-file; ' +
      'nothing was changed'
    );
  if (!a || (!needs.approval && !(s.approvalOverride && needs.closed))) return undefined;
  const claims = {
    ...{ namespace: target.namespace, kind: target.kind, name: target.name, container: s.container },
    // The cluster whose workload holds the entry: the link reads and decides it there.
    ...(target.cluster !== undefined ? { cluster: target.cluster } : {}),
  };
  const links = approvalLinks(
    a.publicUrl,
    a.key,
    { ...claims, id: entry.id, hook: entry.hook, image: entry.image, exp: Date.parse(entry.until) },
    s.approvalOverride && needs.closed,
  );
  // Waiting for the window only: "deploy now" and reject are the choices.
  return needs.approval ? links : { ...links, approve: links.deployNow! };
}

/** The action of a waiting push: `waiting for approval until <time>` or `waiting for the change window …`. Pure. */
export function waitingAction(e: PendingEntry): string {
  const window = `the change window ${e.window}, opens ${e.opensAt ?? 'never within 8 days'}`;
  if (e.waitsFor === 'window')
    return e.approvedBy ? `approved by ${e.approvedBy}; waiting for ${window}` : `waiting for ${window}`;
  if (e.waitsFor === 'approval') return `waiting for approval until ${e.until}`;
  return `waiting for approval until ${e.until}, then for ${window}`;
}

// ================================================================================================
// 32. the cluster executor — carries out what decide (previous chapter) concluded, on the workload in its cluster,
//    and writes it into the push's report (recordDecision, the one place a decision reaches a report): the guarded
//    PATCH of an applied push, the pending entry of a waiting one, the Event of each. A PATCH whose `test` fails
//    (the workload changed since it was read) has the workload read again and the push decided again on it, up to
//    UPGRADE_LIMITS.maxPatchAttempts times. A copy of the workload kept from an earlier push (KnownWorkloads) saves
//    the read that would precede every PATCH: only a plain apply is carried out on it, its patch also testing the
//    annotations the decision read (policy, approval, window); any other decision is reached again on the workload
//    as it is now. Another way to carry a decision out (a commit to Git) is an executor beside this one.
//    Exports: carryOut.
//    Tests: test/e2e.test.ts, test/records.test.ts, test/replicas.test.ts, test/upgrade.test.ts.
// ================================================================================================

/** A push as the executor is given it: its decision's input, but for what each attempt reads and draws. */
type PushToCarryOut = Omit<DecisionInput, 'workload' | 'nowMs' | 'entryId'>;

/**
 * Decides the push on its workload and carries the decision out; a conflict has the workload read and the push
 * decided again. The workload as the PATCH returned it, or undefined when nothing was changed; a refused or failed
 * push throws (its Event recorded), nothing written.
 */
export async function carryOut(
  client: KubeClient,
  given: PushToCarryOut,
  report: UpgradeReport,
  deps: UpgradeDeps,
): Promise<K8sObject | undefined> {
  const target = given.push.target;
  const key = `${target.namespace}/${target.kind}/${target.name}`;
  const now = deps.now ?? (() => new Date());
  let copy = deps.known?.get(key);
  for (let reads = 0; ; ) {
    const workload = copy ?? (await readWorkload(client, target));
    if (!copy) reads++;
    const decision = decide({ ...given, workload, nowMs: now().getTime(), entryId: randomUUID() });
    // A copy may be stale: anything but a plain apply is decided again on the workload as it is now.
    const onCopy = copy !== undefined;
    copy = undefined;
    if (onCopy && !plainApply(decision, given)) continue;
    const done = await execute(client, { ...given, workload }, decision, report, deps, onCopy);
    if (done !== 'conflict') {
      deps.known?.set(key, done);
      return done;
    }
    if (!onCopy && reads >= UPGRADE_LIMITS.maxPatchAttempts) {
      const what = describeResource(workloadResource(target));
      throw new UpgradeError(`${what} kept changing while it was patched (${reads} attempts); try again`);
    }
  }
}

/** An apply that completes no pending entry and takes none off: the only decision carried out on a copy. Pure. */
function plainApply(d: Decision, push: PushToCarryOut): boolean {
  if (d.code !== 'applied' && d.code !== 're-pulled') return false;
  return push.push.decided?.id === undefined && !(PENDING_ANNOTATION in (d.change.guarded ?? {}));
}

/**
 * Workload annotations as read, null when absent. A patch decided on a copy tests the ones its decision was made on
 * (the policy's, the approval's and the window's), since the copy may predate an annotation set since. Pure.
 */
function decisionAnnotations(workload: K8sObject, container: string): Record<string, string | null> {
  const keys = [POLICY_ANNOTATION, `${POLICY_ANNOTATION}.${container}`, APPROVAL_ANNOTATION, WINDOW_ANNOTATION];
  const read = (key: string) => {
    const value = valueAt(workload, ['metadata', 'annotations', key]);
    return typeof value === 'string' ? value : null;
  };
  return Object.fromEntries(keys.map((key) => [key, read(key)]));
}

/** One decision carried out on the workload it was made on: what the PATCH returned, or 'conflict'. */
async function execute(
  client: KubeClient,
  on: PushToCarryOut & { workload: K8sObject },
  d: Decision,
  report: UpgradeReport,
  deps: UpgradeDeps,
  onCopy: boolean,
): Promise<K8sObject | undefined | 'conflict'> {
  const { workload } = on;
  const target = on.push.target;
  report.target = Object.assign(target, { uid: String(valueAt(workload, ['metadata', 'uid'])) });
  const now = (deps.now ?? (() => new Date()))();
  if (d.code === 'applied' || d.code === 're-pulled') {
    if (deps.abandon?.aborted) {
      recordUnchanged(report, 'superseded', KEPT_SUPERSEDED, d.before);
      return undefined;
    }
    const tested = onCopy ? decisionAnnotations(workload, on.config.container) : undefined;
    const ops = planPatch(workload, target.kind, on.config.container, d.container, { ...d.change, tested });
    const updated = await guardedPatch(client, target, ops, onCopy);
    if (updated === 'conflict') return updated;
    recordDecision(report, d, target.kind);
    const recording = recordEventQuietly(client, target, d.event, now, report);
    if (deps.eventAfterAnswer) report.afterAnswer = recording;
    else await recording;
    return updated;
  }
  if (d.code === 'waiting' || d.code === 'approved') {
    const written = { [PENDING_ANNOTATION]: d.pending.value };
    const ops = annotationOps(workload, ['metadata'], written, { [PENDING_ANNOTATION]: d.pending.read ?? null });
    if ((await guardedPatch(client, target, ops, false)) === 'conflict') return 'conflict';
  }
  if ('event' in d && d.event) await recordEventQuietly(client, target, d.event, now, report);
  recordDecision(report, d, target.kind);
  if (d.code === 'refused' || d.code === 'failed')
    throw d.gone ? new PendingGone(d.reason) : new UpgradeError(d.reason);
  return undefined;
}

/**
 * A PATCH under its tests: what it returned, or 'conflict' when a test failed (a 422 without field causes: the
 * workload changed since it was read; on a copy, any 422).
 */
async function guardedPatch(
  client: KubeClient,
  target: WorkloadTarget,
  ops: JsonPatchOperation[],
  onCopy: boolean,
): Promise<K8sObject | 'conflict'> {
  try {
    return await client.patch<K8sObject>(workloadResource(target), ops, UPGRADE_LIMITS.fieldManager);
  } catch (e) {
    if (e instanceof KubeError && e.status === 422 && (onCopy || e.causes.length === 0)) return 'conflict';
    throw e;
  }
}

/**
 * Writes a decision into the push's report: its code and reason, the image the container runs, its notes, what
 * was written. A refusal or failure leaves the decision to the failure it is thrown as (failedUpgrade).
 */
function recordDecision(report: UpgradeReport, d: Decision, kind: WorkloadKind): void {
  for (const note of d.notes) if (!report.notes.includes(note)) report.notes.push(note);
  if (d.before !== undefined) report.imageBefore = d.before;
  if (d.replaced) report.replaced = d.replaced;
  switch (d.code) {
    case 'applied':
    case 're-pulled':
      report.decision = d.code;
      report.action = d.code === 're-pulled' ? kindSpec(kind).sameImageAction : 'image updated';
      Object.assign(report, { changed: true, lastPush: d.lastPush, followRecorded: d.followRecorded });
      return;
    case 'refused':
    case 'failed':
      if (d.code === 'refused') report.refused = true;
      return;
    case 'waiting':
    case 'approved':
      report.waiting = { entry: d.entry, ...(d.links ? { links: d.links } : {}) };
  }
  recordUnchanged(report, d.code, d.reason, d.before);
}
// ================================================================================================
// 33. the report — the answer of one push, one "label: value" per line, values aligned, always in this order, lines
//    whose value is unknown left out: workload, container, image before, image after, action (image updated | rollout
//    restarted (same image re-pulled) | none (<why>)), result (ok | failed: <message>), rollout (progressing |
//    complete | failed | timed out | not tracked), one line per pod, rollback, notes. Exit status 0 when the result
//    is ok (a change made, or an acknowledged no-op), 1 otherwise.
//    Exports: formatForcedRollback, formatReport, formatRollback, formatRollout.
//    Tests: test/e2e.test.ts, test/records.test.ts, test/upgrade.test.ts.
// ================================================================================================

/** What a forced rollback did, for the rollback line, the Event and the log. Pure. */
export function formatForcedRollback(f: ForcedRollback): string {
  const parts: string[] = [];
  if (f.deleted.length > 0)
    parts.push(`deleted the stuck pods ${f.deleted.join(', ')} for the StatefulSet's forced rollback`);
  if (f.byHand.length > 0)
    parts.push(
      `the stuck pods ${f.byHand.join(', ')} must be deleted by hand for the StatefulSet's forced rollback ` +
        `(kubectl -n ${f.namespace} delete pod ${f.byHand.join(' ')}): ${f.why}`,
    );
  else if (f.why !== undefined)
    parts.push(`the stuck pods (not ready, running the image rolled back from) must be deleted by hand: ${f.why}`);
  if (parts.length === 0) parts.push("no stuck pods to delete for the StatefulSet's forced rollback");
  return parts.join('; ');
}

// ---- output -----------------------------------------------------------------------------------

const LABEL_WIDTH = 'image before:'.length;

function reportLine(label: string, value: string): string {
  return `${`${label}:`.padEnd(LABEL_WIDTH)} ${value}`;
}

export function formatRollout(r: RolloutOutcome): string {
  switch (r.state) {
    case 'complete':
    case 'progressing':
    case 'not tracked':
      return `${r.state} (${r.detail})`;
    case 'failed':
    case 'timed out':
      return `${r.state}: ${r.detail}`;
  }
}

function formatPod(p: PodSummary): string {
  return (
    `pod ${p.name}: ${p.phase}, ${p.ready ? 'ready' : 'not ready'}, image ${p.image}, restarts ` +
    `${p.restarts}${p.reason ? `, ${p.reason}` : ''}`
  );
}

export function formatRollback(r: RollbackOutcome): string {
  if (r.notDone !== undefined) return `not rolled back: ${r.notDone}; ${r.reason}`;
  const forced = r.forced ? `; ${formatForcedRollback(r.forced)}` : '';
  const rollout = r.rollout ? `; its rollout ${formatRollout(r.rollout)}` : '';
  return `rolled back to ${r.image}: ${r.reason}${forced}${rollout}`;
}

/** The report as the documented lines (see the section banner). Pure. */
export function formatReport(r: UpgradeReport): string {
  const lines: string[] = [];
  if (r.cluster) lines.push(reportLine('cluster', r.cluster));
  if (r.workload)
    lines.push(reportLine('workload', `${r.workload}${r.namespace ? ` in namespace ${r.namespace}` : ''}`));
  if (r.container) lines.push(reportLine('container', r.container));
  if (r.imageBefore !== undefined) lines.push(reportLine('image before', r.imageBefore));
  if (r.imageAfter !== undefined) lines.push(reportLine('image after', r.imageAfter));
  lines.push(reportLine('action', r.action));
  lines.push(reportLine('result', r.result === 'ok' ? 'ok' : `failed: ${r.error ?? 'unknown error'}`));
  if (r.rollout) {
    lines.push(reportLine('rollout', formatRollout(r.rollout)));
    for (const p of r.rollout.pods.slice(0, UPGRADE_LIMITS.maxPodLines)) lines.push(formatPod(p));
    if (r.rollout.pods.length > UPGRADE_LIMITS.maxPodLines)
      lines.push(reportLine('pods', `${r.rollout.pods.length - UPGRADE_LIMITS.maxPodLines} more not shown`));
  }
  if (r.rollback) lines.push(reportLine('rollback', formatRollback(r.rollback)));
  for (const n of r.notes) lines.push(reportLine('note', n));
  return `${lines.join('\n')}\n`;
}

// ================================================================================================
// 34. rollout follow — follows a rollout by kubectl's rules until it completes, fails (a pod stuck in
//    CrashLoopBackOff, ImagePullBackOff…) or ROLLOUT_TIMEOUT passes. The workload is watched (WorkloadFeed: the
//    client's watch shared by the follows of a namespace and kind, from the PATCH answer's resourceVersion; a watch
//    of the workload alone where RBAC names it; a GET per second, with one warning, where watch is refused). A
//    follow is recorded on the workload (FOLLOW_ANNOTATION) after the answer, so another replica resumes it after a
//    restart, and only the replica that takes the record off reports its end (claimFollow).
//    Exports: claimFollow, followRollout, resumedReport, rolloutEvent.
//    Tests: test/decision.test.ts, test/e2e.test.ts, test/replicas.test.ts, test/resume.test.ts, test/rolling.test.ts,
//    test/watch.test.ts.
// ================================================================================================

/**
 * The shortest wait between two reads of a rollout, whatever the caller asks: a timeout that is
 * not a number, or one about to end, never turns following into a busy loop against the API server.
 */
const ROLLOUT_POLL_FLOOR_MS = 250;

/**
 * Follows a workload's rollout by kubectl's rules until it completes, fails (a Deployment's
 * ProgressDeadlineExceeded, or a new pod stuck in a reason such as CrashLoopBackOff or
 * ImagePullBackOff for UPGRADE_LIMITS.stuckPodFailMs) or the time is up; at the deadline, stuck
 * pods make it "failed", otherwise "timed out". Can run after the HTTP answer has gone; never
 * throws (an API failure becomes the outcome's detail).
 */
export async function followRollout(
  client: KubeClient,
  target: WorkloadTarget,
  options: FollowOptions,
): Promise<RolloutOutcome> {
  const deadline = Date.now() + (Number.isFinite(options.timeoutMs) ? Math.max(0, options.timeoutMs) : 0);
  const pollMs = Math.max(ROLLOUT_POLL_FLOOR_MS, options.pollMs ?? UPGRADE_LIMITS.rolloutPollMs);
  const stuckSince = new Map<string, number>();
  let podsCheckedAt = Date.now();
  const feed = new WorkloadFeed(client, target, options);
  const podStates = new PodStates(client, target);
  const podsOf = (workload: K8sObject, listIfLate?: boolean) => podStates.read(workload, options.container, listIfLate);
  try {
    for (;;) {
      const workload = await feed.current();
      const status = rolloutStatus(target.kind, workload);
      if (status.state === 'untracked') return { state: 'not tracked', detail: status.message, pods: [] };
      if (status.state !== 'waiting') {
        const pods = await podsOf(workload);
        return { state: status.state === 'done' ? 'complete' : 'failed', detail: status.message, pods };
      }
      if (Date.now() >= deadline || options.signal?.aborted) {
        const pods = await podsOf(workload);
        const stuck = stuckPods(pods, options.image);
        if (stuck.length > 0) return { state: 'failed', detail: `pods not ready: ${describeStuck(stuck)}`, pods };
        return { state: 'timed out', detail: `after ${formatGoDuration(options.timeoutMs)}: ${status.message}`, pods };
      }
      options.onProgress?.({ state: 'progressing', detail: status.message, pods: [] });
      // Watching, a rollout whose workload changed since the last look is moving: its pods are looked
      // at once it has been still for stuckPodCheckMs (stuck pods leave the workload's status still).
      if (Date.now() - Math.max(podsCheckedAt, feed.changedAt) >= UPGRADE_LIMITS.stuckPodCheckMs) {
        podsCheckedAt = Date.now();
        if (feed.watching) podStates.watch();
        const failed = await stuckTooLong(await podsOf(workload, false), options, stuckSince);
        if (failed) return failed;
      }
      // Watching, the next look comes with the next change, or when the pods are due a look.
      const still = Math.max(podsCheckedAt, feed.changedAt);
      const next = feed.watching ? still + UPGRADE_LIMITS.stuckPodCheckMs - Date.now() : pollMs;
      await feed.changed(Math.max(ROLLOUT_POLL_FLOOR_MS, Math.min(next, deadline - Date.now())), options.signal);
    }
  } catch (e) {
    return { state: 'timed out', detail: `could not follow the rollout: ${(e as Error).message}`, pods: [] };
  } finally {
    podStates.close();
    const last = feed.close();
    if (last) options.seen?.(last);
  }
}

/** Whether an object's labels satisfy a selector (matchLabels and matchExpressions), as the API server decides. */
function selectorMatches(selector: unknown, obj: unknown): boolean {
  const labels = valueAt(obj, ['metadata', 'labels']);
  const label = (k: string) => (isObject(labels) && typeof labels[k] === 'string' ? labels[k] : undefined);
  const wanted = valueAt(selector, ['matchLabels']);
  if (isObject(wanted) && Object.entries(wanted).some(([k, v]) => label(k) !== String(v))) return false;
  return asArray(valueAt(selector, ['matchExpressions'])).every((e) => {
    const value = label(String(valueAt(e, ['key'])));
    const values = asArray(valueAt(e, ['values'])).map(String);
    switch (valueAt(e, ['operator'])) {
      case 'In':
        return value !== undefined && values.includes(value);
      case 'NotIn':
        return value === undefined || !values.includes(value);
      case 'Exists':
        return value !== undefined;
      case 'DoesNotExist':
        return value === undefined;
      default:
        return false;
    }
  });
}

/**
 * The workload's own pods among `pods` (a namespace's, from a watch), sorted by name: those its
 * selector matches that it owns, directly or (a Deployment's) through the ReplicaSet its controller
 * names `<deployment>-<pod-template-hash>`.
 */
function workloadPodsIn(
  pods: unknown[],
  target: WorkloadTarget,
  workload: K8sObject,
  containerName: string,
): PodSummary[] {
  const selector = valueAt(workload, ['spec', 'selector']);
  const uid = String(target.uid ?? valueAt(workload, ['metadata', 'uid']));
  const owned = (p: unknown) =>
    asArray(valueAt(p, ['metadata', 'ownerReferences'])).some(
      (o) =>
        String(valueAt(o, ['uid'])) === uid ||
        (kindSpec(target.kind).podsOwnedThrough !== undefined &&
          valueAt(o, ['kind']) === 'ReplicaSet' &&
          valueAt(o, ['name']) === `${target.name}-${String(valueAt(p, ['metadata', 'labels', 'pod-template-hash']))}`),
    );
  return pods
    .filter((p) => selectorMatches(selector, p) && owned(p))
    .map((p) => summarizePod(p, containerName))
    .sort((a, b) => a.name.localeCompare(b.name));
}

/**
 * A pod reduced to what summarizePod and the ownership checks read (name, labels, owners, deletion, phase,
 * conditions, containers' names, images and states): what a watch of a namespace's pods keeps of each. Pure.
 */
function leanPod(pod: K8sObject): K8sObject {
  const pick = (o: unknown, keys: string[]): Record<string, unknown> | undefined => {
    if (!isObject(o)) return undefined;
    const kept: Record<string, unknown> = {};
    for (const k of keys) if (o[k] !== undefined) kept[k] = o[k];
    return kept;
  };
  const each = (list: unknown, keep: (o: unknown) => unknown) => (Array.isArray(list) ? list.map(keep) : undefined);
  const container = (c: unknown) => pick(c, ['name', 'image', 'imagePullPolicy']);
  const containerStatus = (c: unknown) => ({
    ...pick(c, ['name', 'ready', 'image', 'restartCount']),
    state: {
      waiting: pick(valueAt(c, ['state', 'waiting']), ['reason']),
      terminated: pick(valueAt(c, ['state', 'terminated']), ['reason']),
    },
  });
  const { metadata, spec, status } = pod;
  return {
    metadata: {
      ...pick(metadata, ['name', 'namespace', 'uid', 'resourceVersion', 'labels', 'deletionTimestamp']),
      ownerReferences: each(valueAt(metadata, ['ownerReferences']), (o) => pick(o, ['uid', 'kind', 'name'])),
    },
    spec: {
      containers: each(valueAt(spec, ['containers']), container),
      initContainers: each(valueAt(spec, ['initContainers']), container),
    },
    status: {
      ...pick(status, ['phase']),
      conditions: each(valueAt(status, ['conditions']), (c) => pick(c, ['type', 'status', 'reason'])),
      containerStatuses: each(valueAt(status, ['containerStatuses']), containerStatus),
      initContainerStatuses: each(valueAt(status, ['initContainerStatuses']), containerStatus),
    },
  };
}

/**
 * The workloads a pod may belong to, by name (the pod watch's index): its owners, and for a pod owned by a
 * ReplicaSet, the Deployment that names that ReplicaSet `<deployment>-<pod-template-hash>`. Pure.
 */
function podWorkloadNames(pod: K8sObject): string[] {
  const hash = valueAt(pod, ['metadata', 'labels', 'pod-template-hash']);
  return asArray(valueAt(pod, ['metadata', 'ownerReferences'])).flatMap((o) => {
    const name = String(valueAt(o, ['name']));
    const suffix = `-${String(hash)}`;
    const viaSet = valueAt(o, ['kind']) === 'ReplicaSet' && typeof hash === 'string' && name.endsWith(suffix);
    return viaSet ? [name, name.slice(0, -suffix.length)] : [name];
  });
}

/**
 * A followed rollout's pods. Once the follow needs their states while the rollout is still
 * (watch()), through the watch of the namespace's pods this client shares among every such
 * follow (one list and one WATCH for a whole release, however many rollouts it has, where a
 * selector's watch each would hold a connection per rollout), which keeps each pod lean (leanPod) and
 * indexed by the workloads that may own it (podWorkloadNames); the rollout's own are picked out of its
 * index entry by its selector and owners (workloadPodsIn). Until then, and where that watch is refused,
 * listed (workloadPods). The summary at the end reads the shared watch when another follow has it open.
 */
class PodStates {
  private readonly client: KubeClient;
  private readonly target: WorkloadTarget;
  private readonly scope: WatchScope;
  private synced: Promise<boolean> | undefined;
  private unsubscribe: () => void = () => undefined;

  constructor(client: KubeClient, target: WorkloadTarget) {
    this.client = client;
    this.target = target;
    const ref = { group: '', version: 'v1', resource: 'pods', namespace: target.namespace };
    this.scope = { ref, keep: leanPod, indexBy: podWorkloadNames };
  }

  watch(): void {
    this.synced ??= new Promise<boolean>((resolve) => {
      this.unsubscribe = this.client.watch(this.scope, undefined, {
        synced: () => resolve(true),
        failed: () => resolve(false),
      });
    });
  }

  /**
   * The pods now. When the shared watch has not listed them within a request's deadline, the look is left to a
   * list of its own (`listIfLate`: the summary at the end) or to the next look (a stuck-pod check: none are known
   * yet; a release's thousands of follows listing at once would queue ahead of its pushes and bury the API server).
   */
  async read(workload: K8sObject, container: string, listIfLate = true): Promise<PodSummary[]> {
    // The wait's timer goes as soon as the race is decided: a follow looks every few seconds.
    let timer: NodeJS.Timeout | undefined;
    const late = () =>
      new Promise<'late'>((resolve) => (timer = setTimeout(resolve, UPGRADE_LIMITS.podWatchSyncMs, 'late').unref()));
    const state = this.synced && (await Promise.race([this.synced, late()]).finally(() => clearTimeout(timer)));
    if (state === 'late' && !listIfLate) return [];
    if (state === false || state === 'late') return podsOrNone(this.client, this.target, workload, container);
    const seen = this.client.watchedBy(this.scope, this.target.name);
    if (seen && (this.synced || this.client.watchSynced(this.scope)))
      return workloadPodsIn([...seen.values()], this.target, workload, container);
    return podsOrNone(this.client, this.target, workload, container);
  }

  close(): void {
    this.unsubscribe();
  }
}

/**
 * What a follow reads its workload through. With the object it starts from (the PATCH's answer),
 * the watch this client shares among every follow of the namespace's workloads of that kind, from
 * that object's resourceVersion on; when that watch is refused (RBAC that names the workloads), a
 * watch of this workload alone; when that is refused too, a GET every poll, said once through
 * `warn`. A watched object older than the one the follow starts from (a lower generation, which the
 * shared watch may still deliver when it started earlier) is not taken: it could show the previous
 * rollout complete.
 */
class WorkloadFeed {
  private latest: K8sObject | undefined;
  /** The copy may have missed a change (the watch joined late, or has gone quiet): it is read again. */
  private stale = false;
  private deleted = false;
  /** A change came since the last look (it may come while the follow lists pods). */
  private fresh = false;
  /** When the workload last changed, as far as the watch has told (0: polling, or no change yet). */
  changedAt = 0;
  /** When the workload was last read with a GET while watching (started: the follow's start). */
  private readAt = Date.now();
  private readonly minGeneration: number;
  private wake: (() => void) | undefined;
  private unsubscribe: () => void = () => undefined;
  private readonly client: KubeClient;
  private readonly target: WorkloadTarget;
  private readonly warn: ((message: string) => void) | undefined;
  private readonly seen: FollowOptions['seen'];
  /** The watch subscribed to: the namespace's workloads of the kind, or this one alone. */
  private scope: WatchScope | undefined;
  watching: boolean;

  /** How long a workload may stay unchanged, its watch unheard, before it is read again (the stuck-pod limit). */
  private readonly quietMs: number;

  constructor(client: KubeClient, target: WorkloadTarget, options: FollowOptions) {
    const initial = options.initial;
    this.client = client;
    this.target = target;
    this.warn = options.warn;
    this.seen = options.seen;
    this.quietMs = options.stuckFailMs ?? UPGRADE_LIMITS.stuckPodFailMs;
    this.latest = initial;
    this.minGeneration = Number(valueAt(initial, ['metadata', 'generation']) ?? target.generation ?? 0);
    const rv = valueAt(initial, ['metadata', 'resourceVersion']) ?? target.resourceVersion;
    this.watching = typeof rv === 'string';
    if (typeof rv === 'string') this.subscribe(workloadResource({ ...target, name: undefined }), rv);
  }

  private subscribe(ref: ResourceRef, rv: string): void {
    const scope = (this.scope = { ref, keep: leanWorkload });
    const seen = this.client.watched(scope)?.get(this.target.name);
    if (seen) this.take(seen);
    this.unsubscribe = this.client.watch(scope, rv, {
      name: this.target.name,
      event: (e) => {
        if (e.type === 'DELETED') this.deleted = true;
        else this.take(e.object);
        this.fresh = true;
        this.wake?.();
      },
      behind: () => {
        this.stale = true;
        this.wake?.();
      },
      failed: (e) => {
        if (e.status === 403 && ref.name === undefined) return this.subscribe(workloadResource(this.target), rv);
        this.watching = false;
        this.warn?.(`rollouts are polled (a GET every second per follow) instead of watched: ${e.message}`);
        this.wake?.();
      },
    });
  }

  private take(o: K8sObject): void {
    if (Number(valueAt(o, ['metadata', 'generation']) ?? 0) < this.minGeneration) return;
    this.latest = o;
    this.seen?.(o);
    this.stale = false;
    this.changedAt = Date.now();
  }

  /**
   * The workload as last seen (watching), or as a GET answers now (polling). Watching, a workload
   * that has not changed for the stuck-pod limit (quietMs) while the watch has not heard from the API
   * server either (no change of another workload, no bookmark) is read again once: a watch that
   * missed a change (a connection gone quiet) cannot hold a follow until its deadline. (A watch that
   * is heard from delivers every change in order: a release's thousands of follows read nothing.)
   */
  async current(): Promise<K8sObject> {
    this.fresh = false;
    const heardAt = this.scope ? this.client.watchHeardAt(this.scope) : 0;
    const seenAt = Math.max(this.changedAt, this.readAt, heardAt);
    if (this.watching && Date.now() - seenAt >= this.quietMs) {
      this.readAt = Date.now();
      this.stale = true;
    }
    if (!this.watching)
      return (this.latest = await this.client.get<K8sObject>(workloadResource(this.target), { background: true }));
    if (this.stale || !this.latest) {
      try {
        this.latest = await this.client.get<K8sObject>(workloadResource(this.target), { background: true });
        this.stale = false;
      } catch (e) {
        // This client's own rate limit has no turn for the read now (a release's pushes come first): the
        // copy in hand serves until the next look, which reads again. Anything else ends the follow.
        if (!(this.latest && e instanceof KubeError && e.reason === 'ClientRateLimited')) throw e;
      }
    }
    if (this.deleted) throw new UpgradeError(`${describeResource(workloadResource(this.target))} was deleted`);
    return this.latest;
  }

  /** Resolves after `ms`, at the workload's next change (watching), or when `signal` aborts. */
  changed(ms: number, signal?: AbortSignal): Promise<void> {
    if (this.fresh) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', done);
        this.wake = undefined;
        resolve();
      };
      const timer = setTimeout(done, ms);
      signal?.addEventListener('abort', done, { once: true });
      this.wake = done;
    });
  }

  /** Stops watching; the workload as last seen, if it was. */
  close(): K8sObject | undefined {
    this.unsubscribe();
    return this.latest;
  }
}

/** The pods not ready for a reason that needs a change (optionally only those running `image`). */
function stuckPods(pods: PodSummary[], image: string | undefined): PodSummary[] {
  const wanted = image === undefined ? undefined : normalizeImageRef(image);
  return pods.filter(
    (p) =>
      !p.ready &&
      p.reason !== undefined &&
      STUCK_REASONS.includes(p.reason) &&
      (wanted === undefined || normalizeImageRef(p.image) === wanted),
  );
}

function describeStuck(stuck: PodSummary[]): string {
  return stuck.map((p) => `${p.name} ${p.reason}`).join(', ');
}

/** A failed outcome once a pod has been seen stuck for longer than the threshold; else undefined. */
function stuckTooLong(
  pods: PodSummary[],
  options: FollowOptions,
  stuckSince: Map<string, number>,
): RolloutOutcome | undefined {
  const stuck = stuckPods(pods, options.image);
  const now = Date.now();
  for (const name of [...stuckSince.keys()]) if (!stuck.some((p) => p.name === name)) stuckSince.delete(name);
  for (const p of stuck) if (!stuckSince.has(p.name)) stuckSince.set(p.name, now);
  const limit = options.stuckFailMs ?? UPGRADE_LIMITS.stuckPodFailMs;
  const longest = Math.max(0, ...[...stuckSince.values()].map((t) => now - t));
  if (stuck.length === 0 || longest < limit) return undefined;
  return {
    state: 'failed',
    detail: `pods not ready: ${describeStuck(stuck)} (stuck for ${formatGoDuration(roundedToSeconds(longest))})`,
    pods,
  };
}

async function podsOrNone(
  client: KubeClient,
  target: WorkloadTarget,
  workload: K8sObject,
  container: string,
): Promise<PodSummary[]> {
  try {
    return await workloadPods(client, target, workload, container);
  } catch {
    // The summary is a courtesy: without list permission on pods the outcome still stands.
    return [];
  }
}

/**
 * Takes this request's follow record off the workload with a PATCH that tests the value read: of
 * the replicas following one rollout, only the one whose PATCH applies reports its end.
 * 'superseded' when a newer push's follow replaced the record, 'gone' when another replica took it.
 * The first try works on the copy in `known` (the follow's last sight of the workload): a stale one
 * fails the PATCH's test, and the workload is read again. The workload as the PATCH returned it
 * goes into `known`, so the next push need not read it again.
 */
export async function claimFollow(
  client: KubeClient,
  target: WorkloadTarget,
  container: string,
  requestId: string,
  known?: KnownWorkloads,
): Promise<'claimed' | 'superseded' | 'gone'> {
  const key = `${target.namespace}/${target.kind}/${target.name}`;
  for (let attempt = 1; ; attempt++) {
    const seen = attempt === 1 ? known?.get(key) : undefined;
    const workload = seen ?? (await readWorkload(client, target));
    const { raw, entries } = readFollowRecords(workload);
    if (seen && entries[container]?.request !== requestId) continue;
    if (!entries[container]) return 'gone';
    if (entries[container].request !== requestId) return 'superseded';
    const rest = Object.fromEntries(Object.entries(entries).filter(([name]) => name !== container));
    const ops = annotationOps(
      workload,
      ['metadata'],
      { [FOLLOW_ANNOTATION]: JSON.stringify(rest) },
      {
        [FOLLOW_ANNOTATION]: raw ?? null,
      },
    );
    try {
      const updated = await client.patch<K8sObject>(workloadResource(target), ops, UPGRADE_LIMITS.fieldManager);
      known?.set(key, updated);
      return 'claimed';
    } catch (e) {
      if (!(e instanceof KubeError && e.status === 422) || attempt >= UPGRADE_LIMITS.maxPatchAttempts) throw e;
    }
  }
}

/**
 * A follow found on a workload, as the report the replica that started it would have made; the
 * rollback setting and the image pin are the hook's now (`hook`), never the record's.
 */
function resumedReport(
  target: WorkloadTarget,
  container: string,
  f: FollowRecord,
  workload: K8sObject,
  hook: { rollbackOnFailure: boolean; imagePin: ImagePin },
): UpgradeReport {
  const { raw, records } = readPushRecords(workload);
  const record = records[container]?.request === f.request ? records[container] : undefined;
  const same = record !== undefined && normalizeImageRef(record.previous) === normalizeImageRef(record.image);
  return {
    decision: same ? 're-pulled' : 'applied',
    namespace: target.namespace,
    workload: `${target.kind}/${target.name}`,
    container,
    imageBefore: record?.previous,
    imageAfter: record?.image,
    action: same ? kindSpec(target.kind).sameImageAction : 'image updated',
    changed: true,
    result: 'ok',
    notes: ['the rollout was followed to its end by a replica started after the one that applied the push'],
    target: { ...target, uid: String(valueAt(workload, ['metadata', 'uid'])) },
    rollout: { state: 'progressing', detail: 'resumed', pods: [] },
    lastPush: record ? raw : undefined,
    followRecorded: true,
    rollbackOnFailure: hook.rollbackOnFailure || undefined,
    imagePin: hook.imagePin,
  };
}

/** The Event that records a followed rollout's end, if it ended. Pure. */
export function rolloutEvent(outcome: RolloutOutcome, container: string): WorkloadEvent | undefined {
  const facts = { container, why: outcome.detail, pods: outcome.pods };
  switch (outcome.state) {
    case 'complete':
      return pushEvent('rollout complete', facts);
    case 'failed':
      return pushEvent('rollout failed', facts);
    case 'timed out':
      return pushEvent('rollout timed out', facts);
    default:
      return undefined;
  }
}

// ================================================================================================
// 35. rollback — ROLLBACK_ON_FAILURE=true: a followed rollout that fails is set back to the image before the push,
//    with the same tested patch, and that rollout is followed too. A StatefulSet (RollingUpdate) does not replace a
//    pod stuck on the bad image by itself, so its "forced rollback" deletes, once the controller has observed the
//    template set back, the pods it owns that still run the image rolled back from and are not ready (uid
//    precondition); a refusal names the pods to delete by hand. applyRolloutEnd is the one place a followed
//    rollout's end is applied to its push (its verdict, its Event, the rollback), by the upgrade and the service.
//    Exports: applyRolloutEnd.
//    Tests: test/decision.test.ts, test/rollback.test.ts.
// ================================================================================================

/**
 * ROLLBACK_ON_FAILURE, after this push's rollout failed: sets the container back to the image it
 * ran before the push (the record's `previous`) and follows that rollout for up to followMs. The
 * PATCH tests that the record is still the one this push wrote and the container still runs its
 * image, so a newer push, or any edit since, is never overridden. Never throws: report.rollback
 * (and report.action, for the mail's outcome) say what happened.
 */
export async function rollBackFailedRollout(
  client: KubeClient,
  target: WorkloadTarget,
  report: UpgradeReport,
  followMs: number,
  deps: Pick<UpgradeDeps, 'now' | 'requestId' | 'hookId'>,
): Promise<void> {
  const container = report.container ?? '';
  const stuck = (report.rollout?.pods ?? []).filter((p) => !p.ready).slice(0, 5);
  const podStates = stuck.length ? ` (${stuck.map((p) => `${p.name} ${p.reason ?? 'not ready'}`).join(', ')})` : '';
  const reason = `the rollout of ${report.imageAfter} failed: ${report.rollout?.detail ?? 'unknown'}${podStates}`;
  try {
    const workload = await readWorkload(client, target);
    const { raw, records } = readPushRecords(workload);
    const record = records[container];
    const located = locateContainer(valueAt(workload, [...kindSpec(target.kind).template, 'spec']), container);
    const notDone = rollbackObstacle(report, raw, record, located) ?? rollbackPinObstacle(report, record, located);
    if (notDone || !record || !located) {
      report.rollback = { reason, notDone: notDone ?? 'the push record is gone' };
      return;
    }
    const now = (deps.now ?? (() => new Date()))();
    const rolledBack = withPushRecord(records, container, { ...record, rolledBack: `${now.toISOString()}: ${reason}` });
    const change: PlannedChange = {
      image: record.previous,
      changeCause: `webhook: rolled back ${container} to ${record.previous}: ${reason}`,
      guarded: { [LAST_PUSH_ANNOTATION]: { value: rolledBack, read: raw } },
    };
    const ops = planPatch(workload, target.kind, container, located, change);
    const patched = await client.patch<K8sObject>(workloadResource(target), ops, UPGRADE_LIMITS.fieldManager);
    report.lastPush = rolledBack;
    report.action = `${report.action}, then rolled back to ${record.previous}`;
    const forced = kindSpec(target.kind).forcedRollback
      ? await forceRollback(client, target, patched, container, record.image)
      : undefined;
    const forcedText = forced ? `; ${formatForcedRollback(forced)}` : '';
    const facts = { container, image: record.previous, why: `${reason}${forcedText}`, asked: whoAsked(deps) };
    await recordEventQuietly(client, target, pushEvent('rolled back', facts), now, report);
    const rollout = await followRollback(client, target, container, record.previous, followMs, forced, patched);
    report.rollback = { reason, image: record.previous, rollout, ...(forced && { forced }) };
  } catch (e) {
    const why = e instanceof KubeError && e.status === 422 ? 'the workload changed meanwhile' : (e as Error).message;
    report.rollback = { reason, notDone: `the rollback failed: ${why}` };
  }
}

/**
 * The rollback's own rollout, followed for up to followMs; not followed when stuck pods are left to
 * delete by hand, since it cannot go on before they are (the mail saying so should not wait for that).
 */
async function followRollback(
  client: KubeClient,
  target: WorkloadTarget,
  container: string,
  image: string,
  followMs: number,
  forced: ForcedRollback | undefined,
  patched: K8sObject,
): Promise<RolloutOutcome> {
  if (forced && (forced.byHand.length > 0 || forced.why !== undefined))
    return { state: 'progressing', detail: 'not followed: it waits until the stuck pods are deleted', pods: [] };
  if (followMs <= 0) return { state: 'progressing', detail: 'not followed', pods: [] };
  // Followed from the rollback's own PATCH answer, not the push's.
  return followRollout(client, target, { timeoutMs: followMs, container, image, initial: patched });
}

/**
 * A StatefulSet's forced rollback (Kubernetes documents it under StatefulSet, "Forced rollback"):
 * with OrderedReady pods and a RollingUpdate, the controller waits for a pod of the failed update
 * to become ready, which it never will, so the template set back changes nothing until those pods
 * are deleted. Once the controller has observed the rollback (so it recreates them from the
 * template set back, not the broken one), deletes each pod the StatefulSet owns whose container
 * still runs the image rolled back from and that is not ready, under a precondition on the pod's
 * uid (a pod recreated meanwhile is left alone). Never throws: a refusal names the pods to delete.
 */
async function forceRollback(
  client: KubeClient,
  target: WorkloadTarget,
  rolledBack: K8sObject,
  container: string,
  fromImage: string,
): Promise<ForcedRollback> {
  const forced: ForcedRollback = { namespace: target.namespace, deleted: [], byHand: [] };
  try {
    const workload = await rollbackObserved(client, target, rolledBack);
    for (const pod of await podsOfFailedUpdate(client, target, workload, container, fromImage)) {
      const name = String(valueAt(pod, ['metadata', 'name']));
      const ref = { group: '', version: 'v1', resource: 'pods', namespace: target.namespace, name };
      try {
        await client.delete(ref, String(valueAt(pod, ['metadata', 'uid'])));
        forced.deleted.push(name);
      } catch (e) {
        // Gone already, or already recreated under another uid: nothing left to do for it.
        if (e instanceof KubeError && (e.status === 404 || e.status === 409)) continue;
        forced.byHand.push(name);
        forced.why ??= (e as Error).message;
      }
    }
  } catch (e) {
    forced.why = (e as Error).message;
  }
  return forced;
}

/** The workload once its controller has observed the rollback's generation; throws past the limit. */
async function rollbackObserved(client: KubeClient, target: WorkloadTarget, rolledBack: K8sObject): Promise<K8sObject> {
  const deadline = Date.now() + UPGRADE_LIMITS.rollbackObservedMs;
  const generation = numberAt(rolledBack, ['metadata', 'generation']);
  let workload = rolledBack;
  while (numberAt(workload, ['status', 'observedGeneration']) < generation) {
    if (Date.now() >= deadline) {
      throw new UpgradeError(
        `the ${target.kind} controller did not observe the rollback within ` +
          formatGoDuration(UPGRADE_LIMITS.rollbackObservedMs),
      );
    }
    await sleep(UPGRADE_LIMITS.rolloutPollMs);
    workload = await client.get<K8sObject>(workloadResource(target));
  }
  return workload;
}

/** The workload's own pods still running `image` in the container and not ready, sorted by name. */
async function podsOfFailedUpdate(
  client: KubeClient,
  target: WorkloadTarget,
  workload: K8sObject,
  container: string,
  image: string,
): Promise<unknown[]> {
  const owners = new Set([String(target.uid ?? valueAt(workload, ['metadata', 'uid']))]);
  const pods = await client.list<{ items: unknown[] }>(
    { group: '', version: 'v1', resource: 'pods', namespace: target.namespace },
    { labelSelector: labelSelector(valueAt(workload, ['spec', 'selector'])) },
  );
  const wanted = normalizeImageRef(image);
  return pods.items
    .filter(
      (p) =>
        ownedBy(p, owners) &&
        !valueAt(p, ['metadata', 'deletionTimestamp']) &&
        !summarizePod(p, container).ready &&
        normalizeImageRef(locateContainer(valueAt(p, ['spec']), container)?.image ?? '') === wanted,
    )
    .sort((a, b) => String(valueAt(a, ['metadata', 'name'])).localeCompare(String(valueAt(b, ['metadata', 'name']))));
}

/**
 * What the end of a followed rollout means for its push: whether the push failed, and why, and
 * whether ROLLBACK_ON_FAILURE sets it back. A rollout that timed out is not rolled back: it may
 * still complete, and kubectl's rules call it failed only once the controller gives up. Pure.
 */
export function rolloutVerdict(
  outcome: RolloutOutcome,
  rollbackOnFailure: boolean,
  timeoutMs?: number,
): { error?: string; rollBack: boolean } {
  if (outcome.state === 'failed') return { error: 'the rollout failed (see rollout)', rollBack: rollbackOnFailure };
  if (outcome.state !== 'timed out') return { rollBack: false };
  const within = timeoutMs === undefined ? '' : ` within ${formatGoDuration(timeoutMs)}`;
  return { error: `the rollout did not complete${within} (see rollout)`, rollBack: false };
}

/** How a caller applies the end of a push's followed rollout (applyRolloutEnd). */
interface RolloutEnd {
  /** The hook's ROLLBACK_ON_FAILURE: a failed rollout is rolled back. */
  rollbackOnFailure: boolean;
  /**
   * The bound a timed-out rollout's error names ("did not complete within 5m0s"), or undefined to name none. The
   * in-line upgrade followed for the hook's ROLLOUT_TIMEOUT and names it; the service followed for -rollout-follow,
   * or for what a resumed follow had left of it, which is not a setting of the hook, so it names none.
   */
  timeoutMs?: number;
  /** How long the rollback's own rollout is followed. */
  rollbackFollowMs: number;
  /** The clock and who asked, as the rollback's Event and record say it. */
  deps: Pick<UpgradeDeps, 'now' | 'requestId' | 'hookId'>;
  /**
   * Told when the rollout's Event could not be recorded. The service logs it, with the request's id, beside the
   * rollout's end it logs; left out, it is a note on the report, as in the in-line upgrade, whose answer lists the
   * report's notes and is not written yet.
   */
  eventFailed?: (message: string) => void;
}

/**
 * The one place a followed rollout's end is applied to its push: its verdict (rolloutVerdict: a failed or timed-out
 * rollout fails the push), its Event (RolloutComplete, RolloutFailed, RolloutTimedOut), and under
 * ROLLBACK_ON_FAILURE the rollback of a failed one. The in-line upgrade and the service's follow both end here.
 */
export async function applyRolloutEnd(
  client: KubeClient,
  target: WorkloadTarget,
  report: UpgradeReport,
  outcome: RolloutOutcome,
  end: RolloutEnd,
): Promise<void> {
  report.rollout = outcome;
  const verdict = rolloutVerdict(outcome, end.rollbackOnFailure, end.timeoutMs);
  if (verdict.error !== undefined) {
    report.result = 'failed';
    report.error = verdict.error;
  }
  const event = rolloutEvent(outcome, report.container ?? '');
  const now = (end.deps.now ?? (() => new Date()))();
  if (event) await recordEventQuietly(client, target, event, now, end.eventFailed ?? report);
  if (verdict.rollBack) await rollBackFailedRollout(client, target, report, end.rollbackFollowMs, end.deps);
}

/**
 * Why the image a rollback would return to is refused, or undefined: it must pass the hook's image
 * pin as a push onto the container would (the record it comes from is an annotation anyone who
 * may edit the workload can write). Pure.
 */
function rollbackPinObstacle(
  report: UpgradeReport,
  record: PushRecord | undefined,
  located: LocatedContainer | undefined,
): string | undefined {
  if (!record || !located) return undefined;
  if (typeof record.previous !== 'string') return 'the push record names no image before the push';
  const pin = checkImagePin(
    report.container ?? '',
    located.image,
    record.previous,
    report.imagePin ?? imagePin(undefined),
  );
  return pin.allowed ? undefined : `the image before the push is refused by the image pin: ${pin.message}`;
}

/** Why a failed rollout cannot be rolled back, or undefined when it can. Pure. */
export function rollbackObstacle(
  report: UpgradeReport,
  raw: string | undefined,
  record: PushRecord | undefined,
  located: LocatedContainer | undefined,
): string | undefined {
  if (raw === undefined || record === undefined || report.lastPush === undefined)
    return 'the workload has no record of the push, so the image before it is not known';
  if (raw !== report.lastPush)
    return record.image !== report.imageAfter
      ? `a newer push (${record.image}, pushed at ${record.pushedAt}) was applied meanwhile`
      : 'the push record changed meanwhile';
  if (!located || located.image !== record.image) return 'the container was changed meanwhile';
  if (normalizeImageRef(record.previous) === normalizeImageRef(record.image))
    return 'the push re-pulled the image the container already ran: there is no earlier image to return to';
  return undefined;
}

// ================================================================================================
// 36. least privilege — -print-rbac: the Roles and RoleBindings the hooks need, worked out from the hooks themselves
//    (namespace, kind and name when the hook fixes them; `resourceNames` wherever it can), so the service account
//    gets nothing it does not use.
//    Exports: fixedInput, fixedTrue, formatRbac, hookReach, HookReach, upgradeInput.
//    Tests: test/chart.test.ts, test/deploy.test.ts, test/unit.test.ts.
// ================================================================================================

// ---- least privilege: the RBAC the hooks need (-print-rbac) -----------------------------------

/** What one hook's upgrades can reach, or why that cannot be told from the hook. */
export interface HookReach {
  hook: string;
  target?: { namespace: string; kind: WorkloadKind; name: string };
  /** Why the hook's workload is not known before a request names it. */
  open?: string;
  /** The hook sets VERIFY_IMAGE=true: it reads the pull secrets its workload names. */
  verifyImage?: boolean;
  /** Those pull secrets, as read from the workload (-print-rbac with cluster access). */
  pullSecrets?: string[];
  /** The hook fixes ROLLBACK_ON_FAILURE=true: a StatefulSet's rollback deletes its stuck pods. */
  rollbackOnFailure?: boolean;
}

/** The matches every passing request satisfies: those reached from the rule's root through `and`. */
export function requiredMatches(rule: Rule | undefined): Match[] {
  if (!rule) return [];
  if ('and' in rule) return rule.and.flatMap(requiredMatches);
  if ('or' in rule) return rule.or.length === 1 ? requiredMatches(rule.or[0]) : [];
  return 'match' in rule ? [rule.match] : [];
}

/**
 * The one value an upgrade input (APP_NS, APP_WORKLOAD…) has for every request the hook's rule lets
 * through: a literal (source "string"), or a parameter a value match of the rule pins. Otherwise
 * the parameter it comes from; undefined when the hook does not pass it.
 */
export function upgradeInput(hook: Hook, envname: string): string | Param | undefined {
  const p = hook.env.findLast((e) => (e.envname || `HOOK_${e.name}`) === envname);
  if (!p || p.source === 'string') return p?.name;
  const same = (q: Param) =>
    q.source === p.source &&
    (p.source === 'header' ? q.name.toLowerCase() === p.name.toLowerCase() : q.name === p.name);
  const pin = requiredMatches(hook.rule).find((m) => m.pinned !== undefined && m.param && same(m.param));
  return pin ? pin.pinned! : p;
}

/** An upgrade input's value when the hook fixes it (a literal, or a parameter a value rule pins). */
function fixedInput(hook: Hook, envname: string): string | undefined {
  const v = upgradeInput(hook, envname);
  return typeof v === 'string' ? v : undefined;
}

/** Whether the hook fixes a boolean input to true (ROLLBACK_ON_FAILURE, VERIFY_IMAGE); anything else is not. */
function fixedTrue(hook: Hook, envname: string): boolean {
  return parseGoBool(fixedInput(hook, envname)?.trim() ?? '') === true;
}

/** An upgrade input's one value, or a string saying where it comes from. */
function pinnedInput(hook: Hook, envname: string): { value: string } | { from: string } | undefined {
  const v = upgradeInput(hook, envname);
  if (v === undefined) return undefined;
  return typeof v === 'string' ? { value: v } : { from: `the ${v.source} parameter "${v.name}"` };
}

/** The namespace and workload a hook can upgrade; undefined for a hook that passes neither (no upgrade). */
export function hookReach(hook: Hook): HookReach | undefined {
  const ns = pinnedInput(hook, 'APP_NS');
  const workload = pinnedInput(hook, 'APP_WORKLOAD');
  if (!ns && !workload) return undefined;
  const reach = { hook: hook.id };
  if (!ns || !workload) return { ...reach, open: `it passes no ${ns ? 'APP_WORKLOAD' : 'APP_NS'}` };
  if ('from' in ns || 'from' in workload) {
    const open = (
      [
        ['namespace', ns],
        ['workload', workload],
      ] as const
    ).flatMap(([what, input]) => ('from' in input ? [{ what, from: input.from }] : []));
    const whats = open.map((o) => o.what).join(' and ');
    const froms = open.map((o) => o.from).join(' and ');
    return {
      ...reach,
      open: `its ${whats} ${open.length > 1 ? 'come' : 'comes'} from ${froms}, which no value rule pins`,
    };
  }
  if (!DNS_LABEL.test(ns.value)) return { ...reach, open: `APP_NS ${showValue(ns.value)} is not a namespace name` };
  // VERIFY_SIGNATURE implies VERIFY_IMAGE: the tag is resolved (and the signatures read) with the pull secret's login.
  const verifyImage = fixedTrue(hook, 'VERIFY_IMAGE') || (fixedInput(hook, 'VERIFY_SIGNATURE')?.trim() ?? '') !== '';
  const rollbackOnFailure = fixedTrue(hook, 'ROLLBACK_ON_FAILURE');
  try {
    return {
      ...reach,
      target: { namespace: ns.value, ...parseWorkload(workload.value) },
      ...(verifyImage && { verifyImage }),
      ...(rollbackOnFailure && { rollbackOnFailure }),
    };
  } catch (e) {
    return { ...reach, open: (e as Error).message };
  }
}

/** The verbs on a workload whose rollout is followed: read, patched, and watched (list re-lists a watch). */
const FOLLOWED_VERBS = ['get', 'patch', 'list', 'watch'];

const yamlList = (items: string[]) => `[${items.map((i) => JSON.stringify(i)).join(', ')}]`;

/**
 * The Role of one namespace: get/patch on the named workloads, and list/watch on them (a rollout is
 * followed through a watch of the workload alone, a field selector on its name, which RBAC grants
 * through resourceNames; list re-lists it when the watch has fallen behind); what the summary and Events need;
 * delete on pods only where a hook's rollback must delete stuck pods (forcedRollback).
 */
function roleRules(workloads: Map<WorkloadKind, Set<string>>, secrets: Set<string>, deletePods: boolean): string[] {
  const rule = (group: string, resource: string, verbs: string[], names?: string[]) => [
    `  - apiGroups: ${yamlList([group])}`,
    `    resources: ${yamlList([resource])}`,
    ...(names ? [`    resourceNames: ${yamlList(names)}`] : []),
    `    verbs: ${yamlList(verbs)}`,
  ];
  const kinds = (Object.keys(WORKLOAD_KINDS) as WorkloadKind[]).filter((k) => workloads.has(k));
  const lines = kinds.flatMap((k) =>
    rule(kindSpec(k).group, kindSpec(k).resource, kindSpec(k).hasRollout ? FOLLOWED_VERBS : ['get', 'patch'], [
      ...workloads.get(k)!,
    ].sort()),
  );
  const through = kinds.map((k) => kindSpec(k).podsOwnedThrough).find((t) => t !== undefined);
  if (through) lines.push(...rule(through.group, through.resource, ['list']));
  if (kinds.some((k) => kindSpec(k).hasRollout))
    lines.push(...rule('', 'pods', deletePods ? ['list', 'watch', 'delete'] : ['list', 'watch']));
  // VERIFY_IMAGE reads the pull secrets the workloads name, and no other.
  if (secrets.size > 0) lines.push(...rule('', 'secrets', ['get'], [...secrets].sort()));
  return [...lines, ...rule('', 'events', ['create'])];
}

/**
 * A Role and a RoleBinding per namespace the hooks' upgrades reach, as YAML `kubectl apply -f -`
 * takes: get, patch, list and watch on exactly the workloads named (resourceNames), list on the ReplicaSets and
 * Pods the rollout summary reads, create on Events, delete on Pods where a hook that fixes
 * ROLLBACK_ON_FAILURE=true upgrades a StatefulSet (its forced rollback). Hooks whose workload a request chooses are
 * listed in a comment and returned: only a cluster-wide role serves them. Pure.
 */
export function formatRbac(reaches: HookReach[], serviceAccount: string, hooksPaths: string[]): string {
  const [saNamespace, saName] = serviceAccount.split('/');
  const byNamespace = new Map<string, Map<WorkloadKind, Set<string>>>();
  const secretsIn = new Map<string, Set<string>>();
  const deletePodsIn = new Set<string>();
  for (const { target: t, pullSecrets, rollbackOnFailure } of reaches) {
    if (!t) continue;
    if (rollbackOnFailure && kindSpec(t.kind).forcedRollback) deletePodsIn.add(t.namespace);
    const kinds = byNamespace.get(t.namespace) ?? new Map<WorkloadKind, Set<string>>();
    const names = kinds.get(t.kind) ?? new Set<string>();
    byNamespace.set(t.namespace, kinds.set(t.kind, names.add(t.name)));
    const secrets = secretsIn.get(t.namespace) ?? new Set<string>();
    secretsIn.set(t.namespace, secrets);
    for (const secret of pullSecrets ?? []) secrets.add(secret);
  }
  const out = [
    `# Generated by \`webhook -print-rbac -hooks ${hooksPaths.join(' -hooks ')}\``,
    `# for the ServiceAccount ${serviceAccount}.`,
    '# Apply with `kubectl apply -f -`; generate again when a hook changes its namespace or workload.',
    ...reaches.map((r) =>
      r.target
        ? `#   hook ${JSON.stringify(r.hook)}: ${r.target.kind}/${r.target.name} in namespace ${r.target.namespace}` +
          (r.pullSecrets?.length ? `, pull secrets ${r.pullSecrets.join(', ')} (VERIFY_IMAGE)` : '') +
          (r.rollbackOnFailure && kindSpec(r.target.kind).forcedRollback
            ? ', delete on its stuck pods (ROLLBACK_ON_FAILURE: forced rollback)'
            : '')
        : `#   hook ${JSON.stringify(r.hook)}: NOT COVERED: ${r.open}`,
    ),
    ...(reaches.some((r) => r.open)
      ? ['# A hook not covered needs value rules that pin its ns and workload, or the cluster-wide role of deploy/.']
      : []),
  ];
  const metadata = (kind: string, ns: string) => [
    '---',
    'apiVersion: rbac.authorization.k8s.io/v1',
    `kind: ${kind}`,
    'metadata:',
    `  name: ${JSON.stringify(saName)}`,
    `  namespace: ${JSON.stringify(ns)}`,
    '  labels:',
    '    app.kubernetes.io/name: webhook',
  ];
  for (const [ns, workloads] of [...byNamespace].sort(([a], [b]) => a.localeCompare(b))) {
    const rules = roleRules(workloads, secretsIn.get(ns) ?? new Set(), deletePodsIn.has(ns));
    out.push(...metadata('Role', ns), 'rules:', ...rules);
    out.push(...metadata('RoleBinding', ns), 'roleRef:', '  apiGroup: rbac.authorization.k8s.io', '  kind: Role');
    out.push(`  name: ${JSON.stringify(saName)}`, 'subjects:', '  - kind: ServiceAccount');
    out.push(`    name: ${JSON.stringify(saName)}`, `    namespace: ${JSON.stringify(saNamespace)}`);
  }
  return `${out.join('\n')}\n`;
}

// ================================================================================================
// 37. the upgrade — the job /webhooks.sh exists for, as named steps: read the settings, compose the image, decide,
//    patch, record the Event, follow the rollout and roll back when asked, report. UpgradeService is the command
//    runner's InProcessCommand: one client, one per-workload queue and one set of kept pushes for every push. A push
//    the API server does not answer is kept and applied when it answers (KeptPushes, answered 202); a waiting push,
//    once decided, and a past push deployed again take the same path from the settings on (runDecided). Each
//    boundary reads the hook's environment once into a HookConfig (readHookConfig): the process (runUpgrade), an HTTP
//    delivery to one cluster (runOne), a decided push (runDecided); a kept push is tried again with the one it kept.
//    Exports: readAtBoundary, runDecidedPush, runPush, runUpgrade, upgradeResult, UpgradeResult.
//    Tests: test/burst.test.ts, test/e2e.test.ts, test/outage.test.ts, test/rollback.test.ts, test/upgrade.test.ts.
// ================================================================================================

/**
 * The upgrade mode: what /webhooks.sh does with argument 1 (the payload) and the hook's
 * environment. Never throws: every failure is in the report, the output and the exit status.
 */
export async function runUpgrade(
  args: string[],
  env: Record<string, string | undefined>,
  deps: UpgradeDeps = {},
): Promise<{ output: string; exitCode: number; report: UpgradeReport }> {
  const read = readAtBoundary(env);
  if ('failed' in read) return read.failed;
  const { config } = read;
  // The push's cluster's credentials from this process's environment, unless the caller gives its own.
  const own = () => credentialsFromEnvironment(env, deps.kubeconfig, config.cluster, execEnvironment(env, new Set()));
  return runPush(args, config, { ...deps, credentials: deps.credentials ?? own });
}

/**
 * A push whose HookConfig its boundary has read (runUpgrade, the service's runOne, a kept push tried again):
 * argument 1 the payload (its text, or in-process the request's payload itself), argument 2 the request's headers.
 * Never throws.
 */
export async function runPush(
  args: string[],
  settings: HookConfig,
  deps: UpgradeDeps,
  payload: PayloadArgument = { text: args[0] },
): Promise<{ output: string; exitCode: number; report: UpgradeReport }> {
  const report = configuredReport(settings);
  const cluster = settings.cluster;
  let ownClient: KubeClient | undefined;
  try {
    // Everything up to queue.run is synchronous, so tasks are queued in the order calls arrive.
    const headers = pushHeaders(args[1]);
    const validation = webhookValidation(headers, payload);
    if (validation !== undefined) {
      recordUnchanged(report, 'no-op', validation);
      return upgradeResult(report);
    }
    const parsed = 'value' in payload ? pushPayload(payload.value) : parsePushPayload(payload.text);
    if (parsed.kind === 'error') throw new PayloadError(parsed.message);
    const composed = composeImageRef(parsed.payload, settings.reading, headers);
    if (composed.kind === 'error') throw new PayloadError(composed.message);
    if (composed.kind === 'noop' || composed.kind === 'answer') {
      recordUnchanged(report, 'no-op', composed.reason);
      const result = upgradeResult(report);
      // A handshake's answer is the body its sender reads; the report still goes to the log and mail.
      return composed.kind === 'answer' ? { ...result, output: composed.body } : result;
    }
    report.imageAfter = composed.ref;
    report.notes.push(...composed.notes);
    // When it arrived, before any wait: the push's time when its payload names none.
    const time = pushTime(composed.pushedAt, (deps.now ?? (() => new Date()))());
    if (time.future !== undefined) report.notes.push(futureTimeNote('payload', time.future, time.ms));
    const incoming = { pushedAtMs: time.ms, timeFrom: time.from, image: composed.ref, push: composed.pushId };
    const push = builtPush(incoming, settings, deps);
    report.pushedAtMs = time.ms;
    const client = deps.client ?? (ownClient = upgradeClient(deps));
    const workloadKey = `${cluster ?? ''}/${settings.namespace}/${settings.workload.kind}/${settings.workload.name}`;
    const apply = async () => {
      if (deps.abandon?.aborted) {
        recordUnchanged(report, 'superseded', KEPT_SUPERSEDED);
        return;
      }
      let ref = composed.candidates ? await candidateFor(client, settings, composed.candidates, report) : composed.ref;
      if (settings.verifyImage) ref = await verifiedRef(client, settings, ref, composed.digest, report, deps);
      report.imageAfter = ref;
      await applyUpgrade(client, settings, { ...push, image: ref }, report, deps);
    };
    await (deps.queue ? deps.queue.run(workloadKey, apply) : apply());
  } catch (e) {
    failedUpgrade(report, e);
  } finally {
    ownClient?.close();
  }
  return upgradeResult(report);
}

/** A client of the push's own (the upgrade mode; the service gives its own): its cluster's credentials. */
function upgradeClient(deps: UpgradeDeps): KubeClient {
  if (!deps.credentials) throw new UpgradeError('no Kubernetes credentials');
  return new KubeClient(deps.credentials());
}

/** A push's boundary: the hook's environment read once into its HookConfig, or the failed result saying why not. */
export function readAtBoundary(
  env: Record<string, string | undefined>,
): { config: HookConfig } | { failed: UpgradeResult } {
  const report = newReport();
  try {
    return { config: readHookConfig(env, report) };
  } catch (e) {
    return { failed: failedPush(report, e) };
  }
}

/** The result of a push refused before it began (a boundary's HookConfig did not read): failedUpgrade's. */
function failedPush(report: UpgradeReport, e: unknown): UpgradeResult {
  failedUpgrade(report, e);
  return upgradeResult(report);
}

/** A failure thrown by a step, in the report: what failed, and whether anything is known to be written. */
function failedUpgrade(report: UpgradeReport, e: unknown): void {
  report.result = 'failed';
  report.error = (e as Error).message;
  if (!report.changed)
    report.decision = e instanceof SignatureRefusal ? 'refused: unsigned' : report.refused ? 'refused' : 'failed';
  report.badInput = e instanceof PayloadError || undefined;
  report.gone = e instanceof PendingGone || undefined;
  // No answer at all, or the server's own failure or throttling, to the end of the retry budget.
  const apiAway = e instanceof KubeError && (e.status === 0 || e.status === 429 || e.status >= 500);
  report.unreachable = apiAway ? 'the API server' : e instanceof RegistryAway ? 'the registry' : undefined;
}

/**
 * A waiting push decided (approved, its window open) or a past push deployed again (deps.decided): the same
 * path as a push from its settings on (pin, the registry and signature check as the hook asks now, policy, hold,
 * newest wins, the waiting step, the patch), with the image the push named. Never throws.
 */
async function runDecidedPush(
  incoming: IncomingPush,
  settings: HookConfig,
  deps: UpgradeDeps & { client: KubeClient },
): Promise<UpgradeResult> {
  const report = configuredReport(settings);
  const cluster = settings.cluster;
  const push = builtPush(incoming, settings, deps);
  try {
    report.imageAfter = push.image;
    report.pushedAtMs = push.pushedAtMs;
    const apply = async () => {
      // What the push was checked against when it came may have changed since (a key, a tag moved), and an entry
      // is only as good as who wrote it: the image is checked again before it is deployed. A replay deploys a past
      // digest on purpose: that digest's signature is checked, not where its tag points now.
      const replay = deps.decided?.action === 'replay';
      const image = !settings.verifyImage
        ? push.image
        : replay
          ? await verifiedAgain(deps.client, settings, push.image, report, deps)
          : await verifiedRef(deps.client, settings, push.image, undefined, report, deps);
      report.imageAfter = image;
      await applyUpgrade(deps.client, settings, { ...push, image }, report, deps);
    };
    // The key a push to this workload queues under (runUpgrade's): the two never run at once.
    const key = `${cluster ?? ''}/${settings.namespace}/${settings.workload.kind}/${settings.workload.name}`;
    await (deps.queue ? deps.queue.run(key, apply) : apply());
  } catch (e) {
    failedUpgrade(report, e);
  }
  return upgradeResult(report);
}

/**
 * A past push's image under the hook's VERIFY_IMAGE and VERIFY_SIGNATURE as they are now: a reference pinned to a
 * digest deploys that digest (its tag may have moved since), whose signature is checked; one without is resolved
 * and checked as a push's (verifiedRef). A refusal throws, nothing written.
 */
async function verifiedAgain(
  client: KubeClient,
  s: UpgradeSettings,
  ref: string,
  report: UpgradeReport,
  deps: UpgradeDeps,
): Promise<string> {
  const parsed = validateImageRef(ref);
  if (!parsed.ok || parsed.ref.digest === undefined) return verifiedRef(client, s, ref, undefined, report, deps);
  const { domain, path: repository, digest } = parsed.ref;
  const pinned = `${domain === undefined ? '' : `${domain}/`}${repository}@${digest}`;
  await verifiedRef(client, s, pinned, digest, report, deps);
  return ref;
}

/** Argument 2, the request's headers when the hook passes them (entire-headers). */
function pushHeaders(text: string | undefined): PushHeaders {
  try {
    return parsePushHeaders(text);
  } catch (e) {
    throw new UpgradeError((e as Error).message);
  }
}

/** Of the references one delivery announced, the one for this container (chooseCandidate), from the workload now. */
async function candidateFor(
  client: KubeClient,
  s: UpgradeSettings,
  candidates: string[],
  report: UpgradeReport,
): Promise<string> {
  const target: WorkloadTarget = { ...s.workload, namespace: s.namespace };
  const workload = await readWorkload(client, target);
  const located = locateContainer(valueAt(workload, [...kindSpec(target.kind).template, 'spec']), s.container);
  const chosen = located ? chooseCandidate(s.container, located.image, candidates, s.pin) : candidates.at(-1)!;
  report.notes.push(
    `the delivery announced ${candidates.length} images (${listWithin(candidates)}); ${chosen} is this container's`,
  );
  return chosen;
}

function upgradeResult(report: UpgradeReport): { output: string; exitCode: number; report: UpgradeReport } {
  return { output: formatReport(report), exitCode: report.result === 'ok' ? 0 : 1, report };
}

/**
 * A push's boundary builds its Push once: what the registry (or the entry decided) says of the image, the workload the
 * hook's settings name, and who asked. Pure.
 */
function builtPush(incoming: IncomingPush, settings: HookConfig, deps: UpgradeDeps): Push {
  const target: WorkloadTarget = { ...settings.workload, namespace: settings.namespace };
  const { requestId, hookId, decided } = deps;
  return { ...incoming, target, cluster: settings.cluster, requestId, hookId, decided };
}

/** The push decided and carried out on its workload (carryOut), then its rollout followed as the hook asks. */
async function applyUpgrade(
  client: KubeClient,
  s: UpgradeSettings,
  push: Push,
  report: UpgradeReport,
  deps: UpgradeDeps,
): Promise<void> {
  const { target } = push;
  const given = { push, config: s, approvals: deps.approvals, followAfter: deps.followAfter };
  const updated = await carryOut(client, given, report, deps);
  if (!updated) return;
  target.generation = numberAt(updated, ['metadata', 'generation']);
  const patchedVersion = valueAt(updated, ['metadata', 'resourceVersion']);
  target.resourceVersion = typeof patchedVersion === 'string' ? patchedVersion : undefined;
  await reportRollout(client, target, updated, s, report, deps);
}

/**
 * The rollout a change started: not tracked, answered as progressing, or followed to its end (and
 * under ROLLBACK_ON_FAILURE, a failed one rolled back).
 */
async function reportRollout(
  client: KubeClient,
  target: WorkloadTarget,
  updated: K8sObject | undefined,
  s: UpgradeSettings,
  report: UpgradeReport,
  deps: UpgradeDeps,
): Promise<void> {
  const spec = kindSpec(target.kind);
  if (!spec.hasRollout) {
    report.rollout = { state: 'not tracked', detail: spec.rollout(updated).message, pods: [] };
    if (s.rollbackOnFailure)
      report.notes.push(`ROLLBACK_ON_FAILURE: a ${target.kind} has no rollout that could fail, so none is rolled back`);
  } else if (s.rolloutTimeoutMs === 0) {
    report.rollout = { state: 'progressing', detail: 'not waited for: ROLLOUT_TIMEOUT is 0', pods: [] };
  } else {
    const options = { timeoutMs: s.rolloutTimeoutMs, container: s.container, image: report.imageAfter };
    const outcome = await followRollout(client, target, { ...options, initial: updated });
    const end = { rollbackOnFailure: s.rollbackOnFailure, timeoutMs: s.rolloutTimeoutMs, deps };
    await applyRolloutEnd(client, target, report, outcome, { ...end, rollbackFollowMs: s.rolloutTimeoutMs });
  }
}

type UpgradeResult = Awaited<ReturnType<typeof runUpgrade>>;

// ================================================================================================
// 38. the upgrade service — the upgrade as the command runner runs it (UpgradeService, its InProcessCommand): one
//    client and one set of kept pushes per cluster (ClusterLane), one per-workload queue for every push, pushes the
//    API server (or, under ON_REGISTRY_AWAY=keep, the registry) does not answer kept and applied when it answers
//    (KeptPushes, answered 202), decided waiting pushes
//    and pushes deployed again (runDecided), and the rollout follower that follows rollouts after the answer.
//    Exports: FannedOut, hookClusters, listWorkloads, ResultListener, ResumedFollow, RolloutFollower, UpgradeOutput,
//    UpgradeService, workloadGroups.
//    Tests: test/burst.test.ts, test/e2e.test.ts, test/outage.test.ts, test/rollback.test.ts, test/upgrade.test.ts.
// ================================================================================================

/** Marks the bundled webhooks.sh: a hook whose command is that file runs the upgrade in-process. */
const UPGRADE_ENTRY_MARKER = 'webhook-upgrade-entry-point';
/** The command every hook file of the old image runs; in the image, a symlink to this executable. */
const UPGRADE_COMMAND = '/webhooks.sh';

/**
 * Whether a resolved command is this program's upgrade entry point: the executable itself under
 * another name (/webhooks.sh as a symlink to it, in the image) or the bundled shim script.
 */
function isUpgradeEntryPoint(file: string): boolean {
  try {
    if (isSea() && fs.realpathSync(file) === fs.realpathSync(process.execPath)) return true;
    const fd = fs.openSync(file, 'r');
    try {
      const head = Buffer.alloc(256);
      return head
        .subarray(0, fs.readSync(fd, head, 0, head.length, 0))
        .toString('latin1')
        .includes(UPGRADE_ENTRY_MARKER);
    } finally {
      fs.closeSync(fd);
    }
  } catch {
    return false;
  }
}

/**
 * Workloads a LIST asks for per request. An answer costs some four times its size on its way (the chunks read,
 * their concatenation, the text, the parsed objects): 100 workloads of a few KiB are a couple of MiB at once, where
 * pages of 500 made the approvals' rescan of a 2,000-workload release, every 30 s, a 20 MB rise of the peak.
 */
const WORKLOAD_LIST_PAGE = 100;

/** Targets by `<namespace>/<kind>`, then by name: what one LIST (or one watch) of a namespace's kind covers. */
function workloadGroups<T extends { namespace: string; kind: WorkloadKind; name: string }>(targets: Iterable<T>) {
  const groups = new Map<string, Map<string, T>>();
  for (const t of targets) {
    const group = `${t.namespace}/${t.kind}`;
    groups.set(group, (groups.get(group) ?? new Map<string, T>()).set(t.name, t));
  }
  return groups;
}

/**
 * The workloads of `targets`, read with one LIST per namespace and kind that holds two or more of them (in pages of
 * WORKLOAD_LIST_PAGE, each page let go before the next) instead of a GET each: `each` is given every target found and
 * its workload, kept lean (leanWorkload). A target alone in its namespace and kind, one a LIST did not find, and the
 * targets of a refused LIST (RBAC that names the workloads) are not given: the caller reads them one by one.
 */
export async function listWorkloads<T extends { namespace: string; kind: WorkloadKind; name: string }>(
  client: KubeClient,
  targets: Iterable<T>,
  each: (target: T, workload: K8sObject) => void,
): Promise<void> {
  const groups = workloadGroups(targets);
  type Page = { items?: K8sObject[]; metadata?: { continue?: string } };
  // A page is let go before the next is asked for: one held across that wait outlives the young generation.
  const listPage = async (ref: ResourceRef, byName: Map<string, T>, next: string | undefined) => {
    const query = { limit: String(WORKLOAD_LIST_PAGE), ...(next ? { continue: next } : {}) };
    const page = await client.list<Page>(ref, query);
    for (const item of page.items ?? []) {
      const target = byName.get(String(valueAt(item, ['metadata', 'name'])));
      if (target) each(target, leanWorkload(item));
    }
    return page.metadata?.continue;
  };
  for (const byName of groups.values()) {
    if (byName.size < 2) continue;
    const { namespace, kind } = byName.values().next().value!;
    const ref = workloadResource({ namespace, kind });
    let next: string | undefined;
    try {
      do {
        next = await listPage(ref, byName, next);
      } while (next);
    } catch {
      /* each is read with a GET instead */
    }
  }
}

const SUPERSEDED_FOLLOW = 'superseded by a later push to this workload, whose report follows the rollout';

/** A push kept while the API server does not answer. */
interface KeptPush {
  args: string[];
  payload: PayloadArgument;
  config: HookConfig;
  requestId: string;
  hook: Hook;
  /** The report answered (202), whose `pending` this push settles. */
  report: UpgradeReport;
  /** What did not answer: the API server, or the registry (ON_REGISTRY_AWAY=keep). */
  who: string;
  deadline: number;
  settle: (report: UpgradeReport) => void;
  /** Aborted when a newer push to the same container replaces this one. */
  abandon: AbortController;
  /** A try is running: a replacement then settles this push with what the try did. */
  trying?: boolean;
}

/**
 * Pushes the API server did not answer within the client's retry budget, or whose registry did not
 * answer under ON_REGISTRY_AWAY=keep: kept (the newest per
 * container, at most UPGRADE_LIMITS.maxKeptPushes), tried again every keptRetryMs until one applies
 * or its deadline (-apply-deadline) passes, and settled with the final report, which the log,
 * Event and mail then tell. Kept in memory: a replica that stops settles what it holds as failed.
 */
class KeptPushes {
  private readonly kept = new Map<string, KeptPush>();
  private retrying = false;
  /** The last try (or the push that started the keeping) got no answer from the API server. */
  private lastTryFailed = false;
  private readonly apply: (k: KeptPush) => Promise<UpgradeResult>;
  private readonly deadlineMs: number;
  private readonly log: Logger;
  private readonly stopping: AbortSignal;

  constructor(apply: (k: KeptPush) => Promise<UpgradeResult>, deadlineMs: number, log: Logger, stopping: AbortSignal) {
    this.apply = apply;
    this.deadlineMs = deadlineMs;
    this.log = log;
    this.stopping = stopping;
  }

  /** The answer for a push the API server did not answer: kept (202), superseded, or failed as it is. */
  keep(push: Pick<KeptPush, 'args' | 'payload' | 'config' | 'requestId' | 'hook'>, result: UpgradeResult) {
    const r = result.report;
    const key = `${r.namespace}/${r.workload}/${r.container}`;
    const held = this.kept.get(key);
    if (held && (held.report.pushedAtMs ?? 0) > (r.pushedAtMs ?? 0)) {
      const superseded = unchanged('superseded', KEPT_SUPERSEDED);
      return upgradeResult({ ...r, result: 'ok', error: undefined, unreachable: undefined, ...superseded });
    }
    if (this.deadlineMs === 0 || this.stopping.aborted || (!held && this.kept.size >= UPGRADE_LIMITS.maxKeptPushes))
      return result;
    held?.abandon.abort();
    if (held && !held.trying)
      held.settle({ ...held.report, pending: undefined, ...unchanged('superseded', KEPT_SUPERSEDED) });
    const deadline = Date.now() + this.deadlineMs;
    const until = new Date(deadline).toISOString();
    let settle!: (report: UpgradeReport) => void;
    const pending = new Promise<UpgradeReport>((resolve) => (settle = resolve));
    const who = r.unreachable ?? 'the API server';
    const report: UpgradeReport = {
      ...r,
      result: 'ok',
      error: undefined,
      decision: 'kept',
      action: `waiting for ${who} (${r.error}): kept, and applied when it answers until ${until}`,
      pending,
    };
    const abandon = new AbortController();
    this.kept.set(key, { ...push, report, who, deadline, settle, abandon });
    // A registry that is away says nothing of the API server, which has just answered this push's reads.
    this.lastTryFailed = who === 'the API server';
    this.log.warn(`[${push.requestId}] ${reportWhere(r)}: ${who} does not answer; push kept until ${until}`);
    if (!this.retrying) void this.retry();
    return { output: formatReport(report), exitCode: 0, report, accepted: true };
  }

  /** Whether the API server is away as far as is known: pushes are kept and the last try failed. */
  away(): boolean {
    return this.kept.size > 0 && this.lastTryFailed;
  }

  /** The loop that tries kept pushes again; it ends when none is left (and keep starts it anew). */
  private async retry(): Promise<void> {
    this.retrying = true;
    try {
      while (this.kept.size > 0 && !this.stopping.aborted) {
        await sleep(UPGRADE_LIMITS.keptRetryMs, undefined, { signal: this.stopping }).catch(() => undefined);
        for (const [key, k] of [...this.kept]) {
          if (this.stopping.aborted || !(await this.retryOne(key, k))) break;
        }
      }
    } finally {
      // Cleared in the same step as the loop's last look at `kept`: a push kept after it starts a new loop.
      this.retrying = false;
    }
  }

  /**
   * One more try of a kept push; false while the API server still does not answer (the other kept
   * pushes then wait for the next round; a registry that is away holds back only its own pushes).
   */
  private async retryOne(key: string, k: KeptPush): Promise<boolean> {
    const limit = formatGoDuration(this.deadlineMs);
    if (Date.now() >= k.deadline) {
      this.fail(key, k, `${k.who} did not answer within -apply-deadline ${limit}`);
      return true;
    }
    k.trying = true;
    const result = await this.apply(k).finally(() => (k.trying = false));
    if (this.kept.get(key) !== k) {
      // Replaced during the try: written before the newer push took over, or not at all.
      const superseded = { ...k.report, pending: undefined, ...unchanged('superseded', KEPT_SUPERSEDED) };
      k.settle(result.report.changed ? result.report : superseded);
      return true;
    }
    const who = result.report.unreachable;
    this.lastTryFailed = who === 'the API server';
    if (who) {
      const why = `${who} did not answer within -apply-deadline ${limit}: ${result.report.error}`;
      if (Date.now() >= k.deadline) this.fail(key, k, why);
      return who !== 'the API server';
    }
    this.kept.delete(key);
    const r = result.report;
    const outcome = r.result === 'ok' ? r.action : `failed: ${r.error}`;
    this.log.notice(`[${k.requestId}] ${reportWhere(r)}: ${k.who} answered again; ${outcome}`);
    k.settle(r);
    return true;
  }

  /** At shutdown: what is still kept is reported as not applied (in memory only, it would be lost). */
  stop(): void {
    for (const [key, k] of [...this.kept])
      this.fail(key, k, `the service stopped before ${k.who} answered`);
  }

  private fail(key: string, k: KeptPush, why: string): void {
    this.kept.delete(key);
    this.log.error(`[${k.requestId}] ${reportWhere(k.report)}: push not applied: ${why}`);
    k.settle({ ...k.report, pending: undefined, ...unchanged('failed', 'not applied'), result: 'failed', error: why });
  }
}

/** A follow another replica recorded, as resumed here: the hook's id and MAIL_TO now, and the request it was. */
interface ResumedFollow {
  hook: string;
  request: string;
  /** The hook's MAIL_TO when the hook fixes it; undefined when it has none or a request chooses it. */
  mailTo: string | undefined;
}

/** A request id as this service writes one (a UUID, or an X-Request-Id taken as it came): printable, bounded. */
const RECORDED_REQUEST_ID = /^[\x21-\x7e]{1,256}$/;
/** A follow record's deadline as followToRecord writes it (toISOString). */
const RECORDED_DEADLINE = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,3})?Z$/;

/**
 * Why a follow record on a workload is not resumed for the hook it names (found among the hooks
 * that fix this workload, else undefined), or undefined when it is. Pure.
 */
function followRecordProblem(
  container: string,
  f: FollowRecord,
  hook: Hook | undefined,
  workload: K8sObject,
  kind: WorkloadKind,
): string | undefined {
  if (!hook) return `hook ${showValue(f.hook)} is not a hook this replica serves for this workload`;
  const fixed = fixedInput(hook, 'APP_CONTAINER')?.trim();
  if (fixed !== undefined && fixed !== container) return `hook ${showValue(hook.id)} upgrades container ${fixed} only`;
  if (!DNS_LABEL.test(container) || !locateContainer(workloadPodSpec(workload, kind), container))
    return 'the workload has no such container';
  if (!RECORDED_REQUEST_ID.test(f.request)) return `request ${showValue(f.request)} is not a request id`;
  if (!RECORDED_DEADLINE.test(f.deadline) || !Number.isFinite(Date.parse(f.deadline)))
    return `deadline ${showValue(f.deadline)} is not a time`;
  return undefined;
}

/** What a resumed follow takes from its hook as loaded now. The pin settings were checked at load. */
function resumeSettings(hook: Hook): { mailTo: string | undefined; rollbackOnFailure: boolean; imagePin: ImagePin } {
  const mailTo = fixedInput(hook, 'MAIL_TO')?.trim() || undefined;
  const rollbackOnFailure = fixedTrue(hook, 'ROLLBACK_ON_FAILURE');
  let pin: ImagePin;
  try {
    pin = readImagePin(fixedInput(hook, 'REGISTRY_HOST'), fixedInput(hook, 'ALLOW_IMAGES'));
  } catch {
    pin = imagePin(undefined);
  }
  return { mailTo, rollbackOnFailure, imagePin: pin };
}

/** `deployment/web in prod`, and its cluster when the hook names one: how the log names a push's workload. */
function reportWhere(r: UpgradeReport): string {
  return `${r.workload} in ${r.namespace}${r.cluster ? ` (cluster ${r.cluster})` : ''}`;
}

/** What the service answers for one push: the upgrade's result, kept (202) or refused as malformed (400). */
type ServiceResult = UpgradeResult & { accepted?: boolean; badInput?: boolean };

/**
 * What the service keeps per cluster: its client (made on first use, with its own token bucket: one
 * cluster's load never slows another's calls), the single-try client used while its API server is
 * away, the workloads it last saw there, and the pushes kept for it.
 */
class ClusterLane {
  readonly known = new KnownWorkloads();
  readonly kept: KeptPushes;
  private shared: KubeClient | undefined;
  private singleTry: KubeClient | undefined;
  readonly credentials: () => KubeCredentials;
  private readonly log: Logger;
  /** Its clients' option that counts their requests in the metrics. */
  private readonly counted: { onRequest: (verb: string) => void };

  constructor(credentials: () => KubeCredentials, kept: KeptPushes, log: Logger, onRequest: (verb: string) => void) {
    this.credentials = credentials;
    this.kept = kept;
    this.log = log;
    this.counted = { onRequest };
  }

  /** The shared client; undefined when there are no credentials (runUpgrade says why, per push). */
  client(): KubeClient | undefined {
    if (!this.shared) {
      try {
        const credentials = this.credentials();
        for (const w of credentials.warnings ?? []) this.log.warn(w);
        this.shared = new KubeClient(credentials, this.counted);
      } catch {
        /* reported per upgrade */
      }
    }
    return this.shared;
  }

  /** A client with the same credentials that tries each request once (no retry budget). */
  singleTryClient(): KubeClient | undefined {
    if (!this.singleTry && this.client())
      this.singleTry = new KubeClient(this.credentials(), { retryBudgetMs: 0, ...this.counted });
    return this.singleTry;
  }
}

/** A delivery fanned out to several clusters (CLUSTERS): each cluster's push with its own result. */
export class FannedOut {
  readonly parts: readonly (ServiceResult & { cluster: string; env: Record<string, string | undefined> })[];
  constructor(parts: FannedOut['parts']) {
    this.parts = parts;
  }
}

/** What the upgrade reports on a command's result: one push's report, or a delivery fanned out to several clusters. */
export type UpgradeOutput = UpgradeReport | FannedOut;

/** The clusters a hook's pushes go to, as it fixes them (CLUSTER or CLUSTERS); [undefined]: the default. */
export function hookClusters(hook: Hook): (string | undefined)[] {
  try {
    const many = HOOK_SETTINGS.CLUSTERS.parse(fixedInput(hook, 'CLUSTERS'));
    return many.length > 0 ? many : [HOOK_SETTINGS.CLUSTER.parse(fixedInput(hook, 'CLUSTER'))];
  } catch {
    return [undefined];
  }
}

/**
 * The upgrade as the runner uses it: one Kubernetes client and one per-workload queue for all
 * pushes (ordering and duplicate coalescing need to see every push), and rollouts followed after
 * the answer has gone, so the final outcome reaches the log, an Event and the mail.
 */
export class UpgradeService implements InProcessCommand<UpgradeOutput> {
  readonly name = 'the upgrade';
  readonly command = UPGRADE_COMMAND;
  private readonly queue = new WorkloadQueue();
  /** Per cluster (the hook's CLUSTER; '' for the default): clients, workloads seen, kept pushes. */
  private readonly lanes = new Map<string, ClusterLane>();
  private readonly warned = new Set<string>();
  /** Per hook (immutable within a snapshot): whether it fixes its workload, so its follows are recorded. */
  private readonly resumable = new WeakMap<Hook, boolean>();
  private approvals: { publicUrl: string; key: Buffer } | undefined;
  private readonly stopping = new AbortController();
  /** One follow per workload: a newer push's follow supersedes the one before. */
  private readonly following = new Map<string, { controller: AbortController; done: Promise<unknown> }>();
  private readonly kubeconfig: string | undefined;
  private readonly env: Record<string, string | undefined>;
  /** The loaded hooks' template variables (useTemplateVariables): no exec plugin inherits them either. */
  private templateVariables: () => ReadonlySet<string> = () => new Set();
  private readonly followMs: number;
  private readonly log: Logger;
  private readonly applyDeadlineMs: number;
  private readonly metrics: Metrics | undefined;

  /** applyDeadlineMs: how long a push the API server does not answer is kept (0: answered as failed). */
  constructor(
    kubeconfig: string | undefined,
    env: Record<string, string | undefined>,
    followMs: number,
    log: Logger,
    applyDeadlineMs = 0,
    metrics?: Metrics,
  ) {
    this.kubeconfig = kubeconfig;
    this.env = env;
    this.followMs = followMs;
    this.log = log;
    this.applyDeadlineMs = applyDeadlineMs;
    this.metrics = metrics;
  }

  /** The cluster's lane (CLUSTER; undefined: the service's default cluster), made on first use. */
  private lane(cluster: string | undefined): ClusterLane {
    let lane = this.lanes.get(cluster ?? '');
    if (!lane) {
      // A kept push tried again: its HookConfig as its boundary read it.
      const apply = (k: KeptPush) => {
        const deps = { ...this.deps(k.requestId, k.hook, k.config), abandon: k.abandon.signal };
        return runPush(k.args, k.config, deps, k.payload);
      };
      const kept = new KeptPushes(apply, this.applyDeadlineMs, this.log, this.stopping.signal);
      const exec = () => execEnvironment(this.env, this.templateVariables());
      const credentials = () => credentialsFromEnvironment(this.env, this.kubeconfig, cluster, exec());
      const labels = (verb: string) => ({ cluster: cluster ?? '', verb });
      const counted = (verb: string) => this.metrics?.inc('webhook_kubernetes_requests_total', labels(verb));
      lane = new ClusterLane(credentials, kept, this.log, counted);
      this.lanes.set(cluster ?? '', lane);
    }
    return lane;
  }

  /** The lane of a decided push's cluster; a malformed name gets none (the push is then refused: no client). */
  private laneOf(cluster: string | undefined): ClusterLane | undefined {
    try {
      return this.lane(HOOK_SETTINGS.CLUSTER.parse(cluster));
    } catch {
      return undefined;
    }
  }

  handles(file: string): boolean {
    return isUpgradeEntryPoint(file);
  }

  /** The loaded hooks' template variables, read when a cluster's credentials are made (before any is: main). */
  useTemplateVariables(current: () => ReadonlySet<string>): void {
    this.templateVariables = current;
  }

  /** A push; with CLUSTERS, one push per cluster at once, each with its own result (FannedOut). */
  async run(
    args: string[],
    env: Record<string, string | undefined>,
    requestId: string,
    hook: Hook,
    value?: { value: unknown },
  ): Promise<ServiceResult | { output: string; exitCode: number; report: FannedOut; accepted?: boolean }> {
    const payload: PayloadArgument = value ?? { text: args[0] };
    let clusters: string[];
    try {
      clusters = HOOK_SETTINGS.CLUSTERS.parse(env.CLUSTERS);
      if (clusters.length > 0 && env.CLUSTER?.trim()) throw new UpgradeError('CLUSTER and CLUSTERS are both set');
    } catch (e) {
      const report = { ...newReport(), decision: 'failed' as const, result: 'failed' as const };
      return { ...upgradeResult({ ...report, error: (e as Error).message }), badInput: true };
    }
    if (clusters.length === 0) return this.runOne(args, payload, env, requestId, hook);
    const parts = await Promise.all(
      clusters.map(async (cluster) => {
        const clusterEnv: typeof env = Object.assign(Object.create(env), { CLUSTER: cluster, CLUSTERS: undefined });
        const one = await this.runOne(args, payload, clusterEnv, `${requestId}/${cluster}`, hook);
        return { cluster, env: clusterEnv, ...one };
      }),
    );
    return {
      output: parts.map((p) => p.output).join('\n'),
      exitCode: parts.every((p) => p.exitCode === 0) ? 0 : 1,
      report: new FannedOut(parts),
      // One cluster's push kept while its API server is away: the delivery is accepted, not failed.
      accepted: parts.some((p) => p.accepted) || undefined,
    };
  }

  /** An HTTP delivery's push to one cluster: its boundary, where the hook's environment becomes its HookConfig. */
  private async runOne(
    args: string[],
    payload: PayloadArgument,
    env: Record<string, string | undefined>,
    requestId: string,
    hook: Hook,
  ): Promise<ServiceResult> {
    const read = readAtBoundary(env);
    if ('failed' in read) return read.failed;
    const { config } = read;
    const deps = this.deps(requestId, hook, config);
    const lane = this.lane(config.cluster);
    // While the API server is known to be away, one try: a push is kept (202) without waiting
    // through the retry budget, which would outlast many a registry's delivery timeout.
    if (lane.kept.away()) deps.client = lane.singleTryClient() ?? deps.client;
    const result = await runPush(args, config, deps, payload);
    const r = result.report;
    // Logged whatever the verbosity: someone tried to deploy a repository the hook does not allow.
    if (r.refused)
      this.log.error(`[${requestId}] hook ${hook.id}: push to ${reportWhere(r)} refused: ${r.error}`);
    if (r.unreachable) return lane.kept.keep({ args, payload, config, requestId, hook }, result);
    if (r.decision === 'waiting' || r.decision === 'approved') return { ...result, accepted: true };
    return r.badInput ? { ...result, badInput: true } : result;
  }

  /** -public-url and the -approval-key-file's key: links for pushes that wait for an approval. */
  useApprovals(approvals: { publicUrl: string; key: Buffer }): void {
    this.approvals = approvals;
  }

  /**
   * A decided push's environment: what a push's command inherits (inheritedEnvironment: never the service's
   * MAIL_* and NOTIFY_*), the settings the hook fixes in its file, its workload, and the one cluster it is in
   * (CLUSTER; undefined: the default), which one of a CLUSTERS hook's.
   */
  decidedEnv(
    hook: Hook,
    target: { namespace: string; kind: WorkloadKind; name: string },
    container: string,
    cluster: string | undefined,
  ): Record<string, string | undefined> {
    // A copy of its own: inheritedEnvironment makes a new object on each call.
    const env: Record<string, string | undefined> = inheritedEnvironment(this.env, hook.templateVariables);
    for (const name of Object.keys(HOOK_SETTINGS)) env[name] = fixedInput(hook, name) ?? env[name];
    const workload = `${target.kind}/${target.name}`;
    Object.assign(env, { APP_NS: target.namespace, APP_WORKLOAD: workload, APP_CONTAINER: container });
    return Object.assign(env, { CLUSTER: cluster, CLUSTERS: undefined });
  }

  /** The client of a cluster (undefined: the default), which the approvals read and write; undefined without one. */
  kube(cluster: string | undefined): KubeClient | undefined {
    return this.lane(cluster).client();
  }

  /**
   * A waiting push decided, or a past push deployed again (runDecidedPush), with the hook's settings as they are
   * now: those it fixes in its file, and the workload and container of the push.
   */
  async runDecided(
    hook: Hook,
    target: { namespace: string; kind: WorkloadKind; name: string },
    container: string,
    push: IncomingPush,
    decided: NonNullable<UpgradeDeps['decided']>,
    requestId: string,
    cluster: string | undefined,
  ): Promise<UpgradeResult & { env: Record<string, string | undefined> }> {
    const env = this.decidedEnv(hook, target, container, cluster);
    const client = this.laneOf(cluster)?.client();
    if (!client) throw new UpgradeError('no Kubernetes credentials');
    const read = readAtBoundary(env);
    if ('failed' in read) return { ...read.failed, env };
    const deps = { ...this.deps(requestId, hook, read.config), client, decided, known: undefined };
    return { ...(await runDecidedPush(push, read.config, deps)), env };
  }

  /**
   * A follow is recorded on the workload only where a replica starting next would find it: the hook
   * fixes the workload (hookReach). Otherwise this replica reports the rollout's end, even at shutdown.
   */
  private deps(requestId: string, hook: Hook, config: HookConfig): UpgradeDeps {
    let resumable = this.resumable.get(hook);
    if (resumable === undefined) this.resumable.set(hook, (resumable = hookReach(hook)?.target !== undefined));
    const lane = this.lane(config.cluster);
    return {
      client: lane.client(),
      kubeconfig: this.kubeconfig,
      credentials: lane.credentials,
      requestId,
      hookId: hook.id,
      queue: this.queue,
      eventAfterAnswer: true,
      known: lane?.known,
      followAfter: this.followMs > 0 && resumable ? { followMs: this.followMs, mailTo: config.mailTo } : undefined,
      approvals: this.approvals,
    };
  }

  /**
   * Follows a rollout the upgrade left progressing, then logs and records its end. Resolves with
   * the report brought up to date (or unchanged when there is nothing to follow), or undefined when
   * the end is not this replica's to report: another replica took the follow record, or this one
   * is stopping and leaves the record for the replica that starts next.
   */
  async follow(
    report: UpgradeReport,
    requestId: string,
    onProgress?: (outcome: RolloutOutcome) => void,
    followMs = this.followMs,
  ): Promise<UpgradeReport | undefined> {
    // A push kept while the API server was away: its final report, once it has one.
    if (report.pending) return this.follow(await report.pending, requestId, onProgress, followMs);
    const eventFailure = await report.afterAnswer;
    if (eventFailure) this.log.error(`[${requestId}] ${reportWhere(report)}: ${eventFailure}`);
    const target = report.target;
    const lane = this.lane(report.cluster);
    const client = lane.client();
    if (!client || !target || !report.changed || report.rollout?.state !== 'progressing' || followMs === 0)
      return report;
    const knownKey = `${target.namespace}/${target.kind}/${target.name}`;
    const key = `${report.cluster ?? ''}/${knownKey}`;
    this.following.get(key)?.controller.abort();
    const controller = new AbortController();
    const signal = AbortSignal.any([controller.signal, this.stopping.signal]);
    const container = report.container ?? '';
    const options = {
      ...{ timeoutMs: followMs, container, image: report.imageAfter, signal, onProgress },
      initial: lane.known.get(knownKey),
      warn: (message: string) => this.warnOnce(`${client.server} ${target.namespace} ${target.kind}`, message),
      seen: (workload: Record<string, unknown>) => lane.known.set(knownKey, workload),
    };
    const done = followRollout(client, target, options);
    this.following.set(key, { controller, done });
    const outcome = await done;
    if (this.following.get(key)?.done === done) this.following.delete(key);
    if (controller.signal.aborted) {
      // A later push to this workload is being followed now; its mail tells how the rollout ended.
      // (A push to another container of it leaves this one's record: taken off, it is not resumed.)
      if (report.followRecorded)
        await claimFollow(client, target, report.container ?? '', requestId, lane.known).catch(() => undefined);
      return { ...report, rollout: { state: 'progressing', detail: SUPERSEDED_FOLLOW, superseded: true, pods: [] } };
    }
    const claim = await this.claim(report, client, target, requestId);
    if (claim === 'superseded')
      return { ...report, rollout: { state: 'progressing', detail: SUPERSEDED_FOLLOW, superseded: true, pods: [] } };
    if (claim !== 'claimed') return undefined;
    return this.ended({ ...report, rollout: outcome }, client, target, requestId);
  }

  /** A warning logged once per subject (a watch refused in a namespace) for the life of this service. */
  private warnOnce(subject: string, message: string): void {
    if (this.warned.has(subject)) return;
    this.warned.add(subject);
    this.log.warn(message);
  }

  /** Whether this replica reports the end of a follow recorded on the workload (see claimFollow). */
  private async claim(
    report: UpgradeReport,
    client: KubeClient,
    target: WorkloadTarget,
    requestId: string,
  ): Promise<'claimed' | 'superseded' | 'gone' | 'left'> {
    if (!report.followRecorded) return 'claimed';
    const where = `[${requestId}] ${reportWhere(report)}`;
    if (this.stopping.signal.aborted) {
      this.log.notice(`${where}: stopping; the rollout's follow is left to the replica that starts next`);
      return 'left';
    }
    try {
      const known = this.lane(report.cluster).known;
      const claim = await claimFollow(client, target, report.container ?? '', requestId, known);
      if (claim === 'gone') this.log.info(`${where}: another replica reported the rollout's end`);
      return claim;
    } catch (e) {
      // Reported twice rather than never: without the API server the record cannot be taken.
      this.log.error(`${where}: the follow record could not be taken off: ${(e as Error).message}`);
      return 'claimed';
    }
  }

  /**
   * At start: the follows other replicas recorded on the workloads of the hooks this one serves
   * (those whose namespace and workload the hook fixes) and did not finish are followed here, for
   * no longer than -rollout-follow; `ended` gets each report this replica is the one to report.
   * A record is resumed only for the hook it names when that hook fixes this workload (and its
   * container, when the hook fixes one); mail recipients, the rollback setting and the image pin
   * are that hook's, never the record's. Any other record is dropped with a warning.
   */
  async resumeFollows(hooks: Iterable<Hook>, ended: (report: UpgradeReport, follow: ResumedFollow) => void) {
    if (this.followMs === 0) return;
    const served = new Map<
      string,
      { target: { namespace: string; kind: WorkloadKind; name: string }; hooks: Hook[]; cluster?: string }
    >();
    for (const hook of hooks) {
      const t = hookReach(hook)?.target;
      if (!t) continue;
      for (const cluster of hookClusters(hook)) {
        const key = `${cluster ?? ''}/${t.namespace}/${t.kind}/${t.name}`;
        served.set(key, { target: t, cluster, hooks: [...(served.get(key)?.hooks ?? []), hook] });
      }
    }
    // The served workloads of each cluster, read with one LIST per namespace and kind where several share one.
    const listed = new Map<string, Map<string, K8sObject>>();
    for (const { target, hooks: servedHooks, cluster } of served.values()) {
      const client = this.lane(cluster).client();
      if (!client) continue;
      const where = `${target.kind}/${target.name} in ${target.namespace}${cluster ? ` (cluster ${cluster})` : ''}`;
      if (!listed.has(cluster ?? '')) {
        const targets = [...served.values()].filter((s) => s.cluster === cluster).map((s) => s.target);
        listed.set(cluster ?? '', await this.listServed(client, targets, this.lane(cluster).known));
      }
      const key = `${target.namespace}/${target.kind}/${target.name}`;
      let workload: K8sObject;
      try {
        workload = listed.get(cluster ?? '')?.get(key) ?? (await readWorkload(client, target));
      } catch (e) {
        this.log.warn(`unfinished follows on ${where}: ${(e as Error).message}`);
        continue;
      }
      const { entries, dropped } = readFollowRecords(workload);
      for (const name of dropped) this.log.warn(`${where}: follow record ${showValue(name)} dropped: malformed`);
      for (const [container, f] of Object.entries(entries)) {
        const hook = servedHooks.find((h) => h.id === f.hook);
        const problem = followRecordProblem(container, f, hook, workload, target.kind);
        if (problem || !hook) {
          this.log.warn(`${where}: follow record of container ${showValue(container)} dropped: ${problem}`);
          continue;
        }
        this.resumeOne({ ...target }, container, f, hook, workload, ended, cluster);
      }
    }
  }

  /**
   * The served workloads of each namespace and kind that serves several, read with one LIST each (listWorkloads)
   * instead of a GET each. What it finds also seeds the copies the first pushes are patched on
   * (`known`), so they need no read of their own: a patch decided on a copy tests the image and the annotations
   * its decision read (the policy, the approval, the window), and a copy that is stale is read again. A refused
   * LIST (RBAC that names the workloads) leaves them to their GETs.
   */
  private async listServed(
    client: KubeClient,
    targets: WorkloadTarget[],
    known: KnownWorkloads,
  ): Promise<Map<string, K8sObject>> {
    const found = new Map<string, K8sObject>();
    await listWorkloads(client, targets, (t, workload) => {
      const key = `${t.namespace}/${t.kind}/${t.name}`;
      found.set(key, workload);
      // A copy a push has made since (its PATCH's answer) is newer than the list.
      if (!known.get(key)) known.set(key, workload);
    });
    return found;
  }

  /** Follows one recorded rollout to its end (see resumeFollows), with the hook's settings. */
  private resumeOne(
    target: WorkloadTarget,
    container: string,
    f: FollowRecord,
    hook: Hook,
    workload: K8sObject,
    ended: (report: UpgradeReport, follow: ResumedFollow) => void,
    cluster?: string,
  ): void {
    const settings = resumeSettings(hook);
    this.log.notice(
      `[${f.request}] ${target.kind}/${target.name} in ${target.namespace}: resuming the rollout's follow`,
    );
    const report = resumedReport(target, container, f, workload, settings);
    report.cluster = cluster;
    this.lane(cluster).known.set(`${target.namespace}/${target.kind}/${target.name}`, workload);
    const remaining = Math.min(this.followMs, Math.max(1, Date.parse(f.deadline) - Date.now()));
    const follow: ResumedFollow = { hook: hook.id, request: f.request, mailTo: settings.mailTo };
    void this.follow(report, f.request, undefined, remaining).then(
      (r) => r && ended(r, follow),
      (e: Error) => this.log.error(`[${f.request}] ${e.message}`),
    );
  }

  /** A followed rollout has ended: logged, recorded as an Event, and rolled back if it failed and the hook asks. */
  private async ended(
    updated: UpgradeReport,
    client: KubeClient,
    target: WorkloadTarget,
    requestId: string,
  ): Promise<UpgradeReport> {
    const outcome = updated.rollout!;
    await applyRolloutEnd(client, target, updated, outcome, {
      rollbackOnFailure: updated.rollbackOnFailure === true,
      rollbackFollowMs: this.followMs,
      deps: { requestId },
      eventFailed: (message) => this.log.error(`[${requestId}] ${message}`),
    });
    const rollback = updated.rollback ? `; ${formatRollback(updated.rollback)}` : '';
    const where = reportWhere(updated);
    const line = `[${requestId}] ${where}: rollout ${formatRollout(outcome)}${rollback}`;
    if (updated.result === 'ok') this.log.info(line);
    else this.log.error(line);
    return updated;
  }

  /** At shutdown: rollouts still followed end now (their mails then go out). */
  async stop(ms: number): Promise<void> {
    this.stopping.abort();
    for (const lane of this.lanes.values()) lane.kept.stop();
    await Promise.race([
      Promise.allSettled([...this.following.values()].map((f) => f.done)),
      sleep(ms, undefined, { ref: false }),
    ]);
  }
}

/**
 * What becomes of a finished command after its answer, in the order it happens: the answer, the
 * rollout's progress, its end (or that another replica reports it). The result chapter implements it.
 */
export interface ResultListener {
  started(hook: Hook, req: HookRequest): void;
  answered(hook: Hook, req: HookRequest, r: CommandResult<UpgradeOutput>, report: UpgradeReport | undefined): void;
  progressed(req: HookRequest, rollout: RolloutOutcome): void;
  /** The final result: the command's, or the upgrade's once its rollout has ended. */
  settled(hook: Hook, req: HookRequest, r: CommandResult<UpgradeOutput>, report: UpgradeReport | undefined): void;
  /** The rollout's end is reported by another replica (or the next to start): nothing is sent from here. */
  handedOver(req: HookRequest, detail: string): void;
  /** A follow another replica left, ended here. */
  resumed(report: UpgradeReport, follow: ResumedFollow): void;
  /** The request fanned out to several clusters, each now a request of its own (`requests`): its record is done. */
  fannedOut(hook: Hook, req: HookRequest, r: CommandResult<UpgradeOutput>, requests: string[]): void;
}

const FOLLOW_HANDED_OVER = "left to another replica of the webhook, which reports the rollout's end";

/**
 * The http server's CommandListener: a finished upgrade's rollout is followed to its end after the
 * answer (UpgradeService.follow), and each step is handed on to the result; any other command's
 * result is final at once.
 */
export class RolloutFollower implements CommandListener<UpgradeOutput> {
  private readonly upgrade: UpgradeService;
  private readonly log: Logger;
  private readonly next: ResultListener;
  /** Results whose rollout is still followed, until they are handed on. */
  private readonly settling = new Set<Promise<void>>();

  constructor(upgrade: UpgradeService, log: Logger, next: ResultListener) {
    this.upgrade = upgrade;
    this.log = log;
    this.next = next;
  }

  started(hook: Hook, req: HookRequest): void {
    this.next.started(hook, req);
  }

  finished(hook: Hook, req: HookRequest, r: CommandResult<UpgradeOutput>): void {
    if (r.report instanceof FannedOut) return this.fannedOut(hook, req, r, r.report);
    const report = r.report;
    this.next.answered(hook, req, r, report);
    if (!report) return this.next.settled(hook, req, r, undefined);
    const progressed = (p: RolloutOutcome) => this.next.progressed(req, p);
    const settling: Promise<void> = this.upgrade
      .follow(report, req.id, progressed)
      .then(
        // undefined: another replica reports this rollout's end (the follow records).
        (final) => (final ? this.next.settled(hook, req, r, final) : this.next.handedOver(req, FOLLOW_HANDED_OVER)),
        (e: Error) => {
          this.log.error(`[${req.id}] ${e.message}`);
          this.next.settled(hook, req, r, report);
        },
      )
      .finally(() => this.settling.delete(settling));
    this.settling.add(settling);
  }

  /**
   * CLUSTERS: each cluster's push goes on as a request of its own (`<request>/<cluster>`), with its own
   * record, follow, Event, mail and notifications; the delivery's record says where it went.
   */
  private fannedOut(hook: Hook, req: HookRequest, r: CommandResult<UpgradeOutput>, f: FannedOut): void {
    const requests = f.parts.map((p) => `${req.id}/${p.cluster}`);
    this.next.fannedOut(hook, req, r, requests);
    f.parts.forEach((p, i) => {
      const part: HookRequest = { ...req, id: requests[i] };
      const { cluster: _, env, ...result } = p;
      this.next.started(hook, part);
      this.finished(hook, part, { ...r, ...result, env, ok: p.exitCode === 0, exitCode: p.exitCode });
    });
  }

  /**
   * At shutdown, once the follows have been told to end: waits up to `ms` for their results to be
   * handed on (a follow ends with an Event written first), so that the flushes that come next have them.
   */
  async settle(ms: number): Promise<void> {
    await Promise.race([Promise.allSettled([...this.settling]), sleep(ms, undefined, { ref: false })]);
  }

  /** At start: follows other replicas left unfinished are finished here, and their results handed on. */
  resume(hooks: Iterable<Hook>): void {
    this.upgrade
      .resumeFollows(hooks, (report, follow) => this.next.resumed(report, follow))
      .catch((e: Error) => this.log.error(`unfinished follows not resumed: ${e.message}`));
  }
}

// ================================================================================================
// 39. approvals — completes the pushes that wait (the patch chapter's waiting step) on whichever replica acts
//    first: an approval link's confirmation page and its POST (GET never decides), the deliveries page's Approve,
//    Reject and Deploy again, a change window's opening and an expiry. Each decision reads the workload, checks the
//    pending entry the link names is still there, and completes it by a patch that tests the annotation it read (a
//    second use, or a second replica, finds nothing to do). An entry is used only when its MAC verifies where it
//    sits and its hook serves that workload, container and cluster (pendingEntryProblem); any other is taken off
//    with a warning and a Warning Event. An approved push goes through the same path as a push
//    (UpgradeService.runDecided); a rejected or expired one only loses its entry. The result goes to the command
//    listener like a push's: recorded, followed, mailed and posted. A replica knows the waiting pushes its own
//    answers recorded, and learns the others' from the workloads its hooks reach: a watch per namespace and kind
//    (listed once, shared with the follows), or, where it has none, one LIST per namespace and kind every rescanMs;
//    in each cluster its hooks name (a waiting push, its key and its links carry the cluster). A link once decided
//    is remembered until it expires: used again, it is answered 410 without asking the API server.
//    Exports: approvalHooksProblem, ApprovalService, waitingKey, WaitingPush.
//    Tests: test/approvals.test.ts, test/clusters.test.ts, test/signed-images.test.ts, test/unit.test.ts.
// ================================================================================================

const APPROVAL_LIMITS = {
  // Another replica's waiting pushes (one that stopped leaves them) are found within this long; a window's
  // opening on one of them is acted on that late at worst. One LIST (in pages) per namespace and kind the hooks reach
  // (a GET where they reach one workload there): a release's 2,000 workloads are 20 requests, not 2,000.
  rescanMs: 30_000,
  // Known waiting pushes are checked this often for an opened window or an expiry: in memory, no API call.
  tickMs: 1_000,
  // A name in the form is a person's name or handle.
  maxNameChars: 100,
  // A window's opening or an expiry that could not be acted on (the API server away) is tried again this much
  // later, not on every tick.
  retryMs: 30_000,
  // Decided entries remembered, so that their links, used again, cost no API call (until they expire, 24 h by
  // default). Each is an id and a time, some 100 bytes: 1 MB at most, more than a day of a release's approvals.
  // Past it the oldest is forgotten, and its link costs one read again.
  rememberedDecisions: 10_000,
};

/** One waiting push as a replica knows it: where it waits (the cluster: undefined for the default), its entry. */
export interface WaitingPush {
  target: { namespace: string; kind: WorkloadKind; name: string };
  container: string;
  cluster: string | undefined;
  entry: PendingEntry;
}

/**
 * Why a pending entry is not used (dropped with a warning), or undefined: its MAC does not verify where it sits
 * (sealed with the links' key), or its hook does not serve that workload, container or cluster. Pure.
 */
export function pendingEntryProblem(key: Buffer | undefined, w: WaitingPush, hook: Hook): string | undefined {
  const place = { ...w.target, cluster: w.cluster, container: w.container };
  if (!pendingEntrySealed(key, place, w.entry))
    return 'its MAC does not verify: it was not written here by this service (changed by hand, or by a version ' +
      'before entries had one, or with another key)';
  const reach = hookReach(hook)?.target;
  const t = w.target;
  if (reach && (reach.namespace !== t.namespace || reach.kind !== t.kind || reach.name !== t.name))
    return `hook ${showValue(hook.id)} upgrades ${reach.kind}/${reach.name} in ${reach.namespace} only`;
  const container = fixedInput(hook, 'APP_CONTAINER')?.trim();
  if (container !== undefined && container !== w.container)
    return `hook ${showValue(hook.id)} upgrades container ${container} only`;
  const clusters = hookClusters(hook);
  if (!clusters.includes(w.cluster))
    return `hook ${showValue(hook.id)} upgrades ${clusters.map((c) => c ?? 'the default cluster').join(', ')} only`;
  return undefined;
}

/** The push a link names as read now, or why there is none to decide (`drop` takes an unused entry off). */
type FoundPush =
  | { push: WaitingPush; running: string }
  | { gone: string; drop?: () => Promise<void> }
  | { refused: string };

/** What a decision did, for the page that asked for it. */
interface DecisionOutcome {
  status: number;
  title: string;
  detail: string;
  report?: string;
}

const APPROVAL_PAGE_HEADERS = {
  'Content-Type': 'text/html; charset=utf-8',
  'Content-Security-Policy':
    "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
  'Cache-Control': 'no-store',
  // The link is the key: the page's own address never leaves in a Referer.
  'Referrer-Policy': 'no-referrer',
  'X-Robots-Tag': 'noindex',
};

const ACTION_WORDS: Record<ApprovalClaims['action'], { verb: string; button: string }> = {
  approve: { verb: 'Approve', button: 'Approve and deploy' },
  'deploy-now': { verb: 'Deploy now', button: 'Deploy now, outside the window' },
  reject: { verb: 'Reject', button: 'Reject' },
};

/** A waiting push's key: its cluster, workload and container (one entry waits per container and cluster). */
export function waitingKey(w: Pick<WaitingPush, 'target' | 'container' | 'cluster'>): string {
  return JSON.stringify([w.cluster ?? '', w.target.namespace, w.target.kind, w.target.name, w.container]);
}

/** Where a waiting push is, for the log: `deployment/web in shop (cluster prod)`. */
function waitingWhere(w: Pick<WaitingPush, 'target' | 'cluster'>): string {
  return `${w.target.kind}/${w.target.name} in ${w.target.namespace}${w.cluster ? ` (cluster ${w.cluster})` : ''}`;
}

const USED_LINK = 'This push was decided already, replaced by a newer push, or expired: the link works once.';

/** The page of a link: what it decides, and the form that decides it. Pure. */
function confirmationPage(w: WaitingPush, action: ApprovalClaims['action'], running: string, problem = ''): string {
  const e = w.entry;
  const words = ACTION_WORDS[action];
  const rows: [string, string][] = [
    ['Workload', `${waitingWhere(w)}, container ${w.container}`],
    ['Image now', running],
    ['Image to deploy', e.image],
    ['Pushed', `${e.pushedAt} (${e.timeFrom === 'payload' ? 'by the registry' : 'received'})`],
    ['Hook, request', `${e.hook}, ${e.request}`],
    ['Waits for', waitingAction(e)],
    ['Decides', e.decides],
  ];
  const body = [
    `<h1>${escapeHtml(words.verb)} this push?</h1>`,
    '<p class="meta">Nothing happens until you press the button below.</p>',
    `<table><tbody>${rows.map(([k, v]) => `<tr><th>${k}</th><td><code>${escapeHtml(v)}</code></td></tr>`).join('')}`,
    '</tbody></table>',
    problem ? `<p class="failed"><span class="tag">${escapeHtml(problem)}</span></p>` : '',
    '<form method="post"><p><label>Your name (recorded with the decision)<br>',
    `<input name="name" required maxlength="${APPROVAL_LIMITS.maxNameChars}" autocomplete="name"></label></p>`,
    `<p><button type="submit">${escapeHtml(words.button)}</button></p></form>`,
  ].join('\n');
  return pageShell(`${words.verb} ${e.image} — webhook`, undefined, body);
}

/** The page after a decision, or for a link that cannot be used. Pure. */
function outcomePage(o: DecisionOutcome): string {
  const tone = o.status < 300 ? 'ok' : 'failed';
  const body = [
    `<h1 class="${tone}">${escapeHtml(o.title)}</h1>`,
    `<p>${escapeHtml(o.detail)}</p>`,
    o.report ? `<pre>${escapeHtml(o.report)}</pre>` : '',
  ].join('\n');
  return pageShell(`${o.title} — webhook`, undefined, body);
}

// What a name may not hold, as it is recorded (`Li Lei (10.0.3.7, by link)`) and shown in a log line, a mail, a
// chat message, the page: control characters (C0, C1), line and paragraph separators, the bidirectional marks,
// embeddings, overrides and isolates that would show the text around them in another order; and brackets of any
// kind, since the address and the way the decision came follow the name in brackets: `Alice (10.0.0.9, admin
// token)` would read as an attribution the service never made.
const NAME_CONTROLS = /[\p{Cc}\p{Zl}\p{Zp}\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/u;
const NAME_BRACKETS = /[\p{Ps}\p{Pe}]/u;

/** The name the form gives, or why it cannot be recorded (naming the character and where). Pure. */
function deciderName(form: URLSearchParams | undefined): { name: string } | { problem: string } {
  const name = (form?.get('name') ?? '').trim();
  if (name === '') return { problem: 'Give your name: it is recorded with the decision.' };
  if (name.length > APPROVAL_LIMITS.maxNameChars)
    return { problem: `A name has at most ${APPROVAL_LIMITS.maxNameChars} characters (this one has ${name.length}).` };
  if (NAME_CONTROLS.test(name)) {
    const which = firstCharacter(name, NAME_CONTROLS);
    return { problem: `A name may not hold control, line-separator or bidirectional characters (${which}).` };
  }
  if (NAME_BRACKETS.test(name)) {
    const which = firstCharacter(name, NAME_BRACKETS);
    return { problem: `A name may not hold brackets (${which}): what follows a name in brackets is the service's.` };
  }
  return { name };
}

/** The first character of `text` that `re` matches, for a message: `"(" U+0028 at character 7`. Pure. */
function firstCharacter(text: string, re: RegExp): string {
  const chars = [...text];
  const i = chars.findIndex((c) => re.test(c));
  const code = `U+${chars[i].codePointAt(0)!.toString(16).toUpperCase().padStart(4, '0')}`;
  return `${/[\p{L}\p{N}\p{P}\p{S}]/u.test(chars[i]) ? `"${chars[i]}" ` : ''}${code} at character ${i + 1}`;
}

/**
 * The waiting pushes and their decisions; also the http server's ApprovalPages, and a CommandListener in front
 * of the rollout follower that learns of the pushes this replica recorded as waiting.
 */
/** A watch the approvals keep on one namespace and kind of a cluster: the workloads it teaches, by name. */
interface GroupWatch {
  cluster: string | undefined;
  group: string;
  scope: WatchScope;
  targets: Map<string, WaitingPush['target']>;
  stop: () => void;
}

export class ApprovalService implements ApprovalPages, CommandListener<UpgradeOutput> {
  readonly prefix = APPROVAL_PATH;
  private readonly pushes = new Map<string, WaitingPush>();
  /** Entry ids a decision is working on here: the tick does not start a second one. */
  private readonly acting = new Set<string>();
  /** Entry ids whose window or expiry failed to be acted on (the API server away): not before this time. */
  private readonly retryAt = new Map<string, number>();
  /** Entries not used (pendingEntryProblem) that this replica is taking off: by workload, container and MAC. */
  private readonly dropping = new Set<string>();
  /** Entry ids known decided (taken off, or replaced), until their links expire: a link used again is 410 here. */
  private readonly decided = new Map<string, number>();
  private readonly stopping = new AbortController();
  /** The watch kept on each cluster's namespace and kind the hooks reach with several workloads (its targets). */
  private readonly watches = new Map<string, GroupWatch>();
  private readonly key: Buffer | undefined;
  private readonly upgrade: UpgradeService;
  private readonly hooks: () => ReadonlyMap<string, Hook>;
  private readonly next: CommandListener<UpgradeOutput>;
  private readonly log: Logger;

  constructor(
    key: Buffer | undefined,
    upgrade: UpgradeService,
    hooks: () => ReadonlyMap<string, Hook>,
    next: CommandListener<UpgradeOutput>,
    log: Logger,
  ) {
    this.key = key;
    this.upgrade = upgrade;
    this.hooks = hooks;
    this.next = next;
    this.log = log;
  }

  started(hook: Hook, req: HookRequest): void {
    this.next.started?.(hook, req);
  }

  finished(hook: Hook, req: HookRequest, r: CommandResult<UpgradeOutput>): void {
    // A delivery fanned out (CLUSTERS): each cluster's push, under its own request id.
    const reports: [UpgradeReport | undefined, string][] =
      r.report instanceof FannedOut
        ? r.report.parts.map((p) => [p.report, `${req.id}/${p.cluster}`])
        : [[r.report, req.id]];
    for (const [report] of reports) this.noted(report);
    this.next.finished(hook, req, r);
    for (const [report, id] of reports) if (report?.replaced) this.superseded(report, report.replaced, id);
  }

  /** What a push this replica answered did to the waiting push of its container. */
  private noted(report: UpgradeReport | undefined): void {
    const t = report?.target;
    if (!t || !report.container) return;
    const where = { target: { ...t }, container: report.container, cluster: report.cluster };
    if (report.waiting) this.pushes.set(waitingKey(where), { ...where, entry: report.waiting.entry });
    else if (report.changed || report.decision === 'rejected' || report.decision === 'expired')
      this.pushes.delete(waitingKey(where));
  }

  /** The waiting push a newer one replaced, reported superseded under its own request id. */
  private superseded(newer: UpgradeReport, older: PendingEntry, by: string): void {
    const hook = this.hooks().get(older.hook);
    const t = newer.target;
    if (!hook || !t || !newer.container) return;
    const target = { namespace: t.namespace, kind: t.kind, name: t.name };
    const report = newReport();
    Object.assign(report, {
      namespace: newer.namespace,
      workload: newer.workload,
      container: newer.container,
      imageBefore: newer.imageBefore,
      imageAfter: newer.imageBefore,
      pushedAtMs: Date.parse(older.pushedAt),
    });
    const image = newer.waiting?.entry.image ?? newer.imageAfter;
    const why = `superseded: a newer push, ${image} (request ${by}), replaced it while it waited`;
    recordUnchanged(report, 'superseded', why);
    report.cluster = newer.cluster;
    const env = this.upgrade.decidedEnv(hook, target, newer.container, newer.cluster);
    this.told(hook, older.request, report, env, 'Superseded');
  }

  /** The waiting pushes this replica knows of, oldest first (the deliveries page). */
  list(): WaitingPush[] {
    return [...this.pushes.values()].sort((a, b) => a.entry.receivedAt.localeCompare(b.entry.receivedAt));
  }

  /** At start: the waiting pushes on the workloads the hooks reach, then the clock that acts on them. */
  start(): void {
    const tick = setInterval(() => this.tick(), APPROVAL_LIMITS.tickMs);
    tick.unref();
    const rescan = setInterval(() => void this.rescan(), APPROVAL_LIMITS.rescanMs);
    rescan.unref();
    this.stopping.signal.addEventListener('abort', () => {
      clearInterval(tick);
      clearInterval(rescan);
      for (const w of this.watches.values()) w.stop();
    });
    void this.rescan();
  }

  stop(): void {
    this.stopping.abort();
  }

  /**
   * Reads the workloads the hooks reach, in each cluster they name (and those of the waiting pushes known), for their
   * pending entries.
   */
  async rescan(): Promise<void> {
    const clusters = this.targetsByCluster();
    for (const [key, w] of this.watches)
      if (!clusters.has(w.cluster ?? '')) {
        w.stop();
        this.watches.delete(key);
      }
    // The clusters at once: one whose API server is away does not hold back the others' windows and expiries.
    await Promise.all(
      [...clusters].map(([cluster, targets]) => {
        const client = this.upgrade.kube(cluster || undefined);
        return client && this.rescanCluster(client, cluster || undefined, targets);
      }),
    );
  }

  /** The workloads to read, by cluster ('' for the default) and then by `<namespace>/<kind>/<name>`. */
  private targetsByCluster(): Map<string, Map<string, WaitingPush['target']>> {
    const clusters = new Map<string, Map<string, WaitingPush['target']>>();
    const add = (cluster: string | undefined, t: WaitingPush['target']) => {
      const targets = clusters.get(cluster ?? '') ?? new Map<string, WaitingPush['target']>();
      clusters.set(cluster ?? '', targets.set(`${t.namespace}/${t.kind}/${t.name}`, t));
    };
    for (const hook of this.hooks().values()) {
      const t = hookReach(hook)?.target;
      if (t) for (const cluster of hookClusters(hook)) add(cluster, t);
    }
    for (const w of this.pushes.values()) add(w.cluster, w.target);
    return clusters;
  }

  private async rescanCluster(
    client: KubeClient,
    cluster: string | undefined,
    targets: Map<string, WaitingPush['target']>,
  ): Promise<void> {
    for (const key of this.watched(client, cluster, targets)) targets.delete(key);
    for (const target of await this.listed(client, cluster, targets)) {
      let workload: K8sObject;
      try {
        workload = await readWorkload(client, { ...target });
      } catch (e) {
        this.log.warn(`waiting pushes on ${waitingWhere({ target, cluster })}: ${(e as Error).message}`);
        continue;
      }
      this.learn(cluster, target, workload);
    }
  }

  /**
   * Keeps a watch on each namespace and kind with several targets (listed first; the one the follows there share):
   * each change of a workload teaches its waiting pushes as it comes, so a rescan does not list them again, a
   * release's thousands of workloads every rescanMs. Returns the keys of the targets so kept: those of a watch that
   * has listed its workloads. Until then (the first rescan), and where the watch is refused or fails, the rescans
   * list them (and the next one tries the watch again).
   */
  private watched(client: KubeClient, cluster: string | undefined, targets: Map<string, WaitingPush['target']>) {
    const groups = workloadGroups(targets.values());
    for (const [key, w] of this.watches) {
      if (w.cluster !== cluster || (groups.get(w.group)?.size ?? 0) >= 2) continue;
      w.stop();
      this.watches.delete(key);
    }
    const kept: string[] = [];
    for (const [group, byName] of groups) {
      if (byName.size < 2 || this.stopping.signal.aborted) continue;
      const w = this.watches.get(JSON.stringify([cluster ?? '', group])) ?? this.watchGroup(client, cluster, byName);
      w.targets = byName;
      if (client.watchSynced(w.scope)) kept.push(...[...byName.keys()].map((name) => `${group}/${name}`));
    }
    return kept;
  }

  private watchGroup(client: KubeClient, cluster: string | undefined, targets: Map<string, WaitingPush['target']>) {
    const { namespace, kind } = targets.values().next().value!;
    const scope = { ref: workloadResource({ namespace, kind }), keep: leanWorkload };
    const group = `${namespace}/${kind}`;
    const key = JSON.stringify([cluster ?? '', group]);
    const w: GroupWatch = { cluster, group, scope, targets, stop: () => undefined };
    this.watches.set(key, w);
    w.stop = client.watch(w.scope, undefined, {
      event: (e) => {
        const target = w.targets.get(String(valueAt(e.object, ['metadata', 'name'])));
        if (target) this.learn(cluster, target, e.type === 'DELETED' ? {} : e.object);
      },
      failed: () => {
        if (this.watches.get(key) === w) this.watches.delete(key);
      },
    });
    return w;
  }

  /**
   * The targets of each namespace and kind with several, read with one LIST (listWorkloads) and learnt from; the
   * others (and those of a refused LIST), left to a GET each.
   */
  private async listed(client: KubeClient, cluster: string | undefined, targets: Map<string, WaitingPush['target']>) {
    const found = new Set<WaitingPush['target']>();
    await listWorkloads(client, targets.values(), (target, workload) => {
      this.learn(cluster, target, workload);
      found.add(target);
    });
    // Those the list did not find are read one by one, which names what is missing.
    return [...targets.values()].filter((t) => !found.has(t));
  }

  /**
   * The waiting pushes of one workload of a cluster as read: those of loaded hooks are known, the others forgotten;
   * one that names a loaded hook but is not to be used there (pendingEntryProblem: not sealed there, or its hook
   * does not serve that workload, container or cluster) is taken off with a warning.
   */
  private learn(cluster: string | undefined, target: WaitingPush['target'], workload: K8sObject): void {
    const { entries } = readPendingEntries(workload);
    const here = waitingKey({ target, cluster, container: '' });
    for (const [key, w] of this.pushes) if (waitingKey({ ...w, container: '' }) === here) this.pushes.delete(key);
    for (const [container, entry] of Object.entries(entries)) {
      const hook = this.hooks().get(entry.hook);
      if (!hook) continue;
      const w = { target, container, cluster, entry };
      const problem = pendingEntryProblem(this.key, w, hook);
      if (problem) void this.dropUntrusted(w, problem);
      else this.pushes.set(waitingKey(w), w);
    }
  }

  /**
   * Takes an entry that is not to be used off the workload (a patch that tests the annotation read, so one
   * replica does it), with a warning in the log and a Warning Event (UpgradeRefused) on the workload.
   */
  private async dropUntrusted(w: WaitingPush, problem: string): Promise<void> {
    const client = this.upgrade.kube(w.cluster);
    const id = `${waitingKey(w)}/${w.entry.mac ?? w.entry.id}`;
    if (!client || this.dropping.has(id)) return;
    this.dropping.add(id);
    const where = waitingWhere(w);
    const what = `the waiting push of ${showValue(w.entry.image)} (hook ${showValue(w.entry.hook)})`;
    try {
      if (!(await this.takeOff(client, w))) return;
      const facts = { container: w.container, image: w.entry.image, hook: w.entry.hook, why: problem };
      const event = pushEvent('dropped', facts);
      this.log.warn(`${where}: ${event.message}`);
      await recordWorkloadEvent(client, { ...w.target }, event);
    } catch (e) {
      this.log.warn(`${where}: container ${w.container}: ${what} is not used (${problem}); not taken off: ` +
        (e as Error).message);
    } finally {
      this.dropping.delete(id);
    }
  }

  /** Acts on the known waiting pushes whose window opened or whose wait expired. */
  private tick(): void {
    const now = Date.now();
    for (const w of this.pushes.values()) {
      const e = w.entry;
      if (this.acting.has(e.id) || (this.retryAt.get(e.id) ?? 0) > now) continue;
      if (now >= Date.parse(e.until)) void this.act(w, 'expire', 'nobody decided in time');
      else if (e.waitsFor === 'window' && e.opensAt && now >= Date.parse(e.opensAt))
        void this.act(w, 'window', `the change window ${e.window}`);
    }
  }

  /** One decision of a waiting push, once per entry on this replica; the outcome is logged. */
  private async act(w: WaitingPush, action: 'expire' | 'window', by: string): Promise<void> {
    this.acting.add(w.entry.id);
    const where = waitingWhere(w);
    try {
      const o = await this.decide(w, action, by);
      if (o.status === 409) this.log.info(`${where}: ${o.detail}`);
      if (o.status >= 500) this.retryAt.set(w.entry.id, Date.now() + APPROVAL_LIMITS.retryMs);
    } catch (e) {
      this.log.error(`${where}: ${(e as Error).message}; tried again in ${formatGoDuration(APPROVAL_LIMITS.retryMs)}`);
      this.retryAt.set(w.entry.id, Date.now() + APPROVAL_LIMITS.retryMs);
    } finally {
      this.acting.delete(w.entry.id);
    }
  }

  /** An approval link: GET shows the confirmation page, POST (with a name) decides. */
  async answer(method: 'GET' | 'POST', token: string, form: URLSearchParams | undefined, remoteIp: string) {
    const page = (status: number, body: string): PageAnswer => ({ status, body, headers: APPROVAL_PAGE_HEADERS });
    if (!this.key) return page(404, outcomePage({ status: 404, title: 'Not found', detail: 'No approvals here.' }));
    const read = readApprovalToken(this.key, token, Date.now());
    if ('refused' in read) {
      const status = read.refused.includes('expired') ? 410 : 403;
      return page(status, outcomePage({ status, title: 'This link cannot be used', detail: read.refused }));
    }
    const c = read.claims;
    // Decided already, as this replica knows: no API call (a used link cannot make the service spend its quota).
    const found = (this.decided.get(c.id) ?? 0) > Date.now() ? { gone: USED_LINK } : await this.find(c);
    // A POST on an entry that is not used takes it off (GET changes nothing; the rescans find it too).
    if ('gone' in found && method === 'POST') await found.drop?.();
    if ('gone' in found) return page(410, outcomePage({ status: 410, title: 'Nothing to decide', detail: found.gone }));
    if ('refused' in found)
      return page(403, outcomePage({ status: 403, title: 'This link cannot be used', detail: found.refused }));
    if (method === 'GET') return page(200, confirmationPage(found.push, c.action, found.running));
    const who = deciderName(form);
    if ('problem' in who) return page(400, confirmationPage(found.push, c.action, found.running, who.problem));
    const o = await this.decide(found.push, c.action, `${who.name} (${remoteIp}, by link)`);
    return page(o.status, outcomePage(o));
  }

  /**
   * The push a link names, read from the workload now: gone once decided, replaced or expired, or when the entry
   * is not to be used (pendingEntryProblem; `drop` takes it off); refused when the link was made for another image
   * or hook than the entry's.
   */
  private async find(c: ApprovalClaims): Promise<FoundPush> {
    const client = this.upgrade.kube(c.cluster);
    const target = { namespace: c.namespace, kind: c.kind as WorkloadKind, name: c.name };
    if (!client || !Object.hasOwn(WORKLOAD_KINDS, c.kind)) return { gone: 'the service cannot reach the cluster' };
    let workload: K8sObject;
    try {
      workload = await readWorkload(client, target);
    } catch (e) {
      return { gone: (e as Error).message };
    }
    const entry = readPendingEntries(workload).entries[c.container];
    if (entry?.id !== c.id) {
      // An entry's id is never written again: decided (here or elsewhere), replaced or expired, for good.
      this.remember(c.id, c.exp);
      return { gone: USED_LINK };
    }
    const push = { target, container: c.container, cluster: c.cluster, entry };
    const hook = this.hooks().get(entry.hook);
    const problem = hook ? pendingEntryProblem(this.key, push, hook) : undefined;
    const drop = () => this.dropUntrusted(push, problem!);
    if (problem) return { gone: `This push's entry on the workload is not used: ${problem}.`, drop };
    if (c.hook !== entry.hook || c.image !== entry.image)
      return { refused: 'the link was made for another push (its image or hook is not the waiting one\'s)' };
    const running = locateContainer(workloadPodSpec(workload, target.kind), c.container)?.image ?? '(unknown)';
    return { push, running };
  }

  /**
   * The deliveries page's forms (behind the admin token): Approve or Reject a waiting push it lists, or deploy a
   * past push again.
   */
  async adminAction(form: URLSearchParams, remoteIp: string, past?: PastPush): Promise<DecisionOutcome> {
    const who = deciderName(form);
    if ('problem' in who) return { status: 400, title: 'Not decided', detail: who.problem };
    const by = `${who.name} (${remoteIp}, admin token)`;
    if (past) return this.replay(past, by);
    const w = this.pushes.get(form.get('key') ?? '');
    const action = form.get('action');
    if (!w || w.entry.id !== form.get('id') || (action !== 'approve' && action !== 'reject'))
      return { status: 409, title: 'Nothing to decide', detail: 'This push is no longer waiting here.' };
    return this.decide(w, action, by);
  }

  /** A decision: the push approved (the same path as a push) or its entry taken off, then the result told. */
  private async decide(w: WaitingPush, action: ApprovalClaims['action'] | 'expire' | 'window', by: string) {
    const hook = this.hooks().get(w.entry.hook);
    if (!hook) {
      this.forget(w);
      return { status: 409, title: 'Not decided', detail: `the hook "${w.entry.hook}" is no longer loaded` };
    }
    if (!hookClusters(hook).includes(w.cluster))
      return { status: 409, title: 'Not decided', detail: `the hook "${hook.id}" no longer names ${clusterName(w)}` };
    const requestId = randomUUID();
    if (action === 'reject' || action === 'expire') {
      const report = await this.dropEntry(w, action === 'reject' ? 'rejected' : 'expired', by);
      this.remember(w.entry.id, Date.parse(w.entry.until));
      if (!report) return { status: 409, title: 'Nothing to decide', detail: 'This push was decided already.' };
      const env = this.upgrade.decidedEnv(hook, w.target, w.container, w.cluster);
      return this.told(hook, requestId, report, env, action === 'reject' ? 'Rejected' : 'Expired');
    }
    const e = w.entry;
    const push: IncomingPush = {
      pushedAtMs: Date.parse(e.pushedAt),
      timeFrom: e.timeFrom,
      image: e.image,
      push: e.push,
    };
    const decided = { id: e.id, action, by };
    const r = await this.upgrade.runDecided(hook, w.target, w.container, push, decided, requestId, w.cluster);
    // Gone from the workload: forgotten, not tried again on every tick until a rescan.
    if (r.report.gone) {
      this.forget(w);
      this.remember(e.id, Date.parse(e.until));
      return { status: 409, title: 'Nothing to decide', detail: r.report.error ?? '' };
    }
    // Decided, but not applied (refused, skipped by policy, held, superseded): it no longer waits. Without an
    // answer from the API server it still does, and is tried again.
    const settled = !['waiting', 'approved'].includes(r.report.decision) && !r.report.changed;
    if (settled && !r.report.unreachable) await this.takeOff(this.upgrade.kube(w.cluster)!, w);
    // Taken off, or (approved while the window is closed) written again under a new id.
    if (r.report.changed || r.report.decision === 'approved' || (settled && !r.report.unreachable))
      this.remember(e.id, Date.parse(e.until));
    this.forget(w);
    return this.told(hook, requestId, r.report, r.env, action === 'window' ? 'Applied' : 'Approved');
  }

  /**
   * "Deploy again": the past push's image, in the cluster it went to, through the same checks as a push (the
   * signature checked again, an approval and a window waited for), requested by the admin.
   */
  private async replay(past: PastPush, by: string): Promise<DecisionOutcome> {
    const hook = this.hooks().get(past.hookId);
    if (!hook) return { status: 409, title: 'Not deployed', detail: `the hook "${past.hookId}" is no longer loaded` };
    if (!hookClusters(hook).includes(past.cluster)) {
      const detail = `the hook "${hook.id}" no longer names ${clusterName(past)}: nothing was deployed`;
      return { status: 409, title: 'Not deployed', detail };
    }
    const workload = parseWorkload(past.workload);
    const target = { namespace: past.namespace, ...workload };
    const now = Date.now();
    const push: IncomingPush = { pushedAtMs: now, timeFrom: 'received', image: past.image, push: `replay|${now}` };
    const requestId = randomUUID();
    const decided = { action: 'replay', by } as const;
    const r = await this.upgrade.runDecided(hook, target, past.container, push, decided, requestId, past.cluster);
    return this.told(hook, requestId, r.report, r.env, r.report.waiting ? 'Waiting' : 'Deployed again');
  }

  /** The result of a decision goes where a push's goes (recorded, followed, mailed, posted); the page's outcome. */
  private told(hook: Hook, id: string, report: UpgradeReport, env: Record<string, string | undefined>, done: string) {
    const req: HookRequest = {
      id,
      method: 'POST',
      remoteAddr: '',
      remoteIp: '',
      headers: {},
      query: {},
      payload: undefined,
      body: Buffer.alloc(0),
    };
    const output = formatReport(report);
    const ok = report.result === 'ok';
    this.started(hook, req);
    this.finished(hook, req, { output, env, ok, exitCode: ok ? 0 : 1, timedOut: false, report });
    this.log.notice(`[${id}] ${report.workload} in ${report.namespace}: ${report.action}`);
    const title = ok ? done : 'Failed';
    return { status: ok ? 200 : 500, title, detail: report.error ?? report.action, report: output };
  }

  /** Takes a pending entry off (rejected, expired) by a patch that tests the annotation read; undefined: gone. */
  private async dropEntry(w: WaitingPush, decision: 'rejected' | 'expired', by: string) {
    const client = this.upgrade.kube(w.cluster);
    if (!client) throw new UpgradeError('no Kubernetes credentials');
    const workload = await this.takeOff(client, w);
    return workload && this.droppedReport(client, w, workload, decision, by);
  }

  /** Takes a pending entry off by a patch that tests the annotation read: the workload as read, undefined if gone. */
  private async takeOff(client: KubeClient, w: WaitingPush): Promise<K8sObject | undefined> {
    const target: WorkloadTarget = { ...w.target };
    for (let attempt = 1; attempt <= UPGRADE_LIMITS.maxPatchAttempts; attempt++) {
      const workload = await readWorkload(client, target);
      const { raw, entries } = readPendingEntries(workload);
      if (entries[w.container]?.id !== w.entry.id) return this.forget(w);
      const rest = Object.fromEntries(Object.entries(entries).filter(([c]) => c !== w.container));
      const ops = annotationOps(workload, ['metadata'], { [PENDING_ANNOTATION]: JSON.stringify(rest) }, {
        [PENDING_ANNOTATION]: raw ?? null,
      });
      try {
        await client.patch(workloadResource(target), ops, UPGRADE_LIMITS.fieldManager);
      } catch (e) {
        if (e instanceof KubeError && e.status === 422 && e.causes.length === 0) continue;
        throw e;
      }
      this.forget(w);
      return workload;
    }
    return undefined;
  }

  private forget(w: WaitingPush): undefined {
    this.pushes.delete(waitingKey(w));
    this.retryAt.delete(w.entry.id);
    return undefined;
  }

  /**
   * An entry known decided, until its links expire (rememberedDecisions at most: those expired go first, then the
   * oldest, whose link then costs one read again).
   */
  private remember(id: string, untilMs: number): void {
    const now = Date.now();
    if (!(untilMs > now)) return;
    if (this.decided.size >= APPROVAL_LIMITS.rememberedDecisions)
      for (const [old, until] of this.decided) if (until <= now) this.decided.delete(old);
    const oldest = this.decided.keys().next().value;
    if (this.decided.size >= APPROVAL_LIMITS.rememberedDecisions && oldest !== undefined) this.decided.delete(oldest);
    this.decided.set(id, untilMs);
  }

  /** The report of a rejected or expired push, recorded as an Event. */
  private async droppedReport(
    client: KubeClient,
    w: WaitingPush,
    workload: K8sObject,
    decision: 'rejected' | 'expired',
    by: string,
  ): Promise<UpgradeReport> {
    const e = w.entry;
    const report = newReport();
    const running = locateContainer(workloadPodSpec(workload, w.target.kind), w.container)?.image;
    const at = new Date().toISOString();
    const why = decision === 'rejected' ? `rejected by ${by} at ${at}` : `expired: nobody decided by ${e.until}`;
    Object.assign(report, {
      namespace: w.target.namespace,
      workload: `${w.target.kind}/${w.target.name}`,
      container: w.container,
      imageBefore: running,
      imageAfter: running,
      target: { ...w.target },
      cluster: w.cluster,
      pushedAtMs: Date.parse(e.pushedAt),
    });
    recordUnchanged(report, decision, why);
    report.notes.push(
      `the push of ${e.image} (request ${e.request}) ${decision === 'rejected' ? 'was' : 'has'} ${why}`,
    );
    const event = pushEvent(decision, { container: w.container, image: e.image, why });
    await recordEventQuietly(client, { ...w.target }, event, new Date(), report);
    return report;
  }
}

/**
 * Why the service cannot start as asked: a hook that requires approvals (or lets an approval deploy outside its
 * window) while no links can be signed. Pure.
 */
export function approvalHooksProblem(hooks: Iterable<Hook>, linksOn: boolean): string | undefined {
  if (linksOn) return undefined;
  for (const hook of hooks)
    for (const name of ['REQUIRE_APPROVAL', 'APPROVAL_OVERRIDE'])
      if (fixedTrue(hook, name))
        return (
          `hook ${JSON.stringify(hook.id)} sets ${name}=true, but approval links cannot be made: start the service ` +
          'with -public-url URL (the address people reach it at) and -approval-key-file FILE (the key that signs them)'
        );
  return undefined;
}

/** `cluster prod`, or `the default cluster`: a push's cluster, in a message. Pure. */
function clusterName(w: { cluster: string | undefined }): string {
  return w.cluster === undefined ? 'the default cluster' : `cluster ${showValue(w.cluster)}`;
}

/** A past push the deliveries page deploys again, in the cluster it went to (undefined: the default). */
interface PastPush {
  hookId: string;
  cluster: string | undefined;
  namespace: string;
  workload: string;
  container: string;
  image: string;
}


// ================================================================================================
// 40. the result — one record per push (Delivery, in the DeliveryLog): made when its request comes in, completed
//    as the rollout follower hands on the answer, the rollout's progress and its end, and once final sent to each
//    ResultChannel in order (the mail, then the chat and JSON receivers), whose outcomes are recorded on it. What
//    became of the push is its upgrade report's decision (DECISIONS), published as pushResult says; the channels
//    and the deliveries page render the record, none reads an outcome back from text. The hook settings a result is
//    told with (ResultSettings) are read from the command's environment once, when its job is made (resultSettings),
//    or, for a follow resumed from its record, from the record and the report.
//    Exports: Delivery, DeliveryLog, NotifyTexts, ResultChannel, ResultDispatcher, SendOutcome.
//    Tests: test/decision.test.ts, test/deliveries.test.ts, test/mail.test.ts, test/notify.test.ts,
//    test/resume.test.ts.
// ================================================================================================

const RESULT_LIMITS = {
  // The report a result carries (the page, the JSON document): an upgrade's is under a few KiB; a
  // plain command's output may be up to a MiB, which 200 entries of the deliveries page would hold
  // in memory. The mail and the log keep the whole output.
  maxReportChars: 64 * 1024,
  // A result's detail (why: a refusal, a no-op's reason) is one line; each of the 200 entries keeps it, the page
  // shows it in a table cell. Reasons built from payload data are cut to a KiB already (listWithin); this also
  // bounds a long API or command error.
  maxDetailChars: 4 * 1024,
};

/** How a push ended, as its mail's subject says it. */
type Outcome = 'succeeded' | 'failed' | 'no change';

/** How a result's mail or notification went: sent, failed (after retries), or held back by a cap. */
export interface SendOutcome {
  state: 'sent' | 'failed' | 'held';
  detail: string;
}

/**
 * The hook settings a command's result is told with, read from the command's environment once, when its job is
 * made (resultSettings): any hook's command, not only an upgrade, has its result mailed and posted. Each setting
 * the channels check is kept as given, so that a wrong one fails its channel, never the push.
 */
export interface ResultSettings {
  /** REPO_TYPE, CLUSTER (trimmed), APP_NS, APP_WORKLOAD, APP_CONTAINER when set: where the push went. */
  repoType: string | undefined;
  cluster: string | undefined;
  namespace: string | undefined;
  workload: string | undefined;
  container: string | undefined;
  /** MAIL_TO as given when set: the mail parses it (Mailer.notify). */
  mailTo: string | undefined;
  /** NOTIFY_ON_SKIP: whether a push the update policy skipped goes to the channels. */
  notifyOnSkip: boolean;
  /** NOTIFY_URL, NOTIFY_FORMAT, NOTIFY_SECRET, NOTIFY_TELEGRAM_CHAT as given: the notifications check them. */
  notify: NotifyTexts;
}

/** The notification settings as a hook passes them, for notifyTargets to check. */
export interface NotifyTexts {
  url?: string;
  format?: string;
  secret?: string;
  telegramChat?: string;
}

/** A command's ResultSettings from its environment: the boundary of a result, as readHookConfig is of a push. */
export function resultSettings(env: Readonly<Record<string, string | undefined>>): ResultSettings {
  return {
    repoType: env.REPO_TYPE || undefined,
    cluster: env.CLUSTER?.trim() || undefined,
    namespace: env.APP_NS || undefined,
    workload: env.APP_WORKLOAD || undefined,
    container: env.APP_CONTAINER || undefined,
    mailTo: env.MAIL_TO || undefined,
    notifyOnSkip: notifyOnSkip(env.NOTIFY_ON_SKIP),
    notify: {
      ...{ url: env.NOTIFY_URL, format: env.NOTIFY_FORMAT, secret: env.NOTIFY_SECRET },
      telegramChat: env.NOTIFY_TELEGRAM_CHAT,
    },
  };
}

/**
 * NOTIFY_ON_SKIP: whether a push the update policy skipped goes to the channels. A value the load let through
 * (it is fixed in the file, so checked there) is read as its default.
 */
function notifyOnSkip(value: string | undefined): boolean {
  try {
    return HOOK_SETTINGS.NOTIFY_ON_SKIP.parse(value);
  } catch {
    return true;
  }
}

/**
 * A resumed follow's ResultSettings, its boundary: what its record (MAIL_TO) and its report say, and no
 * notification settings, as a resumed follow has always been told.
 */
function resumedSettings(report: UpgradeReport, follow: ResumedFollow): ResultSettings {
  return {
    ...{ repoType: undefined, cluster: undefined, notifyOnSkip: true, notify: {} },
    ...{ namespace: report.namespace, workload: report.workload, container: report.container },
    mailTo: follow.mailTo || undefined,
  };
}

/** A command's result as its record reads it: its output and how it ended (none for a follow resumed here). */
type Ended = Pick<CommandResult, 'ok' | 'error' | 'output'> | undefined;

/** How a finished command ended, and how its answer said it: an upgrade's report speaks, else its exit status. */
function outcomeOf(r: Ended, report: UpgradeReport | undefined): { outcome: Outcome; action: string } {
  if (report) {
    const outcome = report.result !== 'ok' ? 'failed' : report.changed ? 'succeeded' : 'no change';
    return { outcome, action: report.action };
  }
  return { outcome: r?.ok ? 'succeeded' : 'failed', action: r?.ok ? 'exit status 0' : (r?.error ?? 'failed') };
}

/** The whole text of a result (the mail's body): the upgrade's report with the links that decide a waiting push. */
function resultText(r: Ended, report: UpgradeReport | undefined): string {
  if (!report) return r?.output ?? '';
  const links = report.waiting?.links;
  // The links go to the mail and the page, never to the log.
  const decide = links
    ? `\napprove: ${links.approve}\nreject: ${links.reject}\n` +
      (links.deployNow ? `deploy now: ${links.deployNow}\n` : '')
    : '';
  return formatReport(report) + decide;
}

/**
 * The one record of a push: where it went, what became of it, its rollout, and how its result was sent. The answer's
 * report, the deliveries page, /deliveries.json, the mail and the chat and JSON notifications all render it.
 */
export interface Delivery {
  seq: number;
  /** running: the command; following: the rollout, after the answer; done: the result is final. */
  state: 'running' | 'following' | 'done';
  notifications: { channel: string; state: 'pending' | SendOutcome['state']; detail: string }[];
  hookId: string;
  requestId: string;
  receivedAt: Date;
  finishedAt?: Date;
  outcome?: Outcome;
  /** One of the closed list's words (DECISIONS' `published`). */
  decision: PublishedDecision;
  detail: string;
  /** How the answer said it (`image updated`, `none (<reason>)`), or a command's exit status: the mail's words. */
  action: string;
  /** The hook settings its result is told with: where it goes, and the names the hook gave. */
  settings: ResultSettings;
  registry?: string;
  /** The hook's CLUSTER (a kubeconfig context); undefined: the service's default cluster. */
  cluster?: string;
  namespace?: string;
  workload?: string;
  container?: string;
  imageBefore?: string;
  imageAfter?: string;
  rollout?: { state: string; detail: string };
  pods: PodSummary[];
  /** The upgrade's report (or the command's output), scrubbed of known secrets, cut to maxReportChars. */
  report: string;
  /** A push that waits: for what, until when, and the links that decide it (when a person may). */
  waiting?: { for: string; until: string; opensAt?: string; window?: string; links?: ApprovalLinks };
}

/** What a finished command (or a follow resumed here) tells its record; the rest is the page's. */
type DeliveryFacts = Omit<Delivery, 'seq' | 'state' | 'notifications'>;

/** A push's published word and its detail. */
type PublishedResult = { decision: PublishedDecision; detail: string };

/** What a push decided, from its upgrade report (or, for another command, its exit status). */
function decisionOf(outcome: Outcome, action: string, report: UpgradeReport | undefined): PublishedResult {
  const code = outcome === 'failed' ? 'failed' : 'ran';
  if (!report) return { decision: DECISIONS[code].published, detail: action };
  // The report stays the applied push's; what is published is that its rollout was taken over.
  if (report.rollout?.superseded) return { decision: DECISIONS['taken over'].published, detail: report.rollout.detail };
  const decision = DECISIONS[report.decision].published;
  if (report.decision === 'refused' || report.decision === 'refused: unsigned' || report.decision === 'failed')
    return { decision, detail: report.error ?? '' };
  // The detail of a push that changed nothing is its reason.
  return { decision, detail: report.changed ? report.action : (report.reason ?? report.action) };
}

/** Which push a record is of: its hook, its request, the settings its result is told with. */
interface RecordOf {
  hookId: string;
  requestId: string;
  settings: ResultSettings;
}

/** A push's record from its command's result and report (final, or as known so far). Pure. */
export function deliveryFacts(
  of: RecordOf,
  r: Ended,
  report: UpgradeReport | undefined,
  receivedAt: Date,
  scrub: (text: string) => string,
): DeliveryFacts {
  const s = of.settings;
  const { outcome, action } = outcomeOf(r, report);
  return {
    ...of,
    receivedAt,
    outcome,
    action,
    ...cutDetail(decisionOf(outcome, action, report)),
    registry: s.repoType,
    cluster: report?.cluster ?? s.cluster,
    namespace: report?.namespace ?? s.namespace,
    workload: report?.workload ?? s.workload,
    container: report?.container ?? s.container,
    imageBefore: report?.imageBefore,
    imageAfter: report?.imageAfter,
    rollout: report?.rollout && { state: report.rollout.state, detail: report.rollout.detail },
    pods: report?.rollout?.pods ?? [],
    report: cutReport(scrub(resultText(r, report))),
    ...(report?.waiting ? { waiting: waitingOf(report.waiting) } : {}),
  };
}

/** What the result tells of a waiting push. Pure. */
function waitingOf(w: NonNullable<UpgradeReport['waiting']>): NonNullable<Delivery['waiting']> {
  const e = w.entry;
  return { for: e.waitsFor, until: e.until, opensAt: e.opensAt, window: e.window, links: w.links };
}

function cutReport(text: string): string {
  const max = RESULT_LIMITS.maxReportChars;
  return text.length <= max ? text : `${text.slice(0, max)}\n[… ${text.length - max} more characters]\n`;
}

/** A decision with its detail cut as a report is, to maxDetailChars. Pure. */
function cutDetail(d: PublishedResult): PublishedResult {
  const max = RESULT_LIMITS.maxDetailChars;
  if (d.detail.length <= max) return d;
  return { decision: d.decision, detail: `${d.detail.slice(0, max)} [… ${d.detail.length - max} more characters]` };
}

/** Where a result goes once it is final: the mail, the chat and JSON receivers. */
export interface ResultChannel {
  /**
   * Sends the record's result; `text`, its whole report (scrubbed, not cut), for the mail. Returns each channel used
   * (its name) with the promise of how it went.
   */
  deliver(d: Delivery, text: string): { channel: string; done: Promise<SendOutcome> }[];
}

/**
 * The record of each push, made once when its request comes in and completed as it goes: answered,
 * its rollout's progress, final. The ring keeps the last `size` for the deliveries page; a push
 * still in flight is kept until it is final whatever the size (0: no page, the records still go out).
 */
export class DeliveryLog {
  private readonly entries: Delivery[] = [];
  private readonly inFlight = new Map<HookRequest, Delivery>();
  private seq = 0;
  private readonly size: number;
  private readonly scrub: (text: string) => string;

  constructor(size: number, scrub: (text: string) => string) {
    this.size = size;
    this.scrub = scrub;
  }

  /** Newest first. */
  list(): readonly Delivery[] {
    return this.entries;
  }

  get(seq: number): Delivery | undefined {
    return this.entries.find((d) => d.seq === seq);
  }

  started(hook: Hook, req: HookRequest): void {
    this.open(hook.id, req.id, req);
  }

  /** A new record, on the page unless it keeps none; in flight until final when it has a request. */
  private open(hookId: string, requestId: string, req?: HookRequest): Delivery {
    const d: Delivery = {
      seq: ++this.seq,
      hookId,
      requestId,
      receivedAt: new Date(),
      decision: DECISIONS.running.published,
      detail: 'the command is running',
      action: 'running',
      settings: resultSettings({}),
      state: 'running',
      pods: [],
      report: '',
      notifications: [],
    };
    if (req) this.inFlight.set(req, d);
    if (this.size === 0) return d;
    this.entries.unshift(d);
    if (this.entries.length > this.size) this.entries.pop();
    return d;
  }

  /** Which push a command's result is of: its hook, request and result settings (read from its environment). */
  private recordOf(hook: Hook, req: HookRequest, r: CommandResult): RecordOf {
    return { hookId: hook.id, requestId: req.id, settings: resultSettings(r.env) };
  }

  answered(hook: Hook, req: HookRequest, r: CommandResult, report: UpgradeReport | undefined): void {
    const d = this.inFlight.get(req) ?? this.open(hook.id, req.id, req);
    Object.assign(d, deliveryFacts(this.recordOf(hook, req, r), r, report, d.receivedAt, this.scrub));
    // Final only once settled: the rollout may still fail.
    d.outcome = undefined;
    d.state = report?.rollout?.state === 'progressing' && report.changed ? 'following' : 'running';
  }

  progressed(req: HookRequest, rollout: RolloutOutcome): void {
    const d = this.inFlight.get(req);
    if (d) d.rollout = { state: rollout.state, detail: rollout.detail };
  }

  /** The final record of a push, and its whole text for the mail. */
  settled(hook: Hook, req: HookRequest, r: CommandResult, report: UpgradeReport | undefined): Final {
    const d = this.inFlight.get(req) ?? this.open(hook.id, req.id, req);
    this.inFlight.delete(req);
    return this.final(d, this.recordOf(hook, req, r), r, report);
  }

  /** The final record of a follow another replica left and this one ended: on the page like any other. */
  resumed(report: UpgradeReport, follow: ResumedFollow): Final {
    const d = this.open(follow.hook, follow.request);
    const of = { hookId: follow.hook, requestId: follow.request, settings: resumedSettings(report, follow) };
    return this.final(d, of, undefined, report);
  }

  private final(d: Delivery, of: RecordOf, r: Ended, report: UpgradeReport | undefined): Final {
    const done = { finishedAt: new Date(), state: 'done' as const };
    Object.assign(d, deliveryFacts(of, r, report, d.receivedAt, this.scrub), done);
    return { record: d, text: this.scrub(resultText(r, report)) };
  }

  /** How each channel the final record went to did, as it becomes known. */
  sending(d: Delivery, channels: { channel: string; done: Promise<SendOutcome> }[]): void {
    for (const c of channels) {
      const shown = { channel: c.channel, state: 'pending' as Delivery['notifications'][number]['state'], detail: '' };
      d.notifications.push(shown);
      void c.done.then((o) => Object.assign(shown, { state: o.state, detail: this.scrub(o.detail) }));
    }
  }

  /** A delivery fanned out to several clusters: its record shows the whole answer and the requests it became. */
  fannedOut(hook: Hook, req: HookRequest, r: CommandResult, requests: string[]): void {
    const d = this.inFlight.get(req) ?? this.open(hook.id, req.id, req);
    this.inFlight.delete(req);
    Object.assign(d, deliveryFacts(this.recordOf(hook, req, r), r, undefined, d.receivedAt, this.scrub), {
      decision: DECISIONS['fanned out'].published,
      detail: `to ${requests.length} clusters: ${requests.join(', ')}`,
      finishedAt: new Date(),
      state: 'done',
    });
  }

  handedOver(req: HookRequest, detail: string): void {
    const d = this.inFlight.get(req);
    if (!d) return;
    this.inFlight.delete(req);
    Object.assign(d, { rollout: { state: 'progressing', detail }, finishedAt: new Date(), state: 'done' });
  }

  /** Whether a push is still running or being followed (the page then refreshes itself). */
  busy(entries: readonly Delivery[] = this.entries): boolean {
    return entries.some((d) => d.state !== 'done' || d.notifications.some((n) => n.state === 'pending'));
  }
}

/** A push's final record, and its whole text (scrubbed, not cut) for the mail. */
interface Final {
  record: Delivery;
  text: string;
}

/**
 * The result of every push, step by step as the rollout follower hands it on: recorded in the
 * DeliveryLog, and once final sent to each channel in order (the mail, then the chat and JSON
 * receivers), whose outcomes are recorded too.
 */
export class ResultDispatcher implements ResultListener {
  private readonly log: DeliveryLog;
  private readonly channels: readonly ResultChannel[];
  private readonly metrics: Metrics | undefined;

  constructor(log: DeliveryLog, channels: readonly ResultChannel[], metrics?: Metrics) {
    this.log = log;
    this.channels = channels;
    this.metrics = metrics;
  }

  started(hook: Hook, req: HookRequest): void {
    this.log.started(hook, req);
  }

  answered(hook: Hook, req: HookRequest, r: CommandResult, report: UpgradeReport | undefined): void {
    this.log.answered(hook, req, r, report);
  }

  progressed(req: HookRequest, rollout: RolloutOutcome): void {
    this.log.progressed(req, rollout);
  }

  settled(hook: Hook, req: HookRequest, r: CommandResult, report: UpgradeReport | undefined): void {
    const final = this.log.settled(hook, req, r, report);
    const d = final.record;
    const labels = { hook: hook.id, cluster: d.cluster ?? '', decision: d.decision };
    if (report) this.metrics?.inc('webhook_upgrades_total', labels);
    this.send(final, report);
  }

  handedOver(req: HookRequest, detail: string): void {
    this.log.handedOver(req, detail);
  }

  fannedOut(hook: Hook, req: HookRequest, r: CommandResult, requests: string[]): void {
    this.log.fannedOut(hook, req, r, requests);
  }

  /** A follow another replica left, ended here: recorded and sent as every push's result is. */
  resumed(report: UpgradeReport, follow: ResumedFollow): void {
    this.send(this.log.resumed(report, follow), report);
  }

  /** A final record to each channel in order, unless the hook keeps a skipped push quiet (NOTIFY_ON_SKIP). */
  private send(final: Final, report: UpgradeReport | undefined): void {
    if (report?.decision === 'skipped by policy' && !final.record.settings.notifyOnSkip) return;
    for (const channel of this.channels) this.log.sending(final.record, channel.deliver(final.record, final.text));
  }
}

// ================================================================================================
// 41. mail — mails a hook's result through the server the MAIL_* variables describe (parseMailConfig; MAIL_TO names
//    the recipients): one mail per push after its rollout's end, at most -max-mails-per-hook per -mail-window, the
//    rest summed up in one mail. The Mailer is the result's first ResultChannel.
//    Exports: Mailer, parseMailConfig.
//    Tests: test/mail.test.ts, test/outage.test.ts, test/resume.test.ts.
// ================================================================================================

/**
 * Reads the MAIL_* variables, each by its HOOK_SETTINGS entry. MAIL_SMTP_SERVER unset or empty means
 * mail is off (no config, no errors). Any error means no config, so a half-understood setup never
 * sends; error strings name the variable, never its value.
 */
export function parseMailConfig(env: Readonly<Record<string, string | undefined>>): {
  config?: MailConfig;
  errors: string[];
} {
  if (!env.MAIL_SMTP_SERVER?.trim()) return { errors: [] };
  const errors: string[] = [];
  const read = <T>(name: HookSettingName & `MAIL_${string}`, fallback: T): T => {
    try {
      return (HOOK_SETTINGS[name] as HookSetting<T>).parse(env[name]);
    } catch (e) {
      errors.push((e as Error).message);
      return fallback;
    }
  };
  const host = read<string | undefined>('MAIL_SMTP_SERVER', undefined)
    ?.trim()
    .replace(/^\[(.*)\]$/, '$1');
  if (env.MAIL_FROM === undefined || env.MAIL_FROM.trim() === '')
    errors.push('MAIL_FROM: required when MAIL_SMTP_SERVER is set');
  const from = read<string | undefined>('MAIL_FROM', undefined)?.trim();
  const user = read<string | undefined>('MAIL_SMTP_USER', undefined)?.trim();
  const password = read<string | undefined>('MAIL_PASSWORD', undefined);
  const ca = read<string | undefined>('MAIL_CACERT', undefined);
  const port = read<number>('MAIL_SMTP_PORT', 0);
  // Unset, port 465 means implicit TLS and any other port is asked: the old image spoke implicit TLS on
  // whatever port was set (163.com: 994), STARTTLS servers use 587/25.
  const mode = read<string | undefined>('MAIL_TLS_MODE', 'auto') ?? (port === IMPLICIT_TLS_PORT ? 'implicit' : 'auto');
  const security = mode === 'implicit' ? 'implicit-tls' : mode === 'starttls' ? 'starttls' : 'auto';
  const verifyCertificate = read<boolean>('MAIL_TLS_CHECK', true);
  const allowPlaintextAuth = read<boolean>('MAIL_ALLOW_PLAINTEXT_AUTH', false);
  if (errors.length > 0 || host === undefined || from === undefined) return { errors };
  const config: MailConfig = {
    host,
    port,
    security,
    from,
    user: user ?? from,
    password: password ? new Secret(password) : undefined,
    ca,
    verifyCertificate,
    allowPlaintextAuth,
  };
  return { errors, config: Object.freeze(config) };
}

// ---- mailing a hook's result ----

// Three tries over about six seconds ride out a restarting relay or greylisting's first refusal
// without keeping a mail (or a shutdown that flushes it) waiting for long.
const MAIL_ATTEMPTS = 3;
const MAIL_RETRY_BACKOFF_MS = 2_000;

/**
 * Subject and body of a result mail. The subject keeps the old image's wording (operators filter
 * on it) and adds the outcome: "Webhooks通知: prod-deployment/web-app 更新结果: succeeded".
 */
function resultMail(d: Delivery, text: string): { subject: string; body: string } {
  const { namespace: ns, workload, container, cluster } = d.settings;
  const target = ns && workload && container ? `${ns}-${workload}-${container}` : d.hookId;
  const lines = [
    `hook: ${d.hookId}`,
    `request: ${d.requestId}`,
    ...(cluster ? [`cluster: ${cluster}`] : []),
    ...(ns ? [`namespace: ${ns}`] : []),
    ...(workload ? [`workload: ${workload}`] : []),
    ...(container ? [`container: ${container}`] : []),
    `outcome: ${d.outcome} (${d.action})`,
    '',
    text,
  ];
  return { subject: `Webhooks通知: ${target} 更新结果: ${d.outcome}`, body: lines.join('\n') };
}

/** How many result mails one hook may send in one window; what goes beyond is summarised. */
interface MailCap {
  max: number;
  windowMs: number;
}

/** One hook's mails to one set of recipients in the current window. */
interface MailWindow {
  to: string[];
  sent: number;
  /** One line per result held back, for the summary; `heldCount` may exceed their number. */
  held: string[];
  heldCount: number;
  timer: NodeJS.Timeout;
}

// A summary lists this many held results one per line and counts the rest, so a flood of calls
// cannot grow one mail (or the memory holding it) without bound.
const MAX_SUMMARY_LINES = 100;

/**
 * Sends result mails in the background: the HTTP answer never waits for SMTP. Transient failures
 * are retried; a final failure is logged with the server's reply and counted; `flush` waits for
 * what is still pending (graceful shutdown). Each hook sends at most `cap.max` mails to the same
 * recipients per window; the results beyond go out together in one summary mail when the window
 * closes (or at shutdown), so a burst cannot flood the inbox and nothing is dropped silently.
 */
export class Mailer implements ResultChannel {
  private readonly pending = new Set<Promise<unknown>>();
  private readonly windows = new Map<string, MailWindow>();
  private readonly config: MailConfig | undefined;
  private readonly log: Logger;
  private readonly metrics: Metrics;
  private readonly cap: MailCap;
  private readonly timeouts: Partial<SmtpTimeouts>;

  constructor(
    config: MailConfig | undefined,
    log: Logger,
    metrics: Metrics,
    cap: MailCap = { max: LIMITS.maxMailsPerHook, windowMs: LIMITS.mailWindowMs },
    timeouts: Partial<SmtpTimeouts> = {},
  ) {
    this.config = config;
    this.log = log;
    this.metrics = metrics;
    this.cap = cap;
    this.timeouts = timeouts;
  }

  /** The result channel: the mail, when the hook passes MAIL_TO and mail is configured. */
  deliver(d: Delivery, text: string): { channel: string; done: Promise<SendOutcome> }[] {
    const done = this.notify(d, text);
    return done ? [{ channel: 'mail', done }] : [];
  }

  /** Mails the result when the hook passes MAIL_TO (and mail is configured): resolves with how it went. */
  notify(d: Delivery, text: string): Promise<SendOutcome> | undefined {
    const mailTo = d.settings.mailTo;
    if (!this.config || !mailTo) return undefined;
    let to: string[];
    let mail: { subject: string; body: string };
    try {
      to = HOOK_SETTINGS.MAIL_TO.parse(mailTo);
      mail = resultMail(d, text);
    } catch (e) {
      this.failed(d.requestId, d.hookId, (e as Error).message);
      return Promise.resolve({ state: 'failed', detail: (e as Error).message });
    }
    if (this.withinCap(d, to)) return this.send(d.requestId, d.hookId, to, mail);
    return Promise.resolve({
      state: 'held',
      detail: "beyond the per-hook cap: in the summary mail at the window's end",
    });
  }

  /** Counts the mail against its hook's window; false when it is held back for the summary. */
  private withinCap(d: Delivery, to: string[]): boolean {
    const key = `${d.hookId}\n${to.join(',')}`;
    let window = this.windows.get(key);
    if (!window) {
      const timer = setTimeout(() => this.closeWindow(key), this.cap.windowMs);
      window = { to, sent: 0, held: [], heldCount: 0, timer };
      this.windows.set(key, window);
    }
    if (window.sent < this.cap.max) {
      window.sent++;
      return true;
    }
    if (window.heldCount === 0)
      this.log.warn(
        `[${d.requestId}] hook ${d.hookId} sent ${this.cap.max} mail(s) to ${to.join(', ')} within ` +
          `${formatGoDuration(this.cap.windowMs)}; further results go into one summary mail when that time is up`,
      );
    window.heldCount++;
    if (window.held.length < MAX_SUMMARY_LINES) window.held.push(summaryLine(d));
    this.metrics.inc('webhook_mails_total', { result: 'summarized' });
    return false;
  }

  /** The window is over: what it held back goes out as one summary mail. */
  private closeWindow(key: string): void {
    const window = this.windows.get(key);
    if (!window) return;
    clearTimeout(window.timer);
    this.windows.delete(key);
    if (window.heldCount === 0) return;
    const hookId = key.slice(0, key.indexOf('\n'));
    this.send(`summary`, hookId, window.to, summaryMail(hookId, window, this.cap));
  }

  private failed(requestId: string, hookId: string, why: string): void {
    this.metrics.inc('webhook_mails_total', { result: 'failed' });
    this.log.error(`[${requestId}] mail for hook ${hookId} not sent: ${why}`);
  }

  private send(
    requestId: string,
    hookId: string,
    to: string[],
    mail: { subject: string; body: string },
  ): Promise<SendOutcome> {
    const config = this.config!;
    let message: string;
    try {
      const date = new Date();
      message = composeMessage({ from: config.from, to, ...mail, date, messageId: newMessageId(config.from) });
    } catch (e) {
      this.failed(requestId, hookId, (e as Error).message);
      return Promise.resolve({ state: 'failed', detail: (e as Error).message });
    }
    const options = { to, timeouts: this.timeouts };
    const sending = sendWithRetry(config, message, options, MAIL_ATTEMPTS, MAIL_RETRY_BACKOFF_MS)
      .then((r): SendOutcome => {
        if (r.ok) {
          this.metrics.inc('webhook_mails_total', { result: 'sent' });
          this.log.info(`[${requestId}] mail sent to ${to.join(', ')} over ${r.security}: ${r.reply}`);
          return { state: 'sent', detail: `to ${to.join(', ')} over ${r.security}` };
        }
        const over = r.security ? ` over ${r.security}` : '';
        const why = `${r.stage} failed after ${r.attempts} attempt(s)${over}: ${r.reply}`;
        this.failed(requestId, hookId, why);
        return { state: 'failed', detail: why };
      })
      .finally(() => this.pending.delete(sending));
    this.pending.add(sending);
    return sending;
  }

  /** Sends the summaries still held back, then waits up to `ms` for mails still being sent. */
  async flush(ms: number): Promise<void> {
    for (const key of [...this.windows.keys()]) this.closeWindow(key);
    if (this.pending.size === 0) return;
    this.log.notice(`sending ${this.pending.size} pending mail(s)`);
    await Promise.race([Promise.allSettled([...this.pending]), sleep(ms, undefined, { ref: false })]);
  }
}

/** One held-back result in a summary: request, target, outcome. */
function summaryLine(d: Delivery): string {
  const { namespace: ns, workload, container } = d.settings;
  const target = ns && workload && container ? ` ${ns}-${workload}-${container}:` : '';
  return `request ${d.requestId}:${target} ${d.outcome} (${d.action})`;
}

/** The mail for the results a window held back. Pure. */
function summaryMail(hookId: string, window: MailWindow, cap: MailCap): { subject: string; body: string } {
  const more = window.heldCount - window.held.length;
  const lines = [
    `hook: ${hookId}`,
    `${window.heldCount} more result(s): the hook had sent ${cap.max} mail(s) within ` +
      `${formatGoDuration(cap.windowMs)}, so these were not mailed one by one (with -verbose, the service's ` +
      `log has each one's output).`,
    '',
    ...window.held,
    ...(more > 0 ? [`… and ${more} more not listed`] : []),
  ];
  return { subject: `Webhooks通知: ${hookId} 更新结果: summary of ${window.heldCount} more`, body: lines.join('\n') };
}

// ================================================================================================
// 42. chat & json notifications — a hook's result posted, at the moment its mail goes (after the rollout's end, in
//    the background), to each URL of NOTIFY_URL, in the body NOTIFY_FORMAT names: json (our own document, versioned
//    by its "schema" field, signed in a header with NOTIFY_SECRET), dingtalk (markdown; NOTIFY_SECRET signs the URL),
//    wecom (markdown), feishu and lark (a card; NOTIFY_SECRET signs the body), slack (mrkdwn), teams (an Adaptive
//    Card for a Workflows webhook), discord (an embed), googlechat (a cardsV2 card) or telegram (the Bot API's
//    sendMessage, in HTML, to NOTIFY_TELEGRAM_CHAT). Each format is one entry of NOTIFY_FORMATS: its body, how it
//    signs, how its receiver says no and when to try again; a waiting push's message carries its approval links as
//    buttons (as links in Discord). Every message is fitted within its vendor's documented limits (a cut value says
//    so), and no text that came with a request is markup there. Every request is one outboundRequest under a total
//    deadline (a receiver that dribbles its answer cannot hold a result); transient failures are retried a few times
//    by the outbound-calls chapter's policy (a Retry-After, or the retry_after of Discord's and Telegram's answers,
//    honoured); one hook sends at most -max-notifications-per-hook per -notify-window. The chat URLs carry their
//    robot's key (Telegram's its bot token), so nothing shows more of a URL than its host. NOTIFY_CACERT adds a CA
//    (PEM, or base64 of it) to the ones trusted for https.
//    Exports: Notifier, notifyTargets, resultDocument.
//    Tests: test/decision.test.ts, test/notify.test.ts.
// ================================================================================================

const NOTIFY_LIMITS = {
  // A chat service answers a robot within a second; a request not wholly answered after 10 s (its
  // connection, its answer's headers and body together) is hung, or held open by a receiver that
  // dribbles its answer.
  requestTimeoutMs: 10_000,
  // Three tries over about six seconds ride out a restarting receiver or a brief throttle, like mail.
  attempts: 3,
  backoffMs: 2_000,
  maxBackoffMs: 8_000,
  // A Retry-After longer than what is left of this is not waited for: a result a minute late is
  // still news, one held longer keeps a shutdown waiting (flush).
  retryBudgetMs: 60_000,
  // Robots answer a line of JSON; more is not an answer we can use.
  maxResponseBytes: 64 * 1024,
  // WeCom's markdown content is limited to 4096 bytes and Slack's section text to 3000 characters:
  // the chat message is the summary, cut at this many bytes; the full report is on the page.
  maxChatBytes: 3_000,
};

/**
 * The documented limits of the newer chats, each fitted as its vendor measures it (characters, or the bytes of the
 * JSON sent); characters are counted in UTF-16 units, never fewer than the vendor's. A message's facts share what
 * is left after its fixed parts; a value that does not fit is cut and says so (CUT_NOTE).
 */
const CHAT_LIMITS = {
  // Every card's title: Discord's embed title is at most 256 characters; the others have no more room in a header.
  titleChars: 256,
  // Teams: a message is at most 28 KB ("Create Incoming Webhooks"; the Workflows post-card action says the same).
  // The facts get 16 KB of it: the title, three links of about 1 KB and the card's frame fit in the rest.
  teamsFactBytes: 16_000,
  // Discord ("Embed Limits"): a field's value at most 1,024 characters; an embed's title, description and fields
  // at most 6,000 characters together.
  discordFieldChars: 1_024,
  discordEmbedChars: 6_000,
  // Google Chat: a message, text and cards, at most 32,000 bytes ("Send a message using the Google Chat API"). The
  // facts get 24,000 bytes; the buttons' links and the card's frame fit in the rest.
  googleChatFactBytes: 24_000,
  // Telegram: sendMessage's text is 1-4,096 characters after entities parsing; its tags are not counted, but this
  // counts the entities (&lt;) the escaped text holds, so a message always fits.
  telegramTextChars: 4_096,
};

/** What a value cut to fit says at its end. */
const CUT_NOTE = ' … (cut)';

/** The documented JSON form of a result (NOTIFY_FORMAT=json, and each entry of /deliveries.json). */
export function resultDocument(r: Delivery, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    schema: 'webhook.result/v1',
    hook: r.hookId,
    request_id: r.requestId,
    received_at: r.receivedAt.toISOString(),
    finished_at: r.finishedAt?.toISOString() ?? null,
    outcome: r.outcome ?? null,
    decision: r.decision,
    detail: r.detail,
    registry: r.registry ?? null,
    // Only where a hook names its cluster (CLUSTER, CLUSTERS): one cluster's documents keep their shape.
    ...(r.cluster !== undefined && { cluster: r.cluster }),
    namespace: r.namespace ?? null,
    workload: r.workload ?? null,
    container: r.container ?? null,
    image_before: r.imageBefore ?? null,
    image_after: r.imageAfter ?? null,
    rollout: r.rollout ?? null,
    pods: r.pods.map((p) => ({ ...p, reason: p.reason ?? null })),
    ...(r.waiting ? waitingDocument(r.waiting) : {}),
    ...extra,
    report: r.report,
  };
}

/** A waiting push in the JSON document: what it waits for, and approveUrl/rejectUrl for any other system. */
function waitingDocument(w: NonNullable<Delivery['waiting']>): Record<string, unknown> {
  return {
    waiting: { for: w.for, until: w.until, opens_at: w.opensAt ?? null, window: w.window ?? null },
    ...(w.links ? { approveUrl: w.links.approve, rejectUrl: w.links.reject } : {}),
    ...(w.links?.deployNow ? { deployNowUrl: w.links.deployNow } : {}),
  };
}

/** The buttons of a waiting push's chat message, in order: label, URL, whether it is the one to press. */
function decisionButtons(r: Delivery): { label: string; url: string; primary: boolean }[] {
  const l = r.waiting?.links;
  if (!l) return [];
  const approve = l.approve === l.deployNow ? [] : [{ label: 'Approve', url: l.approve, primary: true }];
  const now = l.deployNow ? [{ label: 'Deploy now', url: l.deployNow, primary: approve.length === 0 }] : [];
  return [...approve, ...now, { label: 'Reject', url: l.reject, primary: false }];
}

/** The colour a card shows its result in: green succeeded, red failed, amber waiting for a person or a window. */
function resultColour(r: Delivery): 'green' | 'red' | 'amber' | 'grey' {
  if (r.outcome === 'failed') return 'red';
  if (r.waiting) return 'amber';
  return r.outcome === 'succeeded' ? 'green' : 'grey';
}

// ---- the formats ------------------------------------------------------------------------------

/** One request to a receiver. */
interface NotifyRequest {
  url: URL;
  body: string;
  headers: Record<string, string>;
}

interface NotifyFormat {
  /** Whether NOTIFY_SECRET means something to it (signs its requests). */
  signs: boolean;
  request(r: Delivery, target: NotifyTarget, now: Date): NotifyRequest;
  /** Why the receiver's 2xx answer still says no (DingTalk, WeCom and Feishu answer 200 with a code). */
  refusal?(answer: string): string | undefined;
  /** The wait, in seconds, a 429's body asks for (Discord's and Telegram's), over its Retry-After header. */
  bodyRetryAfter?(answer: string): number | undefined;
}

const JSON_HEADERS = { 'Content-Type': 'application/json; charset=utf-8' };

/**
 * How a chat's markup writes a label in bold, and how it keeps text that came with a request (ids,
 * the workload named in the URL, images from the payload, error details) from being markup: no
 * link, image, mention or tag may come from a request.
 */
interface ChatDialect {
  bold(label: string): string;
  text(value: string): string;
}

/**
 * A value on one line, with no bare URL left to link: "://" gets a zero-width space, which every
 * client shows as nothing but no autolinker takes for a URL. Pure.
 */
function chatInert(value: string): string {
  return value.replace(/[\r\n\u2028\u2029]+/g, ' ').replaceAll('://', ':\u200B//');
}

/**
 * The characters that open markup in the markdown of DingTalk, WeCom and Feishu: links and images
 * ([text](url)), and the tags each adds (<font>, WeCom's <@user>, Feishu's <at id=all>), entities
 * included. The three implement different, undocumented subsets of markdown and not all honour a
 * backslash escape, so these become their full-width forms, which read the same and mean nothing.
 */
const MARKDOWN_INERT: Record<string, string> = { '[': '［', ']': '］', '<': '＜', '>': '＞', '&': '＆' };

const MARKDOWN_DIALECT: ChatDialect = {
  bold: (label) => `**${label}**`,
  text: (value) => chatInert(value).replace(/[[\]<>&]/g, (c) => MARKDOWN_INERT[c]),
};

/**
 * Slack's mrkdwn: links and mentions (<url|text>, <!channel>, <@U…>) open with "<", and Slack
 * documents &amp; &lt; &gt; as its escapes. The receivers that take Slack's body but read `text` as
 * markdown (Mattermost, Rocket.Chat) link [text](url): brackets become full-width there too.
 */
const SLACK_ESCAPES: Record<string, string> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '[': '［', ']': '］' };
const SLACK_DIALECT: ChatDialect = {
  bold: (label) => `*${label}*`,
  text: (value) => chatInert(value).replace(/[&<>[\]]/g, (c) => SLACK_ESCAPES[c]),
};

/** Plain text (a card's title, a notification's preview): only kept on one line. */
const PLAIN_TEXT = (value: string) => value.replace(/[\r\n\u2028\u2029]+/g, ' ');

/** The title every chat message starts with: the mail's subject, which DingTalk keywords can match. */
function chatTitle(r: Delivery, text: (value: string) => string = PLAIN_TEXT): string {
  const target = r.namespace && r.workload && r.container ? `${r.namespace}-${r.workload}-${r.container}` : r.hookId;
  return `Webhooks通知: ${text(target)} 更新结果: ${r.outcome ?? 'running'}`;
}

/** One fact of a result: its label (ours) and its value as the record has it (from the request, in part). */
interface ChatFact {
  name: string;
  value: string;
}

/** The facts every chat message tells, in order: the one delivery record, rendered by each format. Pure. */
function chatFacts(r: Delivery): ChatFact[] {
  const facts = [
    { name: 'hook', value: r.hookId },
    { name: 'request', value: r.requestId },
  ];
  if (r.workload) {
    const where = `${r.namespace ? ` in ${r.namespace}` : ''}, container ${r.container ?? 'undefined'}`;
    facts.push({ name: 'workload', value: `${r.workload}${where}${r.cluster ? `, cluster ${r.cluster}` : ''}` });
  }
  if (r.imageAfter) facts.push({ name: 'image', value: `${r.imageBefore ?? '?'} → ${r.imageAfter}` });
  facts.push({ name: 'decision', value: `${r.decision}${r.detail ? ` (${r.detail})` : ''}` });
  if (r.rollout) facts.push({ name: 'rollout', value: `${r.rollout.state}: ${r.rollout.detail}` });
  const ready = r.pods.filter((p) => p.ready).length;
  if (r.pods.length) facts.push({ name: 'pods', value: `${ready} of ${r.pods.length} ready` });
  return facts;
}

/** The summary lines of a chat message in its dialect, every value from the request made inert. */
function chatLines(r: Delivery, d: ChatDialect): string[] {
  const [hook, request, ...rest] = chatFacts(r).map((f) => `${d.bold(f.name)} ${d.text(f.value)}`);
  return [`${hook} · ${request}`, ...rest];
}

/** Text cut to at most `max` UTF-8 bytes, on a character boundary, marked when cut. */
function cutToBytes(text: string, max: number): string {
  if (Buffer.byteLength(text) <= max) return text;
  let cut = Buffer.from(text)
    .subarray(0, max - 4)
    .toString('utf8');
  if (cut.endsWith('\uFFFD')) cut = cut.slice(0, -1);
  return `${cut} …`;
}

function chatMarkdown(r: Delivery, separator: string, d: ChatDialect): string {
  return cutToBytes(chatLines(r, d).join(separator), NOTIFY_LIMITS.maxChatBytes);
}

/** Feishu's card buttons open URLs ("jump"): a custom bot has no callback. */
function feishuButtons(r: Delivery): unknown[] {
  const buttons = decisionButtons(r);
  if (!buttons.length) return [];
  const actions = buttons.map((b) => ({
    tag: 'button',
    text: { tag: 'plain_text', content: b.label },
    type: b.primary ? 'primary' : b.label === 'Reject' ? 'danger' : 'default',
    url: b.url,
  }));
  return [{ tag: 'action', actions }];
}

// WeCom's template card documents its texts in characters: a title of at most 26, a description of 30, a
// sub-title text of 112 (CJK characters are 3 UTF-8 bytes; the cut keeps whole characters).
const WECOM_CARD_BYTES = { title: 78, desc: 90, text: 336 };

/** WeCom's text_notice template card: the summary, and a jump (type 1: a URL) per button; the card opens the first. */
function wecomCard(r: Delivery, buttons: { label: string; url: string }[]): unknown {
  return {
    msgtype: 'template_card',
    template_card: {
      card_type: 'text_notice',
      main_title: {
        title: cutToBytes(chatTitle(r), WECOM_CARD_BYTES.title),
        desc: cutToBytes(r.detail, WECOM_CARD_BYTES.desc),
      },
      sub_title_text: cutToBytes(
        chatLines(r, { ...MARKDOWN_DIALECT, bold: PLAIN_TEXT }).join('\n'),
        WECOM_CARD_BYTES.text,
      ),
      jump_list: buttons.map((b) => ({ type: 1, title: b.label, url: b.url })),
      card_action: { type: 1, url: buttons[0].url },
    },
  };
}

// ---- teams, discord, googlechat, telegram: dialects and limits ----------------------------------

/** The characters that open the markup of Teams' and Discord's markdown, in full-width forms that mean nothing. */
const EMPHASIS_INERT: Record<string, string> = {
  ...MARKDOWN_INERT,
  ...{ '*': '＊', _: '＿', '~': '～', '`': '｀', '|': '｜' },
};

/** A value whose start a markdown reads as a list item, a heading or a quote gets a zero-width space first. */
function lineStartInert(value: string): string {
  return value.replace(/^(?=[-+*#>]|\d+[.)])/, '\u200B');
}

/**
 * Teams' Adaptive Card markdown (a CommonMark subset: bold, italic, lists, links; HTML is shown as text, a mention
 * needs an entity the card does not carry): brackets, tags, emphasis and code in full-width forms.
 */
const TEAMS_TEXT = (value: string) =>
  lineStartInert(chatInert(value)).replace(/[[\]<>&*_~`|]/g, (c) => EMPHASIS_INERT[c]);

/** Discord's markdown as Teams', and its mentions: @everyone and @here broken by a zero-width space after the @. */
const DISCORD_TEXT = (value: string) => TEAMS_TEXT(value).replaceAll('@', '@\u200B');

/** The HTML of Google Chat's card text and Telegram's parse mode: &, < and > as entities, as both document. */
const HTML_TEXT_ESCAPES: Record<string, string> = { '&': '&amp;', '<': '&lt;', '>': '&gt;' };
const HTML_TEXT = (value: string) => chatInert(value).replace(/[&<>]/g, (c) => HTML_TEXT_ESCAPES[c]);

/**
 * Telegram finds links, @mentions, #hashtags and $cashtags in a message by itself, but never inside code: each value
 * is code. A title is bold, so a zero-width space after each sign (and dot) keeps its names from being links.
 */
const TELEGRAM_TEXT = (value: string) => `<code>${HTML_TEXT(value)}</code>`;
const TELEGRAM_TITLE = (value: string) => HTML_TEXT(value.replace(/[@#$.]/g, '$&\u200B'));

/** The size of a text in the JSON body: its UTF-8 bytes, escapes included. */
const jsonBytes = (text: string) => Buffer.byteLength(JSON.stringify(text)) - 2;

/**
 * `raw` in a dialect (`text`), at most `max` by `measure`: whole, or its longest prefix that fits with CUT_NOTE
 * after it. A dialect only grows with its input, so the prefix is found by halving. Pure.
 */
function fitted(raw: string, max: number, text: (value: string) => string, measure = (s: string) => s.length): string {
  const whole = text(raw);
  if (measure(whole) <= max) return whole;
  const chars = [...raw];
  const fits = (n: number) => measure(text(chars.slice(0, n).join('')) + CUT_NOTE) <= max;
  let [lo, hi] = [0, chars.length - 1];
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return text(chars.slice(0, lo).join('')) + CUT_NOTE;
}

/**
 * Facts in a dialect, at most `budget` in all and `each` apiece: a value shorter than its share leaves the rest to
 * the others, so only the longest are cut. Pure.
 */
function fittedFacts(
  facts: ChatFact[],
  budget: number,
  text: (value: string) => string,
  measure = (s: string) => s.length,
  each = Infinity,
): ChatFact[] {
  const sizes = facts.map((f, i) => ({ i, size: measure(text(f.value)) })).sort((a, b) => a.size - b.size);
  const out = [...facts];
  let left = budget;
  sizes.forEach(({ i, size }, k) => {
    const share = Math.min(each, Math.floor(left / (sizes.length - k)));
    const value = size <= share ? text(facts[i].value) : fitted(facts[i].value, share, text, measure);
    out[i] = { name: facts[i].name, value };
    left -= measure(value);
  });
  return out;
}

/** A JSON answer as an object, or undefined when it is not one. */
function answerObject(answer: string): Record<string, unknown> | undefined {
  try {
    const parsed: unknown = JSON.parse(answer);
    return isObject(parsed) ? parsed : undefined;
  } catch {
    return undefined;
  }
}

const TEAMS_COLOURS = { green: 'Good', red: 'Attention', amber: 'Warning', grey: 'Default' } as const;

/**
 * A Teams Workflows message (the flow "When a Teams webhook request is received", or the template "Send webhook
 * alerts to a channel", posts its card): an Adaptive Card with the title, a FactSet and an Action.OpenUrl per button.
 */
function teamsMessage(r: Delivery): unknown {
  const facts = fittedFacts(chatFacts(r), CHAT_LIMITS.teamsFactBytes, TEAMS_TEXT, jsonBytes);
  const actions = decisionButtons(r).map((b) => ({
    ...{ type: 'Action.OpenUrl', title: b.label, url: b.url },
    ...(b.primary ? { style: 'positive' } : b.label === 'Reject' ? { style: 'destructive' } : {}),
  }));
  const title = fitted(chatTitle(r), CHAT_LIMITS.titleChars, TEAMS_TEXT);
  const card = {
    ...{ $schema: 'http://adaptivecards.io/schemas/adaptive-card.json', type: 'AdaptiveCard', version: '1.4' },
    body: [
      {
        type: 'TextBlock',
        text: title,
        weight: 'Bolder',
        size: 'Medium',
        wrap: true,
        color: TEAMS_COLOURS[resultColour(r)],
      },
      { type: 'FactSet', facts: facts.map((f) => ({ title: f.name, value: f.value })) },
    ],
    ...(actions.length ? { actions } : {}),
  };
  const attachment = { contentType: 'application/vnd.microsoft.card.adaptive', contentUrl: null, content: card };
  return { type: 'message', attachments: [attachment] };
}

const DISCORD_COLOURS = { green: 0x2e7d32, red: 0xc62828, amber: 0xf9a825, grey: 0x757575 };

/**
 * A Discord webhook message: one embed, coloured by the result, a field per fact. A webhook that no application
 * owns cannot carry buttons, so the links are Markdown links in the description; no mention is parsed at all.
 */
function discordMessage(r: Delivery): unknown {
  const description = decisionButtons(r)
    .map((b) => {
      const link = `[${b.label}](${b.url.replace(/[()]/g, (c) => (c === '(' ? '%28' : '%29'))})`;
      return b.primary ? `**${link}**` : link;
    })
    .join(' · ');
  const title = fitted(chatTitle(r), CHAT_LIMITS.titleChars, DISCORD_TEXT);
  const names = chatFacts(r).reduce((n, f) => n + f.name.length, 0);
  const budget = CHAT_LIMITS.discordEmbedChars - title.length - description.length - names;
  const facts = fittedFacts(chatFacts(r), budget, DISCORD_TEXT, undefined, CHAT_LIMITS.discordFieldChars);
  const embed = {
    ...{ title, color: DISCORD_COLOURS[resultColour(r)] },
    ...(description ? { description } : {}),
    fields: facts.map((f) => ({ name: f.name, value: f.value || '-' })),
    timestamp: (r.finishedAt ?? r.receivedAt).toISOString(),
  };
  return { allowed_mentions: { parse: [] }, embeds: [embed] };
}

/**
 * A Google Chat incoming-webhook message: one cardsV2 card, its header the title (plain text) and the decision, a
 * decoratedText per fact (its text HTML), and a buttonList of openLink buttons.
 */
function googleChatMessage(r: Delivery): unknown {
  const facts = fittedFacts(chatFacts(r), CHAT_LIMITS.googleChatFactBytes, HTML_TEXT, jsonBytes);
  const widgets = facts.map((f) => ({ decoratedText: { topLabel: f.name, text: f.value, wrapText: true } }));
  const buttons = decisionButtons(r).map((b) => ({ text: b.label, onClick: { openLink: { url: b.url } } }));
  const header = { title: fitted(chatTitle(r), CHAT_LIMITS.titleChars, MARKDOWN_DIALECT.text), subtitle: r.decision };
  const sections = [{ widgets }, ...(buttons.length ? [{ widgets: [{ buttonList: { buttons } }] }] : [])];
  return { cardsV2: [{ cardId: 'result', card: { header, sections } }] };
}

/** The Bot API's sendMessage: the title and a line per fact in HTML, and an inline keyboard of URL buttons. */
function telegramMessage(r: Delivery, chat: string): unknown {
  const title = fitted(chatTitle(r), CHAT_LIMITS.titleChars, TELEGRAM_TITLE);
  // The tags are not counted (the entities they make are); each line's label, space and new line are.
  const labels = chatFacts(r).reduce((n, f) => n + f.name.length + 2, 0);
  const facts = fittedFacts(chatFacts(r), CHAT_LIMITS.telegramTextChars - title.length - labels, TELEGRAM_TEXT);
  const text = [`<b>${title}</b>`, ...facts.map((f) => `<b>${f.name}</b> ${f.value}`)].join('\n');
  const buttons = decisionButtons(r).map((b) => ({ text: b.label, url: b.url }));
  return {
    ...{ chat_id: chat, text, parse_mode: 'HTML', link_preview_options: { is_disabled: true } },
    ...(buttons.length ? { reply_markup: { inline_keyboard: [buttons] } } : {}),
  };
}

/** The Bot API's answer says no unless its "ok" is true. */
function telegramRefusal(answer: string): string | undefined {
  const o = answerObject(answer);
  if (o?.ok === true) return undefined;
  return o ? `${String(o.description ?? 'ok is not true').slice(0, 200)}` : 'the answer is not JSON';
}

/** Base64 HMAC-SHA256, the signature DingTalk and Feishu ask for. */
function hmacBase64(key: string, message: string): string {
  return createHmac('sha256', key).update(message).digest('base64');
}

/** A JSON answer's code field (`errcode` or `code`) when it is not 0, as the receiver's refusal. */
function codeRefusal(...fields: string[]): (answer: string) => string | undefined {
  return (answer) => {
    let parsed: unknown;
    try {
      parsed = JSON.parse(answer);
    } catch {
      return `the answer is not JSON: ${JSON.stringify(answer.slice(0, 200))}`;
    }
    const o = isObject(parsed) ? parsed : {};
    const field = fields.find((f) => o[f] !== undefined);
    if (field === undefined || o[field] === 0) return undefined;
    const message = o.errmsg ?? o.msg ?? o.StatusMessage ?? '';
    return `${field} ${JSON.stringify(o[field])}: ${String(message).slice(0, 200)}`;
  };
}

// Custom bot: https://open.feishu.cn/open-apis/bot/v2/hook/…, and Lark's at https://open.larksuite.com/open-apis/bot/
// v2/hook/… (https://open.larksuite.com/document/client-docs/bot-v3/add-custom-bot); with "签名校验" (signature
// verification), timestamp (s) and sign = base64(HMAC-SHA256(key "timestamp\nsecret", empty message)) join the body.
function feishuFormat(dialect: ChatDialect): NotifyFormat {
  return {
    signs: true,
    request(r, { url, secret }, now) {
      const timestamp = String(Math.floor(now.getTime() / 1000));
      const signature = secret ? { timestamp, sign: hmacBase64(`${timestamp}\n${secret}`, '') } : {};
      const template = r.outcome === 'failed' ? 'red' : r.outcome === 'succeeded' ? 'green' : 'grey';
      const card = {
        // Its body may be 20 KB at most: a title from a long request is cut like the others'.
        header: {
          title: { tag: 'plain_text', content: fitted(chatTitle(r), CHAT_LIMITS.titleChars, PLAIN_TEXT) },
          template,
        },
        elements: [{ tag: 'markdown', content: chatMarkdown(r, '\n', dialect) }, ...feishuButtons(r)],
      };
      return { url, body: JSON.stringify({ ...signature, msg_type: 'interactive', card }), headers: JSON_HEADERS };
    },
    refusal: codeRefusal('code', 'StatusCode'),
  };
}

/** Lark's card markdown keeps emphasis, code and strike-through out of a request's text too (Teams' set). */
const LARK_DIALECT: ChatDialect = {
  bold: MARKDOWN_DIALECT.bold,
  text: (value) => chatInert(value).replace(/[[\]<>&*_~`|]/g, (c) => EMPHASIS_INERT[c]),
};

/** The request of a result to one receiver, in its format, signed as of `now`. Pure. */
export function notifyRequest(r: Delivery, target: NotifyTarget, now = new Date()): NotifyRequest {
  return NOTIFY_FORMATS[target.format].request(r, target, now);
}

/** A body posted as JSON, unsigned. */
function jsonPost(url: URL, message: unknown): NotifyRequest {
  return { url, body: JSON.stringify(message), headers: JSON_HEADERS };
}

const NOTIFY_FORMATS: Record<NotifyFormatName, NotifyFormat> = {
  json: {
    signs: true,
    request(r, { url, secret }) {
      const body = JSON.stringify(resultDocument(r));
      const headers: Record<string, string> = {
        ...JSON_HEADERS,
        'X-Webhook-Event': 'push-result',
        'X-Webhook-Delivery': r.requestId,
      };
      if (secret)
        headers['X-Webhook-Signature-256'] = `sha256=${createHmac('sha256', secret).update(body).digest('hex')}`;
      return { url, body, headers };
    },
  },
  // Custom robot: https://oapi.dingtalk.com/robot/send?access_token=…; with "加签", timestamp (ms)
  // and sign = base64(HMAC-SHA256(key secret, "timestamp\nsecret")) join the query.
  dingtalk: {
    signs: true,
    request(r, { url, secret }, now) {
      const signed = new URL(url);
      if (secret) {
        const timestamp = String(now.getTime());
        signed.searchParams.set('timestamp', timestamp);
        signed.searchParams.set('sign', hmacBase64(secret, `${timestamp}\n${secret}`));
      }
      const text = `### ${chatTitle(r, MARKDOWN_DIALECT.text)}\n\n${chatMarkdown(r, '\n\n', MARKDOWN_DIALECT)}`;
      const buttons = decisionButtons(r);
      // A robot cannot be called back: ActionCard buttons open the links (btnOrientation "1": side by side).
      const message = buttons.length
        ? {
            msgtype: 'actionCard',
            actionCard: {
              title: chatTitle(r),
              text,
              btnOrientation: '1',
              btns: buttons.map((b) => ({ title: b.label, actionURL: b.url })),
            },
          }
        : { msgtype: 'markdown', markdown: { title: chatTitle(r), text } };
      return { url: signed, body: JSON.stringify(message), headers: JSON_HEADERS };
    },
    refusal: codeRefusal('errcode'),
  },
  // Group robot: https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=…; markdown content ≤ 4096 bytes.
  wecom: {
    signs: false,
    request(r, { url }) {
      const buttons = decisionButtons(r);
      if (buttons.length) return { url, body: JSON.stringify(wecomCard(r, buttons)), headers: JSON_HEADERS };
      const content = `### ${chatTitle(r, MARKDOWN_DIALECT.text)}\n${chatMarkdown(r, '\n', MARKDOWN_DIALECT)}`;
      return { url, body: JSON.stringify({ msgtype: 'markdown', markdown: { content } }), headers: JSON_HEADERS };
    },
    refusal: codeRefusal('errcode'),
  },
  feishu: feishuFormat(MARKDOWN_DIALECT),
  // Incoming webhook: https://hooks.slack.com/services/…; `text` is the notification's fallback.
  slack: {
    signs: false,
    request(r, { url }) {
      // `text` is the whole message too: what notifications show, and all that receivers which
      // take Slack's format without its blocks (Mattermost, Rocket.Chat) read.
      const text = `*${chatTitle(r, SLACK_DIALECT.text)}*\n${chatMarkdown(r, '\n', SLACK_DIALECT)}`;
      const buttons = decisionButtons(r).map((b) => ({
        type: 'button',
        text: { type: 'plain_text', text: b.label },
        action_id: b.label.toLowerCase().replace(' ', '-'),
        url: b.url,
        style: b.primary ? 'primary' : b.label === 'Reject' ? 'danger' : undefined,
      }));
      const blocks: unknown[] = [{ type: 'section', text: { type: 'mrkdwn', text } }];
      if (buttons.length) blocks.push({ type: 'actions', elements: buttons });
      return { url, body: JSON.stringify({ text, blocks }), headers: JSON_HEADERS };
    },
  },
  // A Workflows webhook (the Office 365 connectors are retired): https://learn.microsoft.com/en-us/microsoftteams/
  // platform/webhooks-and-connectors/how-to/add-incoming-webhook; the card: https://adaptivecards.io/explorer/.
  // The flow answers 202 Accepted.
  teams: { signs: false, request: (r, { url }) => jsonPost(url, teamsMessage(r)) },
  // Execute Webhook: https://discord.com/developers/docs/resources/webhook#execute-webhook (embed limits:
  // https://discord.com/developers/docs/resources/message#embed-object-embed-limits); answers 204. A 429's body
  // holds retry_after in seconds (https://discord.com/developers/docs/topics/rate-limits).
  discord: {
    signs: false,
    request: (r, { url }) => jsonPost(url, discordMessage(r)),
    bodyRetryAfter: (answer) => {
      const wait = answerObject(answer)?.retry_after;
      return typeof wait === 'number' && wait >= 0 ? wait : undefined;
    },
  },
  // Incoming webhook: https://developers.google.com/workspace/chat/quickstart/webhooks; the card:
  // https://developers.google.com/workspace/chat/api/reference/rest/v1/cards, its text's HTML:
  // https://developers.google.com/workspace/chat/format-messages.
  googlechat: { signs: false, request: (r, { url }) => jsonPost(url, googleChatMessage(r)) },
  // The Bot API's sendMessage (https://core.telegram.org/bots/api#sendmessage) at https://api.telegram.org/bot<token>/
  // sendMessage or a Bot API server of one's own; HTML: https://core.telegram.org/bots/api#html-style. Every answer
  // has "ok"; a 429's parameters.retry_after is the wait in seconds (ResponseParameters).
  telegram: {
    signs: false,
    request: (r, { url, chat }) => jsonPost(url, telegramMessage(r, chat ?? '')),
    refusal: telegramRefusal,
    bodyRetryAfter: (answer) => {
      const parameters = answerObject(answer)?.parameters;
      const wait = isObject(parameters) ? parameters.retry_after : undefined;
      return typeof wait === 'number' && wait >= 0 ? wait : undefined;
    },
  },
  lark: feishuFormat(LARK_DIALECT),
};

// ---- settings ---------------------------------------------------------------------------------

/** One receiver of a hook's notifications. */
interface NotifyTarget {
  url: URL;
  format: NotifyFormatName;
  secret?: string;
  /** The Telegram chat a telegram target posts in (NOTIFY_TELEGRAM_CHAT). */
  chat?: string;
}

/**
 * The bot<token> segment of a Bot API URL, before its method: the token is the bot's key, as the rest of a chat URL
 * is its robot's. Any host may serve it (a Bot API server of one's own, a relay).
 */
const TELEGRAM_SEND_PATH = /\/bot(\d+:[\w-]+)\/sendMessage$/i;

/** Broadcasts a one-value list to `n`, or checks that it has `n` values. */
function perUrl<T>(values: T[], n: number, name: string): T[] {
  if (values.length === 1) return Array(n).fill(values[0]);
  if (values.length !== n)
    throw new Error(`${name} has ${values.length} values for ${n} URLs: give one, or one per URL`);
  return values;
}

/** A hook's receivers from its settings as given; throws (without a secret in the message) when they are wrong. */
export function notifyTargets(texts: NotifyTexts): NotifyTarget[] {
  if (!texts.url?.trim()) return [];
  const urls = HOOK_SETTINGS.NOTIFY_URL.parse(texts.url);
  const formats = perUrl(HOOK_SETTINGS.NOTIFY_FORMAT.parse(texts.format), urls.length, 'NOTIFY_FORMAT');
  const secrets = perUrl(HOOK_SETTINGS.NOTIFY_SECRET.parse(texts.secret), urls.length, 'NOTIFY_SECRET');
  const chats = telegramChatsOf(urls, formats, texts.telegramChat);
  return urls.map((url, i) => {
    if (secrets[i] && !NOTIFY_FORMATS[formats[i]].signs)
      throw new Error(`NOTIFY_SECRET is set, but ${formats[i]} (URL ${i + 1}) does not sign its requests`);
    return { url, format: formats[i], secret: secrets[i], ...(chats.has(i) ? { chat: chats.get(i) } : {}) };
  });
}

/**
 * The chat of each telegram URL (by its index): NOTIFY_TELEGRAM_CHAT's one chat for all, or one per telegram URL in
 * order. Throws when a telegram URL is not a Bot API sendMessage URL, or the chats do not match the URLs.
 */
function telegramChatsOf(urls: URL[], formats: NotifyFormatName[], text: string | undefined): Map<number, string> {
  const chats = HOOK_SETTINGS.NOTIFY_TELEGRAM_CHAT.parse(text);
  const telegram = formats.flatMap((f, i) => (f === 'telegram' ? [i] : []));
  if (telegram.length === 0) {
    if (chats.length) throw new Error('NOTIFY_TELEGRAM_CHAT is set, but no NOTIFY_URL is telegram');
    return new Map();
  }
  for (const i of telegram)
    if (!TELEGRAM_SEND_PATH.test(urls[i].pathname))
      throw new Error(
        `NOTIFY_URL item ${i + 1} (telegram) is not a Bot API URL: https://<host>/bot<token>/sendMessage`,
      );
  if (chats.length === 0)
    throw new Error(`NOTIFY_FORMAT telegram (URL ${telegram[0] + 1}) needs NOTIFY_TELEGRAM_CHAT: the chat to post in`);
  const each = perUrl(chats, telegram.length, 'NOTIFY_TELEGRAM_CHAT');
  return new Map(telegram.map((i, k) => [i, each[k]]));
}

// ---- sending ----------------------------------------------------------------------------------

/** A receiver's failure: `transient` ones (connection trouble, deadline, 5xx, 429) are tried again. */
class NotifyFailure extends Error {
  readonly transient: boolean;
  retryAfterSeconds?: number;
  /** A 429's body, where Discord and Telegram say how long to wait. */
  throttled?: string;
  constructor(message: string, transient: boolean) {
    super(message);
    this.transient = transient;
  }
}

/** One POST under its total deadline; resolves with the answer's body, or throws NotifyFailure. */
async function postOnce(request: NotifyRequest, ca: string[] | undefined): Promise<string> {
  let answer: OutboundAnswer;
  try {
    answer = await outboundRequest(request.url, {
      method: 'POST',
      headers: request.headers,
      body: request.body,
      deadlineMs: NOTIFY_LIMITS.requestTimeoutMs,
      maxResponseBytes: NOTIFY_LIMITS.maxResponseBytes,
      overLimit: 'cut',
      trust: { extraCa: ca },
    });
  } catch (e) {
    const { code, message } = e as OutboundError;
    // A certificate that does not verify will not verify on the next try either.
    const certificate = /CERT|SELF_SIGNED|UNABLE_TO_VERIFY|ERR_TLS/.test(code);
    // Node's hint (--use-system-ca) is no use to an operator of the executable; NOTIFY_CACERT is.
    if (certificate)
      throw new NotifyFailure(
        `${message.replace(/; if the root CA is installed.*$/, '')} (a private CA is trusted with NOTIFY_CACERT)`,
        false,
      );
    throw new NotifyFailure(message, true);
  }
  if (answer.status >= 200 && answer.status < 300) return answer.body;
  const transient = answer.status >= 500 || answer.status === 429 || answer.status === 408;
  const failure = new NotifyFailure(`HTTP ${answer.status}: ${JSON.stringify(answer.body.slice(0, 200))}`, transient);
  failure.retryAfterSeconds = retryAfterSeconds(answer.headers['retry-after']);
  if (answer.status === 429) failure.throttled = answer.body;
  throw failure;
}

/** The host a URL may be shown by: the rest of a chat URL (its path, its query) is its robot's key. */
function shownTarget(url: URL): string {
  return url.host;
}

/**
 * Sends NOTIFY_URL notifications in the background: the answer never waits for them. Each goes
 * out NOTIFY_LIMITS.attempts times at most, backing off between tries; its end is logged and
 * counted (webhook_notifications_total). Each hook sends at most `cap.max` results per window;
 * the ones beyond are logged, counted and recorded as capped, not sent.
 */
export class Notifier implements ResultChannel {
  private readonly pending = new Set<Promise<unknown>>();
  private readonly windows = new Map<string, { sent: number; warned: boolean; ends: number }>();
  private readonly log: Logger;
  private readonly metrics: Metrics;
  private readonly cap: { max: number; windowMs: number };
  private readonly ca: string[] | undefined;
  private readonly backoff: { initialMs: number; maxMs: number };

  constructor(
    log: Logger,
    metrics: Metrics,
    cap: { max: number; windowMs: number },
    ca: string[] | undefined,
    backoffMs = NOTIFY_LIMITS.backoffMs,
  ) {
    this.log = log;
    this.metrics = metrics;
    this.cap = cap;
    this.ca = ca;
    this.backoff = { initialMs: backoffMs, maxMs: NOTIFY_LIMITS.maxBackoffMs };
  }

  /** The result channel: the hook's NOTIFY_URL receivers. */
  deliver(d: Delivery): { channel: string; done: Promise<SendOutcome> }[] {
    return this.notify(d, d.settings.notify);
  }

  /**
   * Posts the result to each of the hook's receivers; returns each one's channel (format and host)
   * with the promise of how it went. No receivers, no entries.
   */
  notify(r: Delivery, texts: NotifyTexts): { channel: string; done: Promise<SendOutcome> }[] {
    let targets: NotifyTarget[];
    try {
      targets = notifyTargets(texts);
    } catch (e) {
      const why = this.scrubbed((e as Error).message, texts);
      this.log.error(`[${r.requestId}] notifications for hook ${r.hookId} not sent: ${why}`);
      this.metrics.inc('webhook_notifications_total', { format: 'unknown', result: 'failed' });
      return [{ channel: 'notify', done: Promise.resolve({ state: 'failed', detail: why }) }];
    }
    if (targets.length === 0) return [];
    const capped = !this.withinCap(r);
    return targets.map((t) => {
      const channel = `${t.format} ${shownTarget(t.url)}`;
      if (capped) {
        this.metrics.inc('webhook_notifications_total', { format: t.format, result: 'capped' });
        const detail = `not sent: hook ${r.hookId} reached ${this.cap.max} per ${formatGoDuration(this.cap.windowMs)}`;
        return { channel, done: Promise.resolve({ state: 'held' as const, detail }) };
      }
      const done = this.send(r, t, texts).finally(() => this.pending.delete(done));
      this.pending.add(done);
      return { channel, done };
    });
  }

  /** Counts the result against its hook's window; false when the hook is over its cap. */
  private withinCap(r: Delivery): boolean {
    const now = Date.now();
    let window = this.windows.get(r.hookId);
    if (!window || now >= window.ends) {
      window = { sent: 0, warned: false, ends: now + this.cap.windowMs };
      this.windows.set(r.hookId, window);
    }
    if (window.sent < this.cap.max) {
      window.sent++;
      return true;
    }
    if (!window.warned)
      this.log.warn(
        `[${r.requestId}] hook ${r.hookId} sent ${this.cap.max} notification(s) within ` +
          `${formatGoDuration(this.cap.windowMs)}; further results are on the deliveries page and in the log only`,
      );
    window.warned = true;
    return false;
  }

  private async send(r: Delivery, t: NotifyTarget, texts: NotifyTexts): Promise<SendOutcome> {
    const where = `${t.format} notification to ${shownTarget(t.url)}`;
    const format = NOTIFY_FORMATS[t.format];
    const policy = { budgetMs: NOTIFY_LIMITS.retryBudgetMs, attempts: NOTIFY_LIMITS.attempts, backoff: this.backoff };
    const sent = await retrying<string, NotifyFailure>(policy, async () => {
      try {
        const answer = await postOnce(notifyRequest(r, t), this.ca);
        const refusal = format.refusal?.(answer);
        if (refusal) throw new NotifyFailure(`refused: ${refusal}`, false);
        return { ok: true, value: answer };
      } catch (e) {
        const failure = e instanceof NotifyFailure ? e : new NotifyFailure((e as Error).message, false);
        const { transient, throttled } = failure;
        const retryAfterSeconds =
          (throttled !== undefined ? format.bodyRetryAfter?.(throttled) : undefined) ?? failure.retryAfterSeconds;
        return { ok: false, failure: { transient, retryAfterSeconds }, error: failure };
      }
    });
    if (sent.ok) {
      this.metrics.inc('webhook_notifications_total', { format: t.format, result: 'sent' });
      this.log.info(`[${r.requestId}] ${where} sent`);
      return { state: 'sent', detail: `attempt ${sent.attempts}` };
    }
    const why = this.scrubbed(`${sent.error.message} (after ${sent.attempts} attempt(s))`, texts, t);
    this.metrics.inc('webhook_notifications_total', { format: t.format, result: 'failed' });
    this.log.error(`[${r.requestId}] ${where} not sent: ${why}`);
    return { state: 'failed', detail: why };
  }

  /** A message with the hook's notification secrets and URLs (but their hosts), and bot tokens alone, taken out. */
  private scrubbed(text: string, texts: NotifyTexts, t?: NotifyTarget): string {
    const urls = (texts.url ?? '').split(/[\s,]+/);
    const tokens = urls.map((u) => TELEGRAM_SEND_PATH.exec(URL.parse(u)?.pathname ?? '')?.[1] ?? '');
    const secrets = [...(texts.secret ?? '').split(/\s+/), ...urls, ...tokens, ...tokens.map(encodeURIComponent)];
    if (t) secrets.push(t.url.href, `${t.url.pathname}${t.url.search}`, t.secret ?? '');
    // Shorter pieces (an empty path "/") are not secrets, and would take ordinary text out.
    return new Scrubber(
      secrets.filter((x) => x.length >= 4 && x !== '/'),
      '[redacted]',
    ).scrub(text);
  }

  /** Waits up to `ms` for notifications still being sent (shutdown). */
  async flush(ms: number): Promise<void> {
    if (this.pending.size === 0) return;
    this.log.notice(`sending ${this.pending.size} pending notification(s)`);
    await Promise.race([Promise.allSettled([...this.pending]), sleep(ms, undefined, { ref: false })]);
  }
}

// ================================================================================================
// 43. deliveries page — what the last pushes did, on the admin listener (never the hook port): the records of the
//    result's DeliveryLog (the last -deliveries pushes, newest first, as far as each has got). /deliveries lists
//    them (refreshing itself while a push is still running); /deliveries/<n> is one push's full report and pods;
//    /deliveries.json and /deliveries/<n>.json carry the same as JSON (entries in the shape of NOTIFY_FORMAT=json).
//    -admin-token protects them. Nothing on them comes from the hook's environment; reports are scrubbed of known
//    secrets, receivers shown by host.
//    Exports: deliveryPages.
//    Tests: test/deliveries.test.ts, test/notify.test.ts.
// ================================================================================================

const DELIVERY_LIMITS = {
  // Seconds between the page's own reloads while a push is running: a rollout takes seconds to
  // minutes, and a phone on a slow line still gets a page in between.
  refreshSeconds: 3,
};

/** The colour class of a push: how it ended, or that it is still going. */
function toneOf(d: Delivery): string {
  if (d.state !== 'done') return 'running';
  if (d.outcome === 'failed') return 'failed';
  return d.outcome === 'succeeded' ? 'ok' : 'quiet';
}

function imageCell(d: Delivery): string {
  if (!d.imageAfter) return '<span class="muted">—</span>';
  const before = d.imageBefore ? `<code>${escapeHtml(d.imageBefore)}</code><br>→ ` : '';
  return `${before}<code>${escapeHtml(d.imageAfter)}</code>`;
}

function notificationsCell(d: Delivery): string {
  if (d.state !== 'done') return '<span class="muted">after the rollout</span>';
  if (d.notifications.length === 0) return '<span class="muted">none configured</span>';
  return d.notifications.map((n) => `${escapeHtml(n.channel)}: ${escapeHtml(n.state)}`).join('<br>');
}

function deliveryRow(d: Delivery): string {
  const workload = d.workload
    ? `${escapeHtml(d.workload)} / ${escapeHtml(d.container ?? '')}<br>` +
      `<span class="muted">${escapeHtml(d.namespace ?? '')}` +
      `${d.cluster ? ` · cluster ${escapeHtml(d.cluster)}` : ''}</span>`
    : '<span class="muted">—</span>';
  const rollout = d.rollout
    ? `${escapeHtml(d.rollout.state)}<br><span class="muted">${escapeHtml(d.rollout.detail)}</span>`
    : '<span class="muted">—</span>';
  return [
    `<tr class="${toneOf(d)}" id="d${d.seq}">`,
    cell('Time', `<a href="deliveries/${d.seq}">${shownTime(d.receivedAt)}</a>`, 'time'),
    cell('Hook', escapeHtml(d.hookId)),
    cell('Request', `<code>${escapeHtml(d.requestId)}</code>`),
    cell('Registry', escapeHtml(d.registry ?? '—')),
    cell('Workload / container', workload),
    cell('Image before → after', imageCell(d), 'image'),
    cell('Decision', `<span class="tag">${escapeHtml(d.decision)}</span><br>${escapeHtml(d.detail)}${replayForm(d)}`),
    cell('Rollout', rollout),
    cell('Notified', notificationsCell(d)),
    '</tr>',
  ].join('');
}

/** A form of the page: posted to `action`, with the name of who decides and the hidden fields given. */
function decisionForm(action: string, fields: Record<string, string>, buttons: [string, string][]): string {
  const hidden = Object.entries(fields)
    .map(([k, v]) => `<input type="hidden" name="${k}" value="${escapeHtml(v)}">`)
    .join('');
  const pressed = buttons
    .map(([value, label]) => `<button type="submit" name="action" value="${value}">${escapeHtml(label)}</button>`)
    .join(' ');
  return (
    `<form method="post" action="${action}">${hidden}` +
    `<input name="name" required maxlength="100" placeholder="your name" aria-label="your name"> ${pressed}</form>`
  );
}

/** The waiting pushes with Approve and Reject (for the holder of the admin token). Pure. */
function renderWaiting(pushes: readonly WaitingPush[]): string {
  if (pushes.length === 0) return '';
  const rows = pushes.map((w) => {
    const key = waitingKey(w);
    const buttons: [string, string][] = w.entry.waitsFor === 'window' ? [] : [['approve', 'Approve']];
    buttons.push(['reject', 'Reject']);
    return [
      `<tr class="running" id="w-${escapeHtml(w.entry.id)}">`,
      cell('Received', escapeHtml(w.entry.receivedAt.slice(0, 19).replace('T', ' ') + ' UTC'), 'time'),
      cell('Hook', escapeHtml(w.entry.hook)),
      cell('Workload / container', `${escapeHtml(`${w.target.kind}/${w.target.name} / ${w.container}`)}<br>` +
        `<span class="muted">${escapeHtml(w.target.namespace)}` +
        `${w.cluster ? ` · cluster ${escapeHtml(w.cluster)}` : ''}</span>`),
      cell('Image', `<code>${escapeHtml(w.entry.image)}</code>`, 'image'),
      cell('Waits for', `<span class="tag">waiting</span><br>${escapeHtml(waitingAction(w.entry))}`),
      cell('Decide', decisionForm('deliveries/decide', { key, id: w.entry.id }, buttons)),
      '</tr>',
    ].join('');
  });
  const head = ['Received', 'Hook', 'Workload / container', 'Image', 'Waits for', 'Decide'];
  return [
    '<h2>Waiting</h2>',
    `<table class="waiting"><thead><tr>${head.map((h) => `<th>${h}</th>`).join('')}</tr></thead><tbody>`,
    rows.join('\n'),
    '</tbody></table><h2>Recent pushes</h2>',
  ].join('\n');
}

/** "Deploy again" for a past applied push (for the holder of the admin token). Pure. */
function replayForm(d: Delivery): string {
  if (d.state !== 'done' || !d.imageAfter || !d.workload || !d.namespace || !d.container) return '';
  if (d.decision !== 'applied' && d.decision !== 'same image restarted') return '';
  return `<br>${decisionForm('deliveries/replay', { seq: String(d.seq) }, [['replay', 'Deploy again']])}`;
}

/** /deliveries: the recent pushes, newest first. Pure. */
function renderDeliveries(
  entries: readonly Delivery[],
  busy: boolean,
  now: Date,
  pushes: readonly WaitingPush[] = [],
): string {
  const head = ['Time', 'Hook', 'Request', 'Registry', 'Workload / container', 'Image before → after'];
  head.push('Decision', 'Rollout', 'Notified');
  const rows = entries.length
    ? entries.map(deliveryRow).join('\n')
    : `<tr><td colspan="${head.length}" class="muted">No push since the service started.</td></tr>`;
  // A page with forms is not reloaded under the hand filling them in.
  const refresh = busy && pushes.length === 0 ? DELIVERY_LIMITS.refreshSeconds : undefined;
  const body = [
    '<h1>Deliveries</h1>',
    `<p class="meta">${entries.length} most recent push(es), newest first · as of ${shownTime(now)}` +
      `${refresh ? ` · refreshing every ${refresh} s while a push is running` : ''}` +
      ' · <a href="deliveries.json">JSON</a></p>',
    renderWaiting(pushes),
    `<table><thead><tr>${head.map((h) => `<th>${h}</th>`).join('')}</tr></thead><tbody>`,
    rows,
    '</tbody></table>',
  ].join('\n');
  return pageShell('Deliveries — webhook', refresh, body);
}

/** /deliveries/<n>: one push, its full report and its pods. Pure. */
function renderDelivery(d: Delivery, busy: boolean): string {
  const fields: [string, string][] = [
    ['Received', shownTime(d.receivedAt)],
    ['Finished', d.finishedAt ? shownTime(d.finishedAt) : 'not yet'],
    ['Hook', escapeHtml(d.hookId)],
    ['Request', `<code>${escapeHtml(d.requestId)}</code>`],
    ['Registry', escapeHtml(d.registry ?? '—')],
    ['Workload', escapeHtml(`${d.workload ?? '—'} in ${d.namespace ?? '—'}, container ${d.container ?? '—'}`)],
    ['Image before → after', imageCell(d)],
    ['Decision', `<span class="tag">${escapeHtml(d.decision)}</span> ${escapeHtml(d.detail)}`],
    ['Outcome', escapeHtml(d.outcome ?? d.state)],
    ['Rollout', d.rollout ? escapeHtml(`${d.rollout.state}: ${d.rollout.detail}`) : '—'],
    ['Notified', notificationDetails(d)],
  ];
  const pods = d.pods.length
    ? d.pods
        .map(
          (p) =>
            `<tr>${cell('Pod', escapeHtml(p.name))}${cell('Phase', escapeHtml(p.phase))}` +
            `${cell('Ready', p.ready ? 'ready' : 'not ready')}${cell('Image', `<code>${escapeHtml(p.image)}</code>`)}` +
            `${cell('Restarts', String(p.restarts))}${cell('Reason', escapeHtml(p.reason ?? ''))}</tr>`,
        )
        .join('\n')
    : '<tr><td colspan="6" class="muted">No pod states (yet).</td></tr>';
  const body = [
    `<p class="meta"><a href="../deliveries">← all deliveries</a> · <a href="${d.seq}.json">JSON</a></p>`,
    `<h1>Push ${d.seq}: ${escapeHtml(d.hookId)}</h1>`,
    `<table class="${toneOf(d)}"><tbody>`,
    fields.map(([k, v]) => `<tr><th>${k}</th><td>${v}</td></tr>`).join('\n'),
    '</tbody></table>',
    '<h2>Pods</h2><table><thead><tr><th>Pod</th><th>Phase</th><th>Ready</th><th>Image</th><th>Restarts</th>',
    `<th>Reason</th></tr></thead><tbody>${pods}</tbody></table>`,
    `<h2>Report</h2><pre>${escapeHtml(d.report || '(none yet)')}</pre>`,
  ].join('\n');
  return pageShell(`Push ${d.seq} — webhook`, busy ? DELIVERY_LIMITS.refreshSeconds : undefined, body);
}

function notificationDetails(d: Delivery): string {
  if (d.state !== 'done') return 'after the rollout';
  if (d.notifications.length === 0) return 'none configured';
  return d.notifications
    .map((n) => `${escapeHtml(n.channel)}: ${escapeHtml(n.state)}${n.detail ? ` (${escapeHtml(n.detail)})` : ''}`)
    .join('<br>');
}

/** A delivery as JSON: the result document plus where it is and how its notifications went. */
function deliveryDocument(d: Delivery): Record<string, unknown> {
  return resultDocument(d, { seq: d.seq, state: d.state, notifications: d.notifications });
}

// The pages forbid every script, frame and outside resource: the page needs none, and a hostile
// value that escaped escaping could run nothing.
const PAGE_HEADERS = {
  'Content-Security-Policy': "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'",
  'Cache-Control': 'no-store',
  // same-origin, not no-referrer: a browser then names this page's origin on the forms it posts (Approve,
  // Reject, Deploy again), which the admin listener checks; no other site is told where the page lives.
  'Referrer-Policy': 'same-origin',
};

/** What a decision from the page did: the page with its outcome. Pure. */
function decidedPage(o: { status: number; title: string; detail: string; report?: string }): PageAnswer {
  const body = [
    '<p class="meta"><a href="../deliveries">← all deliveries</a></p>',
    `<h1>${escapeHtml(o.title)}</h1><p>${escapeHtml(o.detail)}</p>`,
    o.report ? `<pre>${escapeHtml(o.report)}</pre>` : '',
  ].join('\n');
  const headers = { ...PAGE_HEADERS, 'Content-Type': 'text/html; charset=utf-8' };
  return { status: o.status, body: pageShell(`${o.title} — webhook`, undefined, body), headers };
}

/** The page's forms: Approve or Reject a waiting push, Deploy again a past one. */
async function pageAction(
  log: DeliveryLog,
  approvals: ApprovalService,
  pathname: string,
  form: URLSearchParams,
  remoteIp: string,
): Promise<PageAnswer | undefined> {
  if (pathname === '/deliveries/decide') return decidedPage(await approvals.adminAction(form, remoteIp));
  if (pathname !== '/deliveries/replay') return undefined;
  const d = log.get(Number(form.get('seq')));
  const past = d && replayForm(d) !== '' ? d : undefined;
  if (!past) return decidedPage({ status: 404, title: 'Not deployed', detail: 'No such past push on this page.' });
  const push = {
    hookId: past.hookId,
    cluster: past.cluster,
    namespace: past.namespace!,
    workload: past.workload!,
    container: past.container!,
    image: past.imageAfter!,
  };
  return decidedPage(await approvals.adminAction(form, remoteIp, push));
}

/** The deliveries pages for the admin listener (the http server's AdminPages). */
export function deliveryPages(log: DeliveryLog, token: string, approvals?: ApprovalService): AdminPages {
  const html = (body: string) => ({ body, contentType: 'text/html; charset=utf-8', headers: PAGE_HEADERS });
  const json = (value: unknown) => ({
    body: `${JSON.stringify(value, null, 1)}\n`,
    contentType: 'application/json; charset=utf-8',
    headers: PAGE_HEADERS,
  });
  return {
    prefix: '/deliveries',
    token,
    page(pathname) {
      const entries = log.list();
      const pushes = approvals?.list() ?? [];
      if (pathname === '/deliveries') return html(renderDeliveries(entries, log.busy(), new Date(), pushes));
      if (pathname === '/deliveries.json')
        return json({ schema: 'webhook.deliveries/v1', deliveries: entries.map(deliveryDocument) });
      const one = /^\/deliveries\/(\d{1,9})(\.json)?$/.exec(pathname);
      const d = one ? log.get(Number(one[1])) : undefined;
      if (!d) return undefined;
      return one![2] ? json(deliveryDocument(d)) : html(renderDelivery(d, log.busy([d])));
    },
    ...(approvals ? { action: (p, form, ip) => pageAction(log, approvals, p, form, ip) } : {}),
  };
}

// ================================================================================================
// 44. -validate & -print-rbac — the commands that read the hooks and exit: -validate describes every hook (its rule,
//    parameters, answer, upgrade and notifications) and says what is wrong, -print-rbac prints the least-privilege
//    RBAC; both load the hooks exactly as the service does (hookLoadSettings).
//    Exports: commandWarnings, hookLoadSettings, printRbac, validate.
//    Tests: test/clusters.test.ts, test/deploy.test.ts, test/validate.test.ts.
// ================================================================================================

/**
 * -validate: loads the hooks as the service would (the same -template, environment and checks),
 * prints what each matches and does on stdout, and the warnings and errors a reload would log on
 * stderr; 1 when the service would refuse them.
 */
async function validate(o: Options, env: Record<string, string | undefined>): Promise<number> {
  let snapshot: Snapshot;
  try {
    snapshot = loadSnapshot(hookLoadSettings(o, env));
  } catch (e) {
    process.stderr.write(`error: ${(e as Error).message}\n`);
    return 1;
  }
  const upgrade = new UpgradeService(undefined, env, 0, new Logger(false, false, () => undefined));
  for (const w of [...snapshot.warnings, ...commandWarnings(snapshot, env, upgrade), ...mailWarnings(snapshot, env)])
    process.stderr.write(`warning: ${w}\n`);
  process.stdout.write(describeHooks(snapshot, o, env.PATH ?? '', upgrade));
  if (snapshot.hooks.size === 0 && !o.nopanic) {
    process.stderr.write(`error: couldn't load any hooks from ${o.hooks.join(', ')} (use -nopanic to start anyway)\n`);
    return 1;
  }
  process.stdout.write(`${snapshot.hooks.size} hook(s) from ${snapshot.files.length} file(s): valid\n`);
  if (!o.checkClusters) return 0;
  const checked = await checkClusters(snapshot, o, env);
  process.stdout.write(checked.lines.join('\n') + '\n');
  return checked.ok ? 0 : 1;
}

/** The verbs an upgrade needs on its workload, asked of each cluster by -check-clusters. */
const CHECKED_VERBS = ['get', 'patch'];

/**
 * -validate -check-clusters: for each upgrade hook and each cluster it names (CLUSTER, CLUSTERS, or
 * the default), whether the cluster answers and, by SelfSubjectAccessReviews, whether its credentials
 * may get and patch the hook's workload. One try per cluster: a cluster that does not answer is said
 * to, at once. ok is false when any cluster does not answer or does not allow.
 */
async function checkClusters(
  snapshot: Snapshot,
  o: Options,
  env: Record<string, string | undefined>,
): Promise<{ lines: string[]; ok: boolean }> {
  const lines = ['clusters:'];
  let ok = true;
  for (const hook of snapshot.hooks.values()) {
    const reach = hookReach(hook);
    if (!reach) continue;
    for (const cluster of hookClusters(hook)) {
      const checked = await checkCluster(reach, cluster, o.kubeconfig || undefined, env);
      ok &&= checked.ok;
      lines.push(`  hook "${hook.id}", cluster ${cluster ?? '(the default)'}: ${checked.line}`);
    }
  }
  return { lines, ok };
}

/** One hook's cluster: reachable, and its workload allowed (or why not). */
async function checkCluster(
  reach: HookReach,
  cluster: string | undefined,
  kubeconfig: string | undefined,
  env: Record<string, string | undefined>,
): Promise<{ line: string; ok: boolean }> {
  let client: KubeClient;
  try {
    const exec = execEnvironment(env, new Set());
    client = new KubeClient(credentialsFromEnvironment(env, kubeconfig, cluster, exec), { retryBudgetMs: 0 });
  } catch (e) {
    return { line: `no credentials: ${(e as Error).message}`, ok: false };
  }
  try {
    const target = reach.target;
    const attributes = target ? workloadResource(target) : undefined;
    const answers = await Promise.all(
      CHECKED_VERBS.map((verb) => accessReview(client, verb, attributes ?? { group: 'apps', resource: 'deployments' })),
    );
    const at = `reachable (${client.server})`;
    if (!target) return { line: `${at}; the workload comes from each request: permissions not checked`, ok: true };
    const denied = CHECKED_VERBS.filter((_, i) => !answers[i].allowed);
    const what = `${CHECKED_VERBS.join(' and ')} on ${describeResource(attributes!)}`;
    if (denied.length === 0) return { line: `${at}; ${what}: allowed`, ok: true };
    const why = answers.map((a) => a.reason).filter(Boolean)[0];
    return { line: `${at}; ${what}: ${denied.join(' and ')} not allowed${why ? ` (${why})` : ''}`, ok: false };
  } catch (e) {
    return { line: `unreachable: ${(e as Error).message}`, ok: false };
  } finally {
    client.close();
  }
}

/** A SelfSubjectAccessReview: whether these credentials may do `verb` on the resource. */
async function accessReview(
  client: KubeClient,
  verb: string,
  r: { group: string; resource: string; namespace?: string; name?: string },
): Promise<{ allowed: boolean; reason?: string }> {
  const review = {
    apiVersion: 'authorization.k8s.io/v1',
    kind: 'SelfSubjectAccessReview',
    spec: { resourceAttributes: { verb, group: r.group, resource: r.resource, namespace: r.namespace, name: r.name } },
  };
  const where = { group: 'authorization.k8s.io', version: 'v1', resource: 'selfsubjectaccessreviews', namespace: '' };
  const answer = await client.create<{ status?: { allowed?: boolean; reason?: string } }>(where, review);
  return { allowed: answer.status?.allowed === true, reason: answer.status?.reason || undefined };
}

/**
 * The hooks that pass MAIL_TO while this environment gives the service no mail server (MAIL_SMTP_SERVER unset, or
 * MAIL_* settings it refuses): mail is then off and their results are mailed to no one, which nothing else says.
 */
function mailWarnings(snapshot: Snapshot, env: Record<string, string | undefined>): string[] {
  const mail = parseMailConfig(env);
  if (mail.config) return [];
  const why = env.MAIL_SMTP_SERVER?.trim()
    ? `mail is off: ${mail.errors.join('; ')}`
    : 'mail is off: MAIL_SMTP_SERVER is not set';
  return [...snapshot.hooks.values()]
    .filter((hook) => upgradeInput(hook, 'MAIL_TO') !== undefined)
    .map((hook) => `${hook.file}: hook "${hook.id}": MAIL_TO is passed, but ${why}: no result will be mailed`);
}

/** The hooks whose command cannot be run now (checked again on each request, so only a warning). */
function commandWarnings(
  snapshot: Snapshot,
  env: Record<string, string | undefined>,
  inProcess: InProcessCommand,
): string[] {
  return [...snapshot.hooks.values()].flatMap((hook) => {
    const { resolved } = resolveHookCommand(hook, env.PATH ?? '', inProcess);
    return resolved.error
      ? [`${hook.file}: hook "${hook.id}": execute-command: ${resolved.error} (checked again on each request)`]
      : [];
  });
}

/** Each hook for people: its URL, what its rule accepts, what it runs and answers. Pure but for stat(). */
function describeHooks(snapshot: Snapshot, o: Options, envPath: string, inProcess: InProcessCommand): string {
  const out: string[] = [];
  for (const hook of snapshot.hooks.values()) {
    const methods = allowedMethods(hook, o).join(', ');
    const shown = (m: Match) => describeMatch(m, snapshot.inserted);
    out.push(`hook "${hook.id}" (${hook.file})`);
    out.push(`  url:         ${methods || 'any method but HEAD and OPTIONS'} /${o.urlprefix}/${hook.id}`);
    out.push(...labelled('accepts', hook.rule ? describeRule(hook.rule, shown) : ['every request (no trigger-rule)']));
    out.push(`  otherwise:   ${hook.mismatchCode} Hook rules were not satisfied.`);
    const { resolved, inProcess: bundled } = resolveHookCommand(hook, envPath, inProcess);
    const runs = bundled
      ? `${inProcess.name}, in this process (${hook.command})`
      : (resolved.path ?? `nothing now: ${resolved.error}`);
    out.push(`  runs:        ${runs}`);
    if (bundled) out.push(...labelled('upgrades', describeUpgrade(hook, snapshot.inserted)));
    out.push(...labelled('arguments', hook.args.map(describeParam)));
    out.push(
      ...labelled(
        'environment',
        hook.env.map((p) => `${p.envname || `HOOK_${p.name}`} = ${describeEnvParam(p, snapshot.inserted)}`),
      ),
    );
    out.push(...labelled('settings', describeSettings(hook)));
    out.push(
      ...labelled(
        'files',
        hook.files.map((p) => `${p.envname} = a file holding ${describeParam(p)}`),
      ),
    );
    out.push(`  answers:     ${describeAnswer(hook)}`);
    out.push('');
  }
  return out.join('\n') + (out.length ? '\n' : '');
}

/** `  label:       first`, then the other lines aligned under the first; nothing for no lines. */
function labelled(label: string, lines: string[]): string[] {
  return lines.map((line, i) => `  ${i === 0 ? `${label}:`.padEnd(13) : ' '.repeat(13)}${line}`);
}

function describeRule(rule: Rule, shown: (m: Match) => string): string[] {
  const nested = (head: string, rules: Rule[]) => [
    head,
    ...rules.flatMap((r) => describeRule(r, shown).map((l) => `  ${l}`)),
  ];
  if ('and' in rule) return rule.and.length === 1 ? describeRule(rule.and[0], shown) : nested('all of:', rule.and);
  if ('or' in rule) return rule.or.length === 1 ? describeRule(rule.or[0], shown) : nested('any of:', rule.or);
  if ('not' in rule) return nested('not:', [rule.not]);
  return [shown(rule.match)];
}

function describeMatch(m: Match, inserted: Set<string>): string {
  const param = m.param ? `${describeParam(m.param)} ` : '';
  if (m.pinned === undefined) return `${param}${m.type} ${m.shown}`;
  const value = inserted.has(m.pinned) ? 'the value the template inserted (not shown)' : JSON.stringify(m.pinned);
  return `${param}is ${value}`;
}

function describeParam(p: Param): string {
  if (p.source.startsWith('entire-') || p.source === 'raw-request-body') return `the ${p.source}`;
  return `${p.source} ${JSON.stringify(p.name)}${p.base64decode ? ' (base64-decoded)' : ''}`;
}

/** An environment parameter, its value left out when it is a secret (inserted, or a notification's key). */
function describeEnvParam(p: Param, inserted: Set<string>): string {
  if (p.source !== 'string') return describeParam(p);
  if (inserted.has(p.name)) return 'string (inserted by the template, not shown)';
  if (hookSetting(p.envname)?.secret) return 'string (not shown: it holds a key)';
  return describeParam(p);
}

/** A hook's own setting (HOOK_SETTINGS, from: 'hook') by its environment name, or undefined. */
function hookSetting(envname: string): HookSetting<unknown> | undefined {
  if (!Object.hasOwn(HOOK_SETTINGS, envname)) return undefined;
  const s: HookSetting<unknown> = HOOK_SETTINGS[envname as HookSettingName];
  return s.from === 'hook' ? s : undefined;
}

/** What each setting the hook passes means, from HOOK_SETTINGS: its type, default and one line. */
function describeSettings(hook: Hook): string[] {
  const names = [...new Set(hook.env.map((p) => p.envname))].filter((n) => hookSetting(n) !== undefined);
  return names.map((name) => {
    const s = hookSetting(name)!;
    return `${name} (${s.type}; unset: ${s.default}${s.fixed ? '; fixed in the file' : ''}): ${s.meaning}`;
  });
}

function describeAnswer(hook: Hook): string {
  if (!hook.captureOutput)
    return `${hook.successCode} ${JSON.stringify(hook.responseMessage)} at once; the command runs on`;
  const failed = hook.captureOutputOnError ? 'with its output' : 'with a fixed message';
  return `the command's output, ${hook.successCode}; when it fails, 500 ${failed}`;
}

/**
 * What the bundled upgrade changes: the namespace, workload and container it is given, each a
 * literal, a value the trigger rule requires (so no request can choose another), or what a
 * request says.
 */
function describeUpgrade(hook: Hook, inserted: Set<string>): string[] {
  const input = (envname: string, what: string) => {
    const value = upgradeInput(hook, envname);
    if (value === undefined) return `${what}: not passed (${envname} is not in pass-environment-to-command)`;
    if (typeof value === 'string') return `${what}: ${inserted.has(value) ? '(inserted by the template)' : value}`;
    return `${what}: whatever the request's ${describeParam(value)} says (no value rule fixes it)`;
  };
  return [
    ...describeClusters(hook),
    input('APP_NS', 'namespace'),
    input('APP_WORKLOAD', 'workload'),
    input('APP_CONTAINER', 'container'),
    input('REPO_TYPE', 'registry type'),
    input('MAIL_TO', 'mail to'),
    describePolicy(hook),
    describeOutsideChange(hook),
    ...describeSignature(hook),
    ...describeApprovals(hook),
    ...describeNotifications(hook),
  ];
}

/** Whether a push waits for a person and for a change window (fixed at load), and what the workload may add. */
function describeApprovals(hook: Hook): string[] {
  const fixed = (name: string) => {
    const value = upgradeInput(hook, name);
    return typeof value === 'string' ? value : undefined;
  };
  const timeout = formatGoDuration(HOOK_SETTINGS.APPROVAL_TIMEOUT.parse(fixed('APPROVAL_TIMEOUT')));
  const approval = HOOK_SETTINGS.REQUIRE_APPROVAL.parse(fixed('REQUIRE_APPROVAL'))
    ? `required (REQUIRE_APPROVAL=true): a push waits up to ${timeout} for Approve or Reject`
    : `not required (the annotation ${APPROVAL_ANNOTATION}: required asks for one on a workload)`;
  const windows = HOOK_SETTINGS.DEPLOY_WINDOW.parse(fixed('DEPLOY_WINDOW'));
  const override = HOOK_SETTINGS.APPROVAL_OVERRIDE.parse(fixed('APPROVAL_OVERRIDE'));
  const window = windows
    ? `${describeWindows(windows)}: a push outside waits and is applied when it opens` +
      (override ? '; an approval link may deploy now (APPROVAL_OVERRIDE=true)' : '')
    : `always open (the annotation ${WINDOW_ANNOTATION} sets one on a workload)`;
  return [`approval: ${approval}`, `change window: ${window}`];
}

/** The keys a hook checks signatures with (VERIFY_SIGNATURE, fixed and read at load): fingerprints, never the keys. */
function describeSignature(hook: Hook): string[] {
  const fixed = (envname: string) => {
    const value = upgradeInput(hook, envname);
    return typeof value === 'string' ? value : undefined;
  };
  if (!fixed('VERIFY_SIGNATURE')?.trim()) return [];
  const keys = HOOK_SETTINGS.VERIFY_SIGNATURE.parse(fixed('VERIFY_SIGNATURE'));
  const annotations = Object.entries(
    HOOK_SETTINGS.VERIFY_SIGNATURE_ANNOTATIONS.parse(fixed('VERIFY_SIGNATURE_ANNOTATIONS')),
  );
  return [
    `signatures: cosign, signed by any of ${keys.length} key${keys.length === 1 ? '' : 's'} ` +
      `(${keys.map((k) => `${k.kind} ${k.fingerprint}`).join(', ')})` +
      (annotations.length ? `, with ${annotations.map(([k, v]) => `${k}=${v}`).join(' ')}` : '') +
      '; the tag is resolved on its registry (VERIFY_IMAGE) and that digest deployed',
  ];
}

/** Which clusters the hook's pushes go to, when it names them (a context of the kubeconfig each). */
function describeClusters(hook: Hook): string[] {
  const clusters = hookClusters(hook);
  if (clusters.length > 1) return [`clusters: ${clusters.join(', ')} (CLUSTERS: each push upgrades each)`];
  return clusters[0] === undefined ? [] : [`cluster: ${clusters[0]} (a kubeconfig context)`];
}

/** What a push meets once the container's image was changed outside webhook (ON_OUTSIDE_CHANGE, fixed at load). */
function describeOutsideChange(hook: Hook): string {
  const value = upgradeInput(hook, 'ON_OUTSIDE_CHANGE');
  const mode = HOOK_SETTINGS.ON_OUTSIDE_CHANGE.parse(typeof value === 'string' ? value : undefined);
  const given = typeof value === 'string' ? `ON_OUTSIDE_CHANGE=${value}` : 'ON_OUTSIDE_CHANGE unset';
  return mode === 'hold'
    ? `outside changes: held (${given}): once the image is changed outside webhook, only a newer push is applied`
    : `outside changes: followed (${given}): every push is applied, whoever changed the image`;
}

/** The hook's update policy (UPDATE_POLICY, fixed in the file and checked at load), and what overrides it. */
function describePolicy(hook: Hook): string {
  const value = upgradeInput(hook, 'UPDATE_POLICY');
  const shown = typeof value === 'string' && value.trim() !== '' ? value.trim() : 'all (the default: any tag)';
  const annotations = `${POLICY_ANNOTATION}, ${POLICY_ANNOTATION}.<container>`;
  return `policy: ${shown}; the workload's annotations ${annotations} override it`;
}

/** Where a hook's results are posted (NOTIFY_URL): each format and host, never the rest of a URL. */
function describeNotifications(hook: Hook): string[] {
  const fixed = (envname: string) => {
    const value = upgradeInput(hook, envname);
    return typeof value === 'string' ? value : undefined;
  };
  if (fixed('NOTIFY_URL') === undefined) return [];
  try {
    const texts = { url: fixed('NOTIFY_URL'), format: fixed('NOTIFY_FORMAT'), secret: fixed('NOTIFY_SECRET') };
    const targets = notifyTargets({ ...texts, telegramChat: fixed('NOTIFY_TELEGRAM_CHAT') });
    const shown = (t: (typeof targets)[number]) =>
      `${t.format} ${t.url.host}${t.chat ? ` (chat ${t.chat})` : ''}${t.secret ? ' (signed)' : ''}`;
    return [`notify: ${targets.map(shown).join(', ')}`];
  } catch (e) {
    return [`notify: none will be sent: ${(e as Error).message}`];
  }
}

/** How the hook files are read; the settings a hook must fix (HOOK_SETTINGS) are checked at every load. */
function hookLoadSettings(o: Options, env: Record<string, string | undefined>): LoadSettings {
  return {
    paths: o.hooks,
    template: o.template,
    env,
    commandTimeoutMs: o.commandTimeoutMs,
    settingChecks: fixedSettingChecks(),
  };
}

/**
 * The pull secrets the workloads of VERIFY_IMAGE hooks name, read from the cluster into their reach;
 * returns a note for each workload that could not be read (its secrets are then not granted).
 */
async function readPullSecrets(
  reaches: HookReach[],
  kubeconfig: string | undefined,
  env: Record<string, string | undefined>,
  cluster?: string,
): Promise<string[]> {
  const verifying = reaches.filter((r) => r.verifyImage && r.target);
  if (verifying.length === 0) return [];
  let client: KubeClient;
  try {
    client = new KubeClient(credentialsFromEnvironment(env, kubeconfig, cluster, execEnvironment(env, new Set())));
  } catch (e) {
    return verifying.map((r) => unreadNote(r, (e as Error).message));
  }
  const notes: string[] = [];
  try {
    for (const r of verifying) {
      try {
        const workload = await client.get<Record<string, unknown>>(workloadResource(r.target!));
        r.pullSecrets = pullSecretNames(workloadPodSpec(workload, r.target!.kind));
      } catch (e) {
        notes.push(unreadNote(r, (e as Error).message));
      }
    }
  } finally {
    client.close();
  }
  return notes;
}

function unreadNote(r: HookReach, why: string): string {
  return (
    `hook "${r.hook}" sets VERIFY_IMAGE: the pull secrets of ${r.target!.kind}/${r.target!.name} in ` +
    `${r.target!.namespace} could not be read (${why}); grant get on them, or run -print-rbac with -kubeconfig`
  );
}

/** Each cluster's hooks' reach (CLUSTER, CLUSTERS; undefined: the default cluster), in the order hooks name them. */
function reachesByCluster(snapshot: Snapshot): Map<string | undefined, HookReach[]> {
  const byCluster = new Map<string | undefined, HookReach[]>();
  for (const hook of snapshot.hooks.values()) {
    const reach = hookReach(hook);
    if (!reach) continue;
    for (const cluster of hookClusters(hook)) byCluster.set(cluster, [...(byCluster.get(cluster) ?? []), reach]);
  }
  return byCluster;
}

/** The comment that opens one cluster's section of -print-rbac. */
function clusterHeading(cluster: string | undefined): string {
  const apply = cluster
    ? `kubectl --context ${cluster} apply -f -`
    : 'kubectl apply -f - (the current context, or the cluster the service runs in)';
  return `# ==== cluster ${cluster ?? '(the default)'}: apply this section there with \`${apply}\`\n`;
}

/** -print-rbac: the Roles and RoleBindings the hooks need on stdout; what they cannot cover, on stderr. */
async function printRbac(o: Options, env: Record<string, string | undefined>): Promise<number> {
  let snapshot: Snapshot;
  try {
    snapshot = loadSnapshot(hookLoadSettings(o, env));
  } catch (e) {
    process.stderr.write(`webhook: couldn't load hooks: ${(e as Error).message}\n`);
    return 1;
  }
  const reaches = [...snapshot.hooks.values()].flatMap((hook) => hookReach(hook) ?? []);
  const byCluster = reachesByCluster(snapshot);
  const unread: string[] = [];
  const sections: string[] = [];
  for (const [cluster, inCluster] of byCluster) {
    unread.push(...(await readPullSecrets(inCluster, o.kubeconfig || undefined, env, cluster)));
    const rbac = formatRbac(inCluster, o.rbacServiceAccount, o.hooks);
    // Hooks in several clusters: one section each, applied in its own cluster.
    const head = byCluster.size > 1 || cluster !== undefined ? clusterHeading(cluster) : '';
    sections.push(head + rbac);
  }
  process.stdout.write(sections.length ? sections.join('---\n') : formatRbac([], o.rbacServiceAccount, o.hooks));
  const notes = [
    ...snapshot.warnings.map((w) => `warning: ${w}`),
    ...unread,
    ...reaches
      .filter((r) => r.open)
      .map(
        (r) =>
          `hook "${r.hook}" is not covered: ${r.open}; pin its ns and workload with value rules, or grant the ` +
          'cluster-wide role of deploy/rbac-cluster.yaml',
      ),
    ...(reaches.length === 0 ? ['no hook passes APP_NS and APP_WORKLOAD to an upgrade: nothing to grant'] : []),
  ];
  for (const note of notes) process.stderr.write(`webhook: ${note}\n`);
  return 0;
}

// ================================================================================================
// 45. main — wires the chapters together; the only place with process-wide side effects (signals, pid file, listening
//    sockets, exit codes).
//    Tests: test/image.test.ts, test/memory.test.ts, test/runner.test.ts, test/start.test.ts.
// ================================================================================================

export async function main(argv: string[], env: Record<string, string | undefined>): Promise<number> {
  // Upgrade mode: started as /webhooks.sh (a symlink to this executable) or as `webhook upgrade`.
  if (path.basename(process.argv0) === 'webhooks.sh' || argv[0] === 'upgrade') {
    const args = argv[0] === 'upgrade' ? argv.slice(1) : argv;
    const r = await runUpgrade(args, env);
    process.stdout.write(r.output);
    return r.exitCode;
  }
  let o: Options;
  try {
    o = parseCommandLine(argv, env);
    readAdminTokenFile(o);
    readApprovalKeyFile(o);
  } catch (e) {
    if (!(e instanceof UsageError)) throw e;
    if (e.message) process.stderr.write(`${e.message}\n`);
    process.stderr.write(usage());
    return e.message ? 2 : 0;
  }
  if (o.version) {
    process.stdout.write(`webhook version ${VERSION}\n`);
    return 0;
  }
  if (o.listCipherSuites) {
    process.stdout.write(Object.keys(GO_CIPHER_SUITES).join('\n') + '\n');
    return 0;
  }
  if (o.validate) return validate(o, env);
  if (o.printRbac) return await printRbac(o, env);
  return serve(o, env);
}

/** V8's heap limit, which the executable derives from the container's memory limit (scripts/build.ts). */
function memorySizing(): string {
  const mb = (bytes: number) => `${Math.round(bytes / 1048576)} MB`;
  const limit = process.constrainedMemory();
  const container = limit > 0 && limit < Number.MAX_SAFE_INTEGER ? `memory limit ${mb(limit)}` : 'no memory limit';
  return `V8 heap limit ${mb(getHeapStatistics().heap_size_limit)} (${container})`;
}

/** The service: hooks loaded, the pieces wired, the port open, until SIGTERM or SIGINT. */
async function serve(o: Options, env: Record<string, string | undefined>): Promise<number> {
  setFlagsFromString('--enable-experimental-regexp-engine-on-excessive-backtracks');
  setFlagsFromString(`--regexp-backtracks-before-fallback=${LIMITS.regexBacktracksBeforeFallback}`);
  const log = openLog(o);
  if (!log) return 1;
  process.on('exit', () => log.flush());
  const metrics = new Metrics();
  log.notice(`version ${VERSION} starting`);
  if (log.verbose) log.info(memorySizing()); // reads the cgroup's limit: only when it is shown
  const settings = hookLoadSettings(o, env);
  const kubeconfig = o.kubeconfig || undefined;
  const upgrade = new UpgradeService(kubeconfig, env, o.rolloutFollowMs, log, o.applyDeadlineMs, metrics);
  const snapshot = loadInitialHooks(o, settings, log, upgrade);
  if (!snapshot || !approvalLinksReady(o, snapshot, upgrade, log)) return 1;
  const mailer = new Mailer(mailConfig(env, log), log, metrics, { max: o.maxMailsPerHook, windowMs: o.mailWindowMs });
  const store = new HookStore(settings, snapshot, log, metrics);
  upgrade.useTemplateVariables(() => store.current.templateVariables);
  const runner = new CommandRunner<UpgradeOutput>(o.maxConcurrentCommands, env, log, metrics, upgrade);
  const notifier = openNotifier(o, env, log, metrics);
  if (!notifier) return 1;
  const deliveries = new DeliveryLog(o.deliveries, (text) => log.scrub(text));
  const listener = new RolloutFollower(upgrade, log, new ResultDispatcher(deliveries, [mailer, notifier], metrics));
  const approvals = new ApprovalService(o.approvalKey, upgrade, () => store.current.hooks, listener, log);
  const phase = { draining: false, shuttingDown: false };
  const handlerContext: HandlerContext = {
    options: o,
    store,
    runner,
    listener: approvals,
    approvals: o.approvalKey ? approvals : undefined,
    log,
    metrics,
    isShuttingDown: () => phase.shuttingDown,
    isDraining: () => phase.draining,
  };
  const handler = createHandler(handlerContext);
  const server = await openListener(o, handler, log);
  if (!server) return 1;
  server.on('clientError', (err: Error, socket: net.Socket) => answerClientError(handlerContext, err, socket));
  const pages = o.deliveries > 0 ? deliveryPages(deliveries, o.adminToken, approvals) : undefined;
  const adminServer = await openAdminListener(o, metrics, log, pages);
  if (adminServer === false) return 1;
  listener.resume(snapshot.hooks.values());
  approvals.start();
  if (o.hotreload) store.watch();
  reloadOnSignals(store, log);
  return new Promise<number>((resolve) => {
    const shutdown = async (sig: string) => {
      if (phase.draining) return;
      await stopServing(o, log, sig, phase);
      adminServer?.close();
      await stopService(o, { store, server, runner, upgrade, listener, approvals, mailer, notifier, log });
      log.notice('stopped');
      log.flush();
      resolve(0);
    };
    process.on('SIGTERM', () => void shutdown('SIGTERM'));
    process.on('SIGINT', () => void shutdown('SIGINT'));
  });
}

/** SIGHUP and SIGUSR1 reload the hooks. */
function reloadOnSignals(store: HookStore, log: Logger): void {
  const reloadOnSignal = (sig: string) => {
    log.notice(`caught ${sig}, reloading hooks`);
    store.reload(sig);
  };
  process.on('SIGHUP', () => reloadOnSignal('SIGHUP'));
  process.on('SIGUSR1', () => reloadOnSignal('SIGUSR1'));
}

/**
 * Approval links are signed with -approval-key-file and point at -public-url; without both, a hook that requires
 * approvals cannot start (false, after saying why).
 */
function approvalLinksReady(o: Options, snapshot: Snapshot, upgrade: UpgradeService, log: Logger): boolean {
  const problem = approvalHooksProblem(snapshot.hooks.values(), o.approvalKey !== undefined);
  if (problem) log.error(problem);
  else if (o.approvalKey) upgrade.useApprovals({ publicUrl: o.publicUrl, key: o.approvalKey });
  return problem === undefined;
}

/**
 * SIGTERM: /healthz says "not ready" at once while hooks are still served for -shutdown-delay (the
 * time a Service takes to stop sending to this pod), then no new requests are taken.
 */
async function stopServing(
  o: Options,
  log: Logger,
  sig: string,
  phase: { draining: boolean; shuttingDown: boolean },
): Promise<void> {
  phase.draining = true;
  if (o.shutdownDelayMs > 0) {
    log.notice(`caught ${sig}: not ready; still serving for ${formatGoDuration(o.shutdownDelayMs)}`);
    await sleep(o.shutdownDelayMs);
  }
  phase.shuttingDown = true;
  log.notice(
    `caught ${sig}, shutting down: no new requests; running commands get ${formatGoDuration(o.shutdownGraceMs)}`,
  );
}

/** The log: stderr, or -logfile opened for appending; undefined (after saying why) when it cannot be. */
function openLog(o: Options): Logger | undefined {
  // Written synchronously (stderr is synchronous for files and pipes on Linux): see Logger.flush.
  let logFd: number | undefined;
  try {
    if (o.logfile) logFd = fs.openSync(o.logfile, 'a', 0o640);
  } catch (e) {
    process.stderr.write(`webhook: cannot open -logfile ${o.logfile}: ${(e as NodeJS.ErrnoException).code ?? e}\n`);
    return undefined;
  }
  const log = new Logger(o.verbose, o.debug, (text) =>
    logFd === undefined ? process.stderr.write(text) : fs.writeSync(logFd, text),
  );
  return log;
}

/**
 * The NOTIFY_URL sender with NOTIFY_CACERT's CAs; undefined (after saying why) when NOTIFY_CACERT is
 * malformed. Like MAIL_TO, the receivers come from each hook, never from the service's environment.
 */
function openNotifier(
  o: Options,
  env: Record<string, string | undefined>,
  log: Logger,
  metrics: Metrics,
): Notifier | undefined {
  let ca: string[] | undefined;
  try {
    ca = notifyCa(env.NOTIFY_CACERT);
  } catch (e) {
    log.error(`notifications: ${(e as Error).message}`);
    return undefined;
  }
  for (const name of ['NOTIFY_URL', 'NOTIFY_FORMAT', 'NOTIFY_SECRET', 'NOTIFY_TELEGRAM_CHAT'])
    if (env[name] !== undefined)
      log.warn(`${name} in the service's environment is not used: a hook passes it (pass-environment-to-command)`);
  return new Notifier(log, metrics, { max: o.maxNotificationsPerHook, windowMs: o.notifyWindowMs }, ca);
}

/** The mail settings, or undefined (mail off), with what was wrong with them logged. */
function mailConfig(env: Record<string, string | undefined>, log: Logger): MailConfig | undefined {
  const mail = parseMailConfig(env);
  for (const error of mail.errors) log.error(`mail is off: ${error}`);
  const c = mail.config;
  if (c)
    log.notice(
      `mail results through ${c.host}:${c.port} ` +
        `(${c.security}${c.verifyCertificate ? '' : ', certificate not verified'})`,
    );
  return c;
}

/** The first snapshot, its warnings logged; undefined (after logging why) when the service cannot start. */
function loadInitialHooks(
  o: Options,
  settings: LoadSettings,
  log: Logger,
  inProcess: InProcessCommand,
): Snapshot | undefined {
  let snapshot: Snapshot;
  try {
    snapshot = loadSnapshot(settings);
  } catch (e) {
    log.error(`couldn't load hooks: ${(e as Error).message}`);
    return undefined;
  }
  log.setSecrets(snapshot.secrets);
  for (const w of [...snapshot.warnings, ...commandWarnings(snapshot, settings.env, inProcess)]) log.warn(w);
  if (snapshot.hooks.size === 0 && !o.nopanic) {
    log.error(`couldn't load any hooks from ${o.hooks.join(', ')} (use -nopanic to start anyway)`);
    return undefined;
  }
  log.notice(
    `loaded ${snapshot.hooks.size} hook(s) from ${snapshot.files.length} file(s): ` +
      `${[...snapshot.hooks.keys()].join(', ')}`,
  );
  return snapshot;
}

/** Shutdown: no new requests, running commands get the grace period, then follows end and mails go. */
async function stopService(
  o: Options,
  s: {
    store: HookStore;
    server: http.Server;
    runner: CommandRunner;
    upgrade: UpgradeService;
    listener: RolloutFollower;
    approvals: ApprovalService;
    mailer: Mailer;
    notifier: Notifier;
    log: Logger;
  },
): Promise<void> {
  s.store.close();
  s.approvals.stop();
  s.server.close();
  s.server.closeIdleConnections();
  const graceEnds = Date.now() + o.shutdownGraceMs;
  await s.runner.drain(o.shutdownGraceMs);
  // The answers of the commands that just finished go out (with their log lines) before the
  // connections close.
  await new Promise((resolve) => setImmediate(resolve));
  s.log.flush();
  s.server.closeAllConnections();
  // Rollouts still followed end now; their mails, and those of commands that just finished,
  // still go out within what is left of the grace period.
  await s.upgrade.stop(LIMITS.minMailFlushMs);
  await s.listener.settle(LIMITS.minMailFlushMs);
  await Promise.all([
    s.mailer.flush(Math.max(LIMITS.minMailFlushMs, graceEnds - Date.now())),
    s.notifier.flush(Math.max(LIMITS.minMailFlushMs, graceEnds - Date.now())),
  ]);
  if (o.pidfile) fs.rmSync(o.pidfile, { force: true });
}

function isEntryPoint(): boolean {
  // Inside the single executable the embedded module is always the entry point.
  if (isSea()) return true;
  try {
    return (
      process.argv[1] !== undefined &&
      fs.realpathSync(process.argv[1]) === fs.realpathSync(fileURLToPath(import.meta.url))
    );
  } catch {
    return false;
  }
}

if (isEntryPoint()) {
  main(process.argv.slice(2), process.env).then(
    (code) => process.exit(code),
    (e: Error) => {
      process.stderr.write(`webhook: fatal: ${e.stack ?? e.message}\n`);
      process.exit(1);
    },
  );
}
