package kv

import (
	"fmt"
	"net"
	"syscall"
)

// checkPeer refuses a connection to the reader socket from a process of
// another user, by the credentials the kernel recorded when it connected
// (SO_PEERCRED).
func checkPeer(c net.Conn) error {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("kv: reader socket: a %T is not a Unix socket connection", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var (
		cred *syscall.Ucred
		cerr error
	)
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("kv: reader socket: the peer's credentials: %w", cerr)
	}
	return sameUser(int(cred.Uid))
}
