package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	policyv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/trellis-net/trellis/api/v1alpha1"
	"github.com/trellis-net/trellis/cli"
	"github.com/trellis-net/trellis/docs"
)

// Exit codes of status (0: healthy, warnings allowed).
const (
	exitUnhealthy    = 1
	exitCouldNotRead = 2
)

// NewCommand is `kubectl trellis status`.
func NewCommand(f *cli.Factory) *cobra.Command {
	timeout := 30 * time.Second
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the ClusterNetwork's conditions and each node's agent, CNI config, policy and addresses; exit 1 when anything is unhealthy",
		Long: `Status reads the ClusterNetwork, the NodeNetworks, the nodes and Trellis's pods (with your
kubeconfig and RBAC: get/list on clusternetworks, nodenetworks, nodes, and pods and
daemonsets in trellis-system) and says what is wrong and what to do next.

Exit codes: 0 healthy (warnings allowed), 1 a problem found, 2 status could not be read.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.ValidateOutput(); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			c, err := f.Client()
			if err != nil {
				return f.Fail(exitCouldNotRead, err)
			}
			snap, err := Read(ctx, c)
			if err != nil {
				return f.Fail(exitCouldNotRead, err)
			}
			rep := Assess(snap, ParseGuide(docs.Conditions))
			if f.JSON() {
				enc := json.NewEncoder(f.Out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				Render(f.Out, rep)
			}
			if !rep.Healthy {
				// Render has said what is wrong; only the exit code is left to give.
				return &cli.ExitError{Code: exitUnhealthy, Err: errors.New("unhealthy")}
			}
			return nil
		},
	}
	f.AddOutputFlag(cmd)
	cmd.Flags().DurationVar(&timeout, "timeout", timeout, "how long to wait for the API server")
	return cmd
}

// Read lists what Assess judges. A list the user may not read is recorded in
// Snapshot.Unreadable (and judged a problem) rather than failing the whole status; an
// API server that can't be reached at all fails it.
func Read(ctx context.Context, c client.Client) (Snapshot, error) {
	var s Snapshot
	list := func(what string, l client.ObjectList, opts ...client.ListOption) (bool, error) {
		err := c.List(ctx, l, opts...)
		switch {
		case err == nil:
			return true, nil
		case apierrors.IsForbidden(err):
			s.Unreadable = append(s.Unreadable, fmt.Sprintf("%s: forbidden (%s)", what, apierrors.ReasonForError(err)))
			return false, nil
		case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
			return false, nil
		}
		return false, fmt.Errorf("listing %s: %w", what, err)
	}

	var cns v1alpha1.ClusterNetworkList
	if ok, err := list("clusternetworks", &cns); err != nil {
		return s, err
	} else if !ok && len(s.Unreadable) == 0 {
		return s, errors.New("the ClusterNetwork API (network.trellis.dev) is not installed: Trellis is not installed on this cluster (kubectl apply -k config/default)")
	}
	s.ClusterNetworks = cns.Items

	var nns v1alpha1.NodeNetworkList
	if _, err := list("nodenetworks", &nns); err != nil {
		return s, err
	}
	s.NodeNetworks = nns.Items
	var nodes corev1.NodeList
	if _, err := list("nodes", &nodes); err != nil {
		return s, err
	}
	s.Nodes = nodes.Items
	var agents, operators corev1.PodList
	if _, err := list("pods in trellis-system", &agents, client.InNamespace(cli.Namespace),
		client.MatchingLabels{"app.kubernetes.io/name": "trellis-agent"}); err != nil {
		return s, err
	}
	s.AgentPods = agents.Items
	if _, err := list("pods in trellis-system", &operators, client.InNamespace(cli.Namespace),
		client.MatchingLabels{"app.kubernetes.io/name": "trellis-operator"}); err != nil {
		return s, err
	}
	s.OperatorPods = operators.Items
	var ds appsv1.DaemonSet
	switch err := c.Get(ctx, client.ObjectKey{Namespace: cli.Namespace, Name: "trellis-agent"}, &ds); {
	case err == nil:
		s.AgentDaemonSet = &ds
	case apierrors.IsForbidden(err):
		s.Unreadable = append(s.Unreadable, "daemonset trellis-system/trellis-agent: forbidden")
	case !apierrors.IsNotFound(err):
		return s, fmt.Errorf("reading daemonset trellis-system/trellis-agent: %w", err)
	}
	var cnps policyv1beta1.ClusterNetworkPolicyList
	if ok, err := list("clusternetworkpolicies", &cnps); err != nil {
		return s, err
	} else if ok {
		s.ClusterNetworkPolicies = cnps.Items
		if s.ClusterNetworkPolicies == nil {
			s.ClusterNetworkPolicies = []policyv1beta1.ClusterNetworkPolicy{}
		}
	}
	return s, nil
}
