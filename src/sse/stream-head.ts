/**
 * What the fast path (fast-classify.ts) reuses between the chunks of one stream, whose id and model repeat in every
 * chunk: the kept head of the last chunk it accepted, and the stream's known id and model read without a new string.
 */
const NO_BYTES = Buffer.alloc(0);

/**
 * The head of the last chunk the fast path accepted into a scratch: its bytes up to the choice's index
 * (`{"id":…,"object":…,"created":…,"model":…,"choices":[{"index":`), whether it was a chat chunk, and the id and model
 * read from them. vLLM repeats one head in every chunk of a stream (one id, one `created`, one model), so a chunk
 * that begins with these bytes is matched by one comparison instead of being scanned again: the grammar reads a head
 * from its own bytes alone, so equal bytes give equal facts. Any other chunk is scanned in full.
 */
export class StreamHead {
  bytes: Buffer = NO_BYTES;
  chat = false;
  id = '';
  model = '';

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
