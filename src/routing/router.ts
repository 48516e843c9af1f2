/**
 * One pool's picking (docs/routing.md): `least_request` is the power of two choices of src/proxy/picker.ts,
 * unchanged; `cache_aware` keys the request on its rendered prefix, asks the pool's prefix index which upstream was
 * sent those blocks, and picks with bounded load over the engines' scraped signals (src/routing/score.ts). A new
 * prefix no upstream holds is placed by rendezvous hashing of its first block, so every worker and every gateway
 * replica sends the same new prefix to the same upstream without sharing any state.
 *
 * Pure but for the index it owns: the caller passes the eligible upstreams, their signals and the randomness.
 */
import type { ProxiedRoute } from '../accounting/outcomes.js';
import { pickUpstream, type Candidate } from '../proxy/picker.js';
import { prefixBlocks } from './prefix-key.js';
import { PrefixIndex } from './prefix-index.js';
import { pickCacheAware, type PickReason, type RoutingCandidate } from './score.js';
import { SessionGaps } from './sessions.js';

/** Sessions the idle-gap tracker keeps per pool, and how long an idle one is remembered (past 30m+, its class). */
const SESSION_LIMITS = { maxSessions: 100_000, ttlMs: 2 * 3_600_000 } as const;

export type RoutingPolicy = 'cache_aware' | 'least_request';

export interface RoutingSettings {
  readonly policy: RoutingPolicy;
  readonly boundedLoad: number;
  readonly minMatchBlocks: number;
  readonly balanceAbsThreshold: number;
  readonly balanceRelThreshold: number;
  readonly weights: { readonly prefix: number; readonly queue: number; readonly kv: number; readonly inflight: number };
  readonly blockChars: number;
  readonly blockTokens: number;
  readonly maxBlocks: number;
  readonly indexEntries: number;
  readonly sessionHeader?: string | undefined;
  readonly usageReportsCachedTokens: boolean;
}

/** What a request brings to the pick: its prefix blocks (empty: nothing to route on) and its session, if any. */
export interface RoutingKey {
  readonly blocks: readonly number[];
  readonly sessionKey?: string | undefined;
}

export const NO_ROUTING_KEY: RoutingKey = Object.freeze({ blocks: Object.freeze<number[]>([]) });

/** The engine's scraped signals of one upstream, fresh; undefined when stale or missing. */
export interface FreshSignals {
  readonly waiting: number;
  readonly running: number;
  readonly kvUsage: number;
}

export interface RoutableUpstream extends Candidate {
  readonly name: string;
}

/** One pick: where, why, and what it predicts vLLM will find cached there. */
export interface Pick<T> {
  readonly upstream: T;
  readonly reason: PickReason;
  /** Prompt tokens the index predicts are cached on `upstream` (matched blocks × block tokens); 0 for least_request. */
  readonly predictedCachedTokens: number;
}

/** The request's routing key, from its parsed JSON body; bounded work (settings.maxBlocks). */
export function routingKey(settings: RoutingSettings, route: ProxiedRoute, json: unknown, sessionHeaderValue: string | undefined): RoutingKey {
  if (settings.policy !== 'cache_aware') return NO_ROUTING_KEY;
  const { blocks } = prefixBlocks(route, json, { blockChars: settings.blockChars, blockTokens: settings.blockTokens, maxBlocks: settings.maxBlocks });
  // A session id is the client's: the idle-gap tracker digests a long one (sessions.ts storedKey), and the rendezvous
  // hashes it, so any length is bounded work; the header itself is bounded by the server's header limit.
  const sessionKey = sessionHeaderValue === undefined || sessionHeaderValue === '' ? undefined : sessionHeaderValue;
  return sessionKey === undefined ? { blocks } : { blocks, sessionKey };
}

interface Scored<T> extends RoutingCandidate {
  readonly upstream: T;
}

export class PoolRouter<T extends RoutableUpstream> {
  readonly index: PrefixIndex;
  /** Idle gaps of the sessions named by settings.sessionHeader (null without one). */
  readonly sessions: SessionGaps | null;
  private readonly matched = new Map<string, number>();
  /** Reused per placement of a new prefix: each candidate's blocks in the index. */
  private readonly occupancy = new Map<string, number>();

  constructor(readonly settings: RoutingSettings) {
    this.index = new PrefixIndex({ maxEntries: settings.indexEntries });
    this.sessions = settings.sessionHeader === undefined ? null : new SessionGaps(SESSION_LIMITS);
  }

  /**
   * Picks among `eligible` (up, not ejected, under their max_inflight — the caller's filter), avoiding `tried` when it
   * can. Undefined when `eligible` is empty. Records the pick's prefix in the index at once, so the next request of the
   * same prefix, even one arriving before this one's first byte, finds it.
   */
  pick(eligible: readonly T[], tried: ReadonlySet<string>, key: RoutingKey, signalsOf: (upstream: T) => FreshSignals | undefined, random: () => number): Pick<T> | undefined {
    if (eligible.length === 0) return undefined;
    if (this.settings.policy === 'least_request' || key.blocks.length === 0 && key.sessionKey === undefined) {
      const upstream = pickUpstream(eligible, tried, random);
      if (upstream === undefined) return undefined;
      return { upstream, reason: eligible.length === 1 ? 'single' : 'load', predictedCachedTokens: 0 };
    }
    // A retry goes elsewhere when it can: the upstreams already tried are left out unless nothing else is left.
    let pool: readonly T[] = eligible;
    if (tried.size > 0) {
      const untried = eligible.filter((u) => !tried.has(u.name));
      if (untried.length > 0) pool = untried;
    }
    const candidates: Array<Scored<T>> = pool.map((upstream) => {
      const signals = signalsOf(upstream);
      return {
        upstream,
        name: upstream.name,
        weight: upstream.weight,
        inflight: upstream.inflight,
        waiting: signals?.waiting ?? null,
        running: signals?.running ?? null,
        kvUsage: signals?.kvUsage ?? null,
      };
    });
    const matched = this.index.match(key.blocks, this.matched);
    // A prefix nobody holds: placed by rendezvous of its first block, so workers and replicas agree on where it goes.
    const prefixKey = key.blocks.length === 0 ? undefined : `prefix:${key.blocks[0] ?? 0}`;
    const placing = key.sessionKey === undefined && !hasMatch(matched) && prefixKey !== undefined;
    const sessionKey = key.sessionKey ?? (placing ? prefixKey : undefined);
    if (placing) for (const c of candidates) this.occupancy.set(c.name, this.index.sizeOf(c.name));
    const choice = pickCacheAware(
      candidates,
      { requestBlocks: key.blocks.length, matched, sessionKey, tieKey: prefixKey, ...(placing && { occupancy: this.occupancy }) },
      {
        boundedLoad: this.settings.boundedLoad,
        minMatchBlocks: this.settings.minMatchBlocks,
        balanceAbsThreshold: this.settings.balanceAbsThreshold,
        balanceRelThreshold: this.settings.balanceRelThreshold,
        weights: this.settings.weights,
      },
      random,
    );
    matched.clear();
    this.occupancy.clear();
    if (choice === undefined) return undefined;
    const upstream = choice.candidate.upstream;
    if (key.blocks.length > 0) this.index.record(upstream.name, key.blocks);
    // A rendezvous placement of a new prefix is a load-style decision (nothing was predicted cached), not a session.
    const reason: PickReason = choice.reason === 'session' && key.sessionKey === undefined ? 'load' : choice.reason;
    return { upstream, reason, predictedCachedTokens: choice.predictedCachedBlocks * this.settings.blockTokens };
  }

  /** The upstream's engine restarted, or it was ejected or removed: what the index says it holds is gone. */
  forget(upstream: string): void {
    this.index.forget(upstream);
  }
}

function hasMatch(matched: ReadonlyMap<string, number>): boolean {
  for (const blocks of matched.values()) if (blocks > 0) return true;
  return false;
}
