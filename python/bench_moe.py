"""Bench of mixture-of-experts refits (python/bench.py --moe): one rank of
a TP x EP engine keeps each layer's experts stacked as vLLM's FusedMoE does
(experts.w13_weight [E/ep, 2*I/tp, H], experts.w2_weight [E/ep, H, I/tp])
and follows a publisher of the per-expert checkpoint tensors
(model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight) through
pulse.Mapping(experts=...).

  pulse   Subscriber.pull wall time per step (a ~density patch: fetch from
          a local pulse.Server, verify, decode, apply into the stacks), and
          the C library's split of it.
  reload  the same run's dense refit of the same stacks from the trainer's
          BF16 tensors in memory: for each of the rank's experts, narrow and
          copy_ gate, up and down (the least a reload costs); and the same
          through vLLM's load_weights loop (every checkpoint tensor matched
          against the expert params mapping, then FusedMoE.weight_loader's
          narrow and copy_).
  bytes   what the rank downloaded per step (the patch's signed section
          index, its header and table, and the sections of the rank's own
          experts, each verified: issue 34) against the whole patch and
          against those sections alone (pulse-inspect gives their sizes).

Both refits are checked equal, bit for bit, every step. Medians over the
steps.

    PYTHONPATH=python python3 python/bench.py --moe [--layers 2]
        [--experts 64] [--hidden 1024] [--inter 512] [--tp 2] [--ep 2]
        [--steps 5] [--density 0.01]
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time

import torch

import pulse

PROJ = ("gate_proj", "up_proj", "down_proj")


def expert_mapping(num_experts):
    """vLLM's FusedMoE.make_expert_params_mapping("gate_proj", "down_proj",
    "up_proj", num_experts)."""
    return [("experts.w13_" if w in ("gate_proj", "up_proj") else "experts.w2_",
             f"experts.{e}.{w}.", e, s)
            for e in range(num_experts)
            for s, w in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj"))]


def checkpoint(layers, experts, hidden, inter, seed):
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for layer in range(layers):
        for e in range(experts):
            for p in PROJ:
                shape = (hidden, inter) if p == "down_proj" else (inter, hidden)
                sd[f"model.layers.{layer}.mlp.experts.{e}.{p}.weight"] = \
                    (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
    return sd


def perturb(sd, density, g):
    """Moves `density` of the elements (drawn with repeats) by one BF16 ulp."""
    for t in sd.values():
        bits = t.view(torch.int16).view(-1)
        idx = torch.randint(0, bits.numel(), (max(1, int(bits.numel() * density)),), generator=g)
        bits[idx] += 1


def reload(sd, stacks, layers, first, local, tp_rank, tp_size):
    """The engine's dense refit: per expert, narrow the checkpoint tensor
    to the rank's share and copy_ it into the stack (vLLM's _load_w13 and
    _load_w2)."""
    for layer in range(layers):
        w13 = stacks[f"model.layers.{layer}.mlp.experts.w13_weight"]
        w2 = stacks[f"model.layers.{layer}.mlp.experts.w2_weight"]
        share = w2.shape[2]
        for i in range(local):
            name = f"model.layers.{layer}.mlp.experts.{first + i}."
            gate, up, down = (sd[name + p + ".weight"] for p in PROJ)
            w13[i].narrow(0, 0, share).copy_(gate.narrow(0, tp_rank * share, share))
            w13[i].narrow(0, share, share).copy_(up.narrow(0, tp_rank * share, share))
            w2[i].copy_(down.narrow(1, tp_rank * share, share))


def reload_vllm(sd, stacks, mapping_list, first, local, tp_rank):
    """The same refit the way vLLM's load_weights loop does it (Qwen2-MoE):
    every checkpoint tensor is offered to the rank, its expert found by a
    scan of the expert params mapping (`weight_name in name`), renamed to
    the stack, its global expert id mapped to the rank's (others skipped),
    then narrowed and copied (FusedMoE.weight_loader)."""
    for name, loaded in sd.items():
        for param_name, weight_name, expert_id, shard_id in mapping_list:
            if weight_name not in name:
                continue
            param = stacks[name.replace(weight_name, param_name)]
            local_id = expert_id - first
            if not 0 <= local_id < local:
                break  # another rank's expert
            expert = param[local_id]
            if shard_id == "w2":
                share = expert.shape[1]
                expert.copy_(loaded.narrow(1, share * tp_rank, share))
            else:
                share = expert.shape[0] // 2
                dst = expert.narrow(0, 0 if shard_id == "w1" else share, share)
                dst.copy_(loaded.narrow(0, share * tp_rank, share))
            break


def inspect_tool():
    """pulse-inspect: $PULSE_INSPECT, beside the library's build, or on PATH."""
    candidates = [os.environ.get("PULSE_INSPECT")]
    lib = os.environ.get("PULSE_LIBRARY")
    if lib:
        candidates.append(os.path.join(os.path.dirname(os.path.abspath(lib)), "tools", "pulse-inspect"))
    candidates.append(shutil.which("pulse-inspect"))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def section_bytes(tool, store, patch_bytes):
    """{tensor: coded bytes} of the newest patch of `store` (the .pulse
    object of `patch_bytes` bytes), from pulse-inspect's table."""
    objects = os.path.join(store, "objects")
    paths = [os.path.join(objects, f) for f in os.listdir(objects) if f.endswith(".pulse")]
    path = max((p for p in paths if os.path.getsize(p) == patch_bytes), key=os.path.getmtime)
    out = subprocess.run([tool, path], capture_output=True, text=True, check=True).stdout
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"^\s+(\S+) \[[0-9, ]*\] changed .* in ([0-9]+) bytes$", out, re.M)}


def main(argv):
    ap = argparse.ArgumentParser(prog="bench.py --moe")
    ap.add_argument("--moe", action="store_true")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--inter", type=int, default=512)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--ep", type=int, default=2)
    ap.add_argument("--tp-rank", type=int, default=0)
    ap.add_argument("--ep-rank", type=int, default=0)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--plain", action="store_true", help="the publisher writes plain positions")
    args = ap.parse_args(argv)
    local = args.experts // args.ep
    first = args.ep_rank * local
    share = args.inter // args.tp
    sd = checkpoint(args.layers, args.experts, args.hidden, args.inter, 0)
    params = sum(t.numel() for t in sd.values())
    experts = expert_mapping(args.experts)
    mapping = pulse.Mapping(tp_rank=args.tp_rank, tp_size=args.tp, experts=experts,
                            ep_rank=args.ep_rank, ep_size=args.ep)
    stacks, dense, loader = {}, {}, {}
    for layer in range(args.layers):
        for name, shape in ((f"model.layers.{layer}.mlp.experts.w13_weight", (local, 2 * share, args.hidden)),
                            (f"model.layers.{layer}.mlp.experts.w2_weight", (local, args.hidden, share))):
            stacks[name] = torch.zeros(shape, dtype=torch.bfloat16)
            dense[name] = torch.zeros(shape, dtype=torch.bfloat16)
            loader[name] = torch.zeros(shape, dtype=torch.bfloat16)
    tool = inspect_tool()
    g = torch.Generator().manual_seed(1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pulse-bench-moe-") as work:
        store = os.path.join(work, "store")
        with pulse.Publisher(store, anchor_every=1000, plain=args.plain) as pub, pulse.Server(store) as server, \
                pulse.Subscriber(server.url, key=pub.public_key) as sub:
            pub.publish(sd)
            t0 = time.perf_counter()
            sub.pull(stacks, mapping=mapping)  # attach, then the anchor
            first_pull = time.perf_counter() - t0
            for _ in range(args.steps):
                perturb(sd, args.density, g)
                pub.publish(sd)
                fig = pub.last_figures
                t0 = time.perf_counter()
                sub.pull(stacks, mapping=mapping)
                wall = time.perf_counter() - t0
                sf = sub.figures()
                t0 = time.perf_counter()
                reload(sd, dense, args.layers, first, local, args.tp_rank, args.tp)
                dense_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                reload_vllm(sd, loader, experts, first, local, args.tp_rank)
                loader_s = time.perf_counter() - t0
                for name, t in stacks.items():
                    for other, what in ((dense, "dense refit"), (loader, "vLLM-style loader")):
                        if not torch.equal(t.view(torch.int16), other[name].view(torch.int16)):
                            raise SystemExit(f"bench_moe: '{name}' differs from the {what}")
                mine = coded = None
                if tool is not None:
                    sections = section_bytes(tool, store, fig["patch_bytes"])
                    coded = sum(sections.values())
                    mine = sum(b for n, b in sections.items()
                               if first <= int(n.split(".experts.")[1].split(".")[0]) < first + local)
                rows.append({"pulse": wall, "decode": sf["last_decode_s"], "apply": sf["last_apply_s"],
                             "verify": sf["last_verify_s"], "transfer": sf["last_transfer_s"],
                             "c": sf["last_total_s"], "reload": dense_s, "loader": loader_s, "changed": fig["changed"],
                             "patch": fig["patch_bytes"], "fetched": sf["last_bytes"], "mine": mine,
                             "coded": coded})
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    rank_bytes = sum(t.numel() * 2 for t in stacks.values())
    print(f"model: {args.layers} MoE layers x {args.experts} experts (H {args.hidden}, I {args.inter}), "
          f"{params / 1e6:.1f} M expert parameters ({params * 2 / 2**20:.0f} MiB BF16), "
          f"{args.steps} steps at ~{args.density:.1%} density (median {med('changed') / params:.2%} changed)")
    print(f"rank tp {args.tp_rank}/{args.tp} ep {args.ep_rank}/{args.ep}: experts "
          f"[{first}, {first + local}), stacks {rank_bytes / 2**20:.0f} MiB in {2 * args.layers} tensors, "
          f"{3 * local * args.layers} regions; first pull (attach + anchor) {first_pull:.2f} s")
    print(f"pulse pull    median {med('pulse') * 1e3:8.1f} ms  (C: transfer {med('transfer') * 1e3:.1f}, "
          f"verify {med('verify') * 1e3:.1f}, decode {med('decode') * 1e3:.1f}, apply "
          f"{med('apply') * 1e3:.1f}, sync {med('c') * 1e3:.1f} ms)")
    print(f"dense reload  median {med('reload') * 1e3:8.1f} ms  (narrow + copy_ per expert from the "
          f"BF16 checkpoint in memory)")
    print(f"vLLM loader   median {med('loader') * 1e3:8.1f} ms  (every checkpoint tensor through the "
          f"expert params mapping scan, then narrow + copy_)")
    print(f"speedup       median {statistics.median(r['reload'] / r['pulse'] for r in rows):8.2f}x "
          f"against the dense refit, {statistics.median(r['loader'] / r['pulse'] for r in rows):.2f}x "
          f"against the vLLM-style loader (every step: the three equal bit for bit)")
    line = (f"bytes/step    fetched {med('fetched') / 2**20:.2f} MiB, the whole patch "
            f"{med('patch') / 2**20:.2f} MiB")
    if tool is not None:
        line += (f"; its sections {med('coded') / 2**20:.2f} MiB (the rest: header and table), "
                 f"those of the rank's experts {med('mine') / 2**20:.2f} MiB "
                 f"({med('mine') / med('patch'):.0%} of the patch); fetched "
                 f"{med('fetched') / med('patch'):.0%} of the patch: the rank's sections, "
                 f"each verified against the patch's signed section index")
    else:
        line += " (pulse-inspect not found: no per-section figure)"
    print(line)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
