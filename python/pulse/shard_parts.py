"""An anchor of a sharded publish that every rank uploads its parts of
(pulse.shard_group, with upload= and ranks that do not see rank 0's store
folder, as on a multi-node trainer without a shared filesystem).

The anchor stays one object, byte for byte a single publisher's, named by
the SHA-256 of its bytes (docs/protocols/sync.md, "Store layout"). Its file
is cut into parts of `part_bytes` in file order. Each part is assembled at
the rank that owns most of its bytes (rank 0 holds the header), from what
each other rank owns of it: only the bytes a rank owns travel, so with
dim-0 blocks or flat ranges of large tensors most parts are assembled
where they lie. That rank puts the part into one S3 multipart upload.

Two passes over the parts, because S3 names an upload when it begins and
the name is the hash of every byte: the first hashes the parts in file
order, the hash's state going from each part's rank to the next part's
(pulse.s3_parts.Sha256); the second puts them, every rank its own at once
from PUTTERS threads (QUEUE parts waiting at most), each with its own
handle, while the ranks go on assembling.
Rank 0 completes the upload once every rank's parts are in and checks the
object's size there; the committer then names it without the file ever
being on rank 0 (Committer.commit_uploaded). A rank holds a few parts
beside its blocks, never a tensor it does not own.

Every rank goes through every send and receive it has a part in whatever
fails (it sends zeros of the size agreed), so that no rank waits for ever;
the failure is returned and the step fails on every rank: rank 0 then
aborts the upload, and the bucket's head stays at the previous step."""

import queue
import threading
import time

from . import shard
from ._lib import fail

PUTTERS = 2  # parts of this rank in flight at once (S3 serves parallel puts faster)
QUEUE = 2  # parts assembled and waiting for this rank's putters
MAX_PARTS = 10000  # S3's limit on the parts of one upload


def _torch():
    import torch

    return torch


class Plan:
    """Who assembles and puts which part. The same on every rank: it
    follows from the table, every rank's blocks and the header's size."""

    def __init__(self, table, rank_descs, header_size, file_size, part_bytes):
        part_bytes = max(part_bytes, -(-file_size // MAX_PARTS))
        self.parts = []  # (offset, length, bytes owned per rank, the assembling rank)
        for off in range(0, file_size, part_bytes):
            n = min(part_bytes, file_size - off)
            owned = [shard.anchor_owned(table, descs, header_size, off, n)
                     for descs in rank_descs]
            header = max(0, min(off + n, header_size) - off)
            if header + sum(owned) != n:
                raise fail(f"publish: the ranks' blocks own {sum(owned)} of the "
                           f"{n - header} bytes of the anchor at {off} (a tiling error)")
            weight = list(owned)
            weight[0] += header
            up = max(range(len(weight)), key=lambda r: (weight[r], -r))
            self.parts.append((off, n, owned, up))


class AnchorParts:
    """One rank's side of the upload of a sharded anchor; see the top."""

    def __init__(self, pub, make_uploader, part_bytes):
        self._pub = pub  # the GroupPublisher: rank, group, shard, descriptions
        self._make_uploader = make_uploader  # () -> pulse.s3_parts.PartUploader
        self._uploaders = [make_uploader()]  # the first begins and finishes; more for puts
        self._uploader = self._uploaders[0]
        self._part_bytes = part_bytes
        self.figures = None

    def run(self, step, target, pending, failed):
        """Collective. Returns (this rank's failure or None, (sha256, size)
        of the uploaded anchor on rank 0 when every rank succeeded, else
        None). `failed`: this rank already failed the step (it only takes
        part in the agreement that skips the upload)."""
        from .s3_parts import Sha256

        pub = self._pub
        self.figures = None
        began = time.monotonic()
        plan, header, err = None, None, failed
        if err is None:
            try:
                header, size = pub._shard.anchor_header(step, target)
                descs = [[d for d in ds if any(d[4])] for ds in pub._rank_descs]
                plan = Plan(pub._table, descs, len(header), size, self._part_bytes)
            except Exception as exc:
                err = exc
        entries = pub._all_gather("the anchor's plan", (shard.error_text(err) if err else None,))
        if any(e[0] is not None for e in entries):
            return err or fail("publish: another rank failed before the anchor's upload"), None
        self._descs, self._header, self._pending = descs, header, pending
        # 1. the hash, part after part
        err, digest, state = None, None, None
        for k, (off, n, owned, up) in enumerate(plan.parts):
            prev = plan.parts[k - 1][3] if k else up
            if pub.rank == up:
                buf, err, got = self._assemble(k, plan, err, state_from=prev if prev != up
                                               else None)
                if k == 0 or got is not None:
                    state = Sha256(got.numpy().tobytes()) if got is not None else Sha256()
                state.add(buf.numpy())
                nxt = plan.parts[k + 1][3] if k + 1 < len(plan.parts) else None
                if nxt is None:
                    digest = state.digest()
                elif nxt != up:
                    pub._p2p("the anchor's hash", _bytes_tensor(state.state).to(pub._device),
                             nxt, None, None)
                    state = None
            elif owned[pub.rank]:
                err = self._send_owned(k, plan, err)
        entries = pub._all_gather("the anchor's hash", (shard.error_text(err) if err else None,
                                                        digest))
        failure = next((e[0] for e in entries if e[0] is not None), None)
        if failure is not None:
            return err or fail(f"publish: the anchor's hash failed: {failure[1]}"), None
        sha = next(e[1] for e in entries if e[1] is not None)
        rel = f"objects/{sha.hex()}.safetensors"
        # 2. the upload: rank 0 begins it, every rank puts its parts
        upload_id, err = None, None
        if pub.rank == 0:
            try:
                upload_id = self._uploader.begin(rel)
            except Exception as exc:
                err = exc
        entries = pub._all_gather("the anchor's upload", (shard.error_text(err) if err else None,
                                                          upload_id))
        if entries[0][0] is not None:
            return err or fail(f"publish: the anchor's upload: {entries[0][0][1]}"), None
        upload_id = entries[0][1]
        etags, err, sent = self._put_parts(plan, rel, upload_id)
        entries = pub._all_gather("the anchor's upload", (shard.error_text(err) if err else None,
                                                          etags))
        self.figures = {"parts": len(etags), "bytes": sent,
                        "seconds": time.monotonic() - began}
        if pub.rank != 0:
            return err, None
        failure = next((e[0] for e in entries if e[0] is not None), None)
        every = {}
        for e in entries:
            every.update(e[1] or {})
        try:
            if failure is not None:
                raise fail(f"publish: a rank's part of the anchor failed: {failure[1]}")
            self._uploader.finish(rel, upload_id, [every[k + 1] for k in range(len(plan.parts))])
            there = self._uploader.size(rel)
            if there != size:
                raise fail(f"publish: the bucket holds {there} bytes of the anchor {rel}, "
                           f"not {size}", "PULSE_ERR_IO")
        except Exception as exc:
            try:
                self._uploader.abort(rel, upload_id)
            except Exception:
                pass  # the next upload's stale-upload sweep removes it
            return err or exc, None
        return None, (sha, size)

    def close(self):
        for uploader in self._uploaders:
            uploader.close()
        self._uploaders = []

    # ------------------------------------------------------------ parts
    def _own_bytes(self, off, n):
        pub = self._pub
        return pub._shard.anchor_read(self._pending, len(self._header), off, n)

    def _assemble(self, k, plan, err, state_from=None):
        """Part k on its assembling rank: the header's bytes, its own and
        every owner's, placed. With state_from, the hash's state is received
        from that rank too. Returns (the part, the failure so far, the state
        or None)."""
        torch = _torch()
        pub = self._pub
        off, n, owned, up = plan.parts[k]
        buf = torch.empty(n, dtype=torch.uint8)
        got = {r: torch.empty(owned[r], dtype=torch.uint8, device=pub._device)
               for r in range(pub.world) if r != up and owned[r]}
        state = None
        if state_from is not None:
            from .s3_parts import Sha256

            state = torch.empty(len(Sha256().state), dtype=torch.uint8, device=pub._device)
        pub._recv_many("the anchor's parts", got, state, state_from)
        try:
            header = max(0, min(off + n, len(self._header)) - off)
            if header:
                buf[:header] = torch.frombuffer(bytearray(self._header[off:off + header]),
                                                dtype=torch.uint8)
            if owned[up]:
                shard.anchor_place(pub._table, self._descs[up], len(self._header), off, n,
                                   self._own_bytes(off, n), buf)
            for r, t in got.items():
                shard.anchor_place(pub._table, self._descs[r], len(self._header), off, n,
                                   t.cpu(), buf)
        except Exception as exc:
            err = err or exc
        return buf, err, state.cpu() if state is not None else None

    def _send_owned(self, k, plan, err):
        """Part k on a rank that owns bytes of it and does not assemble it."""
        torch = _torch()
        pub = self._pub
        off, n, owned, up = plan.parts[k]
        try:
            data = self._own_bytes(off, n)
            if data.numel() != owned[pub.rank]:
                raise fail(f"publish: this rank read {data.numel()} bytes of the anchor at "
                           f"{off}, its blocks own {owned[pub.rank]}")
        except Exception as exc:  # sent anyway: the step fails on err
            err = err or exc
            data = torch.zeros(owned[pub.rank], dtype=torch.uint8)
        pub._p2p("the anchor's parts", data.to(pub._device), up, None, None)
        return err

    def _put_parts(self, plan, rel, upload_id):
        """Pass 2: every part this rank assembles goes to the upload from
        the putters' threads while the loop goes on. Returns ({part number:
        ETag}, the failure or None, bytes put)."""
        pub = self._pub
        mine = sum(1 for p in plan.parts if p[3] == pub.rank)
        while len(self._uploaders) < min(PUTTERS, max(1, mine)):
            self._uploaders.append(self._make_uploader())
        work = queue.Queue(maxsize=QUEUE)
        etags, errors, sent, lock = {}, [], [0], threading.Lock()

        def putter(uploader):
            while True:
                item = work.get()
                if item is None:
                    return
                number, buf = item
                if errors:
                    continue  # the step fails: the rest is not put
                try:
                    etag = uploader.put(rel, upload_id, number, buf.numpy())
                    with lock:
                        etags[number] = etag
                        sent[0] += buf.numel()
                except Exception as exc:
                    errors.append(exc)

        threads = [threading.Thread(target=putter, args=(u,), name="pulse-anchor-parts",
                                    daemon=True)
                   for u in self._uploaders[:max(1, min(PUTTERS, mine))]]
        for thread in threads:
            thread.start()
        err = None
        try:
            for k, (off, n, owned, up) in enumerate(plan.parts):
                if pub.rank == up:
                    buf, err, _ = self._assemble(k, plan, err)
                    if err is None:
                        work.put((k + 1, buf))
                elif owned[pub.rank]:
                    err = self._send_owned(k, plan, err)
        finally:
            for thread in threads:
                work.put(None)
            for thread in threads:
                thread.join()
        return etags, err or (errors[0] if errors else None), sent[0]


def _bytes_tensor(blob):
    torch = _torch()
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8)
