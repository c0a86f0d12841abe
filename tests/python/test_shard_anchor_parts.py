"""An anchor uploaded part by part, through the Python bindings
(pulse.shard): for 3 ranks' blocks (column blocks, flat ranges, a whole
3-D tensor, an empty block), every part of the anchor (sizes 1, 7, 1000,
larger than the file), rebuilt from RankShard.anchor_header and every
rank's RankShard.anchor_read placed with anchor_place, is the file the
ranks' anchor_write makes, for the snapshot and the pending step; the
owned counts are the reads' sizes; a wrong count is refused. Then a
Committer commits an anchor only the bucket holds (commit_uploaded): the
head names objects/<sha256>.safetensors with its size, the file is not in
the store. Exit 77: no torch."""

import hashlib
import json
import os
import sys
import tempfile

try:
    import torch
except ImportError:
    print("skipped: python3-torch is not installed")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from pulse import shard  # noqa: E402
from pulse._lib import Error, PubOpts  # noqa: E402
from pulse._shard_lib import BLOCK_FLAT, BLOCK_RECT  # noqa: E402

SHAPES = [("w", (37, 29)), ("e", (1000,)), ("c", (6, 10, 7))]
RANK_DESCS = [
    [("w", (37, 29), BLOCK_RECT, (0, 0), (37, 10)), ("e", (1000,), BLOCK_FLAT, (0,), (400,))],
    [("e", (1000,), BLOCK_FLAT, (400,), (600,)), ("w", (37, 29), BLOCK_RECT, (0, 10), (37, 19))],
    [("c", (6, 10, 7), BLOCK_RECT, (0, 0, 0), (6, 10, 7)),
     ("e", (1000,), BLOCK_FLAT, (1000,), (0,))],
]


def block_of(full, desc):
    name, shape, kind, start, extent = desc
    if kind == BLOCK_FLAT:
        return full.reshape(-1)[start[0]:start[0] + extent[0]].clone()
    index = tuple(slice(a, a + e) for a, e in zip(start, extent))
    return full[index].contiguous()


def detect(shards, weights):
    parts = []
    for rank, sh in enumerate(shards):
        parsed = [(d, block_of(weights[d[0]], d) if any(d[4]) else None)
                  for d in RANK_DESCS[rank]]
        array, alive = sh.host_tensors(parsed)
        parts.append(sh.detect(array))
        del alive
    return parts


def check_parts(table, shards, file_bytes, header, pending):
    hs = len(header)
    size = len(file_bytes)
    for part in (1, 7, 1000, size + 3):
        for off in range(0, size, part):
            n = min(part, size - off)
            dst = torch.full((n,), 0xA5, dtype=torch.uint8)
            if off < hs:
                k = min(hs - off, n)
                dst[:k] = torch.frombuffer(bytearray(header[off:off + k]), dtype=torch.uint8)
            total = 0
            for rank, sh in enumerate(shards):
                data = sh.anchor_read(pending, hs, off, n)
                owned = shard.anchor_owned(table, RANK_DESCS[rank], hs, off, n)
                assert data.numel() == owned, (rank, off, n, data.numel(), owned)
                shard.anchor_place(table, RANK_DESCS[rank], hs, off, n, data, dst)
                total += owned
            assert total == n - max(0, min(hs - off, n)), (off, n, total)
            assert bytes(dst.numpy()) == file_bytes[off:off + n], (off, n, part, pending)


def main():
    torch.manual_seed(5)
    table = shard.Table(SHAPES)
    weights = {name: torch.randn(*shape) for name, shape in SHAPES}
    shards = [shard.RankShard(table, descs, 10, 1) for descs in RANK_DESCS]
    with tempfile.TemporaryDirectory() as tmp:
        for step in (0, 1):
            if step:
                for w in weights.values():
                    w.add_(torch.randn_like(w) * 0.05)
            parts = detect(shards, weights)
            digest = shards[0].state_digest(parts, True)
            for pending in ([False] if step == 0 else [True, False]):
                path = os.path.join(tmp, f"anchor-{step}-{int(pending)}")
                for sh in shards:
                    sh.anchor_write(path, step, digest, pending)
                with open(path, "rb") as f:
                    file_bytes = f.read()
                header, size = shards[1].anchor_header(step, digest)
                assert size == len(file_bytes) and file_bytes.startswith(header)
                check_parts(table, shards, file_bytes, header, pending)
            for sh in shards:
                sh.advance()

        # a wrong count places nothing
        hs = len(header)
        data = shards[0].anchor_read(False, hs, hs, 500)
        dst = torch.zeros(500, dtype=torch.uint8)
        try:
            shard.anchor_place(table, RANK_DESCS[0], hs, hs, 500, data[:-1], dst)
            raise AssertionError("a short data tensor was placed")
        except Error as e:
            assert e.status == "PULSE_ERR_ARG" and "own" in str(e), e
        assert int(dst.sum()) == 0
        try:
            shards[0].anchor_read(False, hs, size, 1)
            raise AssertionError("a range past the file was read")
        except Error as e:
            assert "past the end" in str(e), e

        # an anchor only the bucket holds
        store = os.path.join(tmp, "store")
        os.makedirs(store)
        committer = shard.Committer(store, table, PubOpts())
        sha = hashlib.sha256(file_bytes).digest()
        figures = committer.commit_uploaded(7, None, sha, len(file_bytes), digest)
        assert figures["anchor_bytes"] == len(file_bytes), figures
        assert committer.head_step() == 7
        with open(os.path.join(store, "head.json")) as f:
            text = f.read()
        rel = f"objects/{sha.hex()}.safetensors"
        assert rel in text and str(len(file_bytes)) in text, text
        assert not os.path.exists(os.path.join(store, rel))
        try:
            committer.commit_uploaded(8, None, sha[:31], 10, digest)
            raise AssertionError("a short sha256 was taken")
        except Error:
            pass
        committer.free()
        json.loads(text)
    print("ok")


if __name__ == "__main__":
    main()
