// Benchmark target: a stateful Streamable HTTP MCP server built on the official TypeScript SDK
// (@modelcontextprotocol/sdk, McpServer + StreamableHTTPServerTransport), one McpServer per session.
// Its tools match bench/servers/py_server.py exactly; the Rust load generator calls them:
//   count {to, interval_ms?}  sends `to` notifications on the request's own stream, `interval_ms`
//                             apart (0: no sleep at all): notifications/progress for the request's
//                             _meta.progressToken if it has one, else notifications/message
//                             (level info, data {count: i}); then returns text `counted to N`.
//   notify_all {seq?}         sends one notifications/message (level info, data {seq}) to the
//                             standalone GET stream of every live session (initialized, not yet
//                             closed) and returns text: the number of sessions it was sent to.
//
// Usage: TETHER_TS_SDK=<dir with @modelcontextprotocol/sdk installed> node ts_server.mjs PORT [--json]
//   PORT    port on 127.0.0.1 (loopback only); 0 picks a free one
//   --json  answer POSTs with a JSON body instead of an SSE stream (enableJsonResponse; the
//           count notifications then have no stream to ride and the SDK drops them). Without it:
//           SSE responses, and an in-memory event store that keeps every event, so a client can
//           resume any stream with Last-Event-ID.
// Prints exactly one line, `listening on http://127.0.0.1:PORT/mcp`, once it accepts connections.
// Quiet otherwise: only warnings and errors go to stderr.
import { createServer } from "node:http";
import { randomUUID } from "node:crypto";
import { createRequire } from "node:module";

const args = process.argv.slice(2);
const json = args.includes("--json");
const positional = args.filter((a) => !a.startsWith("--"));
const port = Number(positional[0]);
if (positional.length !== 1 || !Number.isInteger(port) || port < 0 || port > 65535 || args.some((a) => a.startsWith("--") && a !== "--json")) {
  console.error("usage: TETHER_TS_SDK=<dir> node ts_server.mjs PORT [--json]");
  process.exit(2);
}
if (!process.env.TETHER_TS_SDK) {
  console.error("TETHER_TS_SDK must name the directory where @modelcontextprotocol/sdk is installed");
  process.exit(2);
}

const require = createRequire(process.env.TETHER_TS_SDK + "/package.json");
const sdk = (path) => require("@modelcontextprotocol/sdk/" + path);
const { McpServer } = sdk("server/mcp.js");
const { StreamableHTTPServerTransport } = sdk("server/streamableHttp.js");
const { isInitializeRequest } = sdk("types.js");
const { z } = require("zod");

// Every event of one session, kept for the session's life. The SDK's example InMemoryEventStore
// (examples/shared) can't serve here: its event ids are `${streamId}_${Date.now()}_${random}`
// and a replay sorts all events by id, so events stored within the same millisecond come back in
// random order (resumption loses or reorders them) and each replay costs O(all events · log); the
// GET stream's id `_GET_stream` also doesn't survive its split('_'). This one keeps a list per
// stream plus an index from event id to (stream, position): a replay costs what it sends.
let lastEventId = 0; // ids are unique across the whole server
class MemoryEventStore {
  streams = new Map(); // stream id -> [[event id, message]]
  index = new Map(); // event id -> [stream id, position in its list]
  async storeEvent(streamId, message) {
    const eventId = String(++lastEventId);
    let events = this.streams.get(streamId);
    if (events === undefined) this.streams.set(streamId, (events = []));
    this.index.set(eventId, [streamId, events.length]);
    events.push([eventId, message]);
    return eventId;
  }
  async getStreamIdForEventId(eventId) {
    return this.index.get(eventId)?.[0];
  }
  async replayEventsAfter(eventId, { send }) {
    const at = this.index.get(eventId);
    if (at === undefined) return "";
    const [streamId, position] = at;
    const events = this.streams.get(streamId);
    // Up to the list's end as it is when we get there, events stored during the replay included.
    for (let i = position + 1; i < events.length; i++) {
      const [id, message] = events[i];
      if (message.jsonrpc !== undefined) await send(id, message); // skip priming events ({})
    }
    return streamId;
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const transports = new Map(); // session id -> transport, from initialize until the session closes
const live = new Map(); // session id -> McpServer, from notifications/initialized until it closes

function mcpServer(transport) {
  const server = new McpServer({ name: "tether-bench-ts", version: "1" }, { capabilities: { logging: {} } });
  server.registerTool(
    "count",
    {
      description: "Sends `to` notifications on this request's stream, `interval_ms` apart, then returns.",
      inputSchema: { to: z.number().int(), interval_ms: z.number().int().optional() },
    },
    async ({ to, interval_ms = 0 }, extra) => {
      const token = extra._meta?.progressToken;
      for (let i = 1; i <= to; i++) {
        if (token !== undefined) {
          await extra.sendNotification({ method: "notifications/progress", params: { progressToken: token, progress: i, total: to } });
        } else {
          await extra.sendNotification({ method: "notifications/message", params: { level: "info", data: { count: i } } });
        }
        if (interval_ms > 0) await sleep(interval_ms);
      }
      return { content: [{ type: "text", text: `counted to ${to}` }] };
    },
  );
  server.registerTool(
    "notify_all",
    {
      description: "Sends one notifications/message to the GET stream of every live session; returns how many.",
      inputSchema: { seq: z.number().int().optional() },
    },
    async ({ seq }) => {
      // A raw notification with no related request goes to each session's standalone GET stream
      // (or, with no GET stream open, only to its event store). Not sendLoggingMessage: that one
      // drops messages below a level the session chose with logging/setLevel.
      const notification = { method: "notifications/message", params: { level: "info", data: { seq: seq ?? null } } };
      let sent = 0;
      for (const other of live.values()) {
        try {
          await other.server.notification(notification);
          sent++;
        } catch (e) {
          console.error(`warning: notify_all: ${e.message}`);
        }
      }
      return { content: [{ type: "text", text: String(sent) }] };
    },
  );
  server.server.oninitialized = () => live.set(transport.sessionId, server);
  server.server.onclose = () => {
    transports.delete(transport.sessionId);
    live.delete(transport.sessionId);
  };
  return server;
}

function jsonError(res, status, code, message) {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code, message } }));
}

const http = createServer(async (req, res) => {
  try {
    if (new URL(req.url, "http://x").pathname !== "/mcp") {
      res.writeHead(404).end();
      return;
    }
    let body;
    if (req.method === "POST") {
      const chunks = [];
      for await (const chunk of req) chunks.push(chunk);
      try {
        body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      } catch {
        return jsonError(res, 400, -32700, "Parse error");
      }
    }
    const id = req.headers["mcp-session-id"];
    if (id !== undefined) {
      const transport = transports.get(id);
      if (transport === undefined) return jsonError(res, 404, -32001, "Session not found");
      return await transport.handleRequest(req, res, body);
    }
    if (req.method !== "POST" || !isInitializeRequest(body)) {
      return jsonError(res, 400, -32000, "Bad Request: No valid session ID provided");
    }
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      enableJsonResponse: json,
      eventStore: json ? undefined : new MemoryEventStore(),
      onsessioninitialized: (sid) => transports.set(sid, transport),
    });
    await mcpServer(transport).connect(transport);
    await transport.handleRequest(req, res, body);
  } catch (e) {
    console.error(`error: ${req.method} ${req.url}: ${e.stack ?? e}`);
    if (!res.headersSent) jsonError(res, 500, -32603, "Internal server error");
    else res.end();
  }
});
// A deep accept queue: the fan-out benchmark opens ~1,000 GET streams at once.
http.listen({ port, host: "127.0.0.1", backlog: 4096 }, () => {
  process.stdout.write(`listening on http://127.0.0.1:${http.address().port}/mcp\n`);
});
