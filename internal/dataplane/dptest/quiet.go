package dptest

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// WaitKernelQuiet waits, at most bound, until the machine's kernel CPU time
// (system, irq and softirq of all CPUs) stays under a tenth of one CPU for
// half a second, and returns how long it waited. The kernel tears down a
// deleted network namespace in the background, and one holding a table of
// 10k Services takes it seconds of CPU: without this wait, a measurement
// started right after an earlier lab's cleanup pays for that teardown
// (measured: a 10k cold sync of 1.1 s took 3.9-6 s).
func WaitKernelQuiet(bound time.Duration) time.Duration {
	const window = 500 * time.Millisecond
	const quietTicks = 5 // a tenth of one CPU over the window, at USER_HZ 100
	start := time.Now()
	prev, ok := kernelTicks()
	for ok && time.Since(start) < bound {
		time.Sleep(window)
		cur, ok2 := kernelTicks()
		if !ok2 || cur-prev < quietTicks {
			break
		}
		prev = cur
	}
	return time.Since(start)
}

// kernelTicks sums the system, irq and softirq ticks of /proc/stat's "cpu"
// line.
func kernelTicks() (uint64, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, false
	}
	var sum uint64
	for _, i := range []int{3, 6, 7} { // system, irq, softirq
		v, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, false
		}
		sum += v
	}
	return sum, true
}
