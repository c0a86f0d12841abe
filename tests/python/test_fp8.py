"""FP8 targets: a small model published in BF16 as usual; a worker holds
some weights as FP8 (torch.float8_e4m3fn where torch has it, else uint8
holding the E4M3FN bits) with their `<name>_scale_inv` (per 128x128 block,
partial edge blocks included, or one per tensor) and, after every pull,
they equal bit for bit an independent reference quantizer written here
with numpy, over the worker's own local tensor (also a fused, TP-sharded
qkv through pulse.Mapping). Steps move a block's amax up and down. A
`_scale_inv` of the wrong shape or dtype is refused before anything is
written; a NaN or infinity published into an FP8 weight is refused with
the worker's FP8 tensors, scales and step unchanged, reported once and
not fetched again for the same head (a follower waits for the next head),
and the next good step goes on. Where torch has float8_e4m3fn, its own conversion agrees
with the numpy quantizer. Exit 77: no torch."""

import os
import sys
import tempfile
import threading
import time

try:
    import numpy as np
    import torch
except ImportError:
    print("skipped: python3-torch or numpy is not installed")
    sys.exit(77)

import pulse  # noqa: E402

HAS_FP8 = hasattr(torch, "float8_e4m3fn")
FP8 = torch.float8_e4m3fn if HAS_FP8 else torch.uint8


# ---------------------------------------------------------- the reference
def e4m3_table():
    """Values of the non-negative finite E4M3FN codes 0x00..0x7E."""
    codes = np.arange(0x7F)
    e, m = codes >> 3, codes & 7
    return np.where(e == 0, np.ldexp(m.astype(np.float64), -9),
                    np.ldexp((8 + m).astype(np.float64), e - 10))


TABLE = e4m3_table()


def e4m3_nearest(v):
    """E4M3FN bits of float32 array v: nearest by distance, ties to the
    even code, saturating at 448, the sign copied."""
    a = np.abs(v.astype(np.float64))
    hi = np.clip(np.searchsorted(TABLE, a), 1, 0x7E)
    lo = hi - 1
    dlo, dhi = a - TABLE[lo], TABLE[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(a >= 448.0, 0x7E, code)
    return (code | np.where(np.signbit(v), 0x80, 0)).astype(np.uint8)


def quantize_ref(bits, per_tensor=False):
    """(q, scales) of BF16 bits (uint16, 2-D), blocks of 128x128 (or one)."""
    x = (bits.astype(np.uint32) << 16).view(np.float32)
    rows, cols = x.shape
    br, bc = (rows, cols) if per_tensor else (128, 128)
    gr, gc = -(-rows // br), -(-cols // bc)
    q = np.zeros(x.shape, np.uint8)
    s = np.zeros((gr, gc), np.float32)
    for i in range(gr):
        for j in range(gc):
            blk = x[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            amax = np.float32(np.abs(blk).max())
            scale = np.float32(1.0) if amax == 0 else np.float32(amax / np.float32(448.0))
            s[i, j] = scale
            q[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = e4m3_nearest((blk / scale).astype(np.float32))
    return q, s


def bf16_bits(t):
    return t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)


def q_bits(t):
    return t.view(torch.uint8).numpy() if HAS_FP8 else t.numpy()


def expect_fp8(name, q, scale, bits, per_tensor=False):
    want_q, want_s = quantize_ref(bits, per_tensor)
    got_s = scale.numpy().reshape(-1).view(np.uint32)
    assert np.array_equal(got_s, want_s.reshape(-1).view(np.uint32)), f"'{name}': scales differ"
    got_q = q_bits(q)
    if not np.array_equal(got_q, want_q):
        bad = np.argwhere(got_q != want_q)[0]
        raise AssertionError(f"'{name}': q differs at {tuple(bad)}: {got_q[tuple(bad)]:#x} "
                             f"!= {want_q[tuple(bad)]:#x}")


# ------------------------------------------------------------- the model
SHAPES = {"a.weight": (300, 200), "b.weight": (256, 384), "c.weight": (64, 96), "c.bias": (96,)}
PER_TENSOR = {"c.weight"}


def trainer_state(gen):
    return {n: (torch.randn(s, generator=gen) * 0.02).to(torch.bfloat16) for n, s in SHAPES.items()}


def train_step(state, gen, step):
    """A few percent of the weights move by an ulp or more; at step 3 the
    largest element of a.weight's block (2, 1) (a partial block) goes up,
    at step 4 it goes back down to zero."""
    for t in state.values():
        mask = torch.rand(t.shape, generator=gen) < 0.03
        t.copy_(torch.where(mask, (t.float() * 1.01 + 1e-4).to(torch.bfloat16), t))
    if "a.weight" not in state:
        return
    blk = state["a.weight"][256:300, 128:200]
    at = np.unravel_index(int(blk.float().abs().argmax()), tuple(blk.shape))
    if step == 3:
        blk[at] = blk.float().abs().max() * 3
    if step == 4:
        blk[at] = 0


def worker_targets():
    targets = {}
    for name, shape in SHAPES.items():
        if name.endswith("weight"):
            targets[name] = torch.zeros(shape, dtype=FP8)
            grid = () if name in PER_TENSOR else (-(-shape[0] // 128), -(-shape[1] // 128))
            targets[name + "_scale_inv"] = torch.zeros(grid, dtype=torch.float32)
        else:
            targets[name] = torch.zeros(shape, dtype=torch.bfloat16)
    return targets


def expect_worker(targets, state):
    for name in SHAPES:
        if name.endswith("weight"):
            expect_fp8(name, targets[name], targets[name + "_scale_inv"], bf16_bits(state[name]),
                       name in PER_TENSOR)
        else:
            assert torch.equal(targets[name].view(torch.int16), state[name].view(torch.int16))


def refused_before_writing(url, key, state):
    """Scales of the wrong shape or dtype: pulse.Error, nothing written."""
    for bad, status in ((torch.zeros((2, 2), dtype=torch.float32), "PULSE_ERR_SIZE_MISMATCH"),
                        (torch.zeros((3,), dtype=torch.float32), "PULSE_ERR_SIZE_MISMATCH"),
                        (torch.zeros((3, 2), dtype=torch.float16), "PULSE_ERR_DTYPE"),
                        (torch.zeros((3, 2), dtype=torch.bfloat16), "PULSE_ERR_DTYPE")):
        targets = worker_targets()
        targets["a.weight_scale_inv"] = bad.fill_(7)
        targets["a.weight"].view(torch.uint8).fill_(0x55)
        with pulse.Subscriber(url, key=key, retries=0) as sub:
            try:
                sub.pull(targets, timeout=60)
                raise AssertionError(f"a scale_inv of {bad.dtype} {list(bad.shape)} was taken")
            except pulse.Error as e:
                assert e.status == status, str(e)
                assert "a.weight_scale_inv" in str(e), str(e)
                print(f"scale_inv {bad.dtype} {list(bad.shape)}: pulse.Error {e}")
        assert bool((targets["a.weight"].view(torch.uint8) == 0x55).all()), "q was written"
        assert bool((bad == 7).all()), "the scales were written"
        assert bool((targets["b.weight"].view(torch.uint8) == 0).all()), "another target was written"
    targets = worker_targets()
    del targets["a.weight_scale_inv"]
    if HAS_FP8:
        try:
            pulse.Subscriber(url, key=key).pull(targets, timeout=60)
            raise AssertionError("an FP8 target without scales was taken")
        except pulse.Error as e:
            assert "a.weight_scale_inv" in str(e), str(e)


def nan_refused(pub, sub, targets, state, gen, step):
    """A NaN (then an infinity) into an FP8 weight: the pull fails, the FP8
    tensors, scales and step stay; the refusal is counted once, and pulling
    the same head again fails at once with nothing fetched or rewritten (no
    route through the refused step: before, the anchor route rewrote the
    targets back to the step before and failed again). The next good step
    is applied by the same worker, from its anchor (the chain goes through
    the bad step)."""
    for bad in (float("nan"), float("inf")):
        before = {n: t.view(torch.uint8).clone() if t.dtype == FP8 else t.clone()
                  for n, t in targets.items()}
        poisoned = {n: t.clone() for n, t in state.items()}
        poisoned["b.weight"][200, 300] = bad
        step += 1
        assert pub.publish(poisoned) == step
        rejected = sub.figures()["rejected"]
        try:
            sub.pull(targets, timeout=60)
            raise AssertionError(f"a {bad} weight went into an FP8 target")
        except pulse.Error as e:
            assert e.status == "PULSE_ERR_UNSUPPORTED", str(e)
            assert "(200, 300)" in str(e), str(e)
            print(f"{bad} into an FP8 target: pulse.Error {e}")
        assert sub.step == step - 1
        fig = sub.figures()
        assert fig["rejected"] == rejected + 1, fig
        for again in range(2):
            anchors, objects = fig["anchors_applied"], fig["objects_fetched"]
            try:
                sub.pull(targets, timeout=60)
                raise AssertionError(f"a {bad} weight went into an FP8 target (pull {again + 2})")
            except pulse.Error as e:
                assert e.status == "PULSE_ERR_UNSUPPORTED", str(e)
                assert f"step {step} was refused" in str(e), str(e)
            fig = sub.figures()
            assert fig["anchors_applied"] == anchors, "the anchor route ran again"
            assert fig["objects_fetched"] == objects, "the refused step was fetched again"
            assert fig["rejected"] == rejected + 1, "the refusal was reported again"
        assert sub.step == step - 1
        for n, t in targets.items():
            now = t.view(torch.uint8) if t.dtype == FP8 else t
            assert torch.equal(now, before[n]), f"'{n}' changed"
        train_step(state, gen, 99)
        step += 1
        assert pub.publish(state) == step
        pub.flush()  # its anchor is in the head
        assert sub.pull(targets, timeout=60) == step
        expect_worker(targets, state)
    sub.close()
    return step

def follow_past_refused(pub, url, targets, state, gen, step):
    """A follower whose head is a refused step waits for the next head: in
    the second it waits, the refusal is counted once, the sync failed once
    and no anchor was taken again (before: it retried with a backoff, and
    each retry's anchor route rewrote the targets); the next good step is
    the first it yields."""
    with pulse.Subscriber(url, key=pub.public_key, retries=0) as sub:
        assert sub.pull(targets, timeout=60) == step
        poisoned = {n: t.clone() for n, t in state.items()}
        poisoned["b.weight"][7, 9] = float("nan")
        step += 1
        assert pub.publish(poisoned) == step
        before, seen, yielded = sub.figures(), [], threading.Event()

        def later():
            time.sleep(1.0)
            seen.append(sub.figures())
            train_step(state, gen, 98)
            pub.publish(state)
            pub.flush()
            if not yielded.wait(60):  # a follower stuck on the refused step
                pulse._lib.lib.pulse_sub_stop(sub._sub)  # ends follow: no yield

        follow = sub.follow(targets)
        thread = threading.Thread(target=later)
        thread.start()
        try:
            got = next(follow, None)
            yielded.set()
        finally:
            follow.close()
            thread.join()
        assert got is not None, "the follower never got past the refused step"
        fig = seen[0]
        assert fig["rejected"] == before["rejected"] + 1, fig
        assert fig["sync_failures"] == before["sync_failures"] + 1, fig
        assert fig["anchors_applied"] == before["anchors_applied"], fig
        assert fig["step"] == step - 1, fig
        assert got == step + 1, got
        expect_worker(targets, state)
        print(f"follower: step {step} refused once, then step {got} applied")
    return step + 1


def fused_tp(work):
    """A TP=2 rank's fused qkv_proj and row-parallel o_proj held in FP8:
    the quantization of the rank's local tensor (torch.cat of the parts'
    row slices; the columns of o_proj), whole blocks over part seams."""
    gen = torch.Generator().manual_seed(5)
    parts = {"l.q_proj.weight": (256, 192), "l.k_proj.weight": (128, 192),
             "l.v_proj.weight": (128, 192), "l.o_proj.weight": (192, 256)}
    state = {n: (torch.randn(s, generator=gen) * 0.02).to(torch.bfloat16) for n, s in parts.items()}
    store = os.path.join(work, "store-tp")
    stacked = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v")]
    with pulse.Publisher(store) as pub, pulse.Server(store) as server:
        ranks = []
        for rank in (0, 1):
            targets = {"l.qkv_proj.weight": torch.zeros((256, 192), dtype=FP8),
                       "l.qkv_proj.weight_scale_inv": torch.zeros((2, 2), dtype=torch.float32),
                       "l.o_proj.weight": torch.zeros((192, 128), dtype=FP8),
                       "l.o_proj.weight_scale_inv": torch.zeros((2, 1), dtype=torch.float32)}
            ranks.append((rank, pulse.Mapping(stacked=stacked, tp_rank=rank, tp_size=2), targets,
                          pulse.Subscriber(server.url, key=pub.public_key)))
        for step in range(1, 5):
            if step > 1:
                train_step(state, gen, step)
            assert pub.publish(state) == step
            for rank, mapping, targets, sub in ranks:
                assert sub.pull(targets, mapping=mapping, timeout=60) == step
                qkv = torch.cat([state[f"l.{p}_proj.weight"].chunk(2, 0)[rank] for p in "qkv"])
                o = state["l.o_proj.weight"].chunk(2, 1)[rank].contiguous()
                expect_fp8("l.qkv_proj.weight", targets["l.qkv_proj.weight"],
                           targets["l.qkv_proj.weight_scale_inv"], bf16_bits(qkv))
                expect_fp8("l.o_proj.weight", targets["l.o_proj.weight"],
                           targets["l.o_proj.weight_scale_inv"], bf16_bits(o))
        for _, _, _, sub in ranks:
            sub.close()
    print("fused TP=2 FP8 ranks: bit-identical at steps 1..4")


def torch_agrees():
    """torch's own float8_e4m3fn conversion of the same x / s (clamped to
    +-448: torch turns values past 464 into NaN) is the numpy reference's q."""
    if not HAS_FP8:
        print("skipped: torch has no float8_e4m3fn (torch " + torch.__version__ + ")")
        return
    gen = torch.Generator().manual_seed(3)
    x = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    x = x[torch.isfinite(x)]
    for amax in (1.0, 448.0, 3e-40, 0.0123, 2.0 ** 100):
        s = np.float32(np.float32(amax) / np.float32(448.0))
        v = (x / torch.tensor(s)).clamp(-448, 448)
        got = v.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        want = e4m3_nearest(v.numpy())
        assert np.array_equal(got, want), f"torch and the reference differ at amax {amax}"
    del gen
    print("torch float8_e4m3fn agrees with the reference quantizer")


def main():
    torch_agrees()
    gen = torch.Generator().manual_seed(34)
    with tempfile.TemporaryDirectory(prefix="pulse-fp8-") as work:
        store = os.path.join(work, "store")
        state = trainer_state(gen)
        # An anchor every step: a worker gets past a bad step from the next one.
        with pulse.Publisher(store, anchor_every=1) as pub, pulse.Server(store) as server:
            assert pub.publish(state) == 1
            refused_before_writing(server.url, pub.public_key, state)
            targets = worker_targets()
            with pulse.Subscriber(server.url, key=pub.public_key, retries=0) as sub:
                assert sub.pull(targets, timeout=60) == 1
                expect_worker(targets, state)
                step = 1
                for _ in range(5):
                    step += 1
                    train_step(state, gen, step)
                    assert pub.publish(state) == step
                    assert sub.pull(targets, timeout=60) == step
                    expect_worker(targets, state)
                print(f"FP8 targets bit-identical to the reference at steps 1..{step}")
                step = nan_refused(pub, sub, targets, state, gen, step)
            follow_past_refused(pub, server.url, targets, state, gen, step)
        fused_tp(work)
    print("ok")


if __name__ == "__main__":
    main()
