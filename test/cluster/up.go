package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/trellis-net/trellis/internal/test/versions"
	"github.com/trellis-net/trellis/test/cluster/controlplane"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/cluster/node"
	"github.com/trellis-net/trellis/test/cluster/pki"
	"github.com/trellis-net/trellis/test/cluster/procs"
	"github.com/trellis-net/trellis/test/cluster/topology"
)

// Up brings the cluster of opts up and returns it once every node is Ready (see
// Options.WaitReady) and, with Options.DNS, CoreDNS too. It is idempotent: a healthy cluster with the same options is
// returned as is; what a killed or failed earlier run left is removed first. On failure
// it leaves what it made for inspection (logs in StateDir/logs): Down removes it.
func Up(ctx context.Context, opts Options) (*Cluster, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	p := newProgress(opts.Progress)
	opts.Progress = p
	extra := ""
	if opts.RemoteNode {
		extra = ", last node behind a router"
	}
	if opts.DNS {
		extra += ", cluster DNS"
	}
	if opts.IPFamily == IPFamilyDual {
		extra += ", dual-stack"
		if opts.IPv4Pods {
			extra += " nodes with IPv4 pods"
		}
	}
	if opts.IPFamily == IPFamilyIPv6 {
		extra += ", IPv6-only Kubernetes"
	}
	if opts.Dataplane != "" {
		extra += ", dataplane " + opts.Dataplane
	}
	v, err := versions.Load()
	if err != nil {
		return nil, err
	}
	p.head("cluster %q: %d nodes%s, CNI %s, Kubernetes %s, state in %s", opts.Name, opts.Nodes, extra, opts.CNI, v.Kubernetes, opts.StateDir)
	t, err := findTools(ctx, opts)
	if err != nil {
		return nil, err
	}
	unlock, err := lockStateDir(opts.StateDir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if c, err := reuseOrSweep(ctx, opts, p); c != nil || err != nil {
		return c, err
	}

	c, nodeCfgs, err := newCluster(opts, t, p)
	if err != nil {
		return nil, err
	}
	// Recorded before anything exists, so that a killed run is cleaned up by the next.
	if err := c.save(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", c.LogDir, err)
	}
	failed := func(err error) (*Cluster, error) {
		_ = c.save() // the pids recorded so far
		return c, fmt.Errorf("%w\n(logs are in %s; `localcluster down --name %s` removes what was created)", err, c.LogDir, c.Name)
	}

	// Images are built while the network and the control plane come up.
	archive := buildImages(ctx, t, c.CNI != CNIReference, p)

	p.step("network: namespaces %s*, underlay 198.51.100.0/24", prefix(c.Name))
	if err := c.Network.Create(ctx); err != nil {
		return failed(fmt.Errorf("creating the network: %w", err))
	}
	for _, n := range c.Nodes {
		if err := procs.CreateCgroup(n.Cgroup); err != nil {
			return failed(err)
		}
	}
	cp, err := c.writePKI(nodeCfgs)
	if err != nil {
		return failed(fmt.Errorf("certificates: %w", err))
	}
	if err := c.startControlPlane(ctx, cp, p); err != nil {
		return failed(err)
	}

	p.step("nodes: containerd, kubelet, kube-proxy on %d nodes", len(c.Nodes))
	if c.CNI == CNIReference {
		for i, cfg := range nodeCfgs {
			if err := c.writeReferenceCNI(cfg, c.Nodes[i].PodCIDR, t.cniPlugins); err != nil {
				return failed(err)
			}
		}
	}
	running, err := c.startNodes(ctx, nodeCfgs, archive, p)
	if err != nil {
		return failed(err)
	}

	switch c.CNI {
	case CNIReference:
		p.step("CNI: reference ptp + host-local, a /24 per node, routes between the node namespaces")
		if err := c.addReferenceRoutes(ctx); err != nil {
			return failed(err)
		}
	case CNITrellis:
		p.step("CNI: Trellis, installed as a user would (kubectl apply -k config/default, then the sample ClusterNetwork)")
		if err := c.installTrellis(ctx, p); err != nil {
			return failed(err)
		}
	}
	if opts.WaitReady > 0 {
		wait := c.waitNodesReady
		if c.CNI == CNINone {
			p.step("CNI: none (nodes stay NotReady until the test installs one)")
			wait = c.waitNodesRegistered
		}
		if err := wait(ctx, opts.WaitReady, running, p); err != nil {
			return failed(err)
		}
		if c.CNI == CNITrellis {
			if err := c.routeControlPlaneToPods(ctx); err != nil {
				return failed(err)
			}
			p.detail("control plane: routes to every node's pod block")
		}
	}
	if c.DNS {
		// CoreDNS needs the pod network: with CNINone (or not waiting) it is only deployed.
		waitDNS := time.Duration(0)
		if opts.WaitReady > 0 && c.CNI != CNINone {
			waitDNS = opts.WaitReady
		}
		if err := c.deployDNS(ctx, t.coreDNSVersion, waitDNS, p); err != nil {
			return failed(err)
		}
	}
	c.Phase = "up"
	c.UpTook = time.Since(p.start)
	if err := c.save(); err != nil {
		return failed(err)
	}
	p.head("cluster %q is up in %v: export KUBECONFIG=%s", c.Name, c.UpTook.Round(100*time.Millisecond), c.Kubeconfig)
	return c, nil
}

// newCluster lays the cluster of opts out (nothing is created yet).
func newCluster(opts Options, t tools, p *progress) (*Cluster, []node.Config, error) {
	c := &Cluster{
		Name: opts.Name, StateDir: opts.StateDir, CNI: opts.CNI, RemoteNode: opts.RemoteNode, DNS: opts.DNS, IPFamily: opts.IPFamily, IPv4Pods: opts.IPv4Pods, Dataplane: opts.Dataplane,
		Kubeconfig: filepath.Join(opts.StateDir, "kubeconfig"),
		LogDir:     filepath.Join(opts.StateDir, "logs"),
		BinDir:     t.k8sBin, ModuleRoot: t.moduleRoot,
		Created: p.start, Phase: "creating", Pids: map[string]int{},
	}
	var err error
	if c.Network, err = topology.Plan(prefix(c.Name), opts.Nodes, opts.RemoteNode); err != nil {
		return nil, nil, err
	}
	if opts.IPFamily == IPFamilyDual || opts.IPFamily == IPFamilyIPv6 {
		c.Network.EnableIPv6()
	}
	cfgs := c.nodeConfigs(t)
	for i, cfg := range cfgs {
		if err := cfg.Validate(); err != nil {
			return nil, nil, err
		}
		n := nodeFromConfig(c.Network.Nodes[i], cfg)
		if c.CNI == CNIReference {
			n.PodCIDR = referenceBlock(i)
		}
		c.Nodes = append(c.Nodes, n)
	}
	return c, cfgs, nil
}

// builtImages are a cluster's images: the OCI archive, and a containerd root they were
// imported into (imageroot.go); root is empty when that failed, and the nodes import the
// archive themselves.
type builtImages struct {
	archive, root string
}

// buildImages starts building the image archive and its imported root and returns a
// function that waits for them (and reports them once).
func buildImages(ctx context.Context, t tools, trellis bool, p *progress) func() (builtImages, error) {
	type result struct {
		builtImages
		cached  bool
		rootErr error
		err     error
	}
	done := make(chan result, 1)
	t0 := time.Now()
	go func() {
		var r result
		cacheDir := filepath.Join(CacheDir(), "localcluster")
		r.archive, r.cached, r.err = images.Build(ctx, images.Sources{
			ModuleRoot: t.moduleRoot, CacheDir: cacheDir,
			AgnhostDir: t.agnhost, CNIPluginsDir: t.cniPlugins, Trellis: trellis,
			CoreDNSDir: t.coreDNS, CoreDNSVersion: t.coreDNSVersion,
		})
		if r.err == nil {
			r.root, r.rootErr = imageRoot(ctx, filepath.Join(cacheDir, "roots"), r.archive)
		}
		done <- r
	}()
	var once sync.Once
	var r result
	return func() (builtImages, error) {
		once.Do(func() {
			r = <-done
			switch {
			case r.err != nil:
				r.err = fmt.Errorf("building the images: %w", r.err)
			case r.cached:
				p.step("images: unchanged, cached archive %s", r.archive)
			default:
				p.step("images: built %s in %v", r.archive, sinceRounded(t0))
			}
			if r.rootErr != nil {
				p.detail("images: no imported root to copy (%v); each node imports the archive", r.rootErr)
			}
		})
		return r.builtImages, r.err
	}
}

// startControlPlane starts etcd, the API server, controller-manager and scheduler, then
// the forwarder, and writes the admin kubeconfig.
func (c *Cluster) startControlPlane(ctx context.Context, cp controlplane.Config, p *progress) error {
	p.step("control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler")
	started, err := controlplane.Start(ctx, cp, p.detail)
	for _, s := range started {
		c.Pids[s.Name] = s.Pid
	}
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	pid, port, err := startForwarder(c.StateDir, filepath.Join(c.LogDir, "forwarder.log"),
		procs.NetNSPath(c.Network.ControlPlane.NetNS), fmt.Sprintf("%s:%d", topology.ControlPlaneIP, controlplane.APIServerPort))
	if err != nil {
		return err
	}
	c.Forwarder.Pid, c.Forwarder.Port = pid, port
	c.Server = "https://" + forwarderAddr(port)
	if err := c.writeAdminKubeconfig(); err != nil {
		return err
	}
	if err := c.save(); err != nil {
		return err
	}
	if err := c.waitAPI(ctx, 15*time.Second); err != nil {
		return fmt.Errorf("the API server through the forwarder %s: %w", c.Server, err)
	}
	p.detail("kubectl access: %s (forwarder pid %d)", c.Server, pid)
	return nil
}

// startNodes starts every node in parallel; each imports the images before its kubelet
// starts.
func (c *Cluster) startNodes(ctx context.Context, cfgs []node.Config, archive func() (builtImages, error), p *progress) ([]*node.Node, error) {
	running := make([]*node.Node, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i, cfg := range cfgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			running[i], errs[i] = startNode(ctx, cfg, archive, p)
		}()
	}
	wg.Wait()
	for i, n := range running {
		c.Nodes[i].recordPids(n)
	}
	if err := c.save(); err != nil {
		return running, err
	}
	return running, errors.Join(errs...)
}

// startNode starts one node, its containerd on a copy of the images' imported root or,
// failing that, importing the archive before its kubelet starts.
func startNode(ctx context.Context, cfg node.Config, built func() (builtImages, error), p *progress) (*node.Node, error) {
	t0 := time.Now()
	n, err := node.Start(ctx, cfg, node.Images{
		Seed: func(root string) (bool, error) {
			imgs, err := built()
			if err != nil {
				return false, err
			}
			if entries, _ := os.ReadDir(root); imgs.root == "" || len(entries) > 0 {
				return false, nil
			}
			t1 := time.Now()
			if err := seedRoot(ctx, imgs.root, root); err != nil {
				p.detail("%s: copying the images' root: %v; importing them instead", cfg.Name, err)
				return false, nil
			}
			p.detail("%s: images in place (a copy of %s) in %v", cfg.Name, imgs.root, sinceRounded(t1))
			return true, nil
		},
		Import: func(socket string) error {
			imgs, err := built()
			if err != nil {
				return err
			}
			t1 := time.Now()
			if _, err := procs.Run(ctx, "ctr", "--address", socket, "--namespace", "k8s.io", "images", "import", imgs.archive); err != nil {
				return err
			}
			p.detail("%s: images imported in %v", cfg.Name, sinceRounded(t1))
			return nil
		},
	})
	if err == nil {
		p.detail("%s (%s): kubelet and kube-proxy started (%v)", cfg.Name, cfg.IP, sinceRounded(t0))
	}
	return n, err
}

// recordPids notes the pids of running's processes (nil: nothing started).
func (n *Node) recordPids(running *node.Node) {
	if running == nil {
		return
	}
	for role, proc := range map[string]*procs.Process{"holder": running.Holder, "containerd": running.Containerd, "kubelet": running.Kubelet, "kube-proxy": running.KubeProxy} {
		if proc != nil {
			n.Pids[role] = proc.Pid
		}
	}
}

// reuseOrSweep returns the running cluster when it is healthy and matches opts, fails when
// it runs with other options, and else removes whatever an earlier run left.
func reuseOrSweep(ctx context.Context, opts Options, p *progress) (*Cluster, error) {
	existing, err := Load(opts)
	switch {
	case err == nil:
		st := existing.Status(ctx)
		if st.Healthy() {
			if existing.Nodes != nil && existing.matches(opts) {
				p.head("cluster %q is already up: export KUBECONFIG=%s", existing.Name, existing.Kubeconfig)
				return existing, nil
			}
			return nil, fmt.Errorf("cluster %q is up with %d nodes, CNI %s, remote node %v, DNS %v: run `localcluster down --name %s` first to change that",
				existing.Name, len(existing.Nodes), existing.CNI, existing.RemoteNode, existing.DNS, existing.Name)
		}
		p.step("removing what an earlier run of cluster %q left (%s)", opts.Name, st.Problem())
	case errors.Is(err, ErrNotFound):
		if left := procs.NetNSNames(prefix(opts.Name)); len(left) > 0 {
			return nil, fmt.Errorf("network namespaces %v of a cluster named %q exist but %s records no cluster: they belong to another --state-dir; "+
				"remove them with `localcluster down --name %s --state-dir THAT-DIR` (or `--state-dir %s`, which removes them too)",
				left, opts.Name, opts.StateDir, opts.Name, opts.StateDir)
		}
	default:
		return nil, err
	}
	if err := down(ctx, opts, false); err != nil {
		return nil, fmt.Errorf("removing the leftovers of an earlier run: %w", err)
	}
	return nil, nil
}

// nodeConfigs describes the nodes of c.
func (c *Cluster) nodeConfigs(t tools) []node.Config {
	var cfgs []node.Config
	for _, h := range c.Network.Nodes {
		cfgs = append(cfgs, c.nodeConfig(h, t))
	}
	return cfgs
}

// nodeConfig describes node h of c.
func (c *Cluster) nodeConfig(h topology.Host, t tools) node.Config {
	dir := filepath.Join(c.StateDir, "nodes", h.Name)
	return node.Config{
		Name: h.Name, NetNS: h.NetNS, IP: h.IP, IP6: h.IP6, IPv6Only: c.ipFamily() == IPFamilyIPv6,
		Cgroup:   prefix(c.Name) + h.Name,
		Dir:      dir,
		LogDir:   c.LogDir,
		StateDir: c.StateDir,
		BinDir:   t.k8sBin,
		// Written by writePKI.
		Kubeconfig:      filepath.Join(dir, "kubelet.kubeconfig"),
		ProxyKubeconfig: filepath.Join(c.StateDir, "pki", "kube-proxy.kubeconfig"),
		CACert:          filepath.Join(c.StateDir, "pki", "ca.crt"),
		SandboxImage:    images.PauseImage,
		ClusterDNS:      c.clusterDNS(),
	}
}

// clusterDNS is the kubelets' clusterDNS: ClusterDNS (ClusterDNS6 on an IPv6-only
// cluster) when c runs DNS, else none.
func (c *Cluster) clusterDNS() netip.Addr {
	if !c.DNS {
		return netip.Addr{}
	}
	return c.DNSAddr()
}

// DNSAddr is the ClusterIP of Service kube-system/kube-dns: ClusterDNS, or ClusterDNS6 on
// an IPv6-only cluster.
func (c *Cluster) DNSAddr() netip.Addr {
	if c.ipFamily() == IPFamilyIPv6 {
		return ClusterDNS6
	}
	return ClusterDNS
}

// matches: c has the shape opts (with defaults) asks for.
func (c *Cluster) matches(opts Options) bool {
	return len(c.Nodes) == opts.Nodes && c.CNI == opts.CNI && c.RemoteNode == opts.RemoteNode && c.DNS == opts.DNS &&
		c.ipFamily() == opts.IPFamily && c.IPv4Pods == opts.IPv4Pods && c.Dataplane == opts.Dataplane
}

// ipFamily is c's IP family (clusters recorded before the field existed are IPv4).
func (c *Cluster) ipFamily() IPFamily {
	if c.IPFamily == "" {
		return IPFamilyIPv4
	}
	return c.IPFamily
}

// apiServerIPs are the API server certificate's addresses: its own, the kubernetes
// Service's and the forwarder's loopback (how kubectl reaches it from the root namespace),
// with their IPv6 counterparts in a layout with IPv6 (pods of an IPv6-only cluster reach
// it at those).
func (c *Cluster) apiServerIPs() []netip.Addr {
	ips := []netip.Addr{topology.ControlPlaneIP, ServiceCIDR.Masked().Addr().Next(), netip.MustParseAddr("127.0.0.1")}
	if cp := c.Network.ControlPlane; cp.IP6.IsValid() {
		ips = append(ips, cp.IP6, ServiceCIDR6.Masked().Addr().Next())
	}
	return ips
}

// serviceCIDRs are c's ClusterIP ranges, IPv4 first.
func (c *Cluster) serviceCIDRs() []netip.Prefix {
	switch c.ipFamily() {
	case IPFamilyDual:
		return []netip.Prefix{ServiceCIDR, ServiceCIDR6}
	case IPFamilyIPv6:
		return []netip.Prefix{ServiceCIDR6}
	}
	return []netip.Prefix{ServiceCIDR}
}

// writePKI makes every certificate and kubeconfig (except the admin kubeconfig, which
// needs the forwarder's port) and returns the control plane's configuration.
func (c *Cluster) writePKI(nodes []node.Config) (controlplane.Config, error) {
	dir := filepath.Join(c.StateDir, "pki")
	cpDir := filepath.Join(c.StateDir, "controlplane")
	ca, err := pki.NewCA("trellis-localcluster-" + c.Name)
	if err != nil {
		return controlplane.Config{}, err
	}
	caKey, err := ca.KeyPEM()
	if err != nil {
		return controlplane.Config{}, err
	}
	if err := pki.WriteFile(filepath.Join(dir, "ca.crt"), ca.CertPEM); err != nil {
		return controlplane.Config{}, err
	}
	if err := pki.WriteFile(filepath.Join(dir, "ca.key"), caKey); err != nil {
		return controlplane.Config{}, err
	}
	saKey, saPub, err := pki.ServiceAccountKey()
	if err != nil {
		return controlplane.Config{}, err
	}
	if err := pki.WriteFile(filepath.Join(dir, "sa.key"), saKey); err != nil {
		return controlplane.Config{}, err
	}
	if err := pki.WriteFile(filepath.Join(dir, "sa.pub"), saPub); err != nil {
		return controlplane.Config{}, err
	}
	apiIP := topology.ControlPlaneIP
	issue := func(name string, spec pki.Spec) (pki.KeyPair, error) {
		kp, err := ca.Issue(spec)
		if err == nil {
			err = kp.WriteFiles(dir, name)
		}
		return kp, err
	}
	if _, err := issue("apiserver", pki.Spec{
		CommonName: "kube-apiserver", Server: true,
		DNSNames: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"},
		IPs:      c.apiServerIPs(),
	}); err != nil {
		return controlplane.Config{}, err
	}
	if _, err := issue("apiserver-kubelet-client", pki.Spec{CommonName: "kube-apiserver-kubelet-client", Organizations: []string{"system:masters"}}); err != nil {
		return controlplane.Config{}, err
	}
	if _, err := issue("admin", pki.Spec{CommonName: "kubernetes-admin", Organizations: []string{"system:masters"}}); err != nil {
		return controlplane.Config{}, err
	}
	kubeconfig := func(path, user string, orgs ...string) error {
		return writeClientKubeconfig(ca, c.Name, path, user, orgs...)
	}
	kcm := filepath.Join(cpDir, "controller-manager.kubeconfig")
	sched := filepath.Join(cpDir, "scheduler.kubeconfig")
	if err := kubeconfig(kcm, "system:kube-controller-manager"); err != nil {
		return controlplane.Config{}, err
	}
	if err := kubeconfig(sched, "system:kube-scheduler"); err != nil {
		return controlplane.Config{}, err
	}
	if err := kubeconfig(filepath.Join(dir, "kube-proxy.kubeconfig"), "system:kube-proxy"); err != nil {
		return controlplane.Config{}, err
	}
	for _, n := range nodes {
		if err := writeNodeKubeconfig(ca, c.Name, n); err != nil {
			return controlplane.Config{}, err
		}
	}
	return controlplane.Config{
		ClusterName: c.Name, BinDir: c.BinDir, Dir: cpDir, LogDir: c.LogDir,
		NetNS: c.Network.ControlPlane.NetNS, IP: apiIP, ServiceCIDRs: c.serviceCIDRs(),
		IPv6Only: c.ipFamily() == IPFamilyIPv6, IP6: c.Network.ControlPlane.IP6,
		PKI: controlplane.PKI{
			CACert: filepath.Join(dir, "ca.crt"), CAKey: filepath.Join(dir, "ca.key"),
			APIServerCert: filepath.Join(dir, "apiserver.crt"), APIServerKey: filepath.Join(dir, "apiserver.key"),
			KubeletClientCert: filepath.Join(dir, "apiserver-kubelet-client.crt"), KubeletClientKey: filepath.Join(dir, "apiserver-kubelet-client.key"),
			ServiceAccountKey: filepath.Join(dir, "sa.key"), ServiceAccountPubKey: filepath.Join(dir, "sa.pub"),
		},
		ControllerManagerKubeconfig: kcm, SchedulerKubeconfig: sched,
		AdminCert: filepath.Join(dir, "admin.crt"), AdminKey: filepath.Join(dir, "admin.key"),
	}, nil
}

// writeClientKubeconfig writes a kubeconfig at path for a client certificate of user
// (in groups orgs) that ca issues, pointing at the API server in the control plane's
// namespace.
func writeClientKubeconfig(ca *pki.CA, clusterName, path, user string, orgs ...string) error {
	kp, err := ca.Issue(pki.Spec{CommonName: user, Organizations: orgs})
	if err != nil {
		return err
	}
	server := fmt.Sprintf("https://%s:%d", topology.ControlPlaneIP, controlplane.APIServerPort)
	return pki.WriteKubeconfig(path, clusterName, server, ca.CertPEM, kp)
}

// writeNodeKubeconfig writes the kubelet's kubeconfig of node n: the node's identity.
func writeNodeKubeconfig(ca *pki.CA, clusterName string, n node.Config) error {
	return writeClientKubeconfig(ca, clusterName, n.Kubeconfig, "system:node:"+n.Name, "system:nodes")
}

// writeAdminKubeconfig writes c.Kubeconfig for c.Server (the forwarder).
func (c *Cluster) writeAdminKubeconfig() error {
	dir := filepath.Join(c.StateDir, "pki")
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return err
	}
	var kp pki.KeyPair
	if kp.CertPEM, err = os.ReadFile(filepath.Join(dir, "admin.crt")); err != nil {
		return err
	}
	if kp.KeyPEM, err = os.ReadFile(filepath.Join(dir, "admin.key")); err != nil {
		return err
	}
	return pki.WriteKubeconfig(c.Kubeconfig, "trellis-"+c.Name, c.Server, caPEM, kp)
}
