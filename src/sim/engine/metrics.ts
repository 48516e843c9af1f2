/**
 * The simulated engine's `/metrics`: a per-engine recorder (counters, hand-rolled fixed-bucket histograms) and a
 * renderer of the Prometheus text exposition laid out exactly as vLLM v1 serves it through prometheus_client's
 * `generate_latest` — `# HELP`/`# TYPE` per family, Python float spelling (`1.0`, `1e+06`, `1.76e+09`), counters as
 * `<name>_total`, histograms as cumulative `_bucket{le}` then `_count` then `_sum`, labels sorted by name, and the
 * `<name>_created` gauge family prometheus_client appends after every counter and histogram (vLLM does not turn it
 * off). Names, documentation strings, label names and buckets are vLLM's own (vllm/v1/metrics/loggers.py
 * PrometheusStatLogger); docs/simulator-metrics.md cites each one and lists what the simulator does not serve.
 *
 * Pure: no clock, no I/O. The caller (the engine runtime) owns time and passes every duration in seconds. The
 * exposition itself (buckets, Python's number spelling, families, rendering) is exposition.ts.
 *
 * Longer than 400 lines on purpose: EngineMetrics is every family vLLM's PrometheusStatLogger serves, in its order, with its
 * names and help strings — the one list docs/simulator-metrics.md follows; split, it would no longer read as that list.
 */
import {
  FixedHistogram,
  ITL_BUCKETS,
  KV_RESIDENCY_BUCKETS,
  type Labels,
  type MetricFamily,
  REQUEST_LATENCY_BUCKETS,
  type Sample,
  TTFT_BUCKETS,
  build125Buckets,
  checkAmount,
  checkObservation,
  formatValue,
  renderFamilies,
} from './exposition.js';

/** The exposition's pieces, for the tests and callers that read them from here. */
export * from './exposition.js';

/**
 * vLLM's FinishReason, in enum order (vllm/v1/engine/__init__.py FINISH_REASON_STRINGS). PrometheusStatLogger
 * creates a `request_success` child for every member up front, so every reason is served from the start at 0.
 */
export const FINISH_REASONS = ['stop', 'length', 'abort', 'error', 'repetition'] as const;
export type FinishReason = (typeof FINISH_REASONS)[number];

export interface EngineMetricsOptions {
  /** The first served model name (vLLM labels metrics with model_config.served_model_name). */
  modelName: string;
  /** The engine's data-parallel index; the `engine` label is its decimal string. */
  engineIndex: number;
  /** --block-size, rendered into vllm:cache_config_info. */
  blockSize: number;
  /** --enable-prefix-caching, rendered into vllm:cache_config_info as Python's `True`/`False`. */
  enablePrefixCaching: boolean;
  /** --max-model-len: the token-count histograms' buckets are 1-2-5 steps up to it. */
  maxModelLen: number;
  /** vLLM's --kv-cache-metrics (observability_config.kv_cache_metrics): serve the KV block residency histograms. */
  kvCacheMetrics: boolean;
  /** 'current': today's names; 'old': a vLLM from before the 0.9/0.11 renames (see OLD_NAMES below). */
  compat: 'current' | 'old';
  /** Unix seconds the simulated vLLM process started: process_start_time_seconds and every `_created` value. */
  startTimeSeconds: number;
  /** KV capacity in blocks (vLLM's num_gpu_blocks) for vllm:cache_config_info; rendered `None` when not given. */
  numGpuBlocks?: number;
}

/** What vLLM's FinishedRequestStats carries for the per-request histograms, in tokens and seconds. */
export interface FinishedRequest {
  finishedReason: FinishReason;
  promptTokens: number;
  generationTokens: number;
  /** Prompt tokens the engine computed, not found in the prefix cache (num_prompt_tokens − num_cached_tokens). */
  prefillKvComputedTokens: number;
  /** First QUEUED → first SCHEDULED. */
  queueSeconds: number;
  /** First SCHEDULED → first token (preemptions during prefill included). */
  prefillSeconds: number;
  /** First token → last token. */
  decodeSeconds: number;
  /** First SCHEDULED → last token. */
  inferenceSeconds: number;
  /** Arrival → finish. */
  e2eSeconds: number;
}

/** One sampled block's eviction, as vLLM's KV cache eviction event carries it (seconds). */
export interface BlockResidency {
  /** Allocation → eviction. */
  lifetimeSeconds: number;
  /** Last access → eviction. */
  idleSeconds: number;
  /** Gaps between consecutive accesses (vLLM keeps the most recent ones in a ring buffer). */
  reuseGapsSeconds: readonly number[];
}

export interface EngineGauges {
  running: number;
  waiting: number;
  /** Used KV blocks / capacity, a fraction in [0, 1] (not a percentage, despite the name). */
  kvUsage: number;
}

/** The names 'old' serves instead of today's (families vLLM added after the renames are left out in families()). */
const OLD_NAMES = {
  kvUsage: 'vllm:gpu_cache_usage_perc',
  prefixQueries: 'vllm:gpu_prefix_cache_queries',
  prefixHits: 'vllm:gpu_prefix_cache_hits',
  itl: 'vllm:time_per_output_token_seconds',
} as const;

interface HistogramSpec {
  readonly name: string;
  readonly help: string;
  readonly histogram: FixedHistogram;
}

export class EngineMetrics {
  private readonly options: EngineMetricsOptions;
  private readonly labels: Labels;
  private startTime: number;

  private promptTokens = 0;
  private generationTokens = 0;
  private prefixQueries = 0;
  private prefixHits = 0;
  private preemptions = 0;
  private readonly success = new Map<FinishReason, number>();

  private readonly promptTokensHist: FixedHistogram;
  private readonly generationTokensHist: FixedHistogram;
  private readonly prefillKvComputedHist: FixedHistogram;
  private readonly ttft = new FixedHistogram(TTFT_BUCKETS);
  private readonly itl = new FixedHistogram(ITL_BUCKETS);
  private readonly tpot = new FixedHistogram(ITL_BUCKETS);
  private readonly e2e = new FixedHistogram(REQUEST_LATENCY_BUCKETS);
  private readonly queue = new FixedHistogram(REQUEST_LATENCY_BUCKETS);
  private readonly inference = new FixedHistogram(REQUEST_LATENCY_BUCKETS);
  private readonly prefill = new FixedHistogram(REQUEST_LATENCY_BUCKETS);
  private readonly decode = new FixedHistogram(REQUEST_LATENCY_BUCKETS);
  private readonly blockLifetime = new FixedHistogram(KV_RESIDENCY_BUCKETS);
  private readonly blockIdle = new FixedHistogram(KV_RESIDENCY_BUCKETS);
  private readonly blockReuseGap = new FixedHistogram(KV_RESIDENCY_BUCKETS);

  constructor(options: EngineMetricsOptions) {
    if (!Number.isInteger(options.engineIndex) || options.engineIndex < 0) {
      throw new RangeError(`engineIndex: expected an integer >= 0, got ${options.engineIndex}`);
    }
    if (!Number.isInteger(options.maxModelLen) || options.maxModelLen < 1) {
      throw new RangeError(`maxModelLen: expected an integer >= 1, got ${options.maxModelLen}`);
    }
    checkAmount('startTimeSeconds', options.startTimeSeconds);
    this.options = { ...options };
    this.labels = { model_name: options.modelName, engine: String(options.engineIndex) };
    this.startTime = options.startTimeSeconds;
    const tokenBuckets = build125Buckets(options.maxModelLen);
    this.promptTokensHist = new FixedHistogram(tokenBuckets);
    this.generationTokensHist = new FixedHistogram(tokenBuckets);
    this.prefillKvComputedHist = new FixedHistogram(tokenBuckets);
    for (const reason of FINISH_REASONS) this.success.set(reason, 0);
  }

  get startTimeSeconds(): number {
    return this.startTime;
  }

  /**
   * vllm:prompt_tokens: vLLM adds a request's whole prompt length (cached tokens included) in the iteration that
   * produces its first token (IterationStats.update_from_output, `if is_prefilling: num_prompt_tokens += prompt_len`),
   * not the tokens computed per chunk. A preempted request that prefills again is counted again.
   */
  addPromptTokens(n: number): void {
    checkAmount('addPromptTokens', n);
    this.promptTokens += n;
  }

  /** vllm:generation_tokens: every token produced, counted in the iteration that produced it. */
  addGenerationTokens(n: number): void {
    checkAmount('addGenerationTokens', n);
    this.generationTokens += n;
  }

  /**
   * vllm:prefix_cache_queries / _hits, in tokens: a newly scheduled request's tokens looked up and the ones found in
   * cached blocks. Call it for first admissions only: vLLM's PrefixCacheStats.record books a previously preempted
   * request's lookup as preempted_queries/preempted_hits, which no Prometheus series serves.
   */
  addPrefixCache(queries: number, hits: number): void {
    checkAmount('addPrefixCache queries', queries);
    checkAmount('addPrefixCache hits', hits);
    if (hits > queries) throw new RangeError(`addPrefixCache: hits ${hits} exceed queries ${queries}`);
    this.prefixQueries += queries;
    this.prefixHits += hits;
  }

  addPreemptions(n: number): void {
    checkAmount('addPreemptions', n);
    this.preemptions += n;
  }

  /** Arrival → first token, once per request (vLLM observes it when the prefill's token comes out). */
  observeTtft(seconds: number): void {
    checkObservation('observeTtft', seconds);
    this.ttft.observe(seconds);
  }

  /** The interval before each later token of a request (vLLM: this output's timestamp − the previous one's). */
  observeItl(seconds: number): void {
    checkObservation('observeItl', seconds);
    this.itl.observe(seconds);
  }

  /** A request finished (any reason, aborts included): request_success and every per-request histogram. */
  observeFinished(f: FinishedRequest): void {
    if (!this.success.has(f.finishedReason)) {
      throw new RangeError(`observeFinished: unknown finished reason ${JSON.stringify(f.finishedReason)}`);
    }
    for (const [what, v] of Object.entries(f)) {
      if (typeof v === 'number') checkObservation(`observeFinished ${what}`, v);
    }
    this.success.set(f.finishedReason, (this.success.get(f.finishedReason) ?? 0) + 1);
    this.e2e.observe(f.e2eSeconds);
    this.queue.observe(f.queueSeconds);
    this.prefill.observe(f.prefillSeconds);
    this.inference.observe(f.inferenceSeconds);
    this.decode.observe(f.decodeSeconds);
    this.prefillKvComputedHist.observe(f.prefillKvComputedTokens);
    this.promptTokensHist.observe(f.promptTokens);
    this.generationTokensHist.observe(f.generationTokens);
    this.tpot.observe(meanTimePerOutputToken(f.decodeSeconds, f.generationTokens));
  }

  /**
   * One sampled block's eviction (vLLM's KV cache eviction event): its lifetime, its idle tail and each reuse gap.
   * A no-op unless kvCacheMetrics, as vLLM drops the events when --kv-cache-metrics is off.
   */
  observeBlockResidency(event: BlockResidency): void {
    if (!this.options.kvCacheMetrics) return;
    checkObservation('observeBlockResidency lifetimeSeconds', event.lifetimeSeconds);
    checkObservation('observeBlockResidency idleSeconds', event.idleSeconds);
    for (const gap of event.reuseGapsSeconds) checkObservation('observeBlockResidency reuse gap', gap);
    this.blockLifetime.observe(event.lifetimeSeconds);
    this.blockIdle.observe(event.idleSeconds);
    for (const gap of event.reuseGapsSeconds) this.blockReuseGap.observe(gap);
  }

  /** An engine restart (a new vLLM process): counters and histograms at zero, a new start time. */
  reset(startTimeSeconds: number): void {
    checkAmount('reset startTimeSeconds', startTimeSeconds);
    this.startTime = startTimeSeconds;
    this.promptTokens = 0;
    this.generationTokens = 0;
    this.prefixQueries = 0;
    this.prefixHits = 0;
    this.preemptions = 0;
    for (const reason of FINISH_REASONS) this.success.set(reason, 0);
    for (const h of this.allHistograms()) h.reset();
  }

  /** This engine's families, in vLLM's registration order (the order its /metrics lists them). */
  families(gauges: EngineGauges): MetricFamily[] {
    checkObservation('gauges.running', gauges.running);
    checkObservation('gauges.waiting', gauges.waiting);
    checkObservation('gauges.kvUsage', gauges.kvUsage);
    const old = this.options.compat === 'old';
    const out: MetricFamily[] = [
      this.gauge('vllm:num_requests_running', 'Number of requests in model execution batches.', gauges.running),
      this.gauge('vllm:num_requests_waiting', 'Number of requests waiting to be processed.', gauges.waiting),
    ];
    if (old) {
      out.push(
        this.gauge(OLD_NAMES.kvUsage, 'GPU KV-cache usage. 1 means 100 percent usage.', gauges.kvUsage),
        this.counter(OLD_NAMES.prefixQueries, 'GPU prefix cache queries, in terms of number of queried blocks.', this.prefixQueries),
        this.counter(OLD_NAMES.prefixHits, 'GPU prefix cache hits, in terms of number of cached blocks.', this.prefixHits),
      );
    } else {
      out.push(
        this.sleepState(),
        this.gauge('vllm:kv_cache_usage_perc', 'KV-cache usage. 1 means 100 percent usage.', gauges.kvUsage),
        this.counter('vllm:prefix_cache_queries', 'Prefix cache queries, in terms of number of queried tokens.', this.prefixQueries),
        this.counter('vllm:prefix_cache_hits', 'Prefix cache hits, in terms of number of cached tokens.', this.prefixHits),
      );
    }
    out.push(
      this.counter('vllm:num_preemptions', 'Cumulative number of preemption from the engine.', this.preemptions),
      this.counter('vllm:prompt_tokens', 'Number of prefill tokens processed.', this.promptTokens),
      this.counter('vllm:generation_tokens', 'Number of generation tokens processed.', this.generationTokens),
      this.requestSuccess(),
    );
    for (const spec of this.histograms()) out.push(this.histogramFamily(spec));
    if (this.options.kvCacheMetrics && !old) {
      for (const spec of this.residencyHistograms()) out.push(this.histogramFamily(spec));
    }
    out.push(this.cacheConfigInfo());
    return out;
  }

  /** The whole exposition for this engine alone (renderEngines serves several engines in one process). */
  render(gauges: EngineGauges): string {
    return renderEngines([{ metrics: this, gauges }]);
  }

  /** Every histogram, served or not in this compat mode, so a reset misses none. */
  private allHistograms(): FixedHistogram[] {
    return [
      this.promptTokensHist, this.generationTokensHist, this.prefillKvComputedHist, this.ttft, this.itl, this.tpot,
      this.e2e, this.queue, this.inference, this.prefill, this.decode, this.blockLifetime, this.blockIdle,
      this.blockReuseGap,
    ];
  }

  /** The per-request and per-token histograms, in vLLM's registration order for the compat mode. */
  private histograms(): HistogramSpec[] {
    const old = this.options.compat === 'old';
    const specs: HistogramSpec[] = [
      { name: 'vllm:request_prompt_tokens', help: 'Number of prefill tokens processed.', histogram: this.promptTokensHist },
      { name: 'vllm:request_generation_tokens', help: 'Number of generation tokens processed.', histogram: this.generationTokensHist },
      { name: 'vllm:time_to_first_token_seconds', help: 'Histogram of time to first token in seconds.', histogram: this.ttft },
    ];
    if (old) {
      specs.push({ name: OLD_NAMES.itl, help: 'Histogram of time per output token in seconds.', histogram: this.itl });
    } else {
      specs.push(
        { name: 'vllm:inter_token_latency_seconds', help: 'Histogram of inter-token latency in seconds.', histogram: this.itl },
        { name: 'vllm:request_time_per_output_token_seconds', help: 'Histogram of time_per_output_token_seconds per request.', histogram: this.tpot },
      );
    }
    specs.push(
      { name: 'vllm:e2e_request_latency_seconds', help: 'Histogram of e2e request latency in seconds.', histogram: this.e2e },
      { name: 'vllm:request_queue_time_seconds', help: 'Histogram of time spent in WAITING phase for request.', histogram: this.queue },
      { name: 'vllm:request_inference_time_seconds', help: 'Histogram of time spent in RUNNING phase for request.', histogram: this.inference },
      { name: 'vllm:request_prefill_time_seconds', help: 'Histogram of time spent in PREFILL phase for request.', histogram: this.prefill },
      { name: 'vllm:request_decode_time_seconds', help: 'Histogram of time spent in DECODE phase for request.', histogram: this.decode },
    );
    if (!old) {
      specs.push({
        name: 'vllm:request_prefill_kv_computed_tokens',
        help: 'Histogram of new KV tokens computed during prefill (excluding cached tokens).',
        histogram: this.prefillKvComputedHist,
      });
    }
    return specs;
  }

  private residencyHistograms(): HistogramSpec[] {
    return [
      {
        name: 'vllm:kv_block_lifetime_seconds',
        help: 'Histogram of KV cache block lifetime from allocation to eviction. Sampled metrics (controlled by --kv-cache-metrics-sample).',
        histogram: this.blockLifetime,
      },
      {
        name: 'vllm:kv_block_idle_before_evict_seconds',
        help: 'Histogram of idle time before KV cache block eviction. Sampled metrics (controlled by --kv-cache-metrics-sample).',
        histogram: this.blockIdle,
      },
      {
        name: 'vllm:kv_block_reuse_gap_seconds',
        help:
          'Histogram of time gaps between consecutive KV cache block accesses. Only the most recent accesses are ' +
          'recorded (ring buffer). Sampled metrics (controlled by --kv-cache-metrics-sample).',
        histogram: this.blockReuseGap,
      },
    ];
  }

  private gauge(name: string, help: string, value: number): MetricFamily {
    return { name, type: 'gauge', help, samples: [{ name, labels: this.labels, value }], created: [] };
  }

  private counter(name: string, help: string, value: number): MetricFamily {
    return {
      name,
      type: 'counter',
      help,
      samples: [{ name: `${name}_total`, labels: this.labels, value }],
      created: [{ name: `${name}_created`, labels: this.labels, value: this.startTime }],
    };
  }

  private requestSuccess(): MetricFamily {
    const name = 'vllm:request_success';
    const withReason = (reason: FinishReason): Labels => ({ ...this.labels, finished_reason: reason });
    return {
      name,
      type: 'counter',
      help: 'Count of successfully processed requests.',
      samples: FINISH_REASONS.map((r) => ({ name: `${name}_total`, labels: withReason(r), value: this.success.get(r) ?? 0 })),
      created: FINISH_REASONS.map((r) => ({ name: `${name}_created`, labels: withReason(r), value: this.startTime })),
    };
  }

  /** vllm:engine_sleep_state: the simulator never sleeps, so awake = 1 and both sleep levels 0. */
  private sleepState(): MetricFamily {
    const name = 'vllm:engine_sleep_state';
    const states: ReadonlyArray<readonly [string, number]> = [['awake', 1], ['weights_offloaded', 0], ['discard_all', 0]];
    return {
      name,
      type: 'gauge',
      help:
        'Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; ' +
        'weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.',
      samples: states.map(([state, value]) => ({ name, labels: { ...this.labels, sleep_state: state }, value })),
      created: [],
    };
  }

  private histogramFamily(spec: HistogramSpec): MetricFamily {
    const { name, histogram } = spec;
    const cumulative = histogram.cumulative();
    const bounds = [...histogram.bounds, Infinity];
    const samples: Sample[] = bounds.map((bound, i) => ({
      name: `${name}_bucket`,
      labels: { ...this.labels, le: formatValue(bound) },
      value: cumulative[i] ?? 0,
    }));
    samples.push({ name: `${name}_count`, labels: this.labels, value: histogram.count });
    samples.push({ name: `${name}_sum`, labels: this.labels, value: histogram.sum });
    return {
      name,
      type: 'histogram',
      help: spec.help,
      samples,
      created: [{ name: `${name}_created`, labels: this.labels, value: this.startTime }],
    };
  }

  /**
   * vllm:cache_config_info: an info-style gauge at 1 whose labels are CacheConfig.metrics_info() — every CacheConfig
   * field as Python's str() — plus `engine` ('current' only: older vLLM had no engine label). No model_name: vLLM
   * builds its label names from the config alone. The simulator's values are vLLM's defaults except the ones it models.
   */
  private cacheConfigInfo(): MetricFamily {
    const name = 'vllm:cache_config_info';
    const config = cacheConfigLabels(this.options);
    const labels: Labels = this.options.compat === 'old' ? config : { ...config, engine: String(this.options.engineIndex) };
    return {
      name,
      type: 'gauge',
      help: 'Information of the LLMEngine CacheConfig',
      samples: [{ name, labels, value: 1 }],
      created: [],
    };
  }
}

/** vLLM's mean_time_per_output_token: decode time over the tokens after the first, 0 for a one-token answer. */
export function meanTimePerOutputToken(decodeSeconds: number, generationTokens: number): number {
  return generationTokens - 1 > 0 ? decodeSeconds / (generationTokens - 1) : 0;
}

/** Python's str() of a bool. */
function pyBool(b: boolean): string {
  return b ? 'True' : 'False';
}

/**
 * CacheConfig's fields as metrics_info() stringifies them (vllm/config/cache.py): the modelled ones from the options,
 * the rest at vLLM's defaults (`None` for unset optionals). num_cpu_blocks is 0 after vLLM's KV profiling.
 */
export function cacheConfigLabels(options: EngineMetricsOptions): Record<string, string> {
  return {
    block_size: String(options.blockSize),
    gpu_memory_utilization: '0.9',
    swap_space: '4',
    cache_dtype: 'auto',
    is_attention_free: 'False',
    num_gpu_blocks_override: 'None',
    sliding_window: 'None',
    enable_prefix_caching: pyBool(options.enablePrefixCaching),
    prefix_caching_hash_algo: 'sha256',
    cpu_offload_gb: '0',
    calculate_kv_scales: 'False',
    cpu_kvcache_space_bytes: 'None',
    mamba_page_size_padded: 'None',
    mamba_block_size: 'None',
    mamba_cache_dtype: 'auto',
    mamba_ssm_cache_dtype: 'auto',
    num_gpu_blocks: options.numGpuBlocks === undefined ? 'None' : String(options.numGpuBlocks),
    num_cpu_blocks: '0',
    kv_sharing_fast_prefill: 'False',
    kv_cache_memory_bytes: 'None',
    kv_offloading_size: 'None',
    kv_offloading_backend: 'None',
  };
}

const PROCESS_START_HELP = 'Start time of the process since unix epoch in seconds.';

/**
 * The exposition of one simulated vLLM process serving one or more engines (data parallel): prometheus_client's
 * process collector first (it registers before vLLM's metrics), then vLLM's families with every engine's child
 * under one HELP/TYPE. The process start time is the first engine's: one process, one start.
 */
export function renderEngines(engines: ReadonlyArray<{ metrics: EngineMetrics; gauges: EngineGauges }>): string {
  const first = engines[0];
  if (first === undefined) return '';
  const process: MetricFamily = {
    name: 'process_start_time_seconds',
    type: 'gauge',
    help: PROCESS_START_HELP,
    samples: [{ name: 'process_start_time_seconds', labels: {}, value: first.metrics.startTimeSeconds }],
    created: [],
  };
  return renderFamilies([[process], ...engines.map(({ metrics, gauges }) => metrics.families(gauges))]);
}
