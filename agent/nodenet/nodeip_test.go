package nodenet

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"

	agentconfig "github.com/trellis-net/trellis/agent/config"
	"github.com/trellis-net/trellis/test/netnstest"
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

	// "uplink" holds 203.0.113.5 and the default route; "underlay" holds 198.51.100.5.
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
	}{
		{"flag wins", &Reconciler{NodeIP: netip.MustParseAddr("198.51.100.9"), NodeIPInterface: "underlay"}, withInternal, true, "198.51.100.9", ""},
		{"configured interface over InternalIP", &Reconciler{NodeIPInterface: "underlay"}, withInternal, true, "198.51.100.5", ""},
		{"spec.agent.nodeIPInterface over InternalIP", &Reconciler{Config: &agentconfig.Config{NodeIPInterface: "underlay"}}, withInternal, true, "198.51.100.5", ""},
		{"--node-ip-interface over spec.agent.nodeIPInterface", &Reconciler{NodeIPInterface: "uplink", Config: &agentconfig.Config{NodeIPInterface: "underlay"}}, withInternal, true, "203.0.113.5", ""},
		{"missing spec.agent.nodeIPInterface", &Reconciler{Config: &agentconfig.Config{NodeIPInterface: "nope"}}, withInternal, true, "", "spec.agent.nodeIPInterface nope"},
		{"InternalIP over the default route", &Reconciler{}, withInternal, true, "198.51.100.7", ""},
		{"default route's interface", &Reconciler{}, bare, true, "203.0.113.5", ""},
		{"missing interface", &Reconciler{NodeIPInterface: "nope"}, withInternal, true, "", "--node-ip-interface nope"},
		{"nothing to go by", &Reconciler{}, bare, false, "", "no IPv4 InternalIP and there is no IPv4 default route"},
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
				got, err := tc.r.nodeIP(tc.node)
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
