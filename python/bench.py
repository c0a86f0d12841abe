"""Bench of the Python package against the C library under it (the
targets in docs/benchmarks/python.md):

  publish  Publisher.publish(state_dict) wall time per step, against the
           C publisher's own time for the same commit of the same tensors
           (pulse_pub_figures.total_seconds, measured inside
           pulse_pub_commit): the ratio is what the binding adds.
  pull     Subscriber.pull(targets) wall time per step into BF16 torch
           tensors, against the C subscriber's own time for the same sync
           (pulse_sub_figures.last_total_s), and the worker process's CPU
           time during the pull (every thread's: on a loaded machine it
           moves less than the wall time; a class index built in the
           background between pulls is not in it).
  memory   a worker process's peak resident memory (VmHWM, reset before the
           measured pulls) above its resident memory before them (its
           targets, filled by the anchor), during patch pulls, plus the
           class index it held before them: for the default (class_index
           "auto", --memory-budget), with the class index (True) and
           without (False); against the model's BF16 bytes and the patch
           bytes, and the bound of the default (model's bytes x 1.1 + the
           patch). Each worker says what its rule chose and why.
  --tp N   instead: the patches pulled by rank 0 of N through pulse.Mapping
           (--split cols: each tensor split on its columns, as row-parallel
           weights are; --split rows: on its rows, as column-parallel ones;
           blocks applied in C, pulse_region.h), its memory against its
           shard's bytes, the halo it keeps (the tensor's bits around its
           blocks that class-model patches need) and the patch bytes.
           --plain: the publisher writes plain positions.
  --moe    instead: one TP x EP rank's fused expert stacks
           (python/bench_moe.py: pull of a ~1% patch against a dense refit
           of the same stacks from the BF16 checkpoint in memory, and the
           bytes the rank fetches; its own options: --help).
  --ranks N  instead: the sharded publish (python/bench_shard.py: N gloo
           processes publish their shards with pulse.Block, against the
           same steps gathered onto rank 0 and published there; per rank
           time per step and peak extra memory against its shard's BF16
           bytes; its own options: python3 python/bench_shard.py --help).

    PYTHONPATH=python python3 python/bench.py [--params 16e6]
        [--tensors 16] [--steps 8] [--density 0.01] [--tp 2 [--split rows]
        [--plain]]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import pulse


def state(params, tensors, seed):
    g = torch.Generator().manual_seed(seed)
    rows = max(1, params // tensors // 1024)
    return {f"layers.{i}.weight": torch.randn(rows, 1024, generator=g) * 0.02
            for i in range(tensors)}


def perturb(sd, density, g):
    """Moves about `density` of the elements by a few BF16 ulps, in place."""
    for t in sd.values():
        flat = t.view(-1)
        idx = torch.randint(0, flat.numel(), (int(flat.numel() * density),), generator=g)
        flat[idx] *= 1.0 + 2.0 ** -6


def rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def halo_elems(rows, cols, r0, nr, c0, nc, log2=20):
    """Elements of the halo the subscriber keeps around a block
    (pulse_region_span at 2^PULSE_CHUNK_LOG2_DEFAULT)."""
    numel, m = rows * cols, (1 << log2) - 1
    lo = (r0 * cols + c0) & ~m
    hi = min(numel, ((r0 + nr - 1) * cols + c0 + nc + m) & ~m)
    return hi - lo - nr * nc


def worker(args):
    """Pulls every step into BF16 tensors; reports memory and times (JSON)."""
    shapes = json.loads(args.shapes)
    mapping = None
    halo = 0
    if args.tp > 1 and args.split == "cols":  # rank 0's columns of every tensor
        mapping = pulse.Mapping(tp_rank=0, tp_size=args.tp, row_parallel=("layers",))
        halo = sum(halo_elems(s[0], s[1], 0, s[0], 0, s[1] // args.tp) for s in shapes.values())
        shapes = {n: [s[0], s[1] // args.tp] for n, s in shapes.items()}
    elif args.tp > 1:  # rank 0's rows (a fused tensor of one part)
        mapping = pulse.Mapping(stacked=[("rows", "layers", 0)], tp_rank=0, tp_size=args.tp)
        halo = sum(halo_elems(s[0], s[1], 0, s[0] // args.tp, 0, s[1]) for s in shapes.values())
        shapes = {n.replace("layers", "rows"): [s[0] // args.tp, s[1]] for n, s in shapes.items()}
    targets = {n: torch.zeros(s, dtype=torch.bfloat16) for n, s in shapes.items()}
    index = {"auto": "auto", "on": True, "off": False}[args.class_index]
    sub = pulse.Subscriber(args.url, key=args.key, class_index=index,
                           memory_budget=int(args.memory_budget) if args.memory_budget else None)
    sub.pull(targets, mapping=mapping)  # the anchor
    out = {"model_bytes": sum(t.numel() * 2 for t in targets.values()), "steps": [],
           "halo_bytes": 2 * halo}
    print("ready", flush=True)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    base = rss_kib("VmRSS")
    held = sub.figures()["class_index_bytes"]  # resident already (built after the anchor)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        t0, c0 = time.perf_counter(), time.process_time()
        step = sub.pull(targets, mapping=mapping)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        fig = sub.figures()
        out["steps"].append({"step": step, "wall": wall, "cpu": cpu, "c": fig["last_total_s"],
                             "bytes": fig["last_bytes"]})
        print("pulled", step, flush=True)
    out["peak_extra_bytes"] = (rss_kib("VmHWM") - base) * 1024 + held
    fig = sub.figures()
    out["class_index_bytes"] = fig["class_index_bytes"]
    out["class_index_why"] = fig["class_index_why"]
    print("result " + json.dumps(out), flush=True)


def main():
    if any(a == "--ranks" or a.startswith("--ranks=") for a in sys.argv[1:]):
        import bench_shard  # the sharded publish's bench (python/bench_shard.py)

        return bench_shard.main(sys.argv[1:])
    if "--moe" in sys.argv[1:]:
        import bench_moe  # mixture-of-experts stacks (python/bench_moe.py)

        return bench_moe.main(sys.argv[1:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=float, default=16e6)
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url")
    ap.add_argument("--key")
    ap.add_argument("--shapes")
    ap.add_argument("--class-index", choices=("auto", "on", "off"), default="auto",
                    help=argparse.SUPPRESS)  # the worker's
    ap.add_argument("--memory-budget", type=float, default=0,
                    help="the default worker's memory_budget in bytes (default: the library's, "
                         "a tenth of the targets' bytes)")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--split", choices=("cols", "rows"), default="cols")
    ap.add_argument("--plain", action="store_true")
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    sd = state(int(args.params), args.tensors, 0)
    params = sum(t.numel() for t in sd.values())
    g = torch.Generator().manual_seed(1)
    with tempfile.TemporaryDirectory(prefix="pulse-bench-") as work:
        store = os.path.join(work, "store")
        pub = pulse.Publisher(store, anchor_every=1000, plain=args.plain)
        server = pulse.Server(store)
        pub.publish(sd)
        shapes = json.dumps({n: list(t.shape) for n, t in sd.items()})
        workers = []
        kinds = (("auto", "on", "off") if args.tp == 1 else ("off",))
        labels = (("default", "class index", "no class index") if args.tp == 1
                  else (f"rank 0 of {args.tp} {args.split}",))
        for mode in kinds:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--url", server.url,
                   "--key", pub.public_key, "--shapes", shapes, "--tp", str(args.tp),
                   "--split", args.split, "--class-index", mode]
            if args.memory_budget and mode == "auto":
                cmd += ["--memory-budget", str(int(args.memory_budget))]
            p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert p.stdout.readline().strip() == "ready"
            workers.append(p)
        pub_ratio, pub_wall, pub_c, patch, changed = [], [], [], [], []
        for step in range(args.steps):
            perturb(sd, args.density, g)
            t0 = time.perf_counter()
            pub.publish(sd)
            wall = time.perf_counter() - t0
            fig = pub.last_figures
            pub_wall.append(wall)
            pub_c.append(fig["total_seconds"])
            pub_ratio.append(wall / fig["total_seconds"])
            patch.append(fig["patch_bytes"])
            changed.append(fig["changed"])
            # Each step in another order: the first to pull after a publish
            # finds the machine busiest (the store's writes), so no worker
            # is always first.
            for p in workers[step % len(workers):] + workers[:step % len(workers)]:
                p.stdin.write("pull\n")
                p.stdin.flush()
                assert p.stdout.readline().startswith("pulled")
        results = []
        for p in workers:
            p.stdin.write("quit\n")
            p.stdin.flush()
            line = p.stdout.readline()
            p.wait()
            results.append(json.loads(line[len("result "):]))
        server.close()
        pub.close()

    med = statistics.median
    print(f"model: {params / 1e6:.1f} M parameters in {args.tensors} tensors "
          f"({params * 2 / 2**20:.0f} MiB BF16), {args.steps} steps at ~{args.density:.1%} density, "
          f"median patch {med(patch) / 2**20:.2f} MiB")
    print(f"publish(state_dict)  median {med(pub_wall) * 1e3:8.1f} ms   C commit "
          f"{med(pub_c) * 1e3:8.1f} ms   ratio median {med(pub_ratio):.3f} max {max(pub_ratio):.3f}")
    for res, label in zip(results, labels):
        steps = res["steps"]
        ratio = [s["wall"] / s["c"] for s in steps if s["c"] > 0]
        print(f"pull(targets) [{label:14s}] median {med(s['wall'] for s in steps) * 1e3:6.1f} ms   "
              f"CPU {med(s['cpu'] for s in steps) * 1e3:6.1f} ms   "
              f"C sync {med(s['c'] for s in steps) * 1e3:6.1f} ms   ratio median {med(ratio):.3f} "
              f"max {max(ratio):.3f}   peak extra memory {res['peak_extra_bytes'] / 2**20:.1f} MiB "
              f"(targets {res['model_bytes'] / 2**20:.0f} MiB, class index "
              f"{res['class_index_bytes'] / 2**20:.1f} MiB, halo {res['halo_bytes'] / 2**20:.1f} MiB)")
        if res.get("class_index_why"):
            print(f"    {label}: {res['class_index_why']}")
    if args.tp == 1:
        default, on, off = (med(s["wall"] for s in res["steps"]) for res in results)
        cpu_default, cpu_on, cpu_off = (med(s["cpu"] for s in res["steps"]) for res in results)
        extra = results[0]["peak_extra_bytes"]
        tenth = results[0]["model_bytes"] * 0.1 + med(patch)
        # The bound stated for the default (no class index): the staged
        # changes and the patch (measured 18-20 B a change), and a fixed
        # part (threads, buffers).
        bound = 32 * max(changed) + 64 * 2**20
        print(f"default pull / the better of index and no index: {default / min(on, off):.3f} "
              f"(within 5%: {'yes' if default <= 1.05 * min(on, off) else 'NO'}); in CPU time "
              f"{cpu_default / min(cpu_on, cpu_off):.3f} "
              f"(within 5%: {'yes' if cpu_default <= 1.05 * min(cpu_on, cpu_off) else 'NO'})")
        print(f"default peak extra memory {extra / 2**20:.1f} MiB: "
              f"{'within' if extra <= bound else 'ABOVE'} its bound 32 B x {max(changed):,} changed "
              f"+ 64 MiB = {bound / 2**20:.1f} MiB; "
              f"{'within' if extra <= tenth else 'above'} 10% of the model + the patch = "
              f"{tenth / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
