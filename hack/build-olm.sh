#!/usr/bin/env bash
# Builds OLM v0 (the olm, catalog and package-server operators, and copy-content and cpb,
# the helpers its bundle-unpack and catalog pods run) and opm from the Go module proxy into
# versioned caches outside the repository, and does nothing when they are already there.
#
# Unlike the other hack/ builds these compile inside a copy of each module's own source, with
# its own go.mod and go.sum: OLM and operator-registry pin dozens of dependencies a
# throwaway module's `go mod tidy` would move. The proxy serves exact versions only (its
# version lists for github.com/operator-framework/* are refused), so `go install MOD@VER`
# can't be used.
#
# Prints the directories holding the binaries on stdout (last two lines: OLM's, then opm's);
# progress goes to stderr. Cold: ~6 min for OLM and ~3.5 min for opm on 2 cores (5.5 min for
# both with a warm Go build cache of their dependencies), ~5 GB of Go build cache.
#
# CGO is off (static binaries): opm's deprecated SQLite-database commands don't work without
# it; what the project uses — validate, render, serve of a file-based catalog — does.
#
# Versions: OLM_VERSION and OPM_VERSION of hack/versions.env (the environment's win).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

OLM_MODULE=github.com/operator-framework/operator-lifecycle-manager
OPM_MODULE=github.com/operator-framework/operator-registry

# test/bundle derives the opm path from the same version (internal/test/versions).
OLM_BIN_DIR="${CACHE_ROOT}/tools/olm-${OLM_VERSION}"
OPM_BIN_DIR="${CACHE_ROOT}/tools/opm-${OPM_VERSION}"

OLM_CMDS=(cmd/olm cmd/catalog cmd/package-server cmd/copy-content util/cpb)
OPM_CMDS=(cmd/opm)

have_all() { have_files "${OLM_BIN_DIR}" "${OLM_CMDS[@]}" && have_files "${OPM_BIN_DIR}" "${OPM_CMDS[@]}"; }

if have_all; then
  echo "${OLM_BIN_DIR}"
  echo "${OPM_BIN_DIR}"
  exit 0
fi

prepare_go_build

# build_module MODULE VERSION BIN_DIR TAGS LDFLAGS PKG... — builds the missing PKGs (each
# binary named after its package's last element) of MODULE@VERSION into BIN_DIR, from a
# writable copy of the module's source under the build cache, with LDFLAGS added to "-s -w".
build_module() {
  local module="$1" version="$2" bin_dir="$3" tags="$4" ldflags="$5"
  shift 5
  local missing
  mapfile -t missing < <(missing_in "${bin_dir}" "$@")
  ((${#missing[@]})) || return 0
  local work="${CACHE_ROOT}/build/${module##*/}-${version}" src
  if [[ ! -f "${work}/go.mod" ]]; then
    src="$(go mod download -json "${module}@${version}" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
    [[ -d "${src}" ]] || { log "could not download ${module}@${version}"; exit 1; }
    rm -rf "${work}.tmp"
    mkdir -p "$(dirname "${work}")"
    cp -r "${src}" "${work}.tmp"
    chmod -R u+w "${work}.tmp"
    mv "${work}.tmp" "${work}"
  fi
  cd "${work}"
  go mod download >&2
  local tmp="${bin_dir}/.tmp"
  rm -rf "${tmp}"; mkdir -p "${tmp}"
  go build -trimpath -tags "${tags}" -ldflags "-s -w ${ldflags}" -o "${tmp}/" "${missing[@]/#/./}" >&2
  local p
  for p in "${missing[@]}"; do mv "${tmp}/${p##*/}" "${bin_dir}/${p##*/}"; done
  rmdir "${tmp}"
}

mkdir -p "${OLM_BIN_DIR}" "${OPM_BIN_DIR}"

log "building opm ${OPM_VERSION} if missing (about 3.5 minutes cold on 2 cores)"
build_module "${OPM_MODULE}" "${OPM_VERSION}" "${OPM_BIN_DIR}" json1,containers_image_openpgp \
  "-X ${OPM_MODULE}/cmd/opm/version.opmVersion=${OPM_VERSION}" "${OPM_CMDS[@]}"

log "building OLM ${OLM_VERSION} if missing (about 6 minutes cold on 2 cores)"
build_module "${OLM_MODULE}" "${OLM_VERSION}" "${OLM_BIN_DIR}" "" \
  "-X ${OLM_MODULE}/pkg/version.OLMVersion=${OLM_VERSION}" "${OLM_CMDS[@]}"

have_all || { log "some binaries are still missing in ${OLM_BIN_DIR} or ${OPM_BIN_DIR}"; exit 1; }
log "binaries ready in ${OLM_BIN_DIR} and ${OPM_BIN_DIR}"
echo "${OLM_BIN_DIR}"
echo "${OPM_BIN_DIR}"
