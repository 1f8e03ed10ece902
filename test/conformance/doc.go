// Package conformance judges Trellis's NetworkPolicy enforcement with an oracle nobody
// here wrote: github.com/mattfenwick/cyclonus v0.5.6. Its whole runner
// (connectivity.Interpreter) drives a local multi-node cluster (test/cluster): it creates
// namespaces x, y, z with pods a, b, c (TCP and UDP servers on ports 80 and 81, spread
// over the nodes), applies every policy its generator produces, probes every pod pair and
// port, and compares what the cluster did with what its policy model (pkg/matcher) says
// Kubernetes must do.
//
// The harness's part: Kube implements cyclonus's kube.IKubernetes with cyclonus's real
// client pointed at the cluster, except that a probe (`/agnhost connect IP:PORT
// --timeout=1s --protocol=tcp|udp`, which cyclonus would exec in the pod) runs in this
// process on a thread that joined the source pod's network namespace (found through the
// pod's cgroup), with agnhost's semantics. Probes go to pod IPs (cyclonus's pod-IP mode);
// loopback (a pod probing itself) is not judged, as upstream Kubernetes does not; the
// policies the oracle evaluates are the ones the API server returned (defaulted). Where
// the oracle is known to differ from Kubernetes the harness says so next to the verdict
// (divergence.go) and never turns a failure into a pass.
//
// Both families: the cluster is dual-stack (every pod has an IPv4 and an IPv6 address)
// and a run makes a pass per family on the same pods. In a pass, Kube shows cyclonus each
// pod's address of that family as its status.podIP (the one address cyclonus knows a pod
// by), so cyclonus probes those addresses and its generator and oracle work in that
// family unchanged: the ipBlock cases are pod z/c's /24 with its /28 excepted over IPv4,
// its /120 with its /124 excepted over IPv6 (cyclonus clears 8 and 4 bits whatever the
// family; the harness lays the pods out so that each family's block and except split
// them), and the conflict cases' fixed 0.0.0.0/0 and 0.0.0.0/31 allow no IPv6 address, as
// Kubernetes says. `kubectl trellis explain` is held to the probes of both passes.
//
// Cases: Generate lists the generator's 230 cases under stable keys; the fixed Subset
// (every tag the generator emits, checked by TestSubsetCoversEveryTag) is what CI runs
// over IPv4, SubsetIPv6 (27 of them, every tag again) over IPv6.
//
// The runner is the Go test TestNetworkPolicyConformance behind the build tag
// `conformance` (like test/e2e's `e2e`): `make conformance` (every case) and `make
// conformance-subset`. It needs root and what `make deps` and hack/build-agnhost.sh
// build. Environment:
//   - TRELLIS_CONFORMANCE: subset (default) or all;
//   - TRELLIS_CONFORMANCE_FAMILY: dual (default: an IPv4 pass, then an IPv6 pass, on a
//     dual-stack cluster), ipv4 (the IPv4 pass on an IPv4-only cluster, as before IPv6)
//     or ipv6 (the IPv6 pass on a dual-stack cluster); ipv4 with the reference CNI;
//   - TRELLIS_CONFORMANCE_CNI: trellis (default) or reference (ptp + host-local, which
//     enforces nothing: a run against it shows what failures look like);
//   - TRELLIS_CONFORMANCE_JUNIT: the JUnit XML file (default
//     $TMPDIR/trellis-conformance/junit.xml); report.txt (per-case details) and
//     cyclonus.log (cyclonus's own log) are written next to it;
//   - TRELLIS_CONFORMANCE_WAIT: seconds between a step's changes and its probes (default 1);
//     TRELLIS_CONFORMANCE_RETRIES: probe rounds repeated when a step differs (default 1);
//   - TRELLIS_CONFORMANCE_STACK: the cluster's families, dual or ipv4 (default: dual unless
//     the family is ipv4); make test runs FAMILY=ipv4 STACK=dual and FAMILY=ipv6 at once;
//   - TRELLIS_CONFORMANCE_CLUSTER: the local cluster's name (default conf), so that two
//     runs can go on at once;
//   - TRELLIS_CONFORMANCE_DATAPLANE: the ClusterNetwork's spec.dataplane (Auto, NFTables or
//     IPTables; default: the sample's);
//   - TRELLIS_CLUSTER_REUSE=1: reuse (and leave running) the cluster of that name.
package conformance
