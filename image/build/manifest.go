package build

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// manifestFile is the manifest's name in the output directory.
const manifestFile = "manifest.json"

// manifestSchema names the manifest's format.
const manifestSchema = "gatehouse.dev/node-image-manifest/v1"

// manifest is manifest.json: every component of the image with its SHA-256
// digest and origin (docs/image.md, "How the image is built").
type manifest struct {
	Schema string `json:"schema"`
	// Recipe is recipeVersion; Suite and Mirror the Debian release and
	// archive; SourceDateEpoch every time stamp in the image.
	Recipe          string `json:"recipe"`
	Suite           string `json:"suite"`
	Mirror          string `json:"mirror"`
	SourceDateEpoch int64  `json:"sourceDateEpoch"`
	// RootFSDigest is the digest of the installed packages' tree the
	// image was assembled from (treeDigest).
	RootFSDigest string        `json:"rootfsDigest"`
	Kernel       kernelInfo    `json:"kernel"`
	Initrd       component     `json:"initrd"`
	Stub         component     `json:"stub"`
	OSRelease    component     `json:"osRelease"`
	Root         rootInfo      `json:"root"`
	Images       []imageInfo   `json:"images"`
	Binaries     []binary      `json:"binaries"`
	Packages     []debPackage  `json:"packages"`
	Partitions   []partitionIn `json:"partitions"`
}

// component is one input of the UKI.
type component struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	Origin string `json:"origin"`
}

type kernelInfo struct {
	Version string `json:"version"`
	component
}

// rootInfo is the root partition (squashfs) and its dm-verity hash tree.
type rootInfo struct {
	SquashFS component `json:"squashfs"`
	Verity   verity    `json:"verity"`
	// HashTree is the hash partition's content.
	HashTree component `json:"hashTree"`
}

// fileInfo is an output file of the build.
type fileInfo struct {
	File   string `json:"file"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// imageInfo is the image of one role.
type imageInfo struct {
	Role    string   `json:"role"`
	Cmdline string   `json:"cmdline"`
	UKI     fileInfo `json:"uki"`
	Disk    fileInfo `json:"disk"`
}

// partitionIn is a partition of the disks (the same on every role's disk),
// with its offset and size in bytes.
type partitionIn struct {
	Name   string `json:"name"`
	Type   string `json:"type"`
	UUID   string `json:"uuid"`
	Offset int64  `json:"offset"`
	Size   int64  `json:"size"`
}

func partitionsOf(l layout) []partitionIn {
	var out []partitionIn
	for _, p := range l.partitions() {
		out = append(out, partitionIn{Name: p.name, Type: p.typeGUID, UUID: p.uuid, Offset: p.start, Size: p.size})
	}
	return out
}

func writeManifest(dir string, m *manifest) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, manifestFile), append(data, '\n'), 0o644) //nolint:gosec // public
}

// describeFile returns the digest and size of the output file name in dir.
func describeFile(dir, name string) (fileInfo, error) {
	path := filepath.Join(dir, name)
	sum, err := sha256File(path)
	if err != nil {
		return fileInfo{}, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fileInfo{}, err
	}
	return fileInfo{File: name, SHA256: sum, Size: fi.Size()}, nil
}

// describeComponent returns the digest and size of the file at path with
// origin.
func describeComponent(path, origin string) (component, error) {
	sum, err := sha256File(path)
	if err != nil {
		return component{}, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return component{}, err
	}
	return component{SHA256: sum, Size: fi.Size(), Origin: origin}, nil
}
