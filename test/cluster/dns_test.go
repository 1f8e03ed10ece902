package cluster

import (
	"context"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/trellis-net/trellis/test/cluster/images"
)

func TestClusterDNSAddress(t *testing.T) {
	if ClusterDNS.String() != "10.96.0.10" || !ServiceCIDR.Contains(ClusterDNS) {
		t.Errorf("ClusterDNS = %v, want the 10th address of %v, 10.96.0.10", ClusterDNS, ServiceCIDR)
	}
	if got := serviceAddr(ServiceCIDR, 1).String(); got != "10.96.0.1" {
		t.Errorf("serviceAddr(ServiceCIDR, 1) = %s, want the kubernetes Service's 10.96.0.1", got)
	}
	if ClusterDNS6.String() != "fd00:10:96::a" || !ServiceCIDR6.Contains(ClusterDNS6) {
		t.Errorf("ClusterDNS6 = %v, want the 10th address of %v, fd00:10:96::a", ClusterDNS6, ServiceCIDR6)
	}
	for _, tc := range []struct {
		family IPFamily
		want   netip.Addr
	}{{"", ClusterDNS}, {IPFamilyIPv4, ClusterDNS}, {IPFamilyDual, ClusterDNS}, {IPFamilyIPv6, ClusterDNS6}} {
		c := &Cluster{DNS: true, IPFamily: tc.family}
		if got := c.clusterDNS(); got != tc.want || c.DNSAddr() != tc.want {
			t.Errorf("--ip-family %q: kubelets' clusterDNS %v, kube-dns at %v; want %v", tc.family, got, c.DNSAddr(), tc.want)
		}
	}
}

// The manifest decodes strictly into the objects kubectl applies, and they say what the
// local cluster promises: kube-dns at ClusterDNS selecting CoreDNS's pods, CoreDNS
// unprivileged on a read-only root, the RBAC its kubernetes plugin needs, the Corefile
// without any upstream.
func TestDNSManifest(t *testing.T) {
	image := images.CoreDNSImage("v9.9.9")
	docs := strings.Split(dnsManifest(image, ClusterDNS), "\n---\n")
	objs := map[string][]byte{}
	for _, d := range docs {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(d), &meta); err != nil {
			t.Fatalf("document %q: %v", d, err)
		}
		objs[meta.Kind] = []byte(d + "\n")
	}
	decode := func(kind string, into any) {
		t.Helper()
		if err := yaml.UnmarshalStrict(objs[kind], into); err != nil {
			t.Fatalf("%s: %v\n%s", kind, err, objs[kind])
		}
	}
	var svc corev1.Service
	var dep appsv1.Deployment
	var cm corev1.ConfigMap
	var role rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	var sa corev1.ServiceAccount
	decode("Service", &svc)
	decode("Deployment", &dep)
	decode("ConfigMap", &cm)
	decode("ClusterRole", &role)
	decode("ClusterRoleBinding", &binding)
	decode("ServiceAccount", &sa)

	if svc.Namespace != DNSNamespace || svc.Name != DNSService || svc.Spec.ClusterIP != ClusterDNS.String() {
		t.Errorf("Service %s/%s at %s, want %s/%s at %s", svc.Namespace, svc.Name, svc.Spec.ClusterIP, DNSNamespace, DNSService, ClusterDNS)
	}
	var ports []string
	for _, p := range svc.Spec.Ports {
		ports = append(ports, string(p.Protocol)+"/"+p.TargetPort.String())
	}
	if !slices.Equal(ports, []string{"UDP/53", "TCP/53"}) {
		t.Errorf("Service ports %v, want UDP and TCP 53", ports)
	}
	pod := dep.Spec.Template
	k, v, _ := strings.Cut(DNSLabel, "=")
	if svc.Spec.Selector[k] != v || pod.Labels[k] != v || dep.Spec.Selector.MatchLabels[k] != v {
		t.Errorf("label %s: Service selects %v, pods have %v", DNSLabel, svc.Spec.Selector, pod.Labels)
	}
	if dep.Namespace != DNSNamespace || dep.Name != DNSDeployment || dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
		t.Errorf("Deployment %s/%s replicas %v", dep.Namespace, dep.Name, dep.Spec.Replicas)
	}
	if pod.Spec.DNSPolicy != corev1.DNSDefault {
		t.Errorf("CoreDNS's dnsPolicy %q: it must not resolve through itself", pod.Spec.DNSPolicy)
	}
	psc := pod.Spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("pod security context %+v: want non-root", psc)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Spec.Containers))
	}
	ctr := pod.Spec.Containers[0]
	sc := ctr.SecurityContext
	if ctr.Image != image || sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("container %s: image %s, security context %+v: want %s, read-only root, no privilege escalation, no capabilities", ctr.Name, ctr.Image, sc, image)
	}
	if pod.Spec.ServiceAccountName != sa.Name || binding.Subjects[0].Name != sa.Name || binding.Subjects[0].Namespace != DNSNamespace || binding.RoleRef.Name != role.Name {
		t.Errorf("ServiceAccount %s, binding %+v of %s", sa.Name, binding, role.Name)
	}
	granted := map[string]bool{}
	for _, r := range role.Rules {
		for _, res := range r.Resources {
			if slices.Contains(r.Verbs, "list") && slices.Contains(r.Verbs, "watch") {
				granted[res] = true
			}
			if slices.ContainsFunc(r.Verbs, func(v string) bool { return v != "list" && v != "watch" }) {
				t.Errorf("ClusterRole grants %v on %s: the kubernetes plugin only lists and watches", r.Verbs, res)
			}
		}
	}
	for _, res := range []string{"services", "endpointslices", "namespaces", "pods"} {
		if !granted[res] {
			t.Errorf("ClusterRole does not grant list and watch on %s", res)
		}
	}
	if cm.Data["Corefile"] != corefile {
		t.Errorf("ConfigMap's Corefile:\n%s\nwant:\n%s", cm.Data["Corefile"], corefile)
	}
	for _, want := range []string{"kubernetes cluster.local in-addr.arpa ip6.arpa {", "pods insecure", "fallthrough in-addr.arpa ip6.arpa", "cache 30", "loop", "reload", "ready", "health"} {
		if !strings.Contains(corefile, want) {
			t.Errorf("Corefile lacks %q", want)
		}
	}
	if strings.Contains(corefile, "forward") {
		t.Errorf("Corefile forwards upstream; nothing outside the cluster is reachable:\n%s", corefile)
	}
}

// Options.DNS is part of a cluster's shape: a running cluster without it is not reused
// for a test that asks for it, nor the other way round.
func TestMatchesDNS(t *testing.T) {
	c := &Cluster{CNI: CNITrellis, Nodes: make([]Node, 2)}
	o, err := Options{Nodes: 2}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if !c.matches(o) {
		t.Error("same shape does not match")
	}
	o.DNS = true
	if c.matches(o) {
		t.Error("a cluster without DNS matches options with DNS")
	}
	c.DNS = true
	if !c.matches(o) || c.clusterDNS() != ClusterDNS {
		t.Errorf("cluster with DNS: matches %v, clusterDNS %v", c.matches(o), c.clusterDNS())
	}
	if (&Cluster{}).clusterDNS().IsValid() {
		t.Error("a cluster without DNS gives the kubelets a clusterDNS")
	}
}

func TestCoreDNSVersion(t *testing.T) {
	root, err := moduleRoot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("COREDNS_VERSION", "")
	v, err := coreDNSVersion(root)
	if err != nil || !strings.HasPrefix(v, "v1.") {
		t.Errorf("COREDNS_VERSION of hack/versions.env: %q, %v", v, err)
	}
	// hack/build-coredns.sh reads it through hack/lib.sh: the same version.
	cmd := exec.Command("bash", "-c", "source hack/lib.sh && echo ${COREDNS_VERSION}")
	cmd.Dir = root
	if out, err := cmd.Output(); err != nil || strings.TrimSpace(string(out)) != v {
		t.Errorf("hack/lib.sh reads COREDNS_VERSION %q (%v), this package %q", out, err, v)
	}
	t.Setenv("COREDNS_VERSION", "v0.0.1")
	if v, err := coreDNSVersion(root); err != nil || v != "v0.0.1" {
		t.Errorf("the environment's COREDNS_VERSION does not win: %q, %v", v, err)
	}
	if got := coreDNSDir("/c", "v1.2.3"); got != "/c/tools/coredns-v1.2.3" {
		t.Errorf("coreDNSDir = %s: hack/build-coredns.sh builds into /c/tools/coredns-v1.2.3", got)
	}
}
