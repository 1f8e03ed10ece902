// Package neighbours lists neighbour (ARP) and FDB entries the way
// containernetworking/plugins' netlinksafe lists routes and links: a dump the kernel
// interrupted because the table changed meanwhile (netlink.ErrDumpInterrupted, frequent
// while pods come and go) is retried instead of failing the caller. netlinksafe has no
// NeighList; this is the one thing it lacks that trellis needs.
package neighbours

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

// attempts bounds the retries of an interrupted dump (netlinksafe uses the same number).
const attempts = 5

// List is netlink.NeighList, retried while the dump is interrupted.
func List(linkIndex, family int) ([]netlink.Neigh, error) {
	var err error
	for range attempts {
		var out []netlink.Neigh
		out, err = netlink.NeighList(linkIndex, family)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return out, err
		}
	}
	return nil, fmt.Errorf("listing neighbours of link %d: interrupted %d times: %w", linkIndex, attempts, err)
}
