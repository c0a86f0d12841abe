#!/usr/bin/env bash
# The layering of the libraries (docs/design.md, "Layers"), one direction only:
#
#   codec <- cuda <- trainer_side   <- loco <- tools
#                 <- inference_side <-
#
# trainer_side and inference_side are siblings: they meet only at codec's
# wire formats. A library may use its own folder and the layers below it,
# never one above or beside it, and never tools/: not the simulation
# harness (tools/sim) and not the programs, bench or CLI helpers. Inside
# loco/ its parts point one way too:
#
#   round <- transport <- coordinator
#                      <- collab
#   round <- gossip
#
# (every part may use loco/'s public headers at its root). In tools/, the
# harness (sim/) and the CLI helpers (cli/) are libraries of their own: each
# uses the pulse libraries and itself, not the other nor the bench or the
# programs. Every file at any depth is checked. Two checks, each of which
# fails this test:
#   includes  a source (.c .h .cu .cuh) includes a header that lives in a
#             folder or part it may not use;
#   symbols   a library's built static archive has an undefined symbol that
#             only an archive it may not use defines (nm).
# First a self-test plants violations in copies, in subfolders (an include
# of the publisher in the subscriber, of loco's header in codec by a path,
# of the harness in loco, of the transport in loco's round, of the CLI
# helpers in the harness, and an object calling the publisher added to a
# copy of the subscriber's archive) and fails unless both checks catch
# them: the test can fail.
#   layering.sh BIN_DIR   BIN_DIR: the build's tools folder (as for every
#                         cli test); the archives are in its parent folder
set -u
bin=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$bin/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

libs="codec cuda trainer_side inference_side loco"
folders=(codec cuda trainer_side inference_side loco tools) # where a header may live
declare -A may_use=(
  [codec]="codec"
  [cuda]="codec cuda"
  [trainer_side]="codec cuda trainer_side"
  [inference_side]="codec cuda inference_side"
  [loco]="codec cuda trainer_side inference_side loco"
  [tools/sim]="codec cuda trainer_side inference_side loco tools/sim"
  [tools/cli]="codec cuda trainer_side inference_side loco tools/cli"
  [tools]="codec cuda trainer_side inference_side loco tools tools/sim tools/cli"
)
# loco's parts: "." is loco/'s root (the public headers).
declare -A loco_may_use=(
  [.]="."
  [round]=". round"
  [transport]=". round transport"
  [coordinator]=". round transport coordinator"
  [collab]=". round transport collab"
  [gossip]=". round gossip"
)
declare -A archive=(
  [codec]=codec/libpulse_codec.a
  [cuda]=cuda/libpulse_cuda.a
  [trainer_side]=trainer_side/libpulse_trainer.a
  [inference_side]=inference_side/libpulse_inference.a
  [loco]=loco/libpulse_loco.a
)

allowed() { # unit, unit it uses
  case " ${may_use[$1]} " in *" $2 "*) return 0 ;; esac
  return 1
}

# The unit of a path relative to the source root: a library's folder, or
# tools/sim, tools/cli, or tools for the rest of tools/.
unit_of() {
  case "$1" in
  tools/sim/*) echo tools/sim ;;
  tools/cli/*) echo tools/cli ;;
  *) echo "${1%%/*}" ;;
  esac
}

# loco's part of a path relative to the source root ("." at loco/'s root).
loco_part() {
  local rest=${1#loco/}
  case "$rest" in */*) echo "${rest%%/*}" ;; *) echo . ;; esac
}

# Prints "FILE includes NAME (WHERE)" for each forbidden include under
# source root $1 (every file at any depth of the checked folders); returns
# 1 when there is one.
check_includes() {
  local root=$1 bad=0 file rel unit name base resolved hrel hunit fpart hpart
  declare -A where=() # header basename -> its path relative to the root
  while IFS= read -r file; do
    where[${file##*/}]=${file#"$root"/}
  done < <(find "${folders[@]/#/$root/}" -type f \( -name '*.h' -o -name '*.cuh' \) 2>/dev/null)
  while IFS= read -r file; do
    rel=${file#"$root"/}
    unit=$(unit_of "$rel")
    [ -n "${may_use[$unit]:-}" ] || continue
    while IFS= read -r name; do
      base=${name##*/}
      hrel=""
      if [ "$name" != "$base" ]; then # a path: where it really points
        resolved=$(realpath -m "$(dirname "$file")/$name")
        case "$resolved" in "$root"/*) hrel=${resolved#"$root"/} ;; esac
      elif [ -f "$(dirname "$file")/$base" ]; then
        hrel=$(dirname "$rel")/$base # a quote include finds its own folder first
      else
        hrel=${where[$base]:-}
      fi
      [ -n "$hrel" ] || continue # a system or generated header
      case " ${folders[*]} " in *" ${hrel%%/*} "*) ;; *) continue ;; esac
      hunit=$(unit_of "$hrel")
      if ! allowed "$unit" "$hunit"; then
        echo "  $rel includes $name ($hrel)"
        bad=1
      elif [ "$unit" = loco ] && [ "$hunit" = loco ]; then
        fpart=$(loco_part "$rel")
        hpart=$(loco_part "$hrel")
        case " ${loco_may_use[$fpart]} " in *" $hpart "*) ;; *)
          echo "  $rel includes $name ($hrel: loco/$fpart may not use loco/$hpart)"
          bad=1 ;;
        esac
      fi
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
  done < <(find "${folders[@]/#/$root/}" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null)
  return $bad
}

# Prints "LIB: SYMBOL (defined by FOLDER)" for each undefined symbol of a
# library's archive under build root $1 that only a forbidden archive
# defines; returns 1 when there is one, 2 when an archive is missing.
check_symbols() {
  local root=$1 bad=0 lib other
  for lib in $libs; do
    if [ ! -f "$root/${archive[$lib]}" ]; then
      echo "  missing archive $root/${archive[$lib]} (build the libraries first)"
      return 2
    fi
    nm -g --defined-only "$root/${archive[$lib]}" 2>/dev/null |
      awk 'NF == 3 {print $3}' | sort -u >"$work/def.$lib"
  done
  for lib in $libs; do
    : >"$work/ok.$lib"
    : >"$work/forbidden.$lib"
    for other in $libs; do
      if allowed "$lib" "$other"; then
        cat "$work/def.$other" >>"$work/ok.$lib"
      else
        sed "s/\$/ $other/" "$work/def.$other" >>"$work/forbidden.$lib"
      fi
    done
    # Undefined in some object of the archive and defined by none of it or
    # of the layers it may use, yet defined by a forbidden one.
    nm -u "$root/${archive[$lib]}" 2>/dev/null | awk '$1 == "U" {print $2}' |
      sort -u | comm -23 - <(sort -u "$work/ok.$lib") >"$work/need.$lib"
    local hits
    hits=$(awk 'NR == FNR {need[$1] = 1; next} ($1 in need) {print "  " lib ": " $1 " (defined by " $2 "/)"}' \
      lib="$lib" "$work/need.$lib" "$work/forbidden.$lib")
    if [ -n "$hits" ]; then
      echo "$hits"
      bad=1
    fi
  done
  return $bad
}

# ---------------------------------------------------------------- self-test
fail=0
mkdir -p "$work/src"
for folder in "${folders[@]}"; do
  # The sources at every depth (not the data files beside them).
  (cd "$src" && find "$folder" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) \
    -exec cp --parents {} "$work/src"/ \;)
done
if ! check_includes "$work/src" >/dev/null; then
  echo "FAIL: the sources as they are, copied, already break the layering"
  fail=1
fi
# One planted include of each kind, each in a subfolder.
declare -A planted=(
  [inference_side/subscriber/subscriber.c]='pulse_publisher.h'
  [codec/runtime/types.c]='../../loco/pulse_loco.h'
  [loco/round/context.c]='sim_trainers.h'
  [loco/round/drift.c]='peer_http_impl.h'
  [tools/sim/sim_dense.c]='cli_args.h'
)
for file in "${!planted[@]}"; do
  if [ ! -f "$work/src/$file" ]; then
    echo "FAIL: self-test: $file is gone; plant in another file"
    fail=1
  fi
  echo "#include \"${planted[$file]}\"" >>"$work/src/$file"
done
out=$(check_includes "$work/src")
rc=$?
for file in "${!planted[@]}"; do
  if ! grep -qF "$file includes ${planted[$file]} " <<<"$out"; then
    echo "FAIL: self-test: the include of ${planted[$file]} planted in $file was not caught:"
    echo "$out"
    fail=1
  fi
done
if [ $rc -eq 0 ]; then
  echo "FAIL: self-test: planted includes passed"
  fail=1
fi

mkdir -p "$work/build"
for lib in $libs; do
  mkdir -p "$work/build/${archive[$lib]%/*}"
  ln -s "$build/${archive[$lib]}" "$work/build/${archive[$lib]}"
done
rm "$work/build/${archive[inference_side]}"
cp "$build/${archive[inference_side]}" "$work/build/${archive[inference_side]}"
printf '%s\n' 'int pulse_pub_flush(void *pub, void *figures);' \
  'int planted_layering_violation(void) { return pulse_pub_flush(0, 0); }' >"$work/planted.c"
if ! ${CC:-cc} -c "$work/planted.c" -o "$work/planted.o" ||
  ! ar q "$work/build/${archive[inference_side]}" "$work/planted.o" 2>/dev/null; then
  echo "FAIL: self-test: could not build the planted object"
  fail=1
else
  out=$(check_symbols "$work/build")
  if [ $? -ne 1 ] || ! grep -q 'inference_side: pulse_pub_flush (defined by trainer_side/)' <<<"$out"; then
    echo "FAIL: self-test: planted symbol not caught:"; echo "$out"
    fail=1
  fi
fi

# -------------------------------------------------------------- the checks
if ! out=$(check_includes "$src"); then
  echo "FAIL: includes against the layering:"; echo "$out"
  fail=1
fi
if ! out=$(check_symbols "$build"); then
  echo "FAIL: archives that need a layer above or beside them:"; echo "$out"
  fail=1
fi
[ $fail -eq 0 ] && echo "layering: ok (self-test and both checks)"
exit $fail
