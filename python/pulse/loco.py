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
process group (gloo on CPU, NCCL on GPU: payloads travel as byte tensors
of their exact sizes), or the project's own exchanges for trainers across
the internet: the coordinator exchange (pulse.loco.Coordinator,
pulse_loco_coord.h: HTTP or datagrams, joining and leaving,
authentication) and the collaboration (pulse.loco.Collaboration,
pulse_loco_collab.h: peers of any speed, rounds of a target global
batch). The C context works on host memory (the library has no device
PULSELoCo context, only the device gate): parameters on a GPU are copied
to the host for each outer step and the new global weights copied back;
under a Collaboration, whose round runs the local steps, also around each
local step.
"""

import ctypes

from ._lib import Error, check, fail, lib
from .loco_collab import Collaboration
from .loco_coord import Coordinator
from .loco_group import TorchGroup
from .loco_member import new_key

__all__ = ["Collaboration", "Coordinator", "DiLoCo", "new_key"]

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
    contiguous, all on one device), collective over its transport.

    `transport` chooses the exchange. None or "torch": the torch.distributed
    process group `group` (None: the default group, or a single trainer
    when torch.distributed is not initialized); at construction the
    trainers agree on the parameter count (a trainer with another count
    raises pulse.Error on every trainer) and start from rank 0's
    parameters (broadcast). A pulse.loco.Coordinator or
    pulse.loco.Collaboration: the project's exchanges; the founding
    trainers start from trainer 0's state (a trainer whose count, alpha,
    mu, gate, rule or exchange settings differ raises pulse.Error on every
    trainer, before any payload), a joiner from the group's.

    `gate="bf16"` is PULSELoCo, `gate="none"` dense DiLoCo (the baseline,
    the same code path). `alpha` and `mu` are the outer Nesterov step's.
    `rule` is the loss rule for contributions that do not arrive ("drop"
    or "keep", docs/formats/loco-payload.md "Loss rules"; None: "keep"
    under a Collaboration, which needs it, else "drop"; over a
    torch.distributed group nothing is lost, so both give the same result
    there; datagrams need "drop")."""

    def __init__(self, params, group=None, alpha=0.7, mu=0.9, gate="bf16", transport=None,
                 rule=None):
        torch, dist = _torch()
        self._ctx = None
        self._member = transport if isinstance(transport, (Coordinator, Collaboration)) \
            else None
        if transport not in (None, "torch") and self._member is None:
            raise fail(f"transport {transport!r}: None or 'torch' (a torch.distributed group), "
                       "a pulse.loco.Coordinator or a pulse.loco.Collaboration")
        if self._member is not None and group is not None:
            raise fail("group= is for the torch.distributed transport, not "
                       f"{type(transport).__name__}")
        if gate not in _GATES:
            raise fail(f"gate {gate!r}: 'bf16' or 'none'")
        if rule is None:
            rule = "keep" if isinstance(transport, Collaboration) else "drop"
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
        self.param_count = sum(p.numel() for p in self.params)
        if self.param_count > (1 << 36):
            raise fail(f"{self.param_count} parameters: at most 2^36")
        self.gate = gate
        if self._member is not None:
            self._open_member(alpha, mu, rule)
        else:
            self._open_group(alpha, mu, rule)

    def _create(self, trainer_id, alpha, mu, rule, theta):
        _declare()
        opts = LocoOpts()
        lib.pulse_loco_opts_init(ctypes.byref(opts))
        opts.param_count = self.param_count
        opts.trainer_id = trainer_id
        opts.alpha = alpha
        opts.mu = mu
        opts.gate = _GATES[self.gate]
        opts.rule = _RULES[rule]
        ctx = ctypes.c_void_p()
        check(lib.pulse_loco_create(ctypes.byref(opts), ctypes.c_void_p(theta.data_ptr()),
                                    ctypes.byref(ctx)))
        self._ctx = ctx

    def _open_group(self, alpha, mu, rule):
        self._group = TorchGroup(self._torch, self._dist, self.group)
        self._group.agree(self.param_count)
        theta = self._flatten()
        self._group.broadcast_start(theta)
        self._unflatten(theta)
        self._create(self._group.rank, alpha, mu, rule, theta)

    def _open_member(self, alpha, mu, rule):
        member = self._member
        theta = self._flatten()
        self._create(member.trainer_id, alpha, mu, rule, theta)
        config = {"param_count": self.param_count, "alpha": float(ctypes.c_float(alpha).value),
                  "mu": float(ctypes.c_float(mu).value), "gate": self.gate, "rule": rule}
        try:
            member._open(self._ctx, theta, config)
        except Exception:
            self.close()
            raise
        self._unflatten(theta)

    # ------------------------------------------------------------ helpers
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
    def _live(self):
        if self._ctx is None:
            raise fail("the optimizer is closed")
        return self._ctx

    @property
    def round(self):
        """The round the next step() runs (rounds finished so far)."""
        return int(lib.pulse_loco_round(self._live()))

    def global_digest(self):
        """64-bit digest of theta_g's bits: equal on every trainer."""
        return int(lib.pulse_loco_global_digest(self._live()))

    def step(self, samples=1, leaving=False, inner=None):
        """One outer step, collective over the trainers: pseudo-gradient
        against theta_g, the gate, error feedback, the exchange, the mean
        (weighted by each trainer's samples), the Nesterov step; then
        every trainer's parameters hold theta_g. `samples`: this trainer's
        sample weight; under a Collaboration, the samples of each local
        step, and `inner` (required there, refused elsewhere) is called as
        inner(samples) for each local step the round's writer grants: one
        step of the inner optimizer on the parameters, in place.

        Returns a dict: round, payload_bytes (this trainer's payload),
        bytes_sent and bytes_received (over a group: the payloads handed to
        it and received from it; over a Coordinator: the exchange's
        bytes_sent, the HTTP bodies this node's server answered since the
        last step and the datagrams it sent, and fetched_bytes, the HTTP
        bodies it fetched and the datagrams it received; over a
        Collaboration: the HTTP bodies its server answered and it fetched
        in the round), entries (sent by this trainer: the entries of its
        payload), density (entries / parameters), contributors; over a group also
        samples; over a Coordinator or a Collaboration also members,
        self_included, resynced and `exchange`, every figure of the C
        step (pulse_loco_coord_step_figures, pulse_loco_collab_figures),
        over a Coordinator also coordinator and rejoined (the step only
        joined again: no round ran), over a Collaboration samples (the
        round's, all peers), steps (this trainer's) and left. On a failed
        exchange the parameters are left as they were and pulse.Error is
        raised (over a group the round is abandoned: the error feedback
        keeps what this trainer sent).

        leaving=True (not over a torch.distributed group, where every rank
        runs every round): this trainer's last round; it flushes its
        residual and leaves."""
        self._live()
        if not isinstance(samples, int) or samples < 1:
            raise fail(f"samples {samples!r}: an integer, at least 1")
        collab = isinstance(self._member, Collaboration)
        if collab and not callable(inner):
            raise fail("a Collaboration's step runs the local steps: inner= a function of "
                       "the samples of one step")
        if inner is not None and not collab:
            raise fail("inner= is for a Collaboration's step (elsewhere the loop runs the "
                       "local steps before step())")
        if collab:
            return self._step_collaboration(samples, leaving, inner)
        if self._member is not None:
            return self._step_coordinator(samples, leaving)
        if leaving:
            raise fail("leaving: a torch.distributed group has no leaving (every rank runs "
                       "every round); leave with a Coordinator or a Collaboration",
                       "PULSE_ERR_UNSUPPORTED")
        return self._step_group(samples)

    def _step_collaboration(self, samples, leaving, inner):
        theta = self._flatten()

        def local_step(n):  # theta is the library's theta_r
            self._unflatten(theta)
            inner(n)
            theta.copy_(self._flatten())

        figures = self._member._round(theta, samples, local_step, leaving)
        self._unflatten(theta)
        return {
            "round": figures["round"],
            "payload_bytes": figures["payload_bytes"],
            "bytes_sent": figures["bytes_out"],
            "bytes_received": figures["bytes_in"],
            "entries": figures["sent"],
            "density": figures["sent"] / self.param_count,
            "contributors": figures["contributors"],
            "members": figures["members"],
            "self_included": bool(figures["self_included"]),
            "resynced": bool(figures["resynced"]),
            "samples": figures["samples"],
            "steps": figures["steps"],
            "left": bool(figures["left"]),
            "exchange": figures,
        }

    def _step_coordinator(self, samples, leaving):
        theta = self._flatten()
        figures = self._member._step(theta, samples, leaving)
        self._unflatten(theta)
        return {
            "round": figures["round"],
            "payload_bytes": figures["payload_bytes"],
            "bytes_sent": figures["bytes_sent"],
            "bytes_received": figures["fetched_bytes"],
            "entries": figures["sent"],
            "density": figures["sent"] / self.param_count,
            "contributors": figures["contributors"],
            "members": figures["members"],
            "coordinator": figures["coordinator"],
            "self_included": bool(figures["self_included"]),
            "resynced": bool(figures["resynced"]),
            "rejoined": bool(figures["rejoined"]),
            "exchange": figures,
        }

    def _step_group(self, samples):
        torch, group = self._torch, self._group
        theta = self._flatten()
        payload = ctypes.c_void_p()
        size = ctypes.c_size_t()
        prep = LocoPrepareFigures()
        check(lib.pulse_loco_prepare(self._ctx, ctypes.c_void_p(theta.data_ptr()), samples, 0,
                                     ctypes.byref(payload), ctypes.byref(size),
                                     ctypes.byref(prep)))
        own = torch.frombuffer(bytearray(ctypes.string_at(payload.value, size.value)),
                               dtype=torch.uint8) \
            if size.value else torch.zeros(0, dtype=torch.uint8)
        try:
            bufs = group.exchange(own)
        except Error:
            lib.pulse_loco_abandon(self._ctx, 0)
            raise
        contributions = (LocoContribution * group.world)()
        for r, buf in enumerate(bufs):
            contributions[r].data = buf.data_ptr() if buf.numel() else None
            contributions[r].size = buf.numel()
        done = LocoFinishFigures()
        check(lib.pulse_loco_finish(self._ctx, contributions, group.world,
                                    ctypes.c_void_p(theta.data_ptr()), ctypes.byref(done)))
        self._unflatten(theta)
        received = sum(b.numel() for r, b in enumerate(bufs) if r != group.rank)
        return {
            "round": int(done.round),
            "payload_bytes": int(size.value),
            "bytes_sent": int(size.value) * (group.world - 1),
            "bytes_received": int(received),
            "entries": int(prep.sent),
            "density": prep.sent / self.param_count,
            "contributors": int(done.contributors),
            "samples": int(done.samples),
        }

    def close(self):
        """Frees the C context and stops a Coordinator's or Collaboration's
        server (also when collected). A Coordinator's trainer calls transport.linger() first
        when the run ends (see Coordinator.linger)."""
        if getattr(self, "_member", None) is not None:
            self._member.close()  # it borrows the context: first
        if getattr(self, "_ctx", None):
            lib.pulse_loco_free(self._ctx)
        self._ctx = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
