/*
 * The semver chapter, by tables of facts: precedence as Semantic Versioning 2.0.0 §11 states it (its own example
 * chains), versions with and without a leading `v`, and npm's range syntax as node-semver's README documents it
 * (its desugarings, its satisfies examples, its pre-release rule). Nothing here is copied from either project's code.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { compareVersions, formatVersion, parseRange, parseVersion, readVersion, satisfiesRange } from '../webhook.ts';

const v = (text: string) => {
  const parsed = parseVersion(text);
  assert.ok(parsed, `${text} should be a version`);
  return parsed;
};
const satisfies = (version: string, range: string) => satisfiesRange(v(version), parseRange(range));

describe('versions', () => {
  test('with or without one leading v; build metadata kept apart', () => {
    assert.deepEqual(v('1.2.3'), { major: 1, minor: 2, patch: 3, pre: [], build: [] });
    assert.deepEqual(v('v1.2.3'), v('1.2.3'));
    assert.deepEqual(v('1.0.0-alpha.1+exp.sha.5114f85'), { major: 1, minor: 0, patch: 0, pre: ['alpha', '1'], build: ['exp', 'sha', '5114f85'] });
    assert.deepEqual(v('1.0.0+20130313144700').build, ['20130313144700'], 'build identifiers may have leading zeros');
    assert.equal(formatVersion(v('v2.0.0-rc.1+b')), '2.0.0-rc.1');
  });
  test('what is not a version, and why', () => {
    const cases: [string, RegExp][] = [
      ['1.2', /not major\.minor\.patch/], ['1', /not major\.minor\.patch/], ['latest', /not major\.minor\.patch/],
      ['dev-123', /not major\.minor\.patch/], ['01.2.3', /major "01" is not a number without leading zeros/],
      ['1.02.3', /minor "02"/], ['V1.2.3', /major "V1"/], ['vv1.2.3', /major "v1"/], ['=1.2.3', /major "=1"/],
      ['1.2.3-01', /leading zero/], ['1.2.3-', /pre-release identifier "" /], ['1.2.3-a..b', /pre-release identifier ""/],
      ['1.2.3+', /build identifier ""/], ['1.2.3-a_b', /"a_b" is not \[0-9A-Za-z-\]\+/], ['1.2.3.4', /not major\.minor\.patch/],
      ['99999999999999999.0.0', /major .* is not a number/], ['1.2.3-' + 'a'.repeat(300), /longer than 256 characters/],
    ];
    for (const [text, why] of cases) {
      const r = readVersion(text);
      assert.equal(typeof r, 'string', `${text} is not a version`);
      assert.match(r as string, why, text);
      assert.equal(parseVersion(text), undefined);
    }
    assert.ok(parseVersion('1.2.3-0a'), 'an identifier with a letter may start with 0');
    assert.ok(parseVersion('1.2.3--'), 'a hyphen is an identifier character');
  });
});

describe('precedence (semver 2.0.0 §11)', () => {
  const ascending = (chain: string[]) => {
    for (let i = 0; i + 1 < chain.length; i++) {
      assert.equal(compareVersions(v(chain[i]), v(chain[i + 1])), -1, `${chain[i]} < ${chain[i + 1]}`);
      assert.equal(compareVersions(v(chain[i + 1]), v(chain[i])), 1, `${chain[i + 1]} > ${chain[i]}`);
    }
  };
  test('major, minor, patch numerically (§11.2)', () => ascending(['1.0.0', '2.0.0', '2.1.0', '2.1.1', '2.10.0', '10.0.0']));
  test('a pre-release below its release (§11.3)', () => ascending(['1.0.0-alpha', '1.0.0']));
  test("the spec's chain of pre-releases (§11.4)", () =>
    ascending(['1.0.0-alpha', '1.0.0-alpha.1', '1.0.0-alpha.beta', '1.0.0-beta', '1.0.0-beta.2', '1.0.0-beta.11', '1.0.0-rc.1', '1.0.0']));
  test('numeric identifiers below alphanumeric ones; digits compared as numbers however long', () => {
    ascending(['1.0.0-1', '1.0.0-2', '1.0.0-10', '1.0.0-99999999999999999999', '1.0.0-a', '1.0.0-a-']);
  });
  test('build metadata is ignored (§10); a v prefix changes nothing', () => {
    assert.equal(compareVersions(v('1.0.0+a'), v('1.0.0+b')), 0);
    assert.equal(compareVersions(v('1.0.0-rc.1+x'), v('1.0.0-rc.1')), 0);
    assert.equal(compareVersions(v('v1.4.2'), v('1.4.2')), 0);
  });
});

describe("npm's ranges", () => {
  // Each range with versions it takes and versions it does not, from node-semver's README (Ranges, Advanced Range
  // Syntax, Prerelease Tags) and its documented desugarings.
  const table: [string, string[], string[]][] = [
    ['>=1.2.7 <1.3.0', ['1.2.7', '1.2.8', '1.2.99'], ['1.2.6', '1.3.0', '1.1.0']],
    ['1.2.7 || >=1.2.9 <2.0.0', ['1.2.7', '1.2.9', '1.4.6'], ['1.2.8', '2.0.0']],
    ['>1.2.3-alpha.3', ['1.2.3-alpha.7', '3.4.5'], ['3.4.5-alpha.9', '1.2.3-alpha.3']],
    ['>=1.2.3-0', ['1.2.3-beta', '1.2.3', '1.3.0'], ['1.3.0-beta']],
    ['^1.2.3-beta.2', ['1.2.3-beta.4', '1.2.3', '1.9.9'], ['1.2.4-beta.2', '1.2.3-beta.1', '2.0.0']],
    ['1.2.3 - 2.3.4', ['1.2.3', '2.3.4'], ['1.2.2', '2.3.5']],
    ['1.2 - 2.3.4', ['1.2.0', '2.3.4'], ['1.1.9', '2.3.5']],
    ['1.2.3 - 2.3', ['2.3.99'], ['2.4.0', '2.4.0-0', '1.2.2']],
    ['1.2.3 - 2', ['2.99.99'], ['3.0.0', '3.0.0-rc.1']],
    ['*', ['0.0.0', '1.2.3', '99.0.0'], ['1.0.0-rc1']],
    ['', ['1.2.3'], ['1.0.0-rc1']],
    ['x', ['1.2.3'], []],
    ['1.x', ['1.0.0', '1.99.99'], ['2.0.0', '0.9.9', '2.0.0-0']],
    ['1', ['1.0.0', '1.5.0'], ['2.0.0']],
    ['1.2.x', ['1.2.0', '1.2.9'], ['1.3.0', '1.1.9']],
    ['1.4.*', ['1.4.0', '1.4.7'], ['1.5.0']],
    ['~1.2.3', ['1.2.3', '1.2.9'], ['1.3.0', '1.2.2']],
    ['~1.2', ['1.2.0', '1.2.9'], ['1.3.0']],
    ['~1', ['1.0.0', '1.9.0'], ['2.0.0']],
    ['~>3.2.1', ['3.2.1', '3.2.9'], ['3.3.0']],
    ['~0.2.3', ['0.2.3', '0.2.9'], ['0.3.0']],
    ['~0', ['0.0.0', '0.9.9'], ['1.0.0']],
    ['~1.2.3-beta.2', ['1.2.3-beta.2', '1.2.3-beta.4', '1.2.4'], ['1.2.4-beta.2', '1.3.0']],
    ['^1.2.3', ['1.2.3', '1.9.9'], ['2.0.0', '1.2.2', '2.0.0-0']],
    ['^0.2.3', ['0.2.3', '0.2.9'], ['0.3.0']],
    ['^0.0.3', ['0.0.3'], ['0.0.4', '0.0.2']],
    ['^0.0.3-beta', ['0.0.3-beta', '0.0.3-pr.2', '0.0.3'], ['0.0.4']],
    ['^1.2.x', ['1.2.0', '1.9.0'], ['2.0.0', '1.1.9']],
    ['^1.x', ['1.0.0'], ['2.0.0']],
    ['^0.0.x', ['0.0.0', '0.0.9'], ['0.1.0']],
    ['^0.0', ['0.0.9'], ['0.1.0']],
    ['^0.x', ['0.0.0', '0.9.9'], ['1.0.0']],
    ['>1', ['2.0.0'], ['1.9.9', '2.0.0-rc.1']],
    ['>1.2', ['1.3.0'], ['1.2.9']],
    ['<1.2', ['1.1.9'], ['1.2.0', '1.2.0-rc.1']],
    ['<=1.2', ['1.2.9'], ['1.3.0', '1.3.0-0']],
    ['>= 1.2.3', ['1.2.3'], ['1.2.2'], ],
    ['1.x.x+build >2.x+build', [], ['1.5.0', '3.0.0']],
    ['=1.2.3', ['1.2.3', 'v1.2.3', '1.2.3+b'], ['1.2.4']],
    ['v1.x', ['1.2.3'], ['2.0.0']],
    ['~v1.2.3', ['1.2.4'], ['1.3.0']],
    ['>=1.4.0 <2.0.0', ['1.4.0', '1.5.0', 'v1.9.9'], ['1.3.9', '2.0.0', '2.0.0-rc.1', '1.5.0-rc.1']],
    ['1.2.3-2.3', ['1.2.3-2.3'], ['1.2.3', '2.3.0'], ],
    ['>*', [], ['0.0.0', '1.0.0']],
    ['<=*', ['0.0.0', '5.0.0'], []],
  ];
  for (const [range, takes, refuses] of table)
    test(JSON.stringify(range), () => {
      for (const version of takes) assert.ok(satisfies(version, range), `${version} in ${range}`);
      for (const version of refuses) assert.ok(!satisfies(version, range), `${version} not in ${range}`);
    });
  test('garbage is refused, naming the item and why', () => {
    const cases: [string, RegExp][] = [
      ['>= 1.2, < 3', /"1\.2,": minor "2," is not a number/],
      ['>=1.4.0 <<2.0.0', /"<<2\.0\.0": not a comparator/],
      ['^', /not a comparator|"": not a version/],
      ['1.2.3 ||', /an alternative of "\|\|" is empty/],
      ['|| 1.2.3', /empty/],
      ['1.x-beta', /a pre-release needs a whole major\.minor\.patch/],
      ['1.2.3.4', /not a version/],
      ['01.2.3', /major "01" is not a number without leading zeros/],
      ['latest', /major "latest"/],
      ['1.2.3 - ', /"-": not a version/],
      ['>=1.0.0 ' + '1'.repeat(2000), /longer than 1024 characters/],
      ['~' + '1.'.repeat(200) + '1', /longer than 256|not a version/],
    ];
    for (const [range, why] of cases) assert.throws(() => parseRange(range), why, range);
  });
});
