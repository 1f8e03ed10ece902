#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine; does nothing when it is there.
set -euo pipefail

log() { echo "install-deps: $*" >&2; }

if ! command -v go >/dev/null; then
  if [[ -x /usr/local/go/bin/go ]]; then
    log "go is at /usr/local/go/bin: add it to PATH"
  else
    log "Go 1.26 is required (https://go.dev/dl); it is not on PATH"
  fi
  exit 1
fi

# Debian packages: command -> package. The datapath and runtime tests add theirs here.
declare -A packages=(
  [git]=git
  [make]=make
  # test/runtime: a real containerd + runc per simulated node, inside network namespaces.
  [containerd]=containerd
  [runc]=runc
  [ip]=iproute2
  [nsenter]=util-linux
  [ping]=iputils-ping
  [iptables]=iptables # the portmap plugin, inside the node namespaces only
  [ipset]=ipset # agent/uninstall: trellis's sets are removed and others' left, in a namespace
  # test/cluster (test/cmd/localcluster, make e2e): kubelet, kube-proxy and the images' Debian
  # userspace (apt-get download + dpkg-deb, always there on Debian).
  [sysctl]=procps
  [unshare]=util-linux
  # test/bench/datapath (make bench-datapath): TCP throughput inside the pod namespaces.
  [iperf3]=iperf3
  # ... and its -profile mode (where the CPU time goes, per netfilter part).
  [perf]=linux-perf
  # test/e2e (kubectl trellis connectivity test, a broken node): a table of the test's own
  # in one node's namespace.
  [nft]=nftables
)
missing=()
for cmd in "${!packages[@]}"; do
  command -v "${cmd}" >/dev/null || missing+=("${packages[${cmd}]}")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    log "missing packages ${missing[*]}: run as root or install them"
    exit 1
  fi
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

# Several local clusters at once (make test runs about five, each node a kubelet and a
# containerd): each takes inotify instances and watches, and the kernel's defaults (128
# instances per user) run out, failing kubelets and containerd's CRI with "too many open
# files". The limits kind asks for, in sysctl.d so a reboot keeps them. Not networking: the
# root network namespace is untouched.
inotify_conf=/etc/sysctl.d/60-trellis-inotify.conf
if [[ ! -f "${inotify_conf}" ]] || (( $(sysctl -n fs.inotify.max_user_instances) < 1024 )); then
  if [[ $(id -u) -ne 0 ]]; then
    log "fs.inotify.max_user_instances is $(sysctl -n fs.inotify.max_user_instances): run as root to raise it for the local clusters"
    exit 1
  fi
  printf 'fs.inotify.max_user_instances = 1024\nfs.inotify.max_user_watches = 1048576\n' >"${inotify_conf}"
  sysctl -q -p "${inotify_conf}"
  log "inotify limits raised for several local clusters at once (${inotify_conf})"
fi
