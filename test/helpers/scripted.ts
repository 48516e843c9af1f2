/**
 * An upstream scripted by the test, for behaviour the simulator does not offer (a different answer per
 * connection, per upstream, or per attempt). `/health` answers 200 so the gateway counts it ready; `/metrics` (the
 * gateway's engine-signal scrapes) and `/version` (its revision reads) answer 404, like a server that is not vLLM,
 * and count as no request.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Cleanups } from './cleanups.js';

export type Handler = (req: IncomingMessage, res: ServerResponse) => void;

export interface Scripted {
  readonly url: string;
  /** Generation requests received (not health checks). */
  readonly requests: () => number;
  close(): Promise<void>;
}

export async function startScripted(handler: Handler): Promise<Scripted> {
  let requests = 0;
  const server = createServer((req, res) => {
    if (req.url === '/health') {
      res.end();
      return;
    }
    if (req.url === '/metrics' || req.url === '/version') {
      req.resume();
      res.statusCode = 404;
      res.end();
      return;
    }
    requests++;
    req.resume();
    req.on('end', () => handler(req, res));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    requests: () => requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** Starts a scripted upstream that `cleanups` closes after the test (after the gateway pushed later). */
export async function startScriptedFor(cleanups: Cleanups, handler: Handler): Promise<Scripted> {
  const upstream = await startScripted(handler);
  cleanups.push(() => upstream.close());
  return upstream;
}

/** The same, for a test that needs only the upstream's URL. */
export async function scriptedUpstream(cleanups: Cleanups, handler: Handler): Promise<string> {
  return (await startScriptedFor(cleanups, handler)).url;
}

const chunk = (choice: Record<string, unknown>) =>
  `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'sim-model', choices: [{ index: 0, logprobs: null, ...choice }] })}\n\n`;

/** vLLM-shaped chat stream pieces. */
export const wire = {
  role: chunk({ delta: { role: 'assistant', content: '' }, finish_reason: null }),
  content: (text: string) => chunk({ delta: { content: text }, finish_reason: null }),
  finish: chunk({ delta: {}, finish_reason: 'stop', stop_reason: null }),
  errorEvent: (code: number) => `data: {"error": {"message": "boom", "type": "InternalServerError", "param": null, "code": ${code}}}\n\n`,
  done: 'data: [DONE]\n\n',
  sse: { 'content-type': 'text/event-stream; charset=utf-8' },
};
