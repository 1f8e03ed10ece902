package policy

import (
	"strconv"
	"strings"

	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/internal/netpol"
)

// The iptables renderer: the typed rules in iptables' notation, in the order iptables-save
// prints a rule (interfaces and addresses, the protocol, its matches, the comment, the
// target), so that the kernel's copy reads back identical and the syncer's comparison of
// what it wrote with what it reads holds.

// iptablesRule is r as agent/netfilter writes it: the matches, the comment apart (the
// syncer puts it after them), the target.
func iptablesRule(r *netpol.Rule) netfilter.Rule {
	return netfilter.Rule{Match: append(matchArgs(r), limitArgs(r.Limit)...), Comment: r.Comment, Target: targetArgs(r)}
}

// IPTablesText is r as one line of iptables-save, without "-A CHAIN": what the kernel's
// copy of the rule reads as.
func IPTablesText(r *netpol.Rule) string {
	f := matchArgs(r)
	if r.Comment != "" {
		f = append(f, "-m", "comment", "--comment", `"`+r.Comment+`"`)
	}
	// A deny log's rate limit comes after the comment: its rule is the Drop rule after it
	// with the limit and the log added.
	f = append(f, limitArgs(r.Limit)...)
	t := targetArgs(r)
	if r.Verdict == netpol.Log && len(t) > 3 {
		t[3] = `"` + t[3] + `"`
	}
	return strings.Join(append(f, t...), " ")
}

func matchArgs(r *netpol.Rule) []string {
	var m []string
	if r.InIface != "" {
		m = append(m, "-i", r.InIface)
	}
	if r.OutIface != "" {
		m = append(m, "-o", r.OutIface)
	}
	if r.Src.IsValid() {
		m = append(m, "-s", r.Src.String())
	}
	if r.Dst.IsValid() {
		m = append(m, "-d", r.Dst.String())
	}
	if r.Protocol != "" {
		m = append(m, "-p", r.Protocol)
	}
	if r.NotSYN {
		m = append(m, "-m", "tcp", "!", "--tcp-flags", "FIN,SYN,RST,ACK", "SYN")
	}
	for _, s := range r.Sets {
		m = append(m, "-m", "set", "--match-set", s.Set, [...]string{"src", "dst", "dst,dst"}[s.Dir])
	}
	if p := r.DstPorts; p != nil {
		ports := strconv.Itoa(int(p.First))
		if p.Last != p.First {
			ports += ":" + strconv.Itoa(int(p.Last))
		}
		m = append(m, "-m", r.Protocol, "--dport", ports)
	}
	if r.ICMPv6Type != nil {
		m = append(m, "-m", "icmp6", "--icmpv6-type", strconv.Itoa(int(*r.ICMPv6Type)))
	}
	switch r.CtState {
	case netpol.CtNew:
		m = append(m, "-m", "conntrack", "--ctstate", "NEW")
	case netpol.CtEstablished:
		m = append(m, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED")
	}
	if r.DstLocal {
		m = append(m, "-m", "addrtype", "--dst-type", "LOCAL")
	}
	return m
}

// limitArgs is a hashlimit table of its own (no mode: one bucket) with one entry, so its
// hash is one bucket big (the default is up to 8,192 buckets, 64 KiB, per table).
func limitArgs(l *netpol.RateLimit) []string {
	if l == nil {
		return nil
	}
	return []string{"-m", "hashlimit", "--hashlimit-upto", l.Rate, "--hashlimit-burst", strconv.Itoa(l.Burst),
		"--hashlimit-name", l.Name, "--hashlimit-htable-size", "1", "--hashlimit-htable-max", "4"}
}

func targetArgs(r *netpol.Rule) []string {
	switch r.Verdict {
	case netpol.Return:
		return []string{"-j", "RETURN"}
	case netpol.Drop:
		return []string{"-j", "DROP"}
	case netpol.Jump:
		return []string{"-j", r.Target}
	case netpol.Goto:
		return []string{"-g", r.Target}
	case netpol.Log:
		if l := r.Log; l != nil {
			return []string{"-j", "NFLOG", "--nflog-prefix", l.Prefix, "--nflog-group", strconv.Itoa(int(l.Group)), "--nflog-size", strconv.Itoa(l.Size)}
		}
	}
	return nil
}
