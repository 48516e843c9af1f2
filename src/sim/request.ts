/**
 * Reading a generation request the way vLLM's pydantic models do, only as far as the simulator needs:
 * the fields that shape the answer are checked, everything else is accepted and ignored.
 */
import { errorBody, errorInfo, estimateTokens, modelNotFoundMessage, type GenerationRoute } from './wire.js';

/** The context length /v1/models reports; longer prompts get vLLM's 400 (param "input_tokens"). */
export const MAX_MODEL_LEN = 131_072;
const MAX_N = 128;

export interface GenerationRequest {
  readonly route: GenerationRoute;
  readonly model: string;
  readonly stream: boolean;
  readonly n: number;
  readonly includeUsage: boolean | null;
  /** max_completion_tokens ?? max_tokens (chat); max_tokens (completions); null when unset. */
  readonly maxTokens: number | null;
  readonly promptTokens: number;
  /** Number of prompts: 1 for chat, the list length for legacy completions. */
  readonly prompts: number;
  /**
   * What the engine model tokenizes, one per prompt: the rendered chat prompt (the simulator's template is the
   * messages' texts in order, so promptTokens = ceil(chars / 4) of it), a legacy prompt's text, or its token ids.
   */
  readonly promptInputs: ReadonlyArray<string | readonly number[]>;
  /** vLLM's `cache_salt`: folded into the first prefix-cache block's hash, so only requests with the same salt share. */
  readonly cacheSalt: string | null;
}

/** What the stats record keeps about a request, known as far as parsing got. */
export interface RequestSummary {
  model: string | null;
  stream: boolean;
  n: number;
  includeUsage: boolean | null;
}

export type ReadResult =
  | { readonly ok: true; readonly request: GenerationRequest }
  | { readonly ok: false; readonly status: number; readonly body: string };

class RequestError extends Error {
  constructor(
    readonly status: number,
    readonly body: string,
  ) {
    super(body);
  }
}

function invalid(message: string, param: string | null = null): RequestError {
  return new RequestError(400, errorBody(errorInfo(400, message, param)));
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function optionalBoolean(body: Record<string, unknown>, key: string): boolean | null {
  const value = body[key];
  if (value === undefined || value === null) return null;
  if (typeof value !== 'boolean') throw invalid(`${key}: Input should be a valid boolean`, key);
  return value;
}

function optionalInt(body: Record<string, unknown>, key: string, min: number, max = Number.MAX_SAFE_INTEGER): number | null {
  const value = body[key];
  if (value === undefined || value === null) return null;
  if (typeof value !== 'number' || !Number.isInteger(value)) throw invalid(`${key}: Input should be a valid integer`, key);
  if (value < min || value > max) throw invalid(`${key} must be between ${min} and ${max}, got ${value}.`, key);
  return value;
}

/**
 * The text a chat message contributes to the prompt count: its string content, or the `text` of its parts joined;
 * "" for anything else. Null when the message is not an object. The simulator's tokenizer tokenizes the same text.
 */
export function messageText(message: unknown): string | null {
  if (!isRecord(message)) return null;
  const { content } = message;
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    let text = '';
    for (const part of content) if (isRecord(part) && typeof part.text === 'string') text += part.text;
    return text;
  }
  return '';
}

/** The rendered chat prompt (the messages' texts in order, the simulator's chat template) and its token count. */
function chatPrompt(body: Record<string, unknown>): { text: string; promptTokens: number } {
  const { messages } = body;
  if (messages === undefined) throw invalid('messages: Field required', 'messages');
  if (!Array.isArray(messages) || messages.length === 0) throw invalid('messages: Input should be a non-empty list', 'messages');
  let text = '';
  for (const message of messages) {
    const part = messageText(message);
    if (part === null) throw invalid('messages: each message should be an object', 'messages');
    text += part;
  }
  return { text, promptTokens: estimateTokens(text.length) };
}

function isTokenIds(value: unknown): value is number[] {
  return Array.isArray(value) && value.length > 0 && value.every((t) => Number.isInteger(t));
}

/** Legacy prompt: a string, a list of strings, a list of token ids, or a list of such lists. */
function completionPrompts(body: Record<string, unknown>): { prompts: number; promptTokens: number; promptInputs: ReadonlyArray<string | readonly number[]> } {
  const { prompt } = body;
  if (prompt === undefined) throw invalid('prompt: Field required', 'prompt');
  if (typeof prompt === 'string') return { prompts: 1, promptTokens: estimateTokens(prompt.length), promptInputs: [prompt] };
  if (isTokenIds(prompt)) return { prompts: 1, promptTokens: prompt.length, promptInputs: [prompt] };
  if (Array.isArray(prompt) && prompt.length > 0) {
    if (prompt.every((p) => typeof p === 'string')) {
      return { prompts: prompt.length, promptTokens: prompt.reduce((sum, p) => sum + estimateTokens(p.length), 0), promptInputs: prompt };
    }
    if (prompt.every(isTokenIds)) {
      return { prompts: prompt.length, promptTokens: prompt.reduce((sum, p) => sum + p.length, 0), promptInputs: prompt };
    }
  }
  throw invalid('prompt: Input should be a string, a list of strings, or a list of token ids', 'prompt');
}

/**
 * Validate a parsed JSON body. `summary` is filled in as fields are read, so a rejected request still
 * leaves a useful record.
 */
export function readGenerationRequest(
  route: GenerationRoute,
  body: unknown,
  models: readonly string[],
  summary: RequestSummary,
): ReadResult {
  try {
    return { ok: true, request: read(route, body, models, summary) };
  } catch (error) {
    if (error instanceof RequestError) return { ok: false, status: error.status, body: error.body };
    throw error;
  }
}

function read(route: GenerationRoute, body: unknown, models: readonly string[], summary: RequestSummary): GenerationRequest {
  if (!isRecord(body)) throw invalid('Input should be a valid dictionary or object to extract fields from');

  if (typeof body.model === 'string') summary.model = body.model;
  const stream = optionalBoolean(body, 'stream') ?? false;
  summary.stream = stream;
  const n = optionalInt(body, 'n', 1, MAX_N) ?? 1;
  summary.n = n;

  const streamOptions = body.stream_options;
  let includeUsage: boolean | null = null;
  if (streamOptions !== undefined && streamOptions !== null) {
    if (!isRecord(streamOptions)) throw invalid('stream_options: Input should be an object', 'stream_options');
    includeUsage = optionalBoolean(streamOptions, 'include_usage');
    summary.includeUsage = includeUsage;
    if (!stream) throw invalid('Stream options can only be defined when `stream=True`.', 'stream_options');
  }

  const maxTokens = optionalInt(body, 'max_tokens', 1);
  const maxCompletionTokens = route === 'chat_completions' ? optionalInt(body, 'max_completion_tokens', 1) : null;

  const { prompts, promptTokens, promptInputs } =
    route === 'chat_completions'
      ? (({ text, promptTokens: tokens }) => ({ prompts: 1, promptTokens: tokens, promptInputs: [text] }))(chatPrompt(body))
      : completionPrompts(body);
  const salt = body.cache_salt;
  if (salt !== undefined && salt !== null && (typeof salt !== 'string' || salt === '')) {
    throw invalid('cache_salt: Input should be a non-empty string', 'cache_salt');
  }
  if (promptTokens >= MAX_MODEL_LEN) {
    throw invalid(
      `This model's maximum context length is ${MAX_MODEL_LEN} tokens. However, your request has ${promptTokens} input tokens. Please reduce the length of the input messages.`,
      'input_tokens',
    );
  }

  // vLLM's `model` is optional and defaults to the first served name.
  let model = models[0] ?? '';
  if (body.model !== undefined && body.model !== null) {
    if (typeof body.model !== 'string') throw invalid('model: Input should be a valid string', 'model');
    if (!models.includes(body.model)) {
      throw new RequestError(404, errorBody(errorInfo(404, modelNotFoundMessage(body.model), 'model')));
    }
    model = body.model;
  }

  const cap = maxCompletionTokens ?? maxTokens;
  return { route, model, stream, n, includeUsage, maxTokens: cap, promptTokens, prompts, promptInputs, cacheSalt: typeof salt === 'string' ? salt : null };
}
