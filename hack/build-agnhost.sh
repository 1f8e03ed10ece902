#!/usr/bin/env bash
# Builds agnhost, the Kubernetes e2e test image's multi-purpose binary
# (k8s.io/kubernetes/test/images/agnhost), from the Go module proxy into a versioned cache
# outside the repository, and does nothing when it is already there.
#
# The local cluster (test/cluster) packs it into an image under its upstream name
# (registry.k8s.io/e2e-test-images/agnhost:<VERSION>) so manifests written for the upstream
# e2e tests run unchanged without a registry.
#
# Prints the directory holding `agnhost`, `VERSION` (the image tag the e2e framework of
# this Kubernetes release uses) and the porter's `localhost.crt`/`localhost.key` (upstream's
# image has them at /) on stdout (last line); progress goes to stderr.
#
# Version: K8S_VERSION of hack/versions.env (the environment's wins).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN_DIR="${CACHE_ROOT}/agnhost/${K8S_VERSION}"
WORK_DIR="${CACHE_ROOT}/build/agnhost-${K8S_VERSION}"

if have_files "${BIN_DIR}" agnhost VERSION localhost.crt localhost.key; then
  echo "${BIN_DIR}"
  exit 0
fi

prepare_go_build
mkdir -p "${BIN_DIR}" "${WORK_DIR}"

log "building agnhost from k8s.io/kubernetes ${K8S_VERSION} (a few minutes cold, seconds warm)"
cd "${WORK_DIR}"
module_dir="$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
version="$(tr -d '[:space:]' < "${module_dir}/test/images/agnhost/VERSION")"
[[ -n "${version}" ]] || { log "no test/images/agnhost/VERSION in k8s.io/kubernetes@${K8S_VERSION}"; exit 1; }
write_k8s_module trellis.local/agnhost-build
write_tools_go k8s.io/kubernetes/test/images/agnhost
go mod tidy >&2
tmp="${BIN_DIR}/.tmp"
rm -rf "${tmp}"; mkdir -p "${tmp}"
go build -trimpath -ldflags "-s -w -X main.Version=${version}" -o "${tmp}/agnhost" k8s.io/kubernetes/test/images/agnhost >&2
echo "${version}" > "${tmp}/VERSION"
cp "${module_dir}/test/images/agnhost/porter/localhost.crt" "${module_dir}/test/images/agnhost/porter/localhost.key" "${tmp}/"
chmod 0644 "${tmp}/localhost.crt" "${tmp}/localhost.key"
mv "${tmp}/localhost.crt" "${tmp}/localhost.key" "${BIN_DIR}/"
mv "${tmp}/VERSION" "${BIN_DIR}/VERSION"
mv "${tmp}/agnhost" "${BIN_DIR}/agnhost"
rmdir "${tmp}"
log "agnhost ${version} ready in ${BIN_DIR}"
echo "${BIN_DIR}"
