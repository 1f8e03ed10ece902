package datapath

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// IPSetPrefix starts the name of every ipset trellis owns (NetworkPolicy selectors), so an
// uninstall can find them all and leave everyone else's.
const IPSetPrefix = "trellis-"

// CleanupIPSets destroys every ipset whose name starts with IPSetPrefix. Run it after
// CleanupIPTables: the kernel refuses to destroy a set a rule still references.
func CleanupIPSets() ([]string, error) {
	ipset, err := exec.LookPath("ipset")
	if err != nil {
		return nil, nil // trellis makes its sets with this command: without it there are none
	}
	out, err := exec.Command(ipset, "list", "-name").Output()
	if err != nil {
		return nil, fmt.Errorf("ipset list -name: %w", cmdErr(err))
	}
	var removed []string
	var errs []error
	for _, name := range strings.Fields(string(out)) {
		if !strings.HasPrefix(name, IPSetPrefix) {
			continue
		}
		if out, err := exec.Command(ipset, "destroy", name).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ipset destroy %s: %v: %s", name, err, strings.TrimSpace(string(out))))
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}

func cmdErr(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
	}
	return err
}
