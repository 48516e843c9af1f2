/**
 * vLLM's JSON shapes (docs/routes.md). Stream chunks are built by string
 * concatenation around a pre-serialised head, because a tick runs for every output event of every stream.
 */
import { STATUS_CODES } from 'node:http';
import type { Framing } from './faults.js';

export type GenerationRoute = 'chat_completions' | 'completions';

/** The "vocabulary": one word per token. Non-ASCII on purpose, so multi-byte UTF-8 crosses the wire. */
export const WORDS: readonly string[] = Object.freeze([
  'Hello', ' world', ',', ' héllo', ' 日本', ' 🙂', ' the', ' quick', ' brown', ' fox',
  ' naïve', ' café', '.', ' jumps', ' über', ' 数据', ' stream', '!',
]);

/** Each word as the inside of a JSON string literal, so joining tokens never re-escapes. */
const WORDS_JSON_INNER: readonly string[] = WORDS.map((w) => JSON.stringify(w).slice(1, -1));

/** The text of token `tokenIndex` of choice `index`; choices start at different words. */
export function tokenText(index: number, tokenIndex: number): string {
  return WORDS[(tokenIndex + index * 3) % WORDS.length] ?? '';
}

/** The text of `count` tokens of choice `index` from `start`. */
export function choiceText(index: number, start: number, count: number): string {
  let text = '';
  for (let t = start; t < start + count; t++) text += tokenText(index, t);
  return text;
}

/** Like choiceText, already escaped as the inside of a JSON string. */
export function choiceTextJsonInner(index: number, start: number, count: number): string {
  let inner = '';
  for (let t = start; t < start + count; t++) inner += WORDS_JSON_INNER[(t + index * 3) % WORDS.length] ?? '';
  return inner;
}

/** Prompt tokens from text: ceil(chars / 4), at least 1. Deterministic, not a tokenizer. */
export function estimateTokens(chars: number): number {
  return Math.max(1, Math.ceil(chars / 4));
}

export interface Usage {
  readonly promptTokens: number;
  readonly completionTokens: number;
  /** null: no prompt_tokens_details at all (absent is not zero). */
  readonly cachedTokens: number | null;
}

export function usageJson(usage: Usage): string {
  const { promptTokens, completionTokens, cachedTokens } = usage;
  const details = cachedTokens === null ? '' : `,"prompt_tokens_details":{"cached_tokens":${cachedTokens}}`;
  return `{"prompt_tokens":${promptTokens},"total_tokens":${promptTokens + completionTokens},"completion_tokens":${completionTokens}${details}}`;
}

/** Builds the data of each stream event of one response. `textInner` is JSON-escaped, without quotes. */
export interface ChunkSerializer {
  /** Chat's role chunk; null for legacy completions, which have none. */
  role(index: number): string | null;
  /** A content chunk; with `finishReason` it is the choice's finish chunk (the only one with stop_reason). */
  output(index: number, textInner: string, finishReason: string | null): string;
  usage(usage: Usage): string;
}

export interface ResponseIdentity {
  readonly id: string;
  readonly created: number;
  readonly model: string;
}

export function createChunkSerializer(route: GenerationRoute, identity: ResponseIdentity): ChunkSerializer {
  const object = route === 'chat_completions' ? 'chat.completion.chunk' : 'text_completion';
  const head = `{"id":${JSON.stringify(identity.id)},"object":"${object}","created":${identity.created},"model":${JSON.stringify(identity.model)},"choices":[`;
  if (route === 'chat_completions') {
    return {
      role: (index) =>
        `${head}{"index":${index},"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
      output: (index, textInner, finishReason) =>
        finishReason === null
          ? `${head}{"index":${index},"delta":{"content":"${textInner}"},"logprobs":null,"finish_reason":null}]}`
          : `${head}{"index":${index},"delta":{"content":"${textInner}"},"logprobs":null,"finish_reason":${JSON.stringify(finishReason)},"stop_reason":null}]}`,
      usage: (usage) => `${head}],"usage":${usageJson(usage)}}`,
    };
  }
  return {
    role: () => null,
    output: (index, textInner, finishReason) =>
      `${head}{"index":${index},"text":"${textInner}","logprobs":null,"finish_reason":${finishReason === null ? 'null' : JSON.stringify(finishReason)},"stop_reason":null}]}`,
    usage: (usage) => `${head}],"usage":${usageJson(usage)}}`,
  };
}

/** A whole non-streaming body: `chat.completion` or `text_completion`, usage included unless null. */
export function completionBody(
  route: GenerationRoute,
  identity: ResponseIdentity,
  choices: readonly { readonly text: string; readonly finishReason: string }[],
  usage: Usage | null,
): string {
  const usageValue = usage === null ? null : (JSON.parse(usageJson(usage)) as unknown);
  if (route === 'chat_completions') {
    return JSON.stringify({
      id: identity.id,
      object: 'chat.completion',
      created: identity.created,
      model: identity.model,
      choices: choices.map((c, index) => ({
        index,
        message: { role: 'assistant', content: c.text, refusal: null, annotations: null, audio: null, function_call: null, tool_calls: [], reasoning: null },
        logprobs: null,
        finish_reason: c.finishReason,
        stop_reason: null,
      })),
      service_tier: null,
      system_fingerprint: null,
      usage: usageValue,
      prompt_logprobs: null,
      kv_transfer_params: null,
    });
  }
  return JSON.stringify({
    id: identity.id,
    object: 'text_completion',
    created: identity.created,
    model: identity.model,
    choices: choices.map((c, index) => ({
      index,
      text: c.text,
      logprobs: null,
      finish_reason: c.finishReason,
      stop_reason: null,
      prompt_logprobs: null,
    })),
    service_tier: null,
    system_fingerprint: null,
    usage: usageValue,
    kv_transfer_params: null,
  });
}

/** GET /v1/models: vLLM's list shape; every served name is its own root here. */
export function modelListBody(models: readonly string[], maxModelLen: number, created: number): string {
  return JSON.stringify({
    object: 'list',
    data: models.map((id, i) => ({
      id,
      object: 'model',
      created,
      owned_by: 'vllm',
      root: id,
      parent: null,
      max_model_len: maxModelLen,
      permission: [
        {
          id: `modelperm-${created.toString(16)}${i.toString(16).padStart(4, '0')}`,
          object: 'model_permission',
          created,
          allow_create_engine: false,
          allow_sampling: true,
          allow_logprobs: true,
          allow_search_indices: false,
          allow_view: true,
          allow_fine_tuning: false,
          organization: '*',
          group: null,
          is_blocking: false,
        },
      ],
    })),
  });
}

// ---- errors ----

const ERROR_TYPES: Readonly<Record<number, string>> = {
  400: 'BadRequestError',
  403: 'PermissionDeniedError',
  404: 'NotFoundError',
  408: 'RequestTimeoutError',
  409: 'ConflictError',
  413: 'RequestEntityTooLargeError',
  422: 'UnprocessableEntityError',
  429: 'RateLimitError',
  500: 'InternalServerError',
  501: 'NotImplementedError',
  502: 'BadGatewayError',
  503: 'ServiceUnavailableError',
  504: 'GatewayTimeoutError',
};

/** vLLM's `type` for a status; a bounded fallback per class, never derived from the message. */
export function errorType(code: number): string {
  return ERROR_TYPES[code] ?? (code >= 500 ? 'InternalServerError' : 'BadRequestError');
}

/** The message the simulator uses for a code when nothing more specific applies. */
export function errorMessage(code: number): string {
  if (code === 500) return 'Internal server error';
  return STATUS_CODES[code] ?? `Error ${code}`;
}

export interface ErrorInfo {
  readonly message: string;
  readonly type: string;
  readonly param: string | null;
  readonly code: number;
}

export function errorInfo(code: number, message = errorMessage(code), param: string | null = null): ErrorInfo {
  return { message, type: errorType(code), param, code };
}

/** Before streaming: FastAPI's compact JSON, raw UTF-8. */
export function errorBody(info: ErrorInfo): string {
  return JSON.stringify({ error: { message: info.message, type: info.type, param: info.param, code: info.code } });
}

/** 401 with --api-key, and 503 while scaling: the error is a string, not an object. */
export function stringErrorBody(message: string): string {
  return JSON.stringify({ error: message });
}

export const UNAUTHORIZED_BODY = stringErrorBody('Unauthorized');
/** str(EngineDeadError): what a dead engine's 500 says, on every route. */
export const ENGINE_DEAD_MESSAGE = 'EngineCore encountered an issue. See stack trace (above) for the root cause.';
export const NOT_FOUND_BODY = '{"detail":"Not Found"}';
export const METHOD_NOT_ALLOWED_BODY = '{"detail":"Method Not Allowed"}';

/** The body vLLM sends for `status` before any streaming. */
export function statusBody(status: number, model: string): string {
  if (status === 401) return UNAUTHORIZED_BODY;
  if (status === 503) return stringErrorBody('Service Unavailable');
  if (status === 404) return errorBody(errorInfo(404, modelNotFoundMessage(model), 'model'));
  return errorBody(errorInfo(status));
}

export function modelNotFoundMessage(model: string): string {
  return `The model \`${model}\` does not exist.`;
}

/** The error event's data after the 200: Python json.dumps output, unlike every other event. */
export function errorEventData(info: ErrorInfo): string {
  return pythonJsonDumps({ error: { message: info.message, type: info.type, param: info.param, code: info.code } });
}

/** Python `json.dumps` with its defaults: `", "` and `": "` separators, ensure_ascii `\uXXXX` escapes. */
export function pythonJsonDumps(value: unknown): string {
  if (value === null || value === undefined) return 'null';
  if (typeof value === 'boolean') return value ? 'true' : 'false';
  if (typeof value === 'number') return Number.isFinite(value) ? String(value) : 'NaN';
  if (typeof value === 'string') {
    // JSON.stringify already escapes controls and lone surrogates; Python also escapes DEL and non-ASCII
    // (per UTF-16 unit, so astral characters become surrogate pairs, as Python does).
    return JSON.stringify(value).replace(/[^\x20-\x7e]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
  }
  if (Array.isArray(value)) return `[${value.map(pythonJsonDumps).join(', ')}]`;
  if (typeof value === 'object') {
    const entries = Object.entries(value as Record<string, unknown>);
    return `{${entries.map(([k, v]) => `${pythonJsonDumps(k)}: ${pythonJsonDumps(v)}`).join(', ')}}`;
  }
  return 'null';
}

// ---- framing ----

const EOL: Readonly<Record<Framing, string>> = { lf: '\n', crlf: '\r\n', cr: '\r' };

export interface FramingStyle {
  readonly framing: Framing;
  /** `: ping` comment lines between events. */
  readonly comments: boolean;
  /** Split JSON data over two `data:` lines right after its opening `{`, so the joined data stays valid JSON. */
  readonly multilineData: boolean;
}

/** Turns event data into event-stream bytes. `first` suppresses the leading comment. */
export function createEventFramer(style: FramingStyle): (data: string, isJson: boolean, first: boolean) => string {
  const eol = EOL[style.framing];
  if (!style.comments && !style.multilineData) return (data) => `data: ${data}${eol}${eol}`;
  const ping = `: ping${eol}`;
  return (data, isJson, first) => {
    const comment = style.comments && !first ? ping : '';
    if (style.multilineData && isJson && data.startsWith('{')) {
      return `${comment}data: {${eol}data: ${data.slice(1)}${eol}${eol}`;
    }
    return `${comment}data: ${data}${eol}${eol}`;
  };
}

/**
 * Named events (`event: <name>` then `data: <JSON>`), as /v1/responses and /v1/messages write them; the same framing
 * modifiers as createEventFramer. `first` suppresses the leading comment.
 */
export function createNamedEventFramer(style: FramingStyle): (name: string, data: string, isJson: boolean, first: boolean) => string {
  const eol = EOL[style.framing];
  if (!style.comments && !style.multilineData) return (name, data) => `event: ${name}${eol}data: ${data}${eol}${eol}`;
  const ping = `: ping${eol}`;
  return (name, data, isJson, first) => {
    const comment = style.comments && !first ? ping : '';
    if (style.multilineData && isJson && data.startsWith('{')) {
      return `${comment}event: ${name}${eol}data: {${eol}data: ${data.slice(1)}${eol}${eol}`;
    }
    return `${comment}event: ${name}${eol}data: ${data}${eol}${eol}`;
  };
}

/** Not JSON: what `malformed_after` sends. */
export const MALFORMED_DATA = '{"id":"broken';
export const DONE_DATA = '[DONE]';
