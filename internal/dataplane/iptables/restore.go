package iptables

import (
	"slices"
	"strings"
)

// tableWrite is one table's section of iptables-restore --noflush input.
type tableWrite struct {
	table string
	// chains are created if missing, flushed and refilled.
	chains []*Chain
	// render, when set, returns chains instead, each time they are
	// written or encoded: a section written ahead renders its rules then,
	// so that a whole input's (~230 bytes a rule) never exist at once.
	// rules is then how many rules it renders.
	render func() []*Chain
	rules  int
	// appends are rules appended to existing chains, which keep theirs.
	appends []*Chain
	// delRules are rules ("<chain> <rule>") deleted before anything else.
	delRules []string
	// inserts are jump rules inserted at the top of built-in chains.
	inserts []Jump
	// deletes are chains flushed and deleted.
	deletes []string
}

func (w *tableWrite) empty() bool {
	return w == nil || w.render == nil && len(w.chains)+len(w.appends)+len(w.delRules)+len(w.inserts)+len(w.deletes) == 0
}

// declared returns the chains the section creates and fills, rendering
// them for a section with render.
func (w *tableWrite) declared() []*Chain {
	if w.render != nil {
		return w.render()
	}
	return w.chains
}

// ruleCount is how many rules the section writes.
func (w *tableWrite) ruleCount() int {
	n := w.rules
	for _, c := range slices.Concat(w.chains, w.appends) {
		n += len(c.Rules)
	}
	return n
}

// write appends the section to b: chain declarations first (which flush),
// then rules (the declared chains', then the appended ones), then jumps,
// then deletions, so that a chain is empty and unreferenced when it is
// deleted.
func (w *tableWrite) write(b *strings.Builder) {
	if w.empty() {
		return
	}
	b.WriteString("*" + w.table + "\n")
	for _, r := range w.delRules {
		b.WriteString("-D " + r + "\n")
	}
	chains := w.declared()
	for _, c := range chains {
		b.WriteString(":" + c.Name + " - [0:0]\n")
	}
	for _, name := range w.deletes {
		b.WriteString(":" + name + " - [0:0]\n")
	}
	var line []byte
	for _, c := range slices.Concat(chains, w.appends) {
		for i := range c.Rules {
			line = append(append(line[:0], "-A "...), c.Name...)
			if r := &c.Rules[i]; r.args[0] != argEnd || r.target.kind != targetNone {
				line = r.appendText(append(line, ' '))
			}
			b.Write(append(line, '\n'))
		}
	}
	// Insert in reverse so that the jumps end up in list order at the top.
	for i := len(w.inserts) - 1; i >= 0; i-- {
		j := w.inserts[i]
		line = append(append(append(line[:0], "-I "...), j.Chain...), " 1 "...)
		b.Write(append(j.Rule.appendText(line), '\n'))
	}
	for _, name := range w.deletes {
		b.WriteString("-X " + name + "\n")
	}
	b.WriteString("COMMIT\n")
}

// restoreText joins sections in order.
func restoreText(ws ...*tableWrite) string {
	var b strings.Builder
	b.Grow(sizeOf(ws))
	for _, w := range ws {
		w.write(&b)
	}
	return b.String()
}

// sizeOf estimates the text size so that the builder never regrows (at 10k
// Services the text is tens of megabytes).
func sizeOf(ws []*tableWrite) int {
	n := 0
	for _, w := range ws {
		if w == nil {
			continue
		}
		for _, c := range slices.Concat(w.chains, w.appends) {
			n += 2 * (len(c.Name) + 10)
			for i := range c.Rules {
				n += len(c.Name) + c.Rules[i].textSize() + 5
			}
		}
		for _, j := range w.inserts {
			n += len(j.Chain) + j.Rule.textSize() + 8
		}
		n += w.rules * 120
		for _, r := range w.delRules {
			n += len(r) + 4
		}
		n += 40 * (len(w.deletes) + 1)
	}
	return n
}

// savedTable is what iptables-save printed for one table.
type savedTable struct {
	chains map[string]bool
	// rules per chain, each the text after "-A <chain> ".
	rules map[string][]string
	order []string
}

// parseSave reads iptables-save output of one table.
func parseSave(out string) *savedTable {
	st := &savedTable{chains: map[string]bool{}, rules: map[string][]string{}}
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			st.chains[name] = true
			st.order = append(st.order, name)
		case strings.HasPrefix(line, "-A "):
			name, rule, _ := strings.Cut(line[3:], " ")
			st.rules[name] = append(st.rules[name], rule)
		}
	}
	return st
}

// ruleTarget returns the -j or -g target of a rule.
func ruleTarget(rule string) string { return argsTarget(splitArgs(rule)) }

// argsTarget is the -j or -g target of a rule's arguments.
func argsTarget(args []string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-j" || args[i] == "-g" || args[i] == "--jump" || args[i] == "--goto" {
			return args[i+1]
		}
	}
	return ""
}

// SplitArgs splits one rule of iptables-save text into the arguments of
// an iptables command (double quotes group words).
func SplitArgs(rule string) []string { return splitArgs(rule) }

// splitArgs splits a rule into arguments, honouring double quotes (a
// backslash inside them escapes the next byte).
func splitArgs(s string) []string {
	return appendArgs(make([]string, 0, 16), s)
}

// appendArgs appends the arguments of s to out. Arguments without quotes,
// and quoted ones without escapes, are substrings of s, not copies.
func appendArgs(out []string, s string) []string {
	for i := 0; i < len(s); {
		if s[i] == ' ' || s[i] == '\t' {
			i++
			continue
		}
		start, plain, inQ := i, true, false
		for ; i < len(s); i++ {
			c := s[i]
			if (c == ' ' || c == '\t') && !inQ {
				break
			}
			switch {
			case c == '"':
				inQ, plain = !inQ, false
			case c == '\\' && inQ && i+1 < len(s):
				i++
				plain = false
			}
		}
		tok := s[start:i]
		switch {
		case plain:
			out = append(out, tok)
		case len(tok) >= 2 && tok[0] == '"' && tok[len(tok)-1] == '"' && !strings.ContainsAny(tok[1:len(tok)-1], `"\\`):
			out = append(out, tok[1:len(tok)-1])
		default:
			out = append(out, unquote(tok))
		}
	}
	return out
}

// unquote removes the quotes of one argument and resolves its escapes.
func unquote(tok string) string {
	var b strings.Builder
	inQ := false
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		switch {
		case c == '"':
			inQ = !inQ
		case c == '\\' && inQ && i+1 < len(tok):
			i++
			b.WriteByte(tok[i])
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// hasJump reports whether a built-in chain already holds jump j (same
// target and comment; iptables-save may reorder or normalise the rest).
func hasJump(saved *savedTable, j Jump) bool {
	for _, r := range saved.rules[j.Chain] {
		if ruleTarget(r) == j.Target() && commentOf(r) == j.Rule.cmt {
			return true
		}
	}
	return false
}

func commentOf(rule string) string {
	toks := splitArgs(rule)
	for i := 0; i+1 < len(toks); i++ {
		if toks[i] == "--comment" {
			return toks[i+1]
		}
	}
	return ""
}
