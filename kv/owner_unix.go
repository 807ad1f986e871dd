//go:build unix

package kv

import (
	"io/fs"
	"syscall"
)

// fileOwner is the user id owning the file fi describes.
func fileOwner(fi fs.FileInfo) (uid int, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}
