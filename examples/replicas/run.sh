#!/usr/bin/env bash
# Two `tether serve` replicas sharing the Redis at $REDIS_URL (default redis://127.0.0.1:6379/),
# on 127.0.0.1:8811 and :8812, each with Prometheus metrics on :9465 and :9466. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
redis="${REDIS_URL:-redis://127.0.0.1:6379/}"
cargo build --release -p tether
trap 'kill 0' EXIT
for n in 1 2; do
  target/release/tether --log-format json serve --store redis --redis-url "$redis" \
    --listen "127.0.0.1:881$n" --metrics "127.0.0.1:946$((4 + n))" &
done
wait
