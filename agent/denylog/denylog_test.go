package denylog

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/trellis-net/trellis/internal/netpol"
	"github.com/vishvananda/netlink/nl"
)

// message builds an NFULNL_MSG_PACKET body as the kernel sends it.
func message(prefix string, hook uint8, in, out uint32, payload []byte) []byte {
	b := []byte{2, 0, 0x1d, 0x01} // nfgenmsg: AF_INET, v0, group 7425
	add := func(typ int, v []byte) { b = append(b, nl.NewRtAttr(typ, v).Serialize()...) }
	add(attrPacketHdr, []byte{0x08, 0x00, hook, 0})
	if in != 0 {
		add(attrInDev, be32(in))
	}
	if out != 0 {
		add(attrOutDev, be32(out))
	}
	add(attrPrefix, append([]byte(prefix), 0))
	add(attrPayload, payload)
	return b
}

func ipv4(proto byte, src, dst string, l4 []byte) []byte {
	h := make([]byte, 20)
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(l4)))
	h[9] = proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	return append(h, l4...)
}

// ipv6 is an IPv6 packet whose fixed header says next, followed by ext (extension
// headers, already chained) and l4.
func ipv6(next byte, src, dst string, ext, l4 []byte) []byte {
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(ext)+len(l4)))
	h[6], h[7] = next, 64
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	return append(append(h, ext...), l4...)
}

func tcp(sport, dport uint16, flags byte) []byte {
	b := make([]byte, 20)
	binary.BigEndian.PutUint16(b, sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	b[12], b[13] = 5<<4, flags
	return b
}

func TestParseMessage(t *testing.T) {
	v6a, v6b := netip.MustParseAddr("fd00:10:244:1::5"), netip.MustParseAddr("fd00:10:244:1::6")
	for _, tc := range []struct {
		name string
		msg  []byte
		ok   bool
		want Packet
	}{
		{"TCP SYN forwarded to a pod", message("TRELLIS-I-ABC 2", HookForward, 7, 9, ipv4(6, "10.244.1.5", "10.244.1.6", tcp(40000, 80, 0x02))), true,
			Packet{Prefix: "TRELLIS-I-ABC 2", Hook: HookForward, InIfindex: 7, OutIfindex: 9, Src: netip.MustParseAddr("10.244.1.5"), Dst: netip.MustParseAddr("10.244.1.6"), Protocol: "tcp", SrcPort: 40000, DstPort: 80, SYN: true}},
		{"TCP ACK is no SYN", message("p 0", HookForward, 7, 9, ipv4(6, "10.0.0.1", "10.0.0.2", tcp(1, 2, 0x12))), true,
			Packet{Prefix: "p 0", Hook: HookForward, InIfindex: 7, OutIfindex: 9, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Protocol: "tcp", SrcPort: 1, DstPort: 2}},
		{"UDP to the node (INPUT)", message("p 1", HookLocalIn, 7, 0, ipv4(17, "10.0.0.1", "198.51.100.1", []byte{0x30, 0x39, 0, 53, 0, 9, 0, 0})), true,
			Packet{Prefix: "p 1", Hook: HookLocalIn, InIfindex: 7, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("198.51.100.1"), Protocol: "udp", SrcPort: 12345, DstPort: 53}},
		{"ICMP has no ports", message("p 3", HookForward, 1, 2, ipv4(1, "10.0.0.1", "10.0.0.2", []byte{8, 0, 0, 0})), true,
			Packet{Prefix: "p 3", Hook: HookForward, InIfindex: 1, OutIfindex: 2, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Protocol: "icmp"}},
		{"truncated TCP header keeps addresses", message("p 4", HookForward, 1, 2, ipv4(6, "10.0.0.1", "10.0.0.2", []byte{0, 1})), true,
			Packet{Prefix: "p 4", Hook: HookForward, InIfindex: 1, OutIfindex: 2, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Protocol: "tcp"}},
		{"IPv6 TCP SYN forwarded to a pod", message("TRELLIS-I-ABC 2", HookForward, 7, 9, ipv6(6, "fd00:10:244:1::5", "fd00:10:244:1::6", nil, tcp(40000, 80, 0x02))), true,
			Packet{Prefix: "TRELLIS-I-ABC 2", Hook: HookForward, InIfindex: 7, OutIfindex: 9, Src: v6a, Dst: v6b, Protocol: "tcp", SrcPort: 40000, DstPort: 80, SYN: true}},
		{"IPv6 UDP after hop-by-hop and destination options", message("p 7", HookLocalIn, 7, 0, ipv6(0, "fd00:10:244:1::5", "fd00:10:244:1::6",
			append([]byte{60, 0, 1, 4, 0, 0, 0, 0}, 17, 1, 1, 4, 0, 0, 0, 0, 1, 6, 0, 0, 0, 0, 0, 0), []byte{0x30, 0x39, 0, 53, 0, 9, 0, 0})), true,
			Packet{Prefix: "p 7", Hook: HookLocalIn, InIfindex: 7, Src: v6a, Dst: v6b, Protocol: "udp", SrcPort: 12345, DstPort: 53}},
		{"IPv6 SCTP in a first fragment has ports", message("p 8", HookForward, 1, 2, ipv6(44, "fd00:10:244:1::5", "fd00:10:244:1::6",
			[]byte{132, 0, 0, 1, 0, 0, 0, 9}, []byte{0x13, 0x88, 0x0b, 0xb8, 0, 0, 0, 0})), true,
			Packet{Prefix: "p 8", Hook: HookForward, InIfindex: 1, OutIfindex: 2, Src: v6a, Dst: v6b, Protocol: "sctp", SrcPort: 5000, DstPort: 3000}},
		{"IPv6 later fragment has no ports", message("p 9", HookForward, 1, 2, ipv6(44, "fd00:10:244:1::5", "fd00:10:244:1::6",
			[]byte{17, 0, 0x05, 0x01, 0, 0, 0, 9}, []byte{0x30, 0x39, 0, 53})), true,
			Packet{Prefix: "p 9", Hook: HookForward, InIfindex: 1, OutIfindex: 2, Src: v6a, Dst: v6b, Protocol: "udp"}},
		{"ICMPv6 has no ports", message("p 10", HookForward, 1, 2, ipv6(58, "fd00:10:244:1::5", "fd00:10:244:1::6", nil, []byte{128, 0, 0, 0})), true,
			Packet{Prefix: "p 10", Hook: HookForward, InIfindex: 1, OutIfindex: 2, Src: v6a, Dst: v6b, Protocol: "icmpv6"}},
		{"IPv6 extension chain cut by the copy keeps addresses", message("p 11", HookForward, 1, 2, ipv6(0, "fd00:10:244:1::5", "fd00:10:244:1::6", []byte{6, 3, 0, 0}, nil)), true,
			Packet{Prefix: "p 11", Hook: HookForward, InIfindex: 1, OutIfindex: 2, Src: v6a, Dst: v6b, Protocol: "0"}},
		{"truncated IPv6 header", message("p 5", HookForward, 1, 2, []byte{0x60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}), false, Packet{}},
		{"no payload", message("p 6", HookForward, 1, 2, nil), false, Packet{}},
		{"short message", []byte{2, 0}, false, Packet{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseMessage(tc.msg)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if ok && got != tc.want {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestLimiter(t *testing.T) {
	t0 := time.Unix(1000, 0)
	syn := func(sport uint16) Packet {
		return Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Protocol: "tcp", SrcPort: sport, DstPort: 80}
	}
	l := NewLimiter(3, 30*time.Second)
	for _, step := range []struct {
		name string
		p    Packet
		at   time.Duration
		ok   bool
		why  string
	}{
		{"first attempt", syn(1), 0, true, ""},
		{"its retransmitted SYN", syn(1), time.Second, false, SuppressedRepeat},
		{"again 7 s later", syn(1), 7 * time.Second, false, SuppressedRepeat},
		{"another attempt (new source port)", syn(2), 7 * time.Second, true, ""},
		{"a third", syn(3), 7 * time.Second, true, ""},
		{"a fourth (the bucket holds one second's worth: 3)", syn(4), 7 * time.Second, true, ""},
		{"a fifth in the same second: over the bound", syn(5), 7 * time.Second, false, SuppressedRate},
		{"the fifth a second later", syn(5), 8 * time.Second, true, ""},
		{"the first 5-tuple after the window: a new attempt", syn(1), 31 * time.Second, true, ""},
	} {
		ok, why := l.Admit("shop", step.p, t0.Add(step.at))
		if ok != step.ok || why != step.why {
			t.Errorf("%s: Admit = %v, %q, want %v, %q", step.name, ok, why, step.ok, step.why)
		}
	}
}

// One namespace's flood uses up its own share of the bound, never another's: with the
// bound split between two namespaces, a flood of distinct attempts in "shop" gets shop's
// share (and no more), and "bank"'s attempts during the flood all get their lines.
func TestLimiterSharesPerNamespace(t *testing.T) {
	t0 := time.Unix(1000, 0)
	pkt := func(src string, sport uint16) Packet {
		return Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr("10.0.0.2"), Protocol: "udp", SrcPort: sport, DstPort: 53}
	}
	for _, tc := range []struct {
		name              string
		perSecond, shares int
		wantShop          int // lines of the flood in 2 s: the share a second, plus one second's burst
	}{
		{"two namespaces split 20 a second", 20, 2, 10 + 2*10},
		{"three namespaces split 10 a second (3.33 each, burst 3)", 10, 3, 3 + 6},
		{"more namespaces than lines a second (burst 1)", 2, 4, 1 + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLimiter(tc.perSecond, 30*time.Second)
			l.SetBound(tc.perSecond, tc.shares)
			shop, bank := 0, 0
			// 2 s of a 10,000 attempts a second flood from shop; bank makes one attempt
			// every 100 ms, up to its burst in all (bank's own rate is never exceeded).
			_, burst := netpol.DenyLogShare(tc.perSecond, tc.shares)
			for i := range 20000 {
				now := t0.Add(time.Duration(i) * 100 * time.Microsecond)
				if ok, _ := l.Admit("shop", pkt("10.0.1.1", uint16(i)), now); ok {
					shop++
				}
				if i%1000 == 500 && bank < burst {
					if ok, why := l.Admit("bank", pkt("10.0.2.1", uint16(i)), now); ok {
						bank++
					} else {
						t.Errorf("bank's attempt %d at %v during shop's flood: suppressed (%s)", bank+1, now.Sub(t0), why)
					}
				}
			}
			if shop < tc.wantShop-1 || shop > tc.wantShop+1 {
				t.Errorf("shop's flood got %d lines in 2 s, want its share: %d", shop, tc.wantShop)
			}
			if bank != burst {
				t.Errorf("bank got %d lines, want %d", bank, burst)
			}
		})
	}
}

// A new bound (the ClusterNetwork's linesPerSecond edited while the agent runs) applies to
// the next packet: each namespace starts with a full bucket of its new share.
func TestLimiterNewBound(t *testing.T) {
	now := time.Unix(1000, 0)
	l := NewLimiter(2, 30*time.Second)
	admitted := func(n int) (ok int) {
		for i := range n {
			p := Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Protocol: "udp", SrcPort: uint16(i), DstPort: 53}
			if yes, _ := l.Admit("shop", p, now); yes {
				ok++
			}
		}
		l.seen = map[flow]time.Time{} // only the bound counts here, not the repeats
		return ok
	}
	for _, step := range []struct {
		perSecond, shares, want int
	}{
		{2, 1, 2},  // NewLimiter's bound: a burst of 2, then nothing this instant
		{5, 1, 5},  // raised: a full bucket of 5 at once
		{5, 1, 0},  // unchanged: the bucket stays empty
		{10, 2, 5}, // raised and split: shop's share is 5
		{1, 1, 1},  // lowered
	} {
		l.SetBound(step.perSecond, step.shares)
		if got := admitted(20); got != step.want {
			t.Errorf("bound %d/s in %d shares: %d of 20 packets admitted at once, want %d", step.perSecond, step.shares, got, step.want)
		}
	}
}

// The limiter's memory is bounded whatever names it is given: at most MaxBuckets buckets
// (plus the shared one) and maxFlows remembered attempts. A bucket that is not full is
// never forgotten (that would hand its namespace a fresh burst); a full one may be.
func TestLimiterMemoryBound(t *testing.T) {
	t0 := time.Unix(1000, 0)
	pkt := func(i int) Packet {
		return Packet{Src: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), Dst: netip.MustParseAddr("10.0.0.2"), Protocol: "tcp", SrcPort: uint16(i), DstPort: 80}
	}
	l := NewLimiter(1, 30*time.Second) // one line a second: a used bucket stays not full for 1 s
	for i := range 3 * MaxBuckets {
		l.Admit("ns-"+strconv.Itoa(i), pkt(i), t0.Add(time.Duration(i)*time.Microsecond))
		if n := l.Buckets(); n > MaxBuckets+1 {
			t.Fatalf("%d buckets after %d namespaces, want at most %d", n, i+1, MaxBuckets+1)
		}
	}
	at := t0.Add(time.Duration(3*MaxBuckets) * time.Microsecond)
	if ok, why := l.Admit("ns-0", pkt(100000), at); ok || why != SuppressedRate {
		t.Errorf("ns-0's second attempt within its second: Admit = %v, %q, want its used bucket kept (false, %q)", ok, why, SuppressedRate)
	}
	// A second later every bucket is full again: a new namespace gets a bucket of its own.
	if ok, _ := l.Admit("new", pkt(100001), at.Add(2*time.Second)); !ok || l.buckets["new"] == nil {
		t.Errorf("a new namespace once the old buckets refilled: admitted %v, own bucket %v; want both", ok, l.buckets["new"] != nil)
	}

	// Attempts are remembered for the window, up to maxFlows (made small here).
	l = NewLimiter(1_000_000, time.Hour)
	l.maxFlows = 1000
	for i := range 5 * l.maxFlows {
		p := Packet{Src: netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)}), Dst: netip.MustParseAddr("10.0.0.2"), Protocol: "udp", SrcPort: uint16(i), DstPort: 53}
		if ok, _ := l.Admit("shop", p, t0.Add(time.Duration(i)*time.Microsecond)); !ok {
			t.Fatalf("attempt %d suppressed", i)
		}
		if len(l.seen) > l.maxFlows {
			t.Fatalf("%d remembered attempts, want at most %d", len(l.seen), l.maxFlows)
		}
	}
}
