#!/usr/bin/env bash
# Builds gotestsum (gotest.tools/gotestsum, which runs the e2e suite in make test and make
# e2e: a line per package, the whole output of a failed test, then the slowest tests with
# their times) from the Go module proxy into a versioned cache outside the repository, and
# does nothing when it is already there. About 30 seconds cold, nothing warm.
#
# Prints the directory holding the binary on stdout (last line); progress goes to stderr.
#
# Version: GOTESTSUM_VERSION of hack/versions.env (the environment's wins).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN_DIR="${CACHE_ROOT}/tools/gotestsum-${GOTESTSUM_VERSION}"
if have_files "${BIN_DIR}" gotestsum; then
  echo "${BIN_DIR}"
  exit 0
fi
prepare_go_build
log "building gotestsum ${GOTESTSUM_VERSION}"
mkdir -p "${BIN_DIR}"
# go install of a module at a version builds it with its own go.mod, as its authors do.
GOBIN="${BIN_DIR}" go install -trimpath "gotest.tools/gotestsum@${GOTESTSUM_VERSION}" >&2
have_files "${BIN_DIR}" gotestsum || { log "gotestsum is missing in ${BIN_DIR}"; exit 1; }
log "gotestsum ready in ${BIN_DIR}"
echo "${BIN_DIR}"
