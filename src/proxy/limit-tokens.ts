/**
 * The tokens of the tenants' limits (tenant-limits.ts, "Tokens"): what a request reserves at admission, and what it
 * is charged when it settles.
 */
import type { Settlement } from '../accounting/ledger.js';
import { reportsUsage, type ProxiedRoute } from '../accounting/outcomes.js';
import type { Usage } from '../sse/classify.js';

/** The routes whose requests ask for output, and the body fields that cap it (the first one present counts). */
const OUTPUT_CAPS: Partial<Record<ProxiedRoute, readonly string[]>> = {
  chat_completions: ['max_completion_tokens', 'max_tokens'],
  completions: ['max_tokens'],
  responses: ['max_output_tokens'],
  messages: ['max_tokens'],
};

/**
 * The tokens reserved at admission: the prompt's estimate plus, on the generating routes, the output cap of the body
 * (`max_completion_tokens`, `max_tokens`, `max_output_tokens`) or else `defaultMaxTokens`, per choice. Routes that
 * never report token usage (tokenize, audio, the store routes, pass-through) reserve nothing.
 */
export function reservedTokens(
  route: ProxiedRoute,
  body: Readonly<Record<string, unknown>>,
  request: { readonly promptTokensEstimate: number | undefined; readonly expectedChoices: number },
  defaultMaxTokens: number,
): number {
  if (route === 'passthrough' || !reportsUsage(route)) return 0;
  const prompt = request.promptTokensEstimate ?? 0;
  const caps = OUTPUT_CAPS[route];
  if (caps === undefined) return prompt;
  let cap = defaultMaxTokens;
  for (const field of caps) {
    const value = body[field];
    if (typeof value === 'number' && Number.isInteger(value) && value >= 0) {
      cap = value;
      break;
    }
  }
  return prompt + cap * Math.max(1, request.expectedChoices);
}

/** What a settled request is charged against tokens_per_minute; `estimated`: from relayed output, not usage. */
export interface Charge {
  readonly tokens: number;
  readonly estimated: boolean;
}

/**
 * The tokens a settled request is charged: its usage (prompt + completion) when the upstream reported completion
 * tokens; otherwise, when it relayed output, the prompt (usage's, or the estimate made at admission) plus the
 * completion estimated from what it relayed (Settlement.estimatedCompletionTokens); undefined when it has neither
 * (the reservation stands).
 */
export function chargedTokens(settlement: Pick<Settlement, 'usage' | 'estimatedCompletionTokens'>, promptTokensEstimate: number | undefined): Charge | undefined {
  const estimated = settlement.estimatedCompletionTokens;
  if (estimated === undefined) {
    const used = usedTokens(settlement.usage);
    return used === undefined ? undefined : { tokens: used, estimated: false };
  }
  return { tokens: (settlement.usage?.promptTokens ?? promptTokensEstimate ?? 0) + estimated, estimated: true };
}

/** Prompt + completion tokens of the usage; undefined when the request reported none. */
export function usedTokens(usage: Usage | undefined): number | undefined {
  if (usage === undefined || (usage.promptTokens === undefined && usage.completionTokens === undefined)) return undefined;
  return (usage.promptTokens ?? 0) + (usage.completionTokens ?? 0);
}
