// Package denylog reads the packets the kernel's NFLOG target sends to a netlink log group
// (nfnetlink_log) and decides which of them become log lines: one per connection attempt
// (a retransmitted SYN is the same attempt) and at most so many a second.
package denylog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"syscall"
	"time"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// nfnetlink_log's protocol (include/uapi/linux/netfilter/nfnetlink_log.h).
const (
	subsysULOG    = 4 // NFNL_SUBSYS_ULOG
	msgPacket     = 0 // NFULNL_MSG_PACKET
	msgConfig     = 1 // NFULNL_MSG_CONFIG
	cfgCmd        = 1 // NFULA_CFG_CMD
	cfgMode       = 2 // NFULA_CFG_MODE
	cfgTimeout    = 4 // NFULA_CFG_TIMEOUT (1/100 s)
	cfgQThresh    = 5 // NFULA_CFG_QTHRESH
	cmdBind       = 1 // NFULNL_CFG_CMD_BIND
	copyPacket    = 2 // NFULNL_COPY_PACKET
	attrPacketHdr = 1 // NFULA_PACKET_HDR
	attrInDev     = 4 // NFULA_IFINDEX_INDEV
	attrOutDev    = 5 // NFULA_IFINDEX_OUTDEV
	attrPayload   = 9 // NFULA_PAYLOAD
	attrPrefix    = 10
	attrTypeMask  = 0x3fff // NLA_TYPE_MASK: without NLA_F_NESTED / NLA_F_NET_BYTEORDER
)

// Netfilter hooks (NFULA_PACKET_HDR's hook).
const (
	HookLocalIn = 1
	HookForward = 2
)

// Packet is one packet the kernel logged.
type Packet struct {
	// Prefix is the NFLOG rule's --nflog-prefix.
	Prefix string
	// Hook is the netfilter hook the rule ran in (HookForward, HookLocalIn).
	Hook uint8
	// InIfindex and OutIfindex are the packet's interfaces (0 when it has none).
	InIfindex, OutIfindex uint32
	Src, Dst              netip.Addr
	// Src and Dst are IPv4 or IPv6 addresses, as the packet is.
	// Protocol is "tcp", "udp", "sctp", "icmp", "icmpv6" or the IP protocol number (IPv6:
	// of the header after the extension headers).
	Protocol         string
	SrcPort, DstPort uint16
	// SYN: a TCP segment with SYN set and ACK clear (a connection's first).
	SYN bool
}

// ErrOverflow is returned by Read when the kernel dropped log messages because the
// socket's receive buffer was full.
var ErrOverflow = errors.New("the netlink log socket overflowed: the kernel dropped log messages")

// NotFromKernelError is returned by Read for a netlink message that a process sent to
// the Reader's socket: only the kernel (netlink port ID 0) sends NFLOG messages, and any
// process with CAP_NET_ADMIN in the node's network namespace can unicast to the socket's
// port ID. Its packets are ignored (they would forge deny lines); reading can go on.
type NotFromKernelError struct {
	// PortID is the sender's netlink port ID (the kernel sets it from the sending
	// socket: it can't be forged), usually the sending process's PID.
	PortID uint32
}

func (e *NotFromKernelError) Error() string {
	return fmt.Sprintf("ignored a netlink message on the NFLOG socket sent by netlink port %d, not by the kernel", e.PortID)
}

// fromKernel tells whether a message came from the kernel: the source address the kernel
// fills in on receipt names port ID 0 only for its own messages.
func fromKernel(from *unix.SockaddrNetlink) bool { return from != nil && from.Pid == 0 }

// Reader receives the packets of one NFLOG group.
type Reader struct {
	sock  *nl.NetlinkSocket
	group uint16
}

// configTimeout bounds the wait for the kernel's answer to each configuration message.
const configTimeout = 5 * time.Second

// Open binds NFLOG group in the calling thread's network namespace. Only one socket per
// network namespace can bind a group. Ending ctx ends the binding (Open returns at once).
func Open(ctx context.Context, group uint16) (*Reader, error) {
	sock, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("opening a netfilter netlink socket: %w", err)
	}
	r := &Reader{sock: sock, group: group}
	// A Receive blocked on an answer that never comes must not hold up the agent's
	// shutdown: closing the socket ends it.
	stop := context.AfterFunc(ctx, sock.Close)
	defer stop()
	// Room for bursts: the kernel's limit keeps the rate down, not the buffer.
	_ = sock.SetReceiveBufferSize(1<<20, false)
	mode := make([]byte, 6) // struct nfulnl_msg_config_mode: be32 copy_range, u8 copy_mode, u8 pad
	binary.BigEndian.PutUint32(mode, 256)
	mode[4] = copyPacket
	for _, step := range []struct {
		what string
		attr *nl.RtAttr
	}{
		{"binding", nl.NewRtAttr(cfgCmd, []byte{cmdBind})},
		{"setting copy mode", nl.NewRtAttr(cfgMode, mode)},
		// Deliver each message at once (the rule's own threshold is 1 too), not a second later.
		{"setting the queue threshold", nl.NewRtAttr(cfgQThresh, be32(1))},
		{"setting the flush timeout", nl.NewRtAttr(cfgTimeout, be32(1))},
	} {
		if err := r.config(step.attr); err != nil {
			sock.Close()
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return nil, fmt.Errorf("NFLOG group %d: %s: %w", group, step.what, err)
		}
	}
	// Read blocks until a packet is logged (Close ends it).
	_ = sock.SetReceiveTimeout(&unix.Timeval{})
	return r, nil
}

func be32(v uint32) []byte {
	b := make([]byte, 4)
	binary.BigEndian.PutUint32(b, v)
	return b
}

// nfgenmsg is struct nfgenmsg: family, version, resource id (the group, big-endian).
type nfgenmsg struct{ group uint16 }

func (m nfgenmsg) Len() int { return 4 }
func (m nfgenmsg) Serialize() []byte {
	b := []byte{unix.AF_UNSPEC, 0, 0, 0}
	binary.BigEndian.PutUint16(b[2:], m.group)
	return b
}

// config sends one configuration message and waits for the kernel's answer.
func (r *Reader) config(attr *nl.RtAttr) error {
	req := nl.NewNetlinkRequest(subsysULOG<<8|msgConfig, unix.NLM_F_ACK)
	req.AddData(nfgenmsg{r.group})
	req.AddData(attr)
	if err := r.sock.Send(req); err != nil {
		return err
	}
	return r.awaitAck(req.Seq, configTimeout)
}

// awaitAck waits up to timeout for the kernel's answer to request seq. The socket's
// receive timeout bounds each Receive, so a kernel that never answers costs timeout, not
// a hang.
func (r *Reader) awaitAck(seq uint32, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		tv := unix.NsecToTimeval(left.Nanoseconds())
		if err := r.sock.SetReceiveTimeout(&tv); err != nil {
			return err
		}
		msgs, from, err := r.sock.Receive()
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil {
			return err
		}
		if !fromKernel(from) {
			continue // a forged answer must not pass for the kernel's
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || m.Header.Seq != seq {
				continue
			}
			if len(m.Data) < 4 {
				return fmt.Errorf("short netlink answer")
			}
			if errno := int32(nl.NativeEndian().Uint32(m.Data[:4])); errno != 0 {
				return syscall.Errno(-errno)
			}
			return nil
		}
	}
	return fmt.Errorf("no answer from the kernel within %s", timeout)
}

// Read blocks until the kernel sends log messages and returns their packets. It returns
// ErrOverflow when messages were lost and a *NotFromKernelError for messages a process
// sent (reading can go on after both), and another error once the Reader is closed.
func (r *Reader) Read() ([]Packet, error) {
	msgs, from, err := r.sock.Receive()
	if errors.Is(err, unix.ENOBUFS) {
		return nil, ErrOverflow
	}
	if err != nil {
		return nil, err
	}
	if !fromKernel(from) {
		e := &NotFromKernelError{}
		if from != nil {
			e.PortID = from.Pid
		}
		return nil, e
	}
	out := make([]Packet, 0, len(msgs))
	for _, m := range msgs {
		if m.Header.Type != subsysULOG<<8|msgPacket {
			continue
		}
		if p, ok := ParseMessage(m.Data); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// PortID is the netlink port ID of the Reader's socket: where the kernel sends the
// group's messages.
func (r *Reader) PortID() (uint32, error) { return r.sock.GetPid() }

// Close unbinds the group (the kernel does when the socket goes) and ends a blocked Read.
func (r *Reader) Close() { r.sock.Close() }

// ParseMessage reads an NFULNL_MSG_PACKET message's body (nfgenmsg and attributes). ok is
// false when it holds no IPv4 or IPv6 packet.
func ParseMessage(b []byte) (Packet, bool) {
	var p Packet
	if len(b) < 4 {
		return p, false
	}
	attrs, err := nl.ParseRouteAttr(b[4:])
	if err != nil {
		return p, false
	}
	var payload []byte
	for _, a := range attrs {
		v := a.Value
		switch a.Attr.Type & attrTypeMask {
		case attrPacketHdr:
			if len(v) >= 3 {
				p.Hook = v[2]
			}
		case attrInDev:
			if len(v) >= 4 {
				p.InIfindex = binary.BigEndian.Uint32(v)
			}
		case attrOutDev:
			if len(v) >= 4 {
				p.OutIfindex = binary.BigEndian.Uint32(v)
			}
		case attrPrefix:
			p.Prefix = nl.BytesToString(v)
		case attrPayload:
			payload = v
		}
	}
	if len(payload) > 0 && payload[0]>>4 == 6 {
		return p, parseIPv6(payload, &p)
	}
	return p, parseIPv4(payload, &p)
}

// parseIPv4 reads addresses, protocol and ports from the start of an IPv4 packet.
func parseIPv4(b []byte, p *Packet) bool {
	if len(b) < 20 || b[0]>>4 != 4 {
		return false
	}
	ihl := int(b[0]&0x0f) * 4
	if ihl < 20 || len(b) < ihl {
		return false
	}
	p.Src = netip.AddrFrom4([4]byte(b[12:16]))
	p.Dst = netip.AddrFrom4([4]byte(b[16:20]))
	proto := b[9]
	later := binary.BigEndian.Uint16(b[6:8])&0x1fff != 0
	if proto == unix.IPPROTO_ICMP {
		p.Protocol = "icmp"
		return true
	}
	parseL4(proto, later, b[ihl:], p)
	return true
}

// IPv6 extension headers (RFC 8200 section 4) that may stand between the fixed header and
// the transport header; the rest end the chain.
const (
	ipv6HopByHop = 0
	ipv6Routing  = 43
	ipv6Fragment = 44
	ipv6DestOpts = 60
)

// parseIPv6 reads addresses, protocol and ports from the start of an IPv6 packet,
// following the extension headers to the transport header (as far as the copied bytes go:
// a chain longer than the copy leaves the protocol without ports).
func parseIPv6(b []byte, p *Packet) bool {
	if len(b) < 40 || b[0]>>4 != 6 {
		return false
	}
	p.Src = netip.AddrFrom16([16]byte(b[8:24]))
	p.Dst = netip.AddrFrom16([16]byte(b[24:40]))
	next, rest, later := b[6], b[40:], false
	for {
		switch next {
		case ipv6HopByHop, ipv6Routing, ipv6DestOpts:
			if len(rest) < 8 {
				p.Protocol = strconv.Itoa(int(next))
				return true
			}
			n := (int(rest[1]) + 1) * 8
			if len(rest) < n {
				p.Protocol = strconv.Itoa(int(next))
				return true
			}
			next, rest = rest[0], rest[n:]
			continue
		case ipv6Fragment:
			if len(rest) < 8 {
				p.Protocol = strconv.Itoa(int(next))
				return true
			}
			later = binary.BigEndian.Uint16(rest[2:4])&0xfff8 != 0
			next, rest = rest[0], rest[8:]
			continue
		case unix.IPPROTO_ICMPV6:
			p.Protocol = "icmpv6"
			return true
		}
		parseL4(next, later, rest, p)
		return true
	}
}

// parseL4 names the transport protocol and reads its ports from l4, unless the packet is a
// later fragment (l4 is then the middle of the datagram).
func parseL4(proto uint8, later bool, l4 []byte, p *Packet) {
	switch proto {
	case unix.IPPROTO_TCP:
		p.Protocol = "tcp"
	case unix.IPPROTO_UDP:
		p.Protocol = "udp"
	case unix.IPPROTO_SCTP:
		p.Protocol = "sctp"
	default:
		p.Protocol = strconv.Itoa(int(proto))
		return
	}
	if later || len(l4) < 4 {
		return // a later fragment: no ports
	}
	p.SrcPort = binary.BigEndian.Uint16(l4[0:2])
	p.DstPort = binary.BigEndian.Uint16(l4[2:4])
	if proto == unix.IPPROTO_TCP && len(l4) >= 14 {
		flags := l4[13]
		p.SYN = flags&0x02 != 0 && flags&0x10 == 0
	}
}
