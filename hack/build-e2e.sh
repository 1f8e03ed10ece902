#!/usr/bin/env bash
# Builds the upstream Kubernetes e2e suite — `e2e.test` (go test -c of
# k8s.io/kubernetes/test/e2e) — and the ginkgo v2 CLI that runs it, at K8S_VERSION, from the
# Go module proxy into a versioned cache outside the repository, and does nothing when they
# are already there. The same throwaway module as hack/build-k8s.sh, so its module cache is
# shared, and so are the compiled packages: after build-k8s.sh about 3 minutes on 2 cores.
#
# Prints the directory holding `e2e.test` and `ginkgo` on stdout (last line); progress goes
# to stderr.
#
# Version: K8S_VERSION of hack/versions.env (the environment's wins); ginkgo at the version
# k8s.io/kubernetes@K8S_VERSION requires.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN_DIR="${CACHE_ROOT}/e2e/${K8S_VERSION}"
WORK_DIR="${CACHE_ROOT}/build/e2e-${K8S_VERSION}"

if have_files "${BIN_DIR}" e2e.test ginkgo; then
  echo "${BIN_DIR}"
  exit 0
fi

prepare_go_build
mkdir -p "${BIN_DIR}" "${WORK_DIR}"
cd "${WORK_DIR}"
write_k8s_module trellis.local/e2e-build
write_tools_go k8s.io/kubernetes/test/e2e github.com/onsi/ginkgo/v2/ginkgo
go mod tidy >&2
tmp="${BIN_DIR}/.tmp"
rm -rf "${tmp}"; mkdir -p "${tmp}"
if [[ ! -x "${BIN_DIR}/ginkgo" ]]; then
  log "building the ginkgo CLI ($(go list -m -f '{{.Version}}' github.com/onsi/ginkgo/v2))"
  go build -trimpath -ldflags "-s -w" -o "${tmp}/ginkgo" github.com/onsi/ginkgo/v2/ginkgo >&2
  mv "${tmp}/ginkgo" "${BIN_DIR}/ginkgo"
fi
if [[ ! -x "${BIN_DIR}/e2e.test" ]]; then
  log "building e2e.test of k8s.io/kubernetes ${K8S_VERSION} (about 3 minutes on 2 cores after build-k8s.sh)"
  CGO_ENABLED=0 go test -c -trimpath -ldflags "-s -w" -o "${tmp}/e2e.test" k8s.io/kubernetes/test/e2e >&2
  mv "${tmp}/e2e.test" "${BIN_DIR}/e2e.test"
fi
rmdir "${tmp}"
have_files "${BIN_DIR}" e2e.test ginkgo || { log "e2e.test or ginkgo still missing in ${BIN_DIR}"; exit 1; }
log "e2e.test and ginkgo ready in ${BIN_DIR}"
echo "${BIN_DIR}"
