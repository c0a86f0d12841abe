#!/usr/bin/env bash
# pulse-pull against hostile sources (issue "Reliability and security: what
# hostile networks and failures still break"): a source alternating the
# publisher's head with one signed by a foreign key is refused on one
# throttled stderr line per 30 s (it printed two lines per refusal); a
# source's redirect to another origin (127.0.0.1 -> 127.0.0.2) is not
# followed and no request reaches the other address, unless
# --follow-redirects-to names it; an object larger than --max-object-size
# is refused before its download. The sources are a small Python server.
# Usage: pull_hostile.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }

"$bin/pulse-bench" trajectory --out "$work/traj" --params 100000 --steps 3 --seed 5 >/dev/null || exit 1
"$bin/pulse-publish" --store "$work/a" --sync-anchors --new-key "$(ck 0)" "$(ck 1)" "$(ck 2)" >/dev/null 2>&1 || bad "publish a"
"$bin/pulse-publish" --store "$work/b" --sync-anchors --new-key "$(ck 0)" "$(ck 1)" "$(ck 2)" >/dev/null 2>&1 || bad "publish b"
key=$("$bin/pulse-publish" --store "$work/a" --public-key)

cat >"$work/srv.py" <<'PY'
import http.server, os, sys, threading
work = sys.argv[1]
count = {"other": 0, "heads": 0}
lock = threading.Lock()

def serve_store(h, store):
    path = h.path.split("?")[0]
    rel = "head.json" if path == "/v1/head" else path[len("/v1/"):] if path.startswith("/v1/objects/") else None
    f = os.path.join(store, rel) if rel else None
    if f is None or not os.path.isfile(f):
        h.send_response(404); h.send_header("Content-Length", "0"); h.end_headers(); return
    data = open(f, "rb").read()
    h.send_response(200); h.send_header("Content-Length", str(len(data))); h.end_headers()
    h.wfile.write(data)

class Alternate(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        store = os.path.join(work, "a")
        if self.path.startswith("/v1/head"):
            with lock:
                count["heads"] += 1
                if count["heads"] % 2 == 0:
                    store = os.path.join(work, "b")
        serve_store(self, store)
    def log_message(self, *a): pass

class Redirect(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(302)
        self.send_header("Location", "http://127.0.0.2:%d%s" % (other.server_address[1], self.path))
        self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass

class Other(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with lock:
            count["other"] += 1
            open(os.path.join(work, "other.count"), "w").write(str(count["other"]))
        serve_store(self, os.path.join(work, "a"))
    def log_message(self, *a): pass

servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), Alternate),
           http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)]
other = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Other)
servers.append(other)
for s in servers:
    s.daemon_threads = True
    threading.Thread(target=s.serve_forever, daemon=True).start()
open(os.path.join(work, "ports.tmp"), "w").write(" ".join(str(s.server_address[1]) for s in servers))
os.rename(os.path.join(work, "ports.tmp"), os.path.join(work, "ports"))
threading.Event().wait()
PY
python3 "$work/srv.py" "$work" 2>"$work/srv.err" &
pids+=($!)
for _ in $(seq 1 100); do [ -s "$work/ports" ] && break; sleep 0.05; done
[ -s "$work/ports" ] || { cat "$work/srv.err"; echo "FAIL: the test server did not start"; exit 1; }
read -r alt redir other <"$work/ports"

# --- a refusal storm: stderr stays short
"$bin/pulse-pull" "http://127.0.0.1:$alt" --key "$key" --out "$work/w.safetensors" --follow \
  --no-catchup --timeout 5 >"$work/storm.out" 2>"$work/storm.err" &
fpid=$!
pids+=($fpid)
sleep 6
kill -TERM "$fpid"; wait "$fpid"
refusals=$(grep -c "foreign\|head refused" "$work/storm.err")
lines=$(wc -l <"$work/storm.err")
bytes=$(wc -c <"$work/storm.err")
[ "$refusals" -ge 1 ] && ok || bad "the foreign head is said to be refused: $(head -3 "$work/storm.err")"
[ "$lines" -le 3 ] && ok || bad "$lines stderr lines ($bytes bytes) in 6 s of refusals: $(head -5 "$work/storm.err")"
echo "refusal storm: $lines stderr lines, $bytes bytes in 6 s"

# --- a redirect to another origin
"$bin/pulse-pull" "http://127.0.0.1:$redir" --key "$key" --out "$work/r.safetensors" --no-catchup \
  --retries 0 --timeout 5 >/dev/null 2>"$work/redir.err"
expect "a pull redirected to another origin fails" 1 "$?"
grep -q "redirected to http://127.0.0.2:$other/" "$work/redir.err" && ok || bad "the error names the target: $(cat "$work/redir.err")"
expect "no request reached the other origin" 0 "$(cat "$work/other.count" 2>/dev/null || echo 0)"
"$bin/pulse-pull" "http://127.0.0.1:$redir" --key "$key" --out "$work/r.safetensors" --no-catchup \
  --retries 0 --timeout 5 --follow-redirects-to "127.0.0.2:$other" >/dev/null 2>"$work/redir2.err"
expect "allowed, the redirect is followed" 0 "$?"
expect "the file is the publisher's step 2" "$(digest_of "$(ck 2)")" "$(digest_of "$work/r.safetensors")"

# --- an object over the limit
"$bin/pulse-pull" "http://127.0.0.2:$other" --key "$key" --out "$work/m.safetensors" --no-catchup \
  --retries 0 --max-object-size 1000 >/dev/null 2>"$work/max.err"
expect "an object over --max-object-size fails the pull" 1 "$?"
grep -q "more than the largest object allowed (1000 bytes" "$work/max.err" && ok || bad "the error says why: $(cat "$work/max.err")"
ls "$work/m.safetensors.pulse-cache/objects" 2>/dev/null | grep -q part && bad "a download began" || ok
finish
