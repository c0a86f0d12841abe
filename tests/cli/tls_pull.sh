#!/usr/bin/env bash
# pulse-pull over HTTPS: pulse-serve behind nginx TLS with a CA and a
# certificate made here by openssl. With --cacert the pull ends bit for bit
# at the trainer's step; without it (verification is on by default) and
# against a certificate for another name it is refused. Usage:
# tls_pull.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
chmod 755 "$work"
# The nginx daemons, not in pids.
cleanup_extra() {
  for n in good wrong; do [ -f "$work/$n/nginx.pid" ] && kill "$(cat "$work/$n/nginx.pid")" 2>/dev/null; done
}
nginx=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$nginx" ] || { echo "FAIL: nginx is not installed (tools/install-deps.sh)"; exit 1; }
command -v openssl >/dev/null || { echo "FAIL: openssl is not installed"; exit 1; }

# A CA, a certificate for 127.0.0.1 and one for another name, both by it.
cd "$work"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj /CN=pulse-test-ca -keyout ca.key -out ca.pem 2>/dev/null || { echo "FAIL: openssl CA"; exit 1; }
for n in good wrong; do
  san=IP:127.0.0.1
  [ $n = wrong ] && san=DNS:wrong.example
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=$n \
    -keyout $n.key -out $n.csr 2>/dev/null &&
    printf 'subjectAltName=%s\n' "$san" >$n.ext &&
    openssl x509 -req -in $n.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
      -extfile $n.ext -out $n.pem 2>/dev/null || { echo "FAIL: openssl certificate $n"; exit 1; }
done
cd - >/dev/null

"$bin/pulse-bench" trajectory --out "$work/traj" --params 100000 --steps 1 --seed 6 >/dev/null || exit 1
"$bin/pulse-publish" --store "$work/store" --new-key --sync-anchors "$work/traj/step0000.safetensors" \
  "$work/traj/step0001.safetensors" >/dev/null 2>&1 || { echo "FAIL: publish"; exit 1; }
serve "$work/store" || exit 1

start_tls() { # NAME -> port of an nginx with NAME's certificate
  local n=$1 p
  p=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  mkdir -p "$work/$n/tmp"
  cat >"$work/$n/nginx.conf" <<CONF
daemon on;
pid $work/$n/nginx.pid;
error_log $work/$n/error.log warn;
events { worker_connections 256; }
http {
  access_log off;
  proxy_temp_path $work/$n/tmp;
  client_body_temp_path $work/$n/tmp;
  fastcgi_temp_path $work/$n/tmp;
  uwsgi_temp_path $work/$n/tmp;
  scgi_temp_path $work/$n/tmp;
  server {
    listen 127.0.0.1:$p ssl;
    ssl_certificate $work/$n.pem;
    ssl_certificate_key $work/$n.key;
    location / { proxy_pass http://127.0.0.1:$port; proxy_buffering off; }
  }
}
CONF
  "$nginx" -p "$work/$n" -c "$work/$n/nginx.conf" -e "$work/$n/error.log" 2>"$work/$n.err" ||
    { echo "FAIL: nginx did not start"; cat "$work/$n.err" >&2; return 1; }
  echo "$p"
}
gport=$(start_tls good) || exit 1
wport=$(start_tls wrong) || exit 1
key=$(sed -n 's/.*"public_key":"\([0-9a-f]*\)".*/\1/p' "$work/store/head.json")
want=$(digest_of "$work/traj/step0001.safetensors")

"$bin/pulse-pull" "https://127.0.0.1:$gport" --key "$key" --cacert "$work/ca.pem" --out "$work/a.safetensors" >"$work/a.out" 2>&1
expect "pull over TLS with --cacert exits 0" 0 "$?"
expect "pull over TLS: step 1 bit for bit" "$want" "$(digest_of "$work/a.safetensors")"

"$bin/pulse-pull" "https://127.0.0.1:$gport" --key "$key" --retries 0 --out "$work/b.safetensors" >"$work/b.out" 2>&1
[ $? -ne 0 ] && ok || bad "an unknown CA was accepted"
grep -qi "certificate" "$work/b.out" && ok || bad "the refusal names the certificate: $(tail -2 "$work/b.out")"

"$bin/pulse-pull" "https://127.0.0.1:$wport" --key "$key" --cacert "$work/ca.pem" --retries 0 --out "$work/c.safetensors" >"$work/c.out" 2>&1
[ $? -ne 0 ] && ok || bad "a certificate for another name was accepted"
grep -qi "certificate\|subject\|name" "$work/c.out" && ok || bad "the refusal says why: $(tail -2 "$work/c.out")"
[ -f "$work/c.safetensors" ] && bad "a refused pull wrote its output" || ok

finish
