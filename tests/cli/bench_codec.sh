#!/usr/bin/env bash
# `pulse-bench codec` on a small synthetic trajectory: exits 0, prints one
# JSON object per step with the required keys, finds changes, beats the
# int32 + BF16 + zstd-1 baseline and "the baseline" (the smallest of every
# baseline through zstd 1, 3 and 19, named), verifies every patch, is deterministic for
# a seed, and rejects bad usage. Needs only bash, grep and awk.
# usage: bash tests/cli/bench_codec.sh BIN_DIR
set -u
BIN_DIR="${1:?usage: bench_codec.sh BIN_DIR}"
BENCH="$BIN_DIR/pulse-bench"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

[ -x "$BENCH" ] || { echo "FAIL: $BENCH is not an executable" >&2; exit 1; }

# Value of a numeric JSON key in one line (empty when absent).
json_num() {
  awk -v key="\"$2\":" '{
    i = index($0, key)
    if (i == 0) exit
    s = substr($0, i + length(key))
    if (match(s, /^-?[0-9][0-9.eE+-]*/)) print substr(s, RSTART, RLENGTH)
  }' <<<"$1"
}

run_json() { # seed outfile
  "$BENCH" codec --params 200000 --steps 3 --reps 1 --seed "$1" --json \
    >"$2" 2>"$TMP/stderr"
}

# 1. A run succeeds and prints three step objects and a summary.
if ! run_json 1 "$TMP/a.json"; then
  fail "pulse-bench codec exited non-zero: $(cat "$TMP/stderr")"
fi
steps=$(grep -c '^{"step":' "$TMP/a.json")
[ "$steps" -eq 3 ] || fail "expected 3 step objects, got $steps"
grep -q '^{"summary":true' "$TMP/a.json" || fail "no summary object"

required="step params changed bytes_v1 bytes_int32_bf16_zstd bound_bytes
encode_bytes_per_s memcpy_bytes_per_s apply_changed_per_s bytes_v1_plain
bytes_v2 bytes_v2_plain bytes_v3 apply_v2_changed_per_s apply_v1_changed_per_s apply_v3_changed_per_s
bytes_dense bytes_dense_zstd bytes_int32_bf16 bytes_delta_abs_zstd
bound_positions_bytes bound_values_bytes patch_encode_s density
bytes_dense_zstd3 bytes_dense_zstd19 bytes_int32_bf16_zstd3 bytes_int32_bf16_zstd19
bytes_delta_abs_zstd3 bytes_delta_abs_zstd19 bytes_gap_xor_zstd bytes_gap_xor_zstd3
bytes_gap_xor_zstd19 dense_zstd19_read_bytes bytes_baseline"
zstd_keys="dense_zstd dense_zstd3 dense_zstd19 int32_bf16_zstd int32_bf16_zstd3
int32_bf16_zstd19 delta_abs_zstd delta_abs_zstd3 delta_abs_zstd19 gap_xor_zstd
gap_xor_zstd3 gap_xor_zstd19"
# Text value of a string JSON key in one line.
json_str() { sed -n "s/.*\"$2\":\"\([^\"]*\)\".*/\1/p" <<<"$1"; }
n=0
while IFS= read -r line; do
  n=$((n + 1))
  for key in $required; do
    [ -n "$(json_num "$line" "$key")" ] || fail "step $n: key $key missing"
  done
  grep -q '"verify":"ok"' <<<"$line" || fail "step $n: not verified"
  [ "$(json_num "$line" step)" -eq "$n" ] || fail "step $n: wrong step number"
  changed=$(json_num "$line" changed)
  base=$(json_num "$line" bytes_int32_bf16_zstd)
  [ "${changed:-0}" -gt 0 ] || fail "step $n: no changes"
  for v in v1 v2; do
    b=$(json_num "$line" "bytes_$v")
    [ "${b:-0}" -gt 0 ] || fail "step $n: empty $v patch"
    [ "${b:-0}" -lt "${base:-0}" ] ||
      fail "step $n: $v ($b B) not smaller than int32+BF16+zstd-1 ($base B)"
  done
  # The baseline is the smallest zstd figure (all measured whole at this
  # size), it is named, and v2 beats it.
  min=""
  for key in $zstd_keys; do
    v=$(json_num "$line" "bytes_$key")
    [ -z "$min" ] || [ "${v:-0}" -lt "$min" ] && min=$v
  done
  best=$(json_num "$line" bytes_baseline)
  [ "$(json_num "$line" dense_zstd19_read_bytes)" = "$(json_num "$line" bytes_dense)" ] ||
    fail "step $n: dense zstd-19 sampled at 200000 parameters"
  [ "$best" = "$min" ] || fail "step $n: the baseline is $best B, the smallest zstd figure $min B"
  name=$(json_str "$line" baseline)
  [ "$(json_num "$line" "bytes_$name")" = "$best" ] || fail "step $n: baseline '$name' is not $best B"
  [ -n "$(json_str "$line" baseline_name)" ] || fail "step $n: the baseline has no name"
  [ "$(json_num "$line" bytes_v2)" -lt "$best" ] || fail "step $n: v2 not smaller than the baseline ($name)"
  awk -v a="$(json_num "$line" apply_changed_per_s)" \
    -v e="$(json_num "$line" encode_bytes_per_s)" \
    'BEGIN { exit !(a > 0 && e > 0) }' || fail "step $n: zero throughput"
done < <(grep '^{"step":' "$TMP/a.json")

sum=$(grep '^{"summary":true' "$TMP/a.json")
for key in ratio_v2_baseline baseline_per_changed gap_xor_zstd19_per_changed; do
  [ -n "$(json_num "$sum" "$key")" ] || fail "summary: key $key missing"
done
awk -v r="$(json_num "$sum" ratio_v2_baseline)" 'BEGIN { exit !(r > 0 && r < 1) }' ||
  fail "summary: v2 / the baseline is not below 1"

# 1b. Decode + apply on several receiver threads: the summary gives the
# default coding's rate through a class index and without one (M changes/s),
# and the thread count; the patches still verify.
if "$BENCH" codec --params 200000 --steps 1 --reps 1 --apply-threads 2 --json \
  >"$TMP/t.json" 2>"$TMP/stderr"; then
  sum=$(grep '^{"summary":true' "$TMP/t.json")
  [ "$(json_num "$sum" apply_threads)" = 2 ] || fail "--apply-threads 2: apply_threads is not 2"
  for key in apply_mchanges_per_s apply_noindex_mchanges_per_s; do
    awk -v v="$(json_num "$sum" "$key")" 'BEGIN { exit !(v > 0) }' ||
      fail "--apply-threads 2: summary $key missing or not positive"
  done
  grep -q '"verify":"ok"' <<<"$sum" || fail "--apply-threads 2: not verified"
else
  fail "--apply-threads 2 exited non-zero: $(cat "$TMP/stderr")"
fi
sum=$(grep '^{"summary":true' "$TMP/a.json")
[ "$(json_num "$sum" apply_threads)" = 1 ] || fail "default apply_threads is not 1"

# 2. Deterministic for a seed: the same sizes twice, other sizes for another
# seed (timings differ, so compare only the size fields).
sizes() {
  grep '^{"step":' "$1" | while IFS= read -r line; do
    echo "$(json_num "$line" changed) $(json_num "$line" bytes_v1)" \
      "$(json_num "$line" bytes_v1_plain) $(json_num "$line" bytes_v2)" \
      "$(json_num "$line" bytes_v2_plain) $(json_num "$line" bound_bytes)"
  done
}
run_json 1 "$TMP/b.json" || fail "second run exited non-zero"
run_json 2 "$TMP/c.json" || fail "run with seed 2 exited non-zero"
[ "$(sizes "$TMP/a.json")" = "$(sizes "$TMP/b.json")" ] ||
  fail "two runs with seed 1 differ"
[ "$(sizes "$TMP/a.json")" != "$(sizes "$TMP/c.json")" ] ||
  fail "seeds 1 and 2 give identical trajectories"

# 3. The readable table names the encodings and ends with a verified summary.
"$BENCH" codec --params 50000 --steps 2 --reps 1 >"$TMP/text" 2>&1 ||
  fail "text run exited non-zero"
for word in "v2, class positions" "v1, class positions" "entropy bound" \
  "int32 index" "summary" "to the bound" "verify OK" "zstd-19" "zstd-3" \
  "the baseline (" "smaller than the baseline"; do
  grep -q "$word" "$TMP/text" || fail "text output lacks '$word'"
done

# 4. Bad usage is refused with status 2 and a message on stderr.
for args in "nosuchmode" "codec --bogus" "codec --params 10" \
  "codec --steps 0" "codec --snapshots only_one.safetensors" \
  "codec --apply-threads -1" "codec --apply-threads many" \
  "codec --params 200000 --snapshots a.safetensors b.safetensors"; do
  # shellcheck disable=SC2086
  "$BENCH" $args >"$TMP/out" 2>"$TMP/err"
  rc=$?
  [ "$rc" -eq 2 ] || fail "'pulse-bench $args' exited $rc, expected 2"
  [ -s "$TMP/err" ] || fail "'pulse-bench $args' printed no error"
  [ ! -s "$TMP/out" ] || fail "'pulse-bench $args' printed to stdout"
done
"$BENCH" --help >"$TMP/out" || fail "--help exited non-zero"
grep -q "codec" "$TMP/out" || fail "--help does not list the codec mode"
"$BENCH" codec --help >"$TMP/out" || fail "codec --help exited non-zero"
grep -q -- "--snapshots" "$TMP/out" || fail "codec --help lacks --snapshots"

# 5. Snapshot input: two tiny safetensors files written byte by byte (BF16
# base, F32 new state cast by the one rounding), two changes.
write_st() { # file header-json data-bytes-as-\x-escapes
  local header="$2"
  while [ $((${#header} % 8)) -ne 0 ]; do # keep the data 8-aligned
    header="$header "
  done
  local n=${#header} le="" i
  for i in 0 1 2 3 4 5 6 7; do
    le="$le$(printf '\\x%02x' $(((n >> (8 * i)) & 255)))"
  done
  printf "$le%s$3" "$header" >"$1"
}
write_st "$TMP/s3.safetensors" \
  '{"__metadata__":{"step":"3"},"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}' \
  '\x80\x3f\x00\x40\x80\xbf\x00\x3f'
# 1.0, 0x40010000, -1.0, 0x3F010000 as F32: elements 1 and 3 change
write_st "$TMP/s4.safetensors" \
  '{"__metadata__":{"step":"4"},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}' \
  '\x00\x00\x80\x3f\x00\x00\x01\x40\x00\x00\x80\xbf\x00\x00\x01\x3f'
if "$BENCH" codec --json --reps 1 --snapshots "$TMP/s3.safetensors" \
  "$TMP/s4.safetensors" >"$TMP/st.json" 2>"$TMP/err"; then
  line=$(grep '^{"step":' "$TMP/st.json")
  [ "$(json_num "$line" step)" = 4 ] || fail "snapshots: step is not 4"
  [ "$(json_num "$line" base_step)" = 3 ] || fail "snapshots: base is not 3"
  [ "$(json_num "$line" params)" = 4 ] || fail "snapshots: params is not 4"
  [ "$(json_num "$line" changed)" = 2 ] || fail "snapshots: changed is not 2"
  grep -q '"verify":"ok"' <<<"$line" || fail "snapshots: not verified"
else
  fail "snapshots run exited non-zero: $(cat "$TMP/err")"
fi

# 6. A missing snapshot file is an error (status 1), not a crash.
"$BENCH" codec --snapshots "$TMP/none0.safetensors" \
  "$TMP/none1.safetensors" >/dev/null 2>"$TMP/err"
rc=$?
[ "$rc" -eq 1 ] || fail "missing snapshots exited $rc, expected 1"

# 7. A synthetic trajectory past the machine's memory is refused at once
# (status 1), with the two commands that measure it from disk instead.
"$BENCH" codec --params 1e12 --steps 2 --lr 1e-6 >"$TMP/out" 2>"$TMP/err"
rc=$?
[ "$rc" -eq 1 ] || fail "--params 1e12 exited $rc, expected 1"
grep -q "pulse-bench trajectory --out DIR --params 1000000000000 --steps 2" "$TMP/err" ||
  fail "--params 1e12: no trajectory command in: $(cat "$TMP/err")"
grep -q "pulse-bench codec --snapshots" "$TMP/err" ||
  fail "--params 1e12: no --snapshots command in: $(cat "$TMP/err")"

if [ "$failures" -ne 0 ]; then
  echo "bench_codec.sh: $failures failure(s)" >&2
  exit 1
fi
echo "bench_codec.sh: OK"
