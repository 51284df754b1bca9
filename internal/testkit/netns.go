package testkit

import (
	"net"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// ListenInNetNS listens on addr (TCP) inside the network namespace at
// nsPath (e.g. /run/netns/<name>) and fails the test if it cannot; the
// listener keeps working from any goroutine.
func ListenInNetNS(t testing.TB, nsPath, addr string) net.Listener {
	t.Helper()
	type result struct {
		lis net.Listener
		err error
	}
	done := make(chan result, 1)
	go func() {
		// This thread is left in the namespace and never reused: the
		// goroutine ends without unlocking it, so the runtime retires it.
		runtime.LockOSThread()
		fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			done <- result{err: err}
			return
		}
		lis, err := net.Listen("tcp", addr)
		done <- result{lis, err}
	}()
	r := <-done
	if r.err != nil {
		t.Fatalf("listening on %s in %s: %v", addr, nsPath, r.err)
	}
	return r.lis
}
