#!/usr/bin/env bash
# The two quick-start commands (README.md):
#   tools/run.sh demo   install what is missing, build, run the main job
#   tools/run.sh test   install what is missing, build, pass every test
# Environment: PULSE_BUILD (build folder, default build), PULSE_JOBS,
# PULSE_FUZZ_SECONDS (per fuzz target in `test`, default 30; 0 skips),
# PULSE_SANITIZE_TESTS (1 = also run the suites under ASan+UBSan; default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mode=${1:-}
build=${PULSE_BUILD:-build}
jobs=${PULSE_JOBS:-$(nproc)}

bash tools/install-deps.sh

configure_and_build() { # dir, extra cmake args...
  local dir=$1; shift
  cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  cmake --build "$dir" -j "$jobs" >/dev/null
}

case "$mode" in
demo)
  configure_and_build "$build"
  # The main job: a trainer publishes a synthetic RL trajectory into a local
  # store served over HTTP on 127.0.0.1; two inference pullers follow it.
  "$build/tools/pulse-bench" demo "${@:2}"
  ;;
test)
  configure_and_build "$build" -DPULSE_WERROR=ON
  (cd "$build" && ctest --output-on-failure -j 1)
  if [ -f tests/cuda/emu/run.sh ]; then
    # No GPU here: the real kernels on the CPU emulator, against the reference.
    echo "== the CUDA kernels on the CPU emulator (tests/cuda/emu)"
    PULSE_EMU_BUILD="$build-emu" bash tests/cuda/emu/run.sh
  fi
  if [ "${PULSE_SANITIZE_TESTS:-1}" = 1 ]; then
    echo "== the suites again under AddressSanitizer + UndefinedBehaviorSanitizer"
    configure_and_build "$build-asan" -DPULSE_WERROR=ON -DPULSE_CUDA=OFF -DPULSE_SANITIZE=address,undefined
    # A suite's whole run can leak one allocation inside Criterion's own
    # runner (tests/lsan.supp says which and why): suppressed for the
    # Criterion suites; the scripts' programs run without it.
    (cd "$build-asan" && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j 1 \
      -E '^(codec|cuda|trainer_side|inference_side|loco)$')
    (cd "$build-asan" && ASAN_OPTIONS=detect_leaks=1 \
      LSAN_OPTIONS=suppressions="$root/tests/lsan.supp" ctest --output-on-failure -j 1 \
      -R '^(codec|cuda|trainer_side|inference_side|loco)$')
  fi
  fuzz_seconds=${PULSE_FUZZ_SECONDS:-30}
  if [ "$fuzz_seconds" != 0 ]; then
    echo "== libFuzzer, ${fuzz_seconds}s per decoder"
    # PULSE_FUZZ instruments every library for coverage and the sanitizers.
    CC=clang configure_and_build "$build-fuzz" -DPULSE_FUZZ=ON -DPULSE_TESTS=OFF -DPULSE_CUDA=OFF
    for fuzzer in "$build-fuzz"/tests/fuzz_*; do
      name=$(basename "$fuzzer"); name=${name#fuzz_}
      corpus=$(mktemp -d)
      cp -r tests/fuzz/corpus/"$name"/. "$corpus"/ 2>/dev/null || true
      "$fuzzer" -max_total_time="$fuzz_seconds" -max_len=65536 -rss_limit_mb=2048 \
        -artifact_prefix="$corpus/" "$corpus" 2>"$corpus.log" || {
        tail -40 "$corpus.log"; echo "fuzz_$name found a failure (artifacts in $corpus)"; exit 1; }
      grep -E "^Done [0-9]+ runs" "$corpus.log" | sed "s/^/fuzz_$name: /" || true
      rm -rf "$corpus" "$corpus.log"
    done
  fi
  echo "all tests passed"
  ;;
*)
  echo "usage: tools/run.sh demo|test" >&2
  exit 2
  ;;
esac
