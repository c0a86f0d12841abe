"""The README's example runs as written: python/examples/train.py
publishes a few steps while worker.py, another process, follows them and
generates text at each; the worker reaches the last step. Exit 77: no
torch."""

import json
import os
import subprocess
import sys
import tempfile
import time

try:
    import torch  # noqa: F401
except ImportError:
    print("skipped: python3-torch is not installed")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "python", "examples")
STEPS = 6


def main():
    with tempfile.TemporaryDirectory(prefix="pulse-example-") as work:
        info = os.path.join(work, "info.json")
        trainer = subprocess.Popen(
            [sys.executable, os.path.join(EXAMPLES, "train.py"), "--store", os.path.join(work, "store"),
             "--steps", str(STEPS), "--info", info, "--hold", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.time() + 60
            while not os.path.exists(info):
                assert trainer.poll() is None, trainer.stdout.read()
                assert time.time() < deadline, "the trainer did not start serving"
                time.sleep(0.05)
            with open(info) as f:
                served = json.load(f)
            last = STEPS + 1  # the initial weights are step 1
            worker = subprocess.run(
                [sys.executable, os.path.join(EXAMPLES, "worker.py"), "--url", served["url"],
                 "--key", served["key"], "--until", str(last)],
                capture_output=True, text=True, timeout=120)
            print(worker.stdout, worker.stderr)
            assert worker.returncode == 0, f"worker exited {worker.returncode}"
            lines = [l for l in worker.stdout.splitlines() if l.startswith("step ")]
            assert lines and lines[-1].startswith(f"step {last}: 'pulse "), lines
        finally:
            trainer.kill()
            trainer.wait()
    print("ok")


if __name__ == "__main__":
    main()
