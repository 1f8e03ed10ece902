// Package nftables keeps tables Trellis owns in the kernel's nftables as a desired Table
// says, over netlink (github.com/google/nftables: no nft binary, no exec per change).
//
// A Table is typed: chains of rules made of the kernel's own expressions (match.go builds
// them), sets and verdict maps with typed elements. A Syncer writes the difference between
// what it wrote last (or, when asked to verify, what it reads back from the kernel) and the
// desired Table as one netlink batch, which the kernel applies atomically: a chain whose
// rules changed is flushed and refilled, a set gains and loses just the elements that
// changed, and nothing else is touched. The diff is a pure function (plan.go) tested
// without a kernel; kernel.go is the only code that speaks netlink.
package nftables

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"

	nft "github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// PolicyTable is the name of the table, in each family, that holds the policy dataplane's
// rules (agent/policy writes it; diagnostics and the uninstall read it by this name).
const PolicyTable = "trellis-policy"

// Table is the desired content of one table: everything in it is Trellis's, and anything
// in it the Table doesn't name is removed.
type Table struct {
	Family ipfamily.Family
	Name   string
	Chains []Chain
	Sets   []Set
}

// Hook makes a chain a base chain: the kernel runs it for every packet at Hook, in
// Priority order with every other base chain there (of any table, and iptables' too).
// A drop in any of them is final; an accept ends only its own chain.
type Hook struct {
	Type     nft.ChainType
	Hook     nft.ChainHook
	Priority int32
}

// Chain is a chain and its rules, in order; a base chain when Hook is set (its policy is
// accept: a packet no rule decides goes on to the hook's other chains).
type Chain struct {
	Name  string
	Hook  *Hook
	Rules []Rule
}

// Rule is one rule: its expressions and a comment for people reading `nft list`.
type Rule struct {
	Exprs   []expr.Any
	Comment string
}

// SetKind is what a set holds, which decides its key type and how its elements are
// written.
type SetKind uint8

const (
	// Addrs: addresses of the table's family.
	Addrs SetKind = iota
	// Ranges: address ranges (an interval set): CIDRs, and CIDRs with exceptions.
	Ranges
	// AddrProtoPorts: address . protocol . port (a concatenation).
	AddrProtoPorts
	// IfaceVerdicts: a verdict map keyed by interface name.
	IfaceVerdicts
)

// Set is a named set (or verdict map) of the table.
type Set struct {
	Name     string
	Kind     SetKind
	Elements []Element
	Comment  string
}

// Element is one element of a set, made by AddrElement, RangeElement, AddrProtoPortElement
// or IfaceVerdictElement.
type Element struct {
	// Key is the element's key as the kernel stores it; End, for a range, is the first
	// address after it (nil: the range runs to the family's last address).
	Key, End []byte
	// Verdict is a map element's value.
	Verdict *expr.Verdict
}

// AddrElement is an element of an Addrs set.
func AddrElement(a netip.Addr) Element { return Element{Key: a.AsSlice()} }

// AddrProtoPortElement is an element of an AddrProtoPorts set: each part of a
// concatenation takes a whole number of 32-bit registers.
func AddrProtoPortElement(a netip.Addr, proto uint8, port uint16) Element {
	k := append(a.AsSlice(), proto, 0, 0, 0, byte(port>>8), byte(port), 0, 0)
	return Element{Key: k}
}

// IfaceVerdictElement is an element of an IfaceVerdicts map: the interface's name, as the
// kernel compares it (IFNAMSIZ bytes, zero-padded), and the verdict.
func IfaceVerdictElement(iface string, v expr.Verdict) Element {
	return Element{Key: ifname(iface), Verdict: &v}
}

// RangeElement is an element of a Ranges set: first to last, inclusive.
func RangeElement(first, last netip.Addr) Element {
	e := Element{Key: first.AsSlice()}
	if next := last.Next(); next.IsValid() {
		e.End = next.AsSlice()
	}
	return e
}

// ifname is iface as the kernel's ifname type holds it.
func ifname(iface string) []byte {
	b := make([]byte, 16)
	copy(b, iface)
	return b
}

// id tells elements apart: two elements with the same id are the same element.
func (e Element) id() string {
	s := hex.EncodeToString(e.Key)
	if e.End != nil {
		s += "-" + hex.EncodeToString(e.End)
	}
	if e.Verdict != nil {
		s += ":" + verdictString(*e.Verdict)
	}
	return s
}

func verdictString(v expr.Verdict) string {
	switch v.Kind {
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictReturn:
		return "return"
	case expr.VerdictJump:
		return "jump " + v.Chain
	case expr.VerdictGoto:
		return "goto " + v.Chain
	}
	return fmt.Sprintf("verdict(%d)", v.Kind)
}

// family is f's nftables table family.
func family(f ipfamily.Family) nft.TableFamily {
	if f == ipfamily.IPv6 {
		return nft.TableFamilyIPv6
	}
	return nft.TableFamilyIPv4
}

// familyName is f's table family as nft names it.
func familyName(f ipfamily.Family) string {
	if f == ipfamily.IPv6 {
		return "ip6"
	}
	return "ip"
}

// declaration is what the kernel must be told of a set when it is made: a set whose
// declaration changes is made again.
func (s *Set) declaration(f ipfamily.Family) nft.Set {
	addr := nft.TypeIPAddr
	if f == ipfamily.IPv6 {
		addr = nft.TypeIP6Addr
	}
	d := nft.Set{Name: s.Name, KeyType: addr, Comment: s.Comment}
	switch s.Kind {
	case Ranges:
		d.Interval = true
	case AddrProtoPorts:
		d.Concatenation = true
		d.KeyType, _ = nft.ConcatSetType(addr, nft.TypeInetProto, nft.TypeInetService)
	case IfaceVerdicts:
		// Host order, as nft declares ifname keys (it prints them right then).
		d.IsMap, d.KeyType, d.DataType, d.KeyByteOrder = true, nft.TypeIFName, nft.TypeVerdict, binaryutil.NativeEndian
	}
	return d
}

// declKey is a set's declaration as a comparable string: its kind and the length of its
// key and data (a map's key and data types read back from the kernel may come swapped, so
// only their sum is compared).
func declKey(d nft.Set) string {
	return fmt.Sprintf("%d/%t/%t/%t", d.KeyType.Bytes+d.DataType.Bytes, d.Interval, d.IsMap, d.Concatenation)
}

// hookKey is a base chain's hook as a comparable string ("" for a regular chain).
func hookKey(h *Hook) string {
	if h == nil {
		return ""
	}
	return fmt.Sprintf("%s/%d/%d", h.Type, h.Hook, h.Priority)
}

// fingerprint identifies a rule's content: the kernel keeps it in the rule's user data
// (beside the comment), so a chain read back is compared with the desired one without
// decoding expressions. Set IDs, which a batch assigns, are not part of it.
func (r *Rule) fingerprint(f ipfamily.Family) (string, error) {
	h := sha256.New()
	for _, e := range r.Exprs {
		if l, ok := e.(*expr.Lookup); ok {
			c := *l
			c.SetID = 0
			e = &c
		}
		b, err := expr.Marshal(byte(family(f)), e)
		if err != nil {
			return "", fmt.Errorf("rule %q: %w", r.Comment, err)
		}
		h.Write(b)
	}
	h.Write([]byte(r.Comment))
	return hex.EncodeToString(h.Sum(nil)[:12]), nil
}

// Validate checks what the kernel would refuse less clearly: names and references.
func (t *Table) Validate() error {
	if t.Name == "" {
		return fmt.Errorf("nftables table: no name")
	}
	chains := map[string]bool{}
	for _, c := range t.Chains {
		if c.Name == "" || len(c.Name) > 255 {
			return fmt.Errorf("table %s: chain name %q: must be 1 to 255 characters", t.Name, c.Name)
		}
		if chains[c.Name] {
			return fmt.Errorf("table %s: chain %s is there twice", t.Name, c.Name)
		}
		chains[c.Name] = true
	}
	sets := map[string]bool{}
	for i := range t.Sets {
		s := &t.Sets[i]
		if s.Name == "" || len(s.Name) > 255 {
			return fmt.Errorf("table %s: set name %q: must be 1 to 255 characters", t.Name, s.Name)
		}
		if sets[s.Name] {
			return fmt.Errorf("table %s: set %s is there twice", t.Name, s.Name)
		}
		sets[s.Name] = true
		for _, e := range s.Elements {
			if v := e.Verdict; v != nil && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) && !chains[v.Chain] {
				return fmt.Errorf("table %s: map %s sends %x to chain %s, which the table doesn't have", t.Name, s.Name, bytes.TrimRight(e.Key, "\x00"), v.Chain)
			}
		}
	}
	for _, c := range t.Chains {
		for _, r := range c.Rules {
			for _, e := range r.Exprs {
				switch e := e.(type) {
				case *expr.Verdict:
					if (e.Kind == expr.VerdictJump || e.Kind == expr.VerdictGoto) && !chains[e.Chain] {
						return fmt.Errorf("table %s: chain %s jumps to chain %s, which the table doesn't have", t.Name, c.Name, e.Chain)
					}
				case *expr.Lookup:
					if !sets[e.SetName] {
						return fmt.Errorf("table %s: chain %s looks up set %s, which the table doesn't have", t.Name, c.Name, e.SetName)
					}
				}
			}
		}
	}
	return nil
}

// String is the table in nft's notation, roughly, for people and test failures: chains
// with their hooks and rule comments, sets with their element count.
func (t *Table) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table %s %s\n", familyName(t.Family), t.Name)
	for _, c := range t.Chains {
		fmt.Fprintf(&b, "  chain %s %s (%d rules)\n", c.Name, hookKey(c.Hook), len(c.Rules))
	}
	for _, s := range t.Sets {
		fmt.Fprintf(&b, "  set %s kind %d (%d elements)\n", s.Name, s.Kind, len(s.Elements))
	}
	return b.String()
}
