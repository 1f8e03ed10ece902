// Package uninstall removes trellis from a node: what the agent programmed (routes, the
// VXLAN device, iptables chains and the rules jumping to them, ipsets) and what it and
// install-cni put on disk (conflist, ready file, CNI plugins). The agent runs it when it
// stops while the ClusterNetwork is being deleted, and `trellis-agent cleanup` by hand.
package uninstall

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/trellis-net/trellis/agent/cniinstall"
	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/ipset"
	"github.com/trellis-net/trellis/agent/netfilter"
)

// Node is what trellis put on the node, as the agent sees it.
type Node struct {
	CNIBinDir  string
	CNIConfDir string
	ReadyFile  string
	// EndpointsDir holds the policy engine's records of the node's pod veths.
	EndpointsDir string
	// Plugins are the files install-cni copies into CNIBinDir (the image's). A copy on the
	// node is removed only while it is identical: a plugin someone else installed or
	// upgraded since stays. The trellis plugin itself is removed whatever its content.
	Plugins []string
}

// Run removes everything trellis put on the node and nothing else, in the order that
// keeps the node consistent if it stops halfway: the conflist and ready file first (the
// runtime stops using trellis for new pods), then rules, sets, routes and the device, the
// plugins last. It goes on after a failure and reports what it removed.
func Run(n Node) (removed []string, err error) {
	var errs []error
	for _, f := range []string{filepath.Join(n.CNIConfDir, cniinstall.ConflistName), n.ReadyFile} {
		if ok, err := remove(f); err != nil {
			errs = append(errs, err)
		} else if ok {
			removed = append(removed, f)
		}
	}
	if n.EndpointsDir != "" {
		if _, err := os.Stat(n.EndpointsDir); err == nil {
			if err := os.RemoveAll(n.EndpointsDir); err != nil {
				errs = append(errs, fmt.Errorf("removing %s: %w", n.EndpointsDir, err))
			} else {
				removed = append(removed, n.EndpointsDir)
			}
		}
	}
	chains, err := netfilter.Cleanup()
	removed, errs = append(removed, chains...), append(errs, err)
	sets, err := ipset.Cleanup()
	for _, s := range sets {
		removed = append(removed, "ipset "+s)
	}
	errs = append(errs, err)
	if err := datapath.Cleanup(); err != nil {
		errs = append(errs, err)
	} else {
		removed = append(removed, datapath.VXLANDevice+" and its routes")
	}
	for _, src := range n.Plugins {
		dst := filepath.Join(n.CNIBinDir, filepath.Base(src))
		if filepath.Base(src) != "trellis" && !sameContent(src, dst) {
			continue
		}
		if ok, err := remove(dst); err != nil {
			errs = append(errs, err)
		} else if ok {
			removed = append(removed, dst)
		}
	}
	return removed, errors.Join(errs...)
}

func remove(path string) (bool, error) {
	err := os.Remove(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("removing %s: %w", path, err)
	}
	return true, nil
}

func sameContent(a, b string) bool {
	x, err := os.ReadFile(a)
	if err != nil {
		return false
	}
	y, err := os.ReadFile(b)
	return err == nil && bytes.Equal(x, y)
}
