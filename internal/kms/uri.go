package kms

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

// URIFile is where the first control plane's bootstrapper writes the
// cluster's KMS URI for the key service (absolute path on the node, mode
// 0600). Its content is secret: a cluster-kms URI carries the master secret.
const URIFile = "/etc/kubernetes/gatehouse/kms-uri"

// ClusterKMSURI is a parsed kms://cluster-kms?key=<base64url>&salt=<base64url>.
type ClusterKMSURI struct {
	MasterSecret, Salt []byte
}

// PKCS11URI is a parsed
// kms://pkcs11?module=<path>&token=<label>&pin-source=file:<path>&key-label=<label>.
type PKCS11URI struct {
	// Module is the path of the PKCS#11 library.
	Module string
	// Token is the label of the token holding the KEK.
	Token string
	// PinSource is where the user PIN is read from: "file:<absolute path>"
	// (as RFC 7512's pin-source); the PIN never appears in the URI.
	PinSource string
	// KeyLabel is the CKA_LABEL of the AES key-encryption key.
	KeyLabel string
}

// ParseURI parses a KMS URI into a *ClusterKMSURI, *PKCS11URI, *AWSKMSURI or
// *VaultTransitURI (docs/keys.md, "KMS URIs"). Errors name the part that is
// wrong and never echo key material.
func ParseURI(uri string) (any, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return nil, errors.New("KMS URI does not parse; expect kms://<backend>?<parameters>, the backend one of " + knownBackends)
	}
	if u.Scheme != "kms" {
		return nil, fmt.Errorf("KMS URI scheme is %q, want kms", u.Scheme)
	}
	if u.Path != "" || u.User != nil || u.Fragment != "" {
		return nil, errors.New("KMS URI has a path, user or fragment; expect kms://<backend>?<parameters>")
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, errors.New("KMS URI query does not parse")
	}
	switch u.Host {
	case "cluster-kms":
		return parseClusterKMS(q)
	case "pkcs11":
		return parsePKCS11(q)
	case BackendAWSKMS:
		return parseAWSKMS(q)
	case BackendVaultTransit:
		return parseVaultTransit(q)
	default:
		return nil, fmt.Errorf("unknown KMS backend %q: known backends are %s", u.Host, knownBackends)
	}
}

const knownBackends = "cluster-kms, pkcs11, " + BackendAWSKMS + ", " + BackendVaultTransit

// single returns a required parameter's value, refusing a missing, repeated
// or empty one.
func single(q url.Values, name string) (string, error) {
	v := q[name]
	if len(v) != 1 || v[0] == "" {
		return "", fmt.Errorf("KMS URI needs exactly one non-empty %q parameter", name)
	}
	return v[0], nil
}

// onlyKnown refuses a parameter not in known.
func onlyKnown(q url.Values, known ...string) error {
	for k := range q {
		if !slices.Contains(known, k) {
			return fmt.Errorf("KMS URI has unknown parameter %q", k)
		}
	}
	return nil
}

// optional returns an optional parameter's value, refusing a repeated or
// empty one.
func optional(q url.Values, name string) (string, error) {
	v, ok := q[name]
	if !ok {
		return "", nil
	}
	if len(v) != 1 || v[0] == "" {
		return "", fmt.Errorf("KMS URI parameter %q is repeated or empty", name)
	}
	return v[0], nil
}

func parseClusterKMS(q url.Values) (*ClusterKMSURI, error) {
	params := []string{"key", "salt"}
	if err := onlyKnown(q, params...); err != nil {
		return nil, err
	}
	var decoded [2][]byte
	for i, name := range params {
		v, err := single(q, name)
		if err != nil {
			return nil, err
		}
		if decoded[i], err = base64.RawURLEncoding.DecodeString(strings.TrimRight(v, "=")); err != nil {
			return nil, fmt.Errorf("KMS URI parameter %q is not base64url", name)
		}
	}
	if len(decoded[0]) < keys.MinMasterSecretSize {
		return nil, fmt.Errorf("KMS URI key has %d bytes, at least %d required", len(decoded[0]), keys.MinMasterSecretSize)
	}
	if len(decoded[1]) < keys.MinMasterSaltSize {
		return nil, fmt.Errorf("KMS URI salt has %d bytes, at least %d required", len(decoded[1]), keys.MinMasterSaltSize)
	}
	return &ClusterKMSURI{MasterSecret: decoded[0], Salt: decoded[1]}, nil
}

func parsePKCS11(q url.Values) (*PKCS11URI, error) {
	params := []string{"module", "token", "pin-source", "key-label"}
	if err := onlyKnown(q, params...); err != nil {
		return nil, err
	}
	var v [4]string
	for i, name := range params {
		var err error
		if v[i], err = single(q, name); err != nil {
			return nil, err
		}
	}
	if !strings.HasPrefix(v[0], "/") {
		return nil, fmt.Errorf("KMS URI module %q is not an absolute path", v[0])
	}
	if !strings.HasPrefix(v[2], "file:/") {
		return nil, errors.New(`KMS URI pin-source must be "file:<absolute path>"`)
	}
	return &PKCS11URI{Module: v[0], Token: v[1], PinSource: v[2], KeyLabel: v[3]}, nil
}

// ClusterKMSURIString renders a cluster-kms URI.
func ClusterKMSURIString(masterSecret, salt []byte) string {
	return "kms://cluster-kms?key=" + base64.RawURLEncoding.EncodeToString(masterSecret) +
		"&salt=" + base64.RawURLEncoding.EncodeToString(salt)
}

// ReadPIN reads the PIN from the URI's pin-source, trimming a final newline.
func (u *PKCS11URI) ReadPIN() (string, error) {
	path := strings.TrimPrefix(u.PinSource, "file:")
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading PKCS#11 PIN from %s: %w", path, err)
	}
	return strings.TrimRight(string(data), "\r\n"), nil
}
