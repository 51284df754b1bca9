package atls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
)

// generous returns limits no test of the door reaches.
func generous() connlimit.Limits {
	return connlimit.Limits{Handshakes: connlimit.Rate{Rate: 1000, Burst: 1000}}
}

// TestEvidenceDoor: once the node belongs to a cluster, only the join
// service's and administrators' certificates of its CA get evidence; every
// other caller is refused at the door, with its reason counted, and the
// TPM makes no quote for it.
func TestEvidenceDoor(t *testing.T) {
	pair := newTPMPair(t)
	c := newCluster(t)
	c.join(t)
	other := newCluster(t)
	ep := serveEndpoint(t, pair, EvidenceEndpoint{ClientCAFile: c.caFile, Limits: generous()}, nil)
	verifiers := []attestation.Verifier{pair.verifier}
	now := time.Now()

	for _, tt := range []struct {
		name       string
		cert       func() (*tls.Certificate, error)
		beforeDoor bool   // the protocol before issue 32: attested TLS at once
		reason     string // "" when answered
		says       string // in the caller's error
	}{
		{name: "the join service's certificate is answered", cert: c.verifier(t)},
		{name: "an administrator's certificate (kubeadm:cluster-admins) is answered", cert: c.admin(t)},
		{name: "a super-admin's certificate (system:masters) is answered",
			cert: c.signed(t, pkix.Name{CommonName: "kubernetes-super-admin", Organization: []string{"system:masters"}}, x509.ExtKeyUsageClientAuth, now)},
		{name: "an anonymous caller is refused", reason: ReasonAnonymous, says: "presented none"},
		{name: "a caller from before the door is refused", beforeDoor: true, reason: ReasonAnonymousProtocol},
		{name: "a kubelet's certificate (system:nodes) of the cluster CA is refused", cert: c.kubelet(t), reason: ReasonOrganization,
			says: "refused this caller's client certificate"},
		{name: "the join service's certificate from another cluster's CA is refused", cert: other.verifier(t), reason: ReasonUntrustedCertificate},
		{name: "a verifier certificate for servers only is refused",
			cert:   c.signed(t, pkix.Name{CommonName: "gatehouse-joinservice", Organization: []string{"gatehouse:verifiers"}}, x509.ExtKeyUsageServerAuth, now),
			reason: ReasonUntrustedCertificate},
		{name: "an expired verifier certificate is refused",
			cert:   c.signed(t, pkix.Name{CommonName: "gatehouse-joinservice", Organization: []string{"gatehouse:verifiers"}}, x509.ExtKeyUsageClientAuth, now.Add(-2*time.Hour)),
			reason: ReasonUntrustedCertificate},
	} {
		t.Run(tt.name, func(t *testing.T) {
			quotes, refused := ep.attester.calls.Load(), ep.metric(t, "gatehouse_evidence_refused_total", "reason", tt.reason)
			var err error
			if tt.beforeDoor {
				_, err = fetchBeforeTheDoor(t.Context(), ep.addr, verifiers)
			} else {
				var r *attestation.Result
				r, err = fetcher("127.0.0.1", tt.cert).Fetch(t.Context(), ep.addr, verifiers)
				if err == nil && r.Variant != attestation.VariantTPM {
					t.Fatalf("result %+v", r)
				}
			}
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if got := ep.attester.calls.Load() - quotes; got != 1 {
					t.Fatalf("%d quotes for one answered caller", got)
				}
				return
			}
			if err == nil {
				t.Fatal("answered")
			}
			if !tt.beforeDoor && !errors.Is(err, ErrRefused) {
				t.Errorf("error %v, want ErrRefused", err)
			}
			if !strings.Contains(err.Error(), tt.says) {
				t.Errorf("error %q does not say %q", err, tt.says)
			}
			// The server counts the refusal once it judged the caller.
			ep.waitMetric(t, refused+1, "gatehouse_evidence_refused_total", "reason", tt.reason)
			if got := ep.attester.calls.Load() - quotes; got != 0 {
				t.Errorf("%d quotes made for a refused caller", got)
			}
		})
	}
}

// TestEvidenceDoorFollowsTheClusterCA: before the node joins (no CA file)
// anonymous callers are answered, also with the protocol from before the
// door (`gatehouse verify --node` before `gatehouse init`); the CA file
// appearing closes the door to them, a changed CA moves it to the new
// CA's certificates, an unreadable one refuses everyone, and a removed one
// (kubeadm reset) opens it again.
func TestEvidenceDoorFollowsTheClusterCA(t *testing.T) {
	pair := newTPMPair(t)
	c := newCluster(t)
	clk := &clock{now: time.Now()}
	ep := serveEndpoint(t, pair, EvidenceEndpoint{ClientCAFile: c.caFile, Limits: generous(), Now: clk.Now}, nil)
	verifiers := []attestation.Verifier{pair.verifier}
	fetch := func(cert func() (*tls.Certificate, error)) error {
		_, err := fetcher("127.0.0.1", cert).Fetch(t.Context(), ep.addr, verifiers)
		return err
	}
	later := func() { clk.Step(defaultClientCARecheck) }

	if err := fetch(nil); err != nil {
		t.Fatalf("anonymous caller before the node joined: %v", err)
	}
	if _, err := fetchBeforeTheDoor(t.Context(), ep.addr, verifiers); err != nil {
		t.Fatalf("caller from before the door, before the node joined: %v", err)
	}
	if err := fetch(c.verifier(t)); err != nil {
		t.Fatalf("the join service before the node joined: %v", err)
	}

	c.join(t)
	later()
	if err := fetch(nil); !errors.Is(err, ErrRefused) {
		t.Fatalf("anonymous caller once the CA file exists: %v, want ErrRefused", err)
	}
	if err := fetch(c.verifier(t)); err != nil {
		t.Fatalf("the join service once the CA file exists: %v", err)
	}

	rotated := newCluster(t)
	if err := os.WriteFile(c.caFile, rotated.ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	later()
	if err := fetch(c.verifier(t)); !errors.Is(err, ErrRefused) {
		t.Fatalf("the old CA's join service certificate after the CA changed: %v, want ErrRefused", err)
	}
	if err := fetch(rotated.verifier(t)); err != nil {
		t.Fatalf("the new CA's join service certificate: %v", err)
	}

	if err := os.WriteFile(c.caFile, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	later()
	quotes := ep.attester.calls.Load()
	for _, cert := range []func() (*tls.Certificate, error){nil, rotated.verifier(t)} {
		if err := fetch(cert); err == nil {
			t.Fatal("a caller was answered while the CA file is unreadable")
		}
	}
	ep.waitMetric(t, 2, "gatehouse_evidence_refused_total", "reason", ReasonCAUnreadable)
	if ep.attester.calls.Load() != quotes {
		t.Error("quotes made while the CA file is unreadable")
	}

	if err := os.Remove(c.caFile); err != nil {
		t.Fatal(err)
	}
	later()
	if err := fetch(nil); err != nil {
		t.Fatalf("anonymous caller after the CA file was removed: %v", err)
	}
}

// TestEvidenceEndpointConfig: a bad configuration fails before serving,
// naming what is wrong.
func TestEvidenceEndpointConfig(t *testing.T) {
	pair := newTPMPair(t)
	for _, tt := range []struct {
		name string
		e    EvidenceEndpoint
		want string
	}{
		{"no attester", EvidenceEndpoint{ClientCAFile: "ca.crt"}, "no attester"},
		{"no client CA file", EvidenceEndpoint{Attester: pair.attester}, "no client CA file"},
		{"kubelets allowed", EvidenceEndpoint{Attester: pair.attester, ClientCAFile: "ca.crt", Organizations: []string{"system:nodes"}}, "node credential"},
		{"bootstrap tokens allowed", EvidenceEndpoint{Attester: pair.attester, ClientCAFile: "ca.crt", Organizations: []string{"system:bootstrappers:kubeadm:default-node-token"}}, "node credential"},
		{"no organization", EvidenceEndpoint{Attester: pair.attester, ClientCAFile: "ca.crt", Organizations: []string{}}, "no client certificate organizations"},
		{"negative queue", EvidenceEndpoint{Attester: pair.attester, ClientCAFile: "ca.crt", QuoteQueue: -1}, "must not be negative"},
		{"zero handshake rate", EvidenceEndpoint{Attester: pair.attester, ClientCAFile: "ca.crt", Limits: connlimit.Limits{PerSource: 1}}, "handshake rate"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			err := tt.e.Serve(ctx, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Serve: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestFetchFromANodeBeforeTheDoor: a fetcher, with or without a client
// certificate, still reads a node that serves attested TLS at once (a
// node not yet upgraded), so the join service can be upgraded first.
func TestFetchFromANodeBeforeTheDoor(t *testing.T) {
	pair := newTPMPair(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); _ = lis.Close(); wg.Wait() })
	wg.Go(func() { // the evidence endpoint before issue 32
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			cfg, verified, err := serverConfig(ctx, Config{Attester: pair.attester})
			if err != nil {
				t.Error(err)
				return
			}
			tconn := tls.Server(conn, cfg)
			if tconn.HandshakeContext(ctx) == nil {
				_ = finish(ctx, tconn, pair.attester, verified)
			}
			_ = conn.Close()
		}
	})
	c := newCluster(t)
	for _, cert := range []func() (*tls.Certificate, error){nil, c.verifier(t)} {
		r, err := fetcher("127.0.0.1", cert).Fetch(t.Context(), lis.Addr().String(), []attestation.Verifier{pair.verifier})
		if err != nil {
			t.Fatalf("fetching from a node before the door: %v", err)
		}
		if r.Variant != attestation.VariantTPM {
			t.Fatalf("result %+v", r)
		}
	}
}
