#!/usr/bin/env bash
# Builds the Kubernetes control-plane binaries (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy, kubectl) and etcd from the Go module proxy into a
# versioned cache outside the repository, and does nothing when they are already there.
#
# setup-envtest cannot download on machines without internet access, so this is what the
# integration tests (KUBEBUILDER_ASSETS) and the local cluster use.
#
# Prints the directory holding the binaries on stdout (last line); progress goes to stderr.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
CACHE_ROOT="${TRELLIS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trellis}"
BIN_DIR="${CACHE_ROOT}/k8s/${K8S_VERSION}"
WORK_DIR="${CACHE_ROOT}/build/k8s-${K8S_VERSION}"
ETCD_WORK_DIR="${CACHE_ROOT}/build/etcd-${ETCD_VERSION}"

K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)

log() { echo "build-k8s: $*" >&2; }

have_all() {
  for b in "${K8S_CMDS[@]}" etcd; do
    [[ -x "${BIN_DIR}/${b}" ]] || return 1
  done
}

if have_all; then
  echo "${BIN_DIR}"
  exit 0
fi

command -v go >/dev/null || { log "go is not on PATH (expected /usr/local/go/bin)"; exit 1; }
mkdir -p "${BIN_DIR}" "${WORK_DIR}" "${ETCD_WORK_DIR}"
# The module cache must not live inside the throwaway module (it breaks `go mod tidy`).
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export CGO_ENABLED=0

# --- etcd ------------------------------------------------------------------------------
if [[ ! -x "${BIN_DIR}/etcd" ]]; then
  log "building etcd ${ETCD_VERSION} (about 1 minute cold)"
  cd "${ETCD_WORK_DIR}"
  if [[ ! -f go.mod ]]; then
    go mod init trellis.local/etcd-build >/dev/null 2>&1
  fi
  cat > tools.go <<GO
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
  go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" >&2
  go mod tidy >&2
  go build -trimpath -ldflags "-s -w" -o "${BIN_DIR}/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "${BIN_DIR}/etcd.tmp" "${BIN_DIR}/etcd"
fi

# --- Kubernetes ----------------------------------------------------------------------------
missing=()
for b in "${K8S_CMDS[@]}"; do
  [[ -x "${BIN_DIR}/${b}" ]] || missing+=("${b}")
done
if ((${#missing[@]})); then
  log "building ${missing[*]} ${K8S_VERSION} (about 25 minutes cold on 2 cores, seconds warm)"
  cd "${WORK_DIR}"
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  staging_version="v0.${K8S_VERSION#v1.}"
  # The staging modules are replaced to their published versions, exactly the list of the
  # replace block in k8s.io/kubernetes's own go.mod.
  gomod_file="$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  [[ -f "${gomod_file}" ]] || { log "could not download k8s.io/kubernetes@${K8S_VERSION}"; exit 1; }
  {
    echo "module trellis.local/k8s-build"
    echo
    echo "go 1.26.0"
    echo
    echo "require k8s.io/kubernetes ${K8S_VERSION}"
    echo
    echo "replace ("
    sed -n '/^replace (/,/^)/p' "${gomod_file}" | awk '/=> \.\/staging/ {print "\t" $1 " => " $1 " '"${staging_version}"'"}'
    echo ")"
  } > go.mod
  {
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for b in "${K8S_CMDS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/${b}\""; done
    echo ")"
  } > tools.go
  go mod tidy >&2
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X ${pkg}.gitVersion=${K8S_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor}"
    ldflags+=" -X ${pkg}.gitTreeState=clean"
  done
  pkgs=()
  for b in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/${b}"); done
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
