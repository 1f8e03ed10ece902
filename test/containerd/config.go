// Package containerd writes the configuration of the containerd that each simulated node
// runs, for the runtime tests (test/runtime) and the local cluster (test/cluster/node).
package containerd

import (
	"fmt"
)

// Config is what differs between the nodes that run a containerd: where it keeps its
// state, where it listens, what it runs pods with. Every path is as containerd sees it,
// inside the node's mount namespace.
//
// The rest is fixed, for containerd 1.6 from Debian (with Debian's runc), what the machines
// have installed and what was checked with the kubelet (it logs "RuntimeConfig ...
// Unimplemented" and falls back, harmlessly):
//
//   - restrict_oom_score_adj: without CAP_SYS_RESOURCE runc cannot lower oom_score_adj
//     ("can't get final child's PID from pipe: EOF");
//   - disable_apparmor: no AppArmor profiles are loaded here;
//   - snapshotters, tracing and metrics containerd would otherwise start are off;
//   - max_conf_num = 1: the first conflist by name in CNIConfDir is the network.
type Config struct {
	// Root and State are containerd's root (images, snapshots) and state directories.
	Root, State string
	// Socket is the CRI/gRPC socket; the ttrpc one is Socket + ".ttrpc".
	Socket string
	// OptDir is the directory of the opt plugin.
	OptDir string
	// SandboxImage is the pause image, imported by the caller.
	SandboxImage string
	// Runc is the runc binary; RuncRoot its state directory.
	Runc, RuncRoot string
	// CNIBinDir and CNIConfDir are the CNI plugins' and the conflists' directories.
	CNIBinDir, CNIConfDir string
}

// TOML renders c as containerd's config.toml (version 2).
func (c Config) TOML() string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[debug]
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
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
        BinaryName = %[7]q
        Root = %[8]q
        SystemdCgroup = false

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[9]q
    conf_dir = %[10]q
    max_conf_num = 1
`,
		c.Root, c.State, c.Socket, c.Socket+".ttrpc", c.OptDir,
		c.SandboxImage, c.Runc, c.RuncRoot, c.CNIBinDir, c.CNIConfDir)
}
