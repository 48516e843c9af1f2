/**
 * OpenTelemetry set-up: the Node SDK with an OTLP/HTTP (JSON) trace exporter, configured the standard way
 * (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER,
 * OTEL_RESOURCE_ATTRIBUTES) and/or `tracing.endpoint`. Off unless an endpoint is set. Spans are exported in batches
 * off the request path, so an unreachable collector costs dropped spans, never latency or errors.
 */
import { trace, type Tracer } from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { NodeSDK } from '@opentelemetry/sdk-node';
import { BatchSpanProcessor } from '@opentelemetry/sdk-trace-base';
import type { Config } from '../config/load.js';
import { within } from '../util/within.js';

export interface Tracing {
  readonly enabled: boolean;
  readonly tracer: Tracer;
  /** Where spans go, for the start-up log. */
  readonly endpoint: string | undefined;
  /** Exports what is buffered (tests; shutdown). */
  flush(): Promise<void>;
  shutdown(): Promise<void>;
}

const TRACER_NAME = 'waybill';
const FLUSH_LIMIT_MS = 3_000;

/** Tracing that records nothing: the API's no-op tracer (spans cost an object each, and are never exported). */
export function disabledTracing(): Tracing {
  return {
    enabled: false,
    tracer: trace.getTracer(TRACER_NAME),
    endpoint: undefined,
    flush: () => Promise.resolve(),
    shutdown: () => Promise.resolve(),
  };
}

function tracesEndpoint(config: Config['tracing'], env: NodeJS.ProcessEnv): string | undefined {
  if (config.endpoint !== undefined) return config.endpoint;
  const traces = env['OTEL_EXPORTER_OTLP_TRACES_ENDPOINT'];
  if (traces !== undefined && traces !== '') return traces;
  const base = env['OTEL_EXPORTER_OTLP_ENDPOINT'];
  if (base !== undefined && base !== '') return `${base.replace(/\/+$/, '')}/v1/traces`;
  return undefined;
}

/**
 * Starts the OpenTelemetry Node SDK when an endpoint is configured, registering it as the process's tracer provider
 * and W3C trace-context propagator. One per process.
 */
export function startTracing(config: Config['tracing'], env: NodeJS.ProcessEnv = process.env): Tracing {
  const endpoint = tracesEndpoint(config, env);
  if (endpoint === undefined || env['OTEL_SDK_DISABLED'] === 'true') return disabledTracing();
  const sdk = new NodeSDK({
    ...(env['OTEL_SERVICE_NAME'] ? {} : { serviceName: 'waybill' }),
    spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter({ url: endpoint }))],
    textMapPropagator: new W3CTraceContextPropagator(),
    // Waybill makes its own spans; auto-instrumenting http and undici would double every request.
    instrumentations: [],
  });
  sdk.start();
  const provider = () => {
    const global = trace.getTracerProvider() as { getDelegate?: () => unknown };
    return (global.getDelegate?.() ?? global) as { forceFlush?: () => Promise<void> };
  };
  return {
    enabled: true,
    tracer: trace.getTracer(TRACER_NAME),
    endpoint,
    // Bounded: with the collector down, the exporter retries for its whole timeout, and neither a test nor a
    // shutting-down gateway should wait that long for spans it cannot deliver.
    flush: async () => {
      await within(provider().forceFlush?.() ?? Promise.resolve(), FLUSH_LIMIT_MS);
    },
    shutdown: async () => {
      await within(sdk.shutdown(), FLUSH_LIMIT_MS);
    },
  };
}
