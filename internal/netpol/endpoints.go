package netpol

import (
	"net/netip"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Announcement is what the CNI plugin said of a pod it wired: authoritative for the pod's
// address and veth on this node, whatever the API server's copy says (a re-created sandbox
// has a new address before the status shows it).
type Announcement struct {
	Pod   types.NamespacedName `json:"pod"`
	UID   types.UID            `json:"uid,omitempty"`
	IP    netip.Addr           `json:"ip"`
	Iface string               `json:"hostInterface"`
	At    time.Time            `json:"at"`
}

// Endpoints attributes this node's pod veths to pods. The kernel's host routes (wired: pod
// address -> host veth, /32 and /128) say which veths exist and which addresses each one
// carries, one per family; the plugin's announcement of a veth names its pod and is
// authoritative for the address it gives, over the API server's copy (a re-created sandbox
// has a new address before the status shows it), and the kernel's routes through that
// veth give the pod's address of the other family. A veth without an Announcement (wired
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
func Endpoints(node string, pods []*Pod, wired map[netip.Addr]string, announced map[string]Announcement, now time.Time, fresh time.Duration) ([]Endpoint, []*Pod) {
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
	owned := func(a Announcement) bool {
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
