package node

import (
	"fmt"
	"path/filepath"
)

// containerdConfig: containerd 1.6 from Debian (with Debian's runc) because it is what the
// machines have installed and what was checked with this kubelet (it logs
// "RuntimeConfig ... Unimplemented" and falls back, harmlessly).
//
//   - restrict_oom_score_adj: without CAP_SYS_RESOURCE runc cannot lower oom_score_adj
//     ("can't get final child's PID from pipe: EOF").
//   - disable_apparmor: no AppArmor profiles are loaded here.
//   - state, runc's root and pod network namespaces are under /run, the node's own tmpfs;
//     the socket is in the node's directory so that ctr reaches it from outside.
//   - the CNI directories are the standard paths, which are the node's own directories
//     inside its mount namespace.
func (c Config) containerdConfig() string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = "/run/containerd"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = %[2]q

[ttrpc]
  address = %[3]q

[debug]
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "10010"
  enable_tls_streaming = false

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = %[6]q
        Root = "/run/runc"
        SystemdCgroup = false

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
`,
		filepath.Join(c.Dir, "containerd", "root"), c.Socket(), c.Socket()+".ttrpc",
		filepath.Join(c.Dir, "containerd", "opt"), c.SandboxImage, mustLook("runc"))
}

// kubeletConfig: what it took on these machines (cgroup v1, no systemd, no
// CAP_SYS_RESOURCE, a disk shared with everything else):
//
//   - failCgroupV1: false, cgroupfs driver, cgroupRoot of the node's own;
//   - failSwapOn: false; oomScoreAdj: 0 (it cannot lower it);
//   - protectKernelDefaults: true, so it never changes machine-wide sysctls (the values it
//     checks are bind-mounted inside the node's mount namespace);
//   - serving on the node's IP, healthz on loopback, no read-only port;
//   - eviction and image GC thresholds relaxed: the shared disk would trigger them;
//   - x509 client certificates (the API server's) and webhook authn/authz.
func (c Config) kubeletConfig() string {
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
`, c.IP, c.CACert, "/"+c.Cgroup, filepath.Join(c.Dir, "resolv.conf"), "unix://"+c.Socket())
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
