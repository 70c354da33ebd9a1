# Installs the official Python SDK (`pip install mcp`) into $TETHER_CACHE (default
# ~/.cache/tether) once; sets PY (the venv) and PY_MCP_VERSION. Source it; it is not a command.
source "$(dirname "${BASH_SOURCE[0]}")/install.sh"
PY_MCP_VERSION=2.3.0
PY="$CACHE/py-mcp-$PY_MCP_VERSION"
pip_install "$PY" "mcp==$PY_MCP_VERSION"
