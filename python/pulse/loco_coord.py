"""The coordinator exchange (loco/pulse_loco_coord.h,
docs/protocols/loco-exchange.md) as a transport of pulse.loco.DiLoCo:
trainers across the internet, each with its own small HTTP server, run
rounds in step through the round's coordinator (the lowest member id);
contributions over HTTP or as datagrams.

    store = torch.distributed.TCPStore("10.0.0.1", 29500, 3, rank == 0)
    coord = pulse.loco.Coordinator(trainer_id=rank, trainers=3, store=store,
                                   host="10.0.0.7", key="me.pem",
                                   member_keys={0: "ab12...", 1: ..., 2: ...})
    outer = pulse.loco.DiLoCo(model.parameters(), transport=coord)

The founding trainers meet once through `store` (a torch.distributed
Store: TCPStore, FileStore, ...): each publishes its node's URL, and all
load trainer 0's state (theta_g, alpha, mu) so that they start from the
same global weights. No payload goes through the store. A trainer that
comes later joins through any member's URL instead (`seed_url`).
"""

import ctypes
import urllib.request

from ._lib import Error, KEY_BYTES, check, fail, figures_dict, lib
from .loco_member import (LocoAdmission, LocoMember, LocoMemberKey, Member, admission_of, count,
                          declare, ms)

__all__ = ["Coordinator"]

_AUTH = {"auto": 0, "on": 1, "off": 2}  # pulse_loco_auth_mode
_TRANSPORT_HTTP, _TRANSPORT_UDP = 0, 1  # pulse_loco_transport


class LocoAuthFigures(ctypes.Structure):
    _c_name_ = "pulse_loco_auth_figures"
    _fields_ = [(name, ctypes.c_uint64) for name in
                ("accepted", "unsigned_bodies", "forged", "replayed", "foreign", "admitted")]


class LocoInboxFigures(ctypes.Structure):
    _c_name_ = "pulse_loco_inbox_figures"
    _fields_ = [(name, ctypes.c_uint64) for name in
                ("accepted", "truncated", "bad_checksum", "malformed", "unknown_sender",
                 "other_round", "other_base", "duplicate")]


class LocoCoordOpts(ctypes.Structure):
    _c_name_ = "pulse_loco_coord_opts"
    _fields_ = [("struct_version", ctypes.c_uint32), ("deadline_ms", ctypes.c_uint32),
                ("manifest_timeout_ms", ctypes.c_uint32), ("max_misses", ctypes.c_uint32),
                ("transport", ctypes.c_int), ("max_datagram", ctypes.c_uint32),
                ("quiet_ms", ctypes.c_uint32), ("resync_range", ctypes.c_uint32),
                ("resync_period", ctypes.c_uint32), ("drift_budget", ctypes.c_double),
                ("host", ctypes.c_char_p), ("port", ctypes.c_uint16),
                ("udp_port", ctypes.c_uint16), ("sign_key", ctypes.c_void_p),
                ("member_keys", ctypes.POINTER(LocoMemberKey)),
                ("member_key_count", ctypes.c_size_t), ("auth", ctypes.c_int),
                ("admission", ctypes.POINTER(LocoAdmission)), ("test_hooks", ctypes.c_void_p)]


class LocoCoordStepFigures(ctypes.Structure):
    _c_name_ = "pulse_loco_coord_step_figures"
    _fields_ = [("round", ctypes.c_uint64), ("members", ctypes.c_uint32),
                ("contributors", ctypes.c_uint32), ("coordinator", ctypes.c_uint32),
                ("self_included", ctypes.c_int), ("resynced", ctypes.c_int),
                ("sent", ctypes.c_uint64), ("payload_bytes", ctypes.c_uint64),
                ("fetched_bytes", ctypes.c_uint64), ("rejoined", ctypes.c_int),
                ("datagrams_sent", ctypes.c_uint64), ("datagrams_dropped", ctypes.c_uint64),
                ("datagrams_received", ctypes.c_uint64),
                ("datagrams_refused_source", ctypes.c_uint64),
                ("datagrams_early", ctypes.c_uint64), ("chunks", LocoInboxFigures),
                ("drift", ctypes.c_double), ("drift_ranges", ctypes.c_uint32),
                ("resynced_ranges", ctypes.c_uint32), ("resync_bytes", ctypes.c_uint64),
                ("wait_ms", ctypes.c_uint64), ("auth", LocoAuthFigures),
                ("datagrams_refused_auth", ctypes.c_uint64), ("auth_bytes", ctypes.c_uint64),
                ("bytes_sent", ctypes.c_uint64)]


_p = ctypes.c_void_p
_PROTOS = {
    "pulse_loco_coord_opts_init": (None, [ctypes.POINTER(LocoCoordOpts)]),
    "pulse_loco_coord_create": (ctypes.c_int, [ctypes.POINTER(LocoCoordOpts), _p,
                                               ctypes.POINTER(_p)]),
    "pulse_loco_coord_free": (None, [_p]),
    "pulse_loco_coord_url": (ctypes.c_char_p, [_p]),
    "pulse_loco_coord_start": (ctypes.c_int, [_p, ctypes.POINTER(LocoMember), ctypes.c_size_t]),
    "pulse_loco_coord_admit": (ctypes.c_int, [_p, ctypes.c_uint8 * KEY_BYTES, ctypes.c_uint64,
                                              ctypes.POINTER(LocoAdmission)]),
    "pulse_loco_coord_join": (ctypes.c_int, [_p, ctypes.c_char_p, _p, ctypes.c_uint32]),
    "pulse_loco_coord_step": (ctypes.c_int, [_p, _p, ctypes.c_uint64, ctypes.c_uint32,
                                             ctypes.POINTER(LocoCoordStepFigures)]),
    "pulse_loco_coord_linger": (ctypes.c_int, [_p, ctypes.c_uint32]),
    "pulse_loco_coord_members": (None, [_p, ctypes.POINTER(LocoMember), ctypes.c_size_t,
                                        ctypes.POINTER(ctypes.c_size_t)]),
}


class Coordinator(Member):
    """The coordinator exchange as a DiLoCo transport: this trainer's
    member, options checked here before anything is sent.

    trainer_id: unique in the run. Founding: `trainers` founding members
    with ids 0..trainers-1 meet through `store` (a torch.distributed Store
    shared by them; keys under "pulse-loco/"): trainer 0's state is the
    start. Joining a running group instead: `seed_url` (any member's URL),
    with `admission` (from a member's Coordinator.admit) when this key is
    not pinned. host: the IPv4 address this node listens on and the others
    reach (None: 127.0.0.1); port: the TCP port of its HTTP server there
    (0: a free one, which `url` names; a port that is taken raises
    pulse.Error PULSE_ERR_IO). datagrams: contributions as UDP datagrams,
    all to all, no retransmission (drop rule only; the manifest, joins and
    re-syncs stay on HTTP). deadline: seconds the coordinator waits for
    the members' payloads after its own is ready (a late member is left
    out of the round); manifest_timeout: seconds a member waits for the
    manifest and each payload before it gives the round up (its step then
    raises pulse.Error); max_misses: missed rounds before the coordinator
    drops a member (it joins again by itself). Datagrams only (None: the
    library's default): max_datagram, the largest datagram in bytes;
    quiet, seconds without a new datagram after which a receiver that
    heard from every sender stops waiting; udp_port, the port of the
    datagram socket (0: a free one); resync_range (parameters, a
    multiple of 128), resync_period (rounds) and drift_budget: how the
    replicas' drift is checked and repaired (pulse_loco_coord.h).
    key: this trainer's Ed25519
    key file (PKCS#8 PEM, pulse.loco.new_key); member_keys: {id: 64 hex
    digits} of the pinned members; auth: "auto" (on with a key), "on"
    (refuse to start without a key) or "off" (comparisons only). join_timeout:
    seconds for the founding meeting or the join."""

    _what = "Coordinator"
    _c_url, _c_admit = "pulse_loco_coord_url", "pulse_loco_coord_admit"

    def __init__(self, trainer_id, trainers=None, store=None, *, seed_url=None, admission=None,
                 host=None, port=0, datagrams=False, deadline=2.0, manifest_timeout=10.0,
                 max_misses=3, max_datagram=None, quiet=None, udp_port=None,
                 resync_range=None, resync_period=None,
                 drift_budget=None, key=None, member_keys=None, auth="auto", join_timeout=60.0):
        declare(_PROTOS)
        admission = admission_of(self._what, admission, seed_url)
        if auth not in _AUTH:
            raise fail(f"Coordinator: auth {auth!r}: 'auto', 'on' or 'off'")
        if auth == "on" and key is None:
            raise fail("Coordinator: auth='on' needs key= (this trainer's key file)")
        self._opts = LocoCoordOpts()
        lib.pulse_loco_coord_opts_init(ctypes.byref(self._opts))
        o = self._opts
        o.deadline_ms = ms(deadline, "deadline")
        o.manifest_timeout_ms = ms(manifest_timeout, "manifest_timeout")
        o.max_misses = count(max_misses, "max_misses")
        o.port = count(port, "port", 0, 2 ** 16)
        o.transport = _TRANSPORT_UDP if datagrams else _TRANSPORT_HTTP
        o.auth = _AUTH[auth]
        self.datagrams = bool(datagrams)
        udp = {"max_datagram": max_datagram, "quiet": quiet, "udp_port": udp_port,
               "resync_range": resync_range,
               "resync_period": resync_period, "drift_budget": drift_budget}
        given = [name for name, value in udp.items() if value is not None]
        if given and not datagrams:
            raise fail(f"Coordinator: {', '.join(given)}: options of datagrams=True")
        if max_datagram is not None:
            o.max_datagram = count(max_datagram, "max_datagram")
        if quiet is not None:
            o.quiet_ms = ms(quiet, "quiet")
        if udp_port is not None:
            o.udp_port = count(udp_port, "udp_port", 0, 2 ** 16)
        if resync_range is not None:
            o.resync_range = count(resync_range, "resync_range")
        if resync_period is not None:
            o.resync_period = count(resync_period, "resync_period")
        if drift_budget is not None:
            if not isinstance(drift_budget, (int, float)) or not drift_budget >= 0:
                raise fail(f"Coordinator: drift_budget {drift_budget!r}: a number >= 0")
            o.drift_budget = drift_budget
        super().__init__(trainer_id, trainers, store, seed_url, key, member_keys, host,
                         join_timeout)
        self._fill_opts(o, admission)

    # ------------------------------------------------- what DiLoCo calls
    def _open(self, ctx, theta, config):
        """Creates the node over the context `ctx`, then founds the group
        (meeting through the store) or joins it; theta (the CPU FP32 vector
        of P floats) gets the starting global weights. `config`: what every
        member must agree on (compared at the founding meeting)."""
        if self.datagrams and config.get("rule") != "drop":
            raise fail("Coordinator: datagrams need rule='drop' (a sender cannot learn "
                       "which of its chunks arrived)")
        node = ctypes.c_void_p()
        check(lib.pulse_loco_coord_create(ctypes.byref(self._opts), ctx, ctypes.byref(node)))
        self._handle = node
        if self.seed_url is not None:
            check(lib.pulse_loco_coord_join(node, self.seed_url.encode(),
                                            ctypes.c_void_p(theta.data_ptr()), self._join_ms))
        else:
            config = dict(config, datagrams=self.datagrams)
            self._found(ctx, theta, config, self.url,
                        lambda members, n: lib.pulse_loco_coord_start(node, members, n))

    def _step(self, theta, samples, leaving):
        figures = LocoCoordStepFigures()
        check(lib.pulse_loco_coord_step(self._handle, ctypes.c_void_p(theta.data_ptr()),
                                        samples, 1 if leaving else 0, ctypes.byref(figures)))
        info = figures_dict(figures)
        info["chunks"] = figures_dict(figures.chunks)
        info["auth"] = figures_dict(figures.auth)
        return info

    def _free_handle(self):
        lib.pulse_loco_coord_free(self._handle)

    # ---------------------------------------------------------------- API
    def served_bytes(self):
        """HTTP body bytes this node's server has answered since it started
        (payloads, relays, manifests, states, error bodies of polls; every
        route of its /metrics, pulse_http_response_bytes_total, but
        /metrics itself): what this trainer sent over HTTP. A response
        counts once it completed. Datagrams are not in it. A step's
        bytes_sent (the C figure) counts the same answers, since the last
        step, and the datagrams; this total also has what was served after
        the last step."""
        if self._handle is None:
            return 0
        # No proxy: the node is this process's own server.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(self.url + "/metrics", timeout=10) as answer:
                text = answer.read().decode()
        except OSError as exc:
            raise Error("PULSE_ERR_IO", f"{self.url}/metrics: {exc}") from exc
        total = 0
        for line in text.splitlines():
            if line.startswith("pulse_http_response_bytes_total{") \
                    and 'route="metrics"' not in line:
                total += int(line.rsplit(" ", 1)[1])
        return total

    def members(self):
        """The members of the next round: {id: url}."""
        return self._members(lib.pulse_loco_coord_members)

    def linger(self, timeout=30.0):
        """At the end of a run, before closing: when this node coordinated
        the last round, waits until every member acknowledged it (at most
        `timeout` seconds; pulse.Error when one did not). Every trainer
        should keep its node up until all are done (see
        pulse_loco_coord_linger)."""
        if self._handle is not None:
            check(lib.pulse_loco_coord_linger(self._handle, ms(timeout, "timeout")))
