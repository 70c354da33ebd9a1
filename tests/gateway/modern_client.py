"""Drives a Streamable HTTP MCP server (here `tether gateway` in front of a server of the
handshake era) with the official Python SDK client (`pip install mcp`) speaking 2026-07-28, in
the SDK's `auto` mode (server/discover) and pinned.

Usage: modern_client.py URL TOOL ARGS_JSON EXPECTED_TEXT
Checks, in each mode: the revision is 2026-07-28, TOOL is listed, and a call of it with ARGS
answers EXPECTED_TEXT. Prints what it saw and exits non-zero on any mismatch.
"""

import asyncio
import json
import sys

from mcp.client.client import Client


async def run(url: str, mode: str, tool: str, args: dict, expected: str, failures: list) -> None:
    async with Client(url, mode=mode) as client:
        if client.protocol_version != "2026-07-28":
            failures.append(f"{mode}: speaks {client.protocol_version}")
        tools = [t.name for t in (await client.list_tools()).tools]
        if tool not in tools:
            failures.append(f"{mode}: tool {tool} not among {tools}")
        result = await asyncio.wait_for(client.call_tool(tool, args), 60)
        text = result.content[0].text if result.content else None
        print(f"{mode}: {len(tools)} tools, {tool} answered {text!r}")
        if text != expected:
            failures.append(f"{mode}: {tool} answered {text!r}")


async def main(url: str, tool: str, args: str, expected: str) -> int:
    failures = []
    for mode in ("auto", "2026-07-28"):
        await run(url, mode, tool, json.loads(args), expected, failures)
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:5])))
