#!/usr/bin/env bash
# Installs the Debian packages pulse needs to build, test and fuzz, only when
# some are missing. Run as root on Debian 12 (or with sudo available).
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libzstd-dev zstd libssl-dev libcurl4-openssl-dev libmicrohttpd-dev
  libcriterion-dev
  clang libclang-rt-14-dev   # the libFuzzer targets and sanitizer runs
  curl python3-numpy         # integration tests and data tools
  python3-venv python3-pip python3-setuptools python3-wheel  # pip install ./python
  python3-torch              # tests against PyTorch's own BF16 rounding, make_trajectory.py
  nginx                      # pulse-bench serve: the reference file server
  awscli                     # tests/cli/s3_*.sh: the AWS CLI reads back uploads
  iproute2 nftables          # tests/cli/loco_udp_netns.sh: namespaces, a lossy link
)
# npm installs s3rver, the S3-compatible test server. Debian's npm package
# conflicts with a nodejs that brings its own npm (NodeSource's), so it is
# asked for only when no npm is there.
command -v npm >/dev/null || packages+=(npm)

# s3rver (npm, not Debian): the S3-compatible server tests/cli/s3_*.sh start.
install_s3rver() {
  command -v s3rver >/dev/null && return 0
  echo "install-deps: installing s3rver (npm)" >&2
  ${SUDO:-} npm install -g --silent s3rver >/dev/null
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -eq 0 ]; then
  install_s3rver
  exit 0
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
install_s3rver
