"""One rank of a sharded publisher whose ranks share the store folder and
nothing else (no process group): each step is pulse_pub_shard_step
(trainer_side/pulse_pub_shard.h, docs/protocols/sync.md "Sharded trainers"), which
coordinates through files in STORE/shard/.

Before the first step the ranks need the whole table (names and full
shapes of every tensor, also those a rank has no block of): each rank
writes its block descriptions to STORE/shard/blocks-R.json and reads every
rank's. The tiling is checked on every rank from the same files, so every
rank refuses the same blocks; the C step checks them again from the parts.
A file left by an earlier job that died before its first step can make
the table of a rank that reads it first disagree with the others': the C
step then refuses the parts of another table on every rank, nothing is
written, and the next publish reads the files again.

With a bucket (upload= on every rank: ranks that share no folder), the
same exchange goes through the bucket: each rank passes its own handle to
the C step, whose files are objects under the prefix's shard/, the block
descriptions too (shard/blocks-R.json), and each anchor is uploaded in
parts by the ranks that own its bytes. store_dir is then each rank's own
folder: rank 0's is the store's staging copy (it commits there and
uploads it; its anchors are only in the bucket, fetched back before a
restarted job's committer opens it); another rank's holds, for the time of
a resume, a copy of the bucket's store (pulse_upload_fetch_store), then
nothing.

A step whose upload fails after rank 0's commit fails on every rank with
an error saying the step is committed in rank 0's store and that the next
publish uploads it: rank 0 then brings the bucket up to its store before
the step opens (and, in a restarted job, before it writes its block
descriptions, so the others resume from the bucket's new head), and a rank
below the bucket's head takes its snapshot again. publish(step=None) after
such a failure retries the failed step, which then returns it on every
rank (nothing detected again); publishing the next step goes on as well."""

import ctypes
import json
import os
import shutil
import tempfile
import time

from . import shard
from ._lib import PubFigures, check, fail, figures_dict
from ._shard_lib import Buffer, PubShardStepOpts, declared
from .server import notify_store


class _Bucket:
    """A rank's handle on the store's bucket (pulse.s3_parts.PartUploader)
    and the part size of its anchors."""

    def __init__(self, make_parts):
        # make_parts (pulse.Publisher's): a factory of PartUploaders and
        # the part size.
        new_uploader, self.part_bytes = make_parts()
        self.uploader = new_uploader()

    @property
    def handle(self):
        return self.uploader._h()

    def put(self, rel, data):
        check(declared().pulse_upload_key_put(self.handle, rel.encode(), data, len(data)))

    def get(self, rel):
        """The object's bytes, or None when the bucket has none."""
        lib = declared()
        buf = Buffer()
        status = lib.pulse_upload_key_get(self.handle, rel.encode(), ctypes.byref(buf))
        if status != 0 and lib.pulse_status_name(status) == b"PULSE_ERR_NOT_FOUND":
            return None
        check(status)
        try:
            return ctypes.string_at(buf.data, buf.size) if buf.size else b""
        finally:
            lib.pulse_buffer_free(ctypes.byref(buf))

    def delete(self, rel):
        check(declared().pulse_upload_key_delete(self.handle, rel.encode()))

    def head_step(self):
        """The bucket's head step, or None when it has none. A head caught
        mid-write (a service that writes objects in place, as s3rver does,
        answers with what it has so far; S3 does not) is read again, a few
        times, as the C exchange does (shard_medium.c, bucket_head)."""
        for tries in range(20):
            head = self.get("head.json")
            if head is None:
                return None
            try:
                return int(json.loads(head)["step"])
            except (ValueError, KeyError, TypeError) as exc:
                if tries == 19:
                    raise fail(f"the bucket's head.json does not parse: {exc}",
                               "PULSE_ERR_JSON") from exc
                time.sleep(0.05)

    def resume(self, rank_shard, store_dir):
        """rank_shard's snapshot at the bucket's head, from a copy of the
        bucket's store made under store_dir and removed after (the whole
        state, transiently, as a resume costs)."""
        if self.get("head.json") is None:
            return False
        os.makedirs(store_dir, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix=".resume-", dir=store_dir)
        try:
            check(declared().pulse_upload_fetch_store(self.handle, os.fsencode(scratch), None))
            return rank_shard.resume(scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def close(self):
        self.uploader.close()


class StorePublisher:
    """See pulse.Publisher: rank `rank` of `world`, through the store."""

    def __init__(self, store_dir, rank, world, make_committer, upload, coding, timeout,
                 make_parts=None):
        self.store_dir = store_dir
        self.rank = rank
        self.world = world
        self._folder = os.path.join(store_dir, "shard")
        self._make_committer = make_committer
        self._upload = upload
        self._chunk_log2, self._pos_model = coding  # (chunk_log2, pos_model)
        self._timeout = timeout
        # upload= on this rank: the exchange goes through the bucket.
        self._bucket = _Bucket(make_parts) if make_parts is not None else None
        self._shard = None
        self._committer = None
        self._published = False
        self._failed_step = None  # the step of this rank's last failed publish
        self.head = None
        self.public_key = None
        self.last_figures = None
        self.last_upload = None

    def _blocks_file(self, rank):
        return os.path.join(self._folder, f"blocks-{rank}.json")

    def _read_blocks(self, rank, bucket):
        """Rank `rank`'s descriptions, or None while its file is not there
        (in the bucket, or in the store folder)."""
        if bucket:
            data = self._bucket.get(f"shard/blocks-{rank}.json")
            try:
                doc = json.loads(data) if data is not None else None
            except ValueError:
                doc = None  # caught mid-write (s3rver writes in place): read again
            if doc is None or doc.get("world") != self.world:
                return None
            return [(d[0], tuple(d[1]), d[2], tuple(d[3]), tuple(d[4])) for d in doc["blocks"]]
        try:
            with open(self._blocks_file(rank)) as f:
                doc = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise fail(f"{self._blocks_file(rank)}: {exc}", "PULSE_ERR_CORRUPT") from None
        if doc.get("world") != self.world:
            return None  # another job's
        return [(d[0], tuple(d[1]), d[2], tuple(d[3]), tuple(d[4])) for d in doc["blocks"]]

    def _catch_up(self):
        """Rank 0 with the bucket: uploads what the bucket lacks when its
        head is behind rank 0's store (a step whose upload failed after its
        commit), before the others resume from the bucket."""
        local = shard.store_head_step(self.store_dir)
        there = self._bucket.head_step()
        if local is None or (there is not None and there >= local):
            return
        try:
            self._upload()
        except Exception as exc:
            raise fail(f"publish: rank 0's store holds step {local} and the bucket's head is "
                       f"{there}: uploading it failed (nothing else changed; the next publish "
                       f"tries again): {exc}", getattr(exc, "status", "PULSE_ERR_IO")) from None

    def _create(self, descs):
        doc = {"world": self.world, "rank": self.rank, "blocks": descs}
        if self._bucket is not None and self.rank == 0:
            self._catch_up()
        if self._bucket is not None:
            os.makedirs(self.store_dir, exist_ok=True)
            self._bucket.put(f"shard/blocks-{self.rank}.json", json.dumps(doc).encode())
        # Rank 0 with upload= writes its file in the folder too: the others,
        # without upload=, share that folder (rank 0 alone uploads).
        if self._bucket is None or self.rank == 0:
            os.makedirs(self._folder, exist_ok=True)
            tmp = self._blocks_file(self.rank) + f".tmp-{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(doc, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._blocks_file(self.rank))
        deadline = time.monotonic() + self._timeout
        rank_descs, where = [], set()
        for rank in range(self.world):
            while True:
                # A rank with upload= looks in the bucket; rank 0 also in
                # the folder (the others may share it and have no upload=).
                got, mode = None, None
                if self._bucket is not None:
                    got, mode = self._read_blocks(rank, True), "bucket"
                if got is None and (self._bucket is None or (self.rank == 0 and rank != 0)):
                    got, mode = self._read_blocks(rank, False), "folder"
                if got is not None:
                    break
                if time.monotonic() > deadline:
                    place = (f"shard/blocks-{rank}.json in the bucket (with upload=, every rank "
                             f"passes it)" if self._bucket is not None else self._blocks_file(rank))
                    raise fail(f"publish: rank {rank}'s blocks ({place}) did not "
                               f"come within {self._timeout} s", "PULSE_ERR_IO")
                time.sleep(0.005 if self._bucket is None else 0.05)
            rank_descs.append(got)
            if rank != self.rank:
                where.add(mode)
        if self._bucket is not None and self.rank == 0 and where == {"folder"}:
            # upload= on rank 0 alone: the step goes through the shared
            # folder and rank 0 uploads the store after it, as before.
            self._bucket.delete("shard/blocks-0.json")
            self._bucket.close()
            self._bucket = None
        elif len(where) > 1:
            raise fail("publish: some ranks gave upload= and others did not: with ranks that "
                       "share no folder every rank passes upload=; with a shared folder, every "
                       "rank or rank 0 alone", "PULSE_ERR_ARG")
        table = shard.Table(shard.build_table(rank_descs))
        shard.check_tiling(table, rank_descs)
        mine = shard.RankShard(table, descs, self._chunk_log2, self._pos_model)
        try:
            if self.rank == 0:
                self._committer = self._make_committer(table)
                self.public_key = self._committer.public_key
            if self._bucket is not None and self.rank != 0:
                self._bucket.resume(mine, self.store_dir)  # no store folder here
            else:
                mine.resume(self.store_dir)
        except BaseException:
            mine.free()
            if self._committer is not None:
                self._committer.free()
                self._committer = None
            raise
        self._shard = mine

    def publish(self, blocks, step):
        parsed = shard.parse_blocks(blocks)
        if self._shard is None:
            self._create([d for d, _ in parsed])
        array, alive = self._shard.host_tensors(parsed)
        if step is None:
            head = (self._bucket.head_step() if self._bucket is not None
                    else shard.store_head_step(self.store_dir))
            step = 1 if head is None else head + 1
            if self._bucket is not None and head is not None and head == self._failed_step:
                # The failed step was committed by rank 0 and uploaded
                # since (by its next publish): retried, it returns on every
                # rank, as on a rank that read the head before the upload.
                step = head
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise fail(f"publish: step {step!r} is not a non-negative int")
        opts = PubShardStepOpts()
        opts.rank = self.rank
        opts.world = self.world
        opts.committer = self._committer.handle if self._committer is not None else None
        opts.timeout_ms = int(self._timeout * 1000)
        if self._bucket is not None:
            opts.bucket = self._bucket.handle
            opts.part_bytes = self._bucket.part_bytes
        figures = PubFigures()
        status = declared().pulse_pub_shard_step(self._shard.handle, os.fsencode(self.store_dir),
                                                 opts, step, array, len(self._shard.descs),
                                                 figures)
        del alive
        if status != 0 and not self._published:
            # The table may have come from another job's file: read them again.
            self._free_parts()
            if self._bucket is not None:
                # Written again by the next publish; a job that ends here
                # leaves no file for a restarted job's ranks to read before
                # rank 0 has brought the bucket up to its store.
                try:
                    self._bucket.delete(f"shard/blocks-{self.rank}.json")
                except Exception:  # noqa: BLE001 - the step's error is the one to raise
                    pass
        # (A first publish that failed builds its parts again, and reads
        # the head again: a failed step committed meanwhile is then behind.)
        self._failed_step = step if status != 0 and self._published else None
        check(status)
        self.head = step
        self.last_figures = figures_dict(figures)
        if self.rank == 0:
            if not self._published:
                for rank in range(self.world):  # every rank has read them
                    if self._bucket is not None:
                        self._bucket.delete(f"shard/blocks-{rank}.json")
                    try:
                        os.unlink(self._blocks_file(rank))
                    except FileNotFoundError:
                        pass
            notify_store(self.store_dir)
            # With the bucket the step uploaded the store itself (the others
            # follow the bucket's head).
            if self._upload is not None and self._bucket is None:
                self.last_upload = self._upload()
        self._published = True
        return step

    def _free_parts(self):
        if self._shard is not None:
            self._shard.free()
            self._shard = None
        if self._committer is not None:
            self._committer.free()
            self._committer = None

    def close(self):
        self._free_parts()
        if self._bucket is not None:
            self._bucket.close()
            self._bucket = None
