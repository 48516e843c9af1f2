#!/usr/bin/env bash
# What a 300 MB /v1/models makes a gateway hold: `bench/own-read/measure.sh <waybill checkout, built>` prints the
# gateway's peak RSS (VmHWM) and the bytes the upstream wrote before its socket was closed. Run it on two checkouts to
# compare (docs/security.md, "Bodies Waybill reads for itself"). Polls with bounded sleeps: a benchmark, not a test.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="$(mktemp -d)"
trap 'kill "${gw:-}" "${up:-}" 2>/dev/null || true; rm -rf "$dir"' EXIT
node "$here/../../dist/bench/own-read/huge-models.js" > "$dir/port" 2> "$dir/upstream.err" & up=$!
for _ in $(seq 1 50); do [ -s "$dir/port" ] && break; sleep 0.1; done
cat > "$dir/config.yaml" <<YAML
server: { host: 127.0.0.1, port: 0, workers: 1 }
pools: [{ name: p, upstreams: [{ name: u, url: "http://127.0.0.1:$(cat "$dir/port")" }] }]
health: { timeout: 60s, interval: 1h }
discovery: { refresh_interval: 1h }
logging: { level: warn }
YAML
node "$1/bin/waybill.js" serve --config "$dir/config.yaml" > "$dir/gateway.out" 2>&1 & gw=$!
for _ in $(seq 1 120); do sleep 0.5; grep -q wrote "$dir/upstream.err" && break; done
sleep 1
grep VmHWM "/proc/$gw/status"
cat "$dir/upstream.err"
