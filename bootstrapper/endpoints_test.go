package bootstrapper

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestEndpointSources(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "endpoints")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("# join services\n10.0.0.1:9090\n\n  cp-2.example:9090  \n")
	got, err := FileEndpoints(file).Endpoints(t.Context())
	if err != nil || !slices.Equal(got, []string{"10.0.0.1:9090", "cp-2.example:9090"}) {
		t.Fatalf("file endpoints %v, %v", got, err)
	}
	// The file is read again on every call.
	write("10.0.0.3:9090\n")
	if got, _ := FileEndpoints(file).Endpoints(t.Context()); !slices.Equal(got, []string{"10.0.0.3:9090"}) {
		t.Fatalf("after an update: %v", got)
	}
	for name, tc := range map[string]struct {
		source EndpointSource
		want   string
	}{
		"missing file": {FileEndpoints(filepath.Join(dir, "none")), "reading join service endpoints"},
		"empty file":   {FileEndpoints(writeTemp(t, "# nothing\n")), "names no join service endpoint"},
		"no port":      {StaticEndpoints{"10.0.0.1"}, `"10.0.0.1" in the static endpoint list is not host:port`},
		"empty list":   {StaticEndpoints{}, "names no join service endpoint"},
	} {
		if _, err := tc.source.Endpoints(t.Context()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", name, err, tc.want)
		}
	}
}

func writeTemp(t *testing.T, s string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
