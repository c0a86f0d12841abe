"""The trainer of the example (docs/guides/trainer.md): a small Llama-shaped
model learns a text with AdamW and publishes its FP32 weights after every
optimizer step; a pulse server in this process serves the store.

    PYTHONPATH=python python3 python/examples/train.py \
        --store /tmp/pulse-store --listen 127.0.0.1:8080 --steps 300

Prints the URL and the public key a worker needs (worker.py).
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama  # noqa: E402
import pulse  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True)
    ap.add_argument("--listen", default="127.0.0.1:0")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--info", help="write {url, key} as JSON to this file once serving")
    ap.add_argument("--hold", type=float, default=0, help="keep serving this many seconds at the end")
    args = ap.parse_args()

    torch.manual_seed(0)
    model = llama.Llama(llama.text_config())
    pub = pulse.Publisher(args.store)
    with pulse.Server(args.store, listen=args.listen) as server:
        step = pub.publish(model.state_dict())  # the initial weights: an anchor
        print(f"serving {server.url} key {pub.public_key}", flush=True)
        if args.info:
            tmp = args.info + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"url": server.url, "key": pub.public_key}, f)
            os.replace(tmp, args.info)
        for _, loss in llama.train_text_steps(model, args.steps):
            step = pub.publish(model.state_dict())  # only BF16-visible changes are sent
            if step % 25 == 0 or step <= 3:
                print(f"step {step}: loss {loss:.3f}", flush=True)
        print(f"published step {step}", flush=True)
        time.sleep(args.hold)
    pub.close()


if __name__ == "__main__":
    main()
