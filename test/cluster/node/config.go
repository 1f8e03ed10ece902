package node

import (
	"fmt"
	"path/filepath"

	"github.com/trellis-net/trellis/test/containerd"
)

// containerdConfig: state, runc's root and pod network namespaces are under /run, the
// node's own tmpfs; the socket is in the node's directory so that ctr reaches it from
// outside; the CNI directories are the standard paths, which are the node's own
// directories inside its mount namespace.
func (c Config) containerdConfig() string {
	return containerd.Config{
		Root: c.ContainerdRoot(), State: "/run/containerd",
		Socket: c.Socket(), OptDir: filepath.Join(c.Dir, "containerd", "opt"),
		SandboxImage: c.SandboxImage, Runc: mustLook("runc"), RuncRoot: "/run/runc",
		CNIBinDir: "/opt/cni/bin", CNIConfDir: "/etc/cni/net.d",
	}.TOML()
}

// kubeletConfig: what it took on these machines (cgroup v1, no systemd, no
// CAP_SYS_RESOURCE, a disk shared with everything else):
//
//   - failCgroupV1: false, cgroupfs driver, cgroupRoot of the node's own;
//   - failSwapOn: false; oomScoreAdj: 0 (it cannot lower it);
//   - protectKernelDefaults: true, so it never changes machine-wide sysctls (the values it
//     checks are bind-mounted inside the node's mount namespace);
//   - serving on the node's IP (its IPv6 one on an IPv6-only cluster: the API server
//     reaches kubelets at their InternalIP for exec, logs and port-forward), healthz on
//     loopback, no read-only port;
//   - eviction and image GC thresholds relaxed: the shared disk would trigger them;
//   - x509 client certificates (the API server's) and webhook authn/authz;
//   - a static pod directory of the node's own (empty unless a test writes a manifest);
//   - clusterDNS when the cluster runs DNS (ClusterDNS): the kubelet writes it, with the
//     cluster.local search path, into the resolv.conf of ClusterFirst pods.
func (c Config) kubeletConfig() string {
	dns := ""
	if c.ClusterDNS.IsValid() {
		dns = fmt.Sprintf("clusterDNS:\n- %s\n", c.ClusterDNS)
	}
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %[2]q
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
cgroupRoot: %[3]q
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
protectKernelDefaults: true
resolvConf: %[4]q
clusterDomain: cluster.local
containerRuntimeEndpoint: %[5]q
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
  imagefs.inodesFree: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
rotateCertificates: false
registerNode: true
staticPodPath: %[6]q
%[7]s`, c.servingIP(), c.CACert, "/"+c.Cgroup, filepath.Join(c.Dir, "resolv.conf"), "unix://"+c.Socket(), c.StaticPodDir(), dns)
}

// kubeProxyConfig: iptables mode; conntrack values of 0 so that it leaves the
// machine-wide conntrack sysctls alone; oomScoreAdj 0 (it cannot lower it).
func (c Config) kubeProxyConfig() string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: %[1]q
hostnameOverride: %[2]s
bindAddress: 0.0.0.0
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# NodePorts on the node's own address only.
nodePortAddresses: ["primary"]
oomScoreAdj: 0
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, c.ProxyKubeconfig, c.Name)
}
