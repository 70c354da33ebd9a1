"""The official Python SDK client (`pip install mcp`) through `tether gateway`, whose streams a
proxy cuts: lists the tools, then calls `count` (tests/gateway/stdio_server.py) with progress.
The SDK must resume each cut stream with Last-Event-ID and get every progress notification
exactly once, in order, and the result. Exits non-zero on any mismatch.

Usage: sdk_resume.py URL TO
"""

import asyncio
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main(url: str, to: int) -> int:
    async with streamable_http_client(url) as (read, write, *_):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = [t.name for t in (await session.list_tools()).tools]
            progress = []

            async def on_progress(value, total, message):
                progress.append(int(value))

            result = await asyncio.wait_for(
                session.call_tool("count", {"to": to, "interval_ms": 20}, progress_callback=on_progress), 60
            )
    text = result.content[0].text
    print(f"python sdk: tools {tools}, result {text!r}, progress {progress}")
    ok = "count" in tools and text == f"counted to {to}" and progress == list(range(1, to + 1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], int(sys.argv[2]))))
