/**
 * Fuzzing as a standing test: hostile upstream transcripts and hostile client requests, generated from a fixed
 * seed, against a real gateway over loopback sockets; every invariant in test/fuzz/invariants.ts must hold. A few
 * seconds' budget here; `npm run fuzz -- --minutes N` runs the same property for longer (fuzz/run.ts).
 *
 * A failure prints the shrunk case as a transcript (request bytes, upstream bytes and splits) with the seed and
 * fast-check path to replay it; FUZZ_SEED runs another seed. The counterexamples found so far are replayed first,
 * one test each (test/fuzz/known-cases.ts).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { caseFailureMessage, formatSummary, runCase, runFuzz, startFuzzEnv, type FuzzEnv } from './fuzz/harness.js';
import { KNOWN_CASES } from './fuzz/known-cases.js';

const SEED = Number(process.env['FUZZ_SEED'] ?? 20_260_601);

describe('fuzz: known counterexamples', () => {
  let env: FuzzEnv;
  beforeAll(async () => {
    env = await startFuzzEnv('per-case', SEED);
  });
  afterAll(async () => {
    await env.close();
  });

  it.each(KNOWN_CASES)('$name', async ({ c }) => {
    const report = await runCase(env, c);
    expect(report.violations, caseFailureMessage(c, report)).toEqual([]);
  });
});

describe('fuzz: hostile upstreams and clients', () => {
  it(
    'keeps every invariant (answered, counted once, sane metrics, bounded finish reasons, [DONE] iff delivered, bounded RSS)',
    async () => {
      const summary = await runFuzz({
        seed: SEED,
        runs: 25,
        // Generation and shrinking stop after 8 s (a failure is then replayed once more).
        timeLimitMs: 8_000,
        // Fewer cases that wait for the gateway's deadlines (each costs 1-4.5 s).
        weights: { slowWeight: 1 },
      });
      expect(summary.failed, formatSummary(summary)).toBe(false);
    },
    30_000,
  );
});
