/**
 * test/README.md is the index a newcomer reads to find the tests of a module: it must name every test file and every
 * helper there is, and nothing that is not there — test files, helpers, or source paths (so a module that moves, or
 * a test file that is added, split or renamed, fails here until its row is written).
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';

const TEST_DIR = new URL('./', import.meta.url);
const ROOT = new URL('../', import.meta.url);
const index = readFileSync(new URL('README.md', TEST_DIR), 'utf8');

/** What the index names in code spans: file names stand in backticks there. */
const spans = [...index.matchAll(/`([^`\n]+)`/g)].map((match) => match[1] ?? '');

/** Test files the index names, relative to test/ (a leading `test/` is dropped). */
const namedTests = new Set(
  spans.flatMap((span) => [...span.matchAll(/(?<![\w*.-])(?:test\/)?(\w[\w./-]*\.test\.ts)/g)].map((match) => match[1] ?? '')),
);

/** Test files there are, as vitest finds them (vitest.config.ts: test/**\/*.test.ts). */
const testFiles = readdirSync(TEST_DIR, { recursive: true, encoding: 'utf8' })
  .map((path) => path.split('\\').join('/'))
  .filter((path) => path.endsWith('.test.ts'))
  .sort();

describe('test/README.md, the index of the tests', () => {
  it('names every test file', () => {
    expect(testFiles.length).toBeGreaterThan(0);
    expect(testFiles.filter((file) => !namedTests.has(file))).toEqual([]);
  });

  it('names only test files that exist', () => {
    expect([...namedTests].filter((file) => !existsSync(new URL(file, TEST_DIR)))).toEqual([]);
  });

  it('names every helper in test/helpers/ and test/fixtures/', () => {
    const helpers = ['helpers', 'fixtures'].flatMap((dir) =>
      readdirSync(new URL(`${dir}/`, TEST_DIR))
        .filter((file) => file.endsWith('.ts'))
        .map((file) => `${dir}/${file}`),
    );
    expect(helpers.length).toBeGreaterThan(0);
    expect(helpers.filter((helper) => !spans.includes(helper))).toEqual([]);
  });

  it('names only source files that exist (a module that moved needs its row rewritten)', () => {
    const sources = spans.filter((span) => /^(src|load|bench|fuzz)\/[\w./-]+\.ts$/.test(span));
    expect(sources.length).toBeGreaterThan(0);
    expect(sources.filter((path) => !existsSync(new URL(path, ROOT)))).toEqual([]);
  });
});
