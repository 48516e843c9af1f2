/**
 * Each route the load tool sends, as a client of that route sees it: its path, the request body, the texts Waybill
 * estimates a prompt's length from, and how its answer reads — events and whole bodies turned into the client's
 * events (load/sse.ts). Written from the wire contract (docs/routes.md, docs/errors.md, docs/metrics.md), never
 * from Waybill's classifier (src/sse/): this is the oracle the reconciliation checks Waybill against.
 *
 * - Chat and legacy completions: `data:` events, `[DONE]` last (load/sse.ts).
 * - Responses (`/v1/responses`): named events; the answer is complete with `response.completed` (no `[DONE]`), whose
 *   status is the finish reason and whose usage is counted; Waybill's own error event is `event: error` with its
 *   string `code`.
 * - Messages (`/v1/messages`): named events; complete with `message_stop` after `message_delta` gave a stop reason;
 *   usage from `message_delta`; Waybill's own error event is Anthropic-shaped, `api_error` or `timeout_error`.
 * - Embeddings, rerank, tokenize: one JSON body, no choices; delivered when it is a 2xx JSON object without `error`.
 */
import {
  countedUsage,
  filled,
  finishLabel,
  isObject,
  parseObject,
  readEvent,
  readJson,
  streamErrorOutcome,
  usageOf,
  type ClientEvent,
  type FinishReason,
  type Json,
  type StreamErrorOutcome,
} from './sse.js';
import { promptText, type LoadRoute, type PlannedRequest } from './workload.js';

export const ROUTE_PATHS: Readonly<Record<LoadRoute, string>> = {
  chat_completions: '/v1/chat/completions',
  completions: '/v1/completions',
  responses: '/v1/responses',
  messages: '/v1/messages',
  embeddings: '/v1/embeddings',
  rerank: '/v1/rerank',
  tokenize: '/tokenize',
};

/** The documents a rerank request ranks against its query (the prompt). */
export const RERANK_DOCUMENTS: readonly string[] = ['alpha bravo delta', 'gamma kilo lima oscar'];

/** The texts of the request's input: what Waybill estimates its prompt length from before usage is known. */
export function inputTexts(plan: PlannedRequest): string[] {
  if (plan.messages !== undefined) return plan.messages.map((m) => m.content);
  const prompt = promptText(plan.promptTokens, plan.index);
  return plan.route === 'rerank' ? [prompt, ...RERANK_DOCUMENTS] : [prompt];
}

export function requestBody(plan: PlannedRequest, model: string): string {
  // A fleet request (always chat) carries its messages: no filler prompt to build.
  const prompt = plan.messages === undefined ? promptText(plan.promptTokens, plan.index) : '';
  switch (plan.route) {
    case 'chat_completions':
    case 'completions': {
      const common = { model, max_tokens: plan.maxTokens, n: plan.n, stream: plan.stream };
      const options = plan.includeUsage ? { stream_options: { include_usage: true } } : {};
      return JSON.stringify(
        plan.route === 'chat_completions' ? { ...common, ...options, messages: plan.messages ?? [{ role: 'user', content: prompt }] } : { ...common, ...options, prompt },
      );
    }
    case 'responses':
      return JSON.stringify({ model, input: prompt, max_output_tokens: plan.maxTokens, stream: plan.stream });
    case 'messages':
      return JSON.stringify({ model, max_tokens: plan.maxTokens, messages: [{ role: 'user', content: prompt }], stream: plan.stream });
    case 'embeddings':
      return JSON.stringify({ model, input: prompt });
    case 'rerank':
      return JSON.stringify({ model, query: prompt, documents: RERANK_DOCUMENTS });
    case 'tokenize':
      return JSON.stringify({ model, prompt });
  }
}

/** How a route's answer reads: one streamed event (with its `event:` name), or a whole 200 body. */
export interface RouteReader {
  readonly event: (data: string, name: string | undefined) => ClientEvent;
  readonly body: (json: unknown) => ClientEvent;
}

export function readerOf(route: LoadRoute): RouteReader {
  switch (route) {
    case 'chat_completions':
    case 'completions':
      return { event: (data) => readEvent(data), body: readJson };
    case 'responses':
      return { event: readResponsesEvent, body: readResponsesBody };
    case 'messages':
      return { event: readMessagesEvent, body: readMessagesBody };
    case 'embeddings':
    case 'rerank':
    case 'tokenize':
      return { event: () => ({ kind: 'malformed' }), body: readPoolingBody };
  }
}

const NOTHING: ClientEvent = { kind: 'chunk', output: [], finishes: [], usage: undefined };

function sequenceOf(json: Json): { sequence?: number } {
  const value = json['sequence_number'];
  return typeof value === 'number' && Number.isSafeInteger(value) ? { sequence: value } : {};
}

// --- OpenAI Responses ----------------------------------------------------------------------------------------------

/** Deltas that carry output (docs/routes.md): text, refusal, reasoning, and tool-call arguments. */
const RESPONSES_OUTPUT_DELTAS: ReadonlySet<string> = new Set([
  'response.output_text.delta',
  'response.refusal.delta',
  'response.reasoning_text.delta',
  'response.reasoning_summary_text.delta',
  'response.function_call_arguments.delta',
]);

/**
 * docs/routes.md: the status of the final response is the finish reason — `completed` → `stop` (`tool_calls` when
 * the output ends in function calls), `incomplete` → `length` (`content_filter` if that is the reason),
 * `cancelled` → `abort`; any other value is `other` (docs/metrics.md).
 */
export function responsesFinishLabel(response: Json): FinishReason {
  switch (response['status']) {
    case 'completed': {
      const output = Array.isArray(response['output']) ? (response['output'] as unknown[]) : [];
      const last = output.at(-1);
      return isObject(last) && last['type'] === 'function_call' ? 'tool_calls' : 'stop';
    }
    case 'incomplete': {
      const details = response['incomplete_details'];
      return isObject(details) && details['reason'] === 'content_filter' ? 'content_filter' : 'length';
    }
    case 'cancelled':
      return 'abort';
    default:
      return finishLabel(typeof response['status'] === 'string' ? response['status'] : 'unknown');
  }
}

/** `input_tokens`, `output_tokens` and `input_tokens_details.cached_tokens` of a response's usage. */
function responsesUsage(response: Json) {
  const usage = response['usage'];
  if (!isObject(usage)) return undefined;
  const details = usage['input_tokens_details'];
  return countedUsage(usage['input_tokens'], usage['output_tokens'], isObject(details) ? details['cached_tokens'] : undefined);
}

export function readResponsesEvent(data: string, name: string | undefined): ClientEvent {
  const json = parseObject(data);
  if (json === undefined) return { kind: 'malformed' };
  const type = typeof json['type'] === 'string' ? json['type'] : (name ?? '');
  const seq = sequenceOf(json);
  switch (type) {
    case 'error': {
      // Waybill's own: `{"type":"error","error":{…},"code":"stream_truncated",…}` (docs/errors.md).
      const error = json['error'];
      const code = json['code'] ?? (isObject(error) ? error['code'] : undefined);
      return { kind: 'error', outcome: streamErrorOutcome(code), ...seq };
    }
    case 'response.failed':
    case 'response.incomplete':
      // Newer servers' failure events: forwarded and counted as the upstream's error.
      return { kind: 'error', outcome: 'stream_error', ...seq };
    case 'response.completed': {
      const response = isObject(json['response']) ? json['response'] : {};
      return { kind: 'chunk', output: [], finishes: [[0, responsesFinishLabel(response)]], usage: responsesUsage(response), terminal: true, ...seq };
    }
    default:
      if (RESPONSES_OUTPUT_DELTAS.has(type) && filled(json['delta'])) {
        return { kind: 'chunk', output: [0], finishes: [], usage: undefined, ...seq };
      }
      return { ...NOTHING, ...seq };
  }
}

/** A whole Responses answer: the response object (`"object":"response"`), a length cap still a 200. */
export function readResponsesBody(json: unknown): ClientEvent {
  if (!isObject(json)) return { kind: 'malformed' };
  if (json['object'] !== 'response') return isObject(json['error']) ? { kind: 'error', outcome: 'stream_error' } : { kind: 'malformed' };
  const status = json['status'];
  const finished = status === 'completed' || status === 'incomplete' || status === 'cancelled';
  const output = Array.isArray(json['output']) ? (json['output'] as unknown[]) : [];
  const answered = output.some(
    (item) =>
      isObject(item) &&
      ((Array.isArray(item['content']) && (item['content'] as unknown[]).some((part) => isObject(part) && filled(part['text']))) ||
        filled(item['arguments'])),
  );
  return { kind: 'chunk', output: answered ? [0] : [], finishes: finished ? [[0, responsesFinishLabel(json)]] : [], usage: responsesUsage(json) };
}

// --- Anthropic Messages --------------------------------------------------------------------------------------------

/** docs/routes.md: end_turn and stop_sequence → stop, max_tokens → length, tool_use → tool_calls, null → none. */
export function messagesFinishLabel(stopReason: unknown): FinishReason {
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
      return 'none';
    default:
      return 'other';
  }
}

/**
 * docs/errors.md: a committed Messages stream Waybill ends itself gets `event: error` of type `api_error`, or
 * `timeout_error` for its deadlines; any other error event (vLLM's converter sends `internal_error`) is the
 * upstream's.
 */
export function messagesErrorOutcome(error: unknown): StreamErrorOutcome {
  const type = isObject(error) ? error['type'] : undefined;
  return type === 'timeout_error' ? 'timeout' : type === 'api_error' ? 'incomplete' : 'stream_error';
}

function messagesUsage(usage: unknown) {
  return isObject(usage) ? countedUsage(usage['input_tokens'], usage['output_tokens'], undefined) : undefined;
}

export function readMessagesEvent(data: string, name: string | undefined): ClientEvent {
  const json = parseObject(data);
  if (json === undefined) return { kind: 'malformed' };
  const type = typeof json['type'] === 'string' ? json['type'] : (name ?? '');
  switch (type) {
    case 'error':
      return { kind: 'error', outcome: messagesErrorOutcome(json['error']) };
    case 'message_stop':
      return { kind: 'done' };
    case 'message_delta': {
      const delta = isObject(json['delta']) ? json['delta'] : {};
      return {
        kind: 'chunk',
        output: [],
        finishes: 'stop_reason' in delta ? [[0, messagesFinishLabel(delta['stop_reason'])]] : [],
        usage: messagesUsage(json['usage']),
      };
    }
    case 'content_block_start': {
      const block = json['content_block'];
      return isObject(block) && block['type'] === 'tool_use' ? { kind: 'chunk', output: [0], finishes: [], usage: undefined } : NOTHING;
    }
    case 'content_block_delta': {
      const delta = isObject(json['delta']) ? json['delta'] : {};
      const output =
        (delta['type'] === 'text_delta' && filled(delta['text'])) ||
        (delta['type'] === 'thinking_delta' && filled(delta['thinking'])) ||
        (delta['type'] === 'input_json_delta' && filled(delta['partial_json']));
      return output ? { kind: 'chunk', output: [0], finishes: [], usage: undefined } : NOTHING;
    }
    default:
      // message_start (its usage is not the answer's: docs/routes.md takes usage from message_delta),
      // content_block_stop, ping.
      return NOTHING;
  }
}

/** A whole Messages answer: `"type":"message"` with its stop reason (left out when null) and usage. */
export function readMessagesBody(json: unknown): ClientEvent {
  if (!isObject(json)) return { kind: 'malformed' };
  if (json['type'] === 'error') return { kind: 'error', outcome: 'stream_error' };
  if (json['type'] !== 'message') return { kind: 'malformed' };
  const content = Array.isArray(json['content']) ? (json['content'] as unknown[]) : [];
  const answered = content.some((block) => isObject(block) && ((block['type'] === 'text' && filled(block['text'])) || block['type'] === 'tool_use'));
  return { kind: 'chunk', output: answered ? [0] : [], finishes: [[0, messagesFinishLabel(json['stop_reason'])]], usage: messagesUsage(json['usage']) };
}

// --- embeddings, rerank, tokenize ----------------------------------------------------------------------------------

/**
 * docs/routes.md: a 2xx JSON object without `error` is an answer (no choices, no finish reason); its usage is
 * `usage.prompt_tokens` (rerank's two-key usage included; tokenize reports none).
 */
export function readPoolingBody(json: unknown): ClientEvent {
  if (!isObject(json)) return { kind: 'malformed' };
  const error = json['error'];
  if (error !== undefined && error !== null) return { kind: 'error', outcome: 'stream_error' };
  return { kind: 'chunk', output: [], finishes: [], usage: usageOf(json['usage']) };
}

/**
 * The outcome of an error status as Waybill counts it (docs/metrics.md, docs/errors.md): 4xx `rejected`, 5xx
 * `failed`, except a 504 that is Waybill's own deadline (`timeout`). On the OpenAI-shaped routes its body says
 * `upstream_timeout` (an upstream's error event with code 504, passed through, is `failed`). On `/v1/messages` the
 * body is Anthropic-shaped and has no code: there a 504 is always Waybill's deadline, since an upstream 5xx is
 * answered 502 and vLLM's Anthropic error events carry no code for a 504 to come from.
 */
export function statusOutcome(status: number, body: string, route: LoadRoute = 'chat_completions'): Exclude<StreamErrorOutcome, 'stream_error' | 'incomplete'> | 'rejected' | 'failed' {
  if (status < 500) return 'rejected';
  if (status !== 504) return 'failed';
  if (route === 'messages') return 'timeout';
  const json = parseObject(body);
  const error = json?.['error'];
  return isObject(error) && error['code'] === 'upstream_timeout' ? 'timeout' : 'failed';
}
