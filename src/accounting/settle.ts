/**
 * The settlement of one logical request: how it is counted, from its record of facts (record.ts) and what the request
 * asked for (RequestInfo) — a pure function, once per request. The delivery machine settles through it, and so do the
 * requests the gateway answers itself (http/answers.ts, with `rejectedRecord`/`cancelledRecord`), so both count the
 * same way. It judges and decides nothing the client sees: the outcome and code here are those of the answer given.
 */
import type { Usage } from '../sse/classify.js';
import { ERRORS } from '../delivery/errors.js';
import { failureOf, isCapacityRefusal, rejectionOutcome } from '../delivery/failures.js';
import { ANONYMOUS, finishReasonLabel, OUTPUT_CHECKS, reportsUsage, type CancelPhase, type CheckVerdict, type FinishReason, type Outcome, type OutputCheck, type Route, type SloResult } from './outcomes.js';
import { notTruncated, type ChoiceChecks } from './output-contract.js';
import { classifyPromptLen } from './prompt-len.js';
import { createRecord, judgedResult, recordJudged, unfinishedChoices, type Anomaly, type AttemptFacts, type AttemptRecord, type GatewayErrorCause, type RequestInfo, type RequestRecord } from './record.js';

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
  readonly clientRetry: number | undefined;
  /** Each choice's content, only for a delivered response whose request asked to capture it (undefined past the cap). */
  readonly answerText: readonly (string | undefined)[] | undefined;
  /** How the answering attempt's upstream was picked (set by the shell once settled, withRouting; absent for a pinned request). */
  readonly routing: RoutingOutcome | undefined;
}

/**
 * The settlement with the answering attempt's routing outcome, set in place: the shell sets it on the settlement the
 * machine has just made, before any observer sees it. Every settlement has one shape — each field present, in the
 * order `settle` writes them — so the observers that read all of its fields (metrics, the log line, the status window)
 * read them through one map: a field added to some settlements only made each of their reads a megamorphic lookup
 * (V8's --log-ic showed them; issue 27), and a copy (`{...settlement, routing}`) is an object of another map.
 */
export function withRouting(settlement: Settlement, routing: RoutingOutcome): Settlement {
  (settlement as { routing: RoutingOutcome | undefined }).routing = routing;
  return settlement;
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

/** The status a client that left before any response is counted with (nginx's convention; no client sees it). */
export const CLIENT_CLOSED = 499;

/**
 * The request's one settlement, by the delivery machine: the attempts' judged results are written into the record
 * first (an attempt reported after settlement carries its verdict), then the settlement is read off it. Once only:
 * a second call throws (a double count is a bug, not a race to hide), and so does a call after one that threw
 * half-way — delivery/step.ts `crash` then settles from what is certain (`crashSettlement`).
 */
export function settleRequest(rec: RequestRecord, info: RequestInfo, at: number): Settlement {
  if (rec.settling) throw new Error('request settled twice');
  rec.settling = true;
  recordJudged(rec, info, at);
  return settle(rec, info, at);
}

/**
 * Closes the record: the request's one settlement at `at`. Pure: the record is not changed (an attempt the shell
 * stopped watching without telling why is judged by what it sent, in the settlement's copy).
 */
export function settle(rec: RequestRecord, info: RequestInfo, at: number): Settlement {
  const endAt = rec.cancelledAt ?? rec.clientEndAt ?? at;
  const durationMs = endAt - rec.arrivalAt;
  const { outcome, code } = outcomeAndCode(rec, info);
  const ttftMs = rec.firstOutputAt !== undefined && info.stream ? rec.firstOutputAt - rec.arrivalAt : undefined;
  const promptLen = classifyPromptLen(info.promptLenBoundaries, info.promptLenClasses, rec.usage?.promptTokens ?? info.promptTokensEstimate);
  const tpotMs = outcome === 'delivered' ? tpot(rec, info) : undefined;
  const { checks, verdict } = outcome === 'delivered' ? outputChecks(rec, info) : { checks: [], verdict: undefined };
  const failedChecks = failedCheckNames(checks);
  const relayed: RelayedOutput = { outputEvents: rec.outputEvents, outputChars: rec.outputChars };
  const estimatedCompletionTokens =
    // (A route that reports no usage of its own — a stored response replayed — was counted when it was generated.)
    rec.usage?.completionTokens === undefined && relayed.outputEvents > 0 && reportsUsage(info.route) ? estimateCompletionTokens(relayed, info.charsPerToken ?? DEFAULT_CHARS_PER_TOKEN) : undefined;
  return {
    model: info.model,
    tenant: info.tenant ?? ANONYMOUS,
    route: info.route,
    stream: info.stream,
    code,
    outcome,
    attempts: rec.attempts.map((attempt) => settledAttempt(rec, info, attempt, at)),
    anomalies: rec.anomalies,
    finishReasons: rec.committedAt !== undefined ? finishReasonLabels(rec, info) : [],
    cancelPhase: outcome === 'client_cancelled' ? cancelPhase(rec) : undefined,
    ttftMs,
    tpotMs,
    durationMs,
    usage: rec.usage,
    relayed,
    estimatedCompletionTokens,
    promptLen,
    slo: sloResult(rec, info, outcome, code, promptLen, ttftMs, tpotMs, durationMs),
    doneAfterErrorDropped: rec.doneAfterError,
    responseId: rec.responseId,
    responseModel: rec.responseModel,
    checks,
    accepted: outcome === 'delivered' && failedChecks.length === 0,
    verdict,
    evaluator: info.evaluator === true,
    failedChecks,
    clientRetry: info.clientRetry,
    answerText: info.captureAnswer === true && outcome === 'delivered' ? answerText(rec, info) : undefined,
    routing: undefined,
  };
}

/** An attempt's public record as settled: one the shell stopped watching without telling why is judged now. */
function settledAttempt(rec: RequestRecord, info: RequestInfo, attempt: AttemptFacts, at: number): AttemptRecord {
  const judged = attempt.result === undefined;
  // Field by field, one literal: an object rest copy went through V8's generic property copy (~3k instructions a
  // request under callgrind, issue 27).
  return {
    upstream: attempt.upstream,
    startedAt: attempt.startedAt,
    status: attempt.status,
    result: judged ? judgedResult(rec, info, attempt) : attempt.result,
    endedAt: judged ? (attempt.endedAt ?? at) : attempt.endedAt,
    firstOutputAt: attempt.firstOutputAt,
    failure: attempt.failure,
  };
}

/** The record of a request the gateway answered itself with `status`, without any attempt (http/answers.ts). */
export function rejectedRecord(info: RequestInfo, arrivalAt: number, status: number): RequestRecord {
  const rec = createRecord(info, arrivalAt);
  rec.rejectedWith = status;
  return rec;
}

/** The record of a request whose client left before the gateway answered it (http/answers.ts). */
export function cancelledRecord(info: RequestInfo, arrivalAt: number, at: number): RequestRecord {
  const rec = createRecord(info, arrivalAt);
  rec.cancelledAt = at;
  return rec;
}

/**
 * The settlement of a request whose record itself failed (a bug, caught by the shell): counted once, from what the
 * shell knows for certain — whether anything had been sent — and nothing it would have to trust the record for. Not
 * `settle` over a fresh record: that is the code that just threw, and a crash must still be counted.
 */
export function crashSettlement(info: RequestInfo, arrivalAt: number, committed: boolean, at: number): Settlement {
  return {
    model: info.model,
    tenant: info.tenant ?? ANONYMOUS,
    route: info.route,
    stream: info.stream,
    code: committed ? 200 : CRASH_STATUS,
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
    answerText: undefined,
    routing: undefined,
  };
}

/** internal_error's status: what a client is answered with before commit when the gateway failed (a bug, caught). */
const CRASH_STATUS = ERRORS.internal_error.status;

function outcomeAndCode(rec: RequestRecord, info: RequestInfo): { outcome: Outcome; code: number } {
  if (rec.rejectedWith !== undefined) return { outcome: rejectionOutcome(rec.rejectedWith), code: rec.rejectedWith };
  const committed = rec.committedAt !== undefined;
  const ending = rec.ending;
  if (rec.cancelledAt !== undefined && (ending === undefined || rec.clientEndAt === undefined)) {
    // The client left before its response ended (a response already fully sent is not a cancellation).
    return { outcome: 'client_cancelled', code: committed ? 200 : CLIENT_CLOSED };
  }
  // No verdict (an attempt that stopped unexplained): counted as the table's `end before output`.
  if (ending === undefined) return committed ? { outcome: 'incomplete', code: 200 } : { outcome: 'failed', code: failureOf('incomplete', info.route).status };
  switch (ending.kind) {
    case 'complete':
      // A stream only completes with every choice finished; a non-stream body may still lack a finish_reason.
      return { outcome: unfinishedChoices(rec, info) === 0 ? 'delivered' : 'incomplete', code: 200 };
    case 'upstream_error':
      return { outcome: 'stream_error', code: 200 };
    case 'gateway_error':
      return { outcome: isDeadline(ending.cause) ? 'timeout' : 'incomplete', code: 200 };
    case 'failure':
      return { outcome: ending.failure.outcome, code: ending.failure.status };
  }
}

function cancelPhase(rec: RequestRecord): CancelPhase {
  if (rec.firstOutputAt !== undefined) return 'streaming';
  return rec.waiting && rec.attempts.length === 0 ? 'queued' : 'before_first_token';
}

function tpot(rec: RequestRecord, info: RequestInfo): number | undefined {
  if (!info.stream || rec.firstOutputAt === undefined || rec.lastOutputAt === undefined) return undefined;
  const completion = rec.usage?.completionTokens;
  if (completion === undefined) return undefined;
  const perChoice = completion / Math.max(1, info.expectedChoices);
  if (perChoice < 2) return undefined;
  return (rec.lastOutputAt - rec.firstOutputAt) / (perChoice - 1);
}

function sloResult(
  rec: RequestRecord,
  info: RequestInfo,
  outcome: Outcome,
  code: number,
  promptLen: string,
  ttftMs: number | undefined,
  tpotMs: number | undefined,
  durationMs: number,
): SloResult {
  const slo = info.slo;
  const ttftLimit = slo.ttftByPromptLenMs[promptLen] ?? slo.ttftMs;
  // Evaluator traffic is counted as what it was everywhere else, but it is not users' experience.
  if (info.evaluator === true) return 'excluded';
  switch (outcome) {
    case 'delivered': {
      if (!info.stream) return durationMs > slo.e2eMs ? 'missed_e2e' : 'met';
      // A delivered stream without any output: the time to its (empty) answer stands in for TTFT.
      const ttft = ttftMs ?? (rec.committedAt ?? rec.arrivalAt) - rec.arrivalAt;
      const missedTtft = ttft > ttftLimit;
      const missedTpot = tpotMs !== undefined && tpotMs > slo.tpotMs;
      if (missedTtft && missedTpot) return 'missed_ttft_tpot';
      if (missedTtft) return 'missed_ttft';
      return missedTpot ? 'missed_tpot' : 'met';
    }
    case 'rejected':
      return isCapacityRefusal(code) ? 'failed' : 'excluded';
    case 'client_cancelled': {
      if (!info.stream) return durationMs > slo.e2eMs ? 'missed_e2e' : 'excluded';
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

/**
 * The output checks of each expected choice of the delivered answer. They observe and never decide: should one throw
 * (a bug), every check is `unevaluated` and the request is still counted as what it was.
 */
function outputChecks(rec: RequestRecord, info: RequestInfo): { checks: ChoiceChecks[]; verdict: CheckVerdict | undefined } {
  try {
    return runOutputChecks(rec, info);
  } catch {
    const checks = Array.from({ length: info.expectedChoices }, (): ChoiceChecks => ({ answer_present: 'unevaluated', not_truncated: 'unevaluated', format_valid: 'unevaluated' }));
    return { checks, verdict: checks.length > 0 ? 'unevaluated' : undefined };
  }
}

function runOutputChecks(rec: RequestRecord, info: RequestInfo): { checks: ChoiceChecks[]; verdict: CheckVerdict | undefined } {
  const contract = info.contract;
  const checks: ChoiceChecks[] = [];
  let missing = false;
  for (let index = 0; index < info.expectedChoices; index++) {
    const format = contract === undefined || rec.assembly === undefined ? 'not_applicable' : rec.assembly.formatVerdict(index, contract);
    if (format === 'unevaluated') missing = true;
    checks.push({
      answer_present: rec.answered[index] === true ? 'pass' : 'fail',
      not_truncated: notTruncated(finishReasonLabel(rec.finishes[index])),
      format_valid: format === 'not_applicable' ? 'unevaluated' : format,
    });
  }
  if (checks.length === 0) return { checks, verdict: undefined };
  if (missing) return { checks, verdict: 'unevaluated' };
  return { checks, verdict: failedCheckNames(checks).length === 0 ? 'accepted' : 'not_accepted' };
}

function answerText(rec: RequestRecord, info: RequestInfo): (string | undefined)[] {
  const texts: (string | undefined)[] = [];
  for (let index = 0; index < info.expectedChoices; index++) texts.push(rec.assembly?.text(index));
  return texts;
}

/** One label per expected choice: finish reasons of other indices are never stored (record.ts recordFinishes). */
function finishReasonLabels(rec: RequestRecord, info: RequestInfo): FinishReason[] {
  const labels: FinishReason[] = [];
  for (let index = 0; index < info.expectedChoices; index++) labels.push(finishReasonLabel(rec.finishes[index]));
  return labels;
}

/** metrics.chars_per_token's default. */
const DEFAULT_CHARS_PER_TOKEN = 4;

function failedCheckNames(checks: readonly ChoiceChecks[]): OutputCheck[] {
  const failed: OutputCheck[] = [];
  for (const name of OUTPUT_CHECKS) if (checks.some((c) => c[name] === 'fail')) failed.push(name);
  return failed;
}

/** A gateway deadline ended the stream (the drain deadline at shutdown included). */
function isDeadline(cause: GatewayErrorCause): boolean {
  return cause === 'idle_timeout' || cause === 'total_timeout' || cause === 'first_output_timeout' || cause === 'shutdown';
}
