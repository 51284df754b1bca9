package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWrite(t *testing.T) {
	tests := []struct {
		name    string
		old     string // existing content; "" for none
		write   func(*os.File) error
		want    string // content afterwards
		wantErr string
	}{
		{name: "new file", write: writeString("new"), want: "new"},
		{name: "replaces", old: "old", write: writeString("new"), want: "new"},
		{name: "failed write keeps the old file", old: "old", want: "old", wantErr: "disk full",
			write: func(f *os.File) error {
				_, _ = f.WriteString("partial")
				return errors.New("disk full")
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f")
			if tt.old != "" {
				if err := os.WriteFile(path, []byte(tt.old), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			err := WriteFunc(path, 0o640, tt.write)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), path) {
					t.Fatalf("error = %v, want one naming %s and %q", err, path, tt.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil || string(got) != tt.want {
				t.Fatalf("content = %q, %v; want %q", got, err, tt.want)
			}
			if tt.wantErr == "" {
				if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o640 {
					t.Fatalf("mode = %v, %v; want 0640", fi.Mode().Perm(), err)
				}
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Fatalf("directory holds %d entries, want only the file: a temporary file was left", len(entries))
			}
		})
	}
}

func TestWriteMissingDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "f")
	if err := Write(path, []byte("x"), 0o600); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("error = %v, want one naming %s", err, path)
	}
}

func writeString(s string) func(*os.File) error {
	return func(f *os.File) error {
		_, err := f.WriteString(s)
		return err
	}
}
