# Installs the real MCP servers and clients scripts/gateway puts tether in front of and behind,
# each pinned, into $TETHER_CACHE (default ~/.cache/tether) once: the reference server
# `@modelcontextprotocol/server-everything` (stdio and Streamable HTTP), FastMCP (PyPI
# `fastmcp`), and the MCP Inspector's CLI. Sets SERVER_EVERYTHING, FASTMCP_PY and INSPECTOR.
# Source it; it is not a command.
source "$(dirname "${BASH_SOURCE[0]}")/install.sh"
EVERYTHING_VERSION=2026.8.31
FASTMCP_VERSION=4.2.3
INSPECTOR_VERSION=2.12.0

npm_install "$CACHE/server-everything-$EVERYTHING_VERSION" "@modelcontextprotocol/server-everything@$EVERYTHING_VERSION"
SERVER_EVERYTHING="$CACHE/server-everything-$EVERYTHING_VERSION/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
npm_install "$CACHE/inspector-$INSPECTOR_VERSION" "@modelcontextprotocol/inspector@$INSPECTOR_VERSION"
INSPECTOR="$CACHE/inspector-$INSPECTOR_VERSION/node_modules/.bin/mcp-inspector"
pip_install "$CACHE/fastmcp-$FASTMCP_VERSION" "fastmcp==$FASTMCP_VERSION"
FASTMCP_PY="$CACHE/fastmcp-$FASTMCP_VERSION/bin/python"
