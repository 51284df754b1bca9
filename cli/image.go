package cli

import "github.com/spf13/cobra"

// newImageCmd is `gatehouse image`: the node image and its signed
// reference values (docs/image.md).
func newImageCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Work with Gatehouse node images and their signed reference values",
	}
	cmd.AddCommand(imageValuesCmds()...)
	cmd.AddCommand(newImageRunCmd())
	cmd.AddCommand(newImageBuildCmd())
	return cmd
}
