package clusterpki

import (
	"crypto/x509"
	"slices"
	"testing"
	"time"
)

// TestVerifierIdentity: the join service's evidence client certificate is
// a short-lived client certificate in verifierGroup, chained to the
// cluster CA, renewed past half its life, and never the join service's
// server identity.
func TestVerifierIdentity(t *testing.T) {
	ca := newTestCA(t)
	now := time.Now()
	clock := func() time.Time { return now }
	id := NewVerifierIdentity(ca, clock)
	cert, err := id.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if leaf.Subject.CommonName != "gatehouse-joinservice" || !slices.Equal(leaf.Subject.Organization, []string{verifierGroup}) {
		t.Errorf("subject %s, want CN=gatehouse-joinservice,O=%s", leaf.Subject, verifierGroup)
	}
	if !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) || len(leaf.URIs) != 0 || leaf.IsCA {
		t.Errorf("usages %v, URIs %v, CA %v: want client authentication only", leaf.ExtKeyUsage, leaf.URIs, leaf.IsCA)
	}
	if life := leaf.NotAfter.Sub(now); life > verifierValidity {
		t.Errorf("valid %s from now, want at most %s", life, verifierValidity)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("does not chain to the cluster CA for client authentication: %v", err)
	}
	chain := []*x509.Certificate{leaf, ca.Certificate()}
	if err := mustVerify(t, ca, clock)(chain); err == nil {
		t.Error("the evidence client certificate passes as the join service's server identity")
	}

	now = now.Add(verifierValidity/2 - time.Minute)
	if again, _ := id.Certificate(); again != cert {
		t.Error("reissued before half its life")
	}
	now = now.Add(2 * time.Minute)
	renewed, err := id.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	if renewed == cert {
		t.Error("not renewed past half its life")
	}
}
