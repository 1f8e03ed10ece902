package nodenet_test

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/trellis-net/trellis/agent/cniinstall"
	"github.com/trellis-net/trellis/agent/nodenet"
	"github.com/trellis-net/trellis/cni/plugin"
	"github.com/trellis-net/trellis/internal/agentconfig"
	"github.com/trellis-net/trellis/internal/cnicontract"
)

// The conflist the agent writes, read back the way a runtime reads it (libcni) and handed
// to the plugin's parser as a runtime hands it over: the plugin accepts it and sees exactly
// the block, MTU, ready file and IPAM directory the agent meant, and portmap is chained.
// A runtime that knows cniVersions (libcni 1.2+) takes the highest offered; one that
// doesn't (containerd 1.6's libcni) reads cniVersion, which stays one it knows.
func TestConflistRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		cniVersion string // --cni-version: the highest offered
		// wantNew and wantOld are the versions a runtime that knows cniVersions and one
		// that reads cniVersion only use.
		wantNew, wantOld string
		block            string
		// block6 is the node's IPv6 block ("" none); the plugin gets it unless policy is on.
		block6 string
		mtu    int
		policy agentconfig.NetworkPolicy
		// wantTimeout is the plugin's policy timeout; 0: no policy hook.
		wantTimeout time.Duration
	}{
		{"1.1.0", "1.1.0", "1.0.0", "10.244.1.0/24", "", 1450, agentconfig.NetworkPolicy{Enabled: true, SetupTimeout: "10s"}, 12 * time.Second}, // the default
		{"1.1.0", "1.1.0", "1.0.0", "10.0.128.0/17", "", 1500, agentconfig.NetworkPolicy{Enabled: true, SetupTimeout: "1m"}, 62 * time.Second},
		{"1.0.0", "1.0.0", "1.0.0", "172.16.9.252/30", "", 8950, agentconfig.NetworkPolicy{Enabled: false, SetupTimeout: "10s"}, 0}, // no STATUS/GC wanted
		{"0.4.0", "0.4.0", "0.4.0", "10.244.2.0/24", "", 1450, agentconfig.NetworkPolicy{Enabled: false, SetupTimeout: "10s"}, 0},
		// Dual-stack: pods get both families; with policy the IPv6 block stays out (the
		// plugin would refuse the conflist: policy is enforced for IPv4 only).
		{"1.1.0", "1.1.0", "1.0.0", "10.244.3.0/24", "fd00:10:244:3::/64", 1450, agentconfig.NetworkPolicy{Enabled: false, SetupTimeout: "10s"}, 0},
		{"1.1.0", "1.1.0", "1.0.0", "10.244.4.0/24", "fd00:10:244:4::/64", 1450, agentconfig.NetworkPolicy{Enabled: true, SetupTimeout: "10s"}, 12 * time.Second},
	} {
		r := &nodenet.Reconciler{
			CNIVersion: tc.cniVersion, ReadyFile: "/var/run/trellis/cni-ready",
			Config: &agentconfig.Config{PodCIDRs: []string{"10.0.0.0/8"}, NetworkPolicy: tc.policy},
		}
		block := netip.MustParsePrefix(tc.block)
		dir := t.TempDir()
		var block6 netip.Prefix
		wantBlocks := []netip.Prefix{block}
		if tc.block6 != "" {
			block6 = netip.MustParsePrefix(tc.block6)
			wantBlocks = append(wantBlocks, block6) // with or without policy: it covers IPv6
		}
		written, err := r.Conflist(block, block6, tc.mtu)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cniinstall.WriteConflist(dir, written); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, cniinstall.ConflistName)
		list, err := libcni.ConfListFromFile(path)
		if err != nil {
			t.Fatalf("libcni can't load the agent's conflist: %v", err)
		}
		if list.Name != cnicontract.NetworkName || list.CNIVersion != tc.wantNew || len(list.Plugins) != 2 {
			t.Fatalf("--cni-version %s: conflist %s %s with %d plugins, want %s %s with trellis and portmap",
				tc.cniVersion, list.Name, list.CNIVersion, len(list.Plugins), cnicontract.NetworkName, tc.wantNew)
		}
		if old := oldLibcniVersion(t, path); old != tc.wantOld {
			t.Errorf("--cni-version %s: a runtime reading cniVersion only gets %q, want %s", tc.cniVersion, old, tc.wantOld)
		}
		if typ := list.Plugins[1].Network.Type; typ != cnicontract.PortMapType || !list.Plugins[1].Network.Capabilities["portMappings"] {
			t.Errorf("second plugin %s with capabilities %v, want portmap with portMappings", typ, list.Plugins[1].Network.Capabilities)
		}
		// What the runtime puts on the plugin's stdin: the entry with name and cniVersion.
		stdin, err := libcni.InjectConf(list.Plugins[0], map[string]any{"name": list.Name, "cniVersion": list.CNIVersion})
		if err != nil {
			t.Fatal(err)
		}
		conf, err := plugin.Parse(stdin.Bytes)
		if err != nil {
			t.Fatalf("the plugin refuses the agent's conflist: %v\n%s", err, stdin.Bytes)
		}
		if conf.Type != cnicontract.PluginType || conf.Block() != block || conf.MTU != tc.mtu ||
			conf.ReadyFile != cnicontract.DefaultReadyFile || conf.DataDir != cnicontract.DefaultDataDir {
			t.Errorf("the plugin read type %s block %s MTU %d ready file %s data dir %s; the agent meant %s %s %d %s %s",
				conf.Type, conf.Block(), conf.MTU, conf.ReadyFile, conf.DataDir,
				cnicontract.PluginType, block, tc.mtu, cnicontract.DefaultReadyFile, cnicontract.DefaultDataDir)
		}
		if !slices.Equal(conf.Blocks(), wantBlocks) {
			t.Errorf("IPv6 block %q, policy %v: the plugin reads blocks %v, want %v", tc.block6, tc.policy.Enabled, conf.Blocks(), wantBlocks)
		}
		// networkPolicy.enabled decides whether ADD waits for the agent's policy hook;
		// networkPolicy.setupTimeout how long.
		switch p := conf.Policy; {
		case tc.wantTimeout == 0 && p != nil:
			t.Errorf("policy disabled, yet the plugin waits for the policy hook: %+v", p)
		case tc.wantTimeout != 0 && p == nil:
			t.Errorf("policy enabled, yet the plugin doesn't wait for the policy hook")
		case p != nil && (p.Socket != cnicontract.DefaultPolicySocket || p.FailurePolicy != cnicontract.FailurePolicyFail || conf.PolicyTimeout() != tc.wantTimeout):
			t.Errorf("policy hook %+v with timeout %v; want socket %s, failure policy Fail, timeout %v",
				p, conf.PolicyTimeout(), cnicontract.DefaultPolicySocket, tc.wantTimeout)
		}
		// The agent's IPAM garbage collector looks where the plugin keeps its store.
		if got, want := cnicontract.StoreDir(conf.DataDir, conf.Name), cnicontract.StoreDir(cnicontract.DefaultDataDir, cnicontract.NetworkName); got != want {
			t.Errorf("plugin store %s, agent GC looks at %s", got, want)
		}
		// The agent's CNI metrics listen where the plugin reports.
		if conf.ReportSocket != cnicontract.DefaultReportSocket {
			t.Errorf("plugin reports to %q, the agent listens on %s", conf.ReportSocket, cnicontract.DefaultReportSocket)
		}
	}
}

// oldLibcniVersion is the version a runtime whose libcni predates cniVersions (before 1.2,
// containerd 1.6) runs the conflist at: it reads the cniVersion key alone.
func oldLibcniVersion(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatalf("parsing %s: %v", path, err)
	}
	return conf.CNIVersion
}

// An unknown --cni-version never reaches the node: the conflist isn't built.
func TestConflistRefusesUnknownVersion(t *testing.T) {
	r := &nodenet.Reconciler{CNIVersion: "1.2.0", ReadyFile: "/var/run/trellis/cni-ready", Config: &agentconfig.Config{}}
	if _, err := r.Conflist(netip.MustParsePrefix("10.244.1.0/24"), netip.Prefix{}, 1450); err == nil || !strings.Contains(err.Error(), `"1.2.0"`) {
		t.Errorf("conflist for CNI version 1.2.0: error %v, want one naming it", err)
	}
}
