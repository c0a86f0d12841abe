"""FP8 targets' requantization per step (pulse_fp8_track: only the blocks a
step touches; a block whose scale stays, only its changed elements)
against requantizing every FP8 target whole (pulse_fp8_quantize_ref), in
the same run over the same tensors.

    PULSE_LIBRARY=build/libpulse.so PYTHONPATH=python \\
        /usr/bin/python3 python/bench_fp8.py [--tensors 2] [--rows 4096]
        [--cols 4096] [--density 0.01] [--steps 7] [--threads 0]

Each step changes `density` of the BF16 weights by -3..+3 ulps (Adam at RL
learning rates) and, in a few blocks, the largest element up or down;
prints the medians of the staged-and-committed requantization and of the
whole requantization, their ratio, and what the steps touched."""

import argparse
import ctypes
import statistics
import time

import numpy as np

from pulse import fp8
from pulse._lib import check


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tensors", type=int, default=2)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(34)
    shape = (args.rows, args.cols)
    n = args.rows * args.cols
    x, q, s, tensors, tracks = [], [], [], [], []
    grid = (-(-args.rows // fp8.BLOCK), -(-args.cols // fp8.BLOCK))
    for _ in range(args.tensors):
        w = (rng.standard_normal(shape, dtype=np.float32) * 0.02).view(np.uint32)
        x.append(((w + 0x8000) >> 16).astype(np.uint16))  # BF16 bits
        q.append(np.zeros(shape, np.uint8))
        s.append(np.zeros(grid, np.float32))
        t = fp8.FP8Tensor(args.rows, args.cols, q[-1].ctypes.data, s[-1].ctypes.data,
                          fp8.SCALE_BLOCK)
        tensors.append(t)
        tr = ctypes.c_void_p()
        check(fp8.c("pulse_fp8_track_create")(x[-1].ctypes.data, ctypes.byref(t), args.threads,
                                              ctypes.byref(tr)))
        tracks.append(tr)
    stage, commit = fp8.c("pulse_fp8_track_stage"), fp8.c("pulse_fp8_staged_commit")
    figures, free = fp8.c("pulse_fp8_staged_figures_get"), fp8.c("pulse_fp8_staged_free")
    whole = fp8.c("pulse_fp8_quantize_ref")
    step_s, whole_s, fig = [], [], []
    for _ in range(args.steps):
        changes = []
        for k in range(args.tensors):
            off = np.unique(rng.integers(0, n, int(n * args.density), dtype=np.uint64))
            flat = x[k].reshape(-1)
            delta = rng.integers(-3, 4, off.size).astype(np.int32)
            new = ((flat[off].astype(np.int32) + delta) & 0xFFFF).astype(np.uint16)
            new = np.where((new & 0x7F80) == 0x7F80, flat[off], new).astype(np.uint16)
            changes.append((np.ascontiguousarray(off), np.ascontiguousarray(new)))
        t0 = time.perf_counter()
        staged = []
        for k, (off, new) in enumerate(changes):
            st = ctypes.c_void_p()
            check(stage(tracks[k], off.ctypes.data, new.ctypes.data, off.size, ctypes.byref(st)))
            staged.append(st)
        for st in staged:
            commit(st)
        step_s.append(time.perf_counter() - t0)
        f = [figures(st) for st in staged]
        fig.append([sum(getattr(g, name) for g in f) for name in
                    ("changes", "blocks_touched", "blocks_rescanned", "blocks_rescaled",
                     "elements_quantized")])
        for st in staged:
            free(st)
        for k, (off, new) in enumerate(changes):  # the subscriber's shadow write
            x[k].reshape(-1)[off] = new
        t0 = time.perf_counter()
        for k in range(args.tensors):
            check(whole(x[k].ctypes.data, ctypes.byref(tensors[k]), args.threads))
        whole_s.append(time.perf_counter() - t0)
    for tr in tracks:
        fp8.c("pulse_fp8_track_free")(tr)
    med = [statistics.median(c) for c in zip(*fig)]
    blocks = args.tensors * grid[0] * grid[1]
    print(f"fp8 requantization: {args.tensors} x {args.rows}x{args.cols} block-scaled targets "
          f"({blocks} blocks), density {args.density:.2%}, {args.steps} steps, threads {args.threads}")
    print(f"  per step (touched blocks): median {statistics.median(step_s) * 1e3:.2f} ms  "
          f"changes {med[0]:.0f}, blocks touched {med[1]:.0f}, rescanned {med[2]:.0f}, "
          f"rescaled {med[3]:.0f}, elements quantized {med[4]:.0f}")
    print(f"  every FP8 target whole:    median {statistics.median(whole_s) * 1e3:.2f} ms  "
          f"elements quantized {args.tensors * n}")
    print(f"  whole / per step: {statistics.median(whole_s) / statistics.median(step_s):.1f}x")


if __name__ == "__main__":
    main()
