package cli

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gatehouse-dev/gatehouse/image/build"
	"github.com/gatehouse-dev/gatehouse/image/predict"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/signedvalues"
)

// Files the build writes beside its disks (docs/image.md, "Output").
const (
	imageValuesFile    = "reference-values.json"
	imageSignedFile    = "reference-values.signed.json"
	imageVerifyKeyFile = "signing-key.pub"
)

// signBuild predicts the reference values of every role's UKI of res
// under platform, signs them with the key at keyFile and writes the
// unsigned payload, the signed file and the public key into res.Dir and
// out (when set). A missing key at the default path (created true) is
// made first, and said so: a local build's own key.
func signBuild(ctx context.Context, w io.Writer, res *build.Result, platform, keyFile string, create bool, out string) error {
	keyPEM, pubPEM, err := signingKey(w, keyFile, create)
	if err != nil {
		return err
	}
	manifest, err := os.ReadFile(res.Manifest)
	if err != nil {
		return fmt.Errorf("reading the build's manifest: %w", err)
	}
	digest := sha256.Sum256(manifest)
	ukis := map[policy.Role]string{}
	for _, im := range res.Images {
		ukis[policy.Role(im.Role)] = im.UKI
	}
	values, err := predict.ReferenceValues(ctx, predict.Build{
		Platform: platform,
		Image:    signedvalues.Image{Name: "gatehouse-node", Version: hex.EncodeToString(digest[:6]), ManifestSHA256: hex.EncodeToString(digest[:]), RootHash: res.RootHash},
		UKIs:     ukis,
	}, keyPEM)
	if err != nil {
		return fmt.Errorf("predicting the image's reference values: %w", err)
	}
	for _, dir := range []string{res.Dir, out} {
		if dir == "" {
			continue
		}
		for name, data := range map[string][]byte{imageValuesFile: values.Payload, imageSignedFile: values.Signed, imageVerifyKeyFile: pubPEM} {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil { //nolint:gosec // public: values, signature and public key
				return fmt.Errorf("writing %s: %w", name, err)
			}
		}
	}
	fmt.Fprintf(w, "  values     %s (platform %s), signed: %s, verify key %s\n", imageValuesFile, platform, imageSignedFile, imageVerifyKeyFile)
	for _, note := range values.Values.Notes {
		fmt.Fprintf(w, "    note: %s\n", note)
	}
	return nil
}

// signingKey reads the PEM signing key at path and returns it with its
// public key (PKIX PEM). With create, a missing key is generated first
// (0600), for builds on this machine.
func signingKey(w io.Writer, path string, create bool) (keyPEM, pubPEM []byte, err error) {
	keyPEM, err = os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && create {
		priv, _, gerr := signedvalues.GenerateKey()
		if gerr != nil {
			return nil, nil, gerr
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, nil, err
		}
		if err := os.WriteFile(path, priv, 0o600); err != nil {
			return nil, nil, fmt.Errorf("writing the new signing key: %w", err)
		}
		fmt.Fprintf(w, "Created a signing key for this machine's builds at %s: clusters that trust its public key (%s beside each build) accept what it signs; keep it like a CA key (docs/image.md)\n", path, imageVerifyKeyFile)
		keyPEM, err = priv, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("--signing-key: %w", err)
	}
	signer, err := signedvalues.ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("--signing-key %s: %w", path, err)
	}
	der, err := x509.MarshalPKIXPublicKey(signer.Public())
	if err != nil {
		return nil, nil, err
	}
	return keyPEM, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}
