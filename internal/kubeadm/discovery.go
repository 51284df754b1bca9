// Package kubeadm holds what Gatehouse needs to speak kubeadm's language:
// bootstrap-token discovery values and typed, hardened v1beta4 configuration.
package kubeadm

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"regexp"
)

// DiscoveryTokenCACertHash returns kubeadm's discovery token CA cert hash for
// cert: "sha256:" followed by the lowercase hex SHA-256 digest of the
// certificate's DER-encoded SubjectPublicKeyInfo (RFC 5280 §4.1.2.7), the
// value `kubeadm join --discovery-token-ca-cert-hash` pins (kubeadm reference,
// "kubeadm join": "Token-based discovery with CA pinning").
func DiscoveryTokenCACertHash(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// DiscoveryTokenCACertHashPEM is DiscoveryTokenCACertHash for the first
// certificate in a PEM bundle. It returns an error when the bundle holds no
// parsable certificate.
func DiscoveryTokenCACertHashPEM(caPEM []byte) (string, error) {
	block, _ := pem.Decode(caPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return "", errors.New("CA bundle holds no PEM CERTIFICATE block")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("parsing CA certificate: %w", err)
	}
	return DiscoveryTokenCACertHash(cert), nil
}

// bootstrapTokenRE matches a bootstrap token (kubeadm reference, "kubeadm
// token": "[a-z0-9]{6}.[a-z0-9]{16}").
var bootstrapTokenRE = regexp.MustCompile(`^[a-z0-9]{6}\.[a-z0-9]{16}$`)

// caCertHashRE matches a discovery token CA cert hash.
var caCertHashRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
