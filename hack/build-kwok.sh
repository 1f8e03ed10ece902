#!/usr/bin/env bash
# Builds kwok's controller (sigs.k8s.io/kwok cmd/kwok) from the Go module proxy into a
# versioned cache outside the repository, and does nothing when it is already there. It
# simulates thousands of Nodes (heartbeats, Ready) against the project's real
# kube-apiserver for make bench-scale and the scale correctness test (test/scale).
#
# The proxy refuses version lists for sigs.k8s.io/kwok, so `go install …@version` fails;
# the module is downloaded at its exact version, copied into a scratch directory and built
# there with -mod=mod. About 5 minutes cold on 2 cores, nothing warm.
#
# Prints the directory holding the binary on stdout (last line); progress goes to stderr.
#
# Version: KWOK_VERSION of hack/versions.env (the environment's wins).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# internal/test/versions derives the same path from the same version (Set.KwokDir).
BIN_DIR="${CACHE_ROOT}/tools/kwok-${KWOK_VERSION}"
WORK_DIR="${CACHE_ROOT}/build/kwok-${KWOK_VERSION}"

# kwok's controller does nothing without stages (how it moves fake objects along): the
# node ones ship in the module; the harness gives them to kwok as its configuration.
STAGES=(kustomize/stage/node/fast/node-initialize.yaml kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml)

have_all() { have_files "${BIN_DIR}" kwok "${STAGES[@]}"; }

if have_all; then
  echo "${BIN_DIR}"
  exit 0
fi

prepare_go_build
src="$(module_source sigs.k8s.io/kwok "${KWOK_VERSION}")"
mkdir -p "${BIN_DIR}"
for s in "${STAGES[@]}"; do cp "${src}/${s}" "${BIN_DIR}/"; done

if [[ ! -s "${BIN_DIR}/kwok" ]]; then
  log "building kwok ${KWOK_VERSION} (about 5 minutes cold on 2 cores)"
  writable_copy "${src}" "${WORK_DIR}"  # go.sum may change
  cd "${WORK_DIR}"
  go mod download >&2
  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" \
    -o "${BIN_DIR}/kwok.tmp" ./cmd/kwok >&2
  mv "${BIN_DIR}/kwok.tmp" "${BIN_DIR}/kwok"
fi

have_all || { log "some files are still missing in ${BIN_DIR}"; exit 1; }
log "kwok ready in ${BIN_DIR}"
echo "${BIN_DIR}"
