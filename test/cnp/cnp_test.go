//go:build cnp

package cnp

import (
	"embed"
	"flag"
	"os"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	api "sigs.k8s.io/network-policy-api/apis/v1beta1"
	confv1a1 "sigs.k8s.io/network-policy-api/conformance/apis/v1alpha1"
	"sigs.k8s.io/network-policy-api/conformance/tests"
	"sigs.k8s.io/network-policy-api/conformance/utils/suite"
)

// manifests is the suite's base/ (its base/manifests.yaml and the per-test policies),
// copied from the module by hack/conformance-cnp.sh with base-no-sctp.patch applied: the
// suite reads both the base and each test's manifests from Options.FS.
//
//go:embed base/*
var manifests embed.FS

// HarnessFailure prefixes every failure of this file's own (not the suite's), so the
// verdict (test/cmd/cnpsum) tells them from the suite's.
const HarnessFailure = "cnp-harness:"

var (
	reportOutput = flag.String("cnp.report", "", "write the suite's ConformanceReport (YAML) here")
	skipTests    = flag.String("cnp.skip", strings.Join(NoKernelSCTPTests, ","),
		"comma-separated ShortNames the suite skips (its SkipTests option)")
	features = flag.String("cnp.features", strings.Join([]string{
		string(suite.SupportClusterNetworkPolicy),
		string(suite.SupportClusterNetworkPolicyNamedPorts),
		string(suite.SupportClusterNetworkPolicyEgressNodePeers),
	}, ","), "comma-separated supported features (the standard profile's and experimental ones)")
	version = flag.String("cnp.version", "v0.0.0-dev", "the Trellis version the report names (hack/conformance-cnp.sh passes TRELLIS_VERSION of hack/versions.env)")
	info    = flag.String("cnp.info", "make conformance-cnp (hack/conformance-cnp.sh): a local 3-node cluster with Trellis installed from config/",
		"the report's additionalInformation: how it was made")
	debug   = flag.Bool("cnp.debug", false, "the suite's Debug option")
	cleanup = flag.Bool("cnp.cleanup", true, "the suite's CleanupBaseResources option")
)

// TestClusterNetworkPolicyConformance runs the upstream ClusterNetworkPolicy conformance
// suite as its conformance_profile_test.go does: the ClusterNetworkPolicy profile with the
// experimental features NamedPorts and EgressNodePeers, the cluster of $KUBECONFIG.
func TestClusterNetworkPolicyConformance(t *testing.T) {
	kubeconfig := os.Getenv("KUBECONFIG")
	if kubeconfig == "" {
		t.Fatalf("%s KUBECONFIG is not set (hack/conformance-cnp.sh sets it)", HarnessFailure)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("%s %v", HarnessFailure, err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatalf("%s %v", HarnessFailure, err)
	}
	clientSet, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("%s %v", HarnessFailure, err)
	}
	if err := api.Install(c.Scheme()); err != nil {
		t.Fatalf("%s %v", HarnessFailure, err)
	}
	if err := apiextensionsv1.AddToScheme(c.Scheme()); err != nil {
		t.Fatalf("%s %v", HarnessFailure, err)
	}

	var skip []string
	if *skipTests != "" {
		skip = strings.Split(*skipTests, ",")
	}
	cSuite, err := suite.NewConformanceProfileTestSuite(suite.ConformanceProfileOptions{
		Options: suite.Options{
			Client:               c,
			ClientSet:            clientSet,
			KubeConfig:           *cfg,
			Debug:                *debug,
			CleanupBaseResources: *cleanup,
			SupportedFeatures:    suite.ParseSupportedFeatures(*features),
			SkipTests:            skip,
			FS:                   &manifests,
		},
		Implementation: confv1a1.Implementation{
			Organization:          "trellis-net",
			Project:               "trellis",
			URL:                   "https://github.com/trellis-net/trellis",
			Version:               *version,
			Contact:               []string{"https://github.com/trellis-net/trellis/issues"},
			AdditionalInformation: *info,
		},
		ConformanceProfiles: suite.ParseConformanceProfiles(string(suite.CNPConformanceProfileName)),
	})
	if err != nil {
		t.Fatalf("%s creating the conformance profile suite: %v", HarnessFailure, err)
	}

	cSuite.Setup(t)
	// Only Setup has failed this test so far (no subtest has run): the base is not ready.
	if t.Failed() {
		t.Fatalf("%s Setup failed: the base manifests' StatefulSets are not Ready", HarnessFailure)
	}
	if err := cSuite.Run(t, tests.ConformanceTests); err != nil {
		t.Fatalf("%s %v", HarnessFailure, err)
	}
	report, err := cSuite.Report()
	if err != nil {
		t.Fatalf("%s generating the conformance report: %v", HarnessFailure, err)
	}
	raw, err := yaml.Marshal(report)
	if err != nil {
		t.Fatalf("%s %v", HarnessFailure, err)
	}
	if *reportOutput != "" {
		if err := os.WriteFile(*reportOutput, raw, 0o644); err != nil {
			t.Fatalf("%s writing the report: %v", HarnessFailure, err)
		}
	}
	t.Logf("Conformance report:\n%s", raw)
}
