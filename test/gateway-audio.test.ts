/**
 * vLLM's speech-to-text routes through the gateway, against the simulator, over real sockets: a multipart upload
 * routed by its `model` field and forwarded byte for byte; the non-stream answer (usage in seconds, never counted as
 * tokens); the stream, judged like a one-choice chat stream (delivered at its finish and `[DONE]`, an error event
 * forwarded and counted, a cut stream ended with Waybill's own error event); and the gateway's own refusals.
 * The forms are encoded by undici's FormData, so the test shares no code with either parser.
 */
import { FormData, request } from 'undici';
import { describe, expect, it } from 'vitest';
import { useCleanups } from './helpers/cleanups.js';
import { settledAfter } from './helpers/settle.js';
import { eventData, startStack, type Stack } from './helpers/stack.js';

const cleanups = useCleanups();

async function stack(config: Record<string, unknown> = {}): Promise<Stack> {
  const s = await startStack({ config: { retries: { max_attempts: 1 }, timeouts: { idle: '200ms' }, ...config } });
  cleanups.push(() => s.close());
  return s;
}

/** 1.5 s of "audio" at the simulator's 32,000 bytes per second. */
const AUDIO = new Uint8Array(48_000).fill(7);

function form(fields: Record<string, string>, file: Uint8Array | null = AUDIO): FormData {
  const data = new FormData();
  if (file !== null) data.append('file', new Blob([file], { type: 'audio/wav' }), 'clip.wav');
  for (const [name, value] of Object.entries(fields)) data.append(name, value);
  return data;
}

async function send(s: Stack, path: string, body: FormData | string, headers: Record<string, string> = {}) {
  const response = await request(`${s.base}${path}`, { method: 'POST', body, headers });
  return { status: response.statusCode, headers: response.headers, body: await response.body.text() };
}

describe('/v1/audio/transcriptions and /translations', () => {
  it('a non-stream transcription is delivered; its usage is seconds of audio, not tokens, and is not counted', async () => {
    const s = await stack();
    const answer = await send(s, '/v1/audio/transcriptions', form({ model: 'sim-model' }));
    expect(answer.status).toBe(200);
    const body = JSON.parse(answer.body) as { text: string; usage: { type: string; seconds: number } };
    expect(body.usage).toEqual({ type: 'duration', seconds: 2 });
    expect(body.text.length).toBeGreaterThan(0);
    const settled = await settledAfter(s, 1);
    expect(settled).toMatchObject({ route: 'transcriptions', stream: false, outcome: 'delivered', finishReasons: ['stop'], usage: undefined, accepted: true });
    expect(await s.metric('waybill_requests_total', { route: 'transcriptions', stream: 'false', code: '200', outcome: 'delivered' })).toBe(1);
    expect(await s.metric('waybill_prompt_tokens_total')).toBe(0);
    expect(await s.metric('waybill_usage_missing_total')).toBe(0);
    // The upload reached the simulator whole: it derived the audio length from the file's bytes.
    expect(s.sims[0]?.stats().byRoute['transcriptions']).toBe(1);
  });

  it('a translation is routed by the form when `model` is left out (one model served)', async () => {
    const s = await stack();
    const answer = await send(s, '/v1/audio/translations', form({}));
    expect(answer.status).toBe(200);
    expect(JSON.parse(answer.body)).toHaveProperty('text');
    expect(await settledAfter(s, 1)).toMatchObject({ route: 'translations', model: 'sim-model', outcome: 'delivered' });
  });

  it('a stream is judged like a one-choice chat stream: TTFT, finish, [DONE]; its token usage counted when asked', async () => {
    const s = await stack();
    const answer = await send(s, '/v1/audio/transcriptions', form({ model: 'sim-model', stream: 'true', stream_include_usage: 'true' }));
    expect(answer.status).toBe(200);
    const events = eventData(answer.body);
    expect(events.at(-1)).toBe('[DONE]');
    const settled = await settledAfter(s, 1);
    expect(settled).toMatchObject({ route: 'transcriptions', stream: true, outcome: 'delivered', finishReasons: ['stop'] });
    expect(settled.ttftMs).toBeDefined();
    // Whisper's prompt: 4 decoder tokens + one audio token per 10 ms (1.5 s → 150).
    expect(settled.usage).toMatchObject({ promptTokens: 154, completionTokens: 8 });
    expect(await s.metric('waybill_prompt_tokens_total')).toBe(154);
  });

  it('an error event mid-stream is forwarded and counted stream_error; a cut stream gets Waybill’s error event', async () => {
    const s = await stack();
    const failed = await send(s, '/v1/audio/transcriptions', form({ model: 'sim-model', stream: 'true' }), { 'x-sim-fault': 'error_after=3' });
    expect(failed.status).toBe(200);
    const errorEvent = JSON.parse(eventData(failed.body).find((data) => data.includes('"error"')) ?? '{}') as { error?: { code?: unknown } };
    expect(errorEvent.error).toBeDefined();
    expect(await settledAfter(s, 1)).toMatchObject({ route: 'transcriptions', outcome: 'stream_error', code: 200 });

    const cut = await send(s, '/v1/audio/transcriptions', form({ model: 'sim-model', stream: 'true' }), { 'x-sim-fault': 'reset_after=3' });
    const last = JSON.parse(eventData(cut.body).at(-1) ?? '{}') as { error?: { code?: string } };
    expect(last.error?.code).toBe('stream_truncated');
    expect(await settledAfter(s, 2)).toMatchObject({ outcome: 'incomplete' });
    expect(await s.metric('waybill_requests_total', { route: 'transcriptions', stream: 'true', code: '200' })).toBe(2);
  });

  it('a failure before output gets a real status, and vLLM’s refusals are relayed with theirs', async () => {
    const s = await stack();
    const before = await send(s, '/v1/audio/transcriptions', form({ model: 'sim-model', stream: 'true' }), { 'x-sim-fault': 'reset_after=0' });
    expect(before.status).toBe(502);
    const empty = await send(s, '/v1/audio/transcriptions', form({ model: 'sim-model' }, new Uint8Array(0)));
    expect(empty.status).toBe(400);
    expect(JSON.parse(empty.body)).toMatchObject({ error: { message: 'Invalid or unsupported audio file.' } });
    await s.settled(2);
    expect(await s.metric('waybill_requests_total', { route: 'transcriptions', code: '502', outcome: 'failed' })).toBe(1);
    expect(await s.metric('waybill_requests_total', { route: 'transcriptions', code: '400', outcome: 'rejected' })).toBe(1);
  });

  it('hostile forms: a file part with no closing boundary is a 400, a form on a JSON route is refused unread; the gateway lives on', async () => {
    const s = await stack({ server: { host: '127.0.0.1', port: 0, body_limit_bytes: 1024 } });
    const cut = '--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF....';
    const refused = await send(s, '/v1/audio/transcriptions', cut, { 'content-type': 'multipart/form-data; boundary=XyZ' });
    expect(refused.status).toBe(400);
    // 5 MB of form to a JSON route: 415 without buffering it under the upload limit (the JSON limit is 1 KiB).
    const big = `--XyZ\r\nContent-Disposition: form-data; name="model"\r\n\r\n${'x'.repeat(5_000_000)}\r\n--XyZ--\r\n`;
    const onChat = await send(s, '/v1/chat/completions', big, { 'content-type': 'multipart/form-data; boundary=XyZ' }).catch(() => ({ status: 415 }));
    expect(onChat.status).toBe(415);
    expect((await send(s, '/v1/audio/transcriptions', form({ model: 'sim-model' }))).status).toBe(200);
    await s.settled(3);
    expect(await s.metric('waybill_requests_total', { route: 'transcriptions', code: '400' })).toBe(1);
    expect(await s.metric('waybill_requests_total', { route: 'chat_completions', code: '415' })).toBe(1);
  });

  it('a repeated field counts by its last value, as vLLM reads it', async () => {
    const s = await stack();
    const data = form({ model: 'nope' });
    data.append('model', 'sim-model');
    data.append('stream', 'false');
    data.append('stream', 'true');
    const answer = await send(s, '/v1/audio/transcriptions', data);
    expect(answer.status).toBe(200);
    expect(await settledAfter(s, 1)).toMatchObject({ model: 'sim-model', stream: true, outcome: 'delivered' });
  });

  it('a client that leaves mid-stream is counted client_cancelled, and the upstream sees the disconnect', async () => {
    const s = await stack({ timeouts: { idle: '30s' } });
    const ended = s.simEnded();
    const controller = new AbortController();
    const response = await request(`${s.base}/v1/audio/transcriptions`, {
      method: 'POST',
      body: form({ model: 'sim-model', stream: 'true' }),
      headers: { 'x-sim-fault': 'stall_after=2' },
      signal: controller.signal,
    });
    expect(response.statusCode).toBe(200);
    // Leave on the first content the gateway relayed (the simulator then holds the stream open).
    let received = '';
    for await (const piece of response.body) {
      received += String(piece);
      if (received.includes('"content"')) break;
    }
    controller.abort();
    expect(await ended).toMatchObject({ route: 'transcriptions', end: 'client_disconnect' });
    expect(await settledAfter(s, 1)).toMatchObject({ route: 'transcriptions', outcome: 'client_cancelled', cancelPhase: 'streaming' });
    expect(await s.metric('waybill_client_cancellations_total', { phase: 'streaming' })).toBe(1);
  });

  it('the gateway’s own refusals: JSON instead of a form (415), an unknown model (404), a bad `stream` (400), an upload over server.max_upload_bytes (413)', async () => {
    const s = await stack({ server: { host: '127.0.0.1', port: 0, max_upload_bytes: 100_000 } });
    const json = await send(s, '/v1/audio/transcriptions', JSON.stringify({ model: 'sim-model' }), { 'content-type': 'application/json' });
    expect(json.status).toBe(415);
    const unknown = await send(s, '/v1/audio/transcriptions', form({ model: 'nope' }));
    expect(unknown.status).toBe(404);
    expect(JSON.parse(unknown.body)).toMatchObject({ error: { code: 'model_not_found' } });
    const badStream = await send(s, '/v1/audio/transcriptions', form({ model: 'sim-model', stream: 'maybe' }));
    expect(badStream.status).toBe(400);
    const big = await send(s, '/v1/audio/transcriptions', form({ model: 'sim-model' }, new Uint8Array(200_000)));
    expect(big.status).toBe(413);
    // A form on a JSON route is refused, not misread.
    const formOnChat = await send(s, '/v1/chat/completions', form({ model: 'sim-model' }));
    expect(formOnChat.status).toBe(415);
    await s.settled(5);
    expect(await s.metric('waybill_requests_total', { route: 'transcriptions', outcome: 'rejected' })).toBe(4);
    expect(s.sims[0]?.stats().byRoute['transcriptions'] ?? 0).toBe(0);
  });
});
