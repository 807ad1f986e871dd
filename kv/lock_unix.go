//go:build unix

package kv

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// lockFile takes an flock on f — exclusive, or shared for readers — waiting
// at most timeout. errLockTimeout when another holder kept it.
func lockFile(f *os.File, exclusive bool, timeout time.Duration) error {
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR):
			return &os.PathError{Op: "flock", Path: f.Name(), Err: err}
		case time.Now().After(deadline):
			return errLockTimeout
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// unlockFile releases f's flock explicitly: closing the descriptor alone
// does not while a mapping of the file still refers to it.
func unlockFile(f *os.File) {
	if c, err := f.SyscallConn(); err == nil {
		c.Control(func(fd uintptr) { syscall.Flock(int(fd), syscall.LOCK_UN) })
	}
}

// identity names the file behind fi across paths (device and inode).
func identity(path string, fi os.FileInfo) any {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return [2]uint64{uint64(st.Dev), uint64(st.Ino)}
	}
	return path
}

// mapFile maps size bytes of f read-only for the file check, or returns
// nil data when it cannot (the check then reads); unmap must be called.
// The check reads only pages it proved inside the file, and runs with
// faults turned into panics, so a file cut short meanwhile is an error,
// not a crash.
func mapFile(f *os.File, size int64) (data []byte, unmap func()) {
	if size <= 0 || size != int64(int(size)) {
		return nil, func() {}
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, func() {}
	}
	return data, func() { syscall.Munmap(data) }
}

// syncDirectory makes the entries of the directory dir durable: once it
// returns nil, a file renamed or linked into dir is found there after a
// power cut.
func syncDirectory(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
