/**
 * Passive health's bound per pool (issue 22, item 16): whatever the sequence of failures, successes, abandoned
 * attempts and time passing, the ejected upstreams of a pool (open or on trial) stay within
 * health.max_ejection_percent of it, and at least one upstream is never ejected.
 */
import fc from 'fast-check';
import { pino } from 'pino';
import { afterAll, describe, expect, it } from 'vitest';
import type { AttemptRecord } from '../src/accounting/ledger.js';
import type { AttemptResult } from '../src/accounting/outcomes.js';
import { parseConfig } from '../src/config/load.js';
import { ModelLabels } from '../src/proxy/model-labels.js';
import { UpstreamRegistry, type Upstream } from '../src/proxy/upstreams.js';

const registries: UpstreamRegistry[] = [];
afterAll(async () => {
  await Promise.all(registries.map((r) => r.close()));
});

function registry(upstreams: number, percent: number | undefined): UpstreamRegistry {
  const config = parseConfig(
    {
      pools: [
        {
          name: 'p',
          models: ['m'],
          // Never connected to: the registry is driven by hand, and start() (health checks, discovery) is never called.
          upstreams: Array.from({ length: upstreams }, (_, i) => ({ name: `u${i}`, url: `http://127.0.0.1:9/${i}` })),
        },
      ],
      health: { eject_after_failures: 2, ejection_base: '50ms', ejection_max: '400ms', ...(percent === undefined ? {} : { max_ejection_percent: percent }) },
      logging: { level: 'silent' },
    },
    'test',
  );
  const r = new UpstreamRegistry(config, pino({ level: 'silent' }), Math.random, {}, () => 0, new ModelLabels());
  registries.push(r);
  return r;
}

const record = (upstream: string, result: AttemptResult | undefined): AttemptRecord => ({
  upstream,
  startedAt: 0,
  status: undefined,
  result,
  endedAt: undefined,
  firstOutputAt: undefined,
  failure: undefined,
});

type Step = { kind: 'attempt'; upstream: number; result: AttemptResult | undefined } | { kind: 'wait'; ms: number };

const step: fc.Arbitrary<Step> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      kind: fc.constant('attempt' as const),
      upstream: fc.nat(7),
      result: fc.constantFrom<AttemptResult | undefined>('http_5xx', 'reset', 'timeout', 'connect_error', 'ok', 'cancelled', undefined),
    }),
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('wait' as const), ms: fc.integer({ min: 1, max: 500 }) }) },
);

describe('passive health never ejects more than its share of a pool, nor all of it', () => {
  it('for any sequence of attempts and time: ejected ≤ floor(n × max_ejection_percent / 100), and at least one not ejected', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 5 }), fc.option(fc.integer({ min: 0, max: 100 }), { nil: undefined }), fc.array(step, { maxLength: 80 }), (n, percent, steps) => {
        const r = registry(n, percent);
        const upstreams: readonly Upstream[] = r.upstreams;
        const bound = Math.floor((n * (percent ?? 100)) / 100);
        let now = 0;
        for (const s of steps) {
          if (s.kind === 'wait') {
            now += s.ms;
          } else {
            const upstream = upstreams[s.upstream % n] as Upstream;
            const ticket = r.sent(upstream, now);
            r.settled(upstream, ticket, record(upstream.name, s.result), now);
          }
          const ejected = upstreams.filter((u) => u.breaker.state(now) !== 'closed').length;
          expect(ejected).toBeLessThanOrEqual(bound);
          expect(upstreams.some((u) => u.isUp(now))).toBe(true);
          expect(upstreams.some((u) => u.breaker.state(now) !== 'open')).toBe(true);
        }
        void r.close();
        registries.pop();
      }),
      { numRuns: 300 },
    );
  });

  it('a pool of three fails three times each: two ejected by default, the third kept; 34 % lets one go', () => {
    for (const [percent, expected] of [[undefined, 2], [34, 1], [0, 0]] as const) {
      const r = registry(3, percent);
      for (const upstream of r.upstreams) {
        for (let i = 0; i < 3; i++) r.settled(upstream, r.sent(upstream, 0), record(upstream.name, 'http_5xx'), 0);
      }
      expect(r.upstreams.filter((u) => u.breaker.state(0) === 'open').length).toBe(expected);
      expect(r.isReady(0)).toBe(false); // no health check ran: readiness needs one (the bound is about ejection)
    }
  });
});
