package cosignformat

import (
	"errors"
	"fmt"
	"io"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	// signatureAnnotation is the layer annotation holding a base64 image
	// signature (cosign's SIGNATURE_SPEC.md).
	signatureAnnotation = "dev.cosignproject.cosign/signature"
	// simpleSigningMediaType is the media type of a signature image's
	// payload layer.
	simpleSigningMediaType types.MediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
)

// SignatureTag is the tag cosign stores the signatures of the manifest
// digest under, in the image's repository: "sha256-<hex>.sig".
func SignatureTag(digest v1.Hash) string {
	return digest.Algorithm + "-" + digest.Hex + ".sig"
}

// SignImage returns the signature image of the manifest or index digest
// of an image in repository: one payload layer with the signature in its
// annotation, an OCI manifest, no timestamps.
func (s *Signer) SignImage(repository string, digest v1.Hash) (v1.Image, error) {
	body, err := payload(repository, digest.String())
	if err != nil {
		return nil, err
	}
	sig, err := s.SignBlob(strings.NewReader(string(body)))
	if err != nil {
		return nil, fmt.Errorf("signing %s@%s: %w", repository, digest, err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	return mutate.Append(img, mutate.Addendum{
		Layer:       static.NewLayer(body, simpleSigningMediaType),
		Annotations: map[string]string{signatureAnnotation: string(sig)},
	})
}

// errNoImageSignature is returned (wrapped) when a signature image holds
// no signature by the key for the digest.
var errNoImageSignature = errors.New("no valid signature for the image")

// VerifyImage checks that the signature image sigImg holds at least one
// simple-signing payload, signed by v's key, naming repository and digest
// (cosign verify's rule). It returns an error wrapping
// errNoImageSignature otherwise, with each layer's reason.
func (v *Verifier) VerifyImage(sigImg v1.Image, repository string, digest v1.Hash) error {
	m, err := sigImg.Manifest()
	if err != nil {
		return fmt.Errorf("reading the signature manifest: %w", err)
	}
	var reasons []error
	for i, desc := range m.Layers {
		sig, ok := desc.Annotations[signatureAnnotation]
		if !ok || desc.MediaType != simpleSigningMediaType {
			reasons = append(reasons, fmt.Errorf("layer %d: not a signed simple-signing payload", i))
			continue
		}
		layer, err := sigImg.LayerByDigest(desc.Digest)
		if err != nil {
			reasons = append(reasons, fmt.Errorf("layer %d: %w", i, err))
			continue
		}
		payload, err := readLayer(layer, desc.Digest)
		if err != nil {
			reasons = append(reasons, fmt.Errorf("layer %d: %w", i, err))
			continue
		}
		if err := v.VerifyBlob(strings.NewReader(string(payload)), []byte(sig)); err != nil {
			reasons = append(reasons, fmt.Errorf("layer %d: %w", i, err))
			continue
		}
		p, err := parsePayload(payload)
		if err != nil {
			reasons = append(reasons, fmt.Errorf("layer %d: %w", i, err))
			continue
		}
		if p.Critical.Image.DockerManifestDigest != digest.String() || p.Critical.Identity.DockerReference != repository {
			reasons = append(reasons, fmt.Errorf("layer %d: signed for %s@%s, not %s@%s", i,
				p.Critical.Identity.DockerReference, p.Critical.Image.DockerManifestDigest, repository, digest))
			continue
		}
		return nil
	}
	return fmt.Errorf("%w %s@%s: %w", errNoImageSignature, repository, digest, errors.Join(reasons...))
}

// readLayer reads an uncompressed payload layer (at most 1 MiB) and
// checks it against its digest.
func readLayer(layer v1.Layer, want v1.Hash) ([]byte, error) {
	rc, err := layer.Compressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	payload, err := io.ReadAll(io.LimitReader(rc, 1<<20))
	if err != nil {
		return nil, err
	}
	got, _, err := v1.SHA256(strings.NewReader(string(payload)))
	if err != nil {
		return nil, err
	}
	if got != want {
		return nil, fmt.Errorf("payload digest %s, manifest says %s", got, want)
	}
	return payload, nil
}
