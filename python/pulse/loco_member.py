"""What the project's own PULSELoCo exchanges share as DiLoCo transports
(pulse.loco.Coordinator, pulse.loco.Collaboration): founding or joining,
the signing key and the pinned members' keys, and the founding meeting
through a torch.distributed Store.

The founding meeting: every founding trainer publishes its URL under
"pulse-loco/url/ID"; trainer 0 exports its state (pulse_loco_state_export:
round, alpha, mu, theta_g, momentum) under "pulse-loco/state", which the
others import (theta_g checked by its digests; another parameter count,
alpha or mu refused); each then publishes its verdict and its settings
(gate, rule, transport) under "pulse-loco/ready/ID". Every trainer reads
every verdict: one refusal or one other setting and every trainer raises
pulse.Error, before any payload. No payload goes through the store.
"""

import ctypes
import json

from ._lib import Error, KEY_BYTES, check, fail, lib

_PREFIX = "pulse-loco/"
_SIG_BYTES = 64  # PULSE_SIGN_SIGNATURE_BYTES


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


class Buffer(ctypes.Structure):
    _c_name_ = "pulse_buffer"
    _fields_ = [("data", ctypes.POINTER(ctypes.c_uint8)), ("size", ctypes.c_size_t)]


_p = ctypes.c_void_p
PROTOS = {
    "pulse_loco_state_export": (ctypes.c_int, [_p, ctypes.POINTER(Buffer)]),
    "pulse_loco_state_import": (ctypes.c_int, [_p, ctypes.c_char_p, ctypes.c_size_t, _p]),
    "pulse_buffer_free": (None, [ctypes.POINTER(Buffer)]),
}


_declared = set()


def declare(protos):
    """Sets the ctypes prototypes of `protos` ({name: (restype,
    argtypes)}) on the library, once per table."""
    if id(protos) not in _declared:
        for name, (restype, argtypes) in protos.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _declared.add(id(protos))


def key_bytes(hex_key, what):
    if not isinstance(hex_key, str) or len(hex_key) != 2 * KEY_BYTES:
        raise fail(f"{what}: a public key is 64 hex digits (a str)")
    try:
        return bytes.fromhex(hex_key)
    except ValueError:
        raise fail(f"{what}: {hex_key!r} is not hex") from None


def ms(value, what):
    """Seconds as whole milliseconds for a uint32_t option."""
    if not isinstance(value, (int, float)):
        raise fail(f"{what} {value!r}: seconds (a number)")
    out = int(round(value * 1000))
    if not 1 <= out < 2 ** 32:
        raise fail(f"{what} {value!r} s: from 0.001 s to 49 days")
    return out


def count(value, what, low=1, high=2 ** 32):
    if not isinstance(value, int) or not low <= value < high:
        raise fail(f"{what} {value!r}: an integer from {low} to {high - 1}")
    return value


def admission_of(what, admission, seed_url):
    """The LocoAdmission struct of `admission` (the bytes a member's
    admit() returned), None for None; checked first, before any other
    option."""
    if admission is None:
        return None
    if not isinstance(admission, bytes):
        raise fail(f"{what}: admission is the bytes a member's admit() returned")
    if len(admission) != ctypes.sizeof(LocoAdmission):
        raise fail(f"{what}: an admission is {ctypes.sizeof(LocoAdmission)} "
                   f"bytes, not {len(admission)}")
    if seed_url is None:
        raise fail(f"{what}: an admission is for a joiner (seed_url)")
    return LocoAdmission.from_buffer_copy(admission)


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


class Member:
    """A trainer's side of one of the project's exchanges: founding
    (trainers, store) or joining (seed_url), its key and the pinned keys.
    Subclasses create the C handle and name it in `_handle`, and name
    their C functions: `_c_url` (pulse_loco_*_url) and `_c_admit`
    (pulse_loco_*_admit)."""

    _what = "exchange"
    _c_url = _c_admit = None

    def __init__(self, trainer_id, trainers, store, seed_url, key, member_keys, host,
                 join_timeout):
        declare(PROTOS)
        self._handle = None
        self._key = None
        self.trainer_id = count(trainer_id, "trainer_id", low=0)
        if seed_url is None:
            if store is None or trainers is None:
                raise fail(f"{self._what}: founding needs trainers= and store= (a "
                           "torch.distributed Store); a late trainer gives seed_url=")
            self.trainers = count(trainers, "trainers")
            if self.trainer_id >= self.trainers:
                raise fail(f"{self._what}: founding trainer_id {trainer_id} not below "
                           f"trainers {trainers}")
        elif store is not None or trainers is not None:
            raise fail(f"{self._what}: seed_url joins a running group; trainers= and store= "
                       "found one: not both")
        else:
            if not isinstance(seed_url, str) or not seed_url.startswith("http://"):
                raise fail(f"{self._what}: seed_url {seed_url!r} is not an http:// URL")
            self.trainers = None
        self.store, self.seed_url = store, seed_url
        self._join_ms = ms(join_timeout, "join_timeout")
        self._host = None
        if host is not None:
            if not isinstance(host, str):
                raise fail(f"{self._what}: host {host!r} is not a str")
            self._host = host.encode()
        self._keys = None
        if member_keys:
            self._keys = (LocoMemberKey * len(member_keys))()
            for i, (mid, hex_key) in enumerate(sorted(member_keys.items())):
                self._keys[i].id = count(mid, "member_keys id", low=0)
                self._keys[i].key[:] = key_bytes(hex_key, f"member_keys[{mid}]")
        if key is not None:
            handle = ctypes.c_void_p()
            check(lib.pulse_sign_key_load(str(key).encode(), ctypes.byref(handle)))
            self._key = handle

    def _fill_opts(self, opts, admission):
        """The options every exchange shares: host, signing key, pinned
        keys and the joiner's admission (kept alive with this member)."""
        opts.host = self._host
        opts.sign_key = self._key
        if self._keys is not None:
            opts.member_keys = self._keys
            opts.member_key_count = len(self._keys)
        self._admission = admission
        if admission is not None:
            opts.admission = ctypes.pointer(admission)

    @property
    def url(self):
        """This member's base URL ("http://HOST:PORT"; a client-mode
        collaboration peer's at its host): what a joiner's seed_url names.
        None before the DiLoCo that uses it is made."""
        if self._handle is None:
            return None
        return getattr(lib, self._c_url)(self._handle).decode()

    def admit(self, newcomer_key, until_round):
        """This member's admission of the public key `newcomer_key` (64
        hex digits), valid until the group passes round `until_round`:
        bytes to hand to the newcomer (its `admission=`). Needs a key."""
        if self._handle is None:
            raise fail(f"{self._what}: admit needs a running member")
        raw = (ctypes.c_uint8 * KEY_BYTES)(*key_bytes(newcomer_key, "admit"))
        out = LocoAdmission()
        check(getattr(lib, self._c_admit)(self._handle, raw,
                                          count(until_round, "until_round", 0, 2 ** 64),
                                          ctypes.byref(out)))
        return bytes(out)

    @property
    def public_key(self):
        """This trainer's public key (64 hex digits), None without a key."""
        if self._key is None:
            return None
        raw = (ctypes.c_char * KEY_BYTES)()
        lib.pulse_sign_key_public(self._key, raw)
        return raw.raw.hex()

    def _store_get(self, name):
        try:
            return self.store.get(_PREFIX + name)
        except Exception as exc:  # the store's timeout, a dead store
            raise Error("PULSE_ERR_IO", f"founding meeting: no {name!r} in the store: "
                        f"{exc}") from exc

    def _found(self, ctx, theta, config, url, start):
        """The founding meeting (the module's doc), then start(members,
        count) with the founding members."""
        store, me = self.store, self.trainer_id
        store.set(f"{_PREFIX}url/{me}", url)
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
            raise fail(f"{self._what}: the founding trainers disagree: " + "; ".join(problems))
        members = (LocoMember * self.trainers)()
        for t in range(self.trainers):
            members[t].id = t
            members[t].url = self._store_get(f"url/{t}")
        check(start(members, self.trainers))

    def _members(self, fn):
        """{id: url} from a pulse_loco_*_members function."""
        if self._handle is None:
            return {}
        n = ctypes.c_size_t()
        fn(self._handle, None, 0, ctypes.byref(n))
        out = (LocoMember * max(n.value, 1))()
        fn(self._handle, out, n.value, ctypes.byref(n))
        return {m.id: m.url.decode() for m in out[:n.value]}

    def _free_handle(self):
        """The subclass frees its C handle (it borrows the key: first)."""

    def close(self):
        """Stops this trainer's server (the DiLoCo using it closes it too)."""
        if getattr(self, "_handle", None):
            self._free_handle()
        self._handle = None
        if getattr(self, "_key", None):
            lib.pulse_sign_key_free(self._key)
        self._key = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
