package netbed

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// Netns is one named network namespace (/run/netns/<Name>) of the testbed.
type Netns struct {
	Name string // full name, prefix included
	bed  *Bed
}

// cmdTimeout bounds every helper command (ip, sysctl, nft, ...). In the
// IPVS VM (test/vm, KPROXY_VM set) every program runs under emulation,
// ~30 times slower to start: four times the bound.
var cmdTimeout = func() time.Duration {
	if os.Getenv("KPROXY_VM") != "" {
		return 2 * time.Minute
	}
	return 30 * time.Second
}()

// Run runs argv inside the namespace (through `ip netns exec`) and returns
// its combined output. A non-zero exit is an error that includes the output.
func (n *Netns) Run(ctx context.Context, argv ...string) (string, error) {
	return run(ctx, append([]string{"ip", "netns", "exec", n.Name}, argv...)...)
}

// IP runs `ip -n <ns> args...`.
func (n *Netns) IP(ctx context.Context, args ...string) (string, error) {
	return run(ctx, append([]string{"ip", "-n", n.Name}, args...)...)
}

// Do runs fn on an OS thread switched into the namespace. Sockets fn opens
// belong to the namespace; goroutines fn starts do not run in it. If the
// thread cannot be switched back, it is discarded rather than reused.
func (n *Netns) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("netbed: current netns: %w", err)
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(n.Name)
		if err != nil {
			errc <- fmt.Errorf("netbed: open netns %s: %w", n.Name, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("netbed: enter netns %s: %w", n.Name, err)
			return
		}
		ferr := fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- ferr
	}()
	return <-errc
}

// Send sends one echo request from this namespace (in-process, no exec).
func (n *Netns) Send(ctx context.Context, req echo.Request) echo.Result {
	var res echo.Result
	err := n.Do(func() error {
		res = echo.Send(ctx, req)
		return nil
	})
	if err != nil {
		return echo.Result{Kind: echo.KindOther, Err: err}
	}
	return res
}

// SendN sends count requests one after the other (count is capped at 10000)
// and returns every result.
func (n *Netns) SendN(ctx context.Context, req echo.Request, count int) []echo.Result {
	count = min(count, 10000)
	out := make([]echo.Result, 0, count)
	for range count {
		if ctx.Err() != nil {
			break
		}
		out = append(out, n.Send(ctx, req))
	}
	return out
}

// Sysctl writes key=value (dotted key, as sysctl(8) takes it) in the namespace.
func (n *Netns) Sysctl(key, value string) error {
	path := filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
	return n.Do(func() error {
		if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
			return fmt.Errorf("netbed: sysctl %s=%s in %s: %w", key, value, n.Name, err)
		}
		return nil
	})
}

// AddRoute adds a route to dst via gw inside the namespace.
func (n *Netns) AddRoute(ctx context.Context, dst netip.Prefix, gw netip.Addr) error {
	_, err := n.IP(ctx, family(dst.Addr()), "route", "replace", dst.String(), "via", gw.String())
	return err
}

// Start starts argv inside the namespace as a tracked process whose output
// goes to <LogDir>/<namespace>-<name>.log. The Bed stops it at Teardown.
func (n *Netns) Start(name string, argv ...string) (*Process, error) {
	return n.bed.start(n, name, argv)
}

// NftList returns `nft list table <family> <table>` run in the namespace.
func (n *Netns) NftList(ctx context.Context, family, table string) (string, error) {
	return n.Run(ctx, "nft", "list", "table", family, table)
}

// IptablesSave returns iptables-save (ip6tables-save when ipv6) run in the namespace.
func (n *Netns) IptablesSave(ctx context.Context, ipv6 bool) (string, error) {
	if ipv6 {
		return n.Run(ctx, "ip6tables-save")
	}
	return n.Run(ctx, "iptables-save")
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "-4"
	}
	return "-6"
}

// run executes argv with a bounded time and returns its combined output.
func run(ctx context.Context, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("netbed: %s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}
