// Package logtail shortens a program's output to what a person reads in an
// error message: its last lines.
package logtail

import "strings"

// Lines returns the last n lines of s (all of s when it has fewer), without
// a trailing newline. n <= 0 returns "".
func Lines(s string, n int) string {
	if n <= 0 {
		return ""
	}
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
