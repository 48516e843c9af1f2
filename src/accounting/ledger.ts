/**
 * The delivery ledger: what happened to one logical request and each attempt Waybill made for it.
 *
 * Pure: no I/O, no clock, no framework. The shell (proxy/) reports facts as they happen, each stamped with a
 * millisecond timestamp it chose, and obeys the verdict for every upstream event: hold it (nothing may reach the
 * client before the first output-bearing event), commit (send the held bytes and this event), forward, or drop.
 * `settle()` closes the record exactly once and returns every observation the metrics, logs and traces need.
 * Its tests are plain sequences of these calls (test/ledger.test.ts).
 */
import type { EventFacts, UpstreamError, Usage } from '../sse/classify.js';
import {
  ANOMALY_KINDS,
  finishReasonLabel,
  type AnomalyKind,
  type AttemptResult,
  type CancelPhase,
  type FinishReason,
  type Outcome,
  type Route,
  type SloResult,
} from './outcomes.js';
import { classifyPromptLen } from './prompt-len.js';
import { failureOf, rejectionOutcome, type Failure, type FailureCause } from '../delivery/failures.js';

export type { Failure, FailureCause } from '../delivery/failures.js';
import { contractNeedsText, notTruncated, OutputAssembly, type ChoiceChecks, type OutputContract } from './output-contract.js';
import { ANONYMOUS, OUTPUT_CHECKS, reportsUsage, type CheckVerdict, type OutputCheck } from './outcomes.js';

export interface SloThresholds {
  readonly ttftMs: number;
  readonly tpotMs: number;
  readonly e2eMs: number;
  /** TTFT threshold per prompt_len class, overriding ttftMs for that class. */
  readonly ttftByPromptLenMs: Readonly<Record<string, number>>;
}

export interface RequestInfo {
  /** Label value for the model (already mapped to the closed set). */
  readonly model: string;
  /** Label value for the client's tenant (configured, `_anonymous` or `_unauthenticated`); `_anonymous` if absent. */
  readonly tenant?: string | undefined;
  readonly route: Route;
  readonly stream: boolean;
  /** Choice indices the response must finish: n × prompts. */
  readonly expectedChoices: number;
  /** Waybill asked the upstream for usage on the client's behalf: drop the usage-only chunk. */
  readonly dropUsageChunk: boolean;
  readonly slo: SloThresholds;
  readonly promptLenBoundaries: readonly number[];
  readonly promptLenClasses: readonly string[];
  /**
   * The prompt's length estimated from the request before dispatch (token ids counted, text by characters per
   * token): its class stands until usage reports the real count, and for requests that never get usage (failures,
   * timeouts, cancellations) — the long-prompt incident is exactly the one whose requests fail.
   */
  readonly promptTokensEstimate?: number | undefined;
  /** What the answer must be (response_format, tools, tool_choice); undefined: no contract requested. */
  readonly contract?: OutputContract | undefined;
  /** Characters of answer text assembled per response for the contract's checks (output_checks.max_output_chars). */
  readonly maxOutputChars?: number | undefined;
  /**
   * Evaluator traffic (evaluation.evaluator_header): `excluded` from the SLO, never sampled for evaluation, and counted
   * apart from users' answers (Settlement.evaluator).
   */
  readonly evaluator?: boolean | undefined;
  /** Keep the answer's text for the request's evaluation sample (evaluation.capture_content, and sampled). */
  readonly captureAnswer?: boolean | undefined;
  /** The client SDK's retry count of this HTTP request (`x-stainless-retry-count`, validated); undefined: not sent. */
  readonly clientRetry?: number | undefined;
  /** Characters of text per token (metrics.chars_per_token): the estimate of output relayed without usage. */
  readonly charsPerToken?: number | undefined;
}

/** What the shell does with the bytes of one upstream event. */
export type Verdict = 'hold' | 'commit' | 'forward' | 'drop';

/** Why an attempt's upstream stream stopped, as the shell saw it. */
export type StreamEnd = 'eof' | 'reset' | 'idle_timeout' | 'first_output_timeout' | 'total_timeout' | 'oversized' | 'shutdown';

/** Why Waybill ended a committed stream with its own error event. `internal`: a bug in the gateway, caught. */
export type GatewayErrorCause = StreamEnd | 'unfinished_choices' | 'internal';

/** How the client response must end once the ledger knows. */
export type Ending =
  /** `[DONE]` was forwarded: end the response. */
  | { kind: 'complete' }
  /** The upstream's error event was forwarded: end the response. */
  | { kind: 'upstream_error' }
  /** After commit the stream broke: write Waybill's own error event naming the cause, then end. */
  | { kind: 'gateway_error'; cause: GatewayErrorCause }
  /** Before commit: answer with a status and an error body. */
  | { kind: 'failure'; failure: Failure };

/** A 2xx response Waybill cannot read, seen at its start. */
export type ProtocolViolation = 'not_event_stream' | 'compressed';

export interface AttemptRecord {
  readonly upstream: string;
  readonly startedAt: number;
  status: number | undefined;
  result: AttemptResult | undefined;
  endedAt: number | undefined;
  /** First output-bearing event seen on this attempt. */
  firstOutputAt: number | undefined;
  failure: Failure | undefined;
}

export interface Anomaly {
  readonly upstream: string;
  readonly kind: AnomalyKind;
}

export interface Settlement {
  readonly model: string;
  /** The client's tenant: a configured name, `_anonymous` or `_unauthenticated`. */
  readonly tenant: string;
  readonly route: Route;
  readonly stream: boolean;
  /** HTTP status the client received (200 for a stream that failed after commit; 499 if it left before any). */
  readonly code: number;
  readonly outcome: Outcome;
  readonly attempts: readonly AttemptRecord[];
  readonly anomalies: readonly Anomaly[];
  /** One per choice of a committed response; empty when nothing was committed. */
  readonly finishReasons: readonly FinishReason[];
  readonly cancelPhase: CancelPhase | undefined;
  readonly ttftMs: number | undefined;
  readonly tpotMs: number | undefined;
  readonly durationMs: number;
  readonly usage: Usage | undefined;
  /** The generated output relayed to the client by the attempt that answered: output events (per choice) and text. */
  readonly relayed: RelayedOutput;
  /**
   * The completion tokens of a request whose upstream reported none (no usage, or usage without completion_tokens)
   * but that relayed output, estimated from what it relayed (`estimateCompletionTokens`); undefined otherwise.
   */
  readonly estimatedCompletionTokens: number | undefined;
  readonly promptLen: string;
  readonly slo: SloResult;
  /** Upstream `[DONE]`s dropped because an error event came first. */
  readonly doneAfterErrorDropped: number;
  /** The answer's `id` and `model` as the upstream sent them (first chunk or body of the committed attempt). */
  readonly responseId: string | undefined;
  readonly responseModel: string | undefined;
  /** The output checks of each choice of a delivered response; empty for any other outcome. */
  readonly checks: readonly ChoiceChecks[];
  /** Delivered, and no applicable check failed (an unevaluated check does not block it). */
  readonly accepted: boolean;
  /**
   * The evaluation cohort's verdict of a delivered response with at least one checked choice (undefined otherwise):
   * `unevaluated` when a check that applies could not be evaluated, else `accepted` or `not_accepted`. Accepted among
   * evaluated and evaluation coverage divide by different sets (seed 000 §7.3); `accepted` above alone cannot say.
   */
  readonly verdict: CheckVerdict | undefined;
  /** The request carried the evaluator header (RequestInfo.evaluator): not users' traffic. */
  readonly evaluator: boolean;
  /** The checks that failed on some choice, each named once. */
  readonly failedChecks: readonly OutputCheck[];
  /** The client SDK's retry count of this HTTP request (RequestInfo.clientRetry). */
  readonly clientRetry?: number | undefined;
  /** Each choice's content, only for a delivered response whose request asked to capture it (undefined past the cap). */
  readonly answerText?: readonly (string | undefined)[];
  /** How the answering attempt's upstream was picked (set by the shell once settled; absent for a pinned request). */
  readonly routing?: RoutingOutcome | undefined;
}

/** The pick of the attempt that answered: what routing decided and predicted, to be checked against the usage. */
export interface RoutingOutcome {
  readonly pool: string;
  readonly policy: string;
  /** One of PICK_REASONS (src/routing/score.ts). */
  readonly reason: string;
  /** Prompt tokens the pick predicted vLLM would find cached on that upstream. */
  readonly predictedCachedTokens: number;
  /** The pool declares its upstreams report cached tokens (then a usage without them means 0). */
  readonly usageReportsCachedTokens: boolean;
  /** With a session: the idle gap's class (src/routing/sessions.ts GAP_CLASSES, or `first`) and length. */
  readonly sessionGap?: { readonly gapClass: string; readonly gapMs: number | null } | undefined;
}

export interface RelayedOutput {
  /** Output-bearing events, counted once per choice they carry output for. */
  readonly outputEvents: number;
  /** UTF-16 units of the generated text those events carried (EventFacts.outputChars). */
  readonly outputChars: number;
}

/**
 * Completion tokens estimated from relayed output: the text at `charsPerToken` characters per token, and never fewer
 * than the output events (vLLM sends an event only for a step that decoded at least one token of that choice). An
 * estimate, not a count: a tokenizer's ratio varies with language and content (docs/security.md).
 */
export function estimateCompletionTokens(relayed: RelayedOutput, charsPerToken: number): number {
  return Math.max(relayed.outputEvents, Math.ceil(relayed.outputChars / charsPerToken));
}

export interface LedgerHooks {
  /** Called for each gap between consecutive output-bearing events written to the client. */
  onInterTokenGap?(ms: number): void;
  /** Called when an anomaly is seen, as it is seen (traces record it as an event of the attempt). */
  onAnomaly?(kind: AnomalyKind, upstream: string): void;
}

interface AttemptState extends AttemptRecord {
  sawDone: boolean;
  error: UpstreamError | undefined;
  /** Anomaly kinds already recorded for this attempt (a bit per kind): each counts once per attempt. */
  anomalyKinds: number;
}

const ANOMALY_BIT = new Map<AnomalyKind, number>(ANOMALY_KINDS.map((kind, i) => [kind, 1 << i]));

export class RequestLedger {
  private readonly attempts: AttemptState[] = [];
  private readonly anomalies: Anomaly[] = [];
  private readonly finishes = new Map<number, string>();
  private committedAt: number | undefined;
  private firstOutputAt: number | undefined;
  private lastOutputAt: number | undefined;
  private usage: Usage | undefined;
  /** The current attempt's relayed output (RelayedOutput). */
  private outputEvents = 0;
  private outputChars = 0;
  private endingValue: Ending | undefined;
  private clientEndAt: number | undefined;
  private cancelledAt: number | undefined;
  private rejection: { status: number } | undefined;
  private doneAfterError = 0;
  private responseId: string | undefined;
  private responseModel: string | undefined;
  /** The last sequence number the upstream's events carried (Responses); -1 before any. */
  private lastSequence = -1;
  /** Expected choices of the current attempt that carried an answer (content, text or a named tool call). */
  private readonly answered = new Set<number>();
  /** The current attempt's answer text, assembled only when the contract needs it. */
  private readonly assembly: OutputAssembly | undefined;
  /** In the admission queue now. */
  private waiting = false;
  private settled = false;

  constructor(
    readonly info: RequestInfo,
    readonly arrivalAt: number,
    private readonly hooks: LedgerHooks = {},
  ) {
    if (contractNeedsText(info.contract) || info.captureAnswer === true) {
      this.assembly = new OutputAssembly(info.expectedChoices, info.maxOutputChars ?? DEFAULT_MAX_OUTPUT_CHARS);
    }
  }

  /** Events must be classified with their answer's pieces (EventFacts.parts): the contract's checks need the text. */
  get wantsParts(): boolean {
    return this.assembly !== undefined;
  }

  /** Has anything been sent to the client? Retries are only possible before this. */
  get committed(): boolean {
    return this.committedAt !== undefined;
  }

  /** Set once the client response's end is decided; the shell acts on it. */
  get ending(): Ending | undefined {
    return this.endingValue;
  }

  /** When the first output-bearing event was written to the client. */
  get firstOutputWrittenAt(): number | undefined {
    return this.firstOutputAt;
  }

  get attemptCount(): number {
    return this.attempts.length;
  }

  get currentAttempt(): AttemptRecord | undefined {
    return this.attempts.at(-1);
  }

  /** The gateway answered by itself, without any attempt (bad request, unknown model, body too large, ...). */
  reject(status: number): void {
    this.rejection = { status };
  }

  /** The request waits in the model's admission queue (time there counts toward TTFT: the clock started at arrival). */
  queued(_at: number): void {
    this.waiting = true;
  }

  /** The request left the admission queue with a slot. */
  admitted(_at: number): void {
    this.waiting = false;
  }

  /**
   * A new attempt. Before commit, a retry replaces whatever the failed attempt left: its failure no longer decides
   * the response, and finish reasons or usage it reported belong to no answer the client will see.
   */
  startAttempt(at: number, upstream: string): void {
    if (this.committed) throw new Error('no attempt after commit');
    this.endingValue = undefined;
    this.finishes.clear();
    this.answered.clear();
    this.assembly?.reset();
    this.usage = undefined;
    this.outputEvents = 0;
    this.outputChars = 0;
    this.responseId = undefined;
    this.responseModel = undefined;
    this.attempts.push({
      upstream,
      startedAt: at,
      status: undefined,
      result: undefined,
      endedAt: undefined,
      firstOutputAt: undefined,
      failure: undefined,
      sawDone: false,
      error: undefined,
      anomalyKinds: 0,
    });
  }

  /** The upstream's response status line arrived. */
  responseStarted(_at: number, status: number): void {
    this.attempt().status = status;
  }

  /** The sequence number an event Waybill adds to a Responses stream takes: one past the last the upstream sent. */
  get nextSequence(): number {
    return this.lastSequence + 1;
  }

  /** One classified upstream SSE event of the current attempt; returns what to do with its bytes. */
  streamEvent(at: number, facts: EventFacts): Verdict {
    const attempt = this.attempt();
    if (facts.kind === 'chunk' || facts.kind === 'error') {
      if (facts.sequence !== undefined && facts.sequence > this.lastSequence) this.lastSequence = facts.sequence;
    }
    if (attempt.sawDone) {
      this.anomaly(attempt, 'data_after_done');
      return 'drop';
    }
    if (attempt.error !== undefined) {
      if (facts.kind === 'done') {
        attempt.sawDone = true;
        this.anomaly(attempt, 'done_after_error');
        this.doneAfterError++;
      }
      return 'drop';
    }
    switch (facts.kind) {
      case 'malformed':
        this.anomaly(attempt, 'malformed_event');
        return 'drop';
      case 'error': {
        attempt.error = facts;
        this.anomaly(attempt, 'error_payload');
        if (this.committed) {
          this.endingValue = { kind: 'upstream_error' };
          return 'forward';
        }
        this.fail(attempt, 'error_payload', failureForErrorPayload(facts, this.info.route));
        return 'drop';
      }
      case 'done':
        return this.finished(at, attempt, false);
      case 'chunk': {
        this.recordFinishes(attempt, facts);
        this.recordAnswer(facts);
        this.recordUsage(attempt, facts);
        this.responseId ??= facts.id;
        this.responseModel ??= facts.model;
        if (facts.usageOnly && this.info.dropUsageChunk) return 'drop';
        this.recordOutput(facts);
        let verdict: Verdict;
        if (facts.output.length === 0) {
          verdict = this.committed ? 'forward' : 'hold';
        } else {
          attempt.firstOutputAt ??= at;
          if (this.lastOutputAt !== undefined) this.hooks.onInterTokenGap?.(at - this.lastOutputAt);
          this.lastOutputAt = at;
          if (this.committed) {
            verdict = 'forward';
          } else {
            this.committedAt = at;
            this.firstOutputAt = at;
            verdict = 'commit';
          }
        }
        // Responses' response.completed: the answer is complete with this event, and no [DONE] follows.
        return facts.terminal === true ? this.finished(at, attempt, verdict === 'commit') : verdict;
      }
    }
  }

  /**
   * The upstream said the answer is complete (`[DONE]`, `message_stop`, `response.completed`). Every choice must have
   * finished; then the answer is delivered, committing it now if nothing was (an answer without output).
   */
  private finished(at: number, attempt: AttemptState, committedNow: boolean): Verdict {
    attempt.sawDone = true;
    if (this.unfinishedChoices() > 0) {
      this.anomaly(attempt, 'missing_finish_reason');
      if (this.committed) this.endingValue = { kind: 'gateway_error', cause: 'unfinished_choices' };
      else this.fail(attempt, 'incomplete', failureOf('incomplete', this.info.route));
      return committedNow ? 'commit' : 'drop';
    }
    this.endingValue = { kind: 'complete' };
    if (this.committed) return committedNow ? 'commit' : 'forward';
    this.committedAt = at;
    return 'commit';
  }

  /** The current attempt's upstream stream stopped (after a 200 event stream). */
  streamEnded(at: number, how: StreamEnd): void {
    const attempt = this.attempt();
    if (attempt.result !== undefined) {
      attempt.endedAt ??= at;
      return;
    }
    attempt.endedAt = at;
    if (attempt.error !== undefined) {
      attempt.result = 'error_payload';
      return;
    }
    if (attempt.sawDone) {
      attempt.result = this.unfinishedChoices() > 0 ? 'incomplete' : 'ok';
      return;
    }
    if (how === 'oversized') this.anomaly(attempt, 'oversized_event');
    if (how === 'eof') {
      this.anomaly(attempt, 'missing_done');
      if (this.unfinishedChoices() > 0) this.anomaly(attempt, 'missing_finish_reason');
    }
    const result = resultForEnd(how);
    if (this.committed) {
      attempt.result = result;
      this.endingValue ??= { kind: 'gateway_error', cause: how };
      return;
    }
    this.fail(attempt, result, failureForEnd(how, this.info.route));
  }

  /** The current attempt failed before any response (refused, reset, DNS, connect timeout). */
  connectFailed(at: number, result: 'connect_error' | 'reset' | 'timeout'): void {
    const attempt = this.attempt();
    attempt.endedAt = at;
    const failure = result === 'timeout' ? failureOf('timeout', this.info.route, { kind: 'first_output_timeout' }) : failureOf(result, this.info.route);
    this.fail(attempt, result, failure);
  }

  /** A complete non-event-stream body: an HTTP error, or a whole non-stream response. */
  bodyReceived(at: number, status: number, facts: EventFacts): void {
    const attempt = this.attempt();
    attempt.status = status;
    attempt.endedAt = at;
    if (status < 200 || status >= 300) {
      const upstreamError = facts.kind === 'error' ? errorOf(facts) : undefined;
      if (status >= 300 && status < 400) {
        // Never followed: a redirect from an inference server is a misconfiguration (a URL missing its path, a
        // login page in front of it), and following it would send the prompt somewhere nobody configured.
        this.fail(attempt, 'http_3xx', failureOf('upstream_3xx', this.info.route, { kind: 'http', status }));
      } else if (status >= 400 && status < 500) {
        this.fail(attempt, 'http_4xx', failureOf('upstream_4xx', this.info.route, { kind: 'http', status }, upstreamError));
      } else {
        // 502 — but on /v1/messages an upstream 529 stays 529 (overloaded_error), as the Anthropic SDK reads it.
        this.fail(attempt, 'http_5xx', failureOf('upstream_5xx', this.info.route, { kind: 'http', status }, upstreamError));
      }
      return;
    }
    if (facts.kind === 'error') {
      this.anomaly(attempt, 'error_payload');
      this.fail(attempt, 'error_payload', failureForErrorPayload(facts, this.info.route));
      return;
    }
    if (facts.kind !== 'chunk' || this.info.stream) {
      // Not a completion body, or JSON where an event stream was asked for: the upstream broke the protocol.
      this.anomaly(attempt, 'malformed_event');
      const cause: FailureCause = this.info.stream ? 'not_event_stream' : 'malformed_body';
      this.fail(attempt, 'incomplete', failureOf(cause, this.info.route));
      return;
    }
    this.recordFinishes(attempt, facts);
    this.recordAnswer(facts);
    this.usage = undefined;
    this.recordUsage(attempt, facts);
    this.recordOutput(facts);
    this.responseId = facts.id;
    this.responseModel = facts.model;
    this.committedAt = at;
    if (this.unfinishedChoices() > 0) {
      this.anomaly(attempt, 'missing_finish_reason');
      attempt.result = 'incomplete';
    } else {
      attempt.result = 'ok';
    }
    this.endingValue = { kind: 'complete' };
  }

  /**
   * A 2xx response that cannot be read (not an event stream where one was asked for, a compressed body): the
   * attempt failed before any output, whatever its body would have said.
   */
  protocolViolation(at: number, violation: ProtocolViolation): void {
    const attempt = this.attempt();
    attempt.endedAt = at;
    this.anomaly(attempt, 'malformed_event');
    this.fail(attempt, 'incomplete', failureOf(violation, this.info.route));
  }

  /**
   * The gateway failed while serving this request (a bug, caught by the shell): the request ends now, as an error
   * event on a committed stream or a 500 before.
   */
  internalError(at: number): void {
    const attempt = this.attempts.at(-1);
    if (attempt !== undefined && attempt.result === undefined) {
      attempt.result = 'cancelled';
      attempt.endedAt = at;
    }
    this.endingValue = this.committed
      ? { kind: 'gateway_error', cause: 'internal' }
      : { kind: 'failure', failure: failureOf('internal', this.info.route) };
  }

  /** The failure the client is answered with when no further attempt is made. */
  finalFailure(): Failure | undefined {
    const ending = this.endingValue;
    return ending?.kind === 'failure' ? ending.failure : undefined;
  }

  /**
   * The shell stops reading the current attempt once its verdict is known (the drain grace after `[DONE]` or an
   * error event ran out): its result is what it sent.
   */
  attemptReleased(at: number): void {
    const attempt = this.attempts.at(-1);
    if (attempt !== undefined) this.judge(attempt, at);
  }

  private judge(attempt: AttemptState, at: number): void {
    if (attempt.result !== undefined) return;
    if (attempt.error !== undefined) attempt.result = 'error_payload';
    else if (attempt.sawDone) attempt.result = this.unfinishedChoices() > 0 ? 'incomplete' : 'ok';
    else attempt.result = this.committed ? 'incomplete' : 'cancelled';
    attempt.endedAt ??= at;
  }

  /** The client went away before its response ended. Ends the current attempt as cancelled. */
  clientCancelled(at: number): void {
    if (this.cancelledAt !== undefined || this.clientEndAt !== undefined) return;
    this.cancelledAt = at;
    const attempt = this.attempts.at(-1);
    if (attempt !== undefined && attempt.result === undefined) {
      attempt.result = 'cancelled';
      attempt.endedAt = at;
    }
  }

  /** The client response has been fully written and ended. */
  clientEnded(at: number): void {
    this.clientEndAt ??= at;
  }

  /** Closes the record. Call exactly once; a second call throws (a double count is a bug, not a race to hide). */
  settle(at: number): Settlement {
    if (this.settled) throw new Error('ledger settled twice');
    this.settled = true;
    // An attempt the shell stopped watching without telling why is judged by what it sent: never lost.
    for (const attempt of this.attempts) this.judge(attempt, at);
    const endAt = this.cancelledAt ?? this.clientEndAt ?? at;
    const durationMs = endAt - this.arrivalAt;
    const { outcome, code } = this.outcomeAndCode();
    const ttftMs = this.firstOutputAt !== undefined && this.info.stream ? this.firstOutputAt - this.arrivalAt : undefined;
    const promptLen = classifyPromptLen(
      this.info.promptLenBoundaries,
      this.info.promptLenClasses,
      this.usage?.promptTokens ?? this.info.promptTokensEstimate,
    );
    const tpotMs = outcome === 'delivered' ? this.tpot() : undefined;
    const { checks, verdict } = outcome === 'delivered' ? this.outputChecks() : { checks: [], verdict: undefined };
    const failedChecks = failedCheckNames(checks);
    const relayed: RelayedOutput = { outputEvents: this.outputEvents, outputChars: this.outputChars };
    const estimatedCompletionTokens =
      // (A route that reports no usage of its own — a stored response replayed — was counted when it was generated.)
      this.usage?.completionTokens === undefined && relayed.outputEvents > 0 && reportsUsage(this.info.route) ? estimateCompletionTokens(relayed, this.info.charsPerToken ?? DEFAULT_CHARS_PER_TOKEN) : undefined;
    return {
      model: this.info.model,
      tenant: this.info.tenant ?? ANONYMOUS,
      route: this.info.route,
      stream: this.info.stream,
      code,
      outcome,
      attempts: this.attempts.map(({ sawDone: _d, error: _e, anomalyKinds: _k, ...record }) => record),
      anomalies: this.anomalies,
      finishReasons: this.committed ? this.finishReasonLabels() : [],
      cancelPhase: outcome === 'client_cancelled' ? this.cancelPhase() : undefined,
      ttftMs,
      tpotMs,
      durationMs,
      usage: this.usage,
      relayed,
      estimatedCompletionTokens,
      promptLen,
      slo: this.sloResult(outcome, code, promptLen, ttftMs, tpotMs, durationMs),
      doneAfterErrorDropped: this.doneAfterError,
      responseId: this.responseId,
      responseModel: this.responseModel,
      checks,
      accepted: outcome === 'delivered' && failedChecks.length === 0,
      verdict,
      evaluator: this.info.evaluator === true,
      failedChecks,
      clientRetry: this.info.clientRetry,
      ...(this.info.captureAnswer === true && outcome === 'delivered' ? { answerText: this.answerText() } : {}),
    };
  }

  /**
   * The output checks of each expected choice of the delivered answer. They observe and never decide: should one
   * throw (a bug), every check is `unevaluated` and the request is still counted as what it was.
   */
  private outputChecks(): { checks: ChoiceChecks[]; verdict: CheckVerdict | undefined } {
    try {
      return this.runOutputChecks();
    } catch {
      const checks = Array.from({ length: this.info.expectedChoices }, (): ChoiceChecks => ({ answer_present: 'unevaluated', not_truncated: 'unevaluated', format_valid: 'unevaluated' }));
      return { checks, verdict: checks.length > 0 ? 'unevaluated' : undefined };
    }
  }

  private runOutputChecks(): { checks: ChoiceChecks[]; verdict: CheckVerdict | undefined } {
    const contract = this.info.contract;
    const checks: ChoiceChecks[] = [];
    let missing = false;
    for (let index = 0; index < this.info.expectedChoices; index++) {
      const format = contract === undefined || this.assembly === undefined ? 'not_applicable' : this.assembly.formatVerdict(index, contract);
      if (format === 'unevaluated') missing = true;
      checks.push({
        answer_present: this.answered.has(index) ? 'pass' : 'fail',
        not_truncated: notTruncated(finishReasonLabel(this.finishes.get(index))),
        format_valid: format === 'not_applicable' ? 'unevaluated' : format,
      });
    }
    if (checks.length === 0) return { checks, verdict: undefined };
    if (missing) return { checks, verdict: 'unevaluated' };
    return { checks, verdict: failedCheckNames(checks).length === 0 ? 'accepted' : 'not_accepted' };
  }

  private answerText(): (string | undefined)[] {
    const texts: (string | undefined)[] = [];
    for (let index = 0; index < this.info.expectedChoices; index++) texts.push(this.assembly?.text(index));
    return texts;
  }

  private recordAnswer(facts: Extract<EventFacts, { kind: 'chunk' }>): void {
    for (const index of facts.answers) if (this.isExpectedChoice(index)) this.answered.add(index);
    if (facts.parts !== undefined) this.assembly?.add(facts.parts);
  }

  private outcomeAndCode(): { outcome: Outcome; code: number } {
    if (this.rejection !== undefined) {
      const status = this.rejection.status;
      return { outcome: rejectionOutcome(status), code: status };
    }
    const ending = this.endingValue;
    if (this.cancelledAt !== undefined && (ending === undefined || this.clientEndAt === undefined)) {
      // The client left before its response ended (a response already fully sent is not a cancellation).
      return { outcome: 'client_cancelled', code: this.committed ? 200 : 499 };
    }
    if (ending === undefined) return { outcome: this.committed ? 'incomplete' : 'failed', code: this.committed ? 200 : 502 };
    switch (ending.kind) {
      case 'complete':
        // A stream only completes with every choice finished; a non-stream body may still lack a finish_reason.
        return { outcome: this.unfinishedChoices() === 0 ? 'delivered' : 'incomplete', code: 200 };
      case 'upstream_error':
        return { outcome: 'stream_error', code: 200 };
      case 'gateway_error':
        return {
          outcome: isDeadline(ending.cause) ? 'timeout' : 'incomplete',
          code: 200,
        };
      case 'failure':
        return { outcome: ending.failure.outcome, code: ending.failure.status };
    }
  }

  private cancelPhase(): CancelPhase {
    if (this.firstOutputAt !== undefined) return 'streaming';
    return this.waiting && this.attempts.length === 0 ? 'queued' : 'before_first_token';
  }

  /** The record of attempt `index` (0-based), for reporting an attempt's verdict after a later one started. */
  attemptAt(index: number): AttemptRecord | undefined {
    return this.attempts[index];
  }

  private tpot(): number | undefined {
    if (!this.info.stream || this.firstOutputAt === undefined || this.lastOutputAt === undefined) return undefined;
    const completion = this.usage?.completionTokens;
    if (completion === undefined) return undefined;
    const perChoice = completion / Math.max(1, this.info.expectedChoices);
    if (perChoice < 2) return undefined;
    return (this.lastOutputAt - this.firstOutputAt) / (perChoice - 1);
  }

  private sloResult(
    outcome: Outcome,
    code: number,
    promptLen: string,
    ttftMs: number | undefined,
    tpotMs: number | undefined,
    durationMs: number,
  ): SloResult {
    const slo = this.info.slo;
    const ttftLimit = slo.ttftByPromptLenMs[promptLen] ?? slo.ttftMs;
    // Evaluator traffic is counted as what it was everywhere else, but it is not users' experience.
    if (this.info.evaluator === true) return 'excluded';
    switch (outcome) {
      case 'delivered': {
        if (!this.info.stream) return durationMs > slo.e2eMs ? 'missed_e2e' : 'met';
        // A delivered stream without any output: the time to its (empty) answer stands in for TTFT.
        const ttft = ttftMs ?? (this.committedAt ?? this.arrivalAt) - this.arrivalAt;
        const missedTtft = ttft > ttftLimit;
        const missedTpot = tpotMs !== undefined && tpotMs > slo.tpotMs;
        if (missedTtft && missedTpot) return 'missed_ttft_tpot';
        if (missedTtft) return 'missed_ttft';
        return missedTpot ? 'missed_tpot' : 'met';
      }
      case 'rejected':
        return code === 429 || code === 503 ? 'failed' : 'excluded';
      case 'client_cancelled': {
        if (!this.info.stream) return durationMs > slo.e2eMs ? 'missed_e2e' : 'excluded';
        const waited = ttftMs ?? durationMs;
        return waited > ttftLimit ? 'missed_ttft' : 'excluded';
      }
      case 'failed':
      case 'timeout':
      case 'stream_error':
      case 'incomplete':
        return 'failed';
    }
  }

  /** One label per expected choice: finish reasons of other indices are never stored (see recordFinishes). */
  private finishReasonLabels(): FinishReason[] {
    const labels: FinishReason[] = [];
    for (let index = 0; index < this.info.expectedChoices; index++) labels.push(finishReasonLabel(this.finishes.get(index)));
    return labels;
  }

  /**
   * Keeps the first finish_reason of each expected choice. An index outside 0..expectedChoices-1 (or not an
   * integer) is an anomaly and never a finish reason: counted, it would inflate the finish-reason shares, and
   * stored, it would let an upstream grow the map with every distinct index it names.
   */
  private recordFinishes(attempt: AttemptState, facts: Extract<EventFacts, { kind: 'chunk' }>): void {
    for (const index of facts.choices) {
      if (!this.isExpectedChoice(index)) this.anomaly(attempt, 'unexpected_choice');
    }
    for (const finish of facts.finishes) {
      if (!this.isExpectedChoice(finish.index)) continue;
      if (!this.finishes.has(finish.index)) this.finishes.set(finish.index, finish.reason);
    }
  }

  private isExpectedChoice(index: number): boolean {
    return Number.isInteger(index) && index >= 0 && index < this.info.expectedChoices;
  }

  private recordOutput(facts: Extract<EventFacts, { kind: 'chunk' }>): void {
    this.outputEvents += facts.output.length;
    this.outputChars += facts.outputChars ?? 0;
  }

  /** Usage whose numbers cannot be counted is missing usage, plus an anomaly; the latest usage seen wins. */
  private recordUsage(attempt: AttemptState, facts: Extract<EventFacts, { kind: 'chunk' }>): void {
    if (facts.usageInvalid) {
      this.anomaly(attempt, 'invalid_usage');
      this.usage = undefined;
    } else if (facts.usage !== undefined) {
      this.usage = facts.usage;
    }
  }

  private unfinishedChoices(): number {
    let missing = 0;
    for (let index = 0; index < this.info.expectedChoices; index++) if (!this.finishes.has(index)) missing++;
    return missing;
  }

  private fail(attempt: AttemptState, result: AttemptResult, failure: Failure): void {
    attempt.result = result;
    attempt.failure = failure;
    this.endingValue = { kind: 'failure', failure };
  }

  /** Records an anomaly once per attempt and kind, so what a request keeps is bounded whatever the upstream sends. */
  private anomaly(attempt: AttemptState, kind: AnomalyKind): void {
    const bit = ANOMALY_BIT.get(kind) ?? 0;
    if ((attempt.anomalyKinds & bit) !== 0) return;
    attempt.anomalyKinds |= bit;
    this.anomalies.push({ upstream: attempt.upstream, kind });
    this.hooks.onAnomaly?.(kind, attempt.upstream);
  }

  private attempt(): AttemptState {
    const attempt = this.attempts.at(-1);
    if (attempt === undefined) throw new Error('no attempt started');
    return attempt;
  }
}

/**
 * The settlement of a request whose ledger itself failed (a bug, caught by the shell): counted once, from what the
 * shell knows for certain — whether anything had been sent — and nothing it would have to trust the ledger for.
 */
export function crashSettlement(info: RequestInfo, arrivalAt: number, committed: boolean, at: number): Settlement {
  return {
    model: info.model,
    tenant: info.tenant ?? ANONYMOUS,
    route: info.route,
    stream: info.stream,
    code: committed ? 200 : 500,
    outcome: committed ? 'incomplete' : 'failed',
    attempts: [],
    anomalies: [],
    finishReasons: [],
    cancelPhase: undefined,
    ttftMs: undefined,
    tpotMs: undefined,
    durationMs: at - arrivalAt,
    usage: undefined,
    relayed: { outputEvents: 0, outputChars: 0 },
    estimatedCompletionTokens: undefined,
    promptLen: 'unknown',
    slo: 'failed',
    doneAfterErrorDropped: 0,
    responseId: undefined,
    responseModel: undefined,
    checks: [],
    accepted: false,
    verdict: undefined,
    evaluator: info.evaluator === true,
    failedChecks: [],
    clientRetry: info.clientRetry,
  };
}

/** metrics.chars_per_token's default. */
const DEFAULT_CHARS_PER_TOKEN = 4;

/** Characters of answer text assembled per response when the request does not say (the config default). */
const DEFAULT_MAX_OUTPUT_CHARS = 1_048_576;

function failedCheckNames(checks: readonly ChoiceChecks[]): OutputCheck[] {
  const failed: OutputCheck[] = [];
  for (const name of OUTPUT_CHECKS) if (checks.some((c) => c[name] === 'fail')) failed.push(name);
  return failed;
}

function errorOf(facts: Extract<EventFacts, { kind: 'error' }>): UpstreamError {
  return { code: facts.code, type: facts.type, message: facts.message, param: facts.param };
}

/** An error event or error body under HTTP 200, before any output: the status its `code` names (else 502). */
function failureForErrorPayload(facts: Extract<EventFacts, { kind: 'error' }>, route: Route): Failure {
  return failureOf('error_payload', route, { kind: 'event', code: facts.code }, errorOf(facts));
}

/** A gateway deadline ended the stream (the drain deadline at shutdown included). */
function isDeadline(cause: GatewayErrorCause): boolean {
  return cause === 'idle_timeout' || cause === 'total_timeout' || cause === 'first_output_timeout' || cause === 'shutdown';
}

function resultForEnd(how: StreamEnd): AttemptResult {
  switch (how) {
    case 'eof':
    case 'oversized':
      return 'incomplete';
    case 'reset':
      return 'reset';
    case 'idle_timeout':
    case 'first_output_timeout':
    case 'total_timeout':
    case 'shutdown':
      return 'timeout';
  }
}

function failureForEnd(how: StreamEnd, route: Route): Failure {
  if (how === 'shutdown' || how === 'oversized') return failureOf(how, route);
  const result = resultForEnd(how);
  if (result === 'timeout') return failureOf('timeout', route, { kind: how === 'total_timeout' ? 'total_timeout' : 'first_output_timeout' });
  return failureOf(result === 'reset' ? 'reset' : 'incomplete', route);
}
