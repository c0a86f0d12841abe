"""One rank of a sharded publisher whose ranks talk over a torch.distributed
process group (gloo on CPU, NCCL on GPU): the steps of pulse_pub_shard.h
driven from Python, parts and counts carried by the group (uint8 tensors;
statuses as objects), the head moved by the group's rank 0. A rank that
sees the store folder (a shared filesystem) writes its blocks of each
anchor into it; one that does not (another node) sends them to rank 0,
which writes them, and on a resume gets its blocks of the head from rank
0: only rank 0 needs the store. With upload= on every rank, such a job's
ranks put their own parts of each anchor into the bucket instead
(pulse.shard_parts), and rank 0 never holds it.

Every collective carries each rank's status, so a rank that raises inside
publish makes every rank raise (with its reason) and nothing is published;
a rank that dies makes the group's collectives fail on the others (gloo: at
once; else the group's timeout), the publisher is then unusable and a
restarted job resumes from the store."""

import os

from . import shard
from ._lib import Error, fail
from .server import notify_store


def _dist():
    import torch.distributed as dist  # only with a group

    return dist


def _torch():
    import torch

    return torch


class GroupPublisher:
    """See pulse.Publisher: rank `rank` of `world`, over `group`."""

    def __init__(self, store_dir, group, make_committer, upload, coding, parts=None):
        dist = _dist()
        self.store_dir = store_dir
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        if group is None or group is dist.group.WORLD:
            self._root = 0
        else:
            self._root = dist.get_global_rank(group, 0)
        # NCCL carries tensors on the device; gloo on the CPU.
        self._device = "cpu"
        if dist.get_backend(group) == "nccl":
            self._device = f"cuda:{_torch().cuda.current_device()}"
        self._make_committer = make_committer  # (table) -> shard.Committer, rank 0
        self._upload = upload  # () -> figures dict, rank 0 (None: no upload)
        self._chunk_log2, self._pos_model = coding  # (chunk_log2, pos_model)
        # With upload= on every rank: () -> (a maker of
        # pulse.s3_parts.PartUploader handles, part bytes). When some rank does not see the store folder, each
        # rank uploads its parts of the anchors (pulse.shard_parts).
        self._make_parts = parts
        self._every_uploads = False  # every rank passed upload= (known at creation)
        self._parts = None
        self.last_anchor_parts = None
        self._table = None
        self._remote = []  # ranks that do not see the store folder
        self._rank_descs = None
        self._shard = None
        self._committer = None
        self._broken = None
        self.head = None
        self.public_key = None
        self.last_figures = None
        self.last_upload = None

    def _rank_shard(self, table, descs):
        return shard.RankShard(table, descs, self._chunk_log2, self._pos_model)

    # ----------------------------------------------------- collectives
    def _collective(self, what, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:  # a rank died, the group timed out
            self._broken = (f"sharded publish: the group failed during {what} ({exc}); this "
                            "publisher is unusable: restart the job (it resumes from the store)")
            raise Error("PULSE_ERR_IO", self._broken) from exc

    def _all_gather(self, what, obj):
        dist = _dist()
        out = [None] * self.world
        self._collective(what, dist.all_gather_object, out, obj, self.group)
        return out

    def _p2p(self, what, send, to, recv, frm):
        """Sends `send` to group rank `to` while `recv` is received from group
        rank `frm` (either may be None; an empty tensor does not travel)."""
        dist = _dist()

        def run():
            reqs = []
            if send is not None and send.numel():
                reqs.append(dist.isend(send, self._global(to), self.group))
            if recv is not None and recv.numel():
                reqs.append(dist.irecv(recv, self._global(frm), self.group))
            for req in reqs:
                req.wait()

        self._collective(what, run)

    def _parts_exchange(self, part):
        """Rank 0 (it encodes) gets every rank's whole part (its blocks'
        headers and the changes of the chunks several ranks meet: a rank
        codes the chunks it covers itself); every other rank gets each
        rank's part cut to the chunks its own blocks meet
        (pulse_pub_shard_part_for: all its counts read; for dim-0 or flat
        blocks that fill their chunks, the blocks' headers only). Point to
        point in world - 1 rounds (round d: to rank + d, from rank - d),
        one part out and one in at a time, each at its size: no rank holds
        every rank's parts but rank 0. Returns (the parts, this rank's own
        included, as uint8 CPU tensors; this rank's failure or None): a
        rank whose cut fails sends an empty part, and its receivers fail
        the step naming it."""
        torch = _torch()
        parts = [None] * self.world
        parts[self.rank] = part
        err = None
        for d in range(1, self.world):
            to, frm = (self.rank + d) % self.world, (self.rank - d) % self.world
            out = part
            if to != 0:
                try:
                    out = self._shard.part_for(part, self._rank_descs[to])
                except Exception as exc:
                    err = err or exc
                    out = torch.empty(0, dtype=torch.uint8)
            size_out = torch.tensor([out.numel()], dtype=torch.int64, device=self._device)
            size_in = torch.empty(1, dtype=torch.int64, device=self._device)
            self._p2p("the parts' exchange", size_out, to, size_in, frm)
            got = torch.empty(int(size_in.item()), dtype=torch.uint8, device=self._device)
            self._p2p("the parts' exchange", out.to(self._device), to, got, frm)
            del out
            parts[frm] = got.cpu()
            if err is None and not got.numel():
                err = fail(f"publish: rank {frm} sent no part of the step (it failed making it)")
        return parts, err

    def _counts_to_root(self, metas, counts):
        """Every rank's counts to rank 0, at their sizes (metas[r][1]); None
        on the other ranks."""
        torch = _torch()
        if self.rank != 0:
            if counts is not None:
                self._p2p("the counts' exchange", counts.to(self._device), 0, None, None)
            return None
        dist = _dist()
        got = [self._landing(metas[r][1]) for r in range(1, self.world)]

        def run():  # every receive posted at once: the ranks send together
            reqs = [dist.irecv(t, self._global(r), self.group)
                    for r, t in enumerate(got, start=1) if t.numel()]
            for req in reqs:
                req.wait()

        self._collective("the counts' exchange", run)
        return [counts] + [t.cpu() for t in got]

    def _recv_many(self, what, got, first, first_from):
        """Receives `first` (may be None) from group rank first_from, then
        got[r] from each group rank r, every receive posted at once (a rank
        that sends two of them sends them in this order)."""
        dist = _dist()

        def run():
            reqs = []
            if first is not None and first.numel():
                reqs.append(dist.irecv(first, self._global(first_from), self.group))
            for r, t in got.items():
                if t.numel():
                    reqs.append(dist.irecv(t, self._global(r), self.group))
            for req in reqs:
                req.wait()

        self._collective(what, run)

    def _landing(self, size):
        """A uint8 tensor of `size` bytes to receive a rank's counts into. On
        the CPU an anonymous mapping of its own, unmapped once the tensor is
        gone: the counts (mostly chunk streams, about the patch's bytes) are
        freed before the commit reads the patch, where a heap block of
        their size would stay resident."""
        torch = _torch()
        if self._device != "cpu" or size == 0:
            return torch.empty(size, dtype=torch.uint8, device=self._device)
        import mmap

        return torch.frombuffer(mmap.mmap(-1, size), dtype=torch.uint8)

    def _broadcast(self, what, obj):
        dist = _dist()
        box = [obj]
        self._collective(what, dist.broadcast_object_list, box, self._root, self.group)
        return box[0]

    @staticmethod
    def _raise_first(entries, mine, what):
        """Raises when a rank failed: this rank's own exception when it was
        one of them, else an Error naming the first rank that failed."""
        for rank, entry in enumerate(entries):
            if entry is not None and entry[0] is not None:
                if mine is not None:
                    raise mine
                status, detail = entry[0]
                raise Error(status, f"{what}: rank {rank} gave it up: {detail}")

    # -------------------------------------------------------- creation
    def _create(self, parsed, err):
        """Collective: every rank's blocks gathered, the table built and the
        tiling checked on every rank; rank 0 opens the store's committer and
        every rank learns whether it sees the store folder; every rank makes
        its shard, from the head when the store has one."""
        descs = [d for d, _ in parsed] if err is None else None
        entries = self._all_gather("the blocks' exchange",
                                   (shard.error_text(err) if err else None, descs))
        self._raise_first(entries, err, "publish (creation)")
        mine, info = None, None
        try:
            rank_descs = [e[1] for e in entries]
            table = shard.Table(shard.build_table(rank_descs))
            shard.check_tiling(table, rank_descs)
            if self.rank == 0:
                self._committer = self._make_committer(table)
                marker = f".group-{os.urandom(8).hex()}"
                os.makedirs(os.path.join(self.store_dir, "shard"), exist_ok=True)
                with open(os.path.join(self.store_dir, "shard", marker), "w"):
                    pass
                info = (self._committer.head_step(), marker, self._committer.public_key)
        except Exception as exc:
            mine = exc
        entries = self._all_gather("the table's check", (shard.error_text(mine) if mine else None,
                                                         info))
        try:
            self._raise_first(entries, mine, "publish (creation)")
            head, marker, self.public_key = entries[0][1]
            # Does this rank's store_dir name rank 0's store (a shared
            # folder)? A rank that does not see it (another node) reads and
            # writes nothing there: rank 0 writes its blocks of the anchors
            # and hands it its blocks of the head on a resume.
            sees = os.path.exists(os.path.join(self.store_dir, "shard", marker))
            mine = None
            try:
                self._shard = self._rank_shard(table, descs)
                if head is not None and sees:
                    self._shard.resume(self.store_dir)
            except Exception as exc:
                mine = exc
            entries = self._all_gather("the shards' creation",
                                       (shard.error_text(mine) if mine else None, sees,
                                        self._make_parts is not None))
            if self.rank == 0:
                os.unlink(os.path.join(self.store_dir, "shard", marker))
            self._raise_first(entries, mine, "publish (creation)")
            self._remote = [r for r, e in enumerate(entries) if not e[1]]
            self._every_uploads = all(e[2] for e in entries)
            self._rank_descs = rank_descs
            self._table = table
            if head is not None and self._remote:
                self._resume_remote()
        except BaseException:
            self._free_parts()
            raise
        self._table = table
        self.head = head

    # -------------------------------------- ranks without the store folder
    def _global(self, rank):
        dist = _dist()
        if self.group is None or self.group is dist.group.WORLD:
            return rank
        return dist.get_global_rank(self.group, rank)

    def _send(self, what, tensors, to_rank):
        """BF16 tensors to group rank `to_rank`, as bytes (point to point)."""
        dist = _dist()
        for t in tensors:
            self._collective(what, dist.send, t.view(_torch().uint8).to(self._device),
                             self._global(to_rank), self.group)

    def _recv(self, what, descs, from_rank):
        """The BF16 tensors of `descs` (non-empty blocks) from group rank
        `from_rank`."""
        torch = _torch()
        dist = _dist()
        out = []
        for desc in descs:
            count = 1
            for e in desc[4]:
                count *= e
            got = torch.empty(2 * count, dtype=torch.uint8, device=self._device)
            self._collective(what, dist.recv, got, self._global(from_rank), self.group)
            out.append(got.cpu().view(torch.bfloat16))
        return out

    def _resume_remote(self):
        """Creation on a store with a head: each rank that does not see the
        store gets its blocks of the head's state from rank 0 (which
        rebuilds them, one rank at a time) and takes them as its snapshot."""
        for r in self._remote:
            proxy, mine = None, None
            if self.rank == 0:
                try:
                    proxy = self._rank_shard(self._table, self._rank_descs[r])
                    proxy.resume(self.store_dir)
                except Exception as exc:
                    mine = exc
            entries = self._all_gather("the resume's exchange",
                                       (shard.error_text(mine) if mine else None,))
            try:
                self._raise_first(entries[:1], mine, "publish (creation)")
                if self.rank == 0:
                    self._send("the resume's exchange",
                               [proxy.snapshot(i) for i in range(len(proxy.descs))], r)
                elif self.rank == r:
                    got = self._recv("the resume's exchange", self._shard.descs, 0)
                    try:
                        array, alive = self._shard.host_tensors(list(zip(self._shard.descs,
                                                                         got)))
                        self._shard.detect(array)  # the first: the snapshot
                    except Exception as exc:
                        mine = exc
            finally:
                if proxy is not None:
                    proxy.free()
            entries = self._all_gather("the resume's exchange",
                                       (shard.error_text(mine) if mine else None,))
            self._raise_first(entries, mine, "publish (creation)")

    def _anchor_remote(self, alive, staged, step, target):
        """An anchor step with ranks that do not see the store: each sends
        rank 0 its blocks' BF16 values of the step, which rank 0 writes into
        the anchor, one rank at a time (through a shard of that rank's
        blocks). Sends and receives happen whatever fails, so that no rank
        waits for ever; the failure is returned (rank 0's write, this
        rank's values)."""
        torch = _torch()
        err = None
        if self.rank in self._remote:
            values = []
            for desc, t in zip(self._shard.descs, alive):
                try:
                    values.append(t if t.dtype == torch.bfloat16 else t.to(torch.bfloat16))
                except Exception as exc:  # sent anyway: the step fails on err
                    err = err or exc
                    values.append(torch.zeros(t.numel(), dtype=torch.bfloat16))
            self._send("the anchor's exchange", [v.reshape(-1) for v in values], 0)
        elif self.rank == 0:
            for r in self._remote:
                got = self._recv("the anchor's exchange",
                                 [d for d in self._rank_descs[r] if any(d[4])], r)
                if err is not None:
                    continue
                proxy = None
                try:
                    proxy = self._rank_shard(self._table, self._rank_descs[r])
                    array, keep = proxy.host_tensors(list(zip(proxy.descs, got)))
                    proxy.detect(array)  # the first: the step's values as its snapshot
                    proxy.anchor_write(staged, step, target, False)
                except Exception as exc:
                    err = exc
                finally:
                    if proxy is not None:
                        proxy.free()
        return err

    # ------------------------------------------ anchors uploaded in parts
    def _by_parts(self):
        """Anchors go up in parts from every rank: when every rank passed
        upload= and some rank does not see the store folder (rank 0 would
        otherwise receive every block and upload the whole anchor alone).
        upload= on rank 0 alone keeps that (a job whose other ranks hold no
        credentials for the bucket)."""
        return self._every_uploads and bool(self._remote)

    def _anchor_parts(self, step, target, pending, err):
        """The step's anchor, put into the bucket by the ranks in parts
        (pulse.shard_parts). Returns (this rank's failure or err, (sha256,
        size) on rank 0 when the anchor is there)."""
        from .shard_parts import AnchorParts

        if self._parts is None:
            try:
                make_uploader, part_bytes = self._make_parts()
                self._parts = AnchorParts(self, make_uploader, part_bytes)
            except Exception as exc:
                err = err or exc
        if self._parts is None:  # still takes part in the agreement that skips it
            self._all_gather("the anchor's plan", (shard.error_text(err),))
            return err, None
        mine, uploaded = self._parts.run(step, target, pending, err)
        self.last_anchor_parts = self._parts.figures
        return err or mine, uploaded

    # ------------------------------------------------------------- step
    def publish(self, blocks, step):
        if self._broken:
            raise Error("PULSE_ERR_IO", self._broken)
        err, parsed = None, None
        try:
            parsed = shard.parse_blocks(blocks)
        except Exception as exc:
            err = exc
        if self._shard is None:
            self._create(parsed or [], err)
        return self._step(parsed, err, step)

    def _plan(self, step):
        """Rank 0's plan of the step: (step, base or None, anchor due, nonce)."""
        head = self._committer.head_step()
        if step is None:
            step = 1 if head is None else head + 1
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise fail(f"publish: step {step!r} is not a non-negative int")
        if head is not None and step <= head:
            raise fail(f"publish: step {step} is not above the head's {head}",
                       "PULSE_ERR_BASE_STEP")
        return step, head, self._committer.anchor_due(step), os.urandom(8).hex()

    def _step(self, parsed, err, asked):
        # 1. every rank's part, and rank 0's plan
        part, plan = None, None
        try:
            if err is not None:
                raise err
            array, alive = self._shard.host_tensors(parsed)
            if self.rank == 0:
                plan = self._plan(asked)
            part = self._shard.detect(array)
        except Exception as exc:
            err = exc
        entries = self._all_gather("the parts' exchange",
                                   (shard.error_text(err) if err else None,
                                    part.numel() if part is not None else 0, asked, plan))
        plan = entries[0][3]
        try:
            self._raise_first(entries, err, "publish")
            for rank, entry in enumerate(entries):
                if entry[2] is not None and entry[2] != plan[0]:
                    raise fail(f"publish: rank {rank} asked for step {entry[2]}, rank 0 "
                               f"publishes {plan[0]} (every rank passes the same step, or none)")
        except BaseException:
            self._drop(plan)
            raise
        step, base, due, nonce = plan
        del entries
        parts, err = self._parts_exchange(part)
        del part
        # 2. the anchor's blocks and the counts
        staged = os.path.join(self.store_dir, "objects", f".anchor-{step}-{nonce}.tmp-shard")
        counts, target = None, None
        try:
            if err is not None:
                raise err
            target = self._shard.state_digest(parts, True)
            if due and self.rank not in self._remote and not self._by_parts():
                self._shard.anchor_write(staged, step, target, base is not None)
            if base is not None:
                counts = self._shard.count(parts)
        except Exception as exc:
            err = exc
        if self.rank != 0:
            parts = None  # only the encoding rank reads them again
        uploaded = None
        if due and self._by_parts():
            err, uploaded = self._anchor_parts(step, target, base is not None, err)
        elif due and self._remote:
            err = self._anchor_remote(alive, staged, step, target) or err
        del alive
        metas = self._all_gather("the counts' exchange",
                                 (shard.error_text(err) if err else None,
                                  counts.numel() if counts is not None else 0))
        gathered = None
        if all(m[0] is None for m in metas) and base is not None:
            gathered = self._counts_to_root(metas, counts)
        del counts
        # 3. rank 0 encodes and commits; every rank learns the outcome
        outcome = None
        if self.rank == 0:
            outcome = self._commit(metas, gathered, plan, parts, target,
                                   staged if due and uploaded is None else None, uploaded)
        del gathered, parts
        outcome = self._broadcast("the commit's outcome", outcome)
        failure, figures, upload = outcome
        if failure is not None:
            self._drop(plan)
            if err is not None:
                raise err
            status, detail = failure
            raise Error(status, detail)
        if base is not None:
            self._shard.advance()
        self.head = step
        self.last_figures = figures
        if upload is not None:
            if isinstance(upload, dict):
                self.last_upload = upload
            else:
                status, detail = upload
                raise Error(status, f"publish: step {step} is committed; its upload failed: "
                                    f"{detail}")
        return step

    def _commit(self, metas, counts, plan, parts, target, staged, uploaded=None):
        """Rank 0: (failure, figures, upload figures or failure). `uploaded`:
        (sha256, size) of the step's anchor, already in the bucket."""
        step, base, _, _ = plan
        for rank, entry in enumerate(metas):
            if entry[0] is not None:
                if staged:
                    _unlink(staged)
                status, detail = entry[0]
                return (status, f"publish: rank {rank} gave it up: {detail}"), None, None
        made = os.path.join(self.store_dir, "objects", f".patch-{step}-{plan[3]}.tmp-shard")
        patch, view = None, None
        try:
            if base is not None:
                # The patch goes to a file while the ranks' streams are held,
                # and is mapped once they are freed: never both in memory.
                opts = self._committer.encode_opts(step, base, self._chunk_log2)
                shard.encode_file(self._table, opts, parts, counts, made)
                parts.clear()  # the caller's lists
                counts.clear()
                patch, view = shard.mapped(made)
            if uploaded is not None:
                figures = self._committer.commit_uploaded(step, patch, uploaded[0], uploaded[1],
                                                          target)
            else:
                figures = self._committer.commit(step, patch, staged, target)
        except Exception as exc:
            if staged:
                _unlink(staged)
            return shard.error_text(exc), None, None
        finally:
            del patch
            if view is not None:
                view.close()
            _unlink(made)
        notify_store(self.store_dir)
        upload = None
        if self._upload is not None:
            try:
                upload = self._upload()
            except Exception as exc:
                upload = shard.error_text(exc)
        return None, figures, upload

    def _drop(self, plan):
        """The step failed: the snapshot stays (a store's first step that
        failed is taken again by its retry)."""
        if self._shard is None:
            return
        if self.head is None:
            self._shard.reset()
        else:
            self._shard.abort()

    # ----------------------------------------------------------- close
    def _free_parts(self):
        if self._parts is not None:
            self._parts.close()
            self._parts = None
        if self._shard is not None:
            self._shard.free()
            self._shard = None
        if self._committer is not None:
            self._committer.free()
            self._committer = None

    def close(self):
        self._free_parts()


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
