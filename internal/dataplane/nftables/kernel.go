package nftables

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
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
// (tables, chains, sets, maps, elements) and typed rules, which any kernel
// implementation (knftables, netlink) can consume.
type op struct {
	// obj is a knftables object or a *ruleOp; nil for an element; a
	// *fill for its element idx, an endpoint-ranges element encoded from
	// its numbers.
	obj any
	// elem is an element of a set (isMap false) or map, kept in render's
	// compact form: a 100k-element sync would otherwise hold 100k
	// knftables objects.
	elem  *element
	idx   int32
	verb  opVerb
	isMap bool // (the small fields last: 32 bytes, not 40)
}

// opList is a transaction's operations, in order, in parts.
type opList [][]op

func (l opList) len() int {
	n := 0
	for _, part := range l {
		n += len(part)
		for _, o := range part {
			if f, ok := o.obj.(*fill); ok && o.idx == wholeFill {
				n += len(f.elems) - 1
			}
		}
	}
	return n
}

// changes counts the operations that change the kernel's rules: every one
// but the declarations (adding a table, chain, set or map, which changes
// nothing when it exists and is followed by what fills it when it does not).
func (l opList) changes() int {
	n := 0
	for o := range l.all {
		switch o.obj.(type) {
		case *knftables.Table, *knftables.Chain, *knftables.Set, *knftables.Map:
			if o.verb == opAdd {
				continue
			}
		}
		n++
	}
	return n
}

// all yields every operation in order, a whole block's as one per element.
func (l opList) all(yield func(op) bool) {
	for _, part := range l {
		for _, o := range part {
			if f, ok := o.obj.(*fill); ok && o.idx == wholeFill {
				for i := range f.elems {
					if !yield(rangeOp(o.verb, f, i)) {
						return
					}
				}
				continue
			}
			if !yield(o) {
				return
			}
		}
	}
}

// elemOp is the op adding or deleting an element.
func elemOp(verb opVerb, e *element, isMap bool) op { return op{verb: verb, elem: e, isMap: isMap} }

// rangeOp is the op adding or deleting f's element i.
func rangeOp(verb opVerb, f *fill, i int) op {
	return op{verb: verb, obj: f, idx: int32(i), isMap: true}
}

// fillOp is the op adding or deleting every element of f; opList.all
// yields it as one rangeOp per element. A cold sync at 10k Services × 100
// endpoints adds a million endpoint-ranges elements: one op each was 32 MB
// (64 MB of slice while it grew) alive next to the transaction's batch.
func fillOp(verb opVerb, f *fill) op {
	return op{verb: verb, obj: f, idx: wholeFill, isMap: true}
}

// wholeFill is the idx of a fillOp.
const wholeFill = -1

// ruleOp is a rule added to a chain.
type ruleOp struct {
	chain string
	rule  rule
}

// ruleAdd is the op adding r to chain.
func ruleAdd(chain string, r rule) op { return op{verb: opAdd, obj: &ruleOp{chain: chain, rule: r}} }

// object returns the op's knftables object (a rule as its text).
func (o op) object() knftables.Object {
	switch obj := o.obj.(type) {
	case nil:
		return o.elem.object(o.isMap)
	case *fill:
		e := obj.element(int(o.idx))
		return e.object(true)
	case *ruleOp:
		return &knftables.Rule{Chain: obj.chain, Rule: obj.rule.String()}
	}
	return o.obj.(knftables.Object)
}

// kernel is the backend's narrow view of one family's table in the kernel:
// nlKernel (netlink, the default) or knftKernel (knftables, for the fake).
type kernel interface {
	// Apply runs ops as one atomic transaction.
	Apply(ctx context.Context, ops opList) error
	// ApplyStages runs each stage received from stages as its own atomic
	// transaction, in order, until stages is closed, and stops at the first
	// that fails. A stage's ops are made only when it is its turn (possibly
	// in another goroutine, while the kernel takes the stage before: stages
	// must only read state that stays unchanged until ApplyStages returns).
	ApplyStages(ctx context.Context, stages <-chan func() opList) error
	// List returns the names of objects of a type ("chain", "set", "map")
	// in the table; empty (no error) when the table does not exist.
	List(ctx context.Context, objectType string) ([]string, error)
	// ListElements returns the elements of a set or map as key -> value,
	// formatted as render formats them (element.Key, element.Value).
	ListElements(ctx context.Context, s *set) (map[string]string, error)
	// ListRanges returns the ranges of an endpoint-ranges map, sorted by
	// first key.
	ListRanges(ctx context.Context, s *set) ([]kernelRange, error)
	// RuleCount returns the number of rules in a chain.
	RuleCount(ctx context.Context, chain string) (int, error)
	// MissingChain returns the first of names that does not exist, or "".
	MissingChain(ctx context.Context, names []string) (string, error)
}

// NFTFactory opens the knftables interface of one family's table.
type NFTFactory func(family knftables.Family, table string) (knftables.Interface, error)

// knftKernel implements kernel with a knftables.Interface. It is used only
// when a caller passes WithNFT, which only tests do (with knftables.NewFake);
// the daemon always programs the kernel through nlKernel (netlink only, no
// nft binary).
type knftKernel struct {
	nft knftables.Interface
}

// Apply runs ops as one knftables transaction.
func (k *knftKernel) Apply(ctx context.Context, ops opList) error {
	if ops.len() == 0 {
		return nil
	}
	tx := k.nft.NewTransaction()
	for o := range ops.all {
		switch o.verb {
		case opAdd:
			tx.Add(o.object())
		case opFlush:
			tx.Flush(o.object())
		case opDelete:
			tx.Delete(o.object())
		}
	}
	if err := k.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("running nftables transaction of %d operations: %w", ops.len(), err)
	}
	return nil
}

// ApplyStages runs the stages one after the other.
func (k *knftKernel) ApplyStages(ctx context.Context, stages <-chan func() opList) error {
	for stage := range stages {
		if err := k.Apply(ctx, stage()); err != nil {
			return err
		}
	}
	return nil
}

func (k *knftKernel) List(ctx context.Context, objectType string) ([]string, error) {
	names, err := k.nft.List(ctx, objectType)
	if isNotFound(err) {
		return nil, nil
	}
	return names, err
}

func (k *knftKernel) ListElements(ctx context.Context, s *set) (map[string]string, error) {
	typ := "set"
	if s.IsMap {
		typ = "map"
	}
	elems, err := k.nft.ListElements(ctx, typ, s.Name)
	if err != nil {
		return nil, err
	}
	m := make(map[string]string, len(elems))
	for _, e := range elems {
		m[strings.Join(e.Key, fieldSep)] = strings.Join(e.Value, fieldSep)
	}
	return m, nil
}

func (k *knftKernel) ListRanges(ctx context.Context, s *set) ([]kernelRange, error) {
	elems, err := k.ListElements(ctx, s)
	if err != nil {
		return nil, err
	}
	out := make([]kernelRange, 0, len(elems))
	for key, value := range elems {
		lo, hi, err := parseRange(key)
		if err != nil {
			return nil, fmt.Errorf("element of %s: %w", s.Name, err)
		}
		a, p, _ := strings.Cut(value, fieldSep)
		addr, err1 := netip.ParseAddr(a)
		port, err2 := strconv.ParseUint(p, 10, 16)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("element of %s: bad endpoint %q", s.Name, value)
		}
		out = append(out, kernelRange{lo: lo, hi: hi, addr: addr, port: uint16(port)})
	}
	slices.SortFunc(out, func(a, b kernelRange) int { return cmp.Compare(a.lo, b.lo) })
	return out, nil
}

func (k *knftKernel) MissingChain(ctx context.Context, names []string) (string, error) {
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
	rules, err := k.nft.ListRules(ctx, chain)
	return len(rules), err
}

// isNotFound reports whether err says the table (or object) does not exist.
// google/nftables loses the errno (it wraps with %v), hence the text match.
func isNotFound(err error) bool {
	return err != nil && (knftables.IsNotFound(err) || errors.Is(err, syscall.ENOENT) ||
		strings.Contains(err.Error(), syscall.ENOENT.Error()))
}
