#!/usr/bin/env bash
# What an inference engine reads from pulse-pull's --out file right after a
# kill -9, before any restart repairs it (issue "Reliability and security",
# finding 12: 2 of 30 kills at 600 ms steps left a file that loaded as a mix
# of two steps). A plain safetensors reader (lib/st_check.py: the header
# length, the JSON, dtypes and offsets, then the tensors' bytes against each
# published step) must either refuse the file or see exactly one published
# step, with the claim of that step.
#  1. Exact points: the library's hook (PULSE_TEST_KILL_AFTER_BYTES=N)
#     kills pulse-pull at byte N of a step written in place, for N across
#     the whole step (journal, header, pages); the file is checked right
#     after each kill, then after the restart that repairs it.
#  2. Real kills: pulse-pull --follow of a publisher that moves every 150 ms,
#     killed with SIGKILL at random times (bounded count and time).
# Usage: pull_crash_loader.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
command -v python3 >/dev/null || { echo "python3 is needed: skipped"; exit 77; }
check() { python3 "$(dirname "$0")/lib/st_check.py" "$@"; }
publish() { "$bin/pulse-publish" --store "$work/store" --keep 60 "$@" >>"$work/pub.out" 2>&1 || bad "publish $*"; }
written() { grep '"event":"synced"' "$1" | tail -1 | sed -n 's/.*"file_bytes_written":\([0-9]*\).*/\1/p'; }

steps=40
"$bin/pulse-bench" trajectory --out "$work/traj" --params 300000 --steps $steps --seed 9 >/dev/null || exit 1
publish --new-key "$(ck 0)" "$(ck 1)"
key=$work/store/signing-key.pem
serve "$work/store" || exit 1
hex=$("$bin/pulse-publish" --store "$work/store" --public-key)
mkdir -p "$work/w"
out=$work/w/m.safetensors
journal=$work/w/.m.safetensors.journal
pull() { "$bin/pulse-pull" "$url" --out "$1" --key "$hex" --json --threads 1 --no-catchup >"$2" 2>&1; }
repair() { "$bin/pulse-pull" http://127.0.0.1:1 --out "$out" --key "$hex" --retries 0 --timeout 1 >"$work/repair.out" 2>&1; }
pull "$out" "$work/p.json"
expect "first pull" "step 1" "$(check "$out" "1:$(ck 1)")"

# --- 1. exact kill points across in-place steps
refused=0
seen_old=0
seen_new=0
kills=0
for s in 2 3 4; do
  publish --key "$key" "$(ck "$s")"
  cp "$out" "$work/before"
  rm -rf "$work/scratch" && mkdir -p "$work/scratch"
  cp "$out" "$work/scratch/m.safetensors"
  pull "$work/scratch/m.safetensors" "$work/scratch.json"
  t=$(written "$work/scratch.json")
  [ -n "$t" ] && [ "$t" -gt 16 ] || { bad "step $s: no write figure"; continue; }
  for k in 0 1 $((t / 8)) $((t / 4)) $((t / 3)) $((t / 2)) $((2 * t / 3)) $((3 * t / 4)) \
    $((7 * t / 8)) $((t - 16)) $((t - 9)) $((t - 8)) $((t - 5)) $((t - 1)) $t $((t + 1)) $((t + 2)); do
    cp "$work/before" "$out"
    rm -f "$journal"
    PULSE_TEST_KILL_AFTER_BYTES=$k pull "$out" "$work/k.json"
    rc=$?
    # Past T (the step's bytes, plus a unit per kill point) it may end well.
    if [ "$k" -le "$t" ] || [ "$rc" != 0 ]; then expect "step $s: killed after $k of $t bytes" 137 "$rc"; fi
    kills=$((kills + 1))
    r=$(check "$out" "$((s - 1)):$(ck $((s - 1)))" "$s:$(ck "$s")")
    case $r in
      refused*) refused=$((refused + 1)) ;;
      "step $((s - 1))") seen_old=$((seen_old + 1)) ;;
      "step $s") seen_new=$((seen_new + 1)) ;;
      *) bad "step $s, killed after $k of $t bytes: a loader reads $r" ;;
    esac
    repair
    r=$(check "$out" "$((s - 1)):$(ck $((s - 1)))" "$s:$(ck "$s")")
    case $r in
      "step $((s - 1))" | "step $s") ok ;;
      *) bad "step $s, killed after $k: after the restart a loader reads $r" ;;
    esac
  done
  cp "$work/scratch/m.safetensors" "$out"
  rm -f "$journal"
done
echo "exact kills: $kills; the file refused after $refused, old step after $seen_old, new after $seen_new"
[ $refused -ge 3 ] && ok || bad "the file was refused after only $refused kills (a step's pages were never hidden)"
[ $seen_old -ge 3 ] && ok || bad "only $seen_old kills left the old step readable"
[ $seen_new -ge 3 ] && ok || bad "only $seen_new kills left the new step readable"

# --- 2. real kill -9 of a following pull at random times
pull "$out" "$work/p2.json"
( for s in $(seq 5 $steps); do publish --key "$key" "$(ck "$s")"; sleep 0.15; done ) &
publisher=$!
pids+=($publisher)
cands=()
for s in $(seq 4 $steps); do cands+=("$s:$(ck "$s")"); done
real=0
t_end=$((SECONDS + 12))
while [ $real -lt 25 ] && [ $SECONDS -lt $t_end ] && kill -0 $publisher 2>/dev/null; do
  "$bin/pulse-pull" "$url" --out "$out" --key "$hex" --follow --threads 1 --no-catchup \
    >"$work/f.out" 2>&1 &
  f=$!
  sleep "0.$((RANDOM % 9 + 1))$((RANDOM % 10))"
  kill -9 $f 2>/dev/null
  wait $f 2>/dev/null
  real=$((real + 1))
  r=$(check "$out" "${cands[@]}")
  case $r in
    refused* | step*) ok ;;
    *) bad "real kill $real: a loader reads $r" ;;
  esac
done
kill $publisher 2>/dev/null
wait $publisher 2>/dev/null
echo "real kills: $real"
[ $real -ge 5 ] && ok || bad "only $real real kills"
repair
case $(check "$out" "${cands[@]}") in step*) ok ;; *) bad "after the last restart: $(check "$out" "${cands[@]}")" ;; esac
finish
