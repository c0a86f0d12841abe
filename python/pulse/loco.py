"""PULSELoCo from PyTorch: a DiLoCo-shaped outer optimizer whose trainers
exchange BF16-gated sparse pseudo-gradients with FP32 error feedback
(docs/formats/loco-payload.md).

    outer = pulse.loco.DiLoCo(model.parameters())   # torch.distributed group
    for round in range(R):
        for _ in range(H):
            loss(model, batch).backward(); inner.step(); inner.zero_grad()
        info = outer.step()                         # collective
        # every trainer's parameters now hold the same global weights

The gate, the error feedback, the payload coding and the outer Nesterov
step run in the C library (pulse_loco.h); Python only flattens the
parameters and moves the payloads. The transport is a torch.distributed
process group (gloo on CPU, NCCL on GPU): payloads travel as byte tensors
of their exact sizes. Parameters on a GPU are copied to the host for the
C context and back after each outer step.
"""

import ctypes

from ._lib import Error, check, fail, lib

__all__ = ["DiLoCo"]

_GATES = {"bf16": 0, "none": 1}  # pulse_loco_gate_mode
_RULES = {"drop": 0, "keep": 1}  # pulse_loco_rule
LEAVING = 1  # PULSE_LOCO_LEAVING


class LocoOpts(ctypes.Structure):
    _c_name_ = "pulse_loco_opts"
    _fields_ = [("struct_version", ctypes.c_uint32), ("param_count", ctypes.c_uint64),
                ("trainer_id", ctypes.c_uint32), ("alpha", ctypes.c_float),
                ("mu", ctypes.c_float), ("gate", ctypes.c_int), ("values", ctypes.c_int),
                ("pos_model", ctypes.c_int), ("chunk_log2", ctypes.c_uint32),
                ("rule", ctypes.c_int), ("gate_mean", ctypes.c_int)]


class LocoPrepareFigures(ctypes.Structure):
    _c_name_ = "pulse_loco_prepare_figures"
    _fields_ = [("round", ctypes.c_uint64), ("sent", ctypes.c_uint64),
                ("payload_bytes", ctypes.c_uint64)]


class LocoFinishFigures(ctypes.Structure):
    _c_name_ = "pulse_loco_finish_figures"
    _fields_ = [("round", ctypes.c_uint64), ("contributors", ctypes.c_uint32),
                ("self_included", ctypes.c_int), ("samples", ctypes.c_uint64),
                ("entries", ctypes.c_uint64)]


class LocoContribution(ctypes.Structure):
    _c_name_ = "pulse_loco_contribution"
    _fields_ = [("data", ctypes.c_void_p), ("size", ctypes.c_size_t)]


_p = ctypes.c_void_p
_PROTOS = {
    "pulse_loco_opts_init": (None, [ctypes.POINTER(LocoOpts)]),
    "pulse_loco_create": (ctypes.c_int, [ctypes.POINTER(LocoOpts), _p, ctypes.POINTER(_p)]),
    "pulse_loco_free": (None, [_p]),
    "pulse_loco_round": (ctypes.c_uint64, [_p]),
    "pulse_loco_global_digest": (ctypes.c_uint64, [_p]),
    "pulse_loco_prepare": (ctypes.c_int, [_p, _p, ctypes.c_uint64, ctypes.c_uint32,
                                          ctypes.POINTER(_p), ctypes.POINTER(ctypes.c_size_t),
                                          ctypes.POINTER(LocoPrepareFigures)]),
    "pulse_loco_finish": (ctypes.c_int, [_p, ctypes.POINTER(LocoContribution), ctypes.c_size_t,
                                         _p, ctypes.POINTER(LocoFinishFigures)]),
    "pulse_loco_abandon": (ctypes.c_int, [_p, ctypes.c_int]),
}
_declared = False


def _declare():
    global _declared
    if not _declared:
        for name, (restype, argtypes) in _PROTOS.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _declared = True


def _torch():
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise fail("pulse.loco needs torch (python3-torch)", "PULSE_ERR_NOT_BUILT") from None
    return torch, dist


class DiLoCo:
    """One trainer's outer optimizer over `params` (FP32 tensors,
    contiguous, all on one device), collective over `group` (a
    torch.distributed process group; None: the default group, or a single
    trainer when torch.distributed is not initialized).

    At construction the trainers agree on the parameter count (a trainer
    with another count raises pulse.Error on every trainer) and start from
    rank 0's parameters (broadcast), so that theta_g is the same everywhere.
    `gate="bf16"` is PULSELoCo, `gate="none"` dense DiLoCo (the baseline,
    the same code path). `alpha` and `mu` are the outer Nesterov step's.
    `rule` is the loss rule ("drop" or "keep"; nothing is lost over a
    torch.distributed group, so both give the same result there).

    `transport` chooses the exchange: None or "torch" (the group). The
    project's own exchanges across sites (the coordinator exchange and the
    collaboration, pulse_loco_coord.h and pulse_loco_collab.h) are not yet
    reachable from Python: asking for them is a pulse.Error."""

    def __init__(self, params, group=None, alpha=0.7, mu=0.9, gate="bf16", transport=None,
                 rule="drop"):
        torch, dist = _torch()
        if transport not in (None, "torch"):
            raise fail(f"transport {transport!r}: only a torch.distributed group (None or "
                       "'torch') is reachable from Python yet", "PULSE_ERR_NOT_BUILT")
        if gate not in _GATES:
            raise fail(f"gate {gate!r}: 'bf16' or 'none'")
        if rule not in _RULES:
            raise fail(f"rule {rule!r}: 'drop' or 'keep'")
        self.params = list(params)
        if not self.params:
            raise fail("no parameters")
        device = self.params[0].device
        for i, p in enumerate(self.params):
            if not isinstance(p, torch.Tensor):
                raise fail(f"parameter {i} is not a torch.Tensor")
            if p.dtype != torch.float32:
                raise fail(f"parameter {i} is {p.dtype}; PULSELoCo keeps FP32 parameters "
                           "(the BF16 gate needs the master weights)")
            if not p.is_contiguous():
                raise fail(f"parameter {i} (shape {tuple(p.shape)}) is not contiguous")
            if p.device != device:
                raise fail(f"parameter {i} is on {p.device}, parameter 0 on {device}")
        self._torch, self._dist = torch, dist
        self.group = group
        self.distributed = dist.is_available() and dist.is_initialized()
        if group is not None and not self.distributed:
            raise fail("a group was given but torch.distributed is not initialized")
        self.world = dist.get_world_size(group) if self.distributed else 1
        self.rank = dist.get_rank(group) if self.distributed else 0
        self.param_count = sum(p.numel() for p in self.params)
        if self.param_count > (1 << 36):
            raise fail(f"{self.param_count} parameters: at most 2^36")
        counts = self._gather_ints(self.param_count)
        if len(set(counts)) != 1:
            raise fail("trainers disagree on the parameter count: "
                       + ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts)))
        theta = self._flatten()
        if self.world > 1:
            self._exchange_call(lambda: dist.broadcast(theta, src=self._global(0), group=group))
            self._unflatten(theta)
        _declare()
        opts = LocoOpts()
        lib.pulse_loco_opts_init(ctypes.byref(opts))
        opts.param_count = self.param_count
        opts.trainer_id = self.rank
        opts.alpha = alpha
        opts.mu = mu
        opts.gate = _GATES[gate]
        opts.rule = _RULES[rule]
        self._ctx = ctypes.c_void_p()
        check(lib.pulse_loco_create(ctypes.byref(opts), ctypes.c_void_p(theta.data_ptr()),
                                    ctypes.byref(self._ctx)))
        self.gate = gate

    # ------------------------------------------------------------ helpers
    def _global(self, rank):
        if self.group is None:
            return rank
        return self._dist.get_global_rank(self.group, rank)

    def _exchange_call(self, fn):
        try:
            return fn()
        except Exception as exc:  # gloo/NCCL: a peer died, a timeout
            raise Error("PULSE_ERR_IO", f"trainer exchange over torch.distributed failed: "
                        f"{exc}") from exc

    def _gather_ints(self, value):
        torch, dist = self._torch, self._dist
        if self.world == 1:
            return [value]
        mine = torch.tensor([value], dtype=torch.int64)
        out = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        self._exchange_call(lambda: dist.all_gather(out, mine, group=self.group))
        return [int(t.item()) for t in out]

    def _flatten(self):
        torch = self._torch
        with torch.no_grad():
            return torch.cat([p.detach().reshape(-1).to("cpu") for p in self.params]).contiguous()

    def _unflatten(self, theta):
        torch = self._torch
        at = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(theta[at:at + n].view_as(p))
                at += n

    # ---------------------------------------------------------------- API
    @property
    def round(self):
        """The round the next step() runs (rounds finished so far)."""
        return int(lib.pulse_loco_round(self._ctx))

    def global_digest(self):
        """64-bit digest of theta_g's bits: equal on every trainer."""
        return int(lib.pulse_loco_global_digest(self._ctx))

    def step(self, samples=1, leaving=False):
        """One outer step, collective over the group: pseudo-gradient
        against theta_g, the gate, error feedback, the exchange, the mean
        (weighted by each trainer's `samples`), the Nesterov step; then
        every trainer's parameters hold theta_g. Returns a dict: round,
        payload_bytes (this trainer's payload), bytes_sent (its payload
        times the other trainers), bytes_received (the others' payloads),
        entries (sent by this trainer), density (entries / parameters),
        contributors, samples. On a failed exchange the round is abandoned
        (the error feedback keeps what this trainer sent), the parameters
        are left as they were, and pulse.Error is raised."""
        torch, dist = self._torch, self._dist
        if self._ctx is None:
            raise fail("the optimizer is closed")
        if samples < 1:
            raise fail(f"samples {samples}: at least 1")
        theta = self._flatten()
        payload = ctypes.c_void_p()
        size = ctypes.c_size_t()
        prep = LocoPrepareFigures()
        check(lib.pulse_loco_prepare(self._ctx, ctypes.c_void_p(theta.data_ptr()), samples,
                                     LEAVING if leaving else 0, ctypes.byref(payload),
                                     ctypes.byref(size), ctypes.byref(prep)))
        own = torch.frombuffer(bytearray(ctypes.string_at(payload.value, size.value)),
                               dtype=torch.uint8) \
            if size.value else torch.zeros(0, dtype=torch.uint8)
        try:
            sizes = self._gather_ints(size.value)
            bufs = []
            for r in range(self.world):
                if r == self.rank:
                    bufs.append(own)
                    continue
                buf = torch.empty(sizes[r], dtype=torch.uint8)
                bufs.append(buf)
            for r in range(self.world):
                if self.world > 1:
                    self._exchange_call(lambda r=r: dist.broadcast(
                        bufs[r], src=self._global(r), group=self.group))
        except Error:
            lib.pulse_loco_abandon(self._ctx, 0)
            raise
        contributions = (LocoContribution * self.world)()
        for r, buf in enumerate(bufs):
            contributions[r].data = buf.data_ptr() if buf.numel() else None
            contributions[r].size = buf.numel()
        done = LocoFinishFigures()
        check(lib.pulse_loco_finish(self._ctx, contributions, self.world,
                                    ctypes.c_void_p(theta.data_ptr()), ctypes.byref(done)))
        self._unflatten(theta)
        received = sum(s for r, s in enumerate(sizes) if r != self.rank)
        return {
            "round": int(done.round),
            "payload_bytes": int(size.value),
            "bytes_sent": int(size.value) * (self.world - 1),
            "bytes_received": int(received),
            "entries": int(prep.sent),
            "density": prep.sent / self.param_count,
            "contributors": int(done.contributors),
            "samples": int(done.samples),
        }

    def close(self):
        """Frees the C context (also when collected)."""
        if getattr(self, "_ctx", None):
            lib.pulse_loco_free(self._ctx)
        self._ctx = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
