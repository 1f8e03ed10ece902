// Package controlplane runs etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler inside the control-plane network namespace, as detached processes that
// outlive the command starting them.
package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/test/audit"
	"github.com/trellis-net/trellis/test/cluster/forward"
	"github.com/trellis-net/trellis/test/cluster/procs"
)

// APIServerPort is the API server's secure port on the control plane's IP.
const APIServerPort = 6443

// AuditLog (in LogDir) records every request of trellis's service accounts (the operator,
// the agents), so that tests can hold their roles to the calls they make (test/audit).
const AuditLog = "kube-apiserver-audit.log"

// Config says where everything is.
type Config struct {
	// ClusterName goes into the controller-manager's --cluster-name.
	ClusterName string
	// BinDir holds etcd and the Kubernetes binaries (hack/build-k8s.sh).
	BinDir string
	// Dir is the control plane's working directory (etcd data, kubeconfigs, cert dirs).
	Dir string
	// LogDir receives etcd.log, kube-apiserver.log, ...
	LogDir string
	// NetNS is the control plane's network namespace (name); IP its address there.
	NetNS string
	IP    netip.Addr
	// ServiceCIDRs are the ClusterIP ranges, one per family, the primary (IPv4) first: its
	// first address is the kubernetes Service.
	ServiceCIDRs []netip.Prefix
	// IPv6Only: ServiceCIDRs is IPv6 only, so the API server advertises IP6 (the
	// kubernetes Service's endpoint must be of its family) and listens on every address
	// (IP, where the test bed's clients connect, and IP6, where pods do).
	IPv6Only bool
	IP6      netip.Addr
	// PKI holds the files the flags point at.
	PKI PKI
	// ControllerManagerKubeconfig, SchedulerKubeconfig authenticate those two.
	ControllerManagerKubeconfig, SchedulerKubeconfig string
	// AdminCert, AdminKey authenticate the readiness checks.
	AdminCert, AdminKey string
}

// PKI lists the certificate and key files of the control plane.
type PKI struct {
	CACert, CAKey                           string
	APIServerCert, APIServerKey             string
	KubeletClientCert, KubeletClientKey     string
	ServiceAccountKey, ServiceAccountPubKey string
}

// Process is a started component.
type Process struct {
	Name string
	Log  string
	*procs.Process
}

// Start starts the four components in order, each once the previous one answers, and
// returns them. logf reports progress.
func Start(ctx context.Context, cfg Config, logf func(string, ...any)) ([]Process, error) {
	for _, d := range []string{cfg.Dir, cfg.LogDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("creating %s: %w", d, err)
		}
	}
	var started []Process
	start := func(name string, args ...string) (Process, error) {
		p := Process{Name: name, Log: filepath.Join(cfg.LogDir, name+".log")}
		proc, err := procs.Start(procs.Spec{
			Path: mustLook("nsenter"),
			Args: append([]string{"nsenter", "--net=" + procs.NetNSPath(cfg.NetNS), "--", filepath.Join(cfg.BinDir, name)}, args...),
			Env:  []string{"HOME=" + cfg.Dir},
			Log:  p.Log,
		})
		if err != nil {
			return p, err
		}
		p.Process = proc
		started = append(started, p)
		return p, nil
	}
	nsPath := procs.NetNSPath(cfg.NetNS)
	t0 := time.Now()
	auditPolicy := filepath.Join(cfg.Dir, "audit-policy.yaml")
	if err := os.WriteFile(auditPolicy, []byte(audit.Policy("system:serviceaccounts:trellis-system")), 0o600); err != nil {
		return nil, fmt.Errorf("writing the audit policy: %w", err)
	}

	etcd, err := start("etcd",
		"--name=trellis-localcluster",
		"--data-dir="+filepath.Join(cfg.Dir, "etcd"),
		// Loopback of the control-plane namespace: only the API server talks to etcd.
		"--listen-client-urls=http://127.0.0.1:2379",
		"--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380",
		"--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=trellis-localcluster=http://127.0.0.1:2380",
		"--unsafe-no-fsync=true", // a throwaway cluster: durability is not worth the fsyncs
		"--log-level=warn",
	)
	if err != nil {
		return started, err
	}
	plain := forward.HTTPClient(nsPath, nil, 2*time.Second)
	if err := waitHealthy(ctx, etcd, 30*time.Second, func() error {
		return get(plain, "http://127.0.0.1:2379/health", `"health":"true"`)
	}); err != nil {
		return started, err
	}
	logf("etcd ready (%v)", time.Since(t0).Round(100*time.Millisecond))

	api, err := start("kube-apiserver",
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address="+cfg.bindAddress(),
		"--advertise-address="+cfg.advertiseAddress(),
		fmt.Sprintf("--secure-port=%d", APIServerPort),
		"--cert-dir="+filepath.Join(cfg.Dir, "kube-apiserver"),
		"--tls-cert-file="+cfg.PKI.APIServerCert,
		"--tls-private-key-file="+cfg.PKI.APIServerKey,
		"--client-ca-file="+cfg.PKI.CACert,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--kubelet-client-certificate="+cfg.PKI.KubeletClientCert,
		"--kubelet-client-key="+cfg.PKI.KubeletClientKey,
		"--kubelet-preferred-address-types=InternalIP",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+cfg.PKI.ServiceAccountPubKey,
		"--service-account-signing-key-file="+cfg.PKI.ServiceAccountKey,
		"--service-cluster-ip-range="+joinPrefixes(cfg.ServiceCIDRs),
		"--allow-privileged=true",
		"--profiling=false",
		"--audit-policy-file="+auditPolicy,
		"--audit-log-path="+filepath.Join(cfg.LogDir, AuditLog),
		"--audit-log-mode=blocking",
	)
	if err != nil {
		return started, err
	}
	admin, err := tls.LoadX509KeyPair(cfg.AdminCert, cfg.AdminKey)
	if err != nil {
		return started, fmt.Errorf("loading the admin certificate: %w", err)
	}
	caPEM, err := os.ReadFile(cfg.PKI.CACert)
	if err != nil {
		return started, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	secure := forward.HTTPClient(nsPath, &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{admin}}, 5*time.Second)
	apiURL := fmt.Sprintf("https://%s:%d", cfg.IP, APIServerPort)
	if err := waitHealthy(ctx, api, 90*time.Second, func() error {
		return get(secure, apiURL+"/readyz", "ok")
	}); err != nil {
		return started, err
	}
	logf("kube-apiserver ready (%v)", time.Since(t0).Round(100*time.Millisecond))

	kcm, err := start("kube-controller-manager",
		"--kubeconfig="+cfg.ControllerManagerKubeconfig,
		"--authentication-kubeconfig="+cfg.ControllerManagerKubeconfig,
		"--authorization-kubeconfig="+cfg.ControllerManagerKubeconfig,
		"--bind-address=127.0.0.1",
		"--cert-dir="+filepath.Join(cfg.Dir, "kube-controller-manager"),
		"--cluster-name="+cfg.ClusterName,
		"--controllers=*",
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+cfg.PKI.ServiceAccountKey,
		// Only the CA: a bundle with a leaf makes it loop on a ClusterTrustBundle error.
		"--root-ca-file="+cfg.PKI.CACert,
		"--cluster-signing-cert-file="+cfg.PKI.CACert,
		"--cluster-signing-key-file="+cfg.PKI.CAKey,
		// Trellis allocates the pod blocks (NodeNetwork), not the controller-manager.
		"--allocate-node-cidrs=false",
		"--profiling=false",
	)
	if err != nil {
		return started, err
	}
	sched, err := start("kube-scheduler",
		"--kubeconfig="+cfg.SchedulerKubeconfig,
		"--authentication-kubeconfig="+cfg.SchedulerKubeconfig,
		"--authorization-kubeconfig="+cfg.SchedulerKubeconfig,
		"--bind-address=127.0.0.1",
		"--cert-dir="+filepath.Join(cfg.Dir, "kube-scheduler"),
		"--leader-elect=false",
		"--profiling=false",
	)
	if err != nil {
		return started, err
	}
	insecure := forward.HTTPClient(nsPath, &tls.Config{InsecureSkipVerify: true}, 2*time.Second) // their self-signed serving certs; /healthz only
	for _, c := range []struct {
		p   Process
		url string
	}{{kcm, "https://127.0.0.1:10257/healthz"}, {sched, "https://127.0.0.1:10259/healthz"}} {
		if err := waitHealthy(ctx, c.p, 60*time.Second, func() error { return get(insecure, c.url, "ok") }); err != nil {
			return started, err
		}
	}
	logf("kube-controller-manager and kube-scheduler ready (%v)", time.Since(t0).Round(100*time.Millisecond))
	return started, nil
}

// waitHealthy waits until healthy passes, p exits or timeout passes; the error ends with
// p's log.
func waitHealthy(ctx context.Context, p Process, timeout time.Duration, healthy func() error) error {
	wait, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := check.Until(wait, 200*time.Millisecond, p.Name+" healthy", func(context.Context) error {
		select {
		case <-p.Exited:
			return check.Stop(fmt.Errorf("%s exited (%v) during startup", p.Name, p.State))
		default:
		}
		return healthy()
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("%w; %s", err, procs.LogTail(p.Log, 4096))
	}
	return err
}

// get fetches url and wants a 200 whose body contains want.
func get(c *http.Client, url, want string) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

func mustLook(cmd string) string {
	if p, err := procs.LookPath(cmd); err == nil {
		return p
	}
	return cmd
}

// joinPrefixes is prefixes as a flag's comma-separated list.
func joinPrefixes(prefixes []netip.Prefix) string {
	out := make([]string, len(prefixes))
	for i, p := range prefixes {
		out[i] = p.String()
	}
	return strings.Join(out, ",")
}

// bindAddress is where the API server listens: IP, every address of an IPv6-only one.
func (cfg Config) bindAddress() string {
	if cfg.IPv6Only {
		return "::"
	}
	return cfg.IP.String()
}

// advertiseAddress is the kubernetes Service's endpoint: of the primary Service range's
// family.
func (cfg Config) advertiseAddress() string {
	if cfg.IPv6Only {
		return cfg.IP6.String()
	}
	return cfg.IP.String()
}
