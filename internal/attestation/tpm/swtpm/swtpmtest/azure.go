package swtpmtest

import (
	"crypto/rsa"
	"testing"

	"github.com/google/go-tpm/legacy/tpm2"
)

// AzureAKPublic is the TPMT_PUBLIC of an RSA attestation key in the
// template of the AK Azure provisions in its vTPMs (a restricted
// RSASSA-SHA256 signing key, OpenHCL's template), for recorded Azure
// evidence that carries the key but not its TPMT_PUBLIC.
func AzureAKPublic(t testing.TB, key *rsa.PublicKey) []byte {
	t.Helper()
	area, err := tpm2.Public{
		Type: tpm2.AlgRSA, NameAlg: tpm2.AlgSHA256,
		Attributes: tpm2.FlagSign | tpm2.FlagRestricted | tpm2.FlagFixedTPM | tpm2.FlagFixedParent |
			tpm2.FlagSensitiveDataOrigin | tpm2.FlagUserWithAuth | tpm2.FlagNoDA,
		RSAParameters: &tpm2.RSAParams{
			Sign:    &tpm2.SigScheme{Alg: tpm2.AlgRSASSA, Hash: tpm2.AlgSHA256},
			KeyBits: uint16(key.N.BitLen()), ModulusRaw: key.N.Bytes(),
		},
	}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return area
}
