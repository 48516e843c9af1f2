/**
 * The simulator's tokenizer, behind /tokenize and /detokenize. It has to agree with the count the simulator bills
 * everywhere else — `estimateTokens`: ceil(UTF-16 units / 4), at least 1 — so a token is 4 UTF-16 units of the text
 * (the last one shorter) and an empty text is one special token. It also has to round-trip: detokenize(tokenize(t))
 * is t. Ids stay below 2³¹ so no client has to care about integer width:
 *
 *   0                         the special token (decodes to "", as a skipped special token does)
 *   1 … 89 451 460            a chunk of 1–4 characters from TAB, LF and printable ASCII, computed (no state)
 *   99 999 999                U+FFFD, for a non-ASCII chunk once the table below is full
 *   100 000 000 + k           the k-th distinct other chunk this simulator has seen (a bounded per-process table)
 *
 * Any other id decodes to "" (a fast tokenizer skips ids it does not know); ids ≥ 2³² are refused by the caller, as
 * vLLM's tokenizer raises OverflowError on them.
 */

const ALPHABET = `\t\n${Array.from({ length: 0x7f - 0x20 }, (_, i) => String.fromCharCode(0x20 + i)).join('')}`;
const BASE = ALPHABET.length; // 97
const CODE_OF = new Map<string, number>(Array.from(ALPHABET, (ch, i) => [ch, i]));
/** First id of the chunks of each length 1–4: 1, 1 + 97, 1 + 97 + 97², … */
const FIRST_ID_OF_LENGTH = [0, 1, 1 + BASE, 1 + BASE + BASE ** 2, 1 + BASE + BASE ** 2 + BASE ** 3, 1 + BASE + BASE ** 2 + BASE ** 3 + BASE ** 4];

export const SPECIAL_TOKEN_ID = 0;
export const REPLACEMENT_TOKEN_ID = 99_999_999;
const TABLE_BASE = 100_000_000;
/** Distinct non-ASCII chunks remembered per simulator: about 100 MB at most. */
export const TABLE_LIMIT = 1 << 20;
/** Token ids above this make vLLM's tokenizer raise OverflowError (a Rust u32). */
export const MAX_TOKEN_ID = 0xffff_ffff;

/** The characters of a text that one token stands for, by estimateTokens' rule. */
const CHARS_PER_TOKEN = 4;

export class SimTokenizer {
  private readonly idOf = new Map<string, number>();
  private readonly chunkOf: string[] = [];

  /** Token ids of `text`: ceil(length / 4) of them, or the one special token for "". */
  encode(text: string): number[] {
    if (text.length === 0) return [SPECIAL_TOKEN_ID];
    const ids: number[] = [];
    for (let at = 0; at < text.length; at += CHARS_PER_TOKEN) ids.push(this.idOfChunk(text.slice(at, at + CHARS_PER_TOKEN)));
    return ids;
  }

  /** The text of `ids`; unknown ids and the special token contribute nothing. */
  decode(ids: readonly number[]): string {
    let text = '';
    for (const id of ids) text += this.chunk(id);
    return text;
  }

  /** What each id stands for, as /tokenize's `token_strs` (the special token shows as "<s>"). */
  tokenStrings(ids: readonly number[]): string[] {
    return ids.map((id) => (id === SPECIAL_TOKEN_ID ? '<s>' : this.chunk(id)));
  }

  private idOfChunk(chunk: string): number {
    const computed = asciiId(chunk);
    if (computed !== null) return computed;
    const known = this.idOf.get(chunk);
    if (known !== undefined) return known;
    if (this.chunkOf.length >= TABLE_LIMIT) return REPLACEMENT_TOKEN_ID;
    const id = TABLE_BASE + this.chunkOf.length;
    this.chunkOf.push(chunk);
    this.idOf.set(chunk, id);
    return id;
  }

  private chunk(id: number): string {
    if (id === REPLACEMENT_TOKEN_ID) return '\ufffd';
    if (id >= TABLE_BASE) return this.chunkOf[id - TABLE_BASE] ?? '';
    return asciiChunk(id);
  }
}

function asciiId(chunk: string): number | null {
  let value = 0;
  for (let i = chunk.length - 1; i >= 0; i--) {
    const code = CODE_OF.get(chunk[i] ?? '');
    if (code === undefined) return null;
    value = value * BASE + code;
  }
  return (FIRST_ID_OF_LENGTH[chunk.length] ?? 0) + value;
}

function asciiChunk(id: number): string {
  for (let length = 1; length <= CHARS_PER_TOKEN; length++) {
    const first = FIRST_ID_OF_LENGTH[length] ?? 0;
    const next = FIRST_ID_OF_LENGTH[length + 1] ?? 0;
    if (id < first || id >= next) continue;
    let value = id - first;
    let chunk = '';
    for (let i = 0; i < length; i++) {
      chunk += ALPHABET[value % BASE] ?? '';
      value = Math.floor(value / BASE);
    }
    return chunk;
  }
  return '';
}
