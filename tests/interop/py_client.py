"""Drives a Streamable HTTP MCP server with the official Python SDK client (`pip install mcp`).

Usage: py_client.py URL
Checks: tools/list, a tools/call with progress, and a call whose stream the server closes
mid-call (the SDK must resume with Last-Event-ID and still get the result). Prints what it
counted and exits non-zero on any mismatch.
"""

import asyncio
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main(url: str) -> int:
    failures = []
    async with streamable_http_client(url) as (read, write, *_):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            print("protocolVersion:", init.protocol_version)
            tools = [t.name for t in (await session.list_tools()).tools]
            print("tools:", len(tools))
            for needed in ("count", "test_reconnection"):
                if needed not in tools:
                    failures.append(f"tool {needed} missing")

            progress = []

            async def on_progress(value, total, message):
                progress.append(value)

            result = await asyncio.wait_for(
                session.call_tool("count", {"to": 5}, progress_callback=on_progress), 30
            )
            text = result.content[0].text
            print("count:", text, "progress:", progress)
            if text != "counted to 5" or progress != [1, 2, 3, 4, 5]:
                failures.append(f"count: {text!r} with progress {progress}")

            result = await asyncio.wait_for(session.call_tool("test_reconnection", {}), 30)
            text = result.content[0].text
            print("test_reconnection:", text)
            if text != "Reconnection test completed":
                failures.append(f"test_reconnection: {text!r}")
    for failure in failures:
        print("FAIL:", failure)
    print(f"python sdk client: {3 - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1])))
