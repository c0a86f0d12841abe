#!/usr/bin/env bash
# One writer per bucket prefix: a second publisher (another store, as on
# another host) uploading to a prefix that holds the head of another run is
# refused before it puts anything, the bucket keeping the first run's head;
# the first publisher goes on. Skips (77) without s3rver or the AWS CLI.
# Usage: s3_writer_lock.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
command -v s3rver >/dev/null || { echo "skipped: s3rver is not installed"; exit 77; }
command -v aws >/dev/null || { echo "skipped: the AWS CLI is not installed"; exit 77; }

source "$(dirname "$0")/lib/s3rver.sh"
start_s3rver
bucket_head() { s3 s3 cp --quiet s3://bkt/runs/w/head.json - 2>/dev/null | sha256sum; }

"$bin/pulse-bench" trajectory --out "$work/traj" --params 200000 --steps 3 --seed 7 >/dev/null || exit 1
pub() { # STORE CHECKPOINT...
  local store=$1; shift
  "$bin/pulse-publish" --store "$store" --grace 0 --upload s3://bkt/runs/w "$@"
}
pub "$work/a" --new-key "$(ck 0)" "$(ck 1)" >"$work/a1.out" 2>&1 && ok || { bad "first publisher"; cat "$work/a1.out"; }
before=$(bucket_head)
objects=$(s3 s3 ls --recursive s3://bkt/runs/w/ | awk '{print $4}' | sort | tr '\n' ' ')

# Another store (another run) to the same prefix.
if pub "$work/b" --new-key "$(ck 0)" >"$work/b.out" 2>&1; then
  bad "a second publisher uploading to the prefix was not refused"
else ok; fi
grep -q "already holds the head of another run" "$work/b.out" && ok || bad "the refusal says why: $(cat "$work/b.out")"
expect "the bucket's head after the refused upload" "$before" "$(bucket_head)"
expect "the bucket's objects after the refused upload" "$objects" \
  "$(s3 s3 ls --recursive s3://bkt/runs/w/ | awk '{print $4}' | sort | tr '\n' ' ')"

# The first publisher goes on.
pub "$work/a" --key "$work/a/signing-key.pem" "$(ck 2)" >"$work/a2.out" 2>&1 && ok || { bad "the first publisher goes on"; cat "$work/a2.out"; }
[ "$(bucket_head)" != "$before" ] && ok || bad "the bucket's head moved"
finish
