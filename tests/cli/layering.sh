#!/usr/bin/env bash
# The layering of the libraries (README "Layers"), one direction only:
#
#   codec <- cuda <- trainer_side   <- loco <- tools
#                 <- inference_side <-
#
# trainer_side and inference_side are siblings: they meet only at codec's
# wire formats. A library may use its own folder and the layers below it,
# never one above or beside it. Two checks, each of which fails this test:
#   includes  a library's sources (.c .h .cu .cuh) include a header that lives
#             in a folder the library may not use;
#   symbols   a library's built static archive has an undefined symbol that
#             only an archive it may not use defines (nm).
# First a self-test plants one violation of each kind in copies (an include
# of the publisher in the subscriber, an include of loco's header in codec,
# and an object calling the publisher added to a copy of the subscriber's
# archive) and fails unless both checks catch them: the test can fail.
#   layering.sh BIN_DIR   BIN_DIR: the build's tools folder (as for every
#                         cli test); the archives are in its parent folder
set -u
bin=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$bin/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

libs="codec cuda trainer_side inference_side loco"
folders="$libs tools" # where a header may live
declare -A may_use=(
  [codec]="codec"
  [cuda]="codec cuda"
  [trainer_side]="codec cuda trainer_side"
  [inference_side]="codec cuda inference_side"
  [loco]="codec cuda trainer_side inference_side loco"
)
declare -A archive=(
  [codec]=codec/libpulse_codec.a
  [cuda]=cuda/libpulse_cuda.a
  [trainer_side]=trainer_side/libpulse_trainer.a
  [inference_side]=inference_side/libpulse_inference.a
  [loco]=loco/libpulse_loco.a
)

allowed() { # library, folder
  case " ${may_use[$1]} " in *" $2 "*) return 0 ;; esac
  return 1
}

# Prints "LIB/FILE includes NAME (FOLDER)" for each forbidden include under
# source root $1; returns 1 when there is one.
check_includes() {
  local root=$1 bad=0 lib file name base where folder resolved
  for lib in $libs; do
    for file in "$root/$lib"/*.c "$root/$lib"/*.h "$root/$lib"/*.cu "$root/$lib"/*.cuh; do
      [ -f "$file" ] || continue
      while IFS= read -r name; do
        base=${name##*/}
        where=""
        if [ "$name" != "$base" ]; then # a path: where it really points
          resolved=$(realpath -m "$root/$lib/$name")
          case "$resolved" in "$root"/*/*)
            folder=${resolved#"$root"/}; folder=${folder%%/*}
            case " $folders " in *" $folder "*) where=$folder ;; esac ;;
          esac
        elif [ -f "$root/$lib/$base" ]; then
          where=$lib # a quote include finds its own folder first
        else
          for folder in $folders; do
            if [ -f "$root/$folder/$base" ]; then
              where=$folder
              allowed "$lib" "$folder" && break
            fi
          done
        fi
        if [ -n "$where" ] && ! allowed "$lib" "$where"; then
          echo "  $lib/${file##*/} includes $name ($where/)"
          bad=1
        fi
      done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]\([^">]*\)[">].*/\1/p' "$file")
    done
  done
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
for folder in $folders; do
  mkdir -p "$work/src/$folder"
  cp "$src/$folder"/*.h "$src/$folder"/*.c "$work/src/$folder"/ 2>/dev/null
  cp "$src/$folder"/*.cu "$src/$folder"/*.cuh "$work/src/$folder"/ 2>/dev/null
done
if ! check_includes "$work/src" >/dev/null; then
  echo "FAIL: the sources as they are, copied, already break the layering"
  fail=1
fi
echo '#include "pulse_publisher.h"' >>"$work/src/inference_side/subscriber.c"
echo '#include "../loco/pulse_loco.h"' >>"$work/src/codec/types.c"
out=$(check_includes "$work/src")
if [ $? -eq 0 ] || ! grep -q 'inference_side/subscriber.c includes pulse_publisher.h' <<<"$out" ||
  ! grep -q 'codec/types.c includes ../loco/pulse_loco.h' <<<"$out"; then
  echo "FAIL: self-test: planted includes not caught:"; echo "$out"
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
