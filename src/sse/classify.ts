/**
 * What one upstream event means for delivery: the facts the ledger needs and nothing more. Shapes follow
 * docs/routes.md: chat and legacy completions chunks, the usage-only chunk, the error event (any JSON with a
 * top-level `error` key, whatever else it holds), and `[DONE]`.
 */
import { isRecord } from '../util/json.js';
import { readOutputParts, type OutputPart } from './output-parts.js';

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
       * when any: what a request without usage is charged from (accounting/ledger.ts, `relayed`). Absent: none.
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
 */
export function classifyEventData(data: string, withParts = false): EventFacts {
  if (withParts) return classifyEventDataSlow(data, true);
  return fastClassify(data) ?? classifyEventDataSlow(data);
}

// ---------------------------------------------------------------------------------------------------------------
// Fast path: vLLM's ordinary delta chunk, recognised by its exact compact text (docs/routes.md, "Chat and legacy completions") without
// JSON.parse. It is a validating matcher for one narrow grammar, not a JSON parser:
//
//   {"id":ID,"object":"chat.completion.chunk","created":UINT,"model":MODEL,"choices":[{"index":UINT,
//      "delta":{DELTA},"logprobs":null,"finish_reason":null[,"stop_reason":null]}]}
//   {"id":ID,"object":"text_completion","created":UINT,"model":MODEL,"choices":[{"index":UINT,
//      "text":STRING,"logprobs":null,"finish_reason":null[,"stop_reason":null]}]}
//
//   ID, MODEL  a string without backslash or control character (so its text is its value)
//   UINT       0 or [1-9][0-9]{0,14} (a JSON number; no sign, fraction or exponent)
//   DELTA      empty, or comma-separated "role":STRING, "content":S, "reasoning":S, "reasoning_content":S,
//              each at most once, in any order, S = STRING or null (no tool_calls: those fall back)
//   STRING     a JSON string, fully validated (escapes, no raw control characters); it is empty iff its text is
//              `""`, since every escape decodes to at least one code unit
//
// No whitespace anywhere, nothing after the final `}`. Every key of the object is fixed by the grammar, so no
// `error`, `usage`, second choice, non-null finish_reason, duplicate key or unknown field can be present; `"error"`
// or `"usage"` inside a string is just string content. Anything else returns undefined and takes JSON.parse.
// ---------------------------------------------------------------------------------------------------------------

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const ZERO = 0x30;
const NINE = 0x39;
const COMMA = 0x2c;
const CLOSE_BRACE = 0x7d;

const HEAD = '{"id":"';
const CHAT_OBJECT = ',"object":"chat.completion.chunk","created":';
const TEXT_OBJECT = ',"object":"text_completion","created":';
const MODEL_KEY = ',"model":"';
const CHOICES_INDEX = ',"choices":[{"index":';
const DELTA_OPEN = ',"delta":{';
const TEXT_KEY = ',"text":"';
const TAIL = ',"logprobs":null,"finish_reason":null';
const STOP_REASON_NULL = ',"stop_reason":null';
const END = '}]}';
const NULL = 'null';

/** Bit per delta key, so a duplicate key (which JSON.parse resolves to the last value) falls back. */
const ROLE = 1;
const CONTENT = 2;
const REASONING = 4;
const REASONING_CONTENT = 8;

const OUTPUT_BIT = 1;
const ANSWER_BIT = 2;

/** Scan state shared by the helpers below; the fast path runs on one thread and never re-enters. */
let pos = 0;
/** The generated text scanDelta found, in UTF-16 units (content plus reasoning under either name, counted once). */
let deltaChars = 0;

/** At `pos` just after an opening quote: a string with no backslash or control character. Leaves `pos` after the closing quote; false to decline. */
function scanPlainString(s: string): boolean {
  const length = s.length;
  for (let i = pos; i < length; i++) {
    const c = s.charCodeAt(i);
    if (c === QUOTE) {
      pos = i + 1;
      return true;
    }
    if (c < 0x20 || c === BACKSLASH) return false;
  }
  return false;
}

function isHex(c: number): boolean {
  return (c >= ZERO && c <= NINE) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66);
}

/**
 * At `pos` just after an opening quote: a valid JSON string. Leaves `pos` after the closing quote and returns the
 * decoded value's length in UTF-16 units (0: empty), or -1 to decline. Every escape decodes to one unit, so the
 * length is the text's minus what its escapes save, counted as they are validated.
 */
function scanJsonString(s: string): number {
  const start = pos;
  const length = s.length;
  let saved = 0;
  for (let i = start; i < length; i++) {
    const c = s.charCodeAt(i);
    if (c === QUOTE) {
      pos = i + 1;
      return i - start - saved;
    }
    if (c < 0x20) return -1;
    if (c === BACKSLASH) {
      const e = s.charCodeAt(++i); // NaN past the end: no case matches
      saved++;
      if (e === 0x75 /* u */) {
        if (!(isHex(s.charCodeAt(i + 1)) && isHex(s.charCodeAt(i + 2)) && isHex(s.charCodeAt(i + 3)) && isHex(s.charCodeAt(i + 4)))) {
          return -1;
        }
        i += 4;
        saved += 4;
      } else if (
        e !== QUOTE && e !== BACKSLASH && e !== 0x2f /* / */ && e !== 0x62 /* b */ && e !== 0x66 /* f */ &&
        e !== 0x6e /* n */ && e !== 0x72 /* r */ && e !== 0x74 /* t */
      ) {
        return -1;
      }
    }
  }
  return -1;
}

/** At `pos`: `0` or `[1-9][0-9]{0,14}`. Leaves `pos` after it and returns its value, or -1 to decline. */
function scanUint(s: string): number {
  let c = s.charCodeAt(pos);
  if (c === ZERO) {
    pos++;
    c = s.charCodeAt(pos);
    return c >= ZERO && c <= NINE ? -1 : 0;
  }
  let value = 0;
  let digits = 0;
  while (c >= ZERO && c <= NINE) {
    if (++digits > 15) return -1;
    value = value * 10 + (c - ZERO);
    c = s.charCodeAt(++pos);
  }
  return digits === 0 ? -1 : value;
}

/** At `pos`: STRING or `null` (a delta value). Returns the string's decoded length, 0 for null, -1 to decline. */
function scanStringOrNull(s: string): number {
  if (s.charCodeAt(pos) === QUOTE) {
    pos++;
    return scanJsonString(s);
  }
  if (s.startsWith(NULL, pos)) {
    pos += NULL.length;
    return 0;
  }
  return -1;
}

/**
 * At `pos` just after `{`: the delta's members and its `}`. Returns OUTPUT_BIT when it carries output, with
 * ANSWER_BIT too when that output includes content (reasoning is output, not an answer); 0 for none, -1 to decline.
 */
function scanDelta(s: string): number {
  deltaChars = 0;
  if (s.charCodeAt(pos) === CLOSE_BRACE) {
    pos++;
    return 0;
  }
  let seen = 0;
  let output = 0;
  let reasoningChars = 0;
  for (;;) {
    let key: number;
    if (s.startsWith('"content":', pos)) {
      key = CONTENT;
      pos += 10;
    } else if (s.startsWith('"role":"', pos)) {
      if ((seen & ROLE) !== 0) return -1;
      seen |= ROLE;
      pos += 8;
      if (scanJsonString(s) < 0) return -1;
      key = 0;
    } else if (s.startsWith('"reasoning":', pos)) {
      key = REASONING;
      pos += 12;
    } else if (s.startsWith('"reasoning_content":', pos)) {
      key = REASONING_CONTENT;
      pos += 20;
    } else {
      return -1;
    }
    if (key !== 0) {
      if ((seen & key) !== 0) return -1;
      seen |= key;
      const chars = scanStringOrNull(s);
      if (chars < 0) return -1;
      if (chars > 0) output |= key === CONTENT ? OUTPUT_BIT | ANSWER_BIT : OUTPUT_BIT;
      if (key === CONTENT) deltaChars += chars;
      else reasoningChars = Math.max(reasoningChars, chars);
    }
    const c = s.charCodeAt(pos++);
    if (c === CLOSE_BRACE) {
      deltaChars += reasoningChars;
      return output;
    }
    if (c !== COMMA) return -1;
  }
}

// Shared, as the types say (readonly): facts are read, never changed, and this path runs for every event. Not frozen:
// V8 iterates a frozen array through its generic path, allocating for every element.
const NO_INDICES: readonly number[] = [];
const NO_FINISHES: readonly ChoiceFinish[] = [];
/** `[i]` for the first choices. */
const INDEX_ONLY: readonly (readonly number[])[] = Array.from({ length: 8 }, (_, i) => [i]);

function indexOnly(index: number): readonly number[] {
  return INDEX_ONLY[index] ?? [index];
}

/**
 * The fast path alone: the facts for vLLM's ordinary one-choice, unfinished delta chunk (the grammar above), or
 * undefined when `data` is anything else. Exported for the tests; callers use `classifyEventData`.
 */
export function fastClassify(data: string): EventFacts | undefined {
  if (!data.startsWith(HEAD)) return undefined;
  pos = HEAD.length;
  const idStart = pos;
  if (!scanPlainString(data)) return undefined;
  const idEnd = pos - 1;
  let chat: boolean;
  if (data.startsWith(CHAT_OBJECT, pos)) {
    chat = true;
    pos += CHAT_OBJECT.length;
  } else if (data.startsWith(TEXT_OBJECT, pos)) {
    chat = false;
    pos += TEXT_OBJECT.length;
  } else {
    return undefined;
  }
  if (scanUint(data) < 0 || !data.startsWith(MODEL_KEY, pos)) return undefined;
  pos += MODEL_KEY.length;
  const modelStart = pos;
  if (!scanPlainString(data)) return undefined;
  const modelEnd = pos - 1;
  if (!data.startsWith(CHOICES_INDEX, pos)) return undefined;
  pos += CHOICES_INDEX.length;
  const index = scanUint(data);
  if (index < 0) return undefined;
  let output: number;
  let chars: number;
  if (chat) {
    if (!data.startsWith(DELTA_OPEN, pos)) return undefined;
    pos += DELTA_OPEN.length;
    output = scanDelta(data);
    chars = deltaChars;
  } else {
    if (!data.startsWith(TEXT_KEY, pos)) return undefined;
    pos += TEXT_KEY.length;
    chars = scanJsonString(data);
    output = chars > 0 ? OUTPUT_BIT | ANSWER_BIT : chars;
  }
  if (output < 0 || !data.startsWith(TAIL, pos)) return undefined;
  pos += TAIL.length;
  if (data.startsWith(STOP_REASON_NULL, pos)) pos += STOP_REASON_NULL.length;
  if (pos + END.length !== data.length || !data.endsWith(END)) return undefined;
  const only = indexOnly(index);
  const facts: EventFacts = {
    kind: 'chunk',
    output: output !== 0 ? only : NO_INDICES,
    answers: (output & ANSWER_BIT) !== 0 ? only : NO_INDICES,
    choices: only,
    finishes: NO_FINISHES,
    usage: undefined,
    usageInvalid: false,
    usageOnly: false,
    id: data.slice(idStart, idEnd),
    model: data.slice(modelStart, modelEnd),
  };
  if (chars > 0) facts.outputChars = chars;
  return facts;
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
