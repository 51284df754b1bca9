package cloudinit

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// yamlStrings are strings Go's YAML encoders wrote so that cloud-init's
// PyYAML could not load the document ("=", "<<") or read another value
// (U+0085 as a space), and strings of every style.
var yamlStrings = []string{
	"", " ", "=", "<<", "~", "null", "y", "n", "yes", "off", "1:20", "190:20:30", "0x1F", "0o17", "1_000", "0644", "1e3", ".inf",
	".5", "2001-12-14", "1.36.4", "-", "-e", "--config", "- x", "?", ":", "a:", "a: b", "a #b", "#c", "&a", "*a", "!t", "|", ">",
	"%", "@", "`", "'", "\"", "\\", "a'b", "a\"b", "{{ ds.meta_data.local_hostname }}", "echo {{ 'x' }}: y", "{% if true %}x{% endif %}",
	"a\u0085b", "a\u2028b", "a\u2029b", "a\n\u2028b\n", "a\n\u2029\n", "a\n\u0085\n", "\ufeffx", "\x00", "\x1b[0m", "\x7f", "\u0080", "\ufffe", "é", "😀", "\t", "a\tb",
	"\n", "\n\n", "a\n", "a\n\n", "a\nb", "\na", "  a\nb", "a\n  b\n", " lead", "trail ", "a\r\nb", "a\rb", "---", "...",
	"x\n---\ny", "x\n...\n", strings.Repeat("long words ", 50),
}

// TestStringsRoundTrip: PyYAML (cloud-init's reader, YAML 1.1) and Go
// read every string back exactly, as a list item, a mapping value and a
// nested list item.
func TestStringsRoundTrip(t *testing.T) {
	c := &Config{BootCmd: []Command{yamlStrings}, WriteFiles: make([]File, len(yamlStrings))}
	for i, s := range yamlStrings {
		c.WriteFiles[i] = File{Path: "/x", Content: s, Append: true}
	}
	data, err := c.render()
	if err != nil {
		t.Fatal(err)
	}
	var got Config
	if err := yaml.Unmarshal(data, &got); err != nil {
		t.Fatalf("Go: %v\n%s", err, data)
	}
	check := func(who string, got Config) {
		t.Helper()
		for i, s := range yamlStrings {
			if len(got.BootCmd) != 1 || len(got.BootCmd[0]) != len(yamlStrings) || got.BootCmd[0][i] != s || got.WriteFiles[i].Content != s {
				t.Errorf("%s reads %q differently:\n%s", who, s, data)
			}
		}
	}
	check("Go", got)
	f := filepath.Join(t.TempDir(), "user-data")
	if err := os.WriteFile(f, data, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), "/usr/bin/python3", "-c",
		"import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1], encoding='utf-8'))))", f).Output()
	if err != nil {
		t.Fatalf("PyYAML: %v\n%s", err, data)
	}
	got = Config{}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	check("PyYAML", got)
	if out, err := schemaCheck(t, data); err != nil || !strings.Contains(out, "Valid cloud-config") {
		t.Fatalf("cloud-init schema: %v\n%s", err, out)
	}
}
