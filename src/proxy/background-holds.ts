/**
 * Background responses hold their tenant's limits until they end (docs/security.md, "Background responses").
 *
 * `POST /v1/responses` with `background: true` is answered at once with a `queued` acknowledgement while vLLM goes on
 * generating in the process that took it. Settled at the acknowledgement, such a request would free its
 * `max_concurrent` slot and keep only its reservation while the generation runs on: a tenant could start any number
 * of them. So an admitted background request that has not ended when its exchange settles hands its LimitTicket here:
 * the slot stays taken and the reservation stands until its home upstream (the one that answered) says it ended —
 * `completed`, `incomplete`, `failed` or `cancelled` — and then the ticket is settled with the final response's usage.
 * It is asked every interval, and at once when a client reads the response through the gateway (`nudge`).
 *
 * Everything is bounded: the responses held (`maxWatched`; past it one is settled at once, as before), the polls in
 * flight across the process (`maxPolls`; the others wait an interval), each poll's time and body
 * (`pollTimeoutMs`; the body at most health.max_body_bytes, read like every own read — a larger one is a failed poll,
 * never an early end), and how long a hold can last (`maxHoldMs`: a home that restarted and answers 404
 * ends it at once as `lost`, one that never answers ends it at the deadline). The poll goes where
 * `GET /v1/responses/{id}` goes — the home upstream's path, with its API key — on the configuration in force at the
 * time (a reload may have replaced the upstream's connections).
 *
 * The meaning of a polled answer is pure (`readPolled`); the class is the shell: timers and sockets.
 */
import { isRecord } from '../util/json.js';
import { classifyResponsesBody } from '../sse/route-events.js';
import { usedTokens, type LimitTicket } from './tenant-limits.js';
import { ReadStopped, type Upstream } from './upstreams.js';

import type { BackgroundHoldEnd } from '../telemetry/labels.js';

/** How a hold ended (`waybill_background_holds_ended_total{how}`): a closed set of telemetry/labels.ts. */

export interface BackgroundHoldSettings {
  readonly pollIntervalMs: number;
  readonly maxHoldMs: number;
  readonly maxPolls: number;
  readonly maxWatched: number;
  /** Each poll's deadline, headers and body included (responses.lookup_timeout). */
  readonly pollTimeoutMs: number;
}

export interface BackgroundHoldDeps {
  readonly settings: BackgroundHoldSettings;
  /** The upstream of this name in the configuration in force now; undefined when a reload removed it. */
  readonly upstream: (name: string) => Upstream | undefined;
  readonly now: () => number;
  readonly onEnded?: (how: BackgroundHoldEnd) => void;
  readonly onHolding?: (count: number) => void;
  /** A settle or a bookkeeping step that threw (a bug): reported, the hold still ends. */
  readonly onError?: (error: unknown) => void;
}

/** What one poll of a held response says. */
export type Polled =
  /** It ended: settle with its usage (prompt + completion; undefined when it reported none: the reservation stands). */
  | { readonly kind: 'ended'; readonly usedTokens: number | undefined }
  /** Its home does not have it (restarted, or it expired there): nothing more will be learned. */
  | { readonly kind: 'lost' }
  /** Still running, or no answer worth believing (an error, a body that is not a response): ask again. */
  | { readonly kind: 'pending' };

const ENDED = new Set(['completed', 'incomplete', 'failed', 'cancelled']);

/** The meaning of a `GET /v1/responses/{id}` answer for a held response: its status and parsed body (undefined: unreadable). */
export function readPolled(status: number, body: unknown): Polled {
  if (status === 404) return { kind: 'lost' };
  if (status < 200 || status >= 300 || !isRecord(body)) return { kind: 'pending' };
  const state = body['status'];
  if (typeof state !== 'string' || !ENDED.has(state)) return { kind: 'pending' };
  const facts = classifyResponsesBody(body);
  return { kind: 'ended', usedTokens: facts.kind === 'chunk' ? usedTokens(facts.usage) : undefined };
}

interface Hold {
  readonly id: string;
  /** The upstream of the newest answer under this id: where the response now lives. */
  upstream: string;
  /**
   * Oldest first. More than one when a tenant created a background response again under its own `request_id` while
   * the first still ran: vLLM replaced the stored one, the first generation may run on, so every slot stays held
   * until the id's response ends (the newest is charged its usage; the others keep their reservations).
   */
  readonly tickets: LimitTicket[];
  deadline: number;
  timer: NodeJS.Timeout | undefined;
}

export class BackgroundHolds {
  private readonly holds = new Map<string, Hold>();
  private polls = 0;
  private closed = false;

  /** Tickets held across every hold: what `maxWatched` bounds. */
  private tickets = 0;

  constructor(private readonly deps: BackgroundHoldDeps) {}

  get size(): number {
    return this.holds.size;
  }

  /**
   * Holds `ticket` until response `id` on upstream `upstream` ends. False when it cannot be held (too many held, the
   * gateway closing): the caller settles the ticket as it would have.
   */
  hold(id: string, upstream: string, ticket: LimitTicket): boolean {
    if (this.closed) return false;
    if (this.tickets >= this.deps.settings.maxWatched) {
      this.deps.onEnded?.('overflow');
      return false;
    }
    this.tickets++;
    const held = this.holds.get(id);
    if (held !== undefined) {
      // The same id again (a client-chosen request_id reused): held with the first, never released at its answer.
      held.tickets.push(ticket);
      held.upstream = upstream;
      held.deadline = this.deps.now() + this.deps.settings.maxHoldMs;
      return true;
    }
    const hold: Hold = { id, upstream, tickets: [ticket], deadline: this.deps.now() + this.deps.settings.maxHoldMs, timer: undefined };
    this.holds.set(id, hold);
    this.deps.onHolding?.(this.holds.size);
    this.schedule(hold);
    return true;
  }

  /**
   * A client read response `id` through the gateway: if it is held, its home is asked now rather than at the next
   * interval (within the same bound on polls in flight), so a client that saw its response end finds its slot free
   * soon after.
   */
  nudge(id: string): void {
    const hold = this.holds.get(id);
    if (hold?.timer === undefined) return;
    clearTimeout(hold.timer);
    hold.timer = setTimeout(() => void this.tick(hold), 0);
    hold.timer.unref();
  }

  /** Ends every hold (the gateway is closing): slots released, reservations kept. */
  close(): void {
    this.closed = true;
    for (const hold of [...this.holds.values()]) this.end(hold, 'shutdown', undefined);
  }

  private schedule(hold: Hold): void {
    const wait = Math.max(0, Math.min(this.deps.settings.pollIntervalMs, hold.deadline - this.deps.now()));
    hold.timer = setTimeout(() => void this.tick(hold), wait);
    // A hold never keeps the process alive: it ends with the gateway's close.
    hold.timer.unref();
  }

  private async tick(hold: Hold): Promise<void> {
    hold.timer = undefined;
    if (this.holds.get(hold.id) !== hold) return;
    if (this.deps.now() >= hold.deadline) {
      this.end(hold, 'deadline', undefined);
      return;
    }
    const upstream = this.deps.upstream(hold.upstream);
    if (upstream === undefined || this.polls >= this.deps.settings.maxPolls) {
      this.schedule(hold);
      return;
    }
    this.polls++;
    let polled: Polled;
    try {
      polled = await this.poll(upstream, hold.id);
    } catch {
      polled = { kind: 'pending' };
    } finally {
      this.polls--;
    }
    if (this.holds.get(hold.id) !== hold) return;
    if (polled.kind === 'ended') this.end(hold, 'ended', polled.usedTokens);
    else if (polled.kind === 'lost') this.end(hold, 'lost', undefined);
    else this.schedule(hold);
  }

  private async poll(upstream: Upstream, id: string): Promise<Polled> {
    let answer: { status: number; body: string };
    try {
      // Read like every body the gateway reads for itself: health.max_body_bytes, within the poll's deadline.
      answer = await upstream.get(`/v1/responses/${encodeURIComponent(id)}`, this.deps.settings.pollTimeoutMs, 'background');
    } catch (error) {
      // Too large to read (counted by the read): it may be the tenant's own doing — vLLM's response object echoes the
      // request's tools, instructions and metadata — so it never frees the slot early. Asked again at the next
      // interval, each poll bounded by the limit, until the response reads as ended or the hold's deadline.
      if (error instanceof ReadStopped) return { kind: 'pending' };
      throw error;
    }
    if (answer.status < 200 || answer.status >= 300) return readPolled(answer.status, undefined);
    let body: unknown;
    try {
      body = JSON.parse(answer.body);
    } catch {
      body = undefined;
    }
    return readPolled(answer.status, body);
  }

  private end(hold: Hold, how: BackgroundHoldEnd, used: number | undefined): void {
    if (hold.timer !== undefined) clearTimeout(hold.timer);
    hold.timer = undefined;
    this.holds.delete(hold.id);
    this.tickets -= hold.tickets.length;
    hold.tickets.forEach((ticket, i) => {
      try {
        ticket.settle(i === hold.tickets.length - 1 ? used : undefined);
      } catch (error) {
        this.deps.onError?.(error);
      }
    });
    this.deps.onHolding?.(this.holds.size);
    this.deps.onEnded?.(how);
  }
}
