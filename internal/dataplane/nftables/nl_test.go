package nftables

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"golang.org/x/sys/unix"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// netlinkConfigs are the configurations whose renderings the netlink tests
// translate: every detect-local mode, masquerade-all, nodePortAddresses.
var netlinkConfigs = map[string]func(*dataplane.Config){
	"cluster-cidr":   func(*dataplane.Config) {},
	"node-cidr":      func(c *dataplane.Config) { c.LocalMode = dataplane.LocalNodeCIDR },
	"bridge":         func(c *dataplane.Config) { c.LocalMode, c.BridgeInterface = dataplane.LocalBridgeInterface, "cbr0" },
	"prefix":         func(c *dataplane.Config) { c.LocalMode, c.InterfacePrefix = dataplane.LocalInterfacePrefix, "veth" },
	"masquerade-all": func(c *dataplane.Config) { c.MasqueradeAll = true; c.LocalMode = dataplane.LocalNone },
	"nodeport-addresses": func(c *dataplane.Config) {
		c.NodePortAddresses = []string{"primary", "198.18.0.0/15", "198.18.64.0/24", "fd00:1::/64", "::/0"}
	},
}

// TestNetlinkTranslatesEverything encodes the full sync of every feature,
// in both families and every detect-local mode, as a netlink batch: render
// must never produce anything the netlink path cannot send (there is no
// nft CLI fallback).
func TestNetlinkTranslatesEverything(t *testing.T) {
	eachRendering(func(name string, f model.Family, d *desired) {
		st := &famState{fam: f, kernelMirror: emptyMirror()}
		var tx txn
		st.fullOps(d, &tx)
		k := newNLKernel(f, DefaultTableName, &genTracker{})
		nt := &nlTxn{n: k.nl, b: newNLBatch(2, DefaultTableName, 0), sets: k.sets}
		count := 0
		for o := range tx.ops().all {
			count++
			if err := nt.queue(o); err != nil {
				what := "element"
				if o.obj != nil {
					what = strings.TrimSpace(strings.Join(strings.Fields(objectText(o)), " "))
				}
				t.Errorf("%s/%s: %s does not translate: %v", name, f, what, err)
			}
		}
		nt.closeElems()
		if _, _, empty := nt.b.Close(); empty || count < 50 {
			t.Errorf("%s/%s: only %d operations", name, f, count)
		}
	})
}

// eachRendering renders the feature snapshot on dptest's node under every
// configuration of netlinkConfigs, in both families.
func eachRendering(do func(config string, f model.Family, d *desired)) {
	for name, mod := range netlinkConfigs {
		cfg := dptest.Config()
		mod(&cfg)
		snap := featureSnapshot()
		snap.Node = dptest.Node()
		for _, f := range []model.Family{model.IPv4, model.IPv6} {
			do(name, f, render(cfg, snap.Family(f), snap.Node))
		}
	}
}

func objectText(o op) string {
	tx := knftables.NewFake(knftables.IPv4Family, DefaultTableName).NewTransaction()
	tx.Add(o.object())
	return tx.String()
}

// TestEndpointsTypeofUserdata compares the typeof userdata with the bytes
// nft 1.0.6 sends for `typeof numgen random mod 1 : ip daddr . tcp dport`
// (captured with nft --debug=mnl).
func TestEndpointsTypeofUserdata(t *testing.T) {
	const want = "000401000000010400000000031a00041700000001120004010000000104010000000204000000000434" +
		"00040d000000012c00140004070000000" + "10c00040c00000001040c00000001140004070000000" +
		"10c000408000000010402000000060400000000"
	got, ok := endpointsTypeof("numgen random mod 1 : ip daddr . tcp dport")
	if !ok || hex.EncodeToString(got) != want {
		t.Errorf("typeof userdata\n got %x\nwant %s", got, want)
	}
}

func TestIntervalElems(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		want   []string // hex keys, "!" marks the interval end
	}{
		{"198.18.0.0/15", []string{"c6120000", "!c6140000"}},
		{"198.18.64.11/32", []string{"c612400b", "!c612400c"}},
		{"255.255.255.0/24", []string{"ffffff00"}},
		{"fd00:1::/64", []string{"fd000001000000000000000000000000", "!fd000001000000010000000000000000"}},
	} {
		var got []string
		for _, e := range intervalElems(netip.MustParsePrefix(tc.prefix)) {
			s := hex.EncodeToString(e.key)
			if e.intervalEnd {
				s = "!" + s
			}
			got = append(got, s)
		}
		if strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("%s: got %v, want %v", tc.prefix, got, tc.want)
		}
	}
}

func TestFirewallRuleExpands(t *testing.T) {
	fw := rule{allowOnly{sel: selSaddr4, allowed: []netip.Prefix{netip.MustParsePrefix("198.18.200.0/24"), netip.MustParsePrefix("198.18.64.11/32")}}}
	if got, want := fw.String(), "ip saddr != { 198.18.200.0/24, 198.18.64.11 } drop"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	var got []string
	for _, r := range fw.kernelRules() {
		got = append(got, r.String())
	}
	want := []string{"ip saddr 198.18.200.0/24 return", "ip saddr 198.18.64.11 return", "drop"}
	if !slices.Equal(got, want) {
		t.Errorf("kernel rules %q, want %q", got, want)
	}
}

// TestBatchChunks: a batch larger than a chunk is whole messages in order
// across its parts, each message once, the ack flag only on the last one.
func TestBatchChunks(t *testing.T) {
	b := newNLBatch(unix.NFPROTO_IPV4, DefaultTableName, 64)
	const n = 40000 // ~2.5 MiB of flush messages
	for i := range n {
		b.flushChain(fmt.Sprintf("chain-%05d", i))
	}
	parts, ackSeq, empty := b.Close()
	if empty || len(parts) < 2 {
		t.Fatalf("%d parts (empty=%v), want more than one", len(parts), empty)
	}
	whole := slices.Concat(parts...)
	var seqs []uint32
	acks := 0
	for off := 0; off < len(whole); {
		l := int(binary.NativeEndian.Uint32(whole[off:]))
		if l < nlmsgHdrLen || off+l > len(whole) {
			t.Fatalf("bad message length %d at %d of %d", l, off, len(whole))
		}
		if binary.NativeEndian.Uint16(whole[off+6:])&unix.NLM_F_ACK != 0 {
			acks++
		}
		seqs = append(seqs, binary.NativeEndian.Uint32(whole[off+8:]))
		off += (l + 3) &^ 3
	}
	if len(seqs) != n+2 || acks != 1 || seqs[len(seqs)-2] != ackSeq {
		t.Fatalf("%d messages, %d acks, ack on %d (last message %d)", len(seqs), acks, ackSeq, seqs[len(seqs)-2])
	}
	for i, s := range seqs {
		if s != uint32(i+1) {
			t.Fatalf("message %d has sequence %d", i, s)
		}
	}
}

// TestEncodeRangeElem: a range is its first key (with the data) and the
// key after its last one flagged as the end, big endian; a range reaching
// the top of the key space has no end element (as nft sends it).
func TestEncodeRangeElem(t *testing.T) {
	data := []string{"ipv4_addr", "inet_service"}
	for _, tc := range []struct {
		key     string
		verb    opVerb
		want    []string // hex keys, "end:" for the flagged one
		hasData bool
	}{
		{"0-1048575", opAdd, []string{"00000000", "end:00100000"}, true},
		{"4293918720-4294967295", opAdd, []string{"fff00000"}, true},
		{"16-31", opDelete, []string{"00000010", "end:00000020"}, false},
	} {
		got, err := encodeRangeElem(nil, make([]byte, 0, 64), data, tc.verb, element{Key: tc.key, Value: "198.18.64.10 . 8080"})
		if err != nil {
			t.Fatalf("%s: %v", tc.key, err)
		}
		var keys []string
		for _, e := range got {
			k := hex.EncodeToString(e.key)
			if e.intervalEnd {
				k = "end:" + k
			}
			keys = append(keys, k)
		}
		if !slices.Equal(keys, tc.want) || (got[0].data != nil) != tc.hasData {
			t.Errorf("%s %v: keys %q (data %x), want %q (data %v)", tc.key, tc.verb, keys, got[0].data, tc.want, tc.hasData)
		}
	}
}

// A batch whose chunks come from a pool encodes exactly what a fresh one
// does, also when the chunks are reused ones still holding an earlier
// (longer) batch: 2,000 Services make batches of several chunks.
func TestPooledBatchEqualsFresh(t *testing.T) {
	snap := scaleSnapshot(2000, 10)
	d := render(dptest.Config(), snap.V4, snap.Node)
	st := &famState{fam: model.IPv4, kernelMirror: emptyMirror()}
	var tx txn
	st.fullOps(d, &tx)
	k := newNLKernel(model.IPv4, DefaultTableName, &genTracker{})
	flat := func(b *nlBatch) []byte {
		bufs, _, _ := b.Close()
		return bytes.Join(bufs, nil)
	}
	fresh, err := k.nl.encode(tx.ops(), k.sets)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Len() < 2*nfnl.ChunkBytes {
		t.Fatalf("the batch has %d bytes; the test needs several chunks", fresh.Len())
	}
	want := flat(fresh)
	pool := &nfnl.Pool{}
	// The first pooled batch fills new chunks with the whole table; the
	// second, only the rules, reuses them.
	parts := []opList{tx.ops(), {tx.rules}}
	for i, ops := range parts {
		b, err := k.nl.encodePooled(ops, k.sets, pool)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := k.nl.encode(ops, k.sets)
		if err != nil {
			t.Fatal(err)
		}
		// (bytes closes a batch: flatten each once.)
		got, refBytes := flat(b), flat(ref)
		if i == 0 && !bytes.Equal(got, want) {
			t.Fatal("a pooled batch differs from a fresh one")
		}
		if !bytes.Equal(got, refBytes) {
			t.Fatalf("batch %d: a pooled batch on reused chunks differs from a fresh one (%d vs %d bytes)", i, len(got), len(refBytes))
		}
		b.Release()
		if i == 0 && pool.Len() < 2 {
			t.Fatalf("released %d chunks to the pool, want them all", pool.Len())
		}
	}
}

// TestRangeEncoding checks that an endpoint-ranges element encoded from
// its numbers has the bytes of the same element encoded from its text,
// for every block of every rendering, both verbs, and the ranges that
// reach the top of the key space.
func TestRangeEncoding(t *testing.T) {
	count := 0
	check := func(name string, f *fill) {
		for i := range f.elems {
			for _, verb := range []opVerb{opAdd, opDelete} {
				text := f.element(i)
				s := endpointSet("ip", "tcp", f.b.shard)
				_, data := s.fields()
				want, err := encodeRangeElem(nil, nil, data, verb, text)
				if err != nil {
					t.Fatalf("%s: %v: %v", name, text, err)
				}
				got := encodeRange(nil, nil, verb, f.elems[i])
				if !reflect.DeepEqual(got, want) {
					t.Errorf("%s: %v (verb %d): got %+v, want %+v", name, text, verb, got, want)
				}
				count++
			}
		}
	}
	eachRendering(func(name string, fam model.Family, d *desired) {
		for _, ps := range d.Ports {
			for i := range ps.Fills {
				check(name+"/"+fam.String(), &ps.Fills[i])
			}
		}
	})
	top := block{shard: "endpoint-ranges-tcp-00", index: blocksPerShard - 1}
	for _, ip := range []string{"198.18.0.1", "fd00::1"} {
		elems := blockRanges(top, 3)
		for i := range elems {
			elems[i].ep = dptest.EP(ip, 8080, false)
		}
		check("top of the key space/"+ip, &fill{b: top, elems: elems})
	}
	if count < 20 {
		t.Errorf("only %d elements checked", count)
	}
}

// TestKeyRoundTrip: element keys encode to netlink and decode back to the
// text render writes, for every field type of a shared or dynamic set.
func TestKeyRoundTrip(t *testing.T) {
	for _, c := range []struct {
		fields []string
		text   string
	}{
		{[]string{"ipv4_addr", "mark"}, "198.18.0.1 . 0x7cfc768a"},
		{[]string{"ipv6_addr", "mark"}, "fd00::1 . 0x00000001"},
		{[]string{"ipv4_addr", "inet_proto", "inet_service"}, "198.19.0.10 . tcp . 80"},
		{[]string{"numgen"}, "1048575"},
	} {
		b, err := appendKey(nil, c.fields, c.text)
		if err != nil {
			t.Fatalf("%q: %v", c.text, err)
		}
		got, err := decodeKey(c.fields, b)
		if err != nil || strings.Join(got, fieldSep) != c.text {
			t.Errorf("%q: decoded %q, %v", c.text, got, err)
		}
	}
}
