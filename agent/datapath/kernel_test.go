package datapath_test

import (
	"errors"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/internal/test/check"
)

func writeProc(n ns.NetNS, values map[string]string) error {
	return n.Do(func(ns.NetNS) error {
		for path, v := range values {
			if err := os.WriteFile("/proc/sys/"+path, []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
}

func readProc(t *testing.T, n ns.NetNS, path string) string {
	t.Helper()
	var v string
	check.Must(t, n.Do(func(ns.NetNS) error {
		b, err := os.ReadFile("/proc/sys/" + path)
		v = string(b)
		return err
	}))
	return v[:len(v)-1]
}

// The agent turns forwarding on and rp_filter loose on the devices it owns, whatever the
// distribution's defaults, and reports the values in effect.
func TestKernelSettings(t *testing.T) {
	topo := newTopology(t)
	node1 := topo.nodes[0]
	topo.syncAll(datapath.ModeVXLAN)
	// Strict defaults, forwarding off, and a veth from a plugin that didn't set rp_filter.
	check.Must(t, writeProc(node1.ns, map[string]string{
		"net/ipv4/ip_forward":                   "0",
		"net/ipv4/conf/all/rp_filter":           "1",
		"net/ipv4/conf/trellis.vxlan/rp_filter": "1",
		"net/ipv4/conf/trlpod1/rp_filter":       "0",
	}))
	st := topo.sync(0, datapath.ModeVXLAN, 1, 2)
	want := map[string]string{
		datapath.SysctlIPForward:   "1",
		datapath.VXLANRPFilter:     "2",
		datapath.VethRPFilter:      "2",
		datapath.SysctlAllRPFilter: "1", // reported, not changed
	}
	if !maps.Equal(st.Sysctls, want) {
		t.Errorf("reported sysctls %v, want %v", st.Sysctls, want)
	}
	for path, v := range map[string]string{
		"net/ipv4/ip_forward":                   "1",
		"net/ipv4/conf/trellis.vxlan/rp_filter": "2",
		"net/ipv4/conf/trlpod1/rp_filter":       "2",
		"net/ipv4/conf/all/rp_filter":           "1",
	} {
		if got := readProc(t, node1.ns, path); got != v {
			t.Errorf("node1 %s = %s, want %s", path, got, v)
		}
	}

	// Why loose: node1 on Direct already, node2 still on VXLAN (a live switch). node2's
	// packets reach node1 through trellis.vxlan while node1 routes node2's block via eth0;
	// a strict rp_filter there would drop them.
	topo.sync(0, datapath.ModeDirect, 1, 2)
	for _, p := range [][2]int{{0, 1}, {1, 0}} {
		if _, err := topo.reach(p[0], p[1]); err != nil {
			t.Errorf("with a strict conf.all.rp_filter on node1: %s -> %s: %v", topo.nodes[p[0]].name, topo.nodes[p[1]].name, err)
		}
	}
}

// A setting the kernel refuses fails the sync with an error naming the sysctl, after the
// routes are programmed, and the other settings are still applied.
func TestKernelSettingRefused(t *testing.T) {
	topo := newTopology(t)
	procSys := t.TempDir()
	// ip_forward as a directory: writing it fails as a read-only /proc/sys would.
	check.Must(t, os.MkdirAll(filepath.Join(procSys, "net/ipv4/ip_forward"), 0o755))
	vxlanRP := filepath.Join(procSys, "net/ipv4/conf/trellis.vxlan/rp_filter")
	check.Must(t, os.MkdirAll(filepath.Dir(vxlanRP), 0o755))
	check.Must(t, os.WriteFile(vxlanRP, []byte("1\n"), 0o644))
	n := topo.nodes[0]
	cfg := datapath.Config{Mode: datapath.ModeVXLAN, VNI: 1, Port: 4789, ProcSys: procSys,
		Local: datapath.Local{NodeIP: n.ip, PodCIDR: n.block}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		Peers: []datapath.Peer{{Name: "node2", NodeIP: topo.nodes[1].ip, PodCIDR: topo.nodes[1].block, VTEPMAC: datapath.VTEPMACFor(topo.nodes[1].ip)}}}
	var st *datapath.Status
	err := n.ns.Do(func(ns.NetNS) error {
		var err error
		st, err = datapath.Sync(cfg)
		return err
	})
	var se *datapath.SysctlError
	if !errors.As(err, &se) || se.Name != datapath.SysctlIPForward || se.Value != "1" {
		t.Fatalf("Sync error %v, want a SysctlError for %s", err, datapath.SysctlIPForward)
	}
	if st == nil || st.RoutesAdded != 1 {
		t.Errorf("routes not programmed before the settings: %+v", st)
	}
	if b, _ := os.ReadFile(vxlanRP); string(b) != "2" {
		t.Errorf("trellis.vxlan rp_filter %q, want 2 although ip_forward failed", b)
	}
}

// TX checksum offload on trellis.vxlan follows what the agent decided (agent/offload),
// both ways.
func TestChecksumOffload(t *testing.T) {
	topo := newTopology(t)
	n := topo.nodes[0]
	txcsum := func() bool {
		t.Helper()
		var on bool
		check.Must(t, n.ns.Do(func(ns.NetNS) error {
			var err error
			on, err = datapath.TXChecksum(datapath.VXLANDevice)
			return err
		}))
		return on
	}
	for _, step := range []struct {
		offload bool
		want    bool
	}{
		{false, false}, // a fresh device has it on: turned off (Disabled, or Auto after a failed self-test)
		{false, false}, // idempotent
		{true, true},   // Enabled, or Auto
		{false, false}, // and back
	} {
		topo.tweak = func(c *datapath.Config) { c.ChecksumOffload = step.offload }
		st := topo.sync(0, datapath.ModeVXLAN, 1)
		if got := txcsum(); got != step.want || st.TXChecksumOffload != step.want {
			t.Errorf("checksumOffload %v: TX checksum offload on the device %v, reported %v; want %v", step.offload, got, st.TXChecksumOffload, step.want)
		}
		check.Must(t, n.ns.Do(func(ns.NetNS) error {
			changed, err := datapath.SetTXChecksum(datapath.VXLANDevice, step.want)
			if changed {
				t.Errorf("checksumOffload %v: setting it again changed the device", step.offload)
			}
			return err
		}))
	}
	// Traffic still flows with the checksum computed in software.
	topo.tweak = nil
	topo.syncAll(datapath.ModeVXLAN)
	if _, err := topo.reach(0, 1); err != nil {
		t.Errorf("pod on node1 -> pod on node2 with TX checksum offload off: %v", err)
	}
}
