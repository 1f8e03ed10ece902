package blocks

import (
	"slices"
	"sync"
	"time"
)

// Pending remembers the blocks the operator wrote (or read live) that its cache may not
// show yet, so that no pass hands a block out twice while the informer lags: the
// ReplicaSet controller's expectations, kept per node. The cache becomes the authority
// for a node's block once it shows that node's NodeNetwork; a claim it never shows (the
// object was created and deleted between two relists) is checked against the API server
// after a while rather than dropped on a timer, since dropping it blind could free a block
// that is still held. Safe for concurrent use.
type Pending struct {
	mu     sync.Mutex
	byNode map[string]claim
}

type claim struct {
	cidrs []string
	since time.Time
}

// Add records that node's NodeNetwork holds (or is being created or updated with) the
// blocks cidrs, as of now.
func (p *Pending) Add(node string, cidrs []string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byNode == nil {
		p.byNode = map[string]claim{}
	}
	p.byNode[node] = claim{cidrs: slices.Clone(cidrs), since: now}
}

// Forget drops node's claim: its NodeNetwork is known not to exist, or not to hold the
// block recorded for it.
func (p *Pending) Forget(node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.byNode, node)
}

// Has says whether node has a claim.
func (p *Pending) Has(node string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.byNode[node]
	return ok
}

// Len is the number of claims the cache does not show yet.
func (p *Pending) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byNode)
}

// Observe drops the claims the cache shows (node's NodeNetwork with the claimed blocks): it
// is their authority from now on. A claim whose node the cache shows with other blocks
// (an older NodeNetwork of the same name, or one not yet updated) stays.
func (p *Pending) Observe(inCache func(node string, cidrs []string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for node, c := range p.byNode {
		if inCache(node, c.cidrs) {
			delete(p.byNode, node)
		}
	}
}

// Due lists the nodes whose claim is older than after (a claim Added with a zero time is
// due at once): the caller reads those NodeNetworks from the API server and Adds or
// Forgets them.
func (p *Pending) Due(now time.Time, after time.Duration) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var due []string
	for node, c := range p.byNode {
		if now.Sub(c.since) >= after {
			due = append(due, node)
		}
	}
	return due
}

// NextDue is how long until the first claim is Due (0 if one is already); false when
// there is no claim.
func (p *Pending) NextDue(now time.Time, after time.Duration) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	next, found := time.Duration(0), false
	for _, c := range p.byNode {
		d := max(after-now.Sub(c.since), 0)
		if !found || d < next {
			next, found = d, true
		}
	}
	return next, found
}

// Held returns the claims as blocks still held.
func (p *Pending) Held() []Existing {
	p.mu.Lock()
	defer p.mu.Unlock()
	held := make([]Existing, 0, len(p.byNode))
	for node, c := range p.byNode {
		held = append(held, Existing{Node: node, CIDRs: slices.Clone(c.cidrs)})
	}
	return held
}
