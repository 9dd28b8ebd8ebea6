//go:build e2e

package bench

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Resource accounting of the proxy process and its children (nft,
// iptables-restore, ...) from /proc: RSS summed over the process tree,
// CPU = the process's own user+system time, plus that of its children it
// has waited for (cutime/cstime), plus that of children still running.

const clockTicks = 100 // USER_HZ on Linux

var pageSize = uint64(os.Getpagesize())

// procStat is one process's /proc/<pid>/stat fields the benchmark uses.
type procStat struct {
	pid, ppid int
	startTime uint64        // clock ticks after boot: tells a reused PID apart
	cpu       time.Duration // utime+stime
	childCPU  time.Duration // cutime+cstime (waited-for children)
	rss       uint64        // bytes
}

func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 22 {
		return procStat{}, false
	}
	n := func(k int) uint64 { v, _ := strconv.ParseUint(f[k-3], 10, 64); return v }
	tick := func(v uint64) time.Duration { return time.Duration(v) * time.Second / clockTicks }
	return procStat{
		pid: pid, ppid: int(n(4)), startTime: n(22),
		cpu: tick(n(14) + n(15)), childCPU: tick(n(16) + n(17)),
		rss: n(24) * pageSize,
	}, true
}

// descendants returns the stats of every live descendant of root.
func descendants(root int) []procStat {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]procStat{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(pid); ok {
			children[st.ppid] = append(children[st.ppid], st)
		}
	}
	var out []procStat
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
	}
	return out
}

// usage is a point-in-time reading of a process tree.
type usage struct {
	rss uint64        // bytes, whole tree
	cpu time.Duration // cumulative, whole tree
	hwm uint64        // the main process's VmHWM (peak RSS since reset)
}

func readUsage(pid int) (usage, bool) {
	st, ok := readStat(pid)
	if !ok {
		return usage{}, false
	}
	u := usage{rss: st.rss, cpu: st.cpu + st.childCPU, hwm: readHWM(pid)}
	for _, c := range descendants(pid) {
		u.rss += c.rss
		u.cpu += c.cpu
	}
	return u, true
}

func readHWM(pid int) uint64 {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, found := strings.CutPrefix(line, "VmHWM:"); found {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// sampler polls a process tree every interval and keeps the peak RSS since
// the last takePeak.
type sampler struct {
	pid  int
	stop chan struct{}
	wg   sync.WaitGroup

	mu   sync.Mutex
	peak uint64
}

func startSampler(pid int, interval time.Duration) *sampler {
	s := &sampler{pid: pid, stop: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			s.sample()
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *sampler) sample() (usage, bool) {
	u, ok := readUsage(s.pid)
	if ok {
		s.mu.Lock()
		s.peak = max(s.peak, u.rss, u.hwm)
		s.mu.Unlock()
	}
	return u, ok
}

// phaseStart resets the peak (and the process's VmHWM) and returns the
// current reading.
func (s *sampler) phaseStart() usage {
	_ = os.WriteFile(filepath.Join("/proc", strconv.Itoa(s.pid), "clear_refs"), []byte("5"), 0o200)
	s.mu.Lock()
	s.peak = 0
	s.mu.Unlock()
	u, _ := s.sample()
	return u
}

// phaseEnd returns the CPU used since start, the peak RSS since the phase
// started and the current RSS.
func (s *sampler) phaseEnd(start usage) (cpu time.Duration, peak, now uint64) {
	u, _ := s.sample()
	s.mu.Lock()
	defer s.mu.Unlock()
	return u.cpu - start.cpu, s.peak, u.rss
}

func (s *sampler) close() {
	close(s.stop)
	s.wg.Wait()
}

// killDescendants sends SIGKILL to the processes in list that still run as
// the same process (same start time): children a stopped proxy left behind
// (an iptables-restore of a sync that never finished).
func killDescendants(list []procStat) {
	for _, d := range list {
		if st, ok := readStat(d.pid); ok && st.startTime == d.startTime {
			_ = syscall.Kill(d.pid, syscall.SIGKILL)
		}
	}
}
