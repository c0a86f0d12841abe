#!/usr/bin/env bash
# Interrupted downloads, real processes on 127.0.0.1: a puller killed with
# SIGKILL in the middle of an anchor resumes from its partial file after a
# restart (Range), in one stream and in parallel ranges; the server killed
# and restarted mid-download; a file that claims a step it does not hold
# (wrong base) is rebuilt from an anchor, never patched. Usage:
# pull_resume.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
stop_signal=KILL
num() { grep "\"event\":\"$2\"" "$1" | tail -1 | sed -n "s/.*\"$3\":\([0-9]*\).*/\1/p"; }
parts_size() { # bytes held in partial files of a cache
  local n=0
  for f in "$1"/objects/.*.part*; do [ -f "$f" ] && n=$((n + $(stat -c %s "$f"))); done
  echo "$n"
}
wait_parts() { # cache, bytes: waits until the partial files hold that much
  for _ in $(seq 1 300); do [ "$(parts_size "$1")" -ge "$2" ] && return 0; sleep 0.02; done
  return 1
}

# 4 M parameters: an 8 MB anchor.
"$bin/pulse-bench" trajectory --out "$work/traj" --params 4000000 --steps 2 --seed 9 >/dev/null || exit 1
"$bin/pulse-publish" --store "$work/store" --new-key --sync-anchors "$(ck 0)" "$(ck 1)" >"$work/pub.out" 2>&1 || { cat "$work/pub.out"; exit 1; }
serve "$work/store" || exit 1
spid=${pids[-1]}
u=$url
key=$(sed -n 's/.*"public_key":"\([0-9a-f]*\)".*/\1/p' "$work/store/head.json")
anchor=$(ls "$work"/store/objects/*.safetensors | head -1)
asize=$(stat -c %s "$anchor")
want=$(digest_of "$(ck 1)")

for par in 1 4; do
  out=$work/p$par.safetensors
  # Slowly (2 MB/s per request), then SIGKILL once 2 MB are on disk.
  "$bin/pulse-pull" "$u" --out "$out" --key "$key" --parallel "$par" --limit-rate 2M --json \
    >"$work/k$par.json" 2>&1 &
  kpid=$!
  pids+=($kpid)
  wait_parts "$out.pulse-cache" 2000000 || bad "parallel $par: the download never started"
  kill -9 "$kpid"; wait "$kpid" 2>/dev/null
  held=$(parts_size "$out.pulse-cache")
  [ "$held" -gt 0 ] && [ "$held" -lt "$asize" ] && ok || bad "parallel $par: partial files hold $held of $asize bytes"
  [ ! -e "$out" ] && ok || bad "parallel $par: no --out file from a killed first pull"
  # The restart resumes: it downloads what was missing, not the whole anchor again.
  "$bin/pulse-pull" "$u" --out "$out" --key "$key" --parallel "$par" --json >"$work/r$par.json" 2>&1
  expect "parallel $par: the restart exits 0" 0 "$?"
  expect "parallel $par: bit for bit" "$want" "$(digest_of "$out")"
  resumed=$(grep '"event":"download".*safetensors' "$work/r$par.json" | sed -n 's/.*"resumed":\([0-9]*\).*/\1/p')
  dl=$(num "$work/r$par.json" synced bytes_downloaded)
  [ "${resumed:-0}" -ge "$held" ] && ok || bad "parallel $par: resumed ${resumed:-?} bytes, $held were on disk"
  [ "${dl:-$asize}" -lt "$asize" ] && ok || bad "parallel $par: downloaded ${dl:-?} bytes after the restart, the anchor is $asize"
  [ "$(parts_size "$out.pulse-cache")" -eq 0 ] && ok || bad "parallel $par: partial files left"
done

# --- the server killed (SIGKILL) mid-download and restarted on its port
"$bin/pulse-pull" "$u" --out "$work/s.safetensors" --key "$key" --limit-rate 3M --retries 30 \
  --parallel 1 --json >"$work/s.json" 2>&1 &
ppid_=$!
pids+=($ppid_)
wait_parts "$work/s.safetensors.pulse-cache" 1500000 || bad "server restart: the download never started"
kill -9 "$spid"; wait "$spid" 2>/dev/null
sleep 0.5
"$bin/pulse-serve" --store "$work/store" --listen "127.0.0.1:$port" >"$work/serve2.out" 2>"$work/serve2.err" &
spid=$!
pids+=($spid)
wait_port "$work/serve2.out" >/dev/null || { bad "pulse-serve did not restart on port $port"; cat "$work/serve2.err"; }
wait "$ppid_"
expect "server restart: the puller exits 0" 0 "$?"
expect "server restart: bit for bit" "$want" "$(digest_of "$work/s.safetensors")"
retries=$(num "$work/s.json" synced retries)
[ "${retries:-0}" -ge 1 ] && ok || bad "server restart: no retry was needed?"
dl=$(num "$work/s.json" synced bytes_downloaded)
[ "${dl:-$asize}" -lt $((asize + asize / 4)) ] && ok || bad "server restart: ${dl:-?} bytes for a $asize-byte anchor (not resumed)"

# --- wrong base: step 1's weights labelled step 0 are never patched
cp "$(ck 1)" "$work/w.safetensors"
sed -i '1s/"step":"1"/"step":"0"/' "$work/w.safetensors"
grep -aq '"step":"0"' "$work/w.safetensors" && ok || bad "could not relabel the checkpoint"
"$bin/pulse-pull" "$u" --out "$work/w.safetensors" --key "$key" --no-catchup --json >"$work/w.json" 2>&1
expect "wrong base: exits 0" 0 "$?"
expect "wrong base: bit for bit" "$want" "$(digest_of "$work/w.safetensors")"
grep -q '"event":"rejected".*wrong base' "$work/w.json" && ok || bad "wrong base: not reported"
grep '"event":"synced"' "$work/w.json" | grep -q '"route":"anchor"' && ok || bad "wrong base: not rebuilt from an anchor"

finish
