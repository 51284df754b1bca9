// Package policy compiles an appraisal policy (reference values per node
// role, and how attestation keys are endorsed) into a verifier: the
// policy-to-verifier step every relying party shares (the join service, the
// CLI's init and verify, the local cluster). docs/joinservice.md, "Roles
// from evidence", describes the format.
package policy

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
)

// Policy is the file form of an appraisal policy: the join config's
// attestation.yaml and the cluster configuration's attestation section
// (docs/joinservice.md, "Join config").
type Policy struct {
	// Variant must be the variant the service was started for ("tpm").
	Variant string `json:"variant"`
	// PCRs is the SHA-256 PCR selection every quote must cover; it must
	// include keys.NodeLockPCR.
	PCRs []int `json:"pcrs"`
	// ReferenceValues are the expected PCR values every node shares, whatever
	// its role (package measurements' format). keys.NodeLockPCR must not appear:
	// it is always enforced as zero.
	ReferenceValues json.RawMessage `json:"referenceValues,omitempty"`
	// Roles holds the reference values of each node role a node can prove
	// (RoleControlPlane, RoleWorker). A node's evidence must satisfy
	// ReferenceValues and at least one role's; the roles it satisfies are
	// the only ones it gets (docs/joinservice.md, "Roles from evidence").
	Roles map[Role]RolePolicy `json:"roles"`
	// AKRoots is a PEM bundle of roots for AK certificate chains.
	AKRoots string `json:"akRoots,omitempty"`
	// PinnedAKs are PEM public keys of trusted attestation keys.
	PinnedAKs []string `json:"pinnedAKs,omitempty"`
}

// Decode decodes a Policy from YAML (or JSON) strictly: unknown fields
// are errors.
func Decode(data []byte) (Policy, error) {
	var p Policy
	jsonData, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return p, err
	}
	dec := json.NewDecoder(bytes.NewReader(jsonData))
	dec.DisallowUnknownFields()
	err = dec.Decode(&p)
	return p, err
}

// Verifier returns the verifier of p, accepting evidence that satisfies
// any of its roles, and a summary of it for logs. lockPCR is what the
// node-lock PCR must hold (see Appraisal).
func (p Policy) Verifier(now func() time.Time, lockPCR []byte) (attestation.Verifier, string, error) {
	a, err := p.Appraisal(now, lockPCR)
	if err != nil {
		return nil, "", err
	}
	return a, a.Summary, nil
}

func parseEndorsement(p Policy) (tpm.Endorsement, error) {
	var e tpm.Endorsement
	if (strings.TrimSpace(p.AKRoots) == "") == (len(p.PinnedAKs) == 0) {
		return e, errors.New("set exactly one of akRoots and pinnedAKs")
	}
	if p.AKRoots != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(p.AKRoots)) {
			return e, errors.New("akRoots holds no PEM certificate")
		}
		e.Roots = pool
		return e, nil
	}
	for i, s := range p.PinnedAKs {
		block, _ := pem.Decode([]byte(s))
		if block == nil || block.Type != "PUBLIC KEY" {
			return e, fmt.Errorf("pinnedAKs[%d] is not a PEM PUBLIC KEY", i)
		}
		pub, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			return e, fmt.Errorf("pinnedAKs[%d]: %w", i, err)
		}
		e.PinnedKeys = append(e.PinnedKeys, crypto.PublicKey(pub))
	}
	return e, nil
}

// Fingerprint returns "sha256:" and the first 16 hex digits of data's
// SHA-256, a short fingerprint for logs.
func Fingerprint(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:8])
}
