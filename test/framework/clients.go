package framework

import (
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/trellis-net/trellis/internal/scheme"
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

// Client is a controller-runtime client of the cluster with the scheme the operator and
// the agent use (the built-in types, the Trellis API, ClusterNetworkPolicy) and CRDs, for
// the objects c.Client()'s clientset has no typed calls for.
func Client(t testing.TB, c *cluster.Cluster) client.Client {
	t.Helper()
	if kc, ok := clients.Load(c); ok {
		return kc.(client.Client)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatalf("loading %s: %v", c.Kubeconfig, err)
	}
	cfg.Timeout = 10 * time.Second
	ctrllog.SetLogger(logr.Discard()) // the client's own log is of no use in a test
	s, err := scheme.New()
	if err == nil {
		err = apiextensionsv1.AddToScheme(s)
	}
	if err != nil {
		t.Fatalf("the scheme: %v", err)
	}
	kc, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatalf("a client of %s: %v", c.Name, err)
	}
	got, _ := clients.LoadOrStore(c, kc)
	return got.(client.Client)
}

// clients are the clients Client made, by cluster: one REST mapper per cluster, not one per
// call in a wait.
var clients sync.Map
