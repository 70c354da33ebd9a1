"""A stdio MCP server written with the official Python SDK (`pip install mcp`): its one tool,
`add(amount)`, adds to a counter kept in the file $COUNT_FILE (under an exclusive lock, since each
gateway session runs a child of its own) and returns the new value. The gateway's chaos runs
(crates/tether/tests/gateway_sdk.rs) count in that file how often the tool really ran.

Usage: py_count_server.py   (stdio)
"""

import fcntl
import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("py-count")


@server.tool()
def add(amount: int = 1) -> dict:
    """Adds `amount` to the counter and returns its new value."""
    path = os.environ["COUNT_FILE"]
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path) as f:
                value = int(f.read() or 0)
        except FileNotFoundError:
            value = 0
        value += amount
        with open(path + ".tmp", "w") as f:
            f.write(str(value))
        os.replace(path + ".tmp", path)
    return {"value": value}


if __name__ == "__main__":
    server.run()
