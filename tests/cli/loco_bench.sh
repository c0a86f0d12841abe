#!/usr/bin/env bash
# `pulse-bench loco` briefly: exits 0, prints one JSON object per round and
# a summary with the required keys, names every baseline (DDP-FP32,
# DiLoCo-BF16 the reference, DiLoCo-FP32), counts bytes that agree with the
# message sizes (each dense message is 40 + 4 or 2 bytes per parameter,
# sent once per trainer and round, or per inner step for DDP, and served
# once to each other trainer), puts at least 10x fewer bytes on the wire
# than DiLoCo-FP32, 5x fewer than DiLoCo-BF16 and 100x fewer than DDP-FP32
# on a short run, keeps every replica identical (also with lost payloads, a
# joiner and a leaver), and refuses bad usage. Needs only bash, grep and awk.
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
if ! "$BENCH" loco --problem teacher --rounds 8 --params 30000 --json >"$TMP/a.json" 2>"$TMP/err"; then
  fail "pulse-bench loco exited non-zero: $(cat "$TMP/err")"
fi
rounds=$(grep -c '^{"round":' "$TMP/a.json")
[ "$rounds" -eq 8 ] || fail "expected 8 round objects, got $rounds"
summary=$(grep '^{"summary":true' "$TMP/a.json")
[ -n "$summary" ] || fail "no summary object"
methods="ddp_fp32 diloco_bf16 diloco_fp32 pulseloco"
baselines="ddp_fp32 diloco_bf16 diloco_fp32"
for m in $methods; do
  for key in bytes_$m wire_bytes_$m wire_bytes_per_trainer_round_$m final_loss_$m; do
    [ -n "$(json_val "$summary" "$key")" ] || fail "summary: key $key missing"
  done
done
for m in $baselines; do
  for key in message_bytes_$m reduction_vs_$m pulseloco_vs_${m}_loss; do
    [ -n "$(json_val "$summary" "$key")" ] || fail "summary: key $key missing"
  done
done
for key in initial_loss loss_floor params target_10x_diloco_bf16 target_100x_ddp_fp32 \
  target_loss_2pct_diloco_bf16 replicas_identical final_loss bytes_per_trainer update_bias; do
  [ -n "$(json_val "$summary" "$key")" ] || fail "summary: key $key missing"
done
grep -q '"baseline":"diloco_bf16"' <<<"$summary" || fail "summary does not name DiLoCo-BF16 its baseline"
P=$(json_val "$summary" params)
# Dense messages: a 40-byte header and 4 (FP32) or 2 (BF16) bytes per parameter.
[ "$(json_val "$summary" message_bytes_ddp_fp32)" = "$((40 + 4 * P))" ] ||
  fail "DDP-FP32 message is not 40 + 4 x $P bytes: $summary"
[ "$(json_val "$summary" message_bytes_diloco_fp32)" = "$((40 + 4 * P))" ] ||
  fail "DiLoCo-FP32 message is not 40 + 4 x $P bytes"
[ "$(json_val "$summary" message_bytes_diloco_bf16)" = "$((40 + 2 * P))" ] ||
  fail "DiLoCo-BF16 message is not 40 + 2 x $P bytes"
# Sent: one message per trainer and round (DDP: per inner step, 20 of them);
# on the wire: each served to the two other trainers.
for m in $baselines; do
  per=1
  [ "$m" = ddp_fp32 ] && per=20
  msg=$(json_val "$summary" message_bytes_$m)
  sent=$(json_val "$summary" bytes_$m)
  wire=$(json_val "$summary" wire_bytes_$m)
  [ "$sent" = "$((msg * 3 * 8 * per))" ] || fail "$m: sent $sent, messages of $msg x 3 trainers x 8 rounds x $per"
  [ "$wire" = "$((2 * sent))" ] || fail "$m: $wire bytes on the wire for $sent sent to 2 others each"
done
ddp=$(json_val "$summary" wire_bytes_ddp_fp32)
bf16=$(json_val "$summary" wire_bytes_diloco_bf16)
fp32=$(json_val "$summary" wire_bytes_diloco_fp32)
pl=$(json_val "$summary" wire_bytes_pulseloco)
plsent=$(json_val "$summary" bytes_pulseloco)
# Every PULSELoCo payload goes to the two other trainers, with the manifests.
awk -v w="${pl:-0}" -v s="${plsent:-0}" 'BEGIN { exit !(s > 0 && w >= 2 * s && w < 2.2 * s) }' ||
  fail "PULSELoCo: $pl bytes on the wire for $plsent sent"
awk -v p="${pl:-0}" -v d="${fp32:-0}" 'BEGIN { exit !(p > 0 && p * 10 <= d) }' ||
  fail "wire_bytes_pulseloco ($pl) * 10 > wire_bytes_diloco_fp32 ($fp32)"
awk -v p="${pl:-0}" -v d="${bf16:-0}" 'BEGIN { exit !(p > 0 && p * 5 <= d) }' ||
  fail "wire_bytes_pulseloco ($pl) * 5 > wire_bytes_diloco_bf16 ($bf16)"
awk -v p="${pl:-0}" -v d="${ddp:-0}" 'BEGIN { exit !(p > 0 && p * 100 <= d) }' ||
  fail "wire_bytes_pulseloco ($pl) * 100 > wire_bytes_ddp_fp32 ($ddp)"
awk -v r="$(json_val "$summary" reduction_vs_diloco_bf16)" -v p="${pl:-0}" -v d="${bf16:-0}" \
  'BEGIN { exit !(p > 0 && (r - d / p) ^ 2 < 0.0001) }' || fail "reduction_vs_diloco_bf16 is not its bytes' ratio"
[ "$(json_val "$summary" replicas_identical)" = true ] || fail "replicas differ"
# Losses are numbers below the start, above the floor.
for m in $methods; do
  awk -v s="$(json_val "$summary" initial_loss)" -v f="$(json_val "$summary" loss_floor)" \
    -v a="$(json_val "$summary" final_loss_$m)" 'BEGIN { exit !(a < s && a > f) }' ||
    fail "final_loss_$m out of order: $summary"
done
while IFS= read -r line; do
  for m in $methods; do
    for key in loss_$m bytes_$m wire_bytes_$m; do
      [ -n "$(json_val "$line" "$key")" ] || fail "round line lacks $key: $line"
    done
  done
  for key in message_bytes_diloco_bf16 density contributors; do
    [ -n "$(json_val "$line" "$key")" ] || fail "round line lacks $key: $line"
  done
  b=$(json_val "$line" bytes_diloco_bf16)
  [ "$(json_val "$line" wire_bytes_diloco_bf16)" = "$((2 * b))" ] ||
    fail "round line: DiLoCo-BF16 on the wire is not twice what was sent: $line"
done < <(grep '^{"round":' "$TMP/a.json")

# 2. Deterministic for a seed without loss: the same PULSELoCo bytes twice.
"$BENCH" loco --problem teacher --rounds 8 --params 30000 --json >"$TMP/b.json" 2>/dev/null ||
  fail "second run exited non-zero"
[ "$(json_val "$(grep '^{"summary"' "$TMP/b.json")" bytes_pulseloco)" = "$plsent" ] ||
  fail "two runs with seed 1 sent different bytes"

# 3. Lost payloads, a joiner and a leaver: still one global state.
if "$BENCH" loco --problem teacher --rounds 10 --params 20000 --inner 5 --drop-rate 0.3 --join-round 3 \
  --leave-round 6 --json >"$TMP/c.json" 2>"$TMP/err"; then
  s=$(grep '^{"summary":true' "$TMP/c.json")
  [ "$(json_val "$s" replicas_identical)" = true ] || fail "churn run: replicas differ"
  grep -q '"members":4' "$TMP/c.json" || fail "churn run: the joiner never became a member"
  grep -q '"contributors":[12],' "$TMP/c.json" || fail "churn run: no round lost a payload"
else
  fail "churn run exited non-zero: $(cat "$TMP/err")"
fi

# Without loss every rule applies the lossless update: update_bias 1.
awk -v b="$(json_val "$summary" update_bias)" 'BEGIN { exit !(b > 0.9999 && b < 1.0001) }' ||
  fail "update_bias without loss is not 1: $summary"
grep -q '"rule":"drop"' <<<"$summary" || fail "summary does not name the default rule drop"

# 3b. A rule by name, PULSELoCo alone: the replica and the trainers agree.
if "$BENCH" loco --problem teacher --rounds 6 --params 20000 --inner 5 --drop-rate 0.3 --rule legacy \
  --only-pulseloco --json >"$TMP/d.json" 2>"$TMP/err"; then
  s=$(grep '^{"summary":true' "$TMP/d.json")
  grep -q '"rule":"legacy"' <<<"$s" || fail "--rule legacy: summary names another rule"
  [ "$(json_val "$s" replicas_identical)" = true ] || fail "--rule legacy: replicas differ"
  [ "$(json_val "$s" bytes_ddp_fp32)" = 0 ] || fail "--only-pulseloco ran DDP"
else
  fail "--rule legacy --only-pulseloco exited non-zero: $(cat "$TMP/err")"
fi

# 4. The readable output names every baseline and the targets.
"$BENCH" loco --problem teacher --rounds 3 --params 10000 --inner 5 >"$TMP/text" 2>&1 || fail "text run failed"
for word in "PULSELoCo" "DiLoCo-BF16" "DiLoCo-FP32" "DDP-FP32" "fewer bytes on the wire than DiLoCo-BF16 (FP32: " \
  ">= 10x fewer than DiLoCo-BF16" "replicas identical"; do
  grep -q "$word" "$TMP/text" || fail "text output lacks '$word'"
done

# 5. Bad usage: status 2, a message on stderr, nothing on stdout.
for args in "loco --bogus" "loco --trainers 0" "loco --rounds 0" "loco --drop-rate 1.5" \
  "loco --params 10" "loco --join-round 9 --rounds 5" "loco --trainers 1 --leave-round 1" \
  "loco --rule fair" "loco --problem bogus" "loco --text"; do
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
