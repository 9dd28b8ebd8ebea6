package file

import (
	"io/fs"
	"syscall"
)

// stampOf includes the inode, so that a file replaced by rename is re-read
// even when its size and time match.
func stampOf(fi fs.FileInfo) stamp {
	st := stamp{modTime: fi.ModTime(), size: fi.Size()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = sys.Ino
	}
	return st
}
