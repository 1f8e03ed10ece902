// Package config is internal/agentconfig under its old name, for agent/policy alone: it
// goes once agent/policy imports internal/agentconfig (the operator and the rest of the
// agent do).
package config

import "github.com/trellis-net/trellis/internal/agentconfig"

// The agent configuration's types, constants and functions: internal/agentconfig's.
type (
	Config        = agentconfig.Config
	NetworkPolicy = agentconfig.NetworkPolicy
	DenyLogs      = agentconfig.DenyLogs
	VXLAN         = agentconfig.VXLAN
)

const (
	FileName                  = agentconfig.FileName
	DenyLogsAnnotated         = agentconfig.DenyLogsAnnotated
	DenyLogsAll               = agentconfig.DenyLogsAll
	DenyLogsOff               = agentconfig.DenyLogsOff
	DefaultDenyLogLines       = agentconfig.DefaultDenyLogLines
	TXChecksumOffloadAuto     = agentconfig.TXChecksumOffloadAuto
	TXChecksumOffloadEnabled  = agentconfig.TXChecksumOffloadEnabled
	TXChecksumOffloadDisabled = agentconfig.TXChecksumOffloadDisabled
)

var (
	ZapLevel = agentconfig.ZapLevel
	Load     = agentconfig.Load
)
