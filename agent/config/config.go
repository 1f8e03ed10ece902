// Package config is the node agent's configuration: the operator renders it from the
// ClusterNetwork into the agent ConfigMap, the agent reads it at start.
package config

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// FileName is the key of the configuration in the agent ConfigMap and the file name the
// agent reads it from.
const FileName = "config.json"

// Config is the agent configuration. Changing any field changes the config hash on the
// agent pod template and so rolls the agent DaemonSet.
type Config struct {
	PodCIDRs      []string      `json:"podCIDRs"`
	NodeBlockSize int32         `json:"nodeBlockSize"`
	Encapsulation string        `json:"encapsulation"`
	VXLAN         VXLAN         `json:"vxlan"`
	MTU           int32         `json:"mtu"`
	NATOutgoing   bool          `json:"natOutgoing"`
	NetworkPolicy NetworkPolicy `json:"networkPolicy"`
	LogLevel      string        `json:"logLevel"`
	// NodeIPInterface, when set, is the interface the node's underlay address is taken from.
	NodeIPInterface string `json:"nodeIPInterface,omitempty"`
	// RemoveOtherCNIConfigs: delete other CNIs' configurations once trellis's is written.
	RemoveOtherCNIConfigs bool `json:"removeOtherCNIConfigs,omitempty"`
}

// VXLAN settings of the node's VXLAN device.
type VXLAN struct {
	Port            int32 `json:"port"`
	VNI             int32 `json:"vni"`
	ChecksumOffload bool  `json:"checksumOffload"`
}

// NetworkPolicy enforcement settings.
type NetworkPolicy struct {
	Enabled      bool     `json:"enabled"`
	SetupTimeout Duration `json:"setupTimeout"`
}

// Duration is a time.Duration that reads and writes as a Go duration string ("10s").
type Duration struct{ time.Duration }

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"10s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
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
	return &c, nil
}
