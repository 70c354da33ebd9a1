// Drives `tether connect URL` with the official TypeScript SDK's v2 stdio client
// (@modelcontextprotocol/client), as a desktop application would launch it, negotiating the
// revision in one of the SDK's modes.
//
// Usage: TETHER_TS_CLIENT=<dir with @modelcontextprotocol/client installed> \
//          node ts_stdio_client.mjs TETHER URL MODE SERVER [CONNECT_FLAGS...]
//   MODE    `legacy`, `auto` (server/discover, falling back to the handshake; on stdio the SDK
//           probes on a sibling process of its own) or `2026-07-28` (pinned: discovery must offer
//           it)
//   SERVER  `tether`: `tether serve` (a call of `count` delivers its progress and, at
//           2026-07-28, a multi round-trip call is answered); `sdk`: an SDK server of the
//           handshake era only, reached at 2026-07-28 through the bridge's translation (a call
//           of `count` gets its result)
// Checks: start-up answers without a stall, tools/list, and the calls above. Prints what it
// measured and exits non-zero on any mismatch.
import { createRequire } from "node:module";

const require = createRequire(process.env.TETHER_TS_CLIENT + "/package.json");
const { Client } = require("@modelcontextprotocol/client");
const { StdioClientTransport } = require("@modelcontextprotocol/client/stdio");

// The SDK's stalls are ten seconds and more: a start-up slower than this is one, not a slow
// machine.
const STARTUP_STALL_MS = 5000;

const [tether, url, mode, serverKind, ...flags] = process.argv.slice(2);
const negotiation = mode === "legacy" || mode === "auto" ? { mode } : { mode: { pin: mode } };
const failures = [];
const client = new Client(
  { name: "ts-stdio-interop", version: "1" },
  { capabilities: { elicitation: {} }, versionNegotiation: negotiation },
);
client.setRequestHandler("elicitation/create", async () => ({ action: "accept", content: { name: "mrtr" } }));
const transport = new StdioClientTransport({ command: tether, args: ["connect", url, ...flags], stderr: "ignore" });
const started = performance.now();
await client.connect(transport);
const took = performance.now() - started;
const revision = client.getNegotiatedProtocolVersion();
console.log(`${mode}: start-up ${(took / 1000).toFixed(2)} s, revision ${revision}`);
if (took > STARTUP_STALL_MS) failures.push(`the start-up stalled for ${(took / 1000).toFixed(1)} s`);
const modern = revision === "2026-07-28";
if ((mode === "legacy") === modern) failures.push(`mode ${mode} speaks ${revision}`);

const tools = (await client.listTools()).tools.map((t) => t.name);
console.log("tools:", tools.length);
if (!tools.includes("count")) failures.push("tool count missing");
if (serverKind === "tether") {
  const progress = [];
  // The SDK hands notifications to their handlers a microtask late, so progress read in the same
  // chunk as its response finds the handler gone (typescript-sdk#2580), however the bridge
  // orders them: the notifications are spaced apart, but the last one is sent right before the
  // result and may be lost that way. Any other loss, repeat or reordering is the bridge's.
  const counted = await client.callTool({ name: "count", arguments: { to: 5, interval_ms: 30 } }, {
    onprogress: (p) => progress.push(p.progress),
    timeout: 30000,
  });
  console.log("count:", counted.content[0].text, "progress:", progress);
  if (counted.content[0].text !== "counted to 5" || !["1,2,3,4,5", "1,2,3,4"].includes(progress.join())) {
    failures.push(`count: ${counted.content[0].text} with progress ${progress}`);
  }
  if (modern) {
    const asked = await client.callTool({ name: "test_input_required_result_elicitation", arguments: {} }, { timeout: 30000 });
    console.log("input required:", asked.content[0].text);
    if (asked.content[0].text !== "Hello, mrtr!") failures.push(`the multi round-trip call answered ${asked.content[0].text}`);
  }
} else {
  const counted = await client.callTool({ name: "count", arguments: { to: 4 } }, { timeout: 30000 });
  console.log("count:", counted.content[0].text);
  if (counted.content[0].text !== "counted to 4") failures.push(`count: ${counted.content[0].text}`);
}
await client.close();
for (const f of failures) console.log("FAIL:", f);
console.log(`typescript sdk stdio client (${mode}): ${failures.length} failed`);
process.exit(failures.length ? 1 : 0);
