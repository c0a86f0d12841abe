#!/usr/bin/env bash
# The installed library (cmake --install): libpulse.so exports exactly the
# documented API (every function the installed public headers declare that
# the library defines, nothing else), carries its ABI version in its SONAME,
# and a small consumer built out of tree against the install prefix, once
# through find_package(pulse) -> pulse::pulse and once through pkg-config,
# publishes two steps into a store, reads them back and runs.
#   install_consumer.sh BIN_DIR   BIN_DIR: the build's tools folder
set -u
bin=$1
build=$(cd "$bin/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() { echo "FAIL: $*"; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; fail "cmake --install"; }
lib=$(find "$prefix" -name 'libpulse.so.*.*' | head -1)
[ -n "$lib" ] || fail "no libpulse.so.X.Y.Z installed"
libdir=$(dirname "$lib")
for f in "$prefix/include/pulse/pulse_publisher.h" "$prefix/include/pulse/pulse_subscriber.h" \
         "$libdir/libpulse.so" "$libdir/libpulse_codec.a" "$libdir/pkgconfig/pulse.pc" \
         "$libdir/cmake/pulse/pulse-config.cmake" "$prefix/bin/pulse-publish"; do
  [ -e "$f" ] || fail "not installed: ${f#$prefix/}"
done
[ -e "$prefix/include/pulse/pulse_log.h" ] && fail "an internal header was installed"

if readelf -d "$lib" | grep -q 'NEEDED.*lib\(a\|ub\)san'; then
  echo "skipped: a sanitizer build (programs built without the sanitizers cannot load it)"
  exit 77
fi

# SONAME: libpulse.so.<ABI version>.
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
case "$soname" in libpulse.so.[0-9]*) ;; *) fail "SONAME is '$soname'" ;; esac
[ -e "$libdir/$soname" ] || fail "no $soname link"

# Exports: functions declared in the installed headers (comments stripped by
# the preprocessor), compared with the dynamic symbol table.
for h in "$prefix"/include/pulse/*.h; do
  gcc -fpreprocessed -dD -E -P "$h" 2>/dev/null
done | grep -o 'pulse_[A-Za-z0-9_]*[[:space:]]*(' | sed 's/[[:space:]]*($//' | sort -u >"$work/declared"
nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | grep -v '^_' | sort -u >"$work/exported"
nm --defined-only -g "$libdir"/libpulse_*.a 2>/dev/null | awk '$2 == "T" {print $3}' | sort -u >"$work/defined"
comm -23 "$work/exported" "$work/declared" >"$work/extra"
[ -s "$work/extra" ] && { head "$work/extra"; fail "exported but not in a public header ($(wc -l <"$work/extra"))"; }
comm -12 "$work/declared" "$work/defined" >"$work/api"
comm -23 "$work/api" "$work/exported" >"$work/missing"
[ -s "$work/missing" ] && { head "$work/missing"; fail "declared in a public header but not exported"; }
n=$(wc -l <"$work/exported")
[ "$n" -ge 50 ] || fail "only $n symbols exported"
echo "libpulse: $soname, $n functions exported, all declared in include/pulse"

mkdir -p "$work/consumer"
cat >"$work/consumer/consumer.c" <<'C'
/* Publishes two steps of a 3x4 BF16 tensor into a store and checks what
 * the publisher holds: a program that uses only the installed API. */
#include <stdio.h>
#include <string.h>
#include "pulse_publisher.h"
#include "pulse_server.h"
#include "pulse_subscriber.h"
int main(int argc, char **argv) {
  if (argc != 2) return 2;
  pulse_tensor_info info = {"w", PULSE_DTYPE_BF16, 2, {3, 4}};
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = &info; o.tensor_count = 1; o.threads = 1;
  pulse_pub *pub = NULL;
  pulse_status st = pulse_pub_create(argv[1], &o, &pub);
  if (st != PULSE_OK) { fprintf(stderr, "create: %s\n", pulse_status_name(st)); return 1; }
  uint16_t w[12];
  for (uint64_t step = 1; step <= 2; step++) {
    for (int i = 0; i < 12; i++) w[i] = (uint16_t)(0x3F80 + i * (int)step);
    pulse_pub_tensor t = {w, PULSE_DTYPE_BF16, PULSE_PUB_HOST};
    st = pulse_pub_commit(pub, step, &t, 1, NULL);
    if (st != PULSE_OK) { fprintf(stderr, "commit: %s\n", pulse_status_name(st)); return 1; }
  }
  uint64_t head = 0;
  int has_head = pulse_pub_head_step(pub, &head);
  const uint16_t *snap = pulse_pub_snapshot(pub, 0);
  int same = snap && memcmp(snap, w, sizeof w) == 0;
  char host[64]; uint16_t port = 1;
  pulse_server_parse_listen("127.0.0.1:0", host, sizeof host, &port);
  printf("head %d step %llu same %d route %s port %u\n", has_head,
         (unsigned long long)head, same, pulse_sub_route_name(PULSE_SUB_ROUTE_CHAIN), port);
  pulse_pub_free(pub);
  return same && head == 2 ? 0 : 1;
}
C
cat >"$work/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.22)
project(consumer C)
find_package(pulse REQUIRED)
add_executable(consumer consumer.c)
target_link_libraries(consumer PRIVATE pulse::pulse)
CM
expect="head 1 step 2 same 1 route chain port 0"
cmake -S "$work/consumer" -B "$work/cm" -DCMAKE_PREFIX_PATH="$prefix" >"$work/cm.log" 2>&1 &&
  cmake --build "$work/cm" >>"$work/cm.log" 2>&1 || { cat "$work/cm.log"; fail "find_package consumer does not build"; }
out=$("$work/cm/consumer" "$work/store1") || fail "find_package consumer failed: $out"
[ "$out" = "$expect" ] || fail "find_package consumer said '$out'"
ldd "$work/cm/consumer" | grep -q "$libdir/$soname" || fail "find_package consumer does not use the installed $soname"
echo "find_package(pulse): $out"

export PKG_CONFIG_PATH=$libdir/pkgconfig
flags=$(pkg-config --cflags --libs pulse) || fail "pkg-config pulse"
cc -std=c11 -Wall -Werror -o "$work/pc_consumer" "$work/consumer/consumer.c" $flags -Wl,-rpath,"$libdir" ||
  fail "pkg-config consumer does not build"
out=$("$work/pc_consumer" "$work/store2") || fail "pkg-config consumer failed: $out"
[ "$out" = "$expect" ] || fail "pkg-config consumer said '$out'"
echo "pkg-config pulse ($flags): $out"

# The installed Python package finds the installed library beside itself.
command -v python3 >/dev/null || exit 0
pkg=$(find "$prefix" -path '*/pulse/__init__.py' | head -1)
[ -n "$pkg" ] || fail "the Python package was not installed"
out=$(cd "$work" && env -u PULSE_LIBRARY PYTHONPATH="$(dirname "$(dirname "$pkg")")" python3 -c '
import os, sys, pulse, pulse._lib as l
s = pulse.Server(sys.argv[1]); s.close()
print(os.path.realpath(l.lib.path))' "$work/store1") || fail "the installed Python package: $out"
[ "$out" = "$(realpath "$lib")" ] || fail "the installed Python package loaded $out, not $lib"
echo "python: import pulse from the prefix loads $(basename "$out") beside it"
