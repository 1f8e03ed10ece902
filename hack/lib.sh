# Shared by the hack/ build scripts: source it, don't run it.
#
# It loads hack/versions.env (a variable already set in the environment wins) and sets
# CACHE_ROOT, where the builds go: $TRELLIS_CACHE, else $XDG_CACHE_HOME/trellis, else
# ~/.cache/trellis (internal/test/testenv.CacheDir finds the same).

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# load_versions sets every KEY=value of hack/versions.env that the environment doesn't set.
load_versions() {
  local key value
  while IFS='=' read -r key value; do
    [[ "${key}" =~ ^[A-Z][A-Z0-9_]*$ ]] || continue
    [[ -n "${!key:-}" ]] || printf -v "${key}" '%s' "${value}"
  done < "${HACK_DIR}/versions.env"
}
load_versions

CACHE_ROOT="${TRELLIS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trellis}"

# log MESSAGE... — progress on stderr, prefixed with the script's name (stdout carries only
# the directory each script prints).
log() { echo "$(basename "$0" .sh): $*" >&2; }

# missing_in DIR ITEM... — prints, one a line, each ITEM whose last path element is not a
# non-empty file in DIR (ITEMs may be package paths: plugins/main/ptp is DIR/ptp).
missing_in() {
  local dir="$1" item
  shift
  for item in "$@"; do
    [[ -s "${dir}/${item##*/}" ]] || echo "${item}"
  done
}

# have_files DIR ITEM... — true when DIR holds every ITEM (missing_in prints nothing).
have_files() { [[ -z "$(missing_in "$@")" ]]; }

# prepare_go_build — checks for go and sets the environment of the throwaway-module builds:
# static binaries, and -mod=mod because the module cache must stay the default one, outside
# the throwaway module (one inside breaks `go mod tidy`).
prepare_go_build() {
  command -v go >/dev/null || { log "go is not on PATH (expected /usr/local/go/bin)"; exit 1; }
  export GOFLAGS="${GOFLAGS:-} -mod=mod"
  export CGO_ENABLED=0
}

# module_source MODULE VERSION — downloads MODULE@VERSION into the Go module cache and
# prints its directory there (read-only: build in a writable_copy of it).
module_source() {
  local dir
  dir="$(go mod download -json "$1@$2" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  [[ -d "${dir}" ]] || { log "could not download $1@$2"; exit 1; }
  echo "${dir}"
}

# writable_copy SRC DIR — makes DIR a fresh, writable copy of SRC (a module's source out of
# the read-only module cache, for a build that may change go.sum or generate files).
writable_copy() {
  rm -rf "$2"
  mkdir -p "$2"
  cp -R "$1/." "$2/"
  chmod -R u+w "$2"
}

# write_k8s_module MODULE — writes go.mod in the working directory: a module MODULE requiring
# k8s.io/kubernetes@$K8S_VERSION with the staging modules (k8s.io/api, client-go ...)
# replaced by their published v0.x versions, exactly the list of the replace block in
# k8s.io/kubernetes's own go.mod (whose ./staging paths don't exist outside its repository).
write_k8s_module() {
  local module="$1" staging_version="v0.${K8S_VERSION#v1.}" gomod_file
  gomod_file="$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  [[ -f "${gomod_file}" ]] || { log "could not download k8s.io/kubernetes@${K8S_VERSION}"; exit 1; }
  {
    echo "module ${module}"
    echo
    echo "go 1.26.0"
    echo
    echo "require k8s.io/kubernetes ${K8S_VERSION}"
    echo
    echo "replace ("
    sed -n '/^replace (/,/^)/p' "${gomod_file}" | awk '/=> \.\/staging/ {print "\t" $1 " => " $1 " '"${staging_version}"'"}'
    echo ")"
  } > go.mod
}

# write_tools_go PKG... — writes tools.go in the working directory importing every PKG, so
# `go mod tidy` pins what `go build` then builds.
write_tools_go() {
  local p
  {
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for p in "$@"; do echo "	_ \"${p}\""; done
    echo ")"
  } > tools.go
}
