package qemu

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// write is one step of a console test: bytes the guest writes, or a reset
// at the current end of the file.
type write struct {
	data  string
	reset bool
}

func TestConsoleSplitsLinesAndBoots(t *testing.T) {
	tests := []struct {
		name   string
		writes []write
		want   []Line // At is not compared
	}{
		{
			name:   "lines split at line ends, without carriage returns and escapes",
			writes: []write{{data: "\x1b[2J\x1b[01;01HBdsDxe: starting Boot0001\r\nsecond\n"}},
			want:   []Line{{Text: "BdsDxe: starting Boot0001"}, {Text: "second"}},
		},
		{
			name:   "a partial line waits for its end",
			writes: []write{{data: "hal"}, {data: "f\nnext"}},
			want:   []Line{{Text: "half"}},
		},
		{
			name:   "a reset ends the old boot's partial line and begins the next boot",
			writes: []write{{data: "old\nunfinished"}, {reset: true}, {data: "new\n"}, {reset: true}, {data: "third\n"}},
			want:   []Line{{Text: "old"}, {Text: "unfinished"}, {Boot: 1, Text: "new"}, {Boot: 2, Text: "third"}},
		},
		{
			name:   "a reset before the old boot's bytes were read still splits them",
			writes: []write{{data: "a\nb"}, {reset: true}, {data: "c\n"}},
			want:   []Line{{Text: "a"}, {Text: "b"}, {Boot: 1, Text: "c"}},
		},
		{
			name:   "an overlong line is split",
			writes: []write{{data: strings.Repeat("x", maxLineBytes+10) + "\n"}},
			want:   []Line{{Text: strings.Repeat("x", maxLineBytes)}, {Text: strings.Repeat("x", 10)}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "console.log")
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			c, err := newConsole(path, time.Now(), nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.writes {
				if w.reset {
					size, err := c.size()
					if err != nil {
						t.Fatal(err)
					}
					c.newBoot(size, time.Now())
					continue
				}
				if _, err := f.WriteString(w.data); err != nil {
					t.Fatal(err)
				}
				// The reset case "before the old boot's bytes were read"
				// polls only at the end.
				if !strings.Contains(tt.name, "before") {
					if err := c.poll(); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := c.poll(); err != nil {
				t.Fatal(err)
			}
			got, next, _, _, _ := c.since(0)
			for i := range got {
				got[i].At = 0
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("lines = %+v, want %+v", got, tt.want)
			}
			if next != len(tt.want) {
				t.Errorf("next = %d, want %d", next, len(tt.want))
			}
		})
	}
}

func TestConsoleWakesWaitersAndEnds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	c, err := newConsole(path, time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, next, _, ended, more := c.since(0)
	if ended {
		t.Fatal("a new console has ended")
	}
	if err := os.WriteFile(path, []byte("one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.poll(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-more:
	default:
		t.Fatal("a new line did not wake the waiter")
	}
	lines, next, _, _, more := c.since(next)
	if len(lines) != 1 || lines[0].Text != "one" || next != 1 {
		t.Fatalf("since(0) after one line = %v, %d", lines, next)
	}
	if err := os.WriteFile(path, []byte("one\nlast words"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.end()
	select {
	case <-more:
	default:
		t.Fatal("the end did not wake the waiter")
	}
	lines, _, _, ended, _ = c.since(next)
	if !ended || len(lines) != 1 || lines[0].Text != "last words" {
		t.Errorf("after the end: lines %v, ended %v; want the unfinished last line, ended", lines, ended)
	}
}

func TestCleanText(t *testing.T) {
	tests := map[string]string{
		"plain":                       "plain",
		"\x1b[2J\x1b[01;01Htext":      "text",
		"tab\tstays\r":                "tab\tstays",
		"bell\x07 and \x1bc reset":    "bell and  reset",
		"unterminated escape \x1b[12": "unterminated escape ",
		"del\x7f":                     "del",
	}
	for in, want := range tests {
		if got := cleanText([]byte(in)); got != want {
			t.Errorf("cleanText(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzConsole feeds the console what a guest may write (the guest is not
// trusted), in two writes with a reset between: lines never hold line
// ends or control characters, stay bounded, and their boots never go
// back.
func FuzzConsole(f *testing.F) {
	f.Add([]byte("BdsDxe: starting\r\n\x1b[2Jtext\n"), []byte("next boot\n"))
	f.Add([]byte("unfinished"), []byte("\x1b[1;"))
	f.Add([]byte(strings.Repeat("x", maxLineBytes+1)), []byte{})
	f.Fuzz(func(t *testing.T, before, after []byte) {
		path := filepath.Join(t.TempDir(), "console.log")
		c, err := newConsole(path, time.Now(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, before, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := c.poll(); err != nil {
			t.Fatal(err)
		}
		c.newBoot(int64(len(before)), time.Now())
		if err := os.WriteFile(path, append(before, after...), 0o600); err != nil {
			t.Fatal(err)
		}
		c.end()
		lines, _, boot, ended, _ := c.since(0)
		if !ended || boot != 1 {
			t.Fatalf("ended %v, boot %d after the end and one reset", ended, boot)
		}
		last := 0
		for _, l := range lines {
			if l.Boot < last || l.Boot > 1 {
				t.Fatalf("line %q of boot %d after boot %d", l.Text, l.Boot, last)
			}
			last = l.Boot
			if len(l.Text) >= 2*maxLineBytes || strings.ContainsFunc(l.Text, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f }) {
				t.Fatalf("line of %d bytes with control characters: %q", len(l.Text), l.Text)
			}
		}
	})
}
