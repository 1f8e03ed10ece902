package cni_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/trellis-net/trellis/agent/cniinstall"
	"github.com/trellis-net/trellis/internal/cnicontract"
	rt "github.com/trellis-net/trellis/test/runtime"
)

// The conflist the agent writes (its default --cni-version), run against the real plugin
// and portmap in a node namespace, the way two generations of runtime read it:
//
//   - libcni 1.2+ (containerd 2, CRI-O) knows cniVersions and picks 1.1.0, the highest
//     offered: it calls STATUS, which follows the ready file, and GC, which releases an
//     allocation libcni itself never heard of;
//   - an older libcni (containerd 1.6; TestThroughContainerd runs that containerd) reads
//     cniVersion only and gets 1.0.0, a version it knows: ADD and DEL work, STATUS and GC
//     are never sent to the plugin.
func TestAgentConflistVersions(t *testing.T) {
	tools, err := rt.ToolsDir() // the reference portmap the conflist chains
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		// load reads the conf dir as the runtime does.
		load        func(t *testing.T, confDir string) *libcni.NetworkConfigList
		wantVersion string
		// statusAndGC: the runtime sends STATUS and GC to the plugins.
		statusAndGC bool
	}{
		{name: "libcni knows cniVersions", wantVersion: "1.1.0", statusAndGC: true,
			load: func(t *testing.T, confDir string) *libcni.NetworkConfigList {
				list, err := libcni.LoadNetworkConf(confDir, cnicontract.NetworkName)
				if err != nil {
					t.Fatalf("loading the agent's conflist: %v", err)
				}
				return list
			}},
		{name: "libcni reads cniVersion only", wantVersion: "1.0.0",
			load: func(t *testing.T, confDir string) *libcni.NetworkConfigList {
				return loadWithoutCNIVersions(t, filepath.Join(confDir, cniinstall.ConflistName))
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, nodeOpts{})
			confDir := filepath.Join(n.dir, "net.d")
			conf, err := cnicontract.NewConflist(cnicontract.NewestVersion, cnicontract.NetConf{
				PodCIDR: n.block.String(), MTU: 1450, DataDir: n.ipamDir, ReadyFile: n.readyFile, LogFile: n.logFile,
			})
			if err != nil {
				t.Fatal(err)
			}
			// Replaces the harness's conflist with the agent's, written as the agent writes it.
			if _, err := cniinstall.WriteConflist(confDir, conf); err != nil {
				t.Fatal(err)
			}
			n.list = tc.load(t, confDir)
			if n.list.CNIVersion != tc.wantVersion || len(n.list.Plugins) != 2 {
				t.Fatalf("the runtime runs the conflist at %s with %d plugins, want %s with trellis and portmap", n.list.CNIVersion, len(n.list.Plugins), tc.wantVersion)
			}
			path := []string{pluginDir, tools}
			n.cni = libcni.NewCNIConfigWithCacheDir(path, filepath.Join(n.dir, "cache"), nil)

			info, err := n.cni.GetVersionInfo(context.Background(), cnicontract.PluginType)
			if err != nil || !slices.Contains(info.SupportedVersions(), "1.1.0") || !slices.Contains(info.SupportedVersions(), tc.wantVersion) {
				t.Fatalf("the plugin's VERSION: %v, %v; want 1.1.0 and %s among them", info, err, tc.wantVersion)
			}

			kept, leaked := n.newPod("kept"), n.newPod("leaked")
			_, res := n.mustAdd(kept)
			if res.Version() != tc.wantVersion {
				t.Errorf("ADD result version %s, want %s", res.Version(), tc.wantVersion)
			}
			// An allocation the runtime's cache doesn't hold (its ADD went through another
			// cache): only the plugin's own GC can find it.
			other := libcni.NewCNIConfigWithCacheDir(path, filepath.Join(n.dir, "other-cache"), nil)
			if err := n.in(func() error {
				_, err := other.AddNetworkList(context.Background(), n.list, n.rt(leaked))
				return err
			}); err != nil {
				t.Fatalf("ADD %s: %v", leaked.name, err)
			}

			// No ready file yet: a STATUS that reaches the plugin fails with code 50.
			err = n.status()
			var cniErr *types.Error
			switch {
			case tc.statusAndGC && (!errors.As(err, &cniErr) || cniErr.Code != types.ErrPluginNotAvailable):
				t.Errorf("STATUS before the agent is ready: %v, want code %d (the plugin was asked)", err, types.ErrPluginNotAvailable)
			case !tc.statusAndGC && err != nil:
				t.Errorf("STATUS at %s: %v, want none sent", tc.wantVersion, err)
			}
			if err := os.WriteFile(n.readyFile, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := n.status(); err != nil {
				t.Errorf("STATUS once ready: %v", err)
			}

			if err := n.gc(kept); err != nil {
				t.Fatalf("GC: %v", err)
			}
			if got, want := len(n.allocations()), map[bool]int{true: 1, false: 2}[tc.statusAndGC]; got != want {
				t.Errorf("after GC keeping %s: %d allocations %v, want %d (GC sent to the plugin: %v)", kept.name, got, n.allocations(), want, tc.statusAndGC)
			}
			if err := n.check(kept); err != nil {
				t.Errorf("CHECK of the kept pod after GC: %v", err)
			}

			if err := n.del(kept, true); err != nil {
				t.Fatalf("DEL %s: %v", kept.name, err)
			}
			if err := n.in(func() error { return other.DelNetworkList(context.Background(), n.list, n.rt(leaked)) }); err != nil {
				t.Fatalf("DEL %s: %v", leaked.name, err)
			}
			n.assertClean()
		})
	}
}

// loadWithoutCNIVersions loads a conflist as a libcni older than 1.2 does: the cniVersions
// key means nothing to it, so the conflist runs at cniVersion.
func loadWithoutCNIVersions(t *testing.T, file string) *libcni.NetworkConfigList {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatalf("parsing %s: %v", file, err)
	}
	if _, ok := raw["cniVersions"]; !ok {
		t.Fatalf("%s has no cniVersions: %s", file, b)
	}
	delete(raw, "cniVersions")
	if b, err = json.Marshal(raw); err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatalf("loading %s without cniVersions: %v", file, err)
	}
	return list
}
