#!/usr/bin/env bash
# Key rotation with the real programs (issue 15; docs/protocols/sync.md,
# "Key rotation"): a `pulse-pull --follow` pinned to the old key follows
# `pulse-publish --rotate-key` without a restart and reaches the new key's
# steps; the publisher then refuses the old key; a rotation signed by a key
# the worker does not trust is refused; heads of the old key replayed after
# the rotation, even at newer steps, are refused; the worker's file stays
# at its verified step through every refusal. Usage: trust_rotation.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"

"$bin/pulse-bench" trajectory --out "$work/traj" --params 200000 --steps 8 --seed 11 >/dev/null || exit 1
pub() { "$bin/pulse-publish" --store "$work/store" --sync-anchors "$@" >>"$work/pub.out" 2>&1; }
pub --new-key "$(ck 0)" "$(ck 1)" "$(ck 2)" "$(ck 3)" || bad "publish 0..3"
old=$("$bin/pulse-publish" --store "$work/store" --public-key)
[ ${#old} -eq 64 ] && ok || bad "--public-key prints 64 hex digits: $old"
cp -r "$work/store" "$work/replay" # the old key's store at step 3
serve "$work/store" || exit 1
u=$url

# --- a follower pinned to the old key
"$bin/pulse-pull" "$u" --key "$old" --out "$work/w.safetensors" --follow --json \
  --timeout 5 >"$work/f.json" 2>"$work/f.err" &
fpid=$!
pids+=($fpid)
wait_digest "$work/w.safetensors" "$(digest_of "$(ck 3)")" && ok || bad "the follower reaches step 3"

"$bin/pulse-publish" --store "$work/store" --rotate-key "$work/new.pem" >"$work/rot.out" 2>&1
expect "--rotate-key exits 0" 0 "$?"
grep -q "step 3: key rotated to" "$work/rot.out" && ok || bad "the rotation is said: $(cat "$work/rot.out")"
new=$("$bin/pulse-publish" --store "$work/store" --key "$work/new.pem" --public-key)
grep -q "\"rotation\":{\"step\":3,\"from\":\"$old\",\"to\":\"$new\"" "$work/store/head.json" && ok ||
  bad "the head carries the rotation record: $(cat "$work/store/head.json")"
pub --key "$work/new.pem" "$(ck 4)" "$(ck 5)" || bad "publish 4..5 with the new key"
wait_digest "$work/w.safetensors" "$(digest_of "$(ck 5)")" && ok || bad "the follower reaches step 5 without a restart"
grep -q '"event":"warning".*rotated its key at step 3' "$work/f.json" && ok || bad "the follower says it took the rotation"
kill -0 "$fpid" 2>/dev/null && ok || bad "the follower is still running"
kill -TERM "$fpid"; wait "$fpid"; expect "the follower stops cleanly" 0 "$?"

# --- the publisher refuses the old key from now on
"$bin/pulse-publish" --store "$work/store" --sync-anchors "$(ck 6)" >"$work/oldpub.out" 2>&1
expect "publishing with the old key fails" 1 "$?"
grep -q "rotated at step 3" "$work/oldpub.out" && ok || bad "the refusal says why: $(cat "$work/oldpub.out")"

# --- a worker that joins after the rotation, pinned to the old key
"$bin/pulse-pull" "$u" --key "$old" --out "$work/late.safetensors" >/dev/null 2>&1
expect "a late worker pinned to the old key follows the rotation" "$(digest_of "$(ck 5)")" "$(digest_of "$work/late.safetensors")"

# --- a forged rotation: another key rotates a copy of the store to its own
cp -r "$work/store" "$work/forged"
"$bin/pulse-publish" --store "$work/forged" --key "$work/k3.pem" --new-key --rotate-key "$work/k4.pem" >"$work/forge.out" 2>&1 ||
  bad "forging a rotation: $(cat "$work/forge.out")"
serve "$work/forged" || exit 1
fu=$url
held=$(digest_of "$work/w.safetensors")
"$bin/pulse-pull" "$fu" --key "$old" --out "$work/w.safetensors" --retries 0 >/dev/null 2>"$work/forged.err"
expect "a rotation not signed by the trusted key fails" 1 "$?"
grep -q "its key rotation (step 5) is signed by" "$work/forged.err" && ok || bad "the refusal says why: $(cat "$work/forged.err")"
expect "the worker keeps its step" "$held" "$(digest_of "$work/w.safetensors")"
"$bin/pulse-pull" "$fu" --key "$old" --out "$work/fresh.safetensors" --retries 0 >/dev/null 2>&1
expect "a fresh worker refuses the forged rotation too" 1 "$?"

# --- the old key replays its heads after the rotation, at newer steps
"$bin/pulse-publish" --store "$work/replay" --sync-anchors "$(ck 4)" "$(ck 5)" "$(ck 6)" "$(ck 7)" >/dev/null 2>&1 ||
  bad "the old key publishes 4..7 in the copy"
serve "$work/replay" || exit 1
ru=$url
"$bin/pulse-pull" "$ru" --key "$old" --out "$work/w.safetensors" --retries 0 >/dev/null 2>"$work/replay.err"
expect "a newer head of the old key after the rotation fails" 1 "$?"
grep -q "signed by $old, not by the pinned key $new" "$work/replay.err" && ok || bad "the refusal says why: $(cat "$work/replay.err")"
expect "the worker keeps its step" "$held" "$(digest_of "$work/w.safetensors")"

finish
