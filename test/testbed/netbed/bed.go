package netbed

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Options configure a Bed.
type Options struct {
	// Prefix starts every namespace and root-namespace link name; default
	// "kpt<pid>-". Keep it short: <Prefix>h must fit in 15 characters.
	Prefix string
	// Layout is the address plan; a Layout without nodes means DefaultLayout().
	Layout Layout
	// EchoBinary is the kproxy-echo binary that pods run. Required for AddPod.
	EchoBinary string
	// LogDir receives one log file per started process; default a new
	// directory under os.TempDir().
	LogDir string
	// Logf receives progress lines (t.Logf fits); nil discards.
	Logf func(format string, args ...any)
}

// Bed is one testbed. New only records the options; Up builds it.
type Bed struct {
	opts   Options
	prefix string
	logDir string
	ownLog bool // logDir was made by Up

	Hub     *Netns
	nodes   []*Node
	clients []*Netns

	mu         sync.Mutex
	pods       []*Pod
	procs      []*Process
	rootRoutes []string // blackhole routes Up added in the root namespace
}

// Node is a node namespace with its pod bridge (cbr0).
type Node struct {
	*Netns
	Spec NodeSpec
	// Gateway4/Gateway6 are the pod bridge's addresses (first of each pod CIDR).
	Gateway4, Gateway6 netip.Addr
	nextPod            int
}

// New returns an unbuilt Bed. It has no side effects.
func New(opts Options) *Bed {
	prefix := opts.Prefix
	if prefix == "" {
		prefix = fmt.Sprintf("kpt%d-", os.Getpid())
	}
	if len(opts.Layout.Nodes) == 0 {
		opts.Layout = DefaultLayout()
	}
	return &Bed{opts: opts, prefix: prefix}
}

// Prefix returns the name prefix of everything this Bed creates.
func (b *Bed) Prefix() string { return b.prefix }

// LogDir returns the directory holding the process logs.
func (b *Bed) LogDir() string { return b.logDir }

// Layout returns the address plan.
func (b *Bed) Layout() Layout { return b.opts.Layout }

// Nodes returns the node namespaces in Layout order.
func (b *Bed) Nodes() []*Node { return b.nodes }

// Node returns the node with the given name, or nil.
func (b *Bed) Node(name string) *Node {
	for _, n := range b.nodes {
		if n.Spec.Name == name {
			return n
		}
	}
	return nil
}

// Clients returns the client namespaces in Layout order.
func (b *Bed) Clients() []*Netns { return b.clients }

// Client returns the first client namespace.
func (b *Bed) Client() *Netns { return b.clients[0] }

// Pods returns every pod added so far.
func (b *Bed) Pods() []*Pod {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*Pod(nil), b.pods...)
}

// Namespaces returns every namespace of the Bed: hub, nodes, clients, pods.
func (b *Bed) Namespaces() []*Netns {
	out := []*Netns{b.Hub}
	for _, n := range b.nodes {
		out = append(out, n.Netns)
	}
	out = append(out, b.clients...)
	for _, p := range b.Pods() {
		out = append(out, p.Netns)
	}
	return out
}

func (b *Bed) logf(format string, args ...any) {
	if b.opts.Logf != nil {
		b.opts.Logf(format, args...)
	}
}

// Up builds the hub, the nodes and the clients. On error the caller must
// still call Teardown, which removes whatever was created.
func (b *Bed) Up(ctx context.Context) error {
	l := b.opts.Layout
	if err := l.Validate(); err != nil {
		return err
	}
	if len(b.prefix)+1 > 15 {
		return fmt.Errorf("netbed: prefix %q too long", b.prefix)
	}
	if err := b.makeLogDir(); err != nil {
		return err
	}
	if b.opts.EchoBinary != "" {
		abs, err := filepath.Abs(b.opts.EchoBinary)
		if err != nil {
			return fmt.Errorf("netbed: echo binary: %w", err)
		}
		b.opts.EchoBinary = abs
	}
	steps := []func(context.Context) error{b.upHub, b.upHostLink, b.upNodes, b.upClients}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return err
		}
	}
	b.logf("netbed: up: prefix=%s nodes=%d clients=%d logs=%s", b.prefix, len(b.nodes), len(b.clients), b.logDir)
	return nil
}

func (b *Bed) makeLogDir() error {
	b.logDir = b.opts.LogDir
	if b.logDir == "" {
		d, err := os.MkdirTemp("", b.prefix+"logs-")
		if err != nil {
			return fmt.Errorf("netbed: log dir: %w", err)
		}
		b.logDir, b.ownLog = d, true
	}
	return os.MkdirAll(b.logDir, 0o755)
}

// RemoveLogs deletes the log directory if Up created it.
func (b *Bed) RemoveLogs() error {
	if !b.ownLog {
		return nil
	}
	return os.RemoveAll(b.logDir)
}

// Teardown stops every process the Bed started (by PID), deletes every
// namespace whose name starts with the prefix, the root-namespace link and
// the blackhole routes Up added. It is safe to call more than once.
func (b *Bed) Teardown() error {
	var errs []error
	b.mu.Lock()
	procs := b.procs
	b.procs = nil
	b.mu.Unlock()
	for _, p := range procs {
		if err := p.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, b.teardownRoot()...)
	errs = append(errs, DeleteNamespaces(b.prefix)...)
	return errors.Join(errs...)
}

// DeleteNamespaces deletes every named network namespace starting with
// prefix. The prefix must be non-empty.
func DeleteNamespaces(prefix string) []error {
	if prefix == "" {
		return []error{errors.New("netbed: refusing empty prefix")}
	}
	entries, err := os.ReadDir("/run/netns")
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return []error{fmt.Errorf("netbed: list namespaces: %w", err)}
	}
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		if _, err := run(context.Background(), "ip", "netns", "delete", e.Name()); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
