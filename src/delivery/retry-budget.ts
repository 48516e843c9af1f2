/**
 * Retry budget in the manner of Envoy's `retry_budget`: retries may add only a fraction of recent traffic, so that
 * when a whole pool is failing, retries cannot multiply the load on it. Pure: time comes in as `now`.
 */

export interface RetryBudgetOptions {
  /** Retries may add at most this fraction of recent requests, e.g. 0.2. */
  readonly ratio: number;
  /** Floor, so that low traffic can still retry, e.g. 3. */
  readonly minPerSecond: number;
  /** How far back "recent" reaches, e.g. 10_000. */
  readonly windowMs: number;
}

/** Fixed buckets: constant memory and O(1) amortised per call, at the price of a window that ends on a bucket edge. */
const BUCKETS = 10;

/**
 * Counts requests and retries in a ring of {@link BUCKETS} buckets of windowMs / 10 each. An event stops counting
 * between 0.9 × windowMs and windowMs after it happened, when its bucket is reused.
 *
 * @example
 * budget.recordRequest(now);                  // once per logical request
 * if (canRetry && budget.tryAcquire(now)) { … } // once per retry
 */
export class RetryBudget {
  private readonly ratio: number;
  private readonly floor: number;
  private readonly bucketMs: number;
  private readonly requests: number[] = new Array<number>(BUCKETS).fill(0);
  private readonly retries: number[] = new Array<number>(BUCKETS).fill(0);
  private requestTotal = 0;
  private retryTotal = 0;
  /** Absolute index (floor(now / bucketMs)) of the newest bucket. */
  private head = Number.NEGATIVE_INFINITY;

  constructor(options: RetryBudgetOptions) {
    const { ratio, minPerSecond, windowMs } = options;
    if (!(ratio >= 0) || !(minPerSecond >= 0) || !(windowMs > 0)) {
      throw new RangeError('retry budget needs ratio ≥ 0, minPerSecond ≥ 0 and windowMs > 0');
    }
    this.ratio = ratio;
    this.floor = (minPerSecond * windowMs) / 1000;
    this.bucketMs = windowMs / BUCKETS;
  }

  /** A logical request started (call once per logical request, not per attempt). */
  recordRequest(now: number): void {
    const slot = this.advance(now);
    this.requests[slot] = (this.requests[slot] ?? 0) + 1;
    this.requestTotal++;
  }

  /**
   * Takes one retry if the budget allows: retries in the window < max(ratio × requests in the window,
   * minPerSecond × windowMs / 1000). Records it when granted.
   */
  tryAcquire(now: number): boolean {
    const slot = this.advance(now);
    if (this.retryTotal >= Math.max(this.ratio * this.requestTotal, this.floor)) return false;
    this.retries[slot] = (this.retries[slot] ?? 0) + 1;
    this.retryTotal++;
    return true;
  }

  /** Expires the buckets that `now` has moved past and returns the slot of the current one. */
  private advance(now: number): number {
    const bucket = Math.floor(now / this.bucketMs);
    if (bucket > this.head) {
      if (bucket - this.head >= BUCKETS) {
        this.requests.fill(0);
        this.retries.fill(0);
        this.requestTotal = 0;
        this.retryTotal = 0;
      } else {
        for (let b = this.head + 1; b <= bucket; b++) this.clear(slotOf(b));
      }
      this.head = bucket;
    }
    // A clock that steps back (it should not: callers pass a monotonic clock) counts in the newest bucket.
    return slotOf(this.head);
  }

  private clear(slot: number): void {
    this.requestTotal -= this.requests[slot] ?? 0;
    this.retryTotal -= this.retries[slot] ?? 0;
    this.requests[slot] = 0;
    this.retries[slot] = 0;
  }
}

function slotOf(bucket: number): number {
  return ((bucket % BUCKETS) + BUCKETS) % BUCKETS;
}
