import { describe, expect, it } from 'vitest';
import { createFramer, DataLineEvent, type FramerOptions, type SseEvent } from '../src/sse/framer.js';
import { encodeDataEvent, generateChatPayloads, mulberry32, splitAt } from './fixtures/sse-fixtures.js';

interface Block {
  raw: string;
  event: SseEvent | null;
}
interface Outcome {
  blocks: Block[];
  trailing: number;
  oversized: number[];
}

function run(chunks: readonly Buffer[], options?: FramerOptions): Outcome {
  const blocks: Block[] = [];
  const oversized: number[] = [];
  const framer = createFramer(
    {
      onBlock: (raw, event) => blocks.push({ raw: raw.toString('latin1'), event: plain(event) }),
      onOversized: (bytes) => oversized.push(bytes),
    },
    options,
  );
  for (const chunk of chunks) framer.feed(chunk);
  return { blocks, trailing: framer.end(), oversized };
}

/** The event's fields as a plain object (a DataLineEvent's are getters: toEqual reads own properties only). */
const plain = (event: SseEvent | null): SseEvent | null => (event === null ? null : { type: event.type, data: event.data, id: event.id });
const bytes = (input: string | Buffer): Buffer => (typeof input === 'string' ? Buffer.from(input, 'utf8') : input);
const msg = (data: string, type = 'message', id?: string): SseEvent => ({ type, data, id });
const events = (outcome: Outcome): (SseEvent | null)[] => outcome.blocks.map((b) => b.event);
const latin1 = (input: Buffer): string => input.toString('latin1');

/** Every way to cut `input` into two chunks, plus one byte per chunk. */
function everySplit(input: Buffer): Buffer[][] {
  const splits: Buffer[][] = [];
  for (let cut = 0; cut <= input.length; cut++) splits.push(splitAt(input, [cut]));
  splits.push(splitAt(input, Array.from({ length: input.length }, (_, i) => i)));
  return splits;
}

interface Case {
  name: string;
  input: string | Buffer;
  /** Dispatched-or-not per block, in order. */
  events: (SseEvent | null)[];
  /** Raw bytes per block (as latin1 strings, so binary input reads exactly); checked when given. */
  raws?: string[];
  trailing?: number;
}

const cases: Case[] = [
  { name: 'vLLM event', input: 'data: {"a":1}\n\n', events: [msg('{"a":1}')], raws: ['data: {"a":1}\n\n'] },
  {
    name: 'several events in one chunk',
    input: 'data: 1\n\ndata: 2\n\ndata: [DONE]\n\n',
    events: [msg('1'), msg('2'), msg('[DONE]')],
    raws: ['data: 1\n\n', 'data: 2\n\n', 'data: [DONE]\n\n'],
  },
  { name: 'CRLF line ends', input: 'data: a\r\ndata: b\r\n\r\n', events: [msg('a\nb')], raws: ['data: a\r\ndata: b\r\n\r\n'] },
  { name: 'CR line ends', input: 'data: a\rdata: b\r\rdata: c\r\r', events: [msg('a\nb'), msg('c')] },
  { name: 'mixed line ends', input: 'data: a\ndata: b\r\ndata: c\r\n\r', events: [msg('a\nb\nc')] },
  { name: 'LF CR is two line ends', input: 'data: a\n\r', events: [msg('a')], raws: ['data: a\n\r'] },
  {
    name: 'CRLF blank line takes its LF into the block',
    input: 'data: a\r\n\r\ndata: b\r\n\r\n',
    events: [msg('a'), msg('b')],
    raws: ['data: a\r\n\r\n', 'data: b\r\n\r\n'],
  },
  {
    name: 'CR CR LF: the LF belongs to the blank line',
    input: 'data: a\r\r\ndata: b\r\r',
    events: [msg('a'), msg('b')],
    raws: ['data: a\r\r\n', 'data: b\r\r'],
  },
  { name: 'comment only block dispatches nothing', input: ': keep-alive\n\n', events: [null], raws: [': keep-alive\n\n'] },
  {
    name: 'comments belong to the following block',
    input: ': hi\ndata: x\n: mid\n\n',
    events: [msg('x')],
    raws: [': hi\ndata: x\n: mid\n\n'],
  },
  { name: 'stray blank lines are empty blocks', input: '\n\ndata: x\n\n', events: [null, null, msg('x')], raws: ['\n', '\n', 'data: x\n\n'] },
  { name: 'multi-line data', input: 'data: a\ndata:\ndata: b\n\n', events: [msg('a\n\nb')] },
  { name: 'empty data field dispatches an empty string', input: 'data:\n\n', events: [msg('')] },
  { name: 'two empty data fields', input: 'data\ndata\n\n', events: [msg('\n')] },
  { name: 'field without colon is a field with empty value', input: 'data\n\n', events: [msg('')] },
  { name: 'no data field dispatches nothing', input: 'event: ping\nid: 7\n\n', events: [null] },
  { name: 'only one space is stripped', input: 'data:  two\n\n', events: [msg(' two')] },
  { name: 'no space after colon', input: 'data:x\n\n', events: [msg('x')] },
  { name: 'tab is not stripped', input: 'data:\tx\n\n', events: [msg('\tx')] },
  { name: 'colons in the value are kept', input: 'data: a:b: c\n\n', events: [msg('a:b: c')] },
  { name: 'event field sets the type', input: 'event: error\ndata: x\n\n', events: [msg('x', 'error')] },
  { name: 'last event field wins', input: 'event: a\nevent: b\ndata: x\n\n', events: [msg('x', 'b')] },
  { name: 'empty event field means message', input: 'event:\ndata: x\n\n', events: [msg('x')] },
  { name: 'type does not leak into the next block', input: 'event: a\ndata: 1\n\ndata: 2\n\n', events: [msg('1', 'a'), msg('2')] },
  { name: 'id field', input: 'id: 42\ndata: x\n\n', events: [msg('x', 'message', '42')] },
  { name: 'empty id field', input: 'id\ndata: x\n\n', events: [msg('x', 'message', '')] },
  { name: 'id containing NUL is ignored', input: 'id: 1\nid: a\u0000b\ndata: x\n\n', events: [msg('x', 'message', '1')] },
  { name: 'id is per block', input: 'id: 1\ndata: a\n\ndata: b\n\n', events: [msg('a', 'message', '1'), msg('b')] },
  { name: 'retry and unknown fields are ignored', input: 'retry: 10\nfoo: bar\nDATA: no\ndata: x\n\n', events: [msg('x')] },
  { name: 'field names are exact', input: 'dat: a\ndataa: b\nevents: c\nidx: d\ndata: x\n\n', events: [msg('x')] },
  { name: 'BOM at stream start is ignored', input: '\uFEFFdata: x\n\n', events: [msg('x')], raws: [latin1(bytes('\uFEFFdata: x\n\n'))] },
  { name: 'BOM alone on the first line is a blank line', input: '\uFEFF\ndata: x\n\n', events: [null, msg('x')] },
  { name: 'only one BOM is ignored', input: '\uFEFF\uFEFFdata: x\n\n', events: [null] },
  { name: 'BOM later in the stream is data', input: 'data: a\n\ndata: \uFEFFb\n\n', events: [msg('a'), msg('\uFEFFb')] },
  { name: 'BOM not at a line start is kept', input: 'data: \uFEFFx\n\n', events: [msg('\uFEFFx')] },
  { name: 'non-ASCII data', input: 'data: {"c":"é中🎉 кошка"}\n\n', events: [msg('{"c":"é中🎉 кошка"}')] },
  { name: 'non-ASCII field name is unknown', input: 'dätä: x\ndata: y\n\n', events: [msg('y')] },
  { name: 'invalid UTF-8 decodes to U+FFFD', input: Buffer.from([0x64, 0x61, 0x74, 0x61, 0x3a, 0xe2, 0x82, 0x0a, 0x0a]), events: [msg('\uFFFD')] },
  { name: 'unterminated trailing event is discarded', input: 'data: 1\n\ndata: 2\n', events: [msg('1')], trailing: 8 },
  { name: 'trailing bytes without a line end', input: 'data: 1\n\ndata: 2', events: [msg('1')], trailing: 7 },
  { name: 'trailing comment', input: 'data: 1\n\n: bye', events: [msg('1')], trailing: 5 },
  { name: 'trailing CR line end is not a blank line', input: 'data: 1\r', events: [], trailing: 8 },
  { name: 'empty stream', input: '', events: [], trailing: 0 },
  { name: 'openai-node style error event', input: 'event: error\ndata: {"error":{"message":"x"}}\n\n', events: [msg('{"error":{"message":"x"}}', 'error')] },
];

describe('createFramer: the WHATWG event-stream grammar', () => {
  it.each(cases)('$name', (c) => {
    const input = bytes(c.input);
    const outcome = run([input]);
    expect(events(outcome)).toEqual(c.events);
    if (c.raws !== undefined) expect(outcome.blocks.map((b) => b.raw)).toEqual(c.raws);
    expect(outcome.trailing).toBe(c.trailing ?? 0);
    expect(outcome.oversized).toEqual([]);
    // Reconstruction: every byte is in exactly one block or in the trailing bytes.
    expect(outcome.blocks.map((b) => b.raw).join('') + latin1(input.subarray(input.length - outcome.trailing))).toBe(latin1(input));
  });

  it.each(cases)('$name: same outcome for every two-chunk split and byte by byte', (c) => {
    const input = bytes(c.input);
    const whole = run([input]);
    for (const chunks of everySplit(input)) expect(run(chunks)).toEqual(whole);
  });
});

describe('createFramer: chunk boundaries', () => {
  it('CR and LF of one CRLF in different chunks make one line end', () => {
    const outcome = run([bytes('data: a\r'), bytes('\ndata: b\r'), bytes('\n\r'), bytes('\n')]);
    expect(events(outcome)).toEqual([msg('a\nb')]);
    expect(outcome.blocks.map((b) => b.raw)).toEqual(['data: a\r\ndata: b\r\n\r\n']);
  });

  it('a lone CR at a chunk end followed by another line is a line end', () => {
    const outcome = run([bytes('data: a\r'), bytes('data: b\r'), bytes('\r')]);
    expect(events(outcome)).toEqual([msg('a\nb')]);
    expect(outcome.trailing).toBe(0);
  });

  it('a blank line ending in CR at a chunk end is dispatched when the next byte arrives', () => {
    const seen: (SseEvent | null)[] = [];
    const framer = createFramer({ onBlock: (_raw, e) => seen.push(plain(e)), onOversized: () => undefined });
    framer.feed(bytes('data: a\r\r'));
    expect(seen).toEqual([]);
    framer.feed(bytes('data: b\r\r'));
    expect(seen).toEqual([msg('a')]);
    expect(framer.end()).toBe(0);
    expect(seen).toEqual([msg('a'), msg('b')]);
  });

  it('decodes a multi-byte character split at each of its bytes', () => {
    const input = bytes('data: é中🎉\n\n');
    for (let a = 0; a <= input.length; a++) {
      for (let b = a; b <= input.length; b++) {
        expect(events(run(splitAt(input, [a, b])))).toEqual([msg('é中🎉')]);
      }
    }
  });

  it('ignores a BOM split across chunks', () => {
    expect(events(run([Buffer.from([0xef]), Buffer.from([0xbb]), Buffer.from([0xbf]), bytes('data: x\n\n')]))).toEqual([msg('x')]);
  });

  it('keeps a lone BOM prefix that is not a BOM', () => {
    const input = Buffer.concat([Buffer.from([0xef, 0xbb]), bytes('data: x\n\ndata: y\n\n')]);
    expect(events(run(splitAt(input, [1, 2])))).toEqual([null, msg('y')]);
  });

  it('treats empty chunks as nothing', () => {
    const outcome = run([Buffer.alloc(0), bytes('data: a\r'), Buffer.alloc(0), bytes('\n\r\n'), Buffer.alloc(0)]);
    expect(outcome.blocks.map((b) => b.raw)).toEqual(['data: a\r\n\r\n']);
  });

  it('passes a view of the chunk when the block lies inside it, a copy when it spans chunks', () => {
    const raws: Buffer[] = [];
    const framer = createFramer({ onBlock: (raw) => raws.push(raw), onOversized: () => undefined });
    const first = bytes('data: 1\n\ndata: 2');
    const second = bytes('\n\n');
    framer.feed(first);
    framer.feed(second);
    expect(raws.map((r) => r.toString())).toEqual(['data: 1\n\n', 'data: 2\n\n']);
    // Buffers share pool slabs, so identity is observed through writes: a view sees them, a copy does not.
    first.fill(0x78);
    second.fill(0x78);
    expect(raws.map((r) => r.toString())).toEqual(['xxxxxxxxx', 'data: 2\n\n']);
  });

  it('copies the partial tail it keeps, so a chunk whose events were delivered may be reused', () => {
    const blocks: string[] = [];
    const framer = createFramer({ onBlock: (raw) => blocks.push(raw.toString()), onOversized: () => undefined });
    const chunk = bytes('data: 1\n\ndata: 2');
    framer.feed(chunk);
    chunk.fill(0x78);
    framer.feed(bytes('\n\n'));
    expect(blocks).toEqual(['data: 1\n\n', 'data: 2\n\n']);
  });

  it('a chunk fed from inside onBlock is framed after the chunk being framed, as if fed after it', () => {
    // The block is completed by a chunk that is one LF (its blank line's CR ended the chunk before), and the receiver
    // reads the next chunk while handling it: that chunk leaves a block unfinished, which the rest must not touch.
    const chunks = ['data: a\r\r', '\n', 'data: b\r\n\r\ndata: par', 'tial\n\n'].map((c) => bytes(c));
    const nested: { raw: string; event: SseEvent | null; endsChunk: boolean }[] = [];
    let fedInside = false;
    const framer = createFramer({
      onBlock: (raw, event, endsChunk) => {
        nested.push({ raw: raw.toString(), event: plain(event), endsChunk });
        if (!fedInside) {
          fedInside = true;
          framer.feed(chunks[2] as Buffer);
        }
      },
      onOversized: () => undefined,
    });
    framer.feed(chunks[0] as Buffer);
    framer.feed(chunks[1] as Buffer);
    framer.feed(chunks[3] as Buffer);
    expect(framer.end()).toBe(0);
    const sequential: { raw: string; event: SseEvent | null; endsChunk: boolean }[] = [];
    const reference = createFramer({
      onBlock: (raw, event, endsChunk) => void sequential.push({ raw: raw.toString(), event: plain(event), endsChunk }),
      onOversized: () => undefined,
    });
    for (const chunk of chunks) reference.feed(chunk);
    reference.end();
    expect(nested).toEqual(sequential);
    expect(nested.map((b) => b.event?.data)).toEqual(['a', 'b', 'partial']);
    expect(nested.map((b) => b.raw).join('')).toBe(chunks.map((c) => c.toString()).join(''));
  });
});

describe('createFramer: realistic vLLM streams', () => {
  const payloads = generateChatPayloads(mulberry32(7), { minDeltas: 20, maxDeltas: 20 });
  const input = Buffer.concat(payloads.map(encodeDataEvent));

  it('dispatches every payload in order, as one chunk', () => {
    expect(events(run([input]))).toEqual(payloads.map((p) => msg(p)));
  });

  it('dispatches every payload in order when split at every byte offset', () => {
    const expected = payloads.map((p) => msg(p));
    for (let cut = 1; cut < input.length; cut++) {
      const outcome = run(splitAt(input, [cut]));
      expect(events(outcome)).toEqual(expected);
      expect(outcome.blocks.map((b) => b.raw).join('')).toBe(latin1(input));
    }
  });
});

describe('createFramer: maxEventBytes', () => {
  it('fires onOversized once with the buffered size, then ignores everything', () => {
    const seen: string[] = [];
    const oversized: number[] = [];
    const framer = createFramer(
      { onBlock: (raw) => seen.push(raw.toString()), onOversized: (n) => oversized.push(n) },
      { maxEventBytes: 16 },
    );
    framer.feed(bytes('data: ok\n\ndata: 0123'));
    expect(oversized).toEqual([]);
    framer.feed(bytes('456789'));
    expect(oversized).toEqual([]);
    expect(framer.failed).toBe(false);
    framer.feed(bytes('abc'));
    expect(oversized).toEqual([19]);
    expect(framer.failed).toBe(true);
    framer.feed(bytes('\n\ndata: later\n\n'));
    expect(seen).toEqual(['data: ok\n\n']);
    expect(oversized).toEqual([19]);
    expect(framer.end()).toBe(0);
  });

  it('an event of exactly maxEventBytes passes', () => {
    const outcome = run([bytes('data: 0123456789'), bytes('\n\n')], { maxEventBytes: 18 });
    expect(outcome.oversized).toEqual([]);
    expect(events(outcome)).toEqual([msg('0123456789')]);
  });

  it('a complete event inside one chunk that exceeds the limit also fails, so chunking does not matter', () => {
    const outcome = run([bytes('data: 1\n\ndata: 0123456789\n\ndata: 2\n\n')], { maxEventBytes: 17 });
    expect(events(outcome)).toEqual([msg('1')]);
    expect(outcome.oversized).toEqual([18]);
  });

  it('counts only the unfinished block, not what was already dispatched', () => {
    const outcome = run([bytes('data: 12345\n\ndata: 12345\n\ndata: 1')], { maxEventBytes: 14 });
    expect(outcome.oversized).toEqual([]);
    expect(outcome.trailing).toBe(7);
  });

  it('counts a long line that never ends', () => {
    const oversized: number[] = [];
    const framer = createFramer({ onBlock: () => undefined, onOversized: (n) => oversized.push(n) }, { maxEventBytes: 1000 });
    for (let i = 0; i < 100 && !framer.failed; i++) framer.feed(Buffer.alloc(64, 0x61));
    expect(oversized).toEqual([1024]);
  });

  it('rejects a non-positive limit', () => {
    expect(() => createFramer({ onBlock: () => undefined, onOversized: () => undefined }, { maxEventBytes: 0 })).toThrow(RangeError);
  });
});

describe('createFramer: end()', () => {
  it('returns 0 when the stream ended on a block boundary', () => {
    expect(run([bytes('data: 1\n\n')]).trailing).toBe(0);
  });

  it('returns the buffered bytes of an unterminated block spanning chunks', () => {
    expect(run([bytes('data: 1\n\n: c\n'), bytes('data: {"a"'), bytes(':"é"}\n')]).trailing).toBe(4 + 10 + 7);
  });

  it('feed() after end() throws, end() twice returns 0', () => {
    const framer = createFramer({ onBlock: () => undefined, onOversized: () => undefined });
    framer.feed(bytes('data: 1'));
    expect(framer.end()).toBe(7);
    expect(framer.end()).toBe(0);
    expect(() => framer.feed(bytes('\n\n'))).toThrow(/after end/);
  });
});

describe('createFramer: a data line left undecoded (DataLineEvent)', () => {
  /** Each block's event as the framer gave it, not made plain. */
  function given(chunks: readonly Buffer[]): { raw: Buffer; event: SseEvent | null }[] {
    const out: { raw: Buffer; event: SseEvent | null }[] = [];
    const framer = createFramer({ onBlock: (raw, event) => out.push({ raw, event }), onOversized: () => undefined });
    for (const chunk of chunks) framer.feed(chunk);
    framer.end();
    return out;
  }
  /** The value's bytes where the event says they are, read without its `data` getter. */
  const valueBytes = (raw: Buffer, event: SseEvent | null): string => {
    if (!(event instanceof DataLineEvent)) throw new Error(`not a DataLineEvent: ${JSON.stringify(event)}`);
    expect(event.raw).toBe(raw);
    return raw.subarray(event.start, event.end).toString('utf8');
  };

  it('one data line per block, several blocks in one chunk, LF or CRLF, after a comment or a BOM: undecoded, at the value', () => {
    const input = '\uFEFFdata: {"a":1}\n\ndata:b\r\n\r\n: keep-alive\ndata: é中🎉\n\ndata:\n\n';
    const blocks = given([bytes(input)]);
    expect(blocks.map((b) => valueBytes(b.raw, b.event))).toEqual(['{"a":1}', 'b', 'é中🎉', '']);
    expect(blocks.map((b) => plain(b.event))).toEqual([msg('{"a":1}'), msg('b'), msg('é中🎉'), msg('')]);
    expect(blocks.map((b) => b.event?.type)).toEqual(['message', 'message', 'message', 'message']);
    expect(blocks.map((b) => b.event?.id)).toEqual([undefined, undefined, undefined, undefined]);
  });

  it('an event handed back (onBlock returns true) is reused for the next data line, read afresh; one kept is never touched', () => {
    const seen: { event: SseEvent | null; data: string; start: number }[] = [];
    let handBack = true;
    const framer = createFramer({
      onBlock: (_raw, event) => {
        seen.push({ event, data: event?.data ?? '', start: event instanceof DataLineEvent ? event.start : -1 });
        return handBack;
      },
      onOversized: () => undefined,
    });
    framer.feed(bytes('data: one\n\ndata: two\n\n'));
    // Kept from here on: the receiver queues it (returns false), so the next block gets a new object.
    handBack = false;
    framer.feed(bytes(': c\ndata: three\n\n'));
    framer.feed(bytes('data: four\n\n'));
    handBack = true;
    framer.feed(bytes('event: e\ndata: five\n\ndata: six\n\n'));
    const events = seen.map((s) => s.event);
    expect(seen.map((s) => s.data)).toEqual(['one', 'two', 'three', 'four', 'five', 'six']);
    expect(events[1]).toBe(events[0]);
    expect(events[2]).toBe(events[0]);
    expect(events[3]).not.toBe(events[2]);
    // The kept ones still read as they were given.
    expect([events[2]?.data, events[3]?.data]).toEqual(['three', 'four']);
    expect((events[2] as DataLineEvent).start).toBe(seen[2]?.start);
    // A plain event (an `event:` field) is never reused, and handing it back gives the framer nothing to reuse.
    expect(events[4]).not.toBeInstanceOf(DataLineEvent);
    expect(events[5]).toBeInstanceOf(DataLineEvent);
    expect(new Set(events).size).toBe(4);
  });

  it('decodes on first read, once, from the block as it was given', () => {
    const [block] = given([bytes('data: x\n\n')]);
    const event = block?.event;
    expect(event).toBeInstanceOf(DataLineEvent);
    expect(event?.data).toBe('x');
    block?.raw.fill(0x79); // a decoded value is kept: a later read does not see the buffer change
    expect(event?.data).toBe('x');
  });

  it.each([
    ['two data lines', 'data: a\ndata: b\n\n', msg('a\nb')],
    ['an event field', 'event: delta\ndata: a\n\n', msg('a', 'delta')],
    ['an event field after the data', 'data: a\nevent: delta\n\n', msg('a', 'delta')],
    ['an id field', 'id: 7\ndata: a\n\n', msg('a', 'message', '7')],
    ['an empty id field', 'data: a\nid:\n\n', msg('a', 'message', '')],
    ['a data field without a colon first', 'data\ndata: a\n\n', msg('\na')],
  ])('is a plain event with %s', (_name, input, expected) => {
    const [block] = given([bytes(input)]);
    expect(block?.event).not.toBeInstanceOf(DataLineEvent);
    expect(block?.event).toEqual(expected);
  });

  it('keeps the value undecoded when the block spans chunks, at its place in the joined raw, wherever the cut falls', () => {
    const input = bytes(': c\r\ndata: {"a":"é"}\r\n\r\n');
    for (const chunks of everySplit(input)) {
      const blocks = given([...chunks, bytes('data: next\n\n')]);
      expect(blocks.map((b) => latin1(b.raw))).toEqual([latin1(input), 'data: next\n\n']);
      expect(blocks.map((b) => valueBytes(b.raw, b.event))).toEqual(['{"a":"é"}', 'next']);
    }
  });

  it('a blank line whose CR ends a chunk: the event comes with the next chunk, its value in place', () => {
    const blocks = given([bytes('data: a\r\r'), bytes('\ndata: b\n\n')]);
    expect(blocks.map((b) => latin1(b.raw))).toEqual(['data: a\r\r\n', 'data: b\n\n']);
    expect(blocks.map((b) => valueBytes(b.raw, b.event))).toEqual(['a', 'b']);
  });

  it('a second data line joined across chunks: a plain event, the first value decoded from its place', () => {
    const input = bytes('data: é1\ndata: 中2\n\n');
    for (const chunks of everySplit(input)) {
      const [block] = given(chunks);
      expect(block?.event).not.toBeInstanceOf(DataLineEvent);
      expect(block?.event).toEqual(msg('é1\n中2'));
    }
  });
});

describe('createFramer: idle, between blocks', () => {
  it('is idle only with nothing of a block, a line or a CR kept, past the first line, not framing, failed or ended', () => {
    const seen: boolean[] = [];
    const framer = createFramer({ onBlock: () => void seen.push(framer.idle), onOversized: () => undefined }, { maxEventBytes: 64 });
    // Before the first line (which may open with a BOM).
    expect(framer.idle).toBe(false);
    framer.feed(Buffer.from('data: a\n\n'));
    expect(framer.idle).toBe(true);
    // Inside a callback: a chunk is being framed.
    expect(seen).toEqual([false]);
    framer.feed(Buffer.from('data: b\n'));
    expect(framer.idle).toBe(false);
    framer.feed(Buffer.from('\n'));
    expect(framer.idle).toBe(true);
    framer.feed(Buffer.from('data: c'));
    expect(framer.idle).toBe(false);
    framer.feed(Buffer.from('\r\n\r'));
    // The block is complete but its CR may be the first half of a CRLF.
    expect(framer.idle).toBe(false);
    framer.feed(Buffer.from('\n'));
    expect(framer.idle).toBe(true);
    framer.feed(Buffer.from(`data: ${'x'.repeat(100)}`));
    expect(framer.failed).toBe(true);
    expect(framer.idle).toBe(false);
    const ended = createFramer({ onBlock: () => undefined, onOversized: () => undefined });
    ended.feed(Buffer.from('data: a\n\n'));
    ended.end();
    expect(ended.idle).toBe(false);
  });
});
