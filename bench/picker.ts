/**
 * Cache-aware routing micro-benchmark, one core: what the per-request work costs — the prefix key of a chat body,
 * the index's match against a full index, and the cache_aware pick at 4 upstreams (next to the least_request P2C
 * pick for scale). Reports the median of several timed runs, in ns per call.
 *
 *   npm run bench:picker      (= tsc -p tsconfig.build.json && node dist/bench/picker.js)
 *   node dist/bench/picker.js --upstreams 4 --runs 7
 */
import { createRandom } from '../src/util/prng.js';
import { pathToFileURL } from 'node:url';
import { pickUpstream } from '../src/proxy/picker.js';
import { PrefixIndex } from '../src/routing/prefix-index.js';
import { prefixBlocks } from '../src/routing/prefix-key.js';
import { pickCacheAware, type RequestMatch, type RoutingCandidate } from '../src/routing/score.js';

export interface PickerBenchResult {
  readonly name: string;
  readonly nsPerCall: number;
}

/** A seeded [0, 1) source (the simulator's mulberry32), so a pick can be replayed. */
const seeded = (seed: number): (() => number) => createRandom(seed);

/** Median ns per call of `body(i)` over `calls` calls, `runs` timed runs after one untimed. */
function time(calls: number, runs: number, body: (i: number) => unknown): number {
  let sink = 0;
  const once = (): number => {
    const started = process.hrtime.bigint();
    for (let i = 0; i < calls; i++) if (body(i) !== undefined) sink++;
    return Number(process.hrtime.bigint() - started) / calls;
  };
  once();
  const samples = Array.from({ length: runs }, once).sort((a, b) => a - b);
  if (sink < 0) console.log(sink); // keeps the results alive
  return samples[Math.floor(samples.length / 2)] ?? 0;
}

export function runPickerBench(upstreams = 4, runs = 7): PickerBenchResult[] {
  const random = seeded(42);
  const system = 'You are a helpful assistant for an online bookshop. Answer briefly and cite the catalogue. '.repeat(30); // ≈ 2.7 KiB
  // Through JSON, as the gateway gets them: flat strings, not the ropes that concatenation and repeat() build.
  const parsed = <T>(value: T): T => JSON.parse(JSON.stringify(value)) as T;
  const bodies = Array.from({ length: 64 }, (_, i) => parsed({
    model: 'm',
    messages: [
      { role: 'system', content: system },
      { role: 'user', content: `Question ${i}: which of your books on ${'topic '.repeat(i % 7)}would you recommend for a beginner?` },
    ],
  }));
  const huge = parsed({ model: 'm', messages: [{ role: 'user', content: 'x'.repeat(1 << 20) }] });

  const index = new PrefixIndex();
  const names = Array.from({ length: upstreams }, (_, i) => `u${i}`);
  // Fill the index to its bound with other prompts, then record the benchmark's on one upstream each.
  for (let p = 0; index.size < 200_000; p++) index.record(names[p % upstreams] ?? 'u0', Array.from({ length: 256 }, (_, i) => p * 1e6 + i));
  const keys = bodies.map((b) => prefixBlocks('chat_completions', b).blocks);
  keys.forEach((k, i) => index.record(names[i % upstreams] ?? 'u0', k));

  const candidates: RoutingCandidate[][] = Array.from({ length: 16 }, () =>
    names.map((name) => ({
      name,
      weight: 1,
      inflight: Math.floor(random() * 20),
      waiting: random() < 0.9 ? Math.floor(random() * 10) : null,
      running: Math.floor(random() * 30),
      kvUsage: random(),
    })),
  );
  const matches: RequestMatch[] = keys.map((k) => ({ requestBlocks: k.length, matched: index.match(k) }));
  const plain = candidates.map((cs) => cs.map(({ name, weight, inflight }) => ({ name, weight, inflight })));
  const noAvoid = new Set<string>();
  const into = new Map<string, number>();

  return [
    { name: `prefixBlocks, chat ≈ ${Math.round((system.length + 80) / 1024)} KiB`, nsPerCall: time(20_000, runs, (i) => prefixBlocks('chat_completions', bodies[i & 63])) },
    { name: 'prefixBlocks, 1 MiB message (256-block cap)', nsPerCall: time(5_000, runs, () => prefixBlocks('chat_completions', huge)) },
    { name: 'PrefixIndex.match, 200k entries', nsPerCall: time(50_000, runs, (i) => (into.clear(), index.match(keys[i & 63] ?? [], into))) },
    { name: 'PrefixIndex.record, 200k entries (evicting)', nsPerCall: time(20_000, runs, (i) => index.record(names[i % upstreams] ?? 'u0', keys[i & 63] ?? [])) },
    { name: `pickCacheAware, ${upstreams} upstreams`, nsPerCall: time(500_000, runs, (i) => pickCacheAware(candidates[i & 15] ?? [], matches[i & 63] ?? matches[0] as RequestMatch, {}, random)) },
    { name: `pickUpstream (P2C), ${upstreams} upstreams`, nsPerCall: time(500_000, runs, (i) => pickUpstream(plain[i & 15] ?? [], noAvoid, random)) },
  ];
}

function main(args: readonly string[]): void {
  const flag = (name: string): number | undefined => {
    const i = args.indexOf(`--${name}`);
    const value = i >= 0 ? Number(args[i + 1]) : NaN;
    return Number.isInteger(value) && value > 0 ? value : undefined;
  };
  const results = runPickerBench(flag('upstreams') ?? 4, flag('runs') ?? 7);
  const width = Math.max(...results.map((r) => r.name.length));
  console.log(`Cache-aware routing, one core, node ${process.version}, median ns per call`);
  for (const r of results) console.log(`  ${r.name.padEnd(width)}  ${r.nsPerCall.toFixed(0).padStart(8)} ns`);
}

const invokedPath = process.argv[1];
if (invokedPath !== undefined && import.meta.url === pathToFileURL(invokedPath).href) {
  main(process.argv.slice(2));
}
