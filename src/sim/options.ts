/** Simulator options: defaults, validation (every problem reported together), then frozen. */
import { FAULT_KINDS, isFaultKind, type FaultKind } from './faults.js';

export interface SimOptions {
  /** Served model names; the first also labels /metrics (vLLM labels with its first served name). */
  models: string[];
  /** Request → first output event; the role chunk goes out with the first token, like vLLM. */
  ttftMs: number;
  /**
   * Prefill: the first output event waits this much longer per 1 000 prompt tokens (the uncached part of the
   * prompt_tokens reported in usage), on top of ttftMs. vLLM's TTFT grows with the prompt the same way.
   */
  prefillMsPer1kTokens: number;
  /** Delay between output events. */
  itlMs: number;
  /** Tokens per choice, capped by max_tokens / max_completion_tokens (then finish_reason 'length'). */
  outputTokens: number;
  /** ± fraction applied to each delay, drawn from the seeded PRNG. */
  jitter: number;
  tokensPerEvent: number;
  /** With promptTokensDetails, usage carries prompt_tokens_details.cached_tokens = min(this, prompt_tokens). */
  cachedTokens: number;
  /** vLLM's --enable-prompt-tokens-details. */
  promptTokensDetails: boolean;
  /** vLLM's --enable-force-include-usage. */
  forceIncludeUsage: boolean;
  /**
   * vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1: /v1/responses keeps responses (`store`, default true) in memory,
   * `background` runs, `previous_response_id` continues a stored response, and GET /v1/responses/{id} and its
   * /cancel find them. Off: `store` is silently false and `background` is a 400, as in vLLM.
   */
  responsesStore: boolean;
  /** The embedding model's native dimension: the length of /v1/embeddings and /pooling vectors (`dimensions` cuts it). */
  embeddingDimensions: number;
  /** vLLM's --api-key: /v1/* then needs `Authorization: Bearer <key>`. */
  apiKey?: string;
  seed: number;
  /** Share of requests without an x-sim-fault header that get a random fault. */
  faultRate: number;
  /** Kinds random faults are drawn from, uniformly. */
  faultKinds: FaultKind[];
  /**
   * Share of chat and legacy completion answers without an x-sim-fault header and without a random fault that end
   * with finish_reason `length` (as if cut at max_tokens: a build that stops late, a changed chat template), their
   * token count unchanged. Drawn from its own seeded stream.
   */
  lengthRate: number;
  /**
   * The engine model (docs/simulator.md, "The engine model"): a prefix cache of KV blocks and a continuous-batching
   * scheduler decide when tokens exist, so TTFT, ITL and cached_tokens emerge from load, cache and prompt length.
   * Off: the timer of ttftMs, itlMs, prefillMsPer1kTokens and jitter (the programmatic default: scripted timings).
   */
  engineModel: boolean;
  /** vLLM's --block-size: tokens per KV block. */
  blockSize: number;
  /** KV capacity in blocks (vLLM's num_gpu_blocks, or --num-gpu-blocks-override). */
  kvBlocks: number;
  /** vLLM's --max-num-seqs. */
  maxNumSeqs: number;
  /** vLLM's --max-num-batched-tokens: the per-step token budget. */
  maxNumBatchedTokens: number;
  /** vLLM's --enable-prefix-caching (on by default in v1); --no-enable-prefix-caching turns it off. */
  enablePrefixCaching: boolean;
  /** The step cost model: step_ms = stepBaseMs + stepPrefillTokenMs × prefill tokens + stepDecodeSeqMs × decoding sequences. */
  stepBaseMs: number;
  stepPrefillTokenMs: number;
  stepDecodeSeqMs: number;
  /** vLLM's --kv-cache-metrics: the KV block residency histograms. */
  kvCacheMetrics: boolean;
  /** 'old': serve vLLM's pre-rename gpu_cache_usage_perc instead of kv_cache_usage_perc. */
  metricsCompat: 'current' | 'old';
  /** What GET /version reports as `version` (vLLM reports its release). */
  revision: string;
  /** Other clients' requests per second straight into the engine (Poisson); 0: none. Needs engineModel. */
  externalLoad: number;
  externalPromptTokens: number;
  externalOutputTokens: number;
  /** Restart the engine (cache emptied, counters reset, requests in flight cut) every this many ms; 0: never. */
  restartEveryMs: number;
}

/** What /version reports unless `revision` says otherwise. */
export const SIM_VERSION = 'waybill-sim';

export const DEFAULT_SIM_OPTIONS: Readonly<Omit<SimOptions, 'apiKey'>> = Object.freeze({
  models: ['sim-model'],
  ttftMs: 50,
  prefillMsPer1kTokens: 20,
  itlMs: 10,
  outputTokens: 32,
  jitter: 0.1,
  tokensPerEvent: 1,
  cachedTokens: 0,
  promptTokensDetails: false,
  forceIncludeUsage: false,
  responsesStore: false,
  embeddingDimensions: 8,
  seed: 1,
  faultRate: 0,
  faultKinds: [...FAULT_KINDS],
  lengthRate: 0,
  engineModel: false,
  blockSize: 16,
  kvBlocks: 8192,
  maxNumSeqs: 256,
  maxNumBatchedTokens: 2048,
  enablePrefixCaching: true,
  stepBaseMs: 8,
  stepPrefillTokenMs: 0.02,
  stepDecodeSeqMs: 0.02,
  kvCacheMetrics: false,
  metricsCompat: 'current',
  revision: SIM_VERSION,
  externalLoad: 0,
  externalPromptTokens: 512,
  externalOutputTokens: 128,
  restartEveryMs: 0,
});

export interface OptionProblem {
  readonly option: keyof SimOptions;
  readonly message: string;
}

export type ValidationResult =
  | { readonly ok: true; readonly options: Readonly<SimOptions> }
  | { readonly ok: false; readonly problems: readonly OptionProblem[] };

function isInt(value: number, min: number): boolean {
  return Number.isInteger(value) && value >= min;
}

/** Merge `partial` over the defaults and check every field; never throws. */
export function validateSimOptions(partial: Partial<SimOptions>): ValidationResult {
  const merged: SimOptions = { ...DEFAULT_SIM_OPTIONS, ...partial };
  const problems: OptionProblem[] = [];
  const problem = (option: keyof SimOptions, message: string): void => {
    problems.push({ option, message });
  };

  if (!Array.isArray(merged.models) || merged.models.length === 0) problem('models', 'needs at least one model name');
  else if (merged.models.some((m) => typeof m !== 'string' || m === '')) problem('models', 'names must be non-empty strings');
  else if (new Set(merged.models).size !== merged.models.length) problem('models', 'names must be unique');
  if (!(Number.isFinite(merged.ttftMs) && merged.ttftMs >= 0)) problem('ttftMs', 'must be a number >= 0');
  if (!(Number.isFinite(merged.prefillMsPer1kTokens) && merged.prefillMsPer1kTokens >= 0)) {
    problem('prefillMsPer1kTokens', 'must be a number >= 0');
  }
  if (!(Number.isFinite(merged.itlMs) && merged.itlMs >= 0)) problem('itlMs', 'must be a number >= 0');
  if (!isInt(merged.outputTokens, 1)) problem('outputTokens', 'must be an integer >= 1');
  if (!(merged.jitter >= 0 && merged.jitter <= 1)) problem('jitter', 'must be between 0 and 1');
  if (!isInt(merged.tokensPerEvent, 1)) problem('tokensPerEvent', 'must be an integer >= 1');
  if (!isInt(merged.cachedTokens, 0)) problem('cachedTokens', 'must be an integer >= 0');
  if (typeof merged.promptTokensDetails !== 'boolean') problem('promptTokensDetails', 'must be a boolean');
  if (typeof merged.forceIncludeUsage !== 'boolean') problem('forceIncludeUsage', 'must be a boolean');
  if (typeof merged.responsesStore !== 'boolean') problem('responsesStore', 'must be a boolean');
  if (!(isInt(merged.embeddingDimensions, 1) && merged.embeddingDimensions <= 65_536)) {
    problem('embeddingDimensions', 'must be an integer between 1 and 65536');
  }
  if (merged.apiKey !== undefined && (typeof merged.apiKey !== 'string' || merged.apiKey === '')) {
    problem('apiKey', 'must be a non-empty string');
  }
  if (!Number.isSafeInteger(merged.seed)) problem('seed', 'must be an integer');
  if (!(merged.faultRate >= 0 && merged.faultRate <= 1)) problem('faultRate', 'must be between 0 and 1');
  if (!(merged.lengthRate >= 0 && merged.lengthRate <= 1)) problem('lengthRate', 'must be between 0 and 1');
  if (!Array.isArray(merged.faultKinds) || merged.faultKinds.length === 0) {
    problem('faultKinds', 'needs at least one fault kind');
  } else {
    const unknown = merged.faultKinds.filter((k) => !isFaultKind(k));
    if (unknown.length > 0) problem('faultKinds', `unknown kind(s) ${unknown.join(', ')}; known: ${FAULT_KINDS.join(', ')}`);
  }

  if (typeof merged.engineModel !== 'boolean') problem('engineModel', 'must be a boolean');
  if (!(isInt(merged.blockSize, 1) && merged.blockSize <= 1024)) problem('blockSize', 'must be an integer between 1 and 1024');
  if (!(isInt(merged.kvBlocks, 1) && merged.kvBlocks <= 16_777_216)) problem('kvBlocks', 'must be an integer between 1 and 16777216');
  if (!(isInt(merged.maxNumSeqs, 1) && merged.maxNumSeqs <= 65_536)) problem('maxNumSeqs', 'must be an integer between 1 and 65536');
  if (!(isInt(merged.maxNumBatchedTokens, 1) && merged.maxNumBatchedTokens <= 1_048_576)) {
    problem('maxNumBatchedTokens', 'must be an integer between 1 and 1048576');
  }
  if (typeof merged.enablePrefixCaching !== 'boolean') problem('enablePrefixCaching', 'must be a boolean');
  for (const key of ['stepBaseMs', 'stepPrefillTokenMs', 'stepDecodeSeqMs'] as const) {
    if (!(Number.isFinite(merged[key]) && merged[key] >= 0 && merged[key] <= 60_000)) problem(key, 'must be a number between 0 and 60000');
  }
  if (merged.engineModel && merged.stepBaseMs + merged.stepPrefillTokenMs + merged.stepDecodeSeqMs <= 0) {
    problem('stepBaseMs', 'the step cost model needs a cost above 0, or the engine would spin');
  }
  if (typeof merged.kvCacheMetrics !== 'boolean') problem('kvCacheMetrics', 'must be a boolean');
  if (merged.metricsCompat !== 'current' && merged.metricsCompat !== 'old') problem('metricsCompat', "must be 'current' or 'old'");
  if (typeof merged.revision !== 'string' || merged.revision === '' || merged.revision.length > 128) {
    problem('revision', 'must be a non-empty string of at most 128 characters');
  }
  if (!(Number.isFinite(merged.externalLoad) && merged.externalLoad >= 0 && merged.externalLoad <= 10_000)) {
    problem('externalLoad', 'must be a number of requests per second between 0 and 10000');
  }
  if (merged.externalLoad > 0 && !merged.engineModel) problem('externalLoad', 'needs the engine model (engineModel)');
  if (!(isInt(merged.externalPromptTokens, 1) && merged.externalPromptTokens < 131_072)) problem('externalPromptTokens', 'must be an integer between 1 and 131071');
  if (!(isInt(merged.externalOutputTokens, 1) && merged.externalOutputTokens <= 65_536)) problem('externalOutputTokens', 'must be an integer between 1 and 65536');
  // setInterval clamps what it cannot hold (below 1 ms, above 2^31 − 1) to 1 ms: a restart every millisecond.
  if (!(merged.restartEveryMs === 0 || (Number.isFinite(merged.restartEveryMs) && merged.restartEveryMs >= 1 && merged.restartEveryMs <= 2_147_483_647))) {
    problem('restartEveryMs', 'must be 0 (never) or between 1 ms and 2147483647 ms (about 24.8 days)');
  }
  if (merged.engineModel && merged.externalLoad > 0 && Math.ceil((merged.externalPromptTokens + merged.externalOutputTokens - 1) / merged.blockSize) > merged.kvBlocks) {
    problem('externalPromptTokens', `other clients' requests (prompt + output) need more KV blocks than kvBlocks (${merged.kvBlocks} of ${merged.blockSize} tokens)`);
  }

  if (problems.length > 0) return { ok: false, problems };
  return {
    ok: true,
    options: Object.freeze({ ...merged, models: [...merged.models], faultKinds: [...merged.faultKinds] }),
  };
}

/** Like validateSimOptions, but throws one TypeError listing every problem. */
export function resolveSimOptions(partial: Partial<SimOptions>): Readonly<SimOptions> {
  const result = validateSimOptions(partial);
  if (result.ok) return result.options;
  throw new TypeError(`Invalid simulator options: ${result.problems.map((p) => `${p.option} ${p.message}`).join('; ')}`);
}
