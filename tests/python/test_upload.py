"""pulse.Publisher(store, upload="s3://BUCKET/PREFIX") against a real
S3-compatible server (s3rver, started here on 127.0.0.1 as
tests/cli/s3_upload.sh does; configured through the environment like the
AWS CLI): after every publish the bucket holds the store's head byte for
byte and every object it names, a worker pulls each step from the bucket
itself (a static copy of the store) into torch tensors equal to the
trainer's BF16 weights, and a bucket that refuses the credentials raises
pulse.Error with the store's message. Exit 77: no torch or no s3rver."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

try:
    import torch
except ImportError:
    print("skipped: python3-torch is not installed")
    sys.exit(77)
if shutil.which("s3rver") is None:
    print("skipped: s3rver is not installed (tools/install-deps.sh)")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "examples"))
import llama  # noqa: E402
import pulse  # noqa: E402


def start_s3rver(work):
    """s3rver with the multipart calls as S3 answers them (abort, ETags
    checked at completion: tests/cli/lib/s3rver_multipart.js)."""
    log = open(os.path.join(work, "s3.log"), "w+")
    node_path = os.environ.get("NODE_PATH") or subprocess.run(
        ["npm", "root", "-g"], capture_output=True, text=True).stdout.strip() or "/usr/lib/node_modules"
    proc = subprocess.Popen(["node", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli",
                                                  "lib", "s3rver_multipart.js"), os.path.join(work, "s3")],
                            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, NODE_PATH=node_path))
    for _ in range(400):
        log.seek(0)
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", log.read())
        if m:
            return proc, int(m.group(1))
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("s3rver did not start")


def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()


# ---- One object in parts from several processes (pulse.s3_parts): the
# functions the spawned processes run (a sharded trainer's ranks).
PART = 4096  # s3rver takes small parts; S3 wants 5 MiB but for the last


def part_bytes(k):
    """Part k (1..3) of the object: distinct, reproducible bytes."""
    return bytes((k * 31 + i * 7) % 251 for i in range(PART))


def hash_parts(state, numbers):
    """Goes on with the SHA-256 from state (None: the first part) over the
    parts numbered: the state after them."""
    from pulse.s3_parts import Sha256
    h = Sha256(state)
    for k in numbers:
        h.add(memoryview(part_bytes(k)))
    return h.state


def put_parts(target, rel, upload_id, numbers):
    """This process's handle puts the parts numbered (part 3 from a uint8
    CPU tensor, the others from bytes): their ETags."""
    from pulse.s3_parts import PartUploader
    with PartUploader(target) as up:
        return [up.put(rel, upload_id, k, torch.frombuffer(bytearray(part_bytes(k)), dtype=torch.uint8)
                       if k == 3 else part_bytes(k)) for k in numbers]


def add_after_digest(h):
    h.digest()
    h.add(b"x")


def check_parts(work, endpoint):
    """Two processes hash (the SHA-256 state passed from one to the other)
    and put parts 1..3 of one upload, a third handle completes it: the
    object is the parts' bytes, named by their SHA-256. Then abort, a wrong
    ETag, and fetch_missing, on the store main() published."""
    import hashlib
    import multiprocessing
    import pickle
    from pulse.s3_parts import PartUploader, Sha256
    target = "s3://bkt/runs/py"
    whole = b"".join(part_bytes(k) for k in (1, 2, 3))
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        state = pool.apply(hash_parts, (None, [1]))
        state = pickle.loads(pickle.dumps(state))  # plain bytes between processes
        sha = Sha256(pool.apply(hash_parts, (state, [2, 3]))).digest()
        assert sha == hashlib.sha256(whole).digest(), "the chained SHA-256 is not hashlib's"
        for what, bad in (("a strided tensor", lambda: Sha256().add(torch.zeros(8, dtype=torch.uint8)[::2])),
                          ("a state of 3 bytes", lambda: Sha256(b"abc")),
                          ("a damaged state", lambda: Sha256(bytes(len(state)))),
                          ("an ended state", lambda: add_after_digest(Sha256(state)))):
            try:
                bad()
                raise AssertionError(f"Sha256 took {what}")
            except pulse.Error as e:
                assert e.status in ("PULSE_ERR_ARG", "PULSE_ERR_CORRUPT"), str(e)
        rel = f"objects/{sha.hex()}.safetensors"
        with PartUploader(target) as up:
            upload_id = up.begin(rel)
            first = pool.apply_async(put_parts, (target, rel, upload_id, [1]))
            rest = pool.apply_async(put_parts, (target, rel, upload_id, [2, 3]))
            etags = first.get(timeout=60) + rest.get(timeout=60)
            assert up.size(rel) is None, "the object is there before its upload completed"
            up.finish(rel, upload_id, etags)
            got = get(f"{endpoint}/bkt/runs/py/{rel}")
            assert got == whole, "the object is not its parts' bytes in order"
            assert hashlib.sha256(got).hexdigest() == sha.hex()
            assert up.size(rel) == 3 * PART
            print(f"parts 1..3 from two processes, completed by a third: {rel[:20]}... "
                  f"{len(got)} bytes, named by its SHA-256")

            rel2 = "objects/" + "ab" * 32 + ".safetensors"
            upload_id = up.begin(rel2)
            up.put(rel2, upload_id, 1, part_bytes(1))
            up.abort(rel2, upload_id)
            assert up.size(rel2) is None, "an aborted upload left an object"
            try:
                up.abort(rel2, upload_id)
                raise AssertionError("aborting an aborted upload was accepted")
            except pulse.Error as e:
                assert e.status == "PULSE_ERR_NOT_FOUND", str(e)
            print("abort: no object left; aborting again is PULSE_ERR_NOT_FOUND")

            upload_id = up.begin(rel2)
            etag = up.put(rel2, upload_id, 1, part_bytes(1))
            try:
                up.finish(rel2, upload_id, ['"' + "0" * 32 + '"'])
                raise AssertionError("a wrong ETag completed the upload")
            except pulse.Error as e:
                assert e.status == "PULSE_ERR_IO" and "completing a multipart upload" in str(e) \
                    and "HTTP 400" in str(e) and rel2 in str(e), str(e)
                print(f"finish with a wrong ETag: pulse.Error {str(e)[:140]}")
            assert up.size(rel2) is None
            up.finish(rel2, upload_id, [etag])  # still open: completes with the right one
            assert up.size(rel2) == PART
    check_fetch_missing(work, target, endpoint)


def check_fetch_missing(work, target, endpoint):
    """fetch_missing on the store main() published: a deleted anchor comes
    back byte for byte, nothing is fetched when nothing is missing, and a
    bucket object that is not its name's bytes is refused, leaving nothing
    in the store."""
    from pulse.s3_parts import PartUploader
    store = os.path.join(work, "store")
    objects = os.path.join(store, "objects")
    anchors = sorted(n for n in os.listdir(objects) if n.endswith(".safetensors"))
    assert anchors, "the published store has no anchor"
    name = anchors[-1]
    path = os.path.join(objects, name)
    with open(path, "rb") as f:
        original = f.read()
    with PartUploader(target) as up:
        os.remove(path)
        assert up.fetch_missing(store) == 1
        with open(path, "rb") as f:
            assert f.read() == original, "the fetched anchor differs from the one deleted"
        assert up.fetch_missing(store) == 0, "fetched what was not missing"
        print(f"fetch_missing: {name[:16]}... back byte for byte ({len(original)} bytes); "
              "then nothing to fetch")

        rel = f"objects/{name}"
        for what, wrong in (("other bytes", bytes(b ^ 1 for b in original[:64]) + original[64:]),
                            ("more bytes", original + b"x")):
            upload_id = up.begin(rel)  # the bucket's copy replaced
            up.finish(rel, upload_id, [up.put(rel, upload_id, 1, wrong)])
            os.remove(path) if os.path.exists(path) else None
            try:
                up.fetch_missing(store)
                raise AssertionError(f"a bucket object of {what} was fetched")
            except pulse.Error as e:
                assert e.status == "PULSE_ERR_CORRUPT", str(e)
                print(f"fetch_missing, bucket object of {what}: pulse.Error {str(e)[:120]}")
            assert not os.path.exists(path), f"a refused object ({what}) is in the store"
            left = [n for n in os.listdir(objects) if n.startswith(".")]
            assert not left, f"temporaries left behind: {left}"
        with open(path, "wb") as f:  # the store as it was
            f.write(original)


def main():
    with tempfile.TemporaryDirectory(prefix="pulse-upload-") as work:
        proc, port = start_s3rver(work)
        try:
            endpoint = f"http://127.0.0.1:{port}"
            os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="S3RVER",
                              AWS_SECRET_ACCESS_KEY="S3RVER", AWS_REGION="us-east-1")
            store = os.path.join(work, "store")
            bucket = f"{endpoint}/bkt/runs/py"
            config = llama.Config()
            trainer = llama.Llama(config)
            worker = {n: torch.zeros(t.shape, dtype=torch.bfloat16) for n, t in trainer.state_dict().items()}
            with pulse.Publisher(store, upload="s3://bkt/runs/py") as pub, \
                    pulse.Subscriber(bucket, key=pub.public_key) as sub:
                steps = [pub.publish(trainer.state_dict())]
                # The first upload lists stale multipart uploads: s3rver
                # answers 501 (not implemented), which is not retried.
                assert pub.last_upload["retries"] == 0, pub.last_upload
                steps += [pub.publish(trainer.state_dict()) for _ in llama.train_steps(trainer, 2)]
                assert pub.last_upload["head_step"] == steps[-1], pub.last_upload
                head = get(f"{bucket}/head.json")
                with open(os.path.join(store, "head.json"), "rb") as f:
                    assert head == f.read(), "the bucket's head is not the store's"
                for path in set(re.findall(rb'"path":"(objects/[0-9a-f]+\.[a-z]+)"', head)):
                    with open(os.path.join(store, path.decode()), "rb") as f:
                        assert get(f"{bucket}/{path.decode()}") == f.read(), f"{path} differs in the bucket"
                print(f"bucket after {len(steps)} steps: head and objects as in the store")
                assert sub.pull(worker, timeout=60) == steps[-1]
                for name, t in trainer.state_dict().items():
                    assert torch.equal(worker[name].view(torch.int16),
                                       t.to(torch.bfloat16).view(torch.int16)), f"'{name}' differs"
                print(f"pulled step {steps[-1]} from the bucket: the trainer's BF16 weights")

            os.environ["AWS_ACCESS_KEY_ID"] = "UNKNOWN"
            trainer2 = llama.Llama(config)
            try:
                with pulse.Publisher(os.path.join(work, "store2"), upload="s3://bkt/runs/b") as pub:
                    pub.publish(trainer2.state_dict())
                raise AssertionError("an unknown access key was accepted")
            except pulse.Error as e:
                assert e.status == "PULSE_ERR_IO", str(e)
                print(f"unknown access key: pulse.Error {str(e)[:120]}")
            os.environ["AWS_ACCESS_KEY_ID"] = "S3RVER"
            check_parts(work, endpoint)
        finally:
            proc.kill()
            proc.wait()
    print("ok")


if __name__ == "__main__":
    main()
