/**
 * The shell around one logical request's delivery machine (delivery/machine.ts): it turns what happens on sockets,
 * timers and the admission gate into machine events, stamped with the injected clock, and carries out the effects
 * the machine answers with. It decides nothing.
 *
 * Events are handled one at a time, in order: an effect that makes something happen synchronously (an abort that
 * undici reports at once, a write that fills the socket) queues its event behind the effects still to run, so the
 * machine never sees a report from inside its own step.
 *
 * Longer than 400 lines on purpose: the Exchange is one object per request whose effect executors share its socket,
 * its timers, its attempt and its event queue; split, each executor would reach back into the others' state.
 */
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Logger } from 'pino';
import { ANONYMOUS, type ProxiedRoute, type RetryReason } from '../accounting/outcomes.js';
import type { RequestInfo } from '../accounting/ledger.js';
import type { Config } from '../config/load.js';
import { machineSettings } from './request-facts.js';
import { DeliveryMachine, type Effect, type MachineEvent, type Observation, type TimerName } from '../delivery/machine.js';
import { createDeliveryObserver } from '../telemetry/delivery-observer.js';
import type { ObserverGuard } from '../telemetry/guard.js';
import type { GatewayMetrics } from '../telemetry/metrics.js';
import type { RequestTrace } from '../telemetry/request-trace.js';
import type { PublishSettlement } from '../telemetry/settlement.js';
import type { Admission } from './admission.js';
import { Attempt, type TurnShare } from './attempt.js';
import { ClientWriter } from './client-writer.js';
import { EventQueue } from './event-queue.js';
import { withHeaders, type FlatHeaders } from './headers.js';
import type { ReadTurns } from './read-turns.js';
import type { ResponseHomes } from './response-homes.js';
import type { ResponseOwners } from './response-owners.js';
import { chargedTokens, type LimitTicket } from './tenant-limits.js';
import type { BackgroundHolds } from './background-holds.js';
import type { RoutingOutcome, Settlement } from '../accounting/ledger.js';
import { withRouting } from '../accounting/settle.js';
import type { Pick, RoutingKey } from '../routing/router.js';
import type { ModelControls, Upstream, UpstreamRegistry } from './upstreams.js';
import type { LiveEntry } from '../util/live-list.js';

export interface ExchangeDeps {
  readonly config: Config;
  readonly upstreams: UpstreamRegistry;
  readonly metrics: GatewayMetrics;
  readonly logger: Logger;
  /** Monotonic milliseconds: the one clock of every decision. */
  readonly now: () => number;
  /** Wall-clock milliseconds, only to read HTTP dates (Retry-After). */
  readonly wallNow: () => number;
  readonly random: () => number;
  /** Observers of the settled request (span, metrics, log line, hooks), each unable to break the others. */
  readonly publish: PublishSettlement;
  /** Reports errors caught inside the exchange or its observers. */
  readonly guard: ObserverGuard;
  /** Called once the exchange holds nothing any more (for the shutdown drain). */
  readonly onDone?: (exchange: Exchange) => void;
  /** Which upstream holds each stored response: learned from every /v1/responses answer. */
  readonly homes?: ResponseHomes;
  /** Whose each stored response is: the tenant of every /v1/responses answer's id. */
  readonly owners?: ResponseOwners;
  /** The process's turns, whose budget answering streams share (read-turns.ts); absent: they never yield. */
  readonly readTurns?: ReadTurns;
  /** Where a background response that has not ended keeps its hold on its tenant's limits (background-holds.ts). */
  readonly backgroundHolds?: BackgroundHolds;
  /** A worker's account to its primary of the requests it holds (app/worker-link.ts), counted if the worker dies. */
  readonly held?: HeldRequests | undefined;
}

/** The labels a request in flight is known by, before it settles. */
export interface HeldLabels {
  readonly model: string;
  readonly tenant: string;
  readonly route: ProxiedRoute;
  readonly stream: boolean;
}

/** Where a worker tells its primary which requests it holds: from the exchange's start to its settlement. */
export interface HeldRequests {
  begin(labels: HeldLabels): HeldRequest;
}

export interface HeldRequest {
  /** The response head went out with `status`: the client has seen it. */
  answered(status: number): void;
  /** Settled (counted by the worker itself). */
  ended(): void;
}

/**
 * One request as the route checked it: its facts for the delivery machine and the ledger (`info`, built once by the
 * route, http/dispatch.ts) and what the shell needs to send it upstream.
 */
export interface CompletionRequest {
  /** The request's facts: route, model (the served name, a key of the upstream registry), tenant, stream, choices, contract, … */
  readonly info: RequestInfo & { readonly route: ProxiedRoute };
  /** The request's hold on its tenant's limits (tenant-limits.ts): settled, and its slot freed, when the request settles. */
  readonly limit?: LimitTicket;
  /** A Responses request with `background: true`: its generation may go on after the request settles. */
  readonly background?: boolean;
  /** Upstream API path, e.g. /v1/chat/completions (with the query, if any). */
  readonly apiPath: string;
  /** POST unless given; a GET or DELETE has no body. */
  readonly method?: 'GET' | 'POST' | 'PUT' | 'DELETE';
  /** Every attempt goes to this upstream (it alone holds what the request reads: a stored response). */
  readonly pinned?: Upstream;
  /** The stored response id the request reads or cancels: its remembered home is forgotten on a 404. */
  readonly storedId?: string;
  /** The body to send upstream (the client's bytes, or with usage requested). */
  readonly body: Buffer;
  readonly requestId: string;
  /** Headers for every upstream attempt (see upstreamHeaders). */
  readonly headers: FlatHeaders;
  readonly arrivalAt: number;
  readonly trace: RequestTrace;
  /** The request's prefix blocks and session for the pool's cache_aware picking (src/routing/router.ts). */
  readonly routing?: RoutingKey | undefined;
}

interface ArmedTimer {
  readonly handle: NodeJS.Timeout;
  readonly ms: number;
}

export class Exchange {
  private readonly machine: DeliveryMachine;
  private readonly controls: ModelControls;
  /** Kept from the start: Node detaches it from the response once the response is done. */
  private readonly socket: Socket | null;
  /** Events that came while a step's effects were carried out, with when they happened. */
  private readonly pending = new EventQueue<MachineEvent>();
  /**
   * The last pick and its attempt's number, for the settlement's routing outcome (the answering attempt's pick). Fields,
   * not collections, here and below: a Map is a few hundred bytes per request, kept for its life (issue 27).
   */
  private lastPick: Pick<Upstream> | undefined;
  private lastPickNumber = 0;
  /** The session's idle gap at this request's start, when it names one. */
  private sessionGap: { gapMs: number | null; gapClass: string } | undefined;
  private running = false;
  /** Attempts not yet over (the current one, and a replaced one still closing): one or two. */
  private readonly attempts: Attempt[] = [];
  private current: Attempt | undefined;
  /** The timers armed now, by name. */
  private readonly timers: Record<TimerName, ArmedTimer | undefined> = { total: undefined, first_output: undefined, idle: undefined, drain: undefined, retry: undefined, linger: undefined };
  private admission: Admission | undefined;
  private queueAbort: AbortController | undefined;
  private readonly observe: (observation: Observation) => void;
  /** How attempts report: straight into the event queue. */
  private readonly report = (event: MachineEvent, at?: number) => this.send(event, at);
  private readonly drained = () => this.send({ type: 'client_drain' });
  /**
   * An attempt's read that may be one ordinary delta event of a committed stream: the machine takes it whole
   * (DeliveryMachine.ordinaryRead) and its one effect, the write, is carried out here. Not while a step's effects are
   * being carried out: what comes then waits its turn in the queue, as an event. A throw (a bug) ends the request as
   * one inside a step or an effect does, an internal error; the read, taken, is not framed again.
   */
  private readonly ordinaryRead = (attempt: number, chunk: Buffer, at: number): boolean => {
    if (this.running) return false;
    try {
      const data = this.machine.ordinaryRead(attempt, chunk, this.pending.clock(at));
      if (data === undefined) return false;
      if (!this.writer.write(data)) this.send({ type: 'client_blocked' });
    } catch (error) {
      this.send({ type: 'internal_error', error });
    }
    return true;
  };
  private readonly writer: ClientWriter;
  private held: HeldRequest | undefined;
  /** The in-flight gauge's label this request was counted under (request_started), taken off the same one at settlement. */
  private inflightLabel: string | undefined;
  /** Its place among the gateway's exchanges in flight (http/lifecycle.ts): set when tracked, taken when done. */
  inFlight: LiveEntry<Exchange> | undefined;

  constructor(
    private readonly deps: ExchangeDeps,
    private readonly request: CompletionRequest,
    private readonly res: ServerResponse,
  ) {
    const { config, guard } = deps;
    this.socket = res.socket;
    this.writer = new ClientWriter(res, this.socket, this.drained);
    this.controls = deps.upstreams.controls(request.info.model);
    const itl = deps.metrics.interTokenLatency(request.info.model);
    this.observe = createDeliveryObserver(deps, request.info.model, request.requestId, request.trace, (label) => {
      this.inflightLabel = label;
    });
    this.machine = new DeliveryMachine(
      { info: request.info, arrivalAt: request.arrivalAt, requestId: request.requestId, gated: this.controls.gate !== undefined },
      {
        settings: machineSettings(config),
        budget: this.controls.budget,
        random: deps.random,
        onInterTokenGap: (ms) => {
          // Per event: a try block costs nothing in V8 until something throws.
          try {
            itl.observe(ms / 1000);
          } catch (error) {
            guard.report('metrics', error);
          }
        },
      },
    );
  }

  start(): void {
    this.res.on('close', () => this.send({ type: 'client_close' }));
    this.res.on('finish', () => this.send({ type: 'client_finish', socketDestroyed: this.socket?.destroyed === true }));
    this.res.on('drain', this.drained);
    const { held, guard } = this.deps;
    if (held !== undefined) {
      const { model, tenant, route, stream } = this.request.info;
      this.held = guard.run<HeldRequest | undefined>('metrics', () => held.begin({ model, tenant: tenant ?? ANONYMOUS, route, stream }), undefined);
    }
    this.send({ type: 'start' });
    // The client may have left before the exchange began (while a stored response was looked up, or an admission
    // waited on a shared store): its 'close' has already fired, so it is told here, once.
    if (this.res.destroyed || this.socket?.destroyed === true) this.send({ type: 'client_close' });
  }

  /** The gateway is shutting down and its drain deadline passed: end this request now, and count it. */
  shutdown(): void {
    this.send({ type: 'shutdown' });
  }

  /**
   * Hands `event` to the machine, stamped `at` (when it happened; default now). One that comes while a step's effects
   * are being carried out waits its turn, stamped as it comes, so the machine sees times in the order it sees events.
   * Returns whether it was handled at once (not queued): the machine keeps no event past its step.
   */
  private send(event: MachineEvent, at?: number): boolean {
    if (this.running) {
      this.pending.push(event, at ?? this.deps.now());
      return false;
    }
    this.running = true;
    try {
      let stamp = at ?? this.deps.now();
      for (let next: MachineEvent | undefined = event; next !== undefined; next = this.pending.shift(), stamp = this.pending.at) {
        for (const effect of this.machine.handle(next, this.pending.clock(stamp))) {
          try {
            this.execute(effect);
          } catch (error) {
            // Carrying out an effect failed (a bug, or a socket in a state nobody expected): the rest of the step is
            // not carried out (a write after a failed head would go out under Node's implicit 200), and the machine
            // ends the request from there, once.
            this.pending.push({ type: 'internal_error', error }, this.deps.now());
            break;
          }
        }
      }
    } finally {
      this.running = false;
    }
    return true;
  }

  private execute(effect: Effect): void {
    switch (effect.kind) {
      case 'arm':
        return this.arm(effect.timer, effect.at, effect.ms);
      case 'clear': {
        const timer = this.timers[effect.timer];
        if (timer !== undefined) clearTimeout(timer.handle);
        this.timers[effect.timer] = undefined;
        return;
      }
      case 'acquire_admission':
        return this.acquireAdmission();
      case 'cancel_admission':
        this.queueAbort?.abort();
        return;
      case 'release_admission':
        if (this.admission?.admitted === true) this.admission.release();
        return;
      case 'start_attempt':
        return this.startAttempt(effect.attempt, effect.avoid, effect.retriedFor);
      case 'abort_attempt':
        this.current?.abort(effect.reason);
        return;
      case 'pause_attempt':
        this.current?.pause();
        return;
      case 'resume_attempt':
        this.current?.resume();
        return;
      case 'write_head':
        this.res.writeHead(effect.status, effect.headers);
        if (this.held !== undefined) {
          const held = this.held;
          this.deps.guard.run('metrics', () => held.answered(effect.status));
        }
        return;
      case 'write':
        // Only the current attempt writes: from its first write on, it is answering.
        if (this.current !== undefined) this.current.answering = true;
        if (!this.writer.write(effect.data)) this.send({ type: 'client_blocked' });
        return;
      case 'end':
        if (effect.data === undefined) this.res.end();
        else this.res.end(effect.data);
        return;
      case 'destroy_client':
        this.res.destroy();
        return;
      case 'attempt_over':
        return this.attemptOver(effect.attempt, effect);
      case 'observe':
        return this.observe(effect.observation);
      case 'settle': {
        // Before anything observes the settlement: whoever learns the request ended finds its slot free. The machine
        // settles exactly once, whatever ends the request (delivery, failure, the client leaving, shutdown).
        if (this.request.limit !== undefined) {
          const limit = this.request.limit;
          // A background response still running keeps its slot and reservation until it ends (background-holds.ts).
          const held = this.deps.guard.run('exchange', () => this.holdBackground(effect.settlement, limit), false);
          const charge = chargedTokens(effect.settlement, this.request.info.promptTokensEstimate);
          if (!held) this.deps.guard.run('exchange', () => limit.settle(charge?.tokens, charge?.estimated));
        }
        if (this.request.info.route === 'responses') this.learnHome(effect.settlement.responseId, effect.settlement.attempts);
        // A client read a stored response: if it is a held background one, its hold asks its home now.
        if (this.request.info.route === 'responses_retrieve' && this.request.storedId !== undefined && effect.settlement.code === 200) {
          const id = this.request.storedId;
          this.deps.guard.run('exchange', () => this.deps.backgroundHolds?.nudge(id));
        }
        // The home it was sent to no longer holds it (restarted, or a lookup long ago): ask everyone next time.
        if (this.request.storedId !== undefined && effect.settlement.code === 404) this.deps.homes?.forget(this.request.storedId);
        this.writer.detach();
        if (this.held !== undefined) {
          const held = this.held;
          this.held = undefined;
          this.deps.guard.run('metrics', () => held.ended());
        }
        const at = this.deps.now();
        const sessionKey = this.request.routing?.sessionKey;
        if (sessionKey !== undefined) this.deps.guard.run('exchange', () => this.deps.upstreams.sessionEnded(this.request.info.model, sessionKey, at));
        const routing = this.deps.guard.run('exchange', () => this.routingOutcome(effect.settlement.attempts.length), undefined);
        const settlement = routing === undefined ? effect.settlement : withRouting(effect.settlement, routing);
        this.deps.publish(settlement, this.request.requestId, this.request.trace, this.inflightLabel, at);
        this.deps.onDone?.(this);
        return;
      }
    }
  }

  /** Re-arming a timer with the same duration refreshes it instead of replacing it. */
  private arm(name: TimerName, at: number, ms: number): void {
    const armed = this.timers[name];
    if (armed !== undefined && armed.ms === ms) {
      armed.handle.refresh();
      return;
    }
    if (armed !== undefined) clearTimeout(armed.handle);
    const handle = setTimeout(
      () => {
        this.timers[name] = undefined;
        this.send({ type: 'timer', timer: name });
      },
      Math.max(0, at - this.deps.now()),
    );
    this.timers[name] = { handle, ms };
  }

  private acquireAdmission(): void {
    const gate = this.controls.gate;
    if (gate === undefined) return;
    this.queueAbort = new AbortController();
    const decided = (admission: Admission) => {
      this.admission = admission;
      this.send({ type: 'admission', admitted: admission.admitted, reason: admission.admitted ? undefined : admission.reason, waitedMs: admission.waitedMs });
    };
    const admission = gate.acquire(this.queueAbort.signal, this.request.info.promptTokensEstimate ?? 0);
    if (admission instanceof Promise) {
      this.send({ type: 'queued' });
      admission.then(decided, (error: unknown) => this.send({ type: 'internal_error', error }));
    } else {
      decided(admission);
    }
  }

  private startAttempt(number: number, avoid: ReadonlySet<string>, retriedFor: RetryReason | undefined): void {
    const { upstreams, config, now } = this.deps;
    const at = now();
    const upstream = this.request.pinned ?? this.pick(number, avoid, at);
    if (upstream === undefined) {
      this.send({ type: 'no_upstream' });
      return;
    }
    const attempt = new Attempt(upstream, number, this.report, {
      streaming: this.request.info.stream,
      maxEventBytes: config.streaming.maxEventBytes,
      maxResponseBytes: config.streaming.maxResponseBytes,
      maxErrorBodyBytes: config.streaming.maxErrorBodyBytes,
      wallNow: this.deps.wallNow,
      now: this.deps.now,
      turnShare: this.turnShare(),
      ordinaryRead: this.ordinaryRead,
    });
    this.current = attempt;
    this.attempts.push(attempt);
    this.send({ type: 'attempt_started', attempt: number, upstream: upstream.name });
    attempt.ticket = upstreams.sent(upstream, at);
    const traceHeaders = this.request.trace.attemptStarted(number, upstream, at, retriedFor);
    const headers = traceHeaders === undefined ? this.request.headers : withHeaders(this.request.headers, traceHeaders);
    upstream.dispatcher.dispatch(
      {
        method: this.request.method ?? 'POST',
        path: upstream.path(this.request.apiPath),
        headers: upstream.withCredentials(headers),
        body: this.request.method === undefined || this.request.method === 'POST' || this.request.method === 'PUT' ? this.request.body : null,
      },
      attempt,
    );
  }

  /**
   * The pool's pick for attempt `number`, counted by reason. The upstream is counted in flight right after, in the same
   * turn (startAttempt's `sent`), so the next request's pick already sees it (llm-d-router #2515).
   */
  private pick(number: number, avoid: ReadonlySet<string>, at: number): Upstream | undefined {
    const { upstreams, guard, metrics } = this.deps;
    const { routing } = this.request;
    const { model } = this.request.info;
    if (number === 1 && routing?.sessionKey !== undefined) {
      const key = routing.sessionKey;
      this.sessionGap = guard.run('exchange', () => upstreams.sessionStarted(model, key, at), undefined);
      const gapMs = this.sessionGap?.gapMs;
      const poolName = upstreams.poolFor(model)?.config.name;
      if (gapMs !== undefined && gapMs !== null && poolName !== undefined) guard.run('metrics', () => metrics.sessionGap(model, poolName, gapMs));
    }
    const picked = upstreams.pick(model, avoid, at, routing);
    if (picked === undefined) return undefined;
    this.lastPick = picked;
    this.lastPickNumber = number;
    const pool = upstreams.poolFor(model)?.config;
    if (pool !== undefined) guard.run('metrics', () => metrics.routingDecision(model, pool.name, pool.routing.policy, picked.reason));
    return picked.upstream;
  }

  /** The pick of the attempt that answered (the last one), as the settlement carries it. */
  private routingOutcome(attempts: number): RoutingOutcome | undefined {
    const picked = this.lastPickNumber === attempts ? this.lastPick : undefined;
    const pool = this.deps.upstreams.poolFor(this.request.info.model)?.config;
    if (picked === undefined || pool === undefined) return undefined;
    return {
      pool: pool.name,
      policy: pool.routing.policy,
      reason: picked.reason,
      predictedCachedTokens: picked.predictedCachedTokens,
      usageReportsCachedTokens: pool.routing.usageReportsCachedTokens,
      ...(this.sessionGap !== undefined && { sessionGap: this.sessionGap }),
    };
  }

  private turnShare(): TurnShare | undefined {
    const turns = this.deps.readTurns;
    const budgetMs = this.deps.config.streaming.turnBudgetMs;
    return turns === undefined || budgetMs === 0 || !this.request.info.stream ? undefined : { turns, budgetMs };
  }

  /**
   * Hands the ticket of a background response that has not ended to the holds: answered 2xx (the `queued`
   * acknowledgement, or a background stream its client left), with the response's id, and no usage yet — usage
   * comes with the end. True when held.
   */
  private holdBackground(settlement: Settlement, limit: LimitTicket): boolean {
    const holds = this.deps.backgroundHolds;
    const home = settlement.attempts.at(-1)?.upstream;
    if (holds === undefined || this.request.background !== true || this.request.info.route !== 'responses') return false;
    if (settlement.code < 200 || settlement.code >= 300 || settlement.usage !== undefined || settlement.responseId === undefined || home === undefined) return false;
    return holds.hold(settlement.responseId, home, limit);
  }

  /** A response id and the upstream whose answer carried it: where GET /v1/responses/{id} will find it. */
  private learnHome(responseId: string | undefined, attempts: readonly { readonly upstream: string }[]): void {
    const last = attempts[attempts.length - 1];
    if (responseId === undefined || last === undefined) return;
    this.deps.homes?.learn(responseId, last.upstream);
    if (this.request.info.tenant !== undefined) this.deps.owners?.bind(responseId, this.request.info.tenant);
  }

  private attemptOver(number: number, effect: Extract<Effect, { kind: 'attempt_over' }>): void {
    let index = 0;
    while (index < this.attempts.length && (this.attempts[index] as Attempt).number !== number) index++;
    const attempt = this.attempts[index];
    if (attempt === undefined) return;
    this.attempts.splice(index, 1);
    const at = this.deps.now();
    this.deps.upstreams.settled(attempt.upstream, attempt.ticket, effect.record, at);
    this.request.trace.attemptEnded(number, effect.record, at);
  }
}
