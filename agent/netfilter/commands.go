package netfilter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// The backend's commands, for what a Syncer doesn't do itself: every iptables exec of the
// agent is here (the policy engine's jump check, its counters, the deny-log probe, the
// diagnostics' listing of every table).

// SaveTable is iptables-save of table, with the rules' packet and byte counters when
// counters is set.
func (b Backend) SaveTable(ctx context.Context, table Table, counters bool) ([]byte, error) {
	args := []string{"-t", string(table)}
	if counters {
		args = append([]string{"-c"}, args...)
	}
	return b.save(ctx, 0, args...)
}

// SaveAll is iptables-save of every table the kernel holds, in one run without -t: named
// with -t, a legacy table that isn't there would be created (its module loaded), and a
// reader must not change the node. With limit > 0 the output is bounded: past limit bytes
// the command is stopped, and the first limit bytes come with an error saying so.
func (b Backend) SaveAll(ctx context.Context, limit int) ([]byte, error) {
	return b.save(ctx, limit)
}

// Installed reports whether b's iptables-save is on the node: a node may have the iptables
// commands without the ip6tables ones, and a reader of b runs iptables-save first.
func (b Backend) Installed() bool {
	return found(b.Save)
}

// save runs iptables-save with args, its output bounded by limit when limit > 0.
func (b Backend) save(ctx context.Context, limit int, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	out := &bounded{w: &stdout, left: limit}
	if limit <= 0 {
		out.left = -1
	}
	cmd := exec.CommandContext(ctx, b.Save, args...)
	cmd.Stdout, cmd.Stderr = out, &stderr
	name := strings.Join(append([]string{b.Save}, args...), " ")
	err := cmd.Run()
	switch {
	case out.cut:
		// Stopping the copy ended the command (broken pipe): that is not its failure.
		return stdout.Bytes(), fmt.Errorf("%s: output longer than %d bytes: cut there", name, limit)
	case err != nil:
		return nil, fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// errCut stops the copy of a command's output at its bound.
var errCut = errors.New("output bound reached")

// bounded writes to w until left bytes are written (left < 0: no bound), then keeps the
// rest out and fails, which closes the pipe and so ends the command.
type bounded struct {
	w    io.Writer
	left int
	cut  bool
}

func (o *bounded) Write(p []byte) (int, error) {
	if o.left < 0 {
		return o.w.Write(p)
	}
	if len(p) > o.left {
		n, _ := o.w.Write(p[:o.left])
		o.left, o.cut = 0, true
		return n, errCut
	}
	o.left -= len(p)
	return o.w.Write(p)
}

var errorLine = regexp.MustCompile(`line:? (\d+)`)

// RestoreNoFlush runs iptables-restore --noflush with input; an error quotes the line
// iptables-restore names (the input may be thousands of lines).
func (b Backend) RestoreNoFlush(ctx context.Context, input []byte) error {
	cmd := exec.CommandContext(ctx, b.Restore, "--noflush", "--wait")
	cmd.Stdin = bytes.NewReader(input)
	out, err := cmd.CombinedOutput()
	if err == nil {
		return nil
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "Try `") {
			lines = append(lines, l)
		}
	}
	msg := strings.Join(lines, "; ")
	if m := errorLine.FindStringSubmatch(msg); m != nil {
		if n, _ := strconv.Atoi(m[1]); n > 0 {
			if lines := strings.Split(string(input), "\n"); n <= len(lines) {
				msg += fmt.Sprintf(" (line %d: %s)", n, lines[n-1])
			}
		}
	}
	return fmt.Errorf("%s --noflush: %w: %s", b.Restore, err, msg)
}

// JumpLeads reports whether, in chain of the filter table, the jump to target comes before
// any rule that doesn't go to a trellis chain (only trellis's own jumps may precede it). It
// lists just that chain (iptables -S), cheap enough to run every second.
func (b Backend) JumpLeads(ctx context.Context, chain, target string) (bool, error) {
	out, err := exec.CommandContext(ctx, b.IPTables, "-w", "5", "-t", "filter", "-S", chain).Output()
	if err != nil {
		return false, fmt.Errorf("%s -S %s: %w", b.IPTables, chain, err)
	}
	return leads(string(out), chain, target), nil
}

// leads is JumpLeads on `iptables -S chain` output.
func leads(listing, chain, target string) bool {
	for _, l := range strings.Split(listing, "\n") {
		rule, ok := strings.CutPrefix(l, "-A "+chain+" ")
		if !ok {
			continue
		}
		args := SplitRule(rule)
		to := ""
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-j" || args[i] == "-g" {
				to = args[i+1]
			}
		}
		switch {
		case to == target:
			return true
		case !strings.HasPrefix(to, ChainPrefix):
			return false
		}
	}
	return false
}

// TryChain reports whether the backend and the kernel take c's rules: it writes c into
// table with a commit of its own (the legacy backend checks matches and targets against
// the kernel only when it commits), then removes it. Nothing jumps to c, so its rules see
// no packet. Declaring c again flushes it (even if the write failed half way, or a crashed
// try left it), so the removal always applies.
func (b Backend) TryChain(ctx context.Context, table Table, c Chain) error {
	werr := b.RestoreNoFlush(ctx, Render(table, TableState{Chains: []Chain{c}}))
	rerr := b.RestoreNoFlush(ctx, renderRestore(table, restorePlan{flush: []string{c.Name}, remove: []string{c.Name}}))
	if werr != nil {
		return werr
	}
	if rerr != nil {
		return fmt.Errorf("removing the chain %s: %w", c.Name, rerr)
	}
	return nil
}
