-- wrk script: the call of ../shared/tools/toolcall.lua (`count {"to":1}` with a progress token: one
-- progress notification and the result over SSE, a fresh JSON-RPC id per request) in its
-- 2026-07-28 form: no session, the revision and the client's capabilities in each request's
-- `_meta`, the method and tool mirrored in `Mcp-Method` and `Mcp-Name`. $SIDS is read and
-- ignored, so that scripts/cpu-by-thread and scripts/instructions-per-call drive it as they
-- drive toolcall.lua (TOOLCALL_LUA=bench/toolcall-stateless.lua).
local idx = 0
setup = function(thread)
  idx = idx + 1
  thread:set("tid", idx)
end
local n = 0
request = function()
  n = n + 1
  local headers = {["Content-Type"] = "application/json", ["Accept"] = "application/json, text/event-stream",
                   ["MCP-Protocol-Version"] = "2026-07-28", ["Mcp-Method"] = "tools/call", ["Mcp-Name"] = "count"}
  local body = '{"jsonrpc":"2.0","id":"w' .. tid .. '-' .. n .. '","method":"tools/call","params":{"name":"count",'
    .. '"arguments":{"to":1,"interval_ms":0},"_meta":{"progressToken":' .. n
    .. ',"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}'
  return wrk.format("POST", nil, headers, body)
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT calls_per_s=%.0f p50_ms=%.3f p99_ms=%.3f p999_ms=%.3f max_ms=%.1f errors=%d non2xx=%d\n",
    summary.requests / (summary.duration / 1e6), latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    latency:percentile(99.9) / 1000, latency.max / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout, summary.errors.status))
end
