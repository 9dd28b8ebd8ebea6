package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	gnftables "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// netlinkReader reads elements and rule counts over netlink. The nft CLI
// fetches its cache of the whole table for any listing (seconds at 10k
// Services); a netlink dump of one set or one chain costs milliseconds.
// Each call uses a socket of the calling thread's network namespace
// (nfnl.WithSocket).
type netlinkReader struct {
	table *gnftables.Table
}

func newNetlinkReader(f model.Family, table string) *netlinkReader {
	fam := gnftables.TableFamilyIPv4
	if f == model.IPv6 {
		fam = gnftables.TableFamilyIPv6
	}
	return &netlinkReader{table: &gnftables.Table{Name: table, Family: fam}}
}

func (n *netlinkReader) v6() bool { return n.table.Family == gnftables.TableFamilyIPv6 }

// nfproto is the reader's family as netlink messages name it.
func (n *netlinkReader) nfproto() byte { return nfproto(n.v6()) }

// ruleCount returns the number of rules in chain.
func (n *netlinkReader) ruleCount(chain string) (int, error) {
	rules := 0
	err := n.dump(unix.NFT_MSG_GETRULE, func(b *nlBatch) {
		b.AttrStr(unix.NFTA_RULE_TABLE, b.table)
		b.AttrStr(unix.NFTA_RULE_CHAIN, chain)
	}, func([]byte) error {
		rules++
		return nil
	}, func() { rules = 0 })
	return rules, err
}

// missingChain asks for each chain by name (the table may hold tens of
// thousands of chains; listing them all costs 100+ ms).
func (n *netlinkReader) missingChain(names []string) (string, error) {
	for _, name := range names {
		_, err := nfnl.Get(n.nfproto(), unix.NFT_MSG_GETCHAIN, func(b *nfnl.Batch) {
			b.AttrStr(unix.NFTA_CHAIN_TABLE, n.table.Name)
			b.AttrStr(unix.NFTA_CHAIN_NAME, name)
		})
		if isNotFound(err) {
			return name, nil
		}
		if err != nil {
			return "", err
		}
	}
	return "", nil
}

// decodeKey splits a concatenated key: each field takes its size rounded up
// to 4 bytes (one netfilter register).
func decodeKey(fields []string, b []byte) ([]string, error) {
	var out []string
	for _, f := range fields {
		size := int(fieldTypes[f].size)
		if size == 0 || len(b) < size {
			return nil, fmt.Errorf("cannot decode %s from %d bytes", f, len(b))
		}
		out = append(out, formatField(f, b[:size]))
		b = b[min((size+3)&^3, len(b)):]
	}
	return out, nil
}

var protoNames = map[byte]string{6: "tcp", 17: "udp", 132: "sctp"}

func formatField(f string, b []byte) string {
	switch f {
	case "ipv4_addr":
		return netip.AddrFrom4([4]byte(b)).String()
	case "ipv6_addr":
		return netip.AddrFrom16([16]byte(b)).String()
	case "numgen":
		return strconv.FormatUint(uint64(binary.NativeEndian.Uint32(b)), 10)
	case "mark":
		return fmt.Sprintf("0x%08x", binary.NativeEndian.Uint32(b))
	case "inet_proto":
		if name, ok := protoNames[b[0]]; ok {
			return name
		}
		return strconv.Itoa(int(b[0]))
	}
	return strconv.Itoa(int(binary.BigEndian.Uint16(b)))
}

// decodeVerdict reads the netlink attributes of a verdict (code, chain) as
// google/nftables leaves them in SetElement.Val for verdict maps.
func decodeVerdict(b []byte) (string, error) {
	const attrCode, attrChain = 1, 2
	var code int32
	var chain string
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b))
		typ := binary.NativeEndian.Uint16(b[2:]) & 0x3fff
		if l < 4 || l > len(b) {
			return "", fmt.Errorf("bad verdict attribute length %d", l)
		}
		data := b[4:l]
		switch {
		case typ == attrCode && len(data) >= 4:
			code = int32(binary.BigEndian.Uint32(data))
		case typ == attrChain:
			chain = strings.TrimRight(string(data), "\x00")
		}
		b = b[min((l+3)&^3, len(b)):]
	}
	switch expr.VerdictKind(code) {
	case expr.VerdictGoto:
		return "goto " + chain, nil
	case expr.VerdictJump:
		return "jump " + chain, nil
	case expr.VerdictDrop:
		return "drop", nil
	case expr.VerdictAccept:
		return "accept", nil
	case expr.VerdictReturn:
		return "return", nil
	}
	return fmt.Sprintf("verdict(%d)", code), nil
}
