#!/usr/bin/env bash
# Two new runs started at the same moment on one empty bucket prefix (two
# hosts, as the issue "Reliability and security: what hostile networks and
# failures still break" found, finding 10): both pass the check before
# either head lands, and before, both "succeeded", the prefix's head ending
# as whichever wrote last. The head's write is now conditional (If-None-Match
# when the prefix had no head, If-Match its ETag after): against a service
# that honours it (S3; here s3rver with conditional writes,
# lib/s3rver_conditional.js, holding each head PUT 1 s so the checks both
# come first), exactly one run publishes and the other is refused, naming
# why; a later step of the winner still goes through (If-Match of its own
# head). Skips (77) without s3rver, node or the AWS CLI.
# Usage: s3_writer_race.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
command -v s3rver >/dev/null || { echo "skipped: s3rver is not installed"; exit 77; }
command -v node >/dev/null || { echo "skipped: node is not installed"; exit 77; }
command -v aws >/dev/null || { echo "skipped: the AWS CLI is not installed"; exit 77; }

source "$(dirname "$0")/lib/s3rver.sh"
export S3_HEAD_DELAY_MS=1000
start_s3rver_conditional

"$bin/pulse-bench" trajectory --out "$work/traj" --params 100000 --steps 3 --seed 3 >/dev/null || exit 1
pub() { # STORE CHECKPOINT...
  local store=$1; shift
  "$bin/pulse-publish" --store "$store" --grace 0 --upload s3://bkt/runs/r "$@"
}
pub "$work/a" --new-key "$(ck 0)" >"$work/a.out" 2>&1 &
pa=$!
pub "$work/b" --new-key "$(ck 1)" >"$work/b.out" 2>&1 &
pb=$!
wait $pa; ra=$?
wait $pb; rb=$?
wins=$(( (ra == 0) + (rb == 0) ))
expect "publishers that moved the prefix's head (a: $ra, b: $rb)" 1 "$wins"
if [ "$ra" -eq 0 ]; then winner=a; loser=b; else winner=b; loser=a; fi
grep -q "another writer\|already holds the head of another run" "$work/$loser.out" && ok ||
  bad "the refused run says why: $(cat "$work/$loser.out")"
# The bucket's head is the winner's, byte for byte.
s3 s3 cp --quiet s3://bkt/runs/r/head.json "$work/bucket_head.json" || bad "reading the bucket's head"
cmp -s "$work/bucket_head.json" "$work/$winner/head.json" && ok || bad "the bucket's head is not $winner's"
# The winner goes on: its next step's head is put If-Match its own.
pub "$work/$winner" --key "$work/$winner/signing-key.pem" "$(ck 2)" >"$work/w2.out" 2>&1 &&
  ok || { bad "the winner's next step"; cat "$work/w2.out"; }
s3 s3 cp --quiet s3://bkt/runs/r/head.json "$work/bucket_head2.json"
cmp -s "$work/bucket_head2.json" "$work/$winner/head.json" && ok || bad "the bucket's head moved to the winner's next step"
grep -q "^412 " "$work/s3.log" && ok || bad "the service refused no conditional write: the test tests nothing"
finish
