package netpol

import (
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/trellis-net/trellis/api/v1alpha1"
)

// podSetDef says which members a pod contributes to a set: its address (selector sets) or
// its address with each protocol and port it declares under a name (named ports).
type podSetDef struct {
	// entries appends to out what pod p puts into the set, given the namespaces (no
	// slice per pod: a set is made of every peer's).
	entries func(out []Member, p *Pod, nss map[string]*Namespace) []Member
	// namespace, when set: only pods of this namespace can be members.
	namespace string
	// namespaced: membership depends on namespace labels.
	namespaced bool
	comment    string
}

// computeMembers is a set's sorted, distinct members, computed from every peer.
func computeMembers(def podSetDef, peers []*Pod, nss map[string]*Namespace) []Member {
	var m []Member
	for _, p := range peers {
		m = def.entries(m, p, nss)
	}
	slices.SortFunc(m, Member.Compare)
	return slices.Compact(m)
}

// PeerChange is a peer that changed since the last sync: Old is what it contributed
// before (nil: it wasn't a peer), New what it contributes now (nil: it no longer is).
type PeerChange struct {
	Old, New *Pod
}

// SetMemo keeps the members of pod-derived sets from sync to sync, so that a pod change
// costs work in proportion to the sets and the pods that changed, never a walk over every
// pod in the cluster. Sets no compile used are forgotten.
type SetMemo struct {
	sets map[string]*memoSet
	used map[string]bool
}

type memoSet struct {
	def podSetDef
	// counts: how many peers contribute each entry (two pods may briefly share an IP).
	counts map[Member]int
	sorted []Member
	// stale: counts changed since sorted was built.
	stale bool
}

func NewSetMemo() *SetMemo {
	return &SetMemo{sets: map[string]*memoSet{}, used: map[string]bool{}}
}

// update applies peer changes to every remembered set; namespacesChanged forgets the sets
// whose membership depends on namespace labels (recomputed when next used).
func (m *SetMemo) Update(changes []PeerChange, namespacesChanged bool, nss map[string]*Namespace) {
	var buf []Member
	for key, s := range m.sets {
		if namespacesChanged && s.def.namespaced {
			delete(m.sets, key)
			continue
		}
		for _, ch := range changes {
			if ns := s.def.namespace; ns != "" && (ch.Old == nil || ch.Old.Namespace != ns) && (ch.New == nil || ch.New.Namespace != ns) {
				continue
			}
			if ch.Old != nil {
				buf = s.def.entries(buf[:0], ch.Old, nss)
				for _, e := range buf {
					if s.counts[e]--; s.counts[e] <= 0 {
						delete(s.counts, e)
					}
					s.stale = true
				}
			}
			if ch.New != nil {
				buf = s.def.entries(buf[:0], ch.New, nss)
				for _, e := range buf {
					s.counts[e]++
					s.stale = true
				}
			}
		}
	}
}

// members returns the set's members, from memory or computed once from the peers.
func (m *SetMemo) members(key string, def podSetDef, peers []*Pod, nss map[string]*Namespace) []Member {
	m.used[key] = true
	s := m.sets[key]
	if s == nil {
		s = &memoSet{def: def, counts: map[Member]int{}, stale: true}
		var buf []Member
		for _, p := range peers {
			buf = def.entries(buf[:0], p, nss)
			for _, e := range buf {
				s.counts[e]++
			}
		}
		m.sets[key] = s
	}
	if s.stale {
		// A fresh slice each time it changes: rulesets handed out earlier keep theirs.
		s.sorted, s.stale = nil, false
		if len(s.counts) > 0 {
			s.sorted = slices.SortedFunc(maps.Keys(s.counts), Member.Compare)
		}
	}
	return s.sorted
}

// sweep forgets the sets the last compile didn't use.
func (m *SetMemo) Sweep() {
	for key := range m.sets {
		if !m.used[key] {
			delete(m.sets, key)
		}
	}
	clear(m.used)
}

// PodView remembers, between syncs, the converted pods (by resourceVersion, so that only
// pods that changed are converted again), the peers and the namespaces' labels.
type PodView struct {
	converted  map[types.NamespacedName]convertedPod
	peers      map[types.NamespacedName]*Pod
	namespaces map[string]map[string]string
	// spare maps, cleared and refilled on the next sync instead of allocated anew (at
	// 10,000 pods a map per sync is most of the agent's garbage).
	spareConverted map[types.NamespacedName]convertedPod
	sparePeers     map[types.NamespacedName]*Pod
}

// refill returns spare, emptied, or a new map when there is none.
func refill[K comparable, V any](spare map[K]V, n int) map[K]V {
	if spare == nil {
		return make(map[K]V, n)
	}
	clear(spare)
	return spare
}

type convertedPod struct {
	uid             types.UID
	resourceVersion string
	// net is the NodeNet the pod's addresses were checked against (nil: none known);
	// dropped the addresses that check took away.
	net     *NodeNet
	pod     *Pod
	dropped []netip.Addr
}

// DroppedPodAddr is a pod address taken out of policy: not in its node's pod blocks.
type DroppedPodAddr struct {
	Pod  types.NamespacedName
	Node string
	Addr netip.Addr
	// NodeNetworkKnown: the pod's node has a NodeNetwork (the address is outside its
	// blocks); false: the agent knows no NodeNetwork of that node yet.
	NodeNetworkKnown bool
}

// pods converts the cache's pods, reusing the conversion of every pod whose
// resourceVersion and node's NodeNet are unchanged. With nets (check), each pod keeps only
// the addresses inside its node's pod blocks (trustedPod); the pods whose addresses were
// dropped at this conversion are returned in fresh (to be reported once), and dropped
// counts every address dropped now.
func (v *PodView) Pods(items []*corev1.Pod, nets map[string]*NodeNet, check bool) (out []*Pod, fresh []DroppedPodAddr, dropped int) {
	next := refill(v.spareConverted, len(items))
	out = make([]*Pod, 0, len(items))
	for i := range items {
		it := items[i]
		key := types.NamespacedName{Namespace: it.Namespace, Name: it.Name}
		var net *NodeNet
		if check {
			net = nets[it.Spec.NodeName]
		}
		c, ok := v.converted[key]
		if !ok || c.uid != it.UID || c.resourceVersion != it.ResourceVersion || it.ResourceVersion == "" || c.net != net {
			c = convertedPod{uid: it.UID, resourceVersion: it.ResourceVersion, net: net, pod: PodFrom(it)}
			if check {
				c.pod, c.dropped = trustedPod(c.pod, net)
				for _, a := range c.dropped {
					fresh = append(fresh, DroppedPodAddr{Pod: key, Node: it.Spec.NodeName, Addr: a, NodeNetworkKnown: net != nil})
				}
			}
		}
		dropped += len(c.dropped)
		next[key] = c
		out = append(out, c.pod)
	}
	v.converted, v.spareConverted = next, v.converted
	return out, fresh, dropped
}

// NodeNetView converts NodeNetworks (again only when their resourceVersion changed),
// keeping a node's NodeNet (the same pointer) while its blocks and addresses stay the
// same: the pods of a node are checked again only when those change, not on each write
// of its status. Its maps are updated in place (no per-sync copy of every node's).
type NodeNetView struct {
	nets map[string]*NodeNet
	rv   map[string]string
}

// convert returns the NodeNets by node name; the map is the view's own, valid until the
// next call.
func (v *NodeNetView) Convert(items []*v1alpha1.NodeNetwork) map[string]*NodeNet {
	if v.nets == nil {
		v.nets, v.rv = make(map[string]*NodeNet, len(items)), make(map[string]string, len(items))
	}
	for _, it := range items {
		old := v.nets[it.Name]
		if old != nil && v.rv[it.Name] == it.ResourceVersion && it.ResourceVersion != "" {
			continue
		}
		if n := NodeNetFrom(it); !n.Equal(old) {
			v.nets[it.Name] = n
		}
		v.rv[it.Name] = it.ResourceVersion
	}
	if len(v.nets) > len(items) { // some are gone
		present := make(map[string]bool, len(items))
		for _, it := range items {
			present[it.Name] = true
		}
		for name := range v.nets {
			if !present[name] {
				delete(v.nets, name)
				delete(v.rv, name)
			}
		}
	}
	return v.nets
}

// peerChanges compares the peers with the last sync's.
func (v *PodView) PeerChanges(peers []*Pod) []PeerChange {
	next := refill(v.sparePeers, len(peers))
	var changes []PeerChange
	for _, p := range peers {
		key := p.Key()
		next[key] = p
		if old := v.peers[key]; old != p {
			changes = append(changes, PeerChange{Old: old, New: p})
		}
	}
	for key, old := range v.peers {
		if _, ok := next[key]; !ok {
			changes = append(changes, PeerChange{Old: old})
		}
	}
	v.peers, v.sparePeers = next, v.peers
	return changes
}

// namespacesChanged reports whether any namespace came, went or changed labels.
func (v *PodView) NamespacesChanged(nss []*Namespace) bool {
	next := make(map[string]map[string]string, len(nss))
	changed := len(nss) != len(v.namespaces)
	for _, n := range nss {
		next[n.Name] = n.Labels
		if old, ok := v.namespaces[n.Name]; !changed && (!ok || !maps.Equal(old, n.Labels)) {
			changed = true
		}
	}
	v.namespaces = next
	return changed
}

func (st State) NamespaceMap() map[string]*Namespace {
	m := make(map[string]*Namespace, len(st.Namespaces))
	for _, n := range st.Namespaces {
		m[n.Name] = n
	}
	return m
}
