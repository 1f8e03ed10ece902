// Package e2e holds end-to-end tests on a local multi-node cluster (test/cluster): real
// kubelets, containerd and kube-proxy in network namespaces, a real control plane. They
// need root and the binaries `make deps` builds; run them with `make e2e` (build tag e2e,
// so `go test ./...` leaves them out).
//
// Environment:
//   - TRELLIS_CLUSTER_REUSE=1: reuse a running cluster of the same shape, and leave the
//     one the test brings up running (test/cluster.ForTest).
package e2e
