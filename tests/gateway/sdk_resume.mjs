// The official TypeScript SDK client through `tether gateway`, whose streams a proxy cuts:
// lists the tools, then calls `count` (tests/gateway/stdio_server.py) with progress. The SDK must
// resume each cut stream with Last-Event-ID and get every progress notification exactly once, in
// order, and the result. Exits non-zero on any mismatch.
//
// Usage: TETHER_TS_SDK=<dir with @modelcontextprotocol/sdk> node sdk_resume.mjs URL TO
import { createRequire } from "node:module";

const require = createRequire(process.env.TETHER_TS_SDK + "/package.json");
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");

const [url, to] = [new URL(process.argv[2]), Number(process.argv[3])];
const client = new Client({ name: "tether-gateway-test", version: "1" });
const transport = new StreamableHTTPClientTransport(url, {
  reconnectionOptions: { initialReconnectionDelay: 50, maxReconnectionDelay: 500, reconnectionDelayGrowFactor: 1.5, maxRetries: 20 },
});
await client.connect(transport);
const tools = (await client.listTools()).tools.map((t) => t.name);
const progress = [];
const result = await client.callTool({ name: "count", arguments: { to, interval_ms: 20 } }, undefined, {
  onprogress: (p) => progress.push(p.progress),
  timeout: 60000,
});
await client.close();
const text = result.content[0].text;
console.log(`typescript sdk: tools ${JSON.stringify(tools)}, result ${JSON.stringify(text)}, progress ${JSON.stringify(progress)}`);
const expected = Array.from({ length: to }, (_, i) => i + 1);
const ok = tools.includes("count") && text === `counted to ${to}` && JSON.stringify(progress) === JSON.stringify(expected);
process.exit(ok ? 0 : 1);
