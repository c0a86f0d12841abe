#!/usr/bin/env bash
# Invariant 2 against the real thing: PyTorch's `tensor.to(torch.bfloat16)`
# and pulse's one rounding give the same BF16 bits for millions of FP32
# values (random bit patterns, ties, subnormals, +-inf, -0.0, finite values
# that overflow). NaNs are checked separately and reported: PyTorch itself
# gives different NaN bits on different code paths.
# Skips (exit 77) where python3-torch is not installed.
# Usage: torch_rounding.sh BIN_DIR
set -u
bin=$1
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "skipped: python3-torch is not installed (apt-get install python3-torch)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 - "$work" <<'PY' || exit 1
import json, struct, sys, torch
out = sys.argv[1]
g = torch.Generator().manual_seed(1)
bits = torch.randint(-2**31, 2**31 - 1, (1 << 22,), generator=g, dtype=torch.int64).to(torch.int32)
edge = []
for hi in range(0, 1 << 16, 7):          # every exponent, ties and neighbours
    for lo in (0x0000, 0x7FFF, 0x8000, 0x8001, 0xFFFF):
        edge.append((hi << 16) | lo)
edge += [0x00000001, 0x00008000, 0x00018000, 0x0000FFFF, 0x80000000, 0x7F7FFFFF,
         0x7F7F7FFF, 0x7F7F8000, 0x7F800000, 0xFF800000, 0xFF7FFFFF]
edge = torch.tensor([e - (1 << 32) if e >= 1 << 31 else e for e in edge], dtype=torch.int32)
allbits = torch.cat([bits, edge])
f = allbits.view(torch.float32)
finite_or_inf = ~torch.isnan(f)
f = f[finite_or_inf]
b = f.to(torch.bfloat16)
def write(path, name, t, dtype):
    raw = t.contiguous().view(torch.int32 if dtype == "F32" else torch.int16).numpy().tobytes()
    h = json.dumps({name: {"dtype": dtype, "shape": [t.numel()], "data_offsets": [0, len(raw)]}},
                   separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(h))); fh.write(h); fh.write(raw)
write(f"{out}/f32.safetensors", "x", f, "F32")
write(f"{out}/torch_bf16.safetensors", "x", b, "BF16")
nan = torch.tensor([0x7FC00000, 0x7F800001, -0x00400000, -1, 0x7FFFFFFF], dtype=torch.int32).view(torch.float32)
print("torch NaN bits:", [hex(int(v) & 0xFFFF) for v in nan.to(torch.bfloat16).view(torch.int16)],
      "(pulse gives 0x7fc0 for every NaN)")
print(f"values compared: {f.numel()}")
PY
# pulse casts the F32 file with its one rounding: the patch from torch's BF16
# to it must be empty.
"$bin/pulse-diff" "$work/torch_bf16.safetensors" "$work/f32.safetensors" -o "$work/p.pulse" | tee "$work/diff.txt"
if grep -q " 0 of " "$work/diff.txt"; then
  echo "torch_rounding: 1 passed, 0 failed"
else
  echo "pulse's rounding differs from PyTorch's on some values"
  "$bin/pulse-inspect" "$work/p.pulse" | tail -3
  echo "torch_rounding: 0 passed, 1 failed"
  exit 1
fi
