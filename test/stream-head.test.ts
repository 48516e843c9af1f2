/**
 * The byte comparisons the fast path's kept head and templates are matched with (src/sse/stream-head.ts): `equalAt`
 * (a byte loop, native past 64 bytes) and `equalWordsAt` (four bytes per comparison, native past 96), held to
 * Buffer's own `equals` on the same range — for literals that are there, and for ones that differ in a single byte
 * anywhere (every place in a word, high bytes included: a word with its top bit set is negative).
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { equalAt, equalWordsAt, wordsOf } from '../src/sse/stream-head.js';

/** A buffer, a place in it and a length that fits there, and whether (and where) the literal differs by one byte. */
const caseArb = fc
  .record({
    bytes: fc.uint8Array({ minLength: 1, maxLength: 300 }),
    at: fc.nat(),
    length: fc.nat({ max: 140 }),
    flip: fc.option(fc.record({ place: fc.nat(), by: fc.integer({ min: 1, max: 255 }) }), { nil: undefined }),
    // A literal cut out of a larger buffer: the comparisons read literals at an offset of their own store too.
    pad: fc.nat({ max: 7 }),
  })
  .map(({ bytes, at, length, flip, pad }) => {
    const buffer = Buffer.from(bytes);
    const start = at % buffer.length;
    const n = Math.min(length, buffer.length - start);
    const store = Buffer.alloc(n + pad);
    buffer.copy(store, pad, start, start + n);
    const literal = store.subarray(pad);
    if (flip !== undefined && n > 0) {
      const place = flip.place % n;
      literal[place] = ((literal[place] as number) + flip.by) & 0xff;
    }
    return { buffer, start, literal };
  });

describe('the kept bytes are compared exactly', () => {
  it('equalAt and equalWordsAt agree with Buffer.equals on the same range, equal or one byte off', () => {
    let equal = 0;
    let unequal = 0;
    fc.assert(
      fc.property(caseArb, ({ buffer, start, literal }) => {
        const expected = buffer.subarray(start, start + literal.length).equals(literal);
        if (expected) equal++;
        else unequal++;
        expect(equalAt(buffer, start, literal)).toBe(expected);
        expect(equalWordsAt(buffer, start, literal, wordsOf(literal))).toBe(expected);
      }),
      { numRuns: 5000 },
    );
    // Both answers are reached often (a flip is drawn about half the time, and makes no difference to an empty literal).
    expect(equal).toBeGreaterThan(500);
    expect(unequal).toBeGreaterThan(500);
  });

  it("a literal's words are its whole four-byte groups, little-endian; its last 0–3 bytes are compared one by one", () => {
    const literal = Buffer.from([0x01, 0x02, 0x03, 0x04, 0xff, 0x00, 0x00, 0x80, 0x41, 0x42]);
    expect([...wordsOf(literal)]).toEqual([0x04030201, 0x800000ff | 0]);
    const bytes = Buffer.concat([Buffer.from('xx'), literal]);
    expect(equalWordsAt(bytes, 2, literal, wordsOf(literal))).toBe(true);
    // The tail byte after the words decides alone.
    const off = Buffer.from(bytes);
    off[off.length - 1] = 0x43;
    expect(equalWordsAt(off, 2, literal, wordsOf(literal))).toBe(false);
  });
});
