#!/usr/bin/env bash
# Builds krew (sigs.k8s.io/krew: cmd/krew and cmd/validate-krew-manifest, the validator
# krew-index runs on every plugin manifest) from the Go module proxy into a versioned cache
# outside the repository, and does nothing when they are already there. About 20 seconds
# cold, nothing warm. hack/validate-krew-manifest.sh runs them on make dist-cli's manifest.
#
# Prints the directory holding the binaries on stdout (last line); progress goes to stderr.
#
# Version: KREW_VERSION of hack/versions.env (the environment's wins).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN_DIR="${CACHE_ROOT}/tools/krew-${KREW_VERSION}"
if have_files "${BIN_DIR}" krew validate-krew-manifest; then
  echo "${BIN_DIR}"
  exit 0
fi
prepare_go_build
log "building krew and validate-krew-manifest ${KREW_VERSION}"
mkdir -p "${BIN_DIR}"
# go install of a module at a version builds it with its own go.mod, as its authors do.
GOBIN="${BIN_DIR}" go install -trimpath \
  "sigs.k8s.io/krew/cmd/krew@${KREW_VERSION}" \
  "sigs.k8s.io/krew/cmd/validate-krew-manifest@${KREW_VERSION}" >&2
missing="$(missing_in "${BIN_DIR}" krew validate-krew-manifest)"
[[ -z "${missing}" ]] || { log "missing in ${BIN_DIR}: ${missing//$'\n'/ }"; exit 1; }
log "krew and validate-krew-manifest ready in ${BIN_DIR}"
echo "${BIN_DIR}"
