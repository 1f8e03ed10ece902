#!/usr/bin/env bash
# Builds agnhost, the Kubernetes e2e test image's multi-purpose binary
# (k8s.io/kubernetes/test/images/agnhost), from the Go module proxy into a versioned cache
# outside the repository, and does nothing when it is already there.
#
# The local cluster (test/cluster) packs it into an image under its upstream name
# (registry.k8s.io/e2e-test-images/agnhost:<VERSION>) so manifests written for the upstream
# e2e tests run unchanged without a registry.
#
# Prints the directory holding `agnhost` and `VERSION` (the image tag the e2e framework of
# this Kubernetes release uses) on stdout (last line); progress goes to stderr.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
CACHE_ROOT="${TRELLIS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trellis}"
BIN_DIR="${CACHE_ROOT}/agnhost/${K8S_VERSION}"
WORK_DIR="${CACHE_ROOT}/build/agnhost-${K8S_VERSION}"

log() { echo "build-agnhost: $*" >&2; }

if [[ -x "${BIN_DIR}/agnhost" && -s "${BIN_DIR}/VERSION" ]]; then
  echo "${BIN_DIR}"
  exit 0
fi

command -v go >/dev/null || { log "go is not on PATH (expected /usr/local/go/bin)"; exit 1; }
mkdir -p "${BIN_DIR}" "${WORK_DIR}"
# The module cache must not live inside the throwaway module (it breaks `go mod tidy`).
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export CGO_ENABLED=0

log "building agnhost from k8s.io/kubernetes ${K8S_VERSION} (a few minutes cold, seconds warm)"
cd "${WORK_DIR}"
staging_version="v0.${K8S_VERSION#v1.}"
gomod_file="$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
[[ -f "${gomod_file}" ]] || { log "could not download k8s.io/kubernetes@${K8S_VERSION}"; exit 1; }
module_dir="$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
version="$(tr -d '[:space:]' < "${module_dir}/test/images/agnhost/VERSION")"
[[ -n "${version}" ]] || { log "no test/images/agnhost/VERSION in k8s.io/kubernetes@${K8S_VERSION}"; exit 1; }
# Same module layout as hack/build-k8s.sh: the staging modules replaced by their published
# versions, exactly the replace block of k8s.io/kubernetes's own go.mod.
{
  echo "module trellis.local/agnhost-build"
  echo
  echo "go 1.26.0"
  echo
  echo "require k8s.io/kubernetes ${K8S_VERSION}"
  echo
  echo "replace ("
  sed -n '/^replace (/,/^)/p' "${gomod_file}" | awk '/=> \.\/staging/ {print "\t" $1 " => " $1 " '"${staging_version}"'"}'
  echo ")"
} > go.mod
cat > tools.go <<GO
//go:build tools

package tools

import _ "k8s.io/kubernetes/test/images/agnhost"
GO
go mod tidy >&2
tmp="${BIN_DIR}/.tmp"
rm -rf "${tmp}"; mkdir -p "${tmp}"
go build -trimpath -ldflags "-s -w -X main.Version=${version}" -o "${tmp}/agnhost" k8s.io/kubernetes/test/images/agnhost >&2
echo "${version}" > "${tmp}/VERSION"
mv "${tmp}/VERSION" "${BIN_DIR}/VERSION"
mv "${tmp}/agnhost" "${BIN_DIR}/agnhost"
rmdir "${tmp}"
log "agnhost ${version} ready in ${BIN_DIR}"
echo "${BIN_DIR}"
