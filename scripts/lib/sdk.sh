# Shared by scripts/interop and scripts/audit (source it; it is not a command).
# Installs the official Python and TypeScript SDKs into $TETHER_CACHE (default ~/.cache/tether),
# builds tether and the rmcp server of tests/interop/rmcp_server (its target dir in the cache;
# optimized with PROFILE=release), and provides `start NAME COMMAND...` (runs a server until the
# script exits, waits for its "listening on URL" line and its port, sets URL), `start_port NAME
# PORT COMMAND...` (the same for a server that prints no URL: waits for the port) and `free_port`.

source "$(dirname "${BASH_SOURCE[0]}")/py-sdk.sh"
source "$(dirname "${BASH_SOURCE[0]}")/ts-sdk.sh"
RMCP_VERSION=3.11.0
LOGS="$(mktemp -d)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$LOGS"
}
trap cleanup EXIT

# PROFILE=release (set before sourcing) builds optimized binaries, for benchmarks.
PROFILE="${PROFILE:-debug}"
PROFILE_FLAG=()
[ "$PROFILE" = release ] && PROFILE_FLAG=(--release)
cargo build --quiet --locked "${PROFILE_FLAG[@]}" -p tether
TETHER="./target/$PROFILE/tether"
cargo build --quiet --locked "${PROFILE_FLAG[@]}" --manifest-path tests/interop/rmcp_server/Cargo.toml --target-dir "$CACHE/rmcp-target"
RMCP="$CACHE/rmcp-target/$PROFILE/rmcp-interop-server"

start() { # name, command...: runs a server, waits for "listening on URL", sets URL
  local name=$1; shift
  "$@" >"$LOGS/$name.log" 2>&1 &
  PIDS+=($!)
  URL=""
  for _ in $(seq 1 150); do
    URL=$(grep -m1 -o 'listening on http://[^ ]*' "$LOGS/$name.log" 2>/dev/null | sed 's/^listening on //' || true)
    if [ -n "$URL" ]; then
      # Some servers announce their address before they accept: wait until the port answers.
      local port=${URL##*:}; port=${port%%/*}
      for _ in $(seq 1 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.1
      done
    fi
    sleep 0.1
  done
  cat "$LOGS/$name.log" >&2
  echo "$name did not start" >&2
  exit 1
}

start_port() { # name, port, command...: runs a server that prints no URL, waits for its port, sets URL
  local name=$1 port=$2; shift 2
  "$@" >"$LOGS/$name.log" 2>&1 &
  PIDS+=($!)
  URL="http://127.0.0.1:$port/mcp"
  for _ in $(seq 1 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    sleep 0.1
  done
  cat "$LOGS/$name.log" >&2
  echo "$name did not start" >&2
  exit 1
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
