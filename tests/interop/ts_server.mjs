// A Streamable HTTP MCP server built on the official TypeScript SDK, with the SDK's
// InMemoryEventStore, for interop tests. Tool `count {to}` sends `to` notifications on the
// request's stream and closes that stream half-way (SEP-1699), so the client must resume.
//
// Usage: TETHER_TS_SDK=<dir with @modelcontextprotocol/sdk installed> node ts_server.mjs
// Prints `listening on http://127.0.0.1:PORT/mcp` first. Loopback only.
import { createServer } from "node:http";
import { randomUUID } from "node:crypto";
import { createRequire } from "node:module";

const require = createRequire(process.env.TETHER_TS_SDK + "/package.json");
const sdk = (path) => require("@modelcontextprotocol/sdk/" + path);
const { McpServer } = sdk("server/mcp.js");
const { StreamableHTTPServerTransport } = sdk("server/streamableHttp.js");
const { isInitializeRequest } = sdk("types.js");
const { InMemoryEventStore } = sdk("examples/shared/inMemoryEventStore.js");
const { z } = require("zod");

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const sessions = new Map();

function mcpServer() {
  const server = new McpServer({ name: "ts-interop", version: "1" }, { capabilities: { logging: {} } });
  server.tool("count", "Counts, closing the stream half-way.", { to: z.number().int() }, async ({ to }, extra) => {
    for (let i = 1; i <= to; i++) {
      await extra.sendNotification({ method: "notifications/message", params: { level: "info", data: { count: i } } });
      if (i === Math.ceil(to / 2) && extra.closeSSEStream) extra.closeSSEStream();
      await sleep(20);
    }
    return { content: [{ type: "text", text: `counted to ${to}` }] };
  });
  return server;
}

const http = createServer(async (req, res) => {
  let raw = "";
  for await (const chunk of req) raw += chunk;
  const body = raw ? JSON.parse(raw) : undefined;
  const id = req.headers["mcp-session-id"];
  if (id && sessions.has(id)) return sessions.get(id).handleRequest(req, res, body);
  if (id) {
    res.writeHead(404, { "content-type": "application/json" });
    return res.end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32001, message: "Session not found" } }));
  }
  if (req.method !== "POST" || !isInitializeRequest(body)) {
    res.writeHead(400, { "content-type": "application/json" });
    return res.end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32000, message: "No valid session" } }));
  }
  const transport = new StreamableHTTPServerTransport({
    sessionIdGenerator: () => randomUUID(),
    eventStore: new InMemoryEventStore(),
    retryInterval: 100,
    onsessioninitialized: (sid) => sessions.set(sid, transport),
  });
  await mcpServer().connect(transport);
  return transport.handleRequest(req, res, body);
});
http.listen(0, "127.0.0.1", () => console.log(`listening on http://127.0.0.1:${http.address().port}/mcp`));
