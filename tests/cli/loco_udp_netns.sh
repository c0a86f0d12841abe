#!/usr/bin/env bash
# PULSELoCo's datagram transport over a real link: two network namespaces
# joined by a veth pair, each dropping 10% of the UDP datagrams it sends on
# the link by an nft rule (numgen random), four trainers split between
# them (`pulse-bench loco --netns`). The run must complete with the loss
# the rule made (chunks sent but not accepted, drift above 0 and under its
# budget, no simulated loss) and every replica identical.
# Needs root, ip (iproute2) and nft; where any is missing, or namespaces
# cannot be made (a container without CAP_SYS_ADMIN/CAP_NET_ADMIN), it
# says that it skipped and exits 77 (ctest: skipped), never 0.
# usage: bash tests/cli/loco_udp_netns.sh BIN_DIR
set -u
BIN_DIR="${1:?usage: loco_udp_netns.sh BIN_DIR}"
BENCH="$BIN_DIR/pulse-bench"
[ -x "$BENCH" ] || { echo "FAIL: $BENCH is not an executable" >&2; exit 1; }

skip() {
  echo "SKIPPED: $*" >&2
  exit 77
}

[ "$(id -u)" = 0 ] || skip "not root (network namespaces need it)"
command -v ip >/dev/null || skip "no ip command (iproute2)"
command -v nft >/dev/null || skip "no nft command (nftables)"

A="pulse_udp_a_$$"
B="pulse_udp_b_$$"
VA="pva$$"
VB="pvb$$"
TMP="$(mktemp -d)"
cleanup() {
  ip netns del "$A" 2>/dev/null
  ip netns del "$B" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT

ip netns add "$A" 2>"$TMP/err" || skip "cannot make a network namespace: $(cat "$TMP/err")"
ip netns add "$B" 2>"$TMP/err" || skip "cannot make a network namespace: $(cat "$TMP/err")"
ip link add "$VA" type veth peer name "$VB" 2>"$TMP/err" || skip "cannot make a veth pair: $(cat "$TMP/err")"
set -e
ip link set "$VA" netns "$A"
ip link set "$VB" netns "$B"
ip -n "$A" addr add 10.213.0.1/24 dev "$VA"
ip -n "$B" addr add 10.213.0.2/24 dev "$VB"
for ns in "$A" "$B"; do
  ip -n "$ns" link set lo up
done
ip -n "$A" link set "$VA" up
ip -n "$B" link set "$VB" up
set +e
# 10% of the datagrams each side sends on the link, dropped in the kernel.
for pair in "$A:$VA" "$B:$VB"; do
  ns="${pair%%:*}"
  dev="${pair#*:}"
  ip netns exec "$ns" nft -f - <<EOF_NFT 2>"$TMP/err" || skip "nft refused the loss rule: $(cat "$TMP/err")"
table inet pulse_loss {
  chain out {
    type filter hook output priority 0; policy accept;
    oifname "$dev" meta l4proto udp numgen random mod 100 < 10 counter drop
  }
}
EOF_NFT
done

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
json_val() {
  awk -v key="\"$2\":" '{
    i = index($0, key)
    if (i == 0) exit
    s = substr($0, i + length(key))
    if (match(s, /^(-?[0-9][0-9.eE+-]*|true|false|"[a-z]*")/)) print substr(s, RSTART, RLENGTH)
  }' <<<"$1"
}

if ! "$BENCH" loco --problem teacher --only-pulseloco --transport udp --trainers 4 --rounds 8 --params 20000 \
  --netns "$A=10.213.0.1,$B=10.213.0.2" --json >"$TMP/run.json" 2>"$TMP/err"; then
  fail "the run over the link failed: $(tail -5 "$TMP/err")"
fi
s=$(grep '^{"summary":true' "$TMP/run.json")
[ -n "$s" ] || fail "no summary"
sent=$(json_val "$s" datagrams_sent)
accepted=$(json_val "$s" chunks_accepted)
[ "$(json_val "$s" datagrams_dropped)" = 0 ] || fail "simulated loss in a run without --drop"
[ "${sent:-0}" -gt 0 ] || fail "no datagram sent: $s"
[ "${accepted:-0}" -lt "${sent:-0}" ] || fail "the nft rule lost nothing: $accepted of $sent accepted"
awk -v a="${accepted:-0}" -v s="${sent:-1}" 'BEGIN { exit !(a / s > 0.8) }' ||
  fail "only $accepted of $sent datagrams arrived (half cross the link at 10% loss)"
awk -v d="$(json_val "$s" max_drift)" -v b="$(json_val "$s" drift_budget)" 'BEGIN { exit !(d > 0 && d <= b) }' ||
  fail "max drift $(json_val "$s" max_drift) not in (0, budget]"
[ "$(json_val "$s" replicas_identical)" = true ] || fail "replicas differ"
for ns in "$A" "$B"; do
  ip netns exec "$ns" nft list table inet pulse_loss | grep -q 'packets [1-9]' ||
    fail "the rule in $ns dropped nothing"
done
if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "loco_udp_netns: ok ($accepted of $sent datagrams accepted over the lossy link)"
