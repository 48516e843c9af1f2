/**
 * `waybill load` / `npm run load --`: an OpenAI-compatible streaming load generator for Waybill, the simulator or a
 * real vLLM. See docs/load.md.
 */
import { writeFile, readFile } from 'node:fs/promises';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { request } from 'undici';
import { parse as parseYaml } from 'yaml';
import { duration } from '../src/config/schema.js';
import { buildInfo } from '../src/util/build.js';
import { watchEmptyConnections } from './client.js';
import { runCompare } from './compare.js';
import { measureTaken, redactArgs, redactUrl, workloadKeys, type RunHeader } from './header.js';
import { reconcile, settledSnapshot, snapshot, TargetError, type Reconciliation } from './reconcile.js';
import { htmlReport, jsonReport, reconciliationText, summaryTable } from './report.js';
import { runWorkload, type Progress, type RunResult } from './runner.js';
import { summarize, type SloThresholds } from './stats.js';
import { FLEET_KINDS, MAX_GROUPS, type Fleet, type FleetKind } from './fleet.js';
import { fleetSummary, upstreamShares } from './fleet-stats.js';
import { chatShareMix, FAULT_KINDS, parseRange, parseRouteMix, type FaultKind, type Range, type RouteShares, type Workload } from './workload.js';

export const USAGE = `usage: waybill load --url URL (--concurrency N | --rate R) (--requests N | --duration D) [options]
       waybill load compare A.json B.json   (before/after table of two --json reports; see its --help)

target and shape
  --url URL                   OpenAI-compatible base URL (Waybill, the simulator, or vLLM)
  --model NAME                model (default: the first of GET /v1/models)
  --concurrency N             closed loop: N concurrent streams
  --rate R                    open loop: Poisson arrivals, R requests per second
  --requests N | --duration D stop after N requests, or after D (e.g. 30s, 2m)
  --seed N                    workload seed (default 1): the same seed sends the same requests
  --warmup N                  first send N requests of the same workload (another seed) that are neither measured
                              nor reconciled: a cold process reads its first requests late
  --workload FILE             YAML with any of the workload keys below (snake_case); flags override it
  --workload shared-prefix|multi-turn   a fleet workload instead (YAML: fleet: shared-prefix), chat completions only
fleet workloads (usage asked on every stream; no faults, cancellations or slow requests)
  --groups G                  shared-prefix: groups, each its own system prompt (default 8)
  --popularity uniform|zipf   shared-prefix: how groups are picked (default uniform)
  --zipf-s S                  shared-prefix: Zipf exponent, group k weighs 1/(k+1)^S (default 1.1)
  --prefix-seed N             shared-prefix: seed of the groups' system prompts (default: --seed), so runs with
                              different --seed share prefixes
  --prefix-tokens P           system prompt per group or session, in tokens of 4 characters (default 2048)
  --question-tokens Q         user question per request or turn, unique (default 64, at least 4)
  --sessions S                multi-turn: concurrent sessions (default: --concurrency; closed loop only)
  --turns T[-U]               multi-turn: turns per session, fixed or drawn per session (default 4)
  --think-time-ms MEAN        multi-turn: pause between a turn's completion and the next turn (default 1000)
  --think-time-dist exp|fixed multi-turn: exponential with that mean, or exactly it (default exp)
  --session-header NAME       multi-turn: send a stable per-session id in this header
workload
  --prompt-tokens A[-B]       prompt length in tokens, fixed or uniform (default 64-512)
  --output-tokens A[-B]       max_tokens (default 32-128)
  --stream-share X            share of streamed requests, on the routes that stream (default 1)
  --chat-share X              share of chat completions; the rest legacy completions (default 1)
  --route-mix R=X,...         instead of --chat-share (YAML: route_shares): each route's share, summing to 1, e.g.
                              chat=0.6,completions=0.1,responses=0.1,messages=0.1,embeddings=0.1 (routes: chat or
                              chat_completions, completions, responses, messages, embeddings, rerank, tokenize)
  --n A[-B]                   choices per request (default 1)
  --usage-share X             share of streams asking stream_options.include_usage (default 0)
  --cancel-share X            share of streams the client abandons (default 0)
  --cancel-after-first-token-share X   of those, the share abandoned after the first token (default 0.5)
  --fault-share X             share of requests with a simulator fault (x-sim-fault; default 0)
  --fault-kinds a,b,...       fault kinds to draw from (default: all)
  --slow-share X              share of streams the simulator makes slow (TTFT 3 s or 120 ms/token)
  --simulator                 the target is (or fronts) the simulator: faults and race-free cancellations apply
SLO, reports, reconciliation
  --slo-ttft D --slo-tpot D --slo-e2e D   thresholds (default 2s, 100ms, 60s) for attainment and goodput
  --json FILE                 write the JSON report (a header says what was run: target, start, duration asked and
                              taken and why they differ, load, workload, seed, Waybill version, these flags)
  --html FILE                 write the self-contained HTML report (the same header, charts with axes)
  --reconcile                 the target is Waybill: compare its /metrics (before/after) with what clients saw
  --sim URL                   a simulator behind Waybill, for --reconcile (repeatable)
  --borderline-margin D       client and Waybill clocks agree within D (default 50ms): SLO results this close to
                              a threshold are borderline, compared as bounds, not exactly (docs/load.md)
  --api-key KEY               sent as Authorization: Bearer (with --reconcile, also on the gateway's /metrics: where client keys exist and there is no admin port, a key with admin: true)
  --timeout D                 per-request limit (default 5m)
  --quiet                     no progress line
  -h, --help                  this help
examples
  waybill load --url http://127.0.0.1:8080 --concurrency 64 --duration 30s --html report.html
  waybill load --url http://vllm:8000 --rate 20 --requests 5000 --workload workload.yaml
  waybill load compare before.json after.json
  (more, and what each number means: docs/load.md)
`;

interface LoadConfig {
  baseUrl: string;
  model: string | undefined;
  concurrency: number | undefined;
  rate: number | undefined;
  requests: number | undefined;
  durationMs: number | undefined;
  seed: number;
  warmup: number;
  workload: Workload;
  simulator: boolean;
  slo: SloThresholds;
  json: string | undefined;
  html: string | undefined;
  reconcile: boolean;
  sims: string[];
  borderlineMarginMs: number;
  apiKey: string | undefined;
  timeoutMs: number;
  quiet: boolean;
  /** The flags as given, for the report's header. */
  argv: readonly string[];
}

const OPTIONS = {
  url: { type: 'string' },
  model: { type: 'string' },
  concurrency: { type: 'string' },
  rate: { type: 'string' },
  requests: { type: 'string' },
  duration: { type: 'string' },
  seed: { type: 'string' },
  warmup: { type: 'string' },
  workload: { type: 'string' },
  groups: { type: 'string' },
  popularity: { type: 'string' },
  'zipf-s': { type: 'string' },
  'prefix-seed': { type: 'string' },
  'prefix-tokens': { type: 'string' },
  'question-tokens': { type: 'string' },
  sessions: { type: 'string' },
  turns: { type: 'string' },
  'think-time-ms': { type: 'string' },
  'think-time-dist': { type: 'string' },
  'session-header': { type: 'string' },
  'prompt-tokens': { type: 'string' },
  'output-tokens': { type: 'string' },
  'stream-share': { type: 'string' },
  'chat-share': { type: 'string' },
  'route-mix': { type: 'string' },
  n: { type: 'string' },
  'usage-share': { type: 'string' },
  'cancel-share': { type: 'string' },
  'cancel-after-first-token-share': { type: 'string' },
  'fault-share': { type: 'string' },
  'fault-kinds': { type: 'string' },
  'slow-share': { type: 'string' },
  simulator: { type: 'boolean' },
  'slo-ttft': { type: 'string' },
  'slo-tpot': { type: 'string' },
  'slo-e2e': { type: 'string' },
  json: { type: 'string' },
  html: { type: 'string' },
  reconcile: { type: 'boolean' },
  sim: { type: 'string', multiple: true },
  'borderline-margin': { type: 'string' },
  'api-key': { type: 'string' },
  timeout: { type: 'string' },
  quiet: { type: 'boolean' },
  help: { type: 'boolean' },
} as const;

/** Reads flags (and the workload file), reporting every problem at once, each naming its flag. */
export async function parseLoadArgs(argv: string[]): Promise<LoadConfig | { problems: string[] }> {
  const { values } = parseArgs({ args: argv, options: OPTIONS, strict: true });
  const problems: string[] = [];
  let file: Record<string, unknown> = {};
  // `--workload` names a fleet workload or a YAML file (whose `fleet` key may name one).
  const fleetFlag = (FLEET_KINDS as readonly string[]).includes(values.workload ?? '') ? (values.workload as FleetKind) : undefined;
  if (values.workload !== undefined && fleetFlag === undefined) {
    try {
      const parsed: unknown = parseYaml(await readFile(values.workload, 'utf8'));
      if (parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed)) file = parsed as Record<string, unknown>;
      else problems.push(`--workload: ${values.workload} is not a YAML mapping`);
    } catch (err) {
      problems.push(`--workload: ${(err as Error).message.split('\n')[0] ?? ''}`);
    }
  }
  const flag = (name: keyof typeof OPTIONS): string | undefined => {
    const fromFlag = values[name];
    if (typeof fromFlag === 'string') return fromFlag;
    const fromFile = file[name.replaceAll('-', '_')];
    if (typeof fromFile === 'string' || typeof fromFile === 'number' || typeof fromFile === 'boolean') return String(fromFile);
    if (Array.isArray(fromFile)) return fromFile.join(',');
    if (fromFile !== undefined && fromFile !== null) problems.push(`--workload: key ${name.replaceAll('-', '_')} must be a value`);
    return undefined;
  };
  const share = (name: keyof typeof OPTIONS, fallback: number): number => {
    const text = flag(name);
    if (text === undefined) return fallback;
    const value = Number(text);
    if (!(value >= 0 && value <= 1)) problems.push(`--${name}: "${text}" is not a share between 0 and 1`);
    return value;
  };
  const range = (name: keyof typeof OPTIONS, fallback: Range): Range => {
    const text = flag(name);
    if (text === undefined) return fallback;
    const value = parseRange(text);
    if (value === undefined) problems.push(`--${name}: "${text}" is not N or A-B`);
    return value ?? fallback;
  };
  const ms = (name: keyof typeof OPTIONS, fallback: number | undefined): number | undefined => {
    const text = flag(name);
    if (text === undefined) return fallback;
    const parsed = duration.safeParse(/^\d+(\.\d+)?$/.test(text) ? Number(text) : text);
    if (!parsed.success) problems.push(`--${name}: "${text}" is not a duration (e.g. 250ms, 30s, 2m)`);
    return parsed.success ? parsed.data : fallback;
  };
  const positive = (name: keyof typeof OPTIONS): number | undefined => {
    const text = flag(name);
    if (text === undefined) return undefined;
    const value = Number(text);
    if (!(value > 0)) problems.push(`--${name}: "${text}" must be a positive number`);
    return value;
  };

  const baseUrl = flag('url');
  if (baseUrl === undefined) problems.push('--url: required');
  const concurrency = positive('concurrency');
  const rate = positive('rate');
  if ((concurrency === undefined) === (rate === undefined)) problems.push('--concurrency / --rate: give exactly one');
  const requests = positive('requests');
  const durationMs = ms('duration', undefined);
  if (requests === undefined && flag('duration') === undefined) problems.push('--requests / --duration: give at least one');
  const kindsText = flag('fault-kinds');
  const faultKinds = kindsText === undefined ? [...FAULT_KINDS] : kindsText.split(',').map((k) => k.trim()).filter(Boolean);
  for (const kind of faultKinds) if (!(FAULT_KINDS as readonly string[]).includes(kind)) problems.push(`--fault-kinds: unknown kind "${kind}" (one of ${FAULT_KINDS.join(', ')})`);
  const reconcileRun = values.reconcile === true || file['reconcile'] === true;
  // The route mix: `--route-mix` (or the YAML key `route_shares`, a mapping or the flag's text), else `chat_share`.
  const mixInput: unknown = values['route-mix'] ?? file['route_shares'];
  const chatShare = share('chat-share', 1);
  let routeShares: RouteShares = chatShareMix(chatShare);
  if (mixInput !== undefined && mixInput !== null) {
    if (flag('chat-share') !== undefined) problems.push('--route-mix / --chat-share: give one (a mix names the chat share itself)');
    const mix = parseRouteMix(mixInput);
    if ('problems' in mix) problems.push(...mix.problems.map((p) => `--route-mix: ${p}`));
    else routeShares = mix;
  }
  const fileFleet = file['fleet'];
  const fleetKind = fleetFlag ?? (fileFleet === undefined || fileFleet === null ? undefined : typeof fileFleet === 'string' ? fileFleet : JSON.stringify(fileFleet));
  const integer = (name: keyof typeof OPTIONS, fallback: number, min: number): number => {
    const text = flag(name);
    if (text === undefined) return fallback;
    const value = Number(text);
    if (!(Number.isInteger(value) && value >= min)) problems.push(`--${name}: "${text}" must be an integer ≥ ${min}`);
    return value;
  };
  const choice = <T extends string>(name: keyof typeof OPTIONS, options: readonly T[], fallback: T): T => {
    const text = flag(name) ?? fallback;
    if (!(options as readonly string[]).includes(text)) problems.push(`--${name}: "${text}" is not one of ${options.join(', ')}`);
    return text as T;
  };
  let fleet: Fleet | undefined;
  if (fleetKind === 'shared-prefix') {
    const zipfS = Number(flag('zipf-s') ?? 1.1);
    if (!(zipfS > 0)) problems.push(`--zipf-s: "${flag('zipf-s') ?? ''}" must be a positive number`);
    const prefixSeedText = flag('prefix-seed');
    const prefixSeed = prefixSeedText === undefined ? undefined : Number(prefixSeedText);
    if (prefixSeed !== undefined && !Number.isInteger(prefixSeed)) problems.push(`--prefix-seed: "${prefixSeedText ?? ''}" is not an integer`);
    if (Number(flag('groups') ?? 8) > MAX_GROUPS) problems.push(`--groups: at most ${MAX_GROUPS} (each group's prompt opens with a token of its own)`);
    fleet = {
      kind: 'shared-prefix',
      groups: Math.min(integer('groups', 8, 1), MAX_GROUPS),
      prefixTokens: integer('prefix-tokens', 2048, 1),
      questionTokens: integer('question-tokens', 64, 4),
      popularity: choice('popularity', ['uniform', 'zipf'], 'uniform'),
      zipfS,
      prefixSeed,
    };
  } else if (fleetKind === 'multi-turn') {
    const turns = range('turns', { min: 4, max: 4 });
    if (turns.min < 1) problems.push('--turns: a session has at least one turn');
    const thinkText = flag('think-time-ms');
    const thinkTimeMs = thinkText === undefined ? 1000 : Number(thinkText);
    if (!(thinkTimeMs >= 0)) problems.push(`--think-time-ms: "${thinkText ?? ''}" must be a number of ms ≥ 0`);
    // Sessions are a closed loop: each waits for its own answers, so arrivals at a rate would not be sessions.
    if (rate !== undefined) problems.push('--rate: multi-turn runs a closed loop of sessions; give --concurrency (and --sessions)');
    fleet = {
      kind: 'multi-turn',
      sessions: integer('sessions', concurrency ?? 1, 1),
      turns,
      prefixTokens: integer('prefix-tokens', 2048, 1),
      questionTokens: integer('question-tokens', 64, 4),
      thinkTimeMs,
      thinkTimeDist: choice('think-time-dist', ['exp', 'fixed'], 'exp'),
      sessionHeader: flag('session-header'),
    };
    const header = flag('session-header');
    if (header !== undefined && !/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(header)) problems.push(`--session-header: "${header}" is not a header name`);
  } else if (fleetKind !== undefined) {
    problems.push(`--workload: fleet "${fleetKind}" is not one of ${FLEET_KINDS.join(', ')}`);
  }
  const workload: Workload = {
    model: flag('model'),
    promptTokens: range('prompt-tokens', { min: 64, max: 512 }),
    outputTokens: range('output-tokens', { min: 32, max: 128 }),
    streamShare: share('stream-share', 1),
    routeShares,
    n: range('n', { min: 1, max: 1 }),
    // Reconciling compares token totals: the client must see usage on every stream.
    usageShare: reconcileRun ? 1 : share('usage-share', 0),
    cancelShare: share('cancel-share', 0),
    cancelAfterFirstTokenShare: share('cancel-after-first-token-share', 0.5),
    faultShare: share('fault-share', 0),
    faultKinds: faultKinds as FaultKind[],
    slowShare: share('slow-share', 0),
    ...(fleet === undefined ? {} : { fleet }),
  };
  if (fleet !== undefined && workload.cancelShare + workload.faultShare + workload.slowShare > 0) {
    // A turn's answer is the next turn's input, and a group's traffic is its prompt: a fault would change both.
    problems.push('--cancel-share / --fault-share / --slow-share: not with a fleet workload');
  }
  if (workload.cancelShare + workload.faultShare + workload.slowShare > 1) problems.push('--cancel-share + --fault-share + --slow-share: must not exceed 1');
  const slo = { ttftMs: ms('slo-ttft', 2000) ?? 2000, tpotMs: ms('slo-tpot', 100) ?? 100, e2eMs: ms('slo-e2e', 60_000) ?? 60_000 };
  const seedText = flag('seed');
  const seed = seedText === undefined ? 1 : Number(seedText);
  if (!Number.isInteger(seed)) problems.push(`--seed: "${seedText ?? ''}" is not an integer`);
  const timeoutMs = ms('timeout', 300_000) ?? 300_000;
  const warmupText = flag('warmup');
  const warmup = warmupText === undefined ? 0 : Number(warmupText);
  if (!(Number.isInteger(warmup) && warmup >= 0)) problems.push(`--warmup: "${warmupText ?? ''}" is not a number of requests`);
  if (problems.length > 0 || baseUrl === undefined) return { problems };
  return {
    baseUrl: baseUrl.replace(/\/+$/, ''),
    model: workload.model,
    concurrency,
    rate,
    requests,
    durationMs,
    seed,
    warmup,
    workload,
    simulator: values.simulator === true || workload.faultShare > 0 || workload.slowShare > 0 || reconcileRun,
    slo,
    json: flag('json'),
    html: flag('html'),
    reconcile: reconcileRun,
    sims: values.sim ?? [],
    borderlineMarginMs: ms('borderline-margin', 50) ?? 50,
    apiKey: flag('api-key'),
    timeoutMs,
    quiet: values.quiet === true,
    argv: [...argv],
  };
}

/** Errors of a connection that could not be made or was lost: the target's problem, not the tool's. */
const CONNECTION_CODES: ReadonlySet<string> = new Set([
  'ECONNREFUSED', 'ECONNRESET', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', 'ETIMEDOUT', 'EPIPE',
  'UND_ERR_CONNECT_TIMEOUT', 'UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT', 'UND_ERR_SOCKET', 'UND_ERR_INVALID_ARG',
  'ERR_INVALID_URL',
]);

/**
 * The target's /metrics text, for the per-upstream shares of a fleet run; undefined when it has none to give (a
 * 404, a refused key, no connection): the shares then name the target as the one upstream.
 */
async function metricsText(baseUrl: string, apiKey: string | undefined): Promise<string | undefined> {
  try {
    const response = await request(`${baseUrl}/metrics`, { headers: apiKey === undefined ? {} : { authorization: `Bearer ${apiKey}` } });
    const text = await response.body.text();
    return response.statusCode === 200 ? text : undefined;
  } catch {
    return undefined;
  }
}

/** One line for an error the operator fixes (an unreachable or wrong target), else undefined. */
export function targetProblem(err: unknown, baseUrl: string): string | undefined {
  if (err instanceof TargetError) return err.message;
  if (!(err instanceof Error)) return undefined;
  const code = (err as NodeJS.ErrnoException).code;
  if (code === undefined || !CONNECTION_CODES.has(code)) return undefined;
  // An AggregateError (every address of a name refused) has no message of its own.
  const detail = err.message === '' ? code : err.message.includes(code) ? err.message : `${err.message} (${code})`;
  return `cannot reach ${baseUrl}: ${detail}`;
}

/**
 * The target answers at all (GET /v1/models), before any load: an unreachable URL is one line, not a run of
 * failed requests. Without --model, the first model it lists.
 */
async function probeTarget(baseUrl: string, apiKey: string | undefined, model: string | undefined): Promise<string> {
  const response = await request(`${baseUrl}/v1/models`, { headers: apiKey === undefined ? {} : { authorization: `Bearer ${apiKey}` } });
  const text = await response.body.text();
  if (model !== undefined) return model;
  let id: unknown;
  try {
    id = (JSON.parse(text) as { data?: Array<{ id?: unknown }> }).data?.[0]?.id;
  } catch {
    id = undefined;
  }
  if (typeof id !== 'string') throw new TargetError(`${baseUrl}/v1/models (${response.statusCode}) lists no model; give --model`);
  return id;
}

function progressPrinter(quiet: boolean): ((p: Progress) => void) | undefined {
  if (quiet) return undefined;
  const tty = process.stderr.isTTY;
  let lastPlain = 0;
  return (p) => {
    const line = `${(p.elapsedMs / 1000).toFixed(1)}s  done ${p.done}  in flight ${p.inFlight}  errors ${p.errors}  ${(p.done / Math.max(0.001, p.elapsedMs / 1000)).toFixed(1)} req/s`;
    if (tty) process.stderr.write(`\r${line}\u001b[K`);
    else if (p.elapsedMs - lastPlain >= 5000) {
      lastPlain = p.elapsedMs;
      process.stderr.write(`${line}\n`);
    }
  };
}

/** The report's header: what this run was (load/header.ts). */
function headerOf(config: LoadConfig, model: string, run: RunResult): RunHeader {
  const asked = { requests: config.requests ?? null, durationS: config.durationMs === undefined ? null : config.durationMs / 1000, warmup: config.warmup };
  return {
    target: redactUrl(config.baseUrl),
    model,
    startedAt: new Date(run.startedAtEpochMs).toISOString(),
    load: config.rate === undefined ? { mode: 'closed', concurrency: config.concurrency ?? 1 } : { mode: 'open', ratePerS: config.rate },
    asked,
    taken: measureTaken(run.results, asked, run.durationMs),
    workload: workloadKeys(config.workload, model),
    seed: config.seed,
    simulator: config.simulator,
    reconcile: config.reconcile,
    timeoutS: config.timeoutMs / 1000,
    waybill: buildInfo(),
    argv: redactArgs(config.argv),
  };
}

export interface LoadOutcome {
  readonly exitCode: number;
  readonly mismatches: number;
  /** With --reconcile: the whole comparison (bounds, borderline and race counts). */
  readonly reconciliation?: Reconciliation;
}

/** Runs the load tool with parsed options; returns its exit code (1 when reconciliation found mismatches). */
export async function runLoadWith(config: LoadConfig, out: (text: string) => void = (t) => process.stdout.write(`${t}\n`)): Promise<LoadOutcome> {
  const model = await probeTarget(config.baseUrl, config.apiKey, config.model);
  const shape = {
    baseUrl: config.baseUrl,
    model,
    apiKey: config.apiKey,
    workload: config.workload,
    concurrency: config.concurrency,
    rate: config.rate,
    simulator: config.simulator,
    requestTimeoutMs: config.timeoutMs,
  };
  // A target that is not Waybill (or a --sim that is not a simulator) is refused before any load.
  if (config.reconcile) await snapshot(config.baseUrl, config.sims, config.apiKey);
  // From before the warm-up: a connection it left open could still be answered with a 408 during the run.
  const stopWatching = config.reconcile ? watchEmptyConnections(config.baseUrl) : undefined;
  if (config.warmup > 0) {
    // Settled before the run's first snapshot, so none of it is counted in the comparison.
    const start = config.reconcile ? await snapshot(config.baseUrl, config.sims, config.apiKey) : undefined;
    const warm = await runWorkload({ ...shape, seed: config.seed + 1, requests: config.warmup, durationMs: undefined, idPrefix: 'warmup' });
    if (start !== undefined) await settledSnapshot(config.baseUrl, config.sims, start, warm.results.length, undefined, config.apiKey);
  }
  const before = config.reconcile ? await snapshot(config.baseUrl, config.sims, config.apiKey) : undefined;
  const fleet = config.workload.fleet;
  const metricsBefore = fleet === undefined ? undefined : await metricsText(config.baseUrl, config.apiKey);
  const progress = progressPrinter(config.quiet);
  const run = await runWorkload({
    ...shape,
    seed: config.seed,
    requests: config.requests,
    durationMs: config.durationMs,
    ...(progress === undefined ? {} : { onProgress: progress }),
  });
  if (progress !== undefined && process.stderr.isTTY) process.stderr.write('\n');
  // With --reconcile, Waybill has settled every request (its attempts counted) once the after snapshot is taken.
  const after = before === undefined ? undefined : await settledSnapshot(config.baseUrl, config.sims, before, run.results.length, undefined, config.apiKey);
  const durationS = run.durationMs / 1000;
  const plain = summarize(run.results, durationS, config.slo);
  const summary =
    fleet === undefined
      ? plain
      : {
          ...plain,
          fleet: fleetSummary(
            fleet.kind,
            run.results,
            durationS,
            upstreamShares(metricsBefore, await metricsText(config.baseUrl, config.apiKey), redactUrl(config.baseUrl), run.results.length),
            fleet.kind === 'shared-prefix' ? fleet.groups : undefined,
          ),
        };
  const header = headerOf(config, model, run);
  out(summaryTable(summary, config.slo));
  out(`run             ${header.taken.explanation}`);
  let reconciliation;
  if (before !== undefined && after !== undefined) {
    reconciliation = reconcile(run.results, before, after, config.slo, config.borderlineMarginMs, stopWatching?.() ?? 0);
    out(reconciliationText(reconciliation));
  }
  const report = { header, summary, slo: config.slo, results: run.results, reconciliation };
  if (config.json !== undefined) await writeFile(config.json, JSON.stringify(jsonReport(report), null, 2));
  if (config.html !== undefined) await writeFile(config.html, htmlReport(report));
  const mismatches = reconciliation?.mismatches.length ?? 0;
  return { exitCode: mismatches > 0 ? 1 : 0, mismatches, ...(reconciliation === undefined ? {} : { reconciliation }) };
}

export async function runLoad(argv: string[]): Promise<number> {
  // Before the help check: `waybill load compare --help` is compare's help.
  if (argv[0] === 'compare') return runCompare(argv.slice(1));
  if (argv.includes('--help') || argv.includes('-h')) {
    console.log(USAGE);
    return 0;
  }
  let config;
  try {
    config = await parseLoadArgs(argv);
  } catch (err) {
    console.error(`${(err as Error).message}\n\n${USAGE}`);
    return 2;
  }
  if ('problems' in config) {
    console.error(`invalid load options:\n${config.problems.map((p) => `  - ${p}`).join('\n')}\n\n${USAGE}`);
    return 2;
  }
  try {
    return (await runLoadWith(config)).exitCode;
  } catch (err) {
    // Exit 2 with one line, as for a bad flag: the operator fixes the command (or starts the target).
    const problem = targetProblem(err, config.baseUrl);
    if (problem === undefined) throw err;
    console.error(`waybill load: ${problem}`);
    return 2;
  }
}

const invoked = process.argv[1];
if (invoked !== undefined && import.meta.url === pathToFileURL(invoked).href) {
  runLoad(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (err: unknown) => {
      console.error(err instanceof Error ? err.message : err);
      process.exit(1);
    },
  );
}
