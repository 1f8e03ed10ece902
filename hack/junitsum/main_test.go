package main

import (
	"encoding/xml"
	"regexp"
	"testing"
)

func TestSummarize(t *testing.T) {
	const doc = `<testsuites><testsuite>
<testcase name="[SynchronizedBeforeSuite]"></testcase>
<testcase name="[It] [sig-network] Netpol allows a"></testcase>
<testcase name="[It] [sig-network] Netpol denies b"><failure message="timeout"></failure></testcase>
<testcase name="[It] [sig-network] Netpol SCTP c"><skipped message="skipped"></skipped></testcase>
<testcase name="[It] [sig-network] Netpol needs a provider"><skipped message="skipped - Only supported for providers [gce]"></skipped></testcase>
<testcase name="[It] [sig-apps] Deployment d"><skipped message="skipped"></skipped></testcase>
<testcase name="[SynchronizedAfterSuite]"><failure message="cleanup"></failure></testcase>
</testsuite></testsuites>`
	var r report
	if err := xml.Unmarshal([]byte(doc), &r); err != nil {
		t.Fatal(err)
	}
	got := summarize(r, regexp.MustCompile(`\[sig-network\] Netpol`), regexp.MustCompile(`SCTP`)).String()
	// Not selected (sig-apps) and passing suite nodes don't count; a failed suite node does.
	if want := "1 passed, 2 failed, 2 skipped (1 by test/upstream/skip.txt, 1 at run time)"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
}
