/**
 * Instructions per request under callgrind: what a build of Waybill, and the bare Node relay beside it, execute in user
 * space per non-streaming request once warm, counted rather than timed.
 *
 *   npm run build && node dist/bench/instructions.js [--a DIR] [--b DIR] [--floor] [--runs 2] [--warmup 4000] [--requests 2000]
 *
 * Why: a gateway's CPU per request differs by ±15% between two processes of one build and by ±20% between windows of
 * one process on these shared VMs (docs/performance.md), more than most changes; bench/ab.js needs many rounds to see
 * 5%. Instructions do not depend on what else the machine is doing: two runs of one build here agree within ~2%.
 *
 * How: each target runs under `valgrind --tool=callgrind` with instrumentation off, behind one simulator on the other
 * core; `--warmup` requests bring it to steady state, then instrumentation is switched on (callgrind_control) for
 * `--requests` more and off again. The count is every thread's user-space instructions (the kernel's part of a system
 * call is not counted, so the ratio of counts is wider than the ratio of CPU time). V8 runs `--single-threaded`, so its
 * compiler works on the main thread in the order the code asks for it rather than whenever a helper thread is free;
 * under valgrind it is still compiling after thousands of requests, and that part (functions of V8's compiler) is
 * reported apart: `execution` is the rest, the figure to compare. The relay is bench/proxy/floor.ts.
 *
 * Needs valgrind (Debian's `valgrind`, which has callgrind_control and callgrind_annotate). A bench, not a test.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Pool } from 'undici';
import { freePort, killAll, pinSelf, spawnPinned, startSim, waitFor200, type Child } from './proxy/procs.js';
import { eventsPerAnswer } from './proxy/scenarios.js';

const PROXY_CORE = 0;
/** The simulator and this process (the load): off the counted process's core, so it runs at its own pace. */
const SIM_CORE = 1;

interface Options {
  a: string | undefined;
  b: string;
  floor: boolean;
  runs: number;
  warmup: number;
  requests: number;
  concurrency: number;
  /** Streamed answers of this many tokens (events: tokens + the role chunk + [DONE]); 0: non-streaming. */
  tokens: number;
  itlMs: number;
  /** Each target's node writes /tmp/perf-PID.map (--perf-basic-prof), to name the JIT code in callgrind's table. */
  perfMap: boolean;
  /** callgrind's cache simulation (--cache-sim=yes): misses of the first-level and last-level caches, per unit. */
  cacheSim: boolean;
}

const USAGE = `usage: node dist/bench/instructions.js [--a DIR] [--b DIR] [--floor|--no-floor] [--runs N] [--warmup N] [--requests N] [--concurrency N] [--perf-map] [--cache-sim]
  --a DIR          a second checkout with dist/ built, counted beside --b (B/A is reported)
  --b DIR          the checkout counted (default .)
  --no-floor       leave out the bare Node relay (bench/proxy/floor.ts)
  --runs N         runs of each target, alternating (default 2)
  --warmup N       requests before counting (default 4000)
  --requests N     requests counted (default 2000)
  --concurrency N  requests in flight (default 32; keep it low when streaming: valgrind runs ~50x slower)
  --tokens N       streamed answers of N tokens, paced by --itl-ms (default 0: non-streaming, max_tokens 1)
  --itl-ms N       the simulator's time between tokens when streaming (default 10)
  --perf-map       each target's node also writes /tmp/perf-PID.map (--perf-basic-prof): the names of the JIT code
                   callgrind lists as bare addresses (take the map's latest entry covering one: V8 reuses code space)
  --cache-sim      also simulate the caches (callgrind --cache-sim=yes: the host's first level, and a last level of
                   1 MiB, 8-way, this VM's L2): instruction and data misses of each, per unit, beside the
                   instructions (user space only: what the kernel's side of a system call evicts is not simulated)`;

function parse(argv: string[]): Options {
  const options: Options = { a: undefined, b: '.', floor: true, runs: 2, warmup: 4000, requests: 2000, concurrency: 32, tokens: 0, itlMs: 10, perfMap: false, cacheSim: false };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    if (flag === '--floor' || flag === '--no-floor') {
      options.floor = flag === '--floor';
      continue;
    }
    if (flag === '--cache-sim') {
      options.cacheSim = true;
      continue;
    }
    if (flag === '--perf-map') {
      options.perfMap = true;
      continue;
    }
    const value = argv[++i];
    if (value === undefined) throw new Error(`${flag}: needs a value\n${USAGE}`);
    if (flag === '--a') options.a = value;
    else if (flag === '--b') options.b = value;
    else if (flag === '--runs') options.runs = Number(value);
    else if (flag === '--warmup') options.warmup = Number(value);
    else if (flag === '--requests') options.requests = Number(value);
    else if (flag === '--concurrency') options.concurrency = Number(value);
    else if (flag === '--tokens') options.tokens = Number(value);
    else if (flag === '--itl-ms') options.itlMs = Number(value);
    else throw new Error(`unknown flag ${flag}\n${USAGE}`);
  }
  for (const [name, n] of [['--runs', options.runs], ['--warmup', options.warmup], ['--requests', options.requests], ['--concurrency', options.concurrency]] as const) {
    if (!Number.isInteger(n) || n < 1) throw new Error(`${name}: a whole number >= 1`);
  }
  if (!Number.isInteger(options.tokens) || options.tokens < 0 || !(options.itlMs >= 0)) throw new Error('--tokens and --itl-ms: numbers >= 0');
  return options;
}

interface Target {
  readonly label: string;
  /** The checkout whose build runs (the floor's script comes from --b's). */
  readonly dir: string;
  readonly kind: 'waybill' | 'floor';
}

interface Count {
  readonly total: number;
  readonly compiler: number;
  /** With --cache-sim: every event callgrind recorded (Ir, I1mr, D1mr, …), less the compiler's share of each. */
  readonly events: ReadonlyMap<string, number>;
}

/**
 * The cache simulated beside the first level: 1 MiB, 8-way, the second level of this VM's cores (`lscpu`: L2 2 MiB in
 * 2 instances), not the L3 callgrind would take by default. A miss there goes to an L3 shared with the host's other
 * tenants: ~15 ns for a 2 MiB working set here, ~145 ns from 8 MiB (a pointer chase pinned to core 0, 2026-12-06).
 */
const LAST_LEVEL = '--LL=1048576,8,64';

/** V8's optimizing compilers (TurboFan, Maglev) and their drivers: what warm-up under valgrind has not finished. */
const COMPILER = /v8::internal::compiler::|v8::internal::Compiler::|v8::internal::maglev::|OptimizedCompilationJob|TurboFan/;

/** A chat completion: non-streaming with one token (the bench's `req` scenario), or streamed with `tokens`. */
function body(tokens: number): string {
  const messages = [{ role: 'user', content: 'Hello there, how are you today?' }];
  return JSON.stringify(tokens === 0 ? { model: 'sim-model', max_tokens: 1, messages } : { model: 'sim-model', max_tokens: tokens, stream: true, messages });
}

async function drive(pool: Pool, concurrency: number, total: number, tokens: number): Promise<void> {
  const BODY = body(tokens);
  let sent = 0;
  let failed = 0;
  const loop = async () => {
    while (sent < total) {
      sent++;
      const response = await pool.request({ path: '/v1/chat/completions', method: 'POST', headers: { 'content-type': 'application/json' }, body: BODY });
      await response.body.dump();
      if (response.statusCode !== 200) failed++;
    }
  };
  await Promise.all(Array.from({ length: concurrency }, loop));
  if (failed > 0) throw new Error(`${failed} of ${total} requests failed`);
}

/** One target under callgrind: its instructions over `requests` warm requests. */
async function count(target: Target, simOrigin: string, dir: string, options: Options, run: number): Promise<Count> {
  const port = await freePort();
  const out = join(dir, `${target.kind}-${run}-${target.label}.callgrind`);
  const script = target.kind === 'waybill' ? [join(target.dir, 'bin/waybill.js'), 'serve', '--config', writeConfig(dir, port, simOrigin), '--workers', '1'] : [join(target.dir, 'dist/bench/proxy/floor.js'), '--port', String(port), '--upstream', simOrigin];
  const child: Child = spawnPinned({
    name: `${target.label}-${run}`,
    core: PROXY_CORE,
    dir,
    command: 'valgrind',
    args: ['--tool=callgrind', '--instr-atstart=no', '--smc-check=all-non-file', ...(options.cacheSim ? ['--cache-sim=yes', LAST_LEVEL] : []), `--callgrind-out-file=${out}`, process.execPath, '--single-threaded', ...(options.perfMap ? ['--perf-basic-prof'] : []), ...script],
  });
  const origin = `http://127.0.0.1:${port}`;
  await waitFor200(`${origin}${target.kind === 'waybill' ? '/readyz' : '/health'}`, 120_000, child);
  // One pool for both phases: closing the warm-up's connections would deoptimize, in the gateway, the code their
  // close reaches (V8's --trace-deopt: node's stream and socket functions, "wrong map") just before the count.
  const pool = new Pool(origin, { connections: options.concurrency, pipelining: 1 });
  await drive(pool, options.concurrency, options.warmup, options.tokens);
  execFileSync('callgrind_control', ['--instr=on', String(child.pid)], { stdio: 'ignore' });
  await drive(pool, options.concurrency, options.requests, options.tokens);
  execFileSync('callgrind_control', ['--instr=off', String(child.pid)], { stdio: 'ignore' });
  await pool.close();
  await child.stop(60_000);
  if (options.perfMap) console.log(`    ${out}: its JIT code's names in /tmp/perf-${String(child.pid)}.map`);
  return read(out);
}

/**
 * Total instructions and the compiler's, from callgrind_annotate's per-function table (every function listed), and with
 * --cache-sim each recorded event's total less the compiler's. A row is one number per event (a `.` for none, each
 * followed by its share in parentheses), then the function's name.
 */
function read(file: string): Count {
  const text = execFileSync('callgrind_annotate', ['--threshold=100', '--auto=no', '--inclusive=no', file], { encoding: 'utf8', maxBuffer: 256 * 1024 * 1024 });
  const names = /^Events shown:\s+(.*)$/m.exec(text)?.[1]?.trim().split(/\s+/) ?? ['Ir'];
  const totals = new Map<string, number>();
  const compiled = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (!/^\s*[\d,]+\s/.test(line)) continue;
    const fields = line.replace(/\(\s*[\d.]+%\)/g, '').trim().split(/\s+/);
    const values = fields.slice(0, names.length).map((field) => (field === '.' ? 0 : Number(field.replaceAll(',', ''))));
    const into = line.includes('PROGRAM TOTALS') ? totals : COMPILER.test(line) ? compiled : undefined;
    if (into === undefined) continue;
    names.forEach((name, i) => into.set(name, (into.get(name) ?? 0) + (values[i] ?? 0)));
  }
  const total = totals.get('Ir') ?? 0;
  if (total === 0) throw new Error(`no instructions counted in ${file}`);
  return { total, compiler: compiled.get('Ir') ?? 0, events: new Map(names.map((name) => [name, (totals.get(name) ?? 0) - (compiled.get(name) ?? 0)])) };
}

function writeConfig(dir: string, port: number, upstream: string): string {
  const file = join(dir, `waybill-${port}.yaml`);
  // JSON is YAML: the bench's gateway (bench/proxy/procs.ts startGateway), the default configuration otherwise, but
  // for the read turns. Their budget is wall-clock time per turn of the event loop (src/proxy/read-turns.ts), and under
  // valgrind every read takes ~50× its time: answering streams would yield at almost every read (pausing and resuming
  // their upstreams) where at c64s's pace they never do. (A checkout from before the key, 219baf5, refuses this file.)
  const streaming = { turn_budget: '0ms' };
  writeFileSync(file, JSON.stringify({ server: { host: '127.0.0.1', port }, pools: [{ name: 'sim', models: ['sim-model'], upstreams: [{ name: 'sim-0', url: upstream }] }], streaming, shutdown: { grace: 0, drain_timeout: 1 } }));
  return file;
}

const median = (values: number[]) => {
  const sorted = [...values].sort((x, y) => x - y);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? (sorted[mid] as number) : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2;
};

async function main(): Promise<void> {
  const options = parse(process.argv.slice(2));
  // Timers' work (the event-loop monitor, the log lines' batching, health checks) is counted per request as well: a
  // counted process slowed by a load on its own core would do more of it per request.
  pinSelf(SIM_CORE);
  const dir = mkdtempSync(join(tmpdir(), 'waybill-instructions-'));
  const b = resolve(options.b);
  const targets: Target[] = [
    ...(options.a !== undefined ? [{ label: 'A', dir: resolve(options.a), kind: 'waybill' as const }] : []),
    { label: options.a !== undefined ? 'B' : 'waybill', dir: b, kind: 'waybill' },
    ...(options.floor ? [{ label: 'floor', dir: b, kind: 'floor' as const }] : []),
  ];
  const kind = options.tokens === 0 ? 'non-streaming request' : `request streamed with ${options.tokens} tokens (${eventsPerAnswer(options.tokens)} events) every ${options.itlMs} ms`;
  console.log(`instructions per ${kind} under callgrind: ${options.warmup} warm-up requests, ${options.requests} counted, ${options.concurrency} in flight, ${options.runs} run(s) each; logs in ${dir}`);
  const sim = await startSim(join(b, 'bin/waybill.js'), SIM_CORE, dir, { itlMs: options.itlMs, ttftMs: options.tokens === 0 ? 50 : 20, outputTokens: Math.max(1, options.tokens), seed: 1 });
  const results = new Map<string, number[]>(targets.map((t) => [t.label, []]));
  try {
    for (let run = 1; run <= options.runs; run++) {
      for (const target of targets) {
        const { total, compiler, events } = await count(target, sim.origin, dir, options, run);
        const perRequest = (n: number) => Math.round(n / options.requests);
        results.get(target.label)?.push(perRequest(total - compiler));
        console.log(`  run ${run} ${target.label.padEnd(8)} ${perRequest(total)} instructions/request: compiler ${perRequest(compiler)}, execution ${perRequest(total - compiler)}`);
        if (options.cacheSim) {
          const unit = options.tokens === 0 ? options.requests : options.requests * eventsPerAnswer(options.tokens);
          const perUnit = [...events].map(([name, n]) => `${name} ${(n / unit).toFixed(name === 'Ir' || name === 'Dr' || name === 'Dw' ? 0 : 1)}`).join(', ');
          console.log(`    per ${options.tokens === 0 ? 'request' : 'event'}, execution (the compiler's share taken out): ${perUnit}`);
        }
      }
    }
  } finally {
    await sim.child.stop();
  }
  const execution = new Map([...results].map(([label, values]) => [label, median(values)]));
  console.log('execution instructions per request (median of runs):');
  for (const [label, value] of execution) console.log(`  ${label.padEnd(8)} ${value}${options.tokens === 0 ? '' : `, ${Math.round(value / eventsPerAnswer(options.tokens))} per event`}`);
  const floor = execution.get('floor');
  for (const label of ['A', 'B', 'waybill']) {
    const value = execution.get(label);
    if (value !== undefined && floor !== undefined) console.log(`  ${label} / floor: ${(value / floor).toFixed(2)}x`);
  }
  const a = execution.get('A');
  const bValue = execution.get('B');
  if (a !== undefined && bValue !== undefined) console.log(`  B / A: ${(bValue / a).toFixed(3)}`);
}

main().catch((error: unknown) => {
  killAll();
  console.error(error instanceof Error ? error.message : error);
  process.exit(1);
});
