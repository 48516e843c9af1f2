/**
 * Framing + ledger micro-benchmark: realistic vLLM chat streams from the seeded fixtures the tests use, chunked as
 * a socket delivers them, framed on one core — once with the framer alone, once with every event classified and
 * fed to a delivery ledger (one per stream, settled at its end), as the gateway does. Reports the median of
 * several timed runs.
 *
 *   npm run bench:framing      (= tsc -p tsconfig.build.json && node dist/bench/framing.js)
 *   node dist/bench/framing.js --streams 2000 --runs 9 --seed 42
 *
 * To measure what an observer adds on the hot path (e.g. the delivery ledger), pass `onEvent` / `onStreamEnd`:
 * they run inside the timed loop, so their cost shows up in ns/event.
 */
import { pathToFileURL } from 'node:url';
import type { RequestInfo } from '../src/accounting/ledger.js';
import { createRecord, currentAttempt, recordAttemptStart, recordClientEnd } from '../src/accounting/record.js';
import { recordStreamEnd, recordStreamEvent } from '../src/accounting/record-upstream.js';
import { settleRequest } from '../src/accounting/settle.js';
import { promptLenClasses } from '../src/accounting/prompt-len.js';
import { classifyStreamEvent } from '../src/delivery/wire.js';
import { chunkScratch } from '../src/sse/fast-classify.js';
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

const LEDGER_INFO: RequestInfo = {
  model: 'm',
  route: 'chat_completions',
  stream: true,
  expectedChoices: 1,
  dropUsageChunk: true,
  slo: { ttftMs: 2000, tpotMs: 100, e2eMs: 60_000, ttftByPromptLenMs: {} },
  promptLenBoundaries: [1024, 4096, 16384, 65536],
  promptLenClasses: promptLenClasses([1024, 4096, 16384, 65536]),
};

/** The gateway's per-event work beside framing: classify each event and rule on it in the stream's record of facts. */
export function ledgerObserver(): Pick<FramingBenchOptions, 'onEvent' | 'onStreamEnd'> {
  let current = -1;
  let clock = 0;
  let record = createRecord(LEDGER_INFO, 0);
  const scratch = chunkScratch();
  return {
    onEvent(streamIndex, _raw, event) {
      if (streamIndex !== current) {
        current = streamIndex;
        record = createRecord(LEDGER_INFO, clock);
        recordAttemptStart(record, clock, 'u0');
        currentAttempt(record).status = 200;
      }
      // As the gateway classifies (delivery/phases/attempt.ts): the stream's id and model reused, the facts in a scratch.
      if (event !== null) recordStreamEvent(record, LEDGER_INFO, ++clock, classifyStreamEvent('chat_completions', event, false, record.responseId, record.responseModel, scratch));
    },
    onStreamEnd() {
      recordStreamEnd(record, LEDGER_INFO, clock, 'eof');
      recordClientEnd(record, clock);
      const settlement = settleRequest(record, LEDGER_INFO, clock);
      if (settlement.outcome !== 'delivered') throw new Error(`stream ${current} settled ${settlement.outcome}`);
    },
  };
}

function main(args: readonly string[]): void {
  const options: FramingBenchOptions = {};
  const streams = readFlag(args, 'streams');
  const runs = readFlag(args, 'runs');
  const seed = readFlag(args, 'seed');
  if (streams !== undefined) options.streams = streams;
  if (runs !== undefined) options.runs = Math.max(1, runs);
  if (seed !== undefined) options.seed = seed;

  const framing = runFramingBench(options);
  const withLedger = runFramingBench({ ...options, ...ledgerObserver() });
  const ms = (r: FramingBenchResult) => r.runNs.map((ns) => (ns / 1e6).toFixed(1)).join(' ');
  const rows: [string, string, string][] = [
    ['', 'framer', 'framer + ledger'],
    ['node', process.version, ''],
    ['streams / chunks', `${framing.streams} / ${framing.chunks}`, ''],
    ['events / bytes', `${framing.events} / ${(framing.bytes / 1e6).toFixed(1)} MB`, ''],
    ['runs (ms)', ms(framing), ms(withLedger)],
    ['median run (ms)', (framing.medianNs / 1e6).toFixed(1), (withLedger.medianNs / 1e6).toFixed(1)],
    ['ns / event', framing.nsPerEvent.toFixed(0), withLedger.nsPerEvent.toFixed(0)],
    ['events / s', Math.round(framing.eventsPerSecond).toLocaleString('en-US'), Math.round(withLedger.eventsPerSecond).toLocaleString('en-US')],
    ['MB / s', framing.megabytesPerSecond.toFixed(0), withLedger.megabytesPerSecond.toFixed(0)],
  ];
  const width = Math.max(...rows.map(([k]) => k.length));
  const width2 = Math.max(...rows.map(([, v]) => v.length));
  console.log('SSE framing and delivery ledger, one core, median of timed runs');
  for (const [key, a, b] of rows) console.log(`  ${key.padEnd(width)}  ${a.padStart(width2)}  ${b}`);
}

const invokedPath = process.argv[1];
if (invokedPath !== undefined && import.meta.url === pathToFileURL(invokedPath).href) {
  main(process.argv.slice(2));
}
