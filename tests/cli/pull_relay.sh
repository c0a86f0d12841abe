#!/usr/bin/env bash
# Relays, real processes on 127.0.0.1: `pulse-pull --serve --follow`
# mirrors the origin's store into its cache and re-serves it; pullers behind
# it end bit-identical to the trainer, follow it as it moves, and verify
# every object themselves: an object corrupted in the relay's store is
# refused (nothing applied, no file written), and with the origin as a
# second URL the pull still succeeds. Usage: pull_relay.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
wait_json_url() {
  for _ in $(seq 1 200); do
    if grep -q '"event":"serving"' "$1" 2>/dev/null; then sed -n 's|.*"url":"\(http://[^"]*\)".*|\1|p' "$1" | head -1; return 0; fi
    sleep 0.05
  done
  return 1
}
head_step() { sed -n 's/.*"step":\([0-9]*\),.*/\1/p' "$1/head.json" 2>/dev/null | head -1; }
wait_head() { # store, step
  for _ in $(seq 1 200); do [ "$(head_step "$1")" = "$2" ] && return 0; sleep 0.05; done
  return 1
}
publish() { "$bin/pulse-publish" --store "$work/store" --anchor-every 3 --sync-anchors "$@" >>"$work/pub.out" 2>&1 || bad "publish $*"; }

"$bin/pulse-bench" trajectory --out "$work/traj" --params 200000 --steps 7 --seed 4 >/dev/null || exit 1
publish --new-key "$(ck 0)" "$(ck 1)" "$(ck 2)" "$(ck 3)" "$(ck 4)"
serve "$work/store" || exit 1
origin=$url
key=$(sed -n 's/.*"public_key":"\([0-9a-f]*\)".*/\1/p' "$work/store/head.json")

# --- the relay
"$bin/pulse-pull" "$origin" --cache "$work/relay" --serve 127.0.0.1:0 --follow --key "$key" --json \
  >"$work/relay.json" 2>"$work/relay.err" &
rpid=$!
pids+=($rpid)
relay=$(wait_json_url "$work/relay.json") || { echo "FAIL: the relay did not start"; cat "$work/relay.err"; exit 1; }
wait_head "$work/relay" 4 || bad "the relay never held step 4"
"$bin/pulse-publish" --store "$work/relay" --verify --key "$work/store/signing-key.pem" >/dev/null 2>&1 \
  && ok || bad "the relay's cache is a whole, consistent store"
[ ! -e "$work/relay/signing-key.pem" ] && ok || bad "no key in the relay"

# --- a puller behind the relay
"$bin/pulse-pull" "$relay" --out "$work/d.safetensors" --key "$key" --json >"$work/d1.json" 2>&1
expect "behind the relay: exits 0" 0 "$?"
expect "behind the relay: step 4 bit for bit" "$(digest_of "$(ck 4)")" "$(digest_of "$work/d.safetensors")"
# ... following it while the origin moves
"$bin/pulse-pull" "$relay" --out "$work/d.safetensors" --key "$key" --follow --json >"$work/df.json" 2>&1 &
dpid=$!
pids+=($dpid)
publish "$(ck 5)" "$(ck 6)"
want=$(digest_of "$(ck 6)")
got=""
for _ in $(seq 1 200); do
  got=$(grep '"event":"synced"' "$work/df.json" | tail -1 | sed -n 's/.*"state_digest":"\([0-9a-f]*\)".*/\1/p')
  [ "$got" = "$want" ] && break
  sleep 0.05
done
expect "follows through the relay to step 6" "$want" "$got"
kill -TERM "$dpid"; wait "$dpid"; expect "the follower stops cleanly" 0 "$?"
expect "the follower's file is step 6" "$want" "$(digest_of "$work/d.safetensors")"

# --- a corrupted object in the relay's store
wait_head "$work/relay" 6 || bad "the relay never held step 6"
for f in "$work"/relay/objects/*.safetensors; do
  printf '\x5a' | dd of="$f" bs=1 seek=200 conv=notrunc status=none
done
"$bin/pulse-pull" "$relay" --out "$work/e.safetensors" --key "$key" --retries 1 --json >"$work/e.json" 2>&1
expect "corrupt relay only: exit 1" 1 "$?"
[ ! -e "$work/e.safetensors" ] && ok || bad "corrupt relay: a file was written"
# The relay's server sees that the files changed, hashes them again and
# answers 500 instead of serving them (pulse_objects_corrupt_total).
grep -q 'HTTP 500' "$work/e.json" && ok || bad "corrupt relay: the relay did not refuse its rotten objects: $(tail -3 "$work/e.json")"
"$bin/pulse-pull" "$relay" "$origin" --out "$work/e.safetensors" --key "$key" --json >"$work/e2.json" 2>&1
expect "relay then origin: exits 0" 0 "$?"
expect "relay then origin: step 6 bit for bit" "$want" "$(digest_of "$work/e.safetensors")"
grep -q 'HTTP 500' "$work/e2.json" && ok || bad "relay then origin: the relay served its rotten objects"

kill -TERM "$rpid"; wait "$rpid"; expect "the relay stops cleanly" 0 "$?"

finish
