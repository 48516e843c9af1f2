/** parseRetryAfter (src/proxy/retry-after.ts): RFC 9110 Retry-After, delay-seconds or an HTTP-date. */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { parseRetryAfter } from '../src/proxy/retry-after.js';

describe('parseRetryAfter', () => {
  const now = Date.UTC(2025, 5, 1, 12, 0, 0); // Sun, 01 Jun 2025 12:00:00 GMT

  it('reads delay-seconds', () => {
    expect(parseRetryAfter('120', now)).toBe(120_000);
    expect(parseRetryAfter('0', now)).toBe(0);
    expect(parseRetryAfter(' 5 ', now)).toBe(5_000);
    expect(parseRetryAfter('9'.repeat(400), now)).toBe(2 ** 31 * 1000);
  });

  it('reads all three HTTP-date formats', () => {
    expect(parseRetryAfter('Sun, 01 Jun 2025 12:00:30 GMT', now)).toBe(30_000);
    expect(parseRetryAfter('Sunday, 01-Jun-25 12:01:00 GMT', now)).toBe(60_000);
    expect(parseRetryAfter('Sun Jun  1 12:00:05 2025', now)).toBe(5_000);
    // Two-digit years more than 50 years ahead are in the past century (RFC 9110 §5.6.7).
    const in1994 = Date.UTC(1994, 10, 6, 8, 49, 0);
    expect(parseRetryAfter('Sunday, 06-Nov-94 08:49:37 GMT', in1994)).toBe(37_000);
    expect(parseRetryAfter('Sunday, 06-Nov-94 08:49:37 GMT', now)).toBe(0);
  });

  it('a date in the past is 0, never negative', () => {
    expect(parseRetryAfter('Wed, 21 Oct 2015 07:28:00 GMT', now)).toBe(0);
    expect(parseRetryAfter('Sun, 01 Jun 2025 11:59:59 GMT', now)).toBe(0);
  });

  it('rejects absent, garbage and invalid values', () => {
    for (const value of [
      undefined,
      '',
      '   ',
      'soon',
      '-5',
      '1.5',
      '+3',
      '12abc',
      '0x10',
      'Sun, 31 Feb 2025 12:00:00 GMT', // no such day
      'Sun, 01 Jun 2025 24:00:00 GMT',
      'sun, 01 jun 2025 12:00:30 gmt', // HTTP-date is case-sensitive
      'Sun, 01 Jun 2025 12:00:30 UTC',
      '2025-06-01T12:00:30Z',
      [],
      ['5', '6'],
    ]) {
      expect(parseRetryAfter(value, now), JSON.stringify(value)).toBeUndefined();
    }
  });

  it('accepts a repeated field whose copies agree', () => {
    expect(parseRetryAfter(['7'], now)).toBe(7_000);
    expect(parseRetryAfter(['7', ' 7'], now)).toBe(7_000);
  });

  it('property: never negative, always finite, for any string', () => {
    fc.assert(
      fc.property(fc.string(), fc.integer({ min: 0, max: 4_102_444_800_000 }), (value, at) => {
        const parsed = parseRetryAfter(value, at);
        if (parsed !== undefined) {
          expect(parsed).toBeGreaterThanOrEqual(0);
          expect(Number.isFinite(parsed)).toBe(true);
        }
      }),
    );
  });
});
