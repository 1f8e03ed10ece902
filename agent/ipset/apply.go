package ipset

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Result says what an Apply did, by set name.
type Result struct {
	Created   []string
	Updated   []string // entries added or deleted
	Rebuilt   []string // options changed: filled aside and swapped in (or re-created while unused)
	Destroyed []string
	// InUse are sets no longer desired that a rule still references: Apply again once the
	// rules stopped using them.
	InUse []string
	// Added and Deleted count entries (the entries of a created or rebuilt set count too).
	Added, Deleted int
	// Restored says whether `ipset restore` ran.
	Restored bool
}

// Apply makes trellis's sets be want: one `ipset list` to read the kernel's sets, and,
// when anything differs, one `ipset restore`. It speaks for every trellis set but the
// node's own (NodePrefix, ApplyNode's): those are neither changed nor destroyed here. A
// set that can't be changed (its type changed while a rule uses it) or is not valid
// (Validate) is left as the kernel holds it, if it does, and reported by name; the rest
// is applied, so one bad set can't hold back the others.
func Apply(ctx context.Context, want []Set) (Result, error) {
	var sets []*desired
	var errs []error
	names := map[string]bool{}
	invalid := map[string]bool{} // left alone: neither changed nor destroyed as undesired
	for _, s := range want {
		d, err := s.canonical()
		if err != nil {
			errs = append(errs, err)
			invalid[s.Name] = true
			continue
		}
		if names[s.Name] {
			errs = append(errs, fmt.Errorf("ipset %s listed twice: the first is applied", s.Name))
			continue
		}
		names[s.Name] = true
		sets = append(sets, d)
	}
	if _, err := exec.LookPath("ipset"); err != nil {
		if len(sets) == 0 && len(errs) == 0 {
			return Result{}, nil // trellis makes its sets with this command: without it there are none
		}
		return Result{}, errors.Join(append(errs, errors.New("the ipset command is missing: install ipset"))...)
	}
	out, err := command(ctx, nil, "list")
	if err != nil {
		return Result{}, errors.Join(append(errs, err)...)
	}
	have := parseList(out)
	for name := range have {
		if strings.HasPrefix(name, NodePrefix) {
			delete(have, name)
		}
	}
	script, res, err := plan(sets, have, invalid)
	errs = append(errs, err)
	if len(script) > 0 {
		if rerr := restore(ctx, script); rerr != nil {
			return Result{}, errors.Join(append(errs, rerr)...)
		}
		res.Restored = true
	}
	return res, errors.Join(errs...)
}

// ApplyNode makes the node's own sets (names starting with NodePrefix: the datapath's,
// not NetworkPolicy's) be want, as Apply does for the others: node sets no longer desired
// are destroyed once no rule uses them. It lists only the node's sets (`ipset list -name`,
// then `ipset list` of each), never the policy's, which may hold tens of thousands of
// entries; a change is one `ipset restore` of the difference.
func ApplyNode(ctx context.Context, want []Set) (Result, error) {
	var sets []*desired
	for _, s := range want {
		if !strings.HasPrefix(s.Name, NodePrefix) {
			return Result{}, fmt.Errorf("ipset %s: a node set's name must start with %s", s.Name, NodePrefix)
		}
		d, err := s.canonical()
		if err != nil {
			return Result{}, err
		}
		sets = append(sets, d)
	}
	if _, err := exec.LookPath("ipset"); err != nil {
		if len(sets) == 0 {
			return Result{}, nil
		}
		return Result{}, errors.New("the ipset command is missing: install ipset")
	}
	names, err := command(ctx, nil, "list", "-name")
	if err != nil {
		return Result{}, err
	}
	have := map[string]*current{}
	for _, name := range strings.Fields(string(names)) {
		if !strings.HasPrefix(name, NodePrefix) {
			continue
		}
		out, err := command(ctx, nil, "list", name)
		if err != nil {
			return Result{}, err
		}
		maps.Copy(have, parseList(out))
	}
	script, res, err := plan(sets, have, nil)
	if err != nil {
		return Result{}, err
	}
	if len(script) > 0 {
		if err := restore(ctx, script); err != nil {
			return Result{}, err
		}
		res.Restored = true
	}
	return res, nil
}

// current is one of trellis's sets as the kernel lists it.
type current struct {
	name, typ, family string
	maxElem           int
	comment           bool
	other             bool // options trellis doesn't set (timeout, counters ...)
	refs              int
	entries           map[string]attrs
}

var ownOptions = map[string]bool{"family": true, "hashsize": true, "maxelem": true, "bucketsize": true, "initval": true}

// parseList reads the plain output of `ipset list` (it gives the reference counts that
// `ipset save` doesn't), keeping trellis's sets only.
func parseList(out []byte) map[string]*current {
	sets := map[string]*current{}
	var cur *current
	members := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, "Name: "); ok {
			cur, members = nil, false
			if strings.HasPrefix(name, Prefix) {
				cur = &current{name: name, entries: map[string]attrs{}}
				sets[name] = cur
			}
			continue
		}
		if cur == nil {
			continue
		}
		if members {
			if line != "" {
				m, a := parseEntry(line)
				cur.entries[m] = a
			}
			continue
		}
		key, val, _ := strings.Cut(line, ": ")
		switch key {
		case "Type":
			cur.typ = val
		case "References":
			cur.refs, _ = strconv.Atoi(val)
		case "Header":
			f := strings.Fields(val)
			for i := 0; i < len(f); i++ {
				switch {
				case f[i] == "family" && i+1 < len(f):
					cur.family = f[i+1]
				case f[i] == "maxelem" && i+1 < len(f):
					cur.maxElem, _ = strconv.Atoi(f[i+1])
				case f[i] == "comment":
					cur.comment = true
					continue
				case !ownOptions[f[i]]:
					cur.other = true
					continue
				}
				i++ // the option's value
			}
		}
		if line == "Members:" {
			members = true
		}
	}
	return sets
}

// parseEntry reads `10.0.0.0/8 nomatch comment "x y"`.
func parseEntry(line string) (string, attrs) {
	member, rest, _ := strings.Cut(line, " ")
	var a attrs
	if before, c, ok := strings.Cut(rest, `comment "`); ok {
		rest = before
		a.comment = strings.TrimSuffix(c, `"`)
	}
	a.nomatch = slices.Contains(strings.Fields(rest), "nomatch")
	return member, a
}

// plan computes the restore script that turns have into want. Stale sets go first (their
// names may be needed), then each desired set: created, re-created, rebuilt aside and
// swapped in, or its entries deleted then added. Sets named in keep are left as they are.
func plan(want []*desired, have map[string]*current, keep map[string]bool) ([]string, Result, error) {
	var script []string
	var res Result
	var errs []error
	wanted := maps.Clone(keep)
	if wanted == nil {
		wanted = map[string]bool{}
	}
	for _, d := range want {
		wanted[d.Name] = true
	}
	for _, name := range slices.Sorted(maps.Keys(have)) {
		if wanted[name] {
			continue
		}
		if have[name].refs > 0 {
			res.InUse = append(res.InUse, name)
			continue
		}
		script = append(script, "destroy "+name)
		res.Destroyed = append(res.Destroyed, name)
	}
	temps := map[string]bool{}
	for _, d := range want {
		h := have[d.Name]
		switch {
		case h == nil:
			script = append(script, createLine(d.Name, d))
			script = appendEntries(script, d.Name, d, d.order)
			res.Created = append(res.Created, d.Name)
			res.Added += len(d.order)
		case h.typ != d.Type || h.family != d.family():
			// The kernel swaps only sets of one type and family.
			if h.refs > 0 {
				errs = append(errs, fmt.Errorf("ipset %s: is %s family %s, want %s family %s, and %d rule(s) use it: the kernel can't swap sets of different types; give the new set another name",
					d.Name, h.typ, h.family, d.Type, d.family(), h.refs))
				continue
			}
			script = append(script, "destroy "+d.Name, createLine(d.Name, d))
			script = appendEntries(script, d.Name, d, d.order)
			res.Rebuilt = append(res.Rebuilt, d.Name)
			res.Added += len(d.order)
		case h.maxElem != d.maxElem() || h.comment != d.Comment || h.other:
			// A leftover of an interrupted rebuild is destroyed above unless a rule uses it.
			tmp := tempName(d.Name, func(n string) bool { return temps[n] || have[n] != nil && have[n].refs > 0 })
			temps[tmp] = true
			script = append(script, createLine(tmp, d))
			script = appendEntries(script, tmp, d, d.order)
			script = append(script, "swap "+tmp+" "+d.Name, "destroy "+tmp)
			res.Rebuilt = append(res.Rebuilt, d.Name)
			res.Added += len(d.order)
		default:
			n := len(script)
			for _, m := range slices.Sorted(maps.Keys(h.entries)) {
				if _, ok := d.entries[m]; !ok {
					script = append(script, "del "+d.Name+" "+m)
					res.Deleted++
				}
			}
			var changed []string
			for _, m := range d.order {
				if a, ok := h.entries[m]; !ok || a != d.entries[m] {
					changed = append(changed, m) // added, or its nomatch/comment updated (-exist)
				}
			}
			script = appendEntries(script, d.Name, d, changed)
			res.Added += len(changed)
			if len(script) > n {
				res.Updated = append(res.Updated, d.Name)
			}
		}
	}
	return script, res, errors.Join(errs...)
}

func createLine(name string, d *desired) string {
	l := fmt.Sprintf("create %s %s family %s maxelem %d", name, d.Type, d.family(), d.maxElem())
	if d.Comment {
		l += " comment"
	}
	return l
}

func appendEntries(script []string, name string, d *desired, members []string) []string {
	for _, m := range members {
		l := "add " + name + " " + m
		a := d.entries[m]
		if a.nomatch {
			l += " nomatch"
		}
		if a.comment != "" {
			l += ` comment "` + a.comment + `"`
		}
		script = append(script, l)
	}
	return script
}

// tempName is the name a rebuild of name fills, one taken is false for.
func tempName(name string, taken func(string) bool) string {
	for i := 0; ; i++ {
		h := fnv.New32a()
		fmt.Fprintf(h, "%s/%d", name, i)
		if n := fmt.Sprintf("%s%08x", swapPrefix, h.Sum32()); !taken(n) {
			return n
		}
	}
}

var errorLine = regexp.MustCompile(`Error in line (\d+)`)

// restore runs the script with -exist: creating a set that exists identically, adding an
// entry that exists (its nomatch and comment are updated) and deleting one that doesn't
// are no errors, so a set changed by someone since the list doesn't fail the rest.
func restore(ctx context.Context, script []string) error {
	input := strings.Join(script, "\n") + "\n"
	_, err := command(ctx, strings.NewReader(input), "restore", "-exist")
	if err == nil {
		return nil
	}
	// The script may be thousands of lines: quote the one ipset names.
	if m := errorLine.FindStringSubmatch(err.Error()); m != nil {
		if n, _ := strconv.Atoi(m[1]); n > 0 && n <= len(script) {
			err = fmt.Errorf("%w (line %d: %s)", err, n, script[n-1])
		}
	}
	return err
}

// List runs `ipset list` and hands its output to read as it comes: a node's sets (other
// components' too, kube-proxy's) may hold hundreds of thousands of entries, which a reader
// keeping a few sets needn't hold. What read leaves unread is drained, so ipset finishes
// its listing; read's error is returned as it is.
func List(ctx context.Context, read func(io.Reader) error) error {
	return stream(ctx, nil, read, "list")
}

func command(ctx context.Context, stdin io.Reader, args ...string) ([]byte, error) {
	var stdout bytes.Buffer
	err := stream(ctx, stdin, func(r io.Reader) error {
		_, err := stdout.ReadFrom(r)
		return err
	}, args...)
	if err != nil {
		return nil, err
	}
	return stdout.Bytes(), nil
}

// stream runs ipset with args, handing its output to read; every ipset exec is here.
func stream(ctx context.Context, stdin io.Reader, read func(io.Reader) error, args ...string) error {
	name := "ipset " + strings.Join(args, " ")
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "ipset", args...)
	cmd.Stdin, cmd.Stderr = stdin, &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	rerr := read(out)
	_, _ = io.Copy(io.Discard, out) // Wait closes the pipe: it must come after every read
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(stderr.String()))
	}
	return rerr
}

// Cleanup destroys every ipset whose name starts with Prefix and nothing else. Run it
// after netfilter.Cleanup: the kernel refuses to destroy a set a rule still references.
// It goes on after a failure and reports the sets destroyed.
func Cleanup() ([]string, error) {
	if _, err := exec.LookPath("ipset"); err != nil {
		return nil, nil // trellis makes its sets with this command: without it there are none
	}
	out, err := command(context.Background(), nil, "list", "-name")
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, name := range strings.Fields(string(out)) {
		if !strings.HasPrefix(name, Prefix) {
			continue
		}
		if _, err := command(context.Background(), nil, "destroy", name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}
