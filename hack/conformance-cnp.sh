#!/usr/bin/env bash
# make conformance-cnp: the upstream ClusterNetworkPolicy conformance suite
# (sigs.k8s.io/network-policy-api/conformance at go.mod's version), its tests unchanged,
# judging a fresh local cluster (3 nodes, cluster DNS, Trellis installed from config/ as a
# user installs it, the experimental channel of the ClusterNetworkPolicy CRD). It runs as
# the suite's conformance_profile_test.go does (test/cnp): the ClusterNetworkPolicy profile
# plus the experimental features ClusterNetworkPolicyNamedPorts and
# ClusterNetworkPolicyEgressNodePeers, writes the suite's ConformanceReport (YAML) and prints
# "N passed, M failed, K skipped, E exempt (no kernel SCTP)" (test/cmd/cnpsum). Root, like the
# local cluster.
#
# This kernel has no SCTP. The suite's base runs without its SCTP servers
# (test/cnp/base-no-sctp.patch, applied to a copy), its four SCTP-only tests are skipped
# (SkipTests), and a failure of another test counts as exempt only when all its failures are
# SCTP pokes the kernel refused (test/cmd/cnpsum says how that is checked). README.md, "ClusterNetworkPolicy
# conformance".
#
# Environment: CNP_CLUSTER (cluster name, default cnp), CNP_DATAPLANE (the ClusterNetwork's
# spec.dataplane, Auto, NFTables or IPTables; default the sample's), CNP_KEEP=1 (leave the cluster up),
# CNP_LIST=1 (only list the suite's tests: no cluster), CNP_RUN (a regular expression of
# test ShortNames to run, e.g. 'CNPAdminTierEgressTCP|CNPAdminTierGress'; default all),
# ARTIFACTS (where the report and the test log go, default $TRELLIS_CACHE/cnp).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ "${CNP_LIST:-0}" == 1 ]]; then
  exec go -C test run ./cmd/cnpsum -list
fi

start=${SECONDS}
name="${CNP_CLUSTER:-cnp}"
artifacts="$(mkdir -p "${ARTIFACTS:-${CACHE_ROOT}/cnp}" && cd "${ARTIFACTS:-${CACHE_ROOT}/cnp}" && pwd)"
report="${artifacts}/conformance-report.yaml"
log_json="${artifacts}/cnp-test.json"
rm -f "${report}" "${log_json}"

# The suite's base and per-test manifests, the base patched, where test/cnp embeds them.
module=sigs.k8s.io/network-policy-api
go mod download "${module}"
src="$(go list -m -f '{{.Dir}}' "${module}")"
[[ -n "${src}" && -d "${src}/conformance/base" ]] || { log "no conformance/base in ${module} (${src})"; exit 1; }
rm -rf test/cnp/base
cp -R "${src}/conformance/base" test/cnp/base
chmod -R u+w test/cnp/base
patch -p1 --fuzz=0 --no-backup-if-mismatch -s -d test/cnp --input "${PWD}/test/cnp/base-no-sctp.patch"
log "base: ${src}/conformance/base with test/cnp/base-no-sctp.patch (no SCTP servers)"

# Built before the cluster: a compile error fails in seconds, not after the cluster.
go -C test test -tags cnp -c -o "${artifacts}/cnp.test" ./cnp
go -C test build -o "${artifacts}/cnpsum" ./cmd/cnpsum
hack/build-agnhost.sh >/dev/null
hack/build-coredns.sh >/dev/null

setup_start=${SECONDS}
go -C test run ./cmd/localcluster up --name "${name}" --nodes 3 --cni trellis --dns ${CNP_DATAPLANE:+--dataplane "${CNP_DATAPLANE}"}
if [[ "${CNP_KEEP:-0}" != 1 ]]; then
  trap 'go -C test run ./cmd/localcluster down --name "${name}"' EXIT
fi
kubeconfig="$(go -C test run ./cmd/localcluster kubeconfig --name "${name}")"
PATH="$(hack/build-k8s.sh | tail -1):${PATH}"
export PATH
k() { kubectl --kubeconfig="${kubeconfig}" "$@"; }

# The experimental channel of the ClusterNetworkPolicy CRD (NamedPorts, EgressNodePeers):
# config/experimental is config/default with it.
crd=clusternetworkpolicies.policy.networking.k8s.io
if [[ -f config/experimental/kustomization.yaml ]]; then
  k apply -k config/experimental >/dev/null
  log "applied config/experimental (the experimental ClusterNetworkPolicy CRD)"
else
  # Until config/experimental exists: the module's experimental CRD as released.
  k apply --server-side --force-conflicts -f "${src}/config/crd/experimental/policy.networking.k8s.io_clusternetworkpolicies.yaml" >/dev/null
  log "applied the experimental ClusterNetworkPolicy CRD of ${module} (no config/experimental yet)"
fi
k wait --for=condition=Established --timeout=60s "crd/${crd}" >/dev/null
channel="$(k get crd "${crd}" -o jsonpath='{.metadata.annotations.policy\.networking\.k8s\.io/channel}')"
[[ "${channel}" == experimental ]] || { log "the ${crd} CRD is of channel '${channel}', not experimental"; exit 1; }
setup_secs=$((SECONDS - setup_start))

run='^TestClusterNetworkPolicyConformance$'
all=true
if [[ -n "${CNP_RUN:-}" ]]; then
  run="${run}/^(${CNP_RUN})\$"
  all=false
fi
version="${TRELLIS_VERSION}+$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
[[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]] || version="${version}-dirty"

log "running the ClusterNetworkPolicy conformance suite (${module} $(basename "${src}" | sed 's/.*@//')); log: ${log_json}"
run_start=${SECONDS}
# go test -json of the built binary (go tool test2json, as go test -json runs it), the
# verdict reading it as it comes; the verdict's status is the run's (the test binary fails
# on exempt failures too).
set +e +o pipefail
KUBECONFIG="${kubeconfig}" go tool test2json -t -p github.com/trellis-net/trellis/test/cnp \
  "${artifacts}/cnp.test" -test.v=test2json -test.count=1 -test.timeout=2h -test.run="${run}" \
  -cnp.report="${report}" -cnp.version="${version}" 2>&1 |
  tee "${log_json}" |
  "${artifacts}/cnpsum" -echo -src "${src}/conformance/tests" -report "${report}" -all="${all}"
rc=${PIPESTATUS[2]}
set -e -o pipefail
log "setup (cluster, Trellis, experimental CRD) $((setup_secs))s, suite $((SECONDS - run_start))s, total $((SECONDS - start))s"
exit "${rc}"
