package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/trellis-net/trellis/agent/denylog"
	"github.com/trellis-net/trellis/internal/cnicontract"
	"github.com/trellis-net/trellis/internal/netpol"
)

// nflogRefuser is an Applier on a node without xt_NFLOG/xt_hashlimit: it refuses every
// ruleset holding a deny log rule, as iptables-restore does there, and records the rest.
type nflogRefuser struct {
	recorder
	refused int
}

func (a *nflogRefuser) Apply(rs netpol.Rulesets, verify bool) (bool, error) {
	for _, c := range rs.V4.Chains {
		for _, r := range c.Rules {
			if r.Verdict == netpol.Log {
				a.mu.Lock()
				a.refused++
				a.mu.Unlock()
				return false, errors.New(`iptables-restore: line 12 failed: Couldn't load target "NFLOG"`)
			}
		}
	}
	return a.recorder.Apply(rs, verify)
}

// Deny logs never change a verdict: on a node that refuses their rules (the probe says so,
// or the restore of the pods' chains fails with them), logged pods get exactly their rules
// without deny logs, they start, their verdicts hold, and the status says why there are
// no lines.
func TestDenyLogsRefusedKeepVerdicts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		probe func() error
	}{
		{"the probe says the node refuses them", func() error { return errors.New(`iptables-restore: Couldn't load match "hashlimit"`) }},
		{"no probe; the restore with them fails", nil},
		{"the probe passes but the restore with them fails", func() error { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &nflogRefuser{}
			var probes int
			var mu sync.Mutex
			var last Status
			e, _, _ := newEngine(t, func(e *Engine) {
				e.Applier = a
				e.DenyLog = netpol.DenyLog{Mode: netpol.DenyLogAll, LinesPerSecond: 100}
				if tc.probe != nil {
					e.DenyLogProbe = func() error { probes++; return tc.probe() }
				}
				e.OnSync = func(st Status, _ netpol.Rulesets, _ time.Duration) { mu.Lock(); last = st; mu.Unlock() }
				wiredAs(map[string]string{dbIP.String(): "trldb", webIP.String(): "trlweb"})(e)
			}, shopNS(),
				allowFrom("db", map[string]string{"app": "db"}, map[string]string{"app": "web"}),
				pod("shop", "db", "u-db", "node1", dbIP.String(), map[string]string{"app": "db"}),
				pod("shop", "web", "u-web", "node1", webIP.String(), map[string]string{"app": "web"}))
			for _, p := range []struct{ name, uid, ip, iface string }{{"db", "u-db", dbIP.String(), "trldb"}, {"web", "u-web", webIP.String(), "trlweb"}} {
				if err := e.EnsurePod(context.Background(), cnicontract.PolicyRequest{Op: cnicontract.PolicyOpAdd, Namespace: "shop", Pod: p.name, PodUID: p.uid, IP: p.ip, HostInterface: p.iface}); err != nil {
					t.Errorf("pod %s did not start with deny logs asked for on a node that refuses them: %v", p.name, err)
				}
			}
			e.Trigger() // more syncs: the node is asked once, not every sync
			if err := e.EnsurePod(context.Background(), cnicontract.PolicyRequest{Op: cnicontract.PolicyOpAdd, Namespace: "shop", Pod: "db", PodUID: "u-db", IP: dbIP.String(), HostInterface: "trldb"}); err != nil {
				t.Errorf("db's second ADD: %v", err)
			}
			if err := e.Ready(); err != nil {
				t.Errorf("not ready: %v", err)
			}
			rs := a.ruleset()
			if len(rs.Families()) == 0 {
				t.Fatal("nothing applied")
			}
			if s := dump(rs); strings.Contains(s, "NFLOG") || strings.Contains(s, "DROP") && strings.Contains(s, "could not be programmed") {
				t.Errorf("applied rules carry deny logs or cut a pod off:\n%s", s)
			}
			if !allowed(t, rs, netpol.Packet{Src: webIP, Dst: dbIP, Protocol: "tcp", DstPort: 5432, OutInterface: "trldb"}) {
				t.Error("web -> db is denied: the policy allows it")
			}
			if allowed(t, rs, netpol.Packet{Src: otherIP, Dst: dbIP, Protocol: "tcp", DstPort: 5432, OutInterface: "trldb"}) {
				t.Error("other -> db is allowed: the policy isolates db")
			}
			mu.Lock()
			st := last
			mu.Unlock()
			if st.DenyLogsOff == nil || !st.Enforced {
				t.Errorf("status %+v: want enforced, with why deny logs are off", st)
			}
			a.mu.Lock()
			refused := a.refused
			a.mu.Unlock()
			if tc.probe != nil && probes != 1 {
				t.Errorf("the node was asked %d times, want once (again only after %s)", probes, denyLogRetry)
			}
			if refused > 1 {
				t.Errorf("%d restores with deny logs were tried, want at most one before they are off", refused)
			}
		})
	}
}

// Deny log lines name the rules the kernel holds: a sync that failed (its netpol.Ruleset never
// reached the kernel) leaves the rules of the last applied one in force.
func TestDenyLoggerTakesOnlyAppliedRules(t *testing.T) {
	const prefix = "TRELLIS-I-ABC 1"
	applied := &netpol.Ruleset{DenyLogRules: map[string]netpol.DenyLogRule{prefix: {PodChain: netpol.PodChain{Pod: types.NamespacedName{Namespace: "shop", Name: "db"}, Direction: netpol.Ingress}, Rule: "not allowed by NetworkPolicy"}}}
	refused := &netpol.Ruleset{DenyLogRules: map[string]netpol.DenyLogRule{prefix: {PodChain: netpol.PodChain{Pod: types.NamespacedName{Namespace: "shop", Name: "web"}, Direction: netpol.Ingress}, Rule: "not allowed by NetworkPolicy"}}}
	for _, tc := range []struct {
		name string
		then Status
		want string
	}{
		{"a failed sync keeps the applied rules", Status{Err: fmt.Errorf("applying network policy rules: iptables-restore failed")}, "shop/db"},
		{"a failed state read keeps them", Status{Err: fmt.Errorf("listing pods: timeout")}, "shop/db"},
		{"a successful sync replaces them", Status{Enforced: true}, "shop/web"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []map[string]any
			var mu sync.Mutex
			d := &DenyLogger{LinesPerSecond: 100, Log: funcr.NewJSON(func(obj string) {
				var m map[string]any
				if json.Unmarshal([]byte(obj), &m) == nil {
					mu.Lock()
					got = append(got, m)
					mu.Unlock()
				}
			}, funcr.Options{})}
			d.Synced(Status{Enforced: true}, netpol.Rulesets{V4: applied})
			d.Synced(tc.then, netpol.Rulesets{V4: refused})
			d.Handle(denylog.Packet{Prefix: prefix, Src: otherIP, Dst: dbIP, Protocol: "tcp", SrcPort: 40000, DstPort: 80, SYN: true})
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 1 || got[0]["pod"] != tc.want {
				t.Errorf("lines %v, want one naming pod %s", got, tc.want)
			}
		})
	}
}
