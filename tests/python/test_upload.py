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
    log = open(os.path.join(work, "s3.log"), "w+")
    proc = subprocess.Popen(["s3rver", "-d", os.path.join(work, "s3"), "-a", "127.0.0.1", "-p", "0",
                             "--configure-bucket", "bkt"], stdout=log, stderr=subprocess.STDOUT)
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
        finally:
            proc.kill()
            proc.wait()
    print("ok")


if __name__ == "__main__":
    main()
