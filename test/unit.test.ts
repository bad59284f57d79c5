/* Unit tests of webhook.ts's pure functions (no process, no network). */
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { describe, test } from 'node:test';
import {
  checkPayloadSignature, checkScalrSignature, cidrContains, compileGoRegex, compileHooksFile, decodeBase64Strict,
  evaluateRule, evaluateRuleBeforeBody, extractSignatures, formatGoDuration, goJsonMarshal, goJsEscape, goQueryEscape, JsonNumber, lookupParameter,
  MultipartError, ParameterNotFound, parseCidr, parseCommandLine, parseGoDuration, parseJsonKeepingNumbers, parseMultipart,
  parsePayload, parseYaml, parseXml, redactUrl, renderTemplate, replaceParameter, UsageError, type HookRequest,
  escapeControls, formatRbac, hookReach, inheritedEnvironment, parseListenAddress, listWithin, pendingEntryProblem,
  sealPendingEntry, gateJob, unsealedEntriesWarnings,
} from '../webhook.ts';

describe('command line', () => {
  test('Go flag syntax', () => {
    const o = parseCommandLine(['--hooks=a.json', '-hooks', 'b.json', '-verbose', '-port=9001', '-nopanic=false', '-header', 'X-A=1=2']);
    assert.deepEqual(o.hooks, ['a.json', 'b.json']);
    assert.equal(o.port, 9001);
    assert.equal(o.verbose, true);
    assert.equal(o.nopanic, false);
    assert.deepEqual(o.headers, [['X-A', '1=2']]);
  });
  test('defaults', () => {
    const o = parseCommandLine([]);
    assert.deepEqual([o.hooks, o.ip, o.port, o.urlprefix, o.maxConcurrentCommands], [['hooks.json'], '0.0.0.0', 9000, 'hooks', 16]);
    assert.deepEqual([o.maxBodyBytes, o.bodyIdleTimeoutMs], [1024 * 1024, 30_000]);
  });
  test('WEBHOOK_CMD is split and appended', () => {
    const o = parseCommandLine(['-hooks', 'x'], { WEBHOOK_CMD: ' -template  -urlprefix=api ' });
    assert.equal(o.template, true);
    assert.equal(o.urlprefix, 'api');
  });
  test('errors', () => {
    assert.throws(() => parseCommandLine(['-port']), /flag needs an argument: -port/);
    assert.throws(() => parseCommandLine(['-port', 'x']), /invalid value "x" for flag -port/);
    assert.throws(() => parseCommandLine(['-nope']), /flag provided but not defined: -nope/);
    assert.throws(() => parseCommandLine(['-verbose=maybe']), UsageError);
    assert.throws(() => parseCommandLine(['-header', 'novalue']), /use name=value/);
    assert.throws(() => parseCommandLine(['stray']), /unexpected argument "stray"/);
  });
  test('durations', () => {
    assert.equal(parseGoDuration('1h2m3.5s'), 3_723_500);
    assert.equal(parseGoDuration('300ms'), 300);
    assert.equal(parseGoDuration('0'), 0);
    assert.throws(() => parseGoDuration('5'), /invalid duration/);
    assert.throws(() => parseGoDuration('5 m'), /invalid duration/);
    assert.equal(formatGoDuration(90_500), '1m30.5s');
    assert.equal(formatGoDuration(10 * 60_000), '10m0s');
  });
});

describe('hook files are read as adnanh reads them (YAML, JSON included), with every key\'s line', () => {
  test('records the line of every key and index', () => {
    const { value, lines } = parseYaml('[\n {"a": 1,\n  "b": [true,\n null]}]');
    const obj = (value as object[])[0] as { b: unknown[] };
    assert.equal(lines.get(obj)?.get('a'), 2);
    assert.equal(lines.get(obj)?.get('b'), 3);
    assert.equal(lines.get(obj.b)?.get('1'), 4);
  });
  test('YAML-style JSON that adnanh loads is loaded: a key in a list, trailing commas', () => {
    assert.deepEqual(parseYaml('{"and": [ "or": [1], ], }').value, { and: [{ or: [1] }] });
    assert.deepEqual(parseYaml('- id: a\n  value: 1\n').value, [{ id: 'a', value: 1 }]);
  });
  test('rejects duplicate keys, trailing data and bad syntax, without quoting strings', () => {
    assert.throws(() => parseYaml('{"a":1,\n"a":2}'), /line 2, column \d+: duplicate key "a"/);
    assert.throws(() => parseYaml('[] x'), /line 1, column 4: did not find expected <document start>/);
    assert.throws(() => parseYaml('[{"id":"x"'), /did not find expected ',' or '}'/);
    assert.throws(() => parseYaml('["secret-value'), (e: Error) => !e.message.includes('secret-value'));
  });
});

describe('templates', () => {
  const env = { getenv: (n: string) => ({ A: 'x"y', E: '' } as Record<string, string>)[n], readFile: (p: string) => (p === '/f' ? 'file\n\n' : undefined) };
  test('functions, pipes, trim markers, comments', () => {
    assert.equal(renderTemplate('{{ getenv "A" | js }}', env).output, 'x\\"y');
    assert.equal(renderTemplate('{{ getenv \\"A\\" | html }}', env).output, 'x&#34;y');
    assert.equal(renderTemplate('{{cat "/f"}}|', env).output, 'file\n|');
    assert.equal(renderTemplate('a  {{- /* c */ -}}  b', env).output, 'ab');
    assert.equal(renderTemplate('{{ urlquery (getenv "A") }}', env).output, 'x%22y');
    assert.equal(renderTemplate('{{ `raw` }}{{ "q" }}', env).output, 'rawq');
  });
  test('collects the values source functions inserted, as secrets', () => {
    assert.deepEqual(renderTemplate('{{ getenv "A" | js }} {{ getenv "E" }}', env).inserted, ['x"y']);
  });
  test('errors name the line', () => {
    assert.throws(() => renderTemplate('\n\n{{ index "a" }}', env), /line 3: template: function "index" not defined/);
    assert.throws(() => renderTemplate('{{ getenv }}', env), /wrong number of args for getenv: want 1 got 0/);
    assert.throws(() => renderTemplate('{{ getenv "A"', env), /unclosed action/);
    assert.throws(() => renderTemplate('{{ .Foo }}', env), /unexpected "\."/);
  });
  test('Go escapers', () => {
    assert.equal(goJsEscape(`a'b<c>&=\\\n`), "a\\'b\\u003Cc\\u003E\\u0026\\u003D\\\\\\u000A");
    assert.equal(goQueryEscape("a b/c?d=e&f~g*'"), 'a+b%2Fc%3Fd%3De%26f~g%2A%27');
  });
});

describe('hook compilation', () => {
  const compile = (hooks: unknown) => compileHooksFile('h.json', JSON.stringify(hooks), { commandTimeoutMs: 1000 });
  test('defaults and secrets', () => {
    const f = compile([{ id: 'a', 'execute-command': '/bin/true', 'http-methods': [' post '], 'trigger-rule': { and: [
      { match: { type: 'value', value: 'prod-namespace', parameter: { source: 'query', name: 'ns' } } },
      { match: { type: 'payload-hmac-sha256', secret: 'hmac-secret-1', parameter: { source: 'header', name: 'X-Sig' } } },
    ] } }]);
    const h = f.hooks[0];
    assert.deepEqual([h.successCode, h.mismatchCode, h.methods, h.commandTimeoutMs], [200, 200, ['POST'], 1000]);
    assert.deepEqual(f.secrets, ['hmac-secret-1'], 'signature secrets are scrubbed; compared routing values are not');
    assert.deepEqual(f.redactedParams, ['url:ns'], 'but compared query parameters are redacted in the access log');
  });
  test('pass-file-to-command without envname is HOOK_ + upper-cased name', () => {
    const h = compile([{ id: 'a', 'execute-command': '/bin/true', 'pass-file-to-command': [{ source: 'payload', name: 'cfg.file' }] }]).hooks[0];
    assert.equal(h.files[0].envname, 'HOOK_CFG.FILE');
  });
  test('placeholders are warnings, with their place', () => {
    const f = compile([{ id: 'a', 'execute-command': '/bin/true', 'pass-environment-to-command': [{ source: 'string', name: '<namespaces>', envname: 'NS' }] }]);
    assert.match(f.warnings[0], /h\.json:1: hook "a": pass-environment-to-command\[0\]\.name: still holds the placeholder "<namespaces>"/);
  });
});

describe('parameters', () => {
  const payload = parseJsonKeepingNumbers('{"a.b":"whole","a":{"b":"split","n":[{"x":1.50}]},"big":12345678901234567890}') as Record<string, unknown>;
  test('dotted lookup tries the whole key first, then descends; arrays by index', () => {
    assert.equal(lookupParameter('a.b', payload), 'whole');
    assert.equal((lookupParameter('a.n.0.x', payload) as JsonNumber).text, '1.50');
    assert.throws(() => lookupParameter('a.n.1.x', payload), ParameterNotFound);
    assert.throws(() => lookupParameter('a.zz', payload), /parameter node not found: zz/);
    assert.throws(() => lookupParameter('x', undefined), ParameterNotFound);
  });
  test('Go JSON serialisation: sorted keys, literal numbers, HTML-safe escapes', () => {
    assert.equal(goJsonMarshal(payload), '{"a":{"b":"split","n":[{"x":1.50}]},"a.b":"whole","big":12345678901234567890}');
    assert.equal(goJsonMarshal({ s: '<a&b>\u2028\u0001"\\\n' }), '{"s":"\\u003ca\\u0026b\\u003e\\u2028\\u0001\\"\\\\\\n"}');
  });
  test('replaceParameter sets only existing keys', () => {
    const p = { a: { b: '{}' } } as Record<string, unknown>;
    assert.equal(replaceParameter('a.b', p, { c: 1 }), true);
    assert.equal(replaceParameter('a.x', p, 1), false);
    assert.deepEqual(p, { a: { b: { c: 1 } } });
  });
});

describe('bodies', () => {
  test('JSON object, JSON array as root, form, unsupported type', () => {
    assert.deepEqual(parsePayload('application/json', Buffer.from('[1]'), []).payload?.root, [new JsonNumber('1')]);
    assert.deepEqual(parsePayload('application/x-www-form-urlencoded', Buffer.from('a=1&a=2&b=x+y'), []).payload, { a: '1', b: 'x y' });
    assert.equal(parsePayload('application/json', Buffer.from('{bad'), []).payload, undefined);
    assert.match(parsePayload('text/plain', Buffer.from('x'), []).note!, /unsupported content type header: text\/plain/);
  });
  test('XML the mxj way', () => {
    assert.deepEqual(parseXml('<?xml version="1.0"?><!-- c --><a x="1"><b>t&amp;u</b><b><![CDATA[<v>]]></b><c/></a>'), { a: { '-x': '1', b: ['t&u', '<v>'], c: '' } });
    assert.throws(() => parseXml('<a><b></a>'), /mismatched closing tag/);
  });
  test('multipart: values, JSON file parts, other files ignored, errors', () => {
    const body = Buffer.from([
      '--XX', 'Content-Disposition: form-data; name="v"', '', 'value', '--XX',
      'Content-Disposition: form-data; name="j"; filename="j.json"', 'Content-Type: application/json', '', '{"k":2}', '--XX',
      'Content-Disposition: form-data; name="f"; filename="f.bin"', 'Content-Type: application/octet-stream', '', 'bin', '--XX--', '',
    ].join('\r\n'));
    assert.deepEqual(parseMultipart('multipart/form-data; boundary=XX', body, []), { v: 'value', j: { k: new JsonNumber('2') } });
    assert.throws(() => parseMultipart('multipart/form-data;', body, []), MultipartError);
    assert.throws(() => parseMultipart('multipart/form-data; boundary=YY', body, []), MultipartError);
    // Bare LF line endings, as Go's mime/multipart accepts them (the first boundary line decides).
    const lf = Buffer.from(body.toString('latin1').replaceAll('\r\n', '\n'), 'latin1');
    assert.deepEqual(parseMultipart('multipart/form-data; boundary=XX', lf, []), { v: 'value', j: { k: new JsonNumber('2') } });
  });
});

describe('rules', () => {
  const request = (over: Partial<HookRequest> = {}): HookRequest => ({
    id: 'r', method: 'POST', remoteAddr: '10.1.2.3:5555', remoteIp: '10.1.2.3', headers: {}, query: { t: 'yes' }, payload: undefined, body: Buffer.from('{"a":1}'), ...over,
  });
  const rules = (rule: unknown) => compileHooksFile('h.json', JSON.stringify([{ id: 'x', 'execute-command': '/bin/true', 'trigger-rule': rule }]), { commandTimeoutMs: 0 }).hooks[0].rule!;
  const value = (name: string, v: string) => ({ match: { type: 'value', value: v, parameter: { source: 'url', name } } });
  test('and / or / not with missing parameters', () => {
    assert.deepEqual(evaluateRule(rules({ and: [value('t', 'yes'), value('t', 'yes')] }), request(), false), { ok: true });
    assert.equal(evaluateRule(rules({ and: [value('t', 'yes'), value('missing', 'x')] }), request(), false).ok, false);
    assert.equal(evaluateRule(rules({ or: [value('missing', 'x'), value('t', 'yes')] }), request(), false).ok, true);
    // adnanh: `not` of a missing parameter is true (the error is only logged).
    const r = evaluateRule(rules({ not: value('missing', 'x') }), request(), false);
    assert.equal(r.ok, true);
    assert.ok(r.error instanceof ParameterNotFound);
  });
  test('signature errors fail hard unless soft inside or', () => {
    const sig = { match: { type: 'payload-hmac-sha256', secret: 's', parameter: { source: 'url', name: 't' } } };
    const rule = rules({ or: [sig, value('t', 'yes')] });
    assert.match(evaluateRule(rule, request(), false).error!.message, /invalid payload signature yes/);
    assert.deepEqual(evaluateRule(rule, request(), true), { ok: true });
  });
  test('HMAC signatures: prefix optional, several comma-separated', () => {
    const body = Buffer.from('{"a":1}');
    const good = createHmac('sha256', 'k').update(body).digest('hex');
    assert.equal(checkPayloadSignature(body, 'sha256', 'k', good).ok, true);
    assert.equal(checkPayloadSignature(body, 'sha256', 'k', `sha256=${good}`).ok, true);
    assert.equal(checkPayloadSignature(body, 'sha256', 'k', `sha256=00,sha256=${good}`).ok, true);
    assert.equal(checkPayloadSignature(body, 'sha256', 'k', 'sha256=00').ok, false);
    assert.deepEqual(extractSignatures('sha1=a,sha256=b,sha1=c', 'sha1='), ['a', 'c']);
  });
  test('Scalr signature with a fresh date, and an outdated one', () => {
    const date = 'Sun 22 Nov 2026 04:00:00 UTC';
    const body = Buffer.from('x');
    const sig = createHmac('sha1', 'k').update(body).update(date).digest('hex');
    const req = request({ body, headers: { 'X-Signature': sig, Date: date } });
    assert.equal(checkScalrSignature(req, 'k', new Date('2026-11-22T04:02:00Z')).ok, true);
    assert.match(checkScalrSignature(req, 'k', new Date('2026-11-22T04:06:00Z')).error!.message, /outdated/);
    assert.equal(checkScalrSignature(request(), 'k', new Date()).ok, false);
  });
  test('before the body, a rule is decided exactly as it will be with it, or left to the body', () => {
    const body = Buffer.from('{"a":"1"}');
    const sig = (secret: string) => 'sha256=' + createHmac('sha256', secret).update(body).digest('hex');
    const full = request({ body, payload: { a: '1' }, headers: { 'X-Sig': sig('k') }, query: { t: 'yes' } });
    const unread = request({ body: Buffer.alloc(0), payload: undefined, headers: full.headers, query: full.query });
    const hmac = (name: string) => ({ match: { type: 'payload-hmac-sha256', secret: 'k', parameter: { source: 'header', name } } });
    const payload = (name: string, v: string) => ({ match: { type: 'value', value: v, parameter: { source: 'payload', name } } });
    const leaves: Record<string, object> = {
      urlTrue: value('t', 'yes'), urlFalse: value('t', 'no'), urlMissing: value('gone', 'x'),
      bodyTrue: payload('a', '1'), bodyFalse: payload('a', '2'), bodyMissing: payload('gone', 'x'),
      hmacGood: hmac('X-Sig'), hmacMissing: hmac('X-None'),
      raw: { match: { type: 'regex', regex: '^\\{', parameter: { source: 'raw-request-body' } } },
    };
    const shapes = (a: object, b: object): object[] => [{ and: [a, b] }, { or: [a, b] }, { not: a }, { and: [{ not: a }, b] }, { or: [{ and: [a, b] }, { not: b }] }];
    let decided = 0;
    for (const a of Object.values(leaves)) {
      for (const b of Object.values(leaves)) {
        for (const shape of shapes(a, b)) {
          for (const soft of [false, true]) {
            const rule = rules(shape);
            const early = evaluateRuleBeforeBody(rule, unread, soft);
            if (!early) continue;
            decided++;
            const late = evaluateRule(rule, full, soft);
            assert.deepEqual([early.ok, early.error?.constructor, early.error?.message], [late.ok, late.error?.constructor, late.error?.message], JSON.stringify(shape));
          }
        }
      }
    }
    assert.ok(decided > 100, `${decided} decided before the body`);
    // The seed hook's shape (only URL matches) is always decided; a body match first never is.
    assert.deepEqual(evaluateRuleBeforeBody(rules({ and: [leaves.urlFalse, leaves.bodyTrue] }), unread, false), { ok: false });
    assert.equal(evaluateRuleBeforeBody(rules({ and: [leaves.bodyTrue, leaves.urlFalse] }), unread, false), undefined);
    assert.ok(evaluateRuleBeforeBody(rules(leaves.hmacMissing), unread, false)!.error instanceof ParameterNotFound);
  });
  test('regex: RE2 syntax is translated, non-RE2 refused', () => {
    assert.equal(compileGoRegex('(?i)^ABC\\z').test('abc'), true);
    assert.equal(compileGoRegex('^(?P<v>\\d+)$').exec('42')?.groups?.v, '42');
    assert.equal(compileGoRegex('[[:digit:]]+').test('x1'), true);
    assert.throws(() => compileGoRegex('a(?=b)'), /lookaround/);
    assert.throws(() => compileGoRegex('(a)\\1'), /backreferences/);
  });
  test('regex: Go semantics on the linear engine', () => {
    const matches = (pattern: string, input: string) => compileGoRegex(pattern).test(input);
    assert.equal(compileGoRegex('^a$').flags.includes('l'), true);
    assert.deepEqual([matches('(?i)k', '\u212a'), matches('(?i)[a-c]+$', 'xABC'), matches('(?i)[^a]', 'A')], [true, true, false]);
    assert.deepEqual([matches('(?i:ab)c', 'ABc'), matches('(?i:ab)c', 'ABC'), matches('a(?i)bc', 'aBC')], [true, false, true]);
    assert.deepEqual([matches('a.c', 'a\rc'), matches('a.c', 'a\nc'), matches('(?s)a.c', 'a\nc')], [true, false, true]);
    assert.deepEqual([matches('\\s', '\v'), matches('[[:space:]]', '\v'), matches('[[:^alpha:]]', 'a')], [false, true, false]);
    assert.deepEqual([matches('\\Qa.b\\E', 'axb'), matches('\\x{41}\\x42\\101', 'ABA'), matches('[]a]', ']')], [false, true, true]);
    assert.deepEqual([matches('(?m)^b$', 'a\nb\nc'), matches('(?m)\\Ab', 'a\nb'), matches('x{,3}', 'x{,3}')], [true, false, true]);
    // Counted repeats of one character beyond the engine's 16 copies are written out.
    assert.deepEqual([matches('^[0-9a-f]{40}$', 'a'.repeat(40)), matches('^[0-9a-f]{40}$', 'a'.repeat(41))], [true, false]);
    assert.deepEqual([matches('^a{2,20}$', 'a'.repeat(20)), matches('^a{2,20}$', 'a'.repeat(21)), matches('^a{20,}$', 'a'.repeat(19))], [true, false, false]);
    assert.equal(matches('^([a-z0-9]+-?)+$', 'a'.repeat(100_000) + '!'), false);
  });
  test('regex: what Go or the linear engine refuses is an error saying why', () => {
    assert.throws(() => compileGoRegex('\\pL'), /Unicode classes/);
    assert.throws(() => compileGoRegex('(?:(?:ab){5}){5}'), /linear-time engine cannot run it/);
    assert.throws(() => compileGoRegex('(?:ab){17}'), /linear-time engine cannot run it/);
    assert.throws(() => compileGoRegex('[\\x{1F600}]'), /beyond U\+FFFF/);
    assert.throws(() => compileGoRegex('a(?m)b'), /only at the start/);
    assert.throws(() => compileGoRegex('(?m)a\\z'), /lookahead/);
    assert.throws(() => compileGoRegex('a{1001}'), /invalid repeat count/);
    assert.throws(() => compileGoRegex('\\y'), /invalid escape sequence/);
    assert.throws(() => compileGoRegex('a**'), /missing argument to repetition operator/);
  });
  test('CIDRs: IPv4, IPv6, single addresses, v4-mapped clients', () => {
    assert.equal(cidrContains(parseCidr('10.0.0.0/8')!, '10.9.8.7'), true);
    assert.equal(cidrContains(parseCidr('10.0.0.0/8')!, '11.0.0.1'), false);
    assert.equal(cidrContains(parseCidr('127.0.0.1')!, '::ffff:127.0.0.1'), true);
    assert.equal(cidrContains(parseCidr('fd00::/8')!, 'fd12::1'), true);
    assert.equal(cidrContains(parseCidr('::1')!, '::1'), true);
    assert.equal(parseCidr('10.0.0.0/33'), undefined);
    assert.equal(parseCidr('nonsense'), undefined);
  });
});

test('redactUrl hides compared parameters and token, keeps the rest', () => {
  assert.equal(redactUrl('/hooks/web?token=s3cret&ns=prod&k%65y=v&flag', new Set(['url:key'])), '/hooks/web?token=REDACTED&ns=prod&k%65y=REDACTED&flag');
  assert.equal(redactUrl('/hooks/web', new Set()), '/hooks/web');
});

test('strict base64', () => {
  assert.equal(decodeBase64Strict('aGk=').toString(), 'hi');
  assert.throws(() => decodeBase64Strict('a*b'), /illegal base64/);
});

describe('least privilege: what a hook can reach (-print-rbac)', () => {
  const compile = (hooks: unknown) => compileHooksFile('h.json', JSON.stringify(hooks), { commandTimeoutMs: 1000 }).hooks;
  const env = (ns: object, workload: object) => [{ envname: 'APP_NS', ...ns }, { envname: 'APP_WORKLOAD', ...workload }];
  const pin = (source: string, name: string, value: string) => ({ match: { type: 'value', value, parameter: { source, name } } });
  const token = pin('url', 'token', 'tok-123456');
  test('literals, and parameters pinned by value rules reached through "and"; anything else is open', () => {
    const hooks = compile([
      { id: 'seed', 'execute-command': '/webhooks.sh', 'pass-environment-to-command': env({ source: 'url', name: 'ns' }, { source: 'url', name: 'workload' }),
        'trigger-rule': { and: [token, { and: [pin('url', 'ns', 'prod')] }, pin('url', 'workload', 'Deploy/web')] } },
      { id: 'literal', 'execute-command': '/webhooks.sh', 'pass-environment-to-command': env({ source: 'string', name: 'shop' }, { source: 'header', name: 'X-Workload' }),
        'trigger-rule': { and: [token, pin('header', 'x-workload', 'cj/nightly')] } },
      { id: 'either', 'execute-command': '/webhooks.sh', 'pass-environment-to-command': env({ source: 'string', name: 'prod' }, { source: 'url', name: 'workload' }),
        'trigger-rule': { or: [pin('url', 'workload', 'deployment/a'), pin('url', 'workload', 'deployment/b')] } },
      { id: 'bad', 'execute-command': '/webhooks.sh', 'pass-environment-to-command': env({ source: 'string', name: 'Prod' }, { source: 'string', name: 'deployment/web' }) },
      { id: 'echo', 'execute-command': '/bin/echo' },
    ]);
    const reaches = hooks.map(hookReach);
    assert.deepEqual(reaches, [
      { hook: 'seed', target: { namespace: 'prod', kind: 'deployment', name: 'web' } },
      { hook: 'literal', target: { namespace: 'shop', kind: 'cronjob', name: 'nightly' } },
      { hook: 'either', open: 'its workload comes from the url parameter "workload", which no value rule pins' },
      { hook: 'bad', open: 'APP_NS "Prod" is not a namespace name' },
      undefined,
    ]);
    const yaml = formatRbac(reaches.filter((r) => r !== undefined), 'ops/hooks', ['h.json']);
    assert.match(yaml, /^#   hook "either": NOT COVERED: /m);
    const roles = yaml.split('---\n').slice(1);
    assert.deepEqual(roles.map((r) => /^kind: (\w+)\n(?:.*\n)*?  namespace: "([^"]+)"/m.exec(r)!.slice(1).join(' ')), ['Role prod', 'RoleBinding prod', 'Role shop', 'RoleBinding shop']);
    // A CronJob has no rollout to summarise: no list on pods or replicasets in its namespace.
    assert.equal(roles[2], [
      'apiVersion: rbac.authorization.k8s.io/v1', 'kind: Role', 'metadata:', '  name: "hooks"', '  namespace: "shop"', '  labels:',
      '    app.kubernetes.io/name: webhook', 'rules:', '  - apiGroups: ["batch"]', '    resources: ["cronjobs"]', '    resourceNames: ["nightly"]',
      '    verbs: ["get", "patch"]', '  - apiGroups: [""]', '    resources: ["events"]', '    verbs: ["create"]', '',
    ].join('\n'));
    assert.match(roles[3], /subjects:\n  - kind: ServiceAccount\n    name: "hooks"\n    namespace: "ops"\n$/);
  });
  test('delete on pods only where a hook fixing ROLLBACK_ON_FAILURE=true upgrades a StatefulSet (its forced rollback)', () => {
    const hook = (id: string, ns: string, workload: string, rollback: object | undefined) => ({
      id, 'execute-command': '/webhooks.sh',
      'pass-environment-to-command': [...env({ source: 'string', name: ns }, { source: 'string', name: workload }), ...(rollback ? [{ envname: 'ROLLBACK_ON_FAILURE', ...rollback }] : [])],
    });
    const reaches = compile([
      hook('sts', 'a', 'sts/db', { source: 'string', name: 'true' }),
      hook('plain', 'b', 'statefulset/db', undefined),
      hook('off', 'c', 'statefulset/db', { source: 'string', name: 'false' }),
      hook('url', 'd', 'statefulset/db', { source: 'url', name: 'rollback' }),
      hook('deploy', 'e', 'deployment/web', { source: 'string', name: 'true' }),
    ]).map(hookReach);
    assert.deepEqual(reaches.map((r) => r?.rollbackOnFailure), [true, undefined, undefined, undefined, true]);
    const yaml = formatRbac(reaches.filter((r) => r !== undefined), 'ops/hooks', ['h.json']);
    const podVerbs = Object.fromEntries(yaml.split('---\n').filter((d) => /^kind: Role$/m.test(d))
      .map((d) => [/namespace: "(\w+)"/.exec(d)![1], /resources: \["pods"\]\n    verbs: (.*)/.exec(d)![1]]));
    assert.deepEqual(podVerbs, { a: '["list", "watch", "delete"]', b: '["list", "watch"]', c: '["list", "watch"]', d: '["list", "watch"]', e: '["list", "watch"]' });
    // -rbac-pod-logs: get on pods/log beside them, where a rollout is followed; never without it.
    assert.doesNotMatch(yaml, /pods\/log/);
    const withLogs = formatRbac(reaches.filter((r) => r !== undefined), 'ops/hooks', ['h.json'], true);
    assert.equal(withLogs.match(/^    resources: \["pods\/log"\]\n    verbs: \["get"\]$/gm)?.length, 5);
    assert.match(withLogs, /^# Generated by `webhook -print-rbac -rbac-pod-logs -hooks h\.json`$/m);
  });
});

describe('pending entries: used only as sealed where they sit, for a hook that serves the place', () => {
  const key = Buffer.alloc(32, 5);
  const fixed = (id: string, settings: Record<string, string>) => ({ id, 'execute-command': '/webhooks.sh',
    'pass-environment-to-command': Object.entries(settings).map(([envname, name]) => ({ envname, source: 'string', name })) });
  const hooks = compileHooksFile('h.json', JSON.stringify([
    fixed('api', { APP_NS: 'prod', APP_WORKLOAD: 'deployment/api', APP_CONTAINER: 'app' }),
    fixed('any', {}),
    fixed('far', { CLUSTER: 'b' }),
    fixed('both', { CLUSTERS: 'a b' }),
  ]), { commandTimeoutMs: 1000 }).hooks;
  const [api, any, far, both] = hooks;
  const entry = {
    id: 'e1', hook: 'api', request: 'r1', image: 'registry.example.com/acme/web:v2', push: 'sha256:x|t',
    pushedAt: '2026-11-25T00:00:00.000Z', timeFrom: 'payload' as const, receivedAt: '2026-11-25T00:00:00.000Z',
    waitsFor: 'window' as const, until: '2026-11-26T00:00:00.000Z', decides: 'the change window',
  };
  /** The waiting push on deployment/<name> in prod, container <container>, cluster <cluster>, sealed there. */
  const at = (name: string, container: string, cluster?: string, hook = 'api') => {
    const target = { namespace: 'prod', kind: 'deployment' as const, name };
    const sealed = sealPendingEntry(key, { ...target, cluster, container }, { ...entry, hook });
    return { target, container, cluster, entry: sealed };
  };
  test('the hook\'s own workload, container and cluster; anything else is named', () => {
    assert.equal(pendingEntryProblem(key, at('api', 'app'), api), undefined);
    assert.equal(pendingEntryProblem(key, at('victim', 'sidecar'), api), 'hook "api" deploys to deployment/api, not deployment/victim');
    assert.equal(pendingEntryProblem(key, at('api', 'sidecar'), api), 'hook "api" deploys to container app, not sidecar');
    assert.equal(pendingEntryProblem(key, at('api', 'app', 'b'), api), 'hook "api" does not deploy to cluster "b"');
    assert.equal(pendingEntryProblem(key, at('victim', 'sidecar', undefined, 'any'), any), undefined);
    assert.equal(pendingEntryProblem(key, at('web', 'app', undefined, 'far'), far), 'hook "far" does not deploy to the default cluster');
    assert.equal(pendingEntryProblem(key, at('web', 'app', 'b', 'far'), far), undefined);
    assert.equal(pendingEntryProblem(key, at('web', 'app', 'a', 'both'), both), undefined);
    const moved = { ...at('api', 'app'), container: 'sidecar' };
    assert.match(pendingEntryProblem(key, moved, api)!, /^its MAC does not verify/);
    assert.match(pendingEntryProblem(Buffer.alloc(32, 6), at('api', 'app'), api)!, /^its MAC does not verify/);
    // Without a key nothing is sealed: the hook's reach is checked, and what an open hook leaves to the request an
    // unsealed entry does not choose.
    assert.equal(pendingEntryProblem(undefined, { ...at('api', 'app'), entry }, api), undefined);
    assert.equal(pendingEntryProblem(undefined, { ...at('victim', 'app'), entry }, api), 'hook "api" deploys to deployment/api, not deployment/victim');
    assert.equal(pendingEntryProblem(undefined, { ...at('web', 'app'), entry: { ...entry, hook: 'any' } }, any),
      'hook "any" leaves its namespace and workload to the request, and a record the service cannot verify (unsealed) ' +
      'may choose them only in a namespace its ANNOTATION_NAMESPACES lists (it lists none), not prod');
  });
  test('a hook with stages: a promotion waits in a later stage, in its own namespace; any other entry in the first', () => {
    const [chain] = compileHooksFile('h.json', JSON.stringify([fixed('chain',
      { APP_NS: 'prod', APP_WORKLOAD: 'deployment/api', APP_CONTAINER: 'app', CLUSTERS: 'staging > live/shop' })]),
    { commandTimeoutMs: 1000 }).hooks;
    const inNs = (namespace: string, cluster: string, promoted?: boolean, sealedWith: Buffer | undefined = key) => {
      const target = { namespace, kind: 'deployment' as const, name: 'api' };
      const written = { ...entry, hook: 'chain', ...(promoted ? { promoted } : {}) };
      return { target, container: 'app', cluster, entry: sealPendingEntry(sealedWith, { ...target, cluster, container: 'app' }, written) };
    };
    assert.equal(pendingEntryProblem(key, inNs('shop', 'live', true), chain), undefined);
    assert.equal(pendingEntryProblem(key, inNs('prod', 'staging'), chain), undefined);
    assert.equal(pendingEntryProblem(key, inNs('prod', 'live', true), chain), 'hook "chain" deploys to namespace shop in cluster "live", not prod');
    assert.equal(pendingEntryProblem(key, inNs('shop', 'staging'), chain), 'hook "chain" deploys to namespace prod in cluster "staging", not shop');
    // Not a promotion's (or, unsealed, anyone's to mark as one): the chain is entered at its first stage only.
    const skipped = 'hook "chain" is a promotion chain, entered at its first stage (staging) only: cluster "live" is reached by the chain\'s promotion';
    assert.equal(pendingEntryProblem(key, inNs('shop', 'live'), chain), skipped);
    assert.equal(pendingEntryProblem(undefined, inNs('shop', 'live', true, undefined), chain), skipped);
  });
});

describe('the gate: what a job of each source may reach', () => {
  const hook = (id: string, settings: Record<string, string>, fromUrl: string[] = []) => ({ id, 'execute-command': '/webhooks.sh',
    'pass-environment-to-command': [
      ...fromUrl.map((envname) => ({ envname, source: 'url', name: envname.toLowerCase() })),
      ...Object.entries(settings).map(([envname, name]) => ({ envname, source: 'string', name }))] });
  const [teamA, open, listed, everywhere, chain] = compileHooksFile('h.json', JSON.stringify([
    hook('team-a', { APP_NS: 'team-a' }, ['APP_WORKLOAD', 'APP_CONTAINER']),
    hook('open', {}, ['APP_NS', 'APP_WORKLOAD', 'APP_CONTAINER']),
    hook('listed', { ANNOTATION_NAMESPACES: 'team-b, team-c' }, ['APP_NS', 'APP_WORKLOAD', 'APP_CONTAINER']),
    hook('everywhere', { ANNOTATION_NAMESPACES: '*' }, ['APP_NS', 'APP_WORKLOAD', 'APP_CONTAINER']),
    hook('chain', { APP_NS: 'shop', APP_WORKLOAD: 'deployment/web', CLUSTERS: 'staging > prod-eu prod-us/shop-us' }),
  ]), { commandTimeoutMs: 1000 }).hooks;
  const at = (namespace: string, cluster?: string, name = 'web') => ({ cluster, namespace, kind: 'deployment' as const, name, container: 'app' });
  const cases: [string, ReturnType<typeof gateJob>][] = [
    [gateJob(teamA, at('team-a'), { source: 'request' }) ?? 'ok', 'ok'],
    // What the hook fixes, no source overwrites.
    [gateJob(teamA, at('team-b'), { source: 'annotation' })!, 'hook "team-a" deploys to namespace team-a in the default cluster, not team-b'],
    [gateJob(teamA, at('team-b'), { source: 'record', sealed: true })!, 'hook "team-a" deploys to namespace team-a in the default cluster, not team-b'],
    // What it leaves open: a request, or a sealed record; an annotation only where ANNOTATION_NAMESPACES says.
    [gateJob(teamA, at('team-a'), { source: 'annotation' })!, 'hook "team-a" leaves its workload to the request, and an annotation may ' +
      'choose them only in a namespace its ANNOTATION_NAMESPACES lists (it lists none), not team-a'],
    [gateJob(open, at('team-b'), { source: 'request' }) ?? 'ok', 'ok'],
    [gateJob(open, at('team-b'), { source: 'record', sealed: true }) ?? 'ok', 'ok'],
    [gateJob(open, at('team-b'), { source: 'record' })!, 'hook "open" leaves its namespace and workload to the request, and a record the ' +
      'service cannot verify (unsealed) may choose them only in a namespace its ANNOTATION_NAMESPACES lists (it lists none), not team-b'],
    [gateJob(listed, at('team-c'), { source: 'annotation' }) ?? 'ok', 'ok'],
    [gateJob(listed, at('team-a'), { source: 'annotation' })!, 'hook "listed" leaves its namespace and workload to the request, and an ' +
      'annotation may choose them only in a namespace its ANNOTATION_NAMESPACES lists (team-b, team-c), not team-a'],
    [gateJob(everywhere, at('kube-system'), { source: 'annotation' }) ?? 'ok', 'ok'],
    [gateJob(open, at('team-b', 'prod'), { source: 'request' })!, 'hook "open" does not deploy to cluster "prod"'],
    // A chain: entered at its first stage; a later stage by the chain's promotion, in the stage's namespace.
    [gateJob(chain, at('shop', 'staging'), { source: 'annotation' }) ?? 'ok', 'ok'],
    [gateJob(chain, at('shop', 'prod-eu'), { source: 'annotation' })!, 'hook "chain" is a promotion chain, entered at its first stage ' +
      '(staging) only: cluster "prod-eu" is reached by the chain\'s promotion'],
    [gateJob(chain, at('shop', 'prod-eu'), { source: 'record', sealed: true })!, 'hook "chain" is a promotion chain, entered at its first ' +
      'stage (staging) only: cluster "prod-eu" is reached by the chain\'s promotion'],
    [gateJob(chain, at('shop', 'prod-eu'), { source: 'promotion', stage: 1 }) ?? 'ok', 'ok'],
    [gateJob(chain, at('shop-us', 'prod-us'), { source: 'promotion', stage: 1 }) ?? 'ok', 'ok'],
    [gateJob(chain, at('payments', 'prod-eu'), { source: 'promotion', stage: 1, sealed: true })!,
      'hook "chain" deploys to namespace shop in cluster "prod-eu", not payments'],
    [gateJob(chain, at('shop', 'staging'), { source: 'promotion', stage: 1 })!, 'hook "chain" does not deploy to cluster "staging"'],
    [gateJob(chain, at('shop', 'staging', 'api'), { source: 'request' })!, 'hook "chain" deploys to deployment/web, not deployment/api'],
  ];
  test('each source, each constraint: allowed, or refused naming why', () => {
    for (const [got, want] of cases) assert.equal(got, want);
  });
  test('without -approval-key-file the service says which hooks\' waits (signature, window) only the replica that wrote them applies', () => {
    const signing = { VERIFY_SIGNATURE: 'cosign:-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEWTu5wEt0MYvVpO7l5s5Tt3wM7yBZ8lAhb4gZv1o7l8kqT6yGQ7g0Zr6m4k3a8v6d2y1m0n9c7b5a4x3w2v1u0g==\n-----END PUBLIC KEY-----' };
    const hooks = compileHooksFile('h.json', JSON.stringify([
      hook('open-waits', signing, ['APP_NS', 'APP_WORKLOAD', 'APP_CONTAINER']),
      hook('open-at-once', { ...signing, SIGNATURE_WAIT: '0' }, ['APP_NS', 'APP_WORKLOAD', 'APP_CONTAINER']),
      hook('fixed-waits', { ...signing, APP_NS: 'shop', APP_WORKLOAD: 'deployment/web' }, ['APP_CONTAINER']),
      hook('windowed', { DEPLOY_WINDOW: 'Mon-Fri 09:00-18:00 UTC' }, ['APP_NS', 'APP_WORKLOAD', 'APP_CONTAINER']),
      hook('plain', {}, ['APP_NS', 'APP_WORKLOAD', 'APP_CONTAINER']),
    ]), { commandTimeoutMs: 1000 }).hooks;
    const lines = unsealedEntriesWarnings(hooks, false);
    assert.deepEqual(lines.map((l) => /^hook "([\w-]+)"/.exec(l)?.[1]), ['open-waits', 'fixed-waits', 'windowed']);
    assert.match(lines[0], /waiting for its signature \(SIGNATURE_WAIT\) is written unsealed, and applied only by the replica that wrote it while it runs: another replica, or this one after a restart, does not resume it \(it expires\): start the service with -public-url and -approval-key-file, or set SIGNATURE_WAIT=0$/);
    assert.match(lines[2], /waiting for its change window \(DEPLOY_WINDOW\) is written unsealed, .* -approval-key-file$/);
    assert.deepEqual(unsealedEntriesWarnings(hooks, true), []);
  });
});

describe('small guards', () => {
  test('escapeControls: C0, DEL, C1 and line separators escaped; printable text and UTF-8 kept', () => {
    assert.equal(escapeControls('a\nb\r\x1b[31m\x7f\x9b\u2028ok é 中'), 'a\\x0ab\\x0d\\x1b[31m\\x7f\\x9b\\u2028ok é 中');
  });
  test('parseListenAddress', () => {
    assert.deepEqual(parseListenAddress(':9100'), { host: undefined, port: 9100 });
    assert.deepEqual(parseListenAddress('127.0.0.1:0'), { host: '127.0.0.1', port: 0 });
    assert.deepEqual(parseListenAddress('[::1]:9100'), { host: '::1', port: 9100 });
    for (const bad of ['9100', 'host:', 'a:99999', '::1:9100']) assert.throws(() => parseListenAddress(bad), UsageError, bad);
  });
  test('inheritedEnvironment leaves out the service\'s own settings and what templates read', () => {
    const env = { PATH: '/bin', MAIL_PASSWORD: 'x', MAIL_TO: 'a@b', HOOK_TOKEN: 't', KUBECONFIG: 'k', CREDENTIALS_DIRECTORY: 'c', API_KEY: 'k', HOME: '/h' };
    assert.deepEqual(inheritedEnvironment(env, new Set(['API_KEY'])), { PATH: '/bin', HOME: '/h' });
  });
});

describe('lists built from payload data', () => {
  test('listWithin: joined up to a KiB, the rest counted; one long item cut', () => {
    assert.equal(listWithin([]), '');
    assert.equal(listWithin(['a', 'b']), 'a, b');
    assert.equal(listWithin(['a', 'b'], '; '), 'a; b');
    const items = Array.from({ length: 100 }, (_, i) => `item-${i}`.padEnd(50, '.'));
    const shown = listWithin(items);
    assert.ok(shown.length <= 1024 + 20, String(shown.length));
    assert.match(shown, /^item-0\.+, item-1\.+, .*item-18\.+ … and 81 more$/);
    assert.equal(listWithin(['x'.repeat(5000)]), `${'x'.repeat(1024)}…`);
    assert.equal(listWithin(['x'.repeat(5000), 'y']), `${'x'.repeat(1024)}… … and 1 more`);
  });
});
