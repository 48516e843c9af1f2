/**
 * The load client's own reading of an OpenAI-compatible response: the reconciliation oracle must not share the
 * code it checks, so nothing here comes from Waybill's framer or classifier (src/sse/). Events are cut by
 * `eventsource-parser` and each event's data is read with plain `JSON.parse`, following the wire contract
 * (docs/metrics.md, docs/errors.md) rather than Waybill's implementation.
 */
import { createParser } from 'eventsource-parser';

export interface Usage {
  readonly promptTokens: number | undefined;
  readonly completionTokens: number | undefined;
  readonly cachedTokens: number | undefined;
}

export type ClientEvent =
  | { readonly kind: 'done' }
  /** Data that is not `[DONE]` and not a JSON object: Waybill drops these, so one reaching a client is a bug. */
  | { readonly kind: 'malformed' }
  /** Any JSON object with a non-null `error`; `code` is `error.code` when it is a string (Waybill's own codes). */
  | { readonly kind: 'error'; readonly code: string | undefined }
  | {
      readonly kind: 'chunk';
      /** Indices of the choices this event carries generated output for. */
      readonly output: readonly number[];
      /** [choice index, finish_reason] for every choice this event finishes. */
      readonly finishes: ReadonlyArray<readonly [number, string]>;
      /** Usage as counted (undefined when absent, or when a count is not one: the request then has no usage). */
      readonly usage: Usage | undefined;
    };

/** The largest event the client accepts (Waybill's default `streaming.max_event_bytes`; characters here). */
export const MAX_EVENT_CHARS = 1024 * 1024;

type Json = Record<string, unknown>;

const isObject = (value: unknown): value is Json => typeof value === 'object' && value !== null && !Array.isArray(value);
const filled = (value: unknown) => typeof value === 'string' && value !== '';

/** docs/metrics.md: role-only chunks, empty deltas and usage chunks are not output. */
function carriesOutput(choice: Json): boolean {
  if (filled(choice['text'])) return true;
  const delta = isObject(choice['delta']) ? choice['delta'] : isObject(choice['message']) ? choice['message'] : undefined;
  if (delta === undefined) return false;
  const toolCalls = delta['tool_calls'];
  return filled(delta['content']) || filled(delta['reasoning_content']) || filled(delta['reasoning']) || (Array.isArray(toolCalls) && toolCalls.length > 0);
}

/**
 * docs/metrics.md (`invalid_usage`): every count a non-negative safe integer and cached ≤ prompt, or the request
 * counts as having no usage at all.
 */
function usageOf(value: unknown): Usage | undefined {
  if (!isObject(value)) return undefined;
  let valid = true;
  const count = (raw: unknown): number | undefined => {
    if (raw === undefined || raw === null) return undefined;
    if (typeof raw === 'number' && Number.isSafeInteger(raw) && raw >= 0) return raw;
    valid = false;
    return undefined;
  };
  const details = value['prompt_tokens_details'];
  const usage = {
    promptTokens: count(value['prompt_tokens']),
    completionTokens: count(value['completion_tokens']),
    cachedTokens: isObject(details) ? count(details['cached_tokens']) : undefined,
  };
  if (usage.cachedTokens !== undefined && !(usage.promptTokens !== undefined && usage.cachedTokens <= usage.promptTokens)) valid = false;
  return valid ? usage : undefined;
}

/** Reads a parsed JSON value: one event's data, or a whole non-stream body. */
export function readJson(json: unknown): ClientEvent {
  if (!isObject(json)) return { kind: 'malformed' };
  const error = json['error'];
  if (error !== undefined && error !== null) {
    const code = isObject(error) ? error['code'] : undefined;
    return { kind: 'error', code: typeof code === 'string' ? code : undefined };
  }
  const output: number[] = [];
  const finishes: Array<readonly [number, string]> = [];
  const choices = json['choices'];
  for (const choice of Array.isArray(choices) ? choices : []) {
    if (!isObject(choice)) continue;
    const index = typeof choice['index'] === 'number' ? choice['index'] : 0;
    if (carriesOutput(choice)) output.push(index);
    const reason = choice['finish_reason'];
    if (typeof reason === 'string' && reason !== '') finishes.push([index, reason]);
  }
  return { kind: 'chunk', output, finishes, usage: usageOf(json['usage']) };
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
 * Cuts a `text/event-stream` body into events and hands each event's data to `onData`. An event over
 * MAX_EVENT_CHARS calls `onOversized` once and ends the reading.
 */
export function createEventReader(onData: (data: string) => void, onOversized: () => void): EventReader {
  const decoder = new TextDecoder();
  let stopped = false;
  const parser = createParser({
    // WHATWG: an event whose data is empty dispatches nothing.
    onEvent: (event) => {
      if (event.data !== '') onData(event.data);
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
