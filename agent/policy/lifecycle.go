package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/trellis-net/trellis/internal/cnicontract"
)

// endpoints attributes this node's pod veths to pods. The kernel's host routes (wired: pod
// address -> host veth, /32 and /128) say which veths exist and which addresses each one
// carries, one per family; the plugin's announcement of a veth names its pod and is
// authoritative for the address it gives, over the API server's copy (a re-created sandbox
// has a new address before the status shows it), and the kernel's routes through that
// veth give the pod's address of the other family. A veth without an announcement (wired
// before this agent kept them) belongs to the one pod of this node the API server gives
// its addresses, a pod not being deleted winning over one that is (and no pod when its two
// families name different pods). An announced veth not in the kernel's list yet (the
// plugin asks right after wiring it) counts for fresh seconds, with the announced address
// only. Each pod has at most one endpoint, its latest. Veths left unattributed are unknown
// interfaces, dropped by the rules.
//
// It returns the endpoints and pods, where a pod whose endpoint addresses differ from its
// API copy is replaced by a copy with the endpoint's addresses (so the sets hold the
// addresses the pod really has).
func endpoints(node string, pods []*Pod, wired map[netip.Addr]string, announced map[string]announcement, now time.Time, fresh time.Duration) ([]Endpoint, []*Pod) {
	byKey := map[types.NamespacedName]int{} // this node's pods only
	local := map[netip.Addr][]*Pod{}
	for i, p := range pods {
		if p.NodeName != node {
			continue
		}
		byKey[p.Key()] = i
		if !p.HostNetwork && !p.Finished {
			for _, a := range [2]netip.Addr{p.IP, p.IPv6} {
				if a.IsValid() {
					local[a] = append(local[a], p)
				}
			}
		}
	}
	type claim struct {
		ep Endpoint
		at time.Time // zero: by the API server's copy only
	}
	best := map[types.NamespacedName]claim{}
	offer := func(c claim) {
		if cur, ok := best[c.ep.Pod]; !ok || c.at.After(cur.at) {
			best[c.ep.Pod] = c
		}
	}
	owned := func(a announcement) bool {
		i, ok := byKey[a.Pod]
		if !ok {
			return false // not in the cache yet: the hook is still waiting for it
		}
		p := pods[i]
		return p.NodeName == node && !p.HostNetwork && !p.Finished && (a.UID == "" || p.RuntimeUID() == a.UID)
	}
	// The addresses each veth carries: one per family (the lowest, should a veth carry
	// more, so that the choice doesn't depend on map order).
	wiredIfaces := make(map[string]Endpoint, len(wired))
	for ip, iface := range wired {
		ep := wiredIfaces[iface]
		ep.Interface = iface
		switch {
		case ip.Is4() && (!ep.IP.IsValid() || ip.Less(ep.IP)):
			ep.IP = ip
		case ip.Is6() && (!ep.IPv6.IsValid() || ip.Less(ep.IPv6)):
			ep.IPv6 = ip
		}
		wiredIfaces[iface] = ep
	}
	for iface, ep := range wiredIfaces {
		if a, ok := announced[iface]; ok && (a.IP == ep.IP || a.IP == ep.IPv6) {
			if owned(a) {
				ep.Pod = a.Pod
				offer(claim{ep, a.At})
			}
			continue
		}
		var owner *Pod
		for _, ip := range [2]netip.Addr{ep.IP, ep.IPv6} {
			if !ip.IsValid() {
				continue
			}
			o := soleOwner(local[ip])
			if o == nil || owner != nil && o != owner {
				owner = nil
				break
			}
			owner = o
		}
		if owner != nil {
			ep.Pod = owner.Key()
			offer(claim{ep: ep})
		}
	}
	for iface, a := range announced {
		if _, ok := wiredIfaces[iface]; ok || now.Sub(a.At) > fresh || !owned(a) {
			continue
		}
		ep := Endpoint{Pod: a.Pod, Interface: iface}
		if a.IP.Is4() {
			ep.IP = a.IP
		} else {
			ep.IPv6 = a.IP
		}
		offer(claim{ep, a.At})
	}
	out := make([]Endpoint, 0, len(best))
	var patched []*Pod
	for key, c := range best {
		out = append(out, c.ep)
		p := pods[byKey[key]]
		ip, ip6 := p.IP, p.IPv6
		if c.ep.IP.IsValid() {
			ip = c.ep.IP
		}
		if c.ep.IPv6.IsValid() {
			ip6 = c.ep.IPv6
		}
		if p.IP != ip || p.IPv6 != ip6 {
			if patched == nil {
				patched = append([]*Pod(nil), pods...)
			}
			cp := *p
			cp.IP, cp.IPv6 = ip, ip6
			patched[byKey[key]] = &cp
		}
	}
	if patched != nil {
		pods = patched
	}
	return out, pods
}

// Announcements are kept as one file per host veth: written when the plugin asks,
// removed when the veth is gone.
func announcementPath(dir, iface string) string {
	return filepath.Join(dir, iface+".json")
}

func saveAnnouncement(dir string, a announcement) error {
	if dir == "" {
		return nil
	}
	if !strings.HasPrefix(a.Iface, cnicontract.HostVethPrefix) || strings.ContainsAny(a.Iface, `/\`) {
		return fmt.Errorf("host interface %q is not a trellis pod veth", a.Iface)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("writing the announcement of %s: %w", a.Iface, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), announcementPath(dir, a.Iface)); err != nil {
		return fmt.Errorf("writing the announcement of %s: %w", a.Iface, err)
	}
	return nil
}

func removeAnnouncement(dir, iface string, log logr.Logger) {
	if dir == "" {
		return
	}
	if err := os.Remove(announcementPath(dir, iface)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		log.Error(err, "removing a pod announcement", "interface", iface)
	}
}

// loadAnnouncements reads what an earlier agent recorded; unreadable files are skipped
// (their veths are then judged by the API server's copy).
func loadAnnouncements(dir string, log logr.Logger) []announcement {
	if dir == "" {
		return nil
	}
	files, err := filepath.Glob(filepath.Join(dir, cnicontract.HostVethPrefix+"*.json"))
	if err != nil {
		return nil
	}
	var out []announcement
	for _, f := range files {
		b, err := os.ReadFile(f)
		var a announcement
		if err == nil {
			err = json.Unmarshal(b, &a)
		}
		if err != nil || a.Iface+".json" != filepath.Base(f) || !a.IP.IsValid() {
			log.Error(err, "ignoring an unreadable pod announcement", "file", f)
			continue
		}
		out = append(out, a)
	}
	return out
}

// soleOwner is the one pod among those claiming an address, a pod not being deleted
// winning over those that are; nil when that doesn't decide.
func soleOwner(claims []*Pod) *Pod {
	if len(claims) == 1 {
		return claims[0]
	}
	var live *Pod
	for _, p := range claims {
		if !p.Deleting {
			if live != nil {
				return nil
			}
			live = p
		}
	}
	return live
}
