#!/usr/bin/env bash
# pulse-publish --upload s3://BUCKET/PREFIX against a real S3-compatible
# server (s3rver from npm, started here on 127.0.0.1; it refuses unknown
# access keys, lenient with signatures), read back by an independent client
# (the AWS CLI): every object the head names is in the bucket byte for byte,
# objects carry Cache-Control immutable and the head no-cache, an anchor over
# --multipart-mb went up as a multipart upload, retention removed what left
# the head (but the newest anchors), an upload killed with -9 mid-way never
# leaves a head naming a missing object and the next run completes it, and
# an unknown access key is refused with the store's message; pulse-pull
# follows the bucket itself (a static copy: head.json, objects/). Usage:
# s3_upload.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"

command -v s3rver >/dev/null || { echo "FAIL: s3rver is not installed (tools/install-deps.sh: npm install -g s3rver)"; exit 1; }
command -v aws >/dev/null || { echo "FAIL: the AWS CLI is not installed (tools/install-deps.sh: awscli)"; exit 1; }

source "$(dirname "$0")/lib/s3rver.sh"
start_s3rver

# 2.7M parameters: a 5.4 MB anchor, over --multipart-mb 5: two parts of 5 MiB.
"$bin/pulse-bench" trajectory --out "$work/traj" --params 2700000 --steps 6 --seed 5 >/dev/null || exit 1
publish() {
  "$bin/pulse-publish" --store "$work/store" --sync-anchors --anchor-every 2 \
    --keep 1 --keep-anchors 2 --grace 0 --upload s3://bkt/runs/a \
    --multipart-mb 5 --part-mb 5 "$@"
}

# Every object the bucket's head names is in the bucket with its size, and
# every object named in the local head is byte-identical there.
check_bucket() {
  local what=$1 head names missing=0 differ=0
  # One listing and read-back of the whole prefix (the CLI is slow to start).
  rm -rf "$work/got" && s3 s3 sync --quiet s3://bkt/runs/a/ "$work/got/" >/dev/null 2>&1
  cp "$work/got/head.json" "$work/bhead.json" 2>/dev/null || { bad "$what: no head in the bucket"; return; }
  names=$(grep -o '"path":"objects/[0-9a-f]*\.[a-z]*","url":"[^"]*","sha256":"[0-9a-f]*","size":[0-9]*' "$work/bhead.json" |
    sed 's/"path":"\([^"]*\)".*"size":\([0-9]*\)/\1 \2/')
  while read -r path size; do
    [ -z "$path" ] && continue
    [ "$(stat -c %s "$work/got/$path" 2>/dev/null)" = "$size" ] || { missing=$((missing + 1)); echo "  missing: $path ($size)"; }
    if [ -f "$work/store/$path" ]; then
      cmp -s "$work/got/$path" "$work/store/$path" || differ=$((differ + 1))
    fi
  done <<<"$names"
  expect "$what: objects the bucket's head names that are missing" 0 "$missing"
  expect "$what: objects that differ from the store" 0 "$differ"
}

# --- three steps: objects, then the head; an anchor in parts
publish --new-key "$(ck 0)" "$(ck 1)" "$(ck 2)" >"$work/pub1.out" 2>"$work/pub1.err"
expect "publish with --upload exits 0" 0 "$?"
grep -q "^upload: step 2:" "$work/pub1.out" && ok || { bad "an upload line per step"; cat "$work/pub1.out" "$work/pub1.err"; }
grep "^upload: step 0:" "$work/pub1.out" | grep -qv " 0 parts" && ok || bad "the 6 MB anchor went up in parts: $(grep '^upload: step 0' "$work/pub1.out")"
check_bucket "after 3 steps"
cmp -s "$work/bhead.json" "$work/store/head.json" && ok || bad "the bucket's head is the store's"
anchor=$(ls "$work/store/objects" | grep safetensors | head -1)
cc=$(s3 s3api head-object --bucket bkt --key "runs/a/objects/$anchor" --query CacheControl --output text 2>&1)
expect "an object's Cache-Control" "public, max-age=31536000, immutable" "$cc"
cc=$(s3 s3api head-object --bucket bkt --key runs/a/head.json --query CacheControl --output text 2>&1)
expect "the head's Cache-Control" "no-cache" "$cc"

# --- pulse-pull straight from the bucket (a static copy: head.json and
# objects/, GET only): the anchor first, bit for bit
jfield() { grep "\"event\":\"$2\"" "$1" | tail -1 | sed -n "s/.*\"$3\":\"\{0,1\}\([^,\"}]*\).*/\1/p"; }
key=$(sed -n 's/.*"public_key":"\([0-9a-f]*\)".*/\1/p' "$work/store/head.json")
bucket_url=http://127.0.0.1:$port/bkt/runs/a
"$bin/pulse-pull" "$bucket_url" --key "$key" --out "$work/w.safetensors" --json >"$work/pull1.json" 2>"$work/pull1.err"
expect "pull from the bucket exits 0" 0 "$?"
expect "pull from the bucket: step 2 bit for bit" "$(digest_of "$(ck 2)")" "$(digest_of "$work/w.safetensors")"

# --- retention: with --keep 1 and no grace, a patch that left the head is
# deleted; the newest 2 anchors stay
publish "$(ck 3)" "$(ck 4)" >"$work/pub2.out" 2>&1 || bad "publish steps 3-4: $(cat "$work/pub2.out")"
check_bucket "after 5 steps"
ls "$work/got/objects" >"$work/ls.txt"
patches_bucket=$(grep -c '\.pulse$' "$work/ls.txt")
patches_head=$(grep -o '"path":"objects/[0-9a-f]*\.pulse"' "$work/store/head.json" | sort -u | wc -l)
expect "patches in the bucket are the head's" "$patches_head" "$patches_bucket"
anchors_bucket=$(grep -c '\.safetensors$' "$work/ls.txt")
[ "$anchors_bucket" -ge 1 ] && [ "$anchors_bucket" -le 3 ] && ok || bad "anchors kept: $anchors_bucket"
grep -q " [1-9][0-9]* deleted" "$work/pub2.out" && ok || bad "retention deleted something: $(cat "$work/pub2.out")"

# the next steps from the bucket: the patch chain (no catch-ups there)
"$bin/pulse-pull" "$bucket_url" --key "$key" --out "$work/w.safetensors" --json >"$work/pull2.json" 2>"$work/pull2.err"
expect "second pull from the bucket exits 0" 0 "$?"
expect "second pull from the bucket: step 4" "$(digest_of "$(ck 4)")" "$(digest_of "$work/w.safetensors")"
expect "second pull walks the chain" chain "$(jfield "$work/pull2.json" synced route)"

# --- kill -9 in the middle of an upload, then the next run completes it
cp -r "$work/store" "$work/store.before"
publish "$(ck 5)" >"$work/pub3.out" 2>&1 &
p=$!
sleep 0.4
# $p is the subshell running the function: the publisher is its child (left
# running, it held the store, one writer per store, while the next run came)
kill -9 $(pgrep -P $p) $p 2>/dev/null
wait $p 2>/dev/null
check_bucket "after kill -9"
publish "$(ck 6)" >"$work/pub4.out" 2>&1 || bad "publish after the kill: $(cat "$work/pub4.out")"
check_bucket "after the next run"
cmp -s "$work/bhead.json" "$work/store/head.json" && ok || bad "the bucket's head is the store's after the next run"

# --- an unknown access key: refused, with what the store said (s3rver
# knows one key; it is lenient with signatures)
out=$(AWS_ACCESS_KEY_ID=UNKNOWN "$bin/pulse-publish" --store "$work/store" --upload s3://bkt/runs/b "$(ck 6)" 2>&1)
[ $? -ne 0 ] && ok || bad "an unknown access key was accepted"
echo "$out" | grep -q "InvalidAccessKeyId\|HTTP 403" && ok || bad "the refusal says why: $out"

finish
