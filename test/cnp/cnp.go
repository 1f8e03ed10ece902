// Package cnp runs the upstream ClusterNetworkPolicy conformance suite
// (sigs.k8s.io/network-policy-api/conformance, the version of go.mod) against a local
// cluster with Trellis installed: `make conformance-cnp` (hack/conformance-cnp.sh).
//
// The suite reads its base and per-test manifests from an embed.FS. The runner copies the
// module's conformance/base into base/ here (gitignored), applies base-no-sctp.patch (the
// base without its SCTP servers: this kernel has no SCTP) and runs the test of
// cnp_test.go, behind the build tag cnp so that `go vet ./...` and `go test ./...` don't
// need the generated directory. patch_test.go (no tag, no cluster) checks the patch still
// applies and removes only the porter/SCTP containers.
package cnp

// BasePatch is the patch (in this directory) the runner applies to a copy of the suite's
// base/manifests.yaml, with patch -p1 --fuzz=0 in the directory holding base/.
const BasePatch = "base-no-sctp.patch"

// NoKernelSCTPTests are the suite's tests that open SCTP connections and nothing else:
// this kernel has no SCTP (CONFIG_IP_SCTP unset, socket(..., IPPROTO_SCTP) fails with
// EPROTONOSUPPORT), so they are skipped with the suite's SkipTests option. SCTP pokes in
// other tests run and are judged by test/cmd/cnpsum.
var NoKernelSCTPTests = []string{
	"CNPAdminTierEgressSCTP",
	"CNPAdminTierIngressSCTP",
	"CNPBaselineTierEgressSCTP",
	"CNPBaselineTierIngressSCTP",
}
