"""FP8 targets on a CUDA device through pulse.Subscriber (tests/gpu/check.sh,
"fp8 pull"): a small model published from the CPU; one worker holds two of
its weights as FP8 on cuda:0 (one torch.float8_e4m3fn with a scale per
128x128 block, edge blocks included; one uint8 holding the E4M3FN bits
with one scale for the tensor), with their `_scale_inv` on the same
device, and the rest in BF16 there; another worker holds the same on the
CPU. After every pull (on a stream of the caller's) the device FP8 bytes
and scales equal the CPU worker's and torch's own float8_e4m3fn conversion
of the reference formula (amax per block, s = amax / 448 in FP32, q =
E4M3FN(x / s)), bit for bit, through steps that move a block's amax up and
down; a NaN published into an FP8 weight is refused with the device FP8
tensors, scales and step unchanged. Usage: fp8_pull.py BUILD_DIR. Prints
"fp8 pull: ..." (a summary line). Exit 77: torch without CUDA or no device
(a skip, with the reason)."""

import os
import sys
import tempfile

build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PULSE_LIBRARY", os.path.join(build, "libpulse.so"))
sys.path.insert(0, os.path.join(root, "python"))

try:
    import torch
except ImportError:
    print("fp8 pull: skipped: python3-torch is not installed")
    sys.exit(77)
if not torch.cuda.is_available():
    print("fp8 pull: skipped: this torch has no CUDA device (torch.cuda.is_available() is False)")
    sys.exit(77)
if not hasattr(torch, "float8_e4m3fn"):
    print("fp8 pull: skipped: this torch has no float8_e4m3fn")
    sys.exit(77)

import pulse  # noqa: E402
from pulse._lib import lib  # noqa: E402

if not lib.pulse_cuda_available():
    print("fp8 pull: FAIL: torch sees a device, libpulse does not: "
          + lib.pulse_cuda_unavailable_reason().decode())
    sys.exit(1)

FP8 = torch.float8_e4m3fn
SHAPES = {"a.weight": (300, 200), "b.weight": (256, 384), "c.weight": (64, 96), "c.bias": (96,)}
BLOCKED, PER_TENSOR = "a.weight", "b.weight"


def reference(x_bf16, per_tensor):
    """(q bits as uint8, scales) of a BF16 tensor by the reference formula,
    with torch's own float8_e4m3fn conversion (the quotients are clamped to
    448 first: torch does not saturate)."""
    x = x_bf16.float()
    rows, cols = x.shape
    br, bc = (rows, cols) if per_tensor else (128, 128)
    gr, gc = -(-rows // br), -(-cols // bc)
    q = torch.empty((rows, cols), dtype=torch.uint8)
    s = torch.empty((gr, gc), dtype=torch.float32)
    for i in range(gr):
        for j in range(gc):
            blk = x[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            amax = blk.abs().max()
            scale = amax / torch.tensor(448.0) if amax != 0 else torch.tensor(1.0)
            s[i, j] = scale
            q[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = \
                (blk / scale).clamp(-448, 448).to(FP8).view(torch.uint8)
    return q, (s.reshape(()) if per_tensor else s)


def worker_targets(dev):
    t = {}
    for name, shape in SHAPES.items():
        if name == BLOCKED:
            t[name] = torch.zeros(shape, dtype=torch.uint8, device=dev).view(FP8)
            t[name + "_scale_inv"] = torch.zeros(
                (-(-shape[0] // 128), -(-shape[1] // 128)), dtype=torch.float32, device=dev)
        elif name == PER_TENSOR:
            t[name] = torch.zeros(shape, dtype=torch.uint8, device=dev)
            t[name + "_scale_inv"] = torch.zeros((), dtype=torch.float32, device=dev)
        else:
            t[name] = torch.zeros(shape, dtype=torch.bfloat16, device=dev)
    return t


def raw(t):
    """The bytes of a tensor (FP8, BF16 or FP32, any number of dimensions:
    torch views a 0-d tensor only as a dtype of its own size)."""
    t = t.view(torch.uint8) if t.dtype == FP8 else t
    return t.reshape(-1).view(torch.uint8)


def train_step(state, gen, k):
    """Moves about 2% of the weights by a few BF16 ulps; step 2 doubles the
    largest weight of each FP8 tensor (its block's amax goes up), step 3
    zeroes it (the amax goes down)."""
    for name, w in state.items():
        mask = torch.rand(w.shape, generator=gen) < 0.02
        w += mask * w.abs() / 128 * torch.randint(-2, 3, w.shape, generator=gen)
        if name in (BLOCKED, PER_TENSOR) and k in (2, 3):
            at = int(w.abs().argmax())
            w.view(-1)[at] = 2 * w.view(-1)[at] if k == 2 else 0.0


def main():
    dev = torch.device("cuda", 0)
    gen = torch.Generator().manual_seed(34)
    state = {n: torch.randn(s, generator=gen) * 0.02 for n, s in SHAPES.items()}
    checked = 0
    with tempfile.TemporaryDirectory(prefix="pulse-gpu-fp8-") as work:
        store = os.path.join(work, "store")
        with pulse.Publisher(store) as pub, pulse.Server(store) as server, \
                pulse.Subscriber(server.url, key=pub.public_key) as sub_cpu, \
                pulse.Subscriber(server.url, key=pub.public_key) as sub_gpu:
            cpu, gpu = worker_targets("cpu"), worker_targets(dev)
            stream = torch.cuda.Stream(dev)
            for k in range(5):
                if k > 0:
                    train_step(state, gen, k)
                step = pub.publish(state)
                assert sub_cpu.pull(cpu, timeout=60) == step
                with torch.cuda.stream(stream):
                    assert sub_gpu.pull(gpu, timeout=60) == step
                    back = {n: raw(t).cpu() for n, t in gpu.items()}
                for n in cpu:
                    assert torch.equal(back[n], raw(cpu[n])), \
                        f"step {step}: '{n}' on the device differs from the CPU pull"
                for n in (BLOCKED, PER_TENSOR):
                    q, s = reference(state[n].to(torch.bfloat16), n == PER_TENSOR)
                    assert torch.equal(back[n], raw(q)), \
                        f"step {step}: '{n}' differs from torch's float8_e4m3fn of the formula"
                    assert torch.equal(back[n + "_scale_inv"], raw(s)), \
                        f"step {step}: '{n}_scale_inv' differs from the formula's"
                    checked += 1
                print(f"step {step}: CUDA FP8 targets = CPU pull = torch float8_e4m3fn")
            # A NaN into an FP8 weight: refused, nothing written, step kept.
            before = {n: raw(t).clone() for n, t in gpu.items()}
            poisoned = {n: t.clone() for n, t in state.items()}
            poisoned[BLOCKED][200, 150] = float("nan")
            bad = pub.publish(poisoned)
            try:
                with torch.cuda.stream(stream):
                    sub_gpu.pull(gpu, timeout=60)
                raise AssertionError("a NaN went into a CUDA FP8 target")
            except pulse.Error as e:
                assert e.status == "PULSE_ERR_UNSUPPORTED", str(e)
            assert sub_gpu.step == bad - 1, f"step {sub_gpu.step} after a refused step {bad}"
            torch.cuda.synchronize(dev)
            for n, t in gpu.items():
                assert torch.equal(raw(t), before[n]), f"'{n}' changed by a refused step"
    print(f"fp8 pull: {checked} FP8 tensors bit-identical over 5 steps (amax up and down); "
          "a NaN refused, nothing written")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"fp8 pull: FAIL: {e}")
        sys.exit(1)
