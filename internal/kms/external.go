package kms

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

// External KMS backends: a key-encryption key (KEK) in a KMS wraps the
// master secret, which is stored only in that wrapped form (docs/keys.md,
// "External KMS").
const (
	// BackendAWSKMS is AWS Key Management Service (or an API-compatible
	// server): kms://aws-kms?key-id=…&region=…[&endpoint=…].
	BackendAWSKMS = "aws-kms"
	// BackendVaultTransit is HashiCorp Vault's (or OpenBao's) Transit
	// secrets engine: kms://vault-transit?address=…&key=…&token-source=file:…
	BackendVaultTransit = "vault-transit"
)

// maxWrappedSize bounds a wrapped master secret (bytes): AWS KMS
// ciphertexts of a 64-byte plaintext are under 300 bytes, Vault Transit's
// under 200; anything far larger is not one.
const maxWrappedSize = 4096

// WrappedSecret is the master secret wrapped by a KEK, with its salt (not
// secret). Both are empty in a URI that only names the KEK, as the cluster
// configuration's masterSecretKEK does before `gatehouse init` wraps a
// secret.
type WrappedSecret struct {
	// Wrapped is the KMS's ciphertext of the master secret.
	Wrapped []byte
	// Salt is the master salt.
	Salt []byte
}

// AAD is the additional authenticated data a wrapped master secret is bound
// to (AWS KMS encryption context, Vault Transit associated data): its
// purpose and the SHA-256 of its salt, so a wrapped secret paired with
// another salt, or another ciphertext of the same KEK, does not unwrap as
// this one.
func (w WrappedSecret) AAD() map[string]string {
	sum := sha256.Sum256(w.Salt)
	return map[string]string{"gatehouse-purpose": "master-secret", "gatehouse-salt-sha256": hex.EncodeToString(sum[:])}
}

// IsWrapped reports whether w carries a wrapped secret.
func (w WrappedSecret) IsWrapped() bool { return len(w.Wrapped) > 0 }

func (w WrappedSecret) appendParams(b *strings.Builder) {
	if w.IsWrapped() {
		b.WriteString("&wrapped=" + base64.RawURLEncoding.EncodeToString(w.Wrapped))
		b.WriteString("&salt=" + base64.RawURLEncoding.EncodeToString(w.Salt))
	}
}

// AWSKMSURI is a parsed
// kms://aws-kms?key-id=<id>&region=<region>[&endpoint=<URL>][&wrapped=<base64url>&salt=<base64url>].
// Credentials come from the AWS SDK's default chain (environment, shared
// files, the instance's role through IMDSv2, web identity), never the URI.
type AWSKMSURI struct {
	// KeyID is the KEK: a key id, key ARN, alias name (alias/…) or alias ARN.
	KeyID string
	// Region is the AWS region, e.g. eu-west-1.
	Region string
	// Endpoint overrides the regional endpoint (a VPC endpoint, FIPS
	// endpoint or a compatible server); https unless on loopback.
	Endpoint string
	WrappedSecret
}

// String renders the URI.
func (u *AWSKMSURI) String() string {
	var b strings.Builder
	b.WriteString("kms://" + BackendAWSKMS + "?key-id=" + url.QueryEscape(u.KeyID) + "&region=" + url.QueryEscape(u.Region))
	if u.Endpoint != "" {
		b.WriteString("&endpoint=" + url.QueryEscape(u.Endpoint))
	}
	u.appendParams(&b)
	return b.String()
}

// VaultTransitURI is a parsed
// kms://vault-transit?address=<URL>&key=<name>&token-source=file:<path>[&mount=<path>][&ca-file=<path>][&wrapped=…&salt=…].
type VaultTransitURI struct {
	// Address is Vault's URL; https unless on loopback.
	Address string
	// Mount is the Transit engine's mount path (default "transit").
	Mount string
	// Key is the Transit key's name.
	Key string
	// TokenSource is "file:<absolute path>" of a Vault token, read at every
	// use so a renewed or replaced token (Vault Agent's sink) takes effect.
	TokenSource string
	// CAFile is an absolute path of the CA bundle for Vault's certificate;
	// empty means the system's roots.
	CAFile string
	WrappedSecret
}

// String renders the URI.
func (u *VaultTransitURI) String() string {
	var b strings.Builder
	b.WriteString("kms://" + BackendVaultTransit + "?address=" + url.QueryEscape(u.Address) + "&key=" + url.QueryEscape(u.Key) +
		"&token-source=" + url.QueryEscape(u.TokenSource))
	if u.Mount != "transit" {
		b.WriteString("&mount=" + url.QueryEscape(u.Mount))
	}
	if u.CAFile != "" {
		b.WriteString("&ca-file=" + url.QueryEscape(u.CAFile))
	}
	u.appendParams(&b)
	return b.String()
}

func parseAWSKMS(q url.Values) (*AWSKMSURI, error) {
	if err := onlyKnown(q, "key-id", "region", "endpoint", "wrapped", "salt"); err != nil {
		return nil, err
	}
	var u AWSKMSURI
	var err error
	if u.KeyID, err = single(q, "key-id"); err != nil {
		return nil, err
	}
	if u.Region, err = single(q, "region"); err != nil {
		return nil, err
	}
	if u.Endpoint, err = optional(q, "endpoint"); err != nil {
		return nil, err
	}
	if u.Endpoint != "" {
		if err := checkServiceURL("endpoint", u.Endpoint); err != nil {
			return nil, err
		}
	}
	if u.WrappedSecret, err = parseWrapped(q); err != nil {
		return nil, err
	}
	return &u, nil
}

func parseVaultTransit(q url.Values) (*VaultTransitURI, error) {
	known := []string{"address", "key", "token-source", "mount", "ca-file", "wrapped", "salt"}
	if err := onlyKnown(q, known...); err != nil {
		return nil, err
	}
	u := VaultTransitURI{Mount: "transit"}
	var err error
	for _, p := range []struct {
		name string
		dst  *string
	}{{"address", &u.Address}, {"key", &u.Key}, {"token-source", &u.TokenSource}} {
		if *p.dst, err = single(q, p.name); err != nil {
			return nil, err
		}
	}
	if err := checkServiceURL("address", u.Address); err != nil {
		return nil, err
	}
	if strings.ContainsAny(u.Key, "/?#") {
		return nil, errors.New("KMS URI key must be a Transit key name, without '/', '?' or '#'")
	}
	if !strings.HasPrefix(u.TokenSource, "file:/") {
		return nil, errors.New(`KMS URI token-source must be "file:<absolute path>"; a token never goes in the URI`)
	}
	if mount, err := optional(q, "mount"); err != nil {
		return nil, err
	} else if mount != "" {
		u.Mount = strings.Trim(mount, "/")
	}
	if u.CAFile, err = optional(q, "ca-file"); err != nil {
		return nil, err
	}
	if u.CAFile != "" && !strings.HasPrefix(u.CAFile, "/") {
		return nil, fmt.Errorf("KMS URI ca-file %q is not an absolute path", u.CAFile)
	}
	if u.WrappedSecret, err = parseWrapped(q); err != nil {
		return nil, err
	}
	return &u, nil
}

// parseWrapped reads the optional wrapped and salt parameters: both or
// neither.
func parseWrapped(q url.Values) (WrappedSecret, error) {
	var w WrappedSecret
	for _, p := range []struct {
		name string
		dst  *[]byte
	}{{"wrapped", &w.Wrapped}, {"salt", &w.Salt}} {
		v, err := optional(q, p.name)
		if err != nil || v == "" {
			if err != nil {
				return w, err
			}
			continue
		}
		if *p.dst, err = base64.RawURLEncoding.DecodeString(strings.TrimRight(v, "=")); err != nil {
			return w, fmt.Errorf("KMS URI parameter %q is not base64url", p.name)
		}
	}
	switch {
	case len(w.Wrapped) == 0 && len(w.Salt) == 0:
		return w, nil
	case len(w.Wrapped) == 0 || len(w.Salt) == 0:
		return w, errors.New(`KMS URI needs both "wrapped" and "salt", or neither (a URI naming only the key-encryption key)`)
	case len(w.Wrapped) > maxWrappedSize:
		return w, fmt.Errorf("KMS URI wrapped secret has %d bytes, at most %d allowed", len(w.Wrapped), maxWrappedSize)
	case len(w.Salt) < keys.MinMasterSaltSize:
		return w, fmt.Errorf("KMS URI salt has %d bytes, at least %d required", len(w.Salt), keys.MinMasterSaltSize)
	}
	return w, nil
}

// checkServiceURL requires an absolute http(s) URL without credentials,
// query or fragment; plain http only to a loopback address.
func checkServiceURL(param, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return fmt.Errorf("KMS URI %s is not an absolute URL", param)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("KMS URI %s must not carry credentials, a query or a fragment", param)
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if ip := net.ParseIP(u.Hostname()); (ip != nil && ip.IsLoopback()) || u.Hostname() == "localhost" {
			return nil
		}
		return fmt.Errorf("KMS URI %s uses plain http to %s: use https (plain http is allowed only to a loopback address)", param, u.Hostname())
	default:
		return fmt.Errorf("KMS URI %s scheme is %q, want https", param, u.Scheme)
	}
}
