"""A Streamable HTTP MCP server built on the official Python SDK (`pip install mcp`), with an
in-memory event store of our own (the wheel ships none), for interop tests.

Tool `count(to)` sends `to` notifications on the request's stream (progress when the call has a
progress token, else log messages) and closes that stream half-way (SEP-1699), so the client
must resume with Last-Event-ID.

Usage: py_server.py PORT   (binds 127.0.0.1 only)
       py_server.py stdio  (the same server on stdio, for `tether gateway -- ...`)
"""

import asyncio
import itertools
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore


class MemoryEventStore(EventStore):
    """Keeps every event; ids are a global counter (integers, so order is visible)."""

    def __init__(self):
        self._ids = itertools.count(1)
        self._events = []  # (event_id, stream_id, message)

    async def store_event(self, stream_id, message):
        event_id = str(next(self._ids))
        self._events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id, send_callback: EventCallback):
        stream = next((s for e, s, _ in self._events if e == last_event_id), None)
        if stream is None:
            return None
        after = int(last_event_id)
        for event_id, stream_id, message in self._events:
            if stream_id == stream and int(event_id) > after and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream


server = MCPServer("py-interop")


@server.tool()
async def count(to: int, ctx: Context) -> str:
    """Counts, closing the stream half-way: progress when the call has a progress token, else
    log messages."""
    meta = ctx.request_context.meta or {}
    progress = meta.get("progress_token") is not None
    for i in range(1, to + 1):
        if progress:
            await ctx.report_progress(i, to)
        else:
            await ctx.log("info", {"count": i})
        if i == (to + 1) // 2 and ctx.request_context.close_sse_stream is not None:
            await ctx.request_context.close_sse_stream()
        await asyncio.sleep(0.02)
    return f"counted to {to}"


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
        sys.exit(0)
    port = int(sys.argv[1])
    print(f"listening on http://127.0.0.1:{port}/mcp", flush=True)
    server.run("streamable-http", host="127.0.0.1", port=port, event_store=MemoryEventStore(), retry_interval=100)
