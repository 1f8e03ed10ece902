// Package framework is what the end-to-end tests share on top of test/cluster (as Cluster
// API's test/framework is to its test/e2e): test pods and Services, policies, traffic from
// inside pods' network namespaces (dial, listen, echo, transfer, probers), and reads and
// waits on Trellis's objects and agents. Suites (test/e2e, test/conformance) hold the tests;
// the helpers live here, exported and documented.
//
// Everything that sends traffic does it from a network namespace of the cluster (a pod's,
// a node's, the external host's), never from the root namespace.
package framework
