/**
 * Engine signals: what each upstream vLLM says about its own load (docs/routing.md, "Engine signals"). Other gateway replicas
 * and batch jobs load the same engines, so the gateway's own in-flight count is not the whole story.
 *
 * - {@link parseEngineMetrics} (engine-metrics.ts): a `/metrics` body to a few numbers. Pure.
 * - {@link EngineSignals}: per upstream, the latest valid signals and when they were read; fresh, stale or missing;
 *   restarts. Pure: time comes in as `now`.
 * - {@link SignalScraper}: the shell that reads `/metrics` on an interval. It owns the timer and nothing else.
 */
import { DEFAULT_PARSE_LIMITS, parseEngineMetrics, type EngineLoad, type IgnoredLines, type ParseLimits } from './engine-metrics.js';

export { DEFAULT_PARSE_LIMITS, PARSE_FAILURES, parseEngineMetrics, parseSampleValue } from './engine-metrics.js';
import type { RestartCause, ScrapeResultKind } from '../telemetry/labels.js';
export type { EngineLoad, IgnoredLines, KvMetric, ParseFailure, ParseLimits, ParseResult } from './engine-metrics.js';

/** How a scrape ended: a closed set (a metric label's values) of telemetry/labels.ts, which says what each means. */
export { SCRAPE_RESULTS } from '../telemetry/labels.js';
export type ScrapeFailure = Exclude<ScrapeResultKind, 'ok'>;

export type ScrapeResult =
  | { readonly ok: true; readonly signals: EngineLoad; readonly ignored: IgnoredLines }
  | { readonly ok: false; readonly reason: ScrapeFailure };

export interface SignalOptions {
  /** Scrapes are off: every upstream's state is `missing`. */
  readonly enabled: boolean;
  /** Time between rounds. */
  readonly intervalMs: number;
  /** A scrape with no whole answer by then is a `deadline` (and the read is expected to abort itself then too). */
  readonly timeoutMs: number;
  /** Signals older than this are `stale`: several missed scrapes, not one slow one. */
  readonly staleAfterMs: number;
  readonly limits: ParseLimits;
}

export const DEFAULT_SIGNAL_OPTIONS: SignalOptions = {
  enabled: true,
  intervalMs: 1_000,
  timeoutMs: 500,
  staleAfterMs: 5_000,
  limits: DEFAULT_PARSE_LIMITS,
};

export type SignalState = 'fresh' | 'stale' | 'missing';

/** Why a restart was inferred: the process start time changed, or a prefix-cache counter went down (telemetry/labels.ts). */
export type { RestartCause } from '../telemetry/labels.js';

/** One upstream's latest valid signals. */
export interface StoredSignals {
  readonly signals: EngineLoad;
  /** When they were read (the caller's clock). */
  readonly at: number;
}

interface Entry {
  latest: StoredSignals | undefined;
  /** The last scrape's failure, cleared by a success: for the status page and logs. */
  lastFailure: ScrapeFailure | undefined;
}

/**
 * Per upstream (by name), the latest valid signals. A failed scrape keeps the previous ones: they age into `stale`
 * rather than vanish, so one lost scrape does not make picking forget an engine's load.
 *
 * ```text
 *   missing ── valid scrape ──▶ fresh ── staleAfterMs without a valid one ──▶ stale
 *      ▲                          ▲                                            │
 *      └── forget (not listed) ── └──────────────── valid scrape ──────────────┘
 * ```
 */
export class EngineSignals {
  private readonly entries = new Map<string, Entry>();

  constructor(
    private readonly staleAfterMs: number,
    /**
     * The engine behind `upstream` restarted: its prefix cache is empty, so whatever the caller predicted about it
     * (a prefix index) should expire.
     */
    private readonly onRestart: (upstream: string, cause: RestartCause) => void = () => {},
  ) {}

  /** Records a scrape's result at `now`; answers whether it revealed a restart (also told to `onRestart`). */
  record(upstream: string, result: ScrapeResult, now: number): RestartCause | undefined {
    let entry = this.entries.get(upstream);
    if (entry === undefined) {
      entry = { latest: undefined, lastFailure: undefined };
      this.entries.set(upstream, entry);
    }
    if (!result.ok) {
      entry.lastFailure = result.reason;
      return undefined;
    }
    const cause = entry.latest === undefined ? undefined : restartCause(entry.latest.signals, result.signals);
    entry.latest = { signals: result.signals, at: now };
    entry.lastFailure = undefined;
    if (cause !== undefined) this.onRestart(upstream, cause);
    return cause;
  }

  state(upstream: string, now: number): SignalState {
    const latest = this.entries.get(upstream)?.latest;
    if (latest === undefined) return 'missing';
    return now - latest.at > this.staleAfterMs ? 'stale' : 'fresh';
  }

  /** The latest valid signals, fresh or not; undefined before the first. Check {@link state} before trusting them. */
  latest(upstream: string): StoredSignals | undefined {
    return this.entries.get(upstream)?.latest;
  }

  /** The latest valid signals if they are fresh at `now`. */
  fresh(upstream: string, now: number): EngineLoad | undefined {
    return this.state(upstream, now) === 'fresh' ? this.entries.get(upstream)?.latest?.signals : undefined;
  }

  lastFailure(upstream: string): ScrapeFailure | undefined {
    return this.entries.get(upstream)?.lastFailure;
  }

  /** Drops upstreams not in `names` (removed by a reload or discovery), so memory follows the configuration. */
  retain(names: ReadonlySet<string>): void {
    for (const name of this.entries.keys()) if (!names.has(name)) this.entries.delete(name);
  }
}

/**
 * A new start time is a restart. Without one (a build without the process collector), a prefix-cache counter going
 * down is one too: counters only reset with the process. Summed over data-parallel engines, one engine restarting
 * inside a running server shows here as well.
 */
export function restartCause(before: EngineLoad, after: EngineLoad): RestartCause | undefined {
  if (before.startTime !== undefined && after.startTime !== undefined && before.startTime !== after.startTime) return 'start_time';
  const down = (a: number | undefined, b: number | undefined) => a !== undefined && b !== undefined && b < a;
  if (down(before.prefixQueries, after.prefixQueries) || down(before.prefixHits, after.prefixHits)) return 'counter_reset';
  return undefined;
}

/** What the scraper needs of an upstream: its name (the key of its signals). */
export interface ScrapeTarget {
  readonly name: string;
}

/** Reads `/metrics` of an upstream; the wiring passes `(u, t) => u.get('/metrics', t, 'signals')`. */
export type MetricsRead<T> = (target: T, timeoutMs: number) => Promise<{ status: number; body: string }>;

export interface ScraperHooks {
  /** Every scrape's result, `busy` rounds included: for counting by reason. Must not throw (a throw is dropped). */
  onResult?(upstream: string, result: ScrapeResult): void;
}

/** Maps a read's error to a reason without importing the reader: `ReadStopped` carries `too_large` or `deadline`. */
export function readFailure(error: unknown): ScrapeFailure {
  const { reason, name, code } = (error ?? {}) as { reason?: unknown; name?: unknown; code?: unknown };
  if (reason === 'too_large') return 'too_large';
  if (reason === 'deadline' || name === 'AbortError' || name === 'TimeoutError') return 'deadline';
  if (code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT') return 'deadline';
  // Refused, reset, and a connect that timed out (a host that drops packets): the engine cannot be reached at all.
  return 'unreachable';
}

/** A parse of a 200 answer, or the read's failure, as one scrape result. */
export function scrapeResult(response: { status: number; body: string }, limits: ParseLimits): ScrapeResult {
  if (response.status !== 200) return { ok: false, reason: 'http_status' };
  const parsed = parseEngineMetrics(response.body, limits);
  return parsed.ok ? { ok: true, signals: parsed.signals, ignored: parsed.ignored } : { ok: false, reason: parsed.reason };
}

/**
 * Scrapes each listed upstream's `/metrics` every `intervalMs` into an {@link EngineSignals}. At most one scrape per
 * upstream is in flight: a slow `/metrics` makes later rounds skip it (`busy`) rather than pile reads onto an engine
 * that is already struggling. Nothing it does throws out of it.
 */
export class SignalScraper<T extends ScrapeTarget> {
  readonly options: SignalOptions;
  private timer: NodeJS.Timeout | undefined = undefined;
  private stopped = false;
  /** Upstream names with a read not yet settled (its result may already be reported: see {@link scrape}). */
  private readonly inFlight = new Set<string>();

  constructor(
    /** Asked every round, so reloads and discovery changes are seen without telling the scraper. */
    private readonly targets: () => readonly T[],
    private readonly read: MetricsRead<T>,
    readonly signals: EngineSignals,
    options: Partial<SignalOptions> = {},
    private readonly hooks: ScraperHooks = {},
    /** Monotonic milliseconds, the same clock the caller asks {@link EngineSignals.state} with. */
    private readonly now: () => number = () => performance.now(),
  ) {
    this.options = { ...DEFAULT_SIGNAL_OPTIONS, ...options };
    const { intervalMs, timeoutMs, staleAfterMs } = this.options;
    if (!(intervalMs > 0) || !(timeoutMs > 0) || !(staleAfterMs > 0)) throw new RangeError('intervalMs, timeoutMs and staleAfterMs must be > 0');
  }

  /** Starts the rounds (the first at once); a no-op when disabled or already started. */
  start(): void {
    if (!this.options.enabled || this.timer !== undefined || this.stopped) return;
    void this.round();
    // unref: scraping alone must not keep the process alive at shutdown.
    this.timer = setInterval(() => void this.round(), this.options.intervalMs).unref();
  }

  /** Stops the rounds; reads in flight finish (each bounded by its deadline), their results dropped. */
  stop(): void {
    this.stopped = true;
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
  }

  /** One round: scrapes every listed upstream not already being scraped; resolves when each has a result. */
  async round(): Promise<void> {
    if (this.stopped) return;
    let targets: readonly T[];
    try {
      targets = this.targets();
    } catch {
      return;
    }
    this.signals.retain(new Set(targets.map((t) => t.name)));
    await Promise.all(targets.map((target) => this.scrape(target)));
  }

  /**
   * Scrapes one upstream. Its result is reported at the read's end or at `timeoutMs`, whichever is first — a read
   * that ignores its deadline still counts as `deadline` on time — but the upstream stays in flight until the read
   * itself settles, so a hung `/metrics` never gets a second concurrent scrape.
   */
  private async scrape(target: T): Promise<void> {
    if (this.inFlight.has(target.name)) {
      this.report(target.name, { ok: false, reason: 'busy' });
      return;
    }
    this.inFlight.add(target.name);
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<ScrapeResult>((resolve) => {
      timer = setTimeout(() => resolve({ ok: false, reason: 'deadline' }), this.options.timeoutMs).unref();
    });
    const reading = this.readOnce(target).finally(() => this.inFlight.delete(target.name));
    const result = await Promise.race([reading, deadline]);
    clearTimeout(timer);
    this.report(target.name, result);
  }

  private async readOnce(target: T): Promise<ScrapeResult> {
    try {
      return scrapeResult(await this.read(target, this.options.timeoutMs), this.options.limits);
    } catch (error) {
      return { ok: false, reason: readFailure(error) };
    }
  }

  private report(upstream: string, result: ScrapeResult): void {
    if (this.stopped) return;
    try {
      this.signals.record(upstream, result, this.now());
    } catch {
      // An onRestart that throws must not stop the scraper; the signals are recorded before it is called.
    }
    try {
      this.hooks.onResult?.(upstream, result);
    } catch {
      // An observer cannot break scraping.
    }
  }
}
