package tpm

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"fmt"
	"slices"
	"time"

	"golang.org/x/crypto/cryptobyte"
	cbasn1 "golang.org/x/crypto/cryptobyte/asn1"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// OIDs of the TCG EK Credential Profile for TPM Family 2.0 (version 2.5,
// §3.2) and of X.509 (RFC 5280).
var (
	oidSubjectAltName  = asn1.ObjectIdentifier{2, 5, 29, 17}
	oidTPMManufacturer = asn1.ObjectIdentifier{2, 23, 133, 2, 1}
	oidTPMModel        = asn1.ObjectIdentifier{2, 23, 133, 2, 2}
	oidTPMVersion      = asn1.ObjectIdentifier{2, 23, 133, 2, 3}
	// oidEKCertificate is tcg-kp-ekCertificate, the extended key usage that
	// marks an EK certificate.
	oidEKCertificate = asn1.ObjectIdentifier{2, 23, 133, 8, 1}
)

// maxEKCertificateSize bounds an EK certificate (bytes); TPM NV indices
// hold a few kilobytes at most.
const maxEKCertificateSize = 8 << 10

// ekCertificate is a TPM endorsement key (EK) certificate, as its
// manufacturer issues it (TCG EK Credential Profile 2.0).
type ekCertificate struct {
	Certificate *x509.Certificate
	// Manufacturer, Model and Version name the TPM: the attributes
	// tcg-at-tpmManufacturer (e.g. "id:49465800"), tcg-at-tpmModel and
	// tcg-at-tpmVersion of the subjectAltName's directoryName.
	Manufacturer, Model, Version string
}

// parseEKCertificate parses a DER EK certificate. It must carry the
// tcg-kp-ekCertificate extended key usage. The profile's subjectAltName,
// critical and holding only a directoryName with the TPM's attributes
// (§3.2.9), is parsed here because crypto/x509 leaves it unhandled; any
// other unhandled critical extension is refused. Errors wrap
// attestation.ErrMalformed (does not parse) or attestation.ErrUntrustedKey
// (not an EK certificate).
func parseEKCertificate(der []byte) (*ekCertificate, error) {
	if len(der) > maxEKCertificateSize {
		return nil, fmt.Errorf("%w: EK certificate of %d bytes exceeds %d", attestation.ErrMalformed, len(der), maxEKCertificateSize)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("%w: EK certificate: %w", attestation.ErrMalformed, err)
	}
	ek := &ekCertificate{Certificate: cert}
	for _, ext := range cert.Extensions {
		if ext.Id.Equal(oidSubjectAltName) {
			if err := ek.parseSubjectAltName(ext.Value); err != nil {
				return nil, err
			}
		}
	}
	unhandled := slices.DeleteFunc(slices.Clone(cert.UnhandledCriticalExtensions), func(id asn1.ObjectIdentifier) bool {
		return id.Equal(oidSubjectAltName) && ek.Manufacturer != ""
	})
	if len(unhandled) > 0 {
		return nil, fmt.Errorf("%w: EK certificate has unhandled critical extensions %v", attestation.ErrUntrustedKey, unhandled)
	}
	cert.UnhandledCriticalExtensions = nil
	if !slices.ContainsFunc(cert.UnknownExtKeyUsage, oidEKCertificate.Equal) {
		return nil, fmt.Errorf("%w: certificate %q is not an EK certificate (no tcg-kp-EKCertificate extended key usage)", attestation.ErrUntrustedKey, cert.Subject)
	}
	return ek, nil
}

// handleTPMSubjectAltName marks cert's critical subjectAltName handled when
// it is the TCG profiles' directoryName naming a TPM (as in EK and vTPM AK
// certificates, which crypto/x509 leaves unhandled); any other unhandled
// critical extension stays, so verification refuses it.
func handleTPMSubjectAltName(cert *x509.Certificate) error {
	for _, ext := range cert.Extensions {
		if !ext.Id.Equal(oidSubjectAltName) || !ext.Critical {
			continue
		}
		var tpm ekCertificate
		if err := tpm.parseSubjectAltName(ext.Value); err != nil {
			return err
		}
		if tpm.Manufacturer != "" {
			cert.UnhandledCriticalExtensions = slices.DeleteFunc(cert.UnhandledCriticalExtensions, oidSubjectAltName.Equal)
		}
	}
	return nil
}

// parseSubjectAltName reads the TPM's attributes from the directoryName
// of a subjectAltName (GeneralNames, RFC 5280 §4.2.1.6).
func (ek *ekCertificate) parseSubjectAltName(value []byte) error {
	in := cryptobyte.String(value)
	var names cryptobyte.String
	if !in.ReadASN1(&names, cbasn1.SEQUENCE) || !in.Empty() {
		return fmt.Errorf("%w: EK certificate subjectAltName does not parse", attestation.ErrMalformed)
	}
	directoryName := cbasn1.Tag(4).ContextSpecific().Constructed()
	for !names.Empty() {
		var name cryptobyte.String
		var tag cbasn1.Tag
		if !names.ReadAnyASN1(&name, &tag) {
			return fmt.Errorf("%w: EK certificate subjectAltName does not parse", attestation.ErrMalformed)
		}
		if tag != directoryName {
			continue // other names are crypto/x509's to handle
		}
		var rdns pkix.RDNSequence
		if rest, err := asn1.Unmarshal(name, &rdns); err != nil || len(rest) > 0 {
			return fmt.Errorf("%w: EK certificate directoryName does not parse", attestation.ErrMalformed)
		}
		for _, rdn := range rdns {
			for _, atv := range rdn {
				v, ok := atv.Value.(string)
				if !ok {
					continue
				}
				switch {
				case atv.Type.Equal(oidTPMManufacturer):
					ek.Manufacturer = v
				case atv.Type.Equal(oidTPMModel):
					ek.Model = v
				case atv.Type.Equal(oidTPMVersion):
					ek.Version = v
				}
			}
		}
	}
	return nil
}

// Verify checks that the certificate chains, at time now, to one of roots
// (the TPM manufacturers' CAs a policy trusts) through intermediates.
// Errors wrap attestation.ErrUntrustedKey.
func (ek *ekCertificate) Verify(roots, intermediates *x509.CertPool, now time.Time) error {
	_, err := ek.Certificate.Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: intermediates, CurrentTime: now,
		// The EK usage is an unknown one to crypto/x509; parseEKCertificate
		// checked it.
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return fmt.Errorf("%w: EK certificate of TPM %s %s: %w", attestation.ErrUntrustedKey, ek.Manufacturer, ek.Model, err)
	}
	return nil
}
