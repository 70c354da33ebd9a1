"""A Streamable HTTP MCP server built with FastMCP (`pip install fastmcp`, the standalone
PrefectHQ project, not the SDK's `mcp.server.fastmcp`), run WITH FastMCP's own event store so
resumption (Last-Event-ID) is on, for tether's gateway audit: how a FastMCP upstream with
resumption answers what tether's probe asks of it.

tested with fastmcp==4.2.3 (mcp==2.3.0)

FastMCP's `run()` takes no event store; `http_app(event_store=...)` does, so we build the app
with `fastmcp.server.event_store.EventStore()` (in memory by default) and serve it with uvicorn.
FastMCP wraps that store per session (SessionScopedEventStore), so an event id from another
session, or one never issued, replays nothing.

Tool `count(to, interval_ms=30)` sends `to` progress notifications (log notifications when the
call carries no progress token), `interval_ms` apart, then returns `counted to {to}`.

Usage: fastmcp_server.py PORT   (binds 127.0.0.1 only, path /mcp)
       fastmcp_server.py stdio  (the same server on stdio, for `tether gateway -- ...`)
"""

import asyncio
import sys

import uvicorn
from fastmcp import Context, FastMCP
from fastmcp.server.event_store import EventStore

server = FastMCP("fastmcp-gateway-audit")


@server.tool()
async def count(to: int, ctx: Context, interval_ms: int = 30) -> str:
    """Counts to `to`, one notification every `interval_ms` milliseconds."""
    meta = ctx.request_context.meta if ctx.request_context is not None else None
    progress = bool(meta) and meta.get("progressToken") is not None
    for i in range(1, to + 1):
        if progress:
            await ctx.report_progress(i, to, f"count {i}")
        else:
            await ctx.info(f"count {i}")
        await asyncio.sleep(interval_ms / 1000)
    return f"counted to {to}"


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run(transport="stdio", show_banner=False)
        sys.exit(0)
    port = int(sys.argv[1])
    app = server.http_app(path="/mcp", transport="http", event_store=EventStore(), retry_interval=100)
    print(f"listening on http://127.0.0.1:{port}/mcp", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
