package iptables

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
