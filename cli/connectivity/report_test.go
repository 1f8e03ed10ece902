package connectivity

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func sampleReport() Report {
	return Report{
		Namespace: "trellis-connectivity-abcde", Nodes: []string{"node1", "node2"}, Image: DefaultImage,
		Duration: 21300 * time.Millisecond,
		Results: []Result{
			{
				Check: Check{Kind: KindPodCrossNode, From: "node1", To: "node2"}, Status: Pass, Duration: 420 * time.Millisecond,
				From: Endpoint{Node: "node1", Pod: "client-node1", Desc: "client-node1 (node1)"},
				To:   Endpoint{Node: "node2", Pod: "server-node2", Address: "10.244.1.3:8080", Desc: "server-node2 (node2) 10.244.1.3:8080"},
			},
			{
				Check: Check{Kind: KindMTU, From: "node2", To: "node1"}, Status: Fail, Duration: 15 * time.Second,
				From:   Endpoint{Node: "node2", Pod: "client-node2", Desc: "client-node2 (node2)"},
				To:     Endpoint{Node: "node1", Pod: "server-node1", Address: "10.244.0.3:9100", Desc: "server-node1 (node1) UDP 10.244.0.3:9100"},
				Detail: "no answer to a 1450-byte packet\nwith DF set",
			},
			{
				Check: Check{Kind: KindDNS, From: "node1"}, Status: Skip,
				From:   Endpoint{Node: "node1", Pod: "client-node1", Desc: "client-node1 (node1)"},
				To:     Endpoint{Desc: "cluster DNS"},
				Detail: "skipped: no cluster DNS (no Service kube-system/kube-dns)",
			},
		},
	}
}

func TestWriteText(t *testing.T) {
	var b bytes.Buffer
	sampleReport().WriteText(&b)
	out := b.String()
	lines := strings.Split(out, "\n")
	find := func(prefix string) string {
		for _, l := range lines {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		t.Fatalf("no line starting %q in:\n%s", prefix, out)
		return ""
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"PASS", []string{"420ms", "pod → pod, across nodes", "client-node1 (node1) → server-node2 (node2) 10.244.1.3:8080"}},
		// A failed line names the source node and pod and the destination node, and its
		// detail stays on the line.
		{"FAIL", []string{"15s", "full-MTU packet with DF", "client-node2 (node2) →", "server-node1 (node1)", "no answer to a 1450-byte packet with DF set"}},
		{"SKIP", []string{"DNS", "skipped: no cluster DNS"}},
		{"Summary:", []string{"3 checks: 1 passed, 1 failed, 1 skipped (21.3s)"}},
		{"Failed checks per node:", []string{"node1 (1), node2 (1)"}},
		{"Connectivity test on 2 node(s)", []string{"node1, node2", "trellis-connectivity-abcde"}},
	} {
		l := find(tc.prefix)
		for _, w := range tc.want {
			if !strings.Contains(l, w) {
				t.Errorf("line %q lacks %q", l, w)
			}
		}
	}
	// The check columns line up: every check line has its title at the same column.
	col := -1
	for _, l := range lines {
		if i := strings.Index(l, "  pod → pod"); strings.HasPrefix(l, "PASS") && i > 0 {
			col = len([]rune(l[:i]))
		}
	}
	if fl := find("FAIL"); col < 0 || len([]rune(fl[:strings.Index(fl, "full-MTU")])) != col+2 {
		t.Errorf("columns don't line up:\n%s", out)
	}
}

func TestWriteJSON(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Namespace string
		Nodes     []string
		Checks    []struct {
			Name, Title, Status, Detail string
			From, To                    struct{ Node, Pod, Address string }
			Nodes                       []string
			DurationSeconds             float64
		}
		Summary         struct{ Passed, Failed, Skipped int }
		OK              bool
		DurationSeconds float64
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, b.String())
	}
	if got.OK || got.Summary.Passed != 1 || got.Summary.Failed != 1 || got.Summary.Skipped != 1 || got.DurationSeconds != 21.3 {
		t.Errorf("summary: ok=%v %+v duration %v", got.OK, got.Summary, got.DurationSeconds)
	}
	if len(got.Checks) != 3 {
		t.Fatalf("%d checks, want 3", len(got.Checks))
	}
	mtu := got.Checks[1]
	if mtu.Name != string(KindMTU) || mtu.Status != "fail" || mtu.From.Node != "node2" || mtu.To.Node != "node1" ||
		mtu.To.Address != "10.244.0.3:9100" || strings.Join(mtu.Nodes, ",") != "node2,node1" || mtu.DurationSeconds != 15 {
		t.Errorf("the failed check: %+v", mtu)
	}
	if dns := got.Checks[2]; dns.Status != "skip" || dns.From.Node != "node1" || len(dns.Nodes) != 1 || dns.To.Node != "" {
		t.Errorf("the skipped check: %+v", dns)
	}
	// An empty report is still a document scripts can read.
	b.Reset()
	if err := (Report{}).WriteJSON(&b); err != nil || !strings.Contains(b.String(), `"checks": []`) || !strings.Contains(b.String(), `"ok": true`) {
		t.Errorf("empty report: %v\n%s", err, b.String())
	}
}

func TestReportOK(t *testing.T) {
	for _, tc := range []struct {
		name        string
		statuses    []Status
		interrupted bool
		want        bool
	}{
		{"all passed", []Status{Pass, Pass}, false, true},
		{"skips are not failures", []Status{Pass, Skip}, false, true},
		{"one failed", []Status{Pass, Fail, Skip}, false, false},
		{"interrupted", []Status{Pass}, true, false},
	} {
		var r Report
		for _, s := range tc.statuses {
			r.Results = append(r.Results, Result{Status: s})
		}
		r.Interrupted = tc.interrupted
		if got := r.OK(); got != tc.want {
			t.Errorf("%s: OK() = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestIsLeftover(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	ns := func(name string, labelled bool, created time.Time, deleting bool) *corev1.Namespace {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created), Labels: map[string]string{}}}
		if labelled {
			n.Labels[LabelTest] = "true"
		}
		if deleting {
			ts := metav1.NewTime(now)
			n.DeletionTimestamp = &ts
		}
		return n
	}
	// lease renewed at renewed (zero: never), created at created.
	lease := func(created, renewed time.Time) *coordinationv1.Lease {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName, CreationTimestamp: metav1.NewTime(created)}}
		if !renewed.IsZero() {
			t := metav1.NewMicroTime(renewed)
			l.Spec.RenewTime = &t
		}
		return l
	}
	old := now.Add(-time.Hour)
	for _, tc := range []struct {
		name  string
		ns    *corev1.Namespace
		lease *coordinationv1.Lease
		want  bool
	}{
		{"stale Lease", ns(NamespacePrefix+"a", true, old, false), lease(old, now.Add(-2*time.Minute)), true},
		{"fresh Lease: a run in progress", ns(NamespacePrefix+"b", true, old, false), lease(old, now.Add(-5*time.Second)), false},
		{"stale Lease in a namespace just created", ns(NamespacePrefix+"g", true, now.Add(-time.Second), false), lease(old, now.Add(-2*time.Minute)), true},
		{"Lease never renewed, created long ago", ns(NamespacePrefix+"h", true, old, false), lease(old, time.Time{}), true},
		{"Lease never renewed, just created", ns(NamespacePrefix+"i", true, old, false), lease(now.Add(-time.Second), time.Time{}), false},
		{"no Lease, created long ago", ns(NamespacePrefix+"c", true, old, false), nil, true},
		{"no Lease, just created (a run between creating the namespace and its Lease)", ns(NamespacePrefix+"d", true, now.Add(-time.Second), false), nil, false},
		{"already being deleted", ns(NamespacePrefix+"e", true, old, true), nil, false},
		{"not labelled", ns(NamespacePrefix+"f", false, old, false), nil, false},
		{"labelled but not our name", ns("production", true, old, false), nil, false},
	} {
		if _, got := IsLeftover(tc.ns, tc.lease, now); got != tc.want {
			t.Errorf("%s: IsLeftover = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestDomainFromResolvConf(t *testing.T) {
	for _, tc := range []struct {
		conf, want string
		ok         bool
	}{
		{"search ns1.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n", "cluster.local", true},
		{"nameserver 10.96.0.10\nsearch ns1.svc.k8s.example.com. svc.k8s.example.com\n", "k8s.example.com", true},
		{"search other.svc.cluster.local\n", "", false},
		{"nameserver 1.1.1.1\n", "", false},
	} {
		got, ok := DomainFromResolvConf(tc.conf, "ns1")
		if got != tc.want || ok != tc.ok {
			t.Errorf("DomainFromResolvConf(%q) = %q, %v; want %q, %v", tc.conf, got, ok, tc.want, tc.ok)
		}
	}
}

func TestParseMTUOutput(t *testing.T) {
	for _, tc := range []struct {
		out   string
		mtu   int
		reply string
	}{
		{"mtu 1450\n1422\n", 1450, "1422"},
		{"mtu 1450\n", 1450, ""},
		{"mtu 9000\n2026/12/05 socat[7] E write(5, 0x0, 8972): Message too long\n", 9000, "2026/12/05 socat[7] E write(5, 0x0, 8972): Message too long"},
		{"", 0, ""},
	} {
		mtu, reply := parseMTUOutput(tc.out)
		if mtu != tc.mtu || reply != tc.reply {
			t.Errorf("parseMTUOutput(%q) = %d, %q; want %d, %q", tc.out, mtu, reply, tc.mtu, tc.reply)
		}
	}
}

func TestNetworkFailure(t *testing.T) {
	for msg, want := range map[string]bool{
		"TIMEOUT":                           true,
		"REFUSED":                           true,
		"OTHER: dial tcp: no route to host": true,
		"DNS: lookup x: no such host":       false,
		"UNKNOWN: missing port in address":  false,
		"exec: \"/agnhost\": no such file":  false,
	} {
		if got := networkFailure(msg); got != want {
			t.Errorf("networkFailure(%q) = %v, want %v", msg, got, want)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	good := Options{Image: DefaultImage, HostPort: 18799, PodTimeout: time.Minute, CheckTimeout: 10 * time.Second, Parallel: 4}
	if err := good.validate(); err != nil {
		t.Fatalf("good options: %v", err)
	}
	for flag, mutate := range map[string]func(*Options){
		"--image":         func(o *Options) { o.Image = "" },
		"--host-port":     func(o *Options) { o.HostPort = 70000 },
		"--pod-timeout":   func(o *Options) { o.PodTimeout = 0 },
		"--check-timeout": func(o *Options) { o.CheckTimeout = time.Second },
		"--parallel":      func(o *Options) { o.Parallel = 0 },
		"--nodes":         func(o *Options) { o.Nodes = []string{"node1", " "} },
	} {
		o := good
		mutate(&o)
		if err := o.validate(); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s: error %v, want one naming the flag", flag, err)
		}
	}
}

func TestBudgetExhausted(t *testing.T) {
	for _, tc := range []struct {
		name    string
		elapsed time.Duration
		ran     int
		want    bool
	}{
		{"in time", 5 * time.Second, 3, false},
		{"time up, the network answered twice", 11 * time.Second, 2, true},
		// Slow execs (a busy API server or kubelet) don't fail the network...
		{"time up, execs never completed", 11 * time.Second, 0, false},
		{"time up, one verdict only", 30 * time.Second, 1, false},
		// ...until the hard bound.
		{"hard bound", 41 * time.Second, 0, true},
	} {
		b := newBudget(10 * time.Second)
		b.start = time.Now().Add(-tc.elapsed)
		b.ran = tc.ran
		if got := b.exhausted(); got != tc.want {
			t.Errorf("%s: exhausted() = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The MTU check's datagram fills the pod MTU less the headers of the echo's family: 28
// bytes over IPv4, 48 over IPv6 (an IPv6-only cluster's pods), sent with socat's address
// of that family.
func TestMTUScriptFamilies(t *testing.T) {
	for _, tc := range []struct {
		addr    string
		ipv6    bool
		headers int
		send    string
	}{
		{"10.244.1.5:9100", false, 28, "UDP4:10.244.1.5:9100,mtudiscover=2"},
		{"[fd00:10:244:1::5]:9100", true, 48, "UDP6:[fd00:10:244:1::5]:9100,mtudiscover=2"},
	} {
		script, headers := mtuScript(tc.addr, tc.ipv6)
		if headers != tc.headers || !strings.Contains(script, "$((m - "+strconv.Itoa(tc.headers)+"))") || !strings.Contains(script, tc.send) {
			t.Errorf("%s: headers %d, script:\n%s\nwant %d bytes of headers and %q", tc.addr, headers, script, tc.headers, tc.send)
		}
	}
	for _, l := range []string{"UDP4-RECVFROM:9100,fork", "UDP6-RECVFROM:9100,fork,ipv6only=1"} {
		if !strings.Contains(sizeEcho, l) {
			t.Errorf("the size echo has no %s listener:\n%s", l, sizeEcho)
		}
	}
}

// The DNS check asks for the records of the Services' family: A, or AAAA on an IPv6-only
// cluster.
func TestDNSScriptFamilies(t *testing.T) {
	for _, tc := range []struct{ clusterIP, want string }{
		{"10.96.12.34", "dig +short +time=2 +tries=1 A kubernetes.default.svc.cluster.local; echo ---; dig +short +time=2 +tries=1 A server-node2.ns.svc.cluster.local"},
		{"fd00:10:96::1234", "dig +short +time=2 +tries=1 AAAA kubernetes.default.svc.cluster.local; echo ---; dig +short +time=2 +tries=1 AAAA server-node2.ns.svc.cluster.local"},
	} {
		if got := dnsScript("kubernetes.default.svc.cluster.local", "server-node2.ns.svc.cluster.local", tc.clusterIP); got != tc.want {
			t.Errorf("ClusterIP %s: %q, want %q", tc.clusterIP, got, tc.want)
		}
	}
}
