/**
 * The engine model on a clock: steps the pure core (core.ts) back to back while it has work, each step taking the
 * time its cost model says, and delivers what a step produced when that time has passed — the first token, each later
 * token, the finish — to the generation that owns the sequence (its pacer) and to the engine's metrics. The core
 * decides; this only waits and tells.
 */
import { performance } from 'node:perf_hooks';
import { createRandom, type Random } from '../../util/prng.js';
import type { Pacer } from '../pacer.js';
import { after, type CancelTimer } from '../timer.js';
import type { EngineCore, EngineSnapshot, StepResult } from './types.js';
import { EnginePacer } from './engine-pacer.js';

/** What the runtime reports to the engine's /metrics (src/sim/engine/metrics.ts implements it). */
export interface EngineMetricsSink {
  addPromptTokens(n: number): void;
  addGenerationTokens(n: number): void;
  addPrefixCache(queries: number, hits: number): void;
  addPreemptions(n: number): void;
  observeTtft(seconds: number): void;
  observeItl(seconds: number): void;
  observeFinished(finished: FinishedSequence): void;
}

export interface FinishedSequence {
  readonly finishedReason: string;
  readonly promptTokens: number;
  readonly generationTokens: number;
  /** Prompt tokens the engine computed (not found in the prefix cache) at the sequence's first scheduling. */
  readonly prefillKvComputedTokens: number;
  readonly queueSeconds: number;
  readonly prefillSeconds: number;
  readonly decodeSeconds: number;
  readonly inferenceSeconds: number;
  readonly e2eSeconds: number;
}

/** One prompt of a generation, for one of its choices. */
export interface SequenceInput {
  readonly promptTokenIds: readonly number[];
  readonly outputTokens: number;
  readonly finishedReason: string;
  readonly cacheSalt?: string;
  /** This sequence's prefix-cache hit counts in the job's cachedTokens (false for a prompt's other choices). Default true. */
  readonly countsCached?: boolean;
}

interface SequenceState {
  readonly job: EngineJob;
  readonly index: number;
  readonly promptTokens: number;
  readonly finishedReason: string;
  readonly countsCached: boolean;
  readonly arrivedAt: number;
  scheduledAt: number | null;
  firstTokenAt: number | null;
  lastTokenAt: number | null;
  /** Prompt tokens found cached at the first scheduling (later resumptions after preemption do not change it). */
  cachedTokens: number | null;
}

/** A generation's sequences in the engine: one per choice (and per prompt of a legacy batch). */
export class EngineJob {
  readonly generated: number[];
  readonly finished: boolean[];
  private finishedCount = 0;
  private readonly watchers = new Set<() => void>();

  constructor(
    readonly ids: readonly string[],
    private readonly runtime: EngineRuntime,
  ) {
    this.generated = ids.map(() => 0);
    this.finished = ids.map(() => false);
  }

  /** The prompt tokens the prefix cache held at each sequence's first scheduling, summed; null before any was. */
  cachedTokens: number | null = null;

  get done(): boolean {
    return this.finishedCount === this.ids.length;
  }

  /** Stop every sequence still in the engine (the client left, or a fault ended the answer). */
  cancel(): void {
    if (this.done) return;
    this.runtime.abortJob(this);
  }

  watch(fn: () => void): () => void {
    this.watchers.add(fn);
    return () => this.watchers.delete(fn);
  }

  /** @internal the runtime's: one sequence's progress. */
  progress(index: number, generated: number, finished: boolean): void {
    this.generated[index] = generated;
    if (finished && this.finished[index] !== true) {
      this.finished[index] = true;
      this.finishedCount += 1;
    }
  }

  /** @internal the runtime's: a step changed something for this job. */
  notify(): void {
    for (const fn of [...this.watchers]) fn();
  }

  /** @internal dropped by an abort or an engine restart: counts as finished so nothing waits for it. */
  drop(): void {
    for (let i = 0; i < this.finished.length; i++) this.progress(i, this.generated[i] ?? 0, true);
  }
}

export interface ExternalLoad {
  /** Requests per second, Poisson arrivals. */
  readonly rate: number;
  readonly promptTokens: number;
  readonly outputTokens: number;
  readonly seed: number;
}

/** External requests queued at once beyond which new arrivals are dropped (counted), so memory stays bounded. */
export const EXTERNAL_BACKLOG_LIMIT = 4096;

export class EngineRuntime {
  private readonly sequences = new Map<string, SequenceState>();
  private stepping = false;
  private cancelStep: CancelTimer | undefined;
  private closed = false;
  private nextJob = 0;
  private last: EngineSnapshot;
  private externalTimer: CancelTimer | undefined;
  private externalInFlight = 0;
  /** External arrivals dropped because EXTERNAL_BACKLOG_LIMIT were already queued. */
  externalDropped = 0;
  /** Steps run since the last restart (for /sim/stats and tests). */
  steps = 0;

  constructor(
    private readonly core: EngineCore,
    private readonly metrics: EngineMetricsSink | null,
    private readonly now: () => number = () => performance.now(),
  ) {
    this.last = core.snapshot();
  }

  snapshot(): EngineSnapshot {
    return this.core.snapshot();
  }

  /** Queue a generation's sequences; each finishes after its outputTokens, or when the job is cancelled. */
  submit(inputs: readonly SequenceInput[]): EngineJob {
    const jobId = `j${(this.nextJob++).toString(36)}`;
    const ids = inputs.map((_, i) => `${jobId}.${i}`);
    const job = new EngineJob(ids, this);
    const at = this.now();
    const added: string[] = [];
    inputs.forEach((input, index) => {
      const id = ids[index] ?? '';
      try {
        this.core.add({ id, promptTokenIds: input.promptTokenIds, outputTokens: Math.max(1, input.outputTokens), ...(input.cacheSalt !== undefined ? { cacheSalt: input.cacheSalt } : {}) });
      } catch (error) {
        // All or nothing: the sequences already added are taken out again, so none is left without a job to cancel it.
        for (const done of added) {
          this.core.abort(done);
          this.sequences.delete(done);
        }
        throw error;
      }
      added.push(id);
      this.sequences.set(id, {
        job,
        index,
        promptTokens: input.promptTokenIds.length,
        finishedReason: input.finishedReason,
        countsCached: input.countsCached !== false,
        arrivedAt: at,
        scheduledAt: null,
        firstTokenAt: null,
        lastTokenAt: null,
        cachedTokens: null,
      });
    });
    this.kick();
    return job;
  }

  /** @internal EngineJob.cancel. */
  abortJob(job: EngineJob): void {
    const at = this.now();
    for (const id of job.ids) {
      const state = this.sequences.get(id);
      if (state === undefined) continue;
      this.sequences.delete(id);
      this.core.abort(id);
      // vLLM's output processor records an aborted request as finished with reason abort.
      this.metrics?.observeFinished({ ...this.finishedOf(state, at), finishedReason: 'abort' });
    }
    job.drop();
  }

  /** An engine restart: every sequence dropped (their generations see them end), the cache emptied, counters zeroed. */
  restart(): void {
    const jobs = new Set<EngineJob>();
    for (const state of this.sequences.values()) jobs.add(state.job);
    this.sequences.clear();
    this.cancelStep?.();
    this.cancelStep = undefined;
    this.stepping = false;
    this.core.reset();
    this.last = this.core.snapshot();
    this.steps = 0;
    this.externalInFlight = 0;
    for (const job of jobs) {
      job.drop();
      job.notify();
    }
  }

  /** Other clients' requests, straight into the engine: seen only in its metrics and in everyone's latency. */
  startExternalLoad(load: ExternalLoad): void {
    this.stopExternalLoad();
    if (load.rate <= 0) return;
    const random: Random = createRandom(load.seed);
    let serial = 0;
    const arrive = (): void => {
      if (this.closed) return;
      if (this.externalInFlight >= EXTERNAL_BACKLOG_LIMIT) this.externalDropped += 1;
      else {
        serial += 1;
        // Distinct from the first token on, so external prompts never share a block with anything.
        const ids = Array.from({ length: Math.max(1, load.promptTokens) }, (_, t) => 1_000_000_000 + ((serial * 7919 + t * 104_729) % 1_000_000_000));
        ids[0] = 2_000_000_000 + serial;
        let job: EngineJob;
        try {
          job = this.submit([{ promptTokenIds: ids, outputTokens: load.outputTokens, finishedReason: 'length' }]);
        } catch {
          // Options validation keeps external requests within the KV capacity; never let one stop the timer chain.
          this.externalDropped += 1;
          this.externalTimer = after((-Math.log(1 - random()) / load.rate) * 1000, arrive);
          return;
        }
        this.externalInFlight += 1;
        const stop = job.watch(() => {
          if (!job.done) return;
          stop();
          this.externalInFlight = Math.max(0, this.externalInFlight - 1);
        });
      }
      // Exponential inter-arrival times: a Poisson process at `rate`.
      const gapMs = (-Math.log(1 - random()) / load.rate) * 1000;
      this.externalTimer = after(gapMs, arrive);
    };
    this.externalTimer = after((-Math.log(1 - random()) / load.rate) * 1000, arrive);
  }

  stopExternalLoad(): void {
    this.externalTimer?.();
    this.externalTimer = undefined;
  }

  close(): void {
    this.closed = true;
    this.stopExternalLoad();
    this.cancelStep?.();
    this.cancelStep = undefined;
    for (const state of this.sequences.values()) state.job.drop();
    this.sequences.clear();
  }

  /** A pacer for the writer of `job`: events due as its sequences produce tokens, `tokensPerEvent` to an event. */
  pacer(job: EngineJob, tokensPerEvent: number): Pacer {
    return new EnginePacer(job, Math.max(1, tokensPerEvent));
  }

  private kick(): void {
    if (this.stepping || this.closed) return;
    this.stepping = true;
    this.cancelStep = after(0, this.runStep);
  }

  private readonly runStep = (): void => {
    this.cancelStep = undefined;
    if (this.closed) return;
    const startedAt = this.now();
    const result = this.core.step();
    if (result === null) {
      this.stepping = false;
      return;
    }
    this.steps += 1;
    for (const admitted of result.admitted) {
      const state = this.sequences.get(admitted.id);
      if (state === undefined) continue;
      state.scheduledAt ??= startedAt;
      state.cachedTokens ??= admitted.cachedTokens;
    }
    const due = startedAt + result.durationMs;
    this.cancelStep = after(Math.max(0, due - this.now()), () => this.endStep(result));
  };

  /** The step's time has passed: its tokens exist now. */
  private endStep(result: StepResult): void {
    this.cancelStep = undefined;
    if (this.closed) return;
    const at = this.now();
    const touched = new Set<EngineJob>();
    const metrics = this.metrics;
    let generatedTokens = 0;
    const finished = new Set(result.finished);
    for (const { id, generated } of result.tokens) {
      const state = this.sequences.get(id);
      if (state === undefined) continue;
      const before = state.job.generated[state.index] ?? 0;
      generatedTokens += Math.max(0, generated - before);
      if (state.firstTokenAt === null) {
        state.firstTokenAt = at;
        metrics?.observeTtft((at - state.arrivedAt) / 1000);
        metrics?.addPromptTokens(state.promptTokens);
        if (state.job.cachedTokens === null) state.job.cachedTokens = 0;
        if (state.countsCached) state.job.cachedTokens += state.cachedTokens ?? 0;
      } else if (state.lastTokenAt !== null) {
        metrics?.observeItl((at - state.lastTokenAt) / 1000);
      }
      state.lastTokenAt = at;
      state.job.progress(state.index, generated, finished.has(id));
      touched.add(state.job);
    }
    for (const id of result.finished) {
      const state = this.sequences.get(id);
      if (state === undefined) continue;
      this.sequences.delete(id);
      state.job.progress(state.index, state.job.generated[state.index] ?? 0, true);
      touched.add(state.job);
      if (metrics !== null) metrics.observeFinished(this.finishedOf(state, at));
    }
    if (metrics !== null) {
      if (generatedTokens > 0) metrics.addGenerationTokens(generatedTokens);
      const snapshot = this.core.snapshot();
      const queries = snapshot.prefixQueries - this.last.prefixQueries;
      const hits = snapshot.prefixHits - this.last.prefixHits;
      if (queries > 0 || hits > 0) metrics.addPrefixCache(queries, hits);
      const preemptions = snapshot.preemptions - this.last.preemptions;
      if (preemptions > 0) metrics.addPreemptions(preemptions);
      this.last = snapshot;
    }
    for (const job of touched) job.notify();
    // Back to back while there is work, as vLLM's engine core loop runs.
    this.runStep();
  }

  private finishedOf(state: SequenceState, at: number): FinishedSequence {
    const scheduledAt = state.scheduledAt ?? at;
    const firstTokenAt = state.firstTokenAt ?? at;
    return {
      finishedReason: state.finishedReason,
      promptTokens: state.promptTokens,
      generationTokens: state.job.generated[state.index] ?? 0,
      prefillKvComputedTokens: Math.max(0, state.promptTokens - (state.cachedTokens ?? 0)),
      queueSeconds: (scheduledAt - state.arrivedAt) / 1000,
      prefillSeconds: (firstTokenAt - scheduledAt) / 1000,
      decodeSeconds: (at - firstTokenAt) / 1000,
      inferenceSeconds: (at - scheduledAt) / 1000,
      e2eSeconds: (at - state.arrivedAt) / 1000,
    };
  }
}
