/**
 * What one logical request asked for, built once by the route (http/dispatch.ts, with proxy/request-facts.ts) and read by the record,
 * the settlement and the delivery machine.
 */
import type { Route } from './outcomes.js';
import type { OutputContract } from './output-contract.js';

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
