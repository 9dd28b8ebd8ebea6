package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/vishvananda/netns"
)

// Exec runs a program. It is the only way this package reaches the kernel
// (besides Sysctl); tests replace it with a fake.
type Exec interface {
	// Run runs name with args, feeding stdin (nil for none), and returns its
	// standard output. A non-zero exit is an error that includes stderr.
	Run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error)
}

// OSExec runs programs on this host.
type OSExec struct{}

// Run implements Exec.
func (OSExec) Run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

// InNamespace runs fn in this host's network namespace (netlink sockets
// opened by fn reach it).
func (OSExec) InNamespace(fn func() error) error { return fn() }

// nsRunner is an Exec that can also run Go code where its programs run, so
// that netlink sockets reach the same kernel tables. Fakes do not have it:
// then every write goes through iptables-restore.
type nsRunner interface {
	InNamespace(fn func() error) error
}

// NetnsExec runs programs inside a named network namespace through
// `ip netns exec` (tests and tools use it to program a namespace).
type NetnsExec struct {
	Namespace string
	Exec      Exec // nil means OSExec
}

// Run implements Exec.
func (n NetnsExec) Run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	e := n.Exec
	if e == nil {
		e = OSExec{}
	}
	return e.Run(ctx, stdin, "ip", append([]string{"netns", "exec", n.Namespace, name}, args...)...)
}

// InNamespace runs fn inside the namespace, on a goroutine of its own
// whose OS thread is locked there and returned to the original namespace
// afterwards; when that return fails, the goroutine ends with the thread
// still locked, and the runtime discards the thread.
func (n NetnsExec) InNamespace(fn func() error) error {
	if n.Exec != nil {
		if _, ok := n.Exec.(OSExec); !ok {
			return fmt.Errorf("%w: exec through %T", errNotNetlink, n.Exec)
		}
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(n.Namespace)
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		fnErr := fn()
		if err := netns.Set(orig); err != nil {
			done <- errors.Join(fnErr, err) // the thread stays locked and dies
			return
		}
		runtime.UnlockOSThread()
		done <- fnErr
	}()
	return <-done
}

// Sysctl reads and writes kernel parameters ("net/ipv4/conf/all/route_localnet").
type Sysctl interface {
	Get(name string) (int, error)
	Set(name string, value int) error
}

// ProcSysctl uses /proc/sys of the current network namespace.
type ProcSysctl struct{}

// Get implements Sysctl.
func (ProcSysctl) Get(name string) (int, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", name))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// Set implements Sysctl.
func (ProcSysctl) Set(name string, value int) error {
	return os.WriteFile(filepath.Join("/proc/sys", name), []byte(strconv.Itoa(value)), 0o644)
}

// ExecSysctl runs the sysctl program through an Exec (so that NetnsExec
// reaches the namespace's parameters).
type ExecSysctl struct{ Exec Exec }

func dotted(name string) string { return strings.ReplaceAll(name, "/", ".") }

// Get implements Sysctl.
func (s ExecSysctl) Get(name string) (int, error) {
	out, err := s.Exec.Run(context.Background(), nil, "sysctl", "-n", dotted(name))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(out)))
}

// Set implements Sysctl.
func (s ExecSysctl) Set(name string, value int) error {
	_, err := s.Exec.Run(context.Background(), nil, "sysctl", "-q", "-w", dotted(name)+"="+strconv.Itoa(value))
	return err
}

const (
	sysctlRouteLocalnet = "net/ipv4/conf/all/route_localnet"
	sysctlTCPBeLiberal  = "net/netfilter/nf_conntrack_tcp_be_liberal"
)
