package certexpiry

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// certPEM returns a self-signed certificate expiring at notAfter, as PEM.
func certPEM(t *testing.T, notAfter time.Time) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: notAfter.Add(-48 * time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestRegister registers the gauge over real PEM files, as the services
// load them: a certificate, a bundle whose earliest certificate counts
// (a key beside it skipped), and the files it refuses.
func TestRegister(t *testing.T) {
	dir := t.TempDir()
	early, late := time.Unix(1900000000, 0).UTC(), time.Unix(2000000000, 0).UTC()
	write := func(name string, data ...[]byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, bytes.Join(data, nil), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keyBlock := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: []byte{1, 2, 3}})
	single := write("tls.crt", certPEM(t, late))
	bundle := write("ca.crt", certPEM(t, late), keyBlock, certPEM(t, early))
	keyOnly := write("tls.key", keyBlock)
	broken := write("broken.crt", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not DER")}))

	reg := prometheus.NewRegistry()
	if err := Register(reg, map[string]string{"serving": single, "client-ca": bundle}); err != nil {
		t.Fatal(err)
	}
	want := `# HELP gatehouse_certificate_expiry_timestamp_seconds When a certificate this process loaded at start-up expires (the earliest NotAfter of its file's certificates), in Unix seconds, by certificate.
# TYPE gatehouse_certificate_expiry_timestamp_seconds gauge
gatehouse_certificate_expiry_timestamp_seconds{certificate="client-ca"} 1.9e+09
gatehouse_certificate_expiry_timestamp_seconds{certificate="serving"} 2e+09
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), metricName); err != nil {
		t.Error(err)
	}

	for _, tc := range []struct {
		name, path, wantErr string
	}{
		{"missing file", filepath.Join(dir, "absent.crt"), "certificate x: reading " + filepath.Join(dir, "absent.crt")},
		{"no certificate", keyOnly, "certificate x: " + keyOnly + " holds no PEM certificate"},
		{"unparsable certificate", broken, "certificate x: parsing a certificate of " + broken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			err := Register(reg, map[string]string{"x": tc.path})
			if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one starting %q", err, tc.wantErr)
			}
			if n, _ := testutil.GatherAndCount(reg); n != 0 {
				t.Errorf("%d series registered after a refused file, want none", n)
			}
		})
	}
	// A second registration (another component's gauge of the same
	// name in one registry) is refused, not merged.
	if err := Register(reg, map[string]string{"other": single}); err == nil || !strings.Contains(err.Error(), "registering metrics") {
		t.Errorf("a duplicate registration: error %v", err)
	}
}
