package bundlegen

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
)

// descriptorDepth is how deep spec and status fields get descriptors: top-level fields and
// the fields of top-level objects (spec.vxlan.port), not deeper (spec.agent.resources is
// one descriptor, not one per quantity).
const descriptorDepth = 2

// Well-known x-descriptors (OLM's UI hints) for fields by name; the rest go by type.
var descriptorsByName = map[string]string{
	"nodeSelector":    "urn:alm:descriptor:com.tectonic.ui:nodeSelector",
	"resources":       "urn:alm:descriptor:com.tectonic.ui:resourceRequirements",
	"imagePullPolicy": "urn:alm:descriptor:com.tectonic.ui:imagePullPolicy",
}

const conditionsDescriptor = "urn:alm:descriptor:io.kubernetes.conditions"

// ownedCRDs is the CSV's customresourcedefinitions.owned: one entry per served version of
// each CRD (OLM keys owned APIs by group, version and kind), the storage version first, with
// spec and status descriptors derived from that version's schema so a new API field shows up
// without editing the base. Entries of base (matched by CRD name) supply displayName,
// description and resources for every version, and their descriptors (matched by path) win
// over the derived ones; a base entry for a CRD or path that no longer exists is an error.
func ownedCRDs(crds []object, base []any) ([]any, error) {
	baseByName := map[string]object{}
	for _, b := range base {
		b, _ := b.(object)
		n, _ := b["name"].(string)
		baseByName[n] = b
	}
	var owned []any
	for _, crd := range crds {
		crdName := name(crd)
		b := baseByName[crdName]
		delete(baseByName, crdName)
		kind, _ := nested[string](crd, "spec", "names", "kind")
		versions, err := servedVersions(crd)
		if err != nil {
			return nil, err
		}
		for _, v := range versions {
			entry := object{
				"name":        crdName,
				"kind":        kind,
				"version":     v.name,
				"displayName": splitWords(kind),
				"description": oneLine(str(v.schema["description"])),
			}
			for _, k := range []string{"displayName", "description", "resources"} {
				if val, ok := b[k]; ok {
					entry[k] = val
				}
			}
			for _, section := range []string{"spec", "status"} {
				sub, _ := nested[object](v.schema, "properties", section)
				derived := descriptors(sub, "", "", section == "spec", descriptorDepth)
				key := section + "Descriptors"
				overrides, _ := b[key].([]any)
				merged, err := mergeDescriptors(derived, overrides)
				if err != nil {
					return nil, fmt.Errorf("%s: %s of %s %s: %w", baseCSVPath, key, crdName, v.name, err)
				}
				if len(merged) > 0 {
					entry[key] = merged
				}
			}
			owned = append(owned, entry)
		}
	}
	for n := range baseByName {
		return nil, fmt.Errorf("%s: owned CRD %q is not rendered by config/default: remove it or fix its name", baseCSVPath, n)
	}
	return owned, nil
}

type crdVersion struct {
	name   string
	schema object
}

// servedVersions returns the CRD's served versions, the storage version first, the others in
// the CRD's order. A CRD whose storage version is not served, or that has none, is an error.
func servedVersions(crd object) ([]crdVersion, error) {
	versions, _ := nested[[]any](crd, "spec", "versions")
	var storage *crdVersion
	var others []crdVersion
	for _, v := range versions {
		v, _ := v.(object)
		schema, _ := nested[object](v, "schema", "openAPIV3Schema")
		cv := crdVersion{str(v["name"]), schema}
		switch {
		case v["storage"] == true && v["served"] != true:
			return nil, fmt.Errorf("CRD %s: storage version %s is not served", name(crd), cv.name)
		case v["storage"] == true:
			storage = &cv
		case v["served"] == true:
			others = append(others, cv)
		}
	}
	if storage == nil {
		return nil, fmt.Errorf("CRD %s has no storage version", name(crd))
	}
	return append([]crdVersion{*storage}, others...), nil
}

// descriptors walks an object schema: one descriptor per field, descending into objects
// with properties while depth allows (the object itself then gets none). A nested field's
// display name starts with its parent's: "VXLAN Port".
func descriptors(schema object, prefix, displayPrefix string, spec bool, depth int) []any {
	props, _ := schema["properties"].(object)
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var out []any
	for _, k := range keys {
		field, _ := props[k].(object)
		path := prefix + k
		_, hasProps := field["properties"].(object)
		if hasProps && depth > 1 && descriptorsByName[k] == "" {
			out = append(out, descriptors(field, path+".", displayPrefix+splitWords(k)+" ", spec, depth-1)...)
			continue
		}
		d := object{
			"path":        path,
			"displayName": displayPrefix + splitWords(k),
		}
		if desc := oneLine(str(field["description"])); desc != "" {
			d["description"] = desc
		}
		if x := xDescriptors(k, field, spec); len(x) > 0 {
			d["x-descriptors"] = x
		}
		out = append(out, d)
	}
	return out
}

// xDescriptors picks the UI hints of a field: conditions, well-known names, then by type
// (spec fields only: status is shown read-only).
func xDescriptors(fieldName string, field object, spec bool) []any {
	if fieldName == "conditions" && field["type"] == "array" {
		return []any{conditionsDescriptor}
	}
	if !spec {
		return nil
	}
	if d, ok := descriptorsByName[fieldName]; ok {
		return []any{d}
	}
	if field["x-kubernetes-int-or-string"] == true {
		return []any{"urn:alm:descriptor:com.tectonic.ui:text"}
	}
	switch field["type"] {
	case "boolean":
		return []any{"urn:alm:descriptor:com.tectonic.ui:booleanSwitch"}
	case "integer":
		return []any{"urn:alm:descriptor:com.tectonic.ui:number"}
	case "string":
		if enum, ok := field["enum"].([]any); ok {
			var out []any
			for _, e := range enum {
				out = append(out, "urn:alm:descriptor:com.tectonic.ui:select:"+str(e))
			}
			return out
		}
		return []any{"urn:alm:descriptor:com.tectonic.ui:text"}
	}
	return nil
}

// mergeDescriptors lays overrides (from the base CSV) over the derived descriptors by path.
func mergeDescriptors(derived, overrides []any) ([]any, error) {
	byPath := map[string]object{}
	for _, d := range derived {
		d := d.(object)
		byPath[str(d["path"])] = d
	}
	for _, o := range overrides {
		o, _ := o.(object)
		d, ok := byPath[str(o["path"])]
		if !ok {
			return nil, fmt.Errorf("descriptor path %q is not a field of the schema (fields deeper than %d levels get none)", str(o["path"]), descriptorDepth)
		}
		for k, v := range o {
			d[k] = v
		}
	}
	return derived, nil
}

// acronyms are written in capitals in display names.
var acronyms = map[string]string{
	"cidr": "CIDR", "cidrs": "CIDRs", "cni": "CNI", "ip": "IP", "mtu": "MTU", "nat": "NAT",
	"vni": "VNI", "vtep": "VTEP", "vxlan": "VXLAN", "ipv4": "IPv4", "ipv6": "IPv6",
}

// splitWords turns a camelCase field or Kind name into a display name:
// podCIDRs → "Pod CIDRs", nodeIPInterface → "Node IP Interface", natOutgoing → "NAT Outgoing",
// nodeIPv6 → "Node IPv6".
func splitWords(s string) string {
	var words []string
	r := []rune(s)
	start := 0
	for i := 1; i < len(r); i++ {
		switch {
		case unicode.IsLower(r[i-1]) && unicode.IsUpper(r[i]):
			// fooBar: a word starts at B.
		case unicode.IsUpper(r[i-1]) && unicode.IsUpper(r[i]) && i+1 < len(r) && unicode.IsLower(r[i+1]) &&
			!(r[i+1] == 's' && (i+2 == len(r) || unicode.IsUpper(r[i+2]))) &&
			!(r[i-1] == 'I' && r[i] == 'P' && r[i+1] == 'v' && i+2 < len(r) && unicode.IsDigit(r[i+2])):
			// IPInterface: a word starts at the I of Interface; CIDRs keeps its plural s.
		default:
			continue
		}
		words = append(words, string(r[start:i]))
		start = i
	}
	words = append(words, string(r[start:]))
	for i, w := range words {
		if a, ok := acronyms[strings.ToLower(w)]; ok {
			words[i] = a
		} else {
			words[i] = strings.ToUpper(w[:1]) + w[1:]
		}
	}
	return strings.Join(words, " ")
}

// oneLine joins a multi-line schema description into one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func str(v any) string {
	s, _ := v.(string)
	return s
}
