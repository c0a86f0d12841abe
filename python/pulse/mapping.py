"""pulse.Mapping: the layout an inference engine keeps the weights in
(fused projections, tensor-parallel shards, stacked mixture-of-experts
weights split over expert-parallel ranks), as a plan of blocks of the
publisher's tensors and where each lives in the engine's tensors. The
Subscriber attaches each block to the C library (pulse_sub_attach_region),
which applies the patches into it and verifies it; nothing here loops over
elements."""

from collections import namedtuple

from ._lib import fail

ROW_PARALLEL = ("o_proj", "down_proj")

# Where an expert's projection goes in its stack (vLLM FusedMoE.weight_loader):
# w1 (gate) the first half of the expert's w13 rows, w3 (up) the second
# half, both split on their rows over the tensor-parallel ranks; w2 (down)
# the expert's whole w2 block, split on its columns.
EXPERT_SHARDS = ("w1", "w2", "w3")

Copy = namedtuple("Copy", "target source src_row0 src_col0 dst_row0 dst_col0 rows cols dst_cols")
Copy.__doc__ = """One block of the plan: rows [src_row0, +rows) x columns
[src_col0, +cols) of the published tensor `source` (its 2-D view: shape[0]
rows of numel/shape[0] columns) go to rows [dst_row0, +rows) x columns
[dst_col0, +cols) of `target` seen as rows of `dst_cols` elements (element
(r, c) of the block at target offset (dst_row0 + r) * dst_cols + dst_col0 + c)."""


def _view_cols(shape):
    """Columns of the 2-D view of a target (rows = shape[0])."""
    cols = 1
    for s in shape[1:]:
        cols *= s
    return cols


class _Experts:
    """The (param_name, weight_name, expert_id, shard_id) list of an engine
    (vLLM's FusedMoE.make_expert_params_mapping), checked, and the rank's
    range of experts."""

    def __init__(self, entries, ep_rank, ep_size, num_experts):
        if not isinstance(ep_size, int) or isinstance(ep_size, bool) or ep_size < 1:
            raise fail(f"Mapping: ep_size {ep_size!r} is not a positive int")
        if not isinstance(ep_rank, int) or isinstance(ep_rank, bool) or not 0 <= ep_rank < ep_size:
            raise fail(f"Mapping: ep_rank {ep_rank!r} is not in [0, {ep_size})")
        self.entries = []
        self.by_weight = {}  # weight_name -> index in entries
        where = {}  # (expert_id, shard_id) -> param_name
        for entry in entries:
            if (not isinstance(entry, (tuple, list)) or len(entry) != 4 or
                    not isinstance(entry[0], str) or not isinstance(entry[1], str) or
                    not entry[0] or not entry[1]):
                raise fail(f"Mapping: experts entry {entry!r} is not "
                           f"(param_name, weight_name, expert_id, shard_id)")
            param, weight, expert, shard = entry
            if not isinstance(expert, int) or isinstance(expert, bool) or expert < 0:
                raise fail(f"Mapping: experts entry {tuple(entry)!r}: expert id {expert!r} "
                           f"is not a non-negative int")
            if shard not in EXPERT_SHARDS:
                raise fail(f"Mapping: experts entry {tuple(entry)!r}: shard_id {shard!r} is "
                           f"not one of {EXPERT_SHARDS}")
            if weight in self.by_weight:
                raise fail(f"Mapping: experts: weight_name '{weight}' is listed twice")
            if (expert, shard) in where:
                raise fail(f"Mapping: experts: expert {expert}'s {shard} is listed twice")
            where[(expert, shard)] = param
            self.by_weight[weight] = len(self.entries)
            self.entries.append((param, weight, expert, shard))
        ids = sorted({e for _, _, e, _ in self.entries})
        if num_experts is None:
            num_experts = len(ids)
        elif not isinstance(num_experts, int) or isinstance(num_experts, bool) or num_experts < 1:
            raise fail(f"Mapping: num_experts {num_experts!r} is not a positive int")
        for e in ids:
            if e >= num_experts:
                raise fail(f"Mapping: experts: expert id {e} is out of range [0, {num_experts}) "
                           f"({len(ids)} experts listed)")
        for e in range(num_experts):
            for shard in EXPERT_SHARDS:
                if (e, shard) not in where:
                    raise fail(f"Mapping: experts: expert {e} has no {shard} entry")
            if where[(e, "w1")] != where[(e, "w3")] or where[(e, "w1")] == where[(e, "w2")]:
                raise fail(f"Mapping: experts: expert {e}'s w1 and w3 must share a param_name "
                           f"and w2 must have another")
        if num_experts % ep_size:
            raise fail(f"Mapping: ep_size {ep_size} does not divide the {num_experts} experts",
                       "PULSE_ERR_UNSUPPORTED")
        self.num = num_experts
        self.local = num_experts // ep_size
        self.first = ep_rank * self.local
        self.lengths = sorted({len(w) for w in self.by_weight})
        # The start every weight_name shares, to find candidates fast.
        names = list(self.by_weight)
        prefix = names[0]
        for w in names[1:]:
            while not w.startswith(prefix):
                prefix = prefix[:-1]
        self.prefix = prefix

    def key(self):
        return (tuple(self.entries), self.num, self.first, self.local)

    def match(self, name):
        """The entry of the first weight_name (in the list's order) that
        occurs in `name`, as the engine's loader tests them, or None."""
        best = None
        at = name.find(self.prefix) if self.prefix else 0
        while at != -1 and at < len(name):
            for n in self.lengths:
                i = self.by_weight.get(name[at:at + n])
                if i is not None and (best is None or i < best):
                    best = i
            at = name.find(self.prefix, at + 1) if self.prefix else at + 1
        return None if best is None else self.entries[best]


class Mapping:
    """The engine layout of one tensor- and expert-parallel rank.

    stacked: (fused, part, shard_id) entries as engines list them to load
    checkpoints, e.g. ("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj",
    "k"), ("qkv_proj", "v_proj", "v"), ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1): the published tensor
    model.layers.3.self_attn.k_proj.weight goes into the engine's
    model.layers.3.self_attn.qkv_proj.weight, after q's rows, in the order
    of the entries. Fused (column-parallel) weights are split on dim 0 per
    part: rank r holds rows [r*R/tp, (r+1)*R/tp) of each part R, q then k
    then v. row_parallel: name components whose weights are split on dim 1
    (2-D ones; a 1-D bias stays whole). Everything else is whole on every
    rank. head_dim: when given, each column-parallel part must hold a
    multiple of tp_size heads (fewer KV heads than ranks is refused), not
    only of tp_size rows.

    experts: the engine's (param_name, weight_name, expert_id, shard_id)
    list, as vLLM's FusedMoE.make_expert_params_mapping builds it, e.g.
    ("experts.w13_", "experts.3.gate_proj.", 3, "w1"),
    ("experts.w2_", "experts.3.down_proj.", 3, "w2"),
    ("experts.w13_", "experts.3.up_proj.", 3, "w3"). A published tensor
    whose name contains a weight_name goes into the stack named by
    replacing it with param_name (model.layers.0.mlp.experts.3.gate_proj.weight
    -> model.layers.0.mlp.experts.w13_weight): w13 [E_local, 2*I_tp, H]
    holds each expert's gate rows then its up rows, w2 [E_local, H, I_tp]
    its down_proj columns, where I_tp = I / moe_tp_size and the rank holds
    rows (gate, up) or columns (down) [moe_tp_rank*I_tp, +I_tp). The rank
    holds experts [ep_rank*E/ep_size, (ep_rank+1)*E/ep_size) at local
    indices from 0 and skips the others. num_experts: E (default: the
    number of expert ids listed; every id in [0, E) must have w1, w2 and
    w3). moe_tp_rank, moe_tp_size: the split inside each expert (default
    tp_rank, tp_size; an engine whose experts are not split under expert
    parallelism gives 0, 1).
    """

    def __init__(self, stacked=(), tp_rank=0, tp_size=1, row_parallel=ROW_PARALLEL, head_dim=None,
                 experts=None, ep_rank=0, ep_size=1, num_experts=None, moe_tp_rank=None,
                 moe_tp_size=None):
        if not isinstance(tp_size, int) or tp_size < 1:
            raise fail(f"Mapping: tp_size {tp_size!r} is not a positive int")
        if not isinstance(tp_rank, int) or not 0 <= tp_rank < tp_size:
            raise fail(f"Mapping: tp_rank {tp_rank!r} is not in [0, {tp_size})")
        if head_dim is not None and (not isinstance(head_dim, int) or head_dim < 1):
            raise fail(f"Mapping: head_dim {head_dim!r} is not a positive int")
        self.tp_rank, self.tp_size, self.head_dim = tp_rank, tp_size, head_dim
        self.row_parallel = tuple(row_parallel)
        self.parts = {}  # part -> fused
        self.order = {}  # fused -> [part, ...]
        for entry in stacked:
            if len(entry) != 3 or not isinstance(entry[0], str) or not isinstance(entry[1], str):
                raise fail(f"Mapping: stacked entry {entry!r} is not (fused, part, shard_id)")
            fused, part, _ = entry
            if part in self.parts or part in self.order or fused in self.parts:
                raise fail(f"Mapping: '{part}' or '{fused}' is listed twice")
            self.parts[part] = fused
            self.order.setdefault(fused, []).append(part)
        for name in self.row_parallel:
            if name in self.parts:
                raise fail(f"Mapping: '{name}' is both fused and row-parallel")
        if moe_tp_size is None:
            moe_tp_size = tp_size
        if moe_tp_rank is None:
            if moe_tp_size not in (1, tp_size):
                raise fail(f"Mapping: moe_tp_size {moe_tp_size!r} needs moe_tp_rank")
            moe_tp_rank = tp_rank if moe_tp_size == tp_size else 0
        if not isinstance(moe_tp_size, int) or moe_tp_size < 1:
            raise fail(f"Mapping: moe_tp_size {moe_tp_size!r} is not a positive int")
        if not isinstance(moe_tp_rank, int) or not 0 <= moe_tp_rank < moe_tp_size:
            raise fail(f"Mapping: moe_tp_rank {moe_tp_rank!r} is not in [0, {moe_tp_size})")
        self.moe_tp_rank, self.moe_tp_size = moe_tp_rank, moe_tp_size
        self.experts = None
        if experts is not None:
            experts = list(experts)
            if not experts:
                raise fail("Mapping: experts is an empty list")
            self.experts = _Experts(experts, ep_rank, ep_size, num_experts)
        elif ep_size != 1 or ep_rank != 0 or num_experts is not None:
            raise fail("Mapping: ep_rank, ep_size and num_experts need experts=")

    def key(self):
        return (tuple((f, tuple(p)) for f, p in self.order.items()), self.tp_rank, self.tp_size,
                self.row_parallel, self.head_dim, self.moe_tp_rank, self.moe_tp_size,
                self.experts.key() if self.experts is not None else None)

    def _where(self, name):
        """(kind, target name, part, components) of a published name."""
        comps = name.split(".")
        for i, comp in enumerate(comps):
            if comp in self.parts:
                fused = self.parts[comp]
                return "fused", ".".join(comps[:i] + [fused] + comps[i + 1:]), comps, i
            if comp in self.row_parallel:
                return "row", name, comps, i
        return "whole", name, comps, None

    def _expert_copy(self, name, shape, entry, target, stacks):
        """The block of expert tensor `name` in its stack `target`, or None
        when the expert is another rank's; records what the stack needs."""
        param, weight, expert, shard = entry
        ex, tp, rank = self.experts, self.moe_tp_size, self.moe_tp_rank
        if len(shape) != 2:
            raise fail(f"tensor '{name}': an expert weight of {len(shape)} dimensions; expert "
                       f"stacks hold 2-D weights", "PULSE_ERR_UNSUPPORTED")
        inner = shape[1] if shard == "w2" else shape[0]  # the intermediate size I
        hidden = shape[0] if shard == "w2" else shape[1]
        if inner % tp:
            raise fail(f"tensor '{name}': an intermediate size of {inner} does not split over "
                       f"{tp} ranks", "PULSE_ERR_UNSUPPORTED")
        share = inner // tp
        kind = "w2" if shard == "w2" else "w13"
        want = [ex.local, hidden, share] if kind == "w2" else [ex.local, 2 * share, hidden]
        stack = stacks.setdefault(target, {"kind": kind, "shape": want, "seen": set(),
                                           "from": name, "param": param})
        if stack["kind"] != kind or stack["shape"] != want:
            raise fail(f"target '{target}': '{name}' ({shard}, shape {list(shape)}) does not fit "
                       f"the stack that '{stack['from']}' gives ({stack['kind']} of "
                       f"{stack['shape']})", "PULSE_ERR_SIZE_MISMATCH")
        stack["seen"].add((expert, shard))
        local = expert - ex.first
        if not 0 <= local < ex.local:
            return None  # another expert-parallel rank's expert
        if kind == "w2":
            return Copy(target, name, 0, rank * share, local * hidden, 0, hidden, share, share)
        half = 0 if shard == "w1" else share
        return Copy(target, name, rank * share, 0, local * 2 * share + half, 0, share, hidden,
                    hidden)

    def _check_stack(self, target, shape, stack):
        """Refuses a stack target of the wrong shape, or one some expert of
        the publisher's table is missing from."""
        ex = self.experts
        if list(shape) != stack["shape"]:
            what = ("[E_local, H, I_tp]" if stack["kind"] == "w2" else "[E_local, 2*I_tp, H]")
            raise fail(f"target '{target}' has shape {list(shape)}, this rank's layout gives "
                       f"{stack['shape']} ({what}: {ex.local} of {ex.num} experts over "
                       f"ep_size {ex.num // ex.local}, moe_tp_size {self.moe_tp_size})",
                       "PULSE_ERR_SIZE_MISMATCH")
        shards = ("w2",) if stack["kind"] == "w2" else ("w1", "w3")
        for e in range(ex.num):
            for shard in shards:
                if (e, shard) not in stack["seen"]:
                    weight = next(w for p, w, i, s in ex.entries if i == e and s == shard)
                    missing = target.replace(stack["param"], weight, 1)
                    raise fail(f"target '{target}': expert {e}'s {shard} ('{missing}') is not "
                               f"in the publisher's table", "PULSE_ERR_NOT_FOUND")

    def plan(self, table, targets):
        """The blocks that bring `targets` ({name: shape}) to the
        published tensors `table` ({name: shape}, the trainer's table): a
        list of Copy, every target covered exactly. Raises Error for what
        does not fit, before anything is attached or written."""
        tp, rank = self.tp_size, self.tp_rank
        copies = []
        expect = {}  # target -> [rows, cols]
        stacks = {}  # expert stack target -> what it needs
        for name, shape in table.items():
            entry = self.experts.match(name) if self.experts is not None else None
            if entry is not None:
                target = name.replace(entry[1], entry[0])
                if target in targets:
                    copy = self._expert_copy(name, shape, entry, target, stacks)
                    if copy is not None:
                        copies.append(copy)
                continue
            kind, target, comps, i = self._where(name)
            if target not in targets:
                continue
            dst_cols = _view_cols(targets[target])
            rows = shape[0]
            cols = 1
            for s in shape[1:]:
                cols *= s
            if kind == "fused":
                part = comps[i]
                if rows % tp:
                    raise fail(f"tensor '{name}': {rows} rows do not split over {tp} ranks",
                               "PULSE_ERR_UNSUPPORTED")
                if self.head_dim is not None and (rows % self.head_dim or (rows // self.head_dim) % tp):
                    raise fail(f"tensor '{name}': {rows // self.head_dim if rows % self.head_dim == 0 else rows / self.head_dim} "
                               f"heads of {self.head_dim} do not split over {tp} ranks (fewer heads "
                               f"than ranks, or not a multiple)", "PULSE_ERR_UNSUPPORTED")
                share = rows // tp
                offset = 0
                for other in self.order[self.parts[part]]:
                    if other == part:
                        break
                    other_name = ".".join(comps[:i] + [other] + comps[i + 1:])
                    if other_name not in table:
                        raise fail(f"target '{target}': part '{other_name}' is not in the "
                                   f"publisher's table", "PULSE_ERR_NOT_FOUND")
                    offset += table[other_name][0] // tp
                copies.append(Copy(target, name, rank * share, 0, offset, 0, share, cols, dst_cols))
                e = expect.setdefault(target, [0, cols, list(shape[1:])])
                e[0] += share
                if e[1] != cols:
                    raise fail(f"target '{target}': its parts have different row sizes",
                               "PULSE_ERR_SIZE_MISMATCH")
            elif kind == "row" and len(shape) == 2:
                if cols % tp:
                    raise fail(f"tensor '{name}': {cols} columns do not split over {tp} ranks",
                               "PULSE_ERR_UNSUPPORTED")
                share = cols // tp
                copies.append(Copy(target, name, 0, rank * share, 0, 0, rows, share, dst_cols))
                expect[target] = [rows, share, [share]]
            else:
                copies.append(Copy(target, name, 0, 0, 0, 0, rows, cols, dst_cols))
                expect[target] = [rows, cols, list(shape[1:])]
        for target, shape in targets.items():
            if target in stacks:
                if target in expect:
                    raise fail(f"target '{target}': both an expert stack and the target of "
                               f"tensors that are not experts", "PULSE_ERR_ARG")
                self._check_stack(target, shape, stacks[target])
                continue
            if target not in expect:
                raise fail(f"target '{target}': no tensor of the publisher's table maps to it",
                           "PULSE_ERR_NOT_FOUND")
            rows, _, rest = expect[target]
            want = [rows] + rest
            if list(shape) != want:
                raise fail(f"target '{target}' has shape {list(shape)}, this rank's layout "
                           f"gives {want}", "PULSE_ERR_SIZE_MISMATCH")
        return copies


DeviceTarget = namedtuple("DeviceTarget", "source shape target offset")
DeviceTarget.__doc__ = """A published tensor `source` of `shape` held whole
at element `offset` of the engine's tensor `target`, its rows one after the
other: what pulse_sub_attach_device takes."""


def device_targets(copies, table):
    """The blocks of a plan (Mapping.plan) as whole device tensors: the C
    library applies patches into CUDA memory only as whole tensors
    (pulse_sub_attach_device; its regions, pulse_region.h, are host
    memory). A plan that only fuses and stacks (tp_size 1: fused qkv and
    gate_up, expert stacks split over ranks by whole experts) is that; a
    block that is part of a published tensor (a tensor-parallel split) or
    whose rows lie apart is refused here, naming it, before anything is
    attached."""
    out = []
    for c in copies:
        shape = tuple(table[c.source])
        rows = shape[0] if shape else 1
        cols = _view_cols(shape) if shape else 1
        if (c.src_row0, c.src_col0, c.rows, c.cols) != (0, 0, rows, cols):
            raise fail(f"target '{c.target}': rows [{c.src_row0}, {c.src_row0 + c.rows}) columns "
                       f"[{c.src_col0}, {c.src_col0 + c.cols}) of '{c.source}' are part of it: "
                       f"the C library applies patches into CUDA memory only as whole tensors "
                       f"(no device regions); hold tensor-parallel splits in host tensors",
                       "PULSE_ERR_UNSUPPORTED")
        if c.rows > 1 and (c.dst_col0 != 0 or c.cols != c.dst_cols):
            raise fail(f"target '{c.target}': the rows of '{c.source}' lie {c.dst_cols} elements "
                       f"apart in it, not one after the other: not a device tensor",
                       "PULSE_ERR_UNSUPPORTED")
        out.append(DeviceTarget(c.source, shape, c.target, c.dst_row0 * c.dst_cols + c.dst_col0))
    return out
