// Package docs embeds the user documentation the tools quote, so that what `kubectl trellis
// status` tells a user to do is the text of docs/conditions.md, never a second copy.
package docs

import _ "embed"

// Conditions is docs/conditions.md: every condition reason with its meaning and what to do.
//
//go:embed conditions.md
var Conditions string
