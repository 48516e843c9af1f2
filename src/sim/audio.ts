/**
 * vLLM's speech-to-text routes, `POST /v1/audio/transcriptions` and `POST /v1/audio/translations`, as vLLM@52a31cce
 * serves them (`vllm/entrypoints/speech_to_text/`; the facts in docs/simulator.md): the multipart form read with
 * @fastify/busboy (audio-form.ts: the file part counted, never kept), the refusals in vLLM's order, the answer's numbers, the stream
 * chunks' serializer and the non-streaming bodies. The timing, faults and stream writing are the chat route's
 * (stream.ts, nonstream.ts), driven by routes/audio.ts.
 *
 * The simulated model is a Whisper: `audio seconds = file bytes / 32 000` (16 kHz, 16-bit, mono PCM), an empty file
 * part is the one thing it cannot decode, and the prompt its usage reports is Whisper's decoder prompt plus one audio
 * token per 10 ms (the log-mel frames).
 */
import { deflateSync } from 'node:zlib';
import type { FormValue } from './audio-form.js';
import type { RequestRecord } from './stats.js';
import { pythonFloat } from './vectors.js';
import {
  choiceText,
  errorBody,
  errorInfo,
  ENGINE_DEAD_MESSAGE,
  estimateTokens,
  modelNotFoundMessage,
  tokenText,
  usageJson,
  WORDS,
  type ChunkSerializer,
  type ResponseIdentity,
  type Usage,
} from './wire.js';

export type AudioRoute = 'transcriptions' | 'translations';

export function audioRouteOf(path: string): AudioRoute | null {
  if (path === '/v1/audio/transcriptions') return 'transcriptions';
  if (path === '/v1/audio/translations') return 'translations';
  return null;
}

/** VLLM_MAX_AUDIO_CLIP_FILESIZE_MB's default, 25, in bytes: `len(audio_data) / 1024**2 > 25` is refused. */
export const MAX_AUDIO_FILE_BYTES = 25 * 1024 * 1024;
/** How the simulator "decodes": 16 kHz, 16-bit, mono PCM (a plain WAV) is 32 000 bytes a second. */
export const AUDIO_BYTES_PER_SECOND = 32_000;
/** Whisper's log-mel frames: sample rate 16 000 / hop length 160 = 100 audio tokens a second. */
const AUDIO_TOKENS_PER_SECOND = 100;
/** `<|startoftranscript|><|lang|><|transcribe or translate|><|notimestamps|>`: Whisper's decoder prompt. */
const DECODER_PROMPT_TOKENS = 4;
/** A segment's average log-probability: vLLM sums the sampled tokens'; the simulator has none to sum. */
const SEGMENT_AVG_LOGPROB = -0.25;
/** Whisper's timestamp tokens step by 20 ms. */
const TIMESTAMP_STEP_S = 0.02;

const RESPONSE_FORMATS = ['json', 'text', 'srt', 'verbose_json', 'vtt'] as const;
type ResponseFormat = (typeof RESPONSE_FORMATS)[number];

// ---- the request ----

export interface AudioRequest {
  readonly route: AudioRoute;
  /** As answered: the field, or the first served name. */
  readonly model: string;
  readonly stream: boolean;
  /** `stream_include_usage` as parsed (false when absent). */
  readonly includeUsage: boolean;
  /** `stream_continuous_usage_stats` as parsed. */
  readonly continuousUsage: boolean;
  readonly responseFormat: 'json' | 'text' | 'verbose_json';
  /** The verbose answer's `language`: the field, or `en`. */
  readonly language: string;
  readonly temperature: number;
  /** `max_completion_tokens`, or null. */
  readonly maxTokens: number | null;
  readonly fileBytes: number;
  /** bytes / 32 000. */
  readonly durationS: number;
  /** What the stream's usage reports as prompt_tokens: decoder prompt, `<|prev|>` + prompt, audio tokens. */
  readonly promptTokens: number;
}

/** How vLLM refuses: `closes` when the handler raised it (uvicorn closes the connection after the answer). */
export interface AudioRefusal {
  readonly status: number;
  readonly body: string;
  readonly closes: boolean;
}

export type AudioReadResult = { readonly ok: true; readonly request: AudioRequest } | { readonly ok: false; readonly refusal: AudioRefusal };

class Refused extends Error {
  constructor(readonly refusal: AudioRefusal) {
    super(refusal.body);
  }
}

/** FastAPI's RequestValidationError handler (vLLM's): 400, type "Bad Request", the VLLMValidationError's param. */
function invalid(message: string, param: string | null = null): Refused {
  return new Refused({ status: 400, body: errorBody({ message, type: 'Bad Request', param, code: 400 }), closes: false });
}

/** An ErrorResponse the handler returns: create_error_response's type, the connection kept. */
function returned(status: number, message: string, param: string | null = null): Refused {
  return new Refused({ status, body: errorBody(errorInfo(status, message, param)), closes: false });
}

/** An exception the handler raises: create_error_response's mapping, then uvicorn closes the connection. */
function raised(message: string, param: string | null = null): Refused {
  return new Refused({ status: 400, body: errorBody(errorInfo(400, message, param)), closes: true });
}

/** The form body FastAPI could not parse: its HTTPException(400), through vLLM's handler. */
export const FORM_PARSE_ERROR_BODY = errorBody({ message: 'There was an error parsing the body', type: 'Bad Request', param: null, code: 400 });

/** Python's truthiness of a raw form value, as the model validator sees it (absent: the field's default, False). */
function truthy(value: FormValue | undefined): boolean {
  return value !== undefined && (value.kind === 'file' || value.value !== '');
}

function stringField(values: ReadonlyMap<string, FormValue>, name: string): string | null {
  const value = values.get(name);
  if (value === undefined) return null;
  if (value.kind === 'file') throw invalid(`${name}: Input should be a valid string`);
  return value.value;
}

const TRUE_STRINGS = new Set(['1', 'on', 't', 'true', 'y', 'yes']);
const FALSE_STRINGS = new Set(['0', 'off', 'f', 'false', 'n', 'no']);

/** pydantic's lax bool from a string. */
function boolField(values: ReadonlyMap<string, FormValue>, name: string): boolean | null {
  const value = stringField(values, name);
  if (value === null) return null;
  const lower = value.toLowerCase();
  if (TRUE_STRINGS.has(lower)) return true;
  if (FALSE_STRINGS.has(lower)) return false;
  throw invalid(`${name}: Input should be a valid boolean, unable to interpret input`);
}

const FLOAT = /^\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*$/;
const INT = /^\s*[+-]?\d+\s*$/;

function floatField(values: ReadonlyMap<string, FormValue>, name: string): number | null {
  const value = stringField(values, name);
  if (value === null) return null;
  if (!FLOAT.test(value)) throw invalid(`${name}: Input should be a valid number, unable to parse string as a number`);
  return Number(value);
}

function intField(values: ReadonlyMap<string, FormValue>, name: string): number | null {
  const value = stringField(values, name);
  if (value === null) return null;
  if (!INT.test(value)) throw invalid(`${name}: Input should be a valid integer, unable to parse string as an integer`);
  return Number(value);
}

/**
 * Validate a parsed form in vLLM's order — the model validator (the 422, the stream options), the fields, the
 * serving class's checks (model, dead engine, response format, verbose + stream), then preprocessing (file size,
 * decoding) and the sampling parameters. `record` gets the model, stream and include-usage as soon as they are read.
 */
export function readAudioRequest(
  route: AudioRoute,
  values: ReadonlyMap<string, FormValue>,
  models: readonly string[],
  record: RequestRecord,
  engineDead: boolean,
): AudioReadResult {
  try {
    return { ok: true, request: parseAudioRequest(route, values, models, record, engineDead) };
  } catch (error) {
    if (error instanceof Refused) return { ok: false, refusal: error.refusal };
    throw error;
  }
}

function parseAudioRequest(
  route: AudioRoute,
  values: ReadonlyMap<string, FormValue>,
  models: readonly string[],
  record: RequestRecord,
  engineDead: boolean,
): AudioRequest {
  // The model validator (mode "before") sees the raw form: a `file` sent as a plain field is an HTTPException(422)
  // (transcriptions only; translations has no such check), and the stream options are tested for Python truthiness,
  // so `stream_include_usage=false` without `stream` is refused too.
  const file = values.get('file');
  if (route === 'transcriptions' && file?.kind === 'field') {
    throw new Refused({
      status: 422,
      body: errorBody({ message: "Expected 'file' to be a file-like object, not 'str'.", type: 'Unprocessable Entity', param: null, code: 422 }),
      closes: false,
    });
  }
  const streamOption = ['stream_include_usage', 'stream_continuous_usage_stats'].find((name) => truthy(values.get(name)));
  if (streamOption !== undefined && !truthy(values.get('stream'))) {
    throw invalid('Stream options can only be defined when `stream=True`.', streamOption);
  }

  // The fields, in the model's order.
  if (file === undefined) throw invalid('file: Field required');
  if (file.kind !== 'file') throw invalid('file: Expected UploadFile, received: <class \'str\'>');
  const modelField = stringField(values, 'model');
  record.model = modelField;
  const language = stringField(values, 'language');
  const prompt = stringField(values, 'prompt') ?? '';
  const format = stringField(values, 'response_format') ?? 'json';
  if (!(RESPONSE_FORMATS as readonly string[]).includes(format)) {
    throw invalid("response_format: Input should be 'json', 'text', 'srt', 'verbose_json' or 'vtt'");
  }
  const responseFormat = format as ResponseFormat;
  const stream = boolField(values, 'stream') ?? false;
  record.stream = stream;
  const includeUsageField = boolField(values, 'stream_include_usage');
  record.includeUsage = includeUsageField;
  const continuousUsage = boolField(values, 'stream_continuous_usage_stats') ?? false;
  const temperature = floatField(values, 'temperature') ?? 0;
  const maxTokens = intField(values, 'max_completion_tokens');

  // The serving class: unknown model (returned), dead engine (raised: 500), response format, verbose + stream.
  let model = models[0] ?? '';
  if (modelField !== null && modelField !== '') {
    if (!models.includes(modelField)) throw returned(404, modelNotFoundMessage(modelField), 'model');
    model = modelField;
  }
  if (engineDead) throw new Refused({ status: 500, body: errorBody(errorInfo(500, ENGINE_DEAD_MESSAGE)), closes: false });
  if (responseFormat === 'srt' || responseFormat === 'vtt') {
    throw returned(400, 'Currently only support response_format: `text`, `json` or `verbose_json`');
  }
  if (responseFormat === 'verbose_json' && stream) throw returned(400, "verbose_json format doesn't support streaming case");

  // Preprocessing (raised): the size limit, then decoding.
  if (file.bytes > MAX_AUDIO_FILE_BYTES) throw raised('Maximum file size exceeded', 'audio_filesize_mb');
  if (file.bytes === 0) throw raised('Invalid or unsupported audio file.');
  if (maxTokens !== null && maxTokens < 1) throw raised(`max_tokens must be at least 1, got ${maxTokens}.`, 'max_tokens');

  return {
    route,
    model,
    stream,
    includeUsage: includeUsageField === true,
    continuousUsage,
    responseFormat,
    language: language ?? 'en',
    temperature,
    maxTokens,
    fileBytes: file.bytes,
    durationS: file.bytes / AUDIO_BYTES_PER_SECOND,
    promptTokens: audioPromptTokens(file.bytes, prompt),
  };
}

/**
 * The prompt tokens vLLM's stream usage reports for Whisper: the decoder prompt (4 special tokens, plus `<|prev|>` and
 * the prompt's tokens when there is a prompt) and the audio tokens, ceil(seconds × 100).
 */
function audioPromptTokens(fileBytes: number, prompt: string): number {
  const audioTokens = Math.ceil((fileBytes * AUDIO_TOKENS_PER_SECOND) / AUDIO_BYTES_PER_SECOND);
  return DECODER_PROMPT_TOKENS + (prompt === '' ? 0 : 1 + estimateTokens(prompt.length)) + audioTokens;
}

// ---- the answer ----

/** `transcribe-<X-Request-Id | 16 hex>` / `translate-…`: vLLM's `{task_type}-{base request id}`. */
export function audioResponseId(route: AudioRoute, requestId: string): string {
  return `${route === 'transcriptions' ? 'transcribe' : 'translate'}-${requestId}`;
}

/**
 * The stream's chunks: `model_dump_json(exclude_unset=True)` — a delta chunk carries only `delta.content`, the finish
 * chunk adds `finish_reason` and `stop_reason: null`; no role chunk. `continuousUsage` (stream_continuous_usage_stats
 * with usage asked) returns the usage so far, which every content chunk then carries.
 */
export function createAudioSerializer(route: AudioRoute, identity: ResponseIdentity, continuousUsage: (() => Usage) | null): ChunkSerializer {
  const object = route === 'transcriptions' ? 'transcription.chunk' : 'translation.chunk';
  const head = `{"id":${JSON.stringify(identity.id)},"object":"${object}","created":${identity.created},"model":${JSON.stringify(identity.model)},"choices":[`;
  const tail = (): string => (continuousUsage === null ? '}' : `,"usage":${usageJson(continuousUsage())}}`);
  return {
    role: () => null,
    output: (_index, textInner, finishReason) =>
      finishReason === null
        ? `${head}{"delta":{"content":"${textInner}"}}]${tail()}`
        : `${head}{"delta":{"content":"${textInner}"},"finish_reason":${JSON.stringify(finishReason)},"stop_reason":null}]${tail()}`,
    usage: (usage) => `${head}],"usage":${usageJson(usage)}}`,
  };
}

/** The ids of a segment's tokens: each word's index in the simulator's word list. */
function tokenIds(count: number): number[] {
  return Array.from({ length: count }, (_, t) => WORDS.indexOf(tokenText(0, t)));
}

/**
 * The non-streaming body (Starlette's JSONResponse of `model_dump()`): `{"text","usage":{"type":"duration","seconds"}}`
 * for transcriptions in `json` and `text` alike (`usage` null with `no_usage`), `{"text"}` for translations, and the
 * verbose object for `verbose_json` — one segment over the whole clip, `duration` a string on transcriptions and a
 * number on translations (their models declare it so), `words` null.
 */
export function audioBody(request: AudioRequest, tokens: number, usage: boolean): string {
  const text = choiceText(0, 0, tokens);
  if (request.responseFormat !== 'verbose_json') {
    if (request.route === 'translations') return `{"text":${JSON.stringify(text)}}`;
    const seconds = Math.ceil(request.durationS);
    return `{"text":${JSON.stringify(text)},"usage":${usage ? `{"type":"duration","seconds":${seconds}}` : 'null'}}`;
  }
  const duration = pythonFloat(request.durationS);
  const textBytes = Buffer.from(text, 'utf8');
  const end = TIMESTAMP_STEP_S * Math.round(request.durationS / TIMESTAMP_STEP_S);
  const segment =
    `{"id":0,"avg_logprob":${pythonFloat(SEGMENT_AVG_LOGPROB)},"compression_ratio":${pythonFloat(textBytes.length / deflateSync(textBytes).length)},` +
    `"end":${pythonFloat(end)},"no_speech_prob":null,"seek":0,"start":0.0,"temperature":${pythonFloat(request.temperature)},` +
    `"text":${JSON.stringify(text)},"tokens":${JSON.stringify(tokenIds(tokens))}}`;
  return (
    `{"duration":${request.route === 'transcriptions' ? JSON.stringify(duration) : duration},` +
    `"language":${JSON.stringify(request.language)},"text":${JSON.stringify(text)},"segments":[${segment}],"words":null}`
  );
}
