/**
 * The classifier's fast path: vLLM's ordinary delta chunk recognised from its exact compact text, without JSON.parse
 * (its grammar below). Apart from classify.ts because it is a byte-level matcher with its own scan state, checked
 * against the JSON.parse path by test/classify-fastpath.test.ts; classify.ts's `classifyEventData` calls it first.
 */
import type { ChoiceFinish, EventFacts } from './classify.js';

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

export type ChunkFacts = Extract<EventFacts, { kind: 'chunk' }>;

/**
 * Facts for the fast path to fill in place (`fastClassify`'s `into`): one per request, so a streamed event allocates
 * none. What it holds is valid until the next classification into it — the delivery machine reads it within the
 * step that classified the event and keeps nothing of it but strings and numbers. `outputChars` is 0 for none.
 */
export function chunkScratch(): ChunkFacts {
  return { kind: 'chunk', output: NO_INDICES, answers: NO_INDICES, choices: NO_INDICES, finishes: NO_FINISHES, usage: undefined, usageInvalid: false, usageOnly: false, id: undefined, model: undefined, outputChars: 0 };
}

/**
 * `data[start, end)` as a string: `known` itself when the text is the same (no new string), else a slice. A stream's
 * `id` and `model` are the same in every chunk, so a caller that passes the ones it has seen allocates none per event.
 */
function textAt(data: string, start: number, end: number, known: string | undefined): string {
  return known !== undefined && known.length === end - start && data.startsWith(known, start) ? known : data.slice(start, end);
}

/**
 * The fast path alone: the facts for vLLM's ordinary one-choice, unfinished delta chunk (the grammar above), or
 * undefined when `data` is anything else. `knownId` and `knownModel`: the stream's id and model seen so far, reused
 * when this chunk names the same (the facts are equal either way). `into`: a `chunkScratch()` to fill and return
 * instead of new facts (the same facts but `outputChars`, 0 rather than absent for none). Exported for the tests;
 * callers use `classifyEventData`.
 */
export function fastClassify(data: string, knownId?: string, knownModel?: string, into?: ChunkFacts): EventFacts | undefined {
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
  const outputs = output !== 0 ? only : NO_INDICES;
  const answers = (output & ANSWER_BIT) !== 0 ? only : NO_INDICES;
  const id = textAt(data, idStart, idEnd, knownId);
  const model = textAt(data, modelStart, modelEnd, knownModel);
  if (into !== undefined) {
    into.output = outputs;
    into.answers = answers;
    into.choices = only;
    into.id = id;
    into.model = model;
    into.outputChars = chars;
    return into;
  }
  // Two literals rather than a property added afterwards: each is allocated at its final size, with no map
  // transition and no out-of-object property store per event. The facts are the same (`outputChars` only when > 0).
  if (chars > 0) {
    return { kind: 'chunk', output: outputs, answers, choices: only, finishes: NO_FINISHES, usage: undefined, usageInvalid: false, usageOnly: false, id, model, outputChars: chars };
  }
  return { kind: 'chunk', output: outputs, answers, choices: only, finishes: NO_FINISHES, usage: undefined, usageInvalid: false, usageOnly: false, id, model };
}
