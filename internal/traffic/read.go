package traffic

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// Sample is what the counters of one service port in one family hold.
type Sample struct {
	ID             model.PortID
	Family         model.Family
	NewConnections uint64
	Packets        uint64
	Bytes          uint64
}

// Read returns the counters of every service port of the families' tables,
// read with one netlink dump of the table's counter objects per family
// (retried when a commit interrupted it), in the calling thread's network
// namespace. A family without the table has no samples.
func Read(fams []model.Family) ([]Sample, error) {
	var out []Sample
	for _, f := range fams {
		got, err := readFamily(f)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

func readFamily(f model.Family) ([]Sample, error) {
	var samples []Sample
	index := map[model.PortID]int{}
	err := nfnl.DumpWhole(nfFamily(f), unix.NFT_MSG_GETOBJ, func(b *nfnl.Batch) {
		b.AttrStr(unix.NFTA_OBJ_TABLE, Table)
		b.AttrBE32(unix.NFTA_OBJ_TYPE, unix.NFT_OBJECT_COUNTER)
	}, func(attrs []byte) error {
		name, packets, bytes, ok := parseCounter(attrs)
		if !ok {
			return nil
		}
		id, isNew, ok := ParseCounterName(name)
		if !ok {
			return nil
		}
		i, seen := index[id]
		if !seen {
			i = len(samples)
			index[id] = i
			samples = append(samples, Sample{ID: id, Family: f})
		}
		if isNew {
			samples[i].NewConnections = packets
		} else {
			samples[i].Packets, samples[i].Bytes = packets, bytes
		}
		return nil
	}, func() { samples, index = samples[:0], map[model.PortID]int{} })
	if errors.Is(err, syscall.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the %s traffic counters: %w", f, err)
	}
	return samples, nil
}

// parseCounter reads one NEWOBJ reply of the table's counters.
func parseCounter(attrs []byte) (name string, packets, bytes uint64, ok bool) {
	var table string
	nfnl.EachAttr(attrs, func(typ uint16, data []byte) {
		switch typ {
		case unix.NFTA_OBJ_TABLE:
			table = cstr(data)
		case unix.NFTA_OBJ_NAME:
			name = cstr(data)
		case unix.NFTA_OBJ_TYPE:
			ok = len(data) == 4 && binary.BigEndian.Uint32(data) == unix.NFT_OBJECT_COUNTER
		case unix.NFTA_OBJ_DATA:
			nfnl.EachAttr(data, func(typ uint16, v []byte) {
				if len(v) != 8 {
					return
				}
				switch typ {
				case unix.NFTA_COUNTER_PACKETS:
					packets = binary.BigEndian.Uint64(v)
				case unix.NFTA_COUNTER_BYTES:
					bytes = binary.BigEndian.Uint64(v)
				}
			})
		}
	})
	return name, packets, bytes, ok && table == Table && name != ""
}

func cstr(b []byte) string {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return string(b)
}
