// Package ipset keeps trellis's ipsets (names starting with Prefix) as described by data:
// sets are created, their entries added and deleted by difference, sets whose options
// changed rebuilt aside and swapped in atomically, and sets no longer desired destroyed,
// all with one `ipset restore` per Apply. Nobody else's sets are read for more than their
// name or touched.
//
// Ordering with the iptables rules that use the sets (agent/netfilter):
//
//  1. Apply(desired sets), before the rules are synced: every set a new rule names
//     exists, with its entries, when iptables-restore checks it.
//  2. Sync the iptables rules: from now on no rule names a set that is no longer desired.
//  3. When step 1 reported sets InUse (no longer desired, still referenced by the old
//     rules), Apply again: the kernel refuses to destroy a set a rule references, so
//     Apply destroys only sets no rule references (the kernel's reference count) and
//     leaves the others for the Apply after the rules stopped using them.
//
// Sets are per network namespace (since Linux 3.13), like iptables rules.
package ipset

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Prefix starts the name of every ipset trellis owns, so an applier and an uninstall can
// tell trellis's sets from everyone else's.
const Prefix = "trellis-"

// NodePrefix starts the names of the node's own sets (agent/datapath's: the tunnel's
// peers), which ApplyNode keeps and Apply, NetworkPolicy's applier, leaves alone. The
// policy's set names (a hash after Prefix) never contain a dash.
const NodePrefix = Prefix + "node-"

// swapPrefix names the sets a rebuild fills before swapping them in; never desired.
const swapPrefix = Prefix + "swap-"

// maxName is the longest set name the kernel takes (IPSET_MAXNAMELEN - 1).
const maxName = 31

// maxComment is the longest entry comment (IPSET_MAX_COMMENT_SIZE - 1).
const maxComment = 255

// Set is a desired ipset.
type Set struct {
	// Name starts with Prefix, at most 31 characters.
	Name string
	// Type is one of hash:ip, hash:net, hash:ip,port, hash:net,port, hash:ip,port,ip,
	// hash:ip,port,net, hash:net,net, hash:net,port,net, hash:net,iface. A set can't
	// change type in place while a rule uses it (the kernel swaps only sets of one type):
	// give a set of another type another name.
	Type string
	// Family is "inet" (the default when empty) or "inet6".
	Family string
	// MaxElem is the most entries the set holds; 0: ipset's default, 65536.
	MaxElem int
	// Comment lets entries carry a comment.
	Comment bool
	// Entries are the members, each once.
	Entries []Entry
}

// Entry is a member of a set.
type Entry struct {
	// Member in the type's dimensions, comma-separated: "10.0.0.1" (ip), "10.0.0.0/24"
	// (net), "10.0.0.1,tcp:80" (ip,port; a bare port number is tcp), "10.0.0.0/24,eth0"
	// (net,iface). Ranges and port names are not taken: each entry is one kernel entry.
	Member string
	// NoMatch makes the entry an exception to the set (types with a net dimension): a
	// packet in 10.1.0.0/16 nomatch does not match a set that also holds 10.0.0.0/8.
	NoMatch bool
	// Comment needs Set.Comment; no double quotes.
	Comment string
}

// dims are the dimensions of the supported types.
var dims = map[string][]string{
	"hash:ip":           {"ip"},
	"hash:net":          {"net"},
	"hash:ip,port":      {"ip", "port"},
	"hash:net,port":     {"net", "port"},
	"hash:ip,port,ip":   {"ip", "port", "ip"},
	"hash:ip,port,net":  {"ip", "port", "net"},
	"hash:net,net":      {"net", "net"},
	"hash:net,port,net": {"net", "port", "net"},
	"hash:net,iface":    {"net", "iface"},
}

const defaultMaxElem = 65536

func (s Set) family() string {
	if s.Family == "" {
		return "inet"
	}
	return s.Family
}

func (s Set) maxElem() int {
	if s.MaxElem == 0 {
		return defaultMaxElem
	}
	return s.MaxElem
}

// attrs are what an entry carries besides its member.
type attrs struct {
	nomatch bool
	comment string
}

// desired is a validated set with its entries keyed by their canonical member.
type desired struct {
	Set
	entries map[string]attrs
	order   []string // canonical members in the given order, for a stable restore
}

// Validate reports what in s can't be applied, naming the set and entry.
func (s Set) Validate() error {
	_, err := s.canonical()
	return err
}

func (s Set) canonical() (*desired, error) {
	var errs []error
	switch {
	case !strings.HasPrefix(s.Name, Prefix):
		errs = append(errs, fmt.Errorf("name must start with %s", Prefix))
	case strings.HasPrefix(s.Name, swapPrefix):
		errs = append(errs, fmt.Errorf("names starting with %s are the applier's", swapPrefix))
	case len(s.Name) > maxName:
		errs = append(errs, fmt.Errorf("name longer than %d characters", maxName))
	case strings.ContainsAny(s.Name, " \t\n\","):
		errs = append(errs, errors.New("name holds a space, comma or quote"))
	}
	d, ok := dims[s.Type]
	if !ok {
		errs = append(errs, fmt.Errorf("type %q is not one of %s", s.Type, strings.Join(slices.Sorted(maps.Keys(dims)), ", ")))
	}
	if f := s.family(); f != "inet" && f != "inet6" {
		errs = append(errs, fmt.Errorf("family %q is not inet or inet6", s.Family))
	}
	if s.MaxElem < 0 {
		errs = append(errs, fmt.Errorf("maxElem %d is negative", s.MaxElem))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("ipset %s: %w", s.Name, errors.Join(errs...))
	}
	out := &desired{Set: s, entries: make(map[string]attrs, len(s.Entries)), order: make([]string, 0, len(s.Entries))}
	for _, e := range s.Entries {
		m, err := canonicalMember(d, s.family(), e.Member)
		switch {
		case err != nil:
		case e.NoMatch && !slices.Contains(d, "net"):
			err = fmt.Errorf("nomatch needs a net dimension, %s has none", s.Type)
		case e.Comment != "" && !s.Comment:
			err = errors.New("a comment needs the set's Comment option")
		case len(e.Comment) > maxComment || strings.ContainsAny(e.Comment, "\"\n\r\x00"):
			err = fmt.Errorf("comment longer than %d characters or holding a double quote or line break", maxComment)
		}
		if err == nil {
			if _, dup := out.entries[m]; dup {
				err = fmt.Errorf("listed twice (as %s)", m)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("entry %q: %w", e.Member, err))
			continue
		}
		out.entries[m] = attrs{nomatch: e.NoMatch, comment: e.Comment}
		out.order = append(out.order, m)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("ipset %s: %w", s.Name, errors.Join(errs...))
	}
	return out, nil
}

// canonicalMember writes a member the way `ipset list` prints it, so that the kernel's
// entries can be compared with the desired ones as strings.
func canonicalMember(dims []string, family, member string) (string, error) {
	parts := strings.Split(member, ",")
	if len(parts) != len(dims) {
		return "", fmt.Errorf("want %d comma-separated parts (%s)", len(dims), strings.Join(dims, ","))
	}
	for i, p := range parts {
		var err error
		switch dims[i] {
		case "ip":
			var a netip.Addr
			if a, err = netip.ParseAddr(p); err == nil {
				err = checkFamily(a, family)
				parts[i] = a.String()
			}
		case "net":
			var pf netip.Prefix
			if pf, err = parsePrefix(p); err == nil {
				if err = checkFamily(pf.Addr(), family); err == nil && pf.Bits() == 0 {
					err = errors.New("a /0 network is not an entry ipset takes")
				}
				if pf.Bits() == pf.Addr().BitLen() {
					parts[i] = pf.Addr().String()
				} else {
					parts[i] = pf.String()
				}
			}
		case "port":
			parts[i], err = canonicalPort(p)
		case "iface":
			if name := strings.TrimPrefix(p, "physdev:"); name == "" || len(name) > 15 || strings.ContainsAny(name, " /") {
				err = fmt.Errorf("%q is not an interface name", p)
			}
		}
		if err != nil {
			return "", err
		}
	}
	return strings.Join(parts, ","), nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	return p.Masked(), err
}

func checkFamily(a netip.Addr, family string) error {
	if a.Zone() != "" {
		return fmt.Errorf("%s: zones are not taken", a)
	}
	if (family == "inet") != a.Is4() {
		return fmt.Errorf("%s is not an address of family %s", a, family)
	}
	return nil
}

var portProtos = []string{"tcp", "udp", "sctp", "udplite"}

func canonicalPort(p string) (string, error) {
	proto, port, ok := strings.Cut(p, ":")
	if !ok {
		proto, port = "tcp", p
	}
	proto = strings.ToLower(proto)
	if !slices.Contains(portProtos, proto) {
		return "", fmt.Errorf("protocol %q: want one of %s", proto, strings.Join(portProtos, ", "))
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return "", fmt.Errorf("port %q: want a number 0-65535", port)
	}
	return proto + ":" + strconv.FormatUint(n, 10), nil
}
