#!/usr/bin/env bash
# A store published in patch format version 3 (pulse-publish --format 3)
# through pulse-serve to pulse-pull: the patches the head names are
# version 3, and a worker reaches every step bit for bit, one-shot with the
# class index off and on, and following; the server's catch-ups follow the
# store's version.
# Usage: pull_format_v3.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
publish() { "$bin/pulse-publish" --store "$work/store" --anchor-every 100 --keep 20 --sync-anchors --format 3 "$@" >>"$work/pub.out" 2>&1 || bad "publish $*"; }

"$bin/pulse-bench" trajectory --out "$work/traj" --params 200000 --steps 4 --seed 9 >/dev/null || exit 1
publish --new-key "$(ck 0)"
serve "$work/store" || exit 1
key=$(sed -n 's/.*"public_key":"\([0-9a-f]*\)".*/\1/p' "$work/store/head.json")
pull() { "$bin/pulse-pull" "$url" --key "$key" --json --no-catchup "$@"; }

for mode in off on; do
  pull --out "$work/$mode.safetensors" >/dev/null 2>&1 || bad "$mode: first pull"
done
publish "$(ck 1)"
patches=$(ls "$work"/store/objects/*.pulse 2>/dev/null)
[ -n "$patches" ] && ok || bad "no patch object in the store"
for p in $patches; do
  "$bin/pulse-inspect" "$p" | grep -q "^pulse patch v3" && ok || bad "$p is not version 3"
done
for mode in off on; do
  pull --out "$work/$mode.safetensors" --class-index "$mode" >"$work/$mode.json" 2>&1
  expect "one-shot, class index $mode: exits 0" 0 "$?"
  expect "one-shot, class index $mode: step 1 bit for bit" "$(digest_of "$(ck 1)")" "$(digest_of "$work/$mode.safetensors")"
done

"$bin/pulse-pull" "$url" --key "$key" --json --no-catchup --out "$work/off.safetensors" --follow --class-index on >"$work/follow.json" 2>&1 &
p=$!
pids+=($p)
publish "$(ck 2)" "$(ck 3)" "$(ck 4)"
wait_digest "$work/off.safetensors" "$(digest_of "$(ck 4)")" && ok || bad "--follow: no step 4"
kill "$p" 2>/dev/null; wait "$p" 2>/dev/null

# The server's catch-up from step 1 (a squash of the store's patches) is
# version 3 too, and a worker at step 1 reaches the head through it.
code=$(curl -s -o "$work/catchup.pulse" -w '%{http_code}' "$url/v1/catchup/1")
expect "catch-up from step 1" 200 "$code"
"$bin/pulse-inspect" "$work/catchup.pulse" | grep -q "^pulse patch v3" && ok || bad "the catch-up is not version 3"
"$bin/pulse-apply" "$(ck 1)" "$work/catchup.pulse" -o "$work/caught.safetensors" >/dev/null 2>&1 || bad "apply the catch-up"
expect "the catch-up reaches step 4 bit for bit" "$(digest_of "$(ck 4)")" "$(digest_of "$work/caught.safetensors")"
finish
