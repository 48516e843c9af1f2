/**
 * Framer micro-benchmark: realistic vLLM chat streams from the seeded fixtures the tests use, chunked as a
 * socket delivers them, framed on one core. Reports the median of several timed runs.
 *
 *   npm run bench:framing      (= tsc -p tsconfig.build.json && node dist/bench/framing.js)
 *   node dist/bench/framing.js --streams 2000 --runs 9 --seed 42
 *
 * To measure what an observer adds on the hot path (e.g. the delivery ledger), pass `onEvent` / `onStreamEnd`:
 * they run inside the timed loop, so their cost shows up in ns/event.
 */
import { pathToFileURL } from 'node:url';
import { createFramer, type SseEvent } from '../src/sse/framer.js';
import { generateCorpus, type FixtureStream } from '../test/fixtures/sse-fixtures.js';

export interface FramingBenchOptions {
  /** Number of generated streams; default 2000. */
  streams?: number;
  /** Timed runs (the median is reported); default 7. */
  runs?: number;
  /** Untimed runs first, so the JIT has compiled the hot loop; default 2. */
  warmupRuns?: number;
  seed?: number;
  /** Observer hook, called for every block inside the timed loop. */
  onEvent?: (streamIndex: number, raw: Buffer, event: SseEvent | null) => void;
  /** Called after each stream's `end()`, inside the timed loop. */
  onStreamEnd?: (streamIndex: number, trailingBytes: number) => void;
}

export interface FramingBenchResult {
  streams: number;
  chunks: number;
  events: number;
  bytes: number;
  /** Wall time of each timed run, ns. */
  runNs: number[];
  medianNs: number;
  nsPerEvent: number;
  eventsPerSecond: number;
  megabytesPerSecond: number;
}

export function runFramingBench(options: FramingBenchOptions = {}): FramingBenchResult {
  const { streams: streamCount = 2000, runs = 7, warmupRuns = 2, seed = 42, onEvent, onStreamEnd } = options;
  const corpus = generateCorpus(seed, streamCount);
  const expectedEvents = corpus.reduce((sum, s) => sum + s.payloads.length, 0);
  const bytes = corpus.reduce((sum, s) => sum + s.bytes.length, 0);
  const chunks = corpus.reduce((sum, s) => sum + s.chunks.length, 0);

  const runNs: number[] = [];
  for (let run = 0; run < warmupRuns + runs; run++) {
    const started = process.hrtime.bigint();
    const events = frameCorpus(corpus, onEvent, onStreamEnd);
    const elapsed = Number(process.hrtime.bigint() - started);
    // The tests prove the output; this only stops the benchmark from silently measuring a broken framer.
    if (events !== expectedEvents) throw new Error(`framed ${events} events, expected ${expectedEvents}`);
    if (run >= warmupRuns) runNs.push(elapsed);
  }

  const medianNs = median(runNs);
  return {
    streams: streamCount,
    chunks,
    events: expectedEvents,
    bytes,
    runNs,
    medianNs,
    nsPerEvent: medianNs / expectedEvents,
    eventsPerSecond: (expectedEvents / medianNs) * 1e9,
    megabytesPerSecond: (bytes / medianNs) * 1e9 / 1e6,
  };
}

/** One pass over the corpus: a fresh framer per stream, as the gateway has one per upstream response. */
function frameCorpus(
  corpus: readonly FixtureStream[],
  onEvent: FramingBenchOptions['onEvent'],
  onStreamEnd: FramingBenchOptions['onStreamEnd'],
): number {
  let events = 0;
  for (let i = 0; i < corpus.length; i++) {
    const stream = corpus[i];
    if (stream === undefined) continue;
    const framer = createFramer({
      onBlock(raw, event) {
        if (event !== null) events++;
        onEvent?.(i, raw, event);
      },
      onOversized(bufferedBytes) {
        throw new Error(`unexpected oversized event (${bufferedBytes} bytes) in stream ${i}`);
      },
    });
    for (const chunk of stream.chunks) framer.feed(chunk);
    const trailing = framer.end();
    onStreamEnd?.(i, trailing);
  }
  return events;
}

function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  const upper = sorted[mid] ?? 0;
  return sorted.length % 2 === 1 ? upper : ((sorted[mid - 1] ?? upper) + upper) / 2;
}

function readFlag(args: readonly string[], name: string): number | undefined {
  const index = args.indexOf(`--${name}`);
  if (index === -1) return undefined;
  const value = Number(args[index + 1]);
  if (!Number.isInteger(value) || value < 0) throw new Error(`--${name} needs a non-negative integer`);
  return value;
}

function main(args: readonly string[]): void {
  const options: FramingBenchOptions = {};
  const streams = readFlag(args, 'streams');
  const runs = readFlag(args, 'runs');
  const seed = readFlag(args, 'seed');
  if (streams !== undefined) options.streams = streams;
  if (runs !== undefined) options.runs = Math.max(1, runs);
  if (seed !== undefined) options.seed = seed;

  const r = runFramingBench(options);
  const ms = r.runNs.map((ns) => (ns / 1e6).toFixed(1));
  const rows: [string, string][] = [
    ['node', process.version],
    ['streams / chunks', `${r.streams} / ${r.chunks}`],
    ['events / bytes', `${r.events} / ${(r.bytes / 1e6).toFixed(1)} MB`],
    ['runs (ms)', ms.join(' ')],
    ['median run', `${(r.medianNs / 1e6).toFixed(1)} ms`],
    ['ns / event', r.nsPerEvent.toFixed(0)],
    ['events / s', Math.round(r.eventsPerSecond).toLocaleString('en-US')],
    ['MB / s', r.megabytesPerSecond.toFixed(0)],
  ];
  const width = Math.max(...rows.map(([k]) => k.length));
  console.log('SSE framer, one core, median of timed runs');
  for (const [key, value] of rows) console.log(`  ${key.padEnd(width)}  ${value}`);
}

const invokedPath = process.argv[1];
if (invokedPath !== undefined && import.meta.url === pathToFileURL(invokedPath).href) {
  main(process.argv.slice(2));
}
