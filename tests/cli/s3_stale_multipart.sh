#!/usr/bin/env bash
# pulse-publish --upload killed with -9 in the middle of a multipart part
# leaves an incomplete multipart upload in the bucket; the next publish lists
# the incomplete uploads under its prefix (ListMultipartUploads) and aborts
# them (AbortMultipartUpload), and leaves those under other prefixes alone.
# s3rver implements neither call (501 NotImplemented for GET ?uploads, 405
# for DELETE ?uploadId), so this test runs against a small S3 stand-in
# written here in Python (the S3 REST calls the uploader makes, no
# authentication): it shows the requests and their effect, not
# compatibility with a real service. Usage: s3_stale_multipart.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
command -v python3 >/dev/null || { echo "FAIL: python3 is not installed"; exit 1; }
command -v curl >/dev/null || { echo "FAIL: curl is not installed"; exit 1; }

cat >"$work/s3.py" <<'PY'
import os, sys, threading, time, uuid, urllib.parse
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
from xml.sax.saxutils import escape
work = sys.argv[1]
objects, uploads, lock = {}, {}, threading.Lock()

class S3(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def parts(self):
        u = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(u.path)
        q = urllib.parse.parse_qs(u.query, keep_blank_values=True)
        bucket, _, key = path.lstrip("/").partition("/")
        return bucket, key, q
    def body(self):
        n = int(self.headers.get("Content-Length", "0"))
        return self.rfile.read(n) if n else b""
    def reply(self, code, data=b"", extra=()):
        with open(os.path.join(work, "s3.log"), "a") as f:
            f.write(f"{self.command} {self.path} {code}\n")
        self.send_response(code)
        for k, v in extra: self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD": self.wfile.write(data)
    def do_HEAD(self):
        b, k, q = self.parts()
        with lock: o = objects.get(k)
        if o is None: return self.reply(404)
        self.send_response(200)
        self.send_header("Content-Length", str(len(o)))
        self.end_headers()
    def do_GET(self):
        b, k, q = self.parts()
        prefix = q.get("prefix", [""])[0]
        with lock:
            if not k and "uploads" in q:
                items = "".join(f"<Upload><Key>{escape(u['key'])}</Key><UploadId>{i}</UploadId></Upload>"
                                for i, u in uploads.items() if u["key"].startswith(prefix))
                return self.reply(200, f"<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>{items}</ListMultipartUploadsResult>".encode())
            if not k:
                items = "".join(f"<Contents><Key>{escape(n)}</Key><LastModified>2000-01-01T00:00:00.000Z</LastModified><Size>{len(o)}</Size></Contents>"
                                for n, o in objects.items() if n.startswith(prefix))
                return self.reply(200, f"<ListBucketResult><IsTruncated>false</IsTruncated>{items}</ListBucketResult>".encode())
            o = objects.get(k)
        return self.reply(200, o) if o is not None else self.reply(404)
    def do_PUT(self):
        b, k, q = self.parts()
        data = self.body()
        if "uploadId" in q:
            if os.path.exists(os.path.join(work, "slow")):
                with open(os.path.join(work, "s3.log"), "a") as f: f.write("PART-STARTED\n")
                time.sleep(60)
            with lock:
                u = uploads.get(q["uploadId"][0])
                if u is None: return self.reply(404, b"<Error><Code>NoSuchUpload</Code></Error>")
                u["parts"][int(q["partNumber"][0])] = data
            return self.reply(200, extra=[("ETag", '"p%s"' % q["partNumber"][0])])
        with lock: objects[k] = data
        return self.reply(200, extra=[("ETag", '"x"')])
    def do_POST(self):
        b, k, q = self.parts()
        self.body()
        with lock:
            if "uploads" in q:
                i = uuid.uuid4().hex
                uploads[i] = {"key": k, "parts": {}}
                return self.reply(200, f"<InitiateMultipartUploadResult><Key>{escape(k)}</Key><UploadId>{i}</UploadId></InitiateMultipartUploadResult>".encode())
            u = uploads.pop(q.get("uploadId", [""])[0], None)
            if u is None: return self.reply(404, b"<Error><Code>NoSuchUpload</Code></Error>")
            objects[k] = b"".join(u["parts"][n] for n in sorted(u["parts"]))
        return self.reply(200, b"<CompleteMultipartUploadResult></CompleteMultipartUploadResult>")
    def do_DELETE(self):
        b, k, q = self.parts()
        with lock:
            if "uploadId" in q:
                gone = uploads.pop(q["uploadId"][0], None)
                return self.reply(204 if gone else 404)
            objects.pop(k, None)
        return self.reply(204)

srv = ThreadingHTTPServer(("127.0.0.1", 0), S3)
with open(os.path.join(work, "port.tmp"), "w") as f: f.write(str(srv.server_address[1]))
os.rename(os.path.join(work, "port.tmp"), os.path.join(work, "port"))
srv.serve_forever()
PY
python3 "$work/s3.py" "$work" 2>"$work/s3.err" &
pids+=($!)
for _ in $(seq 1 200); do [ -f "$work/port" ] && break; sleep 0.05; done
[ -f "$work/port" ] || { echo "FAIL: the S3 stand-in did not start"; cat "$work/s3.err"; exit 1; }
endpoint=http://127.0.0.1:$(cat "$work/port")
export AWS_ENDPOINT_URL=$endpoint AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
uploads_under() { curl -s "$endpoint/bkt?prefix=$1&uploads=" | grep -o '<Upload>' | wc -l; }

# 2.7M parameters: a 5.4 MB anchor, over --multipart-mb 5: two parts.
"$bin/pulse-bench" trajectory --out "$work/traj" --params 2700000 --steps 2 --seed 6 >/dev/null || exit 1
publish() {
  "$bin/pulse-publish" --store "$work/store" --sync-anchors --upload s3://bkt/runs/a \
    --multipart-mb 5 --part-mb 5 "$@"
}

# Another writer's upload under another prefix: never touched.
curl -s -X POST "$endpoint/bkt/runs/b/objects/x?uploads=" >/dev/null
expect "an upload under another prefix" 1 "$(uploads_under runs/b/)"

# --- killed in the middle of a part
touch "$work/slow"
publish --new-key "$(ck 0)" >"$work/pub1.out" 2>&1 &
ppid=$!
for _ in $(seq 1 600); do grep -q PART-STARTED "$work/s3.log" 2>/dev/null && break; sleep 0.05; done
grep -q PART-STARTED "$work/s3.log" && ok || bad "the publish reached a part: $(cat "$work/pub1.out")"
# $ppid is the subshell running the function: the publisher is its child (left
# running, it holds the store, one writer per store, when the next run comes)
kill -9 $(pgrep -P "$ppid") "$ppid"; wait "$ppid" 2>/dev/null
rm -f "$work/slow"
expect "the killed upload left an incomplete multipart upload" 1 "$(uploads_under runs/a/)"
stale=$(curl -s "$endpoint/bkt?prefix=runs/a/&uploads=" | sed -n 's/.*<UploadId>\([0-9a-f]*\)<.*/\1/p')

# --- the next publish aborts it, then uploads as usual
publish --json "$(ck 1)" >"$work/pub2.out" 2>"$work/pub2.err"
expect "the next publish exits 0" 0 "$?"
grep -q '"event":"upload".*"stale_aborted":1' "$work/pub2.out" && ok || bad "it says one stale upload was aborted: $(cat "$work/pub2.out" "$work/pub2.err")"
grep -q "^DELETE /bkt/runs/a/objects/.*uploadId=$stale 204" "$work/s3.log" && ok || bad "AbortMultipartUpload of the stale upload"
expect "no incomplete upload left under the prefix" 0 "$(uploads_under runs/a/)"
expect "the other prefix's upload is left alone" 1 "$(uploads_under runs/b/)"
curl -s "$endpoint/bkt/runs/a/head.json" | grep -q '"step":1' && ok || bad "the bucket's head is step 1"

finish
