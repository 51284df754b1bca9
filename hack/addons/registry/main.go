// Command registry is the CNCF distribution registry of the pinned module
// (go.mod) with the filesystem storage driver only, which the local
// cluster uses: upstream's binary also compiles the Azure, GCS and S3
// drivers and the CloudFront middleware, about 1,000 packages where this
// is about 560 (hack/addon-binaries.sh).
package main

import (
	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
)

func main() {
	// As upstream's main: the commands report their own errors and exit.
	_ = registry.RootCmd.Execute()
}
