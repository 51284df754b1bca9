package kubeadm

import (
	"strings"
	"testing"
)

// kubeadmCA is the CA certificate of kubeadm's own dry-run cluster-info
// (cmd/kubeadm/app/util/apiclient/dryrun.go, v1.36.4), an RSA 2048 CA.
const kubeadmCA = `-----BEGIN CERTIFICATE-----
MIIDBTCCAe2gAwIBAgIINJftaB+OWwAwDQYJKoZIhvcNAQELBQAwFTETMBEGA1UE
AxMKa3ViZXJuZXRlczAeFw0yNDA3MDgxMjQwMDRaFw0zNDA3MDYxMjQ1MDRaMBUx
EzARBgNVBAMTCmt1YmVybmV0ZXMwggEiMA0GCSqGSIb3DQEBAQUAA4IBDwAwggEK
AoIBAQDaQDdigOyWim6W/48n3PHoVeVBSid6WcndEWuUq5gBWXdlt996h+VnItlt
8zChl/oR5WfRaRC805Z+oMn/Y8IGVQ3t1hnyImYn4w3vzRXouGeBeiu2SSVjgBwj
XjybbMCmrAdIcbIeZmH66ev5z+5YKmZRUYc3hDaHpXd0EEnZyJV5waZs0XMQUHM7
eqOZAZJ9/mO3NUBplvrPnpOMK7kSEPPg75cU7WHoJHFkeYW593gsgCs2BtUu64cq
bVX9bigrYddpZkoEKKxU8HIwHsI5V8Ron3mKFGlrE17b2l/8CqmAuOvyzLIeiQGX
egIaR/nRHHID9ATi6tX8EaDDpev/AgMBAAGjWTBXMA4GA1UdDwEB/wQEAwICpDAP
BgNVHRMBAf8EBTADAQH/MB0GA1UdDgQWBBQYaCDe6yuVqSaWV73zLjWmGhiaTzAV
BgNVHREEDjAMggprdWJlcm5ldGVzMA0GCSqGSIb3DQEBCwUAA4IBAQCceMnniPaq
GREjGp6XRS7QEYmQrbEd+TV5JQ18o+mW6oGpZ8CA3JAHQDNNPEmPc0yuXDxO9BFX
bg2XRH+KNJ3W2JfQ1TH3TXJEaxfHuX4mB59RClC114klWdHx1j7AmEkuy6tdjnai
fhtSGnxA03bp7b8go3IjW4NpWRN1WG59va0J8BHFh7CDieLn+DMuI63BgkY/y2s0
L/dm9PfqgUK1A3/0dhCV6bECjzA3JBewmdH/+UBOyY2mC05YP33d0p9yykbkdXNq
DN5yAsvMP/OWCnB1eBQTojM82LSqwtvmmMR4tWauh9udVKGck4xBZWudrnKDUUXI
QDMPRgJC/Nx4
-----END CERTIFICATE-----
`

func TestDiscoveryTokenCACertHashPEM(t *testing.T) {
	tests := []struct {
		name    string
		pem     string
		want    string
		wantErr string
	}{
		{
			// Computed once with: openssl x509 -pubkey -noout | openssl pkey -pubin -outform der | sha256sum
			name: "hash of kubeadm's dry-run CA matches openssl",
			pem:  kubeadmCA,
			want: "sha256:" + kubeadmCAHash,
		},
		{name: "no PEM block", pem: "not a certificate", wantErr: "no PEM CERTIFICATE block"},
		{name: "wrong PEM type", pem: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", wantErr: "no PEM CERTIFICATE block"},
		{name: "corrupt certificate", pem: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", wantErr: "parsing CA certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DiscoveryTokenCACertHashPEM([]byte(tt.pem))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

// kubeadmCAHash is the SPKI SHA-256 of kubeadmCA, computed with openssl.
const kubeadmCAHash = "3b793efefe27a19f93b0fbe6e637e9c41d0dde8a377d6ab1c0f656bf1136dd8a"
