#!/usr/bin/env bash
# make test's stages, timed against their budgets (docs/development.md gives the same
# table; test/docs checks that it does).
#
# First the checks, one after another, stopping at the first failure: generate (manifests,
# deep copies, bundle, catalog), vet, lint; beside them, deps builds what the lanes need
# (the checks need none of it; on a fresh machine both are mostly builds, and two CPUs
# carry them together better than one after the other). Then two lanes that
# run at once (the cluster tests mostly wait on timeouts and probes): the Go tests, fuzz,
# the bundle and the NetworkPolicy conformance subset's IPv6 pass; the e2e suite (its
# shared clusters E2E_PARALLEL at a time), the conformance subset's IPv4 pass, the
# ClusterNetworkPolicy subset and the upstream [sig-network] subset (the lanes about even,
# warm and cold). A stage of a
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

# stage NAME CMD...: runs CMD, records its status and time in $STAGE_LOGS/NAME.result. The
# output goes to the log, printed whole when CMD ends.
stage() {
	local name=$1 start rc
	shift
	[[ -n "${BUDGET[$name]:-}" ]] || { echo "test-stages: stage $name has no budget" >&2; return 1; }
	start=$(date +%s)
	echo "==> $name: started $(date -u +%H:%M:%S) (budget ${BUDGET[$name]} s)"
	"$@" >"$STAGE_LOGS/$name.log" 2>&1
	rc=$?
	local took=$(($(date +%s) - start)) verdict=PASS
	((rc == 0)) || verdict="FAIL (exit $rc)"
	echo "$verdict $took" >"$STAGE_LOGS/$name.result"
	flock 9
	echo "==> $name: output ($STAGE_LOGS/$name.log)"
	cat "$STAGE_LOGS/$name.log"
	echo "==> $name: $verdict in $took s (budget ${BUDGET[$name]} s)"
	flock -u 9
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
trap 'trap - EXIT; [[ -n "${deps_pid:-}" ]] && kill -- -"$deps_pid" 2>/dev/null; kill 0; exit 130' INT TERM # the lanes and deps too

# stop ends the run at a failed check or deps: deps's builds stopped (their process group),
# then the summary (the EXIT trap).
stop() {
	kill -- -"$deps_pid" 2>/dev/null
	exit 1
}

# deps beside the checks, in order; the first failure of either ends the run. deps runs in
# a process group of its own (set -m), so that stop ends its builds and nothing else.
set -m
stage deps "$MAKE" --no-print-directory deps &
deps_pid=$!
set +m
stage generate "$MAKE" --no-print-directory manifests generate bundle catalog || stop
stage vet "$MAKE" --no-print-directory vet || stop
stage lint "$MAKE" --no-print-directory lint || stop
wait "$deps_pid" || stop

# The lanes: two, so that the machine is never loaded past what timing checks bear (an
# agent restart's gap under 1 s, a kube-apiserver starting): about three local clusters
# or the Go tests beside two clusters.
pids=()
{
	stage unit "$MAKE" --no-print-directory test-go
	stage fuzz "$MAKE" --no-print-directory test-fuzz
	stage bundle "$MAKE" --no-print-directory validate-bundle
	# The IPTables dataplane's pass: every other cluster runs the sample's Auto (nftables).
	stage conformance-ipv6 "$MAKE" --no-print-directory conformance-run CONFORMANCE_MODE=subset \
		CONFORMANCE_FAMILY=ipv6 CONFORMANCE_CLUSTER=conf6 CONFORMANCE_OUT=_output/conformance-ipv6 CONFORMANCE_DATAPLANE=IPTables
} &
pids+=($!)
{
	stage e2e "$MAKE" --no-print-directory e2e-run
	stage conformance-ipv4 "$MAKE" --no-print-directory conformance-run CONFORMANCE_MODE=subset \
		CONFORMANCE_FAMILY=ipv4 CONFORMANCE_STACK=dual CONFORMANCE_CLUSTER=conf4 CONFORMANCE_OUT=_output/conformance-ipv4
	stage cnp "$MAKE" --no-print-directory conformance-cnp-ci
	stage upstream "$MAKE" --no-print-directory conformance-upstream-ci
} &
pids+=($!)
for pid in "${pids[@]}"; do
	wait "$pid"
done
# summary (the EXIT trap) sets the exit status from the stages' results.
trap - EXIT
summary
