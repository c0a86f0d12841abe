"""The torch.distributed transport of pulse.loco.DiLoCo: a process group
(gloo on CPU, NCCL on GPU) carries the parameter count check, rank 0's
starting parameters and each round's payloads, as byte tensors of their
exact sizes (one broadcast per trainer). Every failure of the group (a
peer that died, its timeout) is a pulse.Error PULSE_ERR_IO.
"""

from ._lib import Error, fail


class TorchGroup:
    """`group` (None: the default group, or a single trainer when
    torch.distributed is not initialized) as DiLoCo's transport."""

    def __init__(self, torch, dist, group):
        self._torch, self._dist, self.group = torch, dist, group
        self.distributed = dist.is_available() and dist.is_initialized()
        if group is not None and not self.distributed:
            raise fail("a group was given but torch.distributed is not initialized")
        self.world = dist.get_world_size(group) if self.distributed else 1
        self.rank = dist.get_rank(group) if self.distributed else 0
        # NCCL moves only device tensors: the counts and payloads go through
        # the current GPU there, through host memory under gloo.
        nccl = self.distributed and dist.get_backend(group) == "nccl"
        self._wire = torch.device("cuda", torch.cuda.current_device()) if nccl \
            else torch.device("cpu")

    def _global(self, rank):
        if self.group is None:
            return rank
        return self._dist.get_global_rank(self.group, rank)

    def _call(self, fn):
        try:
            return fn()
        except Exception as exc:  # gloo/NCCL: a peer died, a timeout
            raise Error("PULSE_ERR_IO", f"trainer exchange over torch.distributed failed: "
                        f"{exc}") from exc

    def gather_ints(self, value):
        """Every rank's `value`, in rank order."""
        torch, dist = self._torch, self._dist
        if self.world == 1:
            return [value]
        mine = torch.tensor([value], dtype=torch.int64, device=self._wire)
        out = [torch.zeros(1, dtype=torch.int64, device=self._wire) for _ in range(self.world)]
        self._call(lambda: dist.all_gather(out, mine, group=self.group))
        return [int(t.item()) for t in out]

    def agree(self, param_count):
        """Raises pulse.Error on every rank when the counts differ."""
        counts = self.gather_ints(param_count)
        if len(set(counts)) != 1:
            raise fail("trainers disagree on the parameter count: "
                       + ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts)))

    def broadcast_start(self, theta):
        """theta (a CPU tensor) = rank 0's."""
        if self.world > 1:
            wire = theta.to(self._wire)
            self._call(lambda: self._dist.broadcast(wire, src=self._global(0),
                                                    group=self.group))
            theta.copy_(wire)

    def exchange(self, own):
        """Every rank's payload (own: this rank's, a CPU uint8 tensor), as
        CPU tensors in rank order."""
        torch, dist = self._torch, self._dist
        sizes = self.gather_ints(own.numel())
        bufs = [own.to(self._wire) if r == self.rank
                else torch.empty(sizes[r], dtype=torch.uint8, device=self._wire)
                for r in range(self.world)]
        if self.world > 1:
            for r in range(self.world):
                self._call(lambda r=r: dist.broadcast(bufs[r], src=self._global(r),
                                                      group=self.group))
        return [b.cpu() for b in bufs]
