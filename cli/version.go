package cli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gatehouse-dev/gatehouse/internal/buildinfo"
)

func newVersionCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print what this binary was built from",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := buildinfo.Read()
			out := cmd.OutOrStdout()
			switch output {
			case "json":
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(info)
			case "text":
				fmt.Fprintf(out, "Version:\t%s\n", info.Version)
				if info.Revision != "" {
					fmt.Fprintf(out, "Revision:\t%s (modified: %t)\n", info.Revision, info.Modified)
				}
				fmt.Fprintf(out, "Go version:\t%s\nPlatform:\t%s\n", info.GoVersion, info.Platform)
				if len(info.Images) == 0 {
					fmt.Fprintf(out, "Images:\tnone (a development build: make release sets them)\n")
				}
				for _, img := range info.Images {
					fmt.Fprintf(out, "Image:\t%s %s\n", img.Name, img.Ref)
				}
				return nil
			default:
				return fmt.Errorf("unknown --output %q: use text or json", output)
			}
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}
