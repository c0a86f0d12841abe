"""libpulse.so through ctypes: finding it, the C declarations the package
uses, and pulse.Error.

The structs mirror the public headers of this package's version of pulse;
each names its C struct in `_c_name_`, and tests/python/test_struct_layout.py
checks every field's offset and size against the C compiler's. The library
is loaded only if its pulse_version() is this package's __version__ (until
pulse's ABI is 1, any two versions may lay a struct out differently).
Options start from the library's own pulse_X_opts_init: no default is
copied here.
"""

import ctypes
import os

from ._version import __version__

__all__ = ["Error", "lib", "check", "fail"]

_HERE = os.path.dirname(os.path.abspath(__file__))


class Error(Exception):
    """Every failure of the package: `status` is the C status name
    ("PULSE_ERR_CORRUPT", or "PULSE_ERR_ARG" for an argument the package
    refused itself), `code` its number, `detail` the library's text."""

    def __init__(self, status, detail, code=None):
        self.status = status
        self.detail = detail
        self.code = code
        super().__init__(f"{status}: {detail}" if detail else status)


def _candidates():
    env = os.environ.get("PULSE_LIBRARY")
    if env:
        return [env]
    found = []
    try:  # written by cmake --install: the library relative to this folder
        from . import _installed

        found.append(os.path.normpath(os.path.join(_HERE, _installed.LIBRARY)))
    except ImportError:
        pass
    found.append(os.path.join(_HERE, "libpulse.so"))
    # A checkout: python/pulse -> build/libpulse.so
    found.append(os.path.normpath(os.path.join(_HERE, "..", "..", "build", "libpulse.so")))
    return found


# ----------------------------------------------------------------- structs
PULSE_MAX_DIMS = 8
KEY_BYTES = 32  # PULSE_KEY_BYTES
DTYPE_BF16, DTYPE_F32, DTYPE_F16 = 1, 2, 3
PUB_HOST, PUB_DEVICE = 0, 1
SUB_NO_STEP = (1 << 64) - 1
OK = 0


class Closing:
    """What Publisher, Server and Subscriber share around their close(): a
    context manager, and a close() when collected (errors there ignored)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class TensorInfo(ctypes.Structure):
    _c_name_ = "pulse_tensor_info"
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int),
                ("ndim", ctypes.c_uint32), ("shape", ctypes.c_uint64 * PULSE_MAX_DIMS)]


PubHeadFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


class PubOpts(ctypes.Structure):
    _c_name_ = "pulse_pub_opts"
    _fields_ = [("struct_version", ctypes.c_uint32), ("anchor_every", ctypes.c_uint64),
                ("keep_patches", ctypes.c_uint64), ("keep_anchors", ctypes.c_uint64),
                ("key", ctypes.c_void_p), ("tensors", ctypes.POINTER(TensorInfo)),
                ("tensor_count", ctypes.c_size_t), ("pos_model", ctypes.c_int),
                ("chunk_log2", ctypes.c_uint32), ("threads", ctypes.c_int),
                ("anchor_sync", ctypes.c_int), ("on_head", PubHeadFn),
                ("on_head_ctx", ctypes.c_void_p), ("cuda_stream", ctypes.c_void_p),
                ("grace_seconds", ctypes.c_double), ("format_version", ctypes.c_uint32)]

    def __init__(self):
        super().__init__()
        lib.pulse_pub_opts_init(ctypes.byref(self))


class PubTensor(ctypes.Structure):
    _c_name_ = "pulse_pub_tensor"
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("memory", ctypes.c_int)]


class UploadOpts(ctypes.Structure):
    _c_name_ = "pulse_upload_opts"
    _fields_ = [("struct_version", ctypes.c_uint32), ("target", ctypes.c_char_p),
                ("endpoint", ctypes.c_char_p), ("region", ctypes.c_char_p),
                ("access_key", ctypes.c_char_p), ("secret_key", ctypes.c_char_p),
                ("session_token", ctypes.c_char_p), ("cacert", ctypes.c_char_p),
                ("multipart_bytes", ctypes.c_uint64), ("part_bytes", ctypes.c_uint64),
                ("parallel", ctypes.c_uint), ("retries", ctypes.c_uint),
                ("keep_anchors", ctypes.c_uint), ("grace_seconds", ctypes.c_uint32),
                ("no_retention", ctypes.c_int)]

    def __init__(self):
        super().__init__()
        lib.pulse_upload_opts_init(ctypes.byref(self))


class UploadFigures(ctypes.Structure):
    _c_name_ = "pulse_upload_figures"
    _fields_ = [("objects_uploaded", ctypes.c_uint64), ("objects_present", ctypes.c_uint64),
                ("bytes_uploaded", ctypes.c_uint64), ("parts", ctypes.c_uint64),
                ("retries", ctypes.c_uint64), ("deleted", ctypes.c_uint64),
                ("head_step", ctypes.c_uint64), ("seconds", ctypes.c_double)]


class Sha256State(ctypes.Structure):
    _c_name_ = "pulse_sha256_state"
    _fields_ = [("bytes", ctypes.c_uint8 * 128)]  # PULSE_SHA256_STATE_BYTES


class TensorDigest(ctypes.Structure):
    _c_name_ = "pulse_tensor_digest"
    _fields_ = [("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]


class Region(ctypes.Structure):
    _c_name_ = "pulse_region"
    _fields_ = [("name", ctypes.c_char_p), ("row0", ctypes.c_uint64), ("rows", ctypes.c_uint64),
                ("col0", ctypes.c_uint64), ("cols", ctypes.c_uint64), ("data", ctypes.c_void_p),
                ("stride", ctypes.c_uint64), ("digest", TensorDigest),
                ("halo_log2", ctypes.c_uint32), ("halo", ctypes.c_void_p),
                ("halo_digest", TensorDigest)]


class PubFigures(ctypes.Structure):
    _c_name_ = "pulse_pub_figures"
    _fields_ = [("step", ctypes.c_uint64), ("base_step", ctypes.c_uint64),
                ("params", ctypes.c_uint64), ("changed", ctypes.c_uint64),
                ("patch_bytes", ctypes.c_uint64), ("anchor_bytes", ctypes.c_uint64),
                ("anchor_started", ctypes.c_int), ("flush", ctypes.c_int),
                ("detect_seconds", ctypes.c_double), ("encode_seconds", ctypes.c_double),
                ("write_seconds", ctypes.c_double), ("total_seconds", ctypes.c_double),
                ("state_digest", ctypes.c_char * 65)]


class ServerOpts(ctypes.Structure):
    _c_name_ = "pulse_server_opts"
    _fields_ = [("struct_version", ctypes.c_uint32), ("store_dir", ctypes.c_char_p),
                ("host", ctypes.c_char_p), ("port", ctypes.c_uint16),
                ("threads", ctypes.c_int), ("max_connections", ctypes.c_uint),
                ("max_per_ip", ctypes.c_uint), ("idle_timeout_s", ctypes.c_uint),
                ("max_waiters", ctypes.c_uint), ("max_poll_ms", ctypes.c_uint32),
                ("watch", ctypes.c_int), ("key", ctypes.c_void_p),
                ("catchup_threads", ctypes.c_int), ("catchup_builds", ctypes.c_uint),
                ("catchup_queue", ctypes.c_uint), ("catchup_wait_ms", ctypes.c_uint32),
                ("header_timeout_s", ctypes.c_uint)]

    def __init__(self):
        super().__init__()
        lib.pulse_server_opts_init(ctypes.byref(self))


class SubEvent(ctypes.Structure):
    _c_name_ = "pulse_sub_event"
    _fields_ = [("type", ctypes.c_int), ("step", ctypes.c_uint64),
                ("head_step", ctypes.c_uint64), ("from_step", ctypes.c_uint64),
                ("route", ctypes.c_int), ("object", ctypes.c_char_p),
                ("bytes", ctypes.c_uint64), ("total", ctypes.c_uint64),
                ("resumed", ctypes.c_uint64), ("attempt", ctypes.c_uint),
                ("delay_ms", ctypes.c_uint), ("status", ctypes.c_int),
                ("detail", ctypes.c_char_p)]


class SubFigures(ctypes.Structure):
    _c_name_ = "pulse_sub_figures"
    _fields_ = [("step", ctypes.c_uint64), ("head_step", ctypes.c_uint64),
                ("state_digest", ctypes.c_char * 65), ("syncs", ctypes.c_uint64),
                ("sync_failures", ctypes.c_uint64), ("bytes_downloaded", ctypes.c_uint64),
                ("bytes_resumed", ctypes.c_uint64), ("objects_fetched", ctypes.c_uint64),
                ("requests", ctypes.c_uint64), ("retries", ctypes.c_uint64),
                ("rejected", ctypes.c_uint64), ("patches_applied", ctypes.c_uint64),
                ("anchors_applied", ctypes.c_uint64), ("catchups_applied", ctypes.c_uint64),
                ("last_route", ctypes.c_int), ("last_status", ctypes.c_int),
                ("last_from_step", ctypes.c_uint64), ("last_bytes", ctypes.c_uint64),
                ("last_transfer_s", ctypes.c_double), ("last_verify_s", ctypes.c_double),
                ("last_decode_s", ctypes.c_double), ("last_apply_s", ctypes.c_double),
                ("last_total_s", ctypes.c_double), ("last_decode_overlap_s", ctypes.c_double),
                ("class_index_builds", ctypes.c_uint64), ("class_index_bytes", ctypes.c_uint64),
                ("last_write_s", ctypes.c_double), ("file_bytes_written", ctypes.c_uint64),
                ("lagging_sources", ctypes.c_uint64), ("class_index_kept", ctypes.c_int),
                ("class_index_why", ctypes.c_char * 192), ("partial_fetches", ctypes.c_uint64)]


def figures_dict(figures):
    """A figures struct as a dict (strings decoded)."""
    out = {}
    for name, _ in figures._fields_:
        value = getattr(figures, name)
        out[name] = value.decode() if isinstance(value, bytes) else value
    return out


SUB_EV_APPLIED, SUB_EV_SYNCED, SUB_EV_ERROR = 8, 9, 10
# pulse_sub_class_index, as pulse_subscriber.h numbers it
SUB_CLASS_INDEX_AUTO, SUB_CLASS_INDEX_OFF, SUB_CLASS_INDEX_ON = 0, 1, 2
SubEventFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(SubEvent))


class SubOpts(ctypes.Structure):
    _c_name_ = "pulse_sub_opts"
    _fields_ = [("struct_version", ctypes.c_uint32),
                ("urls", ctypes.POINTER(ctypes.c_char_p)), ("url_count", ctypes.c_size_t),
                ("cache_dir", ctypes.c_char_p), ("public_key", ctypes.c_void_p),
                ("allow_unsigned", ctypes.c_int), ("allow_unsigned_catchup", ctypes.c_int),
                ("connect_timeout_ms", ctypes.c_uint32), ("request_timeout_ms", ctypes.c_uint32),
                ("low_speed_bytes", ctypes.c_uint32), ("low_speed_seconds", ctypes.c_uint32),
                ("retries", ctypes.c_uint), ("backoff_ms", ctypes.c_uint32),
                ("backoff_max_ms", ctypes.c_uint32), ("parallel", ctypes.c_uint),
                ("parallel_min_bytes", ctypes.c_uint64), ("max_recv_bytes_per_s", ctypes.c_uint64),
                ("use_catchup", ctypes.c_int), ("mirror", ctypes.c_int),
                ("threads", ctypes.c_int), ("poll_timeout_ms", ctypes.c_uint32),
                ("cuda_stream", ctypes.c_void_p), ("on_event", SubEventFn),
                ("on_event_ctx", ctypes.c_void_p), ("no_streaming", ctypes.c_int),
                ("class_index", ctypes.c_int), ("allow_rollback", ctypes.c_int),
                ("switch_run", ctypes.c_int), ("max_head_age_s", ctypes.c_uint32),
                ("min_bytes_per_s", ctypes.c_uint32), ("download_grace_ms", ctypes.c_uint32),
                ("cacert", ctypes.c_char_p), ("trust_first_use", ctypes.c_int),
                ("redirect_origins", ctypes.POINTER(ctypes.c_char_p)),
                ("redirect_origin_count", ctypes.c_size_t),
                ("max_object_bytes", ctypes.c_uint64), ("memory_budget_bytes", ctypes.c_uint64)]

    def __init__(self):
        super().__init__()
        lib.pulse_sub_opts_init(ctypes.byref(self))


# ------------------------------------------------------------ declarations
_p = ctypes.c_void_p
_u64 = ctypes.c_uint64
_int = ctypes.c_int
_PROTOS = {
    "pulse_version": (ctypes.c_char_p, []),
    "pulse_status_name": (ctypes.c_char_p, [_int]),
    "pulse_error_detail": (ctypes.c_char_p, []),
    "pulse_sign_key_generate": (_int, [ctypes.POINTER(_p)]),
    "pulse_sign_key_load": (_int, [ctypes.c_char_p, ctypes.POINTER(_p)]),
    "pulse_sign_key_save": (_int, [_p, ctypes.c_char_p]),
    "pulse_sign_key_public": (None, [_p, ctypes.c_char * KEY_BYTES]),
    "pulse_sign_key_free": (None, [_p]),
    "pulse_pub_opts_init": (None, [ctypes.POINTER(PubOpts)]),
    "pulse_upload_opts_init": (None, [ctypes.POINTER(UploadOpts)]),
    "pulse_server_opts_init": (None, [ctypes.POINTER(ServerOpts)]),
    "pulse_sub_opts_init": (None, [ctypes.POINTER(SubOpts)]),
    "pulse_pub_create": (_int, [ctypes.c_char_p, ctypes.POINTER(PubOpts), ctypes.POINTER(_p)]),
    "pulse_pub_free": (None, [_p]),
    "pulse_pub_commit": (_int, [_p, _u64, ctypes.POINTER(PubTensor), ctypes.c_size_t,
                                ctypes.POINTER(PubFigures)]),
    "pulse_pub_flush": (_int, [_p, ctypes.POINTER(PubFigures)]),
    "pulse_upload_create": (_int, [ctypes.POINTER(UploadOpts), ctypes.POINTER(_p)]),
    "pulse_upload_free": (None, [_p]),
    "pulse_upload_store": (_int, [_p, ctypes.c_char_p, ctypes.POINTER(UploadFigures)]),
    "pulse_upload_part_begin": (_int, [_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]),
    "pulse_upload_part_put": (_int, [_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint32, _p,
                                     ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]),
    "pulse_upload_part_finish": (_int, [_p, ctypes.c_char_p, ctypes.c_char_p,
                                        ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t]),
    "pulse_upload_part_abort": (_int, [_p, ctypes.c_char_p, ctypes.c_char_p]),
    "pulse_upload_object_size": (_int, [_p, ctypes.c_char_p, ctypes.POINTER(_u64)]),
    "pulse_upload_fetch_missing": (_int, [_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]),
    "pulse_sha256_begin": (None, [ctypes.POINTER(Sha256State)]),
    "pulse_sha256_add": (_int, [ctypes.POINTER(Sha256State), _p, ctypes.c_size_t]),
    "pulse_sha256_end": (_int, [ctypes.POINTER(Sha256State), ctypes.c_uint8 * 32]),
    "pulse_pub_head_step": (_int, [_p, ctypes.POINTER(_u64)]),
    "pulse_pub_tensor_count": (ctypes.c_size_t, [_p]),
    "pulse_pub_tensor_info": (ctypes.POINTER(TensorInfo), [_p, ctypes.c_size_t]),
    "pulse_server_create": (_int, [ctypes.POINTER(ServerOpts), ctypes.POINTER(_p)]),
    "pulse_server_free": (None, [_p]),
    "pulse_server_port": (ctypes.c_uint16, [_p]),
    "pulse_server_notify": (None, [_p, ctypes.c_double]),
    "pulse_server_parse_listen": (_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                         ctypes.POINTER(ctypes.c_uint16)]),
    "pulse_sub_create": (_int, [ctypes.POINTER(SubOpts), ctypes.POINTER(_p)]),
    "pulse_sub_free": (None, [_p]),
    "pulse_sub_attach_host": (_int, [_p, ctypes.c_char_p, ctypes.c_uint32,
                                     ctypes.POINTER(_u64), _p]),
    "pulse_sub_attach_device": (_int, [_p, ctypes.c_char_p, ctypes.c_uint32,
                                       ctypes.POINTER(_u64), _p]),
    "pulse_sub_attach_file": (_int, [_p, ctypes.c_char_p]),
    "pulse_sub_attach_region": (_int, [_p, ctypes.c_uint32, ctypes.POINTER(_u64),
                                       ctypes.POINTER(Region)]),
    "pulse_sub_table": (_int, [_p, ctypes.POINTER(ctypes.POINTER(TensorInfo)),
                               ctypes.POINTER(ctypes.c_size_t)]),
    "pulse_sub_table_free": (None, [ctypes.POINTER(TensorInfo)]),
    "pulse_sub_tensor": (_int, [_p, ctypes.c_char_p, ctypes.POINTER(_p), ctypes.POINTER(_u64)]),
    "pulse_sub_assume_step": (_int, [_p, _u64]),
    "pulse_sub_sync": (_int, [_p]),
    "pulse_sub_follow": (_int, [_p]),
    "pulse_sub_stop": (None, [_p]),
    "pulse_sub_step": (_u64, [_p]),
    "pulse_sub_error": (ctypes.c_char_p, [_p]),
    "pulse_sub_figures_get": (None, [_p, ctypes.POINTER(SubFigures)]),
    "pulse_sub_read_lock": (None, [_p, ctypes.POINTER(_u64)]),
    "pulse_sub_read_unlock": (None, [_p]),
    "pulse_digest_bf16_block": (_int, [_p, _u64, _u64, _u64, _u64, _u64,
                                       ctypes.POINTER(TensorDigest)]),
    "pulse_sub_key_from_hex": (_int, [ctypes.c_char_p, ctypes.c_char * KEY_BYTES]),
    "pulse_cuda_available": (_int, []),
    "pulse_cuda_unavailable_reason": (ctypes.c_char_p, []),
}


class _Library:
    """libpulse.so, loaded by `import pulse` (so that a missing library, or
    one of another version, is said at once), or at first use by a module
    imported alone."""

    def __init__(self):
        self._dll = None

    def _load(self):
        tried = []
        for path in _candidates():
            if not os.path.exists(path):
                tried.append(path)
                continue
            try:
                dll = ctypes.CDLL(path)
            except OSError as exc:
                raise Error("PULSE_ERR_NOT_FOUND", f"cannot load {path}: {exc}") from None
            # Before anything else: a library of another version may lay
            # out every struct below differently.
            try:
                version_fn = dll.pulse_version
            except AttributeError:
                raise Error("PULSE_ERR_VERSION", f"{path} is a libpulse older than "
                            f"{__version__} (no pulse_version); this package needs "
                            f"{__version__}") from None
            version_fn.restype = ctypes.c_char_p
            version_fn.argtypes = []
            found = version_fn().decode()
            if found != __version__:
                raise Error("PULSE_ERR_VERSION", f"{path} is libpulse {found}; this "
                            f"package (pulse {__version__}) needs the same version")
            for name, (restype, argtypes) in _PROTOS.items():
                try:
                    fn = getattr(dll, name)
                except AttributeError:
                    raise Error("PULSE_ERR_NOT_FOUND", f"{path} does not export {name}") from None
                fn.restype = restype
                fn.argtypes = argtypes
            self._dll = dll
            self.path = path
            return
        raise Error("PULSE_ERR_NOT_FOUND",
                    "libpulse.so not found (set PULSE_LIBRARY to its path; tried "
                    + ", ".join(tried) + ")")

    def load(self):
        """Loads the library now (import pulse does): its path."""
        if self._dll is None:
            self._load()
        return self.path

    def __getattr__(self, name):
        if self._dll is None:
            self._load()
        return getattr(self._dll, name)


lib = _Library()


def fail(detail, status="PULSE_ERR_ARG"):
    """An error the package raises itself (bad arguments, before any C call)."""
    return Error(status, detail)


def check(status, detail=None):
    """Raises Error for a non-zero pulse_status, with the library's detail
    (this thread's pulse_error_detail() unless given)."""
    if status == OK:
        return
    name = lib.pulse_status_name(status).decode()
    if detail is None:
        detail = lib.pulse_error_detail().decode(errors="replace")
    raise Error(name, detail, status)
