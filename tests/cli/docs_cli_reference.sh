#!/usr/bin/env bash
# docs/reference/cli.md is every program's --help as the programs print it
# now (tools/scripts/cli_reference.sh writes it), and every flag a program's
# source parses appears in its help (no flag only the code knows).
#   docs_cli_reference.sh BIN_DIR
set -u
bin=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0

bash "$root/tools/scripts/cli_reference.sh" "$bin" "$work/cli.md" || exit 1
if ! diff -u "$root/docs/reference/cli.md" "$work/cli.md" >"$work/diff"; then
  head -60 "$work/diff"
  echo "FAIL: docs/reference/cli.md differs from the programs' --help:" \
       "run tools/scripts/cli_reference.sh $bin"
  fail=1
fi

# Flags in the source, each in its program's help. A flag the source passes
# to another program (pulse-bench runs pulse-pull) is an argv entry, not
# parsed: those lines say argv[.
check_flags() { # program, its help file, sources...
  local prog=$1 help=$2; shift 2
  local flag
  for flag in $(grep -h -v 'argv\[' "$@" | grep -ohE '"--[a-z0-9][a-z0-9-]*' | tr -d '"' | sort -u); do
    [ "$flag" = --help ] && continue
    grep -qE -e "(^|[^a-z0-9-])$flag([^a-z0-9-]|\$)" "$help" ||
      { echo "FAIL: $prog parses $flag, which its --help does not name"; fail=1; }
  done
}
for p in publish pull serve inspect diff apply; do
  "$bin/pulse-$p" --help >"$work/help" 2>&1
  check_flags "pulse-$p" "$work/help" "$root/tools/programs/pulse_$p.c"
done
"$bin/pulse-bench" --help >"$work/help" 2>&1
check_flags pulse-bench "$work/help" $(find "$root/tools/bench" -name '*.c')

[ $fail = 0 ] && echo "ok: the CLI reference is every program's --help, every parsed flag in it"
exit $fail
