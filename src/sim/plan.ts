/**
 * What an accepted request's answer will be — token counts, finish reason, usage, timing — decided once,
 * before anything is written. Pure: the caller supplies the request id and the clock.
 */
import type { Modifiers } from './faults.js';
import type { SimOptions } from './options.js';
import type { GenerationRequest } from './request.js';
import type { ResponseIdentity, Usage } from './wire.js';

export interface AnswerShape {
  readonly identity: ResponseIdentity;
  /** n, or n × prompts for legacy completions. */
  readonly choiceCount: number;
  readonly tokensPerChoice: number;
  readonly tokensPerEvent: number;
  readonly finishReason: string;
  readonly usage: Usage;
  /** Whether a stream ends with a usage chunk (non-streaming bodies: whether they carry usage). */
  readonly sendsUsage: boolean;
  /** The prefill part of ttftMs: whole milliseconds for the prompt tokens usage reports, less the cached ones. */
  readonly prefillMs: number;
  /** Request → first output event (and to the faults that fire at it): the base TTFT plus prefillMs. */
  readonly ttftMs: number;
  readonly itlMs: number;
  readonly jitter: number;
}

export function shapeAnswer(
  request: GenerationRequest,
  modifiers: Modifiers,
  options: Readonly<SimOptions>,
  requestId: string,
  createdSeconds: number,
): AnswerShape {
  const requested = modifiers.tokens ?? options.outputTokens;
  const cap = request.maxTokens;
  const isCapped = cap !== null && cap < requested;
  const tokensPerChoice = isCapped ? cap : requested;
  const choiceCount = request.n * request.prompts;
  // The header's cached_tokens turns prompt_tokens_details on for its request; the option needs the flag.
  const cached = modifiers.cachedTokens ?? (options.promptTokensDetails ? options.cachedTokens : 0);
  const asksUsage = request.stream ? request.includeUsage === true || options.forceIncludeUsage : true;
  const usage: Usage = {
    promptTokens: request.promptTokens,
    completionTokens: choiceCount * tokensPerChoice,
    cachedTokens: cached > 0 ? Math.min(cached, request.promptTokens) : null,
  };
  const prefillMs = prefillDelayMs(usage, modifiers.prefillMsPer1kTokens ?? options.prefillMsPer1kTokens);
  return {
    identity: {
      id: `${request.route === 'chat_completions' ? 'chatcmpl' : 'cmpl'}-${requestId}`,
      created: createdSeconds,
      model: request.model,
    },
    choiceCount,
    tokensPerChoice,
    tokensPerEvent: modifiers.tokensPerEvent ?? options.tokensPerEvent,
    finishReason: modifiers.finishReason ?? (isCapped ? 'length' : 'stop'),
    usage,
    sendsUsage: asksUsage && !modifiers.noUsage,
    prefillMs,
    ttftMs: (modifiers.ttftMs ?? options.ttftMs) + prefillMs,
    itlMs: modifiers.itlMs ?? options.itlMs,
    jitter: options.jitter,
  };
}

/**
 * The prefill delay of a prompt: `msPer1kTokens` per 1 000 of the prompt tokens that usage reports, less those it
 * reports as cached (vLLM's prefix cache skips them), rounded to whole milliseconds — so a short prompt adds
 * nothing and a zero TTFT stays a zero delay.
 */
export function prefillDelayMs(usage: Usage, msPer1kTokens: number): number {
  const computed = usage.promptTokens - (usage.cachedTokens ?? 0);
  return Math.round((computed * msPer1kTokens) / 1000);
}
