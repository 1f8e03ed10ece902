package main

import (
	"strings"
	"testing"
)

func TestParseIperf(t *testing.T) {
	good := `{"start": {}, "intervals": [], "end": {
		"sum_sent": {"bytes": 3000000000, "bits_per_second": 8.1e9, "retransmits": 12},
		"sum_received": {"bytes": 2999000000, "bits_per_second": 7.99e9}}}`
	r, err := parseIperf([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if r.gbps != 7.99 || r.bytes != 2999000000 || r.retransmits != 12 {
		t.Errorf("parsed %+v", r)
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
