/**
 * The stream engine's HTTP side (stream-engine.ts): a 200 `text/event-stream`, each tick's events framed as the
 * request asked (line endings, comments, multi-line data) and sent in one write.
 */
import type { ServerResponse } from 'node:http';
import type { StreamEvent, StreamSink } from './stream-engine.js';
import { createEventFramer, createNamedEventFramer, type FramingStyle } from './wire.js';

export function httpSink(res: ServerResponse, framing: FramingStyle): StreamSink {
  const frameData = createEventFramer(framing);
  const frameNamed = createNamedEventFramer(framing);
  let framed = 0;
  const frame = (event: StreamEvent): string => {
    // `first` suppresses the leading comment of the stream's first event.
    const first = framed === 0;
    framed += 1;
    const isJson = event.isJson ?? true;
    return event.name === undefined ? frameData(event.data, isJson, first) : frameNamed(event.name, event.data, isJson, first);
  };
  const write = (events: readonly StreamEvent[]): boolean => {
    if (events.length === 0) return true;
    if (events.length === 1) return res.write(frame(events[0] as StreamEvent));
    let text = '';
    for (const event of events) text += frame(event);
    return res.write(text);
  };
  return {
    open(events) {
      res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
      if (events.length > 0) write(events);
      else res.flushHeaders();
    },
    write,
    onDrain: (fn) => res.once('drain', fn),
    end: () => res.end(),
    reset: () => res.socket?.resetAndDestroy(),
    cut: () => cutConnection(res),
  };
}

/**
 * What uvicorn does when an exception escapes a started response: `transport.close()` — the bytes already written are
 * flushed, then FIN, with no chunked terminator. The client sees a truncated body (undici: `terminated`).
 */
export function cutConnection(res: ServerResponse): void {
  const socket = res.socket;
  if (socket === null) return;
  socket.once('finish', () => socket.destroy());
  socket.end();
}
