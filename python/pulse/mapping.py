"""pulse.Mapping: the layout an inference engine keeps the weights in
(fused projections, tensor-parallel shards), as a plan of blocks of the
publisher's tensors and where each lives in the engine's tensors. The
Subscriber attaches each block to the C library (pulse_sub_attach_region),
which applies the patches into it and verifies it; nothing here loops over
elements."""

from ._lib import fail

ROW_PARALLEL = ("o_proj", "down_proj")


class Mapping:
    """The engine layout of one tensor-parallel rank.

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
    """

    def __init__(self, stacked=(), tp_rank=0, tp_size=1, row_parallel=ROW_PARALLEL, head_dim=None):
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

    def key(self):
        return (tuple((f, tuple(p)) for f, p in self.order.items()), self.tp_rank, self.tp_size,
                self.row_parallel, self.head_dim)

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

    def plan(self, table, targets):
        """The blocks that bring `targets` ({name: shape}) to the
        published tensors `table` ({name: shape}, the trainer's table):
        [(target, source, src_row0, src_col0, dst_row0, dst_col0, rows,
        cols)] in 2-D terms (a 1-D tensor is one column), every target
        covered exactly. Raises Error for what does not fit."""
        tp, rank = self.tp_size, self.tp_rank
        copies = []
        expect = {}  # target -> [rows, cols]
        for name, shape in table.items():
            kind, target, comps, i = self._where(name)
            if target not in targets:
                continue
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
                copies.append((target, name, rank * share, 0, offset, 0, share, cols))
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
                copies.append((target, name, 0, rank * share, 0, 0, rows, share))
                expect[target] = [rows, share, [share]]
            else:
                copies.append((target, name, 0, 0, 0, 0, rows, cols))
                expect[target] = [rows, cols, list(shape[1:])]
        for target, shape in targets.items():
            if target not in expect:
                raise fail(f"target '{target}': no tensor of the publisher's table maps to it",
                           "PULSE_ERR_NOT_FOUND")
            rows, _, rest = expect[target]
            want = [rows] + rest
            if list(shape) != want:
                raise fail(f"target '{target}' has shape {list(shape)}, this rank's layout "
                           f"gives {want}", "PULSE_ERR_SIZE_MISMATCH")
        return copies
