package cluster

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/trellis-net/trellis/test/cluster/procs"
)

// ProcessStatus is one of the cluster's long-running processes.
type ProcessStatus struct {
	// Name is "etcd", "forwarder", "node1/kubelet"...
	Name  string
	Pid   int
	Alive bool
}

// Status is what Cluster.Status found.
type Status struct {
	Phase     string
	Processes []ProcessStatus
	// API is nil when the API server answers through the forwarder.
	API error
}

// Healthy: Up finished, every process runs and the API server answers.
func (s Status) Healthy() bool { return s.Problem() == "" }

// Problem says why the cluster is not healthy ("" when it is).
func (s Status) Problem() string {
	if s.Phase != "up" {
		return fmt.Sprintf("phase %q: its Up did not finish", s.Phase)
	}
	var dead []string
	for _, p := range s.Processes {
		if !p.Alive {
			dead = append(dead, p.Name)
		}
	}
	if len(dead) > 0 {
		return "not running: " + strings.Join(dead, ", ")
	}
	if s.API != nil {
		return "API server unreachable: " + shortErr(s.API)
	}
	return ""
}

// expected process names (a substring of the command line) per role, to tell a live
// process from a reused pid.
var processCmdline = map[string]string{
	"holder": "sleep infinity", "containerd": "containerd", "kubelet": "kubelet", "kube-proxy": "kube-proxy",
}

// Status checks the recorded processes and the API server.
func (c *Cluster) Status(ctx context.Context) Status {
	s := Status{Phase: c.Phase}
	check := func(name, want string, pid int) {
		cl := procs.Cmdline(pid)
		s.Processes = append(s.Processes, ProcessStatus{Name: name, Pid: pid, Alive: procs.Alive(pid) && strings.Contains(cl, want)})
	}
	names := make([]string, 0, len(c.Pids))
	for name := range c.Pids {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		check(name, name, c.Pids[name])
	}
	check("forwarder", forwarderArg0, c.Forwarder.Pid)
	for _, n := range c.Nodes {
		for _, role := range []string{"holder", "containerd", "kubelet", "kube-proxy"} {
			check(n.Name+"/"+role, processCmdline[role], n.Pids[role])
		}
	}
	if c.Forwarder.Port == 0 {
		s.API = fmt.Errorf("no forwarder recorded")
	} else {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s.API = c.waitAPI(ctx, 0)
	}
	return s
}

// PrintStatus writes a readable status of the cluster to w: processes, the API server,
// nodes.
func (c *Cluster) PrintStatus(ctx context.Context, w io.Writer) Status {
	s := c.Status(ctx)
	fmt.Fprintf(w, "cluster %q (CNI %s, %d nodes), state in %s, phase %s\n", c.Name, c.CNI, len(c.Nodes), c.StateDir, c.Phase)
	for _, p := range s.Processes {
		state := "running"
		if !p.Alive {
			state = "NOT RUNNING"
		}
		fmt.Fprintf(w, "  %-24s pid %-8d %s\n", p.Name, p.Pid, state)
	}
	if s.API != nil {
		fmt.Fprintf(w, "API server through %s: %v\n", c.Server, s.API)
	} else {
		fmt.Fprintf(w, "API server: %s (export KUBECONFIG=%s)\n", c.Server, c.Kubeconfig)
		if out, err := c.Kubectl(ctx, "get", "nodes", "-o", "wide"); err == nil {
			fmt.Fprint(w, out)
		}
	}
	if p := s.Problem(); p != "" {
		fmt.Fprintf(w, "unhealthy: %s\n", p)
	}
	return s
}
