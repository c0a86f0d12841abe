"""The collaboration (loco/pulse_loco_collab.h,
docs/protocols/loco-collaboration.md) as a transport of pulse.loco.DiLoCo:
peers of any speed, rounds that end at a target global batch, joining and
leaving at any round, no special peer.

    collab = pulse.loco.Collaboration(rank, 3, store, target_batch=3 * 8 * 64)
    outer = pulse.loco.DiLoCo(model.parameters(), transport=collab)
    def inner_step(samples):                # one local step of `samples`
        loss(model, batch(samples)).backward(); opt.step(); opt.zero_grad()
    while True:
        info = outer.step(samples=64, inner=inner_step)

A round runs inner_step as long as the round's writer grants steps (until
the round's samples, over all peers, reach target_batch); a fast peer runs
more steps than a slow one. The founding peers meet once through `store`
as for pulse.loco.Coordinator.
"""

import ctypes

from ._lib import KEY_BYTES, check, fail, figures_dict, lib
from .loco_member import (LocoAdmission, LocoMember, LocoMemberKey, Member, admission_of, count,
                          declare, ms)

__all__ = ["Collaboration"]

_CHECKS = {"rotating": 0, "full": 1, "receipts": 2}  # pulse_loco_collab_check


class LocoCollabOpts(ctypes.Structure):
    _c_name_ = "pulse_loco_collab_opts"
    _fields_ = [("struct_version", ctypes.c_uint32), ("target_batch", ctypes.c_uint64),
                ("claim_timeout_ms", ctypes.c_uint32), ("round_timeout_ms", ctypes.c_uint32),
                ("host", ctypes.c_char_p), ("port", ctypes.c_uint16),
                ("partitioned", ctypes.c_int),
                ("client_of", ctypes.c_char_p), ("partition_check", ctypes.c_int),
                ("equal_ranges", ctypes.c_int), ("sign_key", ctypes.c_void_p),
                ("member_keys", ctypes.POINTER(LocoMemberKey)),
                ("member_key_count", ctypes.c_size_t),
                ("admission", ctypes.POINTER(LocoAdmission))]


class LocoCollabFigures(ctypes.Structure):
    _c_name_ = "pulse_loco_collab_figures"
    _fields_ = [("round", ctypes.c_uint64), ("members", ctypes.c_uint32),
                ("contributors", ctypes.c_uint32), ("writer", ctypes.c_uint32),
                ("takeovers", ctypes.c_uint32), ("samples", ctypes.c_uint64),
                ("own_samples", ctypes.c_uint64), ("steps", ctypes.c_uint64),
                ("max_step", ctypes.c_uint64), ("self_included", ctypes.c_int),
                ("resynced", ctypes.c_int), ("dropped", ctypes.c_int), ("left", ctypes.c_int),
                ("partitioned", ctypes.c_int), ("bytes_in", ctypes.c_uint64),
                ("bytes_out", ctypes.c_uint64), ("payload_bytes", ctypes.c_uint64),
                ("busy_ms", ctypes.c_uint64), ("wall_ms", ctypes.c_uint64),
                ("auth_bytes", ctypes.c_uint64), ("sent", ctypes.c_uint64)]


StepFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float),
                          ctypes.c_uint64)

_p = ctypes.c_void_p
_PROTOS = {
    "pulse_loco_collab_opts_init": (None, [ctypes.POINTER(LocoCollabOpts)]),
    "pulse_loco_collab_create": (ctypes.c_int, [ctypes.POINTER(LocoCollabOpts), _p,
                                                ctypes.POINTER(_p)]),
    "pulse_loco_collab_free": (None, [_p]),
    "pulse_loco_collab_url": (ctypes.c_char_p, [_p]),
    "pulse_loco_collab_start": (ctypes.c_int, [_p, ctypes.POINTER(LocoMember),
                                               ctypes.c_size_t]),
    "pulse_loco_collab_join": (ctypes.c_int, [_p, ctypes.c_char_p, _p, ctypes.c_uint32]),
    "pulse_loco_collab_round": (ctypes.c_int, [_p, _p, ctypes.c_uint64, StepFn, _p,
                                               ctypes.c_uint32,
                                               ctypes.POINTER(LocoCollabFigures)]),
    "pulse_loco_collab_members": (None, [_p, ctypes.POINTER(LocoMember), ctypes.c_size_t,
                                         ctypes.POINTER(ctypes.c_size_t)]),
    "pulse_loco_collab_admit": (ctypes.c_int, [_p, ctypes.c_uint8 * KEY_BYTES, ctypes.c_uint64,
                                               ctypes.POINTER(LocoAdmission)]),
}


class Collaboration(Member):
    """The collaboration as a DiLoCo transport: this trainer's peer,
    options checked here before anything is sent. It needs DiLoCo's
    rule="keep" (its default under a Collaboration: a payload left out of
    a round stays in its sender's error feedback).

    trainer_id, trainers, store, seed_url, admission, host, port, key,
    member_keys and join_timeout as for pulse.loco.Coordinator: a joiner's
    key is in every member's member_keys, or it brings `admission` (the
    bytes a member's Collaboration.admit returned); a joiner pins the keys
    of the founders (or of its sponsor and its seed) in its member_keys.
    target_batch: the samples of a round over all peers. claim_timeout:
    seconds after which a writer that does not answer is taken for dead
    (the next one takes over). round_timeout: seconds the writer waits,
    once ready, for the other members (a later one is left out of the next
    round). partitioned: members reduce disjoint ranges instead of every
    member fetching every payload (the same bits). partition_check:
    "rotating", "full" or "receipts" (how the reduced ranges are checked).
    equal_ranges: equal ranges instead of ranges sized by download rate.
    client_of: the URL of a serving member that hosts this peer (a peer
    that cannot accept connections, so no port; not with partitioned)."""

    _what = "Collaboration"
    _c_url, _c_admit = "pulse_loco_collab_url", "pulse_loco_collab_admit"

    def __init__(self, trainer_id, trainers=None, store=None, *, target_batch, seed_url=None,
                 host=None, port=0, claim_timeout=5.0, round_timeout=30.0, partitioned=False,
                 partition_check="rotating", equal_ranges=False, client_of=None, key=None,
                 member_keys=None, join_timeout=60.0, admission=None):
        declare(_PROTOS)
        admission = admission_of(self._what, admission, seed_url)
        if partition_check not in _CHECKS:
            raise fail(f"Collaboration: partition_check {partition_check!r}: 'rotating', "
                       "'full' or 'receipts'")
        if client_of is not None and (not isinstance(client_of, str)
                                      or not client_of.startswith("http://")):
            raise fail(f"Collaboration: client_of {client_of!r} is not an http:// URL")
        if client_of is not None and partitioned:
            raise fail("Collaboration: a client-mode peer (client_of) cannot run partitioned")
        if client_of is not None and port != 0:
            raise fail("Collaboration: a client-mode peer (client_of) listens nowhere: no port")
        self._opts = LocoCollabOpts()
        lib.pulse_loco_collab_opts_init(ctypes.byref(self._opts))
        o = self._opts
        o.target_batch = count(target_batch, "target_batch", 1, 2 ** 64)
        o.claim_timeout_ms = ms(claim_timeout, "claim_timeout")
        o.round_timeout_ms = ms(round_timeout, "round_timeout")
        o.port = count(port, "port", 0, 2 ** 16)
        o.partitioned = 1 if partitioned else 0
        o.partition_check = _CHECKS[partition_check]
        o.equal_ranges = 1 if equal_ranges else 0
        self._client_of = client_of.encode() if client_of is not None else None
        o.client_of = self._client_of
        super().__init__(trainer_id, trainers, store, seed_url, key, member_keys, host,
                         join_timeout)
        self._fill_opts(o, admission)
        self.partitioned = bool(partitioned)

    # ------------------------------------------------- what DiLoCo calls
    def _open(self, ctx, theta, config):
        if config.get("rule") != "keep":
            raise fail("Collaboration: needs rule='keep' (a payload left out of a round "
                       "stays in its sender's error feedback)")
        peer = ctypes.c_void_p()
        check(lib.pulse_loco_collab_create(ctypes.byref(self._opts), ctx, ctypes.byref(peer)))
        self._handle = peer
        if self.seed_url is not None:
            check(lib.pulse_loco_collab_join(peer, self.seed_url.encode(),
                                             ctypes.c_void_p(theta.data_ptr()), self._join_ms))
        else:
            config = dict(config, partitioned=self.partitioned,
                          target_batch=self._opts.target_batch)
            self._found(ctx, theta, config, self.url,
                        lambda members, n: lib.pulse_loco_collab_start(peer, members, n))

    def _round(self, theta, step_samples, local_step, leaving):
        """One round; local_step(samples) runs one inner step on theta (the
        C library's theta_r). An exception there ends the round and is
        raised again here."""
        failures = []

        def trampoline(_user, theta_r, samples):
            try:
                if ctypes.addressof(theta_r.contents) != theta.data_ptr():
                    raise fail("Collaboration: the library stepped another buffer",
                               "PULSE_ERR_INTERNAL")
                local_step(int(samples))
                return 0
            except BaseException as exc:  # back to C as a failed step
                failures.append(exc)
                return 1

        callback = StepFn(trampoline)
        figures = LocoCollabFigures()
        status = lib.pulse_loco_collab_round(self._handle, ctypes.c_void_p(theta.data_ptr()),
                                             step_samples, callback, None,
                                             1 if leaving else 0, ctypes.byref(figures))
        if failures:
            raise failures[0]
        check(status)
        return figures_dict(figures)

    def _free_handle(self):
        lib.pulse_loco_collab_free(self._handle)

    # ---------------------------------------------------------------- API
    def members(self):
        """The members of the next round: {id: url}."""
        return self._members(lib.pulse_loco_collab_members)

