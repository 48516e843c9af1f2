# Waybill: build with dev dependencies, run with production dependencies only.
#   docker build -t waybill .
#   docker run -p 8080:8080 -v $PWD/waybill.yaml:/etc/waybill/config.yaml:ro -e VLLM_API_KEY waybill
# test/deploy.test.ts checks this file's invariants (stages, non-root user, no dev dependencies in the final
# stage, the exposed port, the health check, the exec-form entrypoint).

ARG NODE_IMAGE=node:22-bookworm-slim

FROM ${NODE_IMAGE} AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
# Everything the build compiles (src, bench, load, and the test fixtures bench shares); .dockerignore keeps the
# context small.
COPY . .
RUN npm run build

FROM ${NODE_IMAGE} AS runtime
# The source revision for waybill_build_info, e.g. docker build --build-arg REVISION=$(git rev-parse --short HEAD) .
ARG REVISION=unknown
ENV NODE_ENV=production WAYBILL_REVISION=${REVISION}
WORKDIR /app
COPY package.json package-lock.json ./
# Production dependencies only; the npm cache would only add weight to the image.
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force
COPY --from=build /app/dist ./dist
COPY bin ./bin
COPY config.example.yaml ./
# The node image's unprivileged user (uid 1000); the files above stay root-owned and read-only to it, which is
# also what Kubernetes' readOnlyRootFilesystem expects.
USER node
EXPOSE 8080
# No curl in the slim image: node itself asks /healthz (liveness, not readiness: /readyz is 503 whenever every
# upstream is down, and a container runtime must not restart the gateway for that). Assumes server.port 8080 and
# no server.admin_port; with an admin listener /healthz is served there only, so point the check at it:
#   docker run -e WAYBILL_HEALTHCHECK_URL=http://127.0.0.1:9090/healthz ...
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["node", "-e", "fetch(process.env.WAYBILL_HEALTHCHECK_URL||'http://127.0.0.1:8080/healthz',{signal:AbortSignal.timeout(2000)}).then((r)=>process.exit(r.ok?0:1),()=>process.exit(1))"]
# Exec form: node is PID 1 and receives SIGTERM itself, so Waybill drains (docs/operations.md, Shutdown) instead
# of being killed by a shell that ignores the signal.
ENTRYPOINT ["node", "bin/waybill.js"]
CMD ["serve", "--config", "/etc/waybill/config.yaml"]
