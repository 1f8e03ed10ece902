//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/cli/connectivity"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/framework"
)

// checkLine is a line of `connectivity test`'s text output that reports a check.
var checkLine = regexp.MustCompile(`^(PASS|FAIL|SKIP)\s`)

// testCLIConnectivity runs `kubectl trellis connectivity test` on the healthy cluster as
// a user does: every check passes (the cluster has DNS, so none is skipped), the summary
// says so, it exits 0 and leaves no namespace behind (--output json: checkConnectivityJSON,
// run on the IPv6-only cluster); and a run interrupted with ^C mid-way removes everything
// it made.
func testCLIConnectivity(ctx context.Context, t *testing.T, env *cliEnv) {
	nodes := clusterNodeNames(env.c)
	want := len(connectivity.Plan(nodes))

	t.Run("Text", func(t *testing.T) {
		// A namespace as a run killed outright (SIGKILL) leaves it: labelled, its
		// heartbeat ten minutes old. This run must remove it.
		leftover := leaveNamespace(ctx, t, env, time.Now().Add(-10*time.Minute))
		r := env.kubectlTrellis(ctx, t, "connectivity", "test", "--image", images.AgnhostImage)
		if s := "removing namespace " + leftover + ", left by an earlier run"; !strings.Contains(r.Stderr, s) {
			t.Errorf("stderr does not say %q", s)
		}
		if r.Code != 0 {
			t.Errorf("exit %d, want 0", r.Code)
		}
		lines := checkLines(r.Stdout)
		if len(lines) != want {
			t.Errorf("%d check lines, want %d (the plan for %d nodes)", len(lines), want, len(nodes))
		}
		titles := map[string]bool{}
		for _, l := range lines {
			if !strings.HasPrefix(l, "PASS") {
				t.Errorf("not passed: %s", l)
			}
			for _, k := range []connectivity.Kind{connectivity.KindPodSameNode, connectivity.KindPodCrossNode, connectivity.KindClusterIP,
				connectivity.KindNodeToPod, connectivity.KindHostPort, connectivity.KindMTU, connectivity.KindDNS,
				connectivity.KindPolicyBaseline, connectivity.KindPolicyDeny, connectivity.KindPolicyAllow,
				connectivity.KindPolicyOther, connectivity.KindPolicyRelabel} {
				if strings.Contains(l, k.Title()) {
					titles[k.Title()] = true
				}
			}
			// Each line has its timing.
			if !regexp.MustCompile(`^PASS\s+[0-9.]+(ms|s)\s`).MatchString(l) {
				t.Errorf("no timing on: %s", l)
			}
		}
		if len(titles) != 12 {
			t.Errorf("%d kinds of check reported, want 12: %v", len(titles), titles)
		}
		if s := fmt.Sprintf("Summary: %d checks: %d passed, 0 failed, 0 skipped", want, want); !strings.Contains(r.Stdout, s) {
			t.Errorf("no %q in the output", s)
		}
		for _, p := range []string{"probe pods Ready", "removing namespace " + connectivity.NamespacePrefix} {
			if !strings.Contains(r.Stderr, p) {
				t.Errorf("no progress %q on stderr", p)
			}
		}
		assertNoTestNamespace(ctx, t, env, namespaceIn(r.Stdout))
	})

	t.Run("Forbidden", func(t *testing.T) {
		// A user whose RBAC lacks what the test needs (the namespace's default
		// ServiceAccount can do none of it) gets one error listing it all, and nothing
		// is made.
		before := testNamespaces(ctx, t, env)
		r := env.kubectlTrellis(ctx, t, "connectivity", "test", "--image", images.AgnhostImage, "--as", "system:serviceaccount:default:default")
		if r.Code != connectivity.ExitCouldNotRun {
			t.Errorf("exit %d, want %d", r.Code, connectivity.ExitCouldNotRun)
		}
		for _, want := range []string{"your RBAC does not allow:", "list nodes", "create namespaces", "create pods/exec", "create networkpolicies", "create leases.coordination.k8s.io", "docs/kubectl-trellis/connectivity.md"} {
			if !strings.Contains(r.Stderr, want) {
				t.Errorf("stderr lacks %q", want)
			}
		}
		// The heartbeat is a Lease in the test's namespace: no right to relabel namespaces.
		if strings.Contains(r.Stderr, "patch namespaces") {
			t.Errorf("stderr asks for patch namespaces:\n%s", r.Stderr)
		}
		t.Logf("stderr:\n%s", r.Stderr)
		if after := testNamespaces(ctx, t, env); after != before {
			t.Errorf("test namespaces before: %q, after: %q", before, after)
		}
	})

	t.Run("Interrupted", func(t *testing.T) {
		p := startKubectlTrellis(ctx, t, env, "connectivity", "test", "--image", images.AgnhostImage)
		// Mid-way: the probes are up and the checks (NetworkPolicies among them) running.
		ns := p.waitStderr(t, regexp.MustCompile(`deploying \d+ probe pods on \d+ node\(s\) in namespace (\S+)`), 2*time.Minute)
		p.waitStderr(t, regexp.MustCompile(`running \d+ checks`), 3*time.Minute)
		time.Sleep(3 * time.Second) //nolint:forbidigo // pacing: into the checks, not right at their start
		if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		code := p.wait(t, 3*time.Minute)
		t.Logf("interrupted run:\n--- stdout\n%s--- stderr\n%s", p.stdout.String(), p.stderr.String())
		if code != connectivity.ExitInterrupted {
			t.Errorf("exit %d after SIGINT, want %d", code, connectivity.ExitInterrupted)
		}
		if s := "interrupted: removing namespace " + ns; !strings.Contains(p.stderr.String(), s) {
			t.Errorf("stderr does not say %q", s)
		}
		// Only the test's own words: no log lines of the exec streams it cut.
		if l := regexp.MustCompile(`(?m)^[EWI]\d{4} .*$`).FindString(p.stderr.String()); l != "" {
			t.Errorf("a log line among the progress: %s", l)
		}
		assertNoTestNamespace(ctx, t, env, ns)
	})
}

// testCLIConnectivityBrokenNode breaks one node's pod network on purpose — everything
// arriving on its VXLAN device is dropped by an nftables table of the test's own, which
// Trellis neither owns nor repairs — and runs the test: it must exit 1, every failed
// check must name that node, and every check not involving it must still pass. The node
// is repaired afterwards (also when the test fails).
func testCLIConnectivityBrokenNode(ctx context.Context, t *testing.T, env *cliEnv) {
	nodes := clusterNodeNames(env.c)
	broken := pickNodeToBreak(ctx, t, env, nodes)
	var node cluster.Node
	for _, n := range env.c.Nodes {
		if n.Name == broken {
			node = n
		}
	}
	t.Logf("breaking node %s: dropping all it receives on its VXLAN device", broken)
	const table = "trellis-e2e-broken-node"
	rules := fmt.Sprintf(`table inet %s {
	chain in {
		type filter hook prerouting priority -400; policy accept;
		iifname "trellis.vxlan" counter drop
	}
}
`, table)
	file := filepath.Join(t.TempDir(), "break.nft")
	if err := os.WriteFile(file, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := framework.NodeOutput(node, "nft", "-f", file); err != nil {
		t.Fatalf("breaking node %s: %v\n%s", broken, err, out)
	}
	t.Cleanup(func() {
		if out, err := framework.NodeOutput(node, "nft", "list", "table", "inet", table); err == nil {
			t.Logf("the break's counter on %s:\n%s", broken, out)
		}
		if out, err := framework.NodeOutput(node, "nft", "delete", "table", "inet", table); err != nil {
			t.Errorf("repairing node %s: %v\n%s", broken, err, out)
		}
	})

	r := env.kubectlTrellis(ctx, t, "connectivity", "test", "--image", images.AgnhostImage, "--check-timeout", "10s")
	if r.Code != connectivity.ExitFailed {
		t.Errorf("exit %d with node %s broken, want %d", r.Code, broken, connectivity.ExitFailed)
	}
	names := regexp.MustCompile(`\b` + regexp.QuoteMeta(broken) + `\b`)
	failed := 0
	for _, l := range checkLines(r.Stdout) {
		involves := names.MatchString(l)
		switch {
		case strings.HasPrefix(l, "FAIL"):
			failed++
			if !involves {
				t.Errorf("a failed check that does not name the broken node %s: %s", broken, l)
			}
		case strings.HasPrefix(l, "SKIP") && strings.Contains(l, "not run:"):
			// A NetworkPolicy step after a failed one (the policy pods may be on the
			// broken node); that failure is checked above.
		case !involves && !strings.HasPrefix(l, "PASS"):
			t.Errorf("a check between healthy nodes did not pass: %s", l)
		}
	}
	if failed == 0 {
		t.Errorf("no check failed with node %s broken", broken)
	}
	if !regexp.MustCompile(`Failed checks per node: ` + regexp.QuoteMeta(broken) + ` \(`).MatchString(r.Stdout) {
		t.Errorf("the summary does not put %s first among the nodes of the failed checks", broken)
	}
	assertNoTestNamespace(ctx, t, env, namespaceIn(r.Stdout))
}

// pickNodeToBreak prefers a node that runs no CoreDNS pod (so DNS from the healthy nodes
// still works) and holds neither NetworkPolicy probe (so the policy steps still run).
func pickNodeToBreak(ctx context.Context, t *testing.T, env *cliEnv, nodes []string) string {
	cs, err := env.c.Client()
	if err != nil {
		t.Fatal(err)
	}
	pods, err := cs.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
	if err != nil {
		t.Fatal(err)
	}
	dns := map[string]bool{}
	for _, p := range pods.Items {
		dns[p.Spec.NodeName] = true
	}
	server, client := connectivity.PolicyNodes(nodes)
	best := ""
	for _, n := range nodes {
		switch {
		case !dns[n] && n != server && n != client:
			return n
		case !dns[n] && best == "":
			best = n
		}
	}
	if best == "" {
		t.Fatalf("every node runs CoreDNS (%v): no node to break without breaking DNS for all", dns)
	}
	return best
}

func clusterNodeNames(c *cluster.Cluster) []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.Name)
	}
	return out
}

// checkLines are the output's check lines.
func checkLines(stdout string) []string {
	var out []string
	for _, l := range strings.Split(stdout, "\n") {
		if checkLine.MatchString(l) {
			out = append(out, l)
		}
	}
	return out
}

// namespaceIn is the namespace the text output's header names.
func namespaceIn(stdout string) string {
	m := regexp.MustCompile(`namespace (` + regexp.QuoteMeta(connectivity.NamespacePrefix) + `[a-z0-9]+)`).FindStringSubmatch(stdout)
	if m == nil {
		return ""
	}
	return m[1]
}

// assertNoTestNamespace checks that ns (when known) is gone, and that no namespace of
// the test is left that no run keeps alive.
func assertNoTestNamespace(ctx context.Context, t *testing.T, env *cliEnv, ns string) {
	t.Helper()
	cs, err := env.c.Client()
	if err != nil {
		t.Fatal(err)
	}
	if ns == "" {
		t.Error("the output names no namespace")
	} else if _, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("namespace %s still there after the run (get: %v)", ns, err)
	}
	list, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: connectivity.LabelTest + "=true"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range list.Items {
		lease, err := cs.CoordinationV1().Leases(n.Name).Get(ctx, connectivity.LeaseName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			lease = nil
		} else if err != nil {
			t.Fatal(err)
		}
		if _, left := connectivity.IsLeftover(&n, lease, time.Now()); left || n.Name == ns {
			t.Errorf("namespace %s of a connectivity test left behind", n.Name)
		}
	}
}

// leaveNamespace makes a namespace as a connectivity test run makes it, with its
// heartbeat's Lease last renewed at heartbeat, and returns its name.
func leaveNamespace(ctx context.Context, t *testing.T, env *cliEnv, heartbeat time.Time) string {
	t.Helper()
	cs, err := env.c.Client()
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		GenerateName: connectivity.NamespacePrefix,
		Labels:       map[string]string{connectivity.LabelTest: "true"},
	}}
	created, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().Namespaces().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
	})
	renewed := metav1.NewMicroTime(heartbeat)
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: connectivity.LeaseName, Namespace: created.Name},
		Spec:       coordinationv1.LeaseSpec{AcquireTime: &renewed, RenewTime: &renewed},
	}
	if _, err := cs.CoordinationV1().Leases(created.Name).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return created.Name
}

// testNamespaces lists the connectivity test's namespaces, comma-separated.
func testNamespaces(ctx context.Context, t *testing.T, env *cliEnv) string {
	t.Helper()
	cs, err := env.c.Client()
	if err != nil {
		t.Fatal(err)
	}
	list, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: connectivity.LabelTest + "=true"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, n := range list.Items {
		names = append(names, n.Name)
	}
	return strings.Join(names, ",")
}

// runningPlugin is `kubectl trellis` started in the background (to be signalled).
type runningPlugin struct {
	cmd            *exec.Cmd
	stdout, stderr *lockedBuffer
	stderrLines    chan string
	done           chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startKubectlTrellis starts `kubectl trellis args...` as kubectlTrellis runs it, without
// waiting for it.
func startKubectlTrellis(ctx context.Context, t *testing.T, env *cliEnv, args ...string) *runningPlugin {
	t.Helper()
	cmd := exec.CommandContext(ctx, filepath.Join(env.bin, "kubectl"), append([]string{"trellis"}, args...)...)
	cmd.Env = []string{"PATH=" + env.bin + ":/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + t.TempDir(), "KUBECONFIG=" + env.c.Kubeconfig}
	p := &runningPlugin{cmd: cmd, stdout: &lockedBuffer{}, stderr: &lockedBuffer{}, stderrLines: make(chan string, 1000), done: make(chan struct{})}
	cmd.Stdout = p.stdout
	pr, pw := io.Pipe()
	cmd.Stderr = io.MultiWriter(p.stderr, pw)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			select {
			case p.stderrLines <- sc.Text():
			default:
			}
		}
	}()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = cmd.Wait()
		pw.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// waitStderr waits for a stderr line matching re and returns its first group.
func (p *runningPlugin) waitStderr(t *testing.T, re *regexp.Regexp, timeout time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var group string
	err := check.Until(ctx, check.Interval, fmt.Sprintf("%q on kubectl trellis's stderr", re), func(context.Context) error {
		for {
			select {
			case l := <-p.stderrLines:
				if m := re.FindStringSubmatch(l); m != nil {
					if len(m) > 1 {
						group = m[1]
					}
					return nil
				}
			case <-p.done:
				return check.Stop(fmt.Errorf("kubectl trellis exited first:\n--- stdout\n%s", p.stdout.String()))
			default:
				return errors.New("not yet")
			}
		}
	})
	if err != nil {
		t.Fatalf("%v\n--- stderr\n%s", err, p.stderr.String())
	}
	return group
}

// wait waits for the plugin to exit and returns its exit code.
func (p *runningPlugin) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("kubectl trellis still running %v after the signal:\n%s", timeout, p.stderr.String())
	}
	code := p.cmd.ProcessState.ExitCode()
	if code < 0 {
		t.Errorf("kubectl trellis ended by a signal (%s), not by its own exit", p.cmd.ProcessState)
	}
	return code
}

// checkConnectivityJSON runs `kubectl trellis connectivity test --output json` on a healthy
// cluster and reads it as a script would: one JSON document, ok, every check of the plan
// passed with its source node and a duration, and no namespace left behind.
func checkConnectivityJSON(ctx context.Context, t *testing.T, env *cliEnv) {
	nodes := clusterNodeNames(env.c)
	want := len(connectivity.Plan(nodes))
	r := env.kubectlTrellis(ctx, t, "connectivity", "test", "--image", images.AgnhostImage, "--output", "json")
	if r.Code != 0 {
		t.Errorf("exit %d, want 0", r.Code)
	}
	var rep struct {
		Namespace string   `json:"namespace"`
		Nodes     []string `json:"nodes"`
		OK        bool     `json:"ok"`
		Checks    []struct {
			Name, Status, Detail string
			From, To             struct{ Node string }
			Nodes                []string
			DurationSeconds      float64
		} `json:"checks"`
		Summary struct{ Passed, Failed, Skipped int } `json:"summary"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil {
		t.Fatalf("stdout is not one JSON document: %v", err)
	}
	if !rep.OK || rep.Summary.Passed != want || rep.Summary.Failed != 0 || rep.Summary.Skipped != 0 || len(rep.Checks) != want {
		t.Errorf("ok=%v summary %+v, %d checks; want ok, %d passed", rep.OK, rep.Summary, len(rep.Checks), want)
	}
	if strings.Join(rep.Nodes, ",") != strings.Join(nodes, ",") {
		t.Errorf("nodes %v, want %v", rep.Nodes, nodes)
	}
	for _, c := range rep.Checks {
		if c.Status != "pass" || c.From.Node == "" || len(c.Nodes) == 0 || c.DurationSeconds <= 0 {
			t.Errorf("check %+v: want passed, with its source node and a duration", c)
		}
	}
	assertNoTestNamespace(ctx, t, env, rep.Namespace)
}
