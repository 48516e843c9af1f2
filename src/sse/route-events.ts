/**
 * What one event of the Anthropic Messages and OpenAI Responses streams means for delivery, in the same facts as
 * a chat chunk (docs/routes.md). Both name their events (`event: <type>`, mirrored by the JSON's `type`), both answer
 * one choice (index 0), and neither sends `[DONE]`:
 *
 * - Messages: `message_stop` ends a complete answer (a `done`); `message_delta` carries the stop reason and usage;
 *   `event: error` is an error.
 * - Responses: `response.completed` ends a complete answer (a chunk marked `terminal`, carrying the status as the
 *   finish reason and the usage); `response.failed`, `response.incomplete` and `error` are errors. vLLM sends none
 *   of those three — it cuts the connection — but newer servers may.
 */
import { isRecord } from '../util/json.js';
import { readError, type EventFacts, type UpstreamError, type Usage } from './classify.js';
import type { OutputPart } from './output-parts.js';

/**
 * The finish reason of an answer whose stop reason is null: vLLM's Messages converter maps both `abort` and
 * `repetition` to null, so which of the two it was is lost. A named reason, not `none` (a choice that never got one).
 */
export const NULL_STOP_REASON = 'abort_or_repetition';

type ChunkFacts = Extract<EventFacts, { kind: 'chunk' }>;

function chunk(fields: Partial<ChunkFacts> = {}): ChunkFacts {
  return {
    kind: 'chunk',
    output: [],
    answers: [],
    choices: [0],
    finishes: [],
    usage: undefined,
    usageInvalid: false,
    usageOnly: false,
    id: undefined,
    model: undefined,
    ...fields,
  };
}

function parse(data: string): Record<string, unknown> | undefined {
  try {
    const json: unknown = JSON.parse(data);
    return isRecord(json) ? json : undefined;
  } catch {
    return undefined;
  }
}

const nonEmpty = (value: unknown): value is string => typeof value === 'string' && value.length > 0;

function count(value: unknown): number | undefined | 'invalid' {
  if (value === undefined || value === null) return undefined;
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 0 ? value : 'invalid';
}

/** Usage from counts read off a route's own usage object; 'invalid' when any count cannot be counted. */
function usageOf(prompt: unknown, completion: unknown, cached: unknown): Usage | 'invalid' | undefined {
  const promptTokens = count(prompt);
  const completionTokens = count(completion);
  const cachedTokens = count(cached);
  if (promptTokens === 'invalid' || completionTokens === 'invalid' || cachedTokens === 'invalid') return 'invalid';
  if (cachedTokens !== undefined && (promptTokens === undefined || cachedTokens > promptTokens)) return 'invalid';
  if (promptTokens === undefined && completionTokens === undefined) return undefined;
  return { promptTokens, completionTokens, cachedTokens };
}

function withUsage(usage: Usage | 'invalid' | undefined): Partial<ChunkFacts> {
  return usage === 'invalid' ? { usageInvalid: true } : { usage };
}

// --- Anthropic Messages ------------------------------------------------------------------------------------------

/** Anthropic's stop_reason onto Waybill's finish reasons. */
export function messagesFinishReason(stopReason: unknown): string {
  switch (stopReason) {
    case 'end_turn':
    case 'stop_sequence':
      return 'stop';
    case 'max_tokens':
      return 'length';
    case 'tool_use':
      return 'tool_calls';
    case null:
    case undefined:
      return NULL_STOP_REASON;
    default:
      return typeof stopReason === 'string' ? stopReason : 'other';
  }
}

/**
 * Anthropic's error types and the status each names (the Anthropic API's own table): a Messages error that carries
 * a type and no code is read by its type.
 */
const ANTHROPIC_TYPE_STATUS: Readonly<Record<string, number>> = {
  invalid_request_error: 400,
  authentication_error: 401,
  permission_error: 403,
  not_found_error: 404,
  request_too_large: 413,
  rate_limit_error: 429,
  api_error: 500,
  timeout_error: 504,
  overloaded_error: 529,
};

/**
 * vLLM's Messages converter fails on the chat layer's error event and sends pydantic's message instead, which shows
 * the event it could not parse (its first 25 and last 24 characters): `…'code': 400}}, input_type=dict]`. The code
 * there is the real one (400 for lazy validation); the rest of the error is lost.
 */
const CONVERTER_CODE = /'code': (\d{3})\}\}, input_type=dict\]/;

/**
 * An Anthropic-shaped error (`{"type":"error","error":{"type","message"}}`, or an OpenAI-shaped one some servers
 * send here) with its code: the error's own `code`, else the code in vLLM's converter message, else the status its
 * Anthropic type names. No code when none of them says (docs/errors.md).
 */
function messagesError(value: unknown): UpstreamError {
  const error = readError(value);
  if (error.code !== undefined) return error;
  const buried = error.message === undefined ? null : CONVERTER_CODE.exec(error.message);
  if (buried !== null) return { ...error, code: Number(buried[1]) };
  const named = error.type === undefined ? undefined : ANTHROPIC_TYPE_STATUS[error.type];
  return named === undefined ? error : { ...error, code: named };
}

export function classifyMessagesEvent(eventType: string, data: string, withParts = false): EventFacts {
  const json = parse(data);
  if (json === undefined) return { kind: 'malformed' };
  const type = typeof json['type'] === 'string' ? json['type'] : eventType;
  switch (type) {
    case 'error':
      return { kind: 'error', ...messagesError(json['error'] ?? json) };
    case 'message_stop':
      return { kind: 'done' };
    case 'message_start': {
      // Its usage (the prompt's input_tokens) is not taken: usage counts from message_delta only, as the final usage
      // chunk on chat — a stream broken before it counts no tokens on any route (docs/routes.md).
      const message = isRecord(json['message']) ? json['message'] : {};
      return chunk({ id: str(message['id']), model: str(message['model']) });
    }
    case 'content_block_start': {
      const block = isRecord(json['content_block']) ? json['content_block'] : {};
      if (block['type'] === 'tool_use' && nonEmpty(block['name'])) {
        const parts = withParts ? [toolPart(json['index'], block['name'], undefined)] : undefined;
        return chunk({ output: [0], answers: [0], outputChars: block['name'].length, ...(parts && { parts }) });
      }
      if (block['type'] === 'text' && nonEmpty(block['text'])) return chunk({ output: [0], answers: [0], outputChars: block['text'].length, ...(withParts && { parts: [text(block['text'])] }) });
      return chunk();
    }
    case 'content_block_delta': {
      const delta = isRecord(json['delta']) ? json['delta'] : {};
      if (delta['type'] === 'text_delta' && nonEmpty(delta['text'])) {
        return chunk({ output: [0], answers: [0], outputChars: delta['text'].length, ...(withParts && { parts: [text(delta['text'])] }) });
      }
      if (delta['type'] === 'input_json_delta' && nonEmpty(delta['partial_json'])) {
        return chunk({ output: [0], answers: [0], outputChars: delta['partial_json'].length, ...(withParts && { parts: [toolPart(json['index'], undefined, delta['partial_json'])] }) });
      }
      if (delta['type'] === 'thinking_delta' && nonEmpty(delta['thinking'])) return chunk({ output: [0], outputChars: delta['thinking'].length });
      return chunk();
    }
    case 'message_delta': {
      const delta = isRecord(json['delta']) ? json['delta'] : {};
      const usage = isRecord(json['usage']) ? json['usage'] : {};
      return chunk({
        finishes: 'stop_reason' in delta ? [{ index: 0, reason: messagesFinishReason(delta['stop_reason']) }] : [],
        ...withUsage(usageOf(usage['input_tokens'], usage['output_tokens'], usage['cache_read_input_tokens'])),
      });
    }
    default:
      // content_block_stop, ping, and whatever a newer server adds: carried along, no facts.
      return chunk();
  }
}

/** A whole non-stream Messages body. */
export function classifyMessagesBody(json: unknown, withParts = false): EventFacts {
  if (!isRecord(json)) return { kind: 'malformed' };
  if (json['type'] === 'error' || (isRecord(json['error']) && json['type'] !== 'message')) return { kind: 'error', ...messagesError(json['error']) };
  if (json['type'] !== 'message' && !Array.isArray(json['content'])) return { kind: 'malformed' };
  const content = Array.isArray(json['content']) ? json['content'] : [];
  let answered = false;
  const parts: OutputPart[] = [];
  content.forEach((block, position) => {
    if (!isRecord(block)) return;
    if (block['type'] === 'text' && nonEmpty(block['text'])) {
      answered = true;
      parts.push(text(block['text']));
    } else if (block['type'] === 'tool_use' && nonEmpty(block['name'])) {
      answered = true;
      parts.push(toolPart(position, block['name'], JSON.stringify(block['input'] ?? {})));
    }
  });
  const usage = isRecord(json['usage']) ? json['usage'] : {};
  return chunk({
    output: answered ? [0] : [],
    answers: answered ? [0] : [],
    finishes: [{ index: 0, reason: messagesFinishReason(json['stop_reason']) }],
    ...withUsage(usageOf(usage['input_tokens'], usage['output_tokens'], usage['cache_read_input_tokens'])),
    id: str(json['id']),
    model: str(json['model']),
    ...(withParts && { parts }),
  });
}

// --- OpenAI Responses --------------------------------------------------------------------------------------------

/** A Responses status onto Waybill's finish reasons; `tool_calls` when the output holds a function call. */
function responsesFinishReason(response: Record<string, unknown>): string {
  switch (response['status']) {
    case 'completed': {
      const output = Array.isArray(response['output']) ? response['output'] : [];
      return output.some((item) => isRecord(item) && item['type'] === 'function_call') ? 'tool_calls' : 'stop';
    }
    case 'incomplete': {
      const details = isRecord(response['incomplete_details']) ? response['incomplete_details'] : {};
      return details['reason'] === 'content_filter' ? 'content_filter' : 'length';
    }
    case 'cancelled':
      return 'abort';
    default:
      return 'other';
  }
}

function responsesUsage(response: Record<string, unknown>): Usage | 'invalid' | undefined {
  const usage = response['usage'];
  if (!isRecord(usage)) return undefined;
  const details = isRecord(usage['input_tokens_details']) ? usage['input_tokens_details'] : {};
  return usageOf(usage['input_tokens'], usage['output_tokens'], details['cached_tokens']);
}

/** The parts of a Responses output array: message text, and function calls with their whole arguments. */
function responsesOutputParts(output: unknown): OutputPart[] {
  const parts: OutputPart[] = [];
  if (!Array.isArray(output)) return parts;
  output.forEach((item, position) => {
    if (!isRecord(item)) return;
    if (item['type'] === 'message' && Array.isArray(item['content'])) {
      for (const piece of item['content']) {
        if (isRecord(piece) && piece['type'] === 'output_text' && typeof piece['text'] === 'string') parts.push(text(piece['text']));
      }
    } else if (item['type'] === 'function_call') {
      parts.push(toolPart(position, str(item['name']), typeof item['arguments'] === 'string' ? item['arguments'] : undefined));
    }
  });
  return parts;
}

export function classifyResponsesEvent(eventType: string, data: string, withParts = false): EventFacts {
  const json = parse(data);
  if (json === undefined) return { kind: 'malformed' };
  const type = typeof json['type'] === 'string' ? json['type'] : eventType;
  const sequence = typeof json['sequence_number'] === 'number' && Number.isSafeInteger(json['sequence_number']) ? json['sequence_number'] : undefined;
  const seq = sequence === undefined ? {} : { sequence };
  switch (type) {
    case 'error':
      return { kind: 'error', ...readError(json['error'] ?? json), ...seq };
    case 'response.failed':
    case 'response.incomplete': {
      const response = isRecord(json['response']) ? json['response'] : {};
      const error = readError(response['error']);
      return { kind: 'error', ...error, message: error.message ?? type, ...seq };
    }
    case 'response.completed': {
      const response = isRecord(json['response']) ? json['response'] : {};
      return chunk({
        finishes: [{ index: 0, reason: responsesFinishReason(response) }],
        ...withUsage(responsesUsage(response)),
        id: str(response['id']),
        model: str(response['model']),
        terminal: true,
        ...seq,
      });
    }
    case 'response.output_text.delta':
    case 'response.refusal.delta':
      return nonEmpty(json['delta'])
        ? chunk({ output: [0], answers: [0], outputChars: json['delta'].length, ...seq, ...(withParts && type === 'response.output_text.delta' && { parts: [text(json['delta'])] }) })
        : chunk(seq);
    case 'response.function_call_arguments.delta':
      return nonEmpty(json['delta'])
        ? chunk({ output: [0], answers: [0], outputChars: json['delta'].length, ...seq, ...(withParts && { parts: [toolPart(json['output_index'], undefined, json['delta'])] }) })
        : chunk(seq);
    case 'response.reasoning_text.delta':
    case 'response.reasoning_summary_text.delta':
      return nonEmpty(json['delta']) ? chunk({ output: [0], outputChars: json['delta'].length, ...seq }) : chunk(seq);
    case 'response.output_item.added': {
      const item = isRecord(json['item']) ? json['item'] : {};
      // A function call's name is known here; its arguments follow as deltas of the same output index.
      if (withParts && item['type'] === 'function_call') return chunk({ ...seq, parts: [toolPart(json['output_index'], str(item['name']), undefined)] });
      return chunk(seq);
    }
    case 'response.created':
    case 'response.in_progress': {
      const response = isRecord(json['response']) ? json['response'] : {};
      return chunk({ id: str(response['id']), model: str(response['model']), ...seq });
    }
    default:
      return chunk(seq);
  }
}

/** A whole non-stream Responses body (also a background response's first answer, status `queued`). */
export function classifyResponsesBody(json: unknown, withParts = false): EventFacts {
  if (!isRecord(json)) return { kind: 'malformed' };
  if (isRecord(json['error']) && json['object'] !== 'response') return { kind: 'error', ...readError(json['error']) };
  if (json['object'] !== 'response' && !Array.isArray(json['output'])) return { kind: 'malformed' };
  const parts = responsesOutputParts(json['output']);
  const answered = parts.some((p) => nonEmpty(p.content) || (p.toolCalls ?? []).some((c) => c.name !== undefined));
  const status = json['status'];
  // A background request answers at once with `queued`: accepted for work, nothing generated yet.
  const finished = status === 'completed' || status === 'incomplete' || status === 'cancelled';
  return chunk({
    output: answered ? [0] : [],
    answers: answered ? [0] : [],
    // Not finished (a background request's `queued` acknowledgement): no choice finished here.
    finishes: finished ? [{ index: 0, reason: responsesFinishReason(json) }] : [],
    ...withUsage(responsesUsage(json)),
    id: str(json['id']),
    model: str(json['model']),
    ...(withParts && { parts }),
  });
}

// --- shared ------------------------------------------------------------------------------------------------------

function str(value: unknown): string | undefined {
  return typeof value === 'string' ? value : undefined;
}

function text(content: string): OutputPart {
  return { index: 0, content, toolCalls: undefined };
}

function toolPart(index: unknown, name: string | undefined, args: string | undefined): OutputPart {
  return { index: 0, content: undefined, toolCalls: [{ index: typeof index === 'number' ? index : 0, name, arguments: args }] };
}
