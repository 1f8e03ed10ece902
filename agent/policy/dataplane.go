package policy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables/expr"

	"github.com/trellis-net/trellis/agent/nftables"
	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/internal/ipfamily"
	"github.com/trellis-net/trellis/internal/netpol"
)

// Dataplane names: ClusterNetwork spec.dataplane (api/v1alpha1 Dataplane says what each
// is), as the agent configuration carries it; Auto resolves through ProbeNFTables.
const (
	DataplaneIPTables = string(v1alpha1.DataplaneIPTables)
	DataplaneNFTables = string(v1alpha1.DataplaneNFTables)
	DataplaneAuto     = string(v1alpha1.DataplaneAuto)
)

// Dataplane is an Applier with what the agent asks of the kernel beside applying.
type Dataplane interface {
	Applier
	// Backend names what the rules are written with: "nftables", or iptables' backend
	// ("nft" or "legacy"; "" before the first apply).
	Backend() string
	// DropCounts are the packets the per-pod chains' drop rules dropped, by chain.
	DropCounts() (map[string]uint64, error)
	// ProbeDenyLogs tells whether the node takes deny log rules (nil) or why not.
	ProbeDenyLogs() error
}

var (
	_ Dataplane = (*KernelApplier)(nil)
	_ Dataplane = (*NFTablesApplier)(nil)
)

// ChooseDataplane is the dataplane of setting on this node: Auto is nftables when probe
// (ProbeNFTables) finds the kernel takes the renderer's rules, iptables otherwise, with
// the reason. An empty setting is IPTables: a ClusterNetwork written before the field
// existed keeps what it had until its owner switches.
func ChooseDataplane(setting string, probe func() error) (string, error) {
	switch setting {
	case "", DataplaneIPTables:
		return DataplaneIPTables, nil
	case DataplaneNFTables:
		return DataplaneNFTables, nil
	case DataplaneAuto:
		if err := probe(); err != nil {
			return DataplaneIPTables, fmt.Errorf("spec.dataplane Auto chose IPTables: %w", err)
		}
		return DataplaneNFTables, nil
	}
	return "", fmt.Errorf("dataplane %q: must be Auto, NFTables or IPTables", setting)
}

// newDataplane is the applier of dataplane name, and the other one (whose rules an
// earlier configuration may have left, removed once the chosen one holds the policies).
func newDataplane(name string, families []ipfamily.Family) (chosen, other Dataplane) {
	ipt, nft := &KernelApplier{Families: families}, &NFTablesApplier{Families: families}
	if name == DataplaneNFTables {
		return nft, ipt
	}
	return ipt, nft
}

// Switchover takes away the rules of the dataplane not chosen (an earlier configuration's)
// once the chosen one holds every policy: until then both enforce the same policies, so
// nothing passes in between, in either direction of a switch.
type Switchover struct {
	Other Applier
	done  bool
}

// Synced is called after each sync with whether it left every policy enforced; it
// removes the other dataplane's rules after the first such sync (again after a sync
// following a failed removal).
func (s *Switchover) Synced(enforced bool) error {
	if s.done || !enforced {
		return nil
	}
	if err := s.Other.Remove(); err != nil {
		return fmt.Errorf("removing the other dataplane's policy rules: %w", err)
	}
	s.done = true
	return nil
}

// nftProbeTable is the scratch table ProbeNFTables writes and removes.
const nftProbeTable = "trellis-probe"

// probeTable is a table with one of each thing the policy renderer writes: a verdict map
// by interface, address, interval and concatenated sets, connection state, TCP flags,
// ports, a fib lookup, a counted drop, and a rate-limited log.
func probeTable(f ipfamily.Family) *nftables.Table {
	addr := netip.MustParseAddr("192.0.2.1")
	if f == ipfamily.IPv6 {
		addr = netip.MustParseAddr("2001:db8::1")
	}
	tcp, _ := nftables.Protocol("tcp")
	lim, _ := nftables.Limit("1/sec", 1)
	rules := [][]expr.Any{
		nftables.IfaceMap(true, "dispatch"),
		append(append(append(nftables.CtState(nftables.CtNew), tcp...), nftables.NotSYN()...), nftables.InSet(f, true, "addrs")...),
		append(append(tcp, nftables.DstPorts(80, 90)...), nftables.InSet(f, false, "ranges")...),
		append(nftables.DstAddrProtoPortInSet(f, "ports"), nftables.DstLocal()...),
		append(lim, nftables.Log("probe", netpol.DefaultNFLOGGroup, netpol.DenyLogCopy)...),
		append(nftables.Counter(), nftables.Drop()...),
	}
	t := &nftables.Table{Family: f, Name: nftProbeTable, Chains: []nftables.Chain{{Name: "probe"}, {Name: "target"}}}
	for _, r := range rules {
		t.Chains[0].Rules = append(t.Chains[0].Rules, nftables.Rule{Exprs: r})
	}
	t.Sets = []nftables.Set{
		{Name: "dispatch", Kind: nftables.IfaceVerdicts, Elements: []nftables.Element{nftables.IfaceVerdictElement("probe0", expr.Verdict{Kind: expr.VerdictGoto, Chain: "target"})}},
		{Name: "addrs", Kind: nftables.Addrs, Elements: []nftables.Element{nftables.AddrElement(addr)}},
		{Name: "ranges", Kind: nftables.Ranges, Elements: []nftables.Element{nftables.RangeElement(addr, addr.Next())}},
		{Name: "ports", Kind: nftables.AddrProtoPorts, Elements: []nftables.Element{nftables.AddrProtoPortElement(addr, 6, 80)}},
	}
	return t
}

// ProbeNFTables tells whether the kernel takes every kind of rule and set the nftables
// renderer writes, for each of families: it writes a scratch table no packet reaches (no
// base chain) and removes it at once.
func ProbeNFTables(families []ipfamily.Family) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if len(families) == 0 {
		families = []ipfamily.Family{ipfamily.IPv4}
	}
	var s nftables.Syncer
	for _, f := range families {
		_, err := s.Sync(ctx, probeTable(f), true)
		_, rerr := s.Remove(ctx, f, nftProbeTable)
		if err := errors.Join(err, rerr); err != nil {
			return fmt.Errorf("the kernel refuses Trellis's %s nftables rules: %w", f, err)
		}
	}
	return nil
}
