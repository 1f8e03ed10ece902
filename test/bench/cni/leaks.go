package main

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// checkLeaks proves that every ADD was undone by its DEL: no address is held in either
// IPAM store, libcni's result cache is empty, and neither the node namespace nor any pod
// namespace has an interface besides lo (nor the node a route, the routes die with the
// veths). It runs in the node namespace after the last DEL.
func checkLeaks(r *runner, phases [][]*pod) []error {
	var leaks []error
	for _, name := range slices.Sorted(maps.Keys(r.setups)) {
		s := r.setups[name]
		held, err := heldAddresses(s.ipamDir)
		if err != nil {
			leaks = append(leaks, fmt.Errorf("%s IPAM: %w", name, err))
		} else if len(held) > 0 {
			leaks = append(leaks, fmt.Errorf("%s IPAM %s still holds %d entries (first %s)", name, s.ipamDir, len(held), held[0]))
		}
	}
	if cached, err := dirEntries(filepath.Join(r.cacheDir, "results")); err != nil {
		leaks = append(leaks, fmt.Errorf("libcni cache: %w", err))
	} else if len(cached) > 0 {
		leaks = append(leaks, fmt.Errorf("libcni cache still has %d results (first %s)", len(cached), cached[0]))
	}
	if extra, err := nonLoopback(); err != nil {
		leaks = append(leaks, fmt.Errorf("node namespace: %w", err))
	} else if len(extra) > 0 {
		leaks = append(leaks, fmt.Errorf("node namespace still has %d interfaces (first %s)", len(extra), extra[0]))
	}
	if routes, err := nodeRoutes(); err != nil {
		leaks = append(leaks, fmt.Errorf("node namespace: %w", err))
	} else if len(routes) > 0 {
		leaks = append(leaks, fmt.Errorf("node namespace still has %d routes (first %s)", len(routes), routes[0]))
	}
	for _, pods := range phases {
		for _, p := range pods {
			if !p.added {
				continue
			}
			if err := checkPodNetns(p.rt.NetNS); err != nil {
				leaks = append(leaks, err)
			}
		}
	}
	return leaks
}

// heldAddresses lists the allocation files of an IPAM store (both plugins name them after
// the address) and half-written files of trellis's (.tmp-*).
func heldAddresses(dir string) ([]string, error) {
	names, err := dirEntries(dir)
	if err != nil {
		return nil, err
	}
	var held []string
	for _, n := range names {
		if _, err := netip.ParseAddr(n); err == nil || strings.HasPrefix(n, ".tmp-") {
			held = append(held, n)
		}
	}
	return held, nil
}

// dirEntries lists dir; a directory never created (no ADD got that far) is empty.
func dirEntries(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", dir, err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}

// nonLoopback lists the interfaces of the current namespace other than lo.
func nonLoopback() ([]string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	var out []string
	for _, i := range ifs {
		if i.Name != "lo" {
			out = append(out, i.Name)
		}
	}
	return out, nil
}

// nodeRoutes lists the node's main-table routes of both families (none is expected once
// every veth is gone but the kernel's IPv6 one for lo).
func nodeRoutes() ([]string, error) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing routes: %w", err)
	}
	var out []string
	for _, r := range routes {
		if r.Dst != nil && r.Dst.IP.Equal(net.IPv6loopback) {
			continue
		}
		out = append(out, r.String())
	}
	return out, nil
}

func checkPodNetns(path string) error {
	var extra []string
	err := netnstest.EnterPath(path, func() error {
		var err error
		extra, err = nonLoopback()
		return err
	})
	if err != nil {
		return fmt.Errorf("pod namespace %s: %w", path, err)
	}
	if len(extra) > 0 {
		return fmt.Errorf("pod namespace %s still has %v", path, extra)
	}
	return nil
}
