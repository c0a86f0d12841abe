#!/usr/bin/env bash
# `pulse-bench loco` briefly: exits 0, prints one JSON object per round and
# a summary with the required keys, sends at least 10x fewer bytes than
# DiLoCo and 100x fewer than DDP, keeps every replica identical (also with
# lost payloads, a joiner and a leaver), and refuses bad usage. Needs only
# bash, grep and awk.
# usage: bash tests/cli/loco_bench.sh BIN_DIR
set -u
BIN_DIR="${1:?usage: loco_bench.sh BIN_DIR}"
BENCH="$BIN_DIR/pulse-bench"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

[ -x "$BENCH" ] || { echo "FAIL: $BENCH is not an executable" >&2; exit 1; }

# Value of a JSON key in one line: a number, true or false (empty when absent).
json_val() {
  awk -v key="\"$2\":" '{
    i = index($0, key)
    if (i == 0) exit
    s = substr($0, i + length(key))
    if (match(s, /^(-?[0-9][0-9.eE+-]*|true|false)/)) print substr(s, RSTART, RLENGTH)
  }' <<<"$1"
}

# 1. A short run: round objects, a summary with the required keys.
if ! "$BENCH" loco --rounds 8 --params 30000 --json >"$TMP/a.json" 2>"$TMP/err"; then
  fail "pulse-bench loco exited non-zero: $(cat "$TMP/err")"
fi
rounds=$(grep -c '^{"round":' "$TMP/a.json")
[ "$rounds" -eq 8 ] || fail "expected 8 round objects, got $rounds"
summary=$(grep '^{"summary":true' "$TMP/a.json")
[ -n "$summary" ] || fail "no summary object"
for key in bytes_ddp bytes_diloco bytes_pulseloco final_loss_ddp final_loss_diloco \
  final_loss_pulseloco initial_loss loss_floor replicas_identical; do
  [ -n "$(json_val "$summary" "$key")" ] || fail "summary: key $key missing"
done
ddp=$(json_val "$summary" bytes_ddp)
dil=$(json_val "$summary" bytes_diloco)
pl=$(json_val "$summary" bytes_pulseloco)
awk -v p="${pl:-0}" -v d="${dil:-0}" 'BEGIN { exit !(p > 0 && p * 10 <= d) }' ||
  fail "bytes_pulseloco ($pl) * 10 > bytes_diloco ($dil)"
awk -v p="${pl:-0}" -v d="${ddp:-0}" 'BEGIN { exit !(p > 0 && p * 100 <= d) }' ||
  fail "bytes_pulseloco ($pl) * 100 > bytes_ddp ($ddp)"
[ "$(json_val "$summary" replicas_identical)" = true ] || fail "replicas differ"
# Losses are numbers below the start, above the floor.
awk -v s="$(json_val "$summary" initial_loss)" -v f="$(json_val "$summary" loss_floor)" \
  -v a="$(json_val "$summary" final_loss_diloco)" -v b="$(json_val "$summary" final_loss_pulseloco)" \
  'BEGIN { exit !(a < s && b < s && a > f && b > f) }' || fail "losses out of order: $summary"
while IFS= read -r line; do
  for key in loss_ddp loss_diloco loss_pulseloco bytes_ddp bytes_diloco bytes_pulseloco \
    density contributors; do
    [ -n "$(json_val "$line" "$key")" ] || fail "round line lacks $key: $line"
  done
done < <(grep '^{"round":' "$TMP/a.json")

# 2. Deterministic for a seed without loss: the same PULSELoCo bytes twice.
"$BENCH" loco --rounds 8 --params 30000 --json >"$TMP/b.json" 2>/dev/null ||
  fail "second run exited non-zero"
[ "$(json_val "$(grep '^{"summary"' "$TMP/b.json")" bytes_pulseloco)" = "$pl" ] ||
  fail "two runs with seed 1 sent different bytes"

# 3. Lost payloads, a joiner and a leaver: still one global state.
if "$BENCH" loco --rounds 10 --params 20000 --inner 5 --drop-rate 0.3 --join-round 3 \
  --leave-round 6 --json >"$TMP/c.json" 2>"$TMP/err"; then
  s=$(grep '^{"summary":true' "$TMP/c.json")
  [ "$(json_val "$s" replicas_identical)" = true ] || fail "churn run: replicas differ"
  grep -q '"members":4' "$TMP/c.json" || fail "churn run: the joiner never became a member"
  grep -q '"contributors":[12],' "$TMP/c.json" || fail "churn run: no round lost a payload"
else
  fail "churn run exited non-zero: $(cat "$TMP/err")"
fi

# 4. The readable output names the targets.
"$BENCH" loco --rounds 3 --params 10000 --inner 5 >"$TMP/text" 2>&1 || fail "text run failed"
for word in "PULSELoCo" "DiLoCo" "DDP" "target 10x" "replicas identical"; do
  grep -q "$word" "$TMP/text" || fail "text output lacks '$word'"
done

# 5. Bad usage: status 2, a message on stderr, nothing on stdout.
for args in "loco --bogus" "loco --trainers 0" "loco --rounds 0" "loco --drop-rate 1.5" \
  "loco --params 10" "loco --join-round 9 --rounds 5" "loco --trainers 1 --leave-round 1"; do
  # shellcheck disable=SC2086
  "$BENCH" $args >"$TMP/out" 2>"$TMP/err"
  rc=$?
  [ "$rc" -eq 2 ] || fail "'pulse-bench $args' exited $rc, expected 2"
  [ -s "$TMP/err" ] || fail "'pulse-bench $args' printed no error"
  [ ! -s "$TMP/out" ] || fail "'pulse-bench $args' printed to stdout"
done
"$BENCH" --help >"$TMP/out" || fail "--help exited non-zero"
grep -q "loco" "$TMP/out" || fail "--help does not list the loco mode"
"$BENCH" loco --help >"$TMP/out" || fail "loco --help exited non-zero"
grep -q -- "--drop-rate" "$TMP/out" || fail "loco --help lacks --drop-rate"

if [ "$failures" -ne 0 ]; then
  echo "loco_bench.sh: $failures failure(s)" >&2
  exit 1
fi
echo "loco_bench.sh: OK"
