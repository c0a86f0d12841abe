"""The sharded publish's bench (python/bench.py --ranks N, or this file):
N processes over torch.distributed (gloo), each holding only its shard of
the FP32 master weights, publish S steps with pulse.Publisher(group=...)
(pulse.Block), against the same steps gathered onto rank 0 (dist.gather)
and published there by one pulse.Publisher, in the same run (two launches
of N processes, one per mode, on the same weights). The weights are a
function of each element's position and the step, so a rank makes its
shard without ever holding the model.

Per rank and mode: the publish time per step (barrier, then the call; the
gather mode's is the gather plus rank 0's publish), and the peak extra
memory: the process's peak RSS during the publish calls (VmHWM, reset
before each call through /proc/self/clear_refs) above its RSS before the
first publish (once the library, the modules, the code of the
torch.distributed calls the publishes make and that of the bench's own
weight arithmetic are loaded: warm_collectives, warm_weights);
for the sharded mode against the rank's shard's BF16 bytes.
The peak is split into what the rank holds between steps (its snapshot,
the publisher's state; RSS before the last publish above the baseline) and
the most a step adds on top. Bytes: each step's patch bytes of both modes,
and whether both stores end with the same objects (SHA-256 names: the same
bytes).

With --s3 (s3rver on PATH, started here on 127.0.0.1): every mode uploads
to its own prefix of a local bucket after each step, ranks 1..N-1 keep
folders of their own (as nodes without a shared filesystem), and a third
launch compares the two ways such a job uploads its anchors: "sharded",
every rank passes upload= and puts its own parts of each anchor
(pulse.shard_parts), against "sharded-root", upload= on rank 0 alone,
which receives every rank's blocks and uploads each anchor whole. Per rank
and mode, the anchor steps' time and the bytes the rank put into the
bucket (its parts; rank 0 also the store upload: patches and heads).
s3rver on one machine is no network: the times say what the ranks' work
costs here, the bytes where an anchor's upload goes.

Targets (issue "Sharded trainers publish without a gather", 4 ranks): each
rank's extra memory <= its shard's BF16 bytes + 10% + the patch; no rank's
publish slower than the gather-then-publish step; patch bytes within 1%.
Prints one JSON object (the summary; per-rank figures inside); exit 0 when
the bench ran (the targets' verdicts are fields, not the exit status)."""

import argparse
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4, help="processes (default 4)")
    p.add_argument("--rows", type=int, default=2048, help="rows of each tensor (default 2048)")
    p.add_argument("--cols", type=int, default=4096, help="columns of each tensor (default 4096)")
    p.add_argument("--tensors", type=int, default=2, help="tensors (default 2)")
    p.add_argument("--steps", type=int, default=6, help="steps, the first an anchor (default 6)")
    p.add_argument("--per1024", type=int, default=11,
                   help="elements moved per 1024 per step (default 11: about 1%% BF16 changes)")
    p.add_argument("--mode", choices=("dim0", "flat", "rect"), default="dim0",
                   help="sharding: dim-0 blocks, flat ranges, or a column/row mix")
    p.add_argument("--threads", type=int, default=1, help="publisher threads per rank (default 1)")
    p.add_argument("--work", help="folder for the stores (default: a temporary one, removed)")
    p.add_argument("--anchor-every", type=int, default=16,
                   help="an anchor every N steps (default 16, the publisher's)")
    p.add_argument("--s3", action="store_true",
                   help="upload to a local s3rver; ranks without a shared folder; compare "
                        "parts put by every rank with rank 0's upload (see above)")
    p.add_argument("--part-mb", type=float, default=16.0,
                   help="with --s3: the anchor's parts (default 16 MiB)")
    return p.parse_args(argv)


# ------------------------------------------------------------ the weights
def _hash(torch, pos, salt):
    """A 31-bit hash of int64 positions (multiply-xorshift, wrapping)."""
    h = pos * 2654435761 + salt * 40503
    h = h ^ (h >> 15)
    h = (h * 2246822519) & 0x7FFFFFFF
    return h ^ (h >> 13)


_CHUNK = 1 << 16  # elements per slice of the weights' arithmetic (small temporaries)


def _positions(torch, args, block, a, b):
    """The flat tensor positions of elements a..b of a block (kind, start,
    extent), in the block's row-major order."""
    kind, start, extent = block
    i = torch.arange(a, b, dtype=torch.int64)
    if kind == "flat":
        return i + start[0]
    return (start[0] + i // extent[1]) * args.cols + start[1] + i % extent[1]


def weights_init(torch, args, t, block):
    """The FP32 values of block `block` of tensor t at step 1: a function of
    each element's position (a rank makes its shard alone)."""
    n = _numel(block)
    w = torch.empty(n, dtype=torch.float32)
    for a in range(0, n, _CHUNK):
        b = min(n, a + _CHUNK)
        pos = _positions(torch, args, block, a, b) + t * args.rows * args.cols
        w[a:b] = (_hash(torch, pos, 7).to(torch.float32) / 2 ** 31 - 0.5) * 0.08
    return w


def weights_step(torch, args, t, block, w, step):
    """Moves the block's values to `step` in place: per1024 of every 1024
    elements by up to 1e-3 (an Adam-like step at a high learning rate)."""
    for a in range(0, w.numel(), _CHUNK):
        b = min(w.numel(), a + _CHUNK)
        pos = _positions(torch, args, block, a, b) + t * args.rows * args.cols
        h = _hash(torch, pos, 1000 + step)
        moved = (h & 1023) < args.per1024
        w[a:b] += moved * (((h >> 10) & 1023).to(torch.float32) / 1024 - 0.5) * 2e-3


def blocks_of(args, rank):
    """[(tensor index, (kind, start, extent))] of rank `rank`."""
    out = []
    n = args.ranks
    for t in range(args.tensors):
        mode = args.mode if args.mode != "rect" else ("col" if t % 2 == 0 else "row")
        if mode == "flat":
            total = args.rows * args.cols
            lo, hi = total * rank // n, total * (rank + 1) // n
            out.append((t, ("flat", (lo,), (hi - lo,))))
        elif mode in ("dim0", "col"):
            lo, hi = args.rows * rank // n, args.rows * (rank + 1) // n
            out.append((t, ("rect", (lo, 0), (hi - lo, args.cols))))
        else:  # row-parallel: a block of columns
            lo, hi = args.cols * rank // n, args.cols * (rank + 1) // n
            out.append((t, ("rect", (0, lo), (args.rows, hi - lo))))
    return out


# ---------------------------------------------------------------- memory
def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def hwm_reset():
    """Resets the peak RSS (VmHWM); False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def hwm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


# ----------------------------------------------------------------- ranks
def rank_main(rank, port, args, mode, out_path):
    import datetime

    import torch
    import torch.distributed as dist

    sys.path.insert(0, HERE)
    import pulse

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.ranks, timeout=datetime.timedelta(seconds=600))
    names = [f"layer{t}.w" for t in range(args.tensors)]
    full = (args.rows, args.cols)
    mine = blocks_of(args, rank)
    store = os.path.join(args.work, mode)
    pub = None
    opts = dict(threads=args.threads, anchor_every=args.anchor_every)
    upload = f"s3://bkt/{mode}" if args.s3 else None
    if args.s3 and rank > 0:  # a node of its own: no shared folder
        store = os.path.join(args.work, f"{mode}-rank{rank}")
    if mode in ("sharded", "sharded-root"):
        every = mode == "sharded" or rank == 0
        pub = pulse.Publisher(store, group=dist.group.WORLD, upload=upload if every else None,
                              upload_part_bytes=int(args.part_mb * (1 << 20)), **opts)
    elif rank == 0:
        pub = pulse.Publisher(store, upload=upload, **opts)
    # The library's code and the modules are loaded before the baseline:
    # they are not the publish's memory.
    pulse._lib.lib.pulse_version()
    importlib.import_module("pulse.shard_group")
    warm_collectives(torch, dist, rank, args.ranks)
    warm_weights(torch, args)
    shard_bf16 = 2 * sum(_numel(b) for _, b in mine)
    peaks, times, patch_bytes, changed, before = [], [], [], [], []
    anchor_steps, put_bytes = [], []
    base = None
    can_reset = True
    for step in range(1, args.steps + 1):
        if step == 1:
            local = [(t, b, weights_init(torch, args, t, b)) for t, b in mine]
        else:
            for t, b, w in local:
                weights_step(torch, args, t, b, w, step)
        dist.barrier()
        if base is None:
            base = rss_bytes()
        before.append(rss_bytes() - base)
        can_reset = hwm_reset() and can_reset
        began = time.perf_counter()
        blocks = None
        if mode != "gathered":
            blocks = {}
            for t, (kind, start, extent), w in local:
                if kind == "flat":
                    blocks[names[t]] = pulse.Block(w, full, start[0])
                else:
                    blocks[names[t]] = pulse.Block(w.reshape(extent), full, start)
            pub.publish(blocks)
        else:
            gather_publish(torch, dist, args, rank, pub, names, local)
        times.append(time.perf_counter() - began)
        peaks.append(hwm_bytes() - base)
        if pub is not None:
            patch_bytes.append(pub.last_figures["patch_bytes"])
            changed.append(pub.last_figures["changed"])
            if pub.last_figures["anchor_bytes"]:
                anchor_steps.append(step)
        put = 0
        if pub is not None and pub.last_figures["anchor_bytes"] and pub.last_anchor_parts:
            put += pub.last_anchor_parts["bytes"]
        if rank == 0 and pub is not None and pub.last_upload:  # every rank learns rank 0's
            put += pub.last_upload["bytes_uploaded"]
        put_bytes.append(put)
        del blocks
    if pub is not None:
        pub.close()
    with open(out_path, "w") as f:
        json.dump({"rank": rank, "mode": mode, "times_s": times, "peak_extra_bytes": peaks,
                   "shard_bf16_bytes": shard_bf16, "patch_bytes": patch_bytes,
                   "changed": changed, "rss_before_extra_bytes": before,
                   "anchor_steps": anchor_steps, "put_bytes": put_bytes,
                   "hwm_reset": can_reset}, f)
    dist.barrier()
    dist.destroy_process_group()


def warm_collectives(torch, dist, rank, world):
    """Runs, once, each kind of torch.distributed call the publishes make
    (object all-gather and broadcast, point to point, gather), so that
    their code is paged in before the baseline, as the library's is: on
    gloo the first object collectives page in about 1.8 MiB of torch's and
    gloo's code (file-backed pages, shared by every process), which the
    first publish would otherwise count as its memory."""
    box = [None] * world
    dist.all_gather_object(box, rank)
    dist.broadcast_object_list([rank], 0)
    one, got = torch.ones(1, dtype=torch.int64), torch.empty(1, dtype=torch.int64)
    reqs = [dist.isend(one, (rank + 1) % world), dist.irecv(got, (rank - 1) % world)]
    for req in reqs:
        req.wait()
    dist.gather(one, [torch.empty(1, dtype=torch.int64) for _ in range(world)]
                if rank == 0 else None, dst=0)
    dist.barrier()


def warm_weights(torch, args):
    """Runs the bench's weight arithmetic (weights_init, weights_step) once
    on a few elements of each kind of block before the baseline: the first
    weights_step pages in about 0.3 MiB of torch's code (file-backed pages;
    measured with RssFile), which would otherwise show as memory the
    publisher holds between steps, though the bench's arithmetic made it."""
    for block in (("flat", (0,), (16,)), ("rect", (0, 0), (2, 8))):
        w = weights_init(torch, args, 0, block)
        weights_step(torch, args, 0, block, w, 2)


def _numel(block):
    n = 1
    for e in block[2]:
        n *= e
    return n


def gather_publish(torch, dist, args, rank, pub, names, local):
    """The baseline: every rank's FP32 blocks gathered onto rank 0 (padded
    to one size, as dist.gather needs), the tensors assembled there and
    published whole."""
    n = args.ranks
    per_rank = [blocks_of(args, r) for r in range(n)]
    size = max(sum(_numel(b) for _, b in blocks) for blocks in per_rank)
    flat = torch.zeros(size, dtype=torch.float32)
    at = 0
    for _, b, w in local:
        flat[at:at + w.numel()] = w
        at += w.numel()
    got = [torch.empty(size, dtype=torch.float32) for _ in range(n)] if rank == 0 else None
    dist.gather(flat, got, dst=0)
    if rank != 0:
        return
    model = {name: torch.empty(args.rows, args.cols, dtype=torch.float32) for name in names}
    for r in range(n):
        at = 0
        for t, block in per_rank[r]:
            kind, start, extent = block
            count = _numel(block)
            part = got[r][at:at + count]
            if kind == "flat":
                model[names[t]].view(-1)[start[0]:start[0] + count] = part
            else:
                model[names[t]][start[0]:start[0] + extent[0],
                                start[1]:start[1] + extent[1]] = part.view(extent)
            at += count
    del got
    pub.publish(model)


# ----------------------------------------------------------------- driver
def launch(args, mode, work):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    outs = [os.path.join(work, f"{mode}-{r}.json") for r in range(args.ranks)]
    argv = [f"--{k.replace('_', '-')}={getattr(args, k)}"
            for k in ("ranks", "rows", "cols", "tensors", "steps", "per1024", "mode", "threads",
                      "anchor_every", "part_mb")] + (["--s3"] if args.s3 else [])
    # glibc's dynamic mmap threshold keeps freed large blocks (the weights'
    # temporaries made between publishes) in the heap, where RSS would count
    # them as the publish's: a fixed threshold returns them to the system.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank-of", str(r),
                               str(port), mode, outs[r], "--work", work] + argv, env=env)
             for r in range(args.ranks)]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"bench_shard: a {mode} rank exited {p.returncode}")
    results = []
    for path in outs:
        with open(path) as f:
            results.append(json.load(f))
    return results


def named(store):
    """The objects (SHA-256 names) the store's head names: with --s3, rank
    0's folder of the sharded mode lacks the anchors the ranks put in
    parts, which its head names all the same."""
    with open(os.path.join(store, "head.json")) as f:
        head = json.load(f)
    return sorted(o["path"] for kind in ("anchors", "patches") for o in head.get(kind, []))


def run(args):
    own = args.work is None
    work = args.work = args.work or tempfile.mkdtemp(prefix="pulse-bench-shard-")
    s3 = None
    try:
        for mode in ("sharded", "gathered", "sharded-root"):
            shutil.rmtree(os.path.join(work, mode), ignore_errors=True)
        if args.s3:
            s3 = start_s3rver(work)
        sharded = launch(args, "sharded", work)
        gathered = launch(args, "gathered", work)
        out = summary(args, sharded, gathered, work)
        if args.s3:
            out["s3"] = s3_summary(args, sharded, launch(args, "sharded-root", work))
        return out
    finally:
        if s3 is not None:
            s3.kill()
            s3.wait()
        if own:
            shutil.rmtree(work, ignore_errors=True)


def start_s3rver(work):
    """s3rver (npm) on 127.0.0.1, bucket bkt, data under work/s3; the
    environment points the ranks' uploads at it."""
    import re

    if shutil.which("s3rver") is None:
        raise SystemExit("bench_shard: --s3 needs s3rver (npm install -g s3rver)")
    log = open(os.path.join(work, "s3.log"), "w+")
    proc = subprocess.Popen(["s3rver", "-d", os.path.join(work, "s3"), "-a", "127.0.0.1",
                             "-p", "0", "--configure-bucket", "bkt"], stdout=log,
                            stderr=subprocess.STDOUT)
    for _ in range(400):
        log.seek(0)
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", log.read())
        if m:
            os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{m.group(1)}",
                              AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER",
                              AWS_REGION="us-east-1")
            return proc
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("bench_shard: s3rver did not start")


def s3_summary(args, parts, root):
    """Per rank, the anchor steps' mean time and the bytes put into the
    bucket over the run, with parts put by every rank against rank 0's
    upload."""
    def anchors(r):
        steps = r["anchor_steps"]
        return {"anchor_steps": steps,
                "anchor_step_s": sum(r["times_s"][s - 1] for s in steps) / max(1, len(steps)),
                "put_bytes": sum(r["put_bytes"]),
                "peak_extra_bytes": max(r["peak_extra_bytes"])}
    return {"part_mb": args.part_mb,
            "parts_by_every_rank": [anchors(r) for r in parts],
            "rank0_uploads": [anchors(r) for r in root]}


def summary(args, sharded, gathered, work):
    def mean(xs):
        return sum(xs) / len(xs) if xs else 0.0

    single = gathered[0]
    patches = single["patch_bytes"]
    gather_step_s = mean(single["times_s"][1:])
    ranks = []
    for r in sharded:
        patch = max(r["patch_bytes"] or [0])
        peak = max(r["peak_extra_bytes"])
        budget = r["shard_bf16_bytes"] * 1.1 + max(patches)
        held = r["rss_before_extra_bytes"][-1]  # the snapshot and what stays between steps
        ranks.append({
            "rank": r["rank"], "shard_bf16_bytes": r["shard_bf16_bytes"],
            "peak_extra_bytes": peak, "held_between_steps_bytes": held,
            # a patch step's own (the first step takes the snapshot)
            "peak_within_step_bytes": max(p - b for p, b in zip(r["peak_extra_bytes"][1:],
                                                                 r["rss_before_extra_bytes"][1:])),
            "memory_target_bytes": int(budget),
            "memory_ok": peak <= budget,
            "publish_s_per_step": mean(r["times_s"][1:]), "first_step_s": r["times_s"][0],
            "patch_bytes_seen": patch})
    sharded_bytes = sharded[0]["patch_bytes"]
    same_bytes = all(abs(a - b) <= 0.01 * max(b, 1) for a, b in zip(sharded_bytes, patches))
    return {
        "bench": "shard", "ranks": args.ranks, "mode": args.mode,
        "params": args.tensors * args.rows * args.cols, "steps": args.steps,
        "per1024": args.per1024, "threads": args.threads,
        "density": [round(c / (args.tensors * args.rows * args.cols), 5)
                    for c in single["changed"][1:]],
        "hwm_reset": all(r["hwm_reset"] for r in sharded + gathered),
        "sharded": ranks,
        "gathered": {"publish_s_per_step": gather_step_s, "first_step_s": single["times_s"][0],
                     "rank0_peak_extra_bytes": max(single["peak_extra_bytes"]),
                     "patch_bytes": patches},
        "sharded_patch_bytes": sharded_bytes,
        "bytes_within_1pct": same_bytes,
        "same_objects": named(os.path.join(work, "sharded")) ==
        named(os.path.join(work, "gathered")),
        "memory_ok": all(r["memory_ok"] for r in ranks),
        "no_rank_slower": all(r["publish_s_per_step"] <= gather_step_s for r in ranks),
    }


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--rank-of":
        rank, port, mode, out = int(argv[1]), int(argv[2]), argv[3], argv[4]
        args = parse_args(argv[5:])
        rank_main(rank, port, args, mode, out)
        return 0
    args = parse_args(argv)
    if args.ranks < 2:
        raise SystemExit("bench_shard: --ranks must be at least 2")
    print(json.dumps(run(args), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
