// Drives a Streamable HTTP MCP server with the official TypeScript SDK client.
//
// Usage: NODE_PATH=<dir with @modelcontextprotocol/sdk> node ts_client.mjs URL
// Checks: tools/list, a tools/call with progress, and a call whose stream the server closes
// mid-call (the SDK must resume with Last-Event-ID and still get the result). Prints what it
// counted and exits non-zero on any mismatch.
import { createRequire } from "node:module";

const require = createRequire(process.env.TETHER_TS_SDK + "/package.json");
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");

const url = new URL(process.argv[2]);
const failures = [];
const client = new Client({ name: "tether-interop", version: "1" });
const transport = new StreamableHTTPClientTransport(url, {
  reconnectionOptions: { initialReconnectionDelay: 100, maxReconnectionDelay: 1000, reconnectionDelayGrowFactor: 1.5, maxRetries: 5 },
});
await client.connect(transport);
console.log("protocolVersion:", transport.protocolVersion);
const tools = (await client.listTools()).tools.map((t) => t.name);
console.log("tools:", tools.length);
for (const needed of ["count", "test_reconnection"]) {
  if (!tools.includes(needed)) failures.push(`tool ${needed} missing`);
}
const progress = [];
const counted = await client.callTool({ name: "count", arguments: { to: 5 } }, undefined, {
  onprogress: (p) => progress.push(p.progress),
  timeout: 30000,
});
console.log("count:", counted.content[0].text, "progress:", progress);
if (counted.content[0].text !== "counted to 5" || progress.join() !== "1,2,3,4,5") {
  failures.push(`count: ${counted.content[0].text} with progress ${progress}`);
}
const reconnected = await client.callTool({ name: "test_reconnection", arguments: {} }, undefined, { timeout: 30000 });
console.log("test_reconnection:", reconnected.content[0].text);
if (reconnected.content[0].text !== "Reconnection test completed") failures.push(`test_reconnection: ${reconnected.content[0].text}`);
await transport.terminateSession();
await client.close();
for (const f of failures) console.log("FAIL:", f);
console.log(`typescript sdk client: ${3 - failures.length} passed, ${failures.length} failed`);
process.exit(failures.length ? 1 : 0);
