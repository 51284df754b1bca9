// Command capicomponents generates the clusterctl provider repository files
// of gatehouse-capi-bootstrap, Gatehouse's Cluster API bootstrap provider,
// into config/clusterctl:
//
//   - metadata.yaml: the release series and the Cluster API contract each
//     implements (clusterctl.cluster.x-k8s.io/v1alpha3 Metadata);
//   - bootstrap-components.yaml: everything `clusterctl init --bootstrap
//     gatehouse` installs: the CRDs of config/crd labelled with the contract
//     version, the target Namespace, the manager's ServiceAccount, the
//     ClusterRole of config/rbac/role.yaml and its binding, and the manager's
//     Deployment, with clusterctl variables (${VAR:=default}) for the image,
//     the concurrency and the log level.
//
// The rules are Cluster API's clusterctl provider contract (contract version
// v1beta2, https://cluster-api.sigs.k8s.io/developer/providers/contracts/clusterctl).
// `make generate` runs it from the repository root.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
)

func main() {
	crdDir := flag.String("crds", filepath.Join("config", "crd"), "directory of the generated CRDs")
	role := flag.String("role", filepath.Join("config", "rbac", "role.yaml"), "the manager's generated ClusterRole")
	out := flag.String("out", filepath.Join("config", "clusterctl"), "output directory")
	version := flag.String("version", defaultVersion, "provider release the files describe (vMAJOR.MINOR.PATCH); the default image's tag")
	flag.Parse()
	if err := run(*crdDir, *role, *out, *version); err != nil {
		log.Fatal(err)
	}
}

// run reads the CRDs and the ClusterRole and writes the two repository
// files into out.
func run(crdDir, role, out, version string) error {
	in, err := readInputs(crdDir, role, version)
	if err != nil {
		return err
	}
	files, err := render(in)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil { //nolint:gosec // generated files, world-readable like the rest of the repository
		return err
	}
	for _, name := range []string{metadataFile, componentsFile} {
		if err := os.WriteFile(filepath.Join(out, name), files[name], 0o644); err != nil { //nolint:gosec // as above
			return fmt.Errorf("writing %s: %w", name, err)
		}
	}
	return nil
}
