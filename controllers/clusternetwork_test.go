package controllers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/controllers/render"
	"github.com/trellis-net/trellis/internal/agentconfig"
	"github.com/trellis-net/trellis/internal/test/check"
)

var (
	ctx   = context.Background()
	dsKey = types.NamespacedName{Namespace: render.Namespace, Name: render.DaemonSetName}
	cmKey = types.NamespacedName{Namespace: render.Namespace, Name: render.ConfigMapName}
)

// The operator's behaviour on one cluster, in the order a cluster lives it. Subtests share
// the ClusterNetwork "default" and build on each other.
func TestOperator(t *testing.T) {
	stop := startOperator(t)
	top := t // the operator outlives each subtest

	cn := &v1alpha1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterNetworkName}}
	cn.Spec.PodCIDRs = []string{"10.244.0.0/22"} // 4 blocks of /24
	if err := k8s.Create(ctx, cn); err != nil {
		t.Fatalf("creating ClusterNetwork default: %v", err)
	}

	t.Run("blocks for 5 nodes: exhaustion, then an appended CIDR", func(t *testing.T) {
		for i := 1; i <= 5; i++ {
			createNode(t, fmt.Sprintf("node-%d", i))
		}
		check.Eventually(t, 30*time.Second, "Degraded/PodCIDRExhausted", func() error {
			return expectCondition(v1alpha1.ConditionDegraded, metav1.ConditionTrue, "PodCIDRExhausted",
				"1 node(s) lack an IPv4 pod block (node-5)")
		})
		if got := len(blocksByNode(t)); got != 4 {
			t.Fatalf("%d nodes got a block from a /22 of /24 blocks, want 4", got)
		}
		check.Eventually(t, 30*time.Second, "trellis_operator_pod_blocks with the /22 full", func() error {
			return expectGauges("trellis_operator_pod_blocks", map[string]float64{"allocated": 4, "free": 0})
		})

		updateSpec(t, func(s *v1alpha1.ClusterNetworkSpec) {
			s.PodCIDRs = append(s.PodCIDRs, "10.245.0.0/22")
		})
		check.Eventually(t, 30*time.Second, "all 5 nodes have blocks", func() error {
			if n := len(blocksByNode(t)); n != 5 {
				return fmt.Errorf("%d blocks", n)
			}
			return expectCondition(v1alpha1.ConditionDegraded, metav1.ConditionFalse, "AsExpected", "")
		})
		assertBlocksValid(t, blocksByNode(t), []string{"10.244.0.0/22", "10.245.0.0/22"})
		check.Eventually(t, 30*time.Second, "trellis_operator_pod_blocks with a second /22", func() error {
			return expectGauges("trellis_operator_pod_blocks", map[string]float64{"allocated": 5, "free": 3})
		})
		if got := blocksByNode(t)["node-5"]; got != "10.245.0.0/24" {
			t.Errorf("node-5 got %s, want the first block of the appended CIDR 10.245.0.0/24", got)
		}
		for name := range blocksByNode(t) {
			nn := &v1alpha1.NodeNetwork{}
			mustGet(t, types.NamespacedName{Name: name}, nn)
			node := &corev1.Node{}
			mustGet(t, types.NamespacedName{Name: name}, node)
			if refs := nn.OwnerReferences; len(refs) != 1 || refs[0].Kind != "Node" || refs[0].UID != node.UID {
				t.Errorf("NodeNetwork %s owner references %v, want the Node %s", name, refs, node.UID)
			}
		}
	})

	t.Run("blocks are stable across an operator restart", func(t *testing.T) {
		before := blocksByNode(t)
		stop()
		stop = startOperator(top)
		createNode(t, "node-6")
		check.Eventually(t, 30*time.Second, "node-6 has a block", func() error {
			if _, ok := blocksByNode(t)["node-6"]; !ok {
				return fmt.Errorf("no block yet")
			}
			return nil
		})
		after := blocksByNode(t)
		for n, b := range before {
			if after[n] != b {
				t.Errorf("node %s moved from %s to %s across a restart", n, b, after[n])
			}
		}
		assertBlocksValid(t, after, []string{"10.244.0.0/22", "10.245.0.0/22"})
	})

	t.Run("a deleted node's block is freed and reused", func(t *testing.T) {
		freed := blocksByNode(t)["node-3"]
		if err := k8s.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-3"}}); err != nil {
			t.Fatal(err)
		}
		check.Eventually(t, 30*time.Second, "NodeNetwork node-3 is deleted", func() error {
			err := k8s.Get(ctx, types.NamespacedName{Name: "node-3"}, &v1alpha1.NodeNetwork{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("still there? (%w)", err)
			}
			return errors.New("still there")
		})
		createNode(t, "node-7")
		check.Eventually(t, 30*time.Second, "node-7 gets the freed block", func() error {
			if got := blocksByNode(t)["node-7"]; got != freed {
				return fmt.Errorf("node-7 has %q, want the freed %s", got, freed)
			}
			return nil
		})
		assertBlocksValid(t, blocksByNode(t), []string{"10.244.0.0/22", "10.245.0.0/22"})
	})

	t.Run("changes the running network can't take are refused whole", func(t *testing.T) {
		before := agentConfig(t)
		// The VXLAN port while nodes on the old and the new port would have to talk.
		updateSpec(t, func(s *v1alpha1.ClusterNetworkSpec) { s.VXLAN.Port = 8472 })
		check.Eventually(t, 30*time.Second, "Degraded/DisruptiveChangeRefused", func() error {
			return expectCondition(v1alpha1.ConditionDegraded, metav1.ConditionTrue, "DisruptiveChangeRefused",
				"spec.vxlan.port 4789 -> 8472 refused")
		})
		if got := agentConfig(t); got.VXLAN.Port != before.VXLAN.Port {
			t.Errorf("the refused port reached the agents: %d", got.VXLAN.Port)
		}
		cur := &v1alpha1.ClusterNetwork{}
		mustGet(t, client.ObjectKeyFromObject(cn), cur)
		if cur.Status.ObservedGeneration == cur.Generation {
			t.Errorf("status.observedGeneration %d: a refused generation counts as processed", cur.Status.ObservedGeneration)
		}
		// A pod range the cluster's Services use (the API server's default ServiceCIDR).
		updateSpec(t, func(s *v1alpha1.ClusterNetworkSpec) {
			s.VXLAN.Port = before.VXLAN.Port
			s.PodCIDRs = append(s.PodCIDRs, "10.0.0.0/22")
		})
		check.Eventually(t, 30*time.Second, "Degraded/PodCIDRConflict", func() error {
			return expectCondition(v1alpha1.ConditionDegraded, metav1.ConditionTrue, "PodCIDRConflict",
				"spec.podCIDRs entry 10.0.0.0/22 overlaps Service range 10.0.0.0/24 (ServiceCIDR kubernetes)")
		})
		if got := agentConfig(t); len(got.PodCIDRs) != len(before.PodCIDRs) {
			t.Errorf("the refused range reached the agents: %v", got.PodCIDRs)
		}
		for n, b := range blocksByNode(t) {
			if strings.HasPrefix(b, "10.0.0.") {
				t.Errorf("node %s got block %s from the refused range", n, b)
			}
		}
		// Not in effect, so it can be taken back; and the port change, once the outage is accepted.
		mustGet(t, client.ObjectKeyFromObject(cn), cur)
		cur.Spec.PodCIDRs = before.PodCIDRs
		cur.Annotations = map[string]string{"network.trellis.dev/allow-disruptive-change": "vxlan.port,vxlan.vni"}
		if err := k8s.Update(ctx, cur); err != nil {
			t.Fatalf("removing the refused range: %v", err)
		}
		check.Eventually(t, 30*time.Second, "not Degraded", func() error {
			return expectCondition(v1alpha1.ConditionDegraded, metav1.ConditionFalse, "AsExpected", "")
		})
	})

	t.Run("rendered agent matches the spec", func(t *testing.T) {
		updateSpec(t, func(s *v1alpha1.ClusterNetworkSpec) {
			s.Agent.Image = "registry.example/trellis:custom"
			s.Agent.ImagePullPolicy = corev1.PullAlways
			s.Agent.NodeSelector = map[string]string{"trellis.dev/networked": "true"}
			s.Agent.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "net", Effect: corev1.TaintEffectNoSchedule}}
			s.Agent.Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}}
			s.Agent.LogLevel = "debug"
			s.Encapsulation = v1alpha1.EncapsulationHybrid
			s.VXLAN.Port = 8472
			s.VXLAN.VNI = 42
			s.MTU = 1400
		})
		ds := &appsv1.DaemonSet{}
		check.Eventually(t, 30*time.Second, "DaemonSet has the custom image", func() error {
			if err := k8s.Get(ctx, dsKey, ds); err != nil {
				return err
			}
			if img := ds.Spec.Template.Spec.Containers[0].Image; img != "registry.example/trellis:custom" {
				return fmt.Errorf("image %s", img)
			}
			return nil
		})
		pod := ds.Spec.Template.Spec
		for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
			if c.Image != "registry.example/trellis:custom" || c.ImagePullPolicy != corev1.PullAlways {
				t.Errorf("container %s: image %s pull %s", c.Name, c.Image, c.ImagePullPolicy)
			}
		}
		if len(pod.InitContainers) != 1 || pod.InitContainers[0].Name != "install-cni" {
			t.Errorf("init containers %v, want install-cni", pod.InitContainers)
		}
		if !pod.HostNetwork || pod.PriorityClassName != "system-node-critical" || pod.ServiceAccountName != "trellis-agent" {
			t.Errorf("hostNetwork %v priorityClass %q serviceAccount %q", pod.HostNetwork, pod.PriorityClassName, pod.ServiceAccountName)
		}
		agent := pod.Containers[0]
		for _, c := range append(slices.Clone(pod.InitContainers), agent) {
			sc := c.SecurityContext
			// Root (the image's default user is non-root), not privileged (README "Least privilege").
			if sc == nil || sc.Privileged != nil && *sc.Privileged || sc.RunAsUser == nil || *sc.RunAsUser != 0 {
				t.Errorf("container %s is not unprivileged root: %+v", c.Name, sc)
			}
		}
		if agent.LivenessProbe == nil || agent.ReadinessProbe == nil {
			t.Errorf("agent container lacks liveness/readiness probes")
		}
		if got := agent.Resources.Limits.Memory().String(); got != "256Mi" || len(agent.Resources.Requests) != 0 {
			t.Errorf("resources %v, want exactly the spec's (limits memory 256Mi)", agent.Resources)
		}
		if pod.NodeSelector["trellis.dev/networked"] != "true" {
			t.Errorf("nodeSelector %v", pod.NodeSelector)
		}
		if len(pod.Tolerations) != 1 || pod.Tolerations[0].Key != "dedicated" {
			t.Errorf("tolerations %v, want the spec's", pod.Tolerations)
		}
		paths := map[string]bool{}
		for _, v := range pod.Volumes {
			if v.HostPath != nil {
				paths[v.HostPath.Path] = true
			}
		}
		for _, p := range []string{"/opt/cni/bin", "/etc/cni/net.d", "/var/lib/cni", "/run/xtables.lock"} {
			if !paths[p] {
				t.Errorf("DaemonSet lacks hostPath %s (has %v)", p, paths)
			}
		}
		assertControlledByClusterNetwork(t, ds)

		cfg := agentConfig(t)
		if cfg.Encapsulation != "Hybrid" || cfg.VXLAN.Port != 8472 || cfg.VXLAN.VNI != 42 || cfg.MTU != 1400 ||
			cfg.LogLevel != "debug" || !cfg.NATOutgoing ||
			!slices.Equal(cfg.PodCIDRs, []string{"10.244.0.0/22", "10.245.0.0/22"}) {
			t.Errorf("agent configuration does not match the spec: %+v", cfg)
		}

		role := &rbacv1.ClusterRole{}
		mustGet(t, types.NamespacedName{Name: "trellis-agent"}, role)
		assertControlledByClusterNetwork(t, role)
		for _, rule := range role.Rules {
			for _, res := range rule.Resources {
				if res == "secrets" || res == "*" {
					t.Errorf("agent ClusterRole grants %v on %s", rule.Verbs, res)
				}
			}
			for _, v := range rule.Verbs {
				// Writes: its NodeNetwork's status, events, and the reviews that guard /metrics.
				writable := slices.Contains(rule.Resources, "nodenetworks/status") || slices.Contains(rule.Resources, "events") ||
					slices.Contains(rule.Resources, "tokenreviews") || slices.Contains(rule.Resources, "subjectaccessreviews")
				if v == "*" || (v != "get" && v != "list" && v != "watch" && !writable) {
					t.Errorf("agent ClusterRole grants %s on %v", v, rule.Resources)
				}
			}
		}
		mustGet(t, types.NamespacedName{Name: "trellis-agent"}, &rbacv1.ClusterRoleBinding{})
		mustGet(t, types.NamespacedName{Namespace: render.Namespace, Name: "trellis-agent"}, &corev1.ServiceAccount{})
		// The agents' node restriction comes with them (config/agent/node_restriction_test.go
		// shows what it refuses).
		vap := &admissionregistrationv1.ValidatingAdmissionPolicy{}
		mustGet(t, types.NamespacedName{Name: "trellis-agent-node-restriction"}, vap)
		assertControlledByClusterNetwork(t, vap)
		vapb := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		mustGet(t, types.NamespacedName{Name: "trellis-agent-node-restriction"}, vapb)
		if vapb.Spec.PolicyName != vap.Name || !slices.Equal(vapb.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
			t.Errorf("binding %+v does not deny by policy %s", vapb.Spec, vap.Name)
		}
		ns := &corev1.Namespace{}
		mustGet(t, types.NamespacedName{Name: render.Namespace}, ns)
		if len(ns.OwnerReferences) != 0 {
			t.Errorf("namespace %s is owned by %v: deleting the ClusterNetwork would delete the operator", ns.Name, ns.OwnerReferences)
		}
	})

	t.Run("the operator image is the default agent image", func(t *testing.T) {
		updateSpec(t, func(s *v1alpha1.ClusterNetworkSpec) { s.Agent.Image = "" })
		check.Eventually(t, 30*time.Second, "DaemonSet runs RELATED_IMAGE_AGENT", func() error {
			ds := &appsv1.DaemonSet{}
			if err := k8s.Get(ctx, dsKey, ds); err != nil {
				return err
			}
			if img := ds.Spec.Template.Spec.Containers[0].Image; img != defaultImage {
				return fmt.Errorf("image %s", img)
			}
			return nil
		})
	})

	t.Run("a spec change changes the config hash and rolls the DaemonSet", func(t *testing.T) {
		before := templateHash(t)
		if before == "" {
			t.Fatal("pod template has no config hash annotation")
		}
		updateSpec(t, func(s *v1alpha1.ClusterNetworkSpec) { s.Encapsulation = v1alpha1.EncapsulationDirect })
		check.Eventually(t, 30*time.Second, "config hash changes", func() error {
			after := templateHash(t)
			if after == before {
				return fmt.Errorf("hash still %s", after)
			}
			cur := &v1alpha1.ClusterNetwork{}
			mustGet(t, client.ObjectKeyFromObject(cn), cur)
			if cur.Status.ConfigHash != after {
				return fmt.Errorf("status.configHash %s, template %s", cur.Status.ConfigHash, after)
			}
			if cur.Status.ObservedGeneration != cur.Generation {
				return fmt.Errorf("observedGeneration %d, generation %d", cur.Status.ObservedGeneration, cur.Generation)
			}
			return nil
		})
		if got := agentConfig(t).Encapsulation; got != "Direct" {
			t.Errorf("ConfigMap encapsulation %s, want Direct", got)
		}
	})

	t.Run("a deny log edit leaves the pod template as it was: no agent rolls", func(t *testing.T) {
		// The agents follow spec.networkPolicy.denyLogs on the ClusterNetwork while they run
		// (agent/policy TestDenyLogSettingAppliesLive).
		before := &appsv1.DaemonSet{}
		mustGet(t, dsKey, before)
		updateSpec(t, func(s *v1alpha1.ClusterNetworkSpec) {
			s.NetworkPolicy.DenyLogs = v1alpha1.DenyLogsSpec{Mode: v1alpha1.DenyLogsAll, LinesPerSecond: 7}
		})
		check.Eventually(t, 30*time.Second, "the operator applies the edit", func() error {
			cur := getClusterNetwork(t)
			if cur.Status.ObservedGeneration != cur.Generation {
				return fmt.Errorf("observedGeneration %d, generation %d", cur.Status.ObservedGeneration, cur.Generation)
			}
			// Agents that predate following the ClusterNetwork read it at start.
			if got := agentConfig(t).NetworkPolicy.DenyLogs; got != (agentconfig.DenyLogs{Mode: "All", LinesPerSecond: 7}) {
				return fmt.Errorf("ConfigMap denyLogs %+v", got)
			}
			return nil
		})
		after := &appsv1.DaemonSet{}
		mustGet(t, dsKey, after)
		if after.Generation != before.Generation || !equality.Semantic.DeepEqual(after.Spec.Template, before.Spec.Template) {
			t.Errorf("the DaemonSet's pod template changed (generation %d -> %d): every agent rolls", before.Generation, after.Generation)
		}
		updateSpec(t, func(s *v1alpha1.ClusterNetworkSpec) { s.NetworkPolicy.DenyLogs = v1alpha1.DenyLogsSpec{} }) // the defaults again
		check.Eventually(t, 30*time.Second, "the ConfigMap has the default deny log settings again", func() error {
			if got := agentConfig(t).NetworkPolicy.DenyLogs; got != (agentconfig.DenyLogs{Mode: "Annotated", LinesPerSecond: 100}) {
				return fmt.Errorf("ConfigMap denyLogs %+v", got)
			}
			return nil
		})
	})

	t.Run("drift is corrected", func(t *testing.T) {
		want := agentConfig(t)
		cm := &corev1.ConfigMap{}
		mustGet(t, cmKey, cm)
		cm.Data[agentconfig.FileName] = `{"podCIDRs":["192.168.0.0/16"]}`
		if err := k8s.Update(ctx, cm); err != nil {
			t.Fatal(err)
		}
		check.Eventually(t, 30*time.Second, "ConfigMap restored", func() error {
			if got := agentConfig(t); got.Encapsulation != want.Encapsulation || !slices.Equal(got.PodCIDRs, want.PodCIDRs) {
				return fmt.Errorf("config %+v", got)
			}
			return nil
		})

		ds := &appsv1.DaemonSet{}
		mustGet(t, dsKey, ds)
		oldUID := ds.UID
		if err := k8s.Delete(ctx, ds); err != nil {
			t.Fatal(err)
		}
		check.Eventually(t, 30*time.Second, "DaemonSet re-created", func() error {
			ds := &appsv1.DaemonSet{}
			if err := k8s.Get(ctx, dsKey, ds); err != nil {
				return err
			}
			if ds.UID == oldUID {
				return fmt.Errorf("still the old DaemonSet")
			}
			return nil
		})

		role := &rbacv1.ClusterRole{}
		mustGet(t, types.NamespacedName{Name: "trellis-agent"}, role)
		role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}})
		if err := k8s.Update(ctx, role); err != nil {
			t.Fatal(err)
		}
		check.Eventually(t, 30*time.Second, "ClusterRole edit reverted", func() error {
			role := &rbacv1.ClusterRole{}
			mustGet(t, types.NamespacedName{Name: "trellis-agent"}, role)
			for _, r := range role.Rules {
				if slices.Contains(r.Resources, "secrets") {
					return fmt.Errorf("still grants secrets")
				}
			}
			return nil
		})
	})

	t.Run("status follows the rollout", func(t *testing.T) {
		// No kube-controller-manager runs here: the test plays the DaemonSet controller.
		check.Eventually(t, 30*time.Second, "Progressing while no agent is updated", func() error {
			return expectCondition(v1alpha1.ConditionProgressing, metav1.ConditionTrue, "RollingOut", "0 of 0 nodes updated")
		})
		setDaemonSetStatus(t, 6, 3, 3)
		check.Eventually(t, 30*time.Second, "Progressing with counts", func() error {
			if err := expectCondition(v1alpha1.ConditionProgressing, metav1.ConditionTrue, "RollingOut", "3 of 6 nodes updated, 3 available"); err != nil {
				return err
			}
			return expectCondition(v1alpha1.ConditionAvailable, metav1.ConditionFalse, "AgentsUnavailable", "3 of 6")
		})
		cur := &v1alpha1.ClusterNetwork{}
		mustGet(t, client.ObjectKeyFromObject(cn), cur)
		if n := cur.Status.Nodes; n.Desired != 6 || n.Updated != 3 || n.Ready != 3 {
			t.Errorf("status.nodes %+v, want desired 6 updated 3 ready 3", n)
		}
		if err := expectGauges("trellis_operator_nodes", map[string]float64{"desired": 6, "updated": 3, "ready": 3, "available": 3}); err != nil {
			t.Error(err)
		}

		// The rollout stalls past spec.rollout.progressDeadlineSeconds: one node's new agent
		// can't pull its image (the test plays the kubelet too). Degraded names the node and why.
		stuck := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "trellis-agent-stuck", Namespace: render.Namespace, Labels: render.AgentPodLabels},
			Spec:       corev1.PodSpec{NodeName: "node-2", Containers: []corev1.Container{{Name: "agent", Image: "registry.example/trellis:nope"}}},
		}
		if err := k8s.Create(ctx, stuck); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = k8s.Delete(ctx, stuck) }()
		stuck.Status = corev1.PodStatus{Phase: corev1.PodPending,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "agent", State: corev1.ContainerState{
				Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: `failed to pull "registry.example/trellis:nope": not found`}}}}}
		if err := k8s.Status().Update(ctx, stuck); err != nil {
			t.Fatal(err)
		}
		clockOffset.Store(int64(11 * time.Minute))
		updateSpec(t, func(s *v1alpha1.ClusterNetworkSpec) { s.Rollout.ProgressDeadlineSeconds = 601 })
		check.Eventually(t, 30*time.Second, "Degraded/ProgressDeadlineExceeded naming the node and the reason", func() error {
			return expectCondition(v1alpha1.ConditionDegraded, metav1.ConditionTrue, "ProgressDeadlineExceeded",
				`spec.rollout.progressDeadlineSeconds (10m1s): 3 of 6 nodes updated, 3 available; node node-2: pod trellis-agent-stuck container agent ErrImagePull: failed to pull "registry.example/trellis:nope": not found`)
		})
		clockOffset.Store(0)

		setDaemonSetStatus(t, 6, 6, 6)
		check.Eventually(t, 30*time.Second, "Available, not Progressing, not Degraded", func() error {
			if err := expectCondition(v1alpha1.ConditionAvailable, metav1.ConditionTrue, "AgentsAvailable", "6 of 6"); err != nil {
				return err
			}
			if err := expectCondition(v1alpha1.ConditionProgressing, metav1.ConditionFalse, "RolloutComplete", ""); err != nil {
				return err
			}
			return expectCondition(v1alpha1.ConditionDegraded, metav1.ConditionFalse, "AsExpected", "")
		})
		check.Eventually(t, 30*time.Second, "trellis_operator_nodes after the rollout", func() error {
			return expectGauges("trellis_operator_nodes", map[string]float64{"desired": 6, "updated": 6, "ready": 6, "available": 6})
		})
	})

	t.Run("the MTU in status is the smallest an agent detected", func(t *testing.T) {
		updateSpec(t, func(s *v1alpha1.ClusterNetworkSpec) { s.MTU = 0 })
		for name, mtu := range map[string]int32{"node-1": 1450, "node-2": 1400} {
			nn := &v1alpha1.NodeNetwork{}
			mustGet(t, types.NamespacedName{Name: name}, nn)
			nn.Status.MTU = mtu
			if err := k8s.Status().Update(ctx, nn); err != nil {
				t.Fatal(err)
			}
		}
		check.Eventually(t, 30*time.Second, "status.mtu 1400", func() error {
			cur := &v1alpha1.ClusterNetwork{}
			mustGet(t, client.ObjectKeyFromObject(cn), cur)
			if cur.Status.MTU != 1400 {
				return fmt.Errorf("status.mtu %d", cur.Status.MTU)
			}
			return nil
		})
	})

	t.Run("a ClusterNetwork not named default is refused", func(t *testing.T) {
		other := &v1alpha1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: "second"}}
		other.Spec.PodCIDRs = []string{"10.100.0.0/16"}
		if err := k8s.Create(ctx, other); err != nil {
			t.Fatal(err)
		}
		check.Eventually(t, 30*time.Second, "Degraded/NotDefault", func() error {
			cur := &v1alpha1.ClusterNetwork{}
			mustGet(t, client.ObjectKeyFromObject(other), cur)
			c := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionDegraded)
			if c == nil || c.Status != metav1.ConditionTrue || c.Reason != "NotDefault" || !strings.Contains(c.Message, `named "default"`) {
				return fmt.Errorf("condition %+v", c)
			}
			return nil
		})
		if got := agentConfig(t).PodCIDRs; slices.Contains(got, "10.100.0.0/16") {
			t.Errorf("the second ClusterNetwork changed the agent configuration: %v", got)
		}
	})
}

func createNode(t *testing.T, name string) {
	t.Helper()
	if err := k8s.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatalf("creating node %s: %v", name, err)
	}
}

func mustGet(t *testing.T, key types.NamespacedName, obj client.Object) {
	t.Helper()
	if err := k8s.Get(ctx, key, obj); err != nil {
		t.Fatalf("reading %T %s: %v", obj, key, err)
	}
}

func blocksByNode(t *testing.T) map[string]string {
	t.Helper()
	var list v1alpha1.NodeNetworkList
	if err := k8s.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, nn := range list.Items {
		if nn.Spec.PodCIDR != "" && nn.DeletionTimestamp.IsZero() {
			out[nn.Name] = nn.Spec.PodCIDR
		}
	}
	return out
}

func assertBlocksValid(t *testing.T, blocks map[string]string, pools []string) {
	t.Helper()
	seen := map[string]netip.Prefix{}
	for node, b := range blocks {
		p, err := netip.ParsePrefix(b)
		if err != nil || p.Bits() != 24 {
			t.Errorf("node %s has block %q, want a /24", node, b)
			continue
		}
		inPool := false
		for _, pool := range pools {
			inPool = inPool || netip.MustParsePrefix(pool).Contains(p.Addr())
		}
		if !inPool {
			t.Errorf("node %s block %s is outside %v", node, b, pools)
		}
		for other, q := range seen {
			if q.Overlaps(p) {
				t.Errorf("blocks of %s (%s) and %s (%s) overlap", node, p, other, q)
			}
		}
		seen[node] = p
	}
}

func updateSpec(t *testing.T, mutate func(*v1alpha1.ClusterNetworkSpec)) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		cn := &v1alpha1.ClusterNetwork{}
		mustGet(t, types.NamespacedName{Name: v1alpha1.ClusterNetworkName}, cn)
		mutate(&cn.Spec)
		err := k8s.Update(ctx, cn)
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) || attempt > 5 {
			t.Fatalf("updating ClusterNetwork: %v", err)
		}
	}
}

func expectCondition(typ string, status metav1.ConditionStatus, reason, msgPart string) error {
	cn := &v1alpha1.ClusterNetwork{}
	if err := k8s.Get(ctx, types.NamespacedName{Name: v1alpha1.ClusterNetworkName}, cn); err != nil {
		return err
	}
	c := meta.FindStatusCondition(cn.Status.Conditions, typ)
	if c == nil {
		return fmt.Errorf("no %s condition", typ)
	}
	if c.Status != status || c.Reason != reason || !strings.Contains(c.Message, msgPart) {
		return fmt.Errorf("%s = %s/%s %q, want %s/%s containing %q", typ, c.Status, c.Reason, c.Message, status, reason, msgPart)
	}
	if c.ObservedGeneration != cn.Generation {
		return fmt.Errorf("%s condition observedGeneration %d, generation %d", typ, c.ObservedGeneration, cn.Generation)
	}
	return nil
}

func agentConfig(t *testing.T) agentconfig.Config {
	t.Helper()
	cm := &corev1.ConfigMap{}
	mustGet(t, cmKey, cm)
	var c agentconfig.Config
	if err := json.Unmarshal([]byte(cm.Data[agentconfig.FileName]), &c); err != nil {
		t.Fatalf("agent ConfigMap %s: %v", agentconfig.FileName, err)
	}
	return c
}

func templateHash(t *testing.T) string {
	t.Helper()
	ds := &appsv1.DaemonSet{}
	mustGet(t, dsKey, ds)
	return ds.Spec.Template.Annotations[render.ConfigHashAnnotation]
}

func assertControlledByClusterNetwork(t *testing.T, obj client.Object) {
	t.Helper()
	ref := metav1.GetControllerOf(obj)
	if ref == nil || ref.Kind != "ClusterNetwork" || ref.Name != v1alpha1.ClusterNetworkName {
		t.Errorf("%T %s is not controlled by ClusterNetwork default: %v", obj, obj.GetName(), ref)
	}
	for _, f := range obj.GetManagedFields() {
		if f.Manager == "trellis-operator" && f.Operation == metav1.ManagedFieldsOperationApply {
			return
		}
	}
	t.Errorf("%T %s was not server-side applied by trellis-operator", obj, obj.GetName())
}

// expectGauges compares the operator's gauges name{state} with want, as its /metrics
// would serve them (the manager registers them on controller-runtime's registry).
func expectGauges(name string, want map[string]float64) error {
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		return err
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "state" {
					got[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	for state, v := range want {
		if g, ok := got[state]; !ok || g != v {
			return fmt.Errorf("%s: got %v, want %v", name, got, want)
		}
	}
	return nil
}

func setDaemonSetStatus(t *testing.T, desired, updated, available int32) {
	t.Helper()
	ds := &appsv1.DaemonSet{}
	mustGet(t, dsKey, ds)
	ds.Status = appsv1.DaemonSetStatus{
		ObservedGeneration:     ds.Generation,
		DesiredNumberScheduled: desired,
		CurrentNumberScheduled: desired,
		UpdatedNumberScheduled: updated,
		NumberReady:            available,
		NumberAvailable:        available,
		NumberUnavailable:      desired - available,
	}
	if err := k8s.Status().Update(ctx, ds); err != nil {
		t.Fatalf("setting DaemonSet status: %v", err)
	}
}
