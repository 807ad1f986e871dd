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
	uid, err := peerUser(c)
	if err != nil {
		return err
	}
	return sameUser(uid)
}

// checkWriter refuses the process answering on sock (c is a reader's
// connection to it) when it runs as another user, by the credentials the
// kernel recorded when it listened (SO_PEERCRED).
func checkWriter(c net.Conn, sock string) error {
	uid, err := peerUser(c)
	if err != nil {
		return fmt.Errorf("%s: %w", sock, err)
	}
	return answeredBy(sock, uid)
}

// peerUser is the user id of the process at the other end of c.
func peerUser(c net.Conn) (int, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, fmt.Errorf("a %T is not a Unix socket connection", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var (
		cred *syscall.Ucred
		cerr error
	)
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, fmt.Errorf("the peer's credentials: %w", cerr)
	}
	return int(cred.Uid), nil
}
