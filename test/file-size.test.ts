/**
 * No file in src/ is longer than 400 lines unless its top comment says why (issue 26: a file a newcomer opens holds
 * one contract or one decision, not three). The reason is a line in the file's first comment that starts with the
 * marker `Longer than 400 lines on purpose:` (after the comment's `*`; "on purpose" may be left out), followed by the
 * reason: for example a declared table
 * that is one contract and reads best whole.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = new URL('..', import.meta.url).pathname;
const LIMIT = 400;
const MARKER = /^\s*(?:\/\*\*?|\*|\/\/)\s*Longer than 400 lines(?: on purpose)?:\s*\S/;

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sources(path);
    return name.endsWith('.ts') ? [path] : [];
  });
}

/** The reason a long file states in its first comment, or undefined. */
export function statedReason(text: string): string | undefined {
  const lines = text.split('\n');
  const first = lines.findIndex((line) => line.trim().length > 0);
  if (first < 0 || !/^\s*(\/\*|\/\/)/.test(lines[first]!)) return undefined;
  for (let i = first; i < lines.length; i++) {
    const line = lines[i]!;
    if (MARKER.test(line)) return line.replace(/^.*Longer than 400 lines(?: on purpose)?:\s*/, '');
    // The first comment ends at its close (a block) or at the first line that is not a line comment.
    if (line.includes('*/') || (!line.trim().startsWith('//') && !line.trim().startsWith('*') && !line.trim().startsWith('/*'))) break;
  }
  return undefined;
}

describe('file sizes in src/', () => {
  it('finds the reason only in the first comment', () => {
    expect(statedReason('/**\n * A module.\n * Longer than 400 lines: one table.\n */\nexport {};\n')).toBe('one table.');
    expect(statedReason('// A module.\n// Longer than 400 lines: one table.\nexport {};\n')).toBe('one table.');
    expect(statedReason('/** A module. */\nconst x = 1;\n/** Longer than 400 lines: too late. */\n')).toBeUndefined();
    expect(statedReason('export {};\n// Longer than 400 lines: not a top comment.\n')).toBeUndefined();
    expect(statedReason('/**\n * Longer than 400 lines:\n */\n')).toBeUndefined();
    expect(statedReason('/**\n * A store.\n * Longer than 400 lines on purpose: its design.\n */\n')).toBe('its design.');
  });

  it(`keeps every file at most ${LIMIT} lines, or says why at its top`, () => {
    const long = sources(join(ROOT, 'src'))
      .map((path) => ({ path: relative(ROOT, path), text: readFileSync(path, 'utf8') }))
      .map(({ path, text }) => ({ path, lines: text.split('\n').length - (text.endsWith('\n') ? 1 : 0), reason: statedReason(text) }))
      .filter(({ lines }) => lines > LIMIT);
    const unexplained = long.filter(({ reason }) => reason === undefined).map(({ path, lines }) => `${path}: ${lines} lines`);
    expect(unexplained).toEqual([]);
  });
});
