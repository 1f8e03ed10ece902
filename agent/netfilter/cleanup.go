package netfilter

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
)

// Cleanup removes every trellis chain (name starting with ChainPrefix) and every rule of
// another chain that goes to one, in every table, and nothing else. It looks in both
// backends that are installed (an agent may have used either), reading each with one
// iptables-save (all tables: listing a legacy table by name would create it) and
// writing each table that holds trellis chains with one iptables-restore --noflush. It
// reports the chains removed as "table/chain". The ip6tables variants of the backends are
// cleaned alike where installed.
func Cleanup() ([]string, error) {
	var backends []Backend
	for _, b := range []Backend{Legacy, NFT} {
		if b.Installed() {
			backends = append(backends, b)
		}
	}
	if len(backends) == 0 {
		plain, err := plainBackend()
		if err != nil {
			return nil, nil // trellis writes its chains with these commands: without them there are none
		}
		backends = append(backends, plain)
	}
	for _, b := range backends {
		if v6 := b.IPv6(); v6.Installed() {
			backends = append(backends, v6)
		}
	}
	var removed []string
	var errs []error
	for _, b := range backends {
		r, err := cleanup(b)
		removed = append(removed, r...)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", b.label(), err))
		}
	}
	return removed, errors.Join(errs...)
}

func cleanup(b Backend) ([]string, error) {
	s := Syncer{Backend: b}
	out, err := b.SaveAll(context.Background(), 0)
	if err != nil {
		return nil, err
	}
	ours := func(chain string) bool { return strings.HasPrefix(chain, ChainPrefix) }
	var removed []string
	var errs []error
	for table, dump := range splitTables(out) {
		d := parseSave(dump, ours)
		var p restorePlan
		for _, c := range d.scoped {
			p.flush = append(p.flush, c) // all first: trellis chains may go to each other
			p.remove = append(p.remove, c)
			for _, l := range d.foreign[c] {
				p.unjump = append(p.unjump, l.String())
			}
		}
		for _, l := range d.jumps {
			p.unjump = append(p.unjump, l.String())
		}
		if p.empty() {
			continue
		}
		if err := s.restore(context.Background(), renderRestore(Table(table), p)); err != nil {
			errs = append(errs, fmt.Errorf("%s table: %w", table, err))
			continue
		}
		for _, c := range p.remove {
			if b.V6 {
				c += " (IPv6)"
			}
			removed = append(removed, table+"/"+c)
		}
	}
	return removed, errors.Join(errs...)
}

// splitTables splits the output of iptables-save into its tables.
func splitTables(out []byte) map[string][]byte {
	tables := map[string][]byte{}
	var name string
	var cur bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "*"):
			name = line[1:]
			cur.Reset()
		case line == "COMMIT":
			if name != "" {
				tables[name] = bytes.Clone(cur.Bytes())
			}
			name = ""
		case name != "":
			cur.WriteString(line + "\n")
		}
	}
	return tables
}
