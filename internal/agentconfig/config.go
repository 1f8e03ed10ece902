// Package agentconfig is the node agent's configuration, a contract between the operator
// and the agent: the operator renders it from the ClusterNetwork into the agent ConfigMap
// (controllers/render), the agent reads it at start (Load). The operator imports nothing of
// the agent's but this. It is pure but for Load's file read.
package agentconfig

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/trellis-net/trellis/internal/ipfamily"
)

// FileName is the key of the configuration in the agent ConfigMap and the file name the
// agent reads it from.
const FileName = "config.json"

// Config is the agent configuration. Changing any field but the deny log settings changes
// the config hash on the agent pod template and so rolls the agent DaemonSet: a field
// belongs here only if the agent acts on it (config_test.go holds every field to a test
// that shows its effect).
type Config struct {
	PodCIDRs      []string `json:"podCIDRs"`
	Encapsulation string   `json:"encapsulation"`
	VXLAN         VXLAN    `json:"vxlan"`
	MTU           int32    `json:"mtu"`
	NATOutgoing   bool     `json:"natOutgoing"`
	// LogLevel is the agent's log level (spec.agent.logLevel) unless --zap-log-level is given.
	LogLevel string `json:"logLevel"`
	// NodeIPInterface, when set, is the interface the node's underlay address is taken from.
	NodeIPInterface string `json:"nodeIPInterface,omitempty"`
	// RemoveOtherCNIConfigs: delete other CNIs' configurations once trellis's is written.
	RemoveOtherCNIConfigs bool `json:"removeOtherCNIConfigs,omitempty"`
	// NetworkPolicy enforcement (spec.networkPolicy).
	NetworkPolicy NetworkPolicy `json:"networkPolicy"`
}

// NetworkPolicy settings.
type NetworkPolicy struct {
	// Enabled: the agent enforces NetworkPolicy and the conflist makes every new pod wait
	// for its policies; off, the agent removes every policy rule and set.
	Enabled bool `json:"enabled"`
	// SetupTimeout bounds how long a new pod's setup waits for its policies, a Go
	// duration ("10s").
	SetupTimeout string `json:"setupTimeout,omitempty"`
	// DenyLogs is spec.networkPolicy.denyLogs: the agent starts with it, then follows the
	// ClusterNetwork's (agent/policy ClusterDenyLog), so it is left out of the config hash
	// and its edit rolls no agent. Agents that predate that read it at start only.
	DenyLogs DenyLogs `json:"denyLogs"`
	// Dataplane is spec.dataplane: Auto, NFTables or IPTables ("" is IPTables).
	Dataplane string `json:"dataplane,omitempty"`
}

// DenyLogs settings: which namespaces' denied connection attempts the agent logs, and
// how many lines a second at most.
type DenyLogs struct {
	// Mode is Annotated, All or Off (api/v1alpha1 DenyLogsMode); "" (an operator that
	// predates deny logs) is Annotated.
	Mode string `json:"mode,omitempty"`
	// LinesPerSecond bounds the node's deny log lines; 0 (an older operator) is 100.
	LinesPerSecond int32 `json:"linesPerSecond,omitempty"`
}

// Deny log modes (api/v1alpha1 DenyLogsMode).
const (
	DenyLogsAnnotated = "Annotated"
	DenyLogsAll       = "All"
	DenyLogsOff       = "Off"
	// DefaultDenyLogLines is spec.networkPolicy.denyLogs.linesPerSecond's default.
	DefaultDenyLogLines = 100
)

// Families are the families of the cluster's pod ranges, IPv4 first: pods get addresses
// of these, and policy is enforced for these and compiled for no other. A range that
// doesn't parse counts as both, and no range at all as IPv4 (enforcing a family with no
// pods costs little; missing one would let it through); an IPv4-mapped range is IPv4
// (internal/ipfamily's rule).
func (c *Config) Families() []ipfamily.Family {
	var has ipfamily.Pair[bool]
	for _, s := range c.PodCIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			has = ipfamily.Pair[bool]{V4: true, V6: true}
			break
		}
		has.Set(ipfamily.OfPrefix(p), true)
	}
	if !has.V4 && !has.V6 {
		has.V4 = true
	}
	var out []ipfamily.Family
	for _, f := range ipfamily.All {
		if has.Get(f) {
			out = append(out, f)
		}
	}
	return out
}

// PolicySetupTimeout is NetworkPolicy.SetupTimeout parsed (validated by Load).
func (c *Config) PolicySetupTimeout() time.Duration {
	d, _ := time.ParseDuration(c.NetworkPolicy.SetupTimeout)
	return d
}

// VXLAN settings of the node's VXLAN device.
type VXLAN struct {
	Port int32 `json:"port"`
	VNI  int32 `json:"vni"`
	// TXChecksumOffload is Auto, Enabled or Disabled: the ClusterNetwork's
	// spec.vxlan.txChecksumOffload with the deprecated checksumOffload folded in.
	TXChecksumOffload string `json:"txChecksumOffload"`
}

// TX checksum offload modes (api/v1alpha1 TXChecksumOffloadMode).
const (
	TXChecksumOffloadAuto     = "Auto"
	TXChecksumOffloadEnabled  = "Enabled"
	TXChecksumOffloadDisabled = "Disabled"
)

// logLevels maps the API's log levels (api/v1alpha1 LogLevel) to zap's.
var logLevels = map[string]zapcore.Level{
	"debug": zapcore.DebugLevel,
	"info":  zapcore.InfoLevel,
	"warn":  zapcore.WarnLevel,
	"error": zapcore.ErrorLevel,
}

// ZapLevel is the zap level of a configured log level (debug, info, warn or error).
// debug enables logr's V(1).
func ZapLevel(level string) (zapcore.Level, error) {
	l, ok := logLevels[level]
	if !ok {
		return 0, fmt.Errorf("logLevel %q: want debug, info, warn or error", level)
	}
	return l, nil
}

// Encode renders the configuration deterministically (the config hash depends on it).
func (c *Config) Encode() ([]byte, error) {
	return json.MarshalIndent(c, "", "  ")
}

// Load reads and validates a configuration file.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading agent configuration: %w", err)
	}
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("parsing agent configuration %s: %w", path, err)
	}
	if len(c.PodCIDRs) == 0 {
		return nil, fmt.Errorf("agent configuration %s: podCIDRs is empty", path)
	}
	if _, err := ZapLevel(c.LogLevel); err != nil {
		return nil, fmt.Errorf("agent configuration %s: %w", path, err)
	}
	switch c.VXLAN.TXChecksumOffload {
	case "":
		// Rendered by an operator that predates the field (it had checksumOffload, false
		// unless opted in): Auto, the default.
		c.VXLAN.TXChecksumOffload = TXChecksumOffloadAuto
	case TXChecksumOffloadAuto, TXChecksumOffloadEnabled, TXChecksumOffloadDisabled:
	default:
		return nil, fmt.Errorf("agent configuration %s: vxlan.txChecksumOffload %q: want Auto, Enabled or Disabled (the operator renders it from spec.vxlan.txChecksumOffload)", path, c.VXLAN.TXChecksumOffload)
	}
	switch c.NetworkPolicy.DenyLogs.Mode {
	case "":
		c.NetworkPolicy.DenyLogs.Mode = DenyLogsAnnotated
	case DenyLogsAnnotated, DenyLogsAll, DenyLogsOff:
	default:
		return nil, fmt.Errorf("agent configuration %s: networkPolicy.denyLogs.mode %q: want Annotated, All or Off (the operator renders it from spec.networkPolicy.denyLogs.mode)", path, c.NetworkPolicy.DenyLogs.Mode)
	}
	switch l := c.NetworkPolicy.DenyLogs.LinesPerSecond; {
	case l == 0:
		c.NetworkPolicy.DenyLogs.LinesPerSecond = DefaultDenyLogLines
	case l < 0 || l > 10000:
		return nil, fmt.Errorf("agent configuration %s: networkPolicy.denyLogs.linesPerSecond %d: want 1 to 10000", path, l)
	}
	if c.NetworkPolicy.Enabled {
		if !slices.Contains([]string{"", "Auto", "NFTables", "IPTables"}, c.NetworkPolicy.Dataplane) {
			return nil, fmt.Errorf("agent configuration %s: networkPolicy.dataplane %q: must be Auto, NFTables or IPTables", path, c.NetworkPolicy.Dataplane)
		}
		if d, err := time.ParseDuration(c.NetworkPolicy.SetupTimeout); err != nil || d <= 0 {
			return nil, fmt.Errorf("agent configuration %s: networkPolicy.setupTimeout %q is not a positive duration such as \"10s\"", path, c.NetworkPolicy.SetupTimeout)
		}
	}
	return &c, nil
}
