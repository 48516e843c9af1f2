/**
 * Runs a workload: closed loop (N concurrent clients, each sending its next request when the last ends) or open
 * loop (Poisson arrivals at a rate), for a number of requests or a duration, whichever the options name. Bounded
 * in count and time; stops by itself.
 */
import { Agent } from 'undici';
import { runRequest, type RequestResult } from './client.js';
import { groupPrompts, groupWeights, planSession, planSharedPrefix, planTurn, turnMessages, turnQuestion, type ChatMessage, type MultiTurnFleet } from './fleet.js';
import { planRequest, seededRandom, type PlannedRequest, type Workload } from './workload.js';

export interface RunOptions {
  readonly baseUrl: string;
  readonly model: string;
  readonly apiKey: string | undefined;
  readonly workload: Workload;
  readonly seed: number;
  /** Closed loop: concurrent clients. */
  readonly concurrency: number | undefined;
  /** Open loop: mean arrivals per second. */
  readonly rate: number | undefined;
  readonly requests: number | undefined;
  readonly durationMs: number | undefined;
  readonly simulator: boolean;
  readonly requestTimeoutMs: number;
  /** Prefix of each request's x-request-id (default `load`): `<prefix>-<index>`. */
  readonly idPrefix?: string;
  readonly onProgress?: (progress: Progress) => void;
}

export interface Progress {
  readonly done: number;
  readonly inFlight: number;
  readonly errors: number;
  readonly elapsedMs: number;
}

export interface RunResult {
  readonly results: RequestResult[];
  readonly durationMs: number;
  /** Wall-clock time of the run's start (ms since the epoch): the zero of every result's `startedAt`. */
  readonly startedAtEpochMs: number;
}

/** Outcomes that are failures of the system under test (client cancellations and 4xx are not). */
const ERRORS = new Set(['failed', 'timeout', 'stream_error', 'incomplete']);

export async function runWorkload(options: RunOptions): Promise<RunResult> {
  const random = seededRandom(options.seed);
  // Closed loop: as many connections as streams (with room). Open loop: unbounded, or requests would queue inside
  // the client once rate × latency passed the pool, and arrivals would stop being Poisson.
  const dispatcher = new Agent({
    connections: options.concurrency === undefined ? null : Math.max(16, (options.workload.fleet?.kind === 'multi-turn' ? options.workload.fleet.sessions : options.concurrency) * 2),
    keepAliveTimeout: 4_000,
  });
  const results: RequestResult[] = [];
  const runStart = performance.now();
  const stopAt = options.durationMs === undefined ? Number.POSITIVE_INFINITY : runStart + options.durationMs;
  const limit = options.requests ?? Number.POSITIVE_INFINITY;
  if (!Number.isFinite(limit) && !Number.isFinite(stopAt)) throw new Error('give a request count or a duration');
  let planned = 0;
  let inFlight = 0;
  let errors = 0;
  const client = {
    baseUrl: options.baseUrl,
    model: options.model,
    apiKey: options.apiKey,
    dispatcher,
    runStart,
    timeoutMs: options.requestTimeoutMs,
    idPrefix: options.idPrefix ?? 'load',
  };
  const fleet = options.workload.fleet;
  // A group's system prompt is one string for the whole run, however many requests carry it.
  const prompts = fleet?.kind === 'shared-prefix' ? groupPrompts(options.seed, fleet) : [];
  const weights = fleet?.kind === 'shared-prefix' ? groupWeights(fleet.groups, fleet.popularity, fleet.zipfS) : [];
  const open = () => planned < limit && performance.now() < stopAt;
  const next = (): PlannedRequest | undefined => {
    if (!open()) return undefined;
    if (fleet?.kind === 'shared-prefix') return planSharedPrefix(options.workload, fleet, options.seed, random, planned++, options.simulator, prompts, weights);
    return planRequest(options.workload, random, planned++, options.simulator);
  };
  const execute = async (plan: PlannedRequest): Promise<RequestResult> => {
    inFlight++;
    const result = await runRequest(plan, client);
    inFlight--;
    if (ERRORS.has(result.outcome)) errors++;
    results.push(result);
    return result;
  };
  let sessions = 0;
  /** Turns the sessions started so far hold against the run's count. */
  let reserved = 0;
  const inWindow = () => performance.now() < stopAt;
  /**
   * One multi-turn session after another, until the run's count or window is spent (a session may stop early). A
   * session holds its turns against the count when it starts, so a worker that finished first does not start
   * another session with turns a slower one has yet to send: a count of sessions × turns gives whole sessions.
   */
  const sessionWorker = async (multi: MultiTurnFleet) => {
    while (reserved < limit && inWindow()) {
      const session = planSession(options.workload, multi, options.seed, sessions++);
      const turns = Math.min(session.turns, limit - reserved);
      reserved += turns;
      let messages: readonly ChatMessage[] | undefined;
      let answer = '';
      for (let turn = 0; turn < turns; turn++) {
        if (turn > 0) {
          // Not worth waiting for a turn that will not be sent.
          if (!inWindow()) return;
          await new Promise((resolve) => setTimeout(resolve, session.thinkMs[turn - 1] ?? 0));
        }
        if (!inWindow()) return;
        messages = turnMessages(messages, answer, session.system, turnQuestion(options.seed, multi, session.session, turn));
        answer = (await execute(planTurn(multi, options.seed, session, turn, messages, planned++, options.simulator))).answerText ?? '';
      }
    }
  };
  const progress = options.onProgress;
  const ticker =
    progress === undefined
      ? undefined
      : setInterval(() => progress({ done: results.length, inFlight, errors, elapsedMs: performance.now() - runStart }), 250);
  try {
    if (options.rate !== undefined) {
      const pending: Array<Promise<unknown>> = [];
      let at = performance.now();
      for (let plan = next(); plan !== undefined; plan = next()) {
        // Exponential gaps: a Poisson process, so bursts happen as they do in production.
        at += (-Math.log(1 - random()) / options.rate) * 1000;
        const wait = at - performance.now();
        if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
        pending.push(execute(plan));
      }
      await Promise.all(pending);
    } else if (fleet?.kind === 'multi-turn') {
      await Promise.all(Array.from({ length: fleet.sessions }, () => sessionWorker(fleet)));
    } else {
      const workers = Array.from({ length: options.concurrency ?? 1 }, async () => {
        for (let plan = next(); plan !== undefined; plan = next()) await execute(plan);
      });
      await Promise.all(workers);
    }
  } finally {
    if (ticker !== undefined) clearInterval(ticker);
    await dispatcher.close();
  }
  results.sort((a, b) => a.plan.index - b.plan.index);
  progress?.({ done: results.length, inFlight: 0, errors, elapsedMs: performance.now() - runStart });
  // timeOrigin + the monotonic start, not Date.now(): the same instant the results' clocks count from.
  return { results, durationMs: performance.now() - runStart, startedAtEpochMs: performance.timeOrigin + runStart };
}
