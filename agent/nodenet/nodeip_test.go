package nodenet

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/trellis-net/trellis/internal/agentconfig"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// The node IP comes from the flag, the configured interface, the Node's InternalIP or the
// default route's interface, in that order; read from real links in a namespace.
func TestNodeIP(t *testing.T) {
	netns := netnstest.New(t)
	withInternal := &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "node-a"},
		{Type: corev1.NodeInternalIP, Address: "198.51.100.7"},
	}}}
	bare := &corev1.Node{}
	bare.Name = "node-a"
	withInternal6 := withInternal.DeepCopy()
	withInternal6.Status.Addresses = append(withInternal6.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "2001:db8:7::7"})
	// An IPv4-mapped address is IPv4 (internal/ipfamily): this InternalIP was once neither
	// family's, and the default route's address was taken instead.
	withMapped := &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "::ffff:198.51.100.8"}}}}

	// "uplink" holds 203.0.113.5 and the default route; "underlay" holds 198.51.100.5 and
	// 2001:db8:5::5.
	setup := func(defaultRoute bool) error {
		for _, l := range []struct{ name, addr string }{{"uplink", "203.0.113.5/24"}, {"underlay", "198.51.100.5/24"}} {
			if _, err := netlink.LinkByName(l.name); err == nil {
				continue
			}
			la := netlink.NewLinkAttrs()
			la.Name = l.name
			// A veth pair (this kernel has no dummy links); the peer stays unused.
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: l.name + "-p"}); err != nil {
				return err
			}
			link, err := netlink.LinkByName(l.name)
			if err != nil {
				return err
			}
			a, _ := netlink.ParseAddr(l.addr)
			if err := netlink.AddrAdd(link, a); err != nil {
				return err
			}
			if l.name == "underlay" {
				a6, _ := netlink.ParseAddr("2001:db8:5::5/64")
				a6.Flags = unix.IFA_F_NODAD
				if err := netlink.AddrAdd(link, a6); err != nil {
					return err
				}
			}
			if err := netlink.LinkSetUp(link); err != nil {
				return err
			}
		}
		if !defaultRoute {
			return nil
		}
		uplink, err := netlink.LinkByName("uplink")
		if err != nil {
			return err
		}
		gw, _ := netlink.ParseAddr("203.0.113.1/32")
		return netlink.RouteReplace(&netlink.Route{LinkIndex: uplink.Attrs().Index, Gw: gw.IP})
	}
	cases := []struct {
		name         string
		r            *Reconciler
		node         *corev1.Node
		defaultRoute bool
		want, err    string
		v6only       bool // the node's one block is IPv6
	}{
		{"flag wins", &Reconciler{NodeIP: netip.MustParseAddr("198.51.100.9"), NodeIPInterface: "underlay"}, withInternal, true, "198.51.100.9", "", false},
		{"configured interface over InternalIP", &Reconciler{NodeIPInterface: "underlay"}, withInternal, true, "198.51.100.5", "", false},
		{"spec.agent.nodeIPInterface over InternalIP", &Reconciler{Config: &agentconfig.Config{NodeIPInterface: "underlay"}}, withInternal, true, "198.51.100.5", "", false},
		{"--node-ip-interface over spec.agent.nodeIPInterface", &Reconciler{NodeIPInterface: "uplink", Config: &agentconfig.Config{NodeIPInterface: "underlay"}}, withInternal, true, "203.0.113.5", "", false},
		{"missing spec.agent.nodeIPInterface", &Reconciler{Config: &agentconfig.Config{NodeIPInterface: "nope"}}, withInternal, true, "", "spec.agent.nodeIPInterface nope", false},
		{"InternalIP over the default route", &Reconciler{}, withInternal, true, "198.51.100.7", "", false},
		{"default route's interface", &Reconciler{}, bare, true, "203.0.113.5", "", false},
		{"missing interface", &Reconciler{NodeIPInterface: "nope"}, withInternal, true, "", "--node-ip-interface nope", false},
		{"nothing to go by", &Reconciler{}, bare, false, "", "no IPv4 InternalIP and there is no IPv4 default route", false},
		{"IPv6-only: the IPv6 InternalIP", &Reconciler{}, withInternal6, true, "2001:db8:7::7", "", true},
		{"IPv6-only: the configured interface's IPv6 address", &Reconciler{NodeIPInterface: "underlay"}, withInternal6, true, "2001:db8:5::5", "", true},
		{"IPv6-only: the configured interface's IPv4 address without an IPv6 one", &Reconciler{NodeIPInterface: "uplink"}, withInternal6, true, "203.0.113.5", "", true},
		{"IPv6-only without an IPv6 InternalIP: the IPv4 one", &Reconciler{}, withInternal, true, "198.51.100.7", "", true},
		{"dual-stack: the IPv4 InternalIP", &Reconciler{}, withInternal6, true, "198.51.100.7", "", false},
		{"an IPv4-mapped InternalIP is the IPv4 one", &Reconciler{}, withMapped, true, "198.51.100.8", "", false},
		{"IPv6-only: an IPv4-mapped InternalIP is no IPv6 one", &Reconciler{}, withMapped, true, "198.51.100.8", "", true},
		{"an IPv4-mapped flag is the IPv4 address", &Reconciler{NodeIP: netip.MustParseAddr("::ffff:198.51.100.9")}, withInternal, true, "198.51.100.9", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := netns.Do(func(ns.NetNS) error {
				if err := setup(tc.defaultRoute); err != nil {
					return err
				}
				if !tc.defaultRoute {
					routes, _ := netlink.RouteList(nil, netlink.FAMILY_V4)
					for _, rt := range routes {
						if rt.Dst == nil || rt.Dst.IP.IsUnspecified() {
							_ = netlink.RouteDel(&rt)
						}
					}
				}
				got, err := tc.r.nodeIP(tc.node, tc.v6only)
				switch {
				case tc.err != "":
					if err == nil || !strings.Contains(err.Error(), tc.err) {
						t.Errorf("error %v, want one saying %q", err, tc.err)
					}
				case err != nil:
					t.Errorf("unexpected error: %v", err)
				case got.String() != tc.want:
					t.Errorf("node IP %s, want %s", got, tc.want)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
