# Installs the official Python SDK (`pip install mcp`) into $TETHER_CACHE (default
# ~/.cache/tether) once; sets PY (the venv) and PY_MCP_VERSION. Source it; it is not a command.
CACHE="${TETHER_CACHE:-$HOME/.cache/tether}"
PY_MCP_VERSION=2.3.0
PY="$CACHE/py-mcp-$PY_MCP_VERSION"
if [ ! -f "$PY/.installed" ]; then
  mkdir -p "$CACHE"
  python3 -m venv "$PY"
  pip_log="$(mktemp)"
  "$PY/bin/pip" install --quiet "mcp==$PY_MCP_VERSION" >"$pip_log" 2>&1 || { cat "$pip_log" >&2; rm -f "$pip_log"; exit 1; }
  rm -f "$pip_log"
  touch "$PY/.installed"
fi
