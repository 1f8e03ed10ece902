package uninstall_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/trellis-net/trellis/agent/cniinstall"
	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/agent/uninstall"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// A node namespace with everything trellis programs and things of others beside it: the
// cleanup removes trellis's objects and leaves the others'.
func TestRunRemovesTrellisAndNothingElse(t *testing.T) {
	netnstest.RequireCommands(t, "iptables-restore", "ipset", "nft")
	node := netnstest.New(t)

	dir := t.TempDir()
	n := uninstall.Node{
		CNIBinDir: filepath.Join(dir, "bin"), CNIConfDir: filepath.Join(dir, "net.d"), ReadyFile: filepath.Join(dir, "run", "cni-ready"),
	}
	image := filepath.Join(dir, "image")
	for _, d := range []string{n.CNIBinDir, n.CNIConfDir, filepath.Dir(n.ReadyFile), image} {
		check.Must(t, os.MkdirAll(d, 0o755))
	}
	files := map[string]string{
		filepath.Join(image, "trellis"):  "trellis v2",
		filepath.Join(image, "portmap"):  "portmap v1.10.0",
		filepath.Join(image, "loopback"): "loopback v1.10.0",
		// On the node: trellis of an older version, portmap as install-cni put it, a
		// loopback someone upgraded since, another CNI's plugin and conflist.
		filepath.Join(n.CNIBinDir, "trellis"):                "trellis v1",
		filepath.Join(n.CNIBinDir, "portmap"):                "portmap v1.10.0",
		filepath.Join(n.CNIBinDir, "loopback"):               "loopback v1.11.0",
		filepath.Join(n.CNIBinDir, "bridge"):                 "bridge",
		filepath.Join(n.CNIConfDir, cniinstall.ConflistName): "{}",
		filepath.Join(n.CNIConfDir, "20-other.conflist"):     "{}",
		n.ReadyFile: "now",
	}
	for path, content := range files {
		check.Must(t, os.WriteFile(path, []byte(content), 0o755))
	}
	n.Plugins = []string{filepath.Join(image, "trellis"), filepath.Join(image, "portmap"), filepath.Join(image, "loopback")}

	foreignRoute := &net.IPNet{IP: net.IPv4(10, 99, 0, 0).To4(), Mask: net.CIDRMask(16, 32)}
	check.Must(t, node.Do(func(ns.NetNS) error {
		for _, name := range []string{"lo", "eth0", "other0"} {
			if name != "lo" {
				// (veth pairs: the kernel here has no dummy driver)
				if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
					return err
				}
			}
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		eth0, _ := netlink.LinkByName("eth0")
		a, _ := netlink.ParseAddr("198.51.100.31/24")
		if err := netlink.AddrAdd(eth0, a); err != nil {
			return err
		}
		if err := netlink.RouteAdd(&netlink.Route{Dst: foreignRoute, Gw: net.ParseIP("198.51.100.1"), LinkIndex: eth0.Attrs().Index}); err != nil {
			return err
		}
		// What the agent programs, and a future policy chain using a trellis ipset.
		peer := netip.MustParseAddr("198.51.100.32")
		st, err := datapath.Sync(datapath.Config{Mode: datapath.ModeHybrid, VNI: 1, Port: 4789,
			Local:    datapath.Local{NodeIP: netip.MustParseAddr("198.51.100.31"), PodCIDR: netip.MustParsePrefix("10.244.1.0/24")},
			PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
			Peers: []datapath.Peer{
				{Name: "near", NodeIP: peer, PodCIDR: netip.MustParsePrefix("10.244.2.0/24"), VTEPMAC: datapath.VTEPMACFor(peer)},
				{Name: "far", NodeIP: netip.MustParseAddr("203.0.113.33"), PodCIDR: netip.MustParsePrefix("10.244.3.0/24"), VTEPMAC: datapath.VTEPMACFor(netip.MustParseAddr("203.0.113.33"))},
			}})
		if err != nil {
			return err
		}
		if st.RoutesAdded != 2 {
			return fmt.Errorf("set-up: %d trellis routes, want 2", st.RoutesAdded)
		}
		var nf netfilter.Syncer
		if _, err := nf.Sync(context.Background(), datapath.Netfilter([]netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, true)); err != nil {
			return err
		}
		return run(
			"ipset create trellis-pods hash:ip", "ipset create other-set hash:ip",
			"iptables -t filter -N TRELLIS-POLICY",
			"iptables -t filter -A TRELLIS-POLICY -m set --match-set trellis-pods src -j ACCEPT",
			`iptables -t filter -A FORWARD -m comment --comment "trellis: \"policy\" dispatch" -j TRELLIS-POLICY`,
			"iptables -t nat -N OTHER-NAT",
			"iptables -t nat -A POSTROUTING -j OTHER-NAT",
			"iptables -t filter -A FORWARD -s 10.99.0.0/16 -j ACCEPT",
			// The nftables dataplane's policy tables, and a table of someone else's.
			"nft add table ip trellis-policy", "nft add table ip6 trellis-policy", "nft add table ip other-table",
		)
	}))

	var removed []string
	check.Must(t, node.Do(func(ns.NetNS) error {
		var err error
		removed, err = uninstall.Run(n)
		return err
	}))
	t.Logf("removed: %v", removed)

	check.Must(t, node.Do(func(ns.NetNS) error {
		if _, err := netlink.LinkByName(datapath.VXLANDevice); err == nil {
			t.Errorf("%s is still there", datapath.VXLANDevice)
		}
		if _, err := netlink.LinkByName("other0"); err != nil {
			t.Errorf("the foreign link other0 was removed: %v", err)
		}
		routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		var foreignLeft bool
		for _, r := range routes {
			if r.Protocol == datapath.RouteProtocol {
				t.Errorf("trellis route %s is still there", r.Dst)
			}
			foreignLeft = foreignLeft || r.Dst != nil && r.Dst.String() == foreignRoute.String()
		}
		if !foreignLeft {
			t.Error("the foreign route 10.99.0.0/16 was removed")
		}
		save, err := exec.Command("iptables-save").Output()
		if err != nil {
			return err
		}
		if strings.Contains(string(save), "TRELLIS-") || strings.Contains(string(save), "trellis") {
			t.Errorf("trellis rules left:\n%s", save)
		}
		for _, want := range []string{":OTHER-NAT", "-A POSTROUTING -j OTHER-NAT", "-A FORWARD -s 10.99.0.0/16 -j ACCEPT"} {
			if !strings.Contains(string(save), want) {
				t.Errorf("foreign rule %q was removed:\n%s", want, save)
			}
		}
		tables, err := exec.Command("nft", "list", "tables").Output()
		if err != nil {
			return err
		}
		if strings.Contains(string(tables), "trellis") || !strings.Contains(string(tables), "table ip other-table") {
			t.Errorf("nftables tables left:\n%s\nwant no trellis-* table, and the foreign table ip other-table", tables)
		}
		sets, err := exec.Command("ipset", "list", "-name").Output()
		if err != nil {
			return err
		}
		if got := strings.Fields(string(sets)); !slices.Equal(got, []string{"other-set"}) {
			t.Errorf("ipsets left %v, want only the foreign other-set", got)
		}
		return run("ipset destroy other-set")
	}))
	for path, gone := range map[string]bool{
		filepath.Join(n.CNIBinDir, "trellis"):                true,
		filepath.Join(n.CNIBinDir, "portmap"):                true,
		filepath.Join(n.CNIBinDir, "loopback"):               false, // not the one install-cni put there
		filepath.Join(n.CNIBinDir, "bridge"):                 false,
		filepath.Join(n.CNIConfDir, cniinstall.ConflistName): true,
		filepath.Join(n.CNIConfDir, "20-other.conflist"):     false,
		n.ReadyFile: true,
	} {
		if _, err := os.Stat(path); os.IsNotExist(err) != gone {
			t.Errorf("%s: removed %v, want %v", path, os.IsNotExist(err), gone)
		}
	}

	// Idempotent: a second run (the agent's cleanup after a manual one) finds nothing.
	check.Must(t, node.Do(func(ns.NetNS) error {
		again, err := uninstall.Run(n)
		if len(again) > 1 { // "trellis.vxlan and its routes" is reported either way
			t.Errorf("a second cleanup removed %v", again)
		}
		return err
	}))
}

// run runs shell-free commands, one per string (double-quoted arguments may hold spaces
// and \" escapes).
func run(cmds ...string) error {
	for _, c := range cmds {
		args := splitArgs(c)
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			return &cmdError{cmd: c, out: string(out), err: err}
		}
	}
	return nil
}

type cmdError struct {
	cmd, out string
	err      error
}

func (e *cmdError) Error() string { return e.cmd + ": " + e.err.Error() + ": " + e.out }

func splitArgs(s string) []string {
	var args []string
	var cur strings.Builder
	quoted, in := false, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case c == '"':
			quoted, in = !quoted, true
		case c == ' ' && !quoted:
			if in {
				args, in = append(args, cur.String()), false
				cur.Reset()
			}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if in {
		args = append(args, cur.String())
	}
	return args
}

// trellis's IPAM store goes with trellis once no pod holds an address in it; while one
// does, the store stays (it is what says the address is taken), and other networks'
// state under the data directory always stays.
func TestRunRemovesUnusedIPAMStore(t *testing.T) {
	netnstest.RequireCommands(t, "iptables-restore", "ipset")
	for _, tc := range []struct {
		name string
		// files under the data directory, relative to it.
		files map[string]string
		// gone: which of them (or directories) the cleanup removes.
		gone map[string]bool
	}{
		{name: "no address allocated",
			files: map[string]string{"trellis/lock": "", "trellis/last_reserved_ip": "10.244.1.9"},
			gone:  map[string]bool{"trellis": true, ".": true}},
		{name: "a pod still holds an address",
			files: map[string]string{"trellis/lock": "", "trellis/10.244.1.5": "c1\neth0\nuid-1"},
			gone:  map[string]bool{"trellis/10.244.1.5": false, ".": false}},
		{name: "another network's state beside",
			files: map[string]string{"trellis/lock": "", "other/10.88.0.5": "c1\neth0\nuid-1"},
			gone:  map[string]bool{"trellis": true, "other/10.88.0.5": false}},
		{name: "no store", files: map[string]string{"other/lock": ""}, gone: map[string]bool{"other/lock": false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := netnstest.New(t)
			dir := t.TempDir()
			n := uninstall.Node{CNIBinDir: filepath.Join(dir, "bin"), CNIConfDir: filepath.Join(dir, "net.d"),
				ReadyFile: filepath.Join(dir, "run", "cni-ready"), DataDir: filepath.Join(dir, "lib", "cni", "trellis")}
			for rel, content := range tc.files {
				p := filepath.Join(n.DataDir, rel)
				check.Must(t, os.MkdirAll(filepath.Dir(p), 0o755))
				check.Must(t, os.WriteFile(p, []byte(content), 0o600))
			}
			var removed []string
			check.Must(t, node.Do(func(ns.NetNS) error {
				var err error
				removed, err = uninstall.Run(n)
				return err
			}))
			for rel, wantGone := range tc.gone {
				_, err := os.Stat(filepath.Join(n.DataDir, rel))
				if gone := os.IsNotExist(err); gone != wantGone {
					t.Errorf("%s: gone %v, want %v (removed %v)", rel, gone, wantGone, removed)
				}
			}
			store := filepath.Join(n.DataDir, "trellis")
			if reported := slices.Contains(removed, store); reported != (tc.gone["trellis"]) {
				t.Errorf("removed %v: reports the store %v, want %v", removed, reported, tc.gone["trellis"])
			}
		})
	}
}
