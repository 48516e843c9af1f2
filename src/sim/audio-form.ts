/**
 * The multipart (or urlencoded) form of vLLM's speech-to-text routes, read as Starlette reads it with its limits —
 * through @fastify/busboy, the file part counted, never kept.
 */
import type { IncomingMessage } from 'node:http';
import { Busboy, type BusboyInstance } from '@fastify/busboy';

/** Starlette's multipart limits (MultiPartParser): 1 000 files, 1 000 fields, 1 MiB per non-file part. */
const MAX_FORM_PARTS = 1000;
const MAX_FIELD_BYTES = 1024 * 1024;

/** One form value: a plain field, or a file part (its bytes counted, not kept). */
export type FormValue = { readonly kind: 'field'; readonly value: string } | { readonly kind: 'file'; bytes: number; readonly filename: string };

/**
 * `form`: the parsed form (last value wins per name, as Starlette's FormData.get); a body that is neither multipart nor
 * urlencoded is an empty form, as Starlette reads it. `malformed`: the parser failed. `gone`: the client left first.
 */
export type FormRead =
  | { readonly kind: 'form'; readonly values: ReadonlyMap<string, FormValue> }
  | { readonly kind: 'malformed' }
  | { readonly kind: 'gone' };

function mediaTypeOf(req: IncomingMessage): string {
  return (req.headers['content-type'] ?? '').split(';', 1)[0]?.trim().toLowerCase() ?? '';
}

/**
 * Read the request's form with busboy. A file part's bytes are counted as they pass and dropped, so a 25 MB upload
 * costs no memory; plain fields are kept (Starlette's limits bound them).
 */
export function readAudioForm(req: IncomingMessage): Promise<FormRead> {
  return new Promise((resolve) => {
    let settled = false;
    const settle = (result: FormRead): void => {
      if (settled) return;
      settled = true;
      resolve(result);
    };
    req.once('close', () => {
      if (!req.complete) settle({ kind: 'gone' });
    });

    const values = new Map<string, FormValue>();
    const mediaType = mediaTypeOf(req);
    if (mediaType !== 'multipart/form-data' && mediaType !== 'application/x-www-form-urlencoded') {
      // Starlette's request.form() reads no body for other content types: an empty form. Drain it all the same.
      req.once('end', () => settle({ kind: 'form', values }));
      req.resume();
      return;
    }

    let parser: BusboyInstance;
    try {
      parser = new Busboy({
        headers: { ...req.headers, 'content-type': req.headers['content-type'] ?? '' },
        // Starlette's rule: a part is a file when its Content-Disposition has a filename.
        isPartAFile: (_name, _contentType, filename) => filename !== undefined,
        limits: { files: MAX_FORM_PARTS, fields: MAX_FORM_PARTS, fieldSize: MAX_FIELD_BYTES, fieldNameSize: MAX_FIELD_BYTES },
      });
    } catch {
      // e.g. a multipart content type without a boundary.
      req.resume();
      settle({ kind: 'malformed' });
      return;
    }
    const malformed = (): void => {
      req.unpipe(parser);
      req.resume();
      settle({ kind: 'malformed' });
    };
    parser.on('file', (name, stream, filename) => {
      const value: FormValue = { kind: 'file', bytes: 0, filename };
      if (name !== '') values.set(name, value);
      stream.on('data', (chunk: Buffer) => {
        value.bytes += chunk.length;
      });
      stream.on('error', malformed);
    });
    parser.on('field', (name, value, nameTruncated, valueTruncated) => {
      if (nameTruncated || valueTruncated) {
        malformed();
        return;
      }
      if (name !== '') values.set(name, { kind: 'field', value });
    });
    parser.on('filesLimit', malformed);
    parser.on('fieldsLimit', malformed);
    parser.on('error', malformed);
    parser.on('finish', () => settle({ kind: 'form', values }));
    req.pipe(parser);
  });
}
