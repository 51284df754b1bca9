package kek

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	vault "github.com/hashicorp/vault/api"

	"github.com/gatehouse-dev/gatehouse/internal/kms"
)

// vaultTransit is a KEK in Vault's (or OpenBao's) Transit secrets engine:
// wrapping with encrypt (under the key's newest version), unwrapping with
// decrypt (Vault API docs, "Transit secrets engine (API)"). The aad goes in
// as associated_data, which Transit's AEAD key types (aes256-gcm96,
// chacha20-poly1305) authenticate.
type vaultTransit struct {
	client      *vault.Client
	mount, key  string
	tokenSource string
}

// openVaultTransit returns the KEK u names. The token is read from u's
// token source at every call.
func openVaultTransit(u *kms.VaultTransitURI) (*vaultTransit, error) {
	// The client is built from the URI alone: the environment's VAULT_*
	// settings (a skipped TLS check, another address or namespace) do not
	// apply.
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if u.CAFile != "" {
		pem, err := os.ReadFile(u.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading Vault's CA bundle: %w", err)
		}
		tlsCfg.RootCAs = x509.NewCertPool()
		if !tlsCfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("the CA bundle for Vault %s holds no PEM certificate", u.CAFile)
		}
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = tlsCfg
	client, err := vault.NewClient(&vault.Config{
		Address: u.Address, HttpClient: &http.Client{Transport: transport}, Timeout: 30 * time.Second, MaxRetries: 1,
	})
	if err != nil {
		return nil, fmt.Errorf("creating vault client: %w", err)
	}
	client.ClearNamespace()
	return &vaultTransit{client: client, mount: u.Mount, key: u.Key, tokenSource: u.TokenSource}, nil
}

func (v *vaultTransit) call(ctx context.Context, op string, data map[string]any) (map[string]any, error) {
	path := strings.TrimPrefix(v.tokenSource, "file:")
	token, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the Vault token from %s: %w", path, err)
	}
	client, err := v.client.Clone()
	if err != nil {
		return nil, err
	}
	client.SetToken(strings.TrimSpace(string(token)))
	secret, err := client.Logical().WriteWithContext(ctx, v.mount+"/"+op+"/"+v.key, data)
	if err != nil {
		return nil, fmt.Errorf("vault transit key %s/%s: %s: %w", v.mount, v.key, op, err)
	}
	if secret == nil || secret.Data == nil {
		return nil, fmt.Errorf("vault transit key %s/%s: %s returned no data", v.mount, v.key, op)
	}
	return secret.Data, nil
}

// aadParam renders aad as Transit's associated_data: its sorted key=value
// pairs, newline-separated, base64.
func aadParam(aad map[string]string) string {
	pairs := make([]string, 0, len(aad))
	for k, v := range aad {
		pairs = append(pairs, k+"="+v)
	}
	slices.Sort(pairs)
	return base64.StdEncoding.EncodeToString([]byte(strings.Join(pairs, "\n")))
}

func (v *vaultTransit) ciphertext(ctx context.Context, op string, data map[string]any) ([]byte, error) {
	out, err := v.call(ctx, op, data)
	if err != nil {
		return nil, err
	}
	ct, ok := out["ciphertext"].(string)
	if !ok || !strings.HasPrefix(ct, "vault:v") {
		return nil, fmt.Errorf("vault transit key %s/%s: %s returned no vault:v… ciphertext", v.mount, v.key, op)
	}
	return []byte(ct), nil
}

// Wrap encrypts plaintext under the Transit key's newest version, bound to
// aad.
func (v *vaultTransit) Wrap(ctx context.Context, plaintext []byte, aad map[string]string) ([]byte, error) {
	return v.ciphertext(ctx, "encrypt", map[string]any{
		"plaintext": base64.StdEncoding.EncodeToString(plaintext), "associated_data": aadParam(aad),
	})
}

// Unwrap decrypts wrapped; another key's ciphertext, another aad, a version
// below the key's min_decryption_version or a refused token are errors.
func (v *vaultTransit) Unwrap(ctx context.Context, wrapped []byte, aad map[string]string) ([]byte, error) {
	out, err := v.call(ctx, "decrypt", map[string]any{"ciphertext": string(wrapped), "associated_data": aadParam(aad)})
	if err != nil {
		return nil, err
	}
	b64, ok := out["plaintext"].(string)
	if !ok {
		return nil, errors.New("vault transit decrypt returned no plaintext")
	}
	plaintext, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, errors.New("vault transit decrypt returned a plaintext that is not base64")
	}
	return plaintext, nil
}
