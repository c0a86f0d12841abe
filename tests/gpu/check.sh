#!/usr/bin/env bash
# The GPU check: everything the CUDA path must show on a real device, in one
# run of at most 8 minutes on one H200, ending with ONE summary table.
#
#   tests/gpu/check.sh --prepare   on an ordinary Debian/Ubuntu machine with
#                                  apt (no GPU): gathers into .gpu-deps/ (git
#                                  ignored, at most 40 MiB) the development
#                                  files and runtime libraries of libcurl,
#                                  libmicrohttpd, zstd, OpenSSL, Criterion and
#                                  pkg-config, which a bare GPU image may lack
#   tests/gpu/check.sh             on the GPU machine: the check
#   tests/gpu/check.sh --dry-run   on a machine without a GPU: the same steps
#                                  as far as they go without a device (the
#                                  dependency fallback, the build with nvcc,
#                                  the parsers and the table), to catch a typo
#                                  before the first real run; with root and
#                                  unshare it hides the system's -dev files of
#                                  those libraries first, as on a bare image
#
# With the device tool (the machine starts bare; nothing can be installed
# there; 600 s is the most one command may run):
#   here:   tests/gpu/check.sh --prepare
#   then:   run(command="bash tests/gpu/check.sh", carry=[".gpu-deps"],
#               timeout_s=600)
# The table is printed last and written, with the logs of the steps, to
# $OUT (gpu-summary.txt, *.log: they come back with the reply).
#
# What it checks, in this order (each step has a time limit; the whole check
# stops starting steps past PULSE_GPU_BUDGET seconds, default 470):
#   build      pulse with the CUDA kernels (Release, this device's
#              architecture only; warnings counted, not fatal), using the
#              system's libraries where it has them and .gpu-deps/ for the
#              rest
#   identical  the CUDA suite with PULSE_GPU_LARGE=1: every kernel family
#              (detect, digests, class index, locate, gather, scatter, LoCo
#              gate) byte-identical to the CPU reference, also on 10^9
#              parameters at 1% density; and the cuda_engine suite (device
#              ownership, streams)
#   encode     pulse-bench gpu on 10^9 parameters at 1%: detection against a
#              device-to-device copy of the bytes it reads (target >= 80%)
#   apply      the same run: the device part of applying a 1% step of 10^9
#              parameters once its bytes are on the device (class counts,
#              locate, gather, digest moves, scatter; target < 2 ms)
#   publisher  the publisher's device commits (same bytes as host commits)
#   subscriber a subscriber syncing device targets from a server
#   fp8        the FP8 kernels (cuda_fp8: quantize and the per-step
#              track) = the CPU reference; the device quantizer = torch's
#              own float8_e4m3fn conversion of the same formula, bytes and
#              scales; a 1% step on 8 tensors of 4096x4096 requantizing the
#              touched blocks against requantizing every block (target:
#              faster), the two FP8 copies identical (tests/gpu/fp8_torch.py;
#              skipped where torch has no CUDA); the subscriber's FP8
#              targets over device shadows (inference_side_device_fp8: the
#              CPU reference after every step, a NaN refused); a pull into
#              CUDA FP8 torch targets = a CPU pull = torch's float8_e4m3fn
#              of the formula (tests/gpu/fp8_pull.py; skipped likewise)
#   memcheck, racecheck, synccheck
#              compute-sanitizer over the CUDA suite (default sizes);
#              UNSUPPORTED, not FAIL, where the machine refuses the tool
#   torch      a pull into CUDA torch tensors equal to a CPU pull, on the
#              caller's streams (tests/gpu/torch_pull.py; skipped where
#              torch has no CUDA)
#   moe        a pull through pulse.Mapping into CUDA expert stacks and
#              fused tensors (tp_size 1, EP=2) equal to a CPU pull and to
#              the trainer's weights; tp_size 2 into CUDA refused
#              (tests/gpu/moe_pull.py; skipped likewise)
#   shard      a sharded publish (4 gloo ranks) whose blocks are CUDA
#              tensors, byte for byte a single publish of the gathered
#              weights (tests/python/test_shard.py's CUDA job; skipped
#              likewise)
# Exit status: 0 when nothing FAILed (a speed target MISSED is reported, and
# fails the check only with PULSE_GPU_STRICT=1).
#
# Environment: PULSE_GPU_BUILD (build folder, default build-gpu),
# PULSE_GPU_CLEAN=1 (build afresh; by default the build folder is reused),
# PULSE_GPU_DEPS_DIR (default .gpu-deps), PULSE_GPU_DEPS=carried (use the
# carried libraries even where the system has its own), PULSE_JOBS (default
# all cores), PULSE_GPU_BUDGET (seconds), PULSE_GPU_BUILD_S (seconds the
# configure and the build may take each, default 300: a 2-core machine's dry
# run needs more), PULSE_GPU_BENCH_ARGS (extra options
# for pulse-bench gpu), PULSE_GPU_STRICT.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
mode=check
case "${1:-}" in
--prepare) mode=prepare ;;
--dry-run) mode=dry ;;
--hidden-dry-run) mode=dry; hidden=1 ;; # internal: inside the namespace
"") ;;
*) echo "usage: tests/gpu/check.sh [--prepare | --dry-run]" >&2; exit 2 ;;
esac
deps=${PULSE_GPU_DEPS_DIR:-$root/.gpu-deps}
arch_dir=lib/x86_64-linux-gnu

# ------------------------------------------------------------ --prepare
# Packages whose files the build needs (headers, .pc, .so links) and the
# runtime libraries under them, without what every image has (libc, libgcc,
# libstdc++).
dev_pkgs="libcurl4-openssl-dev libmicrohttpd-dev libzstd-dev libcriterion-dev libssl-dev"
run_pkgs="libcurl4 libmicrohttpd12 libcriterion3 libzstd1 libssl3 pkgconf-bin libpkgconf3"

prepare() {
  command -v apt-get >/dev/null || { echo "--prepare needs apt-get" >&2; return 1; }
  local tmp closure
  tmp=$(mktemp -d)
  chmod 755 "$tmp" # apt's download user writes there
  apt-get update -qq >/dev/null 2>&1 || true
  closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances $run_pkgs 2>/dev/null |
    grep -v '^[ <]' | sort -u | grep -Ev '^(libc6|libgcc-s1|libstdc\+\+6|gcc-[0-9]+-base)$')
  [ -n "$closure" ] || { echo "apt-cache found no packages" >&2; return 1; }
  (cd "$tmp" && apt-get download $dev_pkgs $closure >/dev/null) ||
    { echo "apt-get download failed" >&2; return 1; }
  rm -rf "$deps"
  mkdir -p "$deps/root" "$deps/pc"
  for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$deps/root"; done
  ls "$tmp" > "$deps/packages.txt"
  rm -rf "$tmp" "$deps/root/usr/share/doc" "$deps/root/usr/share/man" \
    "$deps/root/usr/share/lintian" "$deps/root/usr/share/locale" "$deps/root/usr/share/info"
  find "$deps/root" -name '*.a' -delete # shared libraries only
  # .pc files that point into the folder wherever it lies (${pcfiledir}),
  # without what only static linking needs.
  local pc name
  for pc in "$deps"/root/usr/$arch_dir/pkgconfig/*.pc "$deps"/root/usr/share/pkgconfig/*.pc; do
    [ -f "$pc" ] || continue
    name=$(basename "$pc")
    # Debian keeps some headers in the multiarch folder (curl, OpenSSL's
    # configuration.h), found there only as a system folder: -I it too.
    sed -E -e 's|^prefix=.*|prefix=${pcfiledir}/../root/usr|' \
      -e 's|=/usr/|=${pcfiledir}/../root/usr/|g' \
      -e 's|^Cflags:(.*)$|Cflags:\1 -I${pcfiledir}/../root/usr/include/x86_64-linux-gnu|' \
      -e '/^(Requires|Libs)\.private:/d' "$pc" > "$deps/pc/$name"
  done
  local size
  size=$(du -sm "$deps" | cut -f1)
  echo "prepared $deps: $(wc -l < "$deps/packages.txt") packages, ${size} MiB"
  if [ "$size" -gt 40 ]; then
    echo "over 40 MiB: too large to carry with the tree" >&2
    return 1
  fi
}

if [ "$mode" = prepare ]; then
  prepare
  exit $?
fi

# --dry-run as root with unshare: again inside a mount namespace where the
# system's headers and .pc files of the carried libraries are hidden (not
# their .so links: a bind mount would follow them to the runtime library).
if [ "$mode" = dry ] && [ -z "${hidden:-}" ] && [ "$(id -u)" = 0 ] &&
  command -v unshare >/dev/null && unshare -m true 2>/dev/null; then
  exec unshare -m bash -c '
    empty=$(mktemp -d); blank=$(mktemp)
    for p in /usr/include/curl /usr/include/criterion /usr/include/openssl; do
      [ -d "$p" ] && mount --bind "$empty" "$p"; done
    for p in /usr/include/microhttpd.h /usr/include/zstd.h \
      /usr/lib/x86_64-linux-gnu/pkgconfig/{libcurl,libmicrohttpd,libzstd,libcrypto,libssl,openssl,criterion}.pc; do
      [ -f "$p" ] && [ ! -L "$p" ] && mount --bind "$blank" "$p"; done
    exec bash "$0" --hidden-dry-run' "$root/tests/gpu/check.sh"
fi

# A dry run takes every library from the carried folder: it checks that the
# folder alone builds and runs pulse.
[ "$mode" = dry ] && export PULSE_GPU_DEPS=${PULSE_GPU_DEPS:-carried}

# ------------------------------------------------------------ the table
build=${PULSE_GPU_BUILD:-$root/build-gpu}
jobs=${PULSE_JOBS:-$(nproc)}
budget=${PULSE_GPU_BUDGET:-470}
logs=$(mktemp -d)
start=$(date +%s)
rows=()
failed=0
missed=0

elapsed() { echo $(($(date +%s) - $1)); }
# A row: check, result (PASS FAIL MET MISSED UNSUPPORTED SKIPPED), detail.
row() {
  rows+=("$(printf '| %-36s | %-11s | %s |' "$1" "$2" "$3")")
  case $2 in FAIL) failed=1 ;; MISSED) missed=1 ;; esac
  printf '[check] %s: %s (%s)\n' "$1" "$2" "$3" >&2
}
# Seconds a step may take: its own limit, within what is left of the budget.
limit() {
  local left=$((budget - $(elapsed "$start")))
  [ "$left" -lt 1 ] && left=1
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}
finish() {
  row "total" "$([ "$failed" = 0 ] && echo PASS || echo FAIL)" \
    "$(elapsed "$start") s of a ${budget} s budget$([ "$mode" = dry ] && echo ', dry run without a device')"
  local table
  table=$(
    local commit="not a git checkout"
    if commit=$(git rev-parse --short HEAD 2>/dev/null); then
      git diff --quiet HEAD 2>/dev/null || commit="$commit (with local changes)"
    fi
    echo "pulse GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $commit"
    echo "device: $device"
    echo
    printf '| %-36s | %-11s | %s |\n' check result detail
    printf '|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..38})" "$(printf -- '-%.0s' {1..13})" "--------"
    printf '%s\n' "${rows[@]}"
  )
  printf '\n%s\n' "$table"
  if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    printf '%s\n' "$table" > "$OUT/gpu-summary.txt"
    # At most 8 files come back: the table and the logs of the steps that
    # say most (tails).
    local f n=0
    for f in build tests bench memcheck publisher subscriber racecheck; do
      [ -f "$logs/$f.log" ] && [ $n -lt 7 ] && { tail -n 2000 "$logs/$f.log" > "$OUT/$f.log"; n=$((n + 1)); }
    done
  fi
  rm -rf "$logs"
  local rc=$failed
  [ "${PULSE_GPU_STRICT:-0}" = 1 ] && [ "$missed" = 1 ] && rc=1
  exit "$rc"
}

# ------------------------------------------------------------ the machine
export PATH="$PATH:/usr/local/cuda/bin"
nvcc=$(command -v nvcc || true)
sanitizer=$(command -v compute-sanitizer || true)
[ -z "$sanitizer" ] && [ -x /usr/local/cuda/compute-sanitizer/compute-sanitizer ] &&
  sanitizer=/usr/local/cuda/compute-sanitizer/compute-sanitizer
device="none found"
cap=""
if command -v nvidia-smi >/dev/null; then
  device=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')
  [ -n "$device" ] || device="nvidia-smi sees none"
fi
if [ "$mode" = check ] && [ "$device" = "none found" ]; then
  row "device" FAIL "nvidia-smi not found (on a machine without a GPU use --dry-run)"
fi
if [ -z "$nvcc" ]; then
  row "build" FAIL "nvcc not found (the CUDA Toolkit is needed)"
  finish
fi

# -------------------------------------------------- libraries it may lack
# For each library the build needs, the system's when pkg-config finds it,
# else the carried one (.gpu-deps/, see --prepare). Only what is missing is
# taken from there, so the system's libraries win wherever they exist.
pc_modules="libzstd libcrypto libcurl libmicrohttpd criterion"
fallback=$build-deps
rm -rf "$fallback"
mkdir -p "$fallback/pc" "$fallback/lib" "$fallback/bin"
pkgconfig=$(command -v pkg-config || command -v pkgconf || true)
if [ -z "$pkgconfig" ] && [ -x "$deps/root/usr/bin/pkgconf" ]; then
  # The carried pkgconf, with its library; it searches the system's usual
  # folders (Debian's multiarch list) as well as PKG_CONFIG_PATH.
  cat > "$fallback/bin/pkg-config" <<EOF
#!/bin/sh
LD_LIBRARY_PATH="$deps/root/usr/$arch_dir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$deps/root/usr/bin/pkgconf" "\$@"
EOF
  chmod +x "$fallback/bin/pkg-config"
  pkgconfig=$fallback/bin/pkg-config
fi
carried=()
missing=()
for m in $pc_modules; do
  if [ "${PULSE_GPU_DEPS:-}" != carried ] && [ -n "$pkgconfig" ] && "$pkgconfig" --exists "$m" 2>/dev/null; then
    continue
  fi
  if [ -f "$deps/pc/$m.pc" ]; then
    sed "s|\${pcfiledir}/\.\./root|$deps/root|g" "$deps/pc/$m.pc" > "$fallback/pc/$m.pc"
    carried+=("$m")
  else
    missing+=("$m")
  fi
done
if [ -z "$pkgconfig" ]; then
  row "libraries" FAIL "no pkg-config, and none carried (run --prepare on a machine with apt, carry .gpu-deps)"
  finish
fi
if [ ${#missing[@]} -gt 0 ]; then
  row "libraries" FAIL "missing ${missing[*]}, not carried either (run tests/gpu/check.sh --prepare and carry .gpu-deps)"
  finish
fi
if [ ${#carried[@]} -gt 0 ]; then
  # Runtime libraries of the carried ones that the system lacks (by soname).
  known=$(ldconfig -p 2>/dev/null | awk '{print $1}' | sort -u)
  for so in "$deps"/root/usr/$arch_dir/*.so.* "$deps"/root/$arch_dir/*.so.*; do
    [ -e "$so" ] || continue
    name=$(basename "$so")
    case $name in *.so.[0-9]*) ;; *) continue ;; esac
    soname=$(objdump -p "$so" 2>/dev/null | awk '/SONAME/ {print $2}')
    [ -n "$soname" ] || soname=$name
    if ! grep -qx "$soname" <<<"$known" && [ ! -e "$fallback/lib/$soname" ]; then
      ln -s "$so" "$fallback/lib/$soname"
    fi
  done
  export LD_LIBRARY_PATH="$fallback/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  row "libraries" PASS "carried: ${carried[*]} ($(ls "$fallback/lib" | wc -l) runtime libraries the system lacks)"
else
  row "libraries" PASS "the system's"
fi
export PKG_CONFIG_PATH="$fallback/pc${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"

# ------------------------------------------------------------------ build
t=$(date +%s)
archs=${cap:-90}
[ "$mode" = dry ] && archs=90
# Kept between runs (a warm machine keeps ignored build folders): a rerun
# builds only what changed. PULSE_GPU_CLEAN=1 starts afresh.
[ "${PULSE_GPU_CLEAN:-0}" = 1 ] && rm -rf "$build"
# The carried libraries' own dependencies are found at link time by
# -rpath-link (at run time by LD_LIBRARY_PATH, above).
link_extra="-Wl,-rpath-link,$deps/root/usr/$arch_dir:$deps/root/$arch_dir"
# Warnings are counted, not fatal: another compiler's new warning must not
# cost the one run on a device (CI builds with -Werror).
build_s=${PULSE_GPU_BUILD_S:-300}
if timeout "$(limit "$build_s")" cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPULSE_CUDA=ON \
  -DPULSE_WERROR=OFF -DCMAKE_CUDA_COMPILER="$nvcc" -DPULSE_CUDA_ARCHS="${archs}-real" \
  -DPKG_CONFIG_EXECUTABLE="$pkgconfig" -DCMAKE_EXE_LINKER_FLAGS="$link_extra" \
  > "$logs/build.log" 2>&1 &&
  timeout "$(limit "$build_s")" cmake --build "$build" -j "$jobs" --target test_cuda \
    test_trainer_side test_inference_side pulse-bench pulse >> "$logs/build.log" 2>&1; then
  row "build" PASS "$(elapsed "$t") s, $("$nvcc" --version | tail -n 1 | sed 's/^Build //'), sm_${archs}, $(grep -c 'warning' "$logs/build.log") warning lines"
else
  rc=$?
  why=$(grep -E 'error|Error' "$logs/build.log" | head -n 2 | tr '\n' ' ' | cut -c1-300)
  [ "$rc" = 124 ] && why="timed out (PULSE_GPU_BUILD_S=$build_s; a rerun continues it) $why"
  row "build" FAIL "$(elapsed "$t") s: ${why:-exit $rc, see build.log}"
  finish
fi
tests=$build/tests/test_cuda
publisher_tests=$build/tests/test_trainer_side
subscriber_tests=$build/tests/test_inference_side
bench=$build/tools/pulse-bench

# Criterion's synthesis: "Tested: N | Passing: P | Failing: F | Crashing: C".
synthesis() { grep -E 'Synthesis' "$1" | tail -n 1 | sed -E 's/.*Synthesis: //; s/\x1b\[[0-9;]*m//g; s/ +$//'; }
count_of() { synthesis "$1" | sed -nE "s/.*$2: ([0-9]+).*/\\1/p"; }
no_device() { grep -c 'no CUDA device' "$1"; }
first_failure() { grep -E '^\[FAIL\]|Assertion|^\[----\]   ' "$1" | head -n 2 | tr '\n' ' ' | cut -c1-240; }

# Runs a Criterion suite (logs/NAME.log) and writes its row.
suite() { # name, label, seconds, binary, options...
  local name=$1 label=$2 secs=$3 bin=$4; shift 4
  local t0 rc log=$logs/$name.log
  t0=$(date +%s)
  timeout "$(limit "$secs")" "$bin" --jobs 1 --verbose "$@" > "$log" 2>&1
  rc=$?
  local tested passing nodev skipped
  tested=$(count_of "$log" Tested)
  passing=$(count_of "$log" Passing)
  nodev=$(no_device "$log")
  skipped=$(grep -c '^\[SKIP\]' "$log")
  local detail="${passing:-0} of ${tested:-0} passed, $skipped skipped, $(elapsed "$t0") s"
  if [ "$mode" = dry ] && [ "$rc" = 0 ]; then
    row "$label" SKIPPED "dry run: $detail (no device)"
  elif [ "$mode" = dry ]; then
    row "$label" FAIL "dry run: $detail, exit $rc: $(first_failure "$log")"
  elif [ "$rc" = 0 ] && [ "${tested:-0}" -gt 0 ] && [ "$nodev" = 0 ]; then
    row "$label" PASS "$detail"
  else
    [ "$nodev" != 0 ] && detail="$detail, $nodev saw no CUDA device"
    [ "$rc" = 124 ] && detail="$detail, timed out"
    row "$label" FAIL "$detail: $(first_failure "$log")"
  fi
}

# ------------------------------------------------ kernels vs the CPU
export PULSE_GPU_LARGE=1
suite tests "kernels = CPU reference (10^9 @ 1%)" 200 "$tests"
unset PULSE_GPU_LARGE

# ------------------------------------------------------------------ bench
t=$(date +%s)
# shellcheck disable=SC2086
timeout "$(limit 120)" "$bench" gpu --params 1000000000 --density 0.01 --reps 5 \
  ${PULSE_GPU_BENCH_ARGS:-} > "$logs/bench.log" 2>&1
rc=$?
ratio=$(sed -nE 's/.*encode: detect .* ([0-9.]+)% of the copy.*/\1/p' "$logs/bench.log" | head -n 1)
apply_ms=$(sed -nE 's/.*apply on the device: ([0-9.]+) ms.*/\1/p' "$logs/bench.log" | head -n 1)
scatter_ms=$(sed -nE 's/.*apply: scatter of [0-9]+ changes in ([0-9.]+) ms.*/\1/p' "$logs/bench.log" | head -n 1)
if [ "$mode" = dry ] && { [ "$rc" != 0 ] || ! grep -q '^gpu: no CUDA device' "$logs/bench.log"; }; then
  row "pulse-bench gpu" FAIL "dry run: exit $rc: $(tail -n 2 "$logs/bench.log" | tr '\n' ' ' | cut -c1-200)"
elif [ "$mode" = dry ]; then
  row "encode vs D2D copy (>= 80%)" SKIPPED "dry run: $(grep -m1 '^gpu:' "$logs/bench.log" || echo 'no output')"
  row "apply 1% of 10^9 on device (< 2 ms)" SKIPPED "dry run (no device)"
elif [ "$rc" != 0 ] || [ -z "$ratio" ] || [ -z "$apply_ms" ]; then
  why="pulse-bench gpu exited $rc$([ "$rc" = 124 ] && echo ' (timed out)'): $(tail -n 2 "$logs/bench.log" | tr '\n' ' ' | cut -c1-200)"
  row "encode vs D2D copy (>= 80%)" FAIL "$why"
  row "apply 1% of 10^9 on device (< 2 ms)" FAIL "$why"
else
  copy=$(sed -nE 's/^gpu: copy: .* = ([0-9.]+) GB\/s/\1/p' "$logs/bench.log" | head -n 1)
  row "encode vs D2D copy (>= 80%)" "$(awk -v r="$ratio" 'BEGIN {print (r >= 80) ? "MET" : "MISSED"}')" \
    "detect at ${ratio}% of the copy's time (copy ${copy} GB/s), $(elapsed "$t") s run"
  row "apply 1% of 10^9 on device (< 2 ms)" "$(awk -v s="$apply_ms" 'BEGIN {print (s < 2) ? "MET" : "MISSED"}')" \
    "${apply_ms} ms (scatter alone ${scatter_ms} ms)"
fi

# ---------------------------------------- publisher and subscriber
suite publisher "publisher device commits" 120 "$publisher_tests" --filter 'publisher_device/*'
suite subscriber "subscriber device targets" 120 "$subscriber_tests" --filter 'inference_side_device/*'

# ------------------------------------------------------------ FP8 targets
suite fp8 "FP8 kernels = CPU reference" 60 "$tests" --filter 'cuda_fp8/*'
t=$(date +%s)
timeout "$(limit 120)" python3 "$root/tests/gpu/fp8_torch.py" "$build" > "$logs/fp8.log" 2>&1
rc=$?
fp8_torch=$(sed -n 's/^fp8 torch: //p' "$logs/fp8.log" | head -n 1)
fp8_timing=$(sed -n 's/^fp8 timing: //p' "$logs/fp8.log" | head -n 1)
fp8_touched=$(sed -nE 's/.*touched blocks ([0-9.]+) ms.*/\1/p' <<<"$fp8_timing")
fp8_whole=$(sed -nE 's/.*every block ([0-9.]+) ms.*/\1/p' <<<"$fp8_timing")
fp8_why="exit $rc$([ "$rc" = 124 ] && echo ' (timed out)'): $(tail -n 2 "$logs/fp8.log" | tr '\n' ' ' | cut -c1-200)"
if [ "$rc" = 77 ] || [ "$mode" = dry ]; then
  # 77: torch without CUDA (Debian's python3-torch) or no device.
  row "FP8 = torch float8_e4m3fn" SKIPPED "$(tail -n 1 "$logs/fp8.log" | cut -c1-200)"
  row "FP8 1% step: touched vs all blocks" SKIPPED "dry run or no torch CUDA"
else
  case "$fp8_torch" in
  "") row "FP8 = torch float8_e4m3fn" FAIL "$fp8_why" ;;
  skipped*) row "FP8 = torch float8_e4m3fn" SKIPPED "$fp8_torch" ;;
  FAIL*) row "FP8 = torch float8_e4m3fn" FAIL "$fp8_torch" ;;
  *) row "FP8 = torch float8_e4m3fn" PASS "$fp8_torch" ;;
  esac
  if [ -z "$fp8_touched" ] || [ -z "$fp8_whole" ] || ! grep -q 'identical FP8 copies' <<<"$fp8_timing"; then
    row "FP8 1% step: touched vs all blocks" FAIL "${fp8_timing:-$fp8_why}"
  else
    row "FP8 1% step: touched vs all blocks" \
      "$(awk -v a="$fp8_touched" -v b="$fp8_whole" 'BEGIN {print (a < b) ? "MET" : "MISSED"}')" \
      "${fp8_timing}, $(elapsed "$t") s run"
  fi
fi

suite subscriber_fp8 "subscriber device FP8 targets" 120 "$subscriber_tests" \
  --filter 'inference_side_device_fp8/*'
t=$(date +%s)
timeout "$(limit 90)" python3 "$root/tests/gpu/fp8_pull.py" "$build" > "$logs/fp8_pull.log" 2>&1
rc=$?
fp8_pull=$(sed -n 's/^fp8 pull: //p' "$logs/fp8_pull.log" | tail -n 1 | cut -c1-200)
if [ "$rc" = 77 ] || [ "$mode" = dry ]; then
  row "pull into CUDA FP8 = CPU = torch" SKIPPED "${fp8_pull:-$(tail -n 1 "$logs/fp8_pull.log" | cut -c1-200)}"
elif [ "$rc" = 0 ]; then
  row "pull into CUDA FP8 = CPU = torch" PASS "$fp8_pull, $(elapsed "$t") s"
else
  row "pull into CUDA FP8 = CPU = torch" FAIL \
    "exit $rc$([ "$rc" = 124 ] && echo ' (timed out)'): $(tail -n 2 "$logs/fp8_pull.log" | tr '\n' ' ' | cut -c1-200)"
fi

# ------------------------------------------------------------- sanitizers
# Each forked test process prints its own "ERROR SUMMARY: N errors". A tool
# the machine refuses (gVisor: "Device not supported", error 999 at the
# first allocation) is UNSUPPORTED, not a failure of the code.
unsupported() { grep -Eqi 'device not supported|not supported on this|unsupported (device|platform)|error 999|CUDA_ERROR_UNKNOWN|failed to initialize|cannot be used' "$1"; }
sanitize() { # tool, seconds, test options...
  local tool=$1 secs=$2; shift 2
  local t0 rc log=$logs/$tool.log errors runs
  t0=$(date +%s)
  if [ -z "$sanitizer" ]; then
    row "compute-sanitizer $tool" UNSUPPORTED "compute-sanitizer not found"
    return
  fi
  if [ "$(limit "$secs")" -lt 10 ]; then
    row "compute-sanitizer $tool" FAIL "no time left in the budget"
    return
  fi
  local extra=()
  [ "$tool" = memcheck ] && extra=(--leak-check full)
  timeout "$(limit "$secs")" "$sanitizer" --target-processes all --error-exitcode 3 \
    --tool "$tool" "${extra[@]}" "$tests" --jobs 1 "$@" > "$log" 2>&1
  rc=$?
  errors=$(grep -Eo 'ERROR SUMMARY: [0-9]+' "$log" | awk '{s += $3} END {print s + 0}')
  runs=$(grep -c 'ERROR SUMMARY' "$log")
  local detail="$errors errors in $runs processes, tests $(synthesis "$log"), $(elapsed "$t0") s"
  if [ "$mode" = dry ]; then
    row "compute-sanitizer $tool" SKIPPED "dry run: $detail"
  elif unsupported "$log" && [ "$(count_of "$log" Passing)" = "" -o "$(count_of "$log" Passing)" = 0 ]; then
    row "compute-sanitizer $tool" UNSUPPORTED "refused here: $(grep -Eim1 'not supported|error 999|failed to initialize' "$log" | cut -c1-160)"
  elif [ "$rc" = 0 ] && [ "$errors" = 0 ] && [ "$runs" -gt 0 ] && [ "$(count_of "$log" Tested)" != 0 ] &&
    [ "$(no_device "$log")" = 0 ]; then
    row "compute-sanitizer $tool" PASS "$detail"
  else
    [ "$rc" = 124 ] && detail="$detail, timed out"
    row "compute-sanitizer $tool" FAIL "$detail: $(grep -E '^=========' "$log" | grep -v 'ERROR SUMMARY: 0' | head -n 2 | tr '\n' ' ' | cut -c1-200)"
  fi
}
sanitize memcheck 120
# Shared-memory hazards and barrier misuse on the tile kernels (detect,
# class counts, locate) and the streamed apply.
sanitize racecheck 45 --filter 'cuda_detect/tables*'
sanitize synccheck 45 --filter 'cuda_apply/class_counts*'

# ------------------------------------------------------ torch tensors
if [ -f "$root/python/pulse/__init__.py" ] && [ -f "$root/tests/gpu/torch_pull.py" ]; then
  t=$(date +%s)
  timeout "$(limit 90)" python3 "$root/tests/gpu/torch_pull.py" "$build" > "$logs/torch.log" 2>&1
  rc=$?
  if [ "$rc" = 0 ]; then
    row "pull into CUDA torch = CPU pull" PASS "$(elapsed "$t") s"
  elif [ "$rc" = 77 ] || [ "$mode" = dry ]; then
    # 77: torch without CUDA (Debian's python3-torch) or no device.
    row "pull into CUDA torch = CPU pull" SKIPPED "$(tail -n 1 "$logs/torch.log")"
  else
    row "pull into CUDA torch = CPU pull" FAIL "$(tail -n 2 "$logs/torch.log" | tr '\n' ' ' | cut -c1-200)"
  fi
else
  row "pull into CUDA torch = CPU pull" SKIPPED "skipped: no Python binding"
fi
if [ -f "$root/python/pulse/__init__.py" ] && [ -f "$root/tests/gpu/moe_pull.py" ]; then
  t=$(date +%s)
  timeout "$(limit 90)" python3 "$root/tests/gpu/moe_pull.py" "$build" > "$logs/moe.log" 2>&1
  rc=$?
  if [ "$rc" = 0 ]; then
    row "mapped pull into CUDA expert stacks = CPU" PASS "$(elapsed "$t") s"
  elif [ "$rc" = 77 ] || [ "$mode" = dry ]; then
    row "mapped pull into CUDA expert stacks = CPU" SKIPPED "$(tail -n 1 "$logs/moe.log")"
  else
    row "mapped pull into CUDA expert stacks = CPU" FAIL "$(tail -n 2 "$logs/moe.log" | tr '\n' ' ' | cut -c1-200)"
  fi
fi
if [ -f "$root/python/pulse/__init__.py" ] && [ -f "$root/tests/python/test_shard.py" ]; then
  t=$(date +%s)
  PULSE_LIBRARY="$build/libpulse.so" timeout "$(limit 150)" \
    python3 "$root/tests/python/test_shard.py" > "$logs/shard.log" 2>&1
  rc=$?
  what="sharded publish of CUDA blocks = single publish"
  if [ "$rc" = 0 ] && grep -q "dim0 CUDA blocks" "$logs/shard.log"; then
    row "$what" PASS "$(elapsed "$t") s"
  elif [ "$rc" = 77 ] || [ "$mode" = dry ] ||
    { [ "$rc" = 0 ] && grep -q "CUDA blocks skipped" "$logs/shard.log"; }; then
    # 77: no torch; a torch without CUDA says so and runs the rest.
    row "$what" SKIPPED "$(grep -m1 "skipped" "$logs/shard.log" || tail -n 1 "$logs/shard.log")"
  else
    row "$what" FAIL "$(grep -m2 "FAIL\|Error" "$logs/shard.log" | tr '\n' ' ' | cut -c1-200)"
  fi
fi
finish
