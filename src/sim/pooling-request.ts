/**
 * Reading a request to one of vLLM's non-generation routes (embeddings, pooling, classify, score, rerank, tokenize,
 * detokenize) the way vLLM@52a31cce does: its pydantic models first, then its handlers' checks in their order, so
 * each mistake gets vLLM's status, body — and connection handling: an error its handler *raises* goes through
 * Starlette's ServerErrorMiddleware, which answers and then re-raises, and uvicorn closes the connection.
 *
 * The simulated model is a chimera that offers every route at once (a real vLLM model is an embedding model or a
 * classifier, and gets 404 on the other routes): an embedding model whose scores are bi-encoder cosines, with a
 * two-label classifier beside it.
 *
 * Longer than 400 lines on purpose: seven routes' pydantic models and handler checks, each in vLLM's order, sharing the field
 * readers above them; what a request costs is pooling-work.ts, its answer pooling-answer.ts.
 */
import { MAX_MODEL_LEN, messageText, type RequestSummary } from './request.js';
import { MAX_TOKEN_ID } from './tokens.js';
import { EMBED_DTYPES, ENDIANNESS, type EmbedDType, type Endianness } from './vectors.js';
import { errorBody, errorInfo, estimateTokens, modelNotFoundMessage } from './wire.js';

export type PoolingRoute = 'embeddings' | 'pooling' | 'classify' | 'score' | 'rerank' | 'tokenize' | 'detokenize';

const ROUTE_OF_PATH: ReadonlyMap<string, PoolingRoute> = new Map([
  ['/v1/embeddings', 'embeddings'],
  ['/pooling', 'pooling'],
  ['/classify', 'classify'],
  ['/score', 'score'],
  ['/v1/score', 'score'],
  ['/rerank', 'rerank'],
  ['/v1/rerank', 'rerank'],
  ['/v2/rerank', 'rerank'],
  ['/tokenize', 'tokenize'],
  ['/detokenize', 'detokenize'],
]);

export function poolingRouteOf(path: string): PoolingRoute | null {
  return ROUTE_OF_PATH.get(path) ?? null;
}

/** Whether the route runs the engine (tokenize and detokenize never do: a dead engine does not stop them). */
export function usesEngine(route: PoolingRoute): boolean {
  return route !== 'tokenize' && route !== 'detokenize';
}

/** The `architecture` vLLM names in the multimodal refusal. */
const ARCHITECTURE = 'SimModel';

export const ENCODING_FORMATS = ['float', 'base64', 'bytes', 'bytes_only'] as const;
export type EncodingFormat = (typeof ENCODING_FORMATS)[number];
const POOLING_TASKS = ['embed', 'classify', 'token_embed', 'token_classify', 'plugin', 'embed&token_classify'] as const;

/** One text or token-id sequence as the engine gets it: `key` fixes its vector, `tokens` is its length. */
export interface Prompt {
  readonly key: string;
  readonly tokens: number;
}

export interface Encoding {
  readonly format: EncodingFormat;
  readonly dtype: EmbedDType;
  readonly endianness: Endianness;
}

export interface ScorePair {
  readonly query: Prompt;
  readonly document: Prompt;
}

interface Common {
  /** The name answers carry: vLLM's `models.model_name()`, the first served name whatever was asked. */
  readonly model: string;
}

export type PoolingRequest = Common &
  (
    | { readonly route: 'embeddings'; readonly prompts: readonly Prompt[]; readonly encoding: Encoding; readonly dimensions: number | null; readonly normalize: boolean }
    | { readonly route: 'pooling'; readonly task: 'embed' | 'classify'; readonly prompts: readonly Prompt[]; readonly encoding: Encoding; readonly normalize: boolean }
    | { readonly route: 'classify'; readonly prompts: readonly Prompt[] }
    | { readonly route: 'score'; readonly queries: readonly Prompt[]; readonly documents: readonly Prompt[] }
    | { readonly route: 'rerank'; readonly query: Prompt; readonly documents: readonly Prompt[]; readonly texts: readonly string[]; readonly topN: number }
    | { readonly route: 'tokenize'; readonly text: string; readonly returnTokenStrs: boolean }
    | { readonly route: 'detokenize'; readonly ids: readonly number[] }
  );

/**
 * How vLLM refuses a request. `closes`: the error was raised by the handler (a ValueError, VLLMValidationError or
 * VLLMNotFoundError), so uvicorn closes the connection after the answer — without a `connection: close` header.
 */
export interface Refusal {
  readonly status: number;
  readonly body: string;
  readonly closes: boolean;
}

export type PoolingReadResult = { readonly ok: true; readonly request: PoolingRequest } | { readonly ok: false; readonly refusal: Refusal };

class Refused extends Error {
  constructor(readonly refusal: Refusal) {
    super(refusal.body);
  }
}

/** FastAPI's RequestValidationError handler: pydantic errors, JSON decode errors, a wrong content type. */
export function badRequestBody(message: string): string {
  return errorBody({ message, type: 'Bad Request', param: null, code: 400 });
}

function invalid(message: string): Refused {
  return new Refused({ status: 400, body: badRequestBody(message), closes: false });
}

function raised(message: string, param: string | null = null): Refused {
  return new Refused({ status: 400, body: errorBody(errorInfo(400, message, param)), closes: true });
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isInt(value: unknown): value is number {
  return typeof value === 'number' && Number.isInteger(value);
}

function optionalInt(body: Record<string, unknown>, key: string): number | null {
  const value = body[key];
  if (value === undefined || value === null) return null;
  if (!isInt(value)) throw invalid(`${key}: Input should be a valid integer`);
  return value;
}

/** An `int` field with a default (not Optional: null is refused). */
function intOr(body: Record<string, unknown>, key: string, fallback: number): number {
  const value = body[key];
  if (value === undefined) return fallback;
  if (!isInt(value)) throw invalid(`${key}: Input should be a valid integer`);
  return value;
}

function optionalBoolean(body: Record<string, unknown>, key: string): boolean | null {
  const value = body[key];
  if (value === undefined || value === null) return null;
  if (typeof value !== 'boolean') throw invalid(`${key}: Input should be a valid boolean`);
  return value;
}

function literal<T extends string>(body: Record<string, unknown>, key: string, values: readonly T[], fallback: T): T {
  const value = body[key];
  if (value === undefined) return fallback;
  if (typeof value !== 'string' || !(values as readonly string[]).includes(value)) {
    throw invalid(`${key}: Input should be ${values.map((v) => `'${v}'`).join(', ')}`);
  }
  return value as T;
}

/** The `model` field as sent (schema-checked), also into the record; null when absent. */
function readModel(body: Record<string, unknown>, summary: RequestSummary): string | null {
  const { model } = body;
  if (model === undefined || model === null) return null;
  if (typeof model !== 'string') throw invalid('model: Input should be a valid string');
  summary.model = model;
  return model;
}

/** vLLM's `_is_model_supported`: no name (or "") means the served model. */
function isServed(model: string | null, models: readonly string[]): boolean {
  return model === null || model === '' || models.includes(model);
}

/** The pooling handlers raise VLLMNotFoundError, which create_error_response maps with `param: null`. */
function checkPoolingModel(model: string | null, models: readonly string[]): void {
  if (!isServed(model, models)) {
    throw new Refused({ status: 404, body: errorBody(errorInfo(404, modelNotFoundMessage(model ?? ''))), closes: true });
  }
}

function textPrompt(text: string): Prompt {
  return { key: `t\u0000${text}`, tokens: estimateTokens(text.length) };
}

function idsPrompt(ids: readonly number[]): Prompt {
  return { key: `i\u0000${ids.join(',')}`, tokens: ids.length };
}

/** The text of a `messages` list, as the chat route counts it; null when it is not a non-empty list of objects. */
function messagesText(messages: unknown): string | null {
  if (!Array.isArray(messages) || messages.length === 0) return null;
  let text = '';
  for (const message of messages) {
    const part = messageText(message);
    if (part === null) return null;
    text += part;
  }
  return text;
}

/** `input` (str, str[], int[], int[][]) or `messages`; an empty list passes the schema and is refused later. */
function readInput(body: Record<string, unknown>): Prompt[] {
  const { input, messages } = body;
  if (input !== undefined) {
    if (typeof input === 'string') return [textPrompt(input)];
    if (Array.isArray(input)) {
      if (input.length === 0) return [];
      if (input.every(isInt)) return [idsPrompt(input)];
      if (input.every((item) => typeof item === 'string')) return input.map(textPrompt);
      if (input.every((item) => Array.isArray(item) && item.every(isInt))) return input.map(idsPrompt);
    }
    throw invalid('input: Input should be a valid string, a list of strings, a list of integers or a list of lists of integers');
  }
  if (messages !== undefined) {
    const text = messagesText(messages);
    if (text === null) throw invalid('messages: Input should be a non-empty list of message objects');
    return [{ key: `c\u0000${text}`, tokens: estimateTokens(text.length) }];
  }
  throw invalid('input: Field required');
}

function readEncoding(body: Record<string, unknown>): Encoding {
  return {
    format: literal(body, 'encoding_format', ENCODING_FORMATS, 'float'),
    dtype: literal(body, 'embed_dtype', EMBED_DTYPES, 'float32'),
    endianness: literal(body, 'endianness', ENDIANNESS, 'native'),
  };
}

/** `truncate_prompt_tokens`: ≥ −1 by the schema, ≤ max_model_len by `_validate_request`; −1 means max_model_len. */
function readTruncation(body: Record<string, unknown>): number | null {
  const value = optionalInt(body, 'truncate_prompt_tokens');
  if (value === null) return null;
  if (value < -1) throw invalid('truncate_prompt_tokens: Input should be greater than or equal to -1');
  return value;
}

function checkTruncation(truncate: number | null): void {
  if (truncate !== null && truncate > MAX_MODEL_LEN) {
    throw raised('truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size.');
  }
}

/** The renderer's truncation and length check, per prompt; a truncated prompt is another input (another vector). */
function tokenize(prompt: Prompt, truncate: number | null, limit = 0): Prompt {
  let tokens = prompt.tokens;
  if (limit > 0) tokens = Math.min(tokens, limit);
  if (truncate !== null) tokens = Math.min(tokens, truncate < 0 ? MAX_MODEL_LEN : truncate);
  if (tokens > MAX_MODEL_LEN) {
    throw raised(
      `This model's maximum context length is ${MAX_MODEL_LEN} tokens. However, you requested 0 output tokens and your prompt contains ${tokens} input tokens, for a total of ${tokens} tokens. Please reduce the length of the input prompt or the number of requested output tokens.`,
      'input_tokens',
    );
  }
  return tokens === prompt.tokens ? prompt : { key: `${prompt.key}\u0000${tokens}`, tokens };
}

/** The engine's input processor refuses a prompt of no tokens (only a truncation to 0 makes one here). */
function checkNotEmpty(prompts: readonly Prompt[]): void {
  if (prompts.some((p) => p.tokens === 0)) throw raised('The decoder prompt cannot be empty');
}

function renderPrompts(prompts: readonly Prompt[], truncate: number | null): Prompt[] {
  if (prompts.length === 0) throw raised('You must pass at least one prompt');
  return prompts.map((p) => tokenize(p, truncate));
}

// ---- per route ----

function readEmbeddings(body: Record<string, unknown>, models: readonly string[], summary: RequestSummary): PoolingRequest {
  const model = readModel(body, summary);
  const raw = readInput(body);
  const encoding = readEncoding(body);
  const dimensions = optionalInt(body, 'dimensions');
  const normalize = optionalBoolean(body, 'use_activation') ?? true;
  const truncate = readTruncation(body);
  checkTruncation(truncate);
  checkPoolingModel(model, models);
  const prompts = renderPrompts(raw, truncate);
  // PoolingParams.verify, for a Matryoshka model without a fixed list of dimensions.
  if (dimensions !== null && dimensions < 1) throw raised('Dimensions must be greater than 0');
  checkNotEmpty(prompts);
  return { route: 'embeddings', model: models[0] ?? '', prompts, encoding, dimensions, normalize };
}

function readPooling(body: Record<string, unknown>, models: readonly string[], summary: RequestSummary): PoolingRequest {
  const model = readModel(body, summary);
  const raw = readInput(body);
  const encoding = readEncoding(body);
  const dimensions = optionalInt(body, 'dimensions');
  const normalize = optionalBoolean(body, 'use_activation') ?? true;
  const truncate = readTruncation(body);
  const task = body.task === null ? 'embed' : literal(body, 'task', POOLING_TASKS, 'embed');
  // _verify_pooling_task runs before the request context, so before the model check.
  if (dimensions !== null) throw raised('dimensions is currently not supported');
  if (task !== 'embed' && task !== 'classify') {
    throw raised(task === 'plugin' ? 'No IOProcessor plugin installed.' : `Unsupported task: '${task}' Supported tasks: ('embed', 'classify')`);
  }
  checkTruncation(truncate);
  checkPoolingModel(model, models);
  const prompts = renderPrompts(raw, truncate);
  checkNotEmpty(prompts);
  return { route: 'pooling', model: models[0] ?? '', task, prompts, encoding, normalize };
}

function readClassify(body: Record<string, unknown>, models: readonly string[], summary: RequestSummary): PoolingRequest {
  const model = readModel(body, summary);
  const raw = readInput(body);
  optionalBoolean(body, 'use_activation');
  const truncate = readTruncation(body);
  checkTruncation(truncate);
  checkPoolingModel(model, models);
  const prompts = renderPrompts(raw, truncate);
  checkNotEmpty(prompts);
  return { route: 'classify', model: models[0] ?? '', prompts };
}

/** A ScoreInput (a string, or a `{"content": [...]}` multimodal object), or a list of them. */
function readScoreInputs(body: Record<string, unknown>, key: string, allowList = true): (string | Record<string, unknown>)[] {
  const value = body[key];
  const items = Array.isArray(value) && allowList ? (value as unknown[]) : [value];
  for (const item of items) {
    if (typeof item === 'string') continue;
    if (isRecord(item) && Array.isArray(item.content)) continue;
    throw invalid(`${key}: Input should be a valid string${allowList ? ' or a list of strings' : ''}`);
  }
  return items as (string | Record<string, unknown>)[];
}

/** The four request shapes ScoreRequest accepts, in the order the union lists them. */
const SCORE_FIELDS = [
  ['queries', 'documents'],
  ['queries', 'items'],
  ['data_1', 'data_2'],
  ['text_1', 'text_2'],
] as const;

/** The scoring handler's checks, shared by score and rerank: text only, lengths 1:1, 1:N or N:N. */
function scoreTexts(side1: readonly (string | Record<string, unknown>)[], side2: readonly (string | Record<string, unknown>)[]): [string[], string[]] {
  const texts = (side: readonly (string | Record<string, unknown>)[]): string[] =>
    side.map((item) => {
      if (typeof item !== 'string') throw raised(`MultiModalParam is not supported for ${ARCHITECTURE}`);
      return item;
    });
  const first = texts(side1);
  const second = texts(side2);
  if (first.length > 1 && first.length !== second.length) throw raised('Input lengths must be either 1:1, 1:N or N:N');
  if (first.length === 0) throw raised('At least one text element must be given');
  if (second.length === 0) throw raised('At least one text_pair element must be given');
  return [first, second];
}

function checkTokenLimit(value: number, key: string): void {
  if (value === 0) return;
  if (value < 0) throw raised(`${key} must be a non-negative integer`);
  if (value >= MAX_MODEL_LEN) throw raised(`${key} (${value}) must be less than max_model_len (${MAX_MODEL_LEN}).`);
}

function readScoring(
  body: Record<string, unknown>,
  models: readonly string[],
  summary: RequestSummary,
  sides: () => [(string | Record<string, unknown>)[], (string | Record<string, unknown>)[]],
): { model: string; queries: Prompt[]; documents: Prompt[]; texts: string[] } {
  const model = readModel(body, summary);
  const [side1, side2] = sides();
  optionalBoolean(body, 'use_activation');
  // 0 (no per-text truncation) by default, else 0 < limit < max_model_len (checked by the handler).
  const perQuery = intOr(body, 'max_tokens_per_query', 0);
  const perDoc = intOr(body, 'max_tokens_per_doc', 0);
  const truncate = readTruncation(body);
  checkTruncation(truncate);
  checkPoolingModel(model, models);
  const [first, second] = scoreTexts(side1, side2);
  checkTokenLimit(perQuery, 'max_tokens_per_query');
  checkTokenLimit(perDoc, 'max_tokens_per_doc');
  const queries = first.map((t) => tokenize(textPrompt(t), truncate, perQuery));
  const documents = second.map((t) => tokenize(textPrompt(t), truncate, perDoc));
  checkNotEmpty([...queries, ...documents]);
  return { model: models[0] ?? '', queries, documents, texts: second };
}

function readScore(body: Record<string, unknown>, models: readonly string[], summary: RequestSummary): PoolingRequest {
  const fields = SCORE_FIELDS.find(([a, b]) => body[a] !== undefined && body[b] !== undefined);
  const read = readScoring(body, models, summary, () => {
    if (fields === undefined) throw invalid('queries: Field required; documents: Field required');
    return [readScoreInputs(body, fields[0]), readScoreInputs(body, fields[1])];
  });
  return { route: 'score', model: read.model, queries: read.queries, documents: read.documents };
}

function readRerank(body: Record<string, unknown>, models: readonly string[], summary: RequestSummary): PoolingRequest {
  let topN = 0;
  const read = readScoring(body, models, summary, () => {
    if (body.query === undefined) throw invalid('query: Field required');
    if (body.documents === undefined) throw invalid('documents: Field required');
    topN = intOr(body, 'top_n', 0);
    return [readScoreInputs(body, 'query', false), readScoreInputs(body, 'documents')];
  });
  const query = read.queries[0] ?? textPrompt('');
  return { route: 'rerank', model: read.model, query, documents: read.documents, texts: read.texts, topN };
}

/** OpenAIServing._check_model returns an ErrorResponse (not raised): 404 with `param: "model"`, connection kept. */
function checkTokenizerModel(model: string | null, models: readonly string[]): void {
  if (!isServed(model, models)) {
    throw new Refused({ status: 404, body: errorBody(errorInfo(404, modelNotFoundMessage(model ?? ''), 'model')), closes: false });
  }
}

function readTokenize(body: Record<string, unknown>, models: readonly string[], summary: RequestSummary): PoolingRequest {
  const model = readModel(body, summary);
  let text: string;
  if (typeof body.prompt === 'string') text = body.prompt;
  else if (body.prompt === undefined && body.messages !== undefined) {
    const joined = messagesText(body.messages);
    if (joined === null) throw invalid('messages: Input should be a non-empty list of message objects');
    text = joined;
  } else if (body.prompt !== undefined) throw invalid('prompt: Input should be a valid string');
  else throw invalid('prompt: Field required');
  const returnTokenStrs = optionalBoolean(body, 'return_token_strs') ?? false;
  checkTokenizerModel(model, models);
  return { route: 'tokenize', model: models[0] ?? '', text, returnTokenStrs };
}

function readDetokenize(body: Record<string, unknown>, models: readonly string[], summary: RequestSummary): PoolingRequest {
  const model = readModel(body, summary);
  const { tokens } = body;
  if (tokens === undefined) throw invalid('tokens: Field required');
  if (!Array.isArray(tokens) || !tokens.every((t) => isInt(t) && t >= 0 && t <= 2 ** 63 - 1)) {
    throw invalid('tokens: Input should be a list of integers greater than or equal to 0');
  }
  checkTokenizerModel(model, models);
  // The fast tokenizer's u32 ids raise OverflowError, which the route re-raises as a RequestValidationError.
  if (tokens.some((t: number) => t > MAX_TOKEN_ID)) throw invalid('out of range integral type conversion attempted');
  return { route: 'detokenize', model: models[0] ?? '', ids: tokens as number[] };
}

const READERS: Readonly<Record<PoolingRoute, (body: Record<string, unknown>, models: readonly string[], summary: RequestSummary) => PoolingRequest>> = {
  embeddings: readEmbeddings,
  pooling: readPooling,
  classify: readClassify,
  score: readScore,
  rerank: readRerank,
  tokenize: readTokenize,
  detokenize: readDetokenize,
};

/** Validate a parsed JSON body; `summary` gets the model as soon as it is read, so a refusal still names it. */
export function readPoolingRequest(route: PoolingRoute, body: unknown, models: readonly string[], summary: RequestSummary): PoolingReadResult {
  try {
    if (!isRecord(body)) throw invalid('Input should be a valid dictionary or object to extract fields from');
    return { ok: true, request: READERS[route](body, models, summary) };
  } catch (error) {
    if (error instanceof Refused) return { ok: false, refusal: error.refusal };
    throw error;
  }
}
