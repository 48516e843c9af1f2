/**
 * The client write path of a streamed answer, below `ServerResponse` once the head is on the wire.
 *
 * `ServerResponse.write` on a chunked response corks the socket, queues the chunk's size line, the bytes and a CRLF,
 * and uncorks on the next tick: a `process.nextTick`, a three-buffer `writev` and the stream machinery around it, for
 * every event. That glue was a third of the gateway's JavaScript time at 64 streams × 64 tokens (docs/performance.md,
 * issue 15). Here each event is framed into one buffer and written to the socket at once: one `write` syscall, as
 * nginx does. The bytes on the wire are the same chunked encoding Node would send; the end (`0\r\n\r\n`, 'finish')
 * stays with `ServerResponse`, whose writes go to the same socket after these, in order.
 *
 * Only where that is certain: the head went out through `ServerResponse` (the first write carries it), the response
 * is chunked (an HTTP/1.0 client gets Node's own path), and the socket belongs to this response (a pipelined response
 * waiting behind another on its connection is still buffered by Node, which flushes it in order later).
 */
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

/** What Node keeps on a response and its socket (undocumented, stable since Node 0.x; answers.ts reads the same). */
interface ResponseInternals {
  readonly chunkedEncoding?: boolean;
}
interface SocketInternals {
  readonly _httpMessage?: unknown;
}

const CR = 0x0d;
const LF = 0x0a;

/** One chunk of HTTP/1.1 chunked encoding: size in hex, CRLF, the bytes, CRLF. */
export function chunkFrame(data: Buffer): Buffer {
  const size = data.length.toString(16);
  const frame = Buffer.allocUnsafe(size.length + data.length + 4);
  let at = frame.write(size, 0, 'latin1');
  frame[at++] = CR;
  frame[at++] = LF;
  at += data.copy(frame, at);
  frame[at++] = CR;
  frame[at] = LF;
  return frame;
}

export class ClientWriter {
  /** The head has been handed to the socket by an earlier write through the response. */
  private headOut = false;
  private awaitingDrain = false;
  private readonly drained = () => {
    this.awaitingDrain = false;
    this.onDrain();
  };

  constructor(
    private readonly res: ServerResponse,
    /** The response's socket when the exchange began (null: pipelined behind another response). */
    private readonly socket: Socket | null,
    /** The socket took a backlog a write had left: the same meaning as the response's 'drain'. */
    private readonly onDrain: () => void,
  ) {}

  /** Writes body bytes; false when the client's socket is full (resume on onDrain), as `ServerResponse.write`. */
  write(data: Buffer): boolean {
    // An empty chunk would be `0\r\n\r\n`, the end of the body (Node's own write skips them too).
    if (data.length === 0) return true;
    const socket = this.socket;
    if (
      this.headOut &&
      !this.res.writableEnded &&
      socket !== null &&
      (socket as SocketInternals)._httpMessage === this.res &&
      (this.res as ResponseInternals).chunkedEncoding === true &&
      socket.writable
    ) {
      if (socket.write(chunkFrame(data))) return true;
      if (!this.awaitingDrain) {
        this.awaitingDrain = true;
        socket.once('drain', this.drained);
      }
      return false;
    }
    const written = this.res.write(data);
    this.headOut = socket !== null && (socket as SocketInternals)._httpMessage === this.res;
    return written;
  }

  /** The response is over: a socket kept alive for the next request must not call back into this one. */
  detach(): void {
    if (!this.awaitingDrain) return;
    this.awaitingDrain = false;
    this.socket?.removeListener('drain', this.drained);
  }
}
