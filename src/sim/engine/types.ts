/**
 * The contract of the simulated vLLM engine's pure core (src/sim/engine/core.ts): a prefix cache of full KV blocks and
 * a continuous-batching scheduler, stepped by a caller that owns the clock (src/sim/engine/runtime.ts). Pure and
 * deterministic: no timers, no I/O, no randomness; the same calls give the same results. Every rule it models cites
 * vLLM's source in docs/simulator.md.
 */

/** One linear cost model for a step: `baseMs + prefillTokenMs × tokens prefilled + decodeSeqMs × sequences decoded`. */
export interface StepCost {
  readonly baseMs: number;
  readonly prefillTokenMs: number;
  readonly decodeSeqMs: number;
}

export interface EngineConfig {
  /** Tokens per KV block (vLLM's --block-size). */
  readonly blockSize: number;
  /** KV capacity in blocks (what vLLM computes from GPU memory as num_gpu_blocks). */
  readonly kvBlocks: number;
  /** Sequences running at once (vLLM's --max-num-seqs). */
  readonly maxNumSeqs: number;
  /** Tokens scheduled per step, prefill and decode together (vLLM's --max-num-batched-tokens). */
  readonly maxNumBatchedTokens: number;
  /** vLLM's --enable-prefix-caching (on by default in v1). */
  readonly enablePrefixCaching: boolean;
  readonly cost: StepCost;
}

/** A sequence submitted to the engine: one choice of one prompt (vLLM fans n > 1 out into child requests). */
export interface SequenceSpec {
  /** Unique among the engine's live sequences. */
  readonly id: string;
  /** The prompt's token ids (at least one). */
  readonly promptTokenIds: readonly number[];
  /** Tokens to generate before it finishes (>= 1). */
  readonly outputTokens: number;
  /** Folded into the first block's hash, as vLLM folds a request's cache_salt (and LoRA name) into extra keys. */
  readonly cacheSalt?: string;
}

/** What one step did, for the runtime to deliver when the step's time has passed and for metrics. */
export interface StepResult {
  /** The step's duration by the cost model; 0 never happens for a step that scheduled anything. */
  readonly durationMs: number;
  /** Uncached prompt tokens computed this step (chunked prefill included). */
  readonly prefillTokens: number;
  /** Sequences that decoded one token this step. */
  readonly decodeSeqs: number;
  /**
   * Sequences scheduled for the first time (or again after preemption) this step, with their prefix-cache hit:
   * the prompt tokens found in cached full blocks (vLLM's num_computed_tokens from get_computed_blocks).
   */
  readonly admitted: ReadonlyArray<{ readonly id: string; readonly cachedTokens: number; readonly resumed: boolean }>;
  /** Sequences that produced output tokens this step (the first one ends prefill), and how many in total so far. */
  readonly tokens: ReadonlyArray<{ readonly id: string; readonly generated: number }>;
  /** Sequences that generated their last token this step (their blocks are freed, cached blocks stay cached). */
  readonly finished: readonly string[];
  /** Sequences preempted this step (blocks freed, back at the head of the waiting queue, recomputed later). */
  readonly preempted: readonly string[];
}

/** The engine's state for vLLM's gauges and counters. Counters are monotonic until `reset` (a restart). */
export interface EngineSnapshot {
  readonly running: number;
  readonly waiting: number;
  /** Used KV blocks / kvBlocks, in [0, 1] (vLLM's kv_cache_usage_perc is this fraction, not a percentage). */
  readonly kvUsage: number;
  readonly freeBlocks: number;
  /** Blocks holding a cached hash (used or free): what a prefix can still hit. */
  readonly cachedBlocks: number;
  /** Prompt tokens looked up in the prefix cache, and how many of them hit (vLLM's prefix_cache_queries/hits). */
  readonly prefixQueries: number;
  readonly prefixHits: number;
  readonly preemptions: number;
}

export interface EngineCore {
  /** Queue a sequence (FIFO). Throws on a duplicate id or a prompt longer than the KV capacity can ever hold. */
  add(spec: SequenceSpec): void;
  /** Remove a sequence wherever it is (the client left): its blocks are freed; unknown ids are ignored. */
  abort(id: string): void;
  /** True when a step would schedule something. */
  hasWork(): boolean;
  /** Schedule and run one step; null when nothing could be scheduled. */
  step(): StepResult | null;
  snapshot(): EngineSnapshot;
  /** An engine restart: every sequence dropped, the cache emptied, counters zeroed. */
  reset(): void;
}
