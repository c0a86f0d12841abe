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
import json
import urllib.request

from ._lib import Error, KEY_BYTES, check, fail, figures_dict, lib

__all__ = ["Coordinator", "new_key"]

_SIG_BYTES = 64  # PULSE_SIGN_SIGNATURE_BYTES
_AUTH = {"auto": 0, "on": 1, "off": 2}  # pulse_loco_auth_mode
_TRANSPORT_HTTP, _TRANSPORT_UDP = 0, 1  # pulse_loco_transport
_PREFIX = "pulse-loco/"


class LocoMember(ctypes.Structure):
    _c_name_ = "pulse_loco_member"
    _fields_ = [("id", ctypes.c_uint32), ("url", ctypes.c_char * 64)]


class LocoMemberKey(ctypes.Structure):
    _c_name_ = "pulse_loco_member_key"
    _fields_ = [("id", ctypes.c_uint32), ("key", ctypes.c_uint8 * KEY_BYTES)]


class LocoAdmission(ctypes.Structure):
    _c_name_ = "pulse_loco_admission"
    _fields_ = [("key", ctypes.c_uint8 * KEY_BYTES), ("sponsor", ctypes.c_uint8 * KEY_BYTES),
                ("round", ctypes.c_uint64), ("sig", ctypes.c_uint8 * _SIG_BYTES)]


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
                ("host", ctypes.c_char_p), ("sign_key", ctypes.c_void_p),
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
                ("datagrams_refused_auth", ctypes.c_uint64), ("auth_bytes", ctypes.c_uint64)]


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
    "pulse_loco_state_export": (ctypes.c_int, [_p, _p]),
    "pulse_loco_state_import": (ctypes.c_int, [_p, ctypes.c_char_p, ctypes.c_size_t, _p]),
    "pulse_buffer_free": (None, [_p]),
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


class Buffer(ctypes.Structure):
    _c_name_ = "pulse_buffer"
    _fields_ = [("data", ctypes.POINTER(ctypes.c_uint8)), ("size", ctypes.c_size_t)]


def _key_bytes(hex_key, what):
    if not isinstance(hex_key, str) or len(hex_key) != 2 * KEY_BYTES:
        raise fail(f"{what}: a public key is 64 hex digits (a str)")
    try:
        return bytes.fromhex(hex_key)
    except ValueError:
        raise fail(f"{what}: {hex_key!r} is not hex") from None


def _ms(value, what):
    ms = int(round(value * 1000))
    if not 1 <= ms < 2 ** 32:
        raise fail(f"{what} {value!r} s: from 0.001 s to 49 days")
    return ms


def _count(value, what, low=1):
    if not isinstance(value, int) or not low <= value < 2 ** 32:
        raise fail(f"{what} {value!r}: an integer from {low} to 2^32 - 1")
    return value


def new_key(path):
    """Makes an Ed25519 signing key, saved to `path` (PKCS#8 PEM; an
    existing file is an error), and returns its public key (64 hex
    digits): what the other trainers pin in their `member_keys`."""
    handle = ctypes.c_void_p()
    check(lib.pulse_sign_key_generate(ctypes.byref(handle)))
    try:
        check(lib.pulse_sign_key_save(handle, str(path).encode()))
        raw = (ctypes.c_char * KEY_BYTES)()
        lib.pulse_sign_key_public(handle, raw)
        return raw.raw.hex()
    finally:
        lib.pulse_sign_key_free(handle)


class Coordinator:
    """The coordinator exchange as a DiLoCo transport: this trainer's
    member, options checked here before anything is sent.

    trainer_id: unique in the run. Founding: `trainers` founding members
    with ids 0..trainers-1 meet through `store` (a torch.distributed Store
    shared by them; keys under "pulse-loco/"): trainer 0's state is the
    start. Joining a running group instead: `seed_url` (any member's URL),
    with `admission` (from a member's Coordinator.admit) when this key is
    not pinned. host: the IPv4 address this node listens on and the others
    reach (None: 127.0.0.1). datagrams: contributions as UDP datagrams,
    all to all, no retransmission (drop rule only; the manifest, joins and
    re-syncs stay on HTTP). deadline: seconds the coordinator waits for
    the members' payloads after its own is ready (a late member is left
    out of the round); manifest_timeout: seconds a member waits for the
    manifest and each payload before it gives the round up (its step then
    raises pulse.Error); max_misses: missed rounds before the coordinator
    drops a member (it joins again by itself). key: this trainer's Ed25519
    key file (PKCS#8 PEM, pulse.loco.new_key); member_keys: {id: 64 hex
    digits} of the pinned members; auth: "auto" (on with a key), "on"
    (refuse to start without a key) or "off" (comparisons only). join_timeout:
    seconds for the founding meeting or the join."""

    def __init__(self, trainer_id, trainers=None, store=None, *, seed_url=None, admission=None,
                 host=None, datagrams=False, deadline=2.0, manifest_timeout=10.0, max_misses=3,
                 key=None, member_keys=None, auth="auto", join_timeout=60.0):
        _declare()
        self.trainer_id = _count(trainer_id, "trainer_id", low=0)
        if seed_url is None:
            if store is None or trainers is None:
                raise fail("Coordinator: founding needs trainers= and store= (a "
                           "torch.distributed Store); a late trainer gives seed_url=")
            self.trainers = _count(trainers, "trainers")
            if self.trainer_id >= self.trainers:
                raise fail(f"Coordinator: founding trainer_id {trainer_id} not below "
                           f"trainers {trainers}")
        elif store is not None or trainers is not None:
            raise fail("Coordinator: seed_url joins a running group; trainers= and store= "
                       "found one: not both")
        else:
            if not isinstance(seed_url, str) or not seed_url.startswith("http://"):
                raise fail(f"Coordinator: seed_url {seed_url!r} is not an http:// URL")
            self.trainers = None
        if auth not in _AUTH:
            raise fail(f"Coordinator: auth {auth!r}: 'auto', 'on' or 'off'")
        if auth == "on" and key is None:
            raise fail("Coordinator: auth='on' needs key= (this trainer's key file)")
        if admission is not None and not isinstance(admission, bytes):
            raise fail("Coordinator: admission is the bytes a member's admit() returned")
        self.store, self.seed_url, self.datagrams = store, seed_url, bool(datagrams)
        self._join_ms = _ms(join_timeout, "join_timeout")
        self._opts = LocoCoordOpts()
        lib.pulse_loco_coord_opts_init(ctypes.byref(self._opts))
        o = self._opts
        o.deadline_ms = _ms(deadline, "deadline")
        o.manifest_timeout_ms = _ms(manifest_timeout, "manifest_timeout")
        o.max_misses = _count(max_misses, "max_misses")
        o.transport = _TRANSPORT_UDP if datagrams else _TRANSPORT_HTTP
        o.auth = _AUTH[auth]
        self._host = None
        if host is not None:
            self._host = host.encode() if isinstance(host, str) else None
            if self._host is None:
                raise fail(f"Coordinator: host {host!r} is not a str")
            o.host = self._host
        self._keys = None
        if member_keys:
            self._keys = (LocoMemberKey * len(member_keys))()
            for i, (mid, hex_key) in enumerate(sorted(member_keys.items())):
                self._keys[i].id = _count(mid, "member_keys id", low=0)
                self._keys[i].key[:] = _key_bytes(hex_key, f"member_keys[{mid}]")
            o.member_keys = self._keys
            o.member_key_count = len(member_keys)
        self._admission = None
        if admission is not None:
            if len(admission) != ctypes.sizeof(LocoAdmission):
                raise fail(f"Coordinator: an admission is {ctypes.sizeof(LocoAdmission)} "
                           f"bytes, not {len(admission)}")
            self._admission = LocoAdmission.from_buffer_copy(admission)
            o.admission = ctypes.pointer(self._admission)
        self._key = None
        if key is not None:
            handle = ctypes.c_void_p()
            check(lib.pulse_sign_key_load(str(key).encode(), ctypes.byref(handle)))
            self._key = handle
            o.sign_key = handle
        self._node = None
        self.rule = None  # DiLoCo's, for the founding check

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
        self._node = node
        self._served = 0
        if self.seed_url is not None:
            check(lib.pulse_loco_coord_join(node, self.seed_url.encode(),
                                            ctypes.c_void_p(theta.data_ptr()), self._join_ms))
        else:
            self._found(ctx, theta, config)

    def _store_get(self, name):
        try:
            return self.store.get(_PREFIX + name)
        except Exception as exc:  # the store's timeout, a dead store
            raise Error("PULSE_ERR_IO", f"founding meeting: no {name!r} in the store: "
                        f"{exc}") from exc

    def _found(self, ctx, theta, config):
        store, me = self.store, self.trainer_id
        store.set(f"{_PREFIX}url/{me}", self.url)
        verdict = {"config": config, "error": None}
        if me == 0:
            buf = Buffer()
            check(lib.pulse_loco_state_export(ctx, ctypes.byref(buf)))
            try:
                store.set(_PREFIX + "state", ctypes.string_at(buf.data, buf.size))
            finally:
                lib.pulse_buffer_free(ctypes.byref(buf))
        else:
            state = self._store_get("state")
            status = lib.pulse_loco_state_import(ctx, state, len(state),
                                                 ctypes.c_void_p(theta.data_ptr()))
            if status != 0:
                verdict["error"] = (f"{lib.pulse_status_name(status).decode()}: "
                                    f"{lib.pulse_error_detail().decode(errors='replace')}")
        store.set(f"{_PREFIX}ready/{me}", json.dumps(verdict))
        problems = []
        for t in range(self.trainers):
            other = json.loads(self._store_get(f"ready/{t}"))
            if other["error"]:
                problems.append(f"trainer {t} cannot load trainer 0's state ({other['error']})")
            elif other["config"] != config:
                problems.append(f"trainer {t} runs {other['config']}, trainer {me} {config}")
        if problems:
            raise fail("Coordinator: the founding trainers disagree: " + "; ".join(problems))
        members = (LocoMember * self.trainers)()
        for t in range(self.trainers):
            members[t].id = t
            members[t].url = self._store_get(f"url/{t}")
        check(lib.pulse_loco_coord_start(self._node, members, self.trainers))

    def _step(self, theta, samples, leaving):
        figures = LocoCoordStepFigures()
        check(lib.pulse_loco_coord_step(self._node, ctypes.c_void_p(theta.data_ptr()), samples,
                                        1 if leaving else 0, ctypes.byref(figures)))
        info = figures_dict(figures)
        info["chunks"] = figures_dict(figures.chunks)
        info["auth"] = figures_dict(figures.auth)
        served = self.served_bytes()
        info["served_bytes"] = served - self._served
        self._served = served
        return info

    # ---------------------------------------------------------------- API
    @property
    def url(self):
        """This node's base URL ("http://HOST:PORT"): what a joiner's
        seed_url names. None before the DiLoCo that uses it is made."""
        if self._node is None:
            return None
        return lib.pulse_loco_coord_url(self._node).decode()

    @property
    def public_key(self):
        """This trainer's public key (64 hex digits), None without a key."""
        if self._key is None:
            return None
        raw = (ctypes.c_char * KEY_BYTES)()
        lib.pulse_sign_key_public(self._key, raw)
        return raw.raw.hex()

    def served_bytes(self):
        """HTTP body bytes this node's server has answered since it started
        (payloads, relays, manifests, states, error bodies of polls; every
        route of its /metrics, pulse_http_response_bytes_total, but
        /metrics itself): what this trainer sent over HTTP. A response
        counts once it completed. Datagrams are not in it (their count is
        in a step's exchange figures)."""
        if self._node is None:
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
        if self._node is None:
            return {}
        count = ctypes.c_size_t()
        lib.pulse_loco_coord_members(self._node, None, 0, ctypes.byref(count))
        out = (LocoMember * max(count.value, 1))()
        lib.pulse_loco_coord_members(self._node, out, count.value, ctypes.byref(count))
        return {m.id: m.url.decode() for m in out[:count.value]}

    def admit(self, newcomer_key, until_round):
        """This member's admission of the public key `newcomer_key` (64
        hex digits), valid until the group passes round `until_round`:
        bytes to hand to the newcomer (its Coordinator's admission=).
        Needs a key."""
        if self._node is None:
            raise fail("Coordinator: admit needs a running member")
        raw = (ctypes.c_uint8 * KEY_BYTES)(*_key_bytes(newcomer_key, "admit"))
        out = LocoAdmission()
        check(lib.pulse_loco_coord_admit(self._node, raw, until_round, ctypes.byref(out)))
        return bytes(out)

    def linger(self, timeout=30.0):
        """At the end of a run, before closing: when this node coordinated
        the last round, waits until every member acknowledged it (at most
        `timeout` seconds; pulse.Error when one did not). Every trainer
        should keep its node up until all are done (see
        pulse_loco_coord_linger)."""
        if self._node is not None:
            check(lib.pulse_loco_coord_linger(self._node, _ms(timeout, "timeout")))

    def close(self):
        """Stops the node's server (the DiLoCo using it closes it too)."""
        if getattr(self, "_node", None):
            lib.pulse_loco_coord_free(self._node)
        self._node = None
        if getattr(self, "_key", None):
            lib.pulse_sign_key_free(self._key)
        self._key = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
