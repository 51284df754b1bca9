// Package cli holds the commands of the gatehouse CLI. cmd/gatehouse only
// wires them to the process.
package cli

import (
	"github.com/spf13/cobra"
)

// NewRootCmd returns the gatehouse command tree.
func NewRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "gatehouse",
		Short: "Attested Kubernetes node admission",
		Long: "gatehouse lets a machine become a Kubernetes node only after it proves by remote attestation\n" +
			"what it runs, and then hands it exactly its secrets.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newVersionCmd(), newConfigCmd(), newInitCmd(), newVerifyCmd(), newRecoverCmd(), newReferenceValuesCmd(), newMiniCmd(), newUpgradeCmd(), newNodeCmd(), newImageCmd(), newKMSCmd(), newMirrorCmd(), newReleaseCmd())
	return root
}
