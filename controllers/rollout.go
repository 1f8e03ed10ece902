package controllers

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// agentPodTrouble says, for each agent pod that isn't Ready, its node and why, in the words
// an on-call engineer would look for in `kubectl describe pod`: the waiting reason
// (ErrImagePull, ImagePullBackOff, CrashLoopBackOff...) with its message, the last exit and
// the last line of the log (the agent's termination message falls back to its log), or the
// Ready condition's message. It is pure; at most max entries, sorted by node.
func agentPodTrouble(pods []corev1.Pod, max int) []string {
	var out []string
	for i := range pods {
		p := &pods[i]
		if !p.DeletionTimestamp.IsZero() || podReady(p) {
			continue
		}
		node := p.Spec.NodeName
		if node == "" {
			node = "(unscheduled)"
		}
		out = append(out, fmt.Sprintf("node %s: pod %s %s", node, p.Name, podWhy(p)))
	}
	slices.Sort(out)
	if len(out) > max {
		out = append(out[:max], fmt.Sprintf("and %d more", len(out)-max))
	}
	return out
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podWhy(p *corev1.Pod) string {
	statuses := append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...)
	for _, cs := range statuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "PodInitializing" && w.Reason != "ContainerCreating" {
			why := fmt.Sprintf("container %s %s", cs.Name, w.Reason)
			if w.Message != "" {
				why += ": " + oneLine(w.Message, 200)
			}
			if t := cs.LastTerminationState.Terminated; t != nil {
				why += fmt.Sprintf(" (last exit %d", t.ExitCode)
				if line := lastLine(t.Message); line != "" {
					why += ": " + oneLine(line, 200)
				}
				why += ")"
			}
			return why
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Message != "" {
			return "not Ready: " + oneLine(c.Message, 200)
		}
	}
	if p.Status.Phase == corev1.PodPending {
		return "Pending"
	}
	return "not Ready"
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}
