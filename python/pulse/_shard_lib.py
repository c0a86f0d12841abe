"""The C declarations of the sharded publish (trainer_side/pulse_pub_shard.h)
that pulse.shard uses, kept beside _lib's (tests/python/test_struct_layout.py
checks these structures against C as it does _lib's). Declared on first use,
like _lib's, so `import pulse` needs no library."""

import ctypes

from ._lib import PULSE_MAX_DIMS, PubOpts, PubFigures, PubTensor, TensorInfo, lib

BLOCK_RECT, BLOCK_FLAT = 0, 1  # pulse_pub_block_kind


class PubBlock(ctypes.Structure):
    _c_name_ = "pulse_pub_block"
    _fields_ = [("name", ctypes.c_char_p), ("kind", ctypes.c_int),
                ("start", ctypes.c_uint64 * PULSE_MAX_DIMS),
                ("extent", ctypes.c_uint64 * PULSE_MAX_DIMS)]


class PubShardOpts(ctypes.Structure):
    _c_name_ = "pulse_pub_shard_opts"
    _fields_ = [("struct_version", ctypes.c_uint32), ("tensors", ctypes.POINTER(TensorInfo)),
                ("tensor_count", ctypes.c_size_t), ("blocks", ctypes.POINTER(PubBlock)),
                ("block_count", ctypes.c_size_t), ("chunk_log2", ctypes.c_uint32),
                ("pos_model", ctypes.c_int), ("format_version", ctypes.c_uint32)]

    def __init__(self):
        super().__init__()
        declared().pulse_pub_shard_opts_init(ctypes.byref(self))


class PubShardStepOpts(ctypes.Structure):
    _c_name_ = "pulse_pub_shard_step_opts"
    _fields_ = [("struct_version", ctypes.c_uint32), ("rank", ctypes.c_int),
                ("world", ctypes.c_int), ("committer", ctypes.c_void_p),
                ("timeout_ms", ctypes.c_int), ("bucket", ctypes.c_void_p),
                ("part_bytes", ctypes.c_uint64)]

    def __init__(self):
        super().__init__()
        declared().pulse_pub_shard_step_opts_init(ctypes.byref(self))


class Buffer(ctypes.Structure):
    _c_name_ = "pulse_buffer"
    _fields_ = [("data", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class EncodeOpts(ctypes.Structure):
    _c_name_ = "pulse_encode_opts"
    _fields_ = [("struct_version", ctypes.c_uint32), ("step", ctypes.c_uint64),
                ("base_step", ctypes.c_uint64), ("pos_model", ctypes.c_int),
                ("chunk_log2", ctypes.c_uint32), ("threads", ctypes.c_int),
                ("format_version", ctypes.c_uint32)]

    def __init__(self):
        super().__init__()
        declared().pulse_encode_opts_init(ctypes.byref(self))


class StateDigest(ctypes.Structure):
    _c_name_ = "pulse_state_digest"
    _fields_ = [("bytes", ctypes.c_uint8 * 32)]


_p = ctypes.c_void_p
_u64 = ctypes.c_uint64
_int = ctypes.c_int
_size = ctypes.c_size_t
_BUF = ctypes.POINTER(Buffer)
_INFO = ctypes.POINTER(TensorInfo)
_PROTOS = {
    "pulse_pub_shard_opts_init": (None, [ctypes.POINTER(PubShardOpts)]),
    "pulse_pub_shard_step_opts_init": (None, [ctypes.POINTER(PubShardStepOpts)]),
    "pulse_encode_opts_init": (None, [ctypes.POINTER(EncodeOpts)]),
    "pulse_buffer_free": (None, [_BUF]),
    "pulse_pub_blocks_check": (_int, [_INFO, _size, ctypes.POINTER(ctypes.POINTER(PubBlock)),
                                      ctypes.POINTER(_size), _size]),
    "pulse_pub_shard_create": (_int, [ctypes.POINTER(PubShardOpts), ctypes.POINTER(_p)]),
    "pulse_pub_shard_free": (None, [_p]),
    "pulse_pub_shard_detect": (_int, [_p, ctypes.POINTER(PubTensor), _size, _BUF]),
    "pulse_pub_shard_count": (_int, [_p, _BUF, _size, _BUF]),
    "pulse_pub_shard_part_for": (_int, [_p, _BUF, ctypes.POINTER(PubBlock), _size, _BUF]),
    "pulse_pub_shard_encode": (_int, [_INFO, _size, ctypes.POINTER(EncodeOpts), _BUF, _size,
                                      _BUF, _size, ctypes.POINTER(StateDigest), _BUF]),
    "pulse_pub_shard_encode_file": (_int, [_INFO, _size, ctypes.POINTER(EncodeOpts), _BUF, _size,
                                           _BUF, _size, ctypes.c_char_p,
                                           ctypes.POINTER(_u64)]),
    "pulse_pub_shard_state_digest": (_int, [_INFO, _size, ctypes.c_uint32, _BUF, _size, _int,
                                            ctypes.POINTER(StateDigest)]),
    "pulse_pub_shard_anchor_write": (_int, [_p, ctypes.c_char_p, _u64,
                                            ctypes.POINTER(StateDigest), _int]),
    "pulse_pub_shard_anchor_header": (_int, [_p, _u64, ctypes.POINTER(StateDigest), _BUF,
                                             ctypes.POINTER(_u64)]),
    "pulse_pub_shard_anchor_read": (_int, [_p, _int, _u64, _u64, _u64, _BUF]),
    "pulse_pub_anchor_owned": (_int, [_INFO, _size, ctypes.POINTER(PubBlock), _size, _u64, _u64,
                                      _u64, ctypes.POINTER(_u64)]),
    "pulse_pub_anchor_place": (_int, [_INFO, _size, ctypes.POINTER(PubBlock), _size, _u64, _u64,
                                      _u64, _p, _size, _p]),
    "pulse_pub_shard_resume": (_int, [_p, ctypes.c_char_p]),
    "pulse_pub_shard_advance": (None, [_p]),
    "pulse_pub_shard_snapshot": (ctypes.c_void_p, [_p, _size]),
    "pulse_pub_shard_abort": (None, [_p]),
    "pulse_pub_shard_step": (_int, [_p, ctypes.c_char_p, ctypes.POINTER(PubShardStepOpts), _u64,
                                    ctypes.POINTER(PubTensor), _size, ctypes.POINTER(PubFigures)]),
    "pulse_pub_create_committer": (_int, [ctypes.c_char_p, ctypes.POINTER(PubOpts),
                                          ctypes.POINTER(_p)]),
    "pulse_pub_commit_made": (_int, [_p, _u64, _BUF, ctypes.c_char_p,
                                     ctypes.POINTER(StateDigest), ctypes.POINTER(PubFigures)]),
    "pulse_pub_commit_made_uploaded": (_int, [_p, _u64, _BUF, ctypes.c_char_p, _u64,
                                              ctypes.POINTER(StateDigest),
                                              ctypes.POINTER(PubFigures)]),
    "pulse_pub_anchor_due": (_int, [_p, _u64]),
    "pulse_upload_key_put": (_int, [_p, ctypes.c_char_p, ctypes.c_char_p, _size]),
    "pulse_upload_key_get": (_int, [_p, ctypes.c_char_p, _BUF]),
    "pulse_upload_key_delete": (_int, [_p, ctypes.c_char_p]),
    "pulse_upload_fetch_store": (_int, [_p, ctypes.c_char_p, ctypes.POINTER(_size)]),
    "pulse_store_head_load": (_int, [ctypes.c_char_p, ctypes.POINTER(_p)]),
    "pulse_store_head_step": (_u64, [_p]),
    "pulse_store_head_free": (None, [_p]),
}

_declared = False


def declared():
    """libpulse with the declarations above set (once)."""
    global _declared
    if not _declared:
        for name, (restype, argtypes) in _PROTOS.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _declared = True
    return lib


class _Owned:
    """A filled pulse_buffer, freed when the last tensor over it is gone."""

    __slots__ = ("buf",)

    def __init__(self, buf):
        self.buf = buf

    def __del__(self):
        try:
            declared().pulse_buffer_free(ctypes.byref(self.buf))
        except Exception:  # interpreter shutdown: the process frees it
            pass


def take(buf):
    """The bytes of a filled pulse_buffer as a uint8 CPU tensor over the C
    memory, not a copy (parts and counts are O(changes): a copy would hold
    them twice); the buffer is freed once the tensor and every view of it
    are gone."""
    import torch  # the sharded publish is given torch tensors

    if not buf.size:
        declared().pulse_buffer_free(ctypes.byref(buf))
        return torch.empty(0, dtype=torch.uint8)
    array = (ctypes.c_uint8 * buf.size).from_address(buf.data)
    array._owner = _Owned(buf)  # torch.frombuffer keeps the array alive
    return torch.frombuffer(array, dtype=torch.uint8)


def buffers(chunks):
    """A pulse_buffer array over contiguous uint8 CPU tensors (borrowed:
    the caller keeps `chunks` alive while C reads them)."""
    array = (Buffer * max(1, len(chunks)))()
    for i, chunk in enumerate(chunks):
        array[i].data = chunk.data_ptr() if chunk.numel() else None
        array[i].size = chunk.numel()
    return array
