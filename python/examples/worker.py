"""The inference worker of the example (docs/guides/inference-worker.md): a BF16
model in an inference engine's layout (q, k and v fused into qkv_proj, gate
and up into gate_up_proj) whose weights pulse keeps equal to the trainer's
newest step, in place; after each step it generates a line of text.

    PYTHONPATH=python python3 python/examples/worker.py \
        --url http://127.0.0.1:8080 --key HEX
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama  # noqa: E402
import pulse  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--key", required=True, help="the trainer's public key (hex)")
    ap.add_argument("--until", type=int, default=None, help="stop once this step is held")
    ap.add_argument("--prompt", default="pulse ")
    args = ap.parse_args()

    config = llama.text_config()
    model = llama.Llama(config, fused=True).to(torch.bfloat16).eval()
    targets = model.state_dict()  # the model's own BF16 tensors, written in place
    # The trainer publishes q_proj, k_proj, ...: the mapping puts each into
    # its rows of the fused weight (tp_size > 1: this rank's shard).
    mapping = pulse.Mapping(stacked=llama.STACKED, tp_rank=0, tp_size=1, head_dim=config.head_dim)
    with pulse.Subscriber(args.url, key=args.key) as sub:
        for step in sub.follow(targets, mapping=mapping):
            # Between two steps the weights hold still: generate with them.
            print(f"step {step}: {llama.generate(model, args.prompt)!r}", flush=True)
            if args.until is not None and step >= args.until:
                break


if __name__ == "__main__":
    main()
