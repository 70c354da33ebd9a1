#!/usr/bin/env python3
"""A minimal MCP server on stdio (one JSON-RPC message per line), written with the standard
library only, for the gateway's tests (crates/tether/tests/gateway.rs). Each request runs on a
thread of its own, so calls overlap as they would on a real server. Tools:

- count {to, interval_ms}: a progress notification per step (when the call has a progress
  token), then "counted to N"; stops early when cancelled.
- roots {}: asks the client for its roots (a request to the client) and reports how many.
- pid {}: this process's id, so a test can tell one child from another.
- crash {delay_ms}: exits the process (status 3) after the delay, as a crash would.
- add {amount}: adds to the counter kept in the file $COUNT_FILE and returns its new value.
- heard {}: the methods of the notifications received from the client, in order, one per line.
- client {}: the name and version of the client, as its `initialize` said.

As the Python SDK and FastMCP do, a request carrying a 2026-07-28 `_meta` envelope is refused:
this server speaks the handshake era.
"""
import json
import os
import sys
import threading
import time

write_lock = threading.Lock()
answers = {}  # id of a request to the client -> [threading.Event, answer]
answers_lock = threading.Lock()
cancelled = set()
heard = []
client = {}
next_id = [0]
count_lock = threading.Lock()


def send(message):
    with write_lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def ask_client(method, params):
    with answers_lock:
        next_id[0] += 1
        ident = f"s{next_id[0]}"
        slot = answers[ident] = [threading.Event(), None]
    send({"jsonrpc": "2.0", "id": ident, "method": method, "params": params})
    if not slot[0].wait(30):
        raise RuntimeError(f"no answer to {method}")
    return slot[1]


def text(value):
    return {"content": [{"type": "text", "text": str(value)}]}


def call_tool(request):
    params = request.get("params") or {}
    name, args = params.get("name"), params.get("arguments") or {}
    token = (params.get("_meta") or {}).get("progressToken")
    if name == "count":
        to, interval = int(args.get("to", 3)), int(args.get("interval_ms", 10)) / 1000
        for step in range(1, to + 1):
            if request["id"] in cancelled:
                return text(f"cancelled at {step}")
            if token is not None:
                send({"jsonrpc": "2.0", "method": "notifications/progress",
                      "params": {"progressToken": token, "progress": step, "total": to}})
            time.sleep(interval)
        return text(f"counted to {to}")
    if name == "roots":
        answer = ask_client("roots/list", {})
        if "error" in answer:
            return text(f"the client refused: {answer['error']['message']}")
        return text(f"{len(answer['result']['roots'])} roots")
    if name == "pid":
        return text(os.getpid())
    if name == "crash":
        time.sleep(int(args.get("delay_ms", 0)) / 1000)
        os._exit(3)
    if name == "heard":
        return text("\n".join(heard))
    if name == "client":
        return text(f"{client.get('name')} {client.get('version')}")
    if name == "add":
        path = os.environ["COUNT_FILE"]
        with count_lock:
            try:
                with open(path) as f:
                    value = int(f.read() or 0)
            except FileNotFoundError:
                value = 0
            value += int(args.get("amount", 1))
            with open(path + ".tmp", "w") as f:
                f.write(str(value))
            os.replace(path + ".tmp", path)
        return text(value)
    raise KeyError(name)


TOOLS = [
    {"name": name, "inputSchema": {"type": "object"}}
    for name in ("count", "roots", "pid", "crash", "add", "heard", "client")
]


def handle(request):
    method = request["method"]
    meta = (request.get("params") or {}).get("_meta") or {}
    if "io.modelcontextprotocol/protocolVersion" in meta:
        send({"jsonrpc": "2.0", "id": request["id"],
              "error": {"code": -32600, "message": "this connection serves the handshake protocol era"}})
        return
    try:
        if method == "initialize":
            client.update(request["params"].get("clientInfo") or {})
            result = {"protocolVersion": request["params"]["protocolVersion"],
                      "capabilities": {"tools": {}},
                      "serverInfo": {"name": "stdio-test-server", "version": "1.0.0"}}
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call":
            result = call_tool(request)
        else:
            send({"jsonrpc": "2.0", "id": request["id"],
                  "error": {"code": -32601, "message": f"no method {method}"}})
            return
    except KeyError as missing:
        send({"jsonrpc": "2.0", "id": request["id"],
              "error": {"code": -32602, "message": f"unknown tool {missing}"}})
        return
    send({"jsonrpc": "2.0", "id": request["id"], "result": result})


def main():
    print("stdio test server starting", file=sys.stderr, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        if "method" in message and "id" in message:
            threading.Thread(target=handle, args=(message,), daemon=True).start()
        elif message.get("method") == "notifications/cancelled":
            heard.append(message["method"])
            cancelled.add(message["params"]["requestId"])
        elif "method" in message:
            heard.append(message["method"])
        elif "method" not in message:
            with answers_lock:
                slot = answers.pop(message.get("id"), None)
            if slot:
                slot[1] = message
                slot[0].set()


if __name__ == "__main__":
    main()
