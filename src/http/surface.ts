/**
 * The HTTP surface of one gateway, assembled from its parts: the API app with its front door (answers.ts,
 * front-door.ts, body.ts) and its API routes (routes.ts), the admin listener's app (server.admin_port), the live
 * status page (status-page.ts) and the lifecycle — the operational endpoints, start-up and the drain (lifecycle.ts).
 * What it serves is read from the generation in force (`current`) at each request; the composition root
 * (app/gateway.ts) builds the generations and swaps them on a reload.
 */
import type { Tracer } from '@opentelemetry/api';
import Fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import type { SchemaCache } from '../accounting/schemas.js';
import type { Config } from '../config/load.js';
import type { ResponseHomes } from '../proxy/response-homes.js';
import type { ResponseOwners } from '../proxy/response-owners.js';
import type { ObserverGuard } from '../telemetry/guard.js';
import type { GatewayMetrics } from '../telemetry/metrics.js';
import type { PublishSettlement } from '../telemetry/settlement.js';
import type { StatusWindow } from '../telemetry/status.js';
import { createAnswers, type Answers } from './answers.js';
import { fastifyOptions, installFrontDoor } from './front-door.js';
import type { Generation } from './generation.js';
import { createAdminApp, createLifecycle, type Lifecycle } from './lifecycle.js';
import { registerApiRoutes } from './routes.js';
import { createStatusPage, type StatusPage } from './status-page.js';

export interface HttpSurfaceDeps {
  /** The configuration the gateway starts with: the server's options and pass-through routes are fixed by it. */
  readonly config: Config;
  /** The generation in force (a reload replaces it): read at each use. */
  readonly current: () => Generation;
  readonly logger: Logger;
  readonly tracer: Tracer | undefined;
  readonly guard: ObserverGuard;
  readonly publish: PublishSettlement;
  readonly metrics: GatewayMetrics;
  readonly now: () => number;
  readonly schemas: SchemaCache;
  readonly homes: ResponseHomes;
  readonly owners: ResponseOwners;
  /** The settlements the status page reads. */
  readonly statusWindow: StatusWindow;
  /** Answers /metrics with every worker's metrics added up (server.workers); undefined: this process's. */
  readonly scrape: (() => Promise<{ contentType: string; body: string }>) | undefined;
  /** Closes everything the generations hold (the lifecycle's last step). */
  readonly closeUpstreams: () => Promise<void>;
}

export interface HttpSurface {
  readonly app: FastifyInstance;
  /** The admin listener's app; undefined without server.admin_port. */
  readonly admin: FastifyInstance | undefined;
  readonly answers: Answers;
  readonly statusPage: StatusPage;
  readonly lifecycle: Lifecycle;
}

export function createHttpSurface(deps: HttpSurfaceDeps): HttpSurface {
  const { config, current, logger, tracer, guard, publish, metrics, now } = deps;
  // Answers read the configuration in force at each answer.
  const answers = createAnswers({
    get config() {
      return current().config;
    },
    get upstreams() {
      return current().upstreams;
    },
    tracer,
    guard,
    publish,
    now,
  });

  // Typed as fastify's logger so the instance keeps fastify's default generics.
  const fastifyLogger: FastifyBaseLogger = logger;
  const app = Fastify(fastifyOptions(config, fastifyLogger, answers));
  // With server.admin_port, the operational endpoints get a listener of their own and the API port serves only the API.
  const admin = config.server.admin_port === undefined ? undefined : createAdminApp(fastifyLogger);
  const statusPage = createStatusPage({
    window: deps.statusWindow,
    current,
    now,
    wallNow: () => Date.now(),
    stopping: () => lifecycle.stopping,
    guard,
  });
  const lifecycle = createLifecycle({
    app,
    admin,
    statusPage,
    current,
    closeUpstreams: deps.closeUpstreams,
    metrics,
    scrape: deps.scrape,
    // On the API port, the endpoints that name tenants and request ids need an admin key where keys exist.
    opsAccess: admin === undefined ? (headers) => current().opsAccess(headers) : undefined,
    logger,
    now,
  });
  installFrontDoor(app, { config, answers, guard, now, closing: () => lifecycle.closing, current });
  registerApiRoutes(app, { config, tracer, guard, answers, schemas: deps.schemas, homes: deps.homes, owners: deps.owners, metrics });
  return { app, admin, answers, statusPage, lifecycle };
}
