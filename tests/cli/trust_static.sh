#!/usr/bin/env bash
# Bad input from a static copy of a store (issue 15, "Bad input and
# faults"), served by nginx as a bucket or CDN would: a patch object with one
# byte flipped is refused and the worker keeps its verified step (then
# reaches the head once the copy is repaired); a CDN that serves a stale head
# (older step, validly signed) to a --follow worker is not taken as a
# rollback: the worker stays at its newer step, keeps polling, and takes the
# next newer head. Usage: trust_static.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
chmod 755 "$work"
# nginx runs as a daemon, not in pids.
cleanup_extra() {
  [ -f "$work/nginx/nginx.pid" ] && kill "$(cat "$work/nginx/nginx.pid")" 2>/dev/null
}
nginx=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$nginx" ] || { echo "FAIL: nginx is not installed (tools/install-deps.sh)"; exit 1; }

"$bin/pulse-bench" trajectory --out "$work/traj" --params 200000 --steps 6 --seed 9 >/dev/null || exit 1
pub() { "$bin/pulse-publish" --store "$work/store" --sync-anchors --anchor-every 100 "$@" >>"$work/pub.out" 2>&1 || bad "publish $*"; }
# The static copy: what an upload puts in a bucket (objects, then the head).
copy() {
  mkdir -p "$work/www/run/objects"
  cp "$work/store/objects/"*.* "$work/www/run/objects/"
  cp "$work/store/head.json" "$work/www/run/head.json.tmp" && mv "$work/www/run/head.json.tmp" "$work/www/run/head.json"
}
pub --new-key "$(ck 0)" "$(ck 1)" "$(ck 2)"
key=$("$bin/pulse-publish" --store "$work/store" --public-key)
copy
cp "$work/store/head.json" "$work/head2.json" # validly signed, step 2

mkdir -p "$work/nginx"
nport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$work/nginx/nginx.conf" <<CONF
daemon on;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 64; }
http {
  access_log off;
  client_body_temp_path $work/nginx/tmp;
  proxy_temp_path $work/nginx/tmp;
  fastcgi_temp_path $work/nginx/tmp;
  uwsgi_temp_path $work/nginx/tmp;
  scgi_temp_path $work/nginx/tmp;
  server {
    listen 127.0.0.1:$nport;
    location / { root $work/www; }
  }
}
CONF
"$nginx" -p "$work/nginx" -c "$work/nginx/nginx.conf" -e "$work/nginx/error.log" 2>"$work/nginx.err" ||
  { echo "FAIL: nginx did not start"; cat "$work/nginx.err"; exit 1; }
u=http://127.0.0.1:$nport/run

"$bin/pulse-pull" "$u" --key "$key" --out "$work/w.safetensors" --retries 1 >"$work/p1.out" 2>&1
expect "a pull from the static copy" "$(digest_of "$(ck 2)")" "$(digest_of "$work/w.safetensors")"

# --- a tampered patch object in the copy: one byte flipped
pub "$(ck 3)" "$(ck 4)"
copy
p3=$(sed -n 's/.*"step":3,"base_step":2,"path":"\(objects\/[0-9a-f]*\.pulse\)".*/\1/p' "$work/store/head.json")
[ -n "$p3" ] && ok || bad "the head names the patch to step 3"
python3 - "$work/www/run/$p3" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0x40
open(p, "wb").write(bytes(b))
PY
"$bin/pulse-pull" "$u" --key "$key" --out "$work/w.safetensors" --retries 1 >"$work/p2.out" 2>&1
expect "a pull through a tampered patch fails" 1 "$?"
grep -q "not to the signed name" "$work/p2.out" && ok || bad "the refusal says why: $(tail -3 "$work/p2.out")"
expect "the worker keeps its verified step 2" "$(digest_of "$(ck 2)")" "$(digest_of "$work/w.safetensors")"
cp "$work/store/$p3" "$work/www/run/$p3" # the copy repaired
"$bin/pulse-pull" "$u" --key "$key" --out "$work/w.safetensors" --retries 1 >"$work/p3.out" 2>&1
expect "the repaired copy brings the worker to step 4" "$(digest_of "$(ck 4)")" "$(digest_of "$work/w.safetensors")"

# --- a CDN serving a stale head to a follower
"$bin/pulse-pull" "$u" --key "$key" --out "$work/w.safetensors" --follow --json --timeout 5 \
  >"$work/f.json" 2>"$work/f.err" &
fpid=$!
pids+=($fpid)
sleep 1
cp "$work/head2.json" "$work/www/run/head.json.tmp" && mv "$work/www/run/head.json.tmp" "$work/www/run/head.json"
sleep 5 # the static copy is polled every 2 s
kill -0 "$fpid" 2>/dev/null && ok || bad "the follower still runs with a stale head served"
expect "the follower stays at step 4" "$(digest_of "$(ck 4)")" "$(digest_of "$work/w.safetensors")"
grep -q '"event":"rejected".*older than step 4' "$work/f.json" && ok ||
  bad "the stale head is refused as older: $(grep -v progress "$work/f.json" | tail -3)"
pub "$(ck 5)"
copy
wait_digest "$work/w.safetensors" "$(digest_of "$(ck 5)")" && ok || bad "the follower takes the next newer head"
kill -TERM "$fpid"; wait "$fpid"; expect "the follower stops cleanly" 0 "$?"

finish
