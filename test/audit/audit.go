// Package audit reads a kube-apiserver audit log and checks RBAC roles against it: which
// grants the calls of a user used, and which calls were refused. test/rbac (the operator,
// on a test control plane) and the e2e tests (the agent, on the local cluster) use it to
// hold the roles to what the code calls.
package audit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
)

// Policy is an audit policy that logs, at Metadata level, the requests of the members of
// the groups (e.g. system:serviceaccounts:trellis-system) and nothing else.
func Policy(groups ...string) string {
	quoted := make([]string, len(groups))
	for i, g := range groups {
		quoted[i] = fmt.Sprintf("%q", g)
	}
	return `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: [` + strings.Join(quoted, ", ") + `]
- level: None
`
}

// Call is one API request, as the audit log tells it.
type Call struct {
	Verb, Group, Resource, Namespace, Name string // Resource includes "/subresource"
	URI, UserAgent                         string
	Code                                   int
}

func (c Call) String() string {
	return fmt.Sprintf("%s %s %s %s/%s -> %d (%s)", c.Verb, c.Group, c.Resource, c.Namespace, c.Name, c.Code, c.URI)
}

// Read returns the resource requests of user in the audit log at path (one per request:
// its ResponseComplete event, or ResponseStarted for a watch still open).
func Read(path, user string) ([]Call, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the audit log: %w", err)
	}
	defer f.Close()
	var calls []Call
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e struct {
			AuditID, Stage, Verb, RequestURI, UserAgent string
			User                                        struct{ Username string }
			ObjectRef                                   *struct{ Resource, Subresource, Namespace, Name, APIGroup string }
			ResponseStatus                              *struct{ Code int }
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("audit log %s: line %.200q: %w", path, sc.Text(), err)
		}
		if e.User.Username != user || e.ObjectRef == nil || e.ResponseStatus == nil || seen[e.AuditID] {
			continue
		}
		seen[e.AuditID] = true // a watch logs ResponseStarted, then ResponseComplete
		res := e.ObjectRef.Resource
		if e.ObjectRef.Subresource != "" {
			res += "/" + e.ObjectRef.Subresource
		}
		calls = append(calls, Call{Verb: e.Verb, Group: e.ObjectRef.APIGroup, Resource: res,
			Namespace: e.ObjectRef.Namespace, Name: e.ObjectRef.Name, URI: e.RequestURI, UserAgent: e.UserAgent,
			Code: e.ResponseStatus.Code})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the audit log %s: %w", path, err)
	}
	return calls, nil
}

// Refused are the calls RBAC (or admission) refused with 403.
func Refused(calls []Call) []Call {
	var out []Call
	for _, c := range calls {
		if c.Code == http.StatusForbidden {
			out = append(out, c)
		}
	}
	return out
}

// Role is a Role or ClusterRole's rules (Namespace empty for a ClusterRole).
type Role struct {
	Kind, Name, Namespace string
	Rules                 []rbacv1.PolicyRule
}

// Grant is one verb on one resource of a role's rule.
type Grant struct {
	Role                  *Role
	Group, Resource, Verb string
	Names                 []string // the rule's resourceNames; empty: any
}

// Key is "group resource verb", the form exemption lists use.
func (g Grant) Key() string { return g.Group + " " + g.Resource + " " + g.Verb }

func (g Grant) String() string {
	s := fmt.Sprintf("%s %s grants %s on %s %s", g.Role.Kind, g.Role.Name, g.Verb, g.Group, g.Resource)
	if g.Role.Namespace != "" {
		s += " in " + g.Role.Namespace
	}
	if len(g.Names) > 0 {
		s += fmt.Sprintf(" %v", g.Names)
	}
	return s
}

// Grants lists every verb on every resource the roles grant.
func Grants(roles []Role) []Grant {
	var out []Grant
	for i := range roles {
		for _, rule := range roles[i].Rules {
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					for _, v := range rule.Verbs {
						out = append(out, Grant{Role: &roles[i], Group: g, Resource: res, Verb: v, Names: rule.ResourceNames})
					}
				}
			}
		}
	}
	return out
}

// UsedBy says whether a call that was allowed falls under the grant. Two calls use a
// grant of another verb than the one the audit log shows: a server-side apply that created
// its object (a patch answered 201) is authorised as a create of that name too, and an
// informer's streaming list (a watch with sendInitialEvents) stands for the LIST client-go
// falls back to where the server does not stream.
func (g Grant) UsedBy(calls []Call) bool {
	for _, c := range calls {
		verb := c.Verb
		switch {
		case g.Verb == "create" && verb == "patch" && c.Code == http.StatusCreated:
			verb = "create"
		case g.Verb == "list" && verb == "watch" && strings.Contains(c.URI, "sendInitialEvents=true"):
			verb = "list"
		}
		if c.Code == http.StatusForbidden || c.Group != g.Group || c.Resource != g.Resource || verb != g.Verb {
			continue
		}
		if g.Role.Namespace != "" && c.Namespace != g.Role.Namespace {
			continue
		}
		if len(g.Names) > 0 && !slices.Contains(g.Names, c.Name) {
			continue
		}
		return true
	}
	return false
}

// NamelessWrites are writes no role can limit by name, with why: events get generated
// names, and a review is not a stored object. Keys are Grant.Key()s.
var NamelessWrites = map[string]string{
	" events create":                                   "events are created under generated names",
	" events patch":                                    "events are created under generated names",
	"events.k8s.io events create":                      "events are created under generated names",
	"events.k8s.io events patch":                       "events are created under generated names",
	"authentication.k8s.io tokenreviews create":        "a review is not a stored object",
	"authorization.k8s.io subjectaccessreviews create": "a review is not a stored object",
}

// Unlimited says why the grant may be for any name, from NamelessWrites or more (the
// caller's own list), or "" if it must be limited by resourceNames. Reads and grants
// limited by name always may.
func (g Grant) Unlimited(more map[string]string) (why string, ok bool) {
	if !IsWrite(g.Verb) || len(g.Names) > 0 {
		return "", true
	}
	if why, ok := NamelessWrites[g.Key()]; ok {
		return why, true
	}
	why, ok = more[g.Key()]
	return why, ok
}

// IsWrite says whether verb changes objects.
func IsWrite(verb string) bool {
	return slices.Contains([]string{"create", "update", "patch", "delete", "deletecollection", "*"}, verb)
}

// Holds says whether rules grant verb on group/resource (for any name).
func Holds(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) && len(r.ResourceNames) == 0 {
			return true
		}
	}
	return false
}
