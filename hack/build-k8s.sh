#!/usr/bin/env bash
# Builds the Kubernetes control-plane binaries (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy, kubectl) and etcd from the Go module proxy into a
# versioned cache outside the repository, and does nothing when they are already there.
#
# setup-envtest cannot download on machines without internet access, so this is what the
# integration tests (KUBEBUILDER_ASSETS) and the local cluster use.
#
# Prints the directory holding the binaries on stdout (last line); progress goes to stderr.
#
# Versions: hack/versions.env (K8S_VERSION, ETCD_VERSION; the environment's win).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN_DIR="${CACHE_ROOT}/k8s/${K8S_VERSION}"
WORK_DIR="${CACHE_ROOT}/build/k8s-${K8S_VERSION}"
ETCD_WORK_DIR="${CACHE_ROOT}/build/etcd-${ETCD_VERSION}"

K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)

have_all() { have_files "${BIN_DIR}" "${K8S_CMDS[@]}" etcd; }

if have_all; then
  echo "${BIN_DIR}"
  exit 0
fi

prepare_go_build
mkdir -p "${BIN_DIR}" "${WORK_DIR}" "${ETCD_WORK_DIR}"

# --- etcd ------------------------------------------------------------------------------
if [[ ! -x "${BIN_DIR}/etcd" ]]; then
  log "building etcd ${ETCD_VERSION} (about 1 minute cold)"
  cd "${ETCD_WORK_DIR}"
  if [[ ! -f go.mod ]]; then
    go mod init trellis.local/etcd-build >/dev/null 2>&1
  fi
  write_tools_go go.etcd.io/etcd/server/v3
  go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" >&2
  go mod tidy >&2
  go build -trimpath -ldflags "-s -w" -o "${BIN_DIR}/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "${BIN_DIR}/etcd.tmp" "${BIN_DIR}/etcd"
fi

# --- Kubernetes ----------------------------------------------------------------------------
mapfile -t missing < <(missing_in "${BIN_DIR}" "${K8S_CMDS[@]}")
if ((${#missing[@]})); then
  log "building ${missing[*]} ${K8S_VERSION} (about 10 minutes cold on 2 cores, seconds warm)"
  cd "${WORK_DIR}"
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  write_k8s_module trellis.local/k8s-build
  write_tools_go "${K8S_CMDS[@]/#/k8s.io/kubernetes/cmd/}"
  go mod tidy >&2
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X ${pkg}.gitVersion=${K8S_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor}"
    ldflags+=" -X ${pkg}.gitTreeState=clean"
  done
  pkgs=("${missing[@]/#/k8s.io/kubernetes/cmd/}")
  tmp="${BIN_DIR}/.tmp"
  rm -rf "${tmp}"; mkdir -p "${tmp}"
  # One build invocation shares compilation of the common packages; -p 2 keeps peak
  # memory (links need 2-3 GB each) within reason.
  go build -p 2 -trimpath -ldflags "${ldflags}" -o "${tmp}/" "${pkgs[@]}" >&2
  for b in "${missing[@]}"; do mv "${tmp}/${b}" "${BIN_DIR}/${b}"; done
  rmdir "${tmp}"
fi

have_all || { log "some binaries are still missing in ${BIN_DIR}"; exit 1; }
log "binaries ready in ${BIN_DIR}"
echo "${BIN_DIR}"
