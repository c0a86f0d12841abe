#!/usr/bin/env bash
# `pulse-bench loco` in collaboration mode with two failures in one round
# (issue 35 item 8), twice a run, with joins between (the patterns below):
# kill -9 of the round's writer, of a random member and of the first member
# to say it finished the round (kill-finisher:R); all-to-all and
# partitioned. Every run completes its rounds, the survivors end identical,
# exactly the killed peers are missing at the end (a finisher was there to
# kill), and the final loss is at most 1% above the same run without
# churn. As root with nft, the same with two partitions that heal
# (--churn partition:R: two members cut from each other for a round
# timeout and two claim timeouts): every peer alive at the end, identical.
# A churn event the bench does not know is refused. T is 64 steps of the
# problem's batch (32), so that most rounds have several contributors.
source "$(dirname "$0")/lib/common.sh"
BENCH="$bin/pulse-bench"
common=(loco --target-batch 2048 --rounds 20 --trainers 6 --peer-speeds 4000
  --params 3000 --seed 4 --claim-timeout-ms 1000 --round-timeout-ms 2000 --json)
# Partitioned: the writer and a finisher in round 3, a member and a
# finisher in round 7. All-to-all the writer of round 2 holds every payload
# and starts round 3 a claim timeout before the others (they first ask the
# dead writer for its payload): it takes every step of the taken-over
# round, and a finisher killed after its word would be that round's only
# holder (the limit the protocol page states); there, a member and a
# finisher in round 3, the writer and a member in round 7.
churn_partitioned=kill-writer:3,kill-finisher:3,join:5,kill:7,kill-finisher:7
churn_all_to_all=kill:3,kill-finisher:3,join:5,kill-writer:7,kill:7
# The final loss of summary file $1.
loss_of() { python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if "\"summary\"" in l][0]["final_loss"])' "$1"; }
for averaging in all-to-all partitioned; do
  timeout 120 "$BENCH" "${common[@]}" --averaging "$averaging" \
    > "$work/free-$averaging.json" 2> "$work/free-$averaging.err"
  expect "$averaging churn-free exit status" 0 "$?"
  churn=churn_${averaging//-/_}
  churn=${!churn}
  failed_before=$failures
  timeout 300 "$BENCH" "${common[@]}" --averaging "$averaging" --churn "$churn" \
    > "$work/churn-$averaging.json" 2> "$work/churn-$averaging.err"
  status=$?
  # The protocol's stated limit, hit by timing: a round's state held only
  # by members that then died (the survivors, left out of that round, have
  # nobody to join through) ends in a clear error; once in a run of this
  # script it is taken for timing and the run is made again, which must
  # pass (docs/protocols/loco-collaboration.md, the commit step's limits).
  if [ "$status" != 0 ] && grep -q 'left out of round' "$work/churn-$averaging.err" &&
     grep -q 'not admitted through' "$work/churn-$averaging.err"; then
    echo "loco_collab_fail: $averaging: the stated limit (a state held only by dead members), run again:"
    tail -3 "$work/churn-$averaging.err"
    timeout 300 "$BENCH" "${common[@]}" --averaging "$averaging" --churn "$churn" \
      > "$work/churn-$averaging.json" 2> "$work/churn-$averaging.err"
    status=$?
  fi
  expect "$averaging two failures a round: exit status" 0 "$status"
  summary=$(grep '"summary":true' "$work/churn-$averaging.json")
  case "$summary" in *'"identical":true'*) ok ;; *) bad "$averaging: survivors differ: $summary $(tail -5 "$work/churn-$averaging.err")" ;; esac
  case "$summary" in *'"rounds":20,'*) ok ;; *) bad "$averaging: rounds missing: $summary" ;; esac
  # 6 founders and a joiner: those killed are missing at the end (the busy
  # figures list who finished), the writer and random members always, a
  # finisher when the bench caught one's word (20 ms polls: at least once).
  killed=$(grep -c 'killed member' "$work/churn-$averaging.err")
  finishers=$(grep -c 'said it finished' "$work/churn-$averaging.err")
  survivors=$(python3 -c 'import json,sys; print(len([json.loads(l) for l in open(sys.argv[1]) if "\"summary\"" in l][0]["busy"]))' "$work/churn-$averaging.json")
  expect "$averaging survivors" $((7 - killed)) "$survivors"
  [ "$finishers" -ge 1 ] && [ "$killed" -ge 3 ] && ok || bad "$averaging: $killed killed, $finishers after their word"
  free=$(loss_of "$work/free-$averaging.json")
  with=$(loss_of "$work/churn-$averaging.json")
  # No more than 1% above (a taken-over round counts the steps done under
  # the dead writer too: more samples, often a lower loss).
  python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(b > 1.01 * a)' "$free" "$with" \
    && ok || bad "$averaging: final loss $with with churn, $free without (over 1% above)"
  echo "loco_collab_fail: $averaging final loss $free churn-free, $with with $churn"
  # What the bench and the peers said, when a check of this run failed.
  [ "$failures" -eq "$failed_before" ] || tail -8 "$work/churn-$averaging.err"
done
if [ "$(id -u)" = 0 ] && nft list tables > /dev/null 2>&1; then
  # Rounds enough after each cut for the member cut off to join again.
  timeout 300 "$BENCH" "${common[@]}" --rounds 60 --peer-speeds 1000 \
    --churn partition:3,join:6,partition:20 \
    > "$work/cut.json" 2> "$work/cut.err"
  expect "partitions that heal: exit status" 0 "$?"
  summary=$(grep '"summary":true' "$work/cut.json")
  case "$summary" in *'"identical":true'*) ok ;; *) bad "partitions: survivors differ: $summary $(tail -5 "$work/cut.err")" ;; esac
  expect "partitions: cuts made and healed" 2 "$(grep -c 'the partition healed' "$work/cut.err")"
  # 6 founders and a joiner, nobody killed: all 7 end.
  survivors=$(python3 -c 'import json,sys; print(len([json.loads(l) for l in open(sys.argv[1]) if "\"summary\"" in l][0]["busy"]))' "$work/cut.json")
  expect "partitions: every peer ends" 7 "$survivors"
else
  echo "loco_collab_fail: partitions skipped (root and nft needed)"
fi
"$BENCH" loco --target-batch 64 --churn kill-finished:3 > /dev/null 2>&1
expect "an unknown churn event refused" 2 "$?"
[ "$failures" -eq 0 ] || exit 1
echo "loco_collab_fail: ok ($pass checks)"
