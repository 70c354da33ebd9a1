"""Drives `tether connect URL` with the official Python SDK's stdio client (`pip install mcp`),
as a desktop application would launch it.

Usage: py_stdio_client.py TETHER URL
Checks: the handshake answers without a stall (the SDK's own discovery goes through the
bridge), tools/list, and a tools/call with progress. Prints what it counted and exits non-zero
on any mismatch.
"""

import asyncio
import sys
import time

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

# The SDK waits ten seconds for an answer it never gets before falling back: a handshake
# slower than this is that stall, not a slow machine.
HANDSHAKE_STALL = 5.0


async def main(tether: str, url: str) -> int:
    failures = []
    server = StdioServerParameters(command=tether, args=["connect", url])
    async with stdio_client(server) as (read, write, *_):
        async with ClientSession(read, write) as session:
            started = time.monotonic()
            await session.initialize()
            took = time.monotonic() - started
            print(f"handshake: {took:.2f} s")
            if took > HANDSHAKE_STALL:
                failures.append(f"the handshake stalled for {took:.1f} s")
            tools = [t.name for t in (await session.list_tools()).tools]
            print("tools:", len(tools))
            if "count" not in tools:
                failures.append("tool count missing")

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
    for failure in failures:
        print("FAIL:", failure)
    print(f"python sdk stdio client: {3 - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2])))
