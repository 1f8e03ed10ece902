package main

import (
	"bytes"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

// kernelModules are what kubectl-trellis must not link (issue #38): it runs where kubectl
// users are, macOS and Windows too, and talks to the API server only. The linter's
// depguard rule "portable" (.golangci.yml) refuses their direct imports in cli/...; this
// test sees the indirect ones as well, through any package.
var kernelModules = []string{
	"github.com/vishvananda/netlink",
	"github.com/coreos/go-iptables",
	"github.com/containernetworking/plugins",
}

// TestLinksNoKernelPackages: `go list -deps` of kubectl-trellis, for each GOOS it is
// released for (make dist-cli), holds no package of kernelModules; a failure names the
// import chain that brings each in.
func TestLinksNoKernelPackages(t *testing.T) {
	for _, goos := range []string{"linux", "darwin", "windows"} {
		t.Run(goos, func(t *testing.T) {
			root, imports := listDeps(t, goos)
			for _, chain := range kernelChains(root, imports) {
				t.Errorf("GOOS=%s: kubectl-trellis links %s", goos, strings.Join(chain, " -> "))
			}
		})
	}
}

// listDeps returns this package's import path and every package `go list -deps .` lists
// for goos, each with its imports.
func listDeps(t *testing.T, goos string) (string, map[string][]string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, ".")
	cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH=amd64", "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("GOOS=%s go list -deps: %v\n%s", goos, err, stderr.String())
	}
	imports := map[string][]string{}
	root := ""
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		imports[f[0]] = f[1:]
		root = f[0] // -deps lists a package after its dependencies: the named one last
	}
	if root != "github.com/trellis-net/trellis/cmd/kubectl-trellis" {
		t.Fatalf("GOOS=%s go list -deps . ends with %q, not kubectl-trellis", goos, root)
	}
	return root, imports
}

// kernelChains returns, for each package of kernelModules among root's dependencies, the
// shortest import chain from root to it (breadth first).
func kernelChains(root string, imports map[string][]string) [][]string {
	from := map[string]string{root: ""}
	queue := []string{root}
	var chains [][]string
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if isKernel(p) {
			var chain []string
			for q := p; q != ""; q = from[q] {
				chain = append([]string{q}, chain...)
			}
			chains = append(chains, chain)
			continue
		}
		for _, q := range imports[p] {
			if _, seen := from[q]; !seen {
				from[q] = p
				queue = append(queue, q)
			}
		}
	}
	return chains
}

func isKernel(pkg string) bool {
	for _, m := range kernelModules {
		if pkg == m || strings.HasPrefix(pkg, m+"/") {
			return true
		}
	}
	return false
}

func TestKernelChains(t *testing.T) {
	for _, tc := range []struct {
		name    string
		imports map[string][]string
		want    [][]string
	}{
		{name: "none", imports: map[string][]string{"main": {"cli", "fmt"}, "cli": {"fmt"}, "fmt": nil}},
		{name: "module path prefix only", imports: map[string][]string{"main": {"github.com/vishvananda/netlinkish"}}},
		{
			name: "shortest chain to each, once",
			imports: map[string][]string{
				"main":                           {"cli", "cli/explain"},
				"cli":                            {"cli/explain"},
				"cli/explain":                    {"agent/policy", "github.com/coreos/go-iptables/iptables"},
				"agent/policy":                   {"github.com/vishvananda/netlink", "github.com/coreos/go-iptables/iptables"},
				"github.com/vishvananda/netlink": {"github.com/vishvananda/netlink/nl"},
			},
			want: [][]string{
				{"main", "cli/explain", "github.com/coreos/go-iptables/iptables"},
				{"main", "cli/explain", "agent/policy", "github.com/vishvananda/netlink"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := kernelChains("main", tc.imports); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("kernelChains = %q, want %q", got, tc.want)
			}
		})
	}
}
