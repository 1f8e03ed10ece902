#!/usr/bin/env bash
# make conformance-upstream: the upstream Kubernetes e2e suite, unchanged, judging a local
# cluster (3 nodes, cluster DNS, Trellis installed from config/ as a user installs it).
# Runs the specs of test/upstream/focus.txt but those of test/upstream/skip.txt (each with
# its reason), with ginkgo parallelism for 2 CPUs, writes the JUnit XML and prints
# "N passed, M failed, K skipped". Root, like the local cluster.
#
# Environment: UPSTREAM_FOCUS (the focus file, default test/upstream/focus.txt; `make test`
# gives test/upstream/ci.txt), UPSTREAM_PROCS (ginkgo --procs, default 3), UPSTREAM_CLUSTER
# (cluster name, default upstream), UPSTREAM_IP_FAMILY (the cluster's --ip-family, default
# dual: IPv4 first, so the IPv4 specs judge the same cluster as the [Feature:IPv6DualStack]
# ones, which need both families; ipv4: a single-stack cluster, those specs left out),
# UPSTREAM_DATAPLANE (the ClusterNetwork's spec.dataplane: Auto, NFTables or IPTables; default
# the sample's), UPSTREAM_KEEP=1 (leave the cluster up), UPSTREAM_LIST=1
# (only list the selected specs: no cluster), UPSTREAM_DIRECT=0 (no Direct pass, below),
# ARTIFACTS (where the JUnit XML goes, default
# $TRELLIS_CACHE/upstream).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bin="$(hack/build-e2e.sh | tail -1)"
hack/build-agnhost.sh >/dev/null
# The specs' own CoreDNS pods need plugins an older cached build may lack: rebuilt then.
hack/build-coredns.sh >/dev/null
name="${UPSTREAM_CLUSTER:-upstream}"
artifacts="${ARTIFACTS:-${CACHE_ROOT}/upstream}"
mkdir -p "${artifacts}"

# One regular expression from the lines of a file (comments and blank lines left out;
# skip.txt: the pattern before the tab).
patterns() {
  local p
  p="$(grep -v '^\s*\(#\|$\)' "$1" | cut -f1 | paste -sd'|')" || true
  [[ -n "${p}" ]] || { log "$1 has no patterns"; exit 1; }
  echo "${p}"
}
focus_file="${UPSTREAM_FOCUS:-test/upstream/focus.txt}"
focus="$(patterns "${focus_file}")"
skip="$(patterns test/upstream/skip.txt)"
ip_family="${UPSTREAM_IP_FAMILY:-dual}"
if [[ "${ip_family}" != dual ]]; then
  # They need a node, pod and Service address of each family.
  log "UPSTREAM_IP_FAMILY=${ip_family}: the [Feature:IPv6DualStack] specs are left out"
  skip="${skip}|\[Feature:IPv6DualStack\]"
fi

if [[ "${UPSTREAM_LIST:-0}" == 1 ]]; then
  "${bin}/ginkgo" --dry-run -v --focus="${focus}" --skip="${skip}" --no-color "${bin}/e2e.test" -- \
    --kubeconfig=/dev/null --provider=local | sed -n 's/^\(\[sig-network\] .*\)$/\1/p' | sort -u
  exit 0
fi

nodes=3
go -C test run ./cmd/localcluster up --name "${name}" --nodes "${nodes}" --cni trellis --dns \
  --ip-family "${ip_family}" ${UPSTREAM_DATAPLANE:+--dataplane "${UPSTREAM_DATAPLANE}"}
if [[ "${UPSTREAM_KEEP:-0}" != 1 ]]; then
  trap 'go -C test run ./cmd/localcluster down --name "${name}"' EXIT
fi
kubeconfig="$(go -C test run ./cmd/localcluster kubeconfig --name "${name}")"
# The framework's RunHostCmd and friends shell out to kubectl (of the same release).
PATH="$(hack/build-k8s.sh | tail -1):${PATH}"
export PATH

# run_suite FOCUS SKIP REPORT — one ginkgo run; --num-nodes because the framework only
# counts the nodes on ginkgo process 1 (the others would skip "Requires at least 2 nodes").
# REPORT also prefixes the framework's own report files, so the passes keep theirs apart.
run_suite() {
  "${bin}/ginkgo" --procs="${UPSTREAM_PROCS:-3}" --focus="$1" --skip="$2" \
    --timeout=2h --output-dir="${artifacts}" --junit-report="$3" --silence-skips \
    "${bin}/e2e.test" -- --kubeconfig="${kubeconfig}" --provider=local --num-nodes="${nodes}" \
    --report-dir="${artifacts}" --report-prefix="${3%.xml}-"
}

log "running upstream e2e ($(basename "${bin}")) of ${focus_file}: focus '${focus}', skip '${skip}'"
rc=0
run_suite "${focus}" "${skip}" junit.xml || rc=$?
go run ./hack/junitsum -focus "${focus}" -skip "${skip}" "${artifacts}/junit.xml" || rc=1
log "JUnit XML: ${artifacts}/junit.xml"

# The Direct pass: specs skipped in the default (VXLAN) run because they assume pod traffic
# leaves through the node-IP interface (test/upstream/direct.txt says which and why) run
# again after a live switch of the same cluster to Direct routing.
if [[ "${UPSTREAM_DIRECT:-1}" == 1 ]] && [[ -n "$(patterns test/upstream/direct.txt)" ]]; then
  direct="$(patterns test/upstream/direct.txt)"
  log "switching the cluster to Direct routing for the specs of test/upstream/direct.txt"
  k() { kubectl --kubeconfig="${kubeconfig}" "$@"; }
  # Switched: the ClusterNetwork observed the change and finished rolling it out, and every
  # node's agent reports Direct and Ready (as test/e2e's live-switch test waits).
  if k patch clusternetwork default --type=merge -p '{"spec":{"encapsulation":"Direct"}}' >/dev/null &&
    k wait clusternetwork/default --for=condition=Progressing=False --timeout=3m >/dev/null &&
    k wait nodenetworks --all --for=jsonpath='{.status.encapsulation}'=Direct --timeout=3m >/dev/null &&
    k wait nodenetworks --all --for=condition=Ready --timeout=3m >/dev/null; then
    log "every node routes Direct and is Ready"
    run_suite "${direct}" "" junit-direct.xml || rc=$?
    go run ./hack/junitsum -focus "${direct}" "${artifacts}/junit-direct.xml" || rc=1
    log "JUnit XML (Direct pass): ${artifacts}/junit-direct.xml"
  else
    log "FAIL: the cluster did not switch to Direct routing within 3 minutes; the Direct pass did not run"
    k get clusternetwork,nodenetworks -o wide >&2 || true
    rc=1
  fi
fi
exit "${rc}"
