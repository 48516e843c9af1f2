/** The request-body depth limit (src/http/json-bytes.ts exceedsDepth, used by src/http/body.ts parseJson): nesting refused before parsing. */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { parseJson } from '../src/http/body.js';
import { exceedsDepth } from '../src/http/json-bytes.js';

describe('parseJson depth limit', () => {
  it('refuses nesting past the limit before parsing, counting brackets outside strings only', () => {
    expect(exceedsDepth(Buffer.from('[[[]]]'), 3)).toBe(false);
    expect(exceedsDepth(Buffer.from('[[[[]]]]'), 3)).toBe(true);
    expect(exceedsDepth(Buffer.from('{"a":"[[[[[[\\"[["}'), 2)).toBe(false);
    expect(() => parseJson(Buffer.from(`{"x":${'{"a":'.repeat(200)}1${'}'.repeat(200)}}`), 128)).toThrow(/deeper than 128/);
    expect(parseJson(Buffer.from('{"a":[1,{"b":2}]}'), 3)).toEqual({ a: [1, { b: 2 }] });
  });

  it('property: agrees with the real depth of any JSON value', () => {
    const depthOf = (v: unknown): number =>
      typeof v === 'object' && v !== null ? 1 + Math.max(0, ...Object.values(v as Record<string, unknown>).map(depthOf)) : 0;
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 6 }), fc.integer({ min: 1, max: 7 }), (value, limit) => {
        expect(exceedsDepth(Buffer.from(JSON.stringify(value)), limit)).toBe(depthOf(value) > limit);
      }),
      { numRuns: 500 },
    );
  });
});
