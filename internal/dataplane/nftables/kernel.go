package nftables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"syscall"

	"sigs.k8s.io/knftables"
)

// opVerb is what a transaction does with an object.
type opVerb uint8

const (
	opAdd opVerb = iota
	opFlush
	opDelete
)

// op is one step of a transaction, in the vocabulary of knftables objects
// (tables, chains with rule text, sets, maps, elements), which any kernel
// implementation (nft CLI, netlink) can consume.
type op struct {
	verb opVerb
	obj  knftables.Object
}

// kernel is the backend's narrow view of one family's table in the kernel.
// The knftables implementation below execs nft for transactions and uses
// netlink for listing; a pure netlink implementation can replace it.
type kernel interface {
	// Apply runs ops as one atomic transaction.
	Apply(ctx context.Context, ops []op) error
	// List returns the names of objects of a type ("chain", "set", "map")
	// in the table; empty (no error) when the table does not exist.
	List(ctx context.Context, objectType string) ([]string, error)
	// ListElements returns the elements of a set or map.
	ListElements(ctx context.Context, s *set) ([]*knftables.Element, error)
	// RuleCount returns the number of rules in a chain.
	RuleCount(ctx context.Context, chain string) (int, error)
	// MissingChain returns the first of names that does not exist, or "".
	MissingChain(ctx context.Context, names []string) (string, error)
}

// NFTFactory opens the knftables interface of one family's table.
type NFTFactory func(family knftables.Family, table string) (knftables.Interface, error)

// defaultNFT opens the real nft-based implementation, listing names over
// netlink (the nft CLI would list every rule of the table). It runs
// `nft --check` to probe support, so it is called lazily, never from New.
func defaultNFT(family knftables.Family, table string) (knftables.Interface, error) {
	return knftables.New(family, table, knftables.UseNetlink)
}

// knftKernel implements kernel with a knftables.Interface (real or fake).
// With a netlink reader (the real kernel), elements and rules are read over
// netlink rather than through the nft CLI.
type knftKernel struct {
	nft knftables.Interface
	nl  *netlinkReader // nil: read and write through nft only
	// sets are the shared sets and maps, for encoding netlink elements.
	sets map[string]*set
	// netlinkBatches counts transactions sent over netlink (for tests).
	netlinkBatches int
}

// Apply sends ops over netlink when every op translates (incremental
// syncs), else through the nft CLI (full syncs, affinity, firewall rules).
func (k *knftKernel) Apply(ctx context.Context, ops []op) error {
	if len(ops) == 0 {
		return nil
	}
	if k.nl != nil {
		err := k.nl.apply(ops, k.sets)
		if !errors.Is(err, errNoNetlink) {
			if err != nil {
				return fmt.Errorf("sending netlink batch of %d operations: %w", len(ops), err)
			}
			k.netlinkBatches++
			return nil
		}
	}
	tx := k.nft.NewTransaction()
	if k.nl != nil {
		return runGrouped(ctx, tx, ops)
	}
	addOps(tx, ops)
	if err := k.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("running nftables transaction of %d operations: %w", len(ops), err)
	}
	return nil
}

// addOps fills tx with ops.
func addOps(tx *knftables.Transaction, ops []op) {
	for _, o := range ops {
		switch o.verb {
		case opAdd:
			tx.Add(o.obj)
		case opFlush:
			tx.Flush(o.obj)
		case opDelete:
			tx.Delete(o.obj)
		}
	}
}

// runGrouped runs the transaction through `nft -f -` itself, with runs of
// element additions to one set merged into one command: knftables writes
// one command per element, and nft parses 100k commands a second slower
// than one list. The process runs in the calling thread's namespace.
func runGrouped(ctx context.Context, tx *knftables.Transaction, ops []op) error {
	addOps(tx, ops)
	text := groupElements(tx.String())
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(text)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("running nft -f of %d operations: %w: %s", len(ops), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// groupElements merges consecutive "add element FAM TABLE SET { X }" lines
// for the same set into "add element FAM TABLE SET { X, Y, ... }".
func groupElements(text string) string {
	var out strings.Builder
	var prefix string
	var items []string
	flushRun := func() {
		if prefix != "" {
			out.WriteString(prefix + " { " + strings.Join(items, ", ") + " }\n")
		}
		prefix, items = "", items[:0]
	}
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		i := strings.Index(line, " { ")
		if strings.HasPrefix(line, "add element ") && i > 0 && strings.HasSuffix(line, " }") {
			if line[:i] != prefix {
				flushRun()
				prefix = line[:i]
			}
			items = append(items, line[i+3:len(line)-2])
			continue
		}
		flushRun()
		out.WriteString(line + "\n")
	}
	flushRun()
	return out.String()
}

func (k *knftKernel) List(ctx context.Context, objectType string) ([]string, error) {
	names, err := k.nft.List(ctx, objectType)
	if isNotFound(err) {
		return nil, nil
	}
	return names, err
}

func (k *knftKernel) ListElements(ctx context.Context, s *set) ([]*knftables.Element, error) {
	if k.nl != nil {
		return k.nl.elements(s)
	}
	typ := "set"
	if s.IsMap {
		typ = "map"
	}
	return k.nft.ListElements(ctx, typ, s.Name)
}

func (k *knftKernel) MissingChain(ctx context.Context, names []string) (string, error) {
	if k.nl != nil {
		return k.nl.missingChain(names)
	}
	have, err := k.List(ctx, "chain")
	if err != nil {
		return "", err
	}
	for _, n := range names {
		if !slices.Contains(have, n) {
			return n, nil
		}
	}
	return "", nil
}

func (k *knftKernel) RuleCount(ctx context.Context, chain string) (int, error) {
	if k.nl != nil {
		return k.nl.ruleCount(chain)
	}
	rules, err := k.nft.ListRules(ctx, chain)
	return len(rules), err
}

// isNotFound reports whether err says the table (or object) does not exist.
// google/nftables loses the errno (it wraps with %v), hence the text match.
func isNotFound(err error) bool {
	return err != nil && (knftables.IsNotFound(err) || errors.Is(err, syscall.ENOENT) ||
		strings.Contains(err.Error(), syscall.ENOENT.Error()))
}
