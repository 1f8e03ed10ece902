package netfilter

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"time"
)

// Backend is a variant of the iptables commands. The kernel keeps the rules of the legacy
// (x_tables) and the nf_tables variants apart, and packets go through both, so trellis
// writes where the node's other iptables users (kubelet, kube-proxy) do.
type Backend struct {
	// Mode is "nft" or "legacy", as the agent reports it.
	Mode string
	// The commands, looked up in PATH.
	IPTables, Save, Restore string
	// V6 marks the ip6tables commands (IPv6 method): IPv6 rules live in tables of their own.
	V6 bool
}

// IPv4 is the iptables variant of b, of the same mode (b unless b is an IPv6 one).
func (b Backend) IPv4() Backend {
	if !b.V6 {
		return b
	}
	v4 := func(cmd string) string { return strings.Replace(cmd, "ip6tables", "iptables", 1) }
	return Backend{Mode: b.Mode, IPTables: v4(b.IPTables), Save: v4(b.Save), Restore: v4(b.Restore)}
}

// IPv6 is the ip6tables variant of b, of the same mode: the kernel keeps IPv6 rules apart
// from IPv4's, so a node's IPv6 chains are written with these commands.
func (b Backend) IPv6() Backend {
	if b.V6 {
		return b
	}
	v6 := func(cmd string) string { return strings.Replace(cmd, "iptables", "ip6tables", 1) }
	return Backend{Mode: b.Mode, IPTables: v6(b.IPTables), Save: v6(b.Save), Restore: v6(b.Restore), V6: true}
}

// The two variants iptables 1.8 installs side by side.
var (
	Legacy = Backend{Mode: "legacy", IPTables: "iptables-legacy", Save: "iptables-legacy-save", Restore: "iptables-legacy-restore"}
	NFT    = Backend{Mode: "nft", IPTables: "iptables-nft", Save: "iptables-nft-save", Restore: "iptables-nft-restore"}
)

func (b Backend) String() string { return b.Mode }

// label names b in errors: the mode, and the family when it is IPv6.
func (b Backend) label() string {
	if b.V6 {
		return b.Mode + " (ip6tables)"
	}
	return b.Mode
}

// detectTimeout bounds each iptables-save DetectBackend runs (nft listing can hang on a
// wedged kernel; the wrapper bounds it too).
const detectTimeout = 5 * time.Second

// DetectBackend picks the variant the node uses, with the heuristic of Kubernetes'
// iptables wrapper (kubernetes-sigs/iptables-wrappers): the variant holding kubelet's
// KUBE-IPTABLES-HINT or KUBE-KUBELET-CANARY chain (mangle table; kubelet 1.17+ creates
// one), else the one holding more rules, else the one the plain `iptables` command is.
// On a host with only the plain command, that one. It only reads: legacy tables are listed
// without -t, which would create the table.
func DetectBackend() (Backend, error) {
	legacy, nft := found(Legacy.Save), found(NFT.Save)
	switch {
	case legacy && nft:
		nftMangle := run(NFT.Save, "-t", "mangle")
		legacyAll := run(Legacy.Save)
		var nftAll []byte
		if !kubeletChains.Match(nftMangle) && !kubeletChains.Match(legacyAll) {
			nftAll = run(NFT.Save)
		}
		mode := chooseMode(nftMangle, legacyAll, nftAll)
		if mode == "" {
			if plain, err := plainBackend(); err == nil {
				mode = plain.Mode
			} else {
				mode = NFT.Mode // the wrapper's default
			}
		}
		if mode == Legacy.Mode {
			return Legacy, nil
		}
		return NFT, nil
	case legacy:
		return Legacy, nil
	case nft:
		return NFT, nil
	}
	return plainBackend()
}

var kubeletChains = regexp.MustCompile(`(?m)^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY) `)

var ruleLine = regexp.MustCompile(`(?m)^-`)

// chooseMode decides from iptables-save outputs: nftMangle (-t mangle), legacyAll and
// nftAll (every table). "" when nothing tells the two apart.
func chooseMode(nftMangle, legacyAll, nftAll []byte) string {
	switch {
	case kubeletChains.Match(nftMangle):
		return NFT.Mode
	case kubeletChains.Match(legacyAll):
		return Legacy.Mode
	}
	l, n := len(ruleLine.FindAllIndex(legacyAll, -1)), len(ruleLine.FindAllIndex(nftAll, -1))
	switch {
	case l > n:
		return Legacy.Mode
	case n > l:
		return NFT.Mode
	}
	return ""
}

// plainBackend is the plain iptables command, whichever variant it is.
func plainBackend() (Backend, error) {
	out, err := exec.Command("iptables", "--version").Output()
	if err != nil {
		return Backend{}, fmt.Errorf("no iptables command (neither iptables-nft, iptables-legacy nor iptables): install iptables: %w", err)
	}
	b := Backend{Mode: Legacy.Mode, IPTables: "iptables", Save: "iptables-save", Restore: "iptables-restore"}
	if strings.Contains(string(out), "nf_tables") { // "iptables v1.8.9 (nf_tables)"; before 1.8 only legacy
		b.Mode = NFT.Mode
	}
	return b, nil
}

func found(cmd string) bool {
	_, err := exec.LookPath(cmd)
	return err == nil
}

// run returns what cmd printed, nothing when it failed: detection is best effort.
func run(cmd string, args ...string) []byte {
	ctx, cancel := context.WithTimeout(context.Background(), detectTimeout)
	defer cancel()
	var out bytes.Buffer
	c := exec.CommandContext(ctx, cmd, args...)
	c.Stdout = &out
	_ = c.Run()
	return out.Bytes()
}
