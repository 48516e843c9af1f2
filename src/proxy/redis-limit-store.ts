/**
 * Limits per tenant shared by every replica (docs/security.md, "Limits per tenant"): a LimitStore whose counts live in
 * Redis (`limits.redis_url`), so N gateways in front of one pool enforce one limit.
 *
 * - **One script per step.** `reserve` is one Lua script that reads the tenant's counts, applies the same rule as
 *   `decide` (all limits checked, then the request, its tokens and its slot counted together, or nothing), and
 *   answers the counts it saw; `decide` then rebuilds the full Decision (refusal, Retry-After, headers) from them.
 *   `settle` is one script (the `correction` rule); `release` one ZREM. Redis runs each atomically: concurrent
 *   admissions from any number of replicas see each other's counts, so a limit is exact, not approximate.
 * - **Time is Redis's** (`redis.call('TIME')`), in the scripts, never the caller's: the gateway's own clock is
 *   monotonic per process (performance.now(), which starts near 0 in each), and the wall clocks of replicas differ;
 *   every replica must agree on which 60 s window is open and when a slot expires. The `now` the limiter passes is
 *   ignored.
 * - **Keys** (prefix `limits.redis_key_prefix`, default `waybill:limits`; the tenant in braces, a Redis Cluster hash
 *   tag, so a tenant's keys share a slot and every key a script touches is passed in KEYS):
 *   - `<prefix>:{<tenant>}:window` — a hash of the open window's number and its `requests` and `tokens`, reset when a
 *     request first counts in a new window, expiring 1 s after its window ends.
 *   - `<prefix>:{<tenant>}:inflight` — a sorted set of the admitted requests' tickets (random ids), each scored by
 *     when its slot expires: a lease (`limits.redis_slot_lease`, 10 s by default) that the process holding the slot
 *     renews while the request runs (every third of the lease, one script per tenant for all its tickets), never
 *     past admission + `timeouts.total` + the drain grace + a margin (a request always settles before then; a
 *     ticket still held after that is not renewed). A process that dies (a crashed replica, a SIGKILLed worker)
 *     renews nothing: its slots expire within one lease instead of holding the tenant's `max_concurrent` for the
 *     longest a request may run (every admission first removes the expired ones). A renewal re-adds a ticket whose
 *     lease ran out while its request still runs (Redis unreachable for longer than a lease): the count is exact
 *     again as soon as Redis answers. Only for tenants with `max_concurrent`.
 * - **Failures.** Every command has one deadline, `limits.redis_timeout`, waiting for a connection included: an
 *   admission never waits longer. A command that misses it (or fails) rejects with LimitStoreUnavailable, counted by
 *   op through `onError`; the limiter then admits the request unlimited (fail open: its ticket counted nothing and
 *   gives nothing back) or refuses it (fail closed). While the connection is known to be down, commands fail at once
 *   rather than each waiting out the deadline; the client reconnects in the background. Up/down transitions (not
 *   each failure) go to `onState`, for one log line and the `waybill_limit_store_up` gauge.
 * - **Late answers.** A command that missed its deadline was sent, and Redis may still run it (a stall, not a cut):
 *   - a reserve that Redis admits late counted a request that was served unlimited (or refused) meanwhile: the late
 *     answer is undone by one script (its request, its tokens, its slot), so a stall charges nobody;
 *   - a reserve or release whose fate is unknown (the connection closed first, or it could not be sent) leaves a
 *     slot that may be held: its ticket is kept and removed (ZREM, idempotent) as soon as Redis is ready again,
 *     instead of holding the slot until it expires. Its request and tokens stay counted (erring strict, by at most
 *     the admissions cut off that way). At most MAX_PENDING_RELEASES tickets wait; beyond, the slots expire.
 * - **A silent Redis.** A Redis that accepts commands and answers none (stopped, swapping, a network black hole)
 *   keeps the connection "ready": after STALL_AFTER deadlines missed in a row the store counts itself down and fails
 *   every command at once, instead of each admission waiting out the deadline, until Redis answers anything again (a
 *   PING is left waiting for that).
 *
 * The scripts are redis-limit-scripts.ts.
 * Longer than 400 lines on purpose: this comment is the store's design, one failure mode and its answer per item,
 * kept beside the code that answers it.
 */
import { randomUUID } from 'node:crypto';
import { Redis, ReplyError } from 'ioredis';
import { RENEW, RESERVE, SETTLE, UNDO, type ReserveReply, type ScriptedRedis } from './redis-limit-scripts.js';
import { decide, type Counts, type Decision, type LimitStore, type Reservation, type TenantLimits } from './tenant-limits.js';
import type { LimitStoreOp } from '../telemetry/labels.js';

/** The store's operations, as `waybill_limit_store_errors_total{op}` counts their failures (telemetry/labels.ts). */
export { LIMIT_STORE_OPS } from '../telemetry/labels.js';

/** A store operation that failed or missed its deadline: already counted and logged by the store. */
export class LimitStoreUnavailable extends Error {
  constructor(
    readonly op: LimitStoreOp,
    cause: unknown,
  ) {
    super(`limit store ${op} failed: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
    this.name = 'LimitStoreUnavailable';
  }
}

export interface RedisLimitStoreOptions {
  /** redis:// or rediss://, with an optional user, password and database. */
  readonly url: string;
  /** Overrides the URL's password (limits.redis_password_env). */
  readonly password?: string | undefined;
  /** Each operation's deadline, waiting for a connection included (limits.redis_timeout). */
  readonly timeoutMs: number;
  /** limits.redis_key_prefix. */
  readonly keyPrefix: string;
  /** How long an in-flight slot lives unless released: the longest a request can run, and a margin. */
  readonly inflightTtlMs: number;
  /**
   * How long a slot lives unless its holder renews it (limits.redis_slot_lease): renewed every third of it while
   * its request runs, so a process that dies gives its slots back within one lease. Default: inflightTtlMs alone.
   */
  readonly slotLeaseMs?: number | undefined;
  /** Each failed operation. */
  readonly onError?: (op: LimitStoreOp, error: unknown) => void;
  /** The store answers again (up) or stopped answering (down, with why): once per transition. */
  readonly onState?: (up: boolean, error: unknown) => void;
}

/** What a request admitted through Redis holds: its slot's member in the in-flight set. */
interface RedisReservation extends Reservation {
  readonly ticket: string;
}

/** Tickets renewed by one script call, at most (a tenant with more takes several). */
const RENEW_BATCH = 500;

/** Deadlines missed in a row after which Redis counts as silent (see the module's comment). */
export const STALL_AFTER = 3;
/** Tickets of slots whose release is owed, at most (see the module's comment). */
export const MAX_PENDING_RELEASES = 10_000;

/** What becomes of a command that failed: whether Redis may have run it, and its answer if one comes late. */
interface Aftermath<T> {
  /** Redis answered after the deadline. */
  readonly late?: (reply: T) => void;
  /** The connection closed before an answer: it may or may not have run. */
  readonly unknown?: () => void;
  /** Never sent: it did not run. */
  readonly unsent?: () => void;
}

/** Where a Redis URL points, for logs: never its user or password. */
export function redisTarget(url: string): string {
  const parsed = new URL(url);
  return `${parsed.protocol}//${parsed.host}${parsed.pathname}`;
}

export class RedisLimitStore implements LimitStore {
  private readonly client: Redis;
  private readonly scripted: ScriptedRedis;
  /** Whether the store answers: undefined until the first connection or failure. */
  private up: boolean | undefined;
  /** Callers waiting for the connection to become ready. */
  private readonly waiting = new Set<{ resolve: () => void; reject: (error: Error) => void }>();
  private closing = false;
  /** Deadlines missed in a row with the command sent; STALL_AFTER of them: Redis is silent. */
  private misses = 0;
  /** A PING sent while Redis is silent: any answer ends the silence. */
  private probe: Promise<unknown> | undefined;
  /** Slots whose release is owed, by in-flight key: removed once Redis is ready again. */
  private readonly owed = new Map<string, Set<string>>();
  private owedCount = 0;
  /** The slots this process holds, by in-flight key: each ticket with the local time its lease stops being renewed. */
  private readonly held = new Map<string, Map<string, number>>();
  private readonly leaseMs: number;
  private renewer: NodeJS.Timeout | undefined;

  constructor(private readonly options: RedisLimitStoreOptions) {
    this.client = new Redis(options.url, {
      ...(options.password !== undefined && { password: options.password }),
      connectionName: 'waybill',
      // A command is sent only when it can be answered within its deadline: never queued while disconnected and sent
      // later (a stale admission would count a request that was already served or refused), nor re-sent after a
      // reconnect (it may have run).
      enableOfflineQueue: false,
      autoResendUnfulfilledCommands: false,
      maxRetriesPerRequest: 0,
      connectTimeout: Math.max(1000, options.timeoutMs * 4),
      // Reconnects in the background, soon: limits apply again within a second of Redis coming back.
      retryStrategy: (times) => Math.min(times * 100, 1000),
    });
    this.client.defineCommand('waybillReserve', { numberOfKeys: 2, lua: RESERVE });
    this.client.defineCommand('waybillSettle', { numberOfKeys: 1, lua: SETTLE });
    this.client.defineCommand('waybillUndo', { numberOfKeys: 2, lua: UNDO });
    this.client.defineCommand('waybillRenew', { numberOfKeys: 1, lua: RENEW });
    this.leaseMs = Math.min(options.slotLeaseMs ?? options.inflightTtlMs, options.inflightTtlMs);
    this.scripted = this.client as unknown as ScriptedRedis;
    this.client.on('ready', () => {
      this.answered();
      for (const waiter of this.waiting) waiter.resolve();
      this.waiting.clear();
    });
    // ioredis reports every failed connection attempt here: without a listener, it would print each.
    this.client.on('error', (error: Error) => this.disconnected(error));
    this.client.on('close', () => this.disconnected(new Error('connection closed')));
  }

  reserve(tenant: string, limits: TenantLimits, tokens: number, _now: number): Promise<Decision> {
    const reserved = Math.max(0, Math.ceil(tokens));
    const ticket = randomUUID();
    const concurrent = limits.maxConcurrent !== undefined;
    const { window, inflight } = this.keys(tenant);
    const args = [limits.requestsPerMinute ?? 0, limits.tokensPerMinute ?? 0, limits.maxConcurrent ?? 0, reserved, ticket, this.leaseMs];
    // The lease is renewed until the latest a request can settle, counted from now (before Redis answers: never later).
    const renewUntil = performance.now() + this.options.inflightTtlMs;
    const aftermath: Aftermath<ReserveReply> = {
      // Admitted after its caller gave up: the request was served unlimited or refused meanwhile; nothing of it stays.
      late: (reply) => {
        if (Number(reply[0]) === 1) this.undo(window, inflight, Number(reply[1]), reserved, ticket);
      },
      unknown: () => {
        if (concurrent) this.owe(inflight, ticket);
      },
    };
    return this.run('reserve', () => this.scripted.waybillReserve(window, inflight, ...args), aftermath).then(
      (reply) => {
        const [admitted, windowNumber, requests, used, inflightCount, now] = reply.map(Number) as ReserveReply;
        const counts: Counts = { window: windowNumber, requests, tokens: used, inflight: inflightCount };
        const decision = decide(tenant, limits, counts, reserved, now);
        if (decision.admitted !== (admitted === 1)) throw new Error(`the reserve script and decide disagree for tenant ${tenant}: ${JSON.stringify(reply)}`);
        if (!decision.admitted) return decision;
        if (concurrent) this.hold(inflight, ticket, renewUntil);
        const reservation: RedisReservation = { ...decision.reservation, ticket };
        return { ...decision, reservation };
      },
    );
  }

  async settle(reservation: Reservation, usedTokens: number | undefined, _now: number): Promise<void> {
    // No usage: the reservation stands, whatever the window.
    if (usedTokens === undefined) return;
    const { window } = this.keys(reservation.tenant);
    await this.run('settle', () => this.scripted.waybillSettle(window, reservation.window, reservation.tokens, Math.max(0, Math.ceil(usedTokens))));
  }

  async release(reservation: Reservation): Promise<void> {
    if (!reservation.concurrent) return;
    const ticket = (reservation as Partial<RedisReservation>).ticket;
    if (ticket === undefined) return;
    const { inflight } = this.keys(reservation.tenant);
    // No longer renewed, whatever becomes of the ZREM (owed, or the lease runs out).
    this.unhold(inflight, ticket);
    await this.run('release', () => this.client.zrem(inflight, ticket), { unknown: () => this.owe(inflight, ticket), unsent: () => this.owe(inflight, ticket) });
  }

  /** Closes the connection: pending replies are awaited up to the deadline, then it is cut. */
  async close(): Promise<void> {
    this.closing = true;
    clearInterval(this.renewer);
    this.renewer = undefined;
    this.rejectWaiting(new Error('closed'));
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([this.client.quit(), new Promise((resolve) => (timer = setTimeout(resolve, this.options.timeoutMs)))]);
    } catch {
      // Not connected: nothing to wait for.
    } finally {
      clearTimeout(timer);
      this.client.disconnect();
    }
  }

  private keys(tenant: string): { window: string; inflight: string } {
    const base = `${this.options.keyPrefix}:{${tenant}}`;
    return { window: `${base}:window`, inflight: `${base}:inflight` };
  }

  private hold(inflight: string, ticket: string, renewUntil: number): void {
    if (this.closing) return;
    let tickets = this.held.get(inflight);
    if (tickets === undefined) this.held.set(inflight, (tickets = new Map<string, number>()));
    tickets.set(ticket, renewUntil);
    // Renewed while anything is held; a process holding nothing sends nothing.
    this.renewer ??= setInterval(() => this.renew(), Math.max(100, Math.floor(this.leaseMs / 3))).unref();
  }

  private unhold(inflight: string, ticket: string): void {
    const tickets = this.held.get(inflight);
    if (tickets === undefined) return;
    tickets.delete(ticket);
    if (tickets.size > 0) return;
    this.held.delete(inflight);
    if (this.held.size === 0) {
      clearInterval(this.renewer);
      this.renewer = undefined;
    }
  }

  /**
   * Renews the lease of every slot held, one script per tenant (a batch of RENEW_BATCH tickets each). Best effort:
   * sent only while Redis answers; a renewal that fails is the next one's to do (a lease outlives two misses), and
   * a ticket past the latest its request can settle is dropped, left to expire.
   */
  private renew(): void {
    const at = performance.now();
    for (const [inflight, tickets] of [...this.held]) {
      const args: Array<string | number> = [];
      for (const [ticket, until] of [...tickets]) {
        const left = Math.floor(until - at);
        if (left <= 0) {
          this.unhold(inflight, ticket);
          continue;
        }
        args.push(Math.min(this.leaseMs, left), ticket);
      }
      if (this.client.status !== 'ready' || this.probe !== undefined) continue;
      for (let i = 0; i < args.length; i += RENEW_BATCH * 2) {
        this.scripted.waybillRenew(inflight, ...args.slice(i, i + RENEW_BATCH * 2)).catch(() => undefined);
      }
    }
  }

  /**
   * Runs one command within the deadline, the wait for a connection included. A command is sent only while its
   * deadline has not passed: one that was waiting for the connection is dropped, never sent late. What becomes of a
   * command that failed goes to `aftermath`: its late answer, or that its fate is unknown.
   */
  private async run<T>(op: LimitStoreOp, command: () => Promise<T>, aftermath: Aftermath<T> = {}): Promise<T> {
    let timer: NodeJS.Timeout | undefined;
    let expired = false;
    let sent: Promise<T> | undefined;
    const deadline = new Promise<never>((_resolve, reject) => {
      timer = setTimeout(() => {
        expired = true;
        reject(new Error(`no answer within ${this.options.timeoutMs} ms`));
      }, this.options.timeoutMs);
    });
    try {
      const result = await Promise.race([
        this.connected().then(() => {
          if (expired) throw new Error('deadline passed while connecting');
          sent = command();
          return sent;
        }),
        deadline,
      ]);
      this.answered();
      return result;
    } catch (error) {
      this.options.onError?.(op, error);
      this.transition(false, error);
      this.aftermath(sent, expired, aftermath);
      throw new LimitStoreUnavailable(op, error);
    } finally {
      clearTimeout(timer);
    }
  }

  /** A failed command's aftermath: never sent, cut off, or still on its way (then its answer, or the cut, decides). */
  private aftermath<T>(sent: Promise<T> | undefined, expired: boolean, aftermath: Aftermath<T>): void {
    if (sent === undefined) {
      aftermath.unsent?.();
      return;
    }
    if (!expired) {
      // Redis answered with an error (the script ran and failed: it counted nothing), or the connection closed.
      sent.catch((error: unknown) => {
        if (!(error instanceof ReplyError)) aftermath.unknown?.();
      });
      return;
    }
    this.misses += 1;
    if (this.misses >= STALL_AFTER) this.silent();
    sent.then(
      (reply) => {
        this.answered();
        aftermath.late?.(reply);
      },
      (error: unknown) => {
        if (!(error instanceof ReplyError)) aftermath.unknown?.();
      },
    );
  }

  /** Redis answered: it is up, and not silent. */
  private answered(): void {
    this.misses = 0;
    this.probe = undefined;
    this.transition(true, undefined);
    if (this.owedCount > 0) this.payOwed();
  }

  /** Redis stopped answering a live connection: commands fail at once until it answers the probe (or anything). */
  private silent(): void {
    if (this.probe !== undefined || this.client.status !== 'ready') return;
    const probe = this.client.ping().then(
      () => {
        if (this.probe === probe) this.answered();
      },
      () => undefined,
    );
    this.probe = probe;
  }

  /** Takes back a reserve Redis ran late; if that fails, at least its slot is owed. */
  private undo(window: string, inflight: string, windowNumber: number, tokens: number, ticket: string): void {
    if (this.client.status !== 'ready') {
      this.owe(inflight, ticket);
      return;
    }
    this.scripted.waybillUndo(window, inflight, windowNumber, tokens, ticket).catch(() => this.owe(inflight, ticket));
  }

  /** A slot that may be held: removed as soon as Redis answers again (ready, or any command's answer). */
  private owe(inflight: string, ticket: string): void {
    if (this.closing || this.owedCount >= MAX_PENDING_RELEASES) return;
    let tickets = this.owed.get(inflight);
    if (tickets === undefined) this.owed.set(inflight, (tickets = new Set()));
    if (tickets.has(ticket)) return;
    tickets.add(ticket);
    this.owedCount += 1;
    // Paid by the next answer Redis gives (answered), never from here: a connection that fails every command at
    // once would otherwise send and fail forever.
  }

  /** Sends the owed releases (ZREM is idempotent: one that fails again is owed again). */
  private payOwed(): void {
    if (this.client.status !== 'ready') return;
    const owed = [...this.owed];
    this.owed.clear();
    this.owedCount = 0;
    for (const [inflight, tickets] of owed) {
      const members = [...tickets];
      this.client.zrem(inflight, ...members).catch((error: unknown) => {
        // An error reply would fail again: only a cut connection is worth another try.
        if (!(error instanceof ReplyError)) for (const ticket of members) this.owe(inflight, ticket);
      });
    }
  }

  /** Resolves when commands can be sent; fails at once while the store is known to be down and not reconnected. */
  private connected(): Promise<void> {
    if (this.probe !== undefined) return Promise.reject(new Error(`Redis answered none of the last ${STALL_AFTER} commands within ${this.options.timeoutMs} ms`));
    if (this.client.status === 'ready') return Promise.resolve();
    if (this.closing || this.client.status === 'end') return Promise.reject(new Error('closed'));
    if (this.up === false) return Promise.reject(new Error(`not connected (${this.client.status})`));
    return new Promise((resolve, reject) => {
      const waiter = {
        resolve: () => {
          this.waiting.delete(waiter);
          resolve();
        },
        reject: (error: Error) => {
          this.waiting.delete(waiter);
          reject(error);
        },
      };
      this.waiting.add(waiter);
    });
  }

  private disconnected(error: Error): void {
    this.rejectWaiting(error);
    if (!this.closing) this.transition(false, error);
  }

  private rejectWaiting(error: Error): void {
    for (const waiter of [...this.waiting]) waiter.reject(error);
  }

  private transition(up: boolean, error: unknown): void {
    if (this.up === up || this.closing) return;
    this.up = up;
    this.options.onState?.(up, error);
  }
}
