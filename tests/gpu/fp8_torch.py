"""FP8 targets on a real device (tests/gpu/check.sh, "fp8"): pulse's
device quantizer (pulse_cuda_fp8_quantize, cuda/fp8.cu) against PyTorch's
own float8_e4m3fn conversion, and the per-step requantization of only the
touched blocks (pulse_cuda_fp8_track) against requantizing every block.

1. torch: for several shapes (partial edge blocks, a zero block, outliers)
   and both scale layouts, the reference written with torch ops,
     s = amax / 448 in FP32 per 128 x 128 block (or per tensor; 1 when
         amax is 0),
     q = (x.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn),
   equals pulse's bytes and scales bit for bit.
2. timing: a model of TENSORS tensors of 4096 x 4096 BF16 weights with FP8
   copies (one scale per block); STEPS steps changing 1% of the weights by
   a few BF16 ulps. Per step, on the caller's stream: stage the changes,
   scatter them into the BF16 weights (torch), commit (touched blocks
   only); against: scatter, then pulse_cuda_fp8_quantize every tensor
   whole. Medians of the per-step times, and the two FP8 copies compared
   at the end (they must be identical).

Prints 'fp8 torch: ...' and 'fp8 timing: ...' lines that check.sh reads.
Usage: fp8_torch.py BUILD_DIR. Exit 0: both parts ran and passed; 1: a
difference or an error; 77: torch without CUDA, or no device (a skip)."""

import ctypes
import os
import statistics
import sys
import time

build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
TENSORS, SIDE, DENSITY, STEPS = 8, 4096, 0.01, 5

try:
    import torch
except ImportError:
    print("skipped: python3-torch is not installed")
    sys.exit(77)
if not torch.cuda.is_available():
    print("skipped: this torch has no CUDA device (torch.cuda.is_available() is False)")
    sys.exit(77)

lib = ctypes.CDLL(os.path.join(build, "libpulse.so"))
_p, _u64, _int = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int
SCALE_BLOCK, SCALE_TENSOR = 1, 2


class FP8Tensor(ctypes.Structure):  # pulse_cuda_fp8_tensor
    _fields_ = [("rows", _u64), ("cols", _u64), ("q_d", _p), ("scale_inv_d", _p),
                ("scale", _int)]


class Figures(ctypes.Structure):  # pulse_fp8_stage_figures
    _fields_ = [(n, _u64) for n in ("changes", "blocks_touched", "blocks_rescanned",
                                    "blocks_rescaled", "elements_quantized")]


for name, res, args in [
        ("pulse_cuda_available", _int, []),
        ("pulse_error_detail", ctypes.c_char_p, []),
        ("pulse_cuda_workspace_create", _int, [ctypes.POINTER(_p)]),
        ("pulse_cuda_workspace_free", None, [_p]),
        ("pulse_cuda_fp8_quantize", _int, [_p, _p, ctypes.POINTER(FP8Tensor), _p]),
        ("pulse_cuda_fp8_track_create", _int, [_p, ctypes.POINTER(FP8Tensor), _p,
                                               ctypes.POINTER(_p)]),
        ("pulse_cuda_fp8_track_free", None, [_p]),
        ("pulse_cuda_fp8_track_stage", _int, [_p, _p, _p, _u64, _p]),
        ("pulse_cuda_fp8_track_commit", _int, [_p, _p, ctypes.POINTER(Figures)])]:
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = res, args


def ok(status, what):
    if status != 0:
        raise RuntimeError(f"{what}: status {status}: {lib.pulse_error_detail().decode()}")


def stream():
    return torch.cuda.current_stream().cuda_stream


def fp8_of(x, scale):
    """A device FP8 tensor (q bytes, FP32 scales) for BF16 x."""
    rows, cols = x.shape
    grid = (-(-rows // 128), -(-cols // 128)) if scale == SCALE_BLOCK else (1,)
    q = torch.empty((rows, cols), dtype=torch.uint8, device=x.device)
    s = torch.empty(grid, dtype=torch.float32, device=x.device)
    return q, s, FP8Tensor(rows, cols, q.data_ptr(), s.data_ptr(), scale)


def torch_reference(x, scale):
    """q bytes and scales by torch ops alone (the issue's formula). The
    divisor 448 is a tensor: divided by a Python scalar, torch multiplies by
    its reciprocal, which is not the FP32 division."""
    rows, cols = x.shape
    xf = x.float()
    if scale == SCALE_TENSOR:
        amax = xf.abs().amax().reshape(1)
        s = torch.where(amax == 0, torch.ones_like(amax), amax / torch.full_like(amax, 448.0))
        sx = s.expand(rows, cols)
    else:
        gr, gc = -(-rows // 128), -(-cols // 128)
        pad = torch.zeros((gr * 128, gc * 128), dtype=torch.float32, device=x.device)
        pad[:rows, :cols] = xf.abs()
        amax = pad.view(gr, 128, gc, 128).amax(dim=(1, 3))
        s = torch.where(amax == 0, torch.ones_like(amax), amax / torch.full_like(amax, 448.0))
        sx = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
    q = (xf / sx).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    return q, s


def weights(rows, cols, gen):
    x = torch.randn((rows, cols), generator=gen, device="cuda") * 0.02
    outliers = torch.rand((rows, cols), generator=gen, device="cuda") < 1e-3
    x = torch.where(outliers, x * 300, x)
    x[: min(rows, 128), : min(cols, 128)] = 0  # a zero block
    if rows > 130 and cols > 3:
        x[130, 3] = -0.0
    return x.to(torch.bfloat16)


def part_torch():
    if not hasattr(torch, "float8_e4m3fn"):
        print(f"fp8 torch: skipped: torch {torch.__version__} has no float8_e4m3fn")
        return True
    gen = torch.Generator(device="cuda").manual_seed(1)
    shapes = [(4096, 4096), (1000, 3000), (257, 130), (1, 129), (128, 128)]
    bad, checked = [], 0
    for rows, cols in shapes:
        x = weights(rows, cols, gen)
        for scale in (SCALE_BLOCK, SCALE_TENSOR):
            q, s, t = fp8_of(x, scale)
            ok(lib.pulse_cuda_fp8_quantize(None, x.data_ptr(), ctypes.byref(t), stream()),
               "pulse_cuda_fp8_quantize")
            q_ref, s_ref = torch_reference(x, scale)
            torch.cuda.synchronize()
            checked += q.numel()
            if not torch.equal(s.view(torch.int32).reshape(-1),
                               s_ref.view(torch.int32).reshape(-1)):
                bad.append(f"{rows}x{cols} scale {scale}: scales differ")
            elif not torch.equal(q, q_ref):
                n = int((q != q_ref).sum())
                bad.append(f"{rows}x{cols} scale {scale}: {n} bytes differ")
    if bad:
        print("fp8 torch: FAIL: " + "; ".join(bad[:3]))
        return False
    print(f"fp8 torch: {len(shapes) * 2} tensors, {checked} bytes and their scales "
          f"identical to torch {torch.__version__} float8_e4m3fn")
    return True


def part_timing():
    gen = torch.Generator(device="cuda").manual_seed(2)
    a = [weights(SIDE, SIDE, gen) for _ in range(TENSORS)]
    b = [x.clone() for x in a]
    fa = [fp8_of(x, SCALE_BLOCK) for x in a]
    fb = [fp8_of(x, SCALE_BLOCK) for x in b]
    tracks = []
    for x, (_, _, t) in zip(a, fa):
        tr = _p()
        ok(lib.pulse_cuda_fp8_track_create(x.data_ptr(), ctypes.byref(t), stream(),
                                           ctypes.byref(tr)), "track create")
        tracks.append(tr)
    for x, (_, _, t) in zip(b, fb):
        ok(lib.pulse_cuda_fp8_quantize(None, x.data_ptr(), ctypes.byref(t), stream()),
           "quantize")
    ws = _p()  # the whole-tensor path's scratch, kept: it allocates nothing per call
    ok(lib.pulse_cuda_workspace_create(ctypes.byref(ws)), "workspace")
    numel, k = SIDE * SIDE, int(SIDE * SIDE * DENSITY)
    touched_ms, whole_ms, figs = [], [], Figures()
    try:
        for step in range(STEPS + 1):  # the first is a warm-up
            changes = []
            for x in a:
                pos = torch.randperm(numel, device="cuda", generator=gen)[:k]
                old = x.view(-1)[pos].view(torch.int16)
                moved = old + torch.randint(1, 3, (k,), device="cuda", generator=gen,
                                            dtype=torch.int16)
                new = torch.where((moved & 0x7F80) == 0x7F80, old ^ -0x8000, moved)
                changes.append((pos.contiguous(), new.view(torch.bfloat16).contiguous()))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for x, tr, (pos, new) in zip(a, tracks, changes):
                ok(lib.pulse_cuda_fp8_track_stage(tr, pos.data_ptr(), new.data_ptr(), k,
                                                  stream()), "stage")
                x.view(-1)[pos] = new
                ok(lib.pulse_cuda_fp8_track_commit(tr, stream(), None), "commit")
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            for x, (_, _, t), (pos, new) in zip(b, fb, changes):
                x.view(-1)[pos] = new
                ok(lib.pulse_cuda_fp8_quantize(ws, x.data_ptr(), ctypes.byref(t),
                                               stream()), "quantize")
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            if step > 0:
                touched_ms.append((t1 - t0) * 1e3)
                whole_ms.append((t2 - t1) * 1e3)
        # One more step with figures, on the first tensor alone.
        pos = torch.randperm(numel, device="cuda", generator=gen)[:k]
        new = (a[0].view(-1)[pos].view(torch.int16) ^ 0x0001).view(torch.bfloat16)
        ok(lib.pulse_cuda_fp8_track_stage(tracks[0], pos.data_ptr(), new.data_ptr(), k,
                                          stream()), "stage")
        a[0].view(-1)[pos] = new
        b[0].view(-1)[pos] = new
        ok(lib.pulse_cuda_fp8_track_commit(tracks[0], stream(), ctypes.byref(figs)),
           "commit")
        ok(lib.pulse_cuda_fp8_quantize(ws, b[0].data_ptr(), ctypes.byref(fb[0][2]),
                                       stream()), "quantize")
        torch.cuda.synchronize()
    finally:
        for tr in tracks:
            lib.pulse_cuda_fp8_track_free(tr)
        lib.pulse_cuda_workspace_free(ws)
    same = all(torch.equal(qa, qb) and torch.equal(sa.view(torch.int32), sb.view(torch.int32))
               for (qa, sa, _), (qb, sb, _) in zip(fa, fb))
    t, w = statistics.median(touched_ms), statistics.median(whole_ms)
    print(f"fp8 timing: {TENSORS} x {SIDE}x{SIDE} at {DENSITY:.0%}, median of {STEPS} steps: "
          f"touched blocks {t:.2f} ms, every block {w:.2f} ms a step (both with the BF16 "
          f"scatter); {figs.blocks_touched} blocks touched, {figs.blocks_rescanned} "
          f"rescanned, {figs.blocks_rescaled} rescaled in a 1% step of one tensor; "
          f"{'identical' if same else 'DIFFERENT'} FP8 copies")
    return same


def main():
    if not lib.pulse_cuda_available():
        print("FAIL: torch sees a device, libpulse does not")
        return 1
    good = part_torch()
    good = part_timing() and good
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
