#!/usr/bin/env bash
# pulse-serve and pulse-publish --listen driven with the real curl client:
# the head, immutable objects with ETags, 304, Range (206/416), HEAD, 404,
# traversal attempts, long-polls woken by a publisher in another process and
# in the same one, catch-ups that rebuild the head bit for bit, metrics,
# and 50 concurrent clients. Network on 127.0.0.1 only. Usage:
# server_curl.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
if ! command -v curl >/dev/null; then echo "server_curl: no curl client: skipped"; exit 77; fi
C() { curl -s --max-time 20 "$@"; }
status_of() { C -o /dev/null -w '%{http_code}' "$@"; }
hdr() { # header name, then curl arguments: prints the header's value
  local name=$1; shift
  C -D - -o /dev/null "$@" | tr -d '\r' | awk -v n="$name" 'BEGIN{IGNORECASE=1} index(tolower($0), tolower(n) ":") == 1 {sub(/^[^:]*: */, ""); print; exit}'
}

"$bin/pulse-bench" trajectory --out "$work/traj" --params 300000 --steps 7 --seed 5 >/dev/null || exit 1
t=$work/traj
"$bin/pulse-publish" --store "$work/store" --anchor-every 3 --new-key \
  "$t/step0000.safetensors" "$t/step0001.safetensors" "$t/step0002.safetensors" "$t/step0003.safetensors" \
  >"$work/pub1.out" 2>&1 || { cat "$work/pub1.out"; exit 1; }

serve "$work/store" || exit 1
u=$url

# --- the head
C "$u/v1/head" >"$work/head.json"
expect "head status" 200 "$(status_of "$u/v1/head")"
expect "head content type" "application/json" "$(hdr Content-Type "$u/v1/head")"
expect "head cache control" "no-cache" "$(hdr Cache-Control "$u/v1/head")"
grep -q '"step":3,' "$work/head.json" && ok || bad "head step 3"
grep -q '"signature":"' "$work/head.json" && ok || bad "head is signed"
hetag=$(hdr ETag "$u/v1/head")
expect "head 304" 304 "$(status_of -H "If-None-Match: $hetag" "$u/v1/head")"

# --- an object
obj=$(grep -o '"url":"/v1/objects/[0-9a-f]*\.safetensors"' "$work/head.json" | head -1 | cut -d'"' -f4)
sha=$(basename "$obj" .safetensors)
C "$u$obj" -o "$work/obj"
expect "object body hashes to its name" "$sha" "$(sha256sum "$work/obj" | cut -d' ' -f1)"
size=$(stat -c %s "$work/obj")
expect "object etag" "\"$sha\"" "$(hdr ETag "$u$obj")"
expect "object cache control" "public, max-age=31536000, immutable" "$(hdr Cache-Control "$u$obj")"
expect "object 304" 304 "$(status_of -H "If-None-Match: \"$sha\"" "$u$obj")"
expect "range 206" 206 "$(status_of -r 100-199 "$u$obj")"
expect "content-range" "bytes 100-199/$size" "$(hdr Content-Range -r 100-199 "$u$obj")"
C -r 100-199 "$u$obj" -o "$work/part"
expect "range bytes" "$(tail -c +101 "$work/obj" | head -c 100 | sha256sum)" "$(sha256sum <"$work/part")"
expect "suffix range" 206 "$(status_of -r -10 "$u$obj")"
expect "range past the end 416" 416 "$(status_of -r "$size"- "$u$obj")"
expect "416 names the size" "bytes */$size" "$(hdr Content-Range -r "$size"- "$u$obj")"
expect "HEAD request" 200 "$(status_of -I "$u$obj")"
expect "HEAD has the length" "$size" "$(hdr Content-Length -I "$u$obj")"
expect "unknown object 404" 404 "$(status_of "$u/v1/objects/$(printf '%064d' 0).pulse")"
expect "unknown route 404" 404 "$(status_of "$u/nothing")"
C "$u/nothing" | grep -q '^{"error":' && ok || bad "errors are JSON"
expect "POST 405" 405 "$(status_of -X POST "$u/v1/head")"

# --- traversal: nothing outside objects/ and the routes, the key least of all
for p in "/v1/../head.json" "/v1/objects/../signing-key.pem" "/v1/objects/%2e%2e/signing-key.pem" \
         "/v1/objects/%2E%2E%2Fsigning-key.pem" "/v1/objects/..%5csigning-key.pem" \
         "/v1/head%00.json" "/v1/objects/%252e%252e%252fhead.json" "//etc/passwd"; do
  expect "refused: $p" 400 "$(status_of --path-as-is "$u$p")"
done
for p in "/signing-key.pem" "/head.json" "/v1/objects/signing-key.pem" "/etc/passwd" "/v1/catchup/x"; do
  expect "not found: $p" 404 "$(status_of --path-as-is "$u$p")"
done
C --path-as-is "$u/v1/objects/../signing-key.pem" "$u/signing-key.pem" | grep -q PRIVATE && bad "the key leaked" || ok

# --- long-poll woken by a publisher in another process
C -o "$work/poll1" -w '%{http_code}' "$u/v1/head?after=3&timeout_ms=20000" >"$work/poll1.code" &
poll=$!
for _ in $(seq 1 100); do C "$u/metrics" | grep -q '^pulse_longpoll_waiters 1' && break; sleep 0.02; done
"$bin/pulse-publish" --store "$work/store" "$t/step0004.safetensors" >"$work/pub2.out" 2>&1 || bad "publish step 4"
start=$(date +%s%N)
wait $poll
woke_ms=$(( ($(date +%s%N) - start) / 1000000 ))
expect "long-poll answered" 200 "$(cat "$work/poll1.code")"
grep -q '"step":4,' "$work/poll1" && ok || bad "long-poll returns step 4"
[ "$woke_ms" -lt 1000 ] && ok || bad "long-poll woke ${woke_ms} ms after the publisher exited"
t0=$(date +%s%N)
expect "long-poll timeout returns the head" 200 "$(status_of "$u/v1/head?after=4&timeout_ms=300")"
waited=$(( ($(date +%s%N) - t0) / 1000000 ))
[ "$waited" -ge 290 ] && [ "$waited" -lt 3000 ] && ok || bad "timeout waited ${waited} ms"
expect "bad long-poll" 400 "$(status_of "$u/v1/head?after=-1")"

# --- catch-up: from step 1 to the head (4), applied to the real step-1 checkpoint
expect "catch-up status" 200 "$(status_of "$u/v1/catchup/1")"
C "$u/v1/catchup/1" -o "$work/cu.pulse"
expect "catch-up ends at" 4 "$(hdr X-Pulse-To-Step "$u/v1/catchup/1")"
"$bin/pulse-apply" "$t/step0001.safetensors" "$work/cu.pulse" -o "$work/cu.safetensors" >/dev/null 2>&1 || bad "catch-up applies"
expect "catch-up rebuilds step 4" "$(digest_of "$t/step0004.safetensors")" "$(digest_of "$work/cu.safetensors")"
expect "catch-up from the head" 404 "$(status_of "$u/v1/catchup/4")"

# --- metrics and health
C "$u/metrics" >"$work/metrics"
grep -q '^pulse_head_step 4$' "$work/metrics" && ok || bad "metrics: head step"
grep -q '^pulse_http_requests_total{route="object",code="206"}' "$work/metrics" && ok || bad "metrics: 206 counted"
grep -q '^pulse_http_requests_total{route="other",code="400"} ' "$work/metrics" && ok || bad "metrics: refusals counted"
grep -q '^pulse_http_response_bytes_total{route="object"} [1-9]' "$work/metrics" && ok || bad "metrics: bytes"
C "$u/healthz" | grep -q '"status":"ok","step":4' && ok || bad "healthz"

# --- 50 concurrent clients
clients=()
for i in $(seq 1 50); do C "$u$obj" -o "$work/c$i" & clients+=($!); done
wait "${clients[@]}"
n_ok=0
for i in $(seq 1 50); do [ "$(sha256sum "$work/c$i" 2>/dev/null | cut -d' ' -f1)" = "$sha" ] && n_ok=$((n_ok + 1)); done
expect "50 concurrent clients got the whole object" 50 "$n_ok"

kill "${pids[0]}"; wait "${pids[0]}"; expect "pulse-serve stops cleanly on SIGTERM" 0 "$?"

# --- pulse-publish --listen: serves while it publishes, wakes its own long-polls
"$bin/pulse-publish" --store "$work/store" --listen 127.0.0.1:0 --interval-ms 400 \
  "$t/step0005.safetensors" "$t/step0006.safetensors" >"$work/pub3.out" 2>"$work/pub3.err" &
pids+=($!)
port2=$(wait_port "$work/pub3.out") || { bad "pulse-publish --listen did not start"; cat "$work/pub3.err"; }
u2=http://127.0.0.1:$port2
C "$u2/v1/head?after=5&timeout_ms=20000" >"$work/poll2"
grep -q '"step":6,' "$work/poll2" && ok || bad "in-process long-poll sees step 6"
for _ in $(seq 1 100); do grep -q 'step 6 <- 5' "$work/pub3.out" && break; sleep 0.05; done
expect "still serving after publishing" 200 "$(status_of "$u2/healthz")"
kill -INT "${pids[1]}"; wait "${pids[1]}"; expect "pulse-publish stops on SIGINT" 0 "$?"
"$bin/pulse-publish" --store "$work/store" --listen 127.0.0.1:0 --exit-after-publish \
  "$t/step0007.safetensors" >"$work/pub4.out" 2>&1
expect "--exit-after-publish exits" 0 "$?"
grep -q 'on http://127.0.0.1:[1-9]' "$work/pub4.out" && ok || bad "port 0 resolved and printed"
"$bin/pulse-publish" --store "$work/store" --verify --key "$work/store/signing-key.pem" >/dev/null 2>&1 \
  && ok || bad "the store verifies against its key"
expect "the store holds step 7" "$(digest_of "$t/step0007.safetensors")" \
  "$(sed -n 's/.*"state_digest":"\([0-9a-f]*\)".*/\1/p' "$work/store/head.json")"

finish
