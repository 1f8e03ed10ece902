// Package docs keeps the documentation's reference tables true to the code.
package docs

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The code that sets conditions: the API types, the operator and the agent.
var codeDirs = []string{"api", "controllers", "agent", "internal", "cmd"}

// TestConditionTableComplete: every condition type and reason the code declares is in
// docs/conditions.md, and every one listed there is declared. Reasons must be constants
// named Reason* (condition types Condition* in api/v1alpha1, and for the ClusterNetworkPolicy
// API, which isn't ours, ConditionPolicy* in controllers), so a string literal set as a
// condition's Reason is an error too: it would slip past this test.
func TestConditionTableComplete(t *testing.T) {
	root := filepath.Join("..", "..")
	code := scanCode(t, root)
	doc := scanDoc(t, filepath.Join(root, "docs", "conditions.md"))

	for _, l := range code.literals {
		t.Errorf("%s: a condition Reason set from a string literal; declare it as a Reason* constant and list it in docs/conditions.md", l)
	}
	compare(t, "reason", code.reasons, doc.reasons)
	compare(t, "condition type", code.types, doc.types)
}

func compare(t *testing.T, what string, code map[string]string, doc map[string]bool) {
	t.Helper()
	for v, where := range code {
		if !doc[v] {
			t.Errorf("%s %q (%s) is not in docs/conditions.md: add a row saying what it means and what to do", what, v, where)
		}
	}
	for v := range doc {
		if _, ok := code[v]; !ok {
			t.Errorf("docs/conditions.md lists %s %q, which the code does not declare: remove the row", what, v)
		}
	}
}

type codeFacts struct {
	reasons, types map[string]string // value -> where declared
	literals       []string          // positions of Reason: "literal"
}

func scanCode(t *testing.T, root string) codeFacts {
	t.Helper()
	facts := codeFacts{reasons: map[string]string{}, types: map[string]string{}}
	fset := token.NewFileSet()
	for _, dir := range codeDirs {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			apiTypes := strings.HasPrefix(rel, filepath.Join("api", "v1alpha1"))
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.ValueSpec:
					for i, name := range n.Names {
						if i >= len(n.Values) {
							break
						}
						v, ok := stringLit(n.Values[i])
						if !ok {
							continue
						}
						where := rel + ": " + name.Name
						switch {
						case isNamed(name.Name, "Reason"):
							facts.reasons[v] = where
						case apiTypes && isNamed(name.Name, "Condition"), isNamed(name.Name, "ConditionPolicy"):
							facts.types[v] = where
						}
					}
				case *ast.KeyValueExpr:
					if k, ok := n.Key.(*ast.Ident); ok && k.Name == "Reason" {
						if _, ok := stringLit(n.Value); ok {
							facts.literals = append(facts.literals, fset.Position(n.Pos()).String())
						}
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatalf("reading the code under %s: %v", dir, err)
		}
	}
	if len(facts.reasons) < 10 || len(facts.types) < 3 {
		t.Fatalf("found only %d reasons and %d condition types in %v: the scan is broken", len(facts.reasons), len(facts.types), codeDirs)
	}
	return facts
}

// isNamed: ReasonFoo, not Reasons or ReasonableDefault.
func isNamed(name, prefix string) bool {
	rest, ok := strings.CutPrefix(name, prefix)
	return ok && rest != "" && rest[0] >= 'A' && rest[0] <= 'Z'
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	v, err := strconv.Unquote(lit.Value)
	return v, err == nil
}

type docFacts struct {
	reasons, types map[string]bool
}

var (
	typeHeading = regexp.MustCompile("^### `([A-Za-z]+)`$")
	reasonRow   = regexp.MustCompile("^\\| `([A-Za-z]+)` \\|")
)

// scanDoc reads the condition types (### `Type` headings) and reasons (first cell of a
// table row) of the page.
func scanDoc(t *testing.T, path string) docFacts {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("the condition table: %v", err)
	}
	defer f.Close()
	facts := docFacts{reasons: map[string]bool{}, types: map[string]bool{}}
	var rowsOutsideType []string
	inType := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if m := typeHeading.FindStringSubmatch(line); m != nil {
			facts.types[m[1]], inType = true, true
			continue
		}
		if strings.HasPrefix(line, "## ") {
			inType = false
		}
		if m := reasonRow.FindStringSubmatch(line); m != nil {
			facts.reasons[m[1]] = true
			if !inType {
				rowsOutsideType = append(rowsOutsideType, m[1])
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	if len(rowsOutsideType) > 0 {
		slices.Sort(rowsOutsideType)
		t.Errorf("docs/conditions.md: reasons %v are not under a condition type heading (### `Type`)", rowsOutsideType)
	}
	return facts
}
