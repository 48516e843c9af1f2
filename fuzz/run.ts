/**
 * The long-run fuzzer: the property of test/fuzz.property.test.ts under a time budget.
 *
 *   npm run fuzz -- --minutes 10 [--seed N] [--gateway per-case|shared] [--ignore inv1,inv2] [--once]
 *   npm run fuzz -- --seed N --path P --once     # replay (and re-shrink) a printed counterexample
 *
 * With a failure, the shrunk counterexample is printed and, unless --once, the run goes on with that case's
 * invariants ignored, to find a counterexample for each other invariant that fails, until the budget is spent.
 * `--gateway shared` keeps one gateway for the whole run (a soak: RSS growth then measures the gateway's leaks).
 * Exit status 1 when any invariant failed.
 */
import { parseArgs } from 'node:util';
import { formatSummary, runFuzz } from '../test/fuzz/harness.js';
import { INVARIANTS, type InvariantName } from '../test/fuzz/invariants.js';

const { values } = parseArgs({
  options: {
    minutes: { type: 'string', default: '1' },
    seed: { type: 'string' },
    path: { type: 'string' },
    gateway: { type: 'string', default: 'per-case' },
    ignore: { type: 'string', default: '' },
    runs: { type: 'string', default: '1000000' },
    'slow-weight': { type: 'string', default: '4' },
    'rss-limit-mb': { type: 'string', default: '96' },
    once: { type: 'boolean', default: false },
  },
});

const budgetMs = Number(values.minutes) * 60_000;
const seed = values.seed === undefined ? Date.now() % 2 ** 31 : Number(values.seed);
const gateway = values.gateway === 'shared' ? 'shared' : 'per-case';
const ignore = new Set<InvariantName>();
for (const name of values.ignore.split(',').filter((s) => s !== '')) {
  if (!(INVARIANTS as readonly string[]).includes(name)) throw new Error(`--ignore: unknown invariant "${name}" (one of ${INVARIANTS.join(', ')})`);
  ignore.add(name as InvariantName);
}

const deadline = Date.now() + budgetMs;
const failedInvariants = new Set<InvariantName>();
let totalRuns = 0;
let peakMb = 0;
let round = 0;
console.log(`fuzz: ${values.minutes} min, seed ${seed}, gateway ${gateway}${ignore.size > 0 ? `, ignoring ${[...ignore].join(', ')}` : ''}`);
while (Date.now() < deadline - 5_000) {
  const roundSeed = seed + round++;
  const summary = await runFuzz({
    seed: roundSeed,
    runs: Number(values.runs),
    timeLimitMs: deadline - Date.now(),
    gateway,
    ignore: [...ignore],
    rssGrowthLimitMb: Number(values['rss-limit-mb']),
    weights: { slowWeight: Number(values['slow-weight']) },
    ...(values.path !== undefined && round === 1 ? { path: values.path } : {}),
    log: (line) => console.log(`  [seed ${roundSeed}] ${line}`),
  });
  totalRuns += summary.runs;
  peakMb = Math.max(peakMb, summary.rss.peakMb);
  console.log(formatSummary(summary));
  console.log('');
  const fresh = summary.brokenInvariants.filter((name) => !ignore.has(name));
  for (const name of summary.brokenInvariants) {
    failedInvariants.add(name);
    ignore.add(name);
  }
  if (!summary.failed || values.once || fresh.length === 0 || ignore.size >= INVARIANTS.length) break;
}
console.log(
  `fuzz summary: ${totalRuns} case(s), seed ${seed}, rss peak ${peakMb.toFixed(0)} MiB, ${failedInvariants.size === 0 ? 'no invariant failed' : `failed: ${[...failedInvariants].join(', ')}`}`,
);
process.exitCode = failedInvariants.size === 0 ? 0 : 1;
