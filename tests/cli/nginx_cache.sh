#!/usr/bin/env bash
# 20 pulse-pull workers at once through nginx with the shipped caching
# configuration (tools/nginx/pulse-cache.conf) in front of pulse-serve: every
# worker ends bit for bit at the trainer's step, and the origin's own
# counters show that each immutable object left it once, a catch-up pinned
# to its target step too, and an unpinned one is asked each time. Usage:
# nginx_cache.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
src=$(cd "$(dirname "$0")/../.." && pwd)
chmod 755 "$work"
# nginx runs as a daemon, not in pids.
cleanup_extra() {
  [ -f "$work/nginx/nginx.pid" ] && kill "$(cat "$work/nginx/nginx.pid")" 2>/dev/null
}
nginx=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$nginx" ] || { echo "FAIL: nginx is not installed (tools/install-deps.sh)"; exit 1; }

"$bin/pulse-bench" trajectory --out "$work/traj" --params 300000 --steps 2 --seed 4 >/dev/null || exit 1
"$bin/pulse-publish" --store "$work/store" --new-key --sync-anchors "$(ck 0)" "$(ck 1)" "$(ck 2)" >/dev/null 2>&1 || { echo "FAIL: publish"; exit 1; }
serve "$work/store" || exit 1

mkdir -p "$work/nginx/cache"
nport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$work/nginx/nginx.conf" <<CONF
daemon on;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  proxy_temp_path $work/nginx/tmp;
  client_body_temp_path $work/nginx/tmp;
  fastcgi_temp_path $work/nginx/tmp;
  uwsgi_temp_path $work/nginx/tmp;
  scgi_temp_path $work/nginx/tmp;
  proxy_cache_path $work/nginx/cache levels=1:2 keys_zone=pulse:8m use_temp_path=off;
  upstream pulse_origin { server 127.0.0.1:$port; keepalive 16; }
  server {
    listen 127.0.0.1:$nport;
    include $src/tools/nginx/pulse-cache.conf;
  }
}
CONF
"$nginx" -p "$work/nginx" -c "$work/nginx/nginx.conf" -e "$work/nginx/error.log" 2>"$work/nginx.err" ||
  { echo "FAIL: nginx did not start"; cat "$work/nginx.err"; exit 1; }
key=$(sed -n 's/.*"public_key":"\([0-9a-f]*\)".*/\1/p' "$work/store/head.json")

want=$(digest_of "$(ck 2)")
for i in $(seq 1 20); do
  "$bin/pulse-pull" "http://127.0.0.1:$nport" --key "$key" --out "$work/w$i.safetensors" --threads 1 >"$work/w$i.out" 2>&1 &
  wp[$i]=$!
done
for i in $(seq 1 20); do wait "${wp[$i]}" || bad "worker $i failed: $(tail -2 "$work/w$i.out")"; done
same=0
for i in $(seq 1 20); do [ "$(digest_of "$work/w$i.safetensors")" = "$want" ] && same=$((same + 1)); done
expect "workers at step 2 bit for bit" 20 "$same"

# The origin's counters: object answers with a body, per distinct object.
metrics=$(curl -s "http://127.0.0.1:$port/metrics")
sent=$(echo "$metrics" | awk -F' ' '/^pulse_http_requests_total\{route="object",code="(200|206)"\}/ {s += $2} END {print s + 0}')
objects=$(cat "$work"/w*.out | grep -o 'objects/[0-9a-f]*\.[a-z]*' | sort -u | wc -l)
[ "$objects" -ge 1 ] || objects=$(ls "$work/w1.safetensors.pulse-cache/objects" | grep -vc '^\.')
expect "object answers from the origin (each object once)" "$objects" "$sent"

# Catch-ups: one pinned to step 2 asked 5 times through nginx leaves the
# origin once, the same bytes each time; an unpinned one goes to the
# origin every time (no-cache).
catchups() { curl -s "http://127.0.0.1:$port/metrics" | awk '/^pulse_http_requests_total\{route="catchup",code="200"\}/ {s += $2} END {print s + 0}'; }
before=$(catchups)
for i in 1 2 3 4 5; do
  curl -s -o "$work/pinned$i" -w '%{http_code}\n' "http://127.0.0.1:$nport/v1/catchup/0?to=2" >>"$work/pinned.codes"
done
expect "pinned catch-ups answered" "200 200 200 200 200" "$(tr '\n' ' ' <"$work/pinned.codes" | sed 's/ $//')"
expect "a pinned catch-up leaves the origin once" 1 $(($(catchups) - before))
same=$(for i in 2 3 4 5; do cmp -s "$work/pinned1" "$work/pinned$i" && echo y; done | wc -l)
expect "the cached answers are the origin's bytes" 4 "$same"
before=$(catchups)
for i in 1 2; do curl -s -o /dev/null "http://127.0.0.1:$nport/v1/catchup/0"; done
expect "unpinned catch-ups go to the origin each time" 2 $(($(catchups) - before))

finish "20 workers, $sent object answers from the origin for $objects objects"
