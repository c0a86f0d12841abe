#!/usr/bin/env bash
# Runs the CUDA suite (tests/cuda) on a machine without a GPU: the real
# kernels of cuda/*.cu compiled as C++ against the CPU emulator of
# emu_cuda.h, under AddressSanitizer and UndefinedBehaviorSanitizer.
# It checks the kernels' logic (results bit for bit against the CPU
# reference, barriers, out-of-bounds accesses); it says nothing about
# speed or the real compiler, which tests/gpu/check.sh covers on a GPU.
# Then the publisher's device commits (tests/trainer_side/
# test_publisher_device.c, trainer_side without its HTTP server) and the
# subscriber's device targets (tests/inference_side/test_device_sync.c and
# test_device_fp8.c, with the server) run on the same emulated kernels, and once more with the device hidden
# (PULSE_EMU_NO_DEVICE=1) for the "no CUDA device" error.
#   tests/cuda/emu/run.sh [criterion options, e.g. --filter 'cuda_detect/*']
# Environment: PULSE_EMU_BUILD (build folder, default build-emu), PULSE_JOBS,
# PULSE_EMU_SEED (the order the emulator runs threads in between barriers).
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
out=${PULSE_EMU_BUILD:-$root/build-emu}
jobs=${PULSE_JOBS:-$(nproc)}
mkdir -p "$out/obj"

san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"
common="-g -O1 -Wall -Wextra -Werror -ffp-contract=off -fno-fast-math -D_GNU_SOURCE $san"
# Every folder of a module (its root and its parts) is on its include path.
incdirs() { find "$@" -type d -printf '-I%p '; }
inc="$(incdirs "$root/codec") -I$root/cuda -I$root/tests/cuda"

cmake -S "$root" -B "$out/lib" -DPULSE_CUDA=OFF -DPULSE_TESTS=OFF \
  -DPULSE_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$out/lib" --target pulse_codec -j "$jobs" >/dev/null

pids=()
compile() { # output, compiler and arguments...
  local obj=$1; shift
  "$@" -o "$obj" & pids+=($!)
  if [ ${#pids[@]} -ge "$jobs" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
}
objs=()
for src in "$root"/cuda/*.cu; do
  obj="$out/obj/$(basename "$src").o"; objs+=("$obj")
  compile "$obj" g++ -std=c++17 -x c++ -DPULSE_CUDA_EMU -include "$root/tests/cuda/emu/emu_cuda.h" \
    $common -Wno-unknown-pragmas $inc -c "$src"
done
obj="$out/obj/emu_runtime.o"; objs+=("$obj")
compile "$obj" g++ -std=c++17 $common $inc -c "$root/tests/cuda/emu/emu_runtime.cc"
for src in "$root"/cuda/patch_cuda.c "$root"/cuda/patch_cuda_apply.c "$root"/cuda/loco_ref.c "$root"/cuda/chunks.c "$root"/tests/cuda/*.c; do
  obj="$out/obj/$(basename "$src").o"; objs+=("$obj")
  compile "$obj" gcc -std=c11 -DPULSE_HAVE_CUDA=1 $common $inc -c "$src"
done
# pulse-bench's gpu mode alone (the other modes need other modules).
printf '%s\n' '#include <stdio.h>' 'int bench_gpu_main(int argc, char **argv);' \
  'int main(int argc, char **argv) { return bench_gpu_main(argc - 1, argv + 1); }' \
  > "$out/obj/bench_gpu_main.c"
tool_objs=()
# It and the CLI helpers it uses (tools/cli; the other modes need loco and
# the HTTP layers).
for src in "$out/obj/bench_gpu_main.c" "$root"/tools/bench/bench_gpu.c \
  "$root"/tools/cli/cli_{args,report,time}.c; do
  obj="$out/obj/tool_$(basename "$src").o"; tool_objs+=("$obj")
  compile "$obj" gcc -std=c11 -DPULSE_HAVE_CUDA=1 $common $inc -I"$root/tools/cli" -I"$root/tools/bench" -c "$src"
done
# The publisher (no HTTP server: the device commits need none of it).
trainer_objs=()
for src in "$root"/trainer_side/{publisher,upload}/*.c "$root"/tests/trainer_side/test_publisher_device.c; do
  obj="$out/obj/trainer_$(basename "$src").o"; trainer_objs+=("$obj")
  compile "$obj" gcc -std=c11 -DPULSE_HAVE_CUDA=1 $common $inc $(incdirs "$root/trainer_side") \
    -I"$root/tests/trainer_side" -I"$root/tests/common" -c "$src"
done
# The subscriber with device targets, against a publisher and its server.
sub_objs=()
for src in "$root"/trainer_side/{server,serve}/*.c \
  $(find "$root"/inference_side -name '*.c') "$root"/tests/inference_side/test_device_{sync,fp8}.c; do
  obj="$out/obj/sub_$(basename "$src").o"; sub_objs+=("$obj")
  compile "$obj" gcc -std=c11 -DPULSE_HAVE_CUDA=1 $common $inc $(incdirs "$root/trainer_side") \
    $(incdirs "$root/inference_side") -I"$root/tests/inference_side" -I"$root/tests/common" \
    $(pkg-config --cflags libcurl libmicrohttpd) -c "$src"
done
for pid in "${pids[@]}"; do wait "$pid"; done

libs="$out/lib/codec/libpulse_codec.a $(pkg-config --libs libzstd libcrypto) -lpthread -lm"
lib_objs=()
for obj in "${objs[@]}"; do
  case "$obj" in */test_*) ;; *) lib_objs+=("$obj") ;; esac
done
g++ $san -o "$out/test_cuda_emu" "${objs[@]}" $libs $(pkg-config --libs criterion)
g++ $san -o "$out/pulse-bench-emu" "${lib_objs[@]}" "${tool_objs[@]}" $libs
g++ $san -o "$out/test_publisher_emu" "${lib_objs[@]}" "${trainer_objs[@]}" $libs \
  $(pkg-config --libs libcurl criterion) # the trainer side uploads with libcurl
publisher_objs=()
for obj in "${trainer_objs[@]}"; do
  case "$obj" in */trainer_test_*) ;; *) publisher_objs+=("$obj") ;; esac
done
g++ $san -o "$out/test_subscriber_emu" "${lib_objs[@]}" "${publisher_objs[@]}" "${sub_objs[@]}" \
  $libs $(pkg-config --libs libcurl libmicrohttpd criterion)

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
echo "== pulse-bench gpu on a small table (emulated: the figures mean nothing)"
"$out/pulse-bench-emu" gpu --params 300000 --tensors 7 --reps 1
echo "== the CUDA suite on the emulator"
"$out/test_cuda_emu" --jobs "$jobs" "$@"
echo "== the publisher's device commits on the emulator"
"$out/test_publisher_emu" --jobs "$jobs" "$@"
echo "== the subscriber's device targets on the emulator"
"$out/test_subscriber_emu" --jobs "$jobs" "$@"
echo "== the same without a device (PULSE_EMU_NO_DEVICE=1)"
PULSE_EMU_NO_DEVICE=1 "$out/test_publisher_emu" --jobs "$jobs" \
  --filter 'publisher_device/device_tensors_without_a_device_are_refused'
