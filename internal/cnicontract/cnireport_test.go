package cnicontract_test

import (
	"strings"
	"testing"

	"github.com/trellis-net/trellis/internal/cnicontract"
)

// The wire format is a contract between releases: a plugin of one release reports to an
// agent of another during an upgrade, so the encoding is pinned here byte for byte.
func TestCNIReportWire(t *testing.T) {
	b, err := cnicontract.CNIReport{Command: cnicontract.CommandAdd, Result: cnicontract.ResultSuccess, Seconds: 0.25}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"v":1,"cmd":"ADD","result":"success","s":0.25}`; string(b) != want {
		t.Errorf("encoded %s, want %s", b, want)
	}
	r, err := cnicontract.DecodeCNIReport(b)
	if err != nil || r != (cnicontract.CNIReport{Version: 1, Command: "ADD", Result: "success", Seconds: 0.25}) {
		t.Errorf("round trip: %+v, %v", r, err)
	}
}

func TestDecodeCNIReport(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		err      string // "" when valid
	}{
		{"DEL with an error class", `{"v":1,"cmd":"DEL","result":"io_failure","s":0.01}`, ""},
		{"CHECK, unknown fields ignored", `{"v":1,"cmd":"CHECK","result":"other","s":0,"extra":true}`, ""},
		{"a newer version", `{"v":2,"cmd":"ADD","result":"success","s":0.1}`, "version 2"},
		{"no version", `{"cmd":"ADD","result":"success","s":0.1}`, "version 0"},
		{"unknown command", `{"v":1,"cmd":"GC","result":"success","s":0.1}`, `command "GC"`},
		{"free-form result", `{"v":1,"cmd":"ADD","result":"pod 1234 failed","s":0.1}`, "not a known class"},
		{"negative duration", `{"v":1,"cmd":"ADD","result":"success","s":-1}`, "duration"},
		{"not JSON", `ADD ok`, "not JSON"},
		{"oversized", `{"v":1,"cmd":"ADD","result":"success","s":0.1,"pad":"` + strings.Repeat("x", 600) + `"}`, "exceeds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := cnicontract.DecodeCNIReport([]byte(tc.in))
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("want valid, got %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("want an error saying %q, got %v", tc.err, err)
			}
		})
	}
}

func TestResultClass(t *testing.T) {
	for code, want := range map[uint]string{0: "other", 5: "io_failure", 8: "invalid_netns", 11: "try_again_later", 999: "internal", 100: "other", 9: "other"} {
		if got := cnicontract.ResultClass(code); got != want {
			t.Errorf("ResultClass(%d) = %q, want %q", code, got, want)
		}
	}
}
