/**
 * The simulator's /v1/audio/transcriptions and /v1/audio/translations over real sockets, no gateway, against what
 * vLLM@52a31cce writes there (docs/simulator.md): the non-streaming body per response_format, the transcription.chunk
 * stream that always ends with [DONE], every refusal's status, body and connection handling, and the fault header.
 * The multipart bodies are built by undici's own FormData encoder (a Request's body), never by the simulator's parser.
 */
import { describe, expect, it } from 'vitest';
import type { SimOptions } from '../src/sim/server.js';
import { sendKeptAlive as send, type Reply, type Send } from './helpers/one-request.js';
import { nextEnd } from './helpers/sim-records.js';
import { useSimulators } from './helpers/simulators.js';

// ---- harness ----

const FAST: Partial<SimOptions> = { ttftMs: 2, itlMs: 1, jitter: 0, outputTokens: 4, prefillMsPer1kTokens: 0 };
const start = useSimulators(FAST);

type FieldValue = string | Blob;

interface Form {
  body: Buffer;
  contentType: string;
}

/** The bytes and content type undici's FormData encoding gives (what fetch would send). */
async function encode(fields: Record<string, FieldValue>): Promise<Form> {
  const data = new FormData();
  for (const [name, value] of Object.entries(fields)) {
    if (typeof value === 'string') data.append(name, value);
    else data.append(name, value, 'clip.wav');
  }
  const request = new Request('http://form.invalid/', { method: 'POST', body: data });
  return { body: Buffer.from(await request.arrayBuffer()), contentType: request.headers.get('content-type') ?? '' };
}

/** `bytes` of silence: 16 kHz 16-bit mono PCM, 32 000 bytes a second, as the simulator decodes it. */
function audio(bytes: number): Blob {
  return new Blob([new Uint8Array(bytes)], { type: 'audio/wav' });
}

async function post(url: string, path: string, fields: Record<string, FieldValue>, options: Omit<Send, 'form'> = {}): Promise<Reply> {
  return send(url, path, { ...options, form: await encode(fields) });
}

/** `data:` payloads of an LF-framed stream. */
function dataOf(text: string): string[] {
  const complete = text.endsWith('\n\n') ? text.slice(0, -2) : text.slice(0, text.lastIndexOf('\n\n'));
  if (complete === '') return [];
  return complete.split('\n\n').map((block) => {
    expect(block.startsWith('data: '), block).toBe(true);
    return block.slice('data: '.length);
  });
}

function errorJson(reply: Reply): { message: string; type: string; param: string | null; code: number } {
  return (JSON.parse(reply.text) as { error: { message: string; type: string; param: string | null; code: number } }).error;
}

const TRANSCRIPTIONS = '/v1/audio/transcriptions';
const TRANSLATIONS = '/v1/audio/translations';
/** The word list's first four tokens: the text of a 4-token answer. */
const TEXT = 'Hello world, héllo';
const DELTAS = ['Hello', ' world', ',', ' héllo'];
/** 1.5 s of audio: usage says 2 seconds; Whisper's prompt is 4 decoder tokens + 150 audio tokens (one per 10 ms). */
const CLIP_BYTES = 48_000;
const CLIP_PROMPT_TOKENS = 4 + 150;

// ---- non-streaming ----

describe('non-streaming answers', () => {
  it('json: the text and the audio duration in whole seconds, rounded up', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    const reply = await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES), model: 'sim-model' }, { headers: { 'x-request-id': 'req-1' } });
    expect(reply.status).toBe(200);
    expect(reply.headers['content-type']).toBe('application/json');
    expect(reply.text).toBe(`{"text":"${TEXT}","usage":{"type":"duration","seconds":2}}`);
    const record = await ended;
    expect(record).toMatchObject({
      route: 'transcriptions',
      path: TRANSCRIPTIONS,
      requestId: 'req-1',
      model: 'sim-model',
      stream: false,
      end: 'completed',
      status: 200,
      completionTokensSent: 4,
      promptTokens: CLIP_PROMPT_TOKENS,
    });
  });

  it('rounds usage seconds up from the file size at 32 000 bytes a second', async () => {
    const { url } = await start();
    for (const [bytes, seconds] of [[32_000, 1], [32_001, 2], [1, 1], [320_000, 10]] as const) {
      const reply = await post(url, TRANSCRIPTIONS, { file: audio(bytes) });
      expect(JSON.parse(reply.text)).toEqual({ text: TEXT, usage: { type: 'duration', seconds } });
    }
  });

  it('text: still the JSON body, not text/plain', async () => {
    const { url } = await start();
    const reply = await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES), response_format: 'text' });
    expect(reply.status).toBe(200);
    expect(reply.headers['content-type']).toBe('application/json');
    expect(reply.text).toBe(`{"text":"${TEXT}","usage":{"type":"duration","seconds":2}}`);
  });

  it('verbose_json: duration (a string), language, text, segments and words, no usage', async () => {
    const { url } = await start();
    const reply = await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES), response_format: 'verbose_json', language: 'de', temperature: '0.2' });
    expect(reply.status).toBe(200);
    const body = JSON.parse(reply.text) as Record<string, unknown>;
    expect(Object.keys(body)).toEqual(['duration', 'language', 'text', 'segments', 'words']);
    expect(body).toMatchObject({ duration: '1.5', language: 'de', text: TEXT, words: null });
    const segments = body.segments as Record<string, unknown>[];
    expect(segments).toHaveLength(1);
    expect(Object.keys(segments[0] ?? {})).toEqual([
      'id', 'avg_logprob', 'compression_ratio', 'end', 'no_speech_prob', 'seek', 'start', 'temperature', 'text', 'tokens',
    ]);
    expect(segments[0]).toMatchObject({ id: 0, no_speech_prob: null, seek: 0, start: 0, end: 1.5, temperature: 0.2, text: TEXT });
    expect(segments[0]?.tokens).toHaveLength(4);
    // Python floats: `"start":0.0`.
    expect(reply.text).toContain('"start":0.0,');
  });

  it('verbose_json without a language says en', async () => {
    const { url } = await start();
    const reply = await post(url, TRANSCRIPTIONS, { file: audio(64_000), response_format: 'verbose_json' });
    expect(JSON.parse(reply.text)).toMatchObject({ duration: '2.0', language: 'en' });
  });

  it('waits for the whole answer: TTFT, the prefill of the audio tokens, and one ITL per further token', async () => {
    // 10 s of audio = 1000 audio tokens + 4: at 200 ms per 1 000 tokens, 201 ms of prefill.
    const { url } = await start({ ttftMs: 0, itlMs: 0, prefillMsPer1kTokens: 200 });
    const reply = await post(url, TRANSCRIPTIONS, { file: audio(320_000) });
    expect(reply.status).toBe(200);
    expect(reply.firstByteMs).toBeGreaterThanOrEqual(190);
  });
});

describe('translations', () => {
  it('json and text: only the text, no usage', async () => {
    const { sim, url } = await start();
    for (const format of ['json', 'text']) {
      const reply = await post(url, TRANSLATIONS, { file: audio(CLIP_BYTES), response_format: format });
      expect(reply.status).toBe(200);
      expect(reply.text).toBe(`{"text":"${TEXT}"}`);
    }
    expect(sim.stats().byRoute).toMatchObject({ translations: 2, transcriptions: 0 });
    expect(sim.stats().recent.map((r) => r.route)).toEqual(['translations', 'translations']);
  });

  it('verbose_json: duration is a number here', async () => {
    const { url } = await start();
    const reply = await post(url, TRANSLATIONS, { file: audio(CLIP_BYTES), response_format: 'verbose_json' });
    expect(reply.text.startsWith('{"duration":1.5,"language":"en",')).toBe(true);
  });

  it('streams translation.chunk events with translate- ids', async () => {
    const { url } = await start();
    const reply = await post(url, TRANSLATIONS, { file: audio(CLIP_BYTES), stream: 'true' }, { headers: { 'x-request-id': 'abc' } });
    const data = dataOf(reply.text);
    expect(data.at(-1)).toBe('[DONE]');
    const first = JSON.parse(data[0] ?? '') as Record<string, unknown>;
    expect(first).toMatchObject({ id: 'translate-abc', object: 'translation.chunk', model: 'sim-model' });
  });
});

// ---- streaming ----

describe('streaming', () => {
  it('one chunk per output event, the finish chunk, the usage chunk, then [DONE]', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    const reply = await post(
      url,
      TRANSCRIPTIONS,
      { file: audio(CLIP_BYTES), stream: 'true', stream_include_usage: 'true', prompt: 'Hello there' },
      { headers: { 'x-request-id': 'req-s' } },
    );
    expect(reply.status).toBe(200);
    expect(reply.headers['content-type']).toBe('text/event-stream; charset=utf-8');
    expect(reply.complete).toBe(true);
    const data = dataOf(reply.text);
    expect(data).toHaveLength(DELTAS.length + 2);
    expect(data.at(-1)).toBe('[DONE]');
    const chunks = data.slice(0, -1).map((d) => JSON.parse(d) as Record<string, unknown>);
    const created = chunks[0]?.created as number;
    expect(Math.abs(created - Date.now() / 1000)).toBeLessThan(5);
    const head = `{"id":"transcribe-req-s","object":"transcription.chunk","created":${created},"model":"sim-model","choices":[`;
    DELTAS.forEach((delta, i) => {
      const finish = i === DELTAS.length - 1 ? ',"finish_reason":"stop","stop_reason":null' : '';
      expect(data[i]).toBe(`${head}{"delta":{"content":"${delta}"}${finish}}]}`);
    });
    // Prompt: 4 decoder tokens, <|prev|> and ceil(11 / 4) = 3 for the prompt, 150 audio tokens.
    const prompt = 4 + 1 + 3 + 150;
    expect(data[DELTAS.length]).toBe(`${head}],"usage":{"prompt_tokens":${prompt},"total_tokens":${prompt + 4},"completion_tokens":4}}`);
    const record = await ended;
    expect(record).toMatchObject({ stream: true, includeUsage: true, end: 'completed', outputEventsSent: 4, completionTokensSent: 4, promptTokens: prompt });
    expect(sim.stats().tokens).toEqual({ prompt, completion: 4 });
  });

  it('without stream_include_usage: no usage chunk, [DONE] all the same', async () => {
    const { url } = await start();
    const reply = await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES), stream: 'true' });
    const data = dataOf(reply.text);
    expect(data).toHaveLength(DELTAS.length + 1);
    expect(data.at(-1)).toBe('[DONE]');
    expect(reply.text).not.toContain('usage');
  });

  it('forceIncludeUsage sends the usage chunk unasked; no_usage suppresses it', async () => {
    const { url } = await start({ forceIncludeUsage: true });
    const forced = dataOf((await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES), stream: 'true' })).text);
    expect(forced.at(-2)).toContain('"choices":[],"usage":{"prompt_tokens":154,');
    const suppressed = await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES), stream: 'true' }, { headers: { 'x-sim-fault': 'no_usage' } });
    expect(suppressed.text).not.toContain('usage');
    expect(dataOf(suppressed.text).at(-1)).toBe('[DONE]');
  });

  it('stream_continuous_usage_stats puts the usage so far on every chunk', async () => {
    const { url } = await start();
    const reply = await post(url, TRANSCRIPTIONS, {
      file: audio(CLIP_BYTES),
      stream: 'true',
      stream_include_usage: 'true',
      stream_continuous_usage_stats: 'true',
    });
    const chunks = dataOf(reply.text).slice(0, -1).map((d) => JSON.parse(d) as { choices: unknown[]; usage?: { completion_tokens: number; total_tokens: number } });
    expect(chunks.map((c) => c.usage?.completion_tokens)).toEqual([1, 2, 3, 4, 4]);
    expect(chunks.map((c) => c.usage?.total_tokens)).toEqual([155, 156, 157, 158, 158]);
    expect(chunks.at(-1)?.choices).toEqual([]);
  });

  it('answers with the requested served model, or the first one when none is given', async () => {
    const { url } = await start({ models: ['whisper-a', 'whisper-b'] });
    const named = dataOf((await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES), stream: 'true', model: 'whisper-b' })).text);
    expect(JSON.parse(named[0] ?? '')).toMatchObject({ model: 'whisper-b' });
    const unnamed = dataOf((await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES), stream: 'true' })).text);
    expect(JSON.parse(unnamed[0] ?? '')).toMatchObject({ model: 'whisper-a' });
  });

  it('max_completion_tokens caps the answer: finish_reason length', async () => {
    const { url } = await start();
    const data = dataOf((await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES), stream: 'true', max_completion_tokens: '2' })).text);
    expect(data).toHaveLength(3);
    expect(data[1]).toContain('"finish_reason":"length","stop_reason":null');
  });

  it('stream=false with a stream option that is set is a non-streaming answer (the check tests raw truthiness)', async () => {
    const { url } = await start();
    const reply = await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES), stream: 'false', stream_include_usage: 'true' });
    expect(reply.status).toBe(200);
    expect(reply.text).toBe(`{"text":"${TEXT}","usage":{"type":"duration","seconds":2}}`);
  });
});

// ---- refusals ----

describe('refusals', () => {
  it('file sent as a plain string: 422, the only one in vLLM (transcriptions); a 400 on translations', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    const reply = await post(url, TRANSCRIPTIONS, { file: 'not a file', stream: 'true' }, { watchClose: true });
    expect(reply.status).toBe(422);
    expect(reply.text).toBe(`{"error":{"message":"Expected 'file' to be a file-like object, not 'str'.","type":"Unprocessable Entity","param":null,"code":422}}`);
    expect(reply.closed).toBe(false);
    expect(await ended).toMatchObject({ route: 'transcriptions', end: 'rejected', status: 422, promptTokens: null });

    const translation = await post(url, TRANSLATIONS, { file: 'not a file' });
    expect(translation.status).toBe(400);
    expect(errorJson(translation)).toMatchObject({ type: 'Bad Request', param: null, code: 400 });
  });

  it('a urlencoded body has no file part: 422 too', async () => {
    const { url } = await start();
    const reply = await send(url, TRANSCRIPTIONS, { raw: { body: 'file=abc&model=sim-model', contentType: 'application/x-www-form-urlencoded' } });
    expect(reply.status).toBe(422);
  });

  it('stream options without stream: 400 naming the option, even when the option says false', async () => {
    const { url } = await start();
    for (const [option, value] of [['stream_include_usage', 'true'], ['stream_continuous_usage_stats', 'true'], ['stream_include_usage', 'false']]) {
      const reply = await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES), [option as string]: value as string }, { watchClose: true });
      expect(reply.status).toBe(400);
      expect(errorJson(reply)).toEqual({ message: 'Stream options can only be defined when `stream=True`.', type: 'Bad Request', param: option, code: 400 });
      expect(reply.closed).toBe(false);
    }
  });

  it('a missing file, a bad field, a body that is not a form, a malformed multipart body: 400 Bad Request', async () => {
    const { url } = await start();
    const missing = await post(url, TRANSCRIPTIONS, { model: 'sim-model' });
    expect(missing.status).toBe(400);
    expect(errorJson(missing)).toMatchObject({ type: 'Bad Request', param: null });
    const format = await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES), response_format: 'xml' });
    expect(format.status).toBe(400);
    expect(errorJson(format).type).toBe('Bad Request');
    const stream = await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES), stream: 'maybe' });
    expect(stream.status).toBe(400);
    const json = await send(url, TRANSCRIPTIONS, { raw: { body: '{"file":"x"}', contentType: 'application/json' } });
    expect(json.status).toBe(400);
    expect(errorJson(json).message).toContain('file');
    const broken = await send(url, TRANSCRIPTIONS, { raw: { body: '--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nabc', contentType: 'multipart/form-data; boundary=xyz' } });
    expect(broken.status).toBe(400);
    expect(errorJson(broken)).toEqual({ message: 'There was an error parsing the body', type: 'Bad Request', param: null, code: 400 });
  });

  it('srt and vtt: 400 BadRequestError, returned (the connection stays open)', async () => {
    const { url } = await start();
    for (const format of ['srt', 'vtt']) {
      const reply = await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES), response_format: format }, { watchClose: true });
      expect(reply.status).toBe(400);
      expect(errorJson(reply)).toEqual({
        message: 'Currently only support response_format: `text`, `json` or `verbose_json`',
        type: 'BadRequestError',
        param: null,
        code: 400,
      });
      expect(reply.closed).toBe(false);
    }
  });

  it('verbose_json with stream: 400', async () => {
    const { url } = await start();
    const reply = await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES), response_format: 'verbose_json', stream: 'true' });
    expect(reply.status).toBe(400);
    expect(errorJson(reply)).toEqual({ message: "verbose_json format doesn't support streaming case", type: 'BadRequestError', param: null, code: 400 });
  });

  it('unknown model: 404 like the other routes', async () => {
    const { url } = await start();
    const reply = await post(url, TRANSLATIONS, { file: audio(CLIP_BYTES), model: 'whisper-xl' }, { watchClose: true });
    expect(reply.status).toBe(404);
    expect(errorJson(reply)).toEqual({ message: 'The model `whisper-xl` does not exist.', type: 'NotFoundError', param: 'model', code: 404 });
    expect(reply.closed).toBe(false);
  });

  it('a file over 25 MB: 400 audio_filesize_mb, raised (the connection is closed after it); 25 MB exactly is fine', async () => {
    const { sim, url } = await start();
    const limit = 25 * 1024 * 1024;
    const ended = nextEnd(sim);
    const over = await post(url, TRANSCRIPTIONS, { file: audio(limit + 1) }, { watchClose: true });
    expect(over.status).toBe(400);
    expect(errorJson(over)).toEqual({ message: 'Maximum file size exceeded', type: 'BadRequestError', param: 'audio_filesize_mb', code: 400 });
    expect(over.headers.connection).not.toBe('close');
    expect(over.closed).toBe(true);
    expect(await ended).toMatchObject({ end: 'rejected', status: 400 });

    const at = await post(url, TRANSCRIPTIONS, { file: audio(limit) });
    expect(at.status).toBe(200);
    expect(JSON.parse(at.text)).toMatchObject({ usage: { seconds: Math.ceil(limit / 32_000) } });
  });

  it('an empty file part cannot be decoded: 400 "Invalid or unsupported audio file.", raised', async () => {
    const { url } = await start();
    const reply = await post(url, TRANSCRIPTIONS, { file: audio(0) }, { watchClose: true });
    expect(reply.status).toBe(400);
    expect(errorJson(reply)).toEqual({ message: 'Invalid or unsupported audio file.', type: 'BadRequestError', param: null, code: 400 });
    expect(reply.closed).toBe(true);
  });

  it('the route checks before the form: wrong method 405, missing key 401; a dead engine is a 500', async () => {
    const { sim, url } = await start({ apiKey: 'k' });
    const get = await send(url, TRANSCRIPTIONS, { method: 'GET' });
    expect(get.status).toBe(405);
    expect(get.headers.allow).toBe('POST');
    const unauthorized = await post(url, TRANSLATIONS, { file: audio(CLIP_BYTES) });
    expect(unauthorized.status).toBe(401);
    expect(unauthorized.text).toBe('{"error":"Unauthorized"}');
    sim.setEngineDead(true);
    const dead = await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES) }, { headers: { authorization: 'Bearer k' } });
    expect(dead.status).toBe(500);
    expect(dead.headers.connection).toBe('close');
  });

  it('a bad x-sim-fault header: 400 naming it', async () => {
    const { url } = await start();
    const reply = await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES) }, { headers: { 'x-sim-fault': 'explode' } });
    expect(reply.status).toBe(400);
    expect(errorJson(reply).param).toBe('x-sim-fault');
  });
});

// ---- faults ----

describe('faults', () => {
  const STREAM = { file: audio(CLIP_BYTES), stream: 'true', stream_include_usage: 'true' };

  it('error_after: the chunks so far, an error event (Python json.dumps), then [DONE]; no finish, no usage', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    const reply = await post(url, TRANSCRIPTIONS, STREAM, { headers: { 'x-sim-fault': 'error_after=2; error_code=503' } });
    expect(reply.status).toBe(200);
    expect(reply.complete).toBe(true);
    const data = dataOf(reply.text);
    expect(data).toHaveLength(4);
    expect(data.slice(0, 2).map((d) => (JSON.parse(d) as { choices: { delta: { content: string } }[] }).choices[0]?.delta.content)).toEqual(DELTAS.slice(0, 2));
    expect(data[2]).toBe('{"error": {"message": "Service Unavailable", "type": "ServiceUnavailableError", "param": null, "code": 503}}');
    expect(data[3]).toBe('[DONE]');
    expect(await ended).toMatchObject({ fault: 'error_after', end: 'fault', status: 200, outputEventsSent: 2 });
    expect(sim.stats().faultsInjected.error_after).toBe(1);
  });

  it('error_before_output: the error event and [DONE], nothing else', async () => {
    const { url } = await start();
    const reply = await post(url, TRANSCRIPTIONS, STREAM, { headers: { 'x-sim-fault': 'error_before_output' } });
    expect(dataOf(reply.text)).toEqual([
      '{"error": {"message": "Token id 151936 is out of vocabulary", "type": "BadRequestError", "param": null, "code": 400}}',
      '[DONE]',
    ]);
  });

  it('reset_after: the chunks so far, then a reset with no terminator', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    const reply = await post(url, TRANSCRIPTIONS, STREAM, { headers: { 'x-sim-fault': 'reset_after=2' } });
    expect(reply.status).toBe(200);
    expect(reply.complete).toBe(false);
    expect(reply.error).not.toBeNull();
    expect(dataOf(reply.text)).toHaveLength(2);
    expect(await ended).toMatchObject({ fault: 'reset_after', end: 'fault' });
  });

  it('stall_after: nothing more after k chunks until the client leaves (a client disconnect)', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    // 4 tokens at 1 ms would be long done in 200 ms; the stall holds the stream after the first.
    const reply = await post(url, TRANSCRIPTIONS, STREAM, { headers: { 'x-sim-fault': 'stall_after=1' }, leaveAfterMs: 200 });
    expect(reply.status).toBe(200);
    expect(reply.complete).toBe(false);
    expect(dataOf(reply.text)).toEqual([expect.stringContaining('"content":"Hello"') as unknown as string]);
    expect(await ended).toMatchObject({ fault: 'stall_after', end: 'client_disconnect', outputEventsSent: 1 });
    expect(sim.stats().clientDisconnects).toBe(1);
  });

  it('no_done and drop_finish: a complete answer without [DONE]; without the finish chunk', async () => {
    const { url } = await start();
    const noDone = dataOf((await post(url, TRANSCRIPTIONS, STREAM, { headers: { 'x-sim-fault': 'no_done' } })).text);
    expect(noDone).toHaveLength(DELTAS.length + 1);
    expect(noDone).not.toContain('[DONE]');
    const dropped = dataOf((await post(url, TRANSCRIPTIONS, STREAM, { headers: { 'x-sim-fault': 'drop_finish' } })).text);
    expect(dropped.at(-1)).toBe('[DONE]');
    expect(dropped.join('\n')).not.toContain('finish_reason');
  });

  it('non-streaming: status, error_after, reset_after and reset_before_response', async () => {
    const { url } = await start();
    const file = { file: audio(CLIP_BYTES) };
    const status = await post(url, TRANSCRIPTIONS, file, { headers: { 'x-sim-fault': 'status=503' } });
    expect(status.status).toBe(503);
    expect(status.text).toBe('{"error":"Service Unavailable"}');
    const error = await post(url, TRANSLATIONS, file, { headers: { 'x-sim-fault': 'error_after=1; error_code=502' } });
    expect(error.status).toBe(502);
    expect(errorJson(error)).toMatchObject({ type: 'BadGatewayError', code: 502 });
    const reset = await post(url, TRANSCRIPTIONS, file, { headers: { 'x-sim-fault': 'reset_after=1' } });
    expect(reset.status).toBe(0);
    expect(reset.error).not.toBeNull();
    const early = await post(url, TRANSCRIPTIONS, file, { headers: { 'x-sim-fault': 'reset_before_response' } });
    expect(early.status).toBe(0);
    expect(early.error).not.toBeNull();
  });

  it('random faults reach these routes too', async () => {
    const { sim, url } = await start({ faultRate: 1, faultKinds: ['status'] });
    const reply = await post(url, TRANSCRIPTIONS, { file: audio(CLIP_BYTES) });
    expect([500, 503]).toContain(reply.status);
    expect(sim.stats().faultsInjected.status).toBe(1);
  });
});
