package nftables

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// nlKernel is the real kernel: every read and every transaction goes over
// netlink in the calling thread's network namespace; the nft binary is
// never run. Transactions are nlBatch batches (atomic, like `nft -f`).
type nlKernel struct {
	nl *netlinkReader
	// sets are the shared sets and maps, for encoding their elements.
	sets map[string]*set
	// batches counts transactions sent (for tests).
	batches int
	// gen is shared by the Proxier's families.
	gen *genTracker
}

// genTracker holds the nftables ruleset generation at which every family's
// table was last known intact: checked by Drifted, or written by kproxy's
// own batches with nobody else committing in between. 0 means unknown.
type genTracker struct{ verified uint32 }

var _ kernel = (*nlKernel)(nil)

// Apply sends ops as one netlink batch.
func (k *nlKernel) Apply(_ context.Context, ops opList) error {
	if ops.len() == 0 {
		return nil
	}
	b, err := k.nl.encode(ops, k.sets)
	if err != nil {
		k.gen.verified = 0
		return fmt.Errorf("transaction of %d operations: %w", ops.len(), err)
	}
	return k.send(b, ops.len())
}

// ApplyStages sends each stage as its own batch. While the kernel takes
// one stage, the next is made and encoded in another goroutine (on another
// core: the kernel's share of a cold sync at 10k Services is ~0.6 s); the
// batches are sent from the calling goroutine, so into its network
// namespace. At most two batches exist at a time, and their chunks are
// reused from one stage to the next.
func (k *nlKernel) ApplyStages(_ context.Context, stages <-chan func() opList) error {
	type encoded struct {
		b   *nlBatch
		n   int
		err error
	}
	next := make(chan encoded)
	stop := make(chan struct{})
	pool := &nfnl.Pool{}
	defer close(stop)
	go func() {
		defer close(next)
		for stage := range stages {
			var e encoded
			if err := catch("encoding a stage", func() {
				ops := stage()
				if e.n = ops.len(); e.n > 0 {
					e.b, e.err = k.nl.encodePooled(ops, k.sets, pool)
				}
			}); err != nil {
				e.err = err
			}
			select {
			case next <- e:
			case <-stop:
				return
			}
			if e.err != nil {
				return
			}
		}
	}()
	for e := range next {
		if e.err != nil {
			k.gen.verified = 0
			return fmt.Errorf("transaction of %d operations: %w", e.n, e.err)
		}
		if e.n == 0 {
			continue
		}
		err := k.send(e.b, e.n)
		e.b.Release()
		if err != nil {
			return err
		}
	}
	return nil
}

// send sends an encoded batch of n operations and keeps the generation
// tracker: still intact only if nobody else committed before or after it.
func (k *nlKernel) send(b *nlBatch, n int) error {
	before, errBefore := rulesetGeneration()
	if err := b.send(); err != nil {
		k.gen.verified = 0
		return fmt.Errorf("sending netlink batch of %d operations: %w", n, err)
	}
	k.batches++
	after, errAfter := rulesetGeneration()
	if errBefore != nil || errAfter != nil || before != k.gen.verified || after != before+1 {
		k.gen.verified = 0
	} else {
		k.gen.verified = after
	}
	return nil
}

// List returns the names of the table's chains, sets or maps.
func (k *nlKernel) List(_ context.Context, objectType string) ([]string, error) {
	names, err := k.nl.list(objectType)
	if isNotFound(err) {
		return nil, nil
	}
	return names, err
}

func (k *nlKernel) ListElements(_ context.Context, s *set) (map[string]string, error) {
	return k.nl.elementMap(s)
}

func (k *nlKernel) ListRanges(_ context.Context, s *set) ([]kernelRange, error) {
	return k.nl.rangeList(s)
}

func (k *nlKernel) RuleCount(_ context.Context, chain string) (int, error) {
	return k.nl.ruleCount(chain)
}

func (k *nlKernel) MissingChain(_ context.Context, names []string) (string, error) {
	return k.nl.missingChain(names)
}

// list returns the names of objects of a type in the table.
func (n *netlinkReader) list(objectType string) ([]string, error) {
	switch objectType {
	case "chain":
		return nfnl.ChainNames(n.nfproto(), n.table.Name)
	case "set", "map":
		var names []string
		err := n.dump(unix.NFT_MSG_GETSET, func(b *nlBatch) {
			b.AttrStr(unix.NFTA_SET_TABLE, b.table)
		}, func(attrs []byte) error {
			flags := attr(attrs, unix.NFTA_SET_FLAGS)
			isMap := len(flags) == 4 && binary.BigEndian.Uint32(flags)&unix.NFT_SET_MAP != 0
			if name := attr(attrs, unix.NFTA_SET_NAME); len(name) > 0 && isMap == (objectType == "map") {
				names = append(names, strings.TrimRight(string(name), "\x00"))
			}
			return nil
		}, func() { names = names[:0] })
		return names, err
	}
	return nil, fmt.Errorf("cannot list %ss", objectType)
}

// deleteTable deletes a table of the reader's family by name; a missing
// table is no error.
func (n *netlinkReader) deleteTable(name string) error {
	b := newNLBatch(n.nfproto(), name, 256)
	m := b.Msg(unix.NFT_MSG_DELTABLE, 0)
	b.AttrStr(unix.NFTA_TABLE_NAME, name)
	b.Finish(m)
	if err := b.send(); err != nil && !errors.Is(err, syscall.ENOENT) {
		return err
	}
	return nil
}

func newNLKernel(f model.Family, table string, gen *genTracker) *nlKernel {
	k := &nlKernel{nl: newNetlinkReader(f, table), sets: map[string]*set{}, gen: gen}
	for _, s := range newRenderer(dataplane.Config{}, f, model.NodeInfo{}).knownSets() {
		k.sets[s.Name] = s
	}
	return k
}
