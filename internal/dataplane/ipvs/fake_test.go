package ipvs

import (
	"fmt"
	"net/netip"
	"strings"
	"syscall"

	libipvs "github.com/moby/ipvs"

	"github.com/kproxy/kproxy/internal/model"
)

// fakeKernel is an in-memory kernel: IPVS services and destinations, the
// dummy's addresses, ip sets (from `ipset restore` input) and what was
// written to iptables. It counts every change, so tests can tell that a
// sync changed nothing.
type fakeKernel struct {
	svcs    map[string]*libipvs.Service
	dests   map[string]map[string]*libipvs.Destination
	dummy   bool
	addrs   map[netip.Addr]bool
	local   []netip.Addr
	sets    map[string]map[string]bool
	rules   map[model.Family]string
	jumps   map[string]bool
	sysctls map[string]int
	writes  []string // every change, in order
	// noSched are schedulers this kernel lacks: a service asking for one
	// is refused with ENOENT, as ip_vs_ctl refuses it.
	noSched map[string]bool
	// release is KernelRelease's answer ("" is "6.1.0-57-amd64").
	release string
}

func newFakeKernel(local ...string) *fakeKernel {
	k := &fakeKernel{svcs: map[string]*libipvs.Service{}, dests: map[string]map[string]*libipvs.Destination{},
		addrs: map[netip.Addr]bool{}, sets: map[string]map[string]bool{}, rules: map[model.Family]string{},
		jumps: map[string]bool{}, sysctls: map[string]int{}}
	for _, a := range local {
		k.local = append(k.local, netip.MustParseAddr(a))
	}
	return k
}

func svcKey(s *libipvs.Service) string {
	a, _ := netip.AddrFromSlice(s.Address)
	return fmt.Sprintf("%d %s", s.Protocol, netip.AddrPortFrom(a.Unmap(), s.Port))
}

func destKey(d *libipvs.Destination) string {
	a, _ := netip.AddrFromSlice(d.Address)
	return netip.AddrPortFrom(a.Unmap(), d.Port).String()
}

func (k *fakeKernel) log(format string, args ...any) {
	k.writes = append(k.writes, fmt.Sprintf(format, args...))
}

func (k *fakeKernel) Services() ([]*libipvs.Service, error) {
	var out []*libipvs.Service
	for _, s := range k.svcs {
		c := *s
		c.Flags |= flagHashed
		out = append(out, &c)
	}
	return out, nil
}

func (k *fakeKernel) Destinations(s *libipvs.Service) ([]*libipvs.Destination, error) {
	var out []*libipvs.Destination
	for _, d := range k.dests[svcKey(s)] {
		c := *d
		out = append(out, &c)
	}
	return out, nil
}

func (k *fakeKernel) NewService(s *libipvs.Service) error {
	if k.svcs[svcKey(s)] != nil {
		return syscall.EEXIST
	}
	if k.noSched[s.SchedName] {
		return syscall.ENOENT
	}
	c := *s
	k.svcs[svcKey(s)] = &c
	k.dests[svcKey(s)] = map[string]*libipvs.Destination{}
	k.log("new service %s %s", svcKey(s), s.SchedName)
	return nil
}

func (k *fakeKernel) UpdateService(s *libipvs.Service) error {
	if k.svcs[svcKey(s)] == nil || k.noSched[s.SchedName] {
		return syscall.ENOENT
	}
	c := *s
	k.svcs[svcKey(s)] = &c
	k.log("update service %s %s", svcKey(s), s.SchedName)
	return nil
}

func (k *fakeKernel) DelService(s *libipvs.Service) error {
	if k.svcs[svcKey(s)] == nil {
		return syscall.ENOENT
	}
	delete(k.svcs, svcKey(s))
	delete(k.dests, svcKey(s))
	k.log("del service %s", svcKey(s))
	return nil
}

func (k *fakeKernel) NewDestination(s *libipvs.Service, d *libipvs.Destination) error {
	m := k.dests[svcKey(s)]
	if m == nil {
		return syscall.ENOENT
	}
	c := *d
	m[destKey(d)] = &c
	k.log("new dest %s %s w%d", svcKey(s), destKey(d), d.Weight)
	return nil
}

func (k *fakeKernel) UpdateDestination(s *libipvs.Service, d *libipvs.Destination) error {
	m := k.dests[svcKey(s)]
	old := m[destKey(d)]
	if old == nil {
		return syscall.ENOENT
	}
	old.Weight = d.Weight
	k.log("update dest %s %s w%d", svcKey(s), destKey(d), d.Weight)
	return nil
}

func (k *fakeKernel) DelDestination(s *libipvs.Service, d *libipvs.Destination) error {
	delete(k.dests[svcKey(s)], destKey(d))
	k.log("del dest %s %s", svcKey(s), destKey(d))
	return nil
}

func (k *fakeKernel) SetTimeouts(c *libipvs.Config) error {
	k.log("timeouts %v %v %v", c.TimeoutTCP, c.TimeoutTCPFin, c.TimeoutUDP)
	return nil
}

func (k *fakeKernel) EnsureDummy() error {
	if !k.dummy {
		k.dummy = true
		k.log("dummy")
	}
	return nil
}

func (k *fakeKernel) DummyAddrs() ([]netip.Addr, error) {
	var out []netip.Addr
	for a := range k.addrs {
		out = append(out, a)
	}
	return out, nil
}

func (k *fakeKernel) AddDummyAddr(a netip.Addr) error {
	k.addrs[a] = true
	k.log("bind %s", a)
	return nil
}

func (k *fakeKernel) DelDummyAddr(a netip.Addr) error {
	delete(k.addrs, a)
	k.log("unbind %s", a)
	return nil
}

func (k *fakeKernel) DeleteDummy() error {
	k.dummy, k.addrs = false, map[netip.Addr]bool{}
	return nil
}

func (k *fakeKernel) LocalAddrs() ([]netip.Addr, error) { return k.local, nil }

func (k *fakeKernel) SetMembers() (map[string][]string, error) {
	out := map[string][]string{}
	for name, ms := range k.sets {
		out[name] = []string{}
		for m := range ms {
			out[name] = append(out[name], m)
		}
	}
	return out, nil
}

func (k *fakeKernel) IPSetRestore(input string) error {
	for _, l := range strings.Split(strings.TrimSpace(input), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "create":
			if k.sets[f[1]] == nil {
				k.sets[f[1]] = map[string]bool{}
			}
		case "add":
			if k.sets[f[1]] == nil {
				return fmt.Errorf("ipset: set %s does not exist", f[1])
			}
			k.sets[f[1]][f[2]] = true
		case "del":
			delete(k.sets[f[1]], f[2])
		case "destroy":
			delete(k.sets, f[1])
		}
		k.log("ipset %s", l)
	}
	return nil
}

func (k *fakeKernel) IPTablesRestore(fam model.Family, input string) error {
	k.rules[fam] = input
	k.log("iptables-restore %s", fam)
	return nil
}

func (k *fakeKernel) EnsureJump(fam model.Family, j jump) error {
	key := fmt.Sprint(fam, j)
	if !k.jumps[key] {
		k.jumps[key] = true
		k.log("jump %s", key)
	}
	return nil
}

func (k *fakeKernel) Has(string) bool { return true }

func (k *fakeKernel) KernelRelease() (string, error) {
	if k.release == "" {
		return "6.1.0-57-amd64", nil
	}
	return k.release, nil
}

func (k *fakeKernel) WriteSysctl(name string, v int) error {
	if k.sysctls[name] != v {
		k.sysctls[name] = v
		k.log("sysctl %s=%d", name, v)
	}
	return nil
}

// reals returns the real servers of a virtual server ("6 198.19.0.1:80"
// for TCP) with their weights.
func (k *fakeKernel) reals(svc string) map[string]int {
	out := map[string]int{}
	for a, d := range k.dests[svc] {
		out[a] = d.Weight
	}
	return out
}
