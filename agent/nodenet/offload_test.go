package nodenet_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/go-logr/logr/testr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/nodenet"
	"github.com/trellis-net/trellis/agent/offload"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/internal/agentconfig"
	trellisscheme "github.com/trellis-net/trellis/internal/scheme"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// brokenOffloadFilter is a classic BPF program (iptables -m bpf; this kernel has no tc
// drop action) that matches what a NIC that fails to finish offloaded inner checksums puts
// on the wire, so dropping what it matches as the packets leave a node's underlay
// reproduces such a NIC (vmxnet3 on port 4789, some vSphere setups).
//
// Why it is faithful: with TX checksum offload on trellis.vxlan, the kernel leaves the
// inner TCP/UDP checksum to the NIC (CHECKSUM_PARTIAL): the field holds only the
// pseudo-header sum (addresses, protocol, length) the NIC is to complete. A veth passes
// that skb on with its metadata, so the receiver trusts it; a real NIC that doesn't
// complete it sends exactly these bytes, and the receiver's stack verifies them and drops
// the packet. The program matches VXLAN packets (outer IPv4/UDP to the VXLAN port, inner
// Ethernet/IPv4) whose inner TCP or UDP checksum equals that pseudo-header sum, and only
// those: a checksum the kernel computed (offload off) is the full one, which differs;
// a zero UDP checksum (none) and ICMP (always computed in software) pass. Large GSO
// packets carry the same seed for their whole length, so TSO traffic is dropped too, as on
// the broken NIC. A correct full checksum equal to the seed has odds of 1 in 65,536.
func brokenOffloadFilter(port uint16) string {
	// jt and jf name where a jump goes: "" is the next instruction, else a label.
	type ins struct {
		code   uint16
		jt, jf string
		k      uint32
		label  string
	}
	const (
		ldh, ldb, ldm   = unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, unix.BPF_LD | unix.BPF_MEM
		ldxm, st        = unix.BPF_LDX | unix.BPF_MEM, unix.BPF_ST
		addx, subk      = unix.BPF_ALU | unix.BPF_ADD | unix.BPF_X, unix.BPF_ALU | unix.BPF_SUB | unix.BPF_K
		andk, rshk, tax = unix.BPF_ALU | unix.BPF_AND | unix.BPF_K, unix.BPF_ALU | unix.BPF_RSH | unix.BPF_K, unix.BPF_MISC | unix.BPF_TAX
		jeqk, jeqx, ret = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_X, unix.BPF_RET | unix.BPF_K
	)
	// Offsets from the outer IPv4 header (where iptables programs start): UDP at 20 (no
	// options), VXLAN at 28, inner Ethernet at 36, inner IPv4 at 50, inner TCP/UDP at 70.
	prog := []ins{
		{code: ldb, k: 0}, {code: jeqk, k: 0x45, jf: "pass"}, // outer IPv4 …
		{code: ldb, k: 9}, {code: jeqk, k: unix.IPPROTO_UDP, jf: "pass"},
		{code: ldh, k: 22}, {code: jeqk, k: uint32(port), jf: "pass"}, // … UDP to the VXLAN port
		{code: ldh, k: 48}, {code: jeqk, k: 0x0800, jf: "pass"}, // inner IPv4
		{code: ldb, k: 50}, {code: jeqk, k: 0x45, jf: "pass"},
		// M[0] = L4 length + protocol + source and destination address, by 16-bit words
		{code: ldh, k: 52}, {code: subk, k: 20}, {code: st, k: 0},
		{code: ldb, k: 59}, {code: ldxm, k: 0}, {code: addx}, {code: st, k: 0},
		{code: ldh, k: 62}, {code: ldxm, k: 0}, {code: addx}, {code: st, k: 0},
		{code: ldh, k: 64}, {code: ldxm, k: 0}, {code: addx}, {code: st, k: 0},
		{code: ldh, k: 66}, {code: ldxm, k: 0}, {code: addx}, {code: st, k: 0},
		{code: ldh, k: 68}, {code: ldxm, k: 0}, {code: addx}, {code: st, k: 0},
		// X = the sum folded to 16 bits (twice: the first fold can carry)
		{code: rshk, k: 16}, {code: st, k: 1}, {code: ldm, k: 0}, {code: andk, k: 0xffff}, {code: ldxm, k: 1}, {code: addx}, {code: st, k: 0},
		{code: rshk, k: 16}, {code: st, k: 1}, {code: ldm, k: 0}, {code: andk, k: 0xffff}, {code: ldxm, k: 1}, {code: addx}, {code: tax},
		{code: ldb, k: 59}, {code: jeqk, k: unix.IPPROTO_TCP, jt: "tcp"},
		{code: jeqk, k: unix.IPPROTO_UDP, jf: "pass"},
		{code: ldh, k: 76}, {code: jeqk, k: 0, jt: "pass"}, {code: jeqx, jt: "drop", jf: "pass"}, // UDP: no checksum passes; the seed is dropped
		{code: ldh, k: 86, label: "tcp"}, {code: jeqx, jt: "drop", jf: "pass"}, // TCP: the seed is dropped
		{code: ret, k: 0, label: "pass"},
		{code: ret, k: 1, label: "drop"}, // a match: the rule drops it
	}
	at := map[string]int{}
	for i, p := range prog {
		if p.label != "" {
			at[p.label] = i
		}
	}
	rel := func(i int, label string) int {
		if label == "" {
			return 0
		}
		return at[label] - i - 1
	}
	out := []string{fmt.Sprint(len(prog))}
	for i, p := range prog {
		out = append(out, fmt.Sprintf("%d %d %d %d", p.code, rel(i, p.jt), rel(i, p.jf), p.k))
	}
	return strings.Join(out, ",")
}

// A NIC that breaks offloaded VXLAN checksums, reproduced in namespaces (see
// brokenOffloadFilter) on node A's underlay: the self-test finds it, Auto turns offload off
// on node A only (reported on its NodeNetwork and in an Event), and pod traffic recovers;
// node B, whose NIC is fine, keeps offload on. Enabled keeps it on (and reports the
// breakage), Disabled keeps it off, and Auto on a kernel older than 5.7 is off.
func TestChecksumOffloadSelfTest(t *testing.T) {
	netnstest.RequireCommands(t, "iptables", "iptables-restore")
	k8s := apiServer(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	cs, err := kubernetes.NewForConfig(envCfg)
	check.Must(t, err)
	scheme, err := trellisscheme.New()
	check.Must(t, err)
	recorder := eventRecorder(t, cs, scheme)

	nsA, nsB := netnstest.New(t), netnstest.New(t)
	check.Must(t, nsA.Do(func(ns.NetNS) error {
		la := netlink.NewLinkAttrs()
		la.Name = "eth0"
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(nsB.Fd()))})
	}))
	type node struct {
		name, ip, block string
		ns              ns.NetNS
		rec             *nodenet.Reconciler
	}
	nodes := []*node{{name: "csum-a", ip: "198.51.100.71", block: "10.244.70.0/24", ns: nsA}, {name: "csum-b", ip: "198.51.100.72", block: "10.244.71.0/24", ns: nsB}}
	// newChecker is a fresh self-test, as an agent (re)start makes, with short periods;
	// the node's previous one stops first (its responder with it).
	stop := map[string]func(){}
	newChecker := func(n *node) *offload.Checker {
		if s := stop[n.name]; s != nil {
			s()
		}
		c := &offload.Checker{NetNS: n.ns, Log: testr.New(t).WithName(n.name), Interval: time.Second, RetryMin: 200 * time.Millisecond,
			Probe: offload.ProbeOptions{Timeout: 300 * time.Millisecond, Attempts: 2}}
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = c.Start(cctx) }()
		stop[n.name] = func() { cancel(); <-done }
		return c
	}
	for _, n := range nodes {
		upUnderlay(t, n.ns, n.ip)
		addNode(t, k8s, n.name, n.ip, n.block)
		dir := t.TempDir()
		n.rec = &nodenet.Reconciler{Client: k8s, NodeName: n.name, Config: baseConfig(), Recorder: recorder,
			CNIConfDir: filepath.Join(dir, "net.d"), ReadyFile: filepath.Join(dir, "run", "cni-ready"), CNIVersion: "1.0.0", Version: "test"}
		n.rec.Offload = newChecker(n)
	}
	syncAll := func() {
		t.Helper()
		for _, n := range nodes {
			check.Must(t, n.ns.Do(func(ns.NetNS) error { _, err := n.rec.Reconcile(ctx, ctrl.Request{}); return err }))
		}
	}
	// offloadState syncs the nodes until node n's TXChecksumOffload condition has reason
	// (the self-test runs on its own; a sync acts on its verdict), and returns it with the
	// device's offload.
	offloadState := func(n *node, reason string) (*metav1.Condition, bool) {
		t.Helper()
		var c *metav1.Condition
		nn := &v1alpha1.NodeNetwork{}
		wait, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		// Reached or not, the checks below judge the last state.
		_ = check.Until(wait, 100*time.Millisecond, "TXChecksumOffload reason "+reason, func(context.Context) error {
			syncAll()
			nn = &v1alpha1.NodeNetwork{}
			check.Must(t, k8s.Get(ctx, types.NamespacedName{Name: n.name}, nn))
			if c = meta.FindStatusCondition(nn.Status.Conditions, v1alpha1.ConditionTXChecksumOffload); c == nil || c.Reason != reason {
				return fmt.Errorf("%+v", c)
			}
			return nil
		})
		on := nn.Status.Kernel.VXLANTXChecksumOffload
		var dev bool
		check.Must(t, n.ns.Do(func(ns.NetNS) error { var err error; dev, err = datapath.TXChecksum(datapath.VXLANDevice); return err }))
		if on == nil || *on != dev {
			t.Errorf("%s: status.kernel.vxlanTXChecksumOffload %v, the device %v", n.name, on, dev)
		}
		if c == nil || c.Reason != reason {
			t.Fatalf("%s: TXChecksumOffload condition %+v, want reason %s", n.name, c, reason)
		}
		return c, dev
	}

	// Pods on both nodes, and a TCP and a UDP exchange between them each way.
	pods := map[string]ns.NetNS{}
	for i, n := range nodes {
		syncAll()
		pod := netnstest.New(t)
		ip := netip.MustParseAddr(strings.TrimSuffix(n.block, "0/24") + "5")
		check.Must(t, n.ns.Do(func(ns.NetNS) error {
			_, err := veth.Setup(pod, fmt.Sprintf("trlcsum%d", i), "eth0", []netip.Addr{ip}, 1450)
			return err
		}))
		pods[ip.String()] = pod
	}
	podA, podB := "10.244.70.5", "10.244.71.5"
	for ip, pod := range pods {
		echoServer(t, pod, ip)
	}
	reach := func(from, to string) error { return exchange(pods[from], to) }
	bothWays := func() error {
		if err := reach(podA, podB); err != nil {
			return fmt.Errorf("A -> B: %w", err)
		}
		if err := reach(podB, podA); err != nil {
			return fmt.Errorf("B -> A: %w", err)
		}
		return nil
	}

	// A healthy underlay: Auto verifies the tunnel and keeps offload on.
	for _, n := range nodes {
		if c, on := offloadState(n, offload.ReasonTunnelVerified); !on || c.Status != metav1.ConditionTrue {
			t.Errorf("%s on a healthy underlay: offload %v, condition %+v; want on, True", n.name, on, c)
		}
	}
	check.Must(t, bothWays())

	// Node A's NIC breaks offloaded checksums: pod traffic through the tunnel fails ...
	check.Must(t, nsA.Do(func(ns.NetNS) error {
		// POSTROUTING: the last hook before the device, where the inner checksum of a
		// packet left to offload still holds the seed (the kernel completes it only in
		// software, later, for a device that can't).
		args := []string{"-w", "-t", "mangle", "-A", "POSTROUTING", "-o", "eth0", "-p", "udp", "--dport", "4789",
			"-m", "bpf", "--bytecode", brokenOffloadFilter(4789), "-j", "DROP"}
		if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("iptables %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}))
	if err := reach(podA, podB); err == nil {
		t.Fatal("pod A -> pod B got through with the broken-offload filter on A's underlay: the reproduction does not work")
	}
	// ... the self-test sees it, and Auto turns offload off on node A, with an Event.
	c, on := offloadState(nodes[0], v1alpha1.ReasonChecksumOffloadBroken)
	if on || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "csum-b") {
		t.Errorf("node A with a broken NIC: offload %v, condition %+v; want off, False, naming the peer", on, c)
	}
	if err := bothWays(); err != nil {
		t.Errorf("pod traffic did not recover with offload off on node A: %v", err)
	}
	recheck, cancel := context.WithTimeout(ctx, 10*time.Second)
	if err := check.Until(recheck, 200*time.Millisecond, "node A's re-check with offload off confirming the tunnel works", func(context.Context) error {
		if c, _ = offloadState(nodes[0], v1alpha1.ReasonChecksumOffloadBroken); !strings.Contains(c.Message, "get through") {
			return fmt.Errorf("%q", c.Message)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	cancel()
	// Node B's NIC is fine: its probes' UDP got through (TCP only failed on A's replies),
	// so it keeps offload on.
	if c, on := offloadState(nodes[1], offload.ReasonTunnelVerified); !on {
		t.Errorf("node B turned offload off for node A's broken NIC: %+v", c)
	}
	var evs *corev1.EventList
	nnA := &v1alpha1.NodeNetwork{}
	check.Must(t, k8s.Get(ctx, types.NamespacedName{Name: "csum-a"}, nnA))
	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	// Come or not, the check below says what there is.
	_ = check.Until(wait, 100*time.Millisecond, "an Event "+v1alpha1.ReasonChecksumOffloadBroken+" for csum-a", func(context.Context) error {
		evs, err = cs.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(nnA.UID) + ",reason=" + v1alpha1.ReasonChecksumOffloadBroken})
		check.Must(t, err)
		if len(evs.Items) == 0 {
			return errors.New("none yet")
		}
		return nil
	})
	cancel()
	if len(evs.Items) != 1 || evs.Items[0].Type != corev1.EventTypeWarning || evs.Items[0].Count > 1 {
		t.Errorf("events for csum-a with reason %s: %+v; want one Warning", v1alpha1.ReasonChecksumOffloadBroken, evs.Items)
	}

	// Enabled: on whatever the self-test finds (it reports it); pod traffic stays broken.
	a := nodes[0]
	a.rec.Config = baseConfig()
	a.rec.Config.VXLAN.TXChecksumOffload = agentconfig.TXChecksumOffloadEnabled
	a.rec.Offload = newChecker(a)
	if c, on := offloadState(a, v1alpha1.ReasonChecksumOffloadBroken); !on || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "Enabled keeps it on") {
		t.Errorf("Enabled with a broken NIC: offload %v, condition %+v; want on, True, saying Enabled keeps it on", on, c)
	}
	if err := reach(podA, podB); err == nil {
		t.Error("pod A -> pod B got through with offload Enabled on the broken NIC")
	}
	// Disabled: off, nothing probed; traffic flows.
	a.rec.Config.VXLAN.TXChecksumOffload = agentconfig.TXChecksumOffloadDisabled
	a.rec.Offload = newChecker(a)
	if c, on := offloadState(a, offload.ReasonDisabled); on || c.Status != metav1.ConditionFalse {
		t.Errorf("Disabled: offload %v, condition %+v; want off, False", on, c)
	}
	if err := bothWays(); err != nil {
		t.Errorf("offload Disabled: %v", err)
	}
	// Auto on a kernel older than 5.7: off without probing.
	a.rec.Config.VXLAN.TXChecksumOffload = agentconfig.TXChecksumOffloadAuto
	a.rec.KernelRelease = "5.4.0-150-generic"
	a.rec.Offload = newChecker(a)
	if c, on := offloadState(a, offload.ReasonKernelTooOld); on || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "5.4.0-150-generic") {
		t.Errorf("Auto on kernel 5.4: offload %v, condition %+v; want off, False, naming the kernel", on, c)
	}
}

// echoServer answers TCP and UDP on ip:7 in pod until the test ends.
func echoServer(t *testing.T, pod ns.NetNS, ip string) {
	t.Helper()
	var l net.Listener
	var pc net.PacketConn
	check.Must(t, pod.Do(func(ns.NetNS) error {
		var err error
		if l, err = net.Listen("tcp", ip+":7"); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", ip+":7")
		return err
	}))
	t.Cleanup(func() { l.Close(); pc.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
}

// exchange sends, from pod, a UDP datagram and 256 KiB over TCP (so TSO-sized packets) to
// ip:7 and reads them back.
func exchange(pod ns.NetNS, ip string) error {
	return pod.Do(func(ns.NetNS) error {
		u, err := net.DialTimeout("udp", ip+":7", time.Second)
		if err != nil {
			return err
		}
		defer u.Close()
		_ = u.SetDeadline(time.Now().Add(time.Second))
		if _, err := u.Write([]byte("ping")); err != nil {
			return err
		}
		if _, err := u.Read(make([]byte, 16)); err != nil {
			return fmt.Errorf("UDP: %w", err)
		}
		c, err := net.DialTimeout("tcp", ip+":7", time.Second)
		if err != nil {
			return fmt.Errorf("TCP: %w", err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		data := make([]byte, 256<<10)
		go func() { _, _ = c.Write(data) }()
		got := 0
		buf := make([]byte, 64<<10)
		for got < len(data) {
			n, err := c.Read(buf)
			if err != nil {
				return fmt.Errorf("TCP after %d bytes: %w", got, err)
			}
			got += n
		}
		return nil
	})
}
