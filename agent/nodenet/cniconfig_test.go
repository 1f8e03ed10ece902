package nodenet_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/trellis-net/trellis/agent/cniinstall"
	"github.com/trellis-net/trellis/agent/nodenet"
	"github.com/trellis-net/trellis/api/v1alpha1"
	trellisscheme "github.com/trellis-net/trellis/internal/scheme"
	"github.com/trellis-net/trellis/internal/test/check"
	"github.com/trellis-net/trellis/internal/test/netnstest"
)

// Another CNI's installer drops "00-other.conflist" into the conf dir after the agent
// wrote its own: the runtime would use that file, as it sorts first. The agent's conf dir
// watch notices it between syncs: the NodeNetwork's CNIConfigInEffect turns False naming
// the file and spec.agent.removeOtherCNIConfigs, with a Warning Event, and turns True again
// once the file is gone. With removeOtherCNIConfigs the agent removes the file instead.
func TestShadowingCNIConfig(t *testing.T) {
	netnstest.RequireCommands(t, "iptables", "iptables-restore")
	k8s := apiServer(t)
	cs, err := kubernetes.NewForConfig(envCfg)
	check.Must(t, err)
	scheme, err := trellisscheme.New()
	check.Must(t, err)
	recorder := eventRecorder(t, cs, scheme)

	for i, tc := range []struct {
		name   string
		remove bool // spec.agent.removeOtherCNIConfigs
	}{
		{name: "reported", remove: false},
		{name: "removed under removeOtherCNIConfigs", remove: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			cfg.RemoveOtherCNIConfigs = tc.remove
			name := fmt.Sprintf("shadow-%d", i)
			a := newAgent(t, k8s, name, fmt.Sprintf("198.51.100.%d", 81+i), fmt.Sprintf("10.244.%d.0/24", 81+i), cfg)
			a.rec.Recorder = recorder
			check.Must(t, a.sync())
			a.expectReady(t)
			a.expectCNIConfig(t, metav1.ConditionTrue, nodenet.ReasonConflistFirst, cniinstall.ConflistName)

			// The watch, as the manager runs it, with each change leading to a sync (the
			// controller's queue, here run in the agent's namespace).
			wctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				a.rec.WatchCNIConfDir(wctx, 100*time.Millisecond, func() {
					if err := a.sync(); err != nil {
						t.Errorf("sync after a conf dir change: %v", err)
					}
				})
			}()
			var once sync.Once
			stop := func() { once.Do(func() { cancel(); <-done }) } // the watch's sync, if any, done
			defer stop()

			other := filepath.Join(a.rec.CNIConfDir, "00-other.conflist")
			check.Must(t, os.WriteFile(other, []byte(`{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge"}]}`), 0o644))
			if tc.remove {
				check.Eventually(t, 10*time.Second, "the agent removes 00-other.conflist", func() error {
					switch _, err := os.Stat(other); {
					case err == nil:
						return errors.New("still there")
					case !os.IsNotExist(err):
						return err
					}
					return nil
				})
				stop()
				a.expectCNIConfig(t, metav1.ConditionTrue, nodenet.ReasonConflistFirst, cniinstall.ConflistName)
				if evs := a.shadowEvents(t, cs); len(evs) != 0 {
					t.Errorf("shadowing events with removeOtherCNIConfigs: %+v", evs)
				}
				return
			}

			check.Eventually(t, 10*time.Second, "CNIConfigInEffect False/"+nodenet.ReasonConflistShadowed, func() error {
				if c := meta.FindStatusCondition(a.nodeNetwork(t).Status.Conditions, v1alpha1.ConditionCNIConfigInEffect); c == nil || c.Reason != nodenet.ReasonConflistShadowed {
					return fmt.Errorf("CNIConfigInEffect %+v", c)
				}
				return nil
			})
			c := a.expectCNIConfig(t, metav1.ConditionFalse, nodenet.ReasonConflistShadowed, "00-other.conflist")
			for _, want := range []string{cniinstall.ConflistName, "spec.agent.removeOtherCNIConfigs"} {
				if !strings.Contains(c.Message, want) {
					t.Errorf("CNIConfigInEffect message %q doesn't name %s", c.Message, want)
				}
			}
			if _, err := os.Stat(other); err != nil {
				t.Errorf("another CNI's file removed without removeOtherCNIConfigs: %v", err)
			}
			var evs []corev1.Event
			check.Eventually(t, 10*time.Second, "a Warning Event "+nodenet.ReasonConflistShadowed, func() error {
				if evs = a.shadowEvents(t, cs); len(evs) == 0 {
					return errors.New("no event yet")
				}
				return nil
			})
			if len(evs) != 1 || evs[0].Type != corev1.EventTypeWarning || evs[0].Count > 1 || !strings.Contains(evs[0].Message, "00-other.conflist") ||
				!strings.Contains(evs[0].Message, "spec.agent.removeOtherCNIConfigs") || evs[0].InvolvedObject.Kind != "NodeNetwork" {
				t.Errorf("events %+v; want one Warning on the NodeNetwork naming 00-other.conflist and spec.agent.removeOtherCNIConfigs", evs)
			}
			if a.rec.Ready() != nil {
				t.Errorf("Ready() = %v: the datapath is programmed whichever file the runtime uses", a.rec.Ready())
			}

			// The other CNI's file goes: trellis's is in effect again.
			check.Must(t, os.Remove(other))
			check.Eventually(t, 10*time.Second, "CNIConfigInEffect True again", func() error {
				if c := meta.FindStatusCondition(a.nodeNetwork(t).Status.Conditions, v1alpha1.ConditionCNIConfigInEffect); c == nil || c.Status != metav1.ConditionTrue {
					return fmt.Errorf("CNIConfigInEffect %+v", c)
				}
				return nil
			})
			a.expectCNIConfig(t, metav1.ConditionTrue, nodenet.ReasonConflistFirst, cniinstall.ConflistName)
		})
	}
}

// expectCNIConfig checks the NodeNetwork's CNIConfigInEffect condition, its message
// naming file.
func (a *agent) expectCNIConfig(t *testing.T, status metav1.ConditionStatus, reason, file string) *metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(a.nodeNetwork(t).Status.Conditions, v1alpha1.ConditionCNIConfigInEffect)
	if c == nil || c.Status != status || c.Reason != reason || !strings.Contains(c.Message, file) {
		t.Fatalf("CNIConfigInEffect %+v, want %s/%s naming %s", c, status, reason, file)
	}
	return c
}

func (a *agent) shadowEvents(t *testing.T, cs kubernetes.Interface) []corev1.Event {
	t.Helper()
	evs, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + a.rec.NodeName + ",reason=" + nodenet.ReasonConflistShadowed})
	check.Must(t, err)
	return evs.Items
}
