# Installs the real MCP servers and clients scripts/gateway puts tether in front of and behind,
# each pinned, into $TETHER_CACHE (default ~/.cache/tether) once: the reference server
# `@modelcontextprotocol/server-everything` (stdio and Streamable HTTP), FastMCP (PyPI
# `fastmcp`), and the MCP Inspector's CLI. Sets SERVER_EVERYTHING, FASTMCP_PY and INSPECTOR.
# Source it; it is not a command.
CACHE="${TETHER_CACHE:-$HOME/.cache/tether}"
EVERYTHING_VERSION=2026.8.31
FASTMCP_VERSION=4.2.3
INSPECTOR_VERSION=2.12.0

npm_install() { # directory, package@version
  if [ ! -f "$1/.installed" ]; then
    mkdir -p "$1"
    local log; log="$(mktemp)"
    (cd "$1" && { [ -f package.json ] || npm init -y >/dev/null; } \
      && npm install --no-audit --no-fund "$2" >"$log" 2>&1) || { cat "$log" >&2; rm -f "$log"; exit 1; }
    rm -f "$log"
    touch "$1/.installed"
  fi
}
npm_install "$CACHE/server-everything-$EVERYTHING_VERSION" "@modelcontextprotocol/server-everything@$EVERYTHING_VERSION"
SERVER_EVERYTHING="$CACHE/server-everything-$EVERYTHING_VERSION/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
npm_install "$CACHE/inspector-$INSPECTOR_VERSION" "@modelcontextprotocol/inspector@$INSPECTOR_VERSION"
INSPECTOR="$CACHE/inspector-$INSPECTOR_VERSION/node_modules/.bin/mcp-inspector"

FASTMCP="$CACHE/fastmcp-$FASTMCP_VERSION"
if [ ! -f "$FASTMCP/.installed" ]; then
  python3 -m venv "$FASTMCP"
  log="$(mktemp)"
  "$FASTMCP/bin/pip" install --quiet "fastmcp==$FASTMCP_VERSION" >"$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; exit 1; }
  rm -f "$log"
  touch "$FASTMCP/.installed"
fi
FASTMCP_PY="$FASTMCP/bin/python"
