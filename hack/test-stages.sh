#!/usr/bin/env bash
# make test's stages, timed against their budgets (docs/development.md gives the same
# table; test/docs checks that it does).
#
# First the checks every stage needs, one after another, stopping at the first failure:
# deps, generate (manifests, deep copies, bundle, catalog), vet, lint. Then two lanes that
# run at once (the cluster tests mostly wait on timeouts and probes): the Go tests, fuzz,
# the bundle, the NetworkPolicy conformance subset's IPv6 pass, the ClusterNetworkPolicy
# subset and the upstream [sig-network] subset; the e2e suite (its shared clusters
# E2E_PARALLEL at a time) and the conformance subset's IPv4 pass. A stage of a
# lane writes its output to $STAGE_LOGS/<stage>.log, printed whole when the stage ends
# (lanes' output never interleaves); a failed stage doesn't stop the others.
#
# At the end: a table of every stage's time and budget, and a warning naming each stage
# over its budget by more than a quarter (a warning, never a failure: the machine is
# noisy). The exit status is the stages': 0 when every one passed.
set -uo pipefail
cd "$(dirname "$0")/.."

STAGE_LOGS=${STAGE_LOGS:-_output/stages}
MAKE=${MAKE:-make}
rm -rf "$STAGE_LOGS" && mkdir -p "$STAGE_LOGS" || exit 1
exec 9>"$STAGE_LOGS/.print" # held while a lane prints a finished stage's log

# The budget of each stage, in seconds, on this 2-CPU machine with warm caches (the
# stages of the lanes overlap: the total is the slowest lane's, not the sum).
declare -A BUDGET=(
	[deps]=60
	[generate]=60
	[vet]=120
	[lint]=180
	[unit]=600
	[fuzz]=60
	[bundle]=30
	[e2e]=960
	[conformance-ipv4]=480
	[upstream]=300
	[conformance-ipv6]=360
	[cnp]=300
)
# The order of the summary table.
STAGES=(deps generate vet lint unit fuzz bundle e2e conformance-ipv4 upstream conformance-ipv6 cnp)

# stage NAME CMD...: runs CMD, records its status and time in $STAGE_LOGS/NAME.result.
# With LIVE=1 the output goes to the terminal as it comes (and to the log); otherwise to
# the log, printed when CMD ends.
stage() {
	local name=$1 start rc
	shift
	[[ -n "${BUDGET[$name]:-}" ]] || { echo "test-stages: stage $name has no budget" >&2; return 1; }
	start=$(date +%s)
	echo "==> $name: started $(date -u +%H:%M:%S) (budget ${BUDGET[$name]} s)"
	if [[ "${LIVE:-0}" == 1 ]]; then
		"$@" 2>&1 | tee "$STAGE_LOGS/$name.log"
		rc=${PIPESTATUS[0]}
	else
		"$@" >"$STAGE_LOGS/$name.log" 2>&1
		rc=$?
	fi
	local took=$(($(date +%s) - start)) verdict=PASS
	((rc == 0)) || verdict="FAIL (exit $rc)"
	echo "$verdict $took" >"$STAGE_LOGS/$name.result"
	if [[ "${LIVE:-0}" != 1 ]]; then
		flock 9
		echo "==> $name: output ($STAGE_LOGS/$name.log)"
		cat "$STAGE_LOGS/$name.log"
		echo "==> $name: $verdict in $took s (budget ${BUDGET[$name]} s)"
		flock -u 9
	else
		echo "==> $name: $verdict in $took s (budget ${BUDGET[$name]} s)"
	fi
	return "$rc"
}

summary() {
	local name result verdict took budget warnings=() failed=0 total=$(($(date +%s) - T0))
	echo
	echo "==> make test: stages (budgets in docs/development.md)"
	printf '    %-18s %-14s %8s %8s\n' stage result took budget
	for name in "${STAGES[@]}"; do
		budget=${BUDGET[$name]}
		if [[ -f "$STAGE_LOGS/$name.result" ]]; then
			result=$(<"$STAGE_LOGS/$name.result")
			verdict=${result% *} took=${result##* }
		else
			verdict="not run" took=-
		fi
		[[ "$verdict" == PASS || "$verdict" == "not run" ]] || failed=1
		printf '    %-18s %-14s %8s %8s\n' "$name" "$verdict" "$took" "$budget"
		if [[ "$took" != - ]] && ((took * 4 > budget * 5)); then
			warnings+=("stage $name took $took s, over its budget of $budget s by more than a quarter")
		fi
	done
	echo "    total: $total s"
	for w in "${warnings[@]}"; do
		echo "WARNING: $w"
	done
	return "$failed"
}

T0=$(date +%s)
trap 'summary' EXIT
trap 'trap - EXIT; kill 0; exit 130' INT TERM # the lanes too

# The checks, in order; the first failure ends the run.
LIVE=1 stage deps "$MAKE" --no-print-directory deps || exit 1
LIVE=1 stage generate "$MAKE" --no-print-directory manifests generate bundle catalog || exit 1
LIVE=1 stage vet "$MAKE" --no-print-directory vet || exit 1
LIVE=1 stage lint "$MAKE" --no-print-directory lint || exit 1
# Built once, before the lanes that use it start at once.
hack/build-agnhost.sh >/dev/null || exit 1

# The lanes: two, so that the machine is never loaded past what timing checks bear (an
# agent restart's gap under 1 s, a kube-apiserver starting): about three local clusters
# or the Go tests beside two clusters.
pids=()
{
	stage unit "$MAKE" --no-print-directory test-go
	stage fuzz "$MAKE" --no-print-directory test-fuzz
	stage bundle "$MAKE" --no-print-directory validate-bundle
	stage conformance-ipv6 "$MAKE" --no-print-directory conformance-run CONFORMANCE_MODE=subset \
		CONFORMANCE_FAMILY=ipv6 CONFORMANCE_CLUSTER=conf6 CONFORMANCE_OUT=_output/conformance-ipv6
	stage cnp "$MAKE" --no-print-directory conformance-cnp-ci
	stage upstream "$MAKE" --no-print-directory conformance-upstream-ci
} &
pids+=($!)
{
	stage e2e "$MAKE" --no-print-directory e2e-run
	stage conformance-ipv4 "$MAKE" --no-print-directory conformance-run CONFORMANCE_MODE=subset \
		CONFORMANCE_FAMILY=ipv4 CONFORMANCE_STACK=dual CONFORMANCE_CLUSTER=conf4 CONFORMANCE_OUT=_output/conformance-ipv4
} &
pids+=($!)
for pid in "${pids[@]}"; do
	wait "$pid"
done
# summary (the EXIT trap) sets the exit status from the stages' results.
trap - EXIT
summary
