package cluster

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/trellis-net/trellis/test/cluster/node"
	"github.com/trellis-net/trellis/test/cluster/topology"
)

// referenceBlock is node i's (0-based) pod block with CNIReference: 10.244.(i+1).0/24.
func referenceBlock(i int) netip.Prefix {
	a := PodCIDR.Masked().Addr().As4()
	a[2] = byte(i + 1)
	return netip.PrefixFrom(netip.AddrFrom4(a), 24)
}

// referenceConflist: ptp (a routed veth per pod, like Trellis) with host-local IPAM on
// the node's block. No masquerading: pod addresses are routed between the nodes and to
// the control plane (addReferenceRoutes), so traffic keeps its source IP.
const referenceConflist = `{
  "cniVersion": "1.0.0",
  "name": "localcluster-reference",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "mtu": 1500,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

// writeReferenceCNI installs the reference plugins and the conflist into the node's own
// /opt/cni/bin and /etc/cni/net.d (containerd loads the conflist as soon as it starts).
func (c *Cluster) writeReferenceCNI(cfg node.Config, block netip.Prefix, pluginsDir string) error {
	if err := cfg.Prepare(); err != nil {
		return err
	}
	// loopback too: containerd 1.6 runs it for every pod.
	for _, p := range []string{"ptp", "host-local", "portmap", "loopback"} {
		if err := copyFile(filepath.Join(pluginsDir, p), filepath.Join(cfg.CNIBinDir(), p), 0o755); err != nil {
			return err
		}
	}
	path := filepath.Join(cfg.CNIConfDir(), "10-reference.conflist")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(referenceConflist, block)), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// addReferenceRoutes routes every node's block from the other nodes, the control plane
// (the API server answers pods directly) and the router, all inside their namespaces.
func (c *Cluster) addReferenceRoutes(ctx context.Context) error {
	l := c.Network
	for _, to := range c.Nodes {
		for _, from := range append([]topology.Host{l.ControlPlane}, l.Nodes...) {
			if from.Name == to.Name {
				continue
			}
			if err := topology.AddRoute(ctx, from.NetNS, to.PodCIDR, l.NextHop(from, to.Host)); err != nil {
				return fmt.Errorf("routing %s's pods from %s: %w", to.Name, from.Name, err)
			}
		}
		if l.Router != nil {
			// The router is on both subnets: every node is a direct next hop.
			if err := topology.AddRoute(ctx, l.Router.NetNS, to.PodCIDR, to.IP); err != nil {
				return fmt.Errorf("routing %s's pods from the router: %w", to.Name, err)
			}
		}
	}
	return nil
}

// installTrellis installs Trellis exactly as README.md tells users: the operator and the
// CRDs (the ClusterNetworkPolicy CRD's standard channel among them) with `kubectl apply -k
// config/default`, then the sample ClusterNetwork, on a dual-stack cluster with PodCIDR6
// added to its podCIDRs as docs/install.md says (unless IPv4Pods). The operator renders
// the agent DaemonSet; the agents install the CNI.
func (c *Cluster) installTrellis(ctx context.Context, p *progress) error {
	if _, err := c.Kubectl(ctx, "apply", "-k", filepath.Join(c.ModuleRoot, "config", "default")); err != nil {
		return err
	}
	p.detail("kubectl apply -k config/default: done")
	if _, err := c.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/clusternetworks.network.trellis.dev", "crd/nodenetworks.network.trellis.dev",
		"crd/clusternetworkpolicies.policy.networking.k8s.io"); err != nil {
		return err
	}
	sample := filepath.Join(c.ModuleRoot, "config", "samples", "network_v1alpha1_clusternetwork.yaml")
	b, err := os.ReadFile(sample)
	if err != nil {
		return err
	}
	text, what := string(b), "kubectl apply -f config/samples/network_v1alpha1_clusternetwork.yaml"
	switch {
	case c.ipFamily() == IPFamilyIPv6:
		text, what = editSample(text, "  - "+PodCIDR6.String()+"\n"), what+fmt.Sprintf(" with podCIDRs %s instead of %s", PodCIDR6, PodCIDR)
	case c.ipFamily() == IPFamilyDual && !c.IPv4Pods:
		text, what = editSample(text, "  - "+PodCIDR.String()+"\n  - "+PodCIDR6.String()+"\n"), what+fmt.Sprintf(" with %s added to podCIDRs", PodCIDR6)
	}
	if c.Dataplane != "" {
		text, what = withDataplane(text, c.Dataplane), what+" with dataplane: "+c.Dataplane
	}
	if strings.Contains(text, editFailed) {
		return fmt.Errorf("%s: %s", sample, strings.TrimPrefix(text, editFailed))
	}
	if _, err := c.KubectlInput(ctx, text, "apply", "-f", "-"); err != nil {
		return err
	}
	p.detail("%s: done", what)
	return nil
}

// editFailed starts the text of an edit that could not be made: what it could not find.
const editFailed = "edit failed: "

// editSample is the sample ClusterNetwork text with its podCIDRs entry (PodCIDR)
// replaced by entries, the edit docs/install.md tells a user making a dual-stack (or
// IPv6-only) cluster.
func editSample(text, entries string) string {
	v4 := "  - " + PodCIDR.String() + "\n"
	if !strings.Contains(text, v4) {
		return editFailed + fmt.Sprintf("no podCIDRs entry %q to edit", strings.TrimSpace(v4))
	}
	return strings.Replace(text, v4, entries, 1)
}

// withDataplane is the sample ClusterNetwork text with spec.dataplane set to dp: its
// dataplane line replaced, or one added at the top of spec.
func withDataplane(text, dp string) string {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "  dataplane:") {
			lines[i] = "  dataplane: " + dp
			return strings.Join(lines, "\n")
		}
	}
	if !strings.Contains(text, "\nspec:\n") {
		return editFailed + "no spec to set dataplane in"
	}
	return strings.Replace(text, "\nspec:\n", "\nspec:\n  dataplane: "+dp+"\n", 1)
}

// routeControlPlaneToPods routes each node's pod blocks (its NodeNetwork's spec.podCIDRs,
// the IPv6 one too on a dual-stack cluster) from the control plane's namespace (and the
// router's, for a node behind it) to that node. On a real cluster the API server runs on
// a node of the pod network and reaches pods (pods/proxy, services/proxy, webhooks, of
// either family); here the control plane is a host of its own, so it gets static routes
// to the blocks, set once when Up finds every node Ready (a node added later by a test is
// not routed from the control plane).
func (c *Cluster) routeControlPlaneToPods(ctx context.Context) error {
	out, err := c.Kubectl(ctx, "get", "nodenetworks.network.trellis.dev",
		"-o", `jsonpath={range .items[*]}{.metadata.name}{"|"}{.spec.podCIDR}{"|"}{.spec.podCIDRs}{"\n"}{end}`)
	if err != nil {
		return fmt.Errorf("reading the pod blocks: %w", err)
	}
	blocks, err := podBlocks(out)
	if err != nil {
		return err
	}
	l := c.Network
	for _, n := range c.Nodes {
		bs, ok := blocks[n.Name]
		if !ok {
			return fmt.Errorf("node %s has no pod block in its NodeNetwork yet", n.Name)
		}
		for _, b := range bs {
			via, routerVia := l.NextHop(l.ControlPlane, n.Host), n.IP
			if b.Addr().Is6() {
				if !n.IP6.IsValid() {
					return fmt.Errorf("node %s has the IPv6 pod block %s but no IPv6 address", n.Name, b)
				}
				via, routerVia = l.NextHop6(l.ControlPlane, n.Host), n.IP6
			}
			if err := topology.AddRoute(ctx, l.ControlPlane.NetNS, b, via); err != nil {
				return fmt.Errorf("routing %s's pods (%s) from the control plane: %w", n.Name, b, err)
			}
			if l.Router != nil && n.Subnet != l.ControlPlane.Subnet {
				if err := topology.AddRoute(ctx, l.Router.NetNS, b, routerVia); err != nil {
					return fmt.Errorf("routing %s's pods (%s) from the router: %w", n.Name, b, err)
				}
			}
		}
	}
	return nil
}

// podBlocks reads the lines "NAME|PODCIDR|PODCIDRS" (PODCIDRS as kubectl's jsonpath prints
// a list: ["10.244.1.0/24","fd00:10:244:1::/64"]; empty on a NodeNetwork written before
// the field, PODCIDR empty on an IPv6-only node) into each node's blocks; a node without a
// block yet is left out.
func podBlocks(out string) (map[string][]netip.Prefix, error) {
	blocks := map[string][]netip.Prefix{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		fields := strings.SplitN(strings.TrimSpace(line), "|", 3)
		for len(fields) < 3 {
			fields = append(fields, "")
		}
		name, list := fields[0], strings.Trim(strings.TrimSpace(fields[2]), "[]")
		cidrs := strings.Split(list, ",")
		if list == "" {
			cidrs = []string{fields[1]}
		}
		for _, cidr := range cidrs {
			cidr = strings.Trim(strings.TrimSpace(cidr), `"`)
			if cidr == "" {
				continue
			}
			b, err := netip.ParsePrefix(cidr)
			if err != nil {
				return nil, fmt.Errorf("node %s: pod block %q: %w", name, cidr, err)
			}
			blocks[name] = append(blocks[name], b)
		}
	}
	return blocks, nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return fmt.Errorf("copying to %s: %w", dst, err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copying to %s: %w", dst, err)
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
