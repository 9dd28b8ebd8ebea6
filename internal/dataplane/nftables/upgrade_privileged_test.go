package nftables

import (
	"context"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// TestPrivilegedUpgradeFromPreviousLayout: a table an earlier version
// wrote is taken over by one full sync, and its leftovers (old chains, then
// the maps only they used) are deleted once unreferenced, leaving exactly
// what a fresh table would hold. testdata/previous-layout.nft has
// exact-key endpoints maps, verdict maps for frontends without endpoints
// and policy chains named by endpoint count; testdata/32-maps-layout.nft
// (the features golden of eaae972) has 32 TCP endpoint-ranges maps,
// whose chains mostly hash to other maps now;
// testdata/every-map-layout.nft (the features golden of e03eaa5, in table
// kproxy) has every endpoint-ranges map, used or not: those no chain uses
// go too.
func TestPrivilegedUpgradeFromPreviousLayout(t *testing.T) {
	for _, tc := range []struct{ file, keptUntilUnused string }{
		{"testdata/previous-layout.nft", "map endpoints-tcp-"},
		{"testdata/32-maps-layout.nft", ""},
		{"testdata/every-map-layout.nft", ""},
	} {
		t.Run(filepath.Base(tc.file), func(t *testing.T) { upgradeFrom(t, tc.file, tc.keptUntilUnused) })
	}
}

func upgradeFrom(t *testing.T, file, keptUntilUnused string) {
	n := newTestNet(t)
	old, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	loaded := filepath.Join(t.TempDir(), "old.nft")
	if err := os.WriteFile(loaded, []byte(withoutAffinityLookups(string(old))), 0o600); err != nil {
		t.Fatal(err)
	}
	dptest.Run(t, "ip", "netns", "exec", n.Node, "nft", "-f", loaded)

	cfg := dptest.Config()
	cfg.TableName = legacyTable // where the files' layouts were written
	cfg.Families = []model.Family{model.IPv4, model.IPv6}
	cfg.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("198.19.0.0/24"), netip.MustParsePrefix("fd00:19::/112")}
	clk := testingclock.NewFakePassiveClock(time.Now())
	p, _ := New(cfg, WithClock(clk))
	snap := featureSnapshot()
	n.sync(p, snap, dataplane.SyncRequest{Full: true})
	if l := listTableNamed(t, n.Node, "ip", legacyTable); keptUntilUnused != "" && !strings.Contains(l, keptUntilUnused) {
		t.Error("the old endpoints maps went in the takeover, while old chains may still use them")
	}
	clk.SetTime(clk.Now().Add(2 * staleDelay))
	n.sync(p, snap, dataplane.SyncRequest{})

	for _, f := range cfg.Families {
		st := p.fams[f]
		wantChains := map[string]bool{}
		for _, ps := range st.cur.Ports {
			for _, c := range ps.Chains {
				wantChains[c.Name] = true
			}
		}
		n.In(n.Node, func() {
			if err := st.readKernel(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
		for name := range st.kChains {
			if !wantChains[name] {
				t.Errorf("%s: leftover chain %s", f, name)
			}
		}
		for name := range wantChains {
			if !st.kChains[name] {
				t.Errorf("%s: chain %s missing", f, name)
			}
		}
		for name := range st.kSets {
			t.Errorf("%s: leftover set or map %s", f, name)
		}
		used := map[string]bool{}
		for _, ps := range st.cur.Ports {
			for _, f := range ps.Fills {
				name, _ := keyShard(f.key)
				used[name] = true
			}
		}
		if !maps.Equal(st.kMaps, used) {
			t.Errorf("%s: endpoint-ranges maps %v, want those in use %v", f, sortedNames(st.kMaps, 200), sortedNames(used, 200))
		}
		for name, elems := range st.wantText() {
			for k, v := range elems {
				if got, ok := st.readText(name)[k]; !ok || got != v {
					t.Errorf("%s: element %s %q reads back as %q (present %v), rendered %q", f, name, k, got, ok, v)
				}
			}
			if len(st.readText(name)) != len(elems) {
				t.Errorf("%s: %s holds %d elements, want %d", f, name, len(st.readText(name)), len(elems))
			}
		}
	}
}
