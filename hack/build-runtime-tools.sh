#!/usr/bin/env bash
# Builds the container-runtime test tools from the Go module proxy into a versioned cache
# outside the repository, and does nothing when they are already there:
#   - crictl (sigs.k8s.io/cri-tools), the CRI client the runtime tests drive containerd with;
#   - the reference CNI plugins (github.com/containernetworking/plugins): ptp, bridge,
#     host-local, portmap and loopback (containerd 1.6 runs loopback for every pod).
#
# containerd and runc themselves come from Debian (hack/install-deps.sh).
#
# Prints the directory holding the binaries on stdout (last line); progress goes to stderr.
#
# Versions: CRI_TOOLS_VERSION and CNI_PLUGINS_VERSION of hack/versions.env (the
# environment's win).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# test/runtime and test/cluster derive the same path from the same versions (internal/test/versions).
BIN_DIR="${CACHE_ROOT}/tools/cri-tools-${CRI_TOOLS_VERSION}_cni-plugins-${CNI_PLUGINS_VERSION}"
CRI_WORK_DIR="${CACHE_ROOT}/build/cri-tools-${CRI_TOOLS_VERSION}"
CNI_WORK_DIR="${CACHE_ROOT}/build/cni-plugins-${CNI_PLUGINS_VERSION}"

CNI_PLUGINS=(plugins/main/ptp plugins/main/bridge plugins/ipam/host-local plugins/meta/portmap plugins/main/loopback)

have_all() { have_files "${BIN_DIR}" crictl "${CNI_PLUGINS[@]}"; }

if have_all; then
  echo "${BIN_DIR}"
  exit 0
fi

prepare_go_build
mkdir -p "${BIN_DIR}"

# build_in MODULE_DIR MODULE VERSION LDFLAGS PKG... — builds PKGs of MODULE@VERSION from a
# throwaway module in MODULE_DIR into BIN_DIR (each binary named after its package's last
# element), with LDFLAGS added to "-s -w".
build_in() {
  local dir="$1" module="$2" version="$3" ldflags="$4"
  shift 4
  mkdir -p "${dir}"
  cd "${dir}"
  [[ -f go.mod ]] || go mod init "trellis.local/$(basename "${dir}")-build" >/dev/null 2>&1
  local pkgs=("${@/#/${module}/}")
  write_tools_go "${pkgs[@]}"
  go get "${module}@${version}" >&2
  go mod tidy >&2
  local tmp="${BIN_DIR}/.tmp"
  rm -rf "${tmp}"; mkdir -p "${tmp}"
  go build -trimpath -ldflags "-s -w ${ldflags}" -o "${tmp}/" "${pkgs[@]}" >&2
  for p in "$@"; do mv "${tmp}/${p##*/}" "${BIN_DIR}/${p##*/}"; done
  rmdir "${tmp}"
}

# --- reference CNI plugins ---------------------------------------------------------------
mapfile -t missing < <(missing_in "${BIN_DIR}" "${CNI_PLUGINS[@]}")
if ((${#missing[@]})); then
  log "building CNI plugins ${CNI_PLUGINS_VERSION}: ${missing[*]##*/} (under a minute cold)"
  build_in "${CNI_WORK_DIR}" github.com/containernetworking/plugins "${CNI_PLUGINS_VERSION}" \
    "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=${CNI_PLUGINS_VERSION}" "${missing[@]}"
fi

# --- crictl --------------------------------------------------------------------------------
if [[ ! -x "${BIN_DIR}/crictl" ]]; then
  log "building crictl ${CRI_TOOLS_VERSION} (about 6 minutes cold on 2 cores, seconds warm)"
  build_in "${CRI_WORK_DIR}" sigs.k8s.io/cri-tools "${CRI_TOOLS_VERSION}" \
    "-X sigs.k8s.io/cri-tools/pkg/version.Version=${CRI_TOOLS_VERSION}" cmd/crictl
fi

have_all || { log "some binaries are still missing in ${BIN_DIR}"; exit 1; }
log "tools ready in ${BIN_DIR}"
echo "${BIN_DIR}"
