/**
 * Session idle gaps: for a multi-turn session (named by a client header such as `x-session-id`), the time from the
 * session's previous request's *completion* to this request's *start*. Paired with each request's cached-prompt
 * ratio, the gap class shows the KV-cache residency an engine actually gave — without anyone claiming a TTL: vLLM's
 * prefix cache has none, a freed block stays until the free queue reuses it, so residency depends on load. "Long idle
 * gaps with low cached ratio" points at eviction (or a different replica, or a changed input: an association, not
 * proof). Completion-to-start is used rather than start-to-start, which would include the previous response's own
 * duration and so blur a long answer into a long idle.
 *
 * Pure: no clock (the caller passes `now`, in ms, from a monotonic clock), no timers, no I/O. Bounded: at most
 * `maxSessions` entries, each a key of at most KEY_MAX_CHARS + 1 characters and one number.
 */
import { GAP_CLASSES, type GapClass } from '../telemetry/labels.js';

/**
 * Gap classes, upper bound inclusive like a Prometheus `le` bucket (a gap of exactly 10 s is '0-10s', and lands in
 * the histogram's le=10 bucket too). Why these bounds — they separate the residency regimes of a vLLM prefix cache,
 * whose eviction is LRU on the free queue, so a prefix's life is set by how fast new prompts consume free blocks:
 * - 0-10s: agent loops and tool calls. The prefix survives on all but a saturated engine; a low ratio here means
 *   thrashing, a different replica, or a changed input — not idle eviction.
 * - 10s-1m: a quick human reply. Survives at moderate load; under heavy load a busy engine turns over its free
 *   blocks within seconds, and this is where that first shows.
 * - 1m-5m: a human reading and typing. Evicted under sustained load, kept at light load.
 * - 5m-30m: a return after a break. Kept only by a lightly loaded engine (or one with a large KV store).
 * - 30m+: only an idle engine still holds it. Reachable only when `ttlMs` exceeds 30 minutes (with the default TTL
 *   such a gap reads as 'first': the session has expired).
 */
// The classes' names are a metric label's closed set (telemetry/labels.ts); their bounds are here.
export { GAP_CLASSES } from '../telemetry/labels.js';

/** Upper bounds (inclusive, ms) of every class but the last, in GAP_CLASSES order. */
export const GAP_CLASS_BOUNDS_MS: readonly number[] = Object.freeze([10_000, 60_000, 300_000, 1_800_000]);

/**
 * Bucket bounds (s) for a Prometheus histogram of the gap. Every class bound (10, 60, 300, 1800) is among them, so the
 * histogram re-aggregates exactly into the classes; 1 and 5 split the agent/tool-call regime, 3600 the idle tail.
 */
export const GAP_BUCKETS_SECONDS: readonly number[] = Object.freeze([1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600]);

/** The class of a gap of `ms` milliseconds. A negative or NaN gap (a clock the caller got wrong) is the first class. */
export function gapClassOf(ms: number): GapClass {
  for (let i = 0; i < GAP_CLASS_BOUNDS_MS.length; i++) {
    // `!(ms > bound)` rather than `ms <= bound` so NaN falls into the first class instead of the last.
    if (!(ms > (GAP_CLASS_BOUNDS_MS[i] ?? Infinity))) return GAP_CLASSES[i] ?? GAP_CLASSES[0];
  }
  return GAP_CLASSES[GAP_CLASSES.length - 1] ?? GAP_CLASSES[0];
}

/**
 * Session keys are client-controlled: a key of at most this many UTF-16 code units is stored as is (so distinct short
 * keys never collide); a longer one is replaced by a 64-bit digest. 256 is far above any real session id (a UUID is
 * 36) and bounds an entry's key to about 0.5 KiB.
 */
export const KEY_MAX_CHARS = 256;

/**
 * The Map key for a session key. The one-character tag keeps the two spaces apart: a short key that happens to look
 * like a digest is still a different entry.
 *
 * The digest is cyrb53's two 32-bit multiply-xor lanes, kept whole (64 bits, 16 hex digits). Not cryptographic: a
 * client that crafts a collision merges two of its own long-keyed sessions, which only blurs its own gap figures —
 * it cannot name another client's session that it could not simply send the key of.
 */
export function storedKey(sessionKey: string): string {
  if (sessionKey.length <= KEY_MAX_CHARS) return `k${sessionKey}`;
  let a = 0xdeadbeef ^ sessionKey.length;
  let b = 0x41c6ce57 ^ sessionKey.length;
  for (let i = 0; i < sessionKey.length; i++) {
    const c = sessionKey.charCodeAt(i);
    a = Math.imul(a ^ c, 2654435761);
    b = Math.imul(b ^ c, 1597334677);
  }
  a = Math.imul(a ^ (a >>> 16), 2246822507) ^ Math.imul(b ^ (b >>> 13), 3266489909);
  b = Math.imul(b ^ (b >>> 16), 2246822507) ^ Math.imul(a ^ (a >>> 13), 3266489909);
  return `h${hex32(a)}${hex32(b)}`;
}

const hex32 = (n: number): string => (n >>> 0).toString(16).padStart(8, '0');

export interface SessionGapsOptions {
  /** At most this many sessions are remembered; the least recently used is forgotten first. Default 100 000. */
  readonly maxSessions?: number;
  /** A session whose last completion is more than this long ago counts as new (and is dropped). Default 30 min. */
  readonly ttlMs?: number;
}

export interface GapReading {
  /** Milliseconds from the session's last completion to this start (never negative); null for a new or expired session. */
  readonly gapMs: number | null;
  /** gapClassOf(gapMs), or 'first' when there is no gap. */
  readonly gapClass: GapClass | 'first';
}

const FIRST: GapReading = Object.freeze({ gapMs: null, gapClass: 'first' });

/**
 * Expired entries dropped from the least recent end every SWEEP_EVERY calls, at most SWEEP_MAX at a time. Not on every
 * call: V8's Map leaves a hole for each deleted entry until it rehashes, and an iterator from the start walks every
 * hole at the front — every touch (delete + set) makes one — so reading the head on each call cost the whole run of
 * holes per request; amortised over SWEEP_EVERY calls it is a few steps.
 */
const SWEEP_EVERY = 64;
const SWEEP_MAX = 128;

/**
 * The last completion time of each recent session, in a Map kept in recency order (delete + set moves an entry to the
 * end, so the first entry is the least recently used): O(1) per call.
 *
 * In-flight sessions: only completions are recorded. A `start` while an earlier request of the same session is still
 * in flight reads the gap from the last *completion* before it (or 'first' if there is none), so concurrent requests
 * of one session each get a gap from the same completion. Overlapping requests complete in any order; the completion
 * reported last is the one the next start measures from. A request that never completes (the caller should report
 * failures and cancellations as completions too) leaves the previous completion in place.
 */
export class SessionGaps {
  readonly maxSessions: number;
  readonly ttlMs: number;
  /** stored key → the caller's `now` at the session's last completion. */
  private readonly completedAt = new Map<string, number>();
  private calls = 0;

  constructor(options: SessionGapsOptions = {}) {
    this.maxSessions = options.maxSessions ?? 100_000;
    this.ttlMs = options.ttlMs ?? 30 * 60_000;
    if (!Number.isInteger(this.maxSessions) || this.maxSessions < 1) {
      throw new RangeError(`maxSessions must be a positive integer, got ${this.maxSessions}`);
    }
    if (!(this.ttlMs > 0)) throw new RangeError(`ttlMs must be positive, got ${this.ttlMs}`);
  }

  /** Sessions currently remembered (expired ones not yet dropped included). Never more than maxSessions. */
  get size(): number {
    return this.completedAt.size;
  }

  /** A request of `sessionKey` starts at `now`: the gap since the session's last completion. */
  start(sessionKey: string, now: number): GapReading {
    this.sweep(now);
    const key = storedKey(sessionKey);
    const last = this.completedAt.get(key);
    if (last === undefined) return FIRST;
    this.completedAt.delete(key);
    if (this.expired(last, now)) return FIRST;
    // Using a session makes it recent: re-set moves it to the end of the recency order.
    this.completedAt.set(key, last);
    const gapMs = Math.max(0, now - last);
    return { gapMs, gapClass: gapClassOf(gapMs) };
  }

  /** A request of `sessionKey` completed (finished, failed or was cancelled) at `now`. */
  complete(sessionKey: string, now: number): void {
    this.sweep(now);
    const key = storedKey(sessionKey);
    if (!this.completedAt.delete(key) && this.completedAt.size >= this.maxSessions) {
      // Full: the least recent 1 % go at once, one walk over the holes at the front for many evictions, not one each.
      let evict = Math.max(1, Math.floor(this.maxSessions / 100));
      for (const oldest of this.completedAt.keys()) {
        this.completedAt.delete(oldest);
        if (--evict === 0) break;
      }
    }
    this.completedAt.set(key, now);
  }

  /**
   * Last completion more than ttlMs before `now`. A completion "in the future" (a clock that went backwards) is not
   * expired; its gap reads 0.
   */
  private expired(last: number, now: number): boolean {
    return now - last > this.ttlMs;
  }

  /**
   * Lazily drops expired entries from the least recent end, a few per call. Recency is by last touch while expiry is by
   * last completion, so the head is usually but not always the stalest; the sweep stops at the first live entry, and
   * an expired entry it misses is dropped when its session next starts, or evicted by LRU.
   */
  private sweep(now: number): void {
    if (++this.calls % SWEEP_EVERY !== 0) return;
    let left = SWEEP_MAX;
    for (const [key, last] of this.completedAt) {
      if (!this.expired(last, now) || left-- === 0) return;
      this.completedAt.delete(key);
    }
  }
}
