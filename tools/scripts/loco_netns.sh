#!/usr/bin/env bash
# loco_netns.sh up [RATE] | down - four network namespaces pbw1..pbw4
# (10.215.0.1-4/24) on a bridge, for `pulse-bench loco --netns`; with RATE
# (a tc rate, e.g. 8mbit) peer 4's link is limited to it both ways by a
# token bucket (tc tbf). As root. The bandwidth-proportional
# ranges figures (docs/benchmarks/collaboration.md) were measured on it:
#   bash tools/scripts/loco_netns.sh up 8mbit
#   pulse-bench loco ... --netns pbw1=10.215.0.1,pbw2=10.215.0.2,pbw3=10.215.0.3,pbw4=10.215.0.4
#   bash tools/scripts/loco_netns.sh down
set -euo pipefail
case "${1:-}" in
up)
  ip link add brbw type bridge
  ip link set brbw up
  for i in 1 2 3 4; do
    ip netns add pbw$i
    ip link add vbw$i type veth peer name vbw${i}p
    ip link set vbw${i}p netns pbw$i
    ip -n pbw$i addr add 10.215.0.$i/24 dev vbw${i}p
    ip -n pbw$i link set lo up
    ip -n pbw$i link set vbw${i}p up
    ip link set vbw$i master brbw
    ip link set vbw$i up
  done
  if [ -n "${2:-}" ]; then
    # Both directions: egress of the namespace's end and of the host's.
    ip netns exec pbw4 tc qdisc add dev vbw4p root tbf rate "$2" burst 16kb latency 500ms
    tc qdisc add dev vbw4 root tbf rate "$2" burst 16kb latency 500ms
  fi
  ;;
down)
  for i in 1 2 3 4; do
    ip netns del pbw$i 2>/dev/null || true
    ip link del vbw$i 2>/dev/null || true
  done
  ip link del brbw 2>/dev/null || true
  ;;
*)
  echo "usage: $0 up [RATE] | down" >&2
  exit 2
  ;;
esac
