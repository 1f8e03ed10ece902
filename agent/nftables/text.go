package nftables

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// Describe is family f's table name as the kernel holds it, as text for people (a
// sysdump, a support ticket): each chain's hook, each rule's expressions in nft's terms
// with its counter and comment, each set's elements. No nft binary is needed, so the
// agent's image carries none. A table that isn't there is "".
func (s *Syncer) Describe(ctx context.Context, f ipfamily.Family, name string) (string, error) {
	return withConn(ctx, s.NetNS, func(c *nft.Conn) (string, error) { return describe(c, f, name) })
}

func describe(c *nft.Conn, f ipfamily.Family, name string) (string, error) {
	t, err := tableOf(c, f, name)
	if t == nil || err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table %s %s {\n", familyName(f), name)
	sets, err := c.GetSets(t)
	if err != nil {
		return "", fmt.Errorf("listing the sets of table %s %s: %w", familyName(f), name, err)
	}
	for _, st := range sets {
		elems, err := c.GetSetElements(st)
		if err != nil {
			return "", fmt.Errorf("reading set %s: %w", st.Name, err)
		}
		kind := "set"
		if st.IsMap {
			kind = "map"
		}
		fmt.Fprintf(&b, "\t%s %s { # %d elements\n", kind, st.Name, len(fromKernel(st, elems)))
		for _, e := range fromKernel(st, elems) {
			fmt.Fprintf(&b, "\t\t%s\n", elementText(st, e))
		}
		b.WriteString("\t}\n")
	}
	chains, rulesOf, err := chainRules(c, t, f, nil)
	if err != nil {
		return "", err
	}
	for i, ch := range chains {
		fmt.Fprintf(&b, "\tchain %s {", ch.Name)
		if ch.Hooknum != nil && ch.Priority != nil {
			fmt.Fprintf(&b, " # type %s hook %s priority %d", ch.Type, hookName(*ch.Hooknum), int32(*ch.Priority))
		}
		b.WriteString("\n")
		for _, r := range rulesOf[i] {
			fmt.Fprintf(&b, "\t\t%s", exprsText(f, r.Exprs))
			if cm, ok := userdata.GetString(r.UserData, userdata.TypeComment); ok && cm != "" {
				fmt.Fprintf(&b, " comment %q", cm)
			}
			fmt.Fprintf(&b, " # handle %d\n", r.Handle)
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String(), nil
}

func hookName(h nft.ChainHook) string {
	switch h {
	case *nft.ChainHookPrerouting:
		return "prerouting"
	case *nft.ChainHookInput:
		return "input"
	case *nft.ChainHookForward:
		return "forward"
	case *nft.ChainHookOutput:
		return "output"
	case *nft.ChainHookPostrouting:
		return "postrouting"
	}
	return fmt.Sprint(uint32(h))
}

func elementText(s *nft.Set, e Element) string {
	key := keyText(s, e.Key)
	if e.End != nil {
		key += "-" + keyText(s, e.End) + ")"
		key = "[" + key
	}
	if e.Verdict != nil {
		key += " : " + verdictString(*e.Verdict)
	}
	return key
}

func keyText(s *nft.Set, k []byte) string {
	switch {
	case s.IsMap:
		return fmt.Sprintf("%q", strings.TrimRight(string(k), "\x00"))
	case len(k) == 4 || len(k) == 16:
		if a, ok := netip.AddrFromSlice(k); ok {
			return a.String()
		}
	case len(k) == 12 || len(k) == 24: // address . protocol . port
		n := len(k) - 8
		if a, ok := netip.AddrFromSlice(k[:n]); ok {
			return fmt.Sprintf("%s . %s . %d", a, protoName(k[n]), int(k[n+4])<<8|int(k[n+5]))
		}
	}
	return hex.EncodeToString(k)
}

func protoName(p uint8) string {
	for name, n := range Protocols {
		if n == p {
			return name
		}
	}
	return fmt.Sprint(p)
}

// exprsText is a rule's expressions, each as nft's debug output names it.
func exprsText(f ipfamily.Family, es []expr.Any) string {
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, exprText(f, e))
	}
	return strings.Join(out, " ")
}

func exprText(f ipfamily.Family, e expr.Any) string {
	switch e := e.(type) {
	case *expr.Meta:
		return fmt.Sprintf("[meta %s]", metaName(e.Key))
	case *expr.Cmp:
		op := map[expr.CmpOp]string{expr.CmpOpEq: "==", expr.CmpOpNeq: "!=", expr.CmpOpLt: "<", expr.CmpOpLte: "<=", expr.CmpOpGt: ">", expr.CmpOpGte: ">="}[e.Op]
		return fmt.Sprintf("[cmp %s %s]", op, dataText(e.Data))
	case *expr.Payload:
		base := map[expr.PayloadBase]string{expr.PayloadBaseLLHeader: "link", expr.PayloadBaseNetworkHeader: "network", expr.PayloadBaseTransportHeader: "transport"}[e.Base]
		return fmt.Sprintf("[payload %s +%d/%d]", base, e.Offset, e.Len)
	case *expr.Bitwise:
		return fmt.Sprintf("[bitwise & %s]", hex.EncodeToString(e.Mask))
	case *expr.Lookup:
		if e.IsDestRegSet {
			return "[vmap @" + e.SetName + "]"
		}
		return "[lookup @" + e.SetName + "]"
	case *expr.Range:
		return fmt.Sprintf("[range %s-%s]", dataText(e.FromData), dataText(e.ToData))
	case *expr.Ct:
		return "[ct state]"
	case *expr.Fib:
		return "[fib daddr type]"
	case *expr.Counter:
		return fmt.Sprintf("counter packets %d bytes %d", e.Packets, e.Bytes)
	case *expr.Limit:
		return fmt.Sprintf("limit rate %d/%s burst %d", e.Rate, map[expr.LimitTime]string{expr.LimitTimeSecond: "second", expr.LimitTimeMinute: "minute", expr.LimitTimeHour: "hour", expr.LimitTimeDay: "day"}[e.Unit], e.Burst)
	case *expr.Log:
		return fmt.Sprintf("log group %d prefix %q", e.Group, string(e.Data))
	case *expr.Verdict:
		return verdictString(*e)
	}
	return fmt.Sprintf("[%T]", e)
}

func metaName(k expr.MetaKey) string {
	switch k {
	case expr.MetaKeyIIFNAME:
		return "iifname"
	case expr.MetaKeyOIFNAME:
		return "oifname"
	case expr.MetaKeyL4PROTO:
		return "l4proto"
	}
	return fmt.Sprint(uint32(k))
}

// dataText is a compared value: printable text (an interface name) as a string, the rest
// as hex.
func dataText(d []byte) string {
	s := strings.TrimRight(string(d), "\x00")
	printable := s != ""
	for _, r := range s {
		if r < 0x20 || r > 0x7e {
			printable = false
		}
	}
	if printable {
		return fmt.Sprintf("%q", s)
	}
	return "0x" + hex.EncodeToString(d)
}
