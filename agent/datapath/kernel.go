package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/internal/cnicontract"
)

// RPFilterLoose is the rp_filter mode of the devices trellis owns (why: see cnicontract).
const RPFilterLoose = cnicontract.RPFilterLoose

// Sysctl names the datapath reports (sysctl(8) notation: an interface name's dots become
// "/"). VethRPFilter stands for every pod veth.
const (
	SysctlIPForward   = "net.ipv4.ip_forward"
	SysctlAllRPFilter = "net.ipv4.conf.all.rp_filter"
	VethRPFilter      = "net.ipv4.conf." + veth.HostPrefix + "*.rp_filter"
	// SysctlIPv6Forward is set on nodes with an IPv6 block only. With it on the kernel
	// ignores router advertisements on interfaces whose accept_ra is 1 (a router takes
	// none): a node that gets its IPv6 route from them needs accept_ra 2 on that interface.
	SysctlIPv6Forward = "net.ipv6.conf.all.forwarding"
)

// VXLANRPFilter is the sysctl(8) name of trellis.vxlan's rp_filter.
var VXLANRPFilter = "net.ipv4.conf." + strings.ReplaceAll(VXLANDevice, ".", "/") + ".rp_filter"

// SysctlError is a kernel setting the datapath relies on that could not be applied.
type SysctlError struct {
	Name, Value string
	Err         error
}

func (e *SysctlError) Error() string {
	return fmt.Sprintf("could not set %s = %s: %v", e.Name, e.Value, e.Err)
}

func (e *SysctlError) Unwrap() error { return e.Err }

// sysctl is one setting: its sysctl(8) name and its path under /proc/sys.
type sysctl struct{ name, path, value string }

func rpFilter(dev, name string) sysctl {
	return sysctl{name: name, path: "net/ipv4/conf/" + dev + "/rp_filter", value: RPFilterLoose}
}

// setKernelSettings applies what the routed pod network needs in the current network
// namespace (forwarding, of IPv6 too when ipv6; loose rp_filter on trellis.vxlan and the
// pod veths), each written only when it differs, and returns the values in effect. Every
// failure is a *SysctlError.
func setKernelSettings(procSys string, ipv6 bool) (map[string]string, error) {
	veths, err := podVeths()
	if err != nil {
		return nil, err
	}
	effective := map[string]string{}
	var errs []error
	for _, s := range desiredSysctls(veths, ipv6) {
		path := filepath.Join(procSys, s.path)
		cur, err := readSysctl(path)
		if err != nil || cur != s.value {
			if err = os.WriteFile(path, []byte(s.value), 0o644); err == nil {
				cur, err = readSysctl(path)
			}
			if err != nil && s.name == VethRPFilter && errors.Is(err, os.ErrNotExist) {
				continue // the pod's veth went away since the listing
			}
			if err != nil {
				errs = append(errs, &SysctlError{Name: s.name, Value: s.value, Err: err})
			}
		}
		if prev, seen := effective[s.name]; !seen || prev == s.value {
			effective[s.name] = cur // the veths share one name: any one that differs shows
		}
	}
	// Informational: the kernel applies max(all, dev) to rp_filter.
	if v, err := readSysctl(filepath.Join(procSys, "net/ipv4/conf/all/rp_filter")); err == nil {
		effective[SysctlAllRPFilter] = v
	}
	return effective, errors.Join(errs...)
}

// desiredSysctls are the settings the routed pod network needs on a node with these pod
// veths: forwarding (IPv6's too when the node has an IPv6 block), and loose rp_filter on
// trellis.vxlan and every pod veth (the CNI plugin sets it when it creates one; this
// covers veths of older plugins and hand edits). IPv6 has no rp_filter. Pure.
func desiredSysctls(veths []string, ipv6 bool) []sysctl {
	want := []sysctl{
		{name: SysctlIPForward, path: "net/ipv4/ip_forward", value: "1"},
		rpFilter(VXLANDevice, VXLANRPFilter),
	}
	if ipv6 {
		want = append(want, sysctl{name: SysctlIPv6Forward, path: "net/ipv6/conf/all/forwarding", value: "1"})
	}
	for _, v := range veths {
		want = append(want, rpFilter(v, VethRPFilter))
	}
	return want
}

// podVeths are the names of the node's pod veths (host ends).
func podVeths() ([]string, error) {
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var out []string
	for _, l := range links {
		if _, ok := l.(*netlink.Veth); ok && strings.HasPrefix(l.Attrs().Name, veth.HostPrefix) {
			out = append(out, l.Attrs().Name)
		}
	}
	return out, nil
}

func readSysctl(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
