package pki

import (
	"crypto/x509"
	"encoding/pem"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

func TestIssue(t *testing.T) {
	ca, err := NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.Issue(Spec{CommonName: "kube-apiserver", Server: true,
		DNSNames: []string{"kubernetes"}, IPs: []netip.Addr{netip.MustParseAddr("198.51.100.1")}})
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Issue(Spec{CommonName: "system:node:node1", Organizations: []string{"system:nodes"}})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	srv := parse(t, server.CertPEM)
	if _, err := srv.Verify(x509.VerifyOptions{Roots: roots, DNSName: "198.51.100.1"}); err != nil {
		t.Errorf("server certificate for the API server's IP: %v", err)
	}
	cl := parse(t, client.CertPEM)
	if _, err := cl.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate: %v", err)
	}
	if cl.Subject.CommonName != "system:node:node1" || !slices.Equal(cl.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("client subject %v", cl.Subject)
	}
	if slices.Contains(cl.ExtKeyUsage, x509.ExtKeyUsageServerAuth) {
		t.Errorf("a client certificate must not serve")
	}
}

func TestWriteKubeconfig(t *testing.T) {
	ca, err := NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue(Spec{CommonName: "admin", Organizations: []string{"system:masters"}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := WriteKubeconfig(path, "ctx", "https://127.0.0.1:1234", ca.CertPEM, kp); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://127.0.0.1:1234" || len(cfg.TLSClientConfig.CertData) == 0 || len(cfg.TLSClientConfig.CAData) == 0 {
		t.Errorf("kubeconfig loads as %+v", cfg)
	}
}

func parse(t *testing.T, data []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatal("no PEM block")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestLoadCA(t *testing.T) {
	ca, err := NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	key, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := WriteFile(filepath.Join(dir, "ca.crt"), ca.CertPEM); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(filepath.Join(dir, "ca.key"), key); err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	// What the loaded CA issues verifies against the original.
	kp, err := loaded.Issue(Spec{CommonName: "system:node:node4", Organizations: []string{"system:nodes"}})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	if _, err := parse(t, kp.CertPEM).Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("a certificate from the loaded CA: %v", err)
	}
	if _, err := LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "missing.key")); err == nil {
		t.Errorf("LoadCA with a missing key: no error")
	}
}
