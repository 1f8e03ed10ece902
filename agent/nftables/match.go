package nftables

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// The expressions of the matches and verdicts Trellis's rules use, as nft itself compiles
// them (`nft --debug=netlink` prints the same), so that `nft list` shows them as one
// would write them.

// reg is the 128-bit register a match loads into; concatenations use the 32-bit
// registers from reg32 on (each part takes whole ones).
const (
	reg   = 1
	reg32 = 9
)

// Iface matches the packet's input (in) or output interface by name; a name ending in
// "+" matches every interface whose name starts with the rest, as iptables writes it.
func Iface(in bool, name string) []expr.Any {
	key := expr.MetaKeyOIFNAME
	if in {
		key = expr.MetaKeyIIFNAME
	}
	data := []byte(name + "\x00")
	if p, ok := strings.CutSuffix(name, "+"); ok {
		data = []byte(p)
	}
	return []expr.Any{
		&expr.Meta{Key: key, Register: reg},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: data},
	}
}

// addrField is where the packet's source (src) or destination address is in family f's
// network header, and how long it is.
func addrField(f ipfamily.Family, src bool) (offset, length uint32) {
	if f == ipfamily.IPv6 {
		if src {
			return 8, 16
		}
		return 24, 16
	}
	if src {
		return 12, 4
	}
	return 16, 4
}

// loadAddr loads the packet's source or destination address into register r.
func loadAddr(f ipfamily.Family, src bool, r uint32) *expr.Payload {
	off, n := addrField(f, src)
	return &expr.Payload{DestRegister: r, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}
}

// Addr matches the packet's source (src) or destination address being in p.
func Addr(f ipfamily.Family, src bool, p netip.Prefix) []expr.Any {
	p = p.Masked()
	out := []expr.Any{loadAddr(f, src, reg)}
	if p.Bits() < p.Addr().BitLen() {
		m := make([]byte, p.Addr().BitLen()/8)
		for i := 0; i < p.Bits(); i++ {
			m[i/8] |= 0x80 >> (i % 8)
		}
		out = append(out, &expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: uint32(len(m)), Mask: m, Xor: make([]byte, len(m))})
	}
	return append(out, &expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: p.Addr().AsSlice()})
}

// InSet matches the packet's source (src) or destination address being in the Addrs or
// Ranges set named set.
func InSet(f ipfamily.Family, src bool, set string) []expr.Any {
	return []expr.Any{loadAddr(f, src, reg), &expr.Lookup{SourceRegister: reg, SetName: set}}
}

// DstAddrProtoPortInSet matches the packet's destination address, protocol and port being
// in the AddrProtoPorts set named set.
func DstAddrProtoPortInSet(f ipfamily.Family, set string) []expr.Any {
	_, n := addrField(f, false)
	proto := reg32 + n/4
	return []expr.Any{
		loadAddr(f, false, reg32),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: proto},
		&expr.Payload{DestRegister: proto + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: reg32, SetName: set},
	}
}

// Protocols are the protocol names rules use, by number.
var Protocols = map[string]uint8{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP, "icmp": unix.IPPROTO_ICMP, "ipv6-icmp": unix.IPPROTO_ICMPV6}

// Protocol matches the packet's transport protocol (the last header, past IPv6's
// extension headers).
func Protocol(name string) ([]expr.Any, error) {
	p, ok := Protocols[name]
	if !ok {
		return nil, fmt.Errorf("protocol %q: not one of tcp, udp, sctp, icmp, ipv6-icmp", name)
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{p}},
	}, nil
}

// DstPorts matches the destination port (of TCP, UDP or SCTP: after a Protocol match)
// being from first to last.
func DstPorts(first, last uint16) []expr.Any {
	load := &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	if first == last {
		return []expr.Any{load, &expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: binaryutil.BigEndian.PutUint16(first)}}
	}
	return []expr.Any{load, &expr.Range{Op: expr.CmpOpEq, Register: reg, FromData: binaryutil.BigEndian.PutUint16(first), ToData: binaryutil.BigEndian.PutUint16(last)}}
}

// TCP flags.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// NotSYN matches a TCP segment other than a connection's first: of FIN, SYN, RST and ACK,
// anything but SYN alone (iptables' `! --tcp-flags FIN,SYN,RST,ACK SYN`).
func NotSYN() []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 1, Mask: []byte{tcpFIN | tcpSYN | tcpRST | tcpACK}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg, Data: []byte{tcpSYN}},
	}
}

// ICMPv6Type matches an ICMPv6 message's type (after a Protocol match).
func ICMPv6Type(t uint8) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{t}},
	}
}

// Connection-tracking states, as `ct state` tests them.
const (
	CtInvalid     uint32 = 1
	CtEstablished uint32 = 2
	CtRelated     uint32 = 4
	CtNew         uint32 = 8
)

// CtState matches a packet whose connection-tracking state is one of states (a mask of
// the Ct constants).
func CtState(states uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: reg},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(states), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg, Data: make([]byte, 4)},
	}
}

// DstLocal matches a packet whose destination is an address of this node (`fib daddr type
// local`).
func DstLocal() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: reg, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

// IfaceMap sends the packet where the IfaceVerdicts map named set says for its input (in)
// or output interface; a packet whose interface isn't in it goes on to the next rule.
func IfaceMap(in bool, set string) []expr.Any {
	key := expr.MetaKeyOIFNAME
	if in {
		key = expr.MetaKeyIIFNAME
	}
	return []expr.Any{
		&expr.Meta{Key: key, Register: reg},
		&expr.Lookup{SourceRegister: reg, DestRegister: 0, IsDestRegSet: true, SetName: set},
	}
}

// Log sends the packet to the nfnetlink_log group with prefix, copying at most size bytes
// of it (iptables' NFLOG target); the rule goes on after it.
func Log(prefix string, group uint16, size uint32) []expr.Any {
	return []expr.Any{&expr.Log{
		Key:     1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX | 1<<unix.NFTA_LOG_SNAPLEN,
		Group:   group,
		Snaplen: size,
		Data:    []byte(prefix),
	}}
}

// Limit matches at most rate packets ("10/sec", "5/min", "7/hour", "2/day"), with burst
// more at once: the rule's own token bucket.
func Limit(rate string, burst int) ([]expr.Any, error) {
	n, unit, ok := strings.Cut(rate, "/")
	r, err := strconv.ParseUint(n, 10, 32)
	if !ok || err != nil || r == 0 {
		return nil, fmt.Errorf("rate %q: not a number of packets per sec, min, hour or day", rate)
	}
	units := map[string]expr.LimitTime{"sec": expr.LimitTimeSecond, "second": expr.LimitTimeSecond, "s": expr.LimitTimeSecond,
		"min": expr.LimitTimeMinute, "minute": expr.LimitTimeMinute, "m": expr.LimitTimeMinute,
		"hour": expr.LimitTimeHour, "h": expr.LimitTimeHour, "day": expr.LimitTimeDay, "d": expr.LimitTimeDay}
	u, ok := units[unit]
	if !ok {
		return nil, fmt.Errorf("rate %q: the unit must be sec, min, hour or day", rate)
	}
	if burst < 0 {
		return nil, fmt.Errorf("burst %d: must not be negative", burst)
	}
	return []expr.Any{&expr.Limit{Type: expr.LimitTypePkts, Rate: r, Unit: u, Burst: uint32(burst)}}, nil
}

// Counter counts the packets and bytes that reach it.
func Counter() []expr.Any { return []expr.Any{&expr.Counter{}} }

// Verdicts.

func Accept() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}} }
func Drop() []expr.Any   { return []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}} }
func Return() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}} }
func Jump(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}
func Goto(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}}
}
