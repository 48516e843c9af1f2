/**
 * The event the framer (framer.ts) hands out for a block whose only field is one `data:` line — every event vLLM
 * sends — with its value left undecoded in the block's bytes. Apart from the framer because it is the one object
 * that crosses from framing into classification (sse/fast-classify.ts reads the bytes where it says they are).
 */
import type { SseEvent } from './framer.js';

const EMPTY = Buffer.alloc(0);

/**
 * The event of a block whose only field is one `data:` line (comments and blank lines aside) — every event vLLM
 * sends — with its value not decoded: `raw[start, end)`, UTF-8. A byte classifier reads it there
 * (sse/fast-classify.ts); `data` decodes it on first use, to the string a plain event would hold — from `raw`,
 * which may be a view of the chunk fed (see Framer.feed). No `event:` or `id:`
 * field: the type is 'message', the id undefined. A fresh object per event, like any SseEvent, unless the receiver
 * hands it back (FramerCallbacks.onBlock returns true): then the framer reuses it for a later block.
 */
export class DataLineEvent implements SseEvent {
  #data: string | undefined = undefined;
  #raw: Buffer;
  #start: number;
  #end: number;

  constructor(raw: Buffer, start: number, end: number) {
    this.#raw = raw;
    this.#start = start;
    this.#end = end;
  }

  /** The block's raw bytes: what onBlock was given with this event. */
  get raw(): Buffer {
    return this.#raw;
  }

  get start(): number {
    return this.#start;
  }

  get end(): number {
    return this.#end;
  }

  /** The framer's only: this object, handed back, now stands for another block's data line. */
  reuse(raw: Buffer, start: number, end: number): this {
    this.#raw = raw;
    this.#start = start;
    this.#end = end;
    this.#data = undefined;
    return this;
  }

  /** Handed back: keeps no block's bytes while it waits for the next. */
  release(): void {
    this.#raw = EMPTY;
    this.#data = undefined;
  }

  get type(): string {
    return 'message';
  }

  get id(): undefined {
    return undefined;
  }

  get data(): string {
    return (this.#data ??= this.#raw.toString('utf8', this.#start, this.#end));
  }
}

