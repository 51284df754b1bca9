package testenv

import (
	"net"
	"testing"
)

// HostAddress returns a non-loopback IPv4 address of this machine, which
// kubeadm requires as advertise address; the test fails without one.
func HostAddress(t testing.TB) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	t.Fatal("this machine has no non-loopback IPv4 address for kubeadm to advertise")
	return ""
}
