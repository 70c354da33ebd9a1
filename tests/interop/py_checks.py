"""Checks both Python SDK clients (py_client.py over HTTP, py_stdio_client.py through `tether
connect`) make of a session: the tools a test needs are listed, and a call of `count` delivers
its progress and its result. Each appends what failed to `failures`."""

import asyncio


async def check_tools(session, needed, failures):
    tools = [t.name for t in (await session.list_tools()).tools]
    print("tools:", len(tools))
    for name in needed:
        if name not in tools:
            failures.append(f"tool {name} missing")


async def check_count(session, failures):
    progress = []

    async def on_progress(value, total, message):
        progress.append(value)

    result = await asyncio.wait_for(session.call_tool("count", {"to": 5}, progress_callback=on_progress), 30)
    text = result.content[0].text
    print("count:", text, "progress:", progress)
    if text != "counted to 5" or progress != [1, 2, 3, 4, 5]:
        failures.append(f"count: {text!r} with progress {progress}")
