/**
 * Two builds of Waybill, A and B (or the bare Node relay and a build), on the same workload in one run: is B cheaper
 * than A, and by how much?
 *
 *   npm run build && node dist/bench/ab.js --a /path/to/other/checkout [--b .] [--scenario c64s] [--rounds 6]
 *   node dist/bench/ab.js --a . --b . --b-flags '--max-semi-space-size=64'     (one build, a node flag or not)
 *   node dist/bench/ab.js --a relay --b . --scenario c64s                       (Waybill against the bare Node relay)
 *   node dist/bench/ab.js --a . --b . --b-config '{"logging":{"requests":false}}'  (one build, a setting or not)
 *
 * A and B are checkouts with `dist/` built (e.g. `git worktree add /tmp/base main && cd /tmp/base && npm run build`,
 * with node_modules linked). One simulator; both proxies, default configuration unless `--a-config`/`--b-config`, alive
 * on core 0 for the whole run;
 * rounds alternate A, B, B, A, … so drift in the machine's state falls on both. A gateway's CPU per event differs by
 * ±15% between two processes of the same build (docs/performance.md), more than most changes: the figure to read is
 * the median of the paired ratios B/A over the rounds, with their spread. Requests per event stay the same across
 * rows, so the ratio holds for per-request costs too; `req` and `reqs` report per request, the others per event.
 *
 * `--a relay`: A is the bare Node relay (bench/proxy/floor.ts, this checkout's build) instead of a gateway, so the
 * ratio to issue 27's bar comes paired, round by round, rather than from one window of each in a full run.
 * `--b floor-inside`: B is that relay served from inside a gateway's process (bench/proxy/floor-inside.ts), the
 * gateway idle beside it: with `--a relay`, what the gateway's process costs a relay.
 *
 * `--split LONG` (e.g. `--scenario c64s --split c64`): each build's turn runs both scenarios, one after the other, and
 * each turn's two windows split that proxy's CPU into a cost per request and a cost per event (bench/proxy/split.ts);
 * then B − A of each, paired. Where a gap is paid, per request or per event, decides what can close it.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { runLoad } from './proxy/client.js';
import { BIN, FLOOR, FLOOR_INSIDE } from './proxy/layout.js';
import { parseConfigKeys } from './proxy/options.js';
import { killAll, mainThreadUserUs, pinSelf, processCpuUs, startFloor, startGateway, startSim, type Child } from './proxy/procs.js';
import { eventsPerAnswer, measuresRequests, requestBody, SCENARIOS, type Scenario } from './proxy/scenarios.js';
import { splitCosts, splitProblem, type CostSplit } from './proxy/split.js';
import { metricOf } from './proxy/run.js';
import { distribution, median } from './proxy/stats.js';

const PROXY_CORE = 0;
/** `--a relay`: the bare Node relay as A. */
const RELAY = 'relay';
/** `--b floor-inside`: the same relay served from inside a gateway's process (bench/proxy/floor-inside.ts). */
const INSIDE = 'floor-inside';
const LOAD_CORE = 1;


interface Options {
  a: string;
  b: string;
  /** Extra node flags for A's / B's gateway (e.g. --max-semi-space-size=64): the same build with and without. */
  aFlags: string[];
  bFlags: string[];
  /** Configuration keys for A's / B's gateway beside the bench's own (JSON, e.g. '{"logging":{"requests":false}}'). */
  aConfig: Record<string, unknown> | undefined;
  bConfig: Record<string, unknown> | undefined;
  scenario: string;
  /** A second scenario, of longer answers, run in each build's turn: the split into per request and per event. */
  split: string | undefined;
  rounds: number;
  seconds: number;
}

const scenarioOf = (name: string) => SCENARIOS.find((s) => s.name === name) as Scenario;

function parse(argv: string[]): Options {
  const options: Options = { a: '', b: '.', aFlags: [], bFlags: [], aConfig: undefined, bConfig: undefined, scenario: 'c64s', split: undefined, rounds: 6, seconds: 4 };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    const value = argv[++i];
    if (value === undefined) throw new Error(`${flag}: needs a value`);
    if (flag === '--a') options.a = value;
    else if (flag === '--b') options.b = value;
    else if (flag === '--a-flags') options.aFlags = value.split(' ').filter((f) => f !== '');
    else if (flag === '--b-flags') options.bFlags = value.split(' ').filter((f) => f !== '');
    else if (flag === '--a-config') options.aConfig = parseConfigKeys(flag, value);
    else if (flag === '--b-config') options.bConfig = parseConfigKeys(flag, value);
    else if (flag === '--scenario') options.scenario = value;
    else if (flag === '--split') options.split = value;
    else if (flag === '--rounds') options.rounds = Number(value);
    else if (flag === '--seconds') options.seconds = Number(value);
    else throw new Error(`unknown flag ${flag}`);
  }
  if (options.a === '') throw new Error('--a DIR is required (a checkout with dist/ built, or `relay`: the bare Node relay)');
  if (options.a === INSIDE) throw new Error('--a floor-inside: it is B only (--b floor-inside)');
  if (options.b === RELAY) throw new Error('--b relay: the relay is A only (--a relay)');
  if (options.a === RELAY && (options.aFlags.length > 0 || options.aConfig !== undefined)) throw new Error('--a-flags, --a-config: not with --a relay');
  for (const name of [options.scenario, options.split]) {
    if (name !== undefined && !SCENARIOS.some((s) => s.name === name)) throw new Error(`--scenario, --split: one of ${SCENARIOS.map((s) => s.name).join(', ')}`);
  }
  if (options.split !== undefined) {
    const problem = splitProblem(scenarioOf(options.scenario), scenarioOf(options.split));
    if (problem !== undefined) throw new Error(`--split: ${problem}`);
  }
  return options;
}

interface Round {
  build: 'A' | 'B';
  scenario: string;
  usPerEvent: number;
  usPerRequest: number;
  /** The main thread's user time alone, per event, or per request in a scenario of one-token answers: mainThreadUserUs. */
  userPerUnit: number;
  ttftP50: number;
  ttftP99: number;
}

async function main(): Promise<void> {
  const options = parse(process.argv.slice(2));
  const workloads = [scenarioOf(options.scenario), ...(options.split === undefined ? [] : [scenarioOf(options.split)])];
  pinSelf(LOAD_CORE);
  const dir = mkdtempSync(join(tmpdir(), 'waybill-ab-'));
  const bin = (checkout: string) => (checkout === INSIDE ? FLOOR_INSIDE : join(resolve(checkout), 'bin', 'waybill.js'));
  // One simulator for both scenarios of a split: its answers are capped by each request's max_tokens. So the shorter
  // scenario's answers end with finish_reason "length", not the "stop" of its standalone run (src/sim/plan.ts): the
  // same events, two bytes longer, and the gateway settles them as truncated (its output check fails) rather than
  // accepted, through the same code with other values.
  const first = workloads[0] as Scenario;
  const outputTokens = Math.max(...workloads.map((w) => w.tokens));
  const sim = await startSim(options.b === INSIDE ? BIN : bin(options.b), LOAD_CORE, dir, { itlMs: first.itlMs, ttftMs: first.ttftMs, outputTokens, seed: 1 });
  const gateways: Record<'A' | 'B', { child: Child; origin: string }> = {
    A:
      options.a === RELAY
        ? await startFloor(FLOOR, PROXY_CORE, dir, sim.origin)
        : await startGateway(bin(options.a), PROXY_CORE, dir, { name: 'waybill-a', upstream: sim.origin, logging: 'default', nodeFlags: options.aFlags, extra: options.aConfig ?? {} }),
    B: await startGateway(bin(options.b), PROXY_CORE, dir, { name: 'waybill-b', upstream: sim.origin, logging: 'default', nodeFlags: options.bFlags, extra: options.bConfig ?? {} }),
  };
  const rounds: Round[] = [];
  let yields = '';
  try {
    for (let i = 0; i < options.rounds * 2; i++) {
      // A B B A A B …: each build goes first as often as second; a split's two scenarios swap places each turn.
      const build: 'A' | 'B' = (i % 4 === 0 || i % 4 === 3) ? 'A' : 'B';
      for (const workload of i % 2 === 0 ? workloads : [...workloads].reverse()) rounds.push(await measure(build, gateways[build], workload, options.seconds));
    }
    // Answering streams yield their reads only when a turn of the event loop runs past streaming.turn_budget: work a
    // gateway below saturation should not be doing, so a paced scenario's figure is read with this beside it.
    const counted = async (build: 'A' | 'B') => {
      const value = await metricOf(gateways[build].origin, 'waybill_turn_yields_total');
      return Number.isNaN(value) ? 'none (not a gateway)' : String(value);
    };
    yields = `read turns yielded over the run (waybill_turn_yields_total): A ${await counted('A')}, B ${await counted('B')}`;
  } finally {
    await gateways.A.child.stop();
    await gateways.B.child.stop();
    await sim.child.stop();
    killAll();
    rmSync(dir, { recursive: true, force: true });
  }
  for (const workload of workloads) summarise(options, workload, rounds.filter((r) => r.scenario === workload.name));
  if (workloads.length === 2) summariseSplit(options, workloads as [Scenario, Scenario], rounds);
  console.log(`\n${yields}`);
}

/** One build's window of one scenario. */
async function measure(build: 'A' | 'B', gateway: { child: Child; origin: string }, workload: Scenario, seconds: number): Promise<Round> {
  const { child, origin } = gateway;
  const perEvent = !measuresRequests(workload);
  const requestMs = workload.ttftMs + workload.itlMs * (workload.tokens - 1);
  let before = 0;
  let after = 0;
  let userBefore = 0;
  let userAfter = 0;
  const result = await runLoad({
    origin,
    path: '/v1/chat/completions',
    body: requestBody(workload.tokens, false, workload.stream),
    stream: workload.stream,
    concurrency: workload.concurrency,
    rampMs: Math.min(requestMs, 5000),
    warmupMs: Math.max(2000, Math.min(requestMs, 5000) + 1000),
    windowMs: seconds * 1000,
    onWindowStart: () => {
      before = processCpuUs(child.pid);
      userBefore = mainThreadUserUs(child.pid);
    },
    onWindowEnd: () => {
      after = processCpuUs(child.pid);
      userAfter = mainThreadUserUs(child.pid);
    },
  });
  const cpu = after - before;
  const requests = result.completed + result.incomplete;
  const ttft = distribution(result.ttft);
  const round: Round = {
    build,
    scenario: workload.name,
    usPerEvent: cpu / Math.max(1, result.events),
    usPerRequest: cpu / Math.max(1, requests),
    userPerUnit: (userAfter - userBefore) / Math.max(1, perEvent ? result.events : requests),
    ttftP50: ttft.p50,
    ttftP99: ttft.p99,
  };
  console.log(
    `  ${build} ${workload.name} ${result.events > 0 ? `${round.usPerEvent.toFixed(1)} µs/ev ` : ''}${round.usPerRequest.toFixed(0)} µs/req (main thread's user ${round.userPerUnit.toFixed(1)} µs/${perEvent ? 'ev' : 'req'}) TTFT p50 ${round.ttftP50.toFixed(2)} p99 ${round.ttftP99.toFixed(2)} ms (${result.events} events, ${result.errors} errors)`,
  );
  return round;
}

/** Median and range, for a paired figure. */
function range(values: number[], digits = 3): string {
  const sorted = [...values].sort((x, y) => x - y);
  return `median ${median(values).toFixed(digits)} (range ${(sorted[0] ?? NaN).toFixed(digits)}–${(sorted[sorted.length - 1] ?? NaN).toFixed(digits)})`;
}

/** A's and B's windows (or turns) of one scenario, paired as they ran (A B, B A, …): [A's, B's]. */
function pairs<T extends { build: 'A' | 'B' }>(runs: T[]): Array<[T, T]> {
  const paired: Array<[T, T]> = [];
  for (let i = 0; i + 1 < runs.length; i += 2) {
    const [x, y] = [runs[i] as T, runs[i + 1] as T];
    paired.push(x.build === 'A' ? [x, y] : [y, x]);
  }
  return paired;
}

function summarise(options: Options, workload: Scenario, rounds: Round[]): void {
  const perEvent = !measuresRequests(workload);
  const of = (build: 'A' | 'B', pick: (r: Round) => number) => rounds.filter((r) => r.build === build).map(pick);
  const ratios: number[] = [];
  const userRatios: number[] = [];
  for (const [a, b] of pairs(rounds)) {
    ratios.push(perEvent ? b.usPerEvent / a.usPerEvent : b.usPerRequest / a.usPerRequest);
    // Clock ticks (10 ms): a short window at a light load can read none.
    if (a.userPerUnit > 0) userRatios.push(b.userPerUnit / a.userPerUnit);
  }
  const unit = perEvent ? 'µs/event' : 'µs/request';
  const cost = (r: Round) => (perEvent ? r.usPerEvent : r.usPerRequest);
  console.log(`\n${workload.name}, ${options.rounds} rounds × ${options.seconds} s`);
  console.log(`  A ${options.a}: median ${median(of('A', cost)).toFixed(1)} ${unit}, TTFT p50 ${median(of('A', (r) => r.ttftP50)).toFixed(2)} p99 ${median(of('A', (r) => r.ttftP99)).toFixed(2)} ms`);
  console.log(`  B ${options.b}: median ${median(of('B', cost)).toFixed(1)} ${unit}, TTFT p50 ${median(of('B', (r) => r.ttftP50)).toFixed(2)} p99 ${median(of('B', (r) => r.ttftP99)).toFixed(2)} ms`);
  console.log(`  B/A paired: ${range(ratios)}`);
  console.log(`  B/A paired, the main thread's user time alone: ${range(userRatios)} (A ${median(of('A', (r) => r.userPerUnit)).toFixed(1)}, B ${median(of('B', (r) => r.userPerUnit)).toFixed(1)} ${unit})`);
}

/**
 * Each turn's two windows (one build, both scenarios, back to back) give that build's a and b; turns pair as the
 * windows do, for B − A. Events per request are the answers' own (tokens, the role chunk and [DONE]), not a window's
 * count of requests that happened to end in it.
 */
function summariseSplit(options: Options, [short, long]: [Scenario, Scenario], rounds: Round[]): void {
  const eventsOf = (s: Scenario) => eventsPerAnswer(s.tokens);
  const figures = [
    ['CPU', (r: Round) => r.usPerEvent],
    ["the main thread's user time", (r: Round) => r.userPerUnit],
  ] as const;
  /** a and b from two windows of one scenario each, per event by `unit`. */
  const solve = (s: Round, l: Round, unit: (r: Round) => number) =>
    splitCosts({ usPerEvent: unit(s), eventsPerRequest: eventsOf(short) }, { usPerEvent: unit(l), eventsPerRequest: eventsOf(long) });
  console.log(`\nsplit: CPU per event = b + a ÷ events per request (${short.name}: ${eventsOf(short)}, ${long.name}: ${eventsOf(long)}), each turn's two windows`);
  for (const [label, unit] of figures) {
    const turns: Array<{ build: 'A' | 'B'; costs: CostSplit }> = [];
    for (let i = 0; i + 1 < rounds.length; i += 2) {
      const [x, y] = [rounds[i] as Round, rounds[i + 1] as Round];
      const [s, l] = x.scenario === short.name ? [x, y] : [y, x];
      turns.push({ build: x.build, costs: solve(s, l, unit) });
    }
    const of = (build: 'A' | 'B', field: keyof CostSplit) => turns.filter((t) => t.build === build).map((t) => t.costs[field]);
    const delta = (field: keyof CostSplit) => pairs(turns).map(([a, b]) => b.costs[field] - a.costs[field]);
    console.log(`  ${label}:`);
    console.log(`    A ${options.a}: a ${range(of('A', 'usPerRequest'), 0)} µs/request, b ${range(of('A', 'usPerEvent'), 1)} µs/event`);
    console.log(`    B ${options.b}: a ${range(of('B', 'usPerRequest'), 0)} µs/request, b ${range(of('B', 'usPerEvent'), 1)} µs/event`);
    console.log(`    B − A paired: a ${range(delta('usPerRequest'), 0)} µs/request, b ${range(delta('usPerEvent'), 1)} µs/event`);
    // Steadier than any turn's a (a 10% change in one window moves it by hundreds of µs): each scenario's median paired
    // gap per event, solved once.
    const gap = (scenario: Scenario) => median(pairs(rounds.filter((r) => r.scenario === scenario.name)).map(([a, b]) => unit(b) - unit(a)));
    const fromGaps = splitCosts({ usPerEvent: gap(short), eventsPerRequest: eventsOf(short) }, { usPerEvent: gap(long), eventsPerRequest: eventsOf(long) });
    console.log(`    B − A from each scenario's median paired gap: a ${fromGaps.usPerRequest.toFixed(0)} µs/request, b ${fromGaps.usPerEvent.toFixed(1)} µs/event`);
  }
}

main().catch((error: unknown) => {
  killAll();
  console.error(error instanceof Error ? error.message : error);
  process.exit(1);
});
