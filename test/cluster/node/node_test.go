package node

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestMountScript checks the node's mount plan: /run private, every host path bound to
// the node's directory, overlays (for host paths missing on this machine) before any
// bind, and the state directory never under an overlay.
func TestMountScript(t *testing.T) {
	dir := t.TempDir()
	c := Config{Name: "node1", NetNS: "trlc-t-node1", IP: netip.MustParseAddr("198.51.100.11"),
		Dir: filepath.Join(dir, "nodes", "node1"), LogDir: filepath.Join(dir, "logs"), StateDir: dir}
	script, err := c.mountScript()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(script), "\n")
	if lines[0] != "hostname node1" || !strings.Contains(script, "mount -t tmpfs -o mode=0755 trlc-run /run\n") {
		t.Errorf("script does not start with the hostname and a private /run:\n%s", script)
	}
	firstBind, lastOverlay := len(lines), -1
	for i, l := range lines {
		for _, target := range HostPaths {
			if strings.HasPrefix(l, "mount --bind ") && strings.HasSuffix(l, " "+target) {
				firstBind = min(firstBind, i)
			}
		}
		if strings.Contains(l, "-t overlay") {
			lastOverlay = i
		}
	}
	if lastOverlay > firstBind {
		t.Errorf("an overlay is mounted after a bind it would hide:\n%s", script)
	}
	for target, src := range c.hostDirs() {
		if !strings.Contains(script, "mount --bind "+src+" "+target+"\n") {
			t.Errorf("%s is not bound to %s:\n%s", target, src, script)
		}
		if _, err := os.Stat(target); err != nil {
			anc := filepath.Dir(target)
			for ; ; anc = filepath.Dir(anc) {
				if _, err := os.Stat(anc); err == nil {
					break
				}
			}
			if !strings.Contains(script, " "+anc+"\n") || !strings.Contains(script, "lowerdir="+anc+",") {
				t.Errorf("%s is missing here but %s gets no overlay:\n%s", target, anc, script)
			}
		}
	}
}

func TestStateDirUnderOverlayRefused(t *testing.T) {
	var missing string
	for _, p := range HostPaths {
		if _, err := os.Stat(p); err != nil {
			missing = p
		}
	}
	if missing == "" {
		t.Logf("every host path exists on this machine: no overlay to refuse")
		return
	}
	anc := filepath.Dir(missing)
	for ; ; anc = filepath.Dir(anc) {
		if _, err := os.Stat(anc); err == nil {
			break
		}
	}
	c := Config{Name: "node1", Dir: "/x/nodes/node1", LogDir: "/x/logs", StateDir: filepath.Join(anc, "state")}
	if _, err := c.mountScript(); err == nil || !strings.Contains(err.Error(), "--state-dir") {
		t.Errorf("state directory under the overlaid %s: err = %v", anc, err)
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"/a/b-c_d.e": "/a/b-c_d.e",
		"a b":        "'a b'",
		"it's":       `'it'\''s'`,
		"":           "''",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestValidateSocketLength(t *testing.T) {
	c := Config{Name: "n", Dir: "/" + strings.Repeat("d", 100)}
	if err := c.Validate(); err == nil {
		t.Error("a socket path beyond sun_path was accepted")
	}
}

// The kubelet watches the node's own static pod directory, which Prepare creates.
func TestStaticPodDir(t *testing.T) {
	dir := t.TempDir()
	c := Config{Name: "node1", Dir: filepath.Join(dir, "nodes", "node1"), LogDir: filepath.Join(dir, "logs"), StateDir: dir}
	if err := c.Prepare(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(c.StaticPodDir()); err != nil || !fi.IsDir() || !under(c.StaticPodDir(), c.Dir) {
		t.Errorf("static pod directory %s: %v (want a directory under the node's %s)", c.StaticPodDir(), err, c.Dir)
	}
	if want := "\nstaticPodPath: \"" + c.StaticPodDir() + "\"\n"; !strings.Contains(c.kubeletConfig(), want) {
		t.Errorf("kubelet configuration lacks %q:\n%s", want, c.kubeletConfig())
	}
}

// clusterDNS only when the cluster runs DNS; the node's resolv.conf never names a server.
func TestKubeletClusterDNS(t *testing.T) {
	var without, with struct {
		ClusterDNS    []string `json:"clusterDNS"`
		ClusterDomain string   `json:"clusterDomain"`
	}
	c := Config{Name: "node1", Dir: "/x/nodes/node1"}
	if err := yaml.Unmarshal([]byte(c.kubeletConfig()), &without); err != nil || len(without.ClusterDNS) != 0 {
		t.Errorf("without ClusterDNS: clusterDNS %v (%v)", without.ClusterDNS, err)
	}
	c.ClusterDNS = netip.MustParseAddr("10.96.0.10")
	if err := yaml.Unmarshal([]byte(c.kubeletConfig()), &with); err != nil || len(with.ClusterDNS) != 1 || with.ClusterDNS[0] != "10.96.0.10" || with.ClusterDomain != "cluster.local" {
		t.Errorf("with ClusterDNS: clusterDNS %v, clusterDomain %q (%v)\n%s", with.ClusterDNS, with.ClusterDomain, err, c.kubeletConfig())
	}
	for _, rc := range []string{Config{}.resolvConf(), c.resolvConf()} {
		if strings.Contains(rc, "nameserver") {
			t.Errorf("the node's resolv.conf names a server:\n%s", rc)
		}
	}
}

// The kubelet serves where the API server dials it, the Node's first InternalIP: its IPv4
// address, or its IPv6 one on an IPv6-only cluster (kubectl exec and logs need it).
func TestKubeletServingAddress(t *testing.T) {
	ip, ip6 := netip.MustParseAddr("198.51.100.11"), netip.MustParseAddr("2001:db8:100::11")
	for _, tc := range []struct {
		name    string
		c       Config
		want    netip.Addr
		nodeIPs string
	}{
		{"ipv4", Config{IP: ip}, ip, "198.51.100.11"},
		{"dual", Config{IP: ip, IP6: ip6}, ip, "198.51.100.11,2001:db8:100::11"},
		{"ipv6", Config{IP: ip, IP6: ip6, IPv6Only: true}, ip6, "2001:db8:100::11"},
	} {
		var got struct{ Address string }
		if err := yaml.Unmarshal([]byte(tc.c.kubeletConfig()), &got); err != nil || got.Address != tc.want.String() {
			t.Errorf("%s: kubelet address %q (%v), want %s", tc.name, got.Address, err, tc.want)
		}
		if got := tc.c.nodeIPs(); got != tc.nodeIPs {
			t.Errorf("%s: --node-ip %s, want %s", tc.name, got, tc.nodeIPs)
		}
	}
}
