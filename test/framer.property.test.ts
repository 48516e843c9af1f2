import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { createFramer, DataLineEvent, type SseEvent } from '../src/sse/framer.js';
import { generateChatPayloads, mulberry32, splitAt } from './fixtures/sse-fixtures.js';

// ---------------------------------------------------------------------------------------------------------------
// Reference parser: the WHATWG algorithm read literally, on a decoded string, whole stream at once.
// Slow and obviously correct; the framer must agree with it on every event.
// ---------------------------------------------------------------------------------------------------------------

interface RefBlock {
  raw: string;
  event: SseEvent | null;
  /** The framer's promise (framer.ts DataLineEvent): one `data:` line, no `event:` type, no id, so left undecoded. */
  undecoded: boolean;
}

function referenceParse(bytes: Uint8Array): { blocks: RefBlock[]; trailing: string } {
  // "Streams must be decoded using the UTF-8 decode algorithm"; the BOM is kept here only so raw can be compared.
  const text = new TextDecoder('utf-8', { ignoreBOM: true }).decode(bytes);
  const blocks: RefBlock[] = [];
  let dataBuffer = '';
  let eventType = '';
  let id: string | undefined;
  let dataLines = 0;
  let blockStart = 0;
  // "One leading U+FEFF BYTE ORDER MARK character must be ignored if any are present."
  let pos = text.startsWith('\uFEFF') ? 1 : 0;
  for (;;) {
    let end = pos;
    while (end < text.length && text[end] !== '\r' && text[end] !== '\n') end++;
    if (end === text.length) break; // an unterminated line is never processed
    const line = text.slice(pos, end);
    const next = text[end] === '\r' && text[end + 1] === '\n' ? end + 2 : end + 1;
    if (line === '') {
      // "dispatch the event"
      let event: SseEvent | null = null;
      if (dataBuffer !== '') {
        const data = dataBuffer.endsWith('\n') ? dataBuffer.slice(0, -1) : dataBuffer;
        event = { type: eventType === '' ? 'message' : eventType, data, id };
      }
      blocks.push({ raw: text.slice(blockStart, next), event, undecoded: event !== null && dataLines === 1 && eventType === '' && id === undefined });
      dataLines = 0;
      dataBuffer = '';
      eventType = '';
      id = undefined;
      blockStart = next;
    } else if (!line.startsWith(':')) {
      const colon = line.indexOf(':');
      const name = colon === -1 ? line : line.slice(0, colon);
      let value = colon === -1 ? '' : line.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (name === 'data') {
        dataBuffer += value + '\n';
        dataLines++;
      }
      else if (name === 'event') eventType = value;
      else if (name === 'id' && !value.includes('\u0000')) id = value;
    }
    pos = next;
  }
  return { blocks, trailing: text.slice(blockStart) };
}

// ---------------------------------------------------------------------------------------------------------------
// Running the framer
// ---------------------------------------------------------------------------------------------------------------

interface Outcome {
  blocks: { raw: string; event: SseEvent | null; undecoded: boolean }[];
  trailing: number;
  failed: boolean;
}

function frame(chunks: readonly Buffer[], maxEventBytes?: number): Outcome {
  const blocks: Outcome['blocks'] = [];
  let oversizedCalls = 0;
  // Bytes fed so far (the chunk being fed included), and bytes of the blocks so far: a block ends its chunk iff its
  // last byte is the last fed (the blocks' bytes and the trailing ones are the input, in order).
  let fed = 0;
  let framed = 0;
  const framer = createFramer(
    {
      // As plain fields: a DataLineEvent's are getters, and toEqual reads own properties only.
      onBlock: (raw, event, endsChunk) => {
        framed += raw.length;
        expect(endsChunk).toBe(framed === fed);
        blocks.push({ raw: raw.toString('latin1'), event: event === null ? null : { type: event.type, data: event.data, id: event.id }, undecoded: event instanceof DataLineEvent });
        // Copied, so handed back (two blocks in three): the framer's reuse of its events is held to the reference too.
        return blocks.length % 3 !== 0;
      },
      onOversized: () => void oversizedCalls++,
    },
    maxEventBytes === undefined ? {} : { maxEventBytes },
  );
  for (const chunk of chunks) {
    fed += chunk.length;
    framer.feed(chunk);
  }
  const trailing = framer.end();
  expect(oversizedCalls).toBe(framer.failed ? 1 : 0);
  return { blocks, trailing, failed: framer.failed };
}

/** Cut points as drawn by fast-check, mapped onto the input; or one byte per chunk. */
const chunkingArb = fc.oneof(
  { weight: 5, arbitrary: fc.array(fc.nat(), { maxLength: 40 }) },
  { weight: 1, arbitrary: fc.constant('bytewise' as const) },
);

function rechunk(bytes: Buffer, chunking: number[] | 'bytewise'): Buffer[] {
  if (chunking === 'bytewise') return splitAt(bytes, Array.from({ length: bytes.length }, (_, i) => i));
  return splitAt(bytes, chunking.map((c) => c % (bytes.length + 1)).sort((a, b) => a - b));
}

function expectMatchesReference(bytes: Buffer, outcome: Outcome, compareRaw: boolean): void {
  const ref = referenceParse(bytes);
  expect(outcome.blocks.map((b) => b.event)).toEqual(ref.blocks.map((b) => b.event));
  expect(outcome.blocks.map((b) => b.undecoded)).toEqual(ref.blocks.map((b) => b.undecoded));
  if (compareRaw) {
    expect(outcome.blocks.map((b) => Buffer.from(b.raw, 'latin1').toString('utf8'))).toEqual(ref.blocks.map((b) => b.raw));
    expect(outcome.trailing).toBe(Buffer.byteLength(ref.trailing, 'utf8'));
  }
  const joined = outcome.blocks.map((b) => b.raw).join('');
  expect(joined + bytes.subarray(bytes.length - outcome.trailing).toString('latin1')).toBe(bytes.toString('latin1'));
}

// ---------------------------------------------------------------------------------------------------------------
// Generated streams
// ---------------------------------------------------------------------------------------------------------------

/** A field value: any text but line ends (which cannot occur in a value). */
const valueArb = fc.string({ unit: 'grapheme', maxLength: 8 }).map((s) => s.replace(/[\r\n]/g, '_'));

const decorationArb = fc.record({
  comment: fc.option(valueArb, { nil: undefined }),
  eventType: fc.option(fc.oneof(fc.constantFrom('error', 'delta', ''), valueArb), { nil: undefined }),
  // An id holding NUL is ignored (WHATWG), so the expected id is then undefined.
  id: fc.option(fc.oneof(valueArb, fc.constant('a\u0000b')), { nil: undefined }),
  /** Cut the payload into several `data:` lines at these code-point offsets. */
  dataCuts: fc.array(fc.nat(), { maxLength: 3 }),
  strayBlankLines: fc.nat({ max: 2 }),
  noSpace: fc.boolean(),
});

const dialectStreamArb = fc.record({
  seed: fc.integer(),
  eol: fc.constantFrom('\n', '\r\n', '\r'),
  bom: fc.boolean(),
  decorations: fc.array(decorationArb, { minLength: 1, maxLength: 6 }),
  tail: fc.constantFrom('', 'data: {"partial', ': bye', 'data: x\n'),
});

type DialectStream = typeof dialectStreamArb extends fc.Arbitrary<infer T> ? T : never;

/** Renders a vLLM chat stream in another server's dialect; returns its bytes and the events it must produce. */
function renderDialect(spec: DialectStream): { bytes: Buffer; expected: (SseEvent | null)[] } {
  const payloads = generateChatPayloads(mulberry32(spec.seed), { minDeltas: 1, maxDeltas: 8 });
  const eol = spec.eol;
  let text = spec.bom ? '\uFEFF' : '';
  const expected: (SseEvent | null)[] = [];
  payloads.forEach((payload, i) => {
    const d = spec.decorations[i % spec.decorations.length];
    if (d === undefined) throw new Error('no decoration');
    for (let k = 0; k < d.strayBlankLines; k++) {
      text += eol;
      expected.push(null);
    }
    if (d.comment !== undefined) text += `:${d.comment}${eol}`;
    if (d.eventType !== undefined) text += `event: ${d.eventType}${eol}`;
    if (d.id !== undefined) text += `id: ${d.id}${eol}`;
    const chars = [...payload];
    const cuts = [...new Set(d.dataCuts.map((c) => c % (chars.length + 1)))].sort((a, b) => a - b);
    const parts: string[] = [];
    let from = 0;
    for (const cut of [...cuts, chars.length]) {
      parts.push(chars.slice(from, cut).join(''));
      from = cut;
    }
    for (const part of parts) text += (d.noSpace && !part.startsWith(' ') ? `data:${part}` : `data: ${part}`) + eol;
    text += eol;
    const type = d.eventType === undefined || d.eventType === '' ? 'message' : d.eventType;
    expected.push({ type, data: parts.join('\n'), id: d.id?.includes('\u0000') ? undefined : d.id });
  });
  // A CR line end followed by the tail's LF would merge into one CRLF; keep the tail in the stream's own style.
  text += spec.tail.replace(/\n/g, eol);
  return { bytes: Buffer.from(text, 'utf8'), expected };
}

// Bytes chosen to hit the grammar's corners: field names and their prefixes, colons, spaces, every line end,
// BOM bytes, NUL, whole and partial UTF-8 sequences.
const soupToken = fc.constantFrom(
  ...['data', 'data:', 'data: ', 'event:', 'id:', 'retry:', ':', ' ', 'x', '{"a":"é"}', '\n', '\r', '\r\n', '\n\n', '\uFEFF', '\u0000', '中', '🎉'].map(
    (s) => Buffer.from(s, 'utf8'),
  ),
  Buffer.from([0xef, 0xbb]),
  Buffer.from([0xf0, 0x9f]),
  Buffer.from([0xc3]),
);
const soupArb = fc.array(soupToken, { maxLength: 60 }).map((tokens) => Buffer.concat(tokens));

// ---------------------------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------------------------

describe('framer properties', () => {
  it('a vLLM stream in any dialect gives its events, under any chunking, as the reference says', () => {
    fc.assert(
      fc.property(dialectStreamArb, chunkingArb, (spec, chunking) => {
        const { bytes, expected } = renderDialect(spec);
        const whole = frame([bytes]);
        expect(whole.blocks.map((b) => b.event)).toEqual(expected);
        expect(whole.failed).toBe(false);
        expectMatchesReference(bytes, whole, true);
        expect(frame(rechunk(bytes, chunking))).toEqual(whole);
      }),
      { numRuns: 300 },
    );
  });

  it('any byte soup gives the same outcome under any chunking, and the reference events', () => {
    fc.assert(
      fc.property(soupArb, chunkingArb, (bytes, chunking) => {
        const whole = frame([bytes]);
        expectMatchesReference(bytes, whole, false);
        expect(frame(rechunk(bytes, chunking))).toEqual(whole);
      }),
      { numRuns: 1000 },
    );
  });

  it('valid UTF-8 soup: raw blocks and trailing bytes match the reference too', () => {
    const validSoup = soupArb.filter((b) => Buffer.from(b.toString('utf8'), 'utf8').equals(b));
    fc.assert(
      fc.property(validSoup, (bytes) => expectMatchesReference(bytes, frame([bytes]), true)),
      { numRuns: 500 },
    );
  });

  it('oversize: the same blocks are dispatched before the failure, under any chunking', () => {
    fc.assert(
      fc.property(fc.oneof(dialectStreamArb.map((s) => renderDialect(s).bytes), soupArb), chunkingArb, fc.integer({ min: 1, max: 400 }), (bytes, chunking, max) => {
        const whole = frame([bytes], max);
        expect(frame(rechunk(bytes, chunking), max)).toEqual(whole);
        const unlimited = frame([bytes]);
        const blockTooBig = unlimited.blocks.some((b) => b.raw.length > max) || unlimited.trailing > max;
        expect(whole.failed).toBe(blockTooBig);
        // Up to the failure, the limited framer saw exactly what an unlimited one sees.
        expect(unlimited.blocks.slice(0, whole.blocks.length)).toEqual(whole.blocks);
      }),
      { numRuns: 500 },
    );
  });
});
