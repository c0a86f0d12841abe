#!/usr/bin/env bash
# The main job end to end, small: a trainer publishes, two pullers follow over
# HTTP, every step bit-identical, fewer bytes than dense. Usage: demo.sh BIN_DIR
set -u
bin=$1
out=$("$bin/pulse-bench" demo --params 300000 --steps 4 --pullers 2 --json) || {
  echo "FAIL: pulse-bench demo exited non-zero"; echo "$out"; echo "demo: 0 passed, 1 failed"; exit 1; }
pass=0 failed=0
check() { if eval "$2"; then pass=$((pass + 1)); else echo "FAIL: $1"; failed=$((failed + 1)); fi; }
steps=$(printf '%s\n' "$out" | grep -c '"step":')
check "one object per step (5)" '[ "$steps" -eq 5 ]'
check "every step identical" '! printf "%s\n" "$out" | grep "\"step\":" | grep -q "\"identical\":false"'
summary=$(printf '%s\n' "$out" | grep '"summary":true')
check "a summary" '[ -n "$summary" ]'
check "summary says identical" 'printf "%s" "$summary" | grep -q "\"identical\":true"'
reduction=$(printf '%s' "$summary" | sed 's/.*"reduction":\([0-9.]*\).*/\1/')
check "fewer bytes than dense (reduction $reduction > 20)" 'awk -v r="$reduction" "BEGIN{exit !(r > 20)}"'
echo "demo: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
