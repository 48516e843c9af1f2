/**
 * The load client's own reading of an OpenAI-compatible response: the reconciliation oracle must not share the
 * code it checks, so nothing here comes from Waybill's framer or classifier (src/sse/). Events are cut by
 * `eventsource-parser` and each event's data is read with plain `JSON.parse`, following the wire contract
 * (docs/metrics.md, docs/errors.md) rather than Waybill's implementation. This file reads chat and legacy
 * completions; load/load-routes.ts reads the other routes into the same events.
 */
import { createParser } from 'eventsource-parser';

export interface Usage {
  readonly promptTokens: number | undefined;
  readonly completionTokens: number | undefined;
  readonly cachedTokens: number | undefined;
}

/** The label values of docs/metrics.md `outcome`, as the client can tell them. */
export type Outcome = 'delivered' | 'rejected' | 'failed' | 'timeout' | 'stream_error' | 'incomplete' | 'client_cancelled';

/** docs/metrics.md `finish_reason`. */
export type FinishReason = 'stop' | 'length' | 'tool_calls' | 'content_filter' | 'function_call' | 'abort' | 'repetition' | 'other' | 'none';

/** What an error event ends a committed stream as: an upstream's error, or one of Waybill's own (docs/errors.md). */
export type StreamErrorOutcome = Extract<Outcome, 'stream_error' | 'incomplete' | 'timeout'>;

export type ClientEvent =
  /** The answer is complete: chat's `[DONE]`, Messages' `message_stop`. */
  | { readonly kind: 'done' }
  /** Data that is not `[DONE]` and not a JSON object: Waybill drops these, so one reaching a client is a bug. */
  | { readonly kind: 'malformed' }
  /** An error event, and the outcome Waybill counts for the stream it ends. */
  | { readonly kind: 'error'; readonly outcome: StreamErrorOutcome; readonly sequence?: number }
  | {
      readonly kind: 'chunk';
      /** Indices of the choices this event carries generated output for. */
      readonly output: readonly number[];
      /** [choice index, finish-reason label] for every choice this event finishes. */
      readonly finishes: ReadonlyArray<readonly [number, FinishReason]>;
      /** Usage as counted (undefined when absent, or when a count is not one: the request then has no usage). */
      readonly usage: Usage | undefined;
      /** The event also ends the answer (Responses' `response.completed`: no `[DONE]` follows). */
      readonly terminal?: true;
      /** Responses' `sequence_number`. */
      readonly sequence?: number;
      /** Chat and completions: the text choice 0 carries in this event (a multi-turn session sends it back). */
      readonly text?: string;
    };

const FINISH_LABELS: ReadonlySet<string> = new Set(['stop', 'length', 'tool_calls', 'content_filter', 'function_call', 'abort', 'repetition']);

/** docs/metrics.md `finish_reason`: the closed set, `other` for any other value, `none` for a choice without one. */
export function finishLabel(reason: string | undefined): FinishReason {
  if (reason === undefined) return 'none';
  return FINISH_LABELS.has(reason) ? (reason as FinishReason) : 'other';
}

/**
 * docs/errors.md: the error events Waybill itself writes on a committed chat or Responses stream carry a string
 * `code`; the outcome each is counted as (docs/metrics.md). Any other error event (an upstream's) is `stream_error`.
 */
const GATEWAY_STREAM_ERRORS: Readonly<Record<string, StreamErrorOutcome>> = {
  stream_truncated: 'incomplete',
  stream_timeout: 'timeout',
  internal_error: 'incomplete',
};

/** The outcome of an error event whose Waybill code (a string) is `code`, if any. */
export function streamErrorOutcome(code: unknown): StreamErrorOutcome {
  return (typeof code === 'string' ? GATEWAY_STREAM_ERRORS[code] : undefined) ?? 'stream_error';
}

/** The largest event the client accepts (Waybill's default `streaming.max_event_bytes`; characters here). */
export const MAX_EVENT_CHARS = 1024 * 1024;

export type Json = Record<string, unknown>;

export const isObject = (value: unknown): value is Json => typeof value === 'object' && value !== null && !Array.isArray(value);
export const filled = (value: unknown) => typeof value === 'string' && value !== '';

/** docs/metrics.md: role-only chunks, empty deltas and usage chunks are not output. */
function carriesOutput(choice: Json): boolean {
  if (filled(choice['text'])) return true;
  const delta = isObject(choice['delta']) ? choice['delta'] : isObject(choice['message']) ? choice['message'] : undefined;
  if (delta === undefined) return false;
  const toolCalls = delta['tool_calls'];
  return filled(delta['content']) || filled(delta['reasoning_content']) || filled(delta['reasoning']) || (Array.isArray(toolCalls) && toolCalls.length > 0);
}

/** The answer text of a choice (a delta's or message's content, a completion's text); '' when it has none. */
function choiceText(choice: Json): string {
  if (typeof choice['text'] === 'string') return choice['text'];
  const delta = isObject(choice['delta']) ? choice['delta'] : isObject(choice['message']) ? choice['message'] : undefined;
  const content = delta?.['content'];
  return typeof content === 'string' ? content : '';
}

/**
 * docs/metrics.md (`invalid_usage`): every count a non-negative safe integer and cached ≤ prompt, or the request
 * counts as having no usage at all. The counts as read off a route's own usage object.
 */
export function countedUsage(prompt: unknown, completion: unknown, cached: unknown): Usage | undefined {
  let valid = true;
  const count = (raw: unknown): number | undefined => {
    if (raw === undefined || raw === null) return undefined;
    if (typeof raw === 'number' && Number.isSafeInteger(raw) && raw >= 0) return raw;
    valid = false;
    return undefined;
  };
  const usage = { promptTokens: count(prompt), completionTokens: count(completion), cachedTokens: count(cached) };
  if (usage.cachedTokens !== undefined && !(usage.promptTokens !== undefined && usage.cachedTokens <= usage.promptTokens)) valid = false;
  return valid ? usage : undefined;
}

/** OpenAI's usage object (chat, completions, and vLLM's non-generation routes). */
export function usageOf(value: unknown): Usage | undefined {
  if (!isObject(value)) return undefined;
  const details = value['prompt_tokens_details'];
  return countedUsage(value['prompt_tokens'], value['completion_tokens'], isObject(details) ? details['cached_tokens'] : undefined);
}

/** A JSON object, or undefined for anything else (not JSON, or not an object). */
export function parseObject(data: string): Json | undefined {
  try {
    const json: unknown = JSON.parse(data);
    return isObject(json) ? json : undefined;
  } catch {
    return undefined;
  }
}

/** Reads a parsed JSON value: one event's data, or a whole non-stream body. */
export function readJson(json: unknown): ClientEvent {
  if (!isObject(json)) return { kind: 'malformed' };
  const error = json['error'];
  if (error !== undefined && error !== null) return { kind: 'error', outcome: streamErrorOutcome(isObject(error) ? error['code'] : undefined) };
  const output: number[] = [];
  const finishes: Array<readonly [number, FinishReason]> = [];
  let text = '';
  const choices = json['choices'];
  for (const choice of Array.isArray(choices) ? choices : []) {
    if (!isObject(choice)) continue;
    const index = typeof choice['index'] === 'number' ? choice['index'] : 0;
    if (carriesOutput(choice)) output.push(index);
    if (index === 0) text += choiceText(choice);
    const reason = choice['finish_reason'];
    if (typeof reason === 'string' && reason !== '') finishes.push([index, finishLabel(reason)]);
  }
  return { kind: 'chunk', output, finishes, usage: usageOf(json['usage']), ...(text === '' ? {} : { text }) };
}

/** Reads one event's data. */
export function readEvent(data: string): ClientEvent {
  if (data === '[DONE]') return { kind: 'done' };
  let json: unknown;
  try {
    json = JSON.parse(data);
  } catch {
    return { kind: 'malformed' };
  }
  return readJson(json);
}

export interface EventReader {
  /** Feeds response bytes; a chunk may end anywhere, even inside a UTF-8 character. */
  feed(chunk: Uint8Array): void;
  /** End of the body: an unterminated last event is not an event (and is not reported). */
  end(): void;
}

/**
 * Cuts a `text/event-stream` body into events and hands each event's data, and its `event:` name when it has one
 * (Responses and Messages name every event), to `onData`. An event over MAX_EVENT_CHARS calls `onOversized` once
 * and ends the reading.
 */
export function createEventReader(onData: (data: string, name: string | undefined) => void, onOversized: () => void): EventReader {
  const decoder = new TextDecoder();
  let stopped = false;
  const parser = createParser({
    // WHATWG: an event whose data is empty dispatches nothing.
    onEvent: (event) => {
      if (event.data !== '') onData(event.data, event.event);
    },
    onError: (error) => {
      if (error.type !== 'max-buffer-size-exceeded') return; // unknown fields are ignored, as EventSource does
      stopped = true;
      onOversized();
    },
    maxBufferSize: MAX_EVENT_CHARS,
  });
  return {
    feed(chunk) {
      if (!stopped) parser.feed(decoder.decode(chunk, { stream: true }));
    },
    end() {
      if (!stopped) parser.feed(decoder.decode());
    },
  };
}
