#!/usr/bin/env bash
# kill -9 of pulse-publish at random points of its commits, then reopen:
# after every kill the store verifies (signed head, every named object whole
# and matching its SHA-256, the chain replaying to the head's digest), the
# head holds exactly the checkpoint of its step, and publishing resumes from
# it; at the end the store holds the last checkpoint and nothing stray.
# Usage: publisher_crash.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
pid= # the publisher being killed, one at a time
cleanup_extra() {
  if [ -n "$pid" ]; then kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
}
head_field() { sed -n "s/.*\"$1\":\"\\{0,1\\}\\([0-9a-f]*\\)\"\\{0,1\\},.*/\\1/p" "$store/head.json" | head -1; }

steps=40
"$bin/pulse-bench" trajectory --out "$work/traj" --params 1500000 --steps $steps --seed 9 >/dev/null || exit 1
declare -a want
for s in $(seq 0 $steps); do want[$s]=$(digest_of "$(ck "$s")"); done
store=$work/store
"$bin/pulse-publish" --store "$store" --new-key "$(ck 0)" >/dev/null 2>&1 || { echo "FAIL: first publish"; exit 1; }
key=$store/signing-key.pem

RANDOM=4242
rounds=0
killed=0
torn=0 # kills that left a temporary file or an unnamed object: inside a commit
deadline=$((SECONDS + 40))
while [ $rounds -lt 40 ] && [ $SECONDS -lt $deadline ]; do
  h=$(head_field step)
  [ "$h" -ge $steps ] && break
  rounds=$((rounds + 1))
  args=()
  for s in $(seq $((h + 1)) $steps); do args+=("$(ck "$s")"); done
  mode=()
  [ $((rounds % 2)) -eq 0 ] && mode=(--sync-anchors)
  "$bin/pulse-publish" --store "$store" --key "$key" --anchor-every 3 --keep 4 --keep-anchors 2 \
    --threads 1 "${mode[@]}" "${args[@]}" >"$work/run.out" 2>&1 &
  pid=$!
  # Somewhere in the first few commits (a commit here takes 10-50 ms on a
  # 2-core machine, less on a faster one: short waits keep kills landing).
  sleep "0.0$(printf %02d $((5 + RANDOM % 60)))"
  if kill -9 "$pid" 2>/dev/null; then killed=$((killed + 1)); fi
  wait "$pid" 2>/dev/null
  pid=
  # Read-only check of what the kill left (temporary files may remain).
  if "$bin/pulse-publish" --store "$store" --verify --key "$key" >"$work/verify.out" 2>&1; then ok; else
    bad "round $rounds: store inconsistent after kill -9"; sed 's/^/  | /' "$work/verify.out" "$work/run.out"; break; fi
  grep -q " 0 stray files" "$work/verify.out" || torn=$((torn + 1))
  h=$(head_field step)
  d=$(sed -n 's/.*"state_digest":"\([0-9a-f]*\)".*/\1/p' "$store/head.json" | head -1)
  [ "$d" = "${want[$h]}" ] && ok || bad "round $rounds: head step $h does not hold checkpoint $h"
done
[ $killed -ge 3 ] && ok || bad "only $killed kills landed while publishing"

# Finish without interruption: recovery clears what the kills left (--grace 0:
# objects that left the head go too, instead of staying their grace period).
h=$(head_field step)
if [ "$h" -lt $steps ]; then
  args=()
  for s in $(seq $((h + 1)) $steps); do args+=("$(ck "$s")"); done
  "$bin/pulse-publish" --store "$store" --key "$key" --anchor-every 3 --keep 4 --grace 0 "${args[@]}" >"$work/run.out" 2>&1 \
    && ok || { bad "final publish"; cat "$work/run.out"; }
else
  # Everything was published; reopening alone must recover.
  "$bin/pulse-publish" --store "$store" --key "$key" --grace 0 --listen 127.0.0.1:0 --exit-after-publish >/dev/null 2>&1 \
    && ok || bad "reopen"
fi
"$bin/pulse-publish" --store "$store" --verify --key "$key" >"$work/verify.out" 2>&1 && ok || { bad "final verify"; cat "$work/verify.out"; }
grep -q "head step $steps," "$work/verify.out" && ok || bad "the head is step $steps: $(cat "$work/verify.out")"
grep -q " 0 stray files" "$work/verify.out" && ok || bad "stray files after recovery: $(cat "$work/verify.out")"
[ "$(head_field state_digest)" = "${want[$steps]}" ] && ok || bad "the last checkpoint is the head"
ls -A "$store/objects" | grep -q '^\.' && bad "temporary files left in objects/" || ok

finish "$rounds rounds, $killed kill -9 while publishing, $torn inside a write"
