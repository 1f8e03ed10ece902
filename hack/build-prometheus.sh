#!/usr/bin/env bash
# Builds the Prometheus server (github.com/prometheus/prometheus cmd/prometheus), which the
# monitoring e2e (test/e2e/monitoring_test.go) runs on the local cluster to scrape the
# operator and the agents and evaluate config/prometheus's alerts, from the Go module proxy
# into a versioned cache outside the repository, and does nothing when it is already there.
#
# As hack/build-kwok.sh does, the module is downloaded at its exact version, copied into a
# scratch directory and built there with -mod=mod and without its go.work (whose other
# modules the proxy's zip leaves out). Only the kubernetes service discovery is compiled
# in (remove_all_sd, enable_kubernetes_sd: no cloud SDKs), and not the web UI's assets
# (builtinassets): the tests use the HTTP API. About 3.5 minutes cold on 2 cores.
#
# Prints the directory holding `prometheus` on stdout (last line); progress goes to stderr.
#
# Version: PROMETHEUS_VERSION of hack/versions.env (the environment's wins); the module's
# v0.3xx.y versions are Prometheus 3.xx.y.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# internal/test/versions derives the same path from the same version (Set.PrometheusDir).
BIN_DIR="${CACHE_ROOT}/tools/prometheus-${PROMETHEUS_VERSION}"
WORK_DIR="${CACHE_ROOT}/build/prometheus-${PROMETHEUS_VERSION}"

if have_files "${BIN_DIR}" prometheus; then
  echo "${BIN_DIR}"
  exit 0
fi

prepare_go_build
export GOWORK=off
src="$(module_source github.com/prometheus/prometheus "${PROMETHEUS_VERSION}")"
mkdir -p "${BIN_DIR}"

log "building Prometheus ${PROMETHEUS_VERSION} (about 3.5 minutes cold on 2 cores)"
writable_copy "${src}" "${WORK_DIR}"
cd "${WORK_DIR}"
go build -trimpath -tags netgo,remove_all_sd,enable_kubernetes_sd \
  -ldflags "-s -w -X github.com/prometheus/common/version.Version=$(cat VERSION) -X github.com/prometheus/common/version.Revision=${PROMETHEUS_VERSION}" \
  -o "${BIN_DIR}/prometheus.tmp" ./cmd/prometheus >&2
mv "${BIN_DIR}/prometheus.tmp" "${BIN_DIR}/prometheus"

have_files "${BIN_DIR}" prometheus || { log "prometheus is missing in ${BIN_DIR}"; exit 1; }
log "Prometheus ${PROMETHEUS_VERSION} ready in ${BIN_DIR}"
echo "${BIN_DIR}"
