package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/nfnl"
)

// nlBatch is one nfnetlink transaction about kproxy's table: an
// nfnl.Batch (batch begin, messages, batch end, in chunks) that knows the
// table every message names and numbers the sets it creates. The kernel
// applies a batch atomically: every message lands or none does.
//
// Only the last message asks for an acknowledgement; the kernel reports
// errors of any message unasked, so a 100k-message batch costs one reply.
type nlBatch struct {
	*nfnl.Batch
	table string // every message is about this table
	// setID numbers the sets created in this batch (NFTA_SET_ID).
	setID uint32
}

const (
	nfnlSubsysNFTables = 10
	nlmsgHdrLen        = 16
	nfgenHdrLen        = 4
	// maxListBytes keeps one element list under the 64 KiB attribute limit.
	maxListBytes = 60000
)

// newNLBatch starts a batch; sizeHint is the expected number of bytes.
func newNLBatch(fam byte, table string, sizeHint int) *nlBatch {
	return &nlBatch{Batch: nfnl.NewBatch(fam, nil, sizeHint), table: table}
}

// newPooledNLBatch starts a batch whose chunks come from pool.
func newPooledNLBatch(fam byte, table string, pool *nfnl.Pool) *nlBatch {
	return &nlBatch{Batch: nfnl.NewBatch(fam, pool, 0), table: table}
}

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// send sends the batch on a kept socket of the calling thread's network
// namespace (nfnl.WithSocket) and waits for the kernel's verdict, telling the monitor the
// socket's port (its notifications are kproxy's own).
func (b *nlBatch) send() error { return b.SendFrom(recordOwnPort) }

// rulesetGeneration returns the kernel's nftables generation number, which
// every committed transaction (of anyone) increments.
func rulesetGeneration() (uint32, error) {
	attrs, err := nfnl.Get(unix.AF_UNSPEC, unix.NFT_MSG_GETGEN, nil)
	if err != nil {
		return 0, fmt.Errorf("asking for the nftables generation: %w", err)
	}
	if id := attr(attrs, unix.NFTA_GEN_ID); len(id) == 4 {
		return binary.BigEndian.Uint32(id), nil
	}
	return 0, errors.New("no generation id in the nftables reply")
}
