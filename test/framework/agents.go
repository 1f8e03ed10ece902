package framework

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/cluster"
)

// The agents run in TrellisNamespace: AgentDaemonSet is theirs, AgentSelector finds their
// pods, AgentContainer is the container of the trellis-agent process.
const (
	AgentDaemonSet = "trellis-agent"
	AgentSelector  = "app.kubernetes.io/name=trellis-agent"
	AgentContainer = "agent"
)

// TheAgentPid is the one trellis-agent process on n. A container being replaced (the
// kubelet restarting it) briefly leaves two: it waits up to 30 s for one.
func TheAgentPid(t *testing.T, n cluster.Node) int {
	t.Helper()
	var pid int
	check.Eventually(t, 30*time.Second, "one trellis-agent process on "+n.Name, func() error {
		pids := AgentPids(t, n)
		if len(pids) != 1 {
			return fmt.Errorf("%d of them: %v", len(pids), pids)
		}
		pid = pids[0]
		return nil
	})
	return pid
}

// AgentToken is the service account token of the agent running on n, as the agent itself
// reads it (through the process's root: the pod's own mount of it).
func AgentToken(t *testing.T, n cluster.Node) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/var/run/secrets/kubernetes.io/serviceaccount/token", TheAgentPid(t, n)))
	if err != nil {
		t.Fatalf("the agent's token on %s: %v", n.Name, err)
	}
	return strings.TrimSpace(string(b))
}

// KillAgent sends SIGKILL to the trellis-agent processes in node n's network namespace.
func KillAgent(t *testing.T, n cluster.Node) {
	t.Helper()
	pids := AgentPids(t, n)
	if len(pids) == 0 {
		t.Fatalf("no trellis-agent process in %s's network namespace", n.Name)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 %d (trellis-agent on %s): %v", pid, n.Name, err)
		}
		t.Logf("killed trellis-agent pid %d on %s", pid, n.Name)
	}
}

// RestartAgent kills node n's trellis-agent (SIGKILL) and waits until the kubelet has
// restarted it and it is Ready again. It counts restarts from before the kill, so an
// agent restarted earlier on a shared cluster does not pass for one restarted now.
func RestartAgent(ctx context.Context, t *testing.T, c *cluster.Cluster, n cluster.Node) {
	t.Helper()
	before := AgentRestarts(ctx, t, c)
	KillAgent(t, n)
	WaitAgentsRestarted(ctx, t, c, []cluster.Node{n}, before, 2*time.Minute)
}

// AgentPod is the agent's pod on node n.
func AgentPod(ctx context.Context, t *testing.T, c *cluster.Cluster, n cluster.Node) (*corev1.Pod, error) {
	t.Helper()
	pods, err := Clientset(t, c).CoreV1().Pods(TrellisNamespace).List(ctx, metav1.ListOptions{LabelSelector: AgentSelector, FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		return nil, err
	}
	pods.Items = slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil })
	if len(pods.Items) != 1 {
		return nil, fmt.Errorf("%d agent pods on %s", len(pods.Items), n.Name)
	}
	return &pods.Items[0], nil
}

// AgentPids are the trellis-agent processes in node n's network namespace.
func AgentPids(t *testing.T, n cluster.Node) []int {
	t.Helper()
	var want unix.Stat_t
	if err := unix.Stat(n.NetNSPath(), &want); err != nil {
		t.Fatalf("%s's network namespace: %v", n.Name, err)
	}
	var pids []int
	comms, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, p := range comms {
		b, err := os.ReadFile(p)
		if err != nil || strings.TrimSpace(string(b)) != "trellis-agent" {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(filepath.Join(filepath.Dir(p), "ns", "net"), &st) != nil || st.Ino != want.Ino || st.Dev != want.Dev {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}
