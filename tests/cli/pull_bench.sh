#!/usr/bin/env bash
# `pulse-bench sync` at a small size: one JSON object per link with the
# fields the issue names, pulse bytes far below dense at 1% density, the
# dense download timed whole (or a prefix said so), end to end = commit +
# sync, ratios that match their baselines, and
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
  for k in params density link bytes_dense bytes_pulse seconds_dense seconds_pulse transfer_s decode_s verify_s apply_s \
    seconds_commit seconds_end_to_end dense_extrapolated dense_sample_bytes dense_object_bytes \
    ratio_bytes_vs_dense_bf16 ratio_sync_vs_dense_transfer ratio_end_to_end_vs_dense_transfer; do
    grep -q "\"$k\":" <<<"$line" && ok || bad "$link: no field $k"
  done
  bd=$(field "$line" bytes_dense); bp=$(field "$line" bytes_pulse)
  [ -n "$bp" ] && [ "$bp" -gt 0 ] && [ $((bd / bp)) -ge 50 ] && ok || bad "$link: $bp pulse bytes vs $bd dense"
  # 4 MB is timed whole on both links, never extrapolated.
  [ "$(field "$line" dense_extrapolated)" = false ] &&
    [ "$(field "$line" dense_sample_bytes)" = "$(field "$line" dense_object_bytes)" ] && ok ||
    bad "$link: dense not timed whole: $line"
  # Two steps: the median end to end is the mean, commit + sync to the microsecond.
  awk -v c="$(field "$line" seconds_commit)" -v s="$(field "$line" seconds_pulse)" \
    -v e="$(field "$line" seconds_end_to_end)" \
    'BEGIN {d = e - c - s; exit !(c > 0 && s > 0 && d < 2e-6 && d > -2e-6)}' && ok ||
    bad "$link: end to end is not commit + sync: $line"
  # Every ratio is its baseline over the pulse figure it names.
  awk -v bd="$bd" -v bp="$bp" -v r="$(field "$line" ratio_bytes_vs_dense_bf16)" \
    -v sd="$(field "$line" seconds_dense)" -v e="$(field "$line" seconds_end_to_end)" \
    -v re="$(field "$line" ratio_end_to_end_vs_dense_transfer)" \
    'BEGIN {x = bd / bp; y = sd / e; exit !(r > x - 0.01 && r < x + 0.01 && re > y - 0.01 && re < y + 0.01)}' &&
    ok || bad "$link: ratios do not match their figures: $line"
  if [ "$link" = 100mbit ]; then
    sd=$(field "$line" seconds_dense)
    # 4 MB at 100 Mbit/s: about 0.32 s.
    awk -v s="$sd" 'BEGIN {exit !(s > 0.2 && s < 1.0)}' && ok || bad "100mbit: dense took $sd s"
  fi
done <"$work/out.json"
# A prefix asked for is timed, scaled, and said so (JSON and table).
line=$("$bin/pulse-bench" sync --params 2000000 --steps 1 --links loopback --dense-sample 65536 --json)
[ "$(field "$line" dense_extrapolated)" = true ] && [ "$(field "$line" dense_sample_bytes)" = 65536 ] && ok ||
  bad "--dense-sample 65536: $line"
"$bin/pulse-bench" sync --params 2000000 --steps 1 --links loopback --dense-sample 65536 >"$work/text" 2>&1
grep -q "dense timed on the first 65536 of" "$work/text" && ok || bad "the table does not say the dense figure is scaled"
"$bin/pulse-bench" sync --dense-full --dense-sample 65536 >/dev/null 2>&1
[ $? -eq 2 ] && ok || bad "--dense-full with --dense-sample is not refused"
if [ "$links" != loopback ]; then
  ip netns list | grep -q "pulse-bench-$bpid\b" && bad "the namespace pulse-bench-$bpid was left behind" || ok
fi
echo "pull_bench: $pass passed, $failures failed"
[ "$failures" -eq 0 ]
