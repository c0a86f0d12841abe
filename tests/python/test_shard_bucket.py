"""A sharded publisher whose ranks share no folder and no process group:
pulse.Publisher(private_dir, rank=r, world=4, upload="s3://...") on 4
processes, the step exchanged through the bucket (pulse.shard_store over
pulse_pub_shard_step with a bucket), against s3rver with S3's multipart
answers (tests/cli/lib/s3rver_multipart.js). Each step, pulled from the
bucket by pulse.Subscriber, is bit-identical to the gathered weights; the
anchors (anchor_every 2, 1 KiB parts of a mix tiling) are never in rank 0's
folder; a restarted job resumes from the bucket and goes on. A step whose
head upload fails after rank 0's commit fails on every rank with an error
that says so; publish() again returns it on every rank and the job goes
on; a job restarted right after such a failure goes on. With a shared
folder and upload= on rank 0 alone, the step goes through that folder and
rank 0 uploads, as before. Exit 77: no torch or no s3rver."""

import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)

try:
    import torch
except ImportError:
    print("skipped: no torch")
    sys.exit(77)

import pulse  # noqa: E402
from ranks_testutil import spawn_ranks  # noqa: E402

WORLD = 4
PREFIX = "runs/shard-bucket"
SHAPES = {"attn.w": (96, 40), "embed": (5000,), "mlp.w3": (24, 30, 7), "norm": (64,)}


def start_s3rver(work):
    """test_upload.py's s3rver (S3's multipart answers), whose store head
    upload fails while the file head-fault exists."""
    from test_upload import start_s3rver as start_multipart_s3rver
    os.environ["S3_FAIL_HEAD_FILE"] = os.path.join(work, "head-fault")
    try:
        return start_multipart_s3rver(work)
    finally:
        del os.environ["S3_FAIL_HEAD_FILE"]


class Model:
    """FP32 master weights, moved like an optimizer step."""

    def __init__(self, seed):
        self.gen = torch.Generator().manual_seed(seed)
        self.w = {n: (torch.rand(s, generator=self.gen) - 0.5) * 0.08 for n, s in SHAPES.items()}

    def step(self):
        for w in self.w.values():
            moved = torch.rand(w.shape, generator=self.gen) < 0.3
            w += moved * (torch.rand(w.shape, generator=self.gen) - 0.5) * 2e-3


def blocks_of(w, rank):
    """A mix: a 2x2 grid, flat ranges, dim-0 rows and a whole tensor on
    rank 2 (the 1 KiB parts of an anchor are then assembled on every rank)."""
    r0, c0 = (rank // 2) * 48, (rank % 2) * 20
    blocks = {
        "attn.w": pulse.Block(w["attn.w"][r0:r0 + 48, c0:c0 + 20].contiguous(), (96, 40),
                              (r0, c0)),
        "embed": pulse.Block(w["embed"][rank * 1250:(rank + 1) * 1250].clone(), (5000,),
                             rank * 1250),
        "norm": pulse.Block(w["norm"][rank * 16:(rank + 1) * 16].clone(), (64,), (rank * 16,)),
    }
    if rank == 2:
        blocks["mlp.w3"] = w["mlp.w3"].clone()
    return blocks


def head_upload_fails(pub, rank, work, blocks, step):
    """The publish of `step` whose head upload fails after rank 0's commit:
    every rank's error says the step is committed and uploaded later."""
    fault = os.path.join(work, "head-fault")
    if rank == 0:
        open(fault, "w").close()
    try:
        pub.publish(blocks)
    except pulse.Error as exc:
        assert "is committed in rank 0's store" in str(exc), f"rank {rank}: {exc}"
    else:
        raise AssertionError(f"rank {rank}: step {step} went through")
    finally:
        if rank == 0:
            os.unlink(fault)


def worker(rank, work, endpoint, first, last, shared=False, fault=None, stop=False):
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="S3RVER",
                      AWS_SECRET_ACCESS_KEY="S3RVER", AWS_REGION="us-east-1")
    prefix = PREFIX + ("-rank0" if shared else "")
    # No folder is shared, or (shared) one folder and upload= on rank 0 alone.
    mine = os.path.join(work, "shared" if shared else f"rank-{rank}")
    upload = f"s3://bkt/{prefix}" if rank == 0 or not shared else None
    pub = pulse.Publisher(mine, rank=rank, world=WORLD, upload=upload,
                          upload_part_bytes=1024, anchor_every=2, timeout=60)
    model = Model(17)
    for _ in range(1, first):  # step k's weights: k - 1 optimizer steps
        model.step()
    sub = targets = None
    if rank == 0:
        sub = pulse.Subscriber(f"{endpoint}/bkt/{prefix}", key=pub.public_key, retries=1)
        targets = {n: torch.zeros(s, dtype=torch.bfloat16) for n, s in SHAPES.items()}
    for step in range(first, last + 1):
        if step > first:
            model.step()
        if step == fault:
            head_upload_fails(pub, rank, work, blocks_of(model.w, rank), step)
            if stop:  # the job ends right after the failed upload
                break
        assert pub.publish(blocks_of(model.w, rank)) == step, f"rank {rank}: step {step}"
        if rank != 0:
            continue
        assert sub.pull(targets, timeout=60) == step
        for n, w in model.w.items():
            want = w.to(torch.bfloat16).view(torch.int16)
            assert torch.equal(targets[n].view(torch.int16), want), \
                f"step {step}: '{n}' pulled from the bucket differs from the weights"
        if shared:
            continue
        with open(os.path.join(mine, "head.json")) as f:
            anchors = [a["path"] for a in json.load(f)["anchors"] if a["step"] >= first]
        held = [a for a in anchors if os.path.exists(os.path.join(mine, a))]
        assert not held, f"step {step}: rank 0's folder holds the anchors {held}"
    if rank != 0 and not shared and not stop:
        left = [e for e in os.listdir(mine) if not e.startswith(".")] if os.path.isdir(mine) else []
        assert not left, f"rank {rank}'s folder holds {left} (a resume's copy is removed)"
    if sub is not None:
        sub.close()
    pub.close()


def run_job(work, endpoint, first, last, shared=False, fault=None, stop=False):
    outs = spawn_ranks(os.path.abspath(__file__), WORLD,
                       [work, endpoint, str(first), str(last), "shared" if shared else "private",
                        str(fault or 0), "stop" if stop else "retry"],
                       240, f"the job of steps {first}..{last}")
    failed = [f"rank {rank} exited {code}:\n{out}" for rank, (code, out) in enumerate(outs)
              if code != 0]
    assert not failed, f"the job of steps {first}..{last}:\n" + "\n".join(failed)


def main():
    if shutil.which("node") is None or not os.path.exists(
            os.path.join(os.environ.get("NODE_PATH") or "/usr/lib/node_modules", "s3rver")):
        print("skipped: node or s3rver is not installed")
        sys.exit(77)
    work = tempfile.mkdtemp(prefix="pulse-shard-bucket-")
    proc, port = start_s3rver(work)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        run_job(work, endpoint, 1, 4)
        # New processes, new shards: resumed from the bucket.
        run_job(work, endpoint, 5, 6)
        # Step 8's head upload fails after rank 0's commit; publish() again
        # returns it on every rank, and 9 follows.
        run_job(work, endpoint, 7, 9, fault=8)
        # The job ends right after step 10's failed head upload (rank 0's
        # store at 10, the bucket at 9); the restarted job goes on at 11.
        run_job(work, endpoint, 10, 10, fault=10, stop=True)
        run_job(work, endpoint, 11, 12)
        run_job(work, endpoint, 1, 2, shared=True)
        print("ok")
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), sys.argv[4], sys.argv[5], int(sys.argv[6]), int(sys.argv[7]),
               sys.argv[8] == "shared", int(sys.argv[9]) or None, sys.argv[10] == "stop")
    else:
        main()
