package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
	"github.com/trellis-net/trellis/internal/test/versions"
	"github.com/trellis-net/trellis/test/cluster/images"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

// OLM v0 on the local cluster: its olm and catalog operators run as pods on host
// networking (the cluster they install a CNI into has no pod network yet), from an image
// made of the binaries hack/build-olm.sh built (images.OLMArchive). Both bind :8080 for
// health and metrics (OLM's pkg/lib/server: not configurable; :8443 only with TLS
// certificates), so they run on different nodes: olm on the first, catalog on the second.
// The packageserver (the packagemanifests API) is left out: Subscriptions don't use it.

// OLMNamespace holds OLM's operators; OLMOperatorsNamespace is the global OperatorGroup's.
const (
	OLMNamespace          = "olm"
	OLMOperatorsNamespace = "operators"
)

// ImportImages imports the OCI archive into every node's containerd (as Up does with
// its images), for images a test adds after bring-up.
func (c *Cluster) ImportImages(ctx context.Context, archive string) error {
	for _, n := range c.Nodes {
		if _, err := procs.Run(ctx, "ctr", "--address", n.ContainerdSocket, "--namespace", "k8s.io", "images", "import", archive); err != nil {
			return fmt.Errorf("importing %s into %s: %w", archive, n.Name, err)
		}
	}
	return nil
}

// olmManifest: OLM's namespaces, RBAC, OLMConfig, OperatorGroups and the two operators,
// after deploy/chart/templates of the OLM module (no cert-manager, no packageserver).
// %[1]s: image; %[2]s, %[3]s: the olm and catalog operators' nodes.
const olmManifest = `apiVersion: v1
kind: Namespace
metadata:
  name: olm
  labels: {pod-security.kubernetes.io/enforce: privileged}
---
apiVersion: v1
kind: Namespace
metadata:
  name: operators
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:controller:operator-lifecycle-manager
rules:
- apiGroups: ["*"]
  resources: ["*"]
  verbs: ["watch", "list", "get", "create", "update", "patch", "delete", "deletecollection", "escalate", "bind"]
- nonResourceURLs: ["*"]
  verbs: ["*"]
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: olm-operator-serviceaccount
  namespace: olm
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: olm-operator-binding-olm
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:controller:operator-lifecycle-manager
subjects:
- kind: ServiceAccount
  name: olm-operator-serviceaccount
  namespace: olm
---
apiVersion: operators.coreos.com/v1
kind: OLMConfig
metadata:
  name: cluster
---
apiVersion: operators.coreos.com/v1
kind: OperatorGroup
metadata:
  name: global-operators
  namespace: operators
---
apiVersion: operators.coreos.com/v1
kind: OperatorGroup
metadata:
  name: olm-operators
  namespace: olm
spec:
  targetNamespaces: [olm]
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: olm-operator
  namespace: olm
  labels: {app: olm-operator}
spec:
  strategy: {type: Recreate}
  replicas: 1
  selector:
    matchLabels: {app: olm-operator}
  template:
    metadata:
      labels: {app: olm-operator}
    spec:
      serviceAccountName: olm-operator-serviceaccount
      # No pod network yet: host network, tolerating the not-ready nodes.
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      nodeSelector: {kubernetes.io/hostname: %[2]s}
      tolerations: [{operator: Exists}]
      securityContext:
        runAsNonRoot: true
        seccompProfile: {type: RuntimeDefault}
      volumes:
      - name: tmpfs
        emptyDir: {}
      containers:
      - name: olm-operator
        image: %[1]s
        imagePullPolicy: IfNotPresent
        command: [/bin/olm]
        args: [--namespace, $(OPERATOR_NAMESPACE)]
        env:
        - name: OPERATOR_NAMESPACE
          valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
        - name: OPERATOR_NAME
          value: olm-operator
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {drop: [ALL]}
        volumeMounts:
        - {name: tmpfs, mountPath: /tmp}
        readinessProbe:
          httpGet: {path: /healthz, port: 8080}
        terminationMessagePolicy: FallbackToLogsOnError
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: catalog-operator
  namespace: olm
  labels: {app: catalog-operator}
spec:
  strategy: {type: Recreate}
  replicas: 1
  selector:
    matchLabels: {app: catalog-operator}
  template:
    metadata:
      labels: {app: catalog-operator}
    spec:
      serviceAccountName: olm-operator-serviceaccount
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      nodeSelector: {kubernetes.io/hostname: %[3]s}
      tolerations: [{operator: Exists}]
      securityContext:
        runAsNonRoot: true
        seccompProfile: {type: RuntimeDefault}
      volumes:
      - name: tmpfs
        emptyDir: {}
      containers:
      - name: catalog-operator
        image: %[1]s
        imagePullPolicy: IfNotPresent
        command: [/bin/catalog]
        args: [--namespace, olm, --util-image, %[1]s, --set-workload-user-id=false]
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {drop: [ALL]}
        volumeMounts:
        - {name: tmpfs, mountPath: /tmp}
        readinessProbe:
          httpGet: {path: /healthz, port: 8080}
        terminationMessagePolicy: FallbackToLogsOnError
`

// InstallOLM installs OLM v0 (OLM_VERSION of hack/versions.env, built by
// hack/build-olm.sh): its image into every node, the CRDs of the OLM module's
// deploy/chart/crds, then the operators (see above); it returns once both are Available.
// It needs at least two nodes.
func (c *Cluster) InstallOLM(ctx context.Context) error {
	if len(c.Nodes) < 2 {
		return fmt.Errorf("OLM's olm and catalog operators both bind :8080 on the host network: they need 2 nodes, the cluster has %d", len(c.Nodes))
	}
	v, err := versions.Load()
	if err != nil {
		return err
	}
	binDir := v.OLMDir(CacheDir())
	archive, _, err := images.OLMArchive(filepath.Join(CacheDir(), "localcluster"), binDir, v.OLM)
	if err != nil {
		return fmt.Errorf("OLM's image (binaries of hack/build-olm.sh in %s): %w", binDir, err)
	}
	if err := c.ImportImages(ctx, archive); err != nil {
		return err
	}
	crds, err := olmCRDDir(ctx, v.OLM)
	if err != nil {
		return err
	}
	// Server-side: the CRDs are too big for the last-applied annotation.
	if _, err := c.Kubectl(ctx, "apply", "--server-side", "-f", crds); err != nil {
		return fmt.Errorf("OLM's CRDs: %w", err)
	}
	if _, err := c.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s", "-f", crds); err != nil {
		return fmt.Errorf("OLM's CRDs: %w", err)
	}
	manifest := fmt.Sprintf(olmManifest, images.OLMImage(v.OLM), c.Nodes[0].Name, c.Nodes[1].Name)
	if _, err := c.KubectlInput(ctx, manifest, "apply", "-f", "-"); err != nil {
		return fmt.Errorf("OLM's operators: %w", err)
	}
	for _, d := range []string{"olm-operator", "catalog-operator"} {
		if out, err := c.Kubectl(ctx, "rollout", "status", "-n", OLMNamespace, "deployment/"+d, "--timeout=3m"); err != nil {
			return fmt.Errorf("OLM's %s not available: %w\n%s\n%s", d, err, out, c.Diagnose(ctx))
		}
	}
	return nil
}

// olmCRDDir is deploy/chart/crds of the OLM module in the Go module cache (downloaded
// when missing: hack/build-olm.sh downloads it too).
func olmCRDDir(ctx context.Context, version string) (string, error) {
	mod := "github.com/operator-framework/operator-lifecycle-manager@" + version
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go") //nolint:staticcheck // SA1019: the fallback when go is not on PATH, for a test binary built on this machine
	}
	out, err := exec.CommandContext(ctx, goBin, "mod", "download", "-json", mod).Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", mod, err)
	}
	const key = `"Dir": "`
	i := strings.Index(string(out), key)
	if i < 0 {
		return "", fmt.Errorf("go mod download %s: no Dir in %s", mod, out)
	}
	dir, _, _ := strings.Cut(string(out[i+len(key):]), `"`)
	crds := filepath.Join(dir, "deploy", "chart", "crds")
	if _, err := os.Stat(crds); err != nil {
		return "", fmt.Errorf("OLM's CRDs: %w", err)
	}
	return crds, nil
}

// CatalogServer is `opm serve` of a file-based catalog, a process in a node's network
// namespace: a grpc CatalogSource with spec.address Addr makes OLM connect to it (and
// start no catalog pod). It stays a process rather than a pod so that a test can switch
// catalogs by restarting it on another directory of this machine without building an
// image per catalog.
type CatalogServer struct {
	Node Node
	Port int
	Dir  string
	proc *procs.Process
}

// Addr is host:port for a CatalogSource's spec.address.
func (s *CatalogServer) Addr() string {
	return net.JoinHostPort(s.Node.IP.String(), strconv.Itoa(s.Port))
}

// ServeCatalog starts opm (OPM_VERSION, hack/build-olm.sh) serving the file-based catalog
// in dir on port of node n's address, and returns once it accepts connections. Its log
// is LogDir/opm.log; Down stops it with the node's other processes.
func (c *Cluster) ServeCatalog(ctx context.Context, n Node, dir string, port int) (*CatalogServer, error) {
	v, err := versions.Load()
	if err != nil {
		return nil, err
	}
	opm := filepath.Join(v.OPMDir(CacheDir()), "opm")
	nsenter, err := procs.LookPath("nsenter")
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	s := &CatalogServer{Node: n, Port: port, Dir: abs}
	s.proc, err = procs.Start(procs.Spec{
		Path: nsenter,
		Args: []string{"nsenter", "--net=" + n.NetNSPath(), opm, "serve", abs, "-p", strconv.Itoa(port)},
		Env:  []string{"HOME=" + os.TempDir()},
		Log:  filepath.Join(c.LogDir, "opm.log"),
	})
	if err != nil {
		return nil, fmt.Errorf("opm serve %s: %w", abs, err)
	}
	wait, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = check.Until(wait, 200*time.Millisecond, fmt.Sprintf("opm serve %s accepting connections on %s", abs, s.Addr()), func(context.Context) error {
		select {
		case <-s.proc.Exited:
			return check.Stop(fmt.Errorf("opm serve exited: %v\n%s", s.proc.State, procs.LogTail(filepath.Join(c.LogDir, "opm.log"), 2000)))
		default:
		}
		// Dialled inside the node's namespace: nothing leaves the root namespace.
		return dialInNetNS(n.NetNSPath(), s.Addr())
	})
	if err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// Stop stops opm (SIGTERM, then SIGKILL after 10 s) and waits for it to exit.
func (s *CatalogServer) Stop() {
	_ = syscall.Kill(s.proc.Pid, syscall.SIGTERM)
	select {
	case <-s.proc.Exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(s.proc.Pid, syscall.SIGKILL)
		<-s.proc.Exited
	}
}

// dialInNetNS connects to addr from the network namespace at path (netnstest.EnterPath).
func dialInNetNS(path, addr string) error {
	return netnstest.EnterPath(path, func() error {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
		}
		return err
	})
}
