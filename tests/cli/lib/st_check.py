"""A plain safetensors reader, as an inference engine loads a file: the
8-byte header length, the JSON header, each tensor's dtype and offsets, and
its bytes. Used by pull_crash_loader.sh after each kill of pulse-pull.

Usage: st_check.py FILE STEP:PATH [STEP:PATH ...]
Prints and exits with:
  "refused <why>"  exit 3: a loader cannot open the file
  "step N"         exit 0: every tensor is bit for bit that of published
                   step N (PATH), and the metadata claims N
  "mix <why>"      exit 1: it opens, and is no published step (or claims
                   another): what must never happen
"""
import json
import struct
import sys

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1,
               "I16": 2, "I32": 4, "I64": 8, "BOOL": 1}


class Refused(Exception):
    pass


def load(path):
    """(metadata, {name: bytes}) of a safetensors file, or Refused."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise Refused("shorter than 8 bytes")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8 or n > 100 << 20:
        raise Refused("header length %d past the file's %d bytes" % (n, len(raw)))
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise Refused("header is not JSON: %s" % e)
    if not isinstance(header, dict):
        raise Refused("header is not an object")
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    ends = []
    for name, t in header.items():
        try:
            dtype, shape, (b, e) = t["dtype"], t["shape"], t["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise Refused("tensor %s: bad entry" % name)
        if dtype not in DTYPE_BYTES:
            raise Refused("tensor %s: dtype %s" % (name, dtype))
        count = 1
        for d in shape:
            count *= d
        if not (0 <= b <= e <= len(data)) or e - b != count * DTYPE_BYTES[dtype]:
            raise Refused("tensor %s: offsets [%d, %d) do not fit" % (name, b, e))
        tensors[name] = data[b:e]
        ends.append((b, e))
    ends.sort()
    pos = 0
    for b, e in ends:  # contiguous, no overlap, no hole
        if b != pos:
            raise Refused("tensors do not tile the data")
        pos = e
    if pos != len(data):
        raise Refused("data has %d bytes after the tensors" % (len(data) - pos))
    return meta, tensors


def main():
    try:
        meta, got = load(sys.argv[1])
    except Refused as e:
        print("refused", e)
        return 3
    for spec in sys.argv[2:]:
        step, path = spec.split(":", 1)
        _, want = load(path)
        if want == got:
            if meta.get("step") != step:
                print("mix: the tensors of step %s under the claim %r" % (step, meta.get("step")))
                return 1
            print("step", step)
            return 0
    print("mix: tensors of no published step (claim %r)" % meta.get("step"))
    return 1


if __name__ == "__main__":
    sys.exit(main())
