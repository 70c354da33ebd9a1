# Installs the official TypeScript SDK (@modelcontextprotocol/sdk) into $TETHER_CACHE (default
# ~/.cache/tether) once; sets TS (the directory it is installed in) and TS_SDK_VERSION. Source
# it; it is not a command.
CACHE="${TETHER_CACHE:-$HOME/.cache/tether}"
TS_SDK_VERSION=1.32.2
TS="$CACHE/ts-sdk-$TS_SDK_VERSION"
if [ ! -f "$TS/.installed" ]; then
  mkdir -p "$TS"
  npm_log="$(mktemp)"
  (cd "$TS" && { [ -f package.json ] || npm init -y >/dev/null; } \
    && npm install --no-audit --no-fund "@modelcontextprotocol/sdk@$TS_SDK_VERSION" >"$npm_log" 2>&1) \
    || { cat "$npm_log" >&2; rm -f "$npm_log"; exit 1; }
  rm -f "$npm_log"
  touch "$TS/.installed"
fi
