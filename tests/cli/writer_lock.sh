#!/usr/bin/env bash
# One writer per store: pulse-publish started twice on one store (the first
# still serving it) refuses the second run before it writes anything, naming
# the holder; the store keeps the first run's history, verifies (every named
# object hashed against its name), and takes a publisher again once the first
# is gone.
# Usage: writer_lock.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"

"$bin/pulse-bench" trajectory --out "$work/traj" --params 200000 --steps 4 --seed 3 >/dev/null || exit 1
store=$work/store
"$bin/pulse-publish" --store "$store" --new-key --grace 0 --listen 127.0.0.1:0 \
  "$(ck 0)" "$(ck 1)" "$(ck 2)" >"$work/first.out" 2>"$work/first.err" &
first=$!
pids+=($first)
wait_port "$work/first.out" >/dev/null || { bad "the first publisher did not start"; cat "$work/first.err"; finish; }
for _ in $(seq 1 200); do grep -q "serving until" "$work/first.err" && break; sleep 0.05; done
grep -q "serving until" "$work/first.err" && ok || bad "the first publisher did not finish publishing"
before=$(sha256sum "$store/head.json")
files=$(ls -A "$store/objects" | sort | tr '\n' ' ')

# The same run again, on the live store.
if "$bin/pulse-publish" --store "$store" --key "$store/signing-key.pem" --grace 0 "$(ck 3)" \
  >"$work/second.out" 2>"$work/second.err"; then
  bad "a second publisher on a live store was not refused"
else ok; fi
grep -q "already has a writer (pid $first on host" "$work/second.err" && ok \
  || bad "the refusal names the holder: $(cat "$work/second.err")"
expect "head after the refused run" "$before" "$(sha256sum "$store/head.json")"
expect "objects after the refused run" "$files" "$(ls -A "$store/objects" | sort | tr '\n' ' ')"
"$bin/pulse-publish" --store "$store" --verify --key "$store/signing-key.pem" >"$work/verify.out" 2>&1 \
  && ok || bad "verify of the live store: $(cat "$work/verify.out")"

# The first one goes; the store takes the next run.
kill -TERM "$first" && wait "$first" 2>/dev/null
pids=()
"$bin/pulse-publish" --store "$store" --key "$store/signing-key.pem" --grace 0 "$(ck 3)" >"$work/third.out" 2>&1 \
  && ok || bad "publishing after the holder left: $(cat "$work/third.out")"
"$bin/pulse-publish" --store "$store" --verify --key "$store/signing-key.pem" >"$work/verify.out" 2>&1 \
  && ok || bad "final verify: $(cat "$work/verify.out")"
grep -q "head step 3," "$work/verify.out" && ok || bad "head step 3: $(cat "$work/verify.out")"

# --verify hashes what the head names: a named object whose bytes no longer
# hash to its name (same size) makes the store inconsistent.
obj=$store/$(grep -o 'objects/[0-9a-f]*\.pulse' "$store/head.json" | head -1)
[ -f "$obj" ] && ok || bad "no patch named by the head ($obj)"
last=$(tail -c 1 "$obj" | od -An -tu1 | tr -d ' ')
printf "\\x0$((last == 1 ? 2 : 1))" | dd of="$obj" bs=1 seek=$(($(stat -c %s "$obj") - 1)) conv=notrunc 2>/dev/null
if "$bin/pulse-publish" --store "$store" --verify >"$work/verify.out" 2>&1; then
  bad "verify passed a named object that does not hash to its name"
else ok; fi
grep -q "does not match its SHA-256 name" "$work/verify.out" && ok || bad "verify says why: $(cat "$work/verify.out")"
finish
