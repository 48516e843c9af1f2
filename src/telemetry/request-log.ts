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

/**
 * `JSON.stringify(line)`, written for the line's one shape: the same text, key for key (test/request-log-json.property.test.ts
 * holds it to JSON.stringify). V8's generic stringifier looked every key up anew and was a twelfth of a request's
 * instructions under callgrind (issue 27). Each string's quotes are part of the constant text around it, so a field
 * costs two string additions, not four. Every string is escaped as JSON.stringify escapes it, closed-set values too: a
 * value the types say is safe is not trusted to be.
 */
export function requestLogJson(line: RequestLogLine): string {
  return '{' + requestLogMembers(line) + '}';
}

/** requestLogJson's text without its braces: what the logger writes between its own fields (logger.ts dataRecordWriter). */
export function requestLogMembers(line: RequestLogLine): string {
  let out = '"request_id":"' + esc(line.request_id);
  if (line.trace_id !== undefined) out += '","trace_id":"' + esc(line.trace_id);
  out += '","model":"' + esc(line.model) + '","tenant":"' + esc(line.tenant) + '","route":"' + esc(line.route) + (line.stream ? '","stream":true,"code":' : '","stream":false,"code":') + num(line.code);
  out += ',"outcome":"' + esc(line.outcome) + '","attempts":[';
  for (let i = 0; i < line.attempts.length; i++) {
    const a = line.attempts[i] as RequestLogLine['attempts'][number];
    out += (i === 0 ? '{"upstream":"' : ',{"upstream":"') + esc(a.upstream) + '","result":"' + esc(a.result) + '"';
    if (a.status !== undefined) out += ',"status":' + num(a.status);
    if (a.duration_ms !== undefined) out += ',"duration_ms":' + num(a.duration_ms);
    out += '}';
  }
  out += ']';
  if (line.ttft_ms !== undefined) out += ',"ttft_ms":' + num(line.ttft_ms);
  if (line.tpot_ms !== undefined) out += ',"tpot_ms":' + num(line.tpot_ms);
  const { prompt, cached, completion } = line.tokens;
  // Each member after the first with its comma (a slice of the joined string would flatten it, through V8's runtime).
  let tokens = prompt === undefined ? '' : '"prompt":' + num(prompt);
  if (cached !== undefined) tokens += (tokens === '' ? '"cached":' : ',"cached":') + num(cached);
  if (completion !== undefined) tokens += (tokens === '' ? '"completion":' : ',"completion":') + num(completion);
  out += ',"tokens":{' + tokens + '},"finish_reasons":' + strings(line.finish_reasons) + ',"anomalies":' + strings(line.anomalies);
  if (line.cancel_phase !== undefined) out += ',"cancel_phase":"' + esc(line.cancel_phase) + '"';
  out += ',"slo":"' + esc(line.slo) + '","prompt_len":"' + esc(line.prompt_len) + (line.accepted ? '","accepted":true,"checks_failed":' : '","accepted":false,"checks_failed":') + strings(line.checks_failed);
  if (line.format_valid !== undefined) out += ',"format_valid":"' + esc(line.format_valid) + '"';
  if (line.verdict !== undefined) out += ',"verdict":"' + esc(line.verdict) + '"';
  out += line.evaluator ? ',"evaluator":true' : ',"evaluator":false';
  if (line.evaluation_sample !== undefined) out += ',"evaluation_sample":' + num(line.evaluation_sample);
  if (line.client_retry !== undefined) out += ',"client_retry":' + num(line.client_retry);
  const r = line.routing;
  if (r !== undefined) {
    out += ',"routing":{"pool":"' + esc(r.pool) + '","policy":"' + esc(r.policy) + '","reason":"' + esc(r.reason) + '","predicted_cached_tokens":' + num(r.predicted_cached_tokens);
    if (r.session_gap_ms !== undefined) out += ',"session_gap_ms":' + (r.session_gap_ms === null ? 'null' : num(r.session_gap_ms));
    out += '}';
  }
  return out + ',"duration_ms":' + num(line.duration_ms);
}

/**
 * A number as JSON writes it: NaN and the infinities are null; -0 is 0 (String(-0) is '0'). The line's times are
 * rounded to the µs (`round`), and V8 writes such a double through its slow shortest-digits path on every call
 * (~0.5 µs each in a settled request, 1% of it): a value that is exactly k/1000 for an integer |k| < 10^15 is written
 * from k's digits instead. Those are the digits String() writes: k/1000 has at most 15 significant digits, so no
 * other decimal of 15 digits or fewer is nearer to it than half an ulp, and the shortest round-trip form is k's
 * digits with the point put back and trailing zeros dropped.
 */
function num(value: number): string {
  const k = Math.round(value * 1000);
  if (k / 1000 !== value || k >= 1e15 || k <= -1e15) return Number.isFinite(value) ? String(value) : 'null';
  const sign = k < 0 ? '-' : '';
  const magnitude = k < 0 ? -k : k;
  const fraction = magnitude % 1000;
  const whole = (magnitude - fraction) / 1000;
  if (fraction === 0) return sign + String(whole);
  if (fraction % 100 === 0) return sign + String(whole) + '.' + String(fraction / 100);
  if (fraction % 10 === 0) return sign + String(whole) + (fraction < 100 ? '.0' : '.') + String(fraction / 10);
  return sign + String(whole) + (fraction < 10 ? '.00' : fraction < 100 ? '.0' : '.') + String(fraction);
}

/** A string's text as JSON.stringify writes it between its quotes; the common string, with nothing to escape, as it is. */
function esc(value: string): string {
  for (let i = 0; i < value.length; i++) {
    const c = value.charCodeAt(i);
    // Quote, backslash, control characters and any surrogate (a lone one is escaped; a pair is left to JSON.stringify).
    if (c < 0x20 || c === 0x22 || c === 0x5c || (c >= 0xd800 && c <= 0xdfff)) return JSON.stringify(value).slice(1, -1);
  }
  return value;
}

function strings(values: readonly string[]): string {
  if (values.length === 0) return '[]';
  let out = '["' + esc(values[0] as string);
  for (let i = 1; i < values.length; i++) out += '","' + esc(values[i] as string);
  return out + '"]';
}
