#!/usr/bin/env bash
# `pulse-bench sync` at a small size: one JSON object per link with the
# fields the issue names, pulse bytes far below dense at 1% density, and
# (as root with `ip netns`) a 100 Mbit/s link whose dense time matches the
# rate and whose namespace is gone afterwards. Usage: pull_bench.sh BIN_DIR
set -u
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
pass=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failures=$((failures + 1)); }
field() { sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p" <<<"$1"; }

links=loopback
if [ "$(id -u)" = 0 ] && ip netns list >/dev/null 2>&1 && command -v tc >/dev/null; then
  links=loopback,100mbit
fi
"$bin/pulse-bench" sync --params 2000000 --steps 2 --links "$links" --json >"$work/out.json" 2>"$work/err" &
bpid=$!
wait "$bpid"
rc=$?
[ "$rc" -eq 0 ] && ok || { bad "pulse-bench sync exited $rc"; cat "$work/err"; }
n=$(grep -c '^{' "$work/out.json")
want=$(tr ',' '\n' <<<"$links" | wc -l)
[ "$n" -eq "$want" ] && ok || bad "$n JSON objects for $want links"
while read -r line; do
  link=$(field "$line" link)
  for k in params density link bytes_dense bytes_pulse seconds_dense seconds_pulse transfer_s decode_s verify_s apply_s; do
    grep -q "\"$k\":" <<<"$line" && ok || bad "$link: no field $k"
  done
  bd=$(field "$line" bytes_dense); bp=$(field "$line" bytes_pulse)
  [ -n "$bp" ] && [ "$bp" -gt 0 ] && [ $((bd / bp)) -ge 50 ] && ok || bad "$link: $bp pulse bytes vs $bd dense"
  if [ "$link" = 100mbit ]; then
    sd=$(field "$line" seconds_dense)
    # 4 MB at 100 Mbit/s: about 0.32 s.
    awk -v s="$sd" 'BEGIN {exit !(s > 0.2 && s < 1.0)}' && ok || bad "100mbit: dense took $sd s"
  fi
done <"$work/out.json"
if [ "$links" != loopback ]; then
  ip netns list | grep -q "pulse-bench-$bpid\b" && bad "the namespace pulse-bench-$bpid was left behind" || ok
fi
echo "pull_bench: $pass passed, $failures failed"
[ "$failures" -eq 0 ]
