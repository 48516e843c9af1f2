/**
 * The wide event: one log line per logical request when it ends, with everything needed to explain it — and no
 * prompt, completion, key or header. docs/observability.md lists the fields; test/tracing.test.ts checks them.
 */
import type { Settlement } from '../accounting/ledger.js';

export interface RequestLogLine {
  request_id: string;
  trace_id: string | undefined;
  model: string;
  tenant: string;
  route: string;
  stream: boolean;
  code: number;
  outcome: string;
  attempts: Array<{ upstream: string; result: string; status: number | undefined; duration_ms: number | undefined }>;
  ttft_ms: number | undefined;
  tpot_ms: number | undefined;
  tokens: { prompt: number | undefined; cached: number | undefined; completion: number | undefined };
  finish_reasons: string[];
  anomalies: string[];
  cancel_phase: string | undefined;
  slo: string;
  prompt_len: string;
  /** Delivered and no applicable output check failed. */
  accepted: boolean;
  /** Output checks that failed on some choice. */
  checks_failed: string[];
  /** format_valid over the choices: pass, fail or unevaluated (fail if any choice failed), absent when not delivered. */
  format_valid: string | undefined;
  /** The evaluation cohort's verdict (accepted, not_accepted, unevaluated); absent without checked choices. */
  verdict: string | undefined;
  /** The request carried the evaluator header: counted apart from users' traffic. */
  evaluator: boolean;
  /** The inclusion probability when the response was sampled for evaluation. */
  evaluation_sample: number | undefined;
  /** The client SDK's retry count (`x-stainless-retry-count`: 0 first try, n its n-th retry); absent when not sent. */
  client_retry: number | undefined;
  /** How the answering upstream was picked, and the cached prompt tokens the pick predicted there; absent for a pinned request. */
  routing: { pool: string; policy: string; reason: string; predicted_cached_tokens: number; session_gap_ms: number | null | undefined } | undefined;
  duration_ms: number;
}

const round = (ms: number | undefined) => (ms === undefined ? undefined : Math.round(ms * 1000) / 1000);

export function requestLogLine(s: Settlement, requestId: string, traceId: string | undefined, sampleProbability?: number): RequestLogLine {
  return {
    request_id: requestId,
    trace_id: traceId,
    model: s.model,
    tenant: s.tenant,
    route: s.route,
    stream: s.stream,
    code: s.code,
    outcome: s.outcome,
    attempts: s.attempts.map((a) => ({
      upstream: a.upstream,
      result: a.result ?? 'cancelled',
      status: a.status,
      duration_ms: a.endedAt === undefined ? undefined : round(a.endedAt - a.startedAt),
    })),
    ttft_ms: round(s.ttftMs),
    tpot_ms: round(s.tpotMs),
    tokens: { prompt: s.usage?.promptTokens, cached: s.usage?.cachedTokens, completion: s.usage?.completionTokens },
    finish_reasons: [...s.finishReasons],
    anomalies: s.anomalies.map((a) => a.kind),
    cancel_phase: s.cancelPhase,
    slo: s.slo,
    prompt_len: s.promptLen,
    accepted: s.accepted,
    checks_failed: [...s.failedChecks],
    format_valid: formatValid(s),
    verdict: s.verdict,
    evaluator: s.evaluator,
    evaluation_sample: sampleProbability,
    client_retry: s.clientRetry,
    routing:
      s.routing === undefined
        ? undefined
        : { pool: s.routing.pool, policy: s.routing.policy, reason: s.routing.reason, predicted_cached_tokens: s.routing.predictedCachedTokens, session_gap_ms: s.routing.sessionGap?.gapMs },
    duration_ms: round(s.durationMs) ?? 0,
  };
}

function formatValid(s: Settlement): string | undefined {
  if (s.checks.length === 0) return undefined;
  if (s.checks.some((c) => c.format_valid === 'fail')) return 'fail';
  return s.checks.some((c) => c.format_valid === 'unevaluated') ? 'unevaluated' : 'pass';
}
