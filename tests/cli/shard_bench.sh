#!/usr/bin/env bash
# The sharded publish's bench (tests/cli/lib/shard_bench.c, built here with
# cc against the build's headers and libpulse): 4 processes, one per rank,
# publish through the store with pulse_pub_shard_step, against one publisher
# of the gathered FP32 weights on the same steps; prints each rank's time per
# step and peak extra memory against its shard's BF16 bytes, and checks that
# both stores end with the same objects (names are SHA-256: the same bytes).
# As a test it runs a small model; as a bench:
#   ROWS=2048 MODE=dim0|rect PER1024=26 bash tests/cli/shard_bench.sh BIN_DIR
# (2 tensors of ROWS x 4096; PER1024: elements moved per 1024 per step).
source "$(dirname "$0")/lib/common.sh"
command -v cc >/dev/null || { echo "skipped: no C compiler"; exit 77; }
top=$(cd "$bin/.." && pwd)
[ -f "$top/libpulse.so" ] || { echo "skipped: no libpulse.so beside $bin"; exit 77; }
# A sanitizer build's library needs its runtime first in the process: the
# bench's plain program cannot load it (as Python cannot).
if ldd "$top/libpulse.so" 2>/dev/null | grep -q 'libasan\|libubsan'; then
  echo "skipped: libpulse.so is a sanitizer build"; exit 77
fi
cc -O2 -std=c11 -D_GNU_SOURCE -I"$top/include/pulse_codec" -I"$top/include/pulse_trainer" \
  "$(dirname "$0")/lib/shard_bench.c" -L"$top" -lpulse -Wl,-rpath,"$top" -o "$work/shard_bench" \
  >"$work/cc.out" 2>&1 || { bad "the bench does not build"; cat "$work/cc.out"; finish; }
mkdir -p "$work/run"
"$work/shard_bench" "$work/run" "${ROWS:-256}" "${MODE:-dim0}" "${PER1024:-26}" >"$work/bench.out" 2>&1 \
  && ok || bad "the bench failed"
cat "$work/bench.out"
expect "ranks that reported" 4 "$(grep -c '^rank [0-3]: ' "$work/bench.out")"
expect "the sharded store's objects are the single publisher's" \
  "$(ls "$work/run/single/objects" | sort | tr '\n' ' ')" \
  "$(ls "$work/run/sharded/objects" | sort | tr '\n' ' ')"
finish
