"""pulse.loco.DiLoCo over torch.distributed (gloo), 4 processes on a small
PyTorch model of the text (a byte-level model of this repository's
README): 20 outer rounds of 5 AdamW steps; after every outer.step() every
trainer's parameters are bit for bit the same (their digests and the C
context's theta_g digest, gathered), the held-out loss falls, and each
trainer's reported bytes are the payloads the others actually sent. With
gate="none" (dense DiLoCo, the same code path) the outer step equals the
mean of the pseudo-gradients followed by the Nesterov step, computed here
in torch (to FP32 rounding: the C library sums in double in sender order).
Then the failures: parameters of the wrong dtype, not contiguous, or a
count that differs between trainers are refused with pulse.Error before
any payload is sent, and a trainer that dies makes the others fail with a
pulse.Error within the exchange's timeout, never hang. Exit 77: no torch."""

import datetime
import hashlib
import os
import sys

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
from ranks_testutil import spawn_ranks  # noqa: E402

WORLD = 4
ROUNDS = 20
INNER = 5
CONTEXT = 4


class ByteModel(torch.nn.Module):
    """Next byte from the previous CONTEXT bytes: embedding, one hidden layer."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(256, 16)
        self.hidden = torch.nn.Linear(16 * CONTEXT, 64)
        self.out = torch.nn.Linear(64, 256)

    def forward(self, x):
        h = self.embed(x).reshape(x.shape[0], -1)
        return self.out(torch.tanh(self.hidden(h)))


def text_batches(rank):
    with open(os.path.join(ROOT, "README.md"), "rb") as f:
        data = torch.tensor(list(f.read()[:60000]), dtype=torch.long)
    n = data.numel() - CONTEXT - 1
    held = torch.arange(0, 512) * (n // 512)
    gen = torch.Generator().manual_seed(100 + rank)

    def batch(idx):
        x = torch.stack([data[i:i + CONTEXT] for i in idx.tolist()])
        return x, data[idx + CONTEXT]

    return (lambda: batch(torch.randint(0, n, (64,), generator=gen))), batch(held)


def digest(params):
    """SHA-256 of the parameters' bits."""
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def all_same(values):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, values)
    return all(v == out[0] for v in out), out


def run_rounds(rank, gate):
    torch.manual_seed(1234 + rank)  # different starts: DiLoCo broadcasts rank 0's
    model = ByteModel()
    outer = pulse.loco.DiLoCo(model.parameters(), gate=gate)
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    next_batch, (hx, hy) = text_batches(rank)
    loss_fn = torch.nn.CrossEntropyLoss()
    same, _ = all_same(digest(list(model.parameters())))
    assert same, "trainers do not start from the same parameters"
    with torch.no_grad():
        first = loss_fn(model(hx), hy).item()
    last = first
    for r in range(ROUNDS):
        before = [p.detach().clone() for p in model.parameters()]
        for _ in range(INNER):
            x, y = next_batch()
            loss_fn(model(x), y).backward()
            inner.step()
            inner.zero_grad()
        local = [p.detach().clone() for p in model.parameters()]
        info = outer.step()
        assert info["round"] == r and info["contributors"] == WORLD, info
        same, digests = all_same((digest(list(model.parameters())), outer.global_digest()))
        assert same, f"round {r}: trainers differ after outer.step(): {digests}"
        sizes = [None] * WORLD
        dist.all_gather_object(sizes, info["payload_bytes"])
        assert info["bytes_received"] == sum(s for i, s in enumerate(sizes) if i != rank), \
            (info, sizes)
        assert info["bytes_sent"] == info["payload_bytes"] * (WORLD - 1)
        if gate == "none" and r == 0:
            check_dense_step(before, local, list(model.parameters()), outer)
        with torch.no_grad():
            last = loss_fn(model(hx), hy).item()
    assert last < first * 0.9, f"held-out loss {first:.4f} -> {last:.4f}: not falling"
    outer.close()
    return first, last, info


def check_dense_step(before, local, after, outer):
    """Round 0 of dense DiLoCo: b = 0, so b' = avg and theta_g' = theta_g -
    alpha * (avg + mu * avg), avg the mean over trainers of theta_g - theta_r."""
    deltas = [b - l for b, l in zip(before, local)]
    gathered = []
    for d in deltas:
        parts = [torch.zeros_like(d) for _ in range(WORLD)]
        dist.all_gather(parts, d.contiguous())
        gathered.append(torch.stack(parts).double().mean(0).float())
    for b, avg, a in zip(before, gathered, after):
        want = b - 0.7 * (avg + 0.9 * avg)
        err = (want - a.detach()).abs().max().item()
        scale = b.abs().max().item() + 1e-12
        assert err <= 1e-6 * scale + 1e-7, f"dense step differs by {err} (scale {scale})"


def check_refusals(rank):
    def refused(fn, what):
        try:
            fn()
        except pulse.Error as e:
            assert e.status == "PULSE_ERR_ARG", (what, e)
            return
        raise AssertionError(f"{what}: not refused")

    refused(lambda: pulse.loco.DiLoCo([torch.zeros(4, dtype=torch.float16)]), "FP16 parameters")
    refused(lambda: pulse.loco.DiLoCo([torch.zeros(4, 4).t()]), "a non-contiguous parameter")
    refused(lambda: pulse.loco.DiLoCo([torch.zeros(4)], gate="top-k"), "an unknown gate")
    # A count that differs on one trainer: every trainer refuses, nothing sent.
    refused(lambda: pulse.loco.DiLoCo([torch.zeros(10 + (rank == 2))]), "mismatched counts")


def check_dead_peer(rank):
    model = ByteModel()
    outer = pulse.loco.DiLoCo(model.parameters())
    dist.barrier()
    if rank == WORLD - 1:
        os._exit(3)  # dies before its round
    try:
        outer.step()
    except pulse.Error as e:
        assert e.status == "PULSE_ERR_IO", e
        print(f"ok dead peer: {e.detail[:80]}", flush=True)
        os._exit(0)
    raise AssertionError("a dead trainer's round did not fail")


def worker(rank, port, phase):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=20))
    torch.set_num_threads(1)
    if phase == "rounds":
        first, last, info = run_rounds(rank, "bf16")
        print(f"ok bf16 rank {rank} loss {first:.4f} -> {last:.4f} density "
              f"{info['density']:.3f} payload {info['payload_bytes']}", flush=True)
        first, last, info = run_rounds(rank, "none")
        print(f"ok none rank {rank} loss {first:.4f} -> {last:.4f} payload "
              f"{info['payload_bytes']}", flush=True)
        check_refusals(rank)
        print(f"ok refusals rank {rank}", flush=True)
        dist.destroy_process_group()
    else:
        check_dead_peer(rank)


def spawn(phase, timeout):
    return spawn_ranks(__file__, WORLD, [phase], timeout, f"phase {phase}: a trainer")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        return
    failed = 0
    for rank, (rc, out) in enumerate(spawn("rounds", 600)):
        print(out.strip())
        if rc != 0 or out.count("ok ") < 3:
            print(f"FAIL: rank {rank} exited {rc}")
            failed += 1
    for rank, (rc, out) in enumerate(spawn("dead", 120)):
        print(out.strip()[-400:])
        if rank == WORLD - 1:
            if rc != 3:
                print(f"FAIL: the dying rank exited {rc}")
                failed += 1
        elif rc != 0 or "ok dead peer" not in out:
            print(f"FAIL: rank {rank} did not fail cleanly on the dead peer (exit {rc})")
            failed += 1
    print(f"{2 - (failed > 0)} passed, {int(failed > 0)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
