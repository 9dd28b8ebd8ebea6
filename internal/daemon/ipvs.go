package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/config"
)

// IPVS mode falls back to iptables mode when the kernel or the node lacks
// what it needs, as kube-proxy did before it made the failure fatal: an
// operator who asked for ipvs on a node without it keeps working Services,
// and the warning names what is missing. /proxyMode, /configz and the
// metrics then report iptables, the mode in use.

// ipvsFallback returns o, or a copy of it in iptables mode when ipvs is
// asked for and cannot run: missing lists why (nil when it can run).
func ipvsFallback(o *config.Options, e env) *config.Options {
	if string(o.Config.Mode) != ModeIPVS {
		return o
	}
	var missing []string
	if _, ok := e.dataplanes[ModeIPVS]; !ok {
		missing = append(missing, "this kproxy binary has no ipvs dataplane")
	} else if e.ipvsSupport != nil {
		missing = e.ipvsSupport(o.Config.IPVS.Scheduler)
	}
	if len(missing) == 0 {
		return o
	}
	klog.Background().Info("Warning: IPVS mode cannot run on this node; falling back to iptables mode",
		"missing", missing)
	fallback := *o
	cfg := *o.Config
	cfg.Mode = ModeIPTables
	fallback.Config = &cfg
	return &fallback
}

// kernelIPVSSupport lists what this node lacks for IPVS mode: the ip_vs
// module (loaded on demand with modprobe, as upstream does), the module of
// the scheduler, the ip_vs conntrack sysctl, and ipset (version 6 or
// later). It returns nil when nothing is missing.
func kernelIPVSSupport(scheduler string) []string {
	if scheduler == "" {
		scheduler = "rr"
	}
	var missing []string
	if !moduleLoaded("ip_vs", "/proc/net/ip_vs") {
		return append(missing, "kernel module ip_vs (no /proc/net/ip_vs, modprobe ip_vs failed)")
	}
	if !moduleLoaded("ip_vs_"+scheduler, "/sys/module/ip_vs_"+scheduler) {
		missing = append(missing, "kernel module ip_vs_"+scheduler+" (scheduler "+scheduler+")")
	}
	if _, err := os.Stat("/proc/sys/net/ipv4/vs/conntrack"); err != nil {
		missing = append(missing, "sysctl net.ipv4.vs.conntrack")
	}
	if err := ipsetUsable(); err != nil {
		missing = append(missing, err.Error())
	}
	return missing
}

// moduleLoaded reports whether path exists, or the kernel has module built
// in (modules.builtin: a built-in module without parameters, such as
// ip_vs_rr, has no /sys/module entry), trying modprobe module once when
// neither holds. Upstream tries a virtual server with the scheduler instead.
func moduleLoaded(module, path string) bool {
	if _, err := os.Stat(path); err == nil {
		return true
	}
	if builtinModule(module) {
		return true
	}
	if _, err := exec.Command("modprobe", module).CombinedOutput(); err != nil {
		return false
	}
	_, err := os.Stat(path)
	return err == nil
}

// builtinModule reports whether the running kernel's modules.builtin lists
// module.
func builtinModule(module string) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	f, err := os.Open("/lib/modules/" + unix.ByteSliceToString(u.Release[:]) + "/modules.builtin")
	if err != nil {
		return false
	}
	defer f.Close()
	return listsBuiltin(f, module)
}

// listsBuiltin reports whether a modules.builtin file (one path per line,
// such as kernel/net/netfilter/ipvs/ip_vs_rr.ko) lists module.
func listsBuiltin(r io.Reader, module string) bool {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if path.Base(strings.TrimSpace(sc.Text())) == module+".ko" {
			return true
		}
	}
	return false
}

// ipsetUsable checks that the ipset program exists and is version 6 or later.
func ipsetUsable() error {
	out, err := exec.Command("ipset", "--version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ipset (%v)", err)
	}
	// "ipset v7.17, protocol version: 7"
	f := strings.Fields(string(out))
	if len(f) < 2 || !strings.HasPrefix(f[1], "v") {
		return fmt.Errorf("ipset (unrecognised version %q)", strings.TrimSpace(string(out)))
	}
	major, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(f[1], "v"), ".", 2)[0])
	if err != nil || major < 6 {
		return errors.New("ipset version 6 or later (have " + f[1] + ")")
	}
	return nil
}
