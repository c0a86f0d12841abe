# The preamble every cli test shares, sourced first by a script that is run
# as `bash SCRIPT BIN_DIR` (tests/CMakeLists.txt registers only cli/*.sh, so
# this file is not a test): source "$(dirname "$0")/lib/common.sh"
# A script may define cleanup_extra (run at exit, after the processes in pids
# are stopped and before $work goes) and set stop_signal (default TERM).
set -u
bin=${1:?usage: $(basename "$0") BIN_DIR}
test_name=$(basename "$0" .sh)
work=$(mktemp -d)
pids=()
stop_signal=TERM
failures=0
pass=0

# At exit: stops the processes in pids, runs cleanup_extra, removes $work (or keeps it when KEEP is set).
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -s "$stop_signal" "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  if declare -F cleanup_extra >/dev/null; then cleanup_extra; fi
  if [ -n "${KEEP:-}" ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# Counts a passed check.
ok() { pass=$((pass + 1)); }
# Reports a failed check (the arguments say which) and counts it.
bad() { echo "FAIL: $*"; failures=$((failures + 1)); }
# expect DESCRIPTION EXPECTED ACTUAL: passes when the two strings are equal.
expect() { if [ "$2" = "$3" ]; then ok; else bad "$1: expected '$2', got '$3'"; fi; }
# Prints the BF16 state digest pulse-inspect gives for a safetensors file (nothing when it cannot read it).
digest_of() { "$bin/pulse-inspect" "$1" 2>/dev/null | awk '/BF16 state digest/ {print $NF}'; }
# Prints the path of step N of the trajectory in $work/traj.
ck() { printf '%s/traj/step%04d.safetensors' "$work" "$1"; }
# wait_digest FILE DIGEST: waits up to 30 s for FILE to hold that state digest.
wait_digest() {
  local _
  for _ in $(seq 1 300); do
    [ "$(digest_of "$1")" = "$2" ] && return 0
    sleep 0.1
  done
  return 1
}
# wait_port FILE [SECONDS]: waits (10 s by default) for an 'on http://HOST:PORT' line in FILE; prints PORT.
wait_port() {
  local tries=$((${2:-10} * 20)) p
  for ((; tries > 0; tries--)); do
    p=$(sed -n 's|.*on http://[^ ]*:\([0-9]*\)$|\1|p' "$1" 2>/dev/null | head -1)
    [ -n "$p" ] && { echo "$p"; return 0; }
    sleep 0.05
  done
  return 1
}
# serve STORE: starts pulse-serve on STORE (output in STORE.serve.out and .err), adds it to pids, sets port and url.
serve() {
  "$bin/pulse-serve" --store "$1" --listen 127.0.0.1:0 >"$1.serve.out" 2>"$1.serve.err" &
  pids+=($!)
  port=$(wait_port "$1.serve.out") || { echo "FAIL: pulse-serve $1 did not start"; cat "$1.serve.err"; return 1; }
  url=http://127.0.0.1:$port
}
# finish [NOTE]: prints the summary line and exits 1 when a check failed, 0 otherwise.
finish() {
  echo "$test_name: $pass passed, $failures failed${1:+ ($1)}"
  [ "$failures" -eq 0 ] && exit 0
  exit 1
}
