/**
 * `POST /v1/messages` as vLLM@52a31cce serves it: the Anthropic request is converted to a chat completion (usage
 * forced on) and every chat chunk re-written as Anthropic events, `model_dump_json(exclude_unset=True)` — so
 * `message_start`'s message lacks `type` and `role`. An error in the chat stream fails the converter's own parsing:
 * one `event: error` carrying pydantic's message (the real one is lost), then a clean end. Sources:
 * `vllm/entrypoints/anthropic/{api_router,serving,protocol}.py`; docs/routes.md.
 */
import type { EventWriter, NamedEvent } from './event-stream.js';
import { MAX_MODEL_LEN, messageText, type RequestSummary } from './request.js';
import type { EventRouteRefusal } from './responses.js';
import {
  choiceTextJsonInner,
  ENGINE_DEAD_MESSAGE,
  errorBody,
  errorMessage,
  errorType,
  estimateTokens,
  modelNotFoundMessage,
  stringErrorBody,
  UNAUTHORIZED_BODY,
  type ErrorInfo,
} from './wire.js';

export interface MessagesRequest {
  readonly route: 'messages';
  /** The name answers carry: the chat layer's `models.model_name()`, the first served name whatever was asked. */
  readonly model: string;
  readonly stream: boolean;
  readonly maxTokens: number;
  readonly promptTokens: number;
}

export type MessagesReadResult = { readonly ok: true; readonly request: MessagesRequest } | { readonly ok: false; readonly refusal: EventRouteRefusal };

class Refused extends Error {
  constructor(readonly refusal: EventRouteRefusal) {
    super(refusal.body);
  }
}

/** `{"type":"error","error":{"type","message"}}`: AnthropicErrorResponse.model_dump(), as JSONResponse writes it. */
export function anthropicErrorBody(type: string, message: string): string {
  return JSON.stringify({ type: 'error', error: { type, message } });
}

/** The global validation handler answers before the route: OpenAI-shaped, type "Bad Request". */
function invalid(message: string): Refused {
  return new Refused({ status: 400, body: errorBody({ message, type: 'Bad Request', param: null, code: 400 }), closes: false });
}

/** Any exception inside create_messages: the route catches it and answers 500 `internal_error` with str(e). */
function internalError(message: string): Refused {
  return new Refused({ status: 500, body: anthropicErrorBody('internal_error', message), closes: false });
}

/** The `status` fault's body: the middleware's string bodies, else what the route's error paths write for it. */
export function messagesStatusBody(status: number, model: string): string {
  if (status === 401) return UNAUTHORIZED_BODY;
  if (status === 503) return stringErrorBody('Service Unavailable');
  if (status === 404) return anthropicErrorBody('NotFoundError', modelNotFoundMessage(model));
  if (status === 500) return anthropicErrorBody('internal_error', errorMessage(500));
  return anthropicErrorBody(errorType(status), errorMessage(status));
}

/**
 * A non-streaming engine error: the chat layer raises it (it catches nothing but a cancellation), so the route turns
 * it into its 500, whatever the code was.
 */
export function messagesFailure(info: ErrorInfo): { readonly status: number; readonly body: string } {
  return { status: 500, body: anthropicErrorBody('internal_error', info.message) };
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** The text of `system` (a string, or blocks with `text`). */
function systemChars(system: unknown): number {
  if (system === undefined || system === null) return 0;
  if (typeof system === 'string') return system.length;
  if (!Array.isArray(system)) throw invalid('system: Input should be a valid string or a valid list');
  let chars = 0;
  for (const block of system) {
    if (!isRecord(block)) throw invalid('system: each block should be an object');
    if (typeof block.text === 'string') chars += block.text.length;
  }
  return chars;
}

export function readMessagesRequest(body: unknown, models: readonly string[], summary: RequestSummary, engineDead: boolean): MessagesReadResult {
  try {
    return { ok: true, request: read(body, models, summary, engineDead) };
  } catch (error) {
    if (error instanceof Refused) return { ok: false, refusal: error.refusal };
    throw error;
  }
}

function read(body: unknown, models: readonly string[], summary: RequestSummary, engineDead: boolean): MessagesRequest {
  // AnthropicMessagesRequest (pydantic, before the route).
  if (!isRecord(body)) throw invalid('Input should be a valid dictionary or object to extract fields from');
  const { model, messages, max_tokens: maxTokens, stream, tools, tool_choice: toolChoice } = body;
  if (typeof model === 'string') summary.model = model;
  if (stream !== undefined && stream !== null && typeof stream !== 'boolean') throw invalid('stream: Input should be a valid boolean');
  summary.stream = stream === true;
  if (model === undefined) throw invalid('model: Field required');
  if (typeof model !== 'string') throw invalid('model: Input should be a valid string');
  if (model === '') throw invalid('model: Value error, Model is required');
  if (messages === undefined) throw invalid('messages: Field required');
  if (!Array.isArray(messages)) throw invalid('messages: Input should be a valid list');
  let chars = systemChars(body.system);
  for (const message of messages) {
    if (!isRecord(message)) throw invalid('messages: each message should be an object');
    if (message.role !== 'user' && message.role !== 'assistant') throw invalid("messages.role: Input should be 'user' or 'assistant'");
    if (typeof message.content !== 'string' && !Array.isArray(message.content)) {
      throw invalid('messages.content: Input should be a valid string or a valid list');
    }
    chars += messageText(message)?.length ?? 0;
  }
  if (maxTokens === undefined) throw invalid('max_tokens: Field required');
  if (typeof maxTokens !== 'number' || !Number.isInteger(maxTokens)) throw invalid('max_tokens: Input should be a valid integer');
  if (maxTokens <= 0) throw invalid('max_tokens: Value error, max_tokens must be positive');
  if (tools !== undefined && tools !== null) {
    if (!Array.isArray(tools)) throw invalid('tools: Input should be a valid list');
    for (const tool of tools) {
      if (!isRecord(tool) || typeof tool.name !== 'string' || !isRecord(tool.input_schema)) {
        throw invalid('tools: each tool needs a string `name` and an object `input_schema`');
      }
    }
  }
  if (toolChoice !== undefined && toolChoice !== null) {
    if (!isRecord(toolChoice) || !['auto', 'any', 'tool', 'none'].includes(String(toolChoice.type))) {
      throw invalid("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'");
    }
    if (toolChoice.type === 'tool' && (typeof toolChoice.name !== 'string' || toolChoice.name === '')) {
      throw invalid("tool_choice: Value error, tool_choice.name is required when type is 'tool'");
    }
  }

  // The chat layer: the model (an ErrorResponse, translated with vLLM's type name), a dead engine and the renderer's
  // length check (exceptions: the route's 500).
  if (!models.includes(model)) {
    throw new Refused({ status: 404, body: anthropicErrorBody('NotFoundError', modelNotFoundMessage(model)), closes: false });
  }
  if (engineDead) throw internalError(ENGINE_DEAD_MESSAGE);
  const promptTokens = estimateTokens(chars);
  if (promptTokens > MAX_MODEL_LEN - maxTokens) {
    throw internalError(
      `This model's maximum context length is ${MAX_MODEL_LEN} tokens. However, you requested ${maxTokens} output tokens and your prompt contains ${promptTokens} input tokens, for a total of ${promptTokens + maxTokens} tokens. Please reduce the length of the input prompt or the number of requested output tokens.`,
    );
  }
  return { route: 'messages', model: models[0] ?? '', stream: stream === true, maxTokens, promptTokens };
}

// ---- the answer ----

export interface MessagesAnswer {
  /** `chatcmpl-<X-Request-Id | 16 hex>`: the chat completion's id. */
  readonly id: string;
  readonly model: string;
  readonly tokens: number;
  /** The chat finish reason, mapped by stopReason(). */
  readonly finishReason: string;
  readonly promptTokens: number;
  /** `no_usage`: no `usage` where vLLM always sends it. */
  readonly usage: boolean;
}

/** vLLM's stop_reason_map: stop, length and tool_calls; anything else (abort, repetition) is null. */
export function stopReason(finishReason: string): string | null {
  if (finishReason === 'stop') return 'end_turn';
  if (finishReason === 'length') return 'max_tokens';
  if (finishReason === 'tool_calls') return 'tool_use';
  return null;
}

/** The non-streaming 200 body: `model_dump(exclude_none=True)`, so a null stop_reason is left out. */
export function messagesBody(answer: MessagesAnswer): string {
  const reason = stopReason(answer.finishReason);
  return (
    `{"id":${JSON.stringify(answer.id)},"type":"message","role":"assistant","content":[{"type":"text","text":"${choiceTextJsonInner(0, 0, answer.tokens)}"}],` +
    `"model":${JSON.stringify(answer.model)}${reason === null ? '' : `,"stop_reason":"${reason}"`}` +
    `${answer.usage ? `,"usage":{"input_tokens":${answer.promptTokens},"output_tokens":${answer.tokens}}` : ''}}`
  );
}

/** Python's repr() of a JSON value, as pydantic shows an input. */
function pythonRepr(value: unknown): string {
  if (value === null || value === undefined) return 'None';
  if (typeof value === 'boolean') return value ? 'True' : 'False';
  if (typeof value === 'number') return String(value);
  if (typeof value === 'string') {
    const quote = value.includes("'") && !value.includes('"') ? '"' : "'";
    let escaped = '';
    for (const c of value) {
      const code = c.charCodeAt(0);
      if (c === '\\' || c === quote) escaped += `\\${c}`;
      else if (c === '\n') escaped += '\\n';
      else if (c === '\r') escaped += '\\r';
      else if (c === '\t') escaped += '\\t';
      else if (code < 0x20 || code === 0x7f) escaped += `\\x${code.toString(16).padStart(2, '0')}`;
      else escaped += c;
    }
    return `${quote}${escaped}${quote}`;
  }
  if (Array.isArray(value)) return `[${value.map(pythonRepr).join(', ')}]`;
  if (typeof value === 'object') {
    return `{${Object.entries(value as Record<string, unknown>).map(([k, v]) => `${pythonRepr(k)}: ${pythonRepr(v)}`).join(', ')}}`;
  }
  return 'None';
}

/**
 * str(ValidationError) of ChatCompletionStreamResponse.model_validate_json() on the chat error event: `model` and
 * `choices` are missing; pydantic-core shows an input longer than 50 characters as its first 25 and last 24.
 */
export function chatErrorValidationMessage(info: ErrorInfo): string {
  const input = pythonRepr({ error: { message: info.message, type: info.type, param: info.param, code: info.code } });
  const shown = input.length > 50 ? `${input.slice(0, 25)}...${input.slice(-24)}` : input;
  const missing = (field: string): string =>
    `${field}\n  Field required [type=missing, input_value=${shown}, input_type=dict]\n    For further information visit https://errors.pydantic.dev/2.13/v/missing`;
  return `2 validation errors for ChatCompletionStreamResponse\n${missing('model')}\n${missing('choices')}`;
}

export function createMessagesWriter(answer: MessagesAnswer): EventWriter {
  const event = (name: string, rest: string): NamedEvent => ({ name, data: `{"type":"${name}"${rest}}` });
  const delta = (inner: string): NamedEvent => event('content_block_delta', `,"delta":{"type":"text_delta","text":"${inner}"},"index":0`);
  return {
    opening: () => [],
    first: () => [
      event(
        'message_start',
        `,"message":{"id":${JSON.stringify(answer.id)},"content":[],"model":${JSON.stringify(answer.model)},"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":${answer.promptTokens},"output_tokens":0}}`,
      ),
      event('content_block_start', ',"content_block":{"type":"text","text":""},"index":0'),
    ],
    output: (start, count) => delta(choiceTextJsonInner(0, start, count)),
    oversized: (bytes) => {
      const base = Buffer.byteLength(delta('').data);
      return delta('x'.repeat(Math.max(0, bytes - base)));
    },
    malformedName: 'content_block_delta',
    finish: ({ dropFinish, noTerminal }) => {
      const events: NamedEvent[] = [];
      if (!dropFinish) {
        const reason = stopReason(answer.finishReason);
        const usage = answer.usage ? `,"usage":{"input_tokens":${answer.promptTokens},"output_tokens":${answer.tokens}}` : '';
        events.push(
          event('content_block_stop', ',"index":0'),
          event('message_delta', `,"delta":{"stop_reason":${reason === null ? 'null' : `"${reason}"`}}${usage}`),
        );
      }
      if (!noTerminal) events.push(event('message_stop', ''));
      return events;
    },
    late: (start) => delta(choiceTextJsonInner(0, start, 1)),
    failure: (info) => [
      event('error', `,"error":{"type":"internal_error","message":${JSON.stringify(chatErrorValidationMessage(info))}}`),
    ],
  };
}
