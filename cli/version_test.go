package cli

import (
	"bytes"
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/buildinfo"
)

func TestVersion(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
		check   func(t *testing.T, out string)
	}{
		{
			name: "text output names the Go version",
			args: []string{"version"},
			check: func(t *testing.T, out string) {
				if !strings.Contains(out, runtime.Version()) {
					t.Errorf("output %q does not name %s", out, runtime.Version())
				}
			},
		},
		{
			name: "json output decodes",
			args: []string{"version", "-o", "json"},
			check: func(t *testing.T, out string) {
				var info buildinfo.Info
				if err := json.Unmarshal([]byte(out), &info); err != nil {
					t.Fatalf("decoding %q: %v", out, err)
				}
				if info.GoVersion != runtime.Version() || info.Version == "" {
					t.Errorf("got %+v", info)
				}
			},
		},
		{
			name: "a development build has no release images",
			args: []string{"version"},
			check: func(t *testing.T, out string) {
				if !strings.Contains(out, "Images:\tnone (a development build") {
					t.Errorf("output %q does not say the build has no release images", out)
				}
			},
		},
		{
			name:    "unknown output format is refused",
			args:    []string{"version", "-o", "yaml"},
			wantErr: `unknown --output "yaml": use text or json`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := NewRootCmd()
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetArgs(tt.args)
			err := cmd.Execute()
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, out.String())
		})
	}
}
