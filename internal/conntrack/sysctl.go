package conntrack

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
)

// Paths of the conntrack tunables kproxy sets.
const (
	sysctlDir    = "/proc/sys/net/netfilter/"
	hashsizePath = "/sys/module/nf_conntrack/parameters/hashsize"
	// maxConntrackLimit caps maxPerCore × cores, as upstream does.
	maxConntrackLimit = 1 << 20
)

// IntFiles reads and writes files holding one integer (sysctls, module
// parameters). HostFiles is the real one; tests use a map.
type IntFiles interface {
	ReadInt(path string) (int, error)
	WriteInt(path string, value int) error
}

// HostFiles returns the IntFiles of this host (/proc/sys, /sys).
func HostFiles() IntFiles { return hostFiles{} }

type hostFiles struct{}

func (hostFiles) ReadInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

func (hostFiles) WriteInt(path string, value int) error {
	return os.WriteFile(path, []byte(strconv.Itoa(value)), 0o640)
}

// ApplySysctls sets the nf_conntrack sysctls from the conntrack block of the
// KubeProxyConfiguration, as upstream kube-proxy v1.36 does at start:
// nf_conntrack_max = maxPerCore × numCPU (at least min, at most 2^20; unset
// when maxPerCore is 0), the conntrack hash size raised to max/4 when smaller,
// and the TCP established / close-wait, be-liberal, UDP and UDP stream
// timeouts when set. A value already in place is not written. The first
// failure is returned (upstream treats it as fatal).
func ApplySysctls(ctx context.Context, cfg *kpv1alpha1.KubeProxyConntrackConfiguration, numCPU int, files IntFiles) error {
	s := setter{ctx: ctx, files: files}
	if max := ConntrackMax(cfg, numCPU); max > 0 {
		if err := s.setMax(max); err != nil {
			return err
		}
	}
	for _, kv := range timeouts(cfg) {
		if err := s.set(sysctlDir+kv.name, kv.value); err != nil {
			return err
		}
	}
	return nil
}

// ConntrackMax returns the nf_conntrack_max to set, 0 for none.
func ConntrackMax(cfg *kpv1alpha1.KubeProxyConntrackConfiguration, numCPU int) int {
	if cfg.MaxPerCore == nil || *cfg.MaxPerCore <= 0 {
		return 0
	}
	scaled := int(*cfg.MaxPerCore) * numCPU
	floor := 0
	if cfg.Min != nil {
		floor = int(*cfg.Min)
	}
	switch {
	case scaled > maxConntrackLimit:
		return maxConntrackLimit
	case scaled > floor:
		return scaled
	default:
		return floor
	}
}

type sysctlValue struct {
	name  string
	value int
}

// timeouts lists the sysctls after nf_conntrack_max, in upstream's order.
func timeouts(cfg *kpv1alpha1.KubeProxyConntrackConfiguration) []sysctlValue {
	var out []sysctlValue
	seconds := func(d time.Duration) int { return int(d / time.Second) }
	if cfg.TCPEstablishedTimeout != nil && cfg.TCPEstablishedTimeout.Duration > 0 {
		out = append(out, sysctlValue{"nf_conntrack_tcp_timeout_established", seconds(cfg.TCPEstablishedTimeout.Duration)})
	}
	if cfg.TCPCloseWaitTimeout != nil && cfg.TCPCloseWaitTimeout.Duration > 0 {
		out = append(out, sysctlValue{"nf_conntrack_tcp_timeout_close_wait", seconds(cfg.TCPCloseWaitTimeout.Duration)})
	}
	if cfg.TCPBeLiberal {
		out = append(out, sysctlValue{"nf_conntrack_tcp_be_liberal", 1})
	}
	if cfg.UDPTimeout.Duration > 0 {
		out = append(out, sysctlValue{"nf_conntrack_udp_timeout", seconds(cfg.UDPTimeout.Duration)})
	}
	if cfg.UDPStreamTimeout.Duration > 0 {
		out = append(out, sysctlValue{"nf_conntrack_udp_timeout_stream", seconds(cfg.UDPStreamTimeout.Duration)})
	}
	return out
}

type setter struct {
	ctx   context.Context
	files IntFiles
}

// setMax sets nf_conntrack_max and makes the hash table at least max/4.
func (s setter) setMax(max int) error {
	klog.FromContext(s.ctx).Info("Setting nf_conntrack_max", "nfConntrackMax", max)
	if err := s.set(sysctlDir+"nf_conntrack_max", max); err != nil {
		return err
	}
	hashsize, err := s.files.ReadInt(hashsizePath)
	if err != nil {
		return fmt.Errorf("reading conntrack hashsize: %w", err)
	}
	if hashsize >= max/4 {
		return nil
	}
	klog.FromContext(s.ctx).Info("Setting conntrack hashsize", "conntrackHashsize", max/4)
	if err := s.files.WriteInt(hashsizePath, max/4); err != nil {
		return fmt.Errorf("setting conntrack hashsize to %d: %w", max/4, err)
	}
	return nil
}

// set writes value to path unless it is already there. A read error is not
// fatal: the write decides.
func (s setter) set(path string, value int) error {
	if cur, err := s.files.ReadInt(path); err == nil && cur == value {
		return nil
	}
	klog.FromContext(s.ctx).Info("Set sysctl", "entry", strings.TrimPrefix(path, "/proc/sys/"), "value", value)
	if err := s.files.WriteInt(path, value); err != nil {
		return fmt.Errorf("setting %s to %d: %w", path, value, err)
	}
	return nil
}

// NumCPU returns the number of online CPUs of the machine from
// /sys/devices/system/cpu/online (upstream also counts from sysfs rather than
// the process's affinity mask), falling back to runtime.NumCPU.
func NumCPU() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err == nil {
		if n := countCPUList(strings.TrimSpace(string(b))); n > 0 {
			return n
		}
	}
	return runtime.NumCPU()
}

// countCPUList counts the CPUs in a kernel CPU list such as "0-3,8,10-11";
// 0 when it cannot be parsed.
func countCPUList(list string) int {
	n := 0
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0
			}
		}
		n += b - a + 1
	}
	return n
}
