package framework

import (
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/trellis-net/trellis/internal/test/testenv"
	"github.com/trellis-net/trellis/test/cluster"
)

// Clientset is c's client-go clientset (the admin's), failing the test when it can't be made.
func Clientset(t testing.TB, c *cluster.Cluster) kubernetes.Interface {
	t.Helper()
	kc, err := c.Client()
	if err != nil {
		t.Fatalf("client of cluster %s: %v", c.Name, err)
	}
	return kc
}

// TokenClient is a controller-runtime client of c with Trellis's API types as well as
// Kubernetes' that authenticates with token alone (to act as a component's service
// account); Client is the admin's.
func TokenClient(t testing.TB, c *cluster.Cluster, token string) client.Client {
	t.Helper()
	ctrllog.SetLogger(logr.Discard()) // the client's own log is of no use in a test
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Timeout = 10 * time.Second
	cfg.BearerToken, cfg.CertData, cfg.KeyData, cfg.CertFile, cfg.KeyFile = token, nil, nil, "", ""
	cl, err := testenv.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}
