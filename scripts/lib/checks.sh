# Shared by scripts/interop and scripts/gateway (source it; it is not a command): `check`, which
# counts passes and failures, and `expect_probe URL EXIT [ID=VERDICT...] [-- PROBE FLAGS...]`,
# which runs `tether probe` and compares its exit status and the named checks' verdicts ($TETHER
# must be set). The probe's JSON is kept in $LOGS/probe-<n>.json; PROBE_JSON names the last one.

passed=0
failed=0
probes=0
check() { # description, then a command that must succeed
  local what=$1; shift
  if "$@"; then passed=$((passed + 1)); echo "ok   $what"; else failed=$((failed + 1)); echo "FAIL $what"; fi
}

expect_probe() {
  local url=$1 want=$2 rc=0 expected=() flags=(); shift 2
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do expected+=("$1"); shift; done
  [ $# -gt 0 ] && { shift; flags=("$@"); }
  probes=$((probes + 1))
  PROBE_JSON="$LOGS/probe-$probes.json"
  timeout 120 "$TETHER" probe --format json "${flags[@]}" "$url" >"$PROBE_JSON" || rc=$?
  python3 -c "$CHECK_PROBE" "$rc" "$want" "${expected[@]}" <"$PROBE_JSON"
}
CHECK_PROBE='
import json, sys
rc, want, expected = int(sys.argv[1]), int(sys.argv[2]), dict(a.split("=") for a in sys.argv[3:])
checks = {c["id"]: c for c in json.load(sys.stdin)["checks"]}
verdicts = {k: c["verdict"] for k, c in checks.items()}
wrong = {k: verdicts.get(k) for k, v in expected.items() if verdicts.get(k) != v}
print(f"  exit {rc}, verdicts {verdicts}" + (f", unexpected {wrong}" if wrong else ""))
for k in wrong:
    print(f"  {k}: {json.dumps(checks.get(k))}")
sys.exit(0 if rc == want and not wrong else 1)
'
