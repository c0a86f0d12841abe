"""pulse.Publisher: commits a training step's weights into a store."""

import ctypes
import os

from . import _tensors
from .server import notify_store
from ._lib import (Closing, PUB_DEVICE, PUB_HOST, PubFigures, PubOpts, PubTensor, TensorInfo,
                   UploadFigures, UploadOpts, check, fail, figures_dict, lib)


def load_or_create_key(store_dir, key):
    """The signing key: `key` (a PKCS#8 PEM file) when given, else the
    store's signing-key.pem, made on first use (as pulse-publish does)."""
    path = key if key is not None else os.path.join(store_dir, "signing-key.pem")
    handle = ctypes.c_void_p()
    status = lib.pulse_sign_key_load(os.fsencode(path), ctypes.byref(handle))
    if status == 0:
        return handle
    name = lib.pulse_status_name(status).decode()
    if key is not None or name != "PULSE_ERR_NOT_FOUND":
        check(status)
    check(lib.pulse_sign_key_generate(ctypes.byref(handle)))
    status = lib.pulse_sign_key_save(handle, os.fsencode(path))
    if status != 0:
        lib.pulse_sign_key_free(handle)
        check(status)
    return handle


class Publisher(Closing):
    """Opens or creates the store folder `store_dir` and publishes steps
    into it (trainer_side/pulse_publisher.h).

    key: a private key file (Ed25519, PKCS#8 PEM); None creates or reuses
    the store's own (STORE/signing-key.pem). upload: "s3://BUCKET/PREFIX":
    after every step, the objects the head names that the bucket lacks,
    then the head, go up to an S3-compatible store, and retention follows
    (trainer_side/pulse_upload.h, as pulse-publish --upload); configured
    from the environment like the AWS CLI (AWS_ENDPOINT_URL,
    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, ...). The tensor table is the one of
    the first publish for a new store, the store's for an existing one.
    threads: for detection and encoding (0: one per core). anchor_every,
    keep_patches, keep_anchors: as in pulse_pub_opts. plain: write plain
    positions (PULSE_POS_PLAIN, pulse-publish --plain: about 40% more
    position bytes), decoded without base bits; tensor-parallel workers
    (pulse.Mapping) apply either kind into their part of a tensor.
    chunk_log2: elements per patch chunk, 2**chunk_log2 (None: the
    library's default). format_version: the patch format version written
    (None: the library's default, 2; 3 is about 4% smaller, pulse-publish
    --format); a sharded publisher (world > 1) writes the default only.

    Sharded trainers (trainer_side/pulse_pub_shard.h): with world > 1, or
    a torch.distributed `group` of more than one rank, this publisher is
    rank `rank` of a sharded trainer; every rank passes the same store and
    key, and publish is collective (see publish). Over a group the ranks
    talk through its object collectives (gloo on CPU, NCCL on GPU);
    without one, through files in the store folder every rank sees, or,
    with upload= on every rank, through the bucket (ranks on folders of
    their own) (timeout: seconds a rank waits for the others). Over a group
    only rank 0 needs the store: a rank whose store_dir is not rank 0's
    folder (another node) sends rank 0 its blocks of each anchor (BF16, at
    anchor steps) and gets its blocks of the head on a resume. Rank 0 holds
    the key, commits, and with upload= uploads the store after each step.
    With upload= and a rank that does not see rank 0's folder, every rank
    uploads its own parts of each anchor instead (pulse.shard_parts: one
    multipart upload, parts of upload_part_bytes, at least 5 MiB on AWS S3
    but the last), and rank 0's folder stays a staging copy whose head
    names anchors only the bucket holds (it fetches them back when a job
    resumes; serve the bucket, not that folder). That takes upload= (and
    credentials for the bucket) on every rank; with upload= on rank 0
    alone, rank 0 receives the blocks and uploads as above. The
    store is the one a single publisher of the gathered weights makes,
    byte for byte, when the table's order is the same (a tensor's place
    is its first mention: rank 0's blocks first, each rank's in its order).
    """

    def __init__(self, store_dir, key=None, upload=None, rank=None, world=None, group=None, *,
                 anchor_every=16, keep_patches=32, keep_anchors=3, threads=0, plain=False,
                 chunk_log2=None, format_version=None, timeout=60.0,
                 upload_part_bytes=16 << 20):
        self._pub = None
        self._key = None
        self._upload = None
        self._sharded = None
        rank, world = _rank_world(rank, world, group)
        # What the last upload did (pulse_upload_figures), with upload=.
        self.last_upload = None
        self.last_anchor_parts = None
        if upload is not None and not isinstance(upload, str):
            raise fail("Publisher: upload must be a str (s3://BUCKET/PREFIX)")
        # A sharded trainer's rank 0 signs, commits and uploads.
        if upload is not None and rank == 0:
            self._upload_target = upload.encode()
            opts = UploadOpts()
            opts.target = self._upload_target
            handle = ctypes.c_void_p()
            check(lib.pulse_upload_create(ctypes.byref(opts), ctypes.byref(handle)))
            self._upload = handle
        self._upload_spec = (upload, upload_part_bytes)
        self.store_dir = os.fspath(store_dir)
        os.makedirs(self.store_dir, exist_ok=True)
        self._key = load_or_create_key(self.store_dir, key) if rank == 0 else None
        self._opts = PubOpts()
        self._opts.anchor_every = anchor_every
        self._opts.keep_patches = keep_patches
        self._opts.keep_anchors = keep_anchors
        self._opts.threads = threads
        self._opts.pos_model = 0 if plain else 1
        self._opts.key = self._key
        if chunk_log2 is not None:
            self._opts.chunk_log2 = chunk_log2
        if format_version is not None:
            if world > 1:
                raise fail("Publisher: format_version is for a single publisher (the "
                           "sharded one writes the default version)")
            self._opts.format_version = format_version
        self._table = None  # [(name, shape)] in the store's order
        # What the last publish did (pulse_pub_figures: changed, patch_bytes,
        # the C commit's own total_seconds, ...).
        self.last_figures = None
        if world > 1:
            self._sharded = self._shard_rank(rank, world, group, timeout)
        elif os.path.exists(os.path.join(self.store_dir, "head.json")):
            self._open(None)

    def _shard_rank(self, rank, world, group, timeout):
        """One rank of a sharded trainer (pulse.shard_group, pulse.shard_store)."""
        from . import shard, shard_group, shard_store

        target, part_bytes = self._upload_spec
        if not isinstance(part_bytes, int) or isinstance(part_bytes, bool) or part_bytes < 1:
            raise fail(f"Publisher: upload_part_bytes {part_bytes!r} is not a positive int")

        def make_parts():
            from .s3_parts import PartUploader

            return (lambda: PartUploader(target)), part_bytes

        def make_committer(table):
            if target is not None and os.path.exists(os.path.join(self.store_dir, "head.json")):
                # Anchors that every rank uploaded in parts are only in the
                # bucket: they come back before the store opens (recovery
                # refuses a head naming a missing object).
                from .s3_parts import PartUploader

                with_bucket = PartUploader(target)
                try:
                    with_bucket.fetch_missing(self.store_dir)
                finally:
                    with_bucket.close()
            committer = shard.Committer(self.store_dir, table, self._opts)
            committer.public_key = self.public_key
            return committer

        upload = self._upload_figures if self._upload is not None else None
        coding = (self._opts.chunk_log2, self._opts.pos_model)  # every rank codes chunks
        if group is not None:
            return shard_group.GroupPublisher(self.store_dir, group, make_committer, upload,
                                              coding, make_parts if target else None)
        if not isinstance(timeout, (int, float)) or not 0 < timeout < 2 ** 31 / 1000:
            raise fail(f"Publisher: timeout {timeout!r} is not a positive number of seconds")
        return shard_store.StorePublisher(self.store_dir, rank, world, make_committer, upload,
                                          coding, float(timeout), make_parts if target else None)

    def _open(self, table, stream=None):
        names = [name.encode() for name, _ in table] if table else []
        infos = (TensorInfo * max(1, len(names)))()
        for i, (name, shape) in enumerate(table or []):
            infos[i].name = names[i]
            infos[i].dtype = 1
            infos[i].ndim = len(shape)
            for d, size in enumerate(shape):
                infos[i].shape[d] = size
        self._opts.tensors = infos if table else None
        self._opts.tensor_count = len(names)
        self._opts.cuda_stream = stream
        pub = ctypes.c_void_p()
        check(lib.pulse_pub_create(os.fsencode(self.store_dir), ctypes.byref(self._opts),
                                   ctypes.byref(pub)))
        self._pub = pub
        count = lib.pulse_pub_tensor_count(pub)
        self._table = []
        for i in range(count):
            info = lib.pulse_pub_tensor_info(pub, i).contents
            shape = tuple(info.shape[d] for d in range(info.ndim))
            self._table.append((info.name.decode(), shape))

    @property
    def public_key(self):
        """The publisher's Ed25519 public key, 64 hex digits (what a
        Subscriber pins). On a sharded trainer's other ranks: rank 0's,
        once the publisher is made (over a group), else None."""
        if self._key is None:
            return self._sharded.public_key if self._sharded is not None else None
        raw = (ctypes.c_char * 32)()
        lib.pulse_sign_key_public(self._key, raw)
        return bytes(raw).hex()

    @property
    def step(self):
        """The head's step, or None before the first publish (a sharded
        rank: the head it last saw)."""
        if self._sharded is not None:
            return self._sharded.head
        if self._pub is None:
            return None
        step = ctypes.c_uint64()
        return step.value if lib.pulse_pub_head_step(self._pub, ctypes.byref(step)) else None

    def publish(self, tensors, step=None):
        """Commits one step from a mapping or iterable of (name, tensor):
        FP32 master weights (cast to BF16 by the one rounding: only
        BF16-visible changes are published) or BF16, contiguous, on the CPU
        (or on a CUDA device, read on the caller's current stream). The
        names must be the store's table (the first publish of a new store
        makes it), in any order. `step`: above the head's (default: the
        head's + 1, or 1). Returns the step. The tensors are only read,
        during the call. A failure raises Error and publishes nothing.

        A sharded trainer's rank (see the class) gives the blocks it owns:
        a mapping (or pairs) of published names to pulse.Block(tensor,
        full_shape, start), or to a plain tensor for a tensor it owns
        whole; every rank calls publish for every step, with the same
        blocks each time, and every rank returns the same step. The first
        publish checks that the ranks' blocks tile every tensor exactly
        (overlaps, gaps, full shapes that disagree between ranks are refused
        on every rank, naming the tensor, before anything is written).
        Over a group, a rank that raises inside publish makes every rank
        raise with its reason, and nothing is published; the next publish
        retries. A rank that dies leaves the previous step in the store;
        the others raise, and a restarted job resumes from the store."""
        if self._sharded is not None:
            step = self._sharded.publish(tensors, step)
            self.last_figures = self._sharded.last_figures
            self.last_upload = self._sharded.last_upload
            # With anchors uploaded in parts: this rank's parts of the last
            # anchor ({"parts", "bytes", "seconds"}; None before one).
            self.last_anchor_parts = getattr(self._sharded, "last_anchor_parts", None)
            return step
        return self._publish_whole(tensors, step)

    def _publish_whole(self, tensors, step=None):
        pairs = _tensors.items(tensors, "publish")
        checked = {}
        device = None
        for name, tensor in pairs:
            dtype, is_cuda, shape = _tensors.check(name, tensor, ("f32", "bf16"), "tensor")
            checked[name] = (tensor, dtype, is_cuda, shape)
            if is_cuda:
                _tensors.require_cuda(name, "tensor")
                device = tensor
        if self._pub is None:
            if not pairs:
                raise fail("publish: no tensors")
            stream = _tensors.current_stream(device) if device is not None else None
            self._open([(name, checked[name][3]) for name, _ in pairs], stream)
        table_names = {name for name, _ in self._table}
        for name in checked:
            if name not in table_names:
                raise fail(f"tensor '{name}' is not in the store's table", "PULSE_ERR_NOT_FOUND")
        array = (PubTensor * len(self._table))()
        for i, (name, shape) in enumerate(self._table):
            if name not in checked:
                raise fail(f"tensor '{name}' of the store's table is missing", "PULSE_ERR_NOT_FOUND")
            tensor, dtype, is_cuda, got = checked[name]
            if got != shape:
                raise fail(f"tensor '{name}': shape {list(got)}, the store's is {list(shape)}",
                           "PULSE_ERR_SIZE_MISMATCH")
            array[i].data = tensor.data_ptr()
            array[i].dtype = dtype
            array[i].memory = PUB_DEVICE if is_cuda else PUB_HOST
        if step is None:
            head = self.step
            step = 1 if head is None else head + 1
        if not isinstance(step, int) or step < 0:
            raise fail(f"publish: step {step!r} is not a non-negative int")
        figures = PubFigures()
        with _tensors.StreamOrder(device, self._opts.cuda_stream):
            check(lib.pulse_pub_commit(self._pub, step, array, len(self._table),
                                       ctypes.byref(figures)))
        self.last_figures = figures_dict(figures)
        notify_store(self.store_dir)
        self._upload_store()
        return step

    def _upload_store(self):
        """With upload=: the store's head and what it names to the bucket.
        A failure raises Error; the step stays committed in the store and
        the bucket keeps its previous head, and the next upload sends what
        is missing."""
        if self._upload is None:
            return
        self.last_upload = self._upload_figures()

    def _upload_figures(self):
        figures = UploadFigures()
        check(lib.pulse_upload_store(self._upload, os.fsencode(self.store_dir),
                                     ctypes.byref(figures)))
        return figures_dict(figures)

    def flush(self):
        """Waits for an anchor written in the background and names it in
        the head (and, with upload=, uploads that head)."""
        if self._pub is not None:  # a sharded rank's anchors are written in the step
            figures = PubFigures()
            check(lib.pulse_pub_flush(self._pub, ctypes.byref(figures)))
            if figures.flush:
                notify_store(self.store_dir)
                self._upload_store()

    def close(self):
        """Frees the publisher (a background anchor is finished first, and
        with upload= uploaded)."""
        try:
            if self._pub is not None and self._upload is not None:
                self.flush()
        finally:
            self._free()

    def _free(self):
        if self._sharded is not None:
            self._sharded.close()
            self._sharded = None
        if self._upload is not None:
            lib.pulse_upload_free(self._upload)
            self._upload = None
        if self._pub is not None:
            lib.pulse_pub_free(self._pub)
            self._pub = None
        if self._key is not None:
            lib.pulse_sign_key_free(self._key)
            self._key = None


def _rank_world(rank, world, group):
    """(rank, world) of a Publisher: a group's (rank and world, if given,
    must agree), else the given ones, else (0, 1)."""
    for what, value in (("rank", rank), ("world", world)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise fail(f"Publisher: {what} must be an int, not {type(value).__name__}")
    if group is not None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise fail("Publisher: group= given and torch.distributed is not initialized")
        g_rank, g_world = dist.get_rank(group), dist.get_world_size(group)
        if g_rank < 0:
            raise fail("Publisher: this process is not in the group")
        if (rank is not None and rank != g_rank) or (world is not None and world != g_world):
            raise fail(f"Publisher: rank {rank}, world {world} disagree with the group's "
                       f"rank {g_rank} of {g_world}")
        return g_rank, g_world
    if world is None:
        if rank not in (None, 0):
            raise fail("Publisher: rank given without world")
        return 0, 1
    if world < 1 or rank is None or not 0 <= rank < world:
        raise fail(f"Publisher: rank {rank} of world {world}: 0 <= rank < world >= 1 expected")
    return rank, world
