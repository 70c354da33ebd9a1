"""Drives `tether connect URL` with the official Python SDK's stdio client (`pip install mcp`),
as a desktop application would launch it, negotiating the revision in one of the SDK's modes.

Usage: py_stdio_client.py TETHER URL MODE SERVER [CONNECT_FLAGS...]
  MODE    `legacy` (the initialize handshake), `auto` (server/discover, falling back to the
          handshake) or `2026-07-28` (pinned: no handshake at all, the first request carries the
          revision)
  SERVER  `tether`: `tether serve` (a call of `count` delivers its progress and, at 2026-07-28, a
          multi round-trip call is answered); `sdk`: an SDK server of the handshake era only, so
          that a 2026-07-28 client reaches it through the bridge's translation (a call of `count`
          gets its result)
Checks: start-up answers without a stall (the SDK's own negotiation goes through the bridge),
tools/list, and the calls above. Prints what it measured and exits non-zero on any mismatch.
"""

import asyncio
import sys
import time

import mcp_types as types
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

from py_checks import check_count, check_tools

# The SDK waits ten seconds for an answer it never gets before falling back: a start-up slower
# than this is that stall, not a slow machine.
STARTUP_STALL = 5.0


async def answer_name(context, params):
    return types.ElicitResult(action="accept", content={"name": "mrtr"})


async def main(tether: str, url: str, mode: str, server_kind: str, flags: list[str]) -> int:
    failures = []
    server = StdioServerParameters(command=tether, args=["connect", url, *flags])
    started = time.monotonic()
    async with Client(server, mode=mode, elicitation_callback=answer_name) as client:
        took = time.monotonic() - started
        print(f"{mode}: start-up {took:.2f} s, revision {client.protocol_version}")
        if took > STARTUP_STALL:
            failures.append(f"the start-up stalled for {took:.1f} s")
        modern = client.protocol_version == "2026-07-28"
        if (mode == "legacy") == modern:
            failures.append(f"mode {mode} speaks {client.protocol_version}")
        await check_tools(client, ("count",), failures)
        if server_kind == "tether":
            await check_count(client, failures)
            if modern:
                result = await asyncio.wait_for(client.call_tool("test_input_required_result_elicitation", {}), 30)
                text = result.content[0].text
                print("input required:", text)
                if text != "Hello, mrtr!":
                    failures.append(f"the multi round-trip call answered {text!r}")
        else:
            result = await asyncio.wait_for(client.call_tool("count", {"to": 4}), 30)
            text = result.content[0].text
            print("count:", text)
            if text != "counted to 4":
                failures.append(f"count: {text!r}")
    for failure in failures:
        print("FAIL:", failure)
    print(f"python sdk stdio client ({mode}): {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])))
