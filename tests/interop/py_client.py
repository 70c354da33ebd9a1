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

from py_checks import check_count, check_tools


async def main(url: str) -> int:
    failures = []
    async with streamable_http_client(url) as (read, write, *_):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            print("protocolVersion:", init.protocol_version)
            await check_tools(session, ("count", "test_reconnection"), failures)
            await check_count(session, failures)

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
