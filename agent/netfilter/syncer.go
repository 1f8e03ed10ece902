package netfilter

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/coreos/go-iptables/iptables"
)

// Syncer keeps trellis's chains as a State says. The zero value is ready to use: it
// detects the backend on its first Sync. It is safe for concurrent use (syncs run one at
// a time).
//
// Whether a chain differs is decided against what iptables-save prints, which is not what
// was written (quoting, option order, "-p tcp --dport 80" printed as "-p tcp -m tcp
// --dport 80", "--mark 1" as "--mark 0x1" ...). Rather than normalise every extension's
// output, the syncer remembers, per chain, the hash of the desired rules together with the
// hash of how the kernel printed them right after it wrote them: as long as both hashes
// match, nothing is written, whatever the rules look like. Only a chain it has no memory
// of (the first sync after a restart) is compared rule by rule with a normaliser of the
// common differences (sameRule); a rule it doesn't recognise costs one rewrite, never a
// rewrite per sync.
type Syncer struct {
	// Backend selects the iptables commands. Zero: DetectBackend on the first Sync.
	// Set it before the first Sync; ActiveBackend tells the one in use.
	Backend Backend

	mu     sync.Mutex
	active atomic.Pointer[Backend]
	ipt    *iptables.IPTables
	memo   map[Table]*tableMemo
}

// ActiveBackend is the backend the syncer writes with (for the agent to report: Mode is
// "nft" or "legacy"); zero before the first Sync decided it.
func (s *Syncer) ActiveBackend() Backend {
	if b := s.active.Load(); b != nil {
		return *b
	}
	return Backend{}
}

type tableMemo struct {
	scope  []string        // the Scope of the state the memo is of
	chains map[string]memo // every desired chain, in the kernel since the last sync
	jumps  memo
	// foreign are the chains in scope that others' chains went to at the last read:
	// SyncCached leaves their removal to Sync.
	foreign map[string]bool
}

// memo ties a desired content to the kernel's printing of it. A zero have (written by
// SyncCached, never read back) matches no printing.
type memo struct{ want, have [sha256.Size]byte }

// Result says what a Sync changed. Chains are "table/chain", jumps "table/FROM -> TO".
type Result struct {
	// Restored lists the tables written with iptables-restore (one run each).
	Restored []Table
	Written  []string
	Removed  []string
	// Kept are chains no longer desired that a chain outside the state still goes to:
	// flushed (they return at once), not removed.
	Kept         []string
	JumpsAdded   []string
	JumpsRemoved []string
	// JumpsMoved are First jumps put back at the top of their chain (others' rules had
	// been inserted before them).
	JumpsMoved []string
}

// Changed reports whether the Sync wrote anything.
func (r Result) Changed() bool {
	return len(r.Restored) > 0 || len(r.JumpsAdded) > 0 || len(r.JumpsMoved) > 0
}

// Sync makes the chains of st's scope in st's tables hold exactly st's content: per
// table one iptables-save, and one iptables-restore --noflush when a chain differs, a
// chain in scope is no longer desired, or a jump into one is missing, not desired or (a
// First jump) not at the top of its chain any more; then the missing Append jumps
// (go-iptables). It goes on with the other tables after a failure.
func (s *Syncer) Sync(ctx context.Context, st State) (Result, error) {
	return s.sync(ctx, st, false)
}

// SyncCached is Sync for a caller that syncs on every event and trusts the syncer's
// memory in between: it runs no iptables-save. For each table whose last sync (of a state
// of the same Scope) succeeded, it writes, with one iptables-restore --noflush, the chains
// whose desired rules differ from what it last wrote and removes the chains it wrote that
// are no longer desired; the kernel's copy is not read, so drift, jumps someone removed or
// moved, and changes by others are not seen. Any other table gets a full Sync: one never
// synced, or whose last sync failed, or whose jumps changed, or where a chain to be
// removed had others' rules going to it at the last read, or where the restore failed
// (the memory is dropped first).
//
// So the caller must still run Sync periodically (and after a failure), which bounds how
// long drift lasts; SyncCached costs one restore of what changed, or nothing.
func (s *Syncer) SyncCached(ctx context.Context, st State) (Result, error) {
	return s.sync(ctx, st, true)
}

func (s *Syncer) sync(ctx context.Context, st State, cached bool) (Result, error) {
	if err := st.Validate(); err != nil {
		return Result{}, fmt.Errorf("netfilter state: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Backend.Mode == "" {
		b, err := DetectBackend()
		if err != nil {
			return Result{}, err
		}
		s.Backend = b
	}
	if s.active.Load() == nil {
		b := s.Backend
		s.active.Store(&b)
	}
	if s.memo == nil {
		s.memo = map[Table]*tableMemo{}
	}
	var res Result
	var errs []error
	for _, table := range Tables {
		ts, ok := st.Tables[table]
		if !ok {
			continue
		}
		if cached && s.syncTableCached(ctx, st, table, ts, &res) {
			continue
		}
		if err := s.syncTable(ctx, st, table, ts, &res); err != nil {
			delete(s.memo, table) // compare afresh next time
			errs = append(errs, fmt.Errorf("%s table: %w", table, err))
		}
	}
	return res, errors.Join(errs...)
}

// syncTableCached writes what differs from the memo of table, if it can tell from the memo
// alone; false: the table needs a full sync.
func (s *Syncer) syncTableCached(ctx context.Context, st State, table Table, ts TableState, res *Result) bool {
	m := s.memo[table]
	if m == nil || !slices.Equal(m.scope, st.Scope) || m.jumps.want != hashJumps(ts.Jumps) {
		return false
	}
	var p restorePlan
	want := make(map[string][sha256.Size]byte, len(ts.Chains))
	for _, c := range ts.Chains {
		h := hashRules(c.Rules)
		want[c.Name] = h
		if old, ok := m.chains[c.Name]; !ok || old.want != h {
			p.write = append(p.write, c)
		}
	}
	var stale []string
	for c := range m.chains {
		if _, ok := want[c]; ok {
			continue
		}
		if m.foreign[c] {
			return false // kept or removed: Sync reads who still goes to it
		}
		stale = append(stale, c)
	}
	slices.Sort(stale) // map order: keep the restore (and Result) deterministic
	p.flush, p.remove = stale, stale
	if p.empty() {
		return true
	}
	if err := s.restore(ctx, renderRestore(table, p)); err != nil {
		delete(s.memo, table)
		return false
	}
	res.Restored = append(res.Restored, table)
	for _, c := range p.write {
		res.Written = append(res.Written, string(table)+"/"+c.Name)
		m.chains[c.Name] = memo{want: want[c.Name]} // the printing: at the next Sync
	}
	for _, c := range p.remove {
		res.Removed = append(res.Removed, string(table)+"/"+c)
		delete(m.chains, c)
	}
	return true
}

func (s *Syncer) syncTable(ctx context.Context, st State, table Table, ts TableState, res *Result) error {
	out, err := s.save(ctx, table)
	if err != nil {
		return err
	}
	d := parseSave(out, st.inScope)
	m := s.memo[table]
	if m == nil || !slices.Equal(m.scope, st.Scope) {
		m = &tableMemo{scope: slices.Clone(st.Scope), chains: map[string]memo{}}
		s.memo[table] = m
	}
	p := plan(table, ts, d, m)
	for _, c := range p.kept {
		res.Kept = append(res.Kept, string(table)+"/"+c)
	}
	changed, jumpsChanged := false, len(p.unjumped) > 0
	if !p.restore.empty() {
		if err := s.restore(ctx, renderRestore(table, p.restore)); err != nil {
			return err
		}
		changed = true
		jumpsChanged = jumpsChanged || len(p.restore.first) > 0
		res.Restored = append(res.Restored, table)
		for _, c := range p.restore.write {
			res.Written = append(res.Written, string(table)+"/"+c.Name)
		}
		for _, c := range p.restore.remove {
			res.Removed = append(res.Removed, string(table)+"/"+c)
		}
		for _, l := range p.unjumped {
			res.JumpsRemoved = append(res.JumpsRemoved, fmt.Sprintf("%s/%s -> %s", table, l.from, l.to))
		}
		res.JumpsAdded = append(res.JumpsAdded, p.added...)
		res.JumpsMoved = append(res.JumpsMoved, p.moved...)
	}
	for _, j := range p.missing {
		added, err := s.ensureJump(table, j)
		if err != nil {
			return err
		}
		if added {
			changed, jumpsChanged = true, true
			res.JumpsAdded = append(res.JumpsAdded, jumpName(table, j))
		}
	}
	// Every desired chain and jump now matches the kernel's copy: remember its printing,
	// as compared (so a change by someone else since is still seen next time) or, for what
	// was just written, as the kernel prints it now.
	after := d
	if changed {
		if out, err = s.save(ctx, table); err != nil {
			return err
		}
		after = parseSave(out, st.inScope)
	}
	written := make(map[string]bool, len(p.restore.write))
	for _, c := range p.restore.write {
		written[c.Name] = true
	}
	m.chains = make(map[string]memo, len(ts.Chains))
	for _, c := range ts.Chains {
		seen := d
		if written[c.Name] {
			seen = after
		}
		m.chains[c.Name] = memo{want: hashRules(c.Rules), have: hashLines(seen.rules[c.Name])}
	}
	seen := d
	if jumpsChanged {
		seen = after
	}
	m.jumps = memo{want: hashJumps(ts.Jumps), have: hashJumpLines(seen.jumps)}
	m.foreign = make(map[string]bool, len(after.foreign))
	for c := range after.foreign {
		m.foreign[c] = true
	}
	return nil
}

func jumpName(table Table, j Jump) string {
	return fmt.Sprintf("%s/%s -> %s", table, j.From, j.To)
}

// tablePlan is what a table needs: one restore, then the missing Append jumps.
type tablePlan struct {
	restore  restorePlan
	unjumped []jumpLine // the jumps restore.unjump deletes for good
	added    []string   // First jumps restore.first adds ("table/FROM -> TO")
	moved    []string   // First jumps restore.first moves back to the top
	missing  []Jump     // Append jumps to add after the restore
	kept     []string
}

// plan compares the desired content of a table with the kernel's.
func plan(table Table, ts TableState, d tableDump, m *tableMemo) tablePlan {
	var p tablePlan
	want := make(map[string]bool, len(ts.Chains))
	for _, c := range ts.Chains {
		want[c.Name] = true
		if !d.chains[c.Name] || !sameChain(c, d.rules[c.Name], m.chains[c.Name]) {
			p.restore.write = append(p.restore.write, c)
		}
	}
	for _, c := range d.scoped {
		if want[c] {
			continue
		}
		if len(d.foreign[c]) == 0 {
			p.restore.flush = append(p.restore.flush, c)
			p.restore.remove = append(p.restore.remove, c)
			continue
		}
		// Never touch others' chains: the chain stays, empty, until they stop using it.
		p.kept = append(p.kept, c)
		if len(d.rules[c]) > 0 {
			p.restore.flush = append(p.restore.flush, c)
		}
	}
	p.planJumps(table, ts.Jumps, d, m)
	return p
}

// planJumps compares the desired jumps with the kernel's: stale ones and second copies
// are deleted, missing Append ones added after the restore. The First jumps of a chain
// must be its leading rules (only jumps into trellis chains before them), in the state's
// order; where they are not, the restore deletes them and inserts them all at the top
// again, as Calico's felix does: kube-proxy and others insert their own rules at the top.
func (p *tablePlan) planJumps(table Table, jumps []Jump, d tableDump, m *tableMemo) {
	if m.jumps == (memo{want: hashJumps(jumps), have: hashJumpLines(d.jumps)}) && firstInFront(jumps, d) {
		return // all there, as the kernel printed them after the last sync, First ones in front
	}
	at := make([]int, len(jumps)) // the index in d.jumps of each jump's copy, -1: none
	for k := range at {
		at[k] = -1
	}
	twice := map[string]bool{} // chains with a second copy of a First jump
	for i, l := range d.jumps {
		k, copyOfFirst := -1, false
		for kk, j := range jumps {
			if j.From != l.from || !sameRule(l.text, j.rule()) {
				continue
			}
			if at[kk] < 0 {
				k = kk
				break
			}
			copyOfFirst = copyOfFirst || j.Position == First
		}
		if k >= 0 {
			at[k] = i
			continue
		}
		if copyOfFirst {
			twice[l.from] = true
		}
		// Not desired (or a second copy): jumps into trellis chains are trellis's.
		p.restore.unjump = append(p.restore.unjump, l.String())
		p.unjumped = append(p.unjumped, l)
	}
	for _, from := range firstChains(jumps) {
		var block []int // the chain's First jumps, in the state's order
		for k, j := range jumps {
			if j.From == from && j.Position == First {
				block = append(block, k)
			}
		}
		// A second copy is deleted by its spec, which deletes the first copy: rewrite.
		if !twice[from] && inFront(block, at, d) {
			continue
		}
		for pos, k := range block {
			if at[k] < 0 {
				p.added = append(p.added, jumpName(table, jumps[k]))
			} else {
				p.restore.unjump = append(p.restore.unjump, d.jumps[at[k]].String())
				if d.jumps[at[k]].pos != pos {
					p.moved = append(p.moved, jumpName(table, jumps[k]))
				}
			}
			p.restore.first = append(p.restore.first, from+" "+ruleText(jumps[k].rule()))
		}
	}
	for k, j := range jumps {
		if j.Position != First && at[k] < 0 {
			p.missing = append(p.missing, j)
		}
	}
}

// firstChains lists the chains with First jumps, in the order of the first of each.
func firstChains(jumps []Jump) []string {
	var out []string
	for _, j := range jumps {
		if j.Position == First && !slices.Contains(out, j.From) {
			out = append(out, j.From)
		}
	}
	return out
}

// inFront reports whether the jumps block (indices into the state's jumps) all have a
// copy at (indices into d.jumps), in that order, with none of others' rules before them.
func inFront(block, at []int, d tableDump) bool {
	prev := -1
	for _, k := range block {
		if at[k] <= prev || !d.jumps[at[k]].lead {
			return false
		}
		prev = at[k]
	}
	return true
}

// firstInFront is the check of First jumps that needs no rule comparison (for jumps the
// memo vouches for): each chain has at least as many jumps in front as the state has First
// jumps into it. Others' rules go in at the top, before all of trellis's.
func firstInFront(jumps []Jump, d tableDump) bool {
	need := map[string]int{}
	for _, j := range jumps {
		if j.Position == First {
			need[j.From]++
		}
	}
	for _, l := range d.jumps {
		if l.lead {
			need[l.from]--
		}
	}
	for _, n := range need {
		if n > 0 {
			return false
		}
	}
	return true
}

// sameChain reports whether the kernel's rules of a chain (as printed) are c's.
func sameChain(c Chain, printed []string, m memo) bool {
	if m.want == hashRules(c.Rules) && m.have == hashLines(printed) {
		return true
	}
	if len(printed) != len(c.Rules) {
		return false
	}
	for i, r := range c.Rules {
		if !sameRule(printed[i], r) {
			return false
		}
	}
	return true
}

func hashRules(rules []Rule) [sha256.Size]byte {
	h := sha256.New()
	for _, r := range rules {
		h.Write([]byte(ruleText(r)))
		h.Write([]byte{'\n'})
	}
	return [sha256.Size]byte(h.Sum(nil))
}

func hashLines(lines []string) [sha256.Size]byte {
	h := sha256.New()
	for _, l := range lines {
		h.Write([]byte(l))
		h.Write([]byte{'\n'})
	}
	return [sha256.Size]byte(h.Sum(nil))
}

func hashJumps(jumps []Jump) [sha256.Size]byte {
	h := sha256.New()
	for _, j := range jumps {
		fmt.Fprintf(h, "%s %d %s\n", j.From, j.Position, ruleText(j.rule()))
	}
	return [sha256.Size]byte(h.Sum(nil))
}

func hashJumpLines(lines []jumpLine) [sha256.Size]byte {
	h := sha256.New()
	for _, l := range lines {
		fmt.Fprintf(h, "%t %s\n", l.lead, l)
	}
	return [sha256.Size]byte(h.Sum(nil))
}

func (s *Syncer) save(ctx context.Context, table Table) ([]byte, error) {
	return s.Backend.SaveTable(ctx, table, false)
}

func (s *Syncer) restore(ctx context.Context, input []byte) error {
	return s.Backend.RestoreNoFlush(ctx, input)
}

// ensureJump appends the Append jump j unless the kernel has it (First jumps are part of
// the restore, which keeps them at the top).
func (s *Syncer) ensureJump(table Table, j Jump) (added bool, err error) {
	if s.ipt == nil {
		proto := iptables.ProtocolIPv4
		if s.Backend.V6 {
			proto = iptables.ProtocolIPv6
		}
		ipt, err := iptables.New(iptables.IPFamily(proto), iptables.Path(s.Backend.IPTables))
		if err != nil {
			return false, fmt.Errorf("%s: %w", s.Backend.IPTables, err)
		}
		s.ipt = ipt
	}
	spec := j.rule().args()
	ok, err := s.ipt.Exists(string(table), j.From, spec...)
	if err != nil {
		return false, fmt.Errorf("checking the jump %s -> %s: %w", j.From, j.To, err)
	}
	if ok {
		return false, nil
	}
	if err := s.ipt.Append(string(table), j.From, spec...); err != nil {
		return false, fmt.Errorf("adding the jump %s -> %s: %w", j.From, j.To, err)
	}
	return true, nil
}
