package cni_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/trellis-net/trellis/cni/plugin"
	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

func TestSpecVersions(t *testing.T) {
	for _, v := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			n := newNode(t, nodeOpts{version: v})
			a, b := n.newPod("a"), n.newPod("b")
			ra, raw := n.mustAdd(a)
			if raw.Version() != v {
				t.Errorf("result version %s, want %s", raw.Version(), v)
			}
			rb, _ := n.mustAdd(b)
			ipA, ipB := podIP(t, ra), podIP(t, rb)
			for _, ip := range []netip.Addr{ipA, ipB} {
				if !n.block.Contains(ip) || ip == n.block.Addr() || ip == n.block.Addr().Next() || ip.As4()[3] == 255 {
					t.Errorf("pod IP %s is not a usable address of block %s", ip, n.block)
				}
			}
			if ipA == ipB {
				t.Fatalf("both pods got %s", ipA)
			}
			if ones, _ := ra.IPs[0].Address.Mask.Size(); ones != 32 || !ra.IPs[0].Gateway.Equal(veth.GatewayIP) {
				t.Errorf("result IP %v gateway %v, want /32 via %s", ra.IPs[0].Address, ra.IPs[0].Gateway, veth.GatewayIP)
			}

			serve(t, b.ns, ipB.String())
			serve(t, a.ns, ipA.String())
			if got, err := dial(a.ns, ipB.String()); err != nil || got != fmt.Sprintf("hello from %s to %s", ipB, ipA) {
				t.Errorf("pod a -> pod b: %q, %v (want the source address preserved)", got, err)
			}
			if got, err := dial(n.ns, ipA.String()); err != nil || got != fmt.Sprintf("hello from %s to %s", ipA, nodeIP) {
				t.Errorf("node -> pod a: %q, %v", got, err)
			}
			// pod -> node: the node answers on its underlay address.
			serve(t, n.ns, nodeIP)
			if got, err := dial(b.ns, nodeIP); err != nil || !strings.HasSuffix(got, "to "+ipB.String()) {
				t.Errorf("pod b -> node: %q, %v", got, err)
			}
			assertPodMTU(t, a.ns, 1450)

			if err := n.check(a); v == "0.3.1" {
				if err == nil || !strings.Contains(err.Error(), "does not support the CHECK command") {
					t.Errorf("CHECK at 0.3.1: want libcni's refusal, got %v", err)
				}
			} else if err != nil {
				t.Errorf("CHECK after ADD: %v", err)
			}
			for _, p := range []*pod{a, b} {
				if err := n.del(p, true); err != nil {
					t.Fatalf("DEL %s: %v", p.name, err)
				}
				if err := n.del(p, false); err != nil {
					t.Fatalf("second DEL (no netns) %s: %v", p.name, err)
				}
			}
			n.assertClean()
		})
	}
}

func assertPodMTU(t *testing.T, podNS ns.NetNS, want int) {
	t.Helper()
	_ = podNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Errorf("pod eth0: %v", err)
			return nil
		}
		if l.Attrs().MTU != want {
			t.Errorf("pod eth0 MTU %d, want %d", l.Attrs().MTU, want)
		}
		return nil
	})
}

func TestDelAfterPodNamespaceIsGone(t *testing.T) {
	n := newNode(t, nodeOpts{})
	p := n.newPod("gone")
	n.mustAdd(p)
	// The runtime tears the sandbox down before its last DEL: no netns, no prevResult.
	if err := netnstest.Remove(p.ns); err != nil {
		t.Fatal(err)
	}
	if err := n.del(p, false); err != nil {
		t.Fatalf("DEL without a netns: %v", err)
	}
	if err := n.del(p, false); err != nil {
		t.Fatalf("second DEL: %v", err)
	}
	n.assertClean()
}

func TestCheckReportsDifferences(t *testing.T) {
	n := newNode(t, nodeOpts{})
	p := n.newPod("checked")
	r, _ := n.mustAdd(p)
	ip := podIP(t, r)
	if err := n.check(p); err != nil {
		t.Fatalf("CHECK on an intact pod: %v", err)
	}
	// Break the pod side: the permanent neighbour entry for the gateway.
	err := p.ns.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.NeighDel(&netlink.Neigh{LinkIndex: l.Attrs().Index, IP: veth.GatewayIP, Family: netlink.FAMILY_V4})
	})
	if err != nil {
		t.Fatalf("breaking the neighbour entry: %v", err)
	}
	// And the host side: the /32 route.
	err = n.in(func() error {
		return netlink.RouteDel(&netlink.Route{Dst: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_NOWHERE})
	})
	if err != nil {
		t.Fatalf("breaking the host route: %v", err)
	}
	err = n.check(p)
	if err == nil {
		t.Fatal("CHECK passed with the neighbour entry and host route gone")
	}
	for _, want := range []string{"neighbour 169.254.1.1", "host route " + ip.String() + "/32"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("CHECK error does not say %q: %v", want, err)
		}
	}
	if err := n.del(p, true); err != nil {
		t.Fatal(err)
	}
	n.assertClean()
}

func TestStatusFollowsAgentReadiness(t *testing.T) {
	n := newNode(t, nodeOpts{})
	err := n.status()
	var cniErr *types.Error
	if err == nil || !asCNIError(err, &cniErr) || cniErr.Code != types.ErrPluginNotAvailable || !strings.Contains(cniErr.Msg, "not marked") {
		t.Fatalf("STATUS before the agent is ready: want code 50 with a reason, got %#v", err)
	}
	if err := os.WriteFile(n.readyFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := n.status(); err != nil {
		t.Fatalf("STATUS once ready: %v", err)
	}
}

func asCNIError(err error, target **types.Error) bool {
	return errors.As(err, target)
}

func TestGCReleasesInvalidAttachments(t *testing.T) {
	n := newNode(t, nodeOpts{})
	keep, drop1, drop2 := n.newPod("keep"), n.newPod("drop1"), n.newPod("drop2")
	for _, p := range []*pod{keep, drop1, drop2} {
		n.mustAdd(p)
	}
	if err := n.gc(keep); err != nil {
		t.Fatalf("GC: %v", err)
	}
	links, _ := n.hostState()
	if a := n.allocations(); len(a) != 1 || len(links) != 1 || links[0] != veth.HostName(keep.id, "eth0") {
		t.Fatalf("after GC: allocations %v, veths %v; want only the kept pod's", a, links)
	}
	if err := n.check(keep); err != nil {
		t.Errorf("the kept pod was damaged by GC: %v", err)
	}
	if err := n.gc(); err != nil {
		t.Fatal(err)
	}
	n.assertClean()
}

func TestParallelAdds(t *testing.T) {
	const pods = 100
	n := newNode(t, nodeOpts{block: "10.244.0.0/24"})
	ps := make([]*pod, pods)
	for i := range ps {
		ps[i] = n.newPod(fmt.Sprintf("p%03d", i))
	}
	ips := make([]netip.Addr, pods)
	var wg sync.WaitGroup
	errs := make(chan error, pods)
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := n.add(context.Background(), p)
			if err != nil {
				errs <- fmt.Errorf("ADD %s: %w", p.name, err)
				return
			}
			cur, err := current.NewResultFromResult(res)
			if err != nil {
				errs <- err
				return
			}
			ips[i], _ = netip.AddrFromSlice(cur.IPs[0].Address.IP.To4())
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	seen := map[netip.Addr]string{}
	for i, ip := range ips {
		if other, dup := seen[ip]; dup {
			t.Fatalf("%s and %s both got %s", other, ps[i].name, ip)
		}
		seen[ip] = ps[i].name
	}
	if got := len(n.allocations()); got != pods {
		t.Fatalf("%d allocations for %d pods", got, pods)
	}
	links, routes := n.hostState()
	if len(links) != pods || len(routes) != pods {
		t.Fatalf("%d host veths and %d routes for %d pods", len(links), len(routes), pods)
	}
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.del(p, true); err != nil {
				t.Errorf("DEL %s: %v", p.name, err)
			}
		}()
	}
	wg.Wait()
	n.assertClean()
}

func TestRoundRobinAndExhaustion(t *testing.T) {
	n := newNode(t, nodeOpts{block: "10.244.9.0/29"}) // usable: .2 to .6
	var got []string
	var live []*pod
	for i := 0; i < 5; i++ {
		p := n.newPod(fmt.Sprintf("r%d", i))
		r, _ := n.mustAdd(p)
		got = append(got, podIP(t, r).String())
		live = append(live, p)
	}
	if want := "[10.244.9.2 10.244.9.3 10.244.9.4 10.244.9.5 10.244.9.6]"; fmt.Sprint(got) != want {
		t.Fatalf("allocation order %v, want %s", got, want)
	}
	full := n.newPod("full")
	_, err := n.add(context.Background(), full)
	if err == nil || !strings.Contains(err.Error(), "10.244.9.0/29 is full") {
		t.Fatalf("ADD on a full block: want an error naming the block, got %v", err)
	}
	n.assertNoLeftoverOf(full)
	// A freed address is not handed out again at once.
	if err := n.del(live[1], true); err != nil {
		t.Fatal(err)
	}
	if err := n.del(live[2], true); err != nil {
		t.Fatal(err)
	}
	r, _ := n.mustAdd(n.newPod("next"))
	if ip := podIP(t, r).String(); ip != "10.244.9.3" {
		t.Fatalf("after freeing .3 and .4 with .6 handed out last, got %s, want .3 (round robin from the last)", ip)
	}
}

func (n *node) assertNoLeftoverOf(p *pod) {
	n.t.Helper()
	links, _ := n.hostState()
	for _, l := range links {
		if l == veth.HostName(p.id, "eth0") {
			n.t.Errorf("failed ADD left veth %s", l)
		}
	}
}

// The plugin killed at every step of ADD and DEL, then the runtime's DEL or a GC: nothing
// leaks and no address is ever handed out twice.
func TestCrashSafety(t *testing.T) {
	points := []string{"add-after-ipam", "add-after-veth", "add-before-result", "del-after-veth"}
	for _, point := range points {
		for _, recovery := range []string{"DEL", "GC"} {
			t.Run(point+"/"+recovery, func(t *testing.T) {
				n := newNode(t, nodeOpts{})
				bystander := n.newPod("bystander")
				rb, _ := n.mustAdd(bystander)
				victim := n.newPod("victim")
				t.Setenv(plugin.FaultEnv, point)
				var err error
				if strings.HasPrefix(point, "del") {
					t.Setenv(plugin.FaultEnv, "")
					n.mustAdd(victim)
					t.Setenv(plugin.FaultEnv, point)
					err = n.del(victim, true)
				} else {
					_, err = n.add(context.Background(), victim)
				}
				if err == nil {
					t.Fatalf("the plugin survived fault point %s", point)
				}
				t.Setenv(plugin.FaultEnv, "")
				switch recovery {
				case "DEL":
					if err := n.del(victim, false); err != nil {
						t.Fatalf("DEL after the crash: %v", err)
					}
				case "GC":
					if err := n.gc(bystander); err != nil {
						t.Fatalf("GC after the crash: %v", err)
					}
				}
				if a := n.allocations(); len(a) != 1 || a[0] != podIP(t, rb).String() {
					t.Fatalf("allocations %v, want only the bystander's %s", a, podIP(t, rb))
				}
				if err := n.check(bystander); err != nil {
					t.Fatalf("the bystander was damaged: %v", err)
				}
				if err := n.del(bystander, true); err != nil {
					t.Fatal(err)
				}
				n.assertClean()
			})
		}
	}

	t.Run("SIGKILL at random times", func(t *testing.T) {
		n := newNode(t, nodeOpts{})
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
		var survivors []*pod
		for i := 0; i < 25; i++ {
			p := n.newPod(fmt.Sprintf("k%02d", i))
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(40_000))*time.Microsecond)
			_, err := n.add(ctx, p) // the context's end SIGKILLs the plugin wherever it is
			cancel()
			if err == nil {
				survivors = append(survivors, p)
				continue
			}
			if err := n.del(p, false); err != nil {
				t.Fatalf("DEL after a killed ADD: %v", err)
			}
		}
		allocs := n.allocations()
		if len(allocs) != len(survivors) {
			t.Fatalf("%d allocations for %d completed ADDs: %v", len(allocs), len(survivors), allocs)
		}
		ips := map[string]bool{}
		for _, p := range survivors {
			if err := n.check(p); err != nil {
				t.Errorf("completed pod %s: %v", p.name, err)
			}
			r, err := n.cni.GetNetworkListCachedResult(n.list, n.rt(p))
			if err != nil || r == nil {
				t.Fatalf("cached result of %s: %v", p.name, err)
			}
			cur, _ := current.NewResultFromResult(r)
			ip := cur.IPs[0].Address.IP.String()
			if ips[ip] {
				t.Fatalf("address %s handed out twice", ip)
			}
			ips[ip] = true
		}
		t.Logf("%d of 25 ADDs completed before their kill", len(survivors))
		if err := n.gc(); err != nil {
			t.Fatal(err)
		}
		n.assertClean()
	})
}
