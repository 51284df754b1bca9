package keys

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

// idPattern is the documented id pattern; validID must agree with it.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// FuzzValidID checks the hand-written id check against idPattern.
func FuzzValidID(f *testing.F) {
	for _, s := range []string{"a", "measurementSecret", "2b2f6c1e-6f8a-4b8c-9d7e-0a1b2c3d4e5f", ".x", "a/b", "", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if validID(id) != idPattern.MatchString(id) {
			t.Fatalf("validID(%q) = %t, idPattern says %t", id, validID(id), idPattern.MatchString(id))
		}
	})
}

func TestCheckRequest(t *testing.T) {
	tests := []struct {
		name    string
		id      string
		length  int
		wantErr string
	}{
		{name: "uuid", id: "2b2f6c1e-6f8a-4b8c-9d7e-0a1b2c3d4e5f", length: 32},
		{name: "empty id", id: "", length: 32, wantErr: "data key id is empty"},
		{name: "slash in id", id: "a/b", length: 32, wantErr: "must be 1-128 characters"},
		{name: "leading dot", id: ".hidden", length: 32, wantErr: "must be 1-128 characters"},
		{name: "id too long", id: strings.Repeat("a", 129), length: 32, wantErr: "must be 1-128 characters"},
		{name: "length 0", id: "a", length: 0, wantErr: "length 0 is outside 1-64 bytes"},
		{name: "length 65", id: "a", length: 65, wantErr: "length 65 is outside 1-64 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckRequest(tt.id, tt.length)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}
