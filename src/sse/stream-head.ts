/**
 * What the fast path (fast-classify.ts) reuses between the chunks of one stream, whose id and model repeat in every
 * chunk: the kept head of the last chunk it accepted, a template of the last content chunk of each of its first
 * choices, and the stream's known id and model read without a new string.
 */
const NO_BYTES = Buffer.alloc(0);
const NO_WORDS = new Int32Array(0);

/** Choices with a template each (n above this: the later choices' chunks are matched by the head and scanned). */
export const TEMPLATE_CHOICES = 4;

/**
 * The head of the last chunk the fast path accepted into a scratch: its bytes up to the choice's index
 * (`{"id":…,"object":…,"created":…,"model":…,"choices":[{"index":`), whether it was a chat chunk, and the id and model
 * read from them. vLLM repeats one head in every chunk of a stream (one id, one `created`, one model), so a chunk
 * that begins with these bytes is matched by one comparison instead of being scanned again: the grammar reads a head
 * from its own bytes alone, so equal bytes give equal facts. A chunk that no template matches and that does not
 * begin with the kept head is scanned in full.
 */
const NO_TEMPLATES: readonly ChunkTemplate[] = [];

export class StreamHead {
  bytes: Buffer = NO_BYTES;
  chat = false;
  id = '';
  model = '';
  /**
   * The last templated chunk (ChunkTemplate) of choice i, for i < TEMPLATE_CHOICES: a stream of several choices
   * interleaves them, and one template for all would be replaced at every chunk. Matched before the head. None until
   * the first is kept: every request has a scratch, and a non-streamed one never keeps a template (making four per
   * request, through `Array.from`, was ~1.5% of a non-streamed request's CPU).
   */
  templates: readonly ChunkTemplate[] = NO_TEMPLATES;

  /** Choice `index`'s template (index < TEMPLATE_CHOICES), the templates made on first use. */
  template(index: number): ChunkTemplate {
    if (this.templates.length === 0) {
      const made: ChunkTemplate[] = [];
      for (let i = 0; i < TEMPLATE_CHOICES; i++) made.push(new ChunkTemplate());
      this.templates = made;
    }
    return this.templates[index] as ChunkTemplate;
  }

  keep(from: Buffer, start: number, stop: number, chat: boolean, id: string, model: string): void {
    // A head longer than this (a long id or model) is scanned each time rather than kept.
    if (stop - start > 512) return void (this.bytes = NO_BYTES);
    this.bytes = Buffer.from(from.subarray(start, stop));
    this.chat = chat;
    this.id = id;
    this.model = model;
  }
}

/**
 * The last accepted chunk whose only varying part is one string — a chat delta that is exactly `{"content":STRING}`,
 * or a completions choice's `text` — as the bytes around that string: everything before its opening quote's end
 * (`prefix`, the head included) and everything from its closing quote on (`suffix`). vLLM's content chunks differ
 * only in that string, so a chunk made of the same prefix, a valid JSON string and the same suffix is matched with two
 * comparisons and one short scan. The grammar reads the bytes after the string in a state that the prefix alone
 * decides (the string changes no state but its length), so the same prefix and suffix around any valid string give
 * the same facts but the string's own: the index, id and model kept here, and output iff the string is not empty.
 */
export class ChunkTemplate {
  prefix: Buffer = NO_BYTES;
  suffix: Buffer = NO_BYTES;
  /** The suffix as words (`wordsOf`), compared four bytes at a time. */
  suffixWords: Int32Array = NO_WORDS;
  /** Where the choice's index begins in the prefix: templates of a stream differ there first, so it is checked first. */
  indexAt = 0;
  index = 0;
  id = '';
  model = '';

  /** `from[start, open)` the prefix, `from[close, stop)` the suffix (close: the string's closing quote), the index at `indexAt`. */
  keep(from: Buffer, start: number, indexAt: number, open: number, close: number, stop: number, index: number, id: string, model: string): void {
    // A chunk whose parts are longer than this (a long id, model or tail) is scanned each time rather than kept.
    if (open - start > 1024 || stop - close > 256) {
      this.prefix = NO_BYTES;
      return;
    }
    this.prefix = Buffer.from(from.subarray(start, open));
    this.suffix = Buffer.from(from.subarray(close, stop));
    this.suffixWords = wordsOf(this.suffix);
    this.indexAt = indexAt - start;
    this.index = index;
    this.id = id;
    this.model = model;
  }
}

/**
 * Whether `literal` is at `bytes[at]` (the caller checked it fits). Long literals (a kept head or prefix) go to
 * Buffer's native comparison (memcmp): a JavaScript loop over two byte arrays costs ~1.5 ns per byte here, the native
 * call ~80 ns however short (a micro-benchmark of 167 bytes: 250 against 90 ns; of 42 bytes: 65 against 84).
 */
export function equalAt(bytes: Buffer, at: number, literal: Buffer): boolean {
  const n = literal.length;
  if (n > 64) return bytes.compare(literal, 0, n, at, at + n) === 0;
  for (let k = 0; k < n; k++) if (bytes[at + k] !== literal[k]) return false;
  return true;
}

/** `literal`'s whole four-byte groups as little-endian 32-bit words, for `equalWordsAt` (its last 0–3 bytes are not in them). */
export function wordsOf(literal: Buffer): Int32Array {
  const words = new Int32Array(literal.length >> 2);
  for (let i = 0; i < words.length; i++) words[i] = literal.readInt32LE(i * 4);
  return words;
}

/**
 * `equalAt` for a literal whose `words` are kept (`wordsOf(literal)`): four bytes of `bytes` put together and
 * compared with one word, which costs ~0.8 ns per byte here against the byte loop's ~1.4 (a micro-benchmark of a
 * vLLM chunk's 42-byte suffix: 42 against 65 ns, the native comparison 85). Past 96 bytes the native call is cheaper:
 * `equalAt` makes it.
 */
export function equalWordsAt(bytes: Buffer, at: number, literal: Buffer, words: Int32Array): boolean {
  const n = literal.length;
  if (n > 96) return equalAt(bytes, at, literal);
  let i = at;
  for (let k = 0; k < words.length; k++, i += 4) {
    if (((bytes[i] as number) | ((bytes[i + 1] as number) << 8) | ((bytes[i + 2] as number) << 16) | ((bytes[i + 3] as number) << 24)) !== words[k]) return false;
  }
  for (let k = words.length << 2; k < n; k++, i++) if (bytes[i] !== literal[k]) return false;
  return true;
}

/**
 * `bytes[from, to)` (a plain string of the grammar, well-formed UTF-8) as a string: `known` itself when it is ASCII
 * and the bytes spell it (no new string), else the bytes decoded. A stream's `id` and `model` are the same in every
 * chunk, so a caller that passes the ones it has seen allocates none per event. Only ASCII units are compared with
 * bytes: `"Ã©"` (U+00C3 U+00A9) has the code units of the bytes of `"é"` (C3 A9) and is not its text.
 */
export function textAt(bytes: Buffer, from: number, to: number, known: string | undefined): string {
  if (known !== undefined && known.length === to - from) {
    let k = 0;
    while (k < known.length) {
      const unit = known.charCodeAt(k);
      if (unit >= 0x80 || unit !== bytes[from + k]) break;
      k++;
    }
    if (k === known.length) return known;
  }
  return bytes.toString('utf8', from, to);
}
