// Package uninstall removes trellis from a node: what the agent programmed (routes, the
// VXLAN device, iptables chains and the rules jumping to them, ipsets) and what it and
// install-cni put on disk (conflist, ready file, CNI plugins, an IPAM store no pod uses).
// The agent runs it when it stops while the ClusterNetwork is being deleted, and
// `trellis-agent cleanup` by hand.
package uninstall

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/trellis-net/trellis/agent/cniinstall"
	"github.com/trellis-net/trellis/agent/datapath"
	"github.com/trellis-net/trellis/agent/ipset"
	"github.com/trellis-net/trellis/agent/netfilter"
	"github.com/trellis-net/trellis/agent/nftables"
	"github.com/trellis-net/trellis/cni/ipam"
	"github.com/trellis-net/trellis/internal/cnicontract"
)

// Node is what trellis put on the node, as the agent sees it.
type Node struct {
	CNIBinDir  string
	CNIConfDir string
	ReadyFile  string
	// EndpointsDir holds the policy engine's records of the node's pod veths.
	EndpointsDir string
	// DataDir holds the plugin's IPAM state (empty: left alone). trellis's store there is
	// removed only while it holds no address: a pod still running keeps its address (its
	// DEL, or a reboot, ends it), and the store is what says which it is.
	DataDir string
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
	if n.DataDir != "" {
		if ok, err := removeStore(n.DataDir); err != nil {
			errs = append(errs, err)
		} else if ok {
			removed = append(removed, cnicontract.StoreDir(n.DataDir, cnicontract.NetworkName))
		}
	}
	chains, err := netfilter.Cleanup()
	removed, errs = append(removed, chains...), append(errs, err)
	tables, err := nftables.Cleanup(context.Background())
	removed, errs = append(removed, tables...), append(errs, err)
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

// removeStore removes trellis's IPAM store under dataDir, and dataDir once empty, unless an
// address is still allocated. It holds the store's lock meanwhile, as the plugin does.
func removeStore(dataDir string) (bool, error) {
	dir := cnicontract.StoreDir(dataDir, cnicontract.NetworkName)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	s, err := ipam.Open(dir)
	if err != nil {
		return false, fmt.Errorf("opening the IPAM store %s: %w", dir, err)
	}
	defer s.Close()
	allocs, err := s.List()
	if err != nil {
		return false, err
	}
	if len(allocs) > 0 {
		return false, nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return false, fmt.Errorf("removing the IPAM store %s: %w", dir, err)
	}
	_ = os.Remove(dataDir) // only when empty: other networks' state stays
	return true, nil
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
