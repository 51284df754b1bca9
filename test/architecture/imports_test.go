// Package architecture checks the rules of docs/architecture.md that the
// compiler does not: which package may import which, that the package map
// lists every package, that every export has a production caller outside
// its package (or is listed public API), and that internal/ holds only what
// two consumers share.
package architecture

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
)

const module = "github.com/gatehouse-dev/gatehouse"

// pkg is the part of `go list -json` the rules look at.
type pkg struct {
	ImportPath   string
	Dir          string
	GoFiles      []string
	TestGoFiles  []string
	XTestGoFiles []string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// listPackages returns each package of the module keyed by its path
// relative to the module ("" for none), and the module's root. It runs
// `go list -json ./...` once per test binary (listModule): the rules all
// read the same listing, and go list is most of their time.
func listPackages(t *testing.T) (root string, pkgs map[string]pkg) {
	t.Helper()
	l, err := moduleListing()
	if err != nil {
		t.Fatal(err)
	}
	if len(l.pkgs) < 10 {
		t.Fatalf("go list found only %d packages in %s", len(l.pkgs), l.root)
	}
	return l.root, maps.Clone(l.pkgs)
}

// listing is what listModule found: the module's root and its packages.
type listing struct {
	root string
	pkgs map[string]pkg
}

// moduleListing is listModule's result, computed on first use and read
// only afterwards.
var moduleListing = sync.OnceValues(listModule)

// listModule runs `go list -json ./...` in the module root.
func listModule() (listing, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return listing{}, fmt.Errorf("go list -m: %w", err)
	}
	root := strings.TrimSpace(string(out))
	cmd := exec.Command("go", "list", "-e", "-json", "./...")
	cmd.Dir = root
	out, err = cmd.Output()
	if err != nil {
		return listing{}, fmt.Errorf("go list ./...: %w", err)
	}
	pkgs := map[string]pkg{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return listing{}, fmt.Errorf("decoding go list output: %w", err)
		}
		pkgs[rel(p.ImportPath)] = p
		// go test caches a result by the files the test itself opened;
		// stat what go list read so an edit reruns the test.
		for _, name := range slices.Concat([]string{""}, p.GoFiles, p.TestGoFiles, p.XTestGoFiles) {
			if _, err := os.Stat(filepath.Join(p.Dir, name)); err != nil {
				return listing{}, err
			}
		}
	}
	return listing{root: root, pkgs: pkgs}, nil
}

// rel is path relative to the module, or "" when it is not one of ours.
func rel(path string) string {
	if path == module {
		return "."
	}
	if r, ok := strings.CutPrefix(path, module+"/"); ok {
		return r
	}
	return ""
}

// under reports whether p is dir or inside it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// components are the folders holding one component's logic each. A
// component imports the bottom (api/, internal/, charts) and its own
// folder, never another component.
var components = []string{"bootstrapper", "joinservice", "keyservice", "capi", "upgrade", "mini", "image"}

// allowed reports whether package from (relative path) may import to
// (relative path), with the rule's name for the error message.
func allowed(from, to string) (bool, string) {
	switch {
	case under(from, "api"):
		return under(to, "api"), "api/ imports only api/"
	case under(from, "internal"):
		return under(to, "internal") || under(to, "api"), "internal/ imports only internal/ and api/"
	case from == "charts":
		return false, "charts imports nothing of ours"
	case under(from, "cli"):
		return !under(to, "cmd") && !under(to, "test") && !under(to, "bench") && !under(to, "hack"),
			"cli/ imports components, internal/, api/ and charts, never cmd/, test/, bench/ or hack/"
	case under(from, "cmd"):
		return !under(to, "cmd") && !under(to, "test") && !under(to, "bench") && !under(to, "hack"),
			"cmd/<binary> wires packages and imports no other binary, test, bench or hack"
	case under(from, "test"), under(from, "bench"), under(from, "hack"):
		return !under(to, "cmd"), "tests, benchmarks and tools import packages, not cmd/"
	}
	if under(from, "mini") && under(to, "image") {
		// The local cluster's QEMU provider boots the node image (rule 3's one exception).
		return true, "mini/ may import image/"
	}
	for _, c := range components {
		if under(from, c) {
			return under(to, c) || under(to, "internal") || under(to, "api") || to == "charts",
				c + "/ imports its own folder, internal/, api/ and charts"
		}
	}
	return false, "package is in no folder docs/architecture.md names"
}

func TestImportRules(t *testing.T) {
	_, pkgs := listPackages(t)
	names := make([]string, 0, len(pkgs))
	for name := range pkgs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, from := range names {
		p := pkgs[from]
		for _, imp := range p.Imports {
			to := rel(imp)
			if to == "" {
				continue
			}
			if ok, rule := allowed(from, to); !ok {
				t.Errorf("%s imports %s: %s (docs/architecture.md)", from, to, rule)
			}
			if isTestHelper(to) && !isTestHelper(from) && !under(from, "test") && !under(from, "bench") && !under(from, "hack") {
				t.Errorf("%s imports the test helper %s outside its tests (docs/architecture.md)", from, to)
			}
		}
		// Tests may run other components for real (the join service's
		// tests start a key service), but never a binary's main package.
		for _, imp := range slices.Concat(p.TestImports, p.XTestImports) {
			if to := rel(imp); under(to, "cmd") && !under(from, to) {
				t.Errorf("%s imports %s in tests: tests build binaries, they do not import cmd/ (docs/architecture.md)", from, to)
			}
		}
	}
}

// isTestHelper reports whether p exists for tests only: internal/testenv,
// internal/testkit and packages named *test (kmstest, rendertest, ...).
func isTestHelper(p string) bool {
	return under(p, "internal/testenv") || under(p, "internal/testkit") || strings.HasSuffix(p, "test")
}

// TestRulesCatchUpwardImport proves the rules refuse what they are for.
func TestRulesCatchUpwardImport(t *testing.T) {
	tests := []struct {
		from, to string
		want     bool
	}{
		{"internal/kms", "bootstrapper", false},
		{"internal/kms", "internal/keys", true},
		{"internal/clusterconfig", "cli", false},
		{"api/initservice/v1", "internal/keys", false},
		{"mini", "cli", false},
		{"mini", "upgrade", false},
		{"mini", "internal/helm", true},
		{"mini", "image/qemu", true},
		{"image/qemu", "mini", false},
		{"bootstrapper", "joinservice", false},
		{"bootstrapper/installer", "bootstrapper/nodelock", true},
		{"joinservice/joinconfig", "bootstrapper/installer", false},
		{"capi/controller", "capi/render", true},
		{"capi/render", "bootstrapper", false},
		{"cli", "mini", true},
		{"cli", "cmd/gatehouse", false},
		{"cmd/gatehouse", "cli", true},
		{"cmd/gatehouse", "cmd/gatehouse-keyservice", false},
		{"charts", "internal/versions", false},
		{"newfolder", "internal/keys", false},
	}
	for _, tt := range tests {
		if got, rule := allowed(tt.from, tt.to); got != tt.want {
			t.Errorf("allowed(%s → %s) = %v (%s), want %v", tt.from, tt.to, got, rule, tt.want)
		}
	}
}

// mapEntry is an item of the package map: "- `path` — what it is".
var mapEntry = regexp.MustCompile("^`([a-z0-9./_-]+?)/?`")

// TestPackageMapIsComplete checks that docs/architecture.md's package map
// names every package of the module, and nothing that no longer exists.
func TestPackageMapIsComplete(t *testing.T) {
	root, pkgs := listPackages(t)
	f, err := os.Open(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	listed := map[string]bool{}
	inMap := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			inMap = line == "## Package map"
			continue
		}
		if !inMap {
			continue
		}
		if item, ok := strings.CutPrefix(line, "- "); !ok {
			continue
		} else if m := mapEntry.FindStringSubmatch(item); m != nil {
			listed[m[1]] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(listed) == 0 {
		t.Fatal(`docs/architecture.md has no "## Package map" section with "- ` + "`path`" + `" items`)
	}
	for name := range pkgs {
		if !listed[name] {
			t.Errorf("docs/architecture.md's package map does not list %s", name)
		}
	}
	for name := range listed {
		if _, ok := pkgs[name]; !ok {
			t.Errorf("docs/architecture.md's package map lists %s, which is no package", name)
		}
	}
}
