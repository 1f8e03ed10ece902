package offload

import (
	"strings"
	"testing"
)

func TestParseKernelRelease(t *testing.T) {
	for _, tc := range []struct {
		release      string
		major, minor int
		tooOld       bool
		bad          bool
	}{
		{"6.18.44-fc-v1098", 6, 18, false, false},
		{"5.4.0-150-generic", 5, 4, true, false},
		{"5.7.0", 5, 7, false, false},
		{"5.6.19-300.fc32.x86_64", 5, 6, true, false},
		{"4.18.0-553.el8_10.x86_64", 4, 18, true, false},
		{"3.10.0-1160.el7.x86_64", 3, 10, true, false},
		{"5.15", 5, 15, false, false},
		{"6.1rc2", 6, 1, false, false},
		{"10.0.1", 10, 0, false, false},
		{"", 0, 0, false, true},
		{"6", 0, 0, false, true},
		{"v6.1", 0, 0, false, true},
		{"6.x", 0, 0, false, true},
	} {
		major, minor, err := ParseKernelRelease(tc.release)
		if (err != nil) != tc.bad || major != tc.major || minor != tc.minor {
			t.Errorf("ParseKernelRelease(%q) = %d, %d, %v; want %d, %d, error %v", tc.release, major, minor, err, tc.major, tc.minor, tc.bad)
		}
		if got := kernelTooOld(tc.release); got != tc.tooOld {
			t.Errorf("kernelTooOld(%q) = %v, want %v (unreadable releases count as new: the self-test still guards)", tc.release, got, tc.tooOld)
		}
	}
}

func TestDecide(t *testing.T) {
	const newKernel, oldKernel = "6.18.44", "5.4.0-150-generic"
	for _, tc := range []struct {
		name          string
		mode, release string
		verdict       Verdict
		on, probe     bool
		reason        string
		msg           string
	}{
		{"Auto, unverified", ModeAuto, newKernel, Unverified, true, true, ReasonUnverified, "no conclusive result"},
		{"empty mode is Auto", "", newKernel, Unverified, true, true, ReasonUnverified, ""},
		{"Auto, tunnel works", ModeAuto, newKernel, Working, true, true, ReasonTunnelVerified, "work"},
		{"Auto, self-test failed", ModeAuto, newKernel, Broken, false, true, ReasonChecksumOffloadBroken, "so it is off"},
		{"Auto, old kernel", ModeAuto, oldKernel, Unverified, false, false, ReasonKernelTooOld, "older than 5.7"},
		{"Auto, old kernel, whatever the test said", ModeAuto, oldKernel, Working, false, false, ReasonKernelTooOld, ""},
		{"Enabled", ModeEnabled, oldKernel, Working, true, true, ReasonEnabled, "Enabled"},
		{"Enabled, self-test failed: reported, left on", ModeEnabled, newKernel, Broken, true, true, ReasonChecksumOffloadBroken, "keeps it on"},
		{"Disabled", ModeDisabled, newKernel, Working, false, false, ReasonDisabled, "Disabled"},
		{"Disabled, self-test failed", ModeDisabled, newKernel, Broken, false, false, ReasonDisabled, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.mode, tc.release, tc.verdict, "")
			if d.On != tc.on || d.Probe != tc.probe || d.Reason != tc.reason || !strings.Contains(d.Message, tc.msg) {
				t.Errorf("Decide = %+v, want on %v probe %v reason %s, a message with %q", d, tc.on, tc.probe, tc.reason, tc.msg)
			}
		})
	}
	if d := Decide(ModeAuto, newKernel, Broken, "to node-b"); !strings.HasSuffix(d.Message, ": to node-b") {
		t.Errorf("the detail is not in the message: %q", d.Message)
	}
}

func TestJudge(t *testing.T) {
	ok := func(p string) Result { return Result{Peer: p, Control: true, UDP: true, TCP: true} }
	broken := func(p string) Result { return Result{Peer: p, Control: true} }
	silent := func(p string) Result { return Result{Peer: p} }
	theirs := func(p string) Result { return Result{Peer: p, Control: true, UDP: true} } // their replies fail
	for _, tc := range []struct {
		name      string
		on        bool
		results   []Result
		prev      Verdict
		want      Verdict
		detail    string // substring; "=" + x for equality
		keepsPrev bool
	}{
		{"one peer works", true, []Result{ok("b")}, Unverified, Working, "=", false},
		{"works, another broken", true, []Result{broken("b"), ok("c")}, Unverified, Working, "=", false},
		{"every answering peer broken", true, []Result{broken("b"), silent("c"), broken("d")}, Working, Broken, "to b, d", false},
		{"no peer answered the control", true, []Result{silent("b"), silent("c")}, Working, Working, "", true},
		{"no peers", true, nil, Unverified, Unverified, "", true},
		{"their replies fail: not ours to fix", true, []Result{theirs("b")}, Working, Working, "", true},
		{"mixed", true, []Result{theirs("b"), broken("c")}, Unverified, Unverified, "", true},
		{"off after broken, tunnel works", false, []Result{ok("b")}, Broken, Broken, "get through", false},
		{"off after broken, still fails", false, []Result{broken("b")}, Broken, Broken, "something other than offload", false},
		{"off, nobody answered", false, []Result{silent("b")}, Broken, Broken, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, detail := Judge(tc.on, tc.results, tc.prev, "previous")
			if v != tc.want {
				t.Errorf("verdict %s, want %s", v, tc.want)
			}
			switch {
			case tc.keepsPrev && detail != "previous":
				t.Errorf("detail %q, want the previous one kept", detail)
			case !tc.keepsPrev && tc.detail == "=" && detail != "":
				t.Errorf("detail %q, want none (rotating peers must not change the status)", detail)
			case !tc.keepsPrev && tc.detail != "=" && !strings.Contains(detail, tc.detail):
				t.Errorf("detail %q, want it to say %q", detail, tc.detail)
			}
		})
	}
}
