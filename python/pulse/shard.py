"""What every rank of a sharded publisher does alone (trainer_side/
pulse_pub_shard.h): its blocks, described and checked; the whole table
built from every rank's descriptions; its C shard (snapshot of its blocks,
detection, counts, its blocks of an anchor); the store's committer on the
committing rank. How the ranks talk is elsewhere: shard_group.py (a
torch.distributed group), shard_store.py (the store folder)."""

import ctypes
import os

from . import _tensors
from ._lib import (DTYPE_BF16, PULSE_MAX_DIMS, PUB_HOST, Error, PubFigures, PubTensor, TensorInfo,
                   check, fail, figures_dict)
from ._shard_lib import (BLOCK_FLAT, BLOCK_RECT, EncodeOpts, PubBlock, PubShardOpts, StateDigest,
                         buffers, declared, take, Buffer)


class Block:
    """This rank's part of one published tensor, for Publisher.publish of a
    sharded trainer.

    tensor: the rank's local part (contiguous, FP32 or BF16; CPU, or CUDA:
    cast to BF16 on the device and copied to the host for detection).
    full_shape: the whole tensor's shape. start: a tuple (one start per
    dimension: the block is the rectangle of tensor.shape at that corner;
    FSDP2/DTensor dim-0 shards, Megatron column/row blocks) or an int (the
    block is tensor.numel() consecutive elements of the flattened tensor
    from there; FSDP1/ZeRO-3 flat parameters). Checked at publish, so that
    a bad block makes every rank raise, not this one alone."""

    __slots__ = ("tensor", "full_shape", "start")

    def __init__(self, tensor, full_shape, start):
        self.tensor = tensor
        self.full_shape = full_shape
        self.start = start

    def __repr__(self):
        shape = tuple(getattr(self.tensor, "shape", ()))
        return f"pulse.Block({shape} of {self.full_shape} at {self.start})"


def _ints(value, what, positive):
    try:
        out = tuple(value)
    except TypeError:
        raise fail(f"{what}: a tuple of ints expected, not {type(value).__name__}") from None
    low = 1 if positive else 0
    if not out or len(out) > PULSE_MAX_DIMS or \
            not all(isinstance(v, int) and not isinstance(v, bool) and v >= low for v in out):
        raise fail(f"{what}: 1 to {PULSE_MAX_DIMS} ints >= {low} expected, got {value!r}")
    return out


def describe(name, value):
    """(description, tensor) of one entry of publish's blocks: the
    description is (name, full_shape, kind, start, extent), plain ints,
    the same on every rank for the same block; tensor None for a block of
    no elements (it owns nothing)."""
    if isinstance(value, Block):
        tensor, full, start = value.tensor, value.full_shape, value.start
    else:  # a whole tensor: the rank owns all of it
        tensor, full, start = value, None, None
    torch = _tensors._torch()
    if not isinstance(tensor, torch.Tensor):
        raise fail(f"block '{name}': a torch.Tensor or a pulse.Block expected, "
                   f"not {type(tensor).__name__}")
    if full is None:
        full = tuple(int(s) for s in tensor.shape)
        start = (0,) * len(full)
    full = _ints(full, f"block '{name}': full_shape", True)
    if tensor.numel() == 0:
        return (name, full, BLOCK_RECT, (0,) * len(full), (0,) * len(full)), None
    _tensors.check(name, tensor, ("f32", "bf16"), "block")
    numel = 1
    for s in full:
        numel *= s
    if isinstance(start, int) and not isinstance(start, bool):
        count = tensor.numel()
        if start < 0 or start + count > numel:
            raise fail(f"block '{name}': elements [{start}, {start + count}) are outside its "
                       f"{numel} (full_shape {list(full)})")
        return (name, full, BLOCK_FLAT, (start,), (count,)), tensor
    start = _ints(start, f"block '{name}': start", False)
    extent = tuple(int(s) for s in tensor.shape)
    if len(start) != len(full) or len(extent) != len(full):
        raise fail(f"block '{name}': start {list(start)} and the tensor's shape {list(extent)} "
                   f"need one entry per dimension of full_shape {list(full)} (or start an int: "
                   f"an element range)")
    for d, (a, e, n) in enumerate(zip(start, extent, full)):
        if a + e > n:
            raise fail(f"block '{name}': dimension {d}: [{a}, {a + e}) is outside its {n}")
    return (name, full, BLOCK_RECT, start, extent), tensor


def parse_blocks(blocks):
    """[(description, tensor)] of publish's `blocks` (a mapping or (name,
    value) pairs; a block of no elements is dropped)."""
    pairs = _tensors.items(blocks, "publish")
    out = []
    for name, value in pairs:
        desc, tensor = describe(name, value)
        if tensor is not None:
            out.append((desc, tensor))
        else:
            out.append((desc, None))
    return out


def build_table(rank_descs):
    """[(name, full_shape)] from every rank's descriptions (rank order): a
    tensor's place is its first mention, rank 0's blocks first, each rank's
    in its own order. Raises Error naming the tensor when two ranks give it
    different shapes."""
    order, shapes = [], {}
    for rank, descs in enumerate(rank_descs):
        for name, full, *_ in descs:
            if name not in shapes:
                shapes[name] = (full, rank)
                order.append(name)
            elif shapes[name][0] != full:
                raise fail(f"tensor '{name}': rank {rank} gives its full shape as {list(full)}, "
                           f"rank {shapes[name][1]} as {list(shapes[name][0])}",
                           "PULSE_ERR_SIZE_MISMATCH")
    if not order:
        raise fail("publish: no rank gave a block")
    return [(name, shapes[name][0]) for name in order]


class Table:
    """The whole table as the C API takes it (pulse_tensor_info, BF16)."""

    def __init__(self, table):
        self.entries = table
        self.names = [name.encode() for name, _ in table]
        self.infos = (TensorInfo * len(table))()
        for i, (_, shape) in enumerate(table):
            self.infos[i].name = self.names[i]
            self.infos[i].dtype = DTYPE_BF16
            self.infos[i].ndim = len(shape)
            for d, size in enumerate(shape):
                self.infos[i].shape[d] = size

    def __len__(self):
        return len(self.entries)


def c_blocks(descs):
    """A pulse_pub_block array of descriptions (names kept alive in it)."""
    array = (PubBlock * max(1, len(descs)))()
    array._names = [desc[0].encode() for desc in descs]
    for i, (name, full, kind, start, extent) in enumerate(descs):
        array[i].name = array._names[i]
        array[i].kind = kind
        for d, (a, e) in enumerate(zip(start, extent)):
            array[i].start[d] = a
            array[i].extent[d] = e
    return array


def check_tiling(table, rank_descs):
    """pulse_pub_blocks_check over every rank's blocks (those of elements):
    raises Error naming the tensor when they overlap, leave elements out or
    lie outside their tensor."""
    lib = declared()
    kept = [[d for d in descs if any(d[4])] for descs in rank_descs]
    arrays = [c_blocks(descs) for descs in kept]
    pointers = (ctypes.POINTER(PubBlock) * len(arrays))(
        *[ctypes.cast(a, ctypes.POINTER(PubBlock)) for a in arrays])
    counts = (ctypes.c_size_t * len(arrays))(*[len(d) for d in kept])
    check(lib.pulse_pub_blocks_check(table.infos, len(table), pointers, counts, len(arrays)))


def _uint8_cpu(tensor, what):
    torch = _tensors._torch()
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8 or \
            tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise fail(f"anchor part: {what} must be a contiguous uint8 CPU tensor")
    return tensor


def anchor_owned(table, descs, header_size, off, length):
    """How many bytes of the anchor file's range [off, off + length) the
    blocks `descs` (any rank's descriptions, as c_blocks) own
    (pulse_pub_anchor_owned): the size of that rank's anchor_read."""
    kept = [d for d in descs if any(d[4])]
    owned = ctypes.c_uint64()
    check(declared().pulse_pub_anchor_owned(table.infos, len(table), c_blocks(kept), len(kept),
                                            header_size, off, length, ctypes.byref(owned)))
    return owned.value


def anchor_place(table, descs, header_size, off, length, data, dst):
    """Writes a rank's anchor_read bytes `data` of [off, off + length) at
    their places in `dst` (`length` bytes, dst[0] at file offset off;
    pulse_pub_anchor_place). Both contiguous uint8 CPU tensors; raises
    Error (nothing written) when data is not the blocks' bytes count."""
    _uint8_cpu(data, "data")
    _uint8_cpu(dst, "dst")
    if dst.numel() != length:
        raise fail(f"anchor part: dst holds {dst.numel()} bytes, not the range's {length}")
    kept = [d for d in descs if any(d[4])]
    check(declared().pulse_pub_anchor_place(
        table.infos, len(table), c_blocks(kept), len(kept), header_size, off, length,
        data.data_ptr() if data.numel() else None, data.numel(),
        dst.data_ptr() if dst.numel() else None))


class RankShard:
    """This rank's C shard (pulse_pub_shard): the BF16 snapshot of its
    blocks and the pending step. pos_model: the committer's (the rank codes
    the chunks its blocks cover entirely itself)."""

    def __init__(self, table, descs, chunk_log2, pos_model):
        self.table = table
        self.descs = [d for d in descs if any(d[4])]
        self.chunk_log2 = chunk_log2
        self.pos_model = pos_model
        self._blocks = c_blocks(self.descs)
        self._handle = None
        self._make()

    def _make(self):
        opts = PubShardOpts()
        opts.tensors = self.table.infos
        opts.tensor_count = len(self.table)
        opts.blocks = self._blocks
        opts.block_count = len(self.descs)
        opts.chunk_log2 = self.chunk_log2
        opts.pos_model = self.pos_model
        handle = ctypes.c_void_p()
        check(declared().pulse_pub_shard_create(ctypes.byref(opts), ctypes.byref(handle)))
        self._handle = handle

    def reset(self):
        """Drops the snapshot (a store's first step that failed: its retry
        takes a new one)."""
        self.free()
        self._make()

    @property
    def handle(self):
        return self._handle

    def host_tensors(self, parsed):
        """The pulse_pub_tensor array of this rank's blocks from parse_blocks'
        output (in the shard's block order), and what must stay alive while
        C reads it. Raises Error when the blocks are not the ones the shard
        was made with. A CUDA block is cast to BF16 on its device (the one
        rounding: pulse's equals torch's) and copied to the host."""
        given = {desc[0]: (desc, tensor) for desc, tensor in parsed if tensor is not None}
        mine = {desc[0]: desc for desc in self.descs}
        for name in given:
            if name not in mine:
                raise fail(f"block '{name}': this rank had no block of it when the publisher was "
                           "created (the blocks are fixed at the first publish)")
        array = (PubTensor * max(1, len(self.descs)))()
        alive = []
        for i, desc in enumerate(self.descs):
            if desc[0] not in given:
                raise fail(f"block '{desc[0]}' of this rank is missing (the blocks are fixed at "
                           "the first publish)")
            got, tensor = given[desc[0]]
            if got != desc:
                raise fail(f"block '{desc[0]}': {got[1:]} is not the block this rank had at the "
                           f"first publish, {desc[1:]} (the blocks are fixed)")
            code, is_cuda, _ = _tensors.check(desc[0], tensor, ("f32", "bf16"), "block")
            if is_cuda:
                tensor = tensor.to(_tensors._torch().bfloat16).cpu()
                code = DTYPE_BF16
            alive.append(tensor)
            array[i].data = tensor.data_ptr()
            array[i].dtype = code
            array[i].memory = PUB_HOST
        return array, alive

    def detect(self, array):
        """This rank's part of the step (a uint8 tensor)."""
        out = Buffer()
        check(declared().pulse_pub_shard_detect(self._handle, array, len(self.descs),
                                                ctypes.byref(out)))
        return take(out)

    def part_for(self, part, descs):
        """`part` (a uint8 tensor) cut to what a rank whose blocks are `descs`
        reads when it counts (pulse_pub_shard_part_for)."""
        kept = [d for d in descs if any(d[4])]
        blocks = c_blocks(kept)
        out = Buffer()
        check(declared().pulse_pub_shard_part_for(self._handle, buffers([part]), blocks,
                                                  len(kept), ctypes.byref(out)))
        return take(out)

    def count(self, parts):
        """This rank's counts of the step (a uint8 tensor) from every rank's
        part (uint8 tensors, rank order)."""
        out = Buffer()
        check(declared().pulse_pub_shard_count(self._handle, buffers(parts), len(parts),
                                               ctypes.byref(out)))
        return take(out)

    def state_digest(self, parts, target):
        digest = StateDigest()
        check(declared().pulse_pub_shard_state_digest(self.table.infos, len(self.table),
                                                      self.chunk_log2, buffers(parts),
                                                      len(parts), 1 if target else 0,
                                                      ctypes.byref(digest)))
        return digest

    def anchor_write(self, path, step, digest, pending):
        check(declared().pulse_pub_shard_anchor_write(self._handle, os.fsencode(path), step,
                                                      ctypes.byref(digest), 1 if pending else 0))

    def anchor_header(self, step, digest):
        """(header bytes, file size) of the anchor of `step` with `digest`
        (pulse_pub_shard_anchor_header): the same on every rank."""
        out = Buffer()
        size = ctypes.c_uint64()
        check(declared().pulse_pub_shard_anchor_header(self._handle, step, ctypes.byref(digest),
                                                       ctypes.byref(out), ctypes.byref(size)))
        header = bytes(take(out).numpy()) if out.size else b""
        return header, size.value

    def anchor_read(self, pending, header_size, off, length):
        """This rank's bytes of the anchor file's range [off, off + length)
        in file order (pulse_pub_shard_anchor_read): a uint8 CPU tensor of
        anchor_owned(table, descs, ...) bytes; `pending` the pending step's
        values instead of the snapshot's."""
        out = Buffer()
        check(declared().pulse_pub_shard_anchor_read(self._handle, 1 if pending else 0,
                                                     header_size, off, length,
                                                     ctypes.byref(out)))
        return take(out)

    def resume(self, store_dir):
        """Takes the snapshot at the store's head: True, or False when the
        store has none."""
        status = declared().pulse_pub_shard_resume(self._handle, os.fsencode(store_dir))
        if status != 0 and declared().pulse_status_name(status) == b"PULSE_ERR_NOT_FOUND":
            return False
        check(status)
        return True

    def snapshot(self, i):
        """A copy of block i's BF16 snapshot (a CPU tensor)."""
        torch = _tensors._torch()
        desc = self.descs[i]
        count = 1
        for e in desc[4]:
            count *= e
        bits = declared().pulse_pub_shard_snapshot(self._handle, i)
        if not bits:
            raise fail(f"block '{desc[0]}': no snapshot yet")
        out = torch.empty(count, dtype=torch.bfloat16)
        ctypes.memmove(out.data_ptr(), bits, 2 * count)
        return out

    def advance(self):
        declared().pulse_pub_shard_advance(self._handle)

    def abort(self):
        declared().pulse_pub_shard_abort(self._handle)

    def free(self):
        if self._handle is not None:
            declared().pulse_pub_shard_free(self._handle)
            self._handle = None


def encode(table, opts, parts, counts):
    """The step's patch (bytes) from every rank's part and counts."""
    out = Buffer()
    check(declared().pulse_pub_shard_encode(table.infos, len(table), ctypes.byref(opts),
                                            buffers(parts), len(parts), buffers(counts),
                                            len(counts), None, ctypes.byref(out)))
    return take(out)


def encode_file(table, opts, parts, counts, path):
    """The step's patch from every rank's part and counts, written into the
    file `path` (pulse_pub_shard_encode_file: the encoding rank never holds
    the streams it received and the patch together); its size."""
    size = ctypes.c_uint64()
    check(declared().pulse_pub_shard_encode_file(table.infos, len(table), ctypes.byref(opts),
                                                 buffers(parts), len(parts), buffers(counts),
                                                 len(counts), os.fsencode(path),
                                                 ctypes.byref(size)))
    return size.value


def mapped(path):
    """(a uint8 CPU tensor over the file's bytes, mapped copy-on-write: its
    pages are the file's until written; the map, to close once the tensor
    is gone)."""
    import mmap

    import torch

    with open(path, "rb") as f:
        view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    return torch.frombuffer(view, dtype=torch.uint8), view


class Committer:
    """The store's one writer on the committing rank
    (pulse_pub_create_committer): the writer lock, recovery, signing,
    retention; it commits the steps the ranks made."""

    def __init__(self, store_dir, table, opts):
        self.store_dir = store_dir
        self.opts = opts
        self.public_key = None  # hex, set by whoever holds the key
        opts.tensors = table.infos
        opts.tensor_count = len(table)
        self._table = table  # opts points into it
        handle = ctypes.c_void_p()
        check(declared().pulse_pub_create_committer(os.fsencode(store_dir), ctypes.byref(opts),
                                                    ctypes.byref(handle)))
        self.handle = handle

    def head_step(self):
        step = ctypes.c_uint64()
        return step.value if declared().pulse_pub_head_step(self.handle, ctypes.byref(step)) \
            else None

    def anchor_due(self, step):
        return bool(declared().pulse_pub_anchor_due(self.handle, step))

    def encode_opts(self, step, base_step, chunk_log2):
        opts = EncodeOpts()
        opts.step = step
        opts.base_step = base_step
        opts.pos_model = self.opts.pos_model
        opts.chunk_log2 = chunk_log2
        opts.threads = self.opts.threads
        return opts

    def commit(self, step, patch, staged, digest):
        """Commits the made step (patch None for a store's first); the
        figures as a dict."""
        figures = PubFigures()
        buf, patch_arg = _patch_arg(patch)
        check(declared().pulse_pub_commit_made(
            self.handle, step, patch_arg, os.fsencode(staged) if staged else None,
            ctypes.byref(digest), ctypes.byref(figures)))
        return figures_dict(figures)

    def commit_uploaded(self, step, patch, sha256, size, digest):
        """Commits the made step whose anchor is already in the bucket,
        named by its SHA-256 (32 bytes) and size (pulse_pub_commit_made_uploaded:
        the local store does not hold it); patch None for a store's first
        step. The figures as a dict."""
        if not isinstance(sha256, (bytes, bytearray)) or len(sha256) != 32:
            raise fail("commit_uploaded: sha256 must be the anchor's 32-byte digest")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 < size < 2 ** 64:
            raise fail(f"commit_uploaded: size {size!r} is not a positive byte count")
        figures = PubFigures()
        buf, patch_arg = _patch_arg(patch)
        check(declared().pulse_pub_commit_made_uploaded(
            self.handle, step, patch_arg, bytes(sha256), size, ctypes.byref(digest),
            ctypes.byref(figures)))
        return figures_dict(figures)

    def free(self):
        if self.handle is not None:
            declared().pulse_pub_free(self.handle)
            self.handle = None


def _patch_arg(patch):
    """(the buffer array to keep alive, the pulse_buffer pointer) of a made
    patch, or (None, None) for a store's first step."""
    if patch is None:
        return None, None
    buf = buffers([patch])
    return buf, ctypes.cast(buf, ctypes.POINTER(Buffer))


def store_head_step(store_dir):
    """The store's head step, or None when it has no head (read from
    head.json by the library, checked as any head)."""
    lib = declared()
    head = ctypes.c_void_p()
    status = lib.pulse_store_head_load(os.fsencode(store_dir), ctypes.byref(head))
    if status != 0 and lib.pulse_status_name(status) == b"PULSE_ERR_NOT_FOUND":
        return None
    check(status)
    try:
        return lib.pulse_store_head_step(head)
    finally:
        lib.pulse_store_head_free(head)


def error_text(exc):
    """(status name, detail) of an exception, to carry to the other ranks."""
    if isinstance(exc, Error):
        return exc.status, exc.detail
    return "PULSE_ERR_IO", f"{type(exc).__name__}: {exc}"
