package controllers

import (
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/api/v1alpha1"
)

func setCondition(st *v1alpha1.ClusterNetworkStatus, c metav1.Condition) {
	meta.SetStatusCondition(&st.Conditions, c)
}

func equalStatus(a, b v1alpha1.ClusterNetworkStatus) bool {
	return equality.Semantic.DeepEqual(a, b)
}

func firstN(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(s[:n:n], "...")
}
