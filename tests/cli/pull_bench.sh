#!/usr/bin/env bash
# `pulse-bench sync` at a small size, with its three workers (host: a
# subscriber in process; long-lived: one `pulse-pull --follow --out FILE`;
# one-shot: a new `pulse-pull --out FILE` per step): one JSON object per link
# and worker with the fields the issue names, pulse bytes far below dense at
# 1% density, the dense download timed whole (or a prefix said so), end to
# end = commit + total where the worker starts after the commit, total at
# least the sum of its parts, local = total - transfer, ratios that match
# their baselines, no worker process and no folder left behind, and (as root
# with `ip netns`) a 100 Mbit/s link whose dense time matches the rate and
# whose namespace is gone afterwards. Usage: pull_bench.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
field() { sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p" <<<"$1"; }
# The members of one flat JSON line into F[key] (no subprocess: the loop
# below reads many).
declare -A F
parse() {
  F=()
  local rest=$1 v
  while [[ $rest =~ \"([a-z_0-9]+)\":(\"[^\"]*\"|[^,}]*)(.*) ]]; do
    v=${BASH_REMATCH[2]}
    v=${v#\"}
    F[${BASH_REMATCH[1]}]=${v%\"}
    rest=${BASH_REMATCH[3]}
  done
}
# awk -v ... 'BEGIN {exit !(COND)}': 0 when COND holds.
holds() { awk "$@" 2>/dev/null; }

links=loopback
if [ "$(id -u)" = 0 ] && ip netns list >/dev/null 2>&1 && command -v tc >/dev/null; then
  links=loopback,100mbit
fi
mkdir "$work/tmp"
TMPDIR="$work/tmp" "$bin/pulse-bench" sync --params 2000000 --steps 2 --links "$links" \
  --workers host,long-lived,one-shot --json >"$work/out.json" 2>"$work/err" &
bpid=$!
wait "$bpid"
rc=$?
[ "$rc" -eq 0 ] && ok || { bad "pulse-bench sync exited $rc"; cat "$work/err"; }
n=$(grep -c '^{' "$work/out.json")
want=$(($(tr ',' '\n' <<<"$links" | wc -l) * 3))
[ "$n" -eq "$want" ] && ok || bad "$n JSON objects for $want (links x workers)"
for l in ${links//,/ }; do
  for w in host long-lived one-shot; do
    grep -q "\"link\":\"$l\".*\"worker\":\"$w\"" "$work/out.json" && ok || bad "$l: no $w worker reported"
  done
done
while read -r line; do
  parse "$line"
  link=${F[link]} worker=${F[worker]}
  at="$link $worker"
  for k in params density link worker bytes_dense bytes_pulse seconds_dense seconds_pulse transfer_s decode_s \
    verify_s apply_s write_s total_s local_s ratio_local_vs_transfer worker_sync_s load_s seen_s first_step_s \
    seconds_commit seconds_end_to_end dense_extrapolated dense_sample_bytes dense_object_bytes \
    ratio_bytes_vs_dense_bf16 ratio_sync_vs_dense_transfer ratio_end_to_end_vs_dense_transfer; do
    [ -n "${F[$k]+set}" ] && ok || bad "$at: no field $k"
  done
  bd=${F[bytes_dense]} bp=${F[bytes_pulse]}
  [ -n "$bp" ] && [ "$bp" -gt 0 ] && [ $((bd / bp)) -ge 50 ] && ok || bad "$at: $bp pulse bytes vs $bd dense"
  # 4 MB is timed whole on both links, never extrapolated.
  [ "${F[dense_extrapolated]}" = false ] && [ "${F[dense_sample_bytes]}" = "${F[dense_object_bytes]}" ] && ok ||
    bad "$at: dense not timed whole: $line"
  c=${F[seconds_commit]} t=${F[total_s]} e=${F[seconds_end_to_end]} seen=${F[seen_s]}
  [ "${F[seconds_pulse]}" = "$t" ] && ok || bad "$at: seconds_pulse is not total_s"
  # Two steps: medians are means. host and one-shot start after the commit:
  # end to end = commit + total to the microsecond; the long-lived worker may
  # start inside the commit: end to end from the commit's start, at least
  # the time from the head's move (seen_s).
  if [ "$worker" = long-lived ]; then
    holds -v c="$c" -v s="$seen" -v e="$e" 'BEGIN {exit !(c > 0 && s > 0 && e >= s - 2e-6)}' && ok ||
      bad "$at: end to end is shorter than seen: $line"
  else
    holds -v c="$c" -v s="$t" -v e="$e" 'BEGIN {d = e - c - s; exit !(c > 0 && s > 0 && d < 2e-6 && d > -2e-6)}' && ok ||
      bad "$at: end to end is not commit + total: $line"
    [ "$seen" = "$t" ] && ok || bad "$at: seen_s is not total_s"
  fi
  # The parts of a step fit in its total; local = total - transfer, and its
  # ratio to the transfer (printed to the microsecond: r * x is l within
  # half a microsecond times r).
  w=${F[write_s]}
  [ "$w" = null ] && w=0
  holds -v t="$t" -v x="${F[transfer_s]}" -v v="${F[verify_s]}" -v d="${F[decode_s]}" -v a="${F[apply_s]}" \
    -v w="$w" -v l="${F[local_s]}" -v r="${F[ratio_local_vs_transfer]}" \
    'BEGIN {p = x + v + d + a + w; q = t - x - l
            exit !(p > 0 && p <= t + 1e-3 && w >= 0 && q < 2e-6 && q > -2e-6 &&
                   (x == 0 || (r * x - l < r * 1e-6 + 1e-5 && l - r * x < r * 1e-6 + 1e-5)))}' && ok ||
    bad "$at: the parts exceed the total, or local_s is not total - transfer, or its ratio is off: $line"
  ws=${F[worker_sync_s]} ld=${F[load_s]} tg=${F[targets]}
  case $worker in
  host)
    [ "${F[write_s]}" = null ] && [ "$ld" = null ] && [ "${F[first_step_s]}" = null ] && [ "$tg" = host ] && ok ||
      bad "$at: a host worker with a write, load or first-step figure: $line" ;;
  long-lived)
    # Its first step after the start is set apart (untimed), and said.
    [ "$ld" = null ] && [ "$ws" = "$t" ] && [ "$tg" = file ] && [ "${F[first_step_s]}" != null ] && ok ||
      bad "$at: the long-lived total is not pulse-pull's own, or no first step: $line" ;;
  one-shot)
    # Timed from outside: its own sync, plus starting and loading the file.
    holds -v t="$t" -v s="$ws" -v l="$ld" 'BEGIN {d = t - s - l; exit !(s > 0 && l > 0 && d < 2e-6 && d > -2e-6)}' &&
      [ "$tg" = file ] && [ "${F[first_step_s]}" = null ] && ok || bad "$at: one-shot total is not load + its sync: $line" ;;
  esac
  # Every ratio is its baseline over the pulse figure it names, within the
  # rounding of the printed figures: ratios to 2 decimals, seconds to 6
  # (at 0.005 s the last digit alone moves a ratio of 68 by 0.007).
  holds -v bd="$bd" -v bp="$bp" -v r="${F[ratio_bytes_vs_dense_bf16]}" \
    -v sd="${F[seconds_dense]}" -v e="$e" -v re="${F[ratio_end_to_end_vs_dense_transfer]}" \
    'BEGIN {x = bd / bp; y = sd / e; u = 0.006 + y * (5.1e-7 / e + 5.1e-7 / sd)
            exit !(r > x - 0.006 && r < x + 0.006 && re > y - u && re < y + u)}' &&
    ok || bad "$at: ratios do not match their figures: $line"
  if [ "$link" = 100mbit ]; then
    sd=${F[seconds_dense]}
    # 4 MB at 100 Mbit/s: about 0.32 s.
    holds -v s="$sd" 'BEGIN {exit !(s > 0.2 && s < 1.0)}' && ok || bad "100mbit: dense took $sd s"
  fi
done <"$work/out.json"
# Nothing left: no pulse-pull running on the bench's files, no folder.
pgrep -f -- "$work/tmp/" >/dev/null && bad "a worker process was left behind: $(pgrep -af -- "$work/tmp/")" || ok
[ -z "$(ls -A "$work/tmp")" ] && ok || bad "left in TMPDIR: $(ls -A "$work/tmp")"
# A prefix asked for is timed, scaled, and said so (JSON and table).
line=$("$bin/pulse-bench" sync --params 2000000 --steps 1 --links loopback --dense-sample 65536 --json)
[ "$(field "$line" dense_extrapolated)" = true ] && [ "$(field "$line" dense_sample_bytes)" = 65536 ] && ok ||
  bad "--dense-sample 65536: $line"
"$bin/pulse-bench" sync --params 2000000 --steps 1 --links loopback --dense-sample 65536 >"$work/text" 2>&1
grep -q "dense timed on the first 65536 of" "$work/text" && ok || bad "the table does not say the dense figure is scaled"
# The default worker is the host one alone, with the table it always had.
grep -q "^link  *bytes dense bytes pulse" "$work/text" && ! grep -q "long-lived" "$work/text" && ok ||
  bad "the default run is not the host table: $(cat "$work/text")"
"$bin/pulse-bench" sync --dense-full --dense-sample 65536 >/dev/null 2>&1
[ $? -eq 2 ] && ok || bad "--dense-full with --dense-sample is not refused"
for w in host,host sideways ""; do
  "$bin/pulse-bench" sync --workers "$w" >/dev/null 2>&1
  [ $? -eq 2 ] && ok || bad "--workers '$w' is not refused"
done
"$bin/pulse-bench" sync --params 2000000 --steps 1 --links loopback --workers one-shot \
  --pull "$work/no-such-pull" >/dev/null 2>"$work/err"
[ $? -eq 1 ] && grep -q "no-such-pull" "$work/err" && ok || bad "a missing --pull is not said: $(cat "$work/err")"
if [ "$links" != loopback ]; then
  ip netns list | grep -q "pulse-bench-$bpid\b" && bad "the namespace pulse-bench-$bpid was left behind" || ok
fi
finish
