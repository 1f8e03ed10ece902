package ipfamily_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

func TestFamily(t *testing.T) {
	for _, tc := range []struct {
		f                 ipfamily.Family
		name, set         string
		bits              int
		any, defaultRoute string
	}{
		{ipfamily.IPv4, "IPv4", "inet", 32, "0.0.0.0", "0.0.0.0/0"},
		{ipfamily.IPv6, "IPv6", "inet6", 128, "::", "::/0"},
	} {
		if got := tc.f.String(); got != tc.name {
			t.Errorf("String() = %q, want %q", got, tc.name)
		}
		if got := tc.f.SetFamily(); got != tc.set {
			t.Errorf("%s.SetFamily() = %q, want %q", tc.f, got, tc.set)
		}
		if got := tc.f.Bits(); got != tc.bits {
			t.Errorf("%s.Bits() = %d, want %d", tc.f, got, tc.bits)
		}
		if got := tc.f.Any(); got.String() != tc.any || !got.IsUnspecified() || ipfamily.Of(got) != tc.f {
			t.Errorf("%s.Any() = %s, want %s of that family", tc.f, got, tc.any)
		}
		if got := tc.f.Default(); got.String() != tc.defaultRoute {
			t.Errorf("%s.Default() = %s, want %s", tc.f, got, tc.defaultRoute)
		}
	}
	if len(ipfamily.All) != 2 || ipfamily.All[0] != ipfamily.IPv4 || ipfamily.All[1] != ipfamily.IPv6 {
		t.Errorf("All = %v, want [IPv4 IPv6]", ipfamily.All)
	}
	if got := ipfamily.Family(0).String(); got != "Family(0)" {
		t.Errorf("Family(0).String() = %q", got)
	}
}

// The one rule: an IPv4-mapped IPv6 address is IPv4, wherever it is looked at.
func TestOf(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want ipfamily.Family
		host string
	}{
		{"10.0.0.1", ipfamily.IPv4, "10.0.0.1/32"},
		{"0.0.0.0", ipfamily.IPv4, "0.0.0.0/32"},
		{"::ffff:10.0.0.1", ipfamily.IPv4, "10.0.0.1/32"},
		{"::ffff:0:0", ipfamily.IPv4, "0.0.0.0/32"},
		{"fd00::1", ipfamily.IPv6, "fd00::1/128"},
		{"::", ipfamily.IPv6, "::/128"},
		{"::10.0.0.1", ipfamily.IPv6, "::a00:1/128"}, // IPv4-compatible (deprecated), not mapped
		{"64:ff9b::10.0.0.1", ipfamily.IPv6, "64:ff9b::a00:1/128"},
	} {
		a := netip.MustParseAddr(tc.addr)
		if got := ipfamily.Of(a); got != tc.want {
			t.Errorf("Of(%s) = %s, want %s", tc.addr, got, tc.want)
		}
		if got := ipfamily.Host(a); got.String() != tc.host || ipfamily.OfPrefix(got) != tc.want {
			t.Errorf("Host(%s) = %s, want %s", tc.addr, got, tc.host)
		}
	}
}

func TestOfPrefix(t *testing.T) {
	for p, want := range map[string]ipfamily.Family{
		"10.0.0.0/8": ipfamily.IPv4, "::ffff:10.0.0.0/104": ipfamily.IPv4, "fd00::/8": ipfamily.IPv6, "::/0": ipfamily.IPv6,
	} {
		if got := ipfamily.OfPrefix(netip.MustParsePrefix(p)); got != want {
			t.Errorf("OfPrefix(%s) = %s, want %s", p, got, want)
		}
	}
}

func TestHostOfNoAddress(t *testing.T) {
	if p := ipfamily.Host(netip.Addr{}); p.IsValid() {
		t.Errorf("Host(invalid) = %s, want an invalid prefix", p)
	}
}

func TestParseAddr(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{"10.0.0.1", "10.0.0.1", ""},
		{"::ffff:10.0.0.1", "10.0.0.1", ""},
		{"fd00:0::1", "fd00::1", ""},
		{"fe80::1%eth0", "fe80::1%eth0", ""},
		{"", "", `--node-ip "" is not an IP address`},
		{"10.0.0.1/24", "", `--node-ip "10.0.0.1/24" is not an IP address`},
		{"10.0.0.256", "", `--node-ip "10.0.0.256" is not an IP address`},
	} {
		got, err := ipfamily.ParseAddr("--node-ip", tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseAddr(%q) = %s, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got.String() != tc.want || got.Is4In6() {
			t.Errorf("ParseAddr(%q) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

func TestParsePrefix(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		family   ipfamily.Family
		err      string
	}{
		{"10.244.0.0/16", "10.244.0.0/16", ipfamily.IPv4, ""},
		{"10.244.1.7/16", "10.244.1.7/16", ipfamily.IPv4, ""}, // host bits are the caller's to refuse
		{"fd00:10:244::/56", "fd00:10:244::/56", ipfamily.IPv6, ""},
		{"::ffff:10.0.0.0/104", "", 0, `spec.podCIDRs[1] "::ffff:10.0.0.0/104" is an IPv4-mapped prefix: write it as IPv4, 10.0.0.0/8`},
		{"::ffff:10.0.0.1/128", "", 0, `spec.podCIDRs[1] "::ffff:10.0.0.1/128" is an IPv4-mapped prefix: write it as IPv4, 10.0.0.1/32`},
		{"::ffff:0:0/96", "", 0, `spec.podCIDRs[1] "::ffff:0:0/96" is an IPv4-mapped prefix: write it as IPv4, 0.0.0.0/0`},
		{"::ffff:0:0/95", "", 0, `spec.podCIDRs[1] "::ffff:0:0/95" is an IPv4-mapped prefix shorter than /96`},
		{"::/0", "::/0", ipfamily.IPv6, ""},
		{"10.0.0.0", "", 0, `spec.podCIDRs[1] "10.0.0.0" is not a CIDR`},
		{"10.0.0.0/33", "", 0, `spec.podCIDRs[1] "10.0.0.0/33" is not a CIDR`},
	} {
		got, err := ipfamily.ParsePrefix("spec.podCIDRs[1]", tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParsePrefix(%q) = %s, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got.String() != tc.want || ipfamily.OfPrefix(got) != tc.family {
			t.Errorf("ParsePrefix(%q) = %s (%s), %v; want %s (%s)", tc.in, got, ipfamily.OfPrefix(got), err, tc.want, tc.family)
		}
	}
}

func TestPair(t *testing.T) {
	var p ipfamily.Pair[[]string]
	for _, a := range []string{"10.0.0.1", "fd00::1", "::ffff:10.0.0.2", "fd00::2"} {
		f := ipfamily.Of(netip.MustParseAddr(a))
		p.Set(f, append(p.Get(f), a))
	}
	if got := strings.Join(p.Get(ipfamily.IPv4), " "); got != "10.0.0.1 ::ffff:10.0.0.2" {
		t.Errorf("IPv4: %s", got)
	}
	if got := strings.Join(p.Get(ipfamily.IPv6), " "); got != "fd00::1 fd00::2" {
		t.Errorf("IPv6: %s", got)
	}
	if got := (ipfamily.Pair[int]{V4: 24, V6: 64}).Get(ipfamily.IPv6); got != 64 {
		t.Errorf("Get(IPv6) = %d, want 64", got)
	}
}
