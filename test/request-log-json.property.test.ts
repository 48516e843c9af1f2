import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { requestLogJson, requestLogLine, type RequestLogLine } from '../src/telemetry/request-log.js';
import { RequestLedger } from './helpers/ledger-driver.js';
import { requestInfo } from './helpers/ledger-info.js';

// The oracle is V8's JSON.stringify: requestLogJson must write, character for character, what it writes for the line.

/** Any UTF-16 code units, lone surrogates, quotes, backslashes and control characters included. */
const units = fc.array(fc.integer({ min: 0, max: 0xffff }), { maxLength: 10 }).map((codes) => String.fromCharCode(...codes));
const text = fc.oneof(units, fc.string({ maxLength: 12 }), fc.string({ unit: 'grapheme', maxLength: 6 }), fc.constantFrom('', '"', '\\', '\n', '\u2028', '\ud83d\ude00', '\ud800', 'a\udc00b'));
/** Every number JSON writes differently from its digits: NaN, the infinities, -0, exponents. */
const number = fc.oneof(
  fc.integer(),
  fc.double(),
  fc.constantFrom(Number.NaN, Infinity, -Infinity, -0, 1e21, 1e-7, Number.MAX_VALUE, 1e12, 1e12 - 0.001, -0.001, 0.5),
  // Times rounded to the µs, as the line's are: written from their digits (request-log.ts num), up to where that stops.
  fc.integer({ min: -1e15 - 10, max: 1e15 + 10 }).map((k) => k / 1000),
  fc.integer({ min: -1e7, max: 1e7 }).map((k) => k / 1000),
);
const maybe = <T>(arb: fc.Arbitrary<T>) => fc.option(arb, { nil: undefined });

const line: fc.Arbitrary<RequestLogLine> = fc.record({
  request_id: text,
  trace_id: maybe(text),
  model: text,
  tenant: text,
  route: text,
  stream: fc.boolean(),
  code: number,
  outcome: text,
  attempts: fc.array(fc.record({ upstream: text, result: text, status: maybe(number), duration_ms: maybe(number) }), { maxLength: 3 }),
  ttft_ms: maybe(number),
  tpot_ms: maybe(number),
  tokens: fc.record({ prompt: maybe(number), cached: maybe(number), completion: maybe(number) }),
  finish_reasons: fc.array(text, { maxLength: 3 }),
  anomalies: fc.array(text, { maxLength: 3 }),
  cancel_phase: maybe(text),
  slo: text,
  prompt_len: text,
  accepted: fc.boolean(),
  checks_failed: fc.array(text, { maxLength: 3 }),
  format_valid: maybe(text),
  verdict: maybe(text),
  evaluator: fc.boolean(),
  evaluation_sample: maybe(number),
  client_retry: maybe(number),
  routing: maybe(fc.record({ pool: text, policy: text, reason: text, predicted_cached_tokens: number, session_gap_ms: fc.oneof(maybe(number), fc.constant(null)) })),
  duration_ms: number,
});

describe('requestLogJson: JSON.stringify of the wide line, written for its shape', () => {
  it('equals JSON.stringify on generated lines (any code unit in any string, NaN, -0, absent fields)', () => {
    fc.assert(
      fc.property(line, (l) => {
        expect(requestLogJson(l)).toBe(JSON.stringify(l));
      }),
      { numRuns: 2000 },
    );
  });

  it("equals JSON.stringify on a settled request's line, and names every field the line has", () => {
    const ledger = new RequestLedger(requestInfo(), 0);
    ledger.reject(400);
    const l = requestLogLine(ledger.settle(1), 'id', 'trace', 0.25);
    expect(requestLogJson(l)).toBe(JSON.stringify(l));
    // A field added to RequestLogLine and not to requestLogJson would be missing here.
    const full: RequestLogLine = {
      ...l,
      attempts: [{ upstream: 'u', result: 'ok', status: 200, duration_ms: 1 }],
      ttft_ms: 1,
      tpot_ms: 2,
      tokens: { prompt: 1, cached: 2, completion: 3 },
      cancel_phase: 'c',
      format_valid: 'pass',
      verdict: 'accepted',
      client_retry: 1,
      routing: { pool: 'p', policy: 'q', reason: 'r', predicted_cached_tokens: 0, session_gap_ms: 5 },
    };
    expect(Object.keys(JSON.parse(requestLogJson(full)) as object)).toEqual(Object.keys(full));
  });
});
