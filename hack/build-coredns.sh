#!/usr/bin/env bash
# Builds CoreDNS (github.com/coredns/coredns), the local cluster's cluster DNS
# (test/cluster with Options.DNS, `localcluster up --dns`, make demo), from the Go module
# proxy into a versioned cache outside the repository, and does nothing when it is
# already there.
#
# As hack/build-kwok.sh does for kwok, the module is downloaded at its exact version,
# copied into a scratch directory and built there with -mod=mod (its own go.mod and
# go.sum: nothing of this repository's module graph). CoreDNS chooses its plugins at
# compile time (plugin.cfg, then `go generate`): the copy keeps only the plugins the
# local cluster's Corefile and the upstream e2e DNS tests' own CoreDNS pods use (PLUGINS below), so the cloud backends (AWS, Azure, GCP,
# etcd ...) are neither downloaded nor compiled. About 2 minutes cold on 2 cores.
#
# Prints the directory holding `coredns` on stdout (last line); progress goes to stderr.
#
# Version: COREDNS_VERSION of hack/versions.env (the environment's wins).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# test/cluster derives the same path from the same version (cluster.coreDNSDir).
BIN_DIR="${CACHE_ROOT}/tools/coredns-${COREDNS_VERSION}"
WORK_DIR="${CACHE_ROOT}/build/coredns-${COREDNS_VERSION}"

# The plugins compiled in (plugin.cfg's order, kept by the grep below, is the order they run in): what
# test/cluster's Corefile uses, plus log and bind for looking into it by hand, and hosts and
# forward, which the upstream e2e DNS tests' own CoreDNS pods (/coredns in the agnhost
# image) configure.
PLUGINS=(reload bind ready health errors log hosts cache forward kubernetes loop)

# has_plugins BINARY — true when BINARY was built with every plugin of PLUGINS (a cached
# build from an older plugin list is rebuilt).
has_plugins() {
  local have p
  have="$("$1" -plugins 2>/dev/null)" || return 1
  for p in "${PLUGINS[@]}"; do
    grep -qx "${p}" <<<"${have}" || return 1
  done
}

if have_files "${BIN_DIR}" coredns && has_plugins "${BIN_DIR}/coredns"; then
  echo "${BIN_DIR}"
  exit 0
fi

prepare_go_build
src="$(module_source github.com/coredns/coredns "${COREDNS_VERSION}")"
mkdir -p "${BIN_DIR}"

log "building CoreDNS ${COREDNS_VERSION} with plugins ${PLUGINS[*]} (about 2 minutes cold on 2 cores)"
# A writable copy: go.sum may change, go generate rewrites the plugin lists.
writable_copy "${src}" "${WORK_DIR}"
cd "${WORK_DIR}"
for p in "${PLUGINS[@]}"; do
  grep -q "^${p}:" plugin.cfg || { log "plugin.cfg of CoreDNS ${COREDNS_VERSION} has no plugin ${p}"; exit 1; }
done
pattern="$(IFS='|'; echo "${PLUGINS[*]}")"
grep -E "^(${pattern}):" plugin.cfg > plugin.cfg.trimmed
mv plugin.cfg.trimmed plugin.cfg
# Regenerates core/plugin/zplugin.go (the imports) and core/dnsserver/zdirectives.go.
go run directives_generate.go >&2
go build -trimpath -tags grpcnotrace \
  -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=${COREDNS_VERSION}" \
  -o "${BIN_DIR}/coredns.tmp" . >&2
has_plugins "${BIN_DIR}/coredns.tmp" || { log "the built coredns lacks one of ${PLUGINS[*]}:"$'\n'"$("${BIN_DIR}/coredns.tmp" -plugins)"; exit 1; }
mv "${BIN_DIR}/coredns.tmp" "${BIN_DIR}/coredns"

have_files "${BIN_DIR}" coredns || { log "coredns is still missing in ${BIN_DIR}"; exit 1; }
log "CoreDNS ${COREDNS_VERSION} ready in ${BIN_DIR}"
echo "${BIN_DIR}"
