package release

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"io"
	"net/url"
	"os"
	"sort"
	"strings"

	cdx "github.com/CycloneDX/cyclonedx-go"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
)

// sbomFile is one file an SBOM lists, with its sha256.
type sbomFile struct {
	Name   string
	SHA256 string
}

// fileSHA256 is the hex sha256 of the file at p.
func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// goComponent is the CycloneDX component of the Go binary at p: an
// application with the sha256 of the file and, nested, the Go modules
// debug/buildinfo reads from it (purl pkg:golang, the toolchain as
// pkg:golang/stdlib).
func goComponent(name, version, p string) (cdx.Component, error) {
	sum, err := fileSHA256(p)
	if err != nil {
		return cdx.Component{}, err
	}
	bi, err := buildinfo.ReadFile(p)
	if err != nil {
		return cdx.Component{}, fmt.Errorf("reading the Go build information of %s: %w", p, err)
	}
	mods := []cdx.Component{{Type: cdx.ComponentTypeLibrary, Name: "stdlib", Version: bi.GoVersion,
		PackageURL: "pkg:golang/stdlib@" + bi.GoVersion, BOMRef: "pkg:golang/stdlib@" + bi.GoVersion}}
	for _, d := range bi.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		purl := "pkg:golang/" + d.Path + "@" + d.Version
		c := cdx.Component{Type: cdx.ComponentTypeLibrary, Name: d.Path, Version: d.Version, PackageURL: purl, BOMRef: name + ":" + purl}
		if d.Sum != "" {
			c.Properties = &[]cdx.Property{{Name: "go:module:sum", Value: d.Sum}}
		}
		mods = append(mods, c)
	}
	mods[0].BOMRef = name + ":" + mods[0].BOMRef
	return cdx.Component{
		Type: cdx.ComponentTypeApplication, Name: name, Version: version, BOMRef: name,
		PackageURL: "pkg:golang/" + bi.Main.Path + "@" + version,
		Hashes:     &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: sum}},
		Components: &mods,
	}, nil
}

// ociPURL is the package URL of an image by digest (purl-spec's oci type).
func ociPURL(img Image) string {
	repo := img.Repository
	name := repo[strings.LastIndex(repo, "/")+1:]
	return "pkg:oci/" + name + "@" + url.PathEscape(img.Digest) + "?repository_url=" + url.QueryEscape(repo)
}

// imageComponent is the CycloneDX component of an image by digest.
func imageComponent(img Image) cdx.Component {
	return cdx.Component{Type: cdx.ComponentTypeContainer, Name: img.Repository, Version: img.Digest,
		BOMRef: ociPURL(img), PackageURL: ociPURL(img),
		Hashes: &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: strings.TrimPrefix(img.Digest, "sha256:")}}}
}

// fileComponents are file components with their sha256, sorted by name.
func fileComponents(files []sbomFile) []cdx.Component {
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	out := make([]cdx.Component, 0, len(files))
	for _, f := range files {
		out = append(out, cdx.Component{Type: cdx.ComponentTypeFile, Name: f.Name, BOMRef: "file:" + f.Name,
			Hashes: &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: f.SHA256}}})
	}
	return out
}

// writeSBOM writes a CycloneDX 1.6 JSON SBOM describing subject (the
// artifact, with its sha256) and its components to out. It has no
// timestamp, and its serial number is derived from the artifact's
// sha256, so the same artifact gives the same SBOM.
func writeSBOM(out string, subject cdx.Component, artifactSHA256 string, components []cdx.Component) error {
	bom := cdx.NewBOM()
	sum, err := hex.DecodeString(artifactSHA256)
	if err != nil || len(sum) < 16 {
		return fmt.Errorf("SBOM of %s: bad artifact sha256 %q", subject.Name, artifactSHA256)
	}
	u := sum[:16]
	u[6] = (u[6] & 0x0f) | 0x80 // UUID version 8 (RFC 9562 §5.8): custom, here the artifact's hash
	u[8] = (u[8] & 0x3f) | 0x80
	bom.SerialNumber = fmt.Sprintf("urn:uuid:%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
	if subject.Hashes == nil {
		subject.Hashes = &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: artifactSHA256}}
	}
	bom.Metadata = &cdx.Metadata{
		Component: &subject,
		Tools: &cdx.ToolsChoice{Components: &[]cdx.Component{{Type: cdx.ComponentTypeApplication, Name: "gatehouse make release",
			Group: "github.com/gatehouse-dev/gatehouse"}}},
	}
	if len(components) > 0 {
		bom.Components = &components
	}
	return atomicfile.WriteFunc(out, 0o644, func(f *os.File) error {
		enc := cdx.NewBOMEncoder(f, cdx.BOMFileFormatJSON)
		enc.SetPretty(true)
		return enc.EncodeVersion(bom, cdx.SpecVersion1_6)
	})
}
