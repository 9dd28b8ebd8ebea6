package nftables

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// marshalled is e as google/nftables encodes it in a rule's expression list.
func marshalled(fam byte, e expr.Any) ([]byte, error) {
	data, err := expr.Marshal(fam, e)
	if err != nil {
		return nil, err
	}
	return nfnl.AppendAttr(nil, unix.NFTA_LIST_ELEM|unix.NLA_F_NESTED, data), nil
}

// appended is e as appendExpr writes it.
func appended(fam byte, e expr.Any) ([]byte, error) {
	b := newNLBatch(fam, "", 0)
	off := b.Off()
	err := b.appendExpr(e)
	return b.Tail(off), err
}

func checkSameEncoding(t *testing.T, what string, fam byte, e expr.Any) {
	t.Helper()
	want, werr := marshalled(fam, e)
	got, gerr := appended(fam, e)
	if (werr != nil) != (gerr != nil) {
		t.Errorf("%s: %T: error %v, google/nftables' %v", what, e, gerr, werr)
		return
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s: %T %+v:\n got %x\nwant %x", what, e, e, got, want)
	}
}

// TestAppendExprMatchesMarshal: every expression of every rule render makes
// (all features, both families, every detect-local mode, masquerade-all,
// nodePortAddresses), and hand-made values of every field appendExpr
// writes, encode to the bytes google/nftables' marshalling gives.
func TestAppendExprMatchesMarshal(t *testing.T) {
	types := map[string]int{}
	eachRendering(func(name string, f model.Family, d *desired) {
		n := newNetlinkReader(f, DefaultTableName)
		chains := slices.Clone(d.Chains)
		for _, ps := range d.Ports {
			chains = append(chains, ps.Chains...)
		}
		for _, c := range chains {
			for _, r := range c.Rules {
				for _, kr := range r.kernelRules() {
					for _, e := range kr.exprs() {
						types[fmt.Sprintf("%T", e)]++
						checkSameEncoding(t, fmt.Sprintf("%s/%s %q", name, f, r), n.nfproto(), e)
					}
				}
			}
		}
	})
	t.Logf("expressions compared, by type: %v", types)
	for _, want := range []string{"*expr.Meta", "*expr.Cmp", "*expr.Payload", "*expr.Lookup", "*expr.Numgen", "*expr.NAT", "*expr.Verdict", "*expr.Fib", "*expr.Ct", "*expr.Immediate", "*expr.Bitwise", "*expr.Dynset", "*expr.Byteorder", "*expr.Hash"} {
		if types[want] == 0 {
			t.Errorf("render made no %s: the comparison does not cover it", want)
		}
	}

	edge := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 9},
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Ct{Key: expr.CtKeyMARK, SourceRegister: true, Register: 2},
		&expr.Ct{Key: expr.CtKeySRC, Register: 1, Direction: 1},
		&expr.Ct{Key: expr.CtKeyDST, Register: 1},
		&expr.Ct{Key: expr.CtKeyPROTOSRC, Register: 1, Direction: 1},
		&expr.Ct{Key: expr.CtKeyPROTODST, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{1, 2, 3}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 8, Data: nil},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2,
			CsumType: expr.CsumTypeInet, CsumOffset: 16, CsumFlags: 1},
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: 1, Len: 2, CsumType: expr.CsumTypeInet, CsumOffset: 6},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 2, Len: 4, Mask: []byte{0, 0, 0x40, 0}, Xor: []byte{0, 0, 0, 0}},
		&expr.Immediate{Register: 1, Data: []byte("abcde")},
		&expr.Verdict{Kind: expr.VerdictDrop},
		&expr.Verdict{Kind: expr.VerdictReturn},
		&expr.Verdict{Kind: expr.VerdictGoto, Chain: "svc-ABCDEFGHIJ-ns/name/tcp/p/0"},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: "x"},
		&expr.Lookup{SourceRegister: 1, SetName: "cluster-ips", SetID: 3},
		&expr.Lookup{SourceRegister: 1, SetName: "s", Invert: true},
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: "service-ips"},
		&expr.Lookup{SetName: "no-source"},
		&expr.Numgen{Register: 1, Modulus: 1 << 20, Type: unix.NFT_NG_RANDOM, Offset: 3 << 20},
		&expr.Numgen{Register: 1, Modulus: 7, Type: unix.NFT_NG_INCREMENTAL},
		&expr.Numgen{Register: 1, Modulus: 7, Type: 9}, // refused by both
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV6, RegAddrMin: 1, RegAddrMax: 2, RegProtoMin: 3, RegProtoMax: 4},
		&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMax: 2, RegProtoMax: 4,
			Random: true, FullyRandom: true, Persistent: true, Prefix: true},
		&expr.Fib{Register: 1, FlagSADDR: true, ResultADDRTYPE: true},
		&expr.Fib{Register: 1, FlagDADDR: true, FlagMARK: true, FlagIIF: true, FlagOIF: true, FlagPRESENT: true, ResultOIF: true, ResultOIFNAME: true},
		&expr.Fib{Register: 1},
		&expr.Dynset{SrcRegKey: 1, SetName: "affinity", Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: 10800 * time.Second},
		&expr.Dynset{SrcRegKey: 1, SrcRegData: 2, SetName: "m", SetID: 7, Operation: unix.NFT_DYNSET_OP_ADD, Invert: true},
		&expr.Dynset{SrcRegKey: 1, SetName: "s", Operation: 2 /* NFT_DYNSET_OP_DELETE */, Timeout: 1500 * time.Millisecond},
		&expr.Dynset{SrcRegKey: 1, SetName: "counted", Exprs: []expr.Any{&expr.Counter{}}},
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4},
		&expr.Byteorder{SourceRegister: 2, DestRegister: 3, Op: expr.ByteorderNtoh, Len: 8, Size: 2},
		&expr.Hash{SourceRegister: 1, DestRegister: 1, Length: 4, Modulus: 1021, Seed: 0xbeef, Offset: 5 << 20, Type: expr.HashTypeJenkins},
		&expr.Hash{SourceRegister: 1, DestRegister: 2, Length: 16, Modulus: 8},
		&expr.Hash{DestRegister: 1, Modulus: 3, Type: expr.HashTypeSym},
		&expr.Masq{},
		&expr.Counter{Bytes: 1, Packets: 2},
	}
	for i, e := range edge {
		for _, fam := range []byte{unix.NFPROTO_IPV4, unix.NFPROTO_IPV6} {
			checkSameEncoding(t, fmt.Sprintf("edge case %d", i), fam, e)
		}
	}
}

// BenchmarkRuleEncoding is the rules of a 1k-Service cold sync encoded
// into a batch.
func BenchmarkRuleEncoding(b *testing.B) {
	snap := scaleSnapshot(1000, 10)
	d := render(dptest.Config(), snap.V4, snap.Node)
	var ops []*ruleOp
	for _, ps := range d.Ports {
		for _, c := range ps.Chains {
			for _, r := range c.Rules {
				ops = append(ops, &ruleOp{chain: c.Name, rule: r})
			}
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		batch := newNLBatch(unix.NFPROTO_IPV4, DefaultTableName, 1<<20)
		for _, o := range ops {
			for _, kr := range o.rule.kernelRules() {
				if err := batch.addRule(o.chain, kr, kr.exprs()); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
}

// exprs encodes a rule that kernelRules returned (the transaction encodes
// into a slice it reuses: nlTxn.addRule).
func (r rule) exprs() []expr.Any { return r.appendExprs(nil) }
