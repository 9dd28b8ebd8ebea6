package iptables

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// fakeKernel is an in-memory iptables for one backend: it applies
// iptables-restore --noflush input, prints iptables-save output and answers
// `iptables -S CHAIN`. It records every restore input.
type fakeKernel struct {
	mu       sync.Mutex
	tables   map[string]map[string]map[string][]string // family -> table -> chain -> rules
	order    map[string][]string                       // family/table -> chain order
	restores []string
	failNext bool
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{tables: map[string]map[string]map[string][]string{}, order: map[string][]string{}}
}

func (k *fakeKernel) table(fam, t string) map[string][]string {
	if k.tables[fam] == nil {
		k.tables[fam] = map[string]map[string][]string{}
	}
	if k.tables[fam][t] == nil {
		k.tables[fam][t] = map[string][]string{}
		for _, b := range []string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"} {
			k.tables[fam][t][b] = nil
			k.order[fam+"/"+t] = append(k.order[fam+"/"+t], b)
		}
	}
	return k.tables[fam][t]
}

func (k *fakeKernel) Run(_ context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	fam := "4"
	if strings.HasPrefix(name, "ip6") {
		fam = "6"
	}
	switch {
	case strings.HasSuffix(name, "-restore"):
		if k.failNext {
			k.failNext = false
			return nil, fmt.Errorf("iptables-restore: line 2 failed")
		}
		k.restores = append(k.restores, string(stdin))
		return nil, k.apply(fam, string(stdin))
	case strings.HasSuffix(name, "-save") && len(args) >= 2:
		return []byte(k.save(fam, args[1])), nil
	case strings.HasSuffix(name, "-save"):
		var b strings.Builder
		for _, t := range []string{"mangle", "filter", "nat"} {
			if k.tables[fam][t] != nil {
				b.WriteString(k.save(fam, t))
			}
		}
		return []byte(b.String()), nil
	case slices.Contains(args, "-S"):
		c, ok := k.table(fam, args[2])[args[4]]
		if !ok {
			return nil, fmt.Errorf("no chain")
		}
		var b strings.Builder
		for _, r := range c {
			b.WriteString("-A " + args[4] + " " + r + "\n")
		}
		return []byte(b.String()), nil
	}
	return nil, nil
}

func (k *fakeKernel) apply(fam, text string) error {
	var t map[string][]string
	var tname string
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			tname = line[1:]
			t = k.table(fam, tname)
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if _, ok := t[name]; !ok {
				k.order[fam+"/"+tname] = append(k.order[fam+"/"+tname], name)
			}
			t[name] = nil
		case strings.HasPrefix(line, "-A "):
			c, r, _ := strings.Cut(line[3:], " ")
			if _, ok := t[c]; !ok {
				return fmt.Errorf("no chain %s", c)
			}
			if tgt := ruleTarget(r); strings.HasPrefix(tgt, "KUBE-") {
				if _, ok := t[tgt]; !ok {
					return fmt.Errorf("rule in %s jumps to missing chain %s", c, tgt)
				}
			}
			t[c] = append(t[c], r)
		case strings.HasPrefix(line, "-I "):
			toks := strings.SplitN(line, " ", 4)
			t[toks[1]] = append([]string{toks[3]}, t[toks[1]]...)
		case strings.HasPrefix(line, "-D "):
			c, r, _ := strings.Cut(line[3:], " ")
			i := slices.Index(t[c], r)
			if i < 0 {
				return fmt.Errorf("no rule %q in %s", r, c)
			}
			t[c] = slices.Delete(t[c], i, i+1)
		case strings.HasPrefix(line, "-X "):
			delete(t, line[3:])
			o := k.order[fam+"/"+tname]
			k.order[fam+"/"+tname] = slices.DeleteFunc(o, func(s string) bool { return s == line[3:] })
		}
	}
	return nil
}

func (k *fakeKernel) save(fam, tname string) string {
	t := k.table(fam, tname)
	var b strings.Builder
	b.WriteString("*" + tname + "\n")
	for _, c := range k.order[fam+"/"+tname] {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	for _, c := range k.order[fam+"/"+tname] {
		for _, r := range t[c] {
			b.WriteString("-A " + c + " " + r + "\n")
		}
	}
	return b.String() + "COMMIT\n"
}

func (k *fakeKernel) last() string { return k.restores[len(k.restores)-1] }

type fakeSysctl map[string]int

func (s fakeSysctl) Get(n string) (int, error) { return s[n], nil }
func (s fakeSysctl) Set(n string, v int) error { s[n] = v; return nil }
