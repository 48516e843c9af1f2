/**
 * Byte-level framer for `text/event-stream` (WHATWG HTML §9.2 "Server-sent events", "Interpreting an event
 * stream"). It cuts a stream into blocks — everything up to and including the blank line that dispatches an
 * event — and parses each block's fields, so the proxy can forward, hold back or drop whole events while
 * the accounting layer reads what they say.
 *
 * It works on bytes and decodes only complete field values, so a chunk boundary may fall anywhere: inside a
 * multi-byte UTF-8 character, between the CR and LF of one line end, or inside the stream's leading BOM.
 *
 * Pure: no I/O, no clock. `Buffer` is used only as a byte container.
 *
 * @example
 * ```ts
 * const framer = createFramer({
 *   onBlock(raw, event) { socket.write(raw); if (event !== null) observe(event); },
 *   onOversized(bytes) { abort(`event larger than the limit (${bytes} bytes buffered)`); },
 * });
 * upstream.on('data', (chunk: Buffer) => framer.feed(chunk));
 * upstream.on('end', () => { if (framer.end() > 0) noteTruncated(); });
 * ```
 */

import { DataLineEvent } from './data-line.js';

export interface SseEvent {
  /** The last `event:` field's value in the block, or 'message'. */
  readonly type: string;
  /** WHATWG data buffer: the `data:` field values joined with '\n' (no trailing LF). */
  readonly data: string;
  /** The `id:` field value if this block set one, else undefined. */
  readonly id: string | undefined;
}

// The event of a block that is one `data:` line, undecoded (data-line.ts): part of what the framer hands out.
export { DataLineEvent };

export interface FramerCallbacks {
  /**
   * Called once per block. A block = every byte from the end of the previous block up to and including the
   * blank line that ends this block (so comment lines and stray blank lines are part of the following block's
   * raw bytes; concatenating all `raw` of a stream + the trailing unterminated bytes reproduces the input
   * exactly). `event` is null when the block dispatches nothing per WHATWG (comments only, no data field).
   * `raw` is a view (subarray) of a fed chunk when the block lies inside one chunk — no copy — and a fresh
   * Buffer when it spans chunks. A block whose only field is one `data:` line comes with a `DataLineEvent`, its value
   * undecoded in `raw`; read `data` to decode it.
   *
   * Return true to hand `event` back once done with it — nothing keeps it, and it is read no more: the framer then
   * reuses a `DataLineEvent` for a later block rather than allocating one per event. Anything else (a receiver that
   * queues the event) keeps it as it is.
   *
   * A blank line ended by a CR that is the last byte of a chunk is dispatched when the next chunk arrives (or at
   * `end()`): only the next byte tells whether the line end is CR or CRLF, and the LF of a CRLF belongs to this
   * block. Streams in LF or CRLF style are never delayed by this unless a chunk boundary splits a CRLF.
   *
   * `endsChunk`: the block ends at the last byte of the chunk it completes (or it is dispatched by `end()`), so no
   * other block of that chunk follows it — a receiver that acts once per read can act with it.
   */
  onBlock(raw: Buffer, event: SseEvent | null, endsChunk: boolean): unknown;
  /**
   * A block exceeded maxEventBytes: either the unfinished block buffered so far, or a block that lies inside one
   * chunk (so the outcome does not depend on how the stream was chunked). `bufferedBytes` is the number of bytes
   * of that block seen so far. Called once; the framer then ignores all further input.
   */
  onOversized(bufferedBytes: number): void;
}

export interface FramerOptions {
  maxEventBytes?: number; // default 1 MiB
}

export interface Framer {
  /**
   * Parses one chunk, calling `onBlock` for every block it completes. The framer keeps views of `chunk` only
   * while they hold an unfinished block, but the events it hands out may be views of it too (a `DataLineEvent`
   * decodes its `data` from `raw` when first read): do not mutate a chunk after feeding it. If a callback throws, the
   * exception propagates and the rest of the chunk is not parsed: discard the framer. A chunk fed from inside a
   * callback is framed once the chunk being framed is done, before this `feed` returns.
   */
  feed(chunk: Buffer): void;
  /**
   * End of stream: returns the number of buffered bytes of an unterminated trailing block (0 if the stream ended
   * on a block boundary, or after `onOversized`). Per WHATWG an unterminated event is discarded (not
   * dispatched). Calling `feed` afterwards throws.
   */
  end(): number;
  /** True once onOversized fired. */
  readonly failed: boolean;
  /**
   * Between blocks: nothing of a block or line kept, no CR waiting for its LF, the first line (and BOM) behind, no chunk
   * being framed. A whole block fed now is framed from its own bytes alone, so a receiver may read it itself instead.
   */
  readonly idle: boolean;
}

const DEFAULT_MAX_EVENT_BYTES = 1024 * 1024;

const LF = 0x0a;
const CR = 0x0d;
const SPACE = 0x20;
const COLON = 0x3a;
const NUL = 0x00;
const EMPTY = Buffer.alloc(0);

export function createFramer(callbacks: FramerCallbacks, options?: FramerOptions): Framer {
  const maxEventBytes = options?.maxEventBytes ?? DEFAULT_MAX_EVENT_BYTES;
  if (!Number.isFinite(maxEventBytes) || maxEventBytes < 1) {
    throw new RangeError(`maxEventBytes must be a positive number, got ${String(maxEventBytes)}`);
  }
  return new SseFramer(callbacks, maxEventBytes);
}

class SseFramer implements Framer {
  readonly #callbacks: FramerCallbacks;
  readonly #maxEventBytes: number;

  /** Raw bytes of the unfinished block that arrived in earlier chunks; joined once, when the block completes. */
  #pieces: Buffer[] = [];
  #pendingBytes = 0;
  /** The unfinished line's bytes: views into the tail of #pieces. */
  #lineParts: Buffer[] = [];
  /** The previous chunk ended with a CR line end; an LF opening the next chunk completes that CRLF. */
  #afterCR = false;
  /** ...and that CR ended a blank line: the block is complete, waiting for that LF (or not) to join its raw. */
  #blockComplete = false;

  // WHATWG "data buffer" (without its trailing LF), "event type buffer", and this block's id. The data buffer is kept
  // as its first value's place in the block's raw bytes, not decoded (#firstStart -1: no data field yet), and the
  // values of later data fields, decoded, each after its '\n' ('' for none).
  #firstStart = -1;
  #firstEnd = 0;
  #more = '';
  #type = '';
  #id: string | undefined = undefined;

  #atStreamStart = true;
  /** A DataLineEvent the receiver handed back, for the next data-line block. */
  #spare: DataLineEvent | undefined = undefined;
  #failed = false;
  #ended = false;
  /** A chunk is being framed; chunks fed meanwhile wait in #later. */
  #feeding = false;
  #later: Buffer[] = [];

  constructor(callbacks: FramerCallbacks, maxEventBytes: number) {
    this.#callbacks = callbacks;
    this.#maxEventBytes = maxEventBytes;
  }

  get failed(): boolean {
    return this.#failed;
  }

  get idle(): boolean {
    return this.#pieces.length === 0 && !this.#afterCR && !this.#atStreamStart && !this.#feeding && !this.#failed && !this.#ended;
  }

  feed(chunk: Buffer): void {
    if (this.#ended) throw new Error('SSE framer: feed() after end()');
    if (this.#feeding) {
      // Fed from inside a callback (a receiver whose reaction to a block reads the next chunk at once): framed after
      // the chunk being framed, whose state is not to be touched half-way.
      this.#later.push(chunk);
      return;
    }
    this.#feeding = true;
    try {
      this.#feed(chunk);
      while (this.#later.length > 0) this.#feed(this.#later.shift() as Buffer);
    } finally {
      this.#feeding = false;
      // After a callback threw, the rest is not framed (discard the framer): nothing fed meanwhile is kept either.
      if (this.#later.length > 0) this.#later = [];
    }
  }

  #feed(chunk: Buffer): void {
    if (this.#failed) return;
    const n = chunk.length;
    if (n === 0) return;

    let pos = 0;
    if (this.#afterCR) {
      this.#afterCR = false;
      // WHATWG: CRLF is one line end, also when the chunk boundary falls between the two bytes.
      if (chunk[0] === LF) pos = 1;
      if (this.#blockComplete) {
        this.#blockComplete = false;
        if (!this.#dispatch(chunk, 0, pos)) return;
      }
    }

    // Hot loop, long on purpose: one pass over the chunk finding line ends, with the common vLLM shape
    // (`data: <json>\n\n`, whole events per chunk) handled without copying or joining anything.
    let blockStart = this.#pieces.length === 0 ? pos : 0;
    // Next LF / CR at or after `pos` (-1: none left; -2: not searched yet). Cached so each byte is searched once per chunk:
    // re-searching for the rarer CR at every line would make a chunk of many lines quadratic.
    let nextLF = -2;
    let nextCR = -2;
    for (;;) {
      // A blank line straight after a line is every event's end: read that byte rather than call into indexOf.
      if (nextLF !== -1 && nextLF < pos) nextLF = pos < n && chunk[pos] === LF ? pos : chunk.indexOf(LF, pos);
      if (nextCR !== -1 && nextCR < pos) nextCR = chunk.indexOf(CR, pos);
      let eol: number;
      if (nextCR === -1) {
        if (nextLF === -1) break;
        eol = nextLF;
      } else {
        eol = nextLF !== -1 && nextLF < nextCR ? nextLF : nextCR;
      }
      let next = eol + 1;
      if (eol === nextCR) {
        if (next === n) this.#afterCR = true;
        else if (chunk[next] === LF) next++;
      }

      let isBlank: boolean;
      if (this.#lineParts.length === 0) {
        isBlank = this.#parseLine(chunk, pos, eol, this.#pendingBytes - blockStart);
      } else {
        // The line began in an earlier chunk (rare: only events split by the transport get here).
        this.#lineParts.push(chunk.subarray(pos, eol));
        const line = Buffer.concat(this.#lineParts);
        this.#lineParts = [];
        // Its first bytes are the last of the block's pieces.
        isBlank = this.#parseLine(line, 0, line.length, this.#pendingBytes + eol - pos - line.length);
      }

      if (isBlank) {
        if (this.#afterCR) {
          this.#blockComplete = true;
        } else {
          if (!this.#dispatch(chunk, blockStart, next)) return;
          blockStart = next;
        }
      }
      pos = next;
    }

    if (blockStart < n) {
      const total = this.#pendingBytes + n - blockStart;
      if (total > this.#maxEventBytes) {
        this.#fail(total);
        return;
      }
      // Copy a partial tail so the head of the chunk, already handed to onBlock, is not pinned by us.
      const piece = blockStart === 0 ? chunk : Buffer.from(chunk.subarray(blockStart));
      this.#pieces.push(piece);
      this.#pendingBytes = total;
      if (pos < n) this.#lineParts.push(piece.subarray(pos - blockStart));
    }
  }

  end(): number {
    if (this.#ended) return 0;
    this.#ended = true;
    if (this.#failed) return 0;
    this.#afterCR = false;
    if (this.#blockComplete) {
      // The stream ended right after a blank line's CR: the block was complete, nothing is trailing.
      this.#blockComplete = false;
      this.#dispatch(EMPTY, 0, 0);
      return 0;
    }
    const trailing = this.#pendingBytes;
    this.#pieces = [];
    this.#lineParts = [];
    this.#pendingBytes = 0;
    return trailing;
  }

  /**
   * Applies one complete line (without its line end) to the block state, per WHATWG "process the field".
   * Returns true for a blank line, which dispatches the block. `base`: where `buf[0]` is in the block's raw bytes
   * (negative when the block begins later in `buf`), so a data value's place in them is known without decoding it.
   */
  #parseLine(buf: Buffer, start: number, end: number, base: number): boolean {
    if (this.#atStreamStart) {
      this.#atStreamStart = false;
      // "One leading U+FEFF BYTE ORDER MARK character must be ignored." Its 3 bytes can only be in the first line.
      if (end - start >= 3 && buf[start] === 0xef && buf[start + 1] === 0xbb && buf[start + 2] === 0xbf) start += 3;
    }
    if (start === end) return true;
    const first = buf[start];
    if (first === COLON) return false;

    // vLLM sends nothing but `data:` lines: match them before the general field-name scan.
    if (
      first === 0x64 /* d */ &&
      end - start >= 5 &&
      buf[start + 1] === 0x61 /* a */ &&
      buf[start + 2] === 0x74 /* t */ &&
      buf[start + 3] === 0x61 /* a */ &&
      buf[start + 4] === COLON
    ) {
      let valueStart = start + 5;
      if (valueStart < end && buf[valueStart] === SPACE) valueStart++;
      this.#appendData(buf, valueStart, end, base);
      return false;
    }

    // A byte loop bounded by the line: indexOf(':') could run past `end` into later lines of the chunk.
    let colon = start;
    while (colon < end && buf[colon] !== COLON) colon++;
    let valueStart = colon;
    if (colon < end) {
      valueStart = colon + 1;
      // "If value starts with a U+0020 SPACE character, remove it" — one space only.
      if (valueStart < end && buf[valueStart] === SPACE) valueStart++;
    }
    switch (colon - start) {
      case 4:
        if (buf[start] === 0x64 && buf[start + 1] === 0x61 && buf[start + 2] === 0x74 && buf[start + 3] === 0x61) {
          this.#appendData(buf, valueStart, end, base);
        }
        break;
      case 5:
        // e v e n t
        if (buf[start] === 0x65 && buf[start + 1] === 0x76 && buf[start + 2] === 0x65 && buf[start + 3] === 0x6e && buf[start + 4] === 0x74) {
          this.#type = buf.toString('utf8', valueStart, end);
        }
        break;
      case 2:
        if (buf[start] === 0x69 /* i */ && buf[start + 1] === 0x64 /* d */ && !hasNul(buf, valueStart, end)) {
          this.#id = buf.toString('utf8', valueStart, end);
        }
        break;
      default:
        // `retry` only tunes a browser's reconnection delay; it and unknown fields are ignored.
        break;
    }
    return false;
  }

  /** A data field's value, `buf[start, end)`, `base` where buf[0] is in the block: the first is kept as its place. */
  #appendData(buf: Buffer, start: number, end: number, base: number): void {
    if (this.#firstStart < 0) {
      this.#firstStart = base + start;
      this.#firstEnd = base + end;
    } else {
      this.#more += '\n' + buf.toString('utf8', start, end);
    }
  }

  /** Emits the completed block: the pending pieces plus chunk[start, end). Returns false if it was oversized. */
  #dispatch(chunk: Buffer, start: number, end: number): boolean {
    let raw: Buffer;
    if (this.#pieces.length === 0) {
      // One event per chunk is vLLM's usual shape; subarray costs ~50 ns, so skip it when the block is the chunk.
      raw = start === 0 && end === chunk.length ? chunk : chunk.subarray(start, end);
    } else {
      const pieces = this.#pieces;
      if (end > start) pieces.push(chunk.subarray(start, end));
      raw = Buffer.concat(pieces, this.#pendingBytes + end - start);
      this.#pieces = [];
      this.#pendingBytes = 0;
    }
    if (raw.length > this.#maxEventBytes) {
      this.#fail(raw.length);
      return false;
    }
    // WHATWG "dispatch the event": an empty data buffer dispatches nothing; type and data buffers reset either way.
    // One data field and no other: its value stays bytes, where it is in `raw`.
    let event: SseEvent | null = null;
    let line: DataLineEvent | undefined;
    if (this.#firstStart >= 0) {
      if (this.#more === '' && this.#type === '' && this.#id === undefined) {
        const spare = this.#spare;
        this.#spare = undefined;
        line = spare === undefined ? new DataLineEvent(raw, this.#firstStart, this.#firstEnd) : spare.reuse(raw, this.#firstStart, this.#firstEnd);
        event = line;
      } else {
        event = { type: this.#type === '' ? 'message' : this.#type, data: raw.toString('utf8', this.#firstStart, this.#firstEnd) + this.#more, id: this.#id };
      }
    }
    this.#firstStart = -1;
    this.#more = '';
    this.#type = '';
    this.#id = undefined;
    if (this.#callbacks.onBlock(raw, event, end === chunk.length) === true && line !== undefined) {
      line.release();
      this.#spare = line;
    }
    return true;
  }

  #fail(bufferedBytes: number): void {
    this.#failed = true;
    this.#pieces = [];
    this.#lineParts = [];
    this.#pendingBytes = 0;
    this.#firstStart = -1;
    this.#more = '';
    this.#callbacks.onOversized(bufferedBytes);
  }
}

function hasNul(buf: Buffer, start: number, end: number): boolean {
  for (let i = start; i < end; i++) if (buf[i] === NUL) return true;
  return false;
}
