package main

import "testing"

// The symbols seen in a real profile of the trellis side land in the part of netfilter
// they belong to, and everything else in none.
func TestCostOf(t *testing.T) {
	for sym, want := range map[string]string{
		"comment_mt":              "xtables matches (comment, conntrack state, rpfilter, set)",
		"nft_match_large_eval":    "xtables matches (comment, conntrack state, rpfilter, set)",
		"rpfilter_mt":             "xtables matches (comment, conntrack state, rpfilter, set)",
		"conntrack_mt_v3":         "xtables matches (comment, conntrack state, rpfilter, set)",
		"__nf_conntrack_find_get": "conntrack",
		"nf_conntrack_tcp_packet": "conntrack",
		"nf_confirm":              "conntrack",
		"__siphash_unaligned":     "conntrack",
		"nf_nat_ipv4_pre_routing": "NAT hooks",
		"nft_do_chain":            "rule evaluation (nft)",
		"nft_counter_eval":        "rule evaluation (nft)",
		"nf_hook_slow":            "hook dispatch",
		"fib_table_lookup":        "",
		"_copy_to_iter":           "",
		"veth_xmit":               "",
	} {
		if got := costOf(sym); got != want {
			t.Errorf("costOf(%s) = %q, want %q", sym, got, want)
		}
	}
}

func TestPerfLine(t *testing.T) {
	for line, want := range map[string][3]string{
		"     4.78%          1234  iperf3           [k] _copy_to_iter": {"1234", "iperf3", "_copy_to_iter"},
		"     0.10%            12  ksoftirqd/1      [k] nft_do_chain":  {"12", "ksoftirqd/1", "nft_do_chain"},
		"     0.81%           210  iperf3           [.] read":          {"210", "iperf3", "read"},
	} {
		m := perfLine.FindStringSubmatch(line)
		if m == nil || [3]string{m[1], m[2], m[3]} != want {
			t.Errorf("%q: got %q, want %q", line, m, want)
		}
	}
	if perfLine.MatchString("# Samples: 12K of event 'cpu-clock:ppp'") {
		t.Error("a header line matched")
	}
}
