package controllers

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestAgentPodTrouble(t *testing.T) {
	pod := func(name, node string, ready bool, mod func(*corev1.Pod)) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: node},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}}}
		if ready {
			p.Status.Conditions[0].Status = corev1.ConditionTrue
		}
		if mod != nil {
			mod(&p)
		}
		return p
	}
	waiting := func(reason, msg string, last *corev1.ContainerStateTerminated) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "agent",
				State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}},
				LastTerminationState: corev1.ContainerState{Terminated: last}}}
		}
	}
	for _, tc := range []struct {
		name string
		pods []corev1.Pod
		want []string
	}{
		{"all ready", []corev1.Pod{pod("a", "n1", true, nil)}, nil},
		{"image can't be pulled", []corev1.Pod{
			pod("a", "n1", true, nil),
			pod("b", "n2", false, waiting("ErrImagePull", `failed to pull image "nope:1": not found`, nil)),
		}, []string{`node n2: pod b container agent ErrImagePull: failed to pull image "nope:1": not found`}},
		{"crash loop quotes the last log line", []corev1.Pod{
			pod("c", "n3", false, waiting("CrashLoopBackOff", "back-off 10s", &corev1.ContainerStateTerminated{ExitCode: 1,
				Message: "starting\nERROR trellis-agent failed {\"error\": \"no node IP\"}\n"})),
		}, []string{`node n3: pod c container agent CrashLoopBackOff: back-off 10s (last exit 1: ERROR trellis-agent failed {"error": "no node IP"})`}},
		{"running but never ready", []corev1.Pod{
			pod("d", "n4", false, func(p *corev1.Pod) { p.Status.Conditions[0].Message = "containers with unready status: [agent]" }),
		}, []string{"node n4: pod d not Ready: containers with unready status: [agent]"}},
		{"init container", []corev1.Pod{
			pod("e", "n5", false, func(p *corev1.Pod) {
				p.Status.Phase = corev1.PodPending
				p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "install-cni",
					State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}}}
			}),
		}, []string{"node n5: pod e container install-cni ImagePullBackOff"}},
		{"bounded", []corev1.Pod{pod("a", "n1", false, nil), pod("b", "n2", false, nil), pod("c", "n3", false, nil)},
			[]string{"node n1: pod a not Ready", "node n2: pod b not Ready", "and 1 more"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := agentPodTrouble(tc.pods, 2); !slices.Equal(got, tc.want) {
				t.Errorf("got\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}
