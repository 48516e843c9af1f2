/**
 * An attempt reads the clock once per upstream read of a stream (twice while it answers, to charge the read to the
 * turn's budget) and stamps every event of that read with the read's start (src/proxy/attempt.ts). Driven by hand,
 * as undici drives a dispatch handler, with a clock that counts its reads.
 */
import type { Dispatcher } from 'undici';
import { describe, expect, it } from 'vitest';
import { Attempt, type AttemptEvent } from '../src/proxy/attempt.js';
import { ReadTurns } from '../src/proxy/read-turns.js';
import type { Upstream } from '../src/proxy/upstreams.js';

const chunk = (text: string): string =>
  `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"${text}"},"logprobs":null,"finish_reason":null}]}\n\n`;

function harness(share: boolean) {
  let reads = 0;
  let time = 100;
  const now = () => {
    reads++;
    time += 1.5;
    return time;
  };
  const reports: Array<{ event: AttemptEvent; at: number | undefined }> = [];
  const turns = new ReadTurns({ defer: () => undefined });
  const charged: number[] = [];
  const spent = turns.spent.bind(turns);
  turns.spent = (ms: number, budgetMs: number) => {
    charged.push(ms);
    return spent(ms, budgetMs);
  };
  const attempt = new Attempt({} as Upstream, 1, (event, at) => reports.push({ event, at }), {
    streaming: true,
    maxEventBytes: 1 << 20,
    maxResponseBytes: 1 << 20,
    maxErrorBodyBytes: 1 << 16,
    wallNow: () => 0,
    now,
    turnShare: share ? { turns, budgetMs: 1000 } : undefined,
  });
  const controller = { pause() {}, resume() {}, abort() {} } as unknown as Dispatcher.DispatchController;
  attempt.onRequestStart(controller);
  attempt.onResponseStart(controller, 200, { 'content-type': 'text/event-stream' });
  reports.length = 0;
  return { attempt, controller, reports, charged, reads: () => reads };
}

describe('an attempt stamps a read with one clock read', () => {
  it("before it answers: one read of the clock, and the read's blocks and its chunk_done all carry it", () => {
    const { attempt, controller, reports, reads } = harness(true);
    const before = reads();
    attempt.onResponseData(controller, Buffer.from(chunk('a') + chunk('b')));
    expect(reads() - before).toBe(1);
    expect(reports.map((r) => r.event.type)).toEqual(['block', 'block', 'chunk_done']);
    const stamps = new Set(reports.map((r) => r.at));
    expect(stamps.size).toBe(1);
    expect([...stamps][0]).toBe(100 + 1.5 * reads());
  });

  it('while it answers: a second read at the end charges the read to the turn, from the same start', () => {
    const { attempt, controller, reports, charged, reads } = harness(true);
    attempt.answering = true;
    const before = reads();
    attempt.onResponseData(controller, Buffer.from(chunk('a')));
    expect(reads() - before).toBe(2);
    expect(charged).toEqual([1.5]);
    expect(reports.every((r) => r.at === reports[0]?.at)).toBe(true);
    // Without a turn share (streaming.turn_budget 0) an answering read reads the clock once.
    const alone = harness(false);
    alone.attempt.answering = true;
    const from = alone.reads();
    alone.attempt.onResponseData(alone.controller, Buffer.from(chunk('a')));
    expect(alone.reads() - from).toBe(1);
  });

  it("events outside a read (the framer's last block at the end, the stream's end) are left for the receiver to stamp", () => {
    const { attempt, controller, reports } = harness(false);
    // A block whose blank line ended in a CR that was the read's last byte: dispatched only at the end.
    attempt.onResponseData(controller, Buffer.from(chunk('a').replace(/\n\n$/, '\r\r')));
    reports.length = 0;
    attempt.onResponseEnd();
    expect(reports.map((r) => [r.event.type, r.at])).toEqual([
      ['block', undefined],
      ['chunk_done', undefined],
      ['stream_end', undefined],
      ['attempt_settled', undefined],
    ]);
  });
});
