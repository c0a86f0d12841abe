#!/usr/bin/env bash
# `pulse-bench topology` briefly: exits 0, prints one JSON object per arm
# and round with the issue's fields and one summary per arm with arm,
# variance, predicted_variance (null for adaptive), bytes_per_node and
# final_loss; the multi-process run over HTTP on 127.0.0.1 (--processes)
# prints the same numbers, line for line, as the in-process run; --report
# writes report.html with a chart per figure; bad usage is refused.
# usage: bash tests/cli/topology_bench.sh BIN_DIR
set -u
BIN_DIR="${1:?usage: topology_bench.sh BIN_DIR}"
BENCH="$BIN_DIR/pulse-bench"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
[ -x "$BENCH" ] || { echo "FAIL: $BENCH is not an executable" >&2; exit 1; }

ARGS=(--nodes 4 --rounds 4 --inner 1 --params 2000 --arms ring,complete,adaptive --json)
"$BENCH" topology "${ARGS[@]}" --report "$TMP/rep" >"$TMP/mem.json" 2>"$TMP/mem.err" ||
  fail "in-process run exited $? ($(cat "$TMP/mem.err"))"
"$BENCH" topology "${ARGS[@]}" --processes >"$TMP/http.json" 2>"$TMP/http.err" ||
  fail "multi-process run exited $? ($(cat "$TMP/http.err"))"

rounds=$(grep -c '"round":' "$TMP/mem.json")
[ "$rounds" -eq 12 ] || fail "expected 12 round lines (3 arms x 4), got $rounds"
for key in variance consensus_distance loss bytes_per_node; do
  n=$(grep '"round":' "$TMP/mem.json" | grep -c "\"$key\":")
  [ "$n" -eq 12 ] || fail "round lines lack $key ($n of 12)"
done
summaries=$(grep -c '"summary":true' "$TMP/mem.json")
[ "$summaries" -eq 3 ] || fail "expected 3 summaries, got $summaries"
for key in arm variance predicted_variance bytes_per_node final_loss; do
  n=$(grep '"summary":true' "$TMP/mem.json" | grep -c "\"$key\":")
  [ "$n" -eq 3 ] || fail "summaries lack $key"
done
grep '"summary":true' "$TMP/mem.json" | grep '"arm":"adaptive"' |
  grep -q '"predicted_variance":null' || fail "adaptive's prediction is not null"
grep '"summary":true' "$TMP/mem.json" | grep '"arm":"ring"' |
  grep -q '"predicted_variance":[0-9]' || fail "ring has no prediction"
tail -n 3 "$TMP/mem.json" | grep -c '"summary":true' | grep -q 3 ||
  fail "the output does not end with the summaries"

# The real exchange gives the same numbers (and the same final parameters:
# the digest is in each summary).
if ! diff <(grep -v '"seconds"' "$TMP/mem.json") <(grep -v '"seconds"' "$TMP/http.json") >"$TMP/diff"; then
  fail "HTTP run differs from the in-process run: $(head -c 600 "$TMP/diff")"
fi

[ -s "$TMP/rep/report.html" ] || fail "no report.html"
for t in variance loss bytes_per_node consensus_distance summary; do
  [ -s "$TMP/rep/$t.csv" ] || fail "no $t.csv"
done
[ "$(grep -c '<svg' "$TMP/rep/report.html")" -ge 4 ] || fail "report has fewer than 4 charts"

"$BENCH" topology --nodes 12 --arms adaptive >/dev/null 2>&1
[ $? -eq 2 ] || fail "--nodes 12 with adaptive was not refused with 2"
"$BENCH" topology --arms ring,bogus >/dev/null 2>&1
[ $? -eq 2 ] || fail "an unknown arm was not refused with 2"
"$BENCH" topology --rounds x >/dev/null 2>&1
[ $? -eq 2 ] || fail "a bad --rounds was not refused with 2"

[ "$failures" -eq 0 ] || exit 1
echo "topology bench: ok"
