#!/usr/bin/env bash
# pulse-pull's class index flags (--class-index auto|on|off,
# --memory-budget, --no-class-index) against pulse-serve + pulse-publish:
# each synced event says the choice and why, every choice reaches the
# trainer's checkpoint bit for bit, and bad values are usage errors.
# Usage: pull_class_index.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
publish() { "$bin/pulse-publish" --store "$work/store" --anchor-every 100 --keep 20 --sync-anchors "$@" >>"$work/pub.out" 2>&1 || bad "publish $*"; }
jfield() { grep "\"event\":\"$2\"" "$1" | tail -1 | sed -n "s/.*\"$3\":\"\\{0,1\\}\([^,\"}]*\).*/\1/p"; }

"$bin/pulse-bench" trajectory --out "$work/traj" --params 200000 --steps 8 --seed 5 >/dev/null || exit 1
publish --new-key "$(ck 0)"
serve "$work/store" || exit 1
key=$(sed -n 's/.*"public_key":"\([0-9a-f]*\)".*/\1/p' "$work/store/head.json")
pull() { "$bin/pulse-pull" "$url" --key "$key" --json --no-catchup "$@"; }

# --- usage errors
for bad_args in "--class-index maybe" "--class-index" "--memory-budget 0" "--memory-budget lots"; do
  pull --out "$work/u.safetensors" $bad_args >/dev/null 2>"$work/u.err"
  expect "'$bad_args' is a usage error" 2 "$?"
done

# --- one-shot pulls: off unless asked; each choice says so, same bits
for mode in default on off no; do
  f="$work/$mode.safetensors"
  pull --out "$f" >/dev/null 2>&1 || bad "$mode: first pull"
done
publish "$(ck 1)"
for mode in default on off no; do
  case $mode in
    default) args=() ;; on) args=(--class-index on) ;; off) args=(--class-index off) ;; no) args=(--no-class-index) ;;
  esac
  pull --out "$work/$mode.safetensors" "${args[@]}" >"$work/$mode.json" 2>&1
  expect "one-shot $mode exits 0" 0 "$?"
  expect "one-shot $mode: step 1 bit for bit" "$(digest_of "$(ck 1)")" "$(digest_of "$work/$mode.safetensors")"
  want=off why="class index off (opts.class_index OFF)"
  [ "$mode" = on ] && want=on why="class index on (opts.class_index ON)"
  expect "one-shot $mode: the choice" "$want" "$(jfield "$work/$mode.json" synced class_index)"
  grep '"event":"synced"' "$work/$mode.json" | grep -qF "\"class_index_why\":\"$why\"" && ok ||
    bad "one-shot $mode: the reason is not '$why': $(grep '"event":"synced"' "$work/$mode.json")"
done

# --- following: auto keeps none within the default budget, and one with
# room (this trajectory's steps change under 5% of the weights)
follow_until() { # FILE JSON STEP ARGS...: follows until the file holds STEP
  local file=$1 json=$2 step=$3
  shift 3
  "$bin/pulse-pull" "$url" --key "$key" --json --no-catchup --out "$file" --follow "$@" >"$json" 2>&1 &
  local p=$! # pulse-pull itself, not a subshell: stopped before the next publish
  pids+=($p)
  wait_digest "$file" "$(digest_of "$(ck "$step")")" && ok || bad "--follow $*: no step $step"
  kill "$p" 2>/dev/null; wait "$p" 2>/dev/null
}
publish "$(ck 2)" "$(ck 3)"
follow_until "$work/default.safetensors" "$work/fd.json" 3
grep '"event":"synced"' "$work/fd.json" | tail -1 | grep -q 'above the memory budget of .* (a tenth of the targets' && ok ||
  bad "--follow by default: not off for the budget: $(grep '"event":"synced"' "$work/fd.json" | tail -1)"
expect "--follow by default: off" off "$(jfield "$work/fd.json" synced class_index)"
publish "$(ck 4)" "$(ck 5)"
follow_until "$work/default.safetensors" "$work/fr.json" 5 --memory-budget 1G
last=$(grep '"event":"synced"' "$work/fr.json" | tail -1)
expect "--follow with room: on" on "$(jfield "$work/fr.json" synced class_index)"
echo "$last" | grep -q 'class index on: .* within the memory budget of 953.7 MiB' && ok || bad "with room: $last"
finish
