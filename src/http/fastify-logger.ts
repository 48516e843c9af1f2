/** The logger the gateway's fastify apps are given (the API's front door, the admin listener). */
import type { FastifyBaseLogger } from 'fastify';

/**
 * The logger fastify is given: the gateway's, whose `child()` is itself. Fastify makes a child logger per request, and
 * Waybill logs per request once, from the ledger, with the id; a child that is the logger itself costs nothing. (A
 * `childLoggerFactory` returning the parent did the same, but fastify then checks the logger it returns, seven methods
 * by name, on every request.) Everything else is the gateway's logger's own, read through the prototype.
 */
export function requestlessLogger(logger: FastifyBaseLogger): FastifyBaseLogger {
  const wrapper: FastifyBaseLogger = Object.create(logger, {
    child: { value: () => wrapper },
  }) as FastifyBaseLogger;
  return wrapper;
}
