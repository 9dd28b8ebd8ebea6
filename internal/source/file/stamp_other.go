//go:build !linux

package file

import "io/fs"

func stampOf(fi fs.FileInfo) stamp { return stamp{modTime: fi.ModTime(), size: fi.Size()} }
