package testenv

import (
	"fmt"
	"os"
	"path/filepath"
)

// NodeImageEnv names the environment variable pointing at a built node
// image's output directory; `make test` sets it to the output of
// hack/node-image.sh.
const NodeImageEnv = "GATEHOUSE_NODE_IMAGE"

// NodeImage is a built node image's output directory (docs/image.md,
// "Output").
type NodeImage struct {
	Dir string
	// ControlPlaneDisk and WorkerDisk are the raw GPT disks of each role;
	// ControlPlaneUKI and WorkerUKI the UKIs on their EFI system partitions.
	ControlPlaneDisk, WorkerDisk, ControlPlaneUKI, WorkerUKI string
	// SignedValues is the build's signed reference-value file, VerifyKey
	// the public key it is signed with.
	SignedValues, VerifyKey string
}

// NodeImageDir returns the node image GATEHOUSE_NODE_IMAGE names, or an
// error saying how to build one when it is unset or incomplete.
func NodeImageDir() (NodeImage, error) {
	dir := os.Getenv(NodeImageEnv)
	if dir == "" {
		return NodeImage{}, fmt.Errorf("%s is not set: run the tests with `make test`, or export %s=$(hack/node-image.sh)", NodeImageEnv, NodeImageEnv)
	}
	img := NodeImage{
		Dir:              dir,
		ControlPlaneDisk: filepath.Join(dir, "node-controlplane.raw"),
		WorkerDisk:       filepath.Join(dir, "node-worker.raw"),
		ControlPlaneUKI:  filepath.Join(dir, "uki-controlplane.efi"),
		WorkerUKI:        filepath.Join(dir, "uki-worker.efi"),
		SignedValues:     filepath.Join(dir, "reference-values.signed.json"),
		VerifyKey:        filepath.Join(dir, "signing-key.pub"),
	}
	for _, f := range []string{img.ControlPlaneDisk, img.WorkerDisk, img.ControlPlaneUKI, img.WorkerUKI, img.SignedValues, img.VerifyKey} {
		if _, err := os.Stat(f); err != nil {
			return NodeImage{}, fmt.Errorf("%s=%s is not a complete node image (%w): rebuild it with hack/node-image.sh", NodeImageEnv, dir, err)
		}
	}
	return img, nil
}
