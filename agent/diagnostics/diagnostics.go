// Package diagnostics is the agent's read-only view of the node's trellis state for bug
// reports (`kubectl trellis sysdump`): a fixed set of items, each read from the kernel or
// the node's files, never a shell or a command the caller chooses, bounded in size per
// item and in time per request. Server serves it on the node's loopback only, over TLS
// whose certificate's fingerprint the agent publishes in its NodeNetwork status.
package diagnostics

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/agent/cniinstall"
	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/ipset"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/agent/nftables"
	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/diagreport"
	"github.com/trellis-net/trellis/internal/ipfamily"
)

// Bounds: an item is cut at MaxItemBytes (and marked so); a whole request stops waiting
// for commands after RequestTimeout.
const (
	MaxItemBytes   = 4 << 20
	RequestTimeout = 30 * time.Second
)

// commandTimeout bounds each command a collection runs (iptables-save, ipset list), so
// that one wedged command leaves time for the other items; maxSaveBytes bounds a whole
// iptables-save, read before it is filtered down to trellis's.
const (
	commandTimeout = 10 * time.Second
	maxSaveBytes   = 64 << 20
)

// Collector reads the node's state.
type Collector struct {
	NodeName, Version string
	// CNIConfDir is the node's CNI configuration directory as the agent sees it.
	CNIConfDir string
	// Gatherer is the agent's metrics registry (controller-runtime's).
	Gatherer prometheus.Gatherer
	Log      logr.Logger

	busy chan struct{}
}

// Handler serves GET diagreport.Path with the node's Report as JSON. One collection runs at a
// time per node; a second caller waits for it (or its own deadline).
func (c *Collector) Handler() http.Handler {
	c.busy = make(chan struct{}, 1)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			http.Error(w, "only GET", http.StatusMethodNotAllowed)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), RequestTimeout)
		defer cancel()
		select {
		case c.busy <- struct{}{}:
			defer func() { <-c.busy }()
		case <-ctx.Done():
			http.Error(w, "another diagnostics collection is still running on this node", http.StatusServiceUnavailable)
			return
		}
		rep := c.Collect(ctx)
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(rep); err != nil {
			c.Log.V(1).Info("writing diagnostics", "err", err.Error())
		}
	})
}

// Collect reads every item; an item that fails says why in its Error.
func (c *Collector) Collect(ctx context.Context) diagreport.Report {
	rep := diagreport.Report{Node: c.NodeName, Version: c.Version, CollectedAt: time.Now().UTC()}
	add := func(file string, content string, err error) {
		it := diagreport.Item{File: file, Content: content}
		if len(it.Content) > MaxItemBytes {
			it.Content, it.Truncated = it.Content[:MaxItemBytes], true
		}
		if err != nil {
			it.Error = err.Error()
		}
		rep.Items = append(rep.Items, it)
	}
	c.cni(add)
	c.iptables(ctx, add)
	c.nftables(ctx, add)
	out, err := c.ipsets(ctx)
	add("ipset.txt", out, err)
	out, err = routes()
	add("routes.txt", out, err)
	out, err = vxlan()
	add("vxlan.txt", out, err)
	out, err = links()
	add("links.txt", out, err)
	out, err = c.metrics()
	add("metrics.txt", out, err)
	return rep
}

// cni: the directory's configurations in the order the runtime considers them (it uses
// the first), and each one's content. Files are read through an os.Root of the directory:
// a symlink there pointing out of it (to /etc/shadow, a kubeconfig, a token) is never
// followed, and only regular files are read, so whoever can write the directory can't
// make the agent (root) put another file of the node in a dump.
func (c *Collector) cni(add func(string, string, error)) {
	root, err := os.OpenRoot(c.CNIConfDir)
	if err != nil {
		add("cni/order.txt", "", fmt.Errorf("reading the CNI conf dir %s: %w", c.CNIConfDir, err))
		return
	}
	defer root.Close()
	entries, err := readDir(root)
	if err != nil {
		add("cni/order.txt", "", fmt.Errorf("reading the CNI conf dir %s: %w", c.CNIConfDir, err))
		return
	}
	first, _ := cniinstall.FirstConfig(c.CNIConfDir)
	var order strings.Builder
	fmt.Fprintf(&order, "# %s in lexical order; the runtime uses the first *.conf, *.conflist or *.json\n", c.CNIConfDir)
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		isConf := !e.IsDir() && (ext == ".conf" || ext == ".conflist" || ext == ".json")
		mark := "  "
		switch {
		case e.Name() == first:
			mark = "* "
		case !isConf:
			mark = "- "
		}
		note := ""
		switch {
		case e.Name() == first && e.Name() == cniinstall.ConflistName:
			note = "  (in use: trellis's)"
		case e.Name() == first:
			note = "  (in use: NOT trellis's, " + cniinstall.ConflistName + " is ignored)"
		case !isConf:
			note = "  (not a network configuration)"
		}
		fmt.Fprintf(&order, "%s%s%s\n", mark, e.Name(), note)
		if isConf {
			b, err := readBounded(root, e.Name())
			add("cni/"+e.Name(), string(b), err)
		}
	}
	if first == "" {
		order.WriteString("(no network configuration: the node's runtime reports the network plugin not ready)\n")
	}
	add("cni/order.txt", order.String(), nil)
}

func readDir(root *os.Root) ([]os.DirEntry, error) {
	d, err := root.Open(".")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	entries, err := d.ReadDir(-1)
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	return entries, err
}

// readBounded reads the regular file name in root, at most MaxItemBytes+1 bytes. A
// symlink is followed only while it stays inside root; a FIFO or device is not read
// (O_NONBLOCK: opening a FIFO doesn't wait for a writer).
func readBounded(root *os.Root, name string) ([]byte, error) {
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("not read: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("not read: %s is not a regular file (%s)", name, st.Mode().Type())
	}
	return io.ReadAll(io.LimitReader(f, MaxItemBytes+1))
}

// iptables: the backend trellis writes to, and per table trellis's chains and the jumps
// into them, IPv4's (iptables/) and IPv6's (ip6tables/: the kernel keeps them apart, and
// an IPv6 or dual-stack node's IPv6 rules are there). Every table is listed in one
// iptables-save run without -t (Backend.SaveAll: with -t, the legacy variant would load a
// table that isn't there).
func (c *Collector) iptables(ctx context.Context, add func(string, string, error)) {
	b, err := netfilter.DetectBackend()
	if err != nil {
		add("iptables/backend.txt", "", err)
		return
	}
	var summary strings.Builder
	fmt.Fprintf(&summary, "backend: %s (%s)\n", b.Mode, b.Save)
	save, err := saveAll(ctx, b)
	tables, byTable := FilterIPTablesSave(save)
	fmt.Fprintf(&summary, "tables with trellis chains: %s\n", strings.Join(tables, ", "))
	v6 := b.IPv6()
	var tables6 []string
	var byTable6 map[string]string
	if v6.Installed() {
		save6, err6 := saveAll(ctx, v6)
		err = errors.Join(err, err6)
		tables6, byTable6 = FilterIPTablesSave(save6)
		fmt.Fprintf(&summary, "ip6tables tables with trellis chains: %s\n", strings.Join(tables6, ", "))
	} else {
		fmt.Fprintf(&summary, "ip6tables: no %s on the node\n", v6.Save)
	}
	add("iptables/backend.txt", summary.String(), err)
	for _, t := range tables {
		add("iptables/"+t+".txt", byTable[t], nil)
	}
	for _, t := range tables6 {
		add("ip6tables/"+t+".txt", byTable6[t], nil)
	}
}

// nftables: the policy tables of the nftables dataplane as the kernel holds them (read
// over netlink; the node may have no nft binary), one item per family that has one.
func (c *Collector) nftables(ctx context.Context, add func(string, string, error)) {
	var s nftables.Syncer
	for _, f := range ipfamily.All {
		out, err := s.Describe(ctx, f, nftables.PolicyTable)
		if out != "" || err != nil {
			add(fmt.Sprintf("nftables/%s-%s.txt", map[ipfamily.Family]string{ipfamily.IPv4: "ip", ipfamily.IPv6: "ip6"}[f], nftables.PolicyTable), out, err)
		}
	}
}

func saveAll(ctx context.Context, b netfilter.Backend) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	out, err := b.SaveAll(ctx, maxSaveBytes)
	return string(out), err
}

// ipsets: trellis's sets, filtered as `ipset list` streams (other components' sets may be
// big), cut one byte past MaxItemBytes so that Collect marks the item cut.
func (c *Collector) ipsets(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	var b bytes.Buffer
	err := ipset.List(ctx, func(r io.Reader) error {
		return FilterIPSetList(r, &capped{w: &b, left: MaxItemBytes + 1}, ipset.Prefix)
	})
	if errors.Is(err, errCapped) {
		err = nil
	}
	return b.String(), err
}

var errCapped = errors.New("output cut at the size bound")

// capped writes to w until left bytes are written, then fails.
type capped struct {
	w    io.Writer
	left int
}

func (c *capped) Write(p []byte) (int, error) {
	if len(p) > c.left {
		p = p[:c.left]
		_, _ = c.w.Write(p)
		c.left = 0
		return len(p), errCapped
	}
	c.left -= len(p)
	return c.w.Write(p)
}

// linkNames maps interface indexes to names.
func linkNames() map[int]string {
	names := map[int]string{}
	if ls, err := netlinksafe.LinkList(); err == nil {
		for _, l := range ls {
			names[l.Attrs().Index] = l.Attrs().Name
		}
	}
	return names
}

// routes: the main table's routes trellis made, of both families, like `ip route show
// proto 201/202` and `ip -6 route show proto 201/202`.
func routes() (string, error) {
	names := linkNames()
	var b strings.Builder
	for _, p := range []struct {
		proto netlink.RouteProtocol
		what  string
	}{{cnicontract.PeerRouteProtocol, "routes to peer nodes' pod blocks (agent)"}, {cnicontract.PodRouteProtocol, "routes to this node's pods (CNI plugin)"}} {
		var rs []netlink.Route
		for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			fr, err := netlinksafe.RouteListFiltered(family, &netlink.Route{Protocol: p.proto, Table: unix.RT_TABLE_MAIN},
				netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
			if err != nil {
				return b.String(), fmt.Errorf("listing routes of protocol %d: %w", p.proto, err)
			}
			rs = append(rs, fr...)
		}
		fmt.Fprintf(&b, "# proto %d: %s, %d\n", p.proto, p.what, len(rs))
		sort.Slice(rs, func(i, j int) bool { return rs[i].Dst.String() < rs[j].Dst.String() })
		for _, r := range rs {
			b.WriteString(formatRoute(r, names) + "\n")
		}
	}
	return b.String(), nil
}

func formatRoute(r netlink.Route, names map[int]string) string {
	s := "default"
	if r.Dst != nil {
		s = r.Dst.String()
	}
	if r.Gw != nil {
		s += " via " + r.Gw.String()
	}
	if n, ok := names[r.LinkIndex]; ok {
		s += " dev " + n
	} else if r.LinkIndex != 0 {
		s += fmt.Sprintf(" dev if%d", r.LinkIndex)
	}
	s += fmt.Sprintf(" proto %d scope %s", r.Protocol, r.Scope)
	if r.Src != nil {
		s += " src " + r.Src.String()
	}
	if r.Flags&int(netlink.FLAG_ONLINK) != 0 {
		s += " onlink"
	}
	if r.MTU != 0 {
		s += fmt.Sprintf(" mtu %d", r.MTU)
	}
	return s
}

// vxlan: the VXLAN device's settings, FDB (peer VTEP MAC -> peer node IP) and neighbour
// (peer block gateway -> VTEP MAC) entries.
func vxlan() (string, error) {
	l, err := netlinksafe.LinkByName(datapath.VXLANDevice)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return fmt.Sprintf("no %s device (Direct mode, or the datapath isn't set up)\n", datapath.VXLANDevice), nil
		}
		return "", fmt.Errorf("reading %s: %w", datapath.VXLANDevice, err)
	}
	var b strings.Builder
	a := l.Attrs()
	fmt.Fprintf(&b, "%s: mtu %d state %s mac %s", a.Name, a.MTU, a.OperState, a.HardwareAddr)
	if v, ok := l.(*netlink.Vxlan); ok {
		fmt.Fprintf(&b, " vni %d port %d local %s learning %v", v.VxlanId, v.Port, v.SrcAddr, v.Learning)
	}
	b.WriteString("\n# fdb (bridge fdb show dev " + a.Name + ")\n")
	fdb, err := netlink.NeighList(a.Index, unix.AF_BRIDGE)
	if err != nil {
		return b.String(), fmt.Errorf("listing the FDB of %s: %w", a.Name, err)
	}
	for _, n := range fdb {
		fmt.Fprintf(&b, "%s dst %s %s\n", n.HardwareAddr, n.IP, neighState(n.State))
	}
	b.WriteString("# neighbours (ip neigh show dev " + a.Name + "; ip -6 neigh show dev " + a.Name + ")\n")
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		nb, err := netlink.NeighList(a.Index, family)
		if err != nil {
			return b.String(), fmt.Errorf("listing the neighbours of %s: %w", a.Name, err)
		}
		for _, n := range nb {
			fmt.Fprintf(&b, "%s lladdr %s %s\n", n.IP, n.HardwareAddr, neighState(n.State))
		}
	}
	return b.String(), nil
}

func neighState(s int) string {
	var out []string
	for _, st := range []struct {
		bit  int
		name string
	}{{netlink.NUD_PERMANENT, "PERMANENT"}, {netlink.NUD_REACHABLE, "REACHABLE"}, {netlink.NUD_STALE, "STALE"},
		{netlink.NUD_NOARP, "NOARP"}, {netlink.NUD_FAILED, "FAILED"}, {netlink.NUD_INCOMPLETE, "INCOMPLETE"}} {
		if s&st.bit != 0 {
			out = append(out, st.name)
		}
	}
	return strings.Join(out, ",")
}

// links: trellis's devices (the VXLAN device, the pods' host veths) with their addresses.
func links() (string, error) {
	ls, err := netlinksafe.LinkList()
	if err != nil {
		return "", fmt.Errorf("listing links: %w", err)
	}
	var b strings.Builder
	for _, l := range ls {
		a := l.Attrs()
		if a.Name != datapath.VXLANDevice && !strings.HasPrefix(a.Name, cnicontract.HostVethPrefix) {
			continue
		}
		fmt.Fprintf(&b, "%d: %s <%s> mtu %d state %s type %s mac %s\n", a.Index, a.Name, a.Flags, a.MTU, a.OperState, l.Type(), a.HardwareAddr)
		addrs, err := netlinksafe.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			fmt.Fprintf(&b, "    (addresses: %v)\n", err)
			continue
		}
		for _, ad := range addrs {
			ip, _ := netip.AddrFromSlice(ad.IP)
			fmt.Fprintf(&b, "    %s %s\n", ipfamily.Of(ip).SetFamily(), ad.IPNet)
		}
	}
	return b.String(), nil
}

// metrics: the agent's own metrics, from its registry, in Prometheus' text format.
func (c *Collector) metrics() (string, error) {
	if c.Gatherer == nil {
		return "", errors.New("no metrics registry")
	}
	mfs, err := c.Gatherer.Gather()
	var b bytes.Buffer
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if e := enc.Encode(mf); e != nil {
			return b.String(), fmt.Errorf("encoding metrics: %w", e)
		}
	}
	return b.String(), err
}
