package clustertest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/charts"
)

// JoinServiceLog is the log (its audit records among it) of the join
// service on the namespace nodes of the local cluster in dir that match
// the glob pattern node ("cp-*": every control plane).
func JoinServiceLog(t *testing.T, dir, node string) string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "nodes", node, "root", "var", "log", "pods", charts.Namespace+"_gatehouse-joinservice-*", "*", "*.log"))
	var all strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(data)
	}
	return all.String()
}

// AuditCount counts the lines of the join service's audit log from source
// that hold every one of fields. The log spans the service's pods (files
// in no time order), so tests compare counts, not offsets.
func AuditCount(audit, source string, fields ...string) int {
	n := 0
	for line := range strings.SplitSeq(audit, "\n") {
		if !strings.Contains(line, `"source":"`+source+`"`) {
			continue
		}
		all := true
		for _, f := range fields {
			all = all && strings.Contains(line, f)
		}
		if all {
			n++
		}
	}
	return n
}
