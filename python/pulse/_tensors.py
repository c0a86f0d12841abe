"""Checks of the tensors given to the package and their raw views. Torch is
imported only when a tensor is seen, never at `import pulse`."""

from ._lib import DTYPE_BF16, DTYPE_F32, PULSE_MAX_DIMS, fail, lib


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


def require_cuda(name, what):
    """Raises Error unless libpulse can use CUDA now: PULSE_ERR_NOT_BUILT
    for a library built without CUDA, PULSE_ERR_CUDA when no device is
    usable, naming the tensor and the library's reason."""
    if lib.pulse_cuda_available():
        return
    reason = lib.pulse_cuda_unavailable_reason().decode(errors="replace")
    status = "PULSE_ERR_NOT_BUILT" if "without CUDA" in reason else "PULSE_ERR_CUDA"
    raise fail(f"{what} '{name}' is a CUDA tensor, and libpulse cannot use CUDA: {reason}", status)


def current_stream(tensor):
    """The caller's current CUDA stream on the tensor's device (a handle)."""
    torch = _torch()
    try:
        return torch.cuda.current_stream(tensor.device).cuda_stream
    except (AssertionError, RuntimeError) as exc:  # torch without CUDA, no such device
        raise fail(f"the current CUDA stream of {tensor.device}: {exc}", "PULSE_ERR_CUDA") from None


class StreamOrder:
    """Orders the library's work on `handle` (the stream it was given when
    created) after the caller's current stream of that device, and the
    caller's later work after it, when the caller has switched streams
    since (the library keeps the stream it was created with)."""

    def __init__(self, tensor, handle):
        self.tensor, self.handle, self.pair = tensor, handle, None

    def __enter__(self):
        if self.tensor is None:
            return self
        torch = _torch()
        current = torch.cuda.current_stream(self.tensor.device)
        if self.handle is None:  # pulse's own stream waits for no other
            current.synchronize()
        elif current.cuda_stream != self.handle:
            ours = torch.cuda.ExternalStream(self.handle, device=self.tensor.device)
            ours.wait_stream(current)
            self.pair = (current, ours)
        return self

    def __exit__(self, *exc):
        if self.pair is not None:
            self.pair[0].wait_stream(self.pair[1])


def wait_for(tensor, handle):
    """The caller's current stream of the tensor's device waits for the
    library's work on `handle` (follow: before the caller reads a step)."""
    if tensor is None or handle is None:
        return
    torch = _torch()
    current = torch.cuda.current_stream(tensor.device)
    if current.cuda_stream != handle:
        current.wait_stream(torch.cuda.ExternalStream(handle, device=tensor.device))
