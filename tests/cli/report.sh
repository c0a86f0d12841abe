#!/usr/bin/env bash
# `pulse-bench MODE --report DIR`: CSV tables plus one self-contained HTML page
# with one inline SVG per chart; renders in headless Chromium when installed.
# Usage: report.sh BIN_DIR
set -u
bin=$1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 failed=0
check() { if eval "$2"; then pass=$((pass + 1)); else echo "FAIL: $1"; failed=$((failed + 1)); fi; }

"$bin/pulse-bench" demo --params 300000 --steps 3 --report "$TMP/demo" >"$TMP/demo.out" 2>&1
check "demo --report exits 0" '[ $? -eq 0 ] || { cat "$TMP/demo.out"; false; }'
"$bin/pulse-bench" codec --params 200000 --steps 3 --report "$TMP/codec" >"$TMP/codec.out" 2>&1
check "codec --report exits 0" '[ $? -eq 0 ] || { cat "$TMP/codec.out"; false; }'

check "demo steps.csv header" \
  '[ "$(head -1 "$TMP/demo/steps.csv")" = "step,changed,density_pct,pulse_bytes_per_puller,dense_bf16_bytes,reduction_x,sync_ms" ]'
check "demo steps.csv: 4 rows (anchor + 3 steps)" '[ "$(tail -n +2 "$TMP/demo/steps.csv" | wc -l)" -eq 4 ]'
check "codec steps.csv header" \
  '[ "$(head -1 "$TMP/codec/steps.csv")" = "step,changed,density_pct,v2_class,v2_plain,v1_class,v1_plain,v3_class,entropy_bound,dense_bf16,dense_zstd1,dense_zstd3,dense_zstd19,int32_bf16,int32_bf16_zstd1,int32_bf16_zstd3,int32_bf16_zstd19,gap_abs_zstd1,gap_abs_zstd3,gap_abs_zstd19,gap_xor_zstd1,gap_xor_zstd3,gap_xor_zstd19" ]'
check "codec steps.csv: 3 rows" '[ "$(tail -n +2 "$TMP/codec/steps.csv" | wc -l)" -eq 3 ]'
check "codec per_changed.csv: 20 encodings" \
  '[ "$(head -1 "$TMP/codec/per_changed.csv")" = "encoding,bytes_per_changed" ] && [ "$(tail -n +2 "$TMP/codec/per_changed.csv" | wc -l)" -eq 20 ]'
for m in demo:3 codec:3; do
  d=$TMP/${m%%:*} n=${m##*:} html=$TMP/${m%%:*}/report.html
  check "${m%%:*}: report.html has $n charts" '[ "$(grep -o "<svg" "$html" | wc -l)" -eq "$n" ]'
  check "${m%%:*}: no external references" '! grep -qi "http" "$html"'
  check "${m%%:*}: no script" '! grep -qi "<script" "$html"'
  check "${m%%:*}: header names the machine" 'grep -q "CPUs (nproc)" "$html"'
  check "${m%%:*}: charts have axis labels" 'grep -q "log scale" "$html"'
done
check "an existing output is unchanged by --report" 'grep -q "summary: 3 steps" "$TMP/demo.out"'

chromium=/usr/bin/chromium
if [ -x "$chromium" ]; then
  for m in demo codec; do
    shot=$TMP/$m/shot.png
    timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
      --disable-background-networking --disable-component-update --disable-sync \
      --user-data-dir="$(mktemp -d "$TMP/chrome.XXXXXX")" --screenshot="$shot" \
      --window-size=1200,2400 "file://$TMP/$m/report.html" >"$TMP/chrome.log" 2>&1
    size=$(stat -c %s "$shot" 2>/dev/null || echo 0)
    check "$m: screenshot is a PNG" 'head -c 8 "$shot" 2>/dev/null | od -An -c | grep -q "P   N   G" || { tail -5 "$TMP/chrome.log"; false; }'
    check "$m: screenshot is not trivial ($size bytes > 10 kB)" '[ "$size" -gt 10240 ]'
    [ -n "${PULSE_REPORT_KEEP:-}" ] && mkdir -p "$PULSE_REPORT_KEEP" && cp "$shot" "$PULSE_REPORT_KEEP/$m.png"
  done
else
  echo "skipped: chromium not installed"
fi
echo "report: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
