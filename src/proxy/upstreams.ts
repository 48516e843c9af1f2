/**
 * Upstream pools: which upstreams serve which model, active health and model discovery, passive health (ejection),
 * and the pick; each upstream's connections and own reads are upstream.ts's.
 *
 * Longer than 400 lines on purpose: UpstreamRegistry is one object, a generation's view of its upstreams, whose
 * health, discovery and picking read and write the same maps; a split would pass those maps between files.
 */
import { Upstream } from './upstream.js';
import type { Logger } from 'pino';
import type { AttemptRecord } from '../accounting/ledger.js';
import type { AdmissionConfig, Config, PoolConfig } from '../config/load.js';

export { ReadStopped, Upstream } from './upstream.js';
import { OTHER, UNKNOWN_REVISION, type EjectionReason, type OwnRead, type ReadStopReason } from '../accounting/outcomes.js';
import { REVISION, RevisionLabels } from './revision-labels.js';
import { AdmissionGate } from './admission.js';
import { ModelLabels } from './model-labels.js';
import type { BreakerState, SendTicket } from './breaker.js';
import { EngineSignals, SignalScraper, type RestartCause, type ScrapeResult } from '../routing/engine-signals.js';
import { NO_ROUTING_KEY, PoolRouter, type FreshSignals, type Pick, type RoutingKey } from '../routing/router.js';
import { RetryBudget } from '../delivery/retry-budget.js';
import { healthVerdict } from '../delivery/retry-policy.js';

export interface ServedPool {
  readonly config: PoolConfig;
  readonly upstreams: readonly Upstream[];
  models: readonly string[];
  /** Configured models, or a discovery of this pool has read an upstream's model list at least once. */
  discovered: boolean;
  /**
   * Discovery of this pool is no longer pending (see {@link UpstreamRegistry.discoveryPending}): it read a list, an
   * upstream answered `/v1/models` with something that is not one (401, 404, a body that is not a list), or
   * {@link DISCOVERY_PENDING_ROUNDS} rounds found no upstream answering at all.
   */
  settled: boolean;
  /** Discovery rounds of this pool in which no upstream answered (counted until it is settled). */
  unansweredRounds: number;
}

/**
 * Rounds (the first at start, then one per discovery.refresh_interval) in which no upstream of a discovering pool
 * answers `/v1/models` before an unknown model is answered 404 model_not_found rather than 503 model_unavailable.
 */
export const DISCOVERY_PENDING_ROUNDS = 3;

/** One upstream's state at a moment (UpstreamRegistry.snapshot). */
export interface UpstreamState {
  readonly name: string;
  readonly pool: string;
  /** Takes traffic: its health check has not failed and it is not ejected. */
  readonly up: boolean;
  /** The last active health check; null before the first one finished. */
  readonly healthy: boolean | null;
  /** Passive health: `open` while ejected. */
  readonly circuit: BreakerState;
  /** Times passive health ejected it since this configuration was loaded. */
  readonly ejections: number;
  readonly inflight: number;
  /** Its own max_inflight; null: no limit of its own. */
  readonly maxInflight: number | null;
}

/** What each served model has of its own: a retry budget, and an admission gate when configured. */
export interface ModelControls {
  readonly budget: RetryBudget;
  readonly gate: AdmissionGate | undefined;
}

export interface RegistryHooks {
  onEjected?(upstream: string, reason: EjectionReason): void;
  /** An active health check or a model discovery of this upstream failed. */
  onProbeFailed?(upstream: string, probe: 'health' | 'discovery'): void;
  /** A body read for the gateway's own use was stopped at its size limit or deadline. */
  onReadStopped?(upstream: string, read: OwnRead, reason: ReadStopReason): void;
  /** Newly discovered names of `pool` that got no metric label (discovery.max_models_per_pool was reached). */
  onModelsRefused?(pool: string, count: number): void;
  /** One scrape of an upstream's /metrics for its engine signals (engine_signals), `busy` rounds included. */
  onSignalsScraped?(upstream: string, result: ScrapeResult): void;
  /** An upstream's engine restarted (its process start time changed, or its prefix-cache counters went down). */
  onEngineRestart?(upstream: string, cause: RestartCause): void;
  /**
   * A cache_aware pick recorded `blocks` as sent to `upstream` of `pool` in this process's prefix index: with
   * `--workers N` the other workers learn it ({@link UpstreamRegistry.learnRoute}), so their indexes agree.
   */
  onRouted?(pool: string, upstream: string, blocks: readonly number[]): void;
}

/** What one probe saw: an HTTP status, or the error that stopped it. */
type ProbeResult = { ok: true } | { ok: false; status: number | undefined; error: string | undefined };

/**
 * A discovered model id is served only if it has the shape configured names may have; its metric label is bounded
 * by {@link ModelLabels} (discovery.max_models_per_pool), and the list itself by health.max_body_bytes.
 */
const MODEL_ID = /^[A-Za-z0-9._:/-]{1,128}$/;

export class UpstreamRegistry {
  readonly pools: readonly ServedPool[];
  private byModel = new Map<string, ServedPool>();
  private readonly controlsByModel = new Map<string, ModelControls>();
  private timers: NodeJS.Timeout[] = [];
  private closed = false;
  /** Reused per pick: the eligible upstreams of one pool. */
  private readonly eligible: Upstream[] = [];
  private readonly poolOf = new Map<Upstream, ServedPool>();
  /** Upstreams by name (unique across pools), for the revision of each settled request. */
  private readonly byName = new Map<string, Upstream>();
  /** Each pool's picking (pools[].routing): its policy and, for cache_aware, its prefix index. */
  private readonly routers = new Map<ServedPool, PoolRouter<Upstream>>();
  /** What each upstream's engine says of its load, scraped from its /metrics (engine_signals). */
  readonly signals: EngineSignals;
  private readonly scraper: SignalScraper<Upstream>;
  private readonly signalsOf = (upstream: Upstream): FreshSignals | undefined => this.signals.fresh(upstream.name, this.now());

  constructor(
    private readonly config: Config,
    private readonly logger: Logger,
    private readonly random: () => number = Math.random,
    private readonly hooks: RegistryHooks = {},
    /** Monotonic milliseconds: the gateway's one clock (admission queues read it). */
    private readonly now: () => number = () => performance.now(),
    /** The metric labels of model names: the process's, shared by every configuration a reload brings. */
    readonly labels: ModelLabels = new ModelLabels(),
    /** The metric labels of revisions: the process's, like `labels`. */
    readonly revisionLabels: RevisionLabels = new RevisionLabels(),
  ) {
    const onReadStopped = (upstream: string, read: OwnRead, reason: ReadStopReason) => hooks.onReadStopped?.(upstream, read, reason);
    this.pools = config.pools.map((pool) => ({
      config: pool,
      upstreams: pool.upstreams.map((u) => new Upstream(u, config, onReadStopped)),
      models: pool.models ?? [],
      discovered: pool.models !== undefined,
      settled: pool.models !== undefined,
      unansweredRounds: 0,
    }));
    for (const pool of this.pools) for (const upstream of pool.upstreams) this.poolOf.set(upstream, pool);
    for (const pool of this.pools) for (const upstream of pool.upstreams) this.byName.set(upstream.name, upstream);
    for (const pool of this.pools) this.routers.set(pool, new PoolRouter(pool.config.routing));
    for (const pool of this.pools) {
      for (const upstream of pool.upstreams) if (upstream.revisionConfigured) revisionLabels.configure(pool.config.name, upstream.revision);
    }
    labels.configure(config.pools.flatMap((pool) => pool.models ?? []));
    this.indexModels();
    const es = config.engineSignals;
    this.signals = new EngineSignals(es.staleAfterMs, (name, cause) => {
      // A restarted engine's prefix cache is empty: what the index says it holds is gone.
      const upstream = this.byName.get(name);
      if (upstream !== undefined) {
        this.routerOf(upstream)?.forget(name);
        // A restart is when a new build comes in (a rolled pod behind the same address): read its revision now.
        if (!upstream.revisionConfigured && !this.closed) void this.readVersion(upstream);
      }
      hooks.onEngineRestart?.(name, cause);
    });
    this.scraper = new SignalScraper<Upstream>(
      () => this.upstreams,
      (upstream, timeoutMs) => upstream.get('/metrics', timeoutMs, 'signals'),
      this.signals,
      { enabled: es.enabled, intervalMs: es.intervalMs, timeoutMs: es.timeoutMs, staleAfterMs: es.staleAfterMs },
      {
        onResult: (upstream, result) => {
          if (result.ok) this.engineCapacity(upstream, result.signals.kvCapacityTokens);
          hooks.onSignalsScraped?.(upstream, result);
        },
      },
      now,
    );
  }

  /**
   * The engine's KV capacity (vllm:cache_config_info) bounds what the pool's prefix index believes it holds: as many
   * index blocks as the engine has tokens of KV over the pool's block_tokens, the least recently sent forgotten first,
   * as vLLM evicts. Unknown: no bound of its own.
   */
  private engineCapacity(name: string, tokens: number | undefined): void {
    const upstream = this.byName.get(name);
    const router = upstream === undefined ? undefined : this.routerOf(upstream);
    router?.index.setCapacity(name, tokens === undefined ? null : Math.floor(tokens / router.settings.blockTokens));
  }

  /** The pool an upstream belongs to, and its router. */
  private routerOf(upstream: Upstream): PoolRouter<Upstream> | undefined {
    const pool = this.poolOf.get(upstream);
    return pool === undefined ? undefined : this.routers.get(pool);
  }

  /** A session's request starts: the gap since its previous completion (null: none known), per the pool's tracker. */
  sessionStarted(model: string, sessionKey: string, now: number): { gapMs: number | null; gapClass: string } | undefined {
    return this.sessionsOf(model)?.start(sessionKey, now);
  }

  /** A session's request ended (however it ended): the next one's gap is measured from now. */
  sessionEnded(model: string, sessionKey: string, now: number): void {
    this.sessionsOf(model)?.complete(sessionKey, now);
  }

  /** The idle-gap tracker of the pool serving `model` (none without a session header). */
  private sessionsOf(model: string): PoolRouter<Upstream>['sessions'] | undefined {
    const pool = this.byModel.get(model);
    return pool === undefined ? undefined : this.routers.get(pool)?.sessions;
  }

  /** Each upstream's engine signals for the scrape-time gauges: fresh or not, and how old the last valid ones are. */
  *engineSignalStates(now: number): Iterable<{ name: string; fresh: boolean; ageSeconds: number | undefined }> {
    for (const upstream of this.upstreams) {
      const latest = this.signals.latest(upstream.name);
      yield { name: upstream.name, fresh: this.signals.state(upstream.name, now) === 'fresh', ageSeconds: latest === undefined ? undefined : Math.max(0, now - latest.at) / 1000 };
    }
  }

  /** The pool's routing settings for a model (undefined: not served). */
  routingFor(model: string): PoolConfig['routing'] | undefined {
    return this.byModel.get(model)?.config.routing;
  }

  get upstreams(): Upstream[] {
    return this.pools.flatMap((pool) => pool.upstreams);
  }

  /** Served model names, configured and discovered. */
  models(): string[] {
    return [...this.byModel.keys()];
  }

  poolFor(model: string): ServedPool | undefined {
    return this.byModel.get(model);
  }

  /**
   * Whether a pool that discovers its models has not read any upstream's model list yet and may still: a model no pool
   * serves may be one it serves once discovery succeeds (answered 503 model_unavailable, not 404). Bounded per pool:
   * it ends once an upstream of the pool answered `/v1/models` at all (a list, or an HTTP answer that is not one: a
   * wrong api_key, not vLLM — logged and counted as a failed discovery), or after {@link DISCOVERY_PENDING_ROUNDS}
   * rounds with none answering.
   */
  discoveryPending(): boolean {
    return this.pools.some((pool) => !pool.settled);
  }

  /**
   * A reload: pools that discover, whose name and upstreams (names and URLs) are unchanged, start from the previous
   * generation's list, so a reload while their upstreams are down does not unserve their models. The next discovery
   * replaces it as usual.
   */
  /**
   * Keeps what a pool's router learned across a reload that leaves the pool's upstreams and routing settings as they
   * were: its prefix index (where prefixes were sent) and its sessions' idle gaps. Anything else starts afresh.
   */
  carryRouting(previous: UpstreamRegistry): void {
    const key = (pool: ServedPool) => JSON.stringify([pool.upstreams.map((u) => [u.name, u.url.href]), pool.config.routing]);
    for (const pool of this.pools) {
      const before = previous.pools.find((p) => p.config.name === pool.config.name);
      const router = before === undefined ? undefined : previous.routers.get(before);
      if (before === undefined || router === undefined || key(before) !== key(pool)) continue;
      this.routers.set(pool, router);
    }
  }

  /**
   * A reload keeps what each upstream's GET /version said while its name and URL are unchanged and its revision is
   * still read (not configured), so its requests do not read `_unknown` until the next read.
   */
  carryRevisions(previous: UpstreamRegistry): void {
    for (const upstream of this.upstreams) {
      if (upstream.revisionConfigured) continue;
      const before = previous.upstreams.find((u) => u.name === upstream.name && u.url.href === upstream.url.href && !u.revisionConfigured);
      if (before !== undefined) upstream.revision = before.revision;
    }
  }

  /** The `revision` label of an upstream's requests; `_unknown` for a name this configuration does not have. */
  revisionOf(name: string): string {
    return this.byName.get(name)?.revision ?? UNKNOWN_REVISION;
  }

  /** Each upstream's pool and revision label (waybill_upstream_revision_info). */
  *revisions(): Iterable<{ pool: string; upstream: string; revision: string }> {
    for (const pool of this.pools) for (const upstream of pool.upstreams) yield { pool: pool.config.name, upstream: upstream.name, revision: upstream.revision };
  }

  carryDiscovery(previous: UpstreamRegistry): void {
    const key = (pool: ServedPool) => JSON.stringify(pool.upstreams.map((u) => [u.name, u.url.href]));
    for (const pool of this.pools) {
      if (pool.config.models !== undefined) continue;
      const before = previous.pools.find((p) => p.config.name === pool.config.name && p.config.models === undefined);
      if (before === undefined || key(before) !== key(pool)) continue;
      pool.models = before.models;
      pool.discovered = before.discovered;
      pool.settled = before.settled;
      pool.unansweredRounds = before.unansweredRounds;
    }
    this.indexModels();
  }

  /**
   * The model's retry budget and admission gate, made on first use (discovered models included). Models without a
   * label of their own (over discovery.max_models_per_pool) share their pool's, as they share its `_other` series:
   * what the registry holds per model stays bounded too.
   */
  controls(model: string): ModelControls {
    const label = this.labels.label(model);
    const key = label === OTHER ? `${OTHER}\u0000${this.byModel.get(model)?.config.name ?? ''}` : model;
    let controls = this.controlsByModel.get(key);
    if (controls === undefined) {
      const admission: AdmissionConfig | undefined = this.byModel.get(model)?.config.admission;
      controls = {
        budget: new RetryBudget(this.config.retries.budget),
        gate:
          admission &&
          new AdmissionGate(admission, {
            now: this.now,
            setTimer: (fn, ms) => {
              const timer = setTimeout(fn, ms);
              return { cancel: () => clearTimeout(timer) };
            },
          }),
      };
      this.controlsByModel.set(key, controls);
    }
    return controls;
  }

  /**
   * Admission queues, for the queue gauges (read at scrape time): depth, the oldest waiter's wait so far (ms) and the
   * waiters' estimated prompt tokens. The `_other` queues of several pools are added up (their oldest wait: the max).
   */
  *queues(): Iterable<{ model: string; depth: number; oldestWaitMs: number; promptTokens: number }> {
    let other: { model: string; depth: number; oldestWaitMs: number; promptTokens: number } | undefined;
    for (const [key, controls] of this.controlsByModel) {
      const gate = controls.gate;
      if (gate === undefined) continue;
      const queue = { depth: gate.depth, oldestWaitMs: gate.oldestWaitMs, promptTokens: gate.queuedPromptTokens };
      if (!key.startsWith(`${OTHER}\u0000`)) {
        yield { model: key, ...queue };
        continue;
      }
      other ??= { model: OTHER, depth: 0, oldestWaitMs: 0, promptTokens: 0 };
      other.depth += queue.depth;
      other.oldestWaitMs = Math.max(other.oldestWaitMs, queue.oldestWaitMs);
      other.promptTokens += queue.promptTokens;
    }
    if (other !== undefined) yield other;
  }

  /**
   * Picks an upstream for a model: power of two choices by in-flight requests per weight among the upstreams that
   * are up and under their own max_inflight, preferring one not in `tried` (those this request was already sent to:
   * with two sick replicas of three, avoiding only the last one can bounce between the sick pair). When
   * none is up, every upstream under its max_inflight is a candidate again (Envoy's "panic" routing): health checks
   * can be wrong, and trying beats a certain error. Undefined when the model is not served or all are full.
   */
  pick(model: string, tried: ReadonlySet<string>, now: number, key: RoutingKey = NO_ROUTING_KEY): Pick<Upstream> | undefined {
    const pool = this.byModel.get(model);
    if (pool === undefined) return undefined;
    const eligible = this.eligible;
    eligible.length = 0;
    for (const upstream of pool.upstreams) {
      if (upstream.inflight < upstream.maxInflight && upstream.isUp(now) && upstream.breaker.isEligible(now)) eligible.push(upstream);
    }
    if (eligible.length === 0) {
      for (const upstream of pool.upstreams) if (upstream.inflight < upstream.maxInflight) eligible.push(upstream);
    }
    const picked = this.routers.get(pool)?.pick(eligible, tried, key, this.signalsOf, this.random);
    eligible.length = 0;
    if (picked !== undefined && key.blocks.length > 0 && this.hooks.onRouted !== undefined && pool.config.routing.policy === 'cache_aware') {
      this.hooks.onRouted(pool.config.name, picked.upstream.name, key.blocks);
    }
    return picked;
  }

  /** Each cache_aware pool's prefix-index size (waybill_routing_index_entries). */
  *routingIndexes(): Iterable<{ pool: string; entries: number }> {
    for (const [pool, router] of this.routers) if (router.settings.policy === 'cache_aware') yield { pool: pool.config.name, entries: router.index.size };
  }

  /**
   * Another worker sent `blocks` to `upstream` of `pool`: recorded in this pool's index as if picked here, so a
   * prefix another worker spilled or placed is known here too. Ignored when the pool or the upstream is not (or no
   * longer) configured, or the pool does not route by cache.
   */
  learnRoute(pool: string, upstream: string, blocks: readonly number[]): void {
    const known = this.byName.get(upstream);
    const served = known === undefined ? undefined : this.poolOf.get(known);
    if (served === undefined || served.config.name !== pool || served.config.routing.policy !== 'cache_aware') return;
    const router = this.routers.get(served);
    const max = router?.settings.maxBlocks ?? 0;
    router?.index.record(upstream, blocks.length > max ? blocks.slice(0, max) : blocks);
  }

  /** An attempt was sent: count it in flight and tell passive health (it may be the trial after an ejection). */
  sent(upstream: Upstream, now: number): SendTicket {
    upstream.inflight++;
    return upstream.breaker.onSend(now);
  }

  /** An attempt is over: its result is the upstream's health verdict. */
  settled(upstream: Upstream, ticket: SendTicket, record: AttemptRecord | undefined, now: number): void {
    upstream.inflight--;
    const verdict = record === undefined ? 'none' : healthVerdict(record);
    if (verdict === 'success') {
      upstream.ejectionHeld = false;
      upstream.breaker.onSuccess(now, ticket);
      return;
    }
    if (verdict === 'none') {
      upstream.breaker.onAbandon(now, ticket);
      return;
    }
    const ejected = upstream.breaker.onFailure(now, ticket, this.mayEject(upstream, now));
    if (ejected === 'held') {
      if (!upstream.ejectionHeld) {
        upstream.ejectionHeld = true;
        this.logger.warn(
          { upstream: upstream.name, result: record?.result, maxEjectionPercent: this.config.health.maxEjectionPercent },
          'upstream not ejected: its pool keeps at least one upstream taking traffic and at most health.max_ejection_percent ejected',
        );
      }
      return;
    }
    upstream.ejectionHeld = false;
    if (ejected !== undefined) {
      this.logger.warn({ upstream: upstream.name, reason: ejected, result: record?.result }, 'upstream ejected');
      this.hooks.onEjected?.(upstream.name, ejected);
      // Ejected for a while: requests its prefixes would have brought go elsewhere and are cached there.
      this.routerOf(upstream)?.forget(upstream.name);
    }
  }

  /**
   * May passive health eject `upstream` now? Only while the pool keeps another upstream that takes traffic for certain
   * (not failed by its health check, and its circuit closed: a half-open one's trial may fail and keep it out) and ejecting it keeps the pool's ejected upstreams (open or half open) within
   * health.max_ejection_percent of the pool, rounded down. Active health checks are not bounded: an upstream whose
   * /health fails is out until it passes (and when none is up, picking falls back to all of them).
   */
  private mayEject(upstream: Upstream, now: number): boolean {
    const pool = this.poolOf.get(upstream);
    if (pool === undefined) return true;
    const bound = Math.floor((pool.upstreams.length * this.config.health.maxEjectionPercent) / 100);
    let ejected = 0;
    let othersUp = false;
    for (const other of pool.upstreams) {
      if (other === upstream) continue;
      if (other.breaker.state(now) !== 'closed') ejected++;
      if (other.healthy !== false && other.breaker.state(now) === 'closed') othersUp = true;
    }
    return othersUp && ejected + 1 <= bound;
  }

  /**
   * What each upstream is doing now, read-only, for the status page: health, circuit, in flight. Copies, so a reader
   * cannot change what picking and passive health decide from.
   */
  snapshot(now: number): UpstreamState[] {
    return this.pools.flatMap((pool) =>
      pool.upstreams.map((upstream) => ({
        name: upstream.name,
        pool: pool.config.name,
        up: upstream.isUp(now),
        healthy: upstream.healthy ?? null,
        circuit: upstream.breaker.state(now),
        ejections: upstream.breaker.ejections,
        inflight: upstream.inflight,
        maxInflight: Number.isFinite(upstream.maxInflight) ? upstream.maxInflight : null,
      })),
    );
  }

  /** Ready: every pool has a model to serve and at least one upstream that passed its health check and is not ejected. */
  isReady(now: number): boolean {
    return this.pools.every(
      (pool) => pool.models.length > 0 && pool.upstreams.some((u) => u.healthy === true && u.breaker.state(now) !== 'open'),
    );
  }

  /** Runs the first health check and discovery, then keeps both going on their intervals. */
  async start(): Promise<void> {
    await Promise.all([this.checkHealth(), this.discover(), this.readVersions()]);
    this.timers.push(setInterval(() => void this.checkHealth(), this.config.health.intervalMs).unref());
    if (this.upstreams.some((upstream) => !upstream.revisionConfigured)) {
      this.timers.push(setInterval(() => void this.readVersions(), this.config.discovery.refreshIntervalMs).unref());
    }
    this.scraper.start();
    if (this.pools.some((pool) => pool.config.models === undefined)) {
      this.timers.push(setInterval(() => void this.discover(), this.config.discovery.refreshIntervalMs).unref());
    }
  }

  /** Stops health checks and discovery; the upstreams still serve the requests in flight until `close`. */
  stop(): void {
    this.closed = true;
    this.scraper.stop();
    for (const timer of this.timers.splice(0)) clearInterval(timer);
  }

  async close(): Promise<void> {
    this.stop();
    await Promise.all(this.upstreams.map((u) => u.close()));
  }

  private indexModels(): void {
    const byModel = new Map<string, ServedPool>();
    for (const pool of this.pools) {
      for (const model of pool.models) if (!byModel.has(model)) byModel.set(model, pool);
    }
    this.byModel = byModel;
  }

  private async checkHealth(): Promise<void> {
    await Promise.all(
      this.upstreams.map(async (upstream) => {
        let result: ProbeResult;
        try {
          const { status } = await upstream.get('/health', this.config.health.timeoutMs, 'health');
          result = status === 200 ? { ok: true } : { ok: false, status, error: undefined };
        } catch (err) {
          result = { ok: false, status: undefined, error: (err as Error).message };
        }
        if (this.closed) return;
        if (!result.ok) this.hooks.onProbeFailed?.(upstream.name, 'health');
        if (upstream.healthy !== result.ok) {
          if (result.ok) this.logger.info({ upstream: upstream.name, healthy: true }, 'upstream healthy');
          else this.logger.warn({ upstream: upstream.name, healthy: false, status: result.status, err: result.error }, 'upstream unhealthy');
        }
        upstream.healthy = result.ok;
      }),
    );
  }

  private async readVersions(): Promise<void> {
    await Promise.all(this.upstreams.filter((upstream) => !upstream.revisionConfigured).map((upstream) => this.readVersion(upstream)));
  }

  /**
   * Reads an upstream's GET /version (vLLM: `{"version": "0.9.1"}`) on the probe's connection, its body bounded by
   * health.max_body_bytes (a longer one counted as a stopped `discovery` read), within health.timeout. A `version`
   * that is not a string of {@link REVISION}'s shape is not taken; a failed or invalid read keeps the revision it had
   * (`_unknown` before the first valid one). A new one gets its label under discovery.max_revisions_per_pool.
   */
  private async readVersion(upstream: Upstream): Promise<void> {
    let version: string | undefined;
    let problem: string | undefined;
    try {
      const response = await upstream.get('/version', this.config.health.timeoutMs, 'discovery');
      if (response.status !== 200) problem = `status ${response.status}`;
      else {
        const parsed = JSON.parse(response.body) as { version?: unknown } | null;
        const value = parsed?.version;
        if (typeof value === 'string' && REVISION.test(value)) version = value;
        else problem = 'the body has no `version` string of 1-64 characters of [A-Za-z0-9._+:-]';
      }
    } catch (err) {
      problem = (err as Error).message;
    }
    if (this.closed) return;
    if (version === undefined) {
      if (!upstream.versionFailing) {
        upstream.versionFailing = true;
        this.logger.warn({ upstream: upstream.name, err: problem, revision: upstream.revision }, 'reading the upstream revision (GET /version) failed: its revision label is kept');
      }
      return;
    }
    upstream.versionFailing = false;
    const pool = this.poolOf.get(upstream)?.config.name ?? '';
    const { label, firstRefusal } = this.revisionLabels.admit(pool, this.config.discovery.maxRevisionsPerPool, version);
    if (firstRefusal) {
      this.logger.warn(
        { pool, maxRevisionsPerPool: this.config.discovery.maxRevisionsPerPool },
        'upstream revisions over discovery.max_revisions_per_pool: counted under revision="_other" in metrics for the life of the process',
      );
    }
    if (label === upstream.revision) return;
    const from = upstream.revision;
    upstream.revision = label;
    this.logger.info({ upstream: upstream.name, from, to: label, version }, 'upstream revision changed');
  }

  /** Counts a failed discovery, and logs it when the upstream's discovery starts failing (not every interval). */
  private discoveryFailed(upstream: Upstream, status: number | undefined, error: string | undefined): void {
    this.hooks.onProbeFailed?.(upstream.name, 'discovery');
    if (upstream.discoveryFailing) return;
    upstream.discoveryFailing = true;
    const hint = status === 401 || status === 403 ? 'check the upstream api_key' : undefined;
    this.logger.warn({ upstream: upstream.name, status, err: error, hint }, 'model discovery failed');
  }

  /** For pools without configured models: the union of model ids the upstreams list at GET /v1/models. */
  private async discover(): Promise<void> {
    for (const pool of this.pools) {
      if (pool.config.models !== undefined) continue;
      const found = new Set<string>();
      let read = false;
      let answered = false;
      await Promise.all(
        pool.upstreams.map(async (upstream) => {
          let status: number | undefined;
          try {
            const response = await upstream.get('/v1/models', this.config.health.timeoutMs, 'discovery');
            status = response.status;
            // An HTTP answer (a 5xx may be a proxy in front of an upstream still starting: not one).
            if (status < 500) answered = true;
            if (status !== 200) {
              this.discoveryFailed(upstream, status, undefined);
              return;
            }
            const parsed = JSON.parse(response.body) as { data?: unknown };
            if (!Array.isArray(parsed.data)) throw new Error('the body has no `data` list');
            for (const entry of parsed.data as unknown[]) {
              const id = (entry as { id?: unknown } | null)?.id;
              if (typeof id === 'string' && MODEL_ID.test(id)) found.add(id);
            }
            read = true;
            upstream.discoveryFailing = false;
          } catch (err) {
            this.discoveryFailed(upstream, status, (err as Error).message);
          }
        }),
      );
      if (this.closed) return;
      if (read) pool.discovered = true;
      if (!pool.settled) {
        if (!read && !answered) pool.unansweredRounds++;
        if (read || answered || pool.unansweredRounds >= DISCOVERY_PENDING_ROUNDS) {
          pool.settled = true;
          if (!read) {
            this.logger.warn(
              { pool: pool.config.name, rounds: pool.unansweredRounds },
              'model discovery of this pool read no model list: models no pool serves are answered 404 model_not_found from now on',
            );
          }
        }
      }
      // Keep the last known list when every upstream is unreachable, so a blip does not unserve a model.
      if (found.size === 0) continue;
      const models = [...found].sort();
      if (models.join('\n') !== pool.models.join('\n')) {
        const before = new Set(pool.models);
        const { refused, firstRefusal } = this.labels.admit(
          pool.config.name,
          this.config.discovery.maxModelsPerPool,
          models.filter((model) => !before.has(model)),
        );
        if (refused > 0) this.hooks.onModelsRefused?.(pool.config.name, refused);
        if (firstRefusal) {
          this.logger.warn(
            { pool: pool.config.name, maxModelsPerPool: this.config.discovery.maxModelsPerPool },
            'discovered model names over discovery.max_models_per_pool: served, but counted under model="_other" in metrics for the life of the process',
          );
        }
        this.logger.info({ pool: pool.config.name, models: models.length > 64 ? `${models.length} models` : models }, 'models discovered');
        pool.models = models;
      }
    }
    this.indexModels();
  }
}
