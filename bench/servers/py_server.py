"""Benchmark target: a stateful Streamable HTTP MCP server built on the official Python SDK
(`pip install mcp`, the high-level `MCPServer`, served by uvicorn). Its tools match
bench/servers/ts_server.mjs exactly; the Rust load generator calls them:

  count {to, interval_ms?}  sends `to` notifications on the request's own stream, `interval_ms`
                            apart (0: no sleep at all): notifications/progress for the request's
                            _meta.progressToken if it has one, else notifications/message
                            (level info, data {count: i}); then returns text `counted to N`.
  notify_all {seq?}         sends one notifications/message (level info, data {seq}) to the
                            standalone GET stream of every live session (initialized, not yet
                            closed) and returns text: the number of sessions it was sent to.

Usage: py_server.py PORT [--json]   (run with the interpreter of the venv that has `mcp`)
  PORT    port on 127.0.0.1 (loopback only); 0 picks a free one
  --json  answer POSTs with a JSON body instead of an SSE stream (json_response; the count
          notifications then have no stream to ride and the SDK drops them). Without it: SSE
          responses, and an in-memory event store per session that keeps every event, so a
          client can resume any stream with Last-Event-ID.
Prints exactly one line, `listening on http://127.0.0.1:PORT/mcp`, once it accepts connections.
Quiet otherwise: only warnings and errors are logged (stderr).

Sessions never expire and their number is not capped (the SDK defaults are a 30-minute idle
timeout and 10,000 sessions), like the TypeScript server: a client ends its session with DELETE.
"""

import asyncio
import itertools
import socket
import sys
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore

_event_ids = itertools.count(1)  # ids are unique across the whole server


class MemoryEventStore(EventStore):
    """Every event of one session, kept for the session's life: a list per stream plus an index
    from event id to (stream, position), so a replay costs what it sends, not a scan.

    One store per session, because the SDK names streams by JSON-RPC request id (and `_GET_stream`),
    which repeat from session to session: a store shared by the session manager would mix the
    sessions' streams and replay one session's events into another.
    """

    __slots__ = ("_streams", "_index")

    def __init__(self) -> None:
        self._streams: dict[str, list[tuple[str, types.JSONRPCMessage | None]]] = {}
        self._index: dict[str, tuple[str, int]] = {}

    async def store_event(self, stream_id: str, message: types.JSONRPCMessage | None) -> str:
        event_id = str(next(_event_ids))
        events = self._streams.get(stream_id)
        if events is None:
            events = self._streams[stream_id] = []
        self._index[event_id] = (stream_id, len(events))
        events.append((event_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> str | None:
        at = self._index.get(last_event_id)
        if at is None:
            return None
        stream_id, position = at
        events = self._streams[stream_id]
        # Up to the list's end as it is when we get there, events stored during the replay included:
        # the transport registers the live stream right after this returns, with no await between.
        i = position + 1
        while i < len(events):
            event_id, message = events[i]
            i += 1
            if message is not None:  # None: a priming event, nothing to send
                await send_callback(EventMessage(message, event_id))
        return stream_id


# session id -> its Connection, from notifications/initialized until the session ends.
live: dict[str, Connection] = {}


async def track_sessions(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """Middleware: remembers each session once it is initialized, and forgets it when it ends.

    The SDK offers no public way from a handler to a session's Connection (whose notify() writes
    to the standalone GET stream and whose exit_stack unwinds when the session ends), so this
    reads the one the request's ServerSession holds.
    """
    result = await call_next(ctx)
    if ctx.method == "notifications/initialized":
        connection: Connection = ctx.session._connection  # noqa: SLF001
        sid = connection.session_id
        if sid is not None and sid not in live:
            live[sid] = connection
            connection.exit_stack.callback(live.pop, sid, None)
    return result


server = MCPServer("tether-bench-py", version="1", log_level="WARNING", middleware=[track_sessions])


@server.tool(structured_output=False)
async def count(to: int, ctx: Context, interval_ms: int = 0) -> str:
    """Sends `to` notifications on this request's stream, `interval_ms` apart, then returns."""
    rc = ctx.request_context
    meta = (rc.params or {}).get("_meta")
    if isinstance(meta, dict) and meta.get("progressToken") is not None:
        for i in range(1, to + 1):
            await ctx.report_progress(i, to)
            if interval_ms > 0:
                await anyio.sleep(interval_ms / 1000)
    else:
        session, request_id = rc.session, rc.request_id
        for i in range(1, to + 1):
            # send_notification, not ctx.log: no deprecation warning per call, no log-level gate.
            await session.send_notification(
                types.LoggingMessageNotification(
                    params=types.LoggingMessageNotificationParams(level="info", data={"count": i})
                ),
                related_request_id=request_id,
            )
            if interval_ms > 0:
                await anyio.sleep(interval_ms / 1000)
    return f"counted to {to}"


@server.tool(structured_output=False)
async def notify_all(seq: int | None = None) -> str:
    """Sends one notifications/message to the GET stream of every live session; returns how many."""
    # A raw notification on each session's standalone channel: it goes to the session's GET stream
    # (and its event store), past any log-level filter.
    params = {"level": "info", "data": {"seq": seq}}
    sent = 0
    for connection in list(live.values()):
        await connection.notify("notifications/message", params)
        sent += 1
    return str(sent)


def main() -> None:
    args = sys.argv[1:]
    positional = [a for a in args if not a.startswith("--")]
    if len(positional) != 1 or not positional[0].isdigit() or any(a.startswith("--") and a != "--json" for a in args):
        sys.exit("usage: py_server.py PORT [--json]")
    port, json_response = int(positional[0]), "--json" in args

    app = server.streamable_http_app(
        json_response=json_response,
        event_store=None,  # set per session below
        session_idle_timeout=None,
        max_sessions=None,
        host="127.0.0.1",
    )
    if not json_response:
        # Give each session its own event store (see MemoryEventStore). The session manager has no
        # hook for that, so wrap its admission of a new session.
        manager = server.session_manager
        admit = manager._admit_session  # noqa: SLF001

        def admit_with_event_store(requestor: Any) -> Any:
            transport = admit(requestor)
            if transport is not None:
                transport._event_store = MemoryEventStore()  # noqa: SLF001
            return transport

        manager._admit_session = admit_with_event_store  # noqa: SLF001

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    # A deep accept queue: the fan-out benchmark opens ~1,000 GET streams at once. Open SSE streams
    # never end by themselves, so shutdown waits for them only briefly.
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, backlog=4096, timeout_graceful_shutdown=1
    )
    userver = uvicorn.Server(config)

    async def serve() -> None:
        task = asyncio.create_task(userver.serve(sockets=[sock]))
        while not userver.started:  # listening, and the app's lifespan (session manager) is up
            if task.done():
                break
            await asyncio.sleep(0.01)
        else:
            print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
