"""FP8 targets: an engine's FP8 weight (torch.float8_e4m3fn, or a uint8
tensor holding the E4M3FN bits where torch has no FP8) given with its
sibling `<name>_scale_inv` (FP32, the block grid [ceil(R/128), ceil(C/128)],
or [] / [1] for one scale per tensor) is kept equal, bit for bit, to the
reference block quantizer of the trainer's BF16 weights (codec/pulse_fp8.h):
amax per block, s = amax / 448 in FP32, q = E4M3FN(x / s) with ties to
even, saturating at 448.

The Subscriber keeps a BF16 shadow of each FP8 target (2 bytes a weight, on
the FP8 target's device: host memory, or the CUDA device of an FP8 target
and its scales there; the price of recomputing a block's amax without
asking the trainer), attaches the shadow where the FP8 target was (whole,
or, in host memory, through a pulse.Mapping as the engine fuses and shards
it) and binds it to the FP8 tensor and its scales (pulse_sub_bind_fp8): the
C library requantizes only the blocks each step touches, all or nothing
with the step (on a CUDA device, on the pull's stream, with 24 bytes of
device memory per scale block besides the shadow). Every check here runs
before the first C call, so a bad scale is refused before anything is
written."""

import ctypes

from ._lib import check, fail, lib

SCALE_BLOCK, SCALE_TENSOR = 1, 2  # pulse_fp8_scale
BLOCK = 128  # PULSE_FP8_BLOCK
SCALE_SUFFIX = "_scale_inv"


class FP8Tensor(ctypes.Structure):
    _c_name_ = "pulse_fp8_tensor"
    _fields_ = [("rows", ctypes.c_uint64), ("cols", ctypes.c_uint64), ("q", ctypes.c_void_p),
                ("scale_inv", ctypes.c_void_p), ("scale", ctypes.c_int)]


class FP8StageFigures(ctypes.Structure):
    _c_name_ = "pulse_fp8_stage_figures"
    _fields_ = [("changes", ctypes.c_uint64), ("blocks_touched", ctypes.c_uint64),
                ("blocks_rescanned", ctypes.c_uint64), ("blocks_rescaled", ctypes.c_uint64),
                ("elements_quantized", ctypes.c_uint64)]


_int, _p, _u64 = ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64
_PROTOS = {
    "pulse_sub_bind_fp8": (_int, [_p, _p, ctypes.POINTER(FP8Tensor)]),
    "pulse_fp8_quantize_ref": (_int, [_p, ctypes.POINTER(FP8Tensor), _int]),
    "pulse_fp8_track_create": (_int, [_p, ctypes.POINTER(FP8Tensor), _int, ctypes.POINTER(_p)]),
    "pulse_fp8_track_free": (None, [_p]),
    "pulse_fp8_track_stage": (_int, [_p, _p, _p, _u64, ctypes.POINTER(_p)]),
    "pulse_fp8_staged_commit": (None, [_p]),
    "pulse_fp8_staged_figures_get": (FP8StageFigures, [_p]),
    "pulse_fp8_staged_free": (None, [_p]),
}


def c(name):
    """The library's function `name` with its prototype set."""
    fn = getattr(lib, name)
    restype, argtypes = _PROTOS[name]
    fn.restype, fn.argtypes = restype, argtypes
    return fn


def _fp8_dtypes(torch):
    found = [torch.uint8]
    if hasattr(torch, "float8_e4m3fn"):
        found.append(torch.float8_e4m3fn)
    return found


def view_2d(shape):
    """(rows, cols) of a shape: shape[0] rows of the rest."""
    rows = shape[0]
    cols = 1
    for s in shape[1:]:
        cols *= s
    return rows, cols


class Binding:
    """One FP8 target: its FP8 tensor, scales, scale kind and BF16 shadow."""

    def __init__(self, name, q, scale, mode, shadow):
        self.name, self.q, self.scale, self.mode, self.shadow = name, q, scale, mode, shadow
        self.rows, self.cols = view_2d(tuple(q.shape))

    def key(self):
        return (self.name, self.q.data_ptr(), tuple(self.q.shape), self.scale.data_ptr(), self.mode)

    def tensor(self):
        return FP8Tensor(self.rows, self.cols, self.q.data_ptr(), self.scale.data_ptr(), self.mode)

    def bind(self, sub):
        status = c("pulse_sub_bind_fp8")(sub, self.shadow.data_ptr(), ctypes.byref(self.tensor()))
        if status != 0:
            check(status, f"FP8 target '{self.name}': "
                  + lib.pulse_sub_error(sub).decode(errors="replace"))


def _check_pair(name, q, scale, torch):
    """The scale kind of an FP8 target and its scale_inv, or Error."""
    sname = name + SCALE_SUFFIX
    if not isinstance(scale, torch.Tensor):
        raise fail(f"'{sname}': a torch.Tensor expected")
    for what, t in ((name, q), (sname, scale)):
        if t.device.type not in ("cpu", "cuda"):
            raise fail(f"FP8 target '{what}' is on {t.device}: host or CUDA memory only",
                       "PULSE_ERR_UNSUPPORTED")
        if not t.is_contiguous():
            raise fail(f"FP8 target '{what}': not contiguous")
    if scale.device != q.device:
        raise fail(f"'{sname}' is on {scale.device}, '{name}' on {q.device}: an FP8 target and "
                   "its scales must be on one device")
    if scale.dtype != torch.float32:
        raise fail(f"'{sname}': dtype {scale.dtype}, expected torch.float32", "PULSE_ERR_DTYPE")
    if q.dim() == 0 or q.numel() == 0:
        raise fail(f"FP8 target '{name}': empty or 0-dimensional")
    rows, cols = view_2d(tuple(q.shape))
    grid = [(rows + BLOCK - 1) // BLOCK, (cols + BLOCK - 1) // BLOCK]
    shape = list(scale.shape)
    if shape in ([], [1]):
        return SCALE_TENSOR
    if q.dim() == 2 and shape == grid:
        return SCALE_BLOCK
    want = f"{grid} (one per {BLOCK}x{BLOCK} block)" if q.dim() == 2 else "2-D weights only"
    raise fail(f"'{sname}' has shape {shape} for '{name}' of shape {list(q.shape)}: expected "
               f"{want}, or [] / [1] (one per tensor)", "PULSE_ERR_SIZE_MISMATCH")


def split(pairs, shadows):
    """Separates the FP8 targets from `pairs` ((name, tensor) as given):
    returns (pairs for the BF16 attach path, each FP8 target replaced by
    its shadow and each `_scale_inv` left out; [Binding]). `shadows` maps a
    Binding.key() to the shadow of the last attach, reused so that pulling
    into the same tensors again keeps the subscriber (and its step)."""
    given = dict(pairs)
    bf16_pairs, bindings = [], []
    torch = None
    for name, tensor in pairs:
        if torch is None and hasattr(tensor, "dtype"):
            import torch  # tensors were given: torch is there
        if name.endswith(SCALE_SUFFIX) and name[:-len(SCALE_SUFFIX)] in given:
            base = given[name[:-len(SCALE_SUFFIX)]]
            if torch is None or base.dtype not in _fp8_dtypes(torch):
                raise fail(f"'{name}' is given, but '{name[:-len(SCALE_SUFFIX)]}' is not an FP8 "
                           f"tensor (torch.uint8 or torch.float8_e4m3fn)", "PULSE_ERR_DTYPE")
            continue
        if torch is None or tensor.dtype not in _fp8_dtypes(torch):
            bf16_pairs.append((name, tensor))
            continue
        scale = given.get(name + SCALE_SUFFIX)
        if scale is None:
            if tensor.dtype == torch.uint8:  # not FP8: the BF16 check says why
                bf16_pairs.append((name, tensor))
                continue
            raise fail(f"FP8 target '{name}': its scales '{name}{SCALE_SUFFIX}' are not given")
        mode = _check_pair(name, tensor, scale, torch)
        binding = Binding(name, tensor, scale, mode, None)
        shadow = shadows.get(binding.key())
        if shadow is None:
            # Beside the FP8 target: a CUDA one is followed on its device.
            shadow = torch.zeros(tuple(tensor.shape), dtype=torch.bfloat16, device=tensor.device)
        binding.shadow = shadow
        bindings.append(binding)
        bf16_pairs.append((name, shadow))
    return bf16_pairs, bindings
