package main

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseIperf(t *testing.T) {
	good := `{"start": {"connected": [{"socket": 5, "local_host": "fd00:10:100:1::2", "local_port": 41234, "remote_host": "fd00:10:100:2::2", "remote_port": 5201}]}, "intervals": [], "end": {
		"sum_sent": {"bytes": 3000000000, "bits_per_second": 8.1e9, "retransmits": 12},
		"sum_received": {"bytes": 2999000000, "bits_per_second": 7.99e9}}}`
	r, err := parseIperf([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if r.gbps != 7.99 || r.bytes != 2999000000 || r.retransmits != 12 ||
		r.local != netip.MustParseAddr("fd00:10:100:1::2") || r.remote != netip.MustParseAddr("fd00:10:100:2::2") {
		t.Errorf("parsed %+v", r)
	}
	mapped := strings.NewReplacer("fd00:10:100:1::2", "::ffff:10.100.1.2", "fd00:10:100:2::2", "::ffff:10.100.2.2").Replace(good)
	if r, err := parseIperf([]byte(mapped)); err != nil || r.local != netip.MustParseAddr("10.100.1.2") || r.remote != netip.MustParseAddr("10.100.2.2") {
		t.Errorf("IPv4-mapped ends: %+v, %v; want the IPv4 addresses", r, err)
	}
	for name, in := range map[string]string{
		"iperf3 error": `{"start": {}, "intervals": [], "end": {}, "error": "unable to connect to server: Connection refused"}`,
		"empty":        "",
		"not JSON":     "iperf3: error - unable to connect",
		"no receiver":  `{"end": {"sum_sent": {"bytes": 1}}}`,
	} {
		if _, err := parseIperf([]byte(in)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	_, err = parseIperf([]byte(`{"error": "unable to connect to server: Connection refused"}`))
	if err == nil || !strings.Contains(err.Error(), "Connection refused") {
		t.Errorf("the iperf3 error is not passed on: %v", err)
	}
}
