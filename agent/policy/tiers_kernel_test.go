package policy_test

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/agent/policy"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/trellis-net/trellis/internal/test/check"
)

func shopPods(app string) cnp.ClusterNetworkPolicySubject {
	return cnp.ClusterNetworkPolicySubject{Pods: &cnp.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}}
}

func fromApp(app string) []cnp.ClusterNetworkPolicyIngressPeer {
	return []cnp.ClusterNetworkPolicyIngressPeer{{Pods: &cnp.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}}}
}

func tcp(port int32) []cnp.ClusterNetworkPolicyProtocol {
	return []cnp.ClusterNetworkPolicyProtocol{{TCP: &cnp.ClusterNetworkPolicyProtocolTCP{DestinationPort: &cnp.Port{Number: port}}}}
}

// The tiers in a real kernel, for both iptables backends: an Admin Deny beats a
// NetworkPolicy allow, a Pass defers to it, a Baseline Deny applies where no
// NetworkPolicy isolates; the rules (a Pass's second chain, the node path) read back
// identical, so a second apply and a restarted agent's first apply write nothing; and
// an established connection a new Admin Deny denies stops.
func TestKernelClusterNetworkPolicyTiers(t *testing.T) {
	for _, dp := range dataplanes {
		backend := dp.backend
		t.Run(dp.name, func(t *testing.T) {
			n := newNode(t, backend, "web", "db", "cache")
			a := dp.applier()
			// db's NetworkPolicy admits web and cache on 7000 and 7001.
			dbPolicy := policyFor("db", map[string]string{"app": "db"}, []networkingv1.NetworkPolicyIngressRule{{}})
			cluster := []*cnp.ClusterNetworkPolicy{
				{ObjectMeta: metav1.ObjectMeta{Name: "admin", Generation: 1}, Spec: cnp.ClusterNetworkPolicySpec{
					Tier: cnp.AdminTier, Priority: 10, Subject: shopPods("db"),
					Ingress: []cnp.ClusterNetworkPolicyIngressRule{
						{Action: cnp.ClusterNetworkPolicyRuleActionPass, From: fromApp("web"), Protocols: tcp(7000)},
						{Action: cnp.ClusterNetworkPolicyRuleActionDeny, From: fromApp("web")},
					},
				}},
				{ObjectMeta: metav1.ObjectMeta{Name: "baseline", Generation: 1}, Spec: cnp.ClusterNetworkPolicySpec{
					Tier: cnp.BaselineTier, Priority: 10, Subject: shopPods("web"),
					Ingress: []cnp.ClusterNetworkPolicyIngressRule{{Action: cnp.ClusterNetworkPolicyRuleActionDeny, From: fromApp("cache")}},
					Egress: []cnp.ClusterNetworkPolicyEgressRule{{Action: cnp.ClusterNetworkPolicyRuleActionDeny,
						To: []cnp.ClusterNetworkPolicyEgressPeer{{Networks: []cnp.CIDR{"0.0.0.0/0"}}}, Protocols: tcp(7001)}},
				}},
			}
			st := n.state(dbPolicy)
			st.ClusterPolicies = cluster
			if !n.apply(a, st) {
				t.Fatal("the first apply wrote nothing")
			}
			for _, c := range []struct {
				from, to string
				port     int
				ok       bool
			}{
				{"web", "db", 7000, true},     // Admin Pass, then the NetworkPolicy allows
				{"web", "db", 7001, false},    // Admin Deny beats the NetworkPolicy's allow
				{"cache", "db", 7001, true},   // no Admin rule: the NetworkPolicy allows
				{"cache", "web", 7000, false}, // Baseline Deny: no NetworkPolicy isolates web
				{"db", "web", 7000, true},
				{"web", "cache", 7000, true}, {"web", "cache", 7001, false}, // Baseline egress Deny to 0.0.0.0/0 on 7001
			} {
				if err := n.dial(c.from, c.to, c.port); (err == nil) != c.ok {
					t.Errorf("%s -> %s:%d: %v, want allowed=%v\n%s", c.from, c.to, c.port, err, c.ok, dp.save(n, ipfamily.IPv4))
				}
			}
			before := dp.save(n, ipfamily.IPv4)
			if n.apply(a, st) {
				t.Error("a second apply of the same state wrote")
			}
			restarted := dp.applier()
			if n.apply(restarted, st) {
				t.Errorf("a restarted agent's first apply rewrote rules the kernel already held:\nbefore:\n%s\nafter:\n%s", before, dp.save(n, ipfamily.IPv4))
			}

			// An established cache -> db connection; an Admin Deny of cache ends it.
			var conn net.Conn
			check.Must(t, n.pods["cache"].ns.Do(func(ns.NetNS) error {
				var err error
				conn, err = net.DialTimeout("tcp", netip.AddrPortFrom(n.pods["db"].ip, 7000).String(), time.Second)
				return err
			}))
			defer conn.Close()
			cluster[0].Spec.Ingress = append(cluster[0].Spec.Ingress, cnp.ClusterNetworkPolicyIngressRule{Action: cnp.ClusterNetworkPolicyRuleActionDeny, From: fromApp("cache")})
			cluster[0].Generation++
			rs := netpol.Compile(st)
			check.Must(t, n.ns.Do(func(ns.NetNS) error {
				_, err := restarted.Apply(rs, true)
				return err
			}))
			if n.deleteDenied(st, rs) == 0 {
				t.Error("no conntrack entry removed for the connection the Admin Deny denies")
			}
			_ = conn.SetDeadline(time.Now().Add(700 * time.Millisecond))
			buf := make([]byte, 2)
			if _, err := conn.Write([]byte("x\n")); err == nil {
				if _, err := conn.Read(buf); err == nil {
					t.Error("the established connection still works after an Admin Deny")
				}
			}
			if err := n.dial("cache", "db", 7000); err == nil {
				t.Error("cache -> db:7000 allowed after the Admin Deny")
			}
		})
	}
}

// Cluster egress rules govern a pod's traffic to its own node (the INPUT path): an Admin
// Deny of the node's address stops it; under a NetworkPolicy default-deny egress the node
// stays reachable (NetworkPolicy's own-node exception, in its tier), and a conntrack
// clean-up doesn't cut the pod's established connection to its node.
func TestKernelClusterPolicyOwnNode(t *testing.T) {
	for _, dp := range dataplanes {
		backend := dp.backend
		t.Run(dp.name, func(t *testing.T) {
			n := newNode(t, backend, "web")
			nodeIP, otherIP := n.underlay(t)
			a := dp.applier()
			denyOut := policyFor("deny-out", map[string]string{"app": "web"}, nil)
			denyOut.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
			baseline := &cnp.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "baseline"}, Spec: cnp.ClusterNetworkPolicySpec{
				Tier: cnp.BaselineTier, Priority: 1, Subject: shopPods("web"),
				Egress: []cnp.ClusterNetworkPolicyEgressRule{{Action: cnp.ClusterNetworkPolicyRuleActionDeny,
					To: []cnp.ClusterNetworkPolicyEgressPeer{{Networks: []cnp.CIDR{cnp.CIDR(otherIP.String() + "/32")}}}}},
			}}
			st := n.state(denyOut)
			st.ClusterPolicies = []*cnp.ClusterNetworkPolicy{baseline}
			n.apply(a, st)
			conn, err := n.dialIn(t, "web", netip.AddrPortFrom(nodeIP, 7000))
			if err != nil {
				t.Fatalf("web under default-deny egress and cluster egress rules can't reach its own node %s: %v", nodeIP, err)
			}
			defer conn.Close()
			if removed := n.deleteDenied(st, netpol.Compile(st)); removed != 0 {
				t.Errorf("the conntrack clean-up removed %d entries: the connection to the node is allowed", removed)
			}
			// An Admin Deny of the node's own address.
			admin := &cnp.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "admin"}, Spec: cnp.ClusterNetworkPolicySpec{
				Tier: cnp.AdminTier, Priority: 1, Subject: shopPods("web"),
				Egress: []cnp.ClusterNetworkPolicyEgressRule{{Action: cnp.ClusterNetworkPolicyRuleActionDeny,
					To: []cnp.ClusterNetworkPolicyEgressPeer{{Networks: []cnp.CIDR{cnp.CIDR(nodeIP.String() + "/32")}}}}},
			}}
			st.ClusterPolicies = append(st.ClusterPolicies, admin)
			n.apply(a, st)
			if c, err := n.dialIn(t, "web", netip.AddrPortFrom(nodeIP, 7000)); err == nil {
				c.Close()
				t.Errorf("web reached its own node %s through an Admin Deny of its address", nodeIP)
			}
		})
	}
}

// A pod's connection to its own node that an Admin Deny now denies stays stopped once its
// conntrack entry is removed, even when the node speaks next: the node's segment (OUTPUT,
// where no policy chain looks) must not start a new tracked connection whose replies the
// pod's denied packets would then pass as.
func TestKernelOwnNodeConnectionNotPickedUpByTheNode(t *testing.T) {
	backend := netfilter.NFT
	n := newNode(t, backend, "web")
	nodeIP, _ := n.underlay(t)
	a := &policy.KernelApplier{Syncer: netfilter.Syncer{Backend: backend}}
	// A server on the node that speaks every 50 ms (a watch, a stream).
	var ln net.Listener
	check.Must(t, n.ns.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(nodeIP, 7100).String())
		return err
	}))
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		for range 200 {
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = c.Write([]byte("tick\n"))
			time.Sleep(50 * time.Millisecond) //nolint:forbidigo // pacing: a tick every 50 ms
		}
	}()
	st := n.state()
	st.ClusterPolicies = []*cnp.ClusterNetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "watch-allowed"}, Spec: cnp.ClusterNetworkPolicySpec{
		Tier: cnp.AdminTier, Priority: 1, Subject: shopPods("web"),
		Egress: []cnp.ClusterNetworkPolicyEgressRule{{Action: cnp.ClusterNetworkPolicyRuleActionDeny,
			To: []cnp.ClusterNetworkPolicyEgressPeer{{Networks: []cnp.CIDR{"192.0.2.0/24"}}}}},
	}}}
	n.apply(a, st)
	conn, err := n.dialIn(t, "web", netip.AddrPortFrom(nodeIP, 7100))
	if err != nil {
		t.Fatalf("web -> its node before the Deny: %v", err)
	}
	defer conn.Close()
	var mu sync.Mutex
	var last time.Time
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := conn.Read(buf); err != nil {
				return
			}
			mu.Lock()
			last = time.Now()
			mu.Unlock()
		}
	}()
	check.Eventually(t, 5*time.Second, "ticks from the node before the Deny", func() error {
		mu.Lock()
		defer mu.Unlock()
		if last.IsZero() {
			return errors.New("none yet")
		}
		return nil
	})
	st.ClusterPolicies[0].Spec.Egress[0].To[0].Networks = []cnp.CIDR{cnp.CIDR(nodeIP.String() + "/32")}
	n.apply(a, st)
	if n.deleteDenied(st, netpol.Compile(st)) == 0 {
		t.Fatal("no conntrack entry removed for the connection the Deny denies")
	}
	cleaned := time.Now()
	time.Sleep(1500 * time.Millisecond) //nolint:forbidigo // a window: the denied connection must carry no data in it
	mu.Lock()
	defer mu.Unlock()
	if last.After(cleaned.Add(200 * time.Millisecond)) {
		t.Errorf("the denied connection to the node still carried data %v after its tracking was removed: the node's segments picked it up again", last.Sub(cleaned))
	}
}
