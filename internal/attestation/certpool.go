package attestation

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"
)

// CertPool parses a PEM bundle of CA certificates; errors name field and
// the block that does not parse.
func CertPool(field, bundle string) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	rest := []byte(bundle)
	for n := 0; ; n++ {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			if n == 0 {
				return nil, fmt.Errorf("%s holds no PEM certificate", field)
			}
			if strings.TrimSpace(string(rest)) != "" {
				return nil, fmt.Errorf("%s: text after certificate %d is not PEM", field, n)
			}
			return pool, nil
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("%s: block %d is a %q, want CERTIFICATE", field, n+1, block.Type)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: certificate %d: %w", field, n+1, err)
		}
		if !cert.IsCA {
			return nil, fmt.Errorf("%s: certificate %d (%s) is not a CA certificate", field, n+1, cert.Subject)
		}
		pool.AddCert(cert)
	}
}
