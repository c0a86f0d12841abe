"""One S3 object uploaded in parts by several processes, and a SHA-256
whose state travels between them (trainer_side/pulse_upload.h, "One object,
its parts put by several handles"; codec/pulse_sha256.h).

A sharded trainer's ranks on hosts without a shared filesystem upload the
parts of one anchor as ONE multipart upload, and hash it as a chain: the
rank of part k goes on from the SHA-256 state after part k-1.

    up = PartUploader("s3://bkt/runs/7")       # credentials from the env
    upload_id = up.begin(rel)                    # one rank; sent to the others
    etag = up.put(rel, upload_id, k, part_k)     # each rank, its parts
    up.finish(rel, upload_id, etags)             # one rank, every ETag

    h = Sha256(state_from_previous_rank)         # None for part 1
    h.add(part_k); send(h.state)                 # or h.digest() for the last

The GIL is released while a request runs (ctypes), so ranks' threads put
parts at once; one PartUploader is used by one thread at a time (a lock
here makes sharing one safe, but serial: give each thread its own)."""

import contextlib
import ctypes
import os
import threading

from ._lib import (Closing, Error, Sha256State, UploadOpts, check, fail, lib)

__all__ = ["PartUploader", "Sha256"]

_ID_CAP = 1024  # any UploadId (pulse_upload.h)
_ETAG_CAP = 256  # any ETag


def _py_buffer_api():
    """CPython's Py_buffer and PyObject_GetBuffer/PyBuffer_Release (the
    buffer protocol, a stable part of CPython's C API), to borrow the bytes
    of any object exporting them, read-only ones (bytes) included, without
    a copy. Built at first use inside this function: the struct is
    Python's, not libpulse's, so it is not one of the package's structs
    that tests/python/test_struct_layout.py checks against pulse's headers."""
    global _BUFFER_API
    if _BUFFER_API is None:
        class PyBuffer(ctypes.Structure):
            _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p),
                        ("len", ctypes.c_ssize_t), ("itemsize", ctypes.c_ssize_t),
                        ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                        ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p),
                        ("strides", ctypes.c_void_p), ("suboffsets", ctypes.c_void_p),
                        ("internal", ctypes.c_void_p)]
        get = ctypes.pythonapi.PyObject_GetBuffer
        get.argtypes = [ctypes.py_object, ctypes.POINTER(PyBuffer), ctypes.c_int]
        get.restype = ctypes.c_int
        release = ctypes.pythonapi.PyBuffer_Release
        release.argtypes = [ctypes.POINTER(PyBuffer)]
        release.restype = None
        _BUFFER_API = (PyBuffer, get, release)
    return _BUFFER_API


_BUFFER_API = None


@contextlib.contextmanager
def _borrowed(data, what):
    """(address, length) of data's bytes for the duration of the block: a
    contiguous CPU torch tensor (data_ptr, any dtype) or any contiguous
    object of the buffer protocol (bytes, bytearray, memoryview, numpy)."""
    if hasattr(data, "data_ptr") and hasattr(data, "element_size"):  # torch
        if data.device.type != "cpu" or not data.is_contiguous():
            raise fail(f"{what}: a tensor must be contiguous and on the CPU, not "
                       f"{'contiguous' if data.is_contiguous() else 'strided'} on {data.device}")
        yield (data.data_ptr() or None), data.numel() * data.element_size()
        return
    py_buffer, get_buffer, release_buffer = _py_buffer_api()
    view = py_buffer()
    try:
        get_buffer(data, ctypes.byref(view), 0)  # PyBUF_SIMPLE: contiguous bytes
    except (TypeError, BufferError) as exc:
        raise fail(f"{what}: a contiguous buffer (bytes, memoryview, a CPU tensor) "
                   f"expected, not {type(data).__name__}: {exc}") from None
    try:
        yield view.buf, view.len
    finally:
        release_buffer(ctypes.byref(view))


def _text(value, what):
    if not isinstance(value, str) or not value:
        raise fail(f"{what}: a non-empty str expected, not {value!r}")
    return value.encode()


class PartUploader(Closing):
    """Requests on one S3 target ("s3://BUCKET/PREFIX", as Publisher's
    upload=; endpoint and credentials from the environment like the AWS
    CLI), signed and retried as the publisher's uploads. rel: a path of the
    store under the prefix, "objects/<sha256>.safetensors". Failures raise
    pulse.Error with the method, key, HTTP status and the service's
    message."""

    def __init__(self, target):
        if not isinstance(target, str):
            raise fail("PartUploader: target must be a str (s3://BUCKET/PREFIX)")
        opts = UploadOpts()
        opts.target = target.encode()
        handle = ctypes.c_void_p()
        check(lib.pulse_upload_create(ctypes.byref(opts), ctypes.byref(handle)))
        self._handle = handle
        self._lock = threading.Lock()
        self.target = target

    def _h(self):
        if self._handle is None:
            raise fail("PartUploader: closed")
        return self._handle

    def begin(self, rel):
        """Begins a multipart upload of rel: its upload id (send it to the
        ranks that put parts)."""
        out = ctypes.create_string_buffer(_ID_CAP)
        with self._lock:
            check(lib.pulse_upload_part_begin(self._h(), _text(rel, "begin: rel"), out, _ID_CAP))
        return out.value.decode()

    def put(self, rel, upload_id, number, data):
        """Puts data (bytes, memoryview, a contiguous CPU tensor: borrowed,
        not copied) as part `number` (1..10000) of upload_id: its ETag.
        S3 refuses parts other than the last under 5 MiB at finish."""
        if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= 10000:
            raise fail(f"put: part number {number!r} is not in 1..10000")
        etag = ctypes.create_string_buffer(_ETAG_CAP)
        rel_b, id_b = _text(rel, "put: rel"), _text(upload_id, "put: upload_id")
        with _borrowed(data, "put: data") as (address, length), self._lock:
            check(lib.pulse_upload_part_put(self._h(), rel_b, id_b, number, address, length,
                                            etag, _ETAG_CAP))
        return etag.value.decode()

    def finish(self, rel, upload_id, etags):
        """Completes upload_id with parts 1..len(etags) (etags[k] is part
        k+1's): rel then holds their bytes in order. On failure the upload
        stays open (finish again, or abort)."""
        etags = list(etags)
        if not etags or not all(isinstance(e, str) for e in etags):
            raise fail("finish: etags must be a non-empty list of str")
        array = (ctypes.c_char_p * len(etags))(*[e.encode() for e in etags])
        with self._lock:
            check(lib.pulse_upload_part_finish(self._h(), _text(rel, "finish: rel"),
                                               _text(upload_id, "finish: upload_id"),
                                               array, len(etags)))

    def abort(self, rel, upload_id):
        """Aborts upload_id: its parts are dropped, rel is not written.
        pulse.Error PULSE_ERR_NOT_FOUND when the service knows no such
        upload (completed, aborted, never begun)."""
        with self._lock:
            check(lib.pulse_upload_part_abort(self._h(), _text(rel, "abort: rel"),
                                              _text(upload_id, "abort: upload_id")))

    def size(self, rel):
        """The size in bytes of the bucket's object rel, or None when there
        is none."""
        size = ctypes.c_uint64()
        with self._lock:
            status = lib.pulse_upload_object_size(self._h(), _text(rel, "size: rel"),
                                                  ctypes.byref(size))
            try:
                check(status)
            except Error as exc:
                if exc.status == "PULSE_ERR_NOT_FOUND":
                    return None
                raise
        return size.value

    def fetch_missing(self, store_dir):
        """Fetches into the store folder store_dir the objects its
        head.json names that it lacks, from the bucket (streamed, checked
        against their names and sizes; a mismatch raises
        PULSE_ERR_CORRUPT and leaves nothing): how many were fetched."""
        fetched = ctypes.c_size_t()
        with self._lock:
            check(lib.pulse_upload_fetch_missing(self._h(), os.fsencode(store_dir),
                                                 ctypes.byref(fetched)))
        return fetched.value

    def close(self):
        """Frees the handle (requests running elsewhere are not its)."""
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is not None:
            lib.pulse_upload_free(handle)


class Sha256:
    """A running SHA-256 whose state is bytes: Sha256() starts one,
    Sha256(state) goes on from a state another process sent (a process
    running the same libpulse build; never store it). add() hashes more
    bytes (any buffer, as PartUploader.put takes), .state is the state now
    (bytes, picklable), digest() ends the hash: the 32-byte SHA-256 of
    everything added, the same as hashlib.sha256 of their concatenation."""

    def __init__(self, state=None):
        self._state = Sha256State()
        if state is None:
            lib.pulse_sha256_begin(ctypes.byref(self._state))
            return
        state = bytes(state)
        if len(state) != ctypes.sizeof(Sha256State):
            raise fail(f"Sha256: a state is {ctypes.sizeof(Sha256State)} bytes, not {len(state)}")
        ctypes.memmove(ctypes.byref(self._state), state, len(state))
        check(lib.pulse_sha256_add(ctypes.byref(self._state), None, 0))  # refused if not a state

    def add(self, data):
        """Hashes data's bytes next; returns self."""
        with _borrowed(data, "Sha256.add") as (address, length):
            check(lib.pulse_sha256_add(ctypes.byref(self._state), address, length))
        return self

    @property
    def state(self):
        """The running state, to send to the process that goes on."""
        return bytes(self._state.bytes)

    def digest(self):
        """Ends the hash: its 32 bytes (the state is then ended)."""
        out = (ctypes.c_uint8 * 32)()
        check(lib.pulse_sha256_end(ctypes.byref(self._state), out))
        return bytes(out)
