package tests

// Stand-ins for the suite's PokeServer calls (cnpsum reads the protocol argument of the
// call a failure's trace points at). Line numbers matter: main_test.go names them.
func fake() {
	kubernetes.PokeServer(t, s.ClientSet, &s.KubeConfig, "ns", "pod-0", "tcp",
		ip, int32(80), s.TimeoutConfig, true) // line 6
	kubernetes.PokeServer(t, s.ClientSet, &s.KubeConfig, "ns", "pod-0", "sctp",
		ip, int32(9003), s.TimeoutConfig, true) // line 8
}
