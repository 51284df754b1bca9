package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestImageBuildFlagErrors checks that bad flags are refused, naming the
// flag, before anything is built.
func TestImageBuildFlagErrors(t *testing.T) {
	kube := t.TempDir()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		env     string // GATEHOUSE_KUBE_BIN
		wantErr string
	}{
		{
			name:    "unknown output format",
			args:    []string{"-o", "yaml", "--kube-bin", kube},
			wantErr: `unknown --output "yaml": use text or json`,
		},
		{
			name:    "no pinned Kubernetes binaries",
			wantErr: "pass --kube-bin or set GATEHOUSE_KUBE_BIN=$(hack/kube-binaries.sh)",
		},
		{
			name:    "Kubernetes binaries' directory missing",
			args:    []string{"--kube-bin", filepath.Join(kube, "missing")},
			wantErr: "--kube-bin " + filepath.Join(kube, "missing") + " is not a directory",
		},
		{
			name:    "Kubernetes binaries' directory from the environment is checked too",
			env:     file,
			wantErr: "--kube-bin " + file + " is not a directory",
		},
		{
			name:    "bootstrapper missing",
			args:    []string{"--kube-bin", kube, "--bootstrapper", filepath.Join(kube, "gatehouse-bootstrapper")},
			wantErr: "--bootstrapper " + filepath.Join(kube, "gatehouse-bootstrapper") + " is not a file",
		},
		{
			name:    "mirror is no http URL",
			args:    []string{"--kube-bin", kube, "--bootstrapper", file, "--mirror", "ftp://ftp.debian.org/debian"},
			wantErr: `--mirror "ftp://ftp.debian.org/debian" is not the http(s) URL of a Debian archive`,
		},
		{
			name:    "no arguments",
			args:    []string{"bookworm"},
			wantErr: `unknown command "bookworm"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("GATEHOUSE_KUBE_BIN", tt.env)
			t.Setenv("GATEHOUSE_CACHE", t.TempDir())
			cmd := NewRootCmd()
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SetArgs(append([]string{"image", "build"}, tt.args...))
			err := cmd.Execute()
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
			}
			if entries, _ := os.ReadDir(os.Getenv("GATEHOUSE_CACHE")); len(entries) != 0 {
				t.Errorf("a refused build left %d entries in the cache", len(entries))
			}
		})
	}
}
