package status

import (
	"strings"
)

// Advice is what docs/conditions.md says of one condition reason.
type Advice struct {
	Meaning  string `json:"meaning,omitempty"`
	WhatToDo string `json:"whatToDo,omitempty"`
}

// adviceKey names a reason of a condition type on a kind ("ClusterNetwork", "NodeNetwork",
// "ClusterNetworkPolicy").
type adviceKey struct{ kind, condition, reason string }

// Guide is docs/conditions.md read as data: the reasons' meanings and next steps.
type Guide map[adviceKey]Advice

// ParseGuide reads the conditions page: "## Kind" sections, "### `Type`" headings and
// tables whose rows are | `Reason` | Status | Set by | Meaning | What to do |.
func ParseGuide(md string) Guide {
	g := Guide{}
	var kind, condition string
	for line := range strings.SplitSeq(md, "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			kind, condition = strings.TrimSpace(line[3:]), ""
		case strings.HasPrefix(line, "### "):
			condition = strings.Trim(strings.TrimSpace(line[4:]), "`")
		case strings.HasPrefix(line, "| `") && condition != "":
			cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
			if len(cells) != 5 {
				continue
			}
			reason := strings.Trim(strings.TrimSpace(cells[0]), "`")
			g[adviceKey{kind, condition, reason}] = Advice{Meaning: clean(cells[3]), WhatToDo: clean(cells[4])}
		}
	}
	return g
}

// clean turns a markdown cell into plain text for a terminal.
func clean(cell string) string {
	return strings.TrimSpace(strings.ReplaceAll(cell, "`", ""))
}

// Lookup finds a reason's advice; a row that only points elsewhere ("See `Available`.",
// with no next step) is completed from the same reason under another condition of the kind.
func (g Guide) Lookup(kind, condition, reason string) Advice {
	a := g[adviceKey{kind, condition, reason}]
	if a.WhatToDo != "" {
		return a
	}
	for k, other := range g {
		if k.kind == kind && k.reason == reason && other.WhatToDo != "" {
			return other
		}
	}
	return a
}
