"""Checks of the tensors given to the package and their raw views. Torch is
imported only when a tensor is seen, never at `import pulse`."""

from ._lib import DTYPE_BF16, DTYPE_F32, PULSE_MAX_DIMS, fail


def items(tensors, what):
    """(name, tensor) pairs from a mapping (state_dict) or an iterable of
    pairs (named_parameters())."""
    if hasattr(tensors, "items"):
        pairs = list(tensors.items())
    else:
        try:
            pairs = [tuple(p) for p in tensors]
        except TypeError:
            raise fail(f"{what}: a mapping or an iterable of (name, tensor) pairs expected") from None
    seen = set()
    for pair in pairs:
        if len(pair) != 2 or not isinstance(pair[0], str):
            raise fail(f"{what}: (name, tensor) pairs with str names expected")
        if pair[0] in seen:
            raise fail(f"{what}: tensor '{pair[0]}' given twice")
        seen.add(pair[0])
    return pairs


def _torch():
    import torch  # optional at import; needed once tensors are given

    return torch


def check(name, tensor, dtypes, what):
    """Returns (pulse dtype, is_cuda, shape) of a contiguous torch tensor
    whose dtype is among `dtypes` ("bf16", "f32"), else raises Error naming
    the tensor."""
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        raise fail(f"{what} '{name}': a torch.Tensor expected, not {type(tensor).__name__}")
    allowed = {"bf16": (torch.bfloat16, DTYPE_BF16), "f32": (torch.float32, DTYPE_F32)}
    code = None
    for key in dtypes:
        if tensor.dtype == allowed[key][0]:
            code = allowed[key][1]
    if code is None:
        want = " or ".join(str(allowed[k][0]) for k in dtypes)
        raise fail(f"{what} '{name}': dtype {tensor.dtype}, expected {want}", "PULSE_ERR_DTYPE")
    if not tensor.is_contiguous():
        raise fail(f"{what} '{name}': not contiguous (pass .contiguous() or a view that is)")
    if tensor.device.type not in ("cpu", "cuda"):
        raise fail(f"{what} '{name}': tensors on {tensor.device} are not supported")
    if tensor.dim() > PULSE_MAX_DIMS:
        raise fail(f"{what} '{name}': more than {PULSE_MAX_DIMS} dimensions")
    if tensor.dim() == 0 or tensor.numel() == 0:
        raise fail(f"{what} '{name}': empty or 0-dimensional tensor")
    return code, tensor.device.type == "cuda", tuple(int(s) for s in tensor.shape)


def current_stream(tensor):
    """The caller's current CUDA stream on the tensor's device (a handle)."""
    torch = _torch()
    return torch.cuda.current_stream(tensor.device).cuda_stream
