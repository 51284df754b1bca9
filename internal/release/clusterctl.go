package release

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"

	"sigs.k8s.io/yaml"
)

// The clusterctl repository files (hack/capicomponents, config/clusterctl).
const (
	clusterctlMetadata   = "metadata.yaml"
	clusterctlComponents = "bootstrap-components.yaml"
)

// imageVariable is the components file's clusterctl variable for the
// manager's image with its default (hack/capicomponents).
var imageVariable = regexp.MustCompile(`\$\{GATEHOUSE_CAPI_BOOTSTRAP_IMAGE:=[^}]*\}`)

// clusterctlFiles returns the repository files of src (config/clusterctl)
// for version: metadata.yaml as is, after checking it lists the version's
// release series (clusterctl refuses a release outside them), and
// bootstrap-components.yaml with the image variable's default set to the
// manager's image by digest.
func clusterctlFiles(src, version, imageRef string) (map[string][]byte, error) {
	meta, err := os.ReadFile(filepath.Join(src, clusterctlMetadata))
	if err != nil {
		return nil, err
	}
	var m struct {
		ReleaseSeries []struct {
			Major, Minor int
		} `json:"releaseSeries"`
	}
	if err := yaml.Unmarshal(meta, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", clusterctlMetadata, err)
	}
	major, minor := versionSeries(version)
	found := false
	for _, s := range m.ReleaseSeries {
		found = found || (s.Major == major && s.Minor == minor)
	}
	if !found {
		return nil, fmt.Errorf("%s lists no release series %d.%d for %s: add it in hack/capicomponents and run make generate", filepath.Join(src, clusterctlMetadata), major, minor, version)
	}
	comps, err := os.ReadFile(filepath.Join(src, clusterctlComponents))
	if err != nil {
		return nil, err
	}
	if n := len(imageVariable.FindAll(comps, -1)); n != 1 {
		return nil, fmt.Errorf("%s: want one ${GATEHOUSE_CAPI_BOOTSTRAP_IMAGE:=…}, found %d", clusterctlComponents, n)
	}
	comps = imageVariable.ReplaceAll(comps, []byte("${GATEHOUSE_CAPI_BOOTSTRAP_IMAGE:="+imageRef+"}"))
	return map[string][]byte{clusterctlMetadata: meta, clusterctlComponents: comps}, nil
}

// versionSeries is a checked version's major and minor.
func versionSeries(version string) (major, minor int) {
	s := versionRE.FindStringSubmatch(version)
	major, _ = strconv.Atoi(s[1])
	minor, _ = strconv.Atoi(s[2])
	return major, minor
}
