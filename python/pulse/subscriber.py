"""pulse.Subscriber: keeps BF16 tensors of this process equal to a
publisher's newest step."""

import ctypes
import os
import queue
import shutil
import tempfile
import threading

from . import _tensors
from . import fp8 as _fp8
from ._lib import (Closing, SUB_CLASS_INDEX_AUTO, SUB_CLASS_INDEX_OFF, SUB_CLASS_INDEX_ON,
                   SUB_EV_SYNCED, SUB_NO_STEP, Error, Region, SubEventFn, SubFigures, SubOpts,
                   TensorInfo, check, fail, figures_dict, lib)
from .mapping import Mapping, device_targets

class Subscriber(Closing):
    """Follows the publisher at `url` (a base URL, or a list of them: the
    newest valid head of all is followed) (inference_side/pulse_subscriber.h).

    key: the publisher's public key, 64 hex digits (Publisher.public_key,
    pulse-publish --public-key), pinned. Without one the library refuses
    to start unless trust_first_use=True, which trusts the first head's key
    and keeps it in the cache (a warning says so). cache_dir:
    where verified objects are kept (a store's layout; default a temporary
    folder removed by close()). retries, threads, timeouts: as in
    pulse_sub_opts. class_index: whether host targets keep a class index
    (2.13 bytes a parameter: class-model patches then decode without a pass
    over the weights; the same result either way): "auto" (the default:
    decided per step, only where it fits memory_budget and patches are
    sparse; figures()["class_index_why"] says what and why), True (always)
    or False (never). memory_budget: bytes the subscriber may keep beside
    its targets and the step it applies (None: a tenth of the targets'
    bytes, which the index never fits, so that a pull's peak stays within
    the targets + 10% + the patch).
    """

    def __init__(self, url, key=None, *, cache_dir=None, retries=None, threads=0,
                 connect_timeout_ms=None, request_timeout_ms=None, poll_timeout_ms=None,
                 class_index="auto", memory_budget=None, trust_first_use=False):
        self._sub = None
        self._own_cache = None
        urls = [url] if isinstance(url, str) else list(url)
        if not urls or not all(isinstance(u, str) for u in urls):
            raise fail("Subscriber: url must be a str or a list of str")
        self._urls_bytes = [u.encode() for u in urls]
        self._urls = (ctypes.c_char_p * len(urls))(*self._urls_bytes)
        self._key = None
        if key is None and not trust_first_use:
            raise fail("Subscriber: no key: pass key= the publisher's public key (64 hex digits: "
                       "Publisher.public_key, pulse-publish --public-key), or trust_first_use=True")
        if key is not None:
            self._key = (ctypes.c_char * 32)()
            if not isinstance(key, str):
                raise fail("Subscriber: key must be 64 hex digits (a str)")
            check(lib.pulse_sub_key_from_hex(key.encode(), self._key))
        if cache_dir is None:
            cache_dir = self._own_cache = tempfile.mkdtemp(prefix="pulse-sub-")
        self.cache_dir = os.fspath(cache_dir)
        self._opts = SubOpts()
        self._opts.urls = self._urls
        self._opts.url_count = len(urls)
        self._cache_bytes = os.fsencode(self.cache_dir)
        self._opts.cache_dir = self._cache_bytes
        self._opts.public_key = ctypes.cast(self._key, ctypes.c_void_p) if self._key else None
        self._opts.threads = threads
        modes = {"auto": SUB_CLASS_INDEX_AUTO, True: SUB_CLASS_INDEX_ON, False: SUB_CLASS_INDEX_OFF}
        if not any(class_index is mode for mode in (True, False)) and class_index != "auto":
            raise fail('Subscriber: class_index must be "auto", True or False')
        self._opts.class_index = modes[class_index]
        if memory_budget is not None:
            if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) \
                    or not 0 < memory_budget < 2**64:
                raise fail("Subscriber: memory_budget must be a byte count of at least 1 (an int)")
            self._opts.memory_budget_bytes = memory_budget
        self._opts.trust_first_use = 1 if trust_first_use else 0
        for field, value in (("retries", retries), ("connect_timeout_ms", connect_timeout_ms),
                             ("request_timeout_ms", request_timeout_ms),
                             ("poll_timeout_ms", poll_timeout_ms)):
            if value is not None:
                setattr(self._opts, field, value)
        self._events = None  # a queue while follow() runs
        self._on_event = SubEventFn(self._event)
        self._opts.on_event = self._on_event
        self._layout = None  # what is attached: ((name, ptr, shape), ...)
        self._targets = None  # the attached tensors, kept alive
        self._device = None  # a CUDA target when the targets are on a device
        self._fp8_shadows = {}  # FP8 targets' BF16 shadows, kept across pulls

    # ------------------------------------------------------------ targets
    def _attach(self, targets, mapping):
        if mapping is not None and not isinstance(mapping, Mapping):
            raise fail("pull: mapping must be a pulse.Mapping")
        pairs = _tensors.items(targets, "targets")
        if not pairs:
            raise fail("pull: no targets")
        # FP8 targets: their BF16 shadows take their place (pulse.fp8).
        pairs, fp8 = _fp8.split(pairs, self._fp8_shadows)
        layout = []
        device = None
        for name, tensor in pairs:
            _, is_cuda, shape = _tensors.check(name, tensor, ("bf16",), "target")
            if is_cuda:
                _tensors.require_cuda(name, "target")
                device = tensor
            layout.append((name, tensor.data_ptr(), shape, is_cuda))
        if len({entry[3] for entry in layout}) > 1:
            raise fail("pull: host and CUDA targets do not mix")
        layout = (mapping.key() if mapping is not None else None, tuple(layout),
                  tuple(b.key() for b in fp8))
        if layout == self._layout and self._sub is not None:
            return
        self._free_sub()
        self._opts.cuda_stream = _tensors.current_stream(device) if device is not None else None
        sub = ctypes.c_void_p()
        check(lib.pulse_sub_create(ctypes.byref(self._opts), ctypes.byref(sub)))
        try:
            if mapping is not None:
                self._attach_mapped(sub, mapping, dict(pairs), device is not None)
            for name, ptr, shape, is_cuda in (() if mapping is not None else layout[1]):
                dims = (ctypes.c_uint64 * len(shape))(*shape)
                attach = lib.pulse_sub_attach_device if is_cuda else lib.pulse_sub_attach_host
                status = attach(sub, name.encode(), len(shape), dims, ptr)
                if status != 0:
                    check(status, f"target '{name}': " + lib.pulse_error_detail().decode())
            for binding in fp8:  # quantizes the shadow into the FP8 target now
                binding.bind(sub)
        except Error:
            lib.pulse_sub_free(sub)
            raise
        self._sub = sub
        self._layout = layout
        self._targets = [tensor for _, tensor in pairs] + [(b.q, b.scale) for b in fp8]
        self._fp8_shadows = {b.key(): b.shadow for b in fp8}
        self._device = device  # a CUDA target, for the stream order

    def _free_sub(self):
        if self._sub is not None:
            lib.pulse_sub_free(self._sub)
            self._sub = None
            self._layout = None
            self._targets = None
            self._device = None

    def _table(self, sub):
        """{name: shape} of the publisher's table at its head
        (pulse_sub_table: the head verified, its newest anchor's header)."""
        table, count = ctypes.POINTER(TensorInfo)(), ctypes.c_size_t()
        status = lib.pulse_sub_table(sub, ctypes.byref(table), ctypes.byref(count))
        if status != 0:
            check(status, lib.pulse_sub_error(sub).decode(errors="replace"))
        try:
            return {table[i].name.decode(): tuple(table[i].shape[d] for d in range(table[i].ndim))
                    for i in range(count.value)}
        finally:
            lib.pulse_sub_table_free(table)

    def _attach_mapped(self, sub, mapping, targets, on_device):
        """Attaches this rank's blocks of the published tensors, each where
        the mapping puts it in the engine's tensors (pulse_sub_attach_region:
        the C library applies and verifies each block; in CUDA targets, whole
        tensors only: pulse_sub_attach_device). The whole plan is checked
        before the first attach, and attaching writes nothing."""
        table = self._table(sub)
        shapes = {name: tuple(t.shape) for name, t in targets.items()}
        copies = mapping.plan(table, shapes)
        if on_device:
            for d in device_targets(copies, table):
                dims = (ctypes.c_uint64 * max(1, len(d.shape)))(*d.shape)
                ptr = targets[d.target].data_ptr() + 2 * d.offset
                status = lib.pulse_sub_attach_device(sub, d.source.encode(), len(d.shape), dims, ptr)
                if status != 0:
                    detail = lib.pulse_sub_error(sub).decode(errors="replace")
                    check(status, f"target '{d.target}': {detail}")
            return []
        regions = []
        for c in copies:
            # The block's rows lie dst_cols elements apart in the target
            # (a fused or sharded weight: its 2-D view; an expert stack:
            # its last dimension).
            dst = targets[c.target]
            region = Region(c.source.encode(), c.src_row0, c.rows, c.src_col0, c.cols,
                            dst.data_ptr() + 2 * (c.dst_row0 * c.dst_cols + c.dst_col0), c.dst_cols)
            shape = table[c.source]
            dims = (ctypes.c_uint64 * max(1, len(shape)))(*shape)
            status = lib.pulse_sub_attach_region(sub, len(shape), dims, ctypes.byref(region))
            if status != 0:
                check(status, f"target '{c.target}': " + lib.pulse_sub_error(sub).decode(errors="replace"))
            regions.append(region)
        return regions

    def _sync(self, timeout):
        timer = None
        if timeout is not None:
            timer = threading.Timer(timeout, lib.pulse_sub_stop, (self._sub,))
            timer.start()
        try:
            with _tensors.StreamOrder(self._device, self._opts.cuda_stream):
                status = lib.pulse_sub_sync(self._sub)
        finally:
            if timer is not None:
                timer.cancel()
        if status != 0:
            check(status, lib.pulse_sub_error(self._sub).decode(errors="replace"))

    @property
    def step(self):
        """The step the attached targets hold, or None."""
        if self._sub is None:
            return None
        step = lib.pulse_sub_step(self._sub)
        return None if step == SUB_NO_STEP else step

    def figures(self):
        """Counters since the first pull and the split of the last sync
        (pulse_sub_figures: bytes_downloaded, last_total_s, ...), a dict."""
        figures = SubFigures()
        if self._sub is not None:
            lib.pulse_sub_figures_get(self._sub, ctypes.byref(figures))
        return figures_dict(figures)

    def pull(self, targets, mapping=None, timeout=None):
        """Brings the BF16 tensors of `targets` (a mapping name -> tensor,
        names of the publisher's table; a subset is fine) to the
        publisher's head, in place, verified against the signed head and
        the digests; returns the step they hold. The targets stay attached
        until a pull with other tensors, close() or the next pull: they
        must not be written meanwhile. The first pull into targets that
        hold no known step fetches the anchor. On any failure (Error) the
        targets hold a whole step: the one they held before, or for a
        chain of several patches, the last one reached. timeout: seconds
        for the whole pull."""
        self._attach(targets, mapping)
        self._sync(timeout)
        return self.step

    def _event(self, ctx, event):
        events = self._events
        if events is not None and event.contents.type == SUB_EV_SYNCED:
            events.put(("step", event.contents.step))

    def follow(self, targets=None, mapping=None):
        """Yields each new step once the targets hold it (the first yield:
        the head's step after an initial sync). While the caller's code
        runs between two yields, the targets hold that step and are not
        written: the next step downloads and decodes meanwhile, and is
        applied when the generator is resumed. Ends on close() of the
        generator (a `break`) or with Error (a failure that retrying does
        not mend: bad arguments, memory); network failures are retried.
        targets: as for pull (None: the last pull's)."""
        if targets is not None:
            self._attach(targets, mapping)
        elif self._sub is None:
            raise fail("follow: no targets (pass them, or pull first)")
        sub = self._sub
        events = self._events = queue.Queue()

        def run():
            status = lib.pulse_sub_follow(sub)
            detail = lib.pulse_sub_error(sub).decode(errors="replace")
            events.put(("end", (status, detail)))

        thread = threading.Thread(target=run, name="pulse-follow", daemon=True)
        thread.start()
        last = None
        try:
            while True:
                kind, value = events.get()
                if kind == "end":
                    check(value[0], value[1])
                    return
                held = ctypes.c_uint64()
                lib.pulse_sub_read_lock(sub, ctypes.byref(held))
                try:
                    if held.value != SUB_NO_STEP and held.value != last:
                        _tensors.wait_for(self._device, self._opts.cuda_stream)
                        last = held.value
                        yield last
                finally:
                    lib.pulse_sub_read_unlock(sub)
        finally:
            lib.pulse_sub_stop(sub)
            thread.join()
            self._events = None

    def close(self):
        """Frees the subscriber (the targets keep their contents) and a
        temporary cache folder."""
        self._free_sub()
        if self._own_cache is not None:
            shutil.rmtree(self._own_cache, ignore_errors=True)
            self._own_cache = None
