/**
 * The simulated pooler: deterministic vectors from a seeded hash of each input, and their encodings on the wire
 * (vLLM's `tensor2binary`: the values cast to `embed_dtype`, flattened, in the asked byte order). Values are
 * float32 throughout, as a real pooler's output tensor is, so a `float` answer decodes to exactly the numbers a
 * `base64` or `bytes` answer carries.
 */
import { endianness as hostEndianness } from 'node:os';
import { createRandom, deriveSeed } from '../util/prng.js';

export const EMBED_DTYPES = ['float32', 'float16', 'bfloat16', 'fp8_e4m3', 'fp8_e5m2'] as const;
export type EmbedDType = (typeof EMBED_DTYPES)[number];
export const ENDIANNESS = ['native', 'big', 'little'] as const;
export type Endianness = (typeof ENDIANNESS)[number];

/** Labels of the simulated classifier: Hugging Face's default id2label for two classes. */
export const CLASS_LABELS: readonly string[] = Object.freeze(['LABEL_0', 'LABEL_1']);

/** 32-bit FNV-1a over UTF-16 units: the input's identity, mixed into the seed. */
function fnv1a(key: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) hash = Math.imul(hash ^ key.charCodeAt(i), 0x01000193);
  return hash >>> 0;
}

/** `count` values uniform in [-1, 1), fixed by the seed and the input's key. */
function rawValues(seed: number, key: string, count: number): number[] {
  const random = createRandom(deriveSeed(seed, fnv1a(key)));
  return Array.from({ length: count }, () => 2 * random() - 1);
}

/**
 * The embedding of one input: the first `dimensions` of its `native` values (a Matryoshka cut; more than `native`
 * gives `native`, as slicing the pooled tensor does), L2-normalised unless `normalize` is false (vLLM's
 * `use_activation: false`), as float32.
 */
export function embedding(seed: number, key: string, native: number, dimensions: number | null, normalize: boolean): number[] {
  const values = rawValues(seed, key, native).slice(0, Math.min(dimensions ?? native, native));
  if (!normalize) return values.map(Math.fround);
  const norm = Math.sqrt(values.reduce((sum, v) => sum + v * v, 0)) || 1;
  return values.map((v) => Math.fround(v / norm));
}

/** Class probabilities of one input (softmax over seeded logits), as float32. */
export function classProbs(seed: number, key: string): number[] {
  const logits = rawValues(seed, `classify\u0000${key}`, CLASS_LABELS.length).map((v) => 4 * v);
  const top = Math.max(...logits);
  const exps = logits.map((l) => Math.exp(l - top));
  const sum = exps.reduce((a, b) => a + b, 0);
  return exps.map((e) => Math.fround(e / sum));
}

/** The index of the largest value, the first on a tie (numpy's argmax). */
export function argmax(values: readonly number[]): number {
  let best = 0;
  for (let i = 1; i < values.length; i++) if ((values[i] ?? 0) > (values[best] ?? 0)) best = i;
  return best;
}

/** Cosine similarity, as float32: torch's F.cosine_similarity over two embeddings (the bi-encoder score). */
export function cosine(a: readonly number[], b: readonly number[]): number {
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < a.length; i++) {
    const x = a[i] ?? 0;
    const y = b[i] ?? 0;
    dot += x * y;
    na += x * x;
    nb += y * y;
  }
  return Math.fround(dot / Math.max(Math.sqrt(na) * Math.sqrt(nb), 1e-8));
}

// ---- encodings ----

const BYTES_PER_VALUE: Readonly<Record<EmbedDType, number>> = { float32: 4, float16: 2, bfloat16: 2, fp8_e4m3: 1, fp8_e5m2: 1 };

/** 'native' is the byte order of the machine the server runs on, as Python's sys.byteorder. */
function isLittleEndian(order: Endianness): boolean {
  return order === 'native' ? hostEndianness() === 'LE' : order === 'little';
}

/** The bytes of `values` as vLLM's tensor2binary writes them. */
export function encodeValues(values: readonly number[], dtype: EmbedDType, order: Endianness): Buffer {
  const size = BYTES_PER_VALUE[dtype];
  const buffer = Buffer.alloc(values.length * size);
  const view = new DataView(buffer.buffer, buffer.byteOffset, buffer.byteLength);
  const little = isLittleEndian(order);
  values.forEach((value, i) => {
    const at = i * size;
    switch (dtype) {
      case 'float32':
        view.setFloat32(at, value, little);
        break;
      case 'float16':
        view.setUint16(at, minifloatBits(value, 5, 10), little);
        break;
      case 'bfloat16':
        view.setUint16(at, minifloatBits(value, 8, 7), little);
        break;
      case 'fp8_e4m3':
        view.setUint8(at, minifloatBits(value, 4, 3));
        break;
      case 'fp8_e5m2':
        view.setUint8(at, minifloatBits(value, 5, 2));
        break;
    }
  });
  return buffer;
}

function roundHalfEven(x: number): number {
  const floor = Math.floor(x);
  const diff = x - floor;
  if (diff > 0.5) return floor + 1;
  if (diff < 0.5) return floor;
  return floor % 2 === 0 ? floor : floor + 1;
}

/**
 * The bit pattern of `value` in a binary float format with `expBits` exponent and `manBits` mantissa bits
 * (bias 2^(expBits−1) − 1), rounded to nearest even as torch's casts do. Subnormals are kept. Only for |value| ≤ 1,
 * which every value here is: far from every format's overflow, so inf/NaN encodings never arise.
 */
export function minifloatBits(value: number, expBits: number, manBits: number): number {
  const sign = value < 0 || Object.is(value, -0) ? 2 ** (expBits + manBits) : 0;
  const magnitude = Math.abs(value);
  if (magnitude === 0) return sign;
  const bias = 2 ** (expBits - 1) - 1;
  let exp = Math.floor(Math.log2(magnitude));
  if (2 ** exp > magnitude) exp -= 1;
  else if (2 ** (exp + 1) <= magnitude) exp += 1;
  const minExp = 1 - bias;
  // A subnormal's count of the smallest step; reaching 2^manBits is exactly the smallest normal's pattern.
  if (exp < minExp) return sign + roundHalfEven(magnitude / 2 ** (minExp - manBits));
  let significand = roundHalfEven(magnitude / 2 ** (exp - manBits));
  if (significand === 2 ** (manBits + 1)) {
    significand = 2 ** manBits;
    exp += 1;
  }
  return sign + (exp + bias) * 2 ** manBits + (significand - 2 ** manBits);
}

/** Python's float repr, which json.dumps writes: `1.0`, `0.25`, `5e-05`, `1e+16`. Finite values only. */
export function pythonFloat(x: number): string {
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0';
  const [mantissa = '', exponent = '0'] = x.toExponential().split('e');
  const exp = Number(exponent);
  const negative = mantissa.startsWith('-');
  const digits = mantissa.replace('-', '').replace('.', '');
  const signed = (s: string): string => (negative ? `-${s}` : s);
  if (exp < -4 || exp >= 16) {
    const head = digits.length > 1 ? `${digits.slice(0, 1)}.${digits.slice(1)}` : digits;
    return signed(`${head}e${exp < 0 ? '-' : '+'}${String(Math.abs(exp)).padStart(2, '0')}`);
  }
  if (exp < 0) return signed(`0.${'0'.repeat(-exp - 1)}${digits}`);
  if (digits.length <= exp + 1) return signed(`${digits}${'0'.repeat(exp + 1 - digits.length)}.0`);
  return signed(`${digits.slice(0, exp + 1)}.${digits.slice(exp + 1)}`);
}

/** A JSON array of floats as Python's json module writes it (compact separators, as Starlette's JSONResponse). */
export function pythonFloatArray(values: readonly number[]): string {
  return `[${values.map(pythonFloat).join(',')}]`;
}
