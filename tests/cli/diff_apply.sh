#!/usr/bin/env bash
# pulse-diff / pulse-apply / pulse-inspect on real safetensors files written
# by `pulse-bench trajectory`: round trips, FP32 master input, and refusals
# that must leave no output behind. Usage: diff_apply.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
check() { # description, then the command; passes when it exits 0
  local what=$1; shift
  if "$@" >"$work/out.txt" 2>"$work/err.txt"; then pass=$((pass + 1)); else
    echo "FAIL: $what"; sed 's/^/  | /' "$work/out.txt" "$work/err.txt"; failures=$((failures + 1)); fi
}
refuse() { # description, then the command; passes when it exits non-zero
  local what=$1; shift
  if "$@" >"$work/out.txt" 2>"$work/err.txt"; then
    echo "FAIL (accepted): $what"; failures=$((failures + 1)); else pass=$((pass + 1)); fi
  cp "$work/err.txt" "$work/refused.txt"
}

"$bin/pulse-bench" trajectory --out "$work/bf16" --params 300000 --steps 3 --seed 7 >/dev/null || exit 1
"$bin/pulse-bench" trajectory --out "$work/f32" --params 300000 --steps 3 --seed 7 --f32 >/dev/null || exit 1
b=$work/bf16

for s in 1 2 3; do
  p=$((s - 1))
  check "diff step $s" "$bin/pulse-diff" "$b/step000$p.safetensors" "$b/step000$s.safetensors" -o "$work/p$s.pulse"
  check "apply step $s" "$bin/pulse-apply" "$b/step000$p.safetensors" "$work/p$s.pulse" -o "$work/out$s.safetensors"
  want=$(digest_of "$b/step000$s.safetensors"); got=$(digest_of "$work/out$s.safetensors")
  check "step $s rebuilt bit for bit ($got)" test -n "$want" -a "$want" = "$got"
  check "inspect patch $s against its base" "$bin/pulse-inspect" "$work/p$s.pulse" --base "$b/step000$p.safetensors"
done
check "the applied file names its step" grep -q '"step":"3"' "$work/out3.safetensors"

# FP32 master weights give the very patch their BF16 cast gives.
check "diff from FP32 master weights" "$bin/pulse-diff" "$b/step0000.safetensors" "$work/f32/step0001.safetensors" -o "$work/f1.pulse"
check "FP32 and BF16 inputs give identical patches" cmp "$work/f1.pulse" "$work/p1.pulse"
check "plain model round trip" "$bin/pulse-diff" "$b/step0001.safetensors" "$b/step0002.safetensors" --plain -o "$work/plain.pulse"
check "plain patch decodes without a base" "$bin/pulse-inspect" "$work/plain.pulse"
check "plain patch applies" "$bin/pulse-apply" "$b/step0001.safetensors" "$work/plain.pulse" -o "$work/plain.safetensors"
check "plain result bit for bit" test "$(digest_of "$work/plain.safetensors")" = "$(digest_of "$b/step0002.safetensors")"
check "format 1 patch" "$bin/pulse-diff" "$b/step0001.safetensors" "$b/step0002.safetensors" --format 1 -o "$work/v1.pulse"
check "inspect says version 1" grep -q "pulse patch v1" <("$bin/pulse-inspect" "$work/v1.pulse")
check "default patch is version 2" grep -q "pulse patch v2" <("$bin/pulse-inspect" "$work/p2.pulse")
check "format 1 patch applies" "$bin/pulse-apply" "$b/step0001.safetensors" "$work/v1.pulse" -o "$work/v1.safetensors"
check "format 1 result bit for bit" test "$(digest_of "$work/v1.safetensors")" = "$(digest_of "$b/step0002.safetensors")"
check "format 3 patch" "$bin/pulse-diff" "$b/step0001.safetensors" "$b/step0002.safetensors" --format 3 -o "$work/v3.pulse"
check "inspect says version 3 and its value model" grep -q "value model [0-9]* bytes" <("$bin/pulse-inspect" "$work/v3.pulse")
check "format 3 patch applies" "$bin/pulse-apply" "$b/step0001.safetensors" "$work/v3.pulse" -o "$work/v3.safetensors"
check "format 3 result bit for bit" test "$(digest_of "$work/v3.safetensors")" = "$(digest_of "$b/step0002.safetensors")"
check "format 3 patch is smaller than the default" test "$(stat -c %s "$work/v3.pulse")" -lt "$(stat -c %s "$work/p2.pulse")"
check "inspect --version names the formats it reads" grep -q "patch format versions 1\.\.3" <("$bin/pulse-inspect" --version)
refuse "format 4 is refused" "$bin/pulse-diff" "$b/step0001.safetensors" "$b/step0002.safetensors" --format 4 -o "$work/v4.pulse"

# Refusals: exit non-zero, say why, and write nothing.
refuse "apply to the wrong base" "$bin/pulse-apply" "$b/step0001.safetensors" "$work/p1.pulse" -o "$work/bad1.safetensors"
check "wrong base leaves no output" test ! -e "$work/bad1.safetensors"
check "wrong base is explained" grep -q "base digest" "$work/refused.txt"
refuse "inspect against the wrong base" "$bin/pulse-inspect" "$work/p2.pulse" --base "$b/step0000.safetensors"
size=$(stat -c %s "$work/p1.pulse")
head -c $((size - 7)) "$work/p1.pulse" >"$work/trunc.pulse"
refuse "apply a truncated patch" "$bin/pulse-apply" "$b/step0000.safetensors" "$work/trunc.pulse" -o "$work/bad2.safetensors"
check "truncated patch leaves no output" test ! -e "$work/bad2.safetensors"
refuse "inspect a truncated patch" "$bin/pulse-inspect" "$work/trunc.pulse"
cp "$work/p1.pulse" "$work/flip.pulse"
printf '\x5a' | dd of="$work/flip.pulse" bs=1 seek=$((size - 40)) conv=notrunc status=none
refuse "apply a patch with a flipped body byte" "$bin/pulse-apply" "$b/step0000.safetensors" "$work/flip.pulse" -o "$work/bad3.safetensors"
check "corrupt patch leaves no output" test ! -e "$work/bad3.safetensors"
printf 'PULSEPCH\x63\x00' >"$work/v99.pulse"; head -c 200 /dev/zero >>"$work/v99.pulse"
refuse "inspect an unknown version" "$bin/pulse-inspect" "$work/v99.pulse"
check "unknown version is explained" grep -q "format version 99 is newer than this decoder (1..3)" "$work/refused.txt"
head -c 100 /dev/urandom >"$work/garbage.bin"
refuse "inspect garbage" "$bin/pulse-inspect" "$work/garbage.bin"
"$bin/pulse-bench" trajectory --out "$work/other" --params 20000 --steps 0 >/dev/null
refuse "diff different models" "$bin/pulse-diff" "$b/step0000.safetensors" "$work/other/step0000.safetensors" -o "$work/bad4.pulse"
check "different models leave no patch" test ! -e "$work/bad4.pulse"
refuse "missing arguments" "$bin/pulse-apply" "$b/step0000.safetensors"
refuse "missing input file" "$bin/pulse-diff" "$work/nope.safetensors" "$b/step0001.safetensors" -o "$work/bad5.pulse"

finish
