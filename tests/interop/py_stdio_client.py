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

from py_checks import check_count, check_tools

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
            await check_tools(session, ("count",), failures)
            await check_count(session, failures)
    for failure in failures:
        print("FAIL:", failure)
    print(f"python sdk stdio client: {3 - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2])))
