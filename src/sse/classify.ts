/**
 * What one upstream event means for delivery: the facts the ledger needs and nothing more. Shapes follow
 * docs/routes.md: chat and legacy completions chunks, the usage-only chunk, the error event (any JSON with a
 * top-level `error` key, whatever else it holds), and `[DONE]`.
 */
import { isRecord } from '../util/json.js';
import { readOutputParts, type OutputPart } from './output-parts.js';
import { fastClassify, fastClassifyBytes, type ChunkScratch } from './fast-classify.js';
import type { DataLineEvent } from './framer.js';

/** The fast path alone, exported for its tests (test/classify-fastpath.test.ts). */
export { fastClassify, fastClassifyBytes };

export interface Usage {
  promptTokens: number | undefined;
  completionTokens: number | undefined;
  /** Absent is not zero: vLLM only reports it with --enable-prompt-tokens-details and a non-zero hit. */
  cachedTokens: number | undefined;
}

export interface ChoiceFinish {
  index: number;
  reason: string;
}

export type EventFacts =
  | { kind: 'done' }
  | { kind: 'malformed' }
  | ({ kind: 'error'; sequence?: number } & UpstreamError)
  | {
      kind: 'chunk';
      /** Choice indices for which this event carries generated output (content, reasoning, tool calls, text). */
      output: readonly number[];
      /** Choice indices for which this event carries an answer: content, text, or a tool call naming its function (not reasoning). */
      answers: readonly number[];
      /** Choice indices this event names at all (role chunks included). */
      choices: readonly number[];
      finishes: readonly ChoiceFinish[];
      /** Valid usage, or undefined when absent or invalid (see usageInvalid). */
      usage: Usage | undefined;
      /** The event carried a `usage` object whose numbers cannot be counted. */
      usageInvalid: boolean;
      /** `choices: []` with usage: the chunk a gateway that injected include_usage drops. */
      usageOnly: boolean;
      /** The response's `id` and `model`, for traces. */
      id: string | undefined;
      model: string | undefined;
      /** The answer's pieces, only when asked for (the request has an output contract to check). */
      parts?: OutputPart[];
      /** This event ends a complete answer (Responses' `response.completed`: no `[DONE]` follows). */
      terminal?: boolean;
      /** The event's own sequence number (Responses), so an event Waybill adds can continue the numbering. */
      sequence?: number;
      /**
       * UTF-16 units of generated text this event carries (content, text, reasoning, tool-call names and arguments),
       * when any: what a request without usage is charged from (accounting/settle.ts, `relayed`). Absent: none.
       */
      outputChars?: number;
    };

const DONE = '[DONE]';


function nonEmptyString(value: unknown): boolean {
  return typeof value === 'string' && value.length > 0;
}

/** A token count as the ledger may count it: a non-negative safe integer. */
function isTokenCount(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 0;
}

/** A usage field: absent (undefined or null), a valid count, or invalid. */
function readCount(value: unknown): number | undefined | typeof INVALID {
  if (value === undefined || value === null) return undefined;
  return isTokenCount(value) ? value : INVALID;
}

const INVALID = Symbol('invalid');

/**
 * Reads an OpenAI/vLLM `usage` object: undefined when absent or not an object, 'invalid' when any count is not a
 * non-negative safe integer or the cached count exceeds the prompt (an upstream's numbers are checked before they
 * are counted: one 1e308 would make a token counter +Inf until restart).
 */
export function readUsage(value: unknown): Usage | 'invalid' | undefined {
  if (!isRecord(value)) return undefined;
  const details = value['prompt_tokens_details'];
  const promptTokens = readCount(value['prompt_tokens']);
  const completionTokens = readCount(value['completion_tokens']);
  const cachedTokens = isRecord(details) ? readCount(details['cached_tokens']) : undefined;
  if (promptTokens === INVALID || completionTokens === INVALID || cachedTokens === INVALID) return 'invalid';
  if (cachedTokens !== undefined && (promptTokens === undefined || cachedTokens > promptTokens)) return 'invalid';
  return { promptTokens, completionTokens, cachedTokens };
}

export interface UpstreamError {
  code: number | undefined;
  type: string | undefined;
  message: string | undefined;
  param: string | undefined;
}

/** Reads an error object (or vLLM's string-shaped `{"error":"Unauthorized"}`). */
export function readError(value: unknown): UpstreamError {
  if (typeof value === 'string') return { code: undefined, type: undefined, message: value, param: undefined };
  if (!isRecord(value)) return { code: undefined, type: undefined, message: undefined, param: undefined };
  const rawCode = value['code'];
  const code = typeof rawCode === 'number' ? rawCode : typeof rawCode === 'string' && /^\d{3}$/.test(rawCode) ? Number(rawCode) : undefined;
  const type = value['type'];
  const message = value['message'];
  const param = value['param'];
  return {
    param: typeof param === 'string' ? param : undefined,
    code: code !== undefined && Number.isInteger(code) ? code : undefined,
    type: typeof type === 'string' ? type : undefined,
    message: typeof message === 'string' ? message : undefined,
  };
}

/** Does this chat delta or completions choice carry generated output? Empty strings and nulls do not. */
function hasOutput(choice: Record<string, unknown>): boolean {
  if (hasAnswer(choice)) return true;
  const delta = choice['delta'] ?? choice['message'];
  if (!isRecord(delta)) return false;
  if (nonEmptyString(delta['reasoning']) || nonEmptyString(delta['reasoning_content'])) return true;
  const toolCalls = delta['tool_calls'];
  return Array.isArray(toolCalls) && toolCalls.length > 0;
}

/** Does it carry an answer: content or text, or a tool call that names its function? Reasoning is not an answer. */
function hasAnswer(choice: Record<string, unknown>): boolean {
  if (nonEmptyString(choice['text'])) return true;
  const delta = choice['delta'] ?? choice['message'];
  if (!isRecord(delta)) return false;
  if (nonEmptyString(delta['content'])) return true;
  const toolCalls = delta['tool_calls'];
  return Array.isArray(toolCalls) && toolCalls.some((call) => isRecord(call) && isRecord(call['function']) && nonEmptyString(call['function']['name']));
}

const charsOf = (value: unknown): number => (typeof value === 'string' ? value.length : 0);

/** The generated text of a chat delta, message or completions choice, in UTF-16 units (what hasOutput looks at). */
function choiceChars(choice: Record<string, unknown>): number {
  let chars = charsOf(choice['text']);
  const delta = choice['delta'] ?? choice['message'];
  if (!isRecord(delta)) return chars;
  // One reasoning text under either name (`reasoning_content` before late 2025): counted once if both came.
  chars += charsOf(delta['content']) + Math.max(charsOf(delta['reasoning']), charsOf(delta['reasoning_content']));
  const toolCalls = delta['tool_calls'];
  if (Array.isArray(toolCalls)) {
    for (const call of toolCalls) {
      if (isRecord(call) && isRecord(call['function'])) chars += charsOf(call['function']['name']) + charsOf(call['function']['arguments']);
    }
  }
  return chars;
}

/**
 * Classifies a parsed JSON body (an SSE event's data, or a whole non-stream response). With `withParts`, the facts
 * also carry the answer's pieces (for the output contract's checks).
 */
export function classifyJson(json: unknown, withParts = false): EventFacts {
  if (!isRecord(json)) return { kind: 'malformed' };
  if ('error' in json && json['error'] !== undefined && json['error'] !== null) {
    return { kind: 'error', ...readError(json['error']) };
  }
  const rawChoices = json['choices'];
  const output: number[] = [];
  const answers: number[] = [];
  const choices: number[] = [];
  const finishes: ChoiceFinish[] = [];
  let outputChars = 0;
  if (Array.isArray(rawChoices)) {
    for (const choice of rawChoices) {
      if (!isRecord(choice)) continue;
      const index = typeof choice['index'] === 'number' ? choice['index'] : 0;
      choices.push(index);
      if (hasOutput(choice)) {
        output.push(index);
        outputChars += choiceChars(choice);
      }
      if (hasAnswer(choice)) answers.push(index);
      const reason = choice['finish_reason'];
      if (typeof reason === 'string' && reason.length > 0) finishes.push({ index, reason });
    }
  } else if (!('usage' in json)) {
    return { kind: 'malformed' };
  }
  const usage = readUsage(json['usage']);
  const id = json['id'];
  const model = json['model'];
  const facts: EventFacts = {
    kind: 'chunk',
    output,
    answers,
    choices,
    finishes,
    usage: usage === 'invalid' ? undefined : usage,
    usageInvalid: usage === 'invalid',
    usageOnly: choices.length === 0 && usage !== undefined,
    id: typeof id === 'string' ? id : undefined,
    model: typeof model === 'string' ? model : undefined,
  };
  if (outputChars > 0) facts.outputChars = outputChars;
  if (withParts) facts.parts = readOutputParts(rawChoices);
  return facts;
}

/**
 * Classifies the JSON answer of a non-generation route (embeddings, pooling, classify, score, rerank, tokenize,
 * detokenize): an error object, or an answer with no choices and, where the route reports it, usage (rerank's has
 * no completion_tokens; tokenize's none at all). Only an object is an answer.
 */
export function classifyPoolingJson(json: unknown): EventFacts {
  if (!isRecord(json)) return { kind: 'malformed' };
  if ('error' in json && json['error'] !== undefined && json['error'] !== null) return { kind: 'error', ...readError(json['error']) };
  return answerFacts(readUsage(json['usage']), json['id'], json['model']);
}

/** The facts of an answer without choices (a pooling route's JSON, or its raw bytes: usage undefined). */
export function answerFacts(usage: Usage | 'invalid' | undefined, id: unknown, model: unknown): EventFacts {
  return {
    kind: 'chunk',
    output: [],
    answers: [],
    choices: [],
    finishes: [],
    usage: usage === 'invalid' ? undefined : usage,
    usageInvalid: usage === 'invalid',
    usageOnly: false,
    id: typeof id === 'string' ? id : undefined,
    model: typeof model === 'string' ? model : undefined,
  };
}

/**
 * Classifies one SSE event's data buffer: the fast path for vLLM's ordinary delta chunk when it applies, otherwise
 * `JSON.parse`. Both give the same `EventFacts` (test/classify-fastpath.test.ts). With `withParts` (a request whose
 * output contract needs the answer's text) every event takes `JSON.parse`, once, and carries its answer's pieces.
 * `knownId`, `knownModel`: the stream's id and model seen so far, reused by the fast path when the event names the
 * same (no string per event for them; the facts are equal either way). `into`: facts the fast path fills in place
 * (fast-classify.ts `chunkScratch`), valid until the next classification into them.
 */
export function classifyEventData(data: string, withParts = false, knownId?: string, knownModel?: string, into?: ChunkScratch): EventFacts {
  if (withParts) return classifyEventDataSlow(data, true);
  return fastClassify(data, knownId, knownModel, into) ?? classifyEventDataSlow(data);
}

/**
 * `classifyEventData` for an event the framer left undecoded (one `data:` line inside one read: vLLM's every event).
 * The fast path reads its bytes where they lie; only an event it declines is decoded, for JSON.parse. The same facts
 * as `classifyEventData(event.data, …)` (test/classify-fastpath.test.ts).
 */
export function classifyDataLine(event: DataLineEvent, withParts = false, knownId?: string, knownModel?: string, into?: ChunkScratch): EventFacts {
  if (withParts) return classifyEventDataSlow(event.data, true);
  return fastClassifyBytes(event.raw, event.start, event.end, knownId, knownModel, into) ?? classifyEventDataSlow(event.data);
}

/** Classifies one SSE event's data buffer with JSON.parse alone (the path `classifyEventData` falls back to). */
export function classifyEventDataSlow(data: string, withParts = false): EventFacts {
  if (data === DONE) return { kind: 'done' };
  let json: unknown;
  try {
    json = JSON.parse(data);
  } catch {
    return { kind: 'malformed' };
  }
  return classifyJson(json, withParts);
}
