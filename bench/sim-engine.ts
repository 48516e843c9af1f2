/**
 * What the simulator's engine model costs as a load target: one `waybill sim --engines 4` process (the engine model
 * on, its defaults) on core 0, 256 concurrent streams spread evenly over its four engines from this process on core
 * 1, and the simulator's CPU per streamed event, against the same process with the timer (`--engine-model off`, an
 * ITL of the same order) — one run, both rows, fresh processes each. docs/simulator.md holds the figures.
 *
 *   npm run build && node dist/bench/sim-engine.js [--seconds 6] [--streams 256] [--repeats 3]
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { runLoad, type WindowResult } from './proxy/client.js';
import { killAll, pinSelf, processCpuUs, spawnPinned, type Child } from './proxy/procs.js';
import { requestBody } from './proxy/scenarios.js';
import { distribution, median, Samples } from './proxy/stats.js';

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const BIN = join(REPO, 'bin', 'waybill.js');
const SIM_CORE = 0;
const LOAD_CORE = 1;
const ENGINES = 4;
const TOKENS = 64;

interface Options {
  seconds: number;
  streams: number;
  repeats: number;
}

function parse(argv: string[]): Options {
  const options: Options = { seconds: 6, streams: 256, repeats: 3 };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], Number(argv[i + 1])];
    if (!Number.isFinite(value)) throw new Error(`${flag}: needs a number`);
    if (flag === '--seconds') options.seconds = value;
    else if (flag === '--streams') options.streams = value;
    else if (flag === '--repeats') options.repeats = value;
    else throw new Error(`unknown flag ${flag}`);
  }
  return options;
}

async function startFleet(dir: string, name: string, args: string[]): Promise<{ child: Child; origins: string[] }> {
  const origins: string[] = [];
  let ready: () => void = () => undefined;
  const all = new Promise<void>((resolve) => (ready = resolve));
  const child = spawnPinned({
    name,
    core: SIM_CORE,
    dir,
    command: process.execPath,
    args: [BIN, 'sim', '--port', '0', '--engines', String(ENGINES), '--output-tokens', String(TOKENS), ...args],
    watchStdout: (line) => {
      const match = /http:\/\/127\.0\.0\.1:\d+/.exec(line);
      if (match !== null) origins.push(match[0]);
      if (origins.length === ENGINES) ready();
    },
  });
  await Promise.race([all, new Promise((_, reject) => setTimeout(() => reject(new Error(`${name} did not start; see ${child.logFile}`)), 10_000))]);
  return { child, origins };
}

interface Row {
  usPerEvent: number;
  events: number;
  errors: number;
  ttftP50: number;
  ttftP99: number;
  itlP50: number;
  itlP99: number;
}

async function measure(dir: string, label: string, args: string[], options: Options): Promise<Row> {
  const { child, origins } = await startFleet(dir, label, args);
  try {
    let before = 0;
    let after = 0;
    const perEngine = Math.round(options.streams / ENGINES);
    const body = requestBody(TOKENS);
    const results: WindowResult[] = await Promise.all(
      origins.map((origin, i) =>
        runLoad({
          origin,
          path: '/v1/chat/completions',
          body,
          concurrency: perEngine,
          rampMs: 1000,
          warmupMs: 2500,
          windowMs: options.seconds * 1000,
          ...(i === 0 ? { onWindowStart: () => (before = processCpuUs(child.pid)), onWindowEnd: () => (after = processCpuUs(child.pid)) } : {}),
        }),
      ),
    );
    const events = results.reduce((sum, r) => sum + r.outputEvents, 0);
    const ttft = distribution(mergeSamples(results.map((r) => r.ttft)));
    const itl = distribution(mergeSamples(results.map((r) => r.itl)));
    return {
      usPerEvent: (after - before) / Math.max(1, events),
      events,
      errors: results.reduce((sum, r) => sum + r.errors, 0),
      ttftP50: ttft.p50,
      ttftP99: ttft.p99,
      itlP50: itl.p50,
      itlP99: itl.p99,
    };
  } finally {
    await child.stop();
  }
}

function mergeSamples(samples: Samples[]): Samples {
  const merged = new Samples();
  for (const one of samples) for (const value of one.sorted()) merged.push(value);
  return merged;
}

async function main(): Promise<void> {
  const options = parse(process.argv.slice(2));
  pinSelf(LOAD_CORE);
  const dir = mkdtempSync(join(tmpdir(), 'waybill-sim-bench-'));
  const rows: Record<string, Row[]> = { engine: [], timer: [] };
  try {
    for (let r = 0; r < options.repeats; r++) {
      // Alternate the order so drift in the machine's state falls on both.
      const order = r % 2 === 0 ? (['engine', 'timer'] as const) : (['timer', 'engine'] as const);
      for (const label of order) {
        const args = label === 'engine' ? [] : ['--engine-model', 'off', '--ttft-ms', '10', '--itl-ms', '10', '--jitter', '0'];
        const row = await measure(dir, label, args, options);
        rows[label]?.push(row);
        console.log(
          `  ${label.padEnd(6)} ${row.usPerEvent.toFixed(2)} µs/event  (${row.events} events, ${row.errors} errors)  TTFT p50 ${row.ttftP50.toFixed(1)} p99 ${row.ttftP99.toFixed(1)} ms  ITL p50 ${row.itlP50.toFixed(1)} p99 ${row.itlP99.toFixed(1)} ms`,
        );
      }
    }
  } finally {
    killAll();
    rmSync(dir, { recursive: true, force: true });
  }
  console.log(`\n${options.streams} streams over ${ENGINES} engines, ${TOKENS} tokens each, ${options.repeats} × ${options.seconds} s; medians:`);
  for (const [label, list] of Object.entries(rows)) {
    const m = (pick: (r: Row) => number) => median(list.map(pick)).toFixed(2);
    console.log(`  ${label.padEnd(6)} ${m((r) => r.usPerEvent)} µs/event, TTFT p50 ${m((r) => r.ttftP50)} p99 ${m((r) => r.ttftP99)} ms, ITL p50 ${m((r) => r.itlP50)} p99 ${m((r) => r.itlP99)} ms`);
  }
}

main().catch((error: unknown) => {
  killAll();
  console.error(error instanceof Error ? error.message : error);
  process.exit(1);
});
