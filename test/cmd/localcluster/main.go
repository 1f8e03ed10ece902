// Command localcluster brings up a local multi-node Kubernetes cluster on this machine,
// every node a network namespace with containerd, kubelet and kube-proxy, and removes it
// again (package test/cluster does the work). Run it as root from the repository:
//
//	go -C test run ./cmd/localcluster up [--nodes 3] [--cni trellis|reference|none] [--remote-node] [--dns=false]
//	go -C test run ./cmd/localcluster status
//	export KUBECONFIG=$(go -C test run ./cmd/localcluster kubeconfig)
//	go -C test run ./cmd/localcluster down [--keep-logs]
//
// Every command takes --name (default trellis) and --state-dir (default
// $TRELLIS_CACHE/clusters/NAME).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/trellis-net/trellis/test/cluster"
)

const usage = `usage: localcluster COMMAND [flags]

commands:
  up          bring the cluster up (idempotent; removes leftovers of a killed run first)
  down        remove every process, namespace, mount, cgroup and file of the cluster
  status      show the cluster's processes, API server and nodes
  kubeconfig  print the path of the cluster's kubeconfig
  demo        print nodes, pod blocks, the ClusterNetwork, a pod-to-pod connectivity
              matrix and a cluster DNS lookup of a running cluster (make demo runs up first)

run 'localcluster COMMAND -h' for the flags of a command
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "up":
		err = up(ctx, args)
	case "down":
		err = down(ctx, args)
	case "status":
		err = status(ctx, args)
	case "kubeconfig":
		err = kubeconfig(args)
	case "demo":
		err = demo(ctx, args)
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "localcluster %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// clusterFlags are the flags every command has.
func clusterFlags(name string, opts *cluster.Options) *flag.FlagSet {
	fs := flag.NewFlagSet("localcluster "+name, flag.ExitOnError)
	fs.StringVar(&opts.Name, "name", "trellis", "cluster name (namespaces trlc-NAME-*)")
	fs.StringVar(&opts.StateDir, "state-dir", "", "state directory (default $TRELLIS_CACHE/clusters/NAME)")
	return fs
}

func up(ctx context.Context, args []string) error {
	opts := cluster.Options{BuildMissing: true, Progress: os.Stdout}
	fs := clusterFlags("up", &opts)
	fs.IntVar(&opts.Nodes, "nodes", 3, "number of nodes")
	cni := fs.String("cni", string(cluster.CNITrellis), "pod network: trellis (installed from config/), reference (ptp + host-local stand-in) or none (a test installs one)")
	fs.BoolVar(&opts.RemoteNode, "remote-node", false, "put the last node behind a router, on 203.0.113.0/24")
	ipFamily := fs.String("ip-family", string(cluster.IPFamilyIPv4), "ipv4; dual: every node also gets an IPv6 address (2001:db8::/32, inside the node namespaces), a second Service range and both node IPs, and (with trellis) the ClusterNetwork the IPv6 pod range "+cluster.PodCIDR6.String()+"; ipv6: IPv6-only Kubernetes (Service range "+cluster.ServiceCIDR6.String()+", IPv6 node IPs, cluster DNS at "+cluster.ClusterDNS6.String()+") with "+cluster.PodCIDR6.String()+" the only pod range")
	fs.BoolVar(&opts.IPv4Pods, "ipv4-pods", false, "with --ip-family dual: leave the ClusterNetwork IPv4-only (the state before appending an IPv6 range)")
	fs.StringVar(&opts.Dataplane, "dataplane", "", "with trellis: the ClusterNetwork's spec.dataplane (Auto, NFTables or IPTables) instead of the sample's")
	fs.BoolVar(&opts.DNS, "dns", true, "run cluster DNS: CoreDNS behind Service kube-system/kube-dns, the kubelets' clusterDNS (--dns=false: none)")
	fs.DurationVar(&opts.WaitReady, "wait", 5*time.Minute, "how long to wait for every node to be Ready (0: do not wait)")
	_ = fs.Parse(args)
	opts.CNI = cluster.CNI(*cni)
	opts.IPFamily = cluster.IPFamily(*ipFamily)
	if opts.WaitReady == 0 {
		opts.WaitReady = -1
	}
	_, err := cluster.Up(ctx, opts)
	return err
}

func down(ctx context.Context, args []string) error {
	var opts cluster.Options
	fs := clusterFlags("down", &opts)
	keepLogs := fs.Bool("keep-logs", false, "keep STATE-DIR/logs")
	_ = fs.Parse(args)
	start := time.Now()
	if err := cluster.Down(ctx, opts, *keepLogs); err != nil {
		return err
	}
	fmt.Printf("==> cluster %q removed in %v\n", opts.Name, time.Since(start).Round(100*time.Millisecond))
	return nil
}

func status(ctx context.Context, args []string) error {
	var opts cluster.Options
	_ = clusterFlags("status", &opts).Parse(args)
	c, err := cluster.Load(opts)
	if errors.Is(err, cluster.ErrNotFound) {
		return fmt.Errorf("%w: `localcluster up` creates it", err)
	}
	if err != nil {
		return err
	}
	if s := c.PrintStatus(ctx, os.Stdout); !s.Healthy() {
		return errors.New("the cluster is not healthy: `localcluster up` repairs it by recreating it")
	}
	return nil
}

func kubeconfig(args []string) error {
	var opts cluster.Options
	_ = clusterFlags("kubeconfig", &opts).Parse(args)
	c, err := cluster.Load(opts)
	if err != nil {
		return err
	}
	fmt.Println(c.Kubeconfig)
	return nil
}

func demo(ctx context.Context, args []string) error {
	var opts cluster.Options
	_ = clusterFlags("demo", &opts).Parse(args)
	c, err := cluster.Load(opts)
	if err != nil {
		return err
	}
	return c.Demo(ctx, os.Stdout)
}
