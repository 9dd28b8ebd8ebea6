package nfnl

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// errorReply is an NLMSG_ERROR reply about message seq.
func errorReply(seq uint32, errno unix.Errno) []byte {
	m := make([]byte, nlmsgHdrLen+4+nlmsgHdrLen)
	binary.NativeEndian.PutUint32(m[0:], uint32(len(m)))
	binary.NativeEndian.PutUint16(m[4:], unix.NLMSG_ERROR)
	binary.NativeEndian.PutUint32(m[8:], seq)
	binary.NativeEndian.PutUint32(m[nlmsgHdrLen:], uint32(-int32(errno)))
	return m
}

func TestReadAck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replies [][]byte
		want    unix.Errno // 0: no error
	}{
		{"acknowledged", [][]byte{errorReply(7, 0)}, 0},
		{"a message rejected", [][]byte{errorReply(4, unix.ENOENT), errorReply(7, 0)}, unix.ENOENT},
		// The kernel refuses a whole batch (no permission, say) with one
		// error about the batch-begin message and nothing after it.
		{"the batch refused", [][]byte{errorReply(1, unix.EPERM)}, unix.EPERM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fds[0])
			defer unix.Close(fds[1])
			tv := unix.Timeval{Sec: 2}
			_ = unix.SetsockoptTimeval(fds[1], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
			for _, r := range tc.replies {
				if _, err := unix.Write(fds[0], r); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			err = ReadAck(fds[1], 7, func(seq uint32) string { return "message" })
			if time.Since(start) > time.Second {
				t.Errorf("ReadAck waited %v", time.Since(start))
			}
			switch {
			case tc.want == 0 && err != nil:
				t.Errorf("got %v, want no error", err)
			case tc.want != 0 && !errors.Is(err, tc.want):
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// msgErrno reads an error reply's errno, an acknowledgement as 0, and a
// dump's DONE with its (positive) length as no error.
func TestMsgErrno(t *testing.T) {
	done := errorReply(3, 0)
	binary.NativeEndian.PutUint16(done[4:], unix.NLMSG_DONE)
	binary.NativeEndian.PutUint32(done[nlmsgHdrLen:], 20) // a length, not an error
	for _, tc := range []struct {
		name   string
		m      []byte
		want   unix.Errno
		wantOK bool
	}{
		{"error", errorReply(3, unix.ENOENT), unix.ENOENT, true},
		{"ack", errorReply(3, 0), 0, true},
		{"done with a length", done, 0, true},
		{"short", errorReply(3, unix.ENOENT)[:nlmsgHdrLen+2], 0, false},
	} {
		if got, ok := msgErrno(tc.m); got != tc.want || ok != tc.wantOK {
			t.Errorf("%s: got %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.wantOK)
		}
	}
}
