package nftables

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// fingerprintType is the user-data type a rule's fingerprint is kept under. nft prints a
// rule's comment (type 0) and ignores types it doesn't know.
const fingerprintType userdata.Type = 0xa0

// acceptPolicy is every base chain's policy: a packet none of its rules decides goes on to
// the hook's other base chains.
var acceptPolicy = nft.ChainPolicyAccept

// conn opens a netlink connection to the kernel's nftables for one sync: in the network
// namespace netns when it is not 0, in the calling thread's otherwise.
func conn(netns int) (*nft.Conn, error) {
	opts := []nft.ConnOption{nft.AsLasting()}
	if netns != 0 {
		opts = append(opts, nft.WithNetNSFd(netns))
	}
	c, err := nft.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("opening a netlink connection to nftables: %w", err)
	}
	return c, nil
}

// notFound tells whether err is the kernel saying an object does not exist (or that it
// has no nftables at all, so nothing of it can exist).
func notFound(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, os.ErrNotExist) ||
		errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EAFNOSUPPORT)
}

// tableOf is family f's table name as the kernel lists it; nil when it has none.
func tableOf(c *nft.Conn, f ipfamily.Family, name string) (*nft.Table, error) {
	t, err := c.ListTableOfFamily(name, family(f))
	if err != nil {
		if notFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading table %s %s: %w", familyName(f), name, err)
	}
	return t, nil
}

// chainRules are the chains of table t (of family f) that want takes (all when nil), in
// the kernel's order, and each one's rules.
func chainRules(c *nft.Conn, t *nft.Table, f ipfamily.Family, want func(string) bool) ([]*nft.Chain, [][]*nft.Rule, error) {
	all, err := c.ListChainsOfTableFamily(family(f))
	if err != nil {
		return nil, nil, fmt.Errorf("listing the chains of table %s %s: %w", familyName(f), t.Name, err)
	}
	var chains []*nft.Chain
	var rules [][]*nft.Rule
	for _, ch := range all {
		if ch.Table.Name != t.Name || want != nil && !want(ch.Name) {
			continue
		}
		rs, err := c.GetRules(t, ch)
		if err != nil {
			return nil, nil, fmt.Errorf("reading chain %s of table %s %s: %w", ch.Name, familyName(f), t.Name, err)
		}
		chains, rules = append(chains, ch), append(rules, rs)
	}
	return chains, rules, nil
}

// read is the table as the kernel holds it; a table that isn't there is state{}.
func read(c *nft.Conn, f ipfamily.Family, name string) (state, error) {
	t, err := tableOf(c, f, name)
	if t == nil || err != nil {
		return state{}, err
	}
	st := state{exists: true, chains: map[string]chainState{}, sets: map[string]setState{}}
	chains, rulesOf, err := chainRules(c, t, f, nil)
	if err != nil {
		return state{}, err
	}
	for i, ch := range chains {
		rules := rulesOf[i]
		cs := chainState{rules: make([]string, 0, len(rules))}
		if ch.Hooknum != nil && ch.Priority != nil {
			cs.hook = hookKey(&Hook{Type: ch.Type, Hook: *ch.Hooknum, Priority: int32(*ch.Priority)})
			if ch.Policy == nil || *ch.Policy != acceptPolicy {
				cs.hook += "/not-accept" // made again with the accept policy
			}
		}
		for _, r := range rules {
			fp, _ := userdata.GetString(r.UserData, fingerprintType)
			cs.rules = append(cs.rules, fp)
		}
		st.chains[ch.Name] = cs
	}
	sets, err := c.GetSets(t)
	if err != nil {
		return state{}, fmt.Errorf("listing the sets of table %s %s: %w", familyName(f), name, err)
	}
	for _, s := range sets {
		if s.Anonymous {
			continue
		}
		elems, err := c.GetSetElements(s)
		if err != nil {
			return state{}, fmt.Errorf("reading set %s of table %s %s: %w", s.Name, familyName(f), name, err)
		}
		es := map[string]Element{}
		for _, e := range fromKernel(s, elems) {
			es[e.id()] = e
		}
		st.sets[s.Name] = setState{decl: declKey(*s), elements: es}
	}
	return st, nil
}

// fromKernel are a set's elements as the kernel lists them, as Elements: an interval set's
// ranges are a start element followed, in key order, by its end (absent for a range that
// runs to the last address).
func fromKernel(s *nft.Set, elems []nft.SetElement) []Element {
	if !s.Interval {
		out := make([]Element, 0, len(elems))
		for _, e := range elems {
			el := Element{Key: e.Key}
			if s.IsMap {
				el.Verdict = decodeVerdict(e.Val)
			}
			out = append(out, el)
		}
		return out
	}
	slices.SortStableFunc(elems, func(a, b nft.SetElement) int {
		if c := bytes.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		// At the same key a range's end comes before the next one's start.
		switch {
		case a.IntervalEnd && !b.IntervalEnd:
			return -1
		case b.IntervalEnd && !a.IntervalEnd:
			return 1
		}
		return 0
	})
	var out []Element
	for i := 0; i < len(elems); i++ {
		if elems[i].IntervalEnd {
			continue // the end of nothing (older nft writes one before the first range)
		}
		el := Element{Key: elems[i].Key}
		if i+1 < len(elems) && elems[i+1].IntervalEnd {
			el.End = elems[i+1].Key
			i++
		}
		out = append(out, el)
	}
	return out
}

// decodeVerdict is a map element's verdict as the library hands it over: the nested
// NFTA_VERDICT_CODE and NFTA_VERDICT_CHAIN attributes (nil when they don't read as one; the
// element then differs from any desired one and is written again).
func decodeVerdict(b []byte) *expr.Verdict {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil
	}
	ad.ByteOrder = binary.BigEndian
	var v expr.Verdict
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			v.Kind = expr.VerdictKind(int32(ad.Uint32()))
		case unix.NFTA_VERDICT_CHAIN:
			v.Chain = ad.String()
		}
	}
	if ad.Err() != nil {
		return nil
	}
	return &v
}

// toKernel are elements as the kernel takes them: a range is its start and its end.
func toKernel(s *Set, elems []Element) []nft.SetElement {
	out := make([]nft.SetElement, 0, len(elems))
	for _, e := range elems {
		out = append(out, nft.SetElement{Key: e.Key, VerdictData: e.Verdict})
		if s.Kind == Ranges && e.End != nil {
			out = append(out, nft.SetElement{Key: e.End, IntervalEnd: true})
		}
	}
	return out
}

// write queues p on c and sends it as one batch: the kernel applies all of it or none.
func write(c *nft.Conn, want *Table, p *plan, fps map[string][]string) error {
	t := &nft.Table{Family: family(want.Family), Name: want.Name}
	if p.addTable {
		c.AddTable(t)
	}
	chainRef := func(name string) *nft.Chain { return &nft.Chain{Table: t, Name: name} }
	for _, name := range p.flush {
		c.FlushChain(chainRef(name))
	}
	setRef := func(name string) *nft.Set { return &nft.Set{Table: t, Name: name} }
	wantSet := map[string]*Set{}
	for i := range want.Sets {
		wantSet[want.Sets[i].Name] = &want.Sets[i]
	}
	for _, name := range sortedKeys(p.delElems) {
		s := wantSet[name]
		d := s.declaration(want.Family)
		d.Table = t
		if err := c.SetDeleteElements(&d, toKernel(s, p.delElems[name])); err != nil {
			return fmt.Errorf("removing elements of set %s: %w", name, err)
		}
	}
	for _, name := range p.delSets {
		c.DelSet(setRef(name))
	}
	for _, name := range p.delChains {
		c.DelChain(chainRef(name))
	}
	for i := range p.addChains {
		ch := &p.addChains[i]
		nc := &nft.Chain{Table: t, Name: ch.Name}
		if h := ch.Hook; h != nil {
			hook, prio := h.Hook, nft.ChainPriority(h.Priority)
			nc.Type, nc.Hooknum, nc.Priority, nc.Policy = h.Type, &hook, &prio, &acceptPolicy
		}
		c.AddChain(nc)
	}
	// Sets made in this batch are looked up by their batch IDs.
	ids := map[string]uint32{}
	for _, s := range p.addSets {
		d := s.declaration(want.Family)
		d.Table = t
		if err := c.AddSet(&d, toKernel(s, s.Elements)); err != nil {
			return fmt.Errorf("adding set %s: %w", s.Name, err)
		}
		ids[s.Name] = d.ID
	}
	for _, name := range sortedKeys(p.addElems) {
		s := wantSet[name]
		d := s.declaration(want.Family)
		d.Table = t
		if err := c.SetAddElements(&d, toKernel(s, p.addElems[name])); err != nil {
			return fmt.Errorf("adding elements to set %s: %w", name, err)
		}
	}
	for _, ch := range p.fill {
		ref := chainRef(ch.Name)
		for i, r := range ch.Rules {
			ud := userdata.AppendString(nil, fingerprintType, fps[ch.Name][i])
			if r.Comment != "" {
				ud = userdata.AppendString(ud, userdata.TypeComment, r.Comment)
			}
			c.AddRule(&nft.Rule{Table: t, Chain: ref, Exprs: withSetIDs(r.Exprs, ids), UserData: ud})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("writing table %s %s: %w", familyName(want.Family), want.Name, err)
	}
	return nil
}

// withSetIDs are exprs with each lookup of a set made in the same batch given its ID.
func withSetIDs(exprs []expr.Any, ids map[string]uint32) []expr.Any {
	if len(ids) == 0 {
		return exprs
	}
	out := slices.Clone(exprs)
	for i, e := range out {
		if l, ok := e.(*expr.Lookup); ok {
			if id, ok := ids[l.SetName]; ok {
				c := *l
				c.SetID = id
				out[i] = &c
			}
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// remove deletes the table with everything in it, if it is there.
func remove(c *nft.Conn, f ipfamily.Family, name string) (bool, error) {
	if t, err := tableOf(c, f, name); t == nil || err != nil {
		return false, err
	}
	c.DelTable(&nft.Table{Family: family(f), Name: name})
	if err := c.Flush(); err != nil && !notFound(err) {
		return false, fmt.Errorf("removing table %s %s: %w", familyName(f), name, err)
	}
	return true, nil
}

func dropCounts(c *nft.Conn, f ipfamily.Family, name string, want func(string) bool) (map[string]uint64, error) {
	out := map[string]uint64{}
	t, err := tableOf(c, f, name)
	if err != nil {
		return nil, err
	}
	if t == nil {
		return out, nil
	}
	chains, rulesOf, err := chainRules(c, t, f, want)
	if err != nil {
		return nil, err
	}
	for i, ch := range chains {
		for _, r := range rulesOf[i] {
			n := len(r.Exprs)
			if n < 2 {
				continue
			}
			cnt, ok1 := r.Exprs[n-2].(*expr.Counter)
			v, ok2 := r.Exprs[n-1].(*expr.Verdict)
			if ok1 && ok2 && v.Kind == expr.VerdictDrop {
				out[ch.Name] += cnt.Packets
			}
		}
	}
	return out, nil
}

func cleanup(c *nft.Conn) ([]string, error) {
	var removed []string
	for _, f := range ipfamily.All {
		tables, err := c.ListTablesOfFamily(family(f))
		if err != nil {
			if notFound(err) {
				continue
			}
			return removed, fmt.Errorf("listing the %s tables: %w", familyName(f), err)
		}
		for _, t := range tables {
			if !strings.HasPrefix(t.Name, OwnedPrefix) {
				continue
			}
			c.DelTable(t)
			if err := c.Flush(); err != nil && !notFound(err) {
				return removed, fmt.Errorf("removing table %s %s: %w", familyName(f), t.Name, err)
			}
			removed = append(removed, "nftables table "+familyName(f)+" "+t.Name)
		}
	}
	return removed, nil
}
