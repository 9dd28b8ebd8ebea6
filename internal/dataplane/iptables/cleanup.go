package iptables

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/kproxy/kproxy/internal/model"
)

// cleanupBackend removes, in both families of backend b, every chain kproxy
// or upstream kube-proxy (iptables mode) owns and every rule jumping to
// one. With firewall set it also removes KUBE-FIREWALL where no kubelet
// hint chain says that a kubelet owns it (used when switching backends: the
// node's kubelet, if any, is on the other one). It reads each family with one -save call without -t: naming a table
// would make the legacy backend create it. Tables, modules or binaries that
// are not there are skipped, and in this process's own namespace so are
// backends and families without tables (HasTables).
func cleanupBackend(ctx context.Context, ex Exec, b Backend, firewall bool) error {
	var errs []error
	_, local := ex.(OSExec)
	for _, fam := range []model.Family{model.IPv4, model.IPv6} {
		if local && !HasTables(b, fam) {
			continue
		}
		out, err := ex.Run(ctx, nil, b.cmd(fam, "-save"))
		if err != nil {
			continue // no module or binary: nothing to remove
		}
		var ws []*tableWrite
		dropFirewall := firewall && !hasKubeletHint(string(out))
		for _, t := range splitSave(string(out)) {
			ws = append(ws, cleanupWrite(t.name, parseSave(t.text), dropFirewall))
		}
		text := restoreText(ws...)
		if text == "" {
			continue
		}
		if _, err := ex.Run(ctx, []byte(text), b.cmd(fam, "-restore"), "--noflush", "--wait"); err != nil {
			errs = append(errs, fmt.Errorf("removing %s %s rules: %w", b, fam, err))
		}
	}
	return errors.Join(errs...)
}

// savedSection is one table's part of a whole iptables-save output.
type savedSection struct{ name, text string }

// splitSave splits iptables-save output into its tables, in order.
func splitSave(out string) []savedSection {
	var secs []savedSection
	for _, part := range strings.Split(out, "\n*") {
		part = strings.TrimPrefix(part, "*")
		name, rest, ok := strings.Cut(part, "\n")
		if !ok || strings.HasPrefix(name, "#") || name == "" {
			continue
		}
		secs = append(secs, savedSection{name: name, text: rest})
	}
	return secs
}

// cleanupWrite deletes the owned chains of a saved table and the rules of
// other chains that jump to them.
func cleanupWrite(table string, saved *savedTable, firewall bool) *tableWrite {
	w := &tableWrite{table: table}
	owned := func(name string) bool {
		return isLeftoverChain(table, name) || (firewall && table == tableFilter && name == chainKubeletFirewall)
	}
	for _, name := range saved.order {
		if owned(name) {
			w.deletes = append(w.deletes, name)
			continue
		}
		for _, r := range saved.rules[name] {
			if owned(ruleTarget(r)) {
				w.delRules = append(w.delRules, name+" "+r)
			}
		}
	}
	return w
}

// staleChains are owned chains present in a saved table but not desired.
func staleChains(table string, saved *savedTable, want map[string]bool) []string {
	var out []string
	for _, name := range saved.order {
		if isOwnedChain(table, name) && !want[name] && !strings.HasPrefix(name, "KUBE-FIREWALL") {
			out = append(out, name)
		}
	}
	return out
}
