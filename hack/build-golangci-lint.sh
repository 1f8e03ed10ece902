#!/usr/bin/env bash
# Builds golangci-lint (github.com/golangci/golangci-lint/v2, the linter of `make lint`)
# from the Go module proxy into a versioned cache outside the repository, and does nothing
# when it is already there. About 4 minutes cold on 2 cores, nothing warm.
#
# Prints the directory holding the binary on stdout (last line); progress goes to stderr.
#
# Version: GOLANGCI_LINT_VERSION of hack/versions.env (the environment's wins).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN_DIR="${CACHE_ROOT}/tools/golangci-lint-${GOLANGCI_LINT_VERSION}"
if have_files "${BIN_DIR}" golangci-lint; then
  echo "${BIN_DIR}"
  exit 0
fi
prepare_go_build
log "building golangci-lint ${GOLANGCI_LINT_VERSION} (about 4 minutes cold on 2 cores)"
mkdir -p "${BIN_DIR}"
# go install of a module at a version builds it with its own go.mod, as its authors do.
GOBIN="${BIN_DIR}" go install -trimpath \
  "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@${GOLANGCI_LINT_VERSION}" >&2
have_files "${BIN_DIR}" golangci-lint || { log "golangci-lint is missing in ${BIN_DIR}"; exit 1; }
log "golangci-lint ready in ${BIN_DIR}"
echo "${BIN_DIR}"
