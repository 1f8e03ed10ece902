package cni_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/trellis-net/trellis/cni/veth"
	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// fakeAgent answers the policy hook like the node agent, after delay.
func fakeAgent(t *testing.T, delay time.Duration, ok bool) (socket string, got chan cnicontract.PolicyRequest) {
	t.Helper()
	socket = filepath.Join(t.TempDir(), "policy.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	got = make(chan cnicontract.PolicyRequest, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			line, _ := bufio.NewReader(c).ReadBytes('\n')
			var req cnicontract.PolicyRequest
			_ = json.Unmarshal(line, &req)
			got <- req
			time.Sleep(delay) //nolint:forbidigo // a simulated slow policy hook
			resp := cnicontract.PolicyResponse{OK: ok}
			if !ok {
				resp.Error = "ipset trellis-pods is full"
			}
			_ = json.NewEncoder(c).Encode(resp)
			c.Close()
		}
	}()
	return socket, got
}

func TestPolicyHook(t *testing.T) {
	t.Run("ADD waits for the agent's confirmation", func(t *testing.T) {
		socket, got := fakeAgent(t, 300*time.Millisecond, true)
		n := newNode(t, nodeOpts{policy: map[string]any{"socket": socket, "timeout": "5s"}})
		p := n.newPod("web")
		start := time.Now()
		r, _ := n.mustAdd(p)
		if took := time.Since(start); took < 300*time.Millisecond {
			t.Errorf("ADD returned after %s, before the agent confirmed", took)
		}
		req := <-got
		if req.Version != cnicontract.PolicyHookVersion || req.Op != "add" || req.Namespace != "default" || req.Pod != "web" ||
			req.PodUID != "uid-web" || req.IP != podIP(t, r).String() || req.ContainerID != p.id || !strings.HasPrefix(req.HostInterface, "trl") {
			t.Errorf("agent got %+v", req)
		}
	})
	t.Run("an unreachable agent fails the ADD and leaves nothing", func(t *testing.T) {
		n := newNode(t, nodeOpts{policy: map[string]any{"socket": filepath.Join(t.TempDir(), "absent.sock"), "timeout": "1s"}})
		_, err := n.add(context.Background(), n.newPod("x"))
		if err == nil || !strings.Contains(err.Error(), "network policies are not in place") {
			t.Fatalf("want a refusal, got %v", err)
		}
		n.assertClean()
	})
	t.Run("an agent that refuses fails the ADD", func(t *testing.T) {
		socket, _ := fakeAgent(t, 0, false)
		n := newNode(t, nodeOpts{policy: map[string]any{"socket": socket}})
		_, err := n.add(context.Background(), n.newPod("x"))
		if err == nil || !strings.Contains(err.Error(), "ipset trellis-pods is full") {
			t.Fatalf("want the agent's reason, got %v", err)
		}
		n.assertClean()
	})
	t.Run("a slow agent times out", func(t *testing.T) {
		socket, _ := fakeAgent(t, 3*time.Second, true)
		n := newNode(t, nodeOpts{policy: map[string]any{"socket": socket, "timeout": "500ms"}})
		_, err := n.add(context.Background(), n.newPod("x"))
		if err == nil || !strings.Contains(err.Error(), "within 500ms") {
			t.Fatalf("want a timeout, got %v", err)
		}
		n.assertClean()
	})
	t.Run("a dual-stack pod is announced by its IPv4 address and wired with both before the agent is asked", func(t *testing.T) {
		socket, got := fakeAgent(t, 0, true)
		n := newNode(t, nodeOpts{block: dualBlock4, block6: dualBlock6, policy: map[string]any{"socket": socket, "timeout": "5s"}})
		r, _ := n.mustAdd(n.newPod("web"))
		v4, v6 := podIPs(t, r)
		req := <-got
		if req.IP != v4.String() {
			t.Errorf("agent got ip %q, want the pod's IPv4 address %s", req.IP, v4)
		}
		// The agent learns the IPv6 address from the host route through the pod's veth.
		var routes []netlink.Route
		check.Must(t, n.ns.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(req.HostInterface)
			if err != nil {
				return err
			}
			routes, err = netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{LinkIndex: l.Attrs().Index, Protocol: veth.RouteProtocol},
				netlink.RT_FILTER_OIF|netlink.RT_FILTER_PROTOCOL)
			return err
		}))
		if !slices.ContainsFunc(routes, func(rt netlink.Route) bool { return rt.Dst != nil && rt.Dst.IP.Equal(v6.AsSlice()) }) {
			t.Errorf("no route to %s through %s, where the agent learns the pod's IPv6 address: %v", v6, req.HostInterface, routes)
		}
	})
	t.Run("an IPv6-only pod is announced by its IPv6 address", func(t *testing.T) {
		socket, got := fakeAgent(t, 0, true)
		n := newNode(t, nodeOpts{block: "-", block6: dualBlock6, policy: map[string]any{"socket": socket, "timeout": "5s"}})
		r, _ := n.mustAdd(n.newPod("web"))
		if req := <-got; len(r.IPs) != 1 || req.IP != r.IPs[0].Address.IP.String() || !strings.Contains(req.IP, ":") {
			t.Errorf("agent got ip %q, result %v", req.IP, r.IPs)
		}
	})
	t.Run("failurePolicy Ignore proceeds without the agent", func(t *testing.T) {
		n := newNode(t, nodeOpts{policy: map[string]any{"socket": filepath.Join(t.TempDir(), "absent.sock"), "failurePolicy": "Ignore"}})
		n.mustAdd(n.newPod("x"))
		logged, _ := os.ReadFile(n.logFile)
		if !strings.Contains(string(logged), "without policy confirmation") {
			t.Errorf("the plugin did not log that it skipped the policy wait:\n%s", logged)
		}
	})
}

// The plugin run as a runtime runs it, with bad input: a CNI error on stdout with the
// spec's code and a message saying what is wrong, never a panic.
func TestBadInput(t *testing.T) {
	valid := `{"cniVersion":"1.1.0","name":"trellis","type":"trellis","podCIDR":"10.244.1.0/24"}`
	env := func(cmd string) []string {
		return []string{"CNI_COMMAND=" + cmd, "CNI_CONTAINERID=abc", "CNI_NETNS=/proc/self/ns/net", "CNI_IFNAME=eth0", "CNI_PATH=" + pluginDir}
	}
	tests := []struct {
		name  string
		env   []string
		stdin string
		code  uint
		msg   string
	}{
		{"not JSON", env("ADD"), `{"cniVersion":`, 6, "unmarshal"},
		{"no podCIDR", env("ADD"), `{"cniVersion":"1.1.0","name":"trellis","type":"trellis"}`, 7, "podCIDR is empty"},
		{"podCIDR with host bits", env("ADD"), strings.Replace(valid, "10.244.1.0/24", "10.244.1.5/24", 1), 7, "podCIDR \"10.244.1.5/24\""},
		{"IPv6 in podCIDR", env("ADD"), strings.Replace(valid, "10.244.1.0/24", "fd00::/64", 1), 7, "podCIDR \"fd00::/64\" must be an IPv4"},
		{"IPv4 in podCIDRv6", env("ADD"), strings.Replace(valid, `"podCIDR"`, `"podCIDRv6":"10.244.2.0/24","podCIDR"`, 1), 7, "podCIDRv6 \"10.244.2.0/24\" must be an IPv6"},
		{"IPv6 block too large", env("ADD"), strings.Replace(valid, `"podCIDR"`, `"podCIDRv6":"fd00::/48","podCIDR"`, 1), 7, "prefix between /64 and /120"},
		{"bad MTU", env("ADD"), strings.Replace(valid, `"podCIDR"`, `"mtu":99,"podCIDR"`, 1), 7, "mtu 99"},
		{"bad policy timeout", env("ADD"), strings.Replace(valid, `"podCIDR"`, `"policy":{"socket":"/x","timeout":"soon"},"podCIDR"`, 1), 7, "policy.timeout"},
		{"bad failure policy", env("ADD"), strings.Replace(valid, `"podCIDR"`, `"policy":{"socket":"/x","failurePolicy":"Maybe"},"podCIDR"`, 1), 7, "policy.failurePolicy"},
		{"unknown version", env("ADD"), strings.Replace(valid, "1.1.0", "9.9.9", 1), 1, "incompatible CNI versions"},
		{"unknown command", env("FROB"), valid, 4, "CNI_COMMAND"},
		{"no container ID", []string{"CNI_COMMAND=ADD", "CNI_NETNS=/proc/self/ns/net", "CNI_IFNAME=eth0", "CNI_PATH=/x"}, valid, 4, "CNI_CONTAINERID"},
		{"netns that is not one", append(env("ADD")[:2:2], "CNI_NETNS=/nonexistent", "CNI_IFNAME=eth0", "CNI_PATH=/x"), valid, 8, "CNI_NETNS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := osexec.Command(filepath.Join(pluginDir, "trellis"))
			cmd.Env = tt.env
			cmd.Stdin = strings.NewReader(tt.stdin)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if err == nil {
				t.Fatalf("exit 0 for bad input; stdout %s", stdout.String())
			}
			if strings.Contains(stdout.String()+stderr.String(), "goroutine") {
				t.Fatalf("the plugin panicked:\n%s%s", stdout.String(), stderr.String())
			}
			var e struct {
				Code uint   `json:"code"`
				Msg  string `json:"msg"`
			}
			if err := json.Unmarshal(stdout.Bytes(), &e); err != nil {
				t.Fatalf("stdout is not a CNI error: %q", stdout.String())
			}
			if e.Code != tt.code || !strings.Contains(e.Msg, tt.msg) {
				t.Errorf("got code %d %q, want code %d mentioning %q", e.Code, e.Msg, tt.code, tt.msg)
			}
		})
	}
}

// TestRefusesItsOwnNamespace: a runtime that hands the plugin its own network namespace
// (the node's) as CNI_NETNS gets an invalid-netns error before anything is allocated or
// wired. The plugin runs inside a test namespace, so a plugin without the check would
// wire that one, never the machine's.
func TestRefusesItsOwnNamespace(t *testing.T) {
	node := netnstest.New(t)
	dir := t.TempDir()
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"trellis","type":"trellis","podCIDR":"10.244.1.0/24","dataDir":%q,"logFile":%q}`,
		filepath.Join(dir, "ipam"), filepath.Join(dir, "trellis.log"))
	cmd := osexec.Command(filepath.Join(pluginDir, "trellis"))
	cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=abc", "CNI_NETNS=/proc/self/ns/net", "CNI_IFNAME=eth0", "CNI_PATH=" + pluginDir}
	cmd.Stdin = strings.NewReader(conf)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	if err := netnstest.EnterPath(node.Path(), cmd.Run); err == nil {
		t.Fatalf("ADD in the plugin's own namespace succeeded: %s", stdout.String())
	}
	var e struct {
		Code uint   `json:"code"`
		Msg  string `json:"msg"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &e); err != nil {
		t.Fatalf("stdout is not a CNI error: %q", stdout.String())
	}
	if e.Code != 8 || !strings.Contains(e.Msg, "plugin's own network namespace") {
		t.Errorf("got code %d %q, want code 8 (invalid netns) naming the plugin's own network namespace", e.Code, e.Msg)
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "ipam")); len(entries) > 0 {
		t.Errorf("the plugin allocated before refusing: %d entries in its IPAM store", len(entries))
	}
}
