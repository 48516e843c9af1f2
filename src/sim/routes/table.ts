/**
 * The simulator's API routes: path → (route name, handler), one family's handler per file. Every handler checks its
 * own method (a 405 with `allow`), since vLLM checks it before auth on some routes and after on others. Operational
 * endpoints (operational.ts) and the control plane come before this table; a path in none of them is `other`.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { audioRouteOf } from '../audio.js';
import type { Exchange, SimContext } from '../context.js';
import { poolingRouteOf } from '../pooling-request.js';
import type { RouteName } from '../stats.js';
import { storedRouteOf } from '../stored-routes.js';
import { serveAudio } from './audio.js';
import { serveGeneration } from './generation.js';
import { serveCountTokens, serveMessages } from './messages.js';
import { servePooling } from './pooling.js';
import { serveResponses } from './responses.js';
import { serveStored } from './stored.js';

/** A handler of the routes `R`: reads the request, answers it, and ends its record. */
export type Serve<R extends RouteName> = (ctx: SimContext, ex: Exchange, req: IncomingMessage, res: ServerResponse, route: R, path: string) => Promise<void>;

/** A path's route and its handler. */
export interface ApiRoute {
  readonly route: RouteName;
  serve(ctx: SimContext, ex: Exchange, req: IncomingMessage, res: ServerResponse, path: string): Promise<void>;
}

interface TableRow {
  /** The route a path is, or null/undefined when this row does not serve it. */
  readonly match: (path: string) => RouteName | null | undefined;
  readonly serve: Serve<never>;
}

/** A row for the paths `match` recognises (a family's several paths, or paths with an id in them). */
function row<R extends RouteName>(match: (path: string) => R | null | undefined, serve: Serve<R>): TableRow {
  return { match, serve };
}

/** A row for one fixed path. */
function fixed<R extends RouteName>(path: string, route: R, serve: Serve<R>): TableRow {
  return row((candidate) => (candidate === path ? route : null), serve);
}

const ROUTES: readonly TableRow[] = [
  fixed('/v1/chat/completions', 'chat_completions', serveGeneration),
  fixed('/v1/completions', 'completions', serveGeneration),
  fixed('/v1/responses', 'responses', serveResponses),
  fixed('/v1/messages', 'messages', serveMessages),
  fixed('/v1/messages/count_tokens', 'count_tokens', serveCountTokens),
  // GET /v1/responses/{id}, POST /v1/responses/{id}/cancel
  row(storedRouteOf, serveStored),
  // /v1/audio/transcriptions, /v1/audio/translations
  row(audioRouteOf, serveAudio),
  // /v1/embeddings, /pooling, /classify, /score, /rerank, /tokenize, /detokenize (and their aliases)
  row(poolingRouteOf, servePooling),
];

/** The API route of `path`, or null (an unknown path: `other`). */
export function findRoute(path: string): ApiRoute | null {
  for (const { match, serve } of ROUTES) {
    const route = match(path);
    if (route !== null && route !== undefined) {
      return { route, serve: (ctx, ex, req, res, p) => serve(ctx, ex, req, res, route as never, p) };
    }
  }
  return null;
}
