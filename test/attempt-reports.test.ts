/**
 * What an attempt reports per upstream read of a stream (src/proxy/attempt.ts), driven by hand as undici drives a
 * dispatch handler: it reads the clock once per read (twice while it answers, to charge the read to the turn's
 * budget) and stamps every event of that read with the read's start; the read's last block ends the read
 * (`endOfRead`) when the read ends with it, else a `chunk_done` does; a block report the exchange took at once is
 * reused for the next block, one it queued is left as it is.
 */
import type { Dispatcher } from 'undici';
import { describe, expect, it } from 'vitest';
import { Attempt, type AttemptEvent } from '../src/proxy/attempt.js';
import { ReadTurns } from '../src/proxy/read-turns.js';
import type { Upstream } from '../src/proxy/upstreams.js';

const chunk = (text: string): string =>
  `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"${text}"},"logprobs":null,"finish_reason":null}]}\n\n`;

function harness(share: boolean, taken: (event: AttemptEvent) => boolean = () => true, ordinaryRead?: (attempt: number, chunk: Buffer, at: number) => boolean) {
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
  const attempt = new Attempt({} as Upstream, 1, (event, at) => {
    // The report's own fields when it is reported (a reused report changes later; its SseEvent is not copied).
    reports.push({ event: { ...event }, at });
    return taken(event);
  }, {
    streaming: true,
    maxEventBytes: 1 << 20,
    maxResponseBytes: 1 << 20,
    maxErrorBodyBytes: 1 << 16,
    wallNow: () => 0,
    now,
    turnShare: share ? { turns, budgetMs: 1000 } : undefined,
    ordinaryRead,
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
    // The read ends inside a third event: its last whole block does not end it, a chunk_done does.
    attempt.onResponseData(controller, Buffer.from(chunk('a') + chunk('b') + 'data: {"id"'));
    expect(reads() - before).toBe(1);
    expect(reports.map((r) => [r.event.type, r.event.type === 'block' ? r.event.endOfRead : undefined])).toEqual([
      ['block', false],
      ['block', false],
      ['chunk_done', undefined],
    ]);
    const stamps = new Set(reports.map((r) => r.at));
    expect(stamps.size).toBe(1);
    expect([...stamps][0]).toBe(100 + 1.5 * reads());
  });

  it('a read that ends with a whole event: its last block ends the read, and no chunk_done follows', () => {
    const { attempt, controller, reports } = harness(false);
    attempt.onResponseData(controller, Buffer.from(chunk('a') + chunk('b')));
    attempt.onResponseData(controller, Buffer.from(chunk('c')));
    expect(reports.map((r) => [r.event.type, r.event.type === 'block' ? r.event.endOfRead : undefined])).toEqual([
      ['block', false],
      ['block', true],
      ['block', true],
    ]);
    // The rest of the third event's bytes, then nothing: the read that completes it ends with it.
    reports.length = 0;
    attempt.onResponseData(controller, Buffer.from(chunk('d').slice(0, 20)));
    attempt.onResponseData(controller, Buffer.from(chunk('d').slice(20)));
    expect(reports.map((r) => [r.event.type, r.event.type === 'block' ? r.event.endOfRead : undefined])).toEqual([
      ['chunk_done', undefined],
      ['block', true],
    ]);
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

  it('the read whose first write makes it answering (at its end) is not charged; the next one is', () => {
    const ref: { attempt?: Attempt } = {};
    const h = harness(true, (event) => {
      // The exchange marks the attempt answering while it carries out the read's write, at the read's end.
      const ends = event.type === 'chunk_done' || (event.type === 'block' && event.endOfRead === true);
      if (ends && ref.attempt !== undefined) ref.attempt.answering = true;
      return true;
    });
    ref.attempt = h.attempt;
    const before = h.reads();
    h.attempt.onResponseData(h.controller, Buffer.from(chunk('a')));
    expect(h.reads() - before).toBe(1);
    expect(h.charged).toEqual([]);
    h.attempt.onResponseData(h.controller, Buffer.from(chunk('b')));
    expect(h.reads() - before).toBe(3);
    expect(h.charged).toEqual([1.5]);
  });

  it("events outside a read (the framer's last block at the end, the stream's end) are left for the receiver to stamp", () => {
    const { attempt, controller, reports } = harness(false);
    // A block whose blank line ended in a CR that was the read's last byte: dispatched only at the end.
    attempt.onResponseData(controller, Buffer.from(chunk('a').replace(/\n\n$/, '\r\r')));
    reports.length = 0;
    attempt.onResponseEnd();
    expect(reports.map((r) => [r.event.type, r.at, r.event.type === 'block' ? r.event.endOfRead : undefined])).toEqual([
      ['block', undefined, true],
      ['stream_end', undefined, undefined],
      ['attempt_settled', undefined, undefined],
    ]);
    // A stream that ends after a whole event: nothing is left to dispatch, and a chunk_done still ends the read.
    const after = harness(false);
    after.attempt.onResponseData(after.controller, Buffer.from(chunk('a')));
    after.reports.length = 0;
    after.attempt.onResponseEnd();
    expect(after.reports.map((r) => r.event.type)).toEqual(['chunk_done', 'stream_end', 'attempt_settled']);
  });
});

describe('an attempt offers a whole read to the ordinary path only between blocks', () => {
  it('offered while the framer is idle; taken, it reports nothing; declined, or inside a block, it is framed', () => {
    const offered: Array<{ text: string; at: number }> = [];
    // The receiver takes reads of `b` and `d` whole and declines the rest, as the machine's ordinaryRead would.
    const h = harness(true, () => true, (attempt, read, at) => {
      expect(attempt).toBe(1);
      offered.push({ text: read.toString(), at });
      return read.toString() === chunk('b') || read.toString() === chunk('d');
    });
    h.attempt.answering = true;
    // The stream's first read: its first line may open with a BOM, so the framer is not idle yet: framed.
    h.attempt.onResponseData(h.controller, Buffer.from(chunk('a')));
    expect(offered).toEqual([]);
    expect(h.reports.map((r) => r.event.type)).toEqual(['block']);
    h.reports.length = 0;
    const before = h.reads();
    h.attempt.onResponseData(h.controller, Buffer.from(chunk('b')));
    expect(offered.map((o) => o.text)).toEqual([chunk('b')]);
    expect(h.reports).toEqual([]);
    // Stamped with the read's one clock read, and charged to the turn as a framed read is.
    expect(h.reads() - before).toBe(2);
    expect(offered[0]?.at).toBe(100 + 1.5 * (before + 1));
    expect(h.charged).toHaveLength(2);
    // Declined: framed as ever.
    h.attempt.onResponseData(h.controller, Buffer.from(chunk('c')));
    expect(offered).toHaveLength(2);
    expect(h.reports.map((r) => [r.event.type, r.event.type === 'block' ? r.event.endOfRead : undefined])).toEqual([['block', true]]);
    h.reports.length = 0;
    // Half of `d` is offered (declined); its rest continues a block the framer holds: not offered, framed.
    const d = chunk('d');
    h.attempt.onResponseData(h.controller, Buffer.from(d.slice(0, 30)));
    h.attempt.onResponseData(h.controller, Buffer.from(d.slice(30)));
    expect(offered.map((o) => o.text).slice(2)).toEqual([d.slice(0, 30)]);
    expect(h.reports.map((r) => r.event.type)).toEqual(['chunk_done', 'block']);
  });
});

describe('an attempt reuses a block report the exchange took at once', () => {
  it('taken: the next block comes in the same object, which holds no bytes in between', () => {
    const objects: AttemptEvent[] = [];
    const { attempt, controller } = harness(false, (event) => {
      if (event.type === 'block') objects.push(event);
      return true;
    });
    attempt.onResponseData(controller, Buffer.from(chunk('a') + chunk('b')));
    attempt.onResponseData(controller, Buffer.from(chunk('c')));
    expect(objects).toHaveLength(3);
    expect(new Set(objects).size).toBe(1);
    const report = objects[0] as Extract<AttemptEvent, { type: 'block' }>;
    expect(report.raw.length).toBe(0);
    expect(report.event).toBeNull();
  });

  it('queued: that object and its event are left as they were, and the next block gets new ones', () => {
    const queued: Array<{ report: Extract<AttemptEvent, { type: 'block' }>; raw: string; data: string | undefined }> = [];
    let n = 0;
    const { attempt, controller } = harness(false, (event) => {
      if (event.type !== 'block') return true;
      n++;
      // The second and third blocks wait behind a step, as the exchange queues what comes while it runs.
      if (n === 2 || n === 3) {
        queued.push({ report: event, raw: event.raw.toString(), data: event.event?.data });
        return false;
      }
      return true;
    });
    attempt.onResponseData(controller, Buffer.from(chunk('a') + chunk('b') + chunk('c') + chunk('d')));
    expect(queued).toHaveLength(2);
    const [second, third] = queued;
    expect(second?.report).not.toBe(third?.report);
    expect(second?.report.event).not.toBe(third?.report.event);
    // Read after the read is over, as the queue reads them: unchanged by the blocks that came later.
    for (const q of queued) {
      expect(q.report.raw.toString()).toBe(q.raw);
      expect(q.report.event?.data).toBe(q.data);
    }
    const content = (data: string | undefined) => (JSON.parse(data ?? '') as { choices: { delta: { content: string } }[] }).choices[0]?.delta.content;
    expect(queued.map((q) => content(q.data))).toEqual(['b', 'c']);
  });
});
