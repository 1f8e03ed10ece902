package controllers

import (
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trellis-net/trellis/api/v1alpha1"
)

// Condition reasons on ClusterNetwork.
const (
	ReasonAsExpected               = "AsExpected"
	ReasonNotDefault               = "NotDefault"
	ReasonPodCIDRExhausted         = "PodCIDRExhausted"
	ReasonNodeBlockConflict        = "NodeBlockConflict"
	ReasonRenderFailed             = "RenderFailed"
	ReasonApplyFailed              = "ApplyFailed"
	ReasonAllocationFailed         = "AllocationFailed"
	ReasonRollingOut               = "RollingOut"
	ReasonRolloutComplete          = "RolloutComplete"
	ReasonProgressDeadlineExceeded = "ProgressDeadlineExceeded"
	ReasonAgentsAvailable          = "AgentsAvailable"
	ReasonAgentsUnavailable        = "AgentsUnavailable"
	ReasonDaemonSetMissing         = "DaemonSetMissing"
)

// problem is a reason to report Degraded.
type problem struct {
	reason  string
	message string
}

// observed is what a reconcile saw, the input of the status computation.
type observed struct {
	generation int64
	// processed: the generation's blocks were allocated and its agent rendered and applied.
	processed bool
	// podCIDRs of the spec this pass applied (status.podCIDRs once processed).
	podCIDRs []string
	// blocks: the use of each family's node blocks; nil when the allocator did not run.
	blocks []v1alpha1.FamilyBlocks
	// configHash of the agent configuration this pass applied; "" when it applied none.
	configHash string
	daemonSet  *appsv1.DaemonSet // nil when not (yet) there
	// podTrouble names the agent pods that aren't Ready and why, while a rollout is on.
	podTrouble []string
	problems   []problem
	mtu        int32
	deadline   time.Duration
	now        time.Time
}

// rollout summarises the agent DaemonSet.
type rollout struct {
	desired, updated, ready, available int32
	current                            bool // the controller has seen the latest template
}

func rolloutOf(ds *appsv1.DaemonSet) rollout {
	s := ds.Status
	return rollout{
		desired:   s.DesiredNumberScheduled,
		updated:   s.UpdatedNumberScheduled,
		ready:     s.NumberReady,
		available: s.NumberAvailable,
		current:   s.ObservedGeneration >= ds.Generation,
	}
}

func (r rollout) done() bool {
	return r.current && r.updated == r.desired && r.available == r.desired
}

// computeStatus is the ClusterNetwork status for what was observed. It is pure; conditions
// keep their transition times when their status does not change.
//
// observedGeneration follows Cluster API, which patches it only after a reconcile that
// returned no error: status.observedGeneration moves to a generation only once that
// generation was processed, so whoever waits for observedGeneration == generation (kstatus,
// kubectl wait, a GitOps tool) never takes a spec that failed to render or apply for one
// that took effect. Available and Progressing describe the rollout of the configuration
// last applied and keep that generation; Degraded says why the current generation did not
// take effect, so it is stamped with the current one.
func computeStatus(prev v1alpha1.ClusterNetworkStatus, o observed) (v1alpha1.ClusterNetworkStatus, time.Duration) {
	st := *prev.DeepCopy()
	if o.processed {
		st.ObservedGeneration = o.generation
		st.PodCIDRs = o.podCIDRs
	}
	if o.configHash != "" {
		st.ConfigHash = o.configHash
	}
	if o.blocks != nil {
		st.Blocks = o.blocks
	}
	if o.mtu != 0 {
		st.MTU = o.mtu
	}
	setFor := func(gen int64, t string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen,
			LastTransitionTime: metav1.NewTime(o.now),
		})
	}
	set := func(t string, s metav1.ConditionStatus, reason, msg string) {
		setFor(st.ObservedGeneration, t, s, reason, msg)
	}
	var requeue time.Duration
	problems := o.problems

	switch ds := o.daemonSet; {
	case ds == nil:
		st.Nodes = v1alpha1.NodeCounts{}
		set(v1alpha1.ConditionAvailable, metav1.ConditionFalse, ReasonDaemonSetMissing,
			"the agent DaemonSet trellis-system/trellis-agent does not exist yet")
		set(v1alpha1.ConditionProgressing, metav1.ConditionFalse, ReasonDaemonSetMissing,
			"the agent DaemonSet trellis-system/trellis-agent does not exist yet")
	default:
		ro := rolloutOf(ds)
		st.Nodes = v1alpha1.NodeCounts{Desired: ro.desired, Updated: ro.updated, Ready: ro.ready}
		counts := fmt.Sprintf("%d of %d nodes updated, %d available", ro.updated, ro.desired, ro.available)
		// What rolls out is the DaemonSet's template: the image may change with the
		// configuration as it is (an upgrade), so name both.
		what := fmt.Sprintf("the agent (image %s, configuration %s)", agentImage(ds), st.ConfigHash)
		if ro.done() {
			set(v1alpha1.ConditionProgressing, metav1.ConditionFalse, ReasonRolloutComplete,
				what+" is rolled out: "+counts)
		} else {
			set(v1alpha1.ConditionProgressing, metav1.ConditionTrue, ReasonRollingOut,
				"rolling out "+what+": "+counts)
			// The rollout started when Progressing last turned True.
			since := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionProgressing).LastTransitionTime.Time
			if o.deadline > 0 {
				if elapsed := o.now.Sub(since); elapsed >= o.deadline {
					why := "check the trellis-agent pods in trellis-system"
					if len(o.podTrouble) > 0 {
						why = strings.Join(o.podTrouble, "; ")
					}
					problems = append(problems, problem{ReasonProgressDeadlineExceeded, fmt.Sprintf(
						"the agent rollout has not completed within spec.rollout.progressDeadlineSeconds (%s): %s; %s. Nodes not yet updated keep the previous agent; correct spec.agent (or the cause above) to resume",
						o.deadline, counts, why)})
				} else {
					requeue = o.deadline - elapsed
				}
			}
		}
		// Available: every node's agent is up, even if some still run the previous config.
		if ro.desired > 0 && ro.available == ro.desired || ro.desired == 0 && ro.current {
			set(v1alpha1.ConditionAvailable, metav1.ConditionTrue, ReasonAgentsAvailable,
				fmt.Sprintf("the agent is available on %d of %d nodes", ro.available, ro.desired))
		} else {
			set(v1alpha1.ConditionAvailable, metav1.ConditionFalse, ReasonAgentsUnavailable,
				fmt.Sprintf("the agent is available on %d of %d nodes", ro.available, ro.desired))
		}
	}

	if len(problems) == 0 {
		setFor(o.generation, v1alpha1.ConditionDegraded, metav1.ConditionFalse, ReasonAsExpected, "")
	} else {
		msg := problems[0].message
		for _, p := range problems[1:] {
			msg += "; " + p.message
		}
		setFor(o.generation, v1alpha1.ConditionDegraded, metav1.ConditionTrue, problems[0].reason, msg)
	}
	return st, requeue
}

// agentImage is the image of the agent container of the DaemonSet's template.
func agentImage(ds *appsv1.DaemonSet) string {
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == "agent" {
			return c.Image
		}
	}
	return "unknown"
}
