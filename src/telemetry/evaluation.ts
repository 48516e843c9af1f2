/**
 * The evaluation hook: Waybill does not judge quality, it hands a deterministic sample of delivered responses to
 * whoever does (docs/output-contract.md, "Evaluation samples"). Inclusion is decided from the request id alone, so
 * every replica, a retry of the scrape, or a later audit makes the same choice, and the probability travels with
 * the sample so an evaluator can weight it. Content is included only with evaluation.capture_content.
 */
import type { Settlement } from '../accounting/ledger.js';

export interface EvaluationSettings {
  readonly sampleRate: number;
  readonly models: Readonly<Record<string, number>>;
  readonly captureContent: boolean;
}

export interface EvaluationSample {
  readonly request_id: string;
  readonly trace_id: string | undefined;
  readonly model: string;
  readonly route: string;
  readonly inclusion_probability: number;
  readonly accepted: boolean;
  /** The evaluation cohort's verdict (Settlement.verdict): `unevaluated` answers' acceptance is not known. */
  readonly verdict: Settlement['verdict'];
  readonly checks: Settlement['checks'];
  readonly finish_reasons: readonly string[];
  /** Each choice's content, only with evaluation.capture_content (undefined for a choice past the size cap). */
  readonly answers?: readonly (string | undefined)[];
}

/** The model's sample probability (0: not sampled). */
export function sampleRate(settings: EvaluationSettings, model: string): number {
  return settings.models[model] ?? settings.sampleRate;
}

/**
 * Is this request in the sample? FNV-1a of the request id, mixed by murmur3's finaliser (so ids that differ in their
 * last character — sequential client ids — spread over the whole range), as a fraction of 2^32, below the
 * probability. The same id always gives the same answer (test/output-contract.test.ts).
 */
export function inSample(requestId: string, probability: number): boolean {
  if (probability <= 0) return false;
  if (probability >= 1) return true;
  let hash = 0x811c9dc5;
  for (let i = 0; i < requestId.length; i++) {
    hash ^= requestId.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  hash ^= hash >>> 16;
  hash = Math.imul(hash, 0x85ebca6b) >>> 0;
  hash ^= hash >>> 13;
  hash = Math.imul(hash, 0xc2b2ae35) >>> 0;
  hash ^= hash >>> 16;
  return (hash >>> 0) / 0x1_0000_0000 < probability;
}

/** The sample record of a settled request, or undefined when it is not sampled (only users' delivered responses are). */
export function evaluationSample(
  settings: EvaluationSettings,
  s: Settlement,
  requestId: string,
  traceId: string | undefined,
): EvaluationSample | undefined {
  // Evaluator traffic is the evaluator's own replay: sampling it would have the evaluator judge itself (seed 000 §7.2).
  if (s.outcome !== 'delivered' || s.evaluator) return undefined;
  const probability = sampleRate(settings, s.model);
  if (!inSample(requestId, probability)) return undefined;
  return {
    request_id: requestId,
    trace_id: traceId,
    model: s.model,
    route: s.route,
    inclusion_probability: probability,
    accepted: s.accepted,
    verdict: s.verdict,
    checks: s.checks,
    finish_reasons: s.finishReasons,
    ...(settings.captureContent && s.answerText !== undefined ? { answers: s.answerText } : {}),
  };
}
