// Package charts holds the Helm charts of Gatehouse's cluster services
// (gatehouse-joinservice, gatehouse-keyservice), embedded so the CLI can
// install and upgrade them without a chart repository.
package charts

import (
	"embed"
	"fmt"
	"io/fs"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
)

//go:embed all:gatehouse-joinservice all:gatehouse-keyservice
var files embed.FS

// Namespace is where the charts are installed: a namespace of Gatehouse's
// own, so the master secret's Secret is apart from kube-system, which the
// join service writes bootstrap tokens to (docs/threat-model.md, "Reach").
const Namespace = "gatehouse-system"

// Names are the embedded charts.
var Names = []string{"gatehouse-keyservice", "gatehouse-joinservice"}

// Load returns the embedded chart name.
func Load(name string) (*chart.Chart, error) {
	var bufs []*loader.BufferedFile
	err := fs.WalkDir(files, name, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := files.ReadFile(p)
		if err != nil {
			return err
		}
		bufs = append(bufs, &loader.BufferedFile{Name: strings.TrimPrefix(p, name+"/"), Data: data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading chart %s: %w", name, err)
	}
	return loader.LoadFiles(bufs)
}
