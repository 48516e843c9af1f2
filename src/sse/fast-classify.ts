/**
 * The classifier's fast path: vLLM's ordinary delta chunk recognised from its exact compact bytes, without decoding
 * them to a string and without JSON.parse (its grammar below). Apart from classify.ts because it is a byte-level
 * matcher with its own scan state, checked against the JSON.parse path by test/classify-fastpath.test.ts;
 * classify.ts's `classifyEventData` (a decoded string) and `classifyDataLine` (a framer's undecoded data line) call it
 * first.
 *
 * Longer than 400 lines on purpose: it is one byte-level matcher whose helpers share one scan state (module variables
 * each loop copies to locals); split across modules, that state would have to be exported as mutable bindings or
 * passed into every helper on the per-event path.
 */
import type { ChoiceFinish, EventFacts } from './classify.js';
import { equalAt, equalWordsAt, StreamHead, TEMPLATE_CHOICES, textAt, type ChunkTemplate } from './stream-head.js';

// ---------------------------------------------------------------------------------------------------------------
// Fast path: vLLM's ordinary delta chunk, recognised by its exact compact text (docs/routes.md, "Chat and legacy
// completions") without JSON.parse. It is a validating matcher for one narrow grammar, not a JSON parser:
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
//
// The input is UTF-8 bytes. Every byte of 0x80 and above must belong to a well-formed UTF-8 sequence (RFC 3629: no
// overlong form, no surrogate, nothing above U+10FFFF), or the path declines: then decoding the bytes (replacing
// what is ill-formed) and decoding any string's bytes alone give the same text, so the facts are the ones JSON.parse
// finds in the decoded data. A well-formed sequence is one UTF-16 unit, or two for four bytes.
// ---------------------------------------------------------------------------------------------------------------

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const ZERO = 0x30;
const NINE = 0x39;
const COMMA = 0x2c;
const CLOSE_BRACE = 0x7d;

/** A literal of the grammar as the bytes to match (all ASCII): a Buffer, as the input and a stream's head are. */
const ascii = (text: string): Buffer => Buffer.from(text, 'latin1');

const HEAD = ascii('{"id":"');
const CHAT_OBJECT = ascii(',"object":"chat.completion.chunk","created":');
const TEXT_OBJECT = ascii(',"object":"text_completion","created":');
const MODEL_KEY = ascii(',"model":"');
const CHOICES_INDEX = ascii(',"choices":[{"index":');
const DELTA_OPEN = ascii(',"delta":{');
const TEXT_KEY = ascii(',"text":"');
const TAIL = ascii(',"logprobs":null,"finish_reason":null');
const STOP_REASON_NULL = ascii(',"stop_reason":null');
const END = ascii('}]}');
const NULL = ascii('null');
const CONTENT_KEY = ascii('"content":');
const ROLE_KEY = ascii('"role":"');
const REASONING_KEY = ascii('"reasoning":');
const REASONING_CONTENT_KEY = ascii('"reasoning_content":');

/** Bit per delta key, so a duplicate key (which JSON.parse resolves to the last value) falls back. */
const ROLE = 1;
const CONTENT = 2;
const REASONING = 4;
const REASONING_CONTENT = 8;

const OUTPUT_BIT = 1;
const ANSWER_BIT = 2;

// Scan state shared by the helpers below; the fast path runs on one thread and never re-enters. The input is
// src[pos, end): no helper reads at or past `end` (a framer's data line is followed by its line ends in the same buffer).
// A helper that loops copies the state to locals first and writes `pos` back once: V8 reads a module variable from
// memory at every use, and a loop over `src[pos + k]` as written ran at half the speed of the same loop over locals
// (issue 27). `src` is only ever a Buffer (one map at every element read).
const NO_BYTES = Buffer.alloc(0);
let src: Buffer = NO_BYTES;
let pos = 0;
let end = 0;
/** The generated text scanDelta found, in UTF-16 units (content plus reasoning under either name, counted once). */
let deltaChars = 0;
/**
 * Where scanDelta found a delta that is exactly `{"content":STRING}`: the string's first byte and its closing quote;
 * -1 for any other delta (a chunk template is kept only around such a string).
 */
let contentOpen = -1;
let contentClose = -1;

/** The byte at `i`, or -1 at or past the end: no case matches it. */
function byteAt(i: number): number {
  return i < end ? (src[i] as number) : -1;
}

/** Whether `literal` is at `pos`; advances past it when it is. A long one (a kept head) is compared natively. */
function take(literal: Buffer): boolean {
  const at = pos;
  const n = literal.length;
  if (at + n > end || !equalAt(src, at, literal)) return false;
  pos = at + n;
  return true;
}

function isContinuation(c: number): boolean {
  return c >= 0x80 && c <= 0xbf;
}

/**
 * The length of the well-formed UTF-8 sequence whose lead byte (0x80 or above) is at `i`: 2, 3 or 4, or 0 when it is
 * ill-formed or cut by the end (RFC 3629 §4: the second byte's range depends on the lead).
 */
function sequenceAt(i: number): number {
  const lead = byteAt(i);
  const second = byteAt(i + 1);
  if (lead >= 0xc2 && lead <= 0xdf) return isContinuation(second) ? 2 : 0;
  if (lead >= 0xe0 && lead <= 0xef) {
    const low = lead === 0xe0 ? 0xa0 : 0x80;
    const high = lead === 0xed ? 0x9f : 0xbf;
    return second >= low && second <= high && isContinuation(byteAt(i + 2)) ? 3 : 0;
  }
  if (lead >= 0xf0 && lead <= 0xf4) {
    const low = lead === 0xf0 ? 0x90 : 0x80;
    const high = lead === 0xf4 ? 0x8f : 0xbf;
    return second >= low && second <= high && isContinuation(byteAt(i + 2)) && isContinuation(byteAt(i + 3)) ? 4 : 0;
  }
  return 0;
}

/** At `pos` just after an opening quote: a string with no backslash or control character. Leaves `pos` after the closing quote; false to decline. */
function scanPlainString(): boolean {
  const bytes = src;
  const stop = end;
  for (let i = pos; i < stop; i++) {
    const c = bytes[i] as number;
    if (c === QUOTE) {
      pos = i + 1;
      return true;
    }
    if (c < 0x20 || c === BACKSLASH) return false;
    if (c >= 0x80) {
      const n = sequenceAt(i);
      if (n === 0) return false;
      i += n - 1;
    }
  }
  return false;
}

function isHex(c: number): boolean {
  return (c >= ZERO && c <= NINE) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66);
}

/**
 * At `pos` just after an opening quote: a valid JSON string. Leaves `pos` after the closing quote and returns the
 * decoded value's length in UTF-16 units (0: empty), or -1 to decline. Every escape decodes to one unit, as does every
 * ASCII byte and every UTF-8 sequence but a four-byte one (two).
 */
function scanJsonString(): number {
  const bytes = src;
  const stop = end;
  let units = 0;
  for (let i = pos; i < stop; i++) {
    const c = bytes[i] as number;
    if (c === QUOTE) {
      pos = i + 1;
      return units;
    }
    units++;
    if (c < 0x20) return -1;
    if (c === BACKSLASH) {
      const e = byteAt(++i);
      if (e === 0x75 /* u */) {
        if (!(isHex(byteAt(i + 1)) && isHex(byteAt(i + 2)) && isHex(byteAt(i + 3)) && isHex(byteAt(i + 4)))) return -1;
        i += 4;
      } else if (
        e !== QUOTE && e !== BACKSLASH && e !== 0x2f /* / */ && e !== 0x62 /* b */ && e !== 0x66 /* f */ &&
        e !== 0x6e /* n */ && e !== 0x72 /* r */ && e !== 0x74 /* t */
      ) {
        return -1;
      }
    } else if (c >= 0x80) {
      const n = sequenceAt(i);
      if (n === 0) return -1;
      if (n === 4) units++;
      i += n - 1;
    }
  }
  return -1;
}

/** At `pos`: `0` or `[1-9][0-9]{0,14}`. Leaves `pos` after it and returns its value, or -1 to decline. */
function scanUint(): number {
  let at = pos;
  let c = byteAt(at);
  if (c === ZERO) {
    pos = at + 1;
    c = byteAt(at + 1);
    return c >= ZERO && c <= NINE ? -1 : 0;
  }
  let value = 0;
  let digits = 0;
  while (c >= ZERO && c <= NINE) {
    if (++digits > 15) return -1;
    value = value * 10 + (c - ZERO);
    c = byteAt(++at);
  }
  pos = at;
  return digits === 0 ? -1 : value;
}

/** At `pos`: STRING or `null` (a delta value). Returns the string's decoded length, 0 for null, -1 to decline. */
function scanStringOrNull(): number {
  if (byteAt(pos) === QUOTE) {
    pos++;
    return scanJsonString();
  }
  return take(NULL) ? 0 : -1;
}

/**
 * At `pos` just after `{`: the delta's members and its `}`. Returns OUTPUT_BIT when it carries output, with
 * ANSWER_BIT too when that output includes content (reasoning is output, not an answer); 0 for none, -1 to decline.
 */
function scanDelta(): number {
  deltaChars = 0;
  contentOpen = -1;
  if (byteAt(pos) === CLOSE_BRACE) {
    pos++;
    return 0;
  }
  let seen = 0;
  let output = 0;
  let reasoningChars = 0;
  const first = pos;
  for (;;) {
    let key: number;
    if (take(CONTENT_KEY)) {
      key = CONTENT;
    } else if (take(ROLE_KEY)) {
      if ((seen & ROLE) !== 0) return -1;
      seen |= ROLE;
      if (scanJsonString() < 0) return -1;
      key = 0;
    } else if (take(REASONING_KEY)) {
      key = REASONING;
    } else if (take(REASONING_CONTENT_KEY)) {
      key = REASONING_CONTENT;
    } else {
      return -1;
    }
    if (key !== 0) {
      if ((seen & key) !== 0) return -1;
      seen |= key;
      const chars = scanStringOrNull();
      if (chars < 0) return -1;
      if (chars > 0) output |= key === CONTENT ? OUTPUT_BIT | ANSWER_BIT : OUTPUT_BIT;
      if (key === CONTENT) deltaChars += chars;
      else reasoningChars = Math.max(reasoningChars, chars);
    }
    const c = byteAt(pos++);
    if (c === CLOSE_BRACE) {
      deltaChars += reasoningChars;
      // One member, content, a string: `"content":"` at the delta's start and its closing quote just before `}`.
      if (seen === CONTENT && byteAt(first + CONTENT_KEY.length) === QUOTE) {
        contentOpen = first + CONTENT_KEY.length + 1;
        contentClose = pos - 2;
      }
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

/** Facts the fast path fills in place, with the stream's head it keeps between events. */
export type ChunkScratch = ChunkFacts & { readonly head: StreamHead };

/**
 * Facts for the fast path to fill in place (`fastClassify`'s `into`): one per request, so a streamed event allocates
 * none. What it holds is valid until the next classification into it — the delivery machine reads it within the
 * step that classified the event and keeps nothing of it but strings and numbers. `outputChars` is 0 for none.
 */
export function chunkScratch(): ChunkScratch {
  return { kind: 'chunk', output: NO_INDICES, answers: NO_INDICES, choices: NO_INDICES, finishes: NO_FINISHES, usage: undefined, usageInvalid: false, usageOnly: false, id: undefined, model: undefined, outputChars: 0, head: new StreamHead() };
}

/**
 * The fast path on a decoded string: the same facts as `fastClassifyBytes` on its UTF-8 bytes, or undefined. A string
 * with a lone surrogate declines (its UTF-8 would read U+FFFD where JSON.parse keeps the surrogate). Exported for the
 * tests; callers use `classifyEventData`.
 */
export function fastClassify(data: string, knownId?: string, knownModel?: string, into?: ChunkScratch): EventFacts | undefined {
  if (!(data as unknown as { isWellFormed(): boolean }).isWellFormed()) return undefined;
  const bytes = Buffer.from(data, 'utf8');
  return fastClassifyBytes(bytes, 0, bytes.length, knownId, knownModel, into);
}

/**
 * The fast path alone: the facts for vLLM's ordinary one-choice, unfinished delta chunk (the grammar above) in
 * `bytes[from, to)`, or undefined when those bytes are anything else — the facts JSON.parse finds in the bytes decoded
 * as UTF-8. Nothing is decoded but the id and model, and those only when they differ from `knownId` and `knownModel`
 * (the stream's seen so far, reused when this chunk names the same: the facts are equal either way). `into`: a
 * `chunkScratch()` to fill and return instead of new facts (the same facts but `outputChars`, 0 rather than absent for
 * none). Exported for the tests; callers use `classifyDataLine`.
 */
export function fastClassifyBytes(bytes: Buffer, from: number, to: number, knownId?: string, knownModel?: string, into?: ChunkScratch): EventFacts | undefined {
  src = bytes;
  pos = from;
  end = to;
  const facts = scan(bytes, knownId, knownModel, into);
  src = NO_BYTES; // the scan state holds no caller's buffer past the call
  return facts;
}

/**
 * `fastClassifyBytes` for a chunk that one of `into`'s kept templates matches (stream-head.ts), and undefined for
 * any other, scanning nothing and keeping nothing new: a committed stream's ordinary delta, read without the framer
 * (delivery/phases/attempt.ts, ordinaryRead). Where it answers, its facts are the ones `fastClassifyBytes` fills in.
 */
export function matchKeptTemplate(bytes: Buffer, from: number, to: number, into: ChunkScratch): EventFacts | undefined {
  src = bytes;
  pos = from;
  end = to;
  const facts = matchTemplates(bytes, from, into.head, into);
  src = NO_BYTES;
  return facts;
}

/**
 * A chunk made of a kept template's prefix, a valid JSON string and its suffix (stream-head.ts, ChunkTemplate): its
 * facts, filled into `into`, or undefined (not such a chunk: the caller scans it). Leaves `pos` anywhere.
 */
function matchTemplates(bytes: Buffer, from: number, head: StreamHead, into: ChunkScratch): EventFacts | undefined {
  const templates = head.templates;
  for (let i = 0; i < templates.length; i++) {
    const facts = matchTemplate(bytes, from, templates[i] as ChunkTemplate, into);
    if (facts !== undefined) return facts;
  }
  return undefined;
}

function matchTemplate(bytes: Buffer, from: number, template: ChunkTemplate, into: ChunkScratch): EventFacts | undefined {
  const prefix = template.prefix;
  if (prefix.length === 0) return undefined;
  const open = from + prefix.length;
  const close = end - template.suffix.length;
  if (close < open) return undefined;
  // The choice's index and the byte after it first: another choice's chunk differs there, ~150 bytes in.
  const at = template.indexAt;
  if (bytes[from + at] !== prefix[at] || bytes[from + at + 1] !== prefix[at + 1]) return undefined;
  if (!equalAt(bytes, from, prefix) || !equalWordsAt(bytes, close, template.suffix, template.suffixWords)) return undefined;
  pos = open;
  const chars = scanJsonString();
  // The string must end at the suffix's quote: an earlier quote makes the rest something the template never saw.
  if (chars < 0 || pos !== close + 1) return undefined;
  const only = indexOnly(template.index);
  const outputs = chars > 0 ? only : NO_INDICES;
  into.output = outputs;
  into.answers = outputs;
  into.choices = only;
  into.id = template.id;
  into.model = template.model;
  into.outputChars = chars;
  return into;
}

function scan(bytes: Buffer, knownId: string | undefined, knownModel: string | undefined, into: ChunkScratch | undefined): EventFacts | undefined {
  const from = pos;
  const head = into?.head;
  // Where the head's id and model are, when it was scanned rather than matched with the kept one.
  let idStart = 0;
  let idEnd = 0;
  let modelStart = 0;
  let modelEnd = 0;
  let chat: boolean;
  if (head !== undefined) {
    const facts = matchTemplates(bytes, from, head, into as ChunkScratch);
    if (facts !== undefined) return facts;
    pos = from;
  }
  const matched = head !== undefined && head.bytes.length > 0 && take(head.bytes);
  if (matched) {
    chat = head.chat;
  } else {
    if (!take(HEAD)) return undefined;
    idStart = pos;
    if (!scanPlainString()) return undefined;
    idEnd = pos - 1;
    if (take(CHAT_OBJECT)) chat = true;
    else if (take(TEXT_OBJECT)) chat = false;
    else return undefined;
    if (scanUint() < 0 || !take(MODEL_KEY)) return undefined;
    modelStart = pos;
    if (!scanPlainString()) return undefined;
    modelEnd = pos - 1;
    if (!take(CHOICES_INDEX)) return undefined;
  }
  const headEnd = pos;
  const index = scanUint();
  if (index < 0) return undefined;
  let output: number;
  let chars: number;
  let open: number;
  let close: number;
  if (chat) {
    if (!take(DELTA_OPEN)) return undefined;
    output = scanDelta();
    chars = deltaChars;
    open = contentOpen;
    close = contentClose;
  } else {
    if (!take(TEXT_KEY)) return undefined;
    open = pos;
    chars = scanJsonString();
    close = pos - 1;
    output = chars > 0 ? OUTPUT_BIT | ANSWER_BIT : chars;
  }
  if (output < 0 || !take(TAIL)) return undefined;
  take(STOP_REASON_NULL);
  if (!take(END) || pos !== end) return undefined;
  const only = indexOnly(index);
  const outputs = output !== 0 ? only : NO_INDICES;
  const answers = (output & ANSWER_BIT) !== 0 ? only : NO_INDICES;
  let id: string;
  let model: string;
  if (matched) {
    id = head.id;
    model = head.model;
  } else {
    id = textAt(bytes, idStart, idEnd, knownId);
    model = textAt(bytes, modelStart, modelEnd, knownModel);
    head?.keep(bytes, from, headEnd, chat, id, model);
  }
  if (head !== undefined && open >= 0 && index < TEMPLATE_CHOICES) head.template(index).keep(bytes, from, headEnd, open, close, end, index, id, model);
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
