package logtail

import "testing"

func TestLines(t *testing.T) {
	tests := []struct {
		name string
		s    string
		n    int
		want string
	}{
		{"fewer lines than n", "a\nb\n", 5, "a\nb"},
		{"exactly n", "a\nb\nc", 3, "a\nb\nc"},
		{"more lines than n", "a\nb\nc\nd\n", 2, "c\nd"},
		{"trailing newlines dropped", "a\nb\n\n\n", 1, "b"},
		{"empty", "", 3, ""},
		{"zero", "a\nb", 0, ""},
		{"negative", "a\nb", -1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Lines(tt.s, tt.n); got != tt.want {
				t.Errorf("Lines(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
			}
		})
	}
}
