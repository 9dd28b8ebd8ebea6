package dptest

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/model"
)

// ScaleSnapshot is the one shape every dataplane's scale tests and
// benchmarks load, so that their figures compare: n ClusterIP Services
// (namespace "ns", names svc-00000...) on port 80 with eps endpoints each
// on 8080, every tenth also a NodePort (30000 + i/10) while the NodePort
// range lasts (the first 27,680 Services: the API never gives two Services
// one node port, and a snapshot that did made each endpoint change of such
// a Service re-validate the whole table), and with KPROXY_SCALE_AFFINITY set every tenth (i%10 ==
// 1) ClientIP affinity, as the scale benchmark does. ClusterIPs are
// 198.19.(i>>8).(i&255) (beyond 198.19.255.255 past 65,536 Services);
// endpoint k is 198.18.4.0 + k, wrapping inside 198.18.0.0/16 (Services
// past 64,512 endpoints share addresses, as Services may share pods).
func ScaleSnapshot(n, eps int) *model.Snapshot {
	affinity := os.Getenv("KPROXY_SCALE_AFFINITY") != ""
	ports := make([]*model.ServicePort, 0, n)
	for i := range n {
		list := make([]*model.Endpoint, 0, eps)
		for j := range eps {
			a := 0xC6120000 + 1024 + uint32((i*eps+j)%64512)
			list = append(list, EP(netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}).String(), 8080, false))
		}
		opts := []SvcOpt{WithEPs(list...)}
		if i%10 == 0 && i/10 < nodePorts {
			opts = append(opts, WithNodePort(uint16(30000+i/10)))
		}
		if i%10 == 1 && affinity {
			opts = append(opts, WithAffinity(10800))
		}
		ip := netip.AddrFrom4([4]byte{198, byte(19 + i>>16), byte(i >> 8), byte(i)})
		ports = append(ports, Svc("ns", fmt.Sprintf("svc-%05d", i), ip.String(), 80, opts...))
	}
	return Snapshot(ports...)
}

// nodePorts is the size of the API server's default NodePort range
// (30000–32767).
const nodePorts = 2768

// ScaleSizes are the Service counts a scale test runs: KPROXY_SCALE_SIZES
// (comma-separated), else def.
func ScaleSizes(t testing.TB, def string) []int {
	t.Helper()
	s := def
	if env := os.Getenv("KPROXY_SCALE_SIZES"); env != "" {
		s = env
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			t.Fatalf("KPROXY_SCALE_SIZES: %q is not a Service count", f)
		}
		out = append(out, n)
	}
	return out
}
