/**
 * `POST /v1/responses` as vLLM@52a31cce serves it on its simple (non-Harmony) path, without a tool or reasoning
 * parser: reading the request (its pydantic model, then the handler's checks in their order) and writing the answer —
 * the response object (`ResponsesResponse`, every key, nulls included, in declaration order) and the stream's events
 * (`event: <type>` + compact JSON with gapless `sequence_number`s). Sources: `vllm/entrypoints/openai/responses/
 * {api_router,serving,protocol,streaming_events,context}.py`; docs/routes.md. The answer is responses-answer.ts.
 */
import { randomBytes } from 'node:crypto';
import { MAX_MODEL_LEN, messageText, type RequestSummary } from './request.js';
import { pythonFloat } from './vectors.js';
import {
  ENGINE_DEAD_MESSAGE,
  errorBody,
  errorInfo,
  estimateTokens,
  modelNotFoundMessage,
} from './wire.js';

/** vLLM's random_uuid(): 16 hex. */
export function randomId(): string {
  return randomBytes(8).toString('hex');
}

export interface ResponsesRequest {
  readonly route: 'responses';
  /** The name answers carry: vLLM's `models.model_name()`, the first served name whatever was asked. */
  readonly model: string;
  readonly stream: boolean;
  /** `max_output_tokens` as sent; null when unset. */
  readonly maxOutputTokens: number | null;
  readonly promptTokens: number;
  /** The body's `request_id`, which vLLM uses as the response id; null when absent. */
  readonly requestId: string | null;
  /** `background` as sent (only ever true with the store on). */
  readonly background: boolean;
  /** Whether the response is kept: `store` (default true), silently false without the store. */
  readonly store: boolean;
  /** `previous_response_id` as sent (only ever set with the store on, when the id is stored). */
  readonly previousResponseId: string | null;
  /** The characters the prompt counts (input, instructions, and a previous response's context). */
  readonly promptChars: number;
  /** The request fields the response object echoes, already serialised, keyed by response field. */
  readonly echo: ResponseEcho;
}

interface ResponseEcho {
  readonly instructions: string;
  readonly metadata: string;
  readonly parallelToolCalls: string;
  readonly temperature: string;
  readonly toolChoice: string;
  readonly tools: string;
  readonly topP: string;
  readonly maxToolCalls: string;
  readonly reasoning: string;
  readonly serviceTier: string;
  readonly text: string;
  readonly topLogprobs: string;
  readonly truncation: string;
  readonly user: string;
  readonly presencePenalty: string;
  readonly frequencyPenalty: string;
}

/** How vLLM refuses a request; `closes`: the handler raised it (uvicorn closes the connection after the answer). */
export interface EventRouteRefusal {
  readonly status: number;
  readonly body: string;
  readonly closes: boolean;
}

export type ResponsesReadResult = { readonly ok: true; readonly request: ResponsesRequest } | { readonly ok: false; readonly refusal: EventRouteRefusal };

class Refused extends Error {
  constructor(readonly refusal: EventRouteRefusal) {
    super(refusal.body);
  }
}

/** FastAPI's RequestValidationError handler (vLLM's): 400, type "Bad Request", the VLLMValidationError's param. */
function invalid(message: string, param: string | null = null): Refused {
  return new Refused({ status: 400, body: errorBody({ message, type: 'Bad Request', param, code: 400 }), closes: false });
}

/** An ErrorResponse the handler returns (not raises): `type` as the handler names it. */
function returned(status: number, type: string, message: string, param: string | null): Refused {
  return new Refused({ status, body: errorBody({ message, type, param, code: status }), closes: false });
}

/** An exception the handler raises: create_error_response's mapping, then uvicorn closes the connection. */
function raised(status: number, message: string, param: string | null = null): Refused {
  return new Refused({ status, body: errorBody(errorInfo(status, message, param)), closes: true });
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

export function json(value: unknown): string {
  return value === undefined ? 'null' : JSON.stringify(value);
}

function optional<T>(body: Record<string, unknown>, key: string, check: (v: unknown) => v is T, expected: string): T | null {
  const value = body[key];
  if (value === undefined || value === null) return null;
  if (!check(value)) throw invalid(`${key}: Input should be ${expected}`);
  return value;
}

const isString = (v: unknown): v is string => typeof v === 'string';
const isBoolean = (v: unknown): v is boolean => typeof v === 'boolean';
const isInt = (v: unknown): v is number => typeof v === 'number' && Number.isInteger(v);
const isNumber = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);
const isList = (v: unknown): v is unknown[] => Array.isArray(v);

/** The characters of `input` the prompt counts: the string, or each item's text (message content or tool output). */
function inputChars(input: unknown): number {
  if (typeof input === 'string') return input.length;
  if (!Array.isArray(input)) throw invalid('input: Input should be a valid string or a valid list');
  let chars = 0;
  for (const item of input) {
    if (typeof item === 'string') {
      chars += item.length;
      continue;
    }
    if (!isRecord(item)) throw invalid('input: each item should be an object');
    const text = messageText(item) ?? '';
    chars += text.length;
    if (typeof item.output === 'string') chars += item.output.length;
    if (typeof item.arguments === 'string') chars += item.arguments.length;
  }
  return chars;
}

/** `text` echoed as ResponseTextConfig dumps it: `{"format":…,"verbosity":…}`, each format with its own keys. */
function textConfig(text: unknown): string {
  if (text === undefined || text === null) return 'null';
  if (!isRecord(text)) throw invalid('text: Input should be a valid dictionary');
  const format = text.format;
  let formatJson = 'null';
  if (format !== undefined && format !== null) {
    if (!isRecord(format)) throw invalid('text.format: Input should be a valid dictionary');
    if (format.type === 'text' || format.type === 'json_object') formatJson = `{"type":"${format.type}"}`;
    else if (format.type === 'json_schema') {
      if (typeof format.name !== 'string') throw invalid('text.format.json_schema.name: Field required');
      if (!isRecord(format.schema)) throw invalid('text.format.json_schema.schema: Field required');
      formatJson = `{"name":${json(format.name)},"schema":${json(format.schema)},"type":"json_schema","description":${json(format.description ?? null)},"strict":${json(format.strict ?? null)}}`;
    } else throw invalid("text.format: Input tag does not match any of the expected tags: 'text', 'json_schema', 'json_object'");
  }
  return `{"format":${formatJson},"verbosity":${json(text.verbosity ?? null)}}`;
}

/** `tools` echoed: function tools as openai's FunctionTool dumps them (every key, in order), other tools as sent. */
function toolsJson(tools: readonly unknown[]): string {
  const items = tools.map((tool) => {
    if (!isRecord(tool)) throw invalid('tools: each tool should be an object');
    if (tool.type !== 'function') return json(tool);
    if (typeof tool.name !== 'string') throw invalid('tools.function.name: Field required');
    return `{"name":${json(tool.name)},"parameters":${json(tool.parameters ?? null)},"strict":${json(tool.strict ?? null)},"type":"function","allowed_callers":${json(tool.allowed_callers ?? null)},"defer_loading":${json(tool.defer_loading ?? null)},"description":${json(tool.description ?? null)},"output_schema":${json(tool.output_schema ?? null)}}`;
  });
  return `[${items.join(',')}]`;
}

/** The request's model validators (check_tool_usage): the tool_choice the response echoes, or a 400. */
function toolChoice(body: Record<string, unknown>, hasTools: boolean): string {
  const choice = body.tool_choice ?? 'auto';
  const named = isRecord(choice) && choice.type === 'function';
  if (!hasTools) {
    if (choice === 'auto' || choice === 'none') return '"none"';
    if (choice === 'required') throw invalid("Value error, Tool choice 'required' must be specified with 'tools' parameter.", 'tool_choice');
    if (named) throw invalid("Value error, Tool choice 'function' not found in 'tools' parameter.", 'tool_choice');
  }
  return json(choice);
}

/**
 * The response store as the request reader sees it (VLLM_ENABLE_RESPONSES_API_STORE=1): the characters a stored
 * response adds to the prompt of a request that continues it (`previous_response_id`), undefined when not stored.
 */
export interface StoreLookup {
  contextChars(id: string): number | undefined;
}

/**
 * Validate a parsed body as vLLM does, in its order. `summary` is filled in as fields are read, so a refused request
 * still leaves a useful record. `engineDead`: the handler raises the engine's error after the model checks. `store`:
 * null without VLLM_ENABLE_RESPONSES_API_STORE (`store` silently false, `background` refused, every
 * `previous_response_id` unknown).
 */
export function readResponsesRequest(
  body: unknown,
  models: readonly string[],
  summary: RequestSummary,
  engineDead: boolean,
  store: StoreLookup | null = null,
): ResponsesReadResult {
  try {
    return { ok: true, request: read(body, models, summary, engineDead, store) };
  } catch (error) {
    if (error instanceof Refused) return { ok: false, refusal: error.refusal };
    throw error;
  }
}

function read(body: unknown, models: readonly string[], summary: RequestSummary, engineDead: boolean, store: StoreLookup | null): ResponsesRequest {
  if (!isRecord(body)) throw invalid('Input should be a valid dictionary or object to extract fields from');
  if (typeof body.model === 'string') summary.model = body.model;
  const stream = optional(body, 'stream', isBoolean, 'a valid boolean') ?? false;
  summary.stream = stream;

  // ResponsesRequest's fields and model validators (pydantic, before the handler).
  if (body.input === undefined) throw invalid('input: Field required');
  const chars = inputChars(body.input);
  const model = optional(body, 'model', isString, 'a valid string');
  const instructions = optional(body, 'instructions', isString, 'a valid string');
  const maxOutputTokens = optional(body, 'max_output_tokens', isInt, 'a valid integer');
  const maxToolCalls = optional(body, 'max_tool_calls', isInt, 'a valid integer');
  const temperature = optional(body, 'temperature', isNumber, 'a valid number');
  const topP = optional(body, 'top_p', isNumber, 'a valid number');
  const presencePenalty = optional(body, 'presence_penalty', isNumber, 'a valid number');
  const frequencyPenalty = optional(body, 'frequency_penalty', isNumber, 'a valid number');
  for (const [key, value] of [['presence_penalty', presencePenalty], ['frequency_penalty', frequencyPenalty]] as const) {
    if (value !== null && (value < -2 || value > 2)) throw invalid(`${key}: Input should be greater than or equal to -2 and less than or equal to 2`);
  }
  const background = optional(body, 'background', isBoolean, 'a valid boolean') ?? false;
  const storeField = optional(body, 'store', isBoolean, 'a valid boolean') ?? true;
  const tools = optional(body, 'tools', isList, 'a valid list') ?? [];
  const metadata = optional(body, 'metadata', isRecord, 'a valid dictionary');
  const include = optional(body, 'include', isList, 'a valid list');
  const requestId = optional(body, 'request_id', isString, 'a valid string');
  const previousResponseId = optional(body, 'previous_response_id', isString, 'a valid string');
  const previousInputMessages = optional(body, 'previous_input_messages', isList, 'a valid list');
  if (background && !storeField) throw invalid('Value error, background can only be used when `store` is true', 'background');
  if (body.prompt !== undefined && body.prompt !== null) throw invalid('Value error, prompt template is not supported', 'prompt');
  const choice = toolChoice(body, tools.length > 0);
  const echoText = textConfig(body.text);
  const echoTools = toolsJson(tools);

  // The handler: the model, its own checks, a dead engine, the stored response, the prompt's length.
  if (model !== null && model !== '' && !models.includes(model)) {
    throw returned(404, 'NotFoundError', modelNotFoundMessage(model), 'model');
  }
  if (background && store === null) {
    throw returned(
      400,
      'invalid_request_error',
      'This vLLM engine does not support `store=True` and therefore does not support the background mode. To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.',
      'background',
    );
  }
  if (previousInputMessages !== null && previousInputMessages.length > 0 && previousResponseId !== null) {
    throw returned(400, 'invalid_request_error', 'Only one of `previous_input_messages` and `previous_response_id` can be set.', 'previous_response_id');
  }
  if (engineDead) throw raised(500, ENGINE_DEAD_MESSAGE);
  // Without VLLM_ENABLE_RESPONSES_API_STORE nothing is ever stored; with it, the stored response's input and output
  // are put before this request's input.
  const previousChars = previousResponseId === null ? 0 : store?.contextChars(previousResponseId);
  if (previousChars === undefined) {
    throw returned(404, 'invalid_request_error', `Response with id '${previousResponseId ?? ''}' not found.`, 'response_id');
  }
  const promptChars = chars + (instructions?.length ?? 0) + previousChars;
  const promptTokens = estimateTokens(promptChars);
  const requested = maxOutputTokens ?? 0;
  if (promptTokens > MAX_MODEL_LEN - requested) {
    // The renderer's check (prompt + requested output), raised.
    throw raised(
      400,
      `This model's maximum context length is ${MAX_MODEL_LEN} tokens. However, you requested ${requested} output tokens and your prompt contains ${promptTokens} input tokens, for a total of ${promptTokens + requested} tokens. Please reduce the length of the input prompt or the number of requested output tokens.`,
      'input_tokens',
    );
  }
  if (promptTokens >= MAX_MODEL_LEN) {
    throw returned(400, 'invalid_request_error', `The engine prompt length ${promptTokens} exceeds the max_model_len ${MAX_MODEL_LEN}. Please reduce prompt.`, 'input');
  }
  if (maxOutputTokens !== null && maxOutputTokens < 1) throw raised(400, `max_tokens must be at least 1, got ${maxOutputTokens}.`);

  const withLogprobs = include !== null && include.includes('message.output_text.logprobs');
  const topLogprobs = optional(body, 'top_logprobs', isInt, 'a valid integer') ?? 0;
  return {
    route: 'responses',
    model: models[0] ?? '',
    stream,
    maxOutputTokens,
    promptTokens,
    requestId,
    background,
    store: store !== null && storeField,
    previousResponseId,
    promptChars,
    echo: {
      instructions: json(instructions),
      metadata: json(metadata),
      parallelToolCalls: json(optional(body, 'parallel_tool_calls', isBoolean, 'a valid boolean') ?? true),
      temperature: pythonFloat(temperature ?? 1),
      toolChoice: choice,
      tools: echoTools,
      topP: pythonFloat(topP ?? 1),
      maxToolCalls: json(maxToolCalls),
      reasoning: json(optional(body, 'reasoning', isRecord, 'a valid dictionary')),
      serviceTier: json(optional(body, 'service_tier', isString, 'a valid string') ?? 'auto'),
      text: echoText,
      topLogprobs: withLogprobs ? String(topLogprobs) : 'null',
      truncation: json(optional(body, 'truncation', isString, 'a valid string') ?? 'disabled'),
      user: json(optional(body, 'user', isString, 'a valid string')),
      presencePenalty: pythonFloat(presencePenalty ?? 0),
      frequencyPenalty: pythonFloat(frequencyPenalty ?? 0),
    },
  };
}

export type { ResponsesAnswer } from './responses-answer.js';
