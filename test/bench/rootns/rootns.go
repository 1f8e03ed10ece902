// Package rootns lets a benchmark prove it left the machine's (root) network namespace as
// it found it: a snapshot before, one after, and the lines that differ.
package rootns

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
)

// Snapshot describes the calling thread's network namespace: links, addresses, routes
// (every table) without counters or timers, and net.ipv4.ip_forward. Call it from a
// thread of the root namespace.
func Snapshot() ([]string, error) {
	var out []string
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing root links: %w", err)
	}
	names := map[int]string{}
	for _, l := range links {
		a := l.Attrs()
		names[a.Index] = a.Name
		out = append(out, fmt.Sprintf("link %s %s mtu %d", a.Name, l.Type(), a.MTU))
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("listing addresses of %s: %w", a.Name, err)
		}
		for _, ad := range addrs {
			out = append(out, fmt.Sprintf("addr %s %s", a.Name, ad.IPNet))
		}
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: syscall.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing root routes: %w", err)
	}
	for _, r := range routes {
		out = append(out, fmt.Sprintf("route table %d %v via %v dev %s src %v", r.Table, r.Dst, r.Gw, names[r.LinkIndex], r.Src))
	}
	fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		return nil, fmt.Errorf("reading the root's ip_forward: %w", err)
	}
	out = append(out, "sysctl net.ipv4.ip_forward = "+string(bytes.TrimSpace(fwd)))
	slices.Sort(out)
	return out, nil
}

// Diff lists the lines only in a (-) or only in b (+).
func Diff(a, b []string) []string {
	var d []string
	for _, l := range a {
		if !slices.Contains(b, l) {
			d = append(d, "- "+l)
		}
	}
	for _, l := range b {
		if !slices.Contains(a, l) {
			d = append(d, "+ "+l)
		}
	}
	return d
}

// Unchanged takes a snapshot now and fails, listing the differences, unless it equals
// before (a Snapshot from the start of the run).
func Unchanged(before []string) error {
	after, err := Snapshot()
	if err != nil {
		return err
	}
	if d := Diff(before, after); len(d) > 0 {
		return fmt.Errorf("the root network namespace changed during the run:\n  %s", strings.Join(d, "\n  "))
	}
	return nil
}
