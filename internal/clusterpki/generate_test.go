package clusterpki

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestGenerateCASignsAdminAndKubelet(t *testing.T) {
	now := time.Now()
	ca, certPEM, keyPEM, err := GenerateCA(now)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{"ca.crt": certPEM, "ca.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	loaded, err := LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatalf("the generated CA does not load as kubeadm's files: %v", err)
	}
	if loaded.DiscoveryTokenCACertHash() != ca.DiscoveryTokenCACertHash() {
		t.Fatal("loaded CA differs")
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())

	adminPEM, _, err := ca.SignAdmin("alice", now)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(adminPEM)
	admin, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if admin.Subject.CommonName != "alice" || len(admin.Subject.Organization) != 1 || admin.Subject.Organization[0] != AdminGroup {
		t.Fatalf("admin subject %s", admin.Subject)
	}
	if _, err := admin.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ca.SignAdmin("kubernetes-super-admin", now); err == nil {
		t.Fatal("signed a super-admin")
	}

	csr, _, err := NewKubeletCSR("cp-0", []net.IP{net.IPv4(192, 0, 2, 10)})
	if err != nil {
		t.Fatal(err)
	}
	req, err := ParseKubeletCSR(csr)
	if err != nil {
		t.Fatalf("our own kubelet CSR is refused: %v", err)
	}
	der, err := ca.SignKubelet(req, now, 0)
	if err != nil {
		t.Fatal(err)
	}
	kubelet, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubelet.Verify(x509.VerifyOptions{Roots: roots, DNSName: "cp-0", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := NewKubeletCSR("cp-0", nil); err == nil {
		t.Fatal("a CSR without IPs was made")
	}
}
