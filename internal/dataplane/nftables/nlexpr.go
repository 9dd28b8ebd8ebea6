package nftables

import (
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Rule expressions written straight into the batch. google/nftables
// marshals an expression by building each attribute list in a new slice and
// copying it into its parent: at 10k Services that costs a cold sync
// ~11 MB and ~0.4M allocations more (BenchmarkColdSync10k at 69b7cca, every
// stage encoded: `go test -run '^$' -bench 'ColdSync10k|RuleEncoding' -benchmem
// ./internal/dataplane/nftables/`; docs/history.md has the figures). appendExpr
// writes the same bytes in place for the expression types render's rules
// are made of (the affinity rules' dynset too: a cold sync at 10k Services
// × 10 endpoints with 10 % ClientIP affinity allocates 50 MB instead of
// 70 MB, BenchmarkColdSync10k with KPROXY_SCALE_AFFINITY=1), and leaves
// any other type to expr.Marshal
// (TestAppendExprMatchesMarshal compares the two on every expression render
// produces and on hand-made edge cases).

// appendExpr appends e as one element of a rule's expression list.
func (b *nlBatch) appendExpr(e expr.Any) error {
	name := exprName(e)
	if name == "" {
		data, err := expr.Marshal(b.Fam(), e)
		if err != nil {
			return err
		}
		b.Attr(unix.NFTA_LIST_ELEM|unix.NLA_F_NESTED, data)
		return nil
	}
	elem := b.Nest(unix.NFTA_LIST_ELEM)
	b.AttrStr(unix.NFTA_EXPR_NAME, name)
	data := b.Nest(unix.NFTA_EXPR_DATA)
	switch e := e.(type) {
	case *expr.Meta:
		b.AttrBE32(unix.NFTA_META_KEY, uint32(e.Key))
		b.AttrBE32(pick(e.SourceRegister, unix.NFTA_META_SREG, unix.NFTA_META_DREG), e.Register)
	case *expr.Ct:
		b.AttrBE32(unix.NFTA_CT_KEY, uint32(e.Key))
		b.AttrBE32(pick(e.SourceRegister, unix.NFTA_CT_SREG, unix.NFTA_CT_DREG), e.Register)
		switch e.Key {
		case expr.CtKeySRC, expr.CtKeyDST, expr.CtKeyPROTOSRC, expr.CtKeyPROTODST:
			b.AttrBE32(unix.NFTA_CT_DIRECTION, e.Direction)
		}
	case *expr.Cmp:
		b.AttrBE32(unix.NFTA_CMP_SREG, e.Register)
		b.AttrBE32(unix.NFTA_CMP_OP, uint32(e.Op))
		b.Value(unix.NFTA_CMP_DATA, e.Data)
	case *expr.Payload:
		if e.OperationType == expr.PayloadWrite {
			b.AttrBE32(unix.NFTA_PAYLOAD_SREG, e.SourceRegister)
		} else {
			b.AttrBE32(unix.NFTA_PAYLOAD_DREG, e.DestRegister)
		}
		b.AttrBE32(unix.NFTA_PAYLOAD_BASE, uint32(e.Base))
		b.AttrBE32(unix.NFTA_PAYLOAD_OFFSET, e.Offset)
		b.AttrBE32(unix.NFTA_PAYLOAD_LEN, e.Len)
		if e.CsumType > 0 {
			b.AttrBE32(unix.NFTA_PAYLOAD_CSUM_TYPE, uint32(e.CsumType))
			b.AttrBE32(unix.NFTA_PAYLOAD_CSUM_OFFSET, uint32(e.CsumOffset))
			if e.CsumFlags > 0 {
				b.AttrBE32(unix.NFTA_PAYLOAD_CSUM_FLAGS, e.CsumFlags)
			}
		}
	case *expr.Bitwise:
		b.AttrBE32(unix.NFTA_BITWISE_SREG, e.SourceRegister)
		b.AttrBE32(unix.NFTA_BITWISE_DREG, e.DestRegister)
		b.AttrBE32(unix.NFTA_BITWISE_LEN, e.Len)
		b.Value(unix.NFTA_BITWISE_MASK, e.Mask)
		b.Value(unix.NFTA_BITWISE_XOR, e.Xor)
	case *expr.Immediate:
		b.AttrBE32(unix.NFTA_IMMEDIATE_DREG, e.Register)
		b.Value(unix.NFTA_IMMEDIATE_DATA, e.Data)
	case *expr.Verdict:
		b.AttrBE32(unix.NFTA_IMMEDIATE_DREG, unix.NFT_REG_VERDICT)
		imm := b.Nest(unix.NFTA_IMMEDIATE_DATA)
		v := b.Nest(unix.NFTA_DATA_VERDICT)
		b.AttrBE32(unix.NFTA_VERDICT_CODE, uint32(e.Kind))
		if e.Chain != "" {
			b.AttrStr(unix.NFTA_VERDICT_CHAIN, e.Chain)
		}
		b.End(v)
		b.End(imm)
	case *expr.Lookup:
		if e.SourceRegister != 0 {
			b.AttrBE32(unix.NFTA_LOOKUP_SREG, e.SourceRegister)
		}
		if e.IsDestRegSet {
			b.AttrBE32(unix.NFTA_LOOKUP_DREG, e.DestRegister)
		}
		if e.Invert {
			b.AttrBE32(unix.NFTA_LOOKUP_FLAGS, unix.NFT_LOOKUP_F_INV)
		}
		b.AttrStr(unix.NFTA_LOOKUP_SET, e.SetName)
		b.AttrBE32(unix.NFTA_LOOKUP_SET_ID, e.SetID)
	case *expr.Numgen:
		b.AttrBE32(unix.NFTA_NG_DREG, e.Register)
		b.AttrBE32(unix.NFTA_NG_MODULUS, e.Modulus)
		b.AttrBE32(unix.NFTA_NG_TYPE, e.Type)
		b.AttrBE32(unix.NFTA_NG_OFFSET, e.Offset)
	case *expr.NAT:
		b.AttrBE32(unix.NFTA_NAT_TYPE, uint32(e.Type))
		b.AttrBE32(unix.NFTA_NAT_FAMILY, e.Family)
		if e.RegAddrMin != 0 {
			b.AttrBE32(unix.NFTA_NAT_REG_ADDR_MIN, e.RegAddrMin)
			if e.RegAddrMax != 0 {
				b.AttrBE32(unix.NFTA_NAT_REG_ADDR_MAX, e.RegAddrMax)
			}
		}
		if e.RegProtoMin != 0 {
			b.AttrBE32(unix.NFTA_NAT_REG_PROTO_MIN, e.RegProtoMin)
			if e.RegProtoMax != 0 {
				b.AttrBE32(unix.NFTA_NAT_REG_PROTO_MAX, e.RegProtoMax)
			}
		}
		if flags := natFlags(e); flags != 0 {
			b.AttrBE32(unix.NFTA_NAT_FLAGS, flags)
		}
	case *expr.Dynset:
		b.AttrBE32(unix.NFTA_DYNSET_SREG_KEY, e.SrcRegKey)
		if e.SrcRegData != 0 {
			b.AttrBE32(unix.NFTA_DYNSET_SREG_DATA, e.SrcRegData)
		}
		b.AttrBE32(unix.NFTA_DYNSET_OP, e.Operation)
		if e.Timeout != 0 {
			b.Attr(unix.NFTA_DYNSET_TIMEOUT, be64(uint64(e.Timeout.Milliseconds())))
		}
		b.AttrStr(unix.NFTA_DYNSET_SET_NAME, e.SetName)
		b.AttrBE32(unix.NFTA_DYNSET_SET_ID, e.SetID)
		var flags uint32
		if e.Invert {
			flags = unix.NFT_DYNSET_F_INV
		}
		b.AttrBE32(unix.NFTA_DYNSET_FLAGS, flags)
	case *expr.Byteorder:
		b.AttrBE32(unix.NFTA_BYTEORDER_SREG, e.SourceRegister)
		b.AttrBE32(unix.NFTA_BYTEORDER_DREG, e.DestRegister)
		b.AttrBE32(unix.NFTA_BYTEORDER_OP, uint32(e.Op))
		b.AttrBE32(unix.NFTA_BYTEORDER_LEN, e.Len)
		b.AttrBE32(unix.NFTA_BYTEORDER_SIZE, e.Size)
	case *expr.Hash:
		b.AttrBE32(unix.NFTA_HASH_SREG, e.SourceRegister)
		b.AttrBE32(unix.NFTA_HASH_DREG, e.DestRegister)
		b.AttrBE32(unix.NFTA_HASH_LEN, e.Length)
		b.AttrBE32(unix.NFTA_HASH_MODULUS, e.Modulus)
		if e.Seed != 0 {
			b.AttrBE32(unix.NFTA_HASH_SEED, e.Seed)
		}
		b.AttrBE32(unix.NFTA_HASH_OFFSET, e.Offset)
		b.AttrBE32(unix.NFTA_HASH_TYPE, uint32(e.Type))
	case *expr.Fib:
		b.AttrBE32(unix.NFTA_FIB_DREG, e.Register)
		if flags := fibFlags(e); flags != 0 {
			b.AttrBE32(unix.NFTA_FIB_FLAGS, flags)
		}
		if results := fibResults(e); results != 0 {
			b.AttrBE32(unix.NFTA_FIB_RESULT, results)
		}
	}
	b.End(data)
	b.End(elem)
	return nil
}

// exprName is the kernel name of the expression types appendExpr writes
// itself; "" for the others.
func exprName(e expr.Any) string {
	switch e := e.(type) {
	case *expr.Meta:
		return "meta"
	case *expr.Ct:
		return "ct"
	case *expr.Cmp:
		return "cmp"
	case *expr.Payload:
		return "payload"
	case *expr.Bitwise:
		return "bitwise"
	case *expr.Immediate, *expr.Verdict:
		return "immediate"
	case *expr.Lookup:
		return "lookup"
	case *expr.Numgen:
		// google/nftables refuses other types; let it say so.
		if e.Type == unix.NFT_NG_RANDOM || e.Type == unix.NFT_NG_INCREMENTAL {
			return "numgen"
		}
	case *expr.NAT:
		return "nat"
	case *expr.Fib:
		return "fib"
	case *expr.Dynset:
		// Expressions attached to the set's elements are left to
		// google/nftables (render makes none).
		if len(e.Exprs) == 0 {
			return "dynset"
		}
	case *expr.Byteorder:
		return "byteorder"
	case *expr.Hash:
		return "hash"
	}
	return ""
}

func pick(cond bool, yes, no uint16) uint16 {
	if cond {
		return yes
	}
	return no
}

// flagBit is one bit of a flags attribute and whether it is set.
type flagBit struct {
	set bool
	bit uint32
}

// orFlags ORs the set flags.
func orFlags(flags ...flagBit) uint32 {
	var v uint32
	for _, f := range flags {
		if f.set {
			v |= f.bit
		}
	}
	return v
}

func natFlags(e *expr.NAT) uint32 {
	return orFlags(
		flagBit{e.Random, expr.NF_NAT_RANGE_PROTO_RANDOM},
		flagBit{e.FullyRandom, expr.NF_NAT_RANGE_PROTO_RANDOM_FULLY},
		flagBit{e.Persistent, expr.NF_NAT_RANGE_PERSISTENT},
		flagBit{e.Prefix, expr.NF_NAT_RANGE_PREFIX},
		flagBit{e.Specified, expr.NF_NAT_RANGE_PROTO_SPECIFIED})
}

func fibFlags(e *expr.Fib) uint32 {
	return orFlags(
		flagBit{e.FlagSADDR, unix.NFTA_FIB_F_SADDR},
		flagBit{e.FlagDADDR, unix.NFTA_FIB_F_DADDR},
		flagBit{e.FlagMARK, unix.NFTA_FIB_F_MARK},
		flagBit{e.FlagIIF, unix.NFTA_FIB_F_IIF},
		flagBit{e.FlagOIF, unix.NFTA_FIB_F_OIF},
		flagBit{e.FlagPRESENT, unix.NFTA_FIB_F_PRESENT})
}

func fibResults(e *expr.Fib) uint32 {
	return orFlags(
		flagBit{e.ResultOIF, unix.NFT_FIB_RESULT_OIF},
		flagBit{e.ResultOIFNAME, unix.NFT_FIB_RESULT_OIFNAME},
		flagBit{e.ResultADDRTYPE, unix.NFT_FIB_RESULT_ADDRTYPE})
}
