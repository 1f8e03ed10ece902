package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

// The agent's settings the benchmark programs, the ClusterNetwork defaults.
const (
	vxlanVNI    = 1
	vxlanPort   = 4789
	natOutgoing = true
)

// cniTimeout bounds one CNI call; the plugin takes milliseconds.
const cniTimeout = time.Minute

// setupTrellis brings a trellis cluster up as a real one comes up: the agent's datapath
// sync on every node (twice: the first pass makes each node's VXLAN device, whose MAC the
// peers need, as the NodeNetwork status publishes it), its iptables chains, then the
// conflist with the pod MTU the sync chose, then the pods, ADDed by the trellis plugin
// binary through libcni from inside the node namespace, then one more sync, and the
// NetworkPolicy dispatch chains (enabled by default; no policy exists: policyDispatch).
func setupTrellis(ctx context.Context, c *cluster, o options, runDir string) error {
	macs := map[string]net.HardwareAddr{}
	var statuses []*datapath.Status
	for pass := range 2 {
		statuses = statuses[:0]
		for _, n := range c.nodes {
			st, err := syncNode(c, n, macs, o.txChecksum().On)
			if err != nil {
				return fmt.Errorf("trellis %s %s, sync pass %d: %w", c.mode, n.name, pass+1, err)
			}
			macs[n.name] = st.VTEPMAC
			statuses = append(statuses, st)
		}
	}
	for i, n := range c.nodes {
		st := statuses[i]
		if len(st.Unreachable) > 0 || len(st.PeersPending) > 0 {
			return fmt.Errorf("trellis %s %s: the sync left peers unreachable %v or pending %v", c.mode, n.name, st.Unreachable, st.PeersPending)
		}
		v6 := ""
		if n.block6.IsValid() {
			// The IPv6 rows take the IPv4 rows' ways: no peer tunnelled for want of an IPv6
			// underlay address, none left out.
			f := st.IPv6
			if f == nil || f.Underlay != "eth0" || len(f.Unreachable) > 0 || len(f.PeersPending) > 0 || len(f.Tunnelled) > 0 ||
				!slices.Equal(f.PeersDirect, st.PeersDirect) || !slices.Equal(f.PeersVXLAN, st.PeersVXLAN) {
				return fmt.Errorf("trellis %s %s: the IPv6 peers are not reached as the IPv4 ones (direct %v, via VXLAN %v): %+v", c.mode, n.name, st.PeersDirect, st.PeersVXLAN, f)
			}
			v6 = "; IPv6 the same"
		}
		logf("trellis %-6s %s: peers direct %v, via VXLAN %v, pod MTU %d%s", c.mode, n.name, st.PeersDirect, st.PeersVXLAN, st.PodMTU, v6)
	}
	c.podMTU = statuses[0].PodMTU

	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	cni := libcni.NewCNIConfigWithCacheDir([]string{filepath.Dir(o.trellisBin)}, filepath.Join(runDir, "cni-cache"), exec)
	for i, n := range c.nodes {
		list, err := nodeConflist(n, statuses[i].PodMTU, filepath.Join(runDir, n.netns))
		if err != nil {
			return err
		}
		for _, p := range n.pods {
			if err := netnstest.Add(ctx, p.netns); err != nil {
				return err
			}
			if err := addPod(ctx, cni, list, n, p); err != nil {
				return err
			}
		}
	}
	// The agent's next periodic sync, with the pods in place: the node as it runs from then
	// on (the sync also covers the pod veths' settings).
	for i, n := range c.nodes {
		st, err := syncNode(c, n, macs, o.txChecksum().On)
		if err != nil {
			return fmt.Errorf("trellis %s %s, sync with the pods in place: %w", c.mode, n.name, err)
		}
		if i == 0 {
			c.agent = st
		}
	}
	for _, n := range c.nodes {
		if err := policyDispatch(n); err != nil {
			return fmt.Errorf("trellis %s %s: %w", c.mode, n.name, err)
		}
	}
	return nil
}

// syncNode runs what the agent's reconcile runs on n: datapath.Sync with every other node of
// the cluster as a peer (with the VTEP MACs known so far), then its netfilter chains.
func syncNode(c *cluster, n *node, macs map[string]net.HardwareAddr, checksumOffload bool) (*datapath.Status, error) {
	// As agent/nodenet builds it: on a dual-stack node, its IPv6 block and underlay
	// address, the peers' (their NodeNetworks' status.nodeIPv6), both pod ranges.
	cfg := datapath.Config{
		Mode: c.mode, VNI: vxlanVNI, Port: vxlanPort, ChecksumOffload: checksumOffload,
		Local:    datapath.Local{NodeIP: n.ip, PodCIDR: n.block, NodeIPv6: n.ip6, PodCIDRv6: n.block6},
		PodCIDRs: []netip.Prefix{c.podCIDR},
	}
	if c.podCIDR6.IsValid() {
		cfg.PodCIDRs = append(cfg.PodCIDRs, c.podCIDR6)
	}
	for _, peer := range c.nodes {
		if peer != n {
			cfg.Peers = append(cfg.Peers, datapath.Peer{Name: peer.name, NodeIP: peer.ip, PodCIDR: peer.block,
				NodeIPv6: peer.ip6, PodCIDRv6: peer.block6, VTEPMAC: macs[peer.name]})
		}
	}
	var st *datapath.Status
	err := inNetns(n.netns, func() error {
		var err error
		if st, err = datapath.Sync(cfg); err != nil {
			return fmt.Errorf("datapath.Sync: %w", err)
		}
		var nf netfilter.Syncer
		if _, err := nf.Sync(context.Background(), datapath.Netfilter([]netip.Prefix{c.podCIDR}, natOutgoing)); err != nil {
			return fmt.Errorf("netfilter sync: %w", err)
		}
		if !c.podCIDR6.IsValid() {
			return nil
		}
		// The IPv6 chains, with ip6tables of the same backend (agent/nodenet syncNetfilter).
		nf6 := netfilter.Syncer{Backend: nf.ActiveBackend().IPv6()}
		if _, err := nf6.Sync(context.Background(), datapath.Netfilter6([]netip.Prefix{c.podCIDR6}, natOutgoing)); err != nil {
			return fmt.Errorf("netfilter sync, IPv6: %w", err)
		}
		return nil
	})
	return st, err
}

// nodeConflist writes the node's ready file and returns the conflist the agent would write
// (the trellis entry; portmap, which the agent chains after it, adds nothing to a pod
// without port mappings), with the node's state kept under dir.
func nodeConflist(n *node, podMTU int, dir string) (*libcni.NetworkConfigList, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	ready := filepath.Join(dir, "cni-ready")
	if err := os.WriteFile(ready, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("writing the ready file of %s: %w", n.netns, err)
	}
	plugin := map[string]any{
		"type": "trellis", "podCIDR": n.block.String(), "mtu": podMTU,
		"dataDir": filepath.Join(dir, "ipam"), "readyFile": ready, "logFile": filepath.Join(dir, "cni.log"),
	}
	if n.block6.IsValid() {
		plugin["podCIDRv6"] = n.block6.String()
	}
	b, err := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "trellis", "plugins": []any{plugin}})
	if err != nil {
		return nil, fmt.Errorf("encoding the conflist of %s: %w", n.netns, err)
	}
	list, err := libcni.ConfListFromBytes(b)
	if err != nil {
		return nil, fmt.Errorf("parsing the conflist of %s: %w", n.netns, err)
	}
	return list, nil
}

// addPod asks the plugin for the network's STATUS and then ADDs p, as a runtime does, from
// a thread in the node namespace (the plugin makes the host end of the veth where it runs).
func addPod(ctx context.Context, cni *libcni.CNIConfig, list *libcni.NetworkConfigList, n *node, p *pod) error {
	id := randomHex(32)
	rt := &libcni.RuntimeConf{
		ContainerID: id, NetNS: procs.NetNSPath(p.netns), IfName: "eth0",
		Args: [][2]string{
			{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", benchPodNamespace}, {"K8S_POD_NAME", p.netns},
			{"K8S_POD_INFRA_CONTAINER_ID", id}, {"K8S_POD_UID", randomHex(16)},
		},
	}
	ctx, cancel := context.WithTimeout(ctx, cniTimeout)
	defer cancel()
	return inNetns(n.netns, func() error {
		if err := cni.GetStatusNetworkList(ctx, list); err != nil {
			return fmt.Errorf("CNI STATUS on %s: %w", n.netns, err)
		}
		res, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return fmt.Errorf("CNI ADD of %s on %s: %w", p.netns, n.netns, err)
		}
		cur, err := current.NewResultFromResult(res)
		if err != nil {
			return fmt.Errorf("CNI ADD of %s: converting the result: %w", p.netns, err)
		}
		want := []netip.Prefix{n.block}
		if n.block6.IsValid() {
			want = append(want, n.block6)
		}
		if len(cur.IPs) != len(want) {
			return fmt.Errorf("CNI ADD of %s: %d IPs in the result, want %d (one of each block of %v)", p.netns, len(cur.IPs), len(want), want)
		}
		for i, block := range want {
			ip, ok := netip.AddrFromSlice(cur.IPs[i].Address.IP)
			if ip = ip.Unmap(); !ok || !block.Contains(ip) {
				return fmt.Errorf("CNI ADD of %s: address %d, %v, is not in the node's block %s", p.netns, i, cur.IPs[i].Address.IP, block)
			}
			if ip.Is4() {
				p.ip = ip
			} else {
				p.ip6 = ip
			}
		}
		return nil
	})
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}
