#!/usr/bin/env python3
"""Record a real optimizer trajectory as safetensors checkpoints.

Fine-tunes a small byte-level GPT with AdamW at an RL-like learning rate,
starting from a briefly pretrained state with a fresh optimizer (as RL
post-training does), and writes one checkpoint per optimizer step:

    OUT/step0000.safetensors   the starting state
    OUT/stepNNNN.safetensors   after step N

Each file holds the BF16 weights (what inference workers run; the cast is
PyTorch's own `tensor.to(torch.bfloat16)`), or the FP32 master weights with
--f32, with `__metadata__.step`. Feed them to `pulse-bench codec --snapshots`
or `pulse-diff`/`pulse-publish`.

usage: make_trajectory.py OUT [--steps 12] [--lr 2e-6] [--width 128]
                              [--layers 4] [--pretrain 150] [--seed 0] [--f32]
Needs Debian's python3-torch (CPU: about two minutes at the defaults on two
cores; the cost grows with width^2 * layers * batch * context).
"""
import argparse
import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.att = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.att(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class ByteGPT(nn.Module):
    def __init__(self, width, layers, context):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(context, width) * 0.02)
        self.emb = nn.Embedding(256, width)
        self.blocks = nn.ModuleList(Block(width, max(1, width // 64)) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        x = self.emb(idx) + self.pos[:t]
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


def corpus(seed, size=1 << 18):
    """Deterministic text with structure worth learning: arithmetic facts,
    sorted word lists and a few repeated phrases."""
    g = torch.Generator().manual_seed(seed)
    words = ["weight", "patch", "sparse", "trainer", "worker", "gradient", "adam", "step",
             "policy", "reward", "token", "bfloat", "delta", "anchor", "digest", "stream"]
    out, length = [], 0
    while length < size:
        kind = int(torch.randint(0, 3, (1,), generator=g))
        if kind == 0:
            a, b = (int(v) for v in torch.randint(0, 1000, (2,), generator=g))
            out.append(f"{a} + {b} = {a + b}\n")
        elif kind == 1:
            pick = sorted(words[int(i)] for i in torch.randint(0, len(words), (6,), generator=g))
            out.append(" ".join(pick) + "\n")
        else:
            out.append("the policy moves a little every step; most weights stay put.\n")
        length += len(out[-1])
    return torch.tensor(list("".join(out).encode()[:size]), dtype=torch.long)


def batches(data, context, batch, g):
    while True:
        i = torch.randint(0, len(data) - context - 1, (batch,), generator=g)
        x = torch.stack([data[j:j + context] for j in i])
        y = torch.stack([data[j + 1:j + context + 1] for j in i])
        yield x, y


def write_safetensors(path, model, step, f32):
    """The safetensors layout by hand (8-byte header length, JSON header
    padded to 8 bytes, contiguous little-endian data), atomically."""
    header, blobs, off = {"__metadata__": {"step": str(step)}}, [], 0
    for name, p in model.state_dict().items():
        t = p.detach().float() if f32 else p.detach().to(torch.bfloat16)
        raw = t.contiguous().view(torch.int32 if f32 else torch.int16).numpy().tobytes()
        header[name] = {"dtype": "F32" if f32 else "BF16", "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--lr", type=float, default=2e-6)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--pretrain", type=int, default=150, help="pretraining steps at lr 1e-3")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--f32", action="store_true", help="write FP32 master weights")
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(a.seed)
    os.makedirs(a.out, exist_ok=True)
    data = corpus(a.seed)
    g = torch.Generator().manual_seed(a.seed + 1)
    it = batches(data, a.context, a.batch, g)
    model = ByteGPT(a.width, a.layers, a.context)

    def loss_of(x, y):
        return F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))

    pre = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    for i in range(a.pretrain):
        x, y = next(it)
        loss = loss_of(x, y)
        pre.zero_grad()
        loss.backward()
        pre.step()
    print(f"pretrained {a.pretrain} steps, loss {loss.item():.3f}, "
          f"{sum(p.numel() for p in model.parameters())} parameters")

    # RL-like fine-tuning: a fresh optimizer at a small learning rate.
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    write_safetensors(os.path.join(a.out, "step0000.safetensors"), model, 0, a.f32)
    prev = {k: v.detach().to(torch.bfloat16).clone() for k, v in model.state_dict().items()}
    for step in range(1, a.steps + 1):
        x, y = next(it)
        loss = loss_of(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        write_safetensors(os.path.join(a.out, f"step{step:04d}.safetensors"), model, step, a.f32)
        cur = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
        changed = sum(int((cur[k].view(torch.int16) != prev[k].view(torch.int16)).sum()) for k in cur)
        total = sum(v.numel() for v in cur.values())
        print(f"step {step}: loss {loss.item():.4f}, BF16 changed {changed} of {total} "
              f"({100.0 * changed / total:.2f}%)")
        prev = {k: v.clone() for k, v in cur.items()}


if __name__ == "__main__":
    main()
