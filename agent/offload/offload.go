// Package offload decides TX checksum offload on the node's VXLAN device. With it the
// device also does TSO (the kernel only segments late for a device that checksums), which
// is most of VXLAN's throughput; without it the kernel checksums and segments every packet
// in software. Some kernels (< 5.7) and some NICs/drivers (vmxnet3 on port 4789, some
// vSphere setups) corrupt offloaded VXLAN checksums, so in Auto the agent proves its
// tunnel instead of trusting a version check alone: a Checker exchanges small UDP and TCP
// probes with a few VXLAN peers (bounded in count and rate) and, when they fail where a
// probe with nothing to offload gets through, Decide turns offload off on this node.
package offload

import (
	"fmt"
	"strconv"
	"strings"
)

// Modes of spec.vxlan.txChecksumOffload, as the agent configuration carries them.
const (
	ModeAuto     = "Auto"
	ModeEnabled  = "Enabled"
	ModeDisabled = "Disabled"
)

// Reasons of the NodeNetwork's TXChecksumOffload condition.
const (
	ReasonEnabled        = "Enabled"        // spec says Enabled
	ReasonDisabled       = "Disabled"       // spec says Disabled
	ReasonKernelTooOld   = "KernelTooOld"   // Auto on a kernel that corrupts offloaded VXLAN checksums
	ReasonUnverified     = "Unverified"     // Auto, on; no conclusive self-test yet (or no VXLAN peer)
	ReasonTunnelVerified = "TunnelVerified" // Auto, on; UDP and TCP through the tunnel work
	// ReasonChecksumOffloadBroken is api/v1alpha1.ReasonChecksumOffloadBroken.
	ReasonChecksumOffloadBroken = "ChecksumOffloadBroken"
)

// MinKernel is the first kernel release that no longer corrupts offloaded VXLAN checksums
// (5.7: "netfilter: nat: never update the UDP checksum when it's 0", which broke the inner
// checksum of NATed VXLAN packets left to offload; the reason flannel and Calico turned it off).
var MinKernel = [2]int{5, 7}

// ParseKernelRelease reads major and minor from a kernel release as uname -r prints it
// ("5.4.0-150-generic", "6.18.44-fc-v1098", "4.18.0-553.el8_10.x86_64").
func ParseKernelRelease(release string) (major, minor int, err error) {
	f := strings.SplitN(release, ".", 3)
	if len(f) < 2 {
		return 0, 0, fmt.Errorf("kernel release %q: want major.minor[.patch…]", release)
	}
	digits := func(s string) string {
		end := 0
		for end < len(s) && s[end] >= '0' && s[end] <= '9' {
			end++
		}
		return s[:end]
	}
	if major, err = strconv.Atoi(f[0]); err != nil {
		return 0, 0, fmt.Errorf("kernel release %q: major version: %w", release, err)
	}
	if minor, err = strconv.Atoi(digits(f[1])); err != nil {
		return 0, 0, fmt.Errorf("kernel release %q: minor version: %w", release, err)
	}
	return major, minor, nil
}

// kernelTooOld reports whether release is older than MinKernel. A release it can't read
// counts as new enough: the self-test still guards the tunnel.
func kernelTooOld(release string) bool {
	major, minor, err := ParseKernelRelease(release)
	if err != nil {
		return false
	}
	return major < MinKernel[0] || major == MinKernel[0] && minor < MinKernel[1]
}

// Verdict is what the tunnel self-test found.
type Verdict int

const (
	// Unverified: no conclusive probe yet (no VXLAN peer, or none answered the control).
	Unverified Verdict = iota
	// Working: with offload on, UDP and TCP through the tunnel got through.
	Working
	// Broken: with offload on, UDP and TCP failed where the control probe (nothing to
	// offload) got through.
	Broken
)

func (v Verdict) String() string {
	return [...]string{"Unverified", "Working", "Broken"}[v]
}

// Decision is TX checksum offload on the node's VXLAN device and why.
type Decision struct {
	On bool
	// Probe: the self-test runs (Auto on a kernel that allows offload, and Enabled, whose
	// breakage is reported but not acted on).
	Probe   bool
	Reason  string
	Message string
}

// Decide is TX checksum offload for mode (ModeAuto, ModeEnabled or ModeDisabled; empty is
// Auto) on a node running kernel release, given the self-test's verdict and its detail.
// It is pure.
func Decide(mode, release string, v Verdict, detail string) Decision {
	with := func(msg string) string {
		if detail == "" {
			return msg
		}
		return msg + ": " + detail
	}
	switch mode {
	case ModeDisabled:
		return Decision{Reason: ReasonDisabled, Message: "spec.vxlan.txChecksumOffload is Disabled"}
	case ModeEnabled:
		d := Decision{On: true, Probe: true, Reason: ReasonEnabled, Message: "spec.vxlan.txChecksumOffload is Enabled"}
		if v == Broken {
			d.Reason = ReasonChecksumOffloadBroken
			d.Message = with("the tunnel self-test fails with TX checksum offload on; spec.vxlan.txChecksumOffload Enabled keeps it on " +
				"(set Auto or Disabled to turn it off)")
		}
		return d
	}
	if kernelTooOld(release) {
		return Decision{Reason: ReasonKernelTooOld, Message: fmt.Sprintf(
			"kernel %s is older than %d.%d, whose VXLAN checksum offload is known to corrupt packets: off (spec.vxlan.txChecksumOffload Enabled forces it on)",
			release, MinKernel[0], MinKernel[1])}
	}
	switch v {
	case Broken:
		return Decision{Probe: true, Reason: ReasonChecksumOffloadBroken, Message: with(
			"the tunnel self-test failed with TX checksum offload on, so it is off (the NIC or driver corrupts offloaded VXLAN " +
				"checksums; restart the agent to test again, or set spec.vxlan.txChecksumOffload)")}
	case Working:
		return Decision{On: true, Probe: true, Reason: ReasonTunnelVerified, Message: with("UDP and TCP through the tunnel work with TX checksum offload on")}
	}
	return Decision{On: true, Probe: true, Reason: ReasonUnverified, Message: with("on; the tunnel self-test has no conclusive result yet")}
}

// Result is one peer's probe: each field says whether that exchange got through.
type Result struct {
	Peer string
	// Control: a UDP exchange with a zero checksum both ways (nothing to offload, as with
	// ICMP) with the peer's responder. Without it nothing can be concluded: the peer's
	// agent may not serve probes yet (an upgrade from a version without a responder) or
	// the tunnel may be down altogether.
	Control bool
	// UDP: a checksummed UDP request (left to offload when it is on) answered with a zero
	// checksum: it tests this node's TX only.
	UDP bool
	// TCP: a TCP connection and echo: this node's TX (SYN, data) and the peer's (SYN-ACK).
	TCP bool
}

// Judge turns one round's results into a verdict and its detail, given whether offload
// was on during the round and the verdict and detail before it. Offload is judged broken
// only when every peer that answered the control failed both UDP and TCP; one peer whose
// UDP and TCP got through proves it works. Other mixes (UDP through, TCP not: the peer's
// own TX may be what is broken, its agent sees to that) and rounds no peer answered leave
// verdict and detail as they were. With offload off (after a Broken verdict) the verdict
// stays and the detail says whether the tunnel works now. Details name peers only for a
// Broken verdict, so that steady-state rounds over rotating peers don't change the
// NodeNetwork status (no API writes). It is pure.
func Judge(offloadOn bool, results []Result, prev Verdict, prevDetail string) (Verdict, string) {
	var answered, working, broken []string
	for _, r := range results {
		if !r.Control {
			continue
		}
		answered = append(answered, r.Peer)
		switch {
		case r.UDP && r.TCP:
			working = append(working, r.Peer)
		case !r.UDP && !r.TCP:
			broken = append(broken, r.Peer)
		}
	}
	switch {
	case len(answered) == 0:
		return prev, prevDetail
	case !offloadOn && len(working) > 0:
		return prev, "with it off, UDP and TCP through the tunnel get through"
	case !offloadOn:
		return prev, "with it off, UDP/TCP through the tunnel still fail: something other than offload blocks them"
	case len(working) > 0:
		return Working, ""
	case len(broken) == len(answered):
		return Broken, "UDP and TCP failed, a zero-checksum probe got through, to " + strings.Join(broken, ", ")
	}
	return prev, prevDetail
}
