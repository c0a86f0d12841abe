#!/usr/bin/env bash
# pulse-pull against pulse-serve + pulse-publish, real processes on
# 127.0.0.1: a puller from the start, the chain on the next sync, a late
# joiner after retention (anchor route), --follow through long-polls, a
# pinned key that does not match, and usage errors. Every puller's --out
# must end with the trainer checkpoint's state digest. Usage:
# pull_sync.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
publish() { "$bin/pulse-publish" --store "$work/store" --anchor-every 3 --keep 2 --sync-anchors "$@" >>"$work/pub.out" 2>&1 || bad "publish $*"; }
jfield() { grep "\"event\":\"$2\"" "$1" | tail -1 | sed -n "s/.*\"$3\":\"\\{0,1\\}\([^,\"}]*\).*/\1/p"; }

"$bin/pulse-bench" trajectory --out "$work/traj" --params 200000 --steps 14 --seed 3 >/dev/null || exit 1
publish --new-key "$(ck 0)" "$(ck 1)" "$(ck 2)" "$(ck 3)"
serve "$work/store" || exit 1
u=$url
key=$(sed -n 's/.*"public_key":"\([0-9a-f]*\)".*/\1/p' "$work/store/head.json")
[ ${#key} -eq 64 ] && ok || bad "the head names its key"

# --- a puller from the start
"$bin/pulse-pull" "$u" --out "$work/a.safetensors" --key "$key" --json >"$work/a1.json" 2>"$work/a1.err"
expect "first pull exits 0" 0 "$?"
expect "first pull: step 3 bit for bit" "$(digest_of "$(ck 3)")" "$(digest_of "$work/a.safetensors")"
expect "first pull takes an anchor" anchor "$(jfield "$work/a1.json" synced route)"
[ -d "$work/a.safetensors.pulse-cache/objects" ] && ok || bad "default cache next to --out"

# --- the next steps come as patches (or one signed catch-up)
publish "$(ck 4)" "$(ck 5)"
"$bin/pulse-pull" "$u" --out "$work/a.safetensors" --key "$key" --json --no-catchup >"$work/a2.json" 2>&1
expect "second pull exits 0" 0 "$?"
expect "second pull: step 5" "$(digest_of "$(ck 5)")" "$(digest_of "$work/a.safetensors")"
expect "second pull walks the chain" chain "$(jfield "$work/a2.json" synced route)"
expect "second pull resumed from step 3" 3 "$(jfield "$work/a2.json" synced from_step)"
grep -q '"event":"download".*safetensors' "$work/a2.json" && bad "second pull downloaded an anchor" || ok

# --- a late joiner after retention moved on: the newest anchor
publish "$(ck 6)" "$(ck 7)" "$(ck 8)" "$(ck 9)" "$(ck 10)"
"$bin/pulse-pull" "$u" --out "$work/b.safetensors" --key "$key" --json >"$work/b.json" 2>&1
expect "late joiner exits 0" 0 "$?"
expect "late joiner: step 10" "$(digest_of "$(ck 10)")" "$(digest_of "$work/b.safetensors")"
expect "late joiner takes an anchor" anchor "$(jfield "$work/b.json" synced route)"
expect "late joiner: the newest anchor (9), then one patch" 2 "$(grep -c '"event":"applied"' "$work/b.json")"
# The first puller fell behind retention (the head no longer names step 5),
# but the store still holds the objects that led from it (their grace
# period): the server squashes one signed catch-up from step 5.
"$bin/pulse-pull" "$u" --out "$work/a.safetensors" --key "$key" --json >"$work/a3.json" 2>&1
expect "behind retention: step 10" "$(digest_of "$(ck 10)")" "$(digest_of "$work/a.safetensors")"
expect "behind retention: one catch-up" catchup "$(jfield "$work/a3.json" synced route)"

# --- --follow: long-polls bring each new step
"$bin/pulse-pull" "$u" --out "$work/a.safetensors" --key "$key" --follow --json >"$work/f.json" 2>"$work/f.err" &
fpid=$!
pids+=($fpid)
for _ in $(seq 1 100); do grep -q '"event":"synced"' "$work/f.json" && break; sleep 0.05; done
publish "$(ck 11)"
publish "$(ck 12)"
want=$(digest_of "$(ck 12)")
got=""
for _ in $(seq 1 100); do
  got=$(grep '"event":"synced"' "$work/f.json" | tail -1 | sed -n 's/.*"state_digest":"\([0-9a-f]*\)".*/\1/p')
  [ "$got" = "$want" ] && break
  sleep 0.1
done
expect "--follow reaches step 12" "$want" "$got"
expect "--follow's file is step 12" "$want" "$(digest_of "$work/a.safetensors")"
kill -TERM "$fpid"; wait "$fpid"; expect "--follow stops cleanly on SIGTERM" 0 "$?"
grep -q '"event":"exit","code":0' "$work/f.json" && ok || bad "--follow reports its exit"

# --- refusals: another key, no server, usage
other=$(printf '%064d' 1)
"$bin/pulse-pull" "$u" --out "$work/c.safetensors" --key "$other" --retries 0 >/dev/null 2>"$work/c.err"
expect "a head signed by another key fails" 1 "$?"
[ ! -e "$work/c.safetensors" ] && ok || bad "nothing written on a refused head"
grep -q "signed by" "$work/c.err" && ok || bad "the refusal says why"
# Pinned trust by default: no --key is refused before anything is asked.
"$bin/pulse-pull" "$u" --out "$work/d.safetensors" --json >"$work/d0.json" 2>"$work/d0.err"
expect "no --key and no --trust-first-use: usage" 2 "$?"
grep -q "no publisher key.*--key HEX" "$work/d0.err" && grep -q -- "--trust-first-use" "$work/d0.err" && ok ||
  bad "the refusal says what to give: $(cat "$work/d0.err")"
[ ! -e "$work/d.safetensors" ] && [ ! -e "$work/d.safetensors.pulse-cache" ] && ok || bad "nothing made without a key"
"$bin/pulse-pull" "$u" --out "$work/d.safetensors" --key "$key" --trust-first-use >/dev/null 2>&1
expect "--key with --trust-first-use: usage" 2 "$?"
expect "pulse-publish --public-key prints the head's key" "$key" \
  "$("$bin/pulse-publish" --store "$work/store" --public-key 2>/dev/null)"
"$bin/pulse-pull" "$u" --out "$work/d.safetensors" --trust-first-use --json >"$work/d.json" 2>&1
expect "trust on first use, asked for, works" "$(digest_of "$(ck 12)")" "$(digest_of "$work/d.safetensors")"
grep -q '"event":"warning".*first use' "$work/d.json" && ok || bad "trust on first use warns"
"$bin/pulse-pull" "http://127.0.0.1:1" --out "$work/e.safetensors" --key "$key" --retries 1 >/dev/null 2>&1
expect "no server: exit 1" 1 "$?"
"$bin/pulse-pull" --out "$work/e.safetensors" >/dev/null 2>&1
expect "no URL: usage" 2 "$?"
"$bin/pulse-pull" "$u" >/dev/null 2>&1
expect "no --out: usage" 2 "$?"
"$bin/pulse-pull" "$u" --out x --key abc >/dev/null 2>&1
expect "bad key: usage" 2 "$?"

finish
