"""Sharded trainers publish without a gather (pulse.Publisher with a
torch.distributed group, gloo, 4 processes; pulse.Block).

For flat element ranges (FSDP1/ZeRO-3), dim-0 blocks (FSDP2/DTensor),
rectangular column/row blocks (Megatron), tensor sets (pipeline stages)
and a mix, 5 steps each: after every step the store holds the very objects
(sha256 names) a single-process publish of the gathered FP32 weights
writes, the patch bytes are that publish's, and a worker pulling the store
(Python pulse.Subscriber over pulse.Server, and the pulse-pull CLI) holds
the trainer's BF16 weights bit for bit.

Faults: a rank that raises in a step (the store's first; bad input before
detection; an exception in the counting phase) makes every rank raise
naming it, the previous step stays on every rank and in the store, and the
retry publishes; overlapping, missing, inconsistent and out-of-range blocks
are refused at creation on every rank with the tensor named, before
anything is written; a rank killed mid-step (os._exit) makes the others
raise, the store keeps the previous step, and a restarted job resumes from
the store and publishes the next steps.

Also: two jobs over subgroups; a job whose ranks 2 and 3 do not see the
store folder (as on other nodes: rank 0 writes their blocks of the anchors
and hands them their blocks of the head when the job resumes); the same
sharded publish without a group (rank=, world=: through the store folder,
the C pulse_pub_shard_step); where s3rver is installed, a sharded job with
upload="s3://..." whose every step a worker pulls from the bucket; where
torch sees a CUDA device, blocks in GPU memory (skipped, saying so, where
not). Exit 77: no torch."""

import datetime
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

try:
    import torch
    import torch.distributed as dist
except ImportError:
    print("skipped: python3-torch is not installed")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
import pulse  # noqa: E402
from pulse import shard as pulse_shard  # noqa: E402
from ranks_testutil import spawn_ranks  # noqa: E402

WORLD = 4
STEPS = 5
SHAPES = {"attn.w": (96, 40), "embed": (5000,), "mlp.w3": (24, 30, 7), "norm": (64,)}
OPTS = dict(chunk_log2=10, anchor_every=2, keep_patches=8, keep_anchors=4, threads=1)


class Model:
    """The trainer's FP32 weights, the same on every rank (seeded): each
    rank cuts its blocks out of them, the single publisher publishes them
    whole."""

    def __init__(self, seed):
        self.gen = torch.Generator().manual_seed(seed)
        self.w = {name: (torch.rand(shape, generator=self.gen) - 0.5) *
                  (2.0 if name == "norm" else 0.08) for name, shape in SHAPES.items()}

    def step(self):
        """An Adam-like step: some weights move by about 1e-3, which changes
        some BF16 values and moves a few across exponent classes."""
        for w in self.w.values():
            mask = torch.rand(w.shape, generator=self.gen) < 0.3
            w += mask * (torch.rand(w.shape, generator=self.gen) - 0.5) * 2e-3


def split(n, rank):
    return n * rank // WORLD, n * (rank + 1) // WORLD


def dim_block(w, rank, d):
    lo, hi = split(w.shape[d], rank)
    index = [slice(None)] * w.dim()
    index[d] = slice(lo, hi)
    start = [0] * w.dim()
    start[d] = lo
    return pulse.Block(w[tuple(index)].contiguous().clone(), tuple(w.shape), tuple(start))


def blocks_of(sharding, w, rank):
    """Rank `rank`'s blocks of the weights `w` under `sharding`."""
    out = {}
    if sharding == "flat":  # FSDP1: the concatenation in 4 uneven ranges
        total = sum(t.numel() for t in w.values())
        lo = total * rank // WORLD + 37 * (rank > 0)
        hi = total * (rank + 1) // WORLD + 37 if rank + 1 < WORLD else total
        at = 0
        for name, t in w.items():
            a, e = max(lo, at), min(hi, at + t.numel())
            if a < e:
                part = t.reshape(-1)[a - at:e - at].clone()
                out[name] = pulse.Block(part, tuple(t.shape), a - at)
            at += t.numel()
    elif sharding == "dim0":  # FSDP2/DTensor
        for name, t in w.items():
            out[name] = dim_block(t, rank, 0)
    elif sharding == "rect":  # Megatron: a 2x2 grid, column- and row-parallel
        r0, c0 = (rank // 2) * 48, (rank % 2) * 17
        out["attn.w"] = pulse.Block(w["attn.w"][r0:r0 + 48, c0:c0 + (23 if rank % 2 else 17)]
                                    .contiguous().clone(), (96, 40), (r0, c0))
        out["embed"] = dim_block(w["embed"], rank, 0)
        out["mlp.w3"] = dim_block(w["mlp.w3"], rank, 1)
        if rank == 0:
            out["norm"] = w["norm"].clone()
    elif sharding == "sets":  # pipeline stages: tensor t on rank (t + 1) % 4
        for t, name in enumerate(SHAPES):
            if (t + 1) % WORLD == rank:
                out[name] = w[name].clone()
    elif sharding == "mix":
        r0, c0 = (rank // 2) * 50, (rank % 2) * 20
        out["attn.w"] = pulse.Block(w["attn.w"][r0:r0 + (46 if rank // 2 else 50), c0:c0 + 20]
                                    .contiguous().clone(), (96, 40), (r0, c0))
        lo, hi = split(5000, rank)
        out["embed"] = pulse.Block(w["embed"][lo:hi].clone(), (5000,), lo)
        if rank == 2:
            out["mlp.w3"] = w["mlp.w3"].clone()
        out["norm"] = dim_block(w["norm"], rank, 0)
    return out


def table_order(sharding):
    """The table's order a sharded publisher makes: first mention, rank 0's
    blocks first (a single publisher given this order writes the same
    bytes)."""
    order = []
    model = Model(0)
    for rank in range(WORLD):
        for name in blocks_of(sharding, model.w, rank):
            if name not in order:
                order.append(name)
    return order


def objects(store):
    return sorted(n for n in os.listdir(os.path.join(store, "objects")) if not n.startswith("."))


def section_indexes(store):
    """{name: bytes} of the store's patch section indexes (sections/)."""
    folder = os.path.join(store, "sections")
    if not os.path.isdir(folder):
        return {}
    out = {}
    for n in os.listdir(folder):
        if not n.startswith("."):
            with open(os.path.join(folder, n), "rb") as f:
                out[n] = f.read()
    return out


def read_safetensors_bf16(path):
    """{name: int16 tensor of the BF16 bits} of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        assert entry["dtype"] == "BF16", entry
        a, b = entry["data_offsets"]
        raw = bytearray(data[8 + n + a:8 + n + b])
        out[name] = torch.frombuffer(raw, dtype=torch.int16).reshape(entry["shape"])
    return out


def bits(t):
    return t.to(torch.bfloat16).view(torch.int16)


class Worker:
    """Rank 0's inference worker of a store: pulse.Subscriber over
    pulse.Server, and the pulse-pull CLI into a file."""

    def __init__(self, store, key, work):
        self.server = pulse.Server(store)
        self.key = key
        self.sub = pulse.Subscriber(self.server.url, key=key, retries=1)
        self.targets = {n: torch.zeros(s, dtype=torch.bfloat16) for n, s in SHAPES.items()}
        self.out = os.path.join(work, "pulled.safetensors")
        self.cli = os.path.join(os.path.dirname(os.environ["PULSE_LIBRARY"]), "tools", "pulse-pull")

    def check(self, step, model):
        got = self.sub.pull(self.targets, timeout=60)
        assert got == step, f"the subscriber holds step {got}, not {step}"
        run = subprocess.run([self.cli, self.server.url, "--out", self.out, "--key", self.key,
                              "--threads", "1", "--retries", "1"], capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 0, f"pulse-pull: {run.stdout}{run.stderr}"
        pulled = read_safetensors_bf16(self.out)
        for name, w in model.w.items():
            assert torch.equal(self.targets[name].view(torch.int16), bits(w)), \
                f"step {step}: the subscriber's '{name}' is not the trainer's BF16 weights"
            assert torch.equal(pulled[name], bits(w)), \
                f"step {step}: pulse-pull's '{name}' is not the trainer's BF16 weights"

    def close(self):
        self.sub.close()
        self.server.close()


def expect_error(fn, *words):
    """The pulse.Error fn raises; every word must be in its message."""
    try:
        fn()
    except pulse.Error as e:
        for word in words:
            assert word in str(e), f"'{word}' is not in: {e}"
        return e
    raise AssertionError(f"not refused (expected {words})")


class Single:
    """Rank 0's single publisher of the gathered FP32 weights."""

    def __init__(self, store, order):
        self.pub = pulse.Publisher(store, **OPTS)
        self.store = store
        self.order = order

    def publish(self, model, step):
        assert self.pub.publish({n: model.w[n] for n in self.order}, step) == step
        figures = self.pub.last_figures
        self.pub.flush()  # its anchors are written in the background
        return figures


def same_store(sharded, single, step, figures, single_figures):
    got, want = objects(sharded), objects(single)
    assert got == want, f"step {step}: the sharded store's objects {got} are not the single " \
                        f"publisher's {want}"
    # The patches' section indexes too, so a worker holding some tensors
    # fetches only theirs from a sharded trainer's store: the same bytes
    # but the last 96, the signer's key and signature (each store has its
    # own key).
    got_ix, want_ix = section_indexes(sharded), section_indexes(single)
    assert sorted(got_ix) == sorted(want_ix), \
        f"step {step}: section indexes {sorted(got_ix)}, single publisher {sorted(want_ix)}"
    for name, data in got_ix.items():
        assert data[:-96] == want_ix[name][:-96], f"step {step}: section index {name} differs"
    a, b = figures["patch_bytes"], single_figures["patch_bytes"]
    assert abs(a - b) <= 0.01 * max(b, 1), f"step {step}: patch bytes {a}, single {b}"
    return a


def on_device(blocks, device):
    """The blocks with their tensors on `device`."""
    return {n: pulse.Block(b.tensor.to(device), b.full_shape, b.start) if isinstance(b, pulse.Block)
            else b.to(device) for n, b in blocks.items()}


def publish_job(rank, work, name, sharding, seed, first=1, last=STEPS, faults=False, group=True,
                device=None, private=()):
    """Steps first..last of `sharding` into work/<name>/sharded (resumed
    from its head when first > 1), checked against a single publisher of
    steps 1..last (rank 0) after every step."""
    model = Model(seed)
    for _ in range(2, first):
        model.step()
    sharded = os.path.join(work, name, "sharded")
    where = dict(group=dist.group.WORLD) if group else dict(rank=rank, world=WORLD)
    # A rank in `private` sees another folder (as on another node): rank 0
    # writes its blocks of the anchors and hands it the head's on a resume.
    mine = os.path.join(work, name, f"private-{rank}") if rank in private else sharded
    pub = pulse.Publisher(mine, **where, **OPTS, timeout=30)
    single = worker = None
    if rank == 0:
        single_dir = os.path.join(work, name, "single")
        shutil.rmtree(single_dir, ignore_errors=True)
        single = Single(single_dir, table_order(sharding))
        replay = Model(seed)
        for step in range(1, first):
            if step > 1:
                replay.step()
            single.publish(replay, step)
    sizes = []
    for step in range(first, last + 1):
        if step > 1:
            model.step()
        blocks = blocks_of(sharding, model.w, rank)
        if device is not None:
            blocks = on_device(blocks, device)
        if faults and step == 1:
            # rank 3 raises in the store's first step: every rank raises, no
            # head; the retry takes every snapshot again
            saved = pulse_shard.RankShard.state_digest
            if rank == 3:
                def boom(self, parts, target):
                    raise pulse.Error("PULSE_ERR_IO", "the first step failed on purpose")
                pulse_shard.RankShard.state_digest = boom
            try:
                expect_error(lambda: pub.publish(blocks), "on purpose")
            finally:
                pulse_shard.RankShard.state_digest = saved
            assert pub.step is None and pulse_shard.store_head_step(sharded) is None
        if faults and step == 3:
            # rank 1 gives an FP16 block: every rank raises, naming it
            bad = dict(blocks)
            if rank == 1:
                bad["embed"] = pulse.Block(bad["embed"].tensor.half(), (5000,), bad["embed"].start)
            e = expect_error(lambda: pub.publish(bad), "embed" if rank == 1 else "rank 1")
            assert rank != 1 or e.status == "PULSE_ERR_DTYPE", e
            assert pub.step == 2, f"rank {rank} holds step {pub.step} after a failed step 3"
            assert pulse_shard.store_head_step(sharded) == 2
        if faults and step == 4:
            # rank 2 raises while counting: it raises its own exception,
            # every other rank a pulse.Error naming it
            saved = pulse_shard.RankShard.count
            if rank == 2:
                def boom(self, parts):
                    raise RuntimeError("the trainer failed while counting")
                pulse_shard.RankShard.count = boom
                try:
                    pub.publish(blocks)
                    raise AssertionError("rank 2's failure did not raise")
                except RuntimeError as e:
                    assert "counting" in str(e)
                finally:
                    pulse_shard.RankShard.count = saved
            else:
                expect_error(lambda: pub.publish(blocks), "rank 2", "counting")
            assert pub.step == 3 and pulse_shard.store_head_step(sharded) == 3
        assert pub.publish(blocks) == step
        assert pub.step == step
        if rank == 0:
            single_figures = single.publish(model, step)
            sizes.append(same_store(sharded, single.store, step, pub.last_figures, single_figures))
            if worker is None:
                worker = Worker(sharded, pub.public_key, os.path.join(work, name))
            worker.check(step, model)
        elif group:
            assert pub.public_key is not None and len(pub.public_key) == 64
    if worker is not None:
        worker.close()
    pub.close()
    if single is not None:
        single.pub.close()
    return sizes


def refused_at_creation(rank, work, name, change, *words):
    """A job whose blocks `change` spoils: every rank refuses the first
    publish naming the tensor; no head, no object."""
    store = os.path.join(work, "refused-" + name)
    model = Model(91)
    blocks = change(blocks_of("dim0", model.w, rank))
    pub = pulse.Publisher(store, group=dist.group.WORLD, **OPTS)
    expect_error(lambda: pub.publish(blocks), *words)
    dist.barrier()
    assert pulse_shard.store_head_step(store) is None, "a head was written"
    folder = os.path.join(store, "objects")
    assert not os.path.isdir(folder) or not os.listdir(folder), "an object was written"
    pub.close()


def overlap(rank):
    def change(blocks):
        if rank == 3:  # one row into rank 2's block
            t = blocks["attn.w"]
            full = Model(91).w["attn.w"]
            blocks["attn.w"] = pulse.Block(full[71:96].clone(), t.full_shape, (71, 0))
        return blocks
    return change


def missing(rank):
    def change(blocks):
        if rank == 3:
            del blocks["norm"]
        return blocks
    return change


def inconsistent(rank):
    def change(blocks):
        if rank == 1:
            t = blocks["embed"]
            blocks["embed"] = pulse.Block(t.tensor, (5001,), t.start)
        return blocks
    return change


def kill_mid_step(rank, work):
    """dim0 steps 1 and 2, then rank 2 dies in step 3 after the parts'
    exchange: the others raise, the store keeps step 2."""
    sharded = os.path.join(work, "killed", "sharded")
    model = Model(71)
    pub = pulse.Publisher(sharded, group=dist.group.WORLD, **OPTS)
    for step in (1, 2):
        if step > 1:
            model.step()
        assert pub.publish(blocks_of("dim0", model.w, rank)) == step
    model.step()
    if rank == 2:
        def die(self, parts):
            os._exit(3)
        pulse_shard.RankShard.count = die
    began = time.monotonic()
    e = expect_error(lambda: pub.publish(blocks_of("dim0", model.w, rank)))
    assert e.status == "PULSE_ERR_IO", e
    assert pub.step == 2
    assert pulse_shard.store_head_step(sharded) == 2
    print(f"ok rank {rank}: a dead rank failed step 3 in {time.monotonic() - began:.1f} s: "
          f"{e.detail[:90]}", flush=True)
    expect_error(lambda: pub.publish(blocks_of("dim0", model.w, rank)), "restart the job")


def s3_job(rank, work, endpoint):
    """upload="s3://...": rank 0 uploads the store after each commit; every
    rank learns the upload's figures; a worker pulls each step from the
    bucket itself."""
    store = os.path.join(work, "s3", "sharded")
    model = Model(61)
    pub = pulse.Publisher(store, upload="s3://bkt/runs/shard", group=dist.group.WORLD, **OPTS)
    sub = targets = None
    for step in range(1, 4):
        if step > 1:
            model.step()
        assert pub.publish(blocks_of("rect", model.w, rank)) == step
        assert pub.last_upload["head_step"] == step, pub.last_upload
        if rank == 0:
            if sub is None:
                sub = pulse.Subscriber(f"{endpoint}/bkt/runs/shard", key=pub.public_key, retries=1)
                targets = {n: torch.zeros(s, dtype=torch.bfloat16) for n, s in SHAPES.items()}
            assert sub.pull(targets, timeout=60) == step
            for name, w in model.w.items():
                assert torch.equal(targets[name].view(torch.int16), bits(w)), \
                    f"step {step}: '{name}' pulled from the bucket differs"
    if sub is not None:
        sub.close()
    pub.close()
    dist.barrier()


def bucket_get(endpoint, key):
    """The bytes of bucket bkt's object `key`, None when it is absent."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{endpoint}/bkt/{key}", timeout=30) as r:
            return r.read()
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def s3_parts_job(rank, work, endpoint, first=1, last=4, fault=False):
    """upload= with ranks 1-3 on folders of their own (no shared
    filesystem): every rank puts its parts of each anchor (1 KiB parts, a
    "mix" tiling: strided rows, flat ranges, a tensor of rank 2's) into one
    multipart upload, which is byte for byte the single publisher's anchor;
    rank 0's folder never holds it; a worker pulls each step from the
    bucket. With fault, rank 2 fails while reading its part of step 3's
    anchor: every rank raises, the bucket keeps step 2, the retry
    publishes. A job started later (first > 1) resumes: rank 0 fetches the
    anchors back from the bucket, ranks 1-3 get their blocks from it."""
    name = "s3-parts"
    sharded = os.path.join(work, name, "sharded")
    mine = sharded if rank == 0 else os.path.join(work, name, f"private-{rank}")
    prefix = "runs/parts"
    pub = pulse.Publisher(mine, upload=f"s3://bkt/{prefix}", group=dist.group.WORLD,
                          upload_part_bytes=1024, **OPTS)
    model = Model(67)
    for _ in range(2, first):
        model.step()
    single = sub = targets = None
    if rank == 0:
        single_dir = os.path.join(work, name, "single")
        shutil.rmtree(single_dir, ignore_errors=True)
        single = Single(single_dir, table_order("mix"))
        replay = Model(67)
        for step in range(1, first):
            if step > 1:
                replay.step()
            single.publish(replay, step)
        sub = pulse.Subscriber(f"{endpoint}/bkt/{prefix}", key=pub.public_key, retries=1)
        targets = {n: torch.zeros(s, dtype=torch.bfloat16) for n, s in SHAPES.items()}
    for step in range(first, last + 1):
        if step > 1:
            model.step()
        blocks = blocks_of("mix", model.w, rank)
        if fault and step == 3:
            saved = pulse_shard.RankShard.anchor_read
            if rank == 2:
                def boom(self, *args):
                    raise pulse.Error("PULSE_ERR_IO", "the anchor's part failed on purpose")
                pulse_shard.RankShard.anchor_read = boom
            try:
                expect_error(lambda: pub.publish(blocks), "on purpose")
            finally:
                pulse_shard.RankShard.anchor_read = saved
            assert pub.step == 2, f"rank {rank} holds step {pub.step} after a failed step 3"
            if rank == 0:
                head = json.loads(bucket_get(endpoint, f"{prefix}/head.json"))
                assert head["step"] == 2, f"the bucket's head is at {head['step']}, not 2"
        assert pub.publish(blocks) == step
        if step % 2 == 1:  # an anchor step (anchor_every=2)
            parts = [None] * WORLD
            dist.all_gather_object(parts, pub.last_anchor_parts["parts"])
            assert all(p > 0 for p in parts), f"step {step}: parts put per rank {parts}"
        if rank == 0:
            single.publish(model, step)
            assert sub.pull(targets, timeout=60) == step
            for n, w in model.w.items():
                assert torch.equal(targets[n].view(torch.int16), bits(w)), \
                    f"step {step}: '{n}' pulled from the bucket differs"
            anchors = [o for o in objects(single.store) if o.endswith(".safetensors")]
            for o in anchors:
                with open(os.path.join(single.store, "objects", o), "rb") as f:
                    want = f.read()
                got = bucket_get(endpoint, f"{prefix}/objects/{o}")
                assert got == want, f"step {step}: the bucket's anchor {o} is not the single " \
                                    f"publisher's ({None if got is None else len(got)} bytes)"
            if step % 2 == 1:
                with open(os.path.join(sharded, "head.json")) as f:
                    newest = [a["path"] for a in json.load(f)["anchors"] if a["step"] == step]
                assert newest and not os.path.exists(os.path.join(sharded, newest[0])), \
                    f"step {step}: rank 0's folder holds the anchor {newest}"
    if rank == 0:
        sub.close()
        single.pub.close()
    pub.close()
    dist.barrier()


def subgroup_job(rank, work):
    """Two jobs at once over subgroups ({0, 1} and {2, 3}): each splits every
    tensor's dim 0 in two and publishes into its own store; the group's rank
    0 (global rank 0 or 2) commits, and its store is a single publisher's."""
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group, mine = groups[rank // 2], rank % 2
    name = f"subgroup-{rank // 2}"
    sharded = os.path.join(work, name, "sharded")
    model = Model(51 + rank // 2)
    pub = pulse.Publisher(sharded, group=group, **OPTS)
    single = Single(os.path.join(work, name, "single"), list(SHAPES)) if mine == 0 else None
    for step in range(1, 4):
        if step > 1:
            model.step()
        blocks = {}
        for n, w in model.w.items():
            lo, hi = (0, w.shape[0] // 2) if mine == 0 else (w.shape[0] // 2, w.shape[0])
            blocks[n] = pulse.Block(w[lo:hi].clone(), tuple(w.shape), (lo,) + (0,) * (w.dim() - 1))
        assert pub.publish(blocks) == step
        if single is not None:
            same_store(sharded, single.store, step, pub.last_figures, single.publish(model, step))
    pub.close()
    if single is not None:
        single.pub.close()
    dist.barrier()


def outside(rank):
    def change(blocks):
        if rank == 0:  # 24 rows from row 90 of 96
            t = blocks["attn.w"]
            blocks["attn.w"] = pulse.Block(t.tensor, t.full_shape, (90, 0))
        return blocks
    return change


def worker_main(rank, port, work, phase):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=30))
    torch.set_num_threads(1)
    if phase == "main":
        for seed, sharding in enumerate(("flat", "dim0", "rect", "sets", "mix")):
            began = time.monotonic()
            sizes = publish_job(rank, work, sharding, sharding, 10 + seed,
                                faults=sharding == "mix")
            print(f"ok rank {rank} {sharding}: {time.monotonic() - began:.1f} s, patch bytes "
                  f"{sizes} (= the single publish's)", flush=True)
        if torch.cuda.is_available():  # blocks in GPU memory: cast there, copied to the host
            sizes = publish_job(rank, work, "dim0-cuda", "dim0", 16, device="cuda")
            print(f"ok rank {rank} dim0 CUDA blocks: patch bytes {sizes}", flush=True)
        else:
            print(f"rank {rank}: CUDA blocks skipped: torch sees no CUDA device", flush=True)
        refused_at_creation(rank, work, "overlap", overlap(rank), "attn.w", "overlap")
        refused_at_creation(rank, work, "missing", missing(rank), "norm")
        refused_at_creation(rank, work, "inconsistent", inconsistent(rank), "embed", "5001")
        refused_at_creation(rank, work, "outside", outside(rank), "attn.w", "outside",
                            "rank 0" if rank else "attn.w")
        print(f"ok rank {rank} refusals", flush=True)
        kill_mid_step(rank, work)
        os._exit(0)  # the group lost a rank: no orderly shutdown
    # A restarted job resumes from the killed store and publishes 3..5;
    # then the same sharded publish without a group, through the store.
    publish_job(rank, work, "killed", "dim0", 71, first=3)
    print(f"ok rank {rank} resumed", flush=True)
    subgroup_job(rank, work)
    print(f"ok rank {rank} two jobs over subgroups", flush=True)
    publish_job(rank, work, "private", "mix", 91, private=(2, 3))
    publish_job(rank, work, "private", "mix", 91, first=6, last=7, private=(2, 3))
    print(f"ok rank {rank} ranks 2 and 3 without the store folder, and their resume", flush=True)
    sizes = publish_job(rank, work, "mix-store", "mix", 81, group=False)
    print(f"ok rank {rank} through the store: patch bytes {sizes}", flush=True)
    if os.environ.get("AWS_ENDPOINT_URL"):
        s3_job(rank, work, os.environ["AWS_ENDPOINT_URL"])
        print(f"ok rank {rank} upload to s3rver: each step pulled from the bucket", flush=True)
        s3_parts_job(rank, work, os.environ["AWS_ENDPOINT_URL"], fault=True)
        s3_parts_job(rank, work, os.environ["AWS_ENDPOINT_URL"], first=5, last=6)
        print(f"ok rank {rank} anchors uploaded in parts by every rank, a failed part, a resume",
              flush=True)
    else:
        print(f"rank {rank}: the S3 upload skipped: s3rver is not installed", flush=True)
    dist.destroy_process_group()


def spawn(work, phase, timeout):
    return spawn_ranks(__file__, WORLD, [work, phase], timeout, f"phase {phase}: a rank")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    if "PULSE_LIBRARY" not in os.environ:
        print("PULSE_LIBRARY must name the build's libpulse.so (ctest sets it)")
        sys.exit(1)
    work = tempfile.mkdtemp(prefix="pulse-shard-")
    failed = 0
    s3 = None
    try:
        if shutil.which("s3rver"):
            sys.path.insert(0, HERE)
            from test_upload import start_s3rver
            s3, port = start_s3rver(work)
            os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
                              AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER",
                              AWS_REGION="us-east-1")
        for rank, (rc, out) in enumerate(spawn(work, "main", 300)):
            print(out.strip())
            want = 3 if rank == 2 else 0
            if rc != want or (rank != 2 and out.count("ok ") < 7):
                print(f"FAIL: rank {rank} exited {rc} (want {want})")
                failed += 1
        for rank, (rc, out) in enumerate(spawn(work, "resume", 300)):
            print(out.strip())
            if rc != 0 or out.count("ok ") < 4 + 2 * bool(s3):
                print(f"FAIL: rank {rank} of the restarted job exited {rc}")
                failed += 1
    finally:
        if s3 is not None:
            s3.kill()
            s3.wait()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{2 - (failed > 0)} passed, {int(failed > 0)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
