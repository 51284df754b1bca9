package architecture

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The rules below read the source with go/parser alone (no type checker):
// a use is a selector pkg.Name in a file that imports pkg. That is exact
// for top-level identifiers, which is all they look at.

// source is one package's parsed non-test files.
type source struct {
	path  string // relative to the module, as rel returns
	name  string // the package clause's name
	files []*ast.File
}

// decl is one exported top-level identifier and the parts of its
// declaration that a caller of it reaches: a function's signature, a
// type's definition (exported fields only) and its exported methods'
// signatures, a variable's or constant's type.
type decl struct {
	pkg, name string
	pos       token.Position
	reach     []reached
}

// reached is a part of a declaration and the file it is in, whose imports
// name the packages it refers to.
type reached struct {
	node ast.Node
	file *ast.File
}

// parseSources parses the non-test files of every package of the module.
func parseSources(t *testing.T, pkgs map[string]pkg) (*token.FileSet, []source) {
	t.Helper()
	fset := token.NewFileSet()
	var out []source
	for path, p := range pkgs {
		if path == "" || len(p.GoFiles) == 0 {
			continue
		}
		s := source{path: path}
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			s.name = f.Name.Name
			s.files = append(s.files, f)
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	return fset, out
}

// checkedForCallers reports whether the exported identifiers of package p
// must have a production caller outside it: not main packages, test
// helpers, tools, benchmarks and tests, nor the wire formats under api/
// (generated, public by nature).
func checkedForCallers(s source) bool {
	switch {
	case s.name == "main", isTestHelper(s.path), under(s.path, "api"),
		under(s.path, "hack"), under(s.path, "bench"), under(s.path, "test"):
		return false
	}
	return true
}

// callsCount reports whether a use in package p is a production call: not
// from a test helper, a benchmark or a test package.
func callsCount(p string) bool {
	return !isTestHelper(p) && !under(p, "bench") && !under(p, "test")
}

// exportedDecls lists the exported top-level identifiers of s.
func exportedDecls(fset *token.FileSet, s source) map[string]*decl {
	out := map[string]*decl{}
	add := func(f *ast.File, name *ast.Ident, reach ...ast.Node) {
		if !name.IsExported() {
			return
		}
		d := out[name.Name]
		if d == nil {
			d = &decl{pkg: s.path, name: name.Name, pos: fset.Position(name.Pos())}
			out[name.Name] = d
		}
		for _, n := range reach {
			if n != nil && !isNilNode(n) {
				d.reach = append(d.reach, reached{n, f})
			}
		}
	}
	type method struct {
		decl *ast.FuncDecl
		file *ast.File
	}
	var methods []method
	for _, f := range s.files {
		for _, dl := range f.Decls {
			switch dl := dl.(type) {
			case *ast.FuncDecl:
				if dl.Recv != nil {
					methods = append(methods, method{dl, f})
					continue
				}
				add(f, dl.Name, dl.Type)
			case *ast.GenDecl:
				for _, spec := range dl.Specs {
					switch spec := spec.(type) {
					case *ast.TypeSpec:
						add(f, spec.Name, spec.TypeParams, exportedPart(spec.Type))
					case *ast.ValueSpec:
						for _, name := range spec.Names {
							add(f, name, spec.Type)
						}
					}
				}
			}
		}
	}
	// A used type's exported methods are reachable through it.
	for _, m := range methods {
		if !m.decl.Name.IsExported() {
			continue
		}
		if d := out[receiverType(m.decl.Recv.List[0].Type)]; d != nil {
			d.reach = append(d.reach, reached{m.decl.Type, m.file})
		}
	}
	return out
}

func isNilNode(n ast.Node) bool {
	switch n := n.(type) {
	case *ast.FieldList:
		return n == nil
	case ast.Expr:
		return n == nil
	}
	return false
}

// exportedPart is a type's definition without its unexported struct
// fields, which no caller outside the package reaches.
func exportedPart(e ast.Expr) ast.Expr {
	st, ok := e.(*ast.StructType)
	if !ok {
		return e
	}
	fields := &ast.FieldList{}
	for _, f := range st.Fields.List {
		exported := len(f.Names) == 0 // embedded
		for _, n := range f.Names {
			exported = exported || n.IsExported()
		}
		if exported {
			fields.List = append(fields.List, f)
		}
	}
	return &ast.StructType{Fields: fields}
}

// receiverType is the name of a method's receiver type.
func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// imports maps a file's import names to module-relative package paths
// (imports of other modules are left out).
func imports(f *ast.File, names map[string]string) map[string]string {
	out := map[string]string{}
	for _, imp := range f.Imports {
		path, err := strconv.Unquote(imp.Path.Value)
		if err != nil {
			continue
		}
		r := rel(path)
		if r == "" {
			continue
		}
		name := names[r]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		out[name] = r
	}
	return out
}

// uses calls f with the package path and identifier of every pkg.Name
// selector in n whose pkg is one of the file's imports, and with "" and
// the name for every plain identifier (a same-package reference).
func uses(n ast.Node, imported map[string]string, f func(pkg, name string)) {
	ast.Inspect(n, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			if x, ok := n.X.(*ast.Ident); ok {
				if p, ok := imported[x.Name]; ok {
					f(p, n.Sel.Name)
					return false
				}
			}
		case *ast.Ident:
			f("", n.Name)
		}
		return true
	})
}

// uncalledExports returns the exported identifiers of the checked packages
// that no production code outside their package uses, neither by name nor
// through the signature or definition of an identifier that is used.
// Identifiers public matches are public API: used, and so is what their
// declarations reach.
func uncalledExports(fset *token.FileSet, srcs []source, public func(key string) bool) []*decl {
	names := map[string]string{}
	for _, s := range srcs {
		names[s.path] = s.name
	}
	decls := map[string]map[string]*decl{}
	fileImports := map[*ast.File]map[string]string{}
	for _, s := range srcs {
		decls[s.path] = exportedDecls(fset, s)
		for _, f := range s.files {
			fileImports[f] = imports(f, names)
		}
	}
	used := map[*decl]bool{}
	var queue []*decl
	mark := func(pkg, name string) {
		if d := decls[pkg][name]; d != nil && !used[d] {
			used[d] = true
			queue = append(queue, d)
		}
	}
	for _, s := range srcs {
		for _, d := range decls[s.path] {
			if public(d.pkg + "." + d.name) {
				mark(d.pkg, d.name)
			}
		}
		if !callsCount(s.path) {
			continue
		}
		for _, f := range s.files {
			uses(f, fileImports[f], func(pkg, name string) {
				if pkg != "" && pkg != s.path {
					mark(pkg, name)
				}
			})
		}
	}
	// What a used identifier's declaration names is reachable too.
	for len(queue) > 0 {
		d := queue[0]
		queue = queue[1:]
		for _, r := range d.reach {
			uses(r.node, fileImports[r.file], func(pkg, name string) {
				if pkg == "" {
					pkg = d.pkg
				}
				mark(pkg, name)
			})
		}
	}
	var out []*decl
	for _, s := range srcs {
		if !checkedForCallers(s) {
			continue
		}
		for _, d := range decls[s.path] {
			if !used[d] {
				out = append(out, d)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].pkg+"."+out[i].name < out[j].pkg+"."+out[j].name
	})
	return out
}

// publicAPI are exported identifiers with no production caller in this
// module that stay exported, each with the reason; a trailing * matches a
// prefix.
var publicAPI = map[string]string{
	"capi/controller.Condition*":                                 "KubeadmConfig condition types: Cluster API's bootstrap provider contract, read by users and tools (docs/capi.md)",
	"capi/controller.Reason*":                                    "KubeadmConfig condition reasons users and tools read (docs/capi.md)",
	"capi/render.*Path":                                          "files the bootstrap data writes on a Machine: the documented format (docs/capi.md) the controller's tests assert",
	"capi/render.KubeadmConfigPathFor":                           "the same, for a Machine's kubeadm configuration",
	"capi/render.BootstrapperEnvPathFor":                         "the same, for the bootstrapper's environment file, which the node image's unit reads (docs/capi.md, docs/image.md)",
	"internal/atls.Reason*":                                      "refusal reasons in audit records and metric labels operators alert on (docs/continuous-attestation.md)",
	"internal/connlimit.Reason*":                                 "refusal reasons in metric labels operators alert on (docs/joinservice.md)",
	"joinservice/continuous.Reason*":                             "reasons of the gatehouse.dev/Attested Node condition and of audit records (docs/continuous-attestation.md)",
	"joinservice/csrapprover.Reason*":                            "reasons of the approver's CSR conditions and audit records (docs/continuous-attestation.md, \"Certificates\")",
	"joinservice/gate.Reason*":                                   "the credential gate's refusal reasons in audit records (docs/continuous-attestation.md)",
	"joinservice/joinconfig.Key*":                                "keys of the join config ConfigMap, a format users write (docs/joinservice.md)",
	"joinservice.ControlPlaneLeaseName":                          "the Lease control-plane joins take, which an operator inspects (docs/joinservice.md)",
	"internal/nodebinding.Annotation*":                           "annotations of the binding ConfigMaps, a format `gatehouse node adopt` and operators read (docs/continuous-attestation.md)",
	"internal/nodebinding.Key*":                                  "keys of the binding ConfigMaps (the same format)",
	"internal/nodebinding.Label":                                 "the label of the binding ConfigMaps (the same format)",
	"internal/nodeattestation.Label":                             "the label of the attestation record ConfigMaps, a format operators read (docs/continuous-attestation.md)",
	"bootstrapper/statedisk.ResetRequested":                      "a State value callers compare (statedisk.Disk.State); the bootstrapper's tests build disks in each state",
	"bootstrapper/statedisk.Unformatted":                         "the same",
	"internal/attestation/snp/snpguest.NewWithProvider":          "the seam for go-sev-guest's test device (snptest), which the tests of four packages attest with",
	"internal/attestation/tdx/tdxguest.NewWithProvider":          "the seam for go-tdx-guest's test device (tdxtest), the same",
	"internal/attestation/tpm/tpmattester.EKCertificateRequired": "an EKCertificateMode value, the attester's documented option",
	"internal/attestation/tpm/tpmattester.AK*":                   "AKSource values, the attester's documented options (the bootstrapper's --attestation-key; swtpmtest makes Compute Engine-style TPMs with AKGCE)",
	"internal/attestation/tpm/tpmattester.NSMRequestCommand":     "TPM2_VENDOR_AWS_NSM_REQUEST, the NitroTPM's documented vendor command, which the NitroTPM attester test's emulated NSM answers",
	"internal/attestation/tpm/tpmattester.AzureAK*":              "Azure's documented vTPM AK handle and certificate index (docs/attestation.md); the Trusted Launch and confidential VM attester tests provision a TPM simulator at them",
	"internal/bootstraptoken.ErrIDTaken":                         "the documented error of Issuer.Issue (errors.Is), which the join service's tests assert",
	"internal/keys.ErrInvalidRequest":                            "the documented error of the key derivation (errors.Is), which the KMS tests assert",
	"internal/clusterpki.AdminGroup":                             "the admin kubeconfig's organisation, the documented group of Init's admin (docs/keys.md)",
	"internal/atls.ServeEvidence":                                "the evidence endpoint without the door, for listeners limited otherwise; the verifiers' tests in cli and joinservice/continuous serve a node's evidence with it (a node serves through EvidenceEndpoint)",
	"internal/attestation/tpm.ExpectedPCRs":                      "predicts the PCR values of a measured boot without a TPM: how a node image's reference values are made (docs/attestation.md); the swtpm tests check a real boot against it",
	"image/qemu.Accel*":                                          "values of qemu.Config.Accel, the runner's documented option (the CLI parses its flag with qemu.ParseAccel); the local cluster's VM nodes (issue 36) set them",
	"capi/render/cloudinit.RefExpr":                              "the Jinja expression a reference renders to, which the renderer's fuzz checker recomputes independently of the rendering",
	// What test/e2e and test/vme2e inspect of a local cluster on the host;
	// nodes are reached through mini.Provider (mini.Exec runs a command).
	"mini.Record":             "the local cluster's record (mini.json), which test/e2e reads to check that `mini down` left nothing",
	"mini.ReadRecord":         "the same",
	"mini.NodeProcesses":      "the rule `mini down` finds a node's processes by (its mount namespace while that is still the node's); test/e2e asserts by the same rule that none is left",
	"mini.CheckPrerequisites": "what `mini up` checks first; test/e2e fails early on a host without it, naming what is missing",
	"mini.FreeNetwork":        "picks an unused network as `mini up` does; test/e2e runs its cluster beside a user's",
	"mini.ImageRepository":    "the repository of the images `mini up` preloads; test/e2e's workloads run the pause image from it",
	"mini.PCRs":               "the PCRs a local node attests; test/e2e's attacks attest as a node does",
	"mini.BootArtefacts":      "a local node's measured boot files; the same",
	"mini.RestartVMNode":      "boots a VM node from another node image; test/vme2e shows a changed command line refused",
	"mini.VMConsoleLog":       "a VM node's serial console, where test/vme2e reads the bootstrapper's state-disk record",
	"mini.VMPIDs":             "a VM node's QEMU and swtpm, whose memory test/vme2e measures",
	"mini.VMMemoryMiB":        "a VM node's memory (PCR 0 depends on it); test/vme2e reports it beside QEMU's resident set",
	"mini.EtcdMembers":        "the control planes' etcd members; test/e2e's HA checks wait for exactly the expected healthy members",
}

// isPublicAPI reports whether an entry of publicAPI matches key.
func isPublicAPI(key string) bool {
	for entry := range publicAPI {
		if matchesEntry(entry, key) {
			return true
		}
	}
	return false
}

// matchesEntry reports whether the allow-list entry matches key
// ("pkg.Name"); one * in the entry's name matches any run of characters.
func matchesEntry(entry, key string) bool {
	prefix, suffix, wild := strings.Cut(entry, "*")
	if !wild {
		return entry == key
	}
	return len(key) >= len(prefix)+len(suffix) && strings.HasPrefix(key, prefix) && strings.HasSuffix(key, suffix)
}

// TestExportsHaveProductionCallers fails for an exported identifier of a
// production package that no production code outside its package uses
// (docs/architecture.md, "Import rule"): an export that only tests use
// belongs in a _test.go file or a *test package.
func TestExportsHaveProductionCallers(t *testing.T) {
	root, pkgs := listPackages(t)
	fset, srcs := parseSources(t, pkgs)
	for _, d := range uncalledExports(fset, srcs, isPublicAPI) {
		key := d.pkg + "." + d.name
		t.Errorf("%s:%d: %s is exported but no production code outside %s uses it: unexport it, move it into a _test.go file or a *test package, or add it to publicAPI in %s with the reason",
			relFile(root, d.pos.Filename), d.pos.Line, key, d.pkg, "test/architecture/callers_test.go")
	}
	// Every entry must still match an export nothing else uses.
	all := uncalledKeys(fset, srcs)
	for key := range publicAPI {
		matched := false
		for _, k := range all {
			matched = matched || matchesEntry(key, k)
		}
		if !matched {
			t.Errorf("publicAPI lists %s, which matches no export without a production caller: remove it from the list", key)
		}
	}
}

// uncalledKeys returns the keys ("pkg.Name") of the exports with no
// production caller, counting nothing as public API.
func uncalledKeys(fset *token.FileSet, srcs []source) []string {
	var keys []string
	for _, d := range uncalledExports(fset, srcs, func(string) bool { return false }) {
		keys = append(keys, d.pkg+"."+d.name)
	}
	return keys
}

// relFile is a file name relative to the module root.
func relFile(root, name string) string {
	if r, err := filepath.Rel(root, name); err == nil {
		return r
	}
	return name
}

// TestUncalledExportsCatchesTestOnlyExport proves the rule finds what it
// is for, on a module written for the test.
func TestUncalledExportsCatchesTestOnlyExport(t *testing.T) {
	files := map[string]map[string]string{
		"internal/lib": {"lib.go": `package lib
type Result struct{ Field Inner; hidden Hidden }
type Inner int
type Hidden int
type Method struct{}
func (Result) Get() Method { return Method{} }
func New() Result { return Result{} }
func OnlyForTests() {}
const Used, Unused = 1, 2
type Public struct{ Reached Reachable }
type Reachable int
`, "method.go": `package lib
import "github.com/gatehouse-dev/gatehouse/internal/other"
// Other is declared in another file than Result, which imports other.
func (Result) Other() other.Thing { return 0 }
`},
		"internal/other": {"other.go": `package other
type Thing int
type Unused int
`},
		"internal/lib/libtest": {"libtest.go": `package libtest
import "github.com/gatehouse-dev/gatehouse/internal/lib"
func Helper() { lib.OnlyForTests() }
`},
		"cli": {"cli.go": `package cli
import alias "github.com/gatehouse-dev/gatehouse/internal/lib"
func Run() int { _ = alias.New(); return alias.Used }
`},
	}
	fset := token.NewFileSet()
	var srcs []source
	for path, fs := range files {
		s := source{path: path}
		for name, text := range fs {
			f, err := parser.ParseFile(fset, filepath.Join(path, name), text, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			s.name = f.Name.Name
			s.files = append(s.files, f)
		}
		srcs = append(srcs, s)
	}
	var got []string
	for _, d := range uncalledExports(fset, srcs, func(key string) bool { return key == "internal/lib.Public" }) {
		got = append(got, d.pkg+"."+d.name)
	}
	want := []string{"cli.Run", "internal/lib.Hidden", "internal/lib.OnlyForTests", "internal/lib.Unused", "internal/other.Unused"}
	if !slices.Equal(got, want) {
		t.Errorf("uncalled exports = %v, want %v", got, want)
	}
}

// sharedLibrary names the unit an internal package belongs to when it
// counts consumers: the attestation library's packages are one library
// whose consumers are outside it; any other package is its own unit.
func sharedLibrary(p string) string {
	if under(p, "internal/attestation") {
		return "internal/attestation"
	}
	return p
}

// consumer names who an importer is for the single-consumer rule: a
// component folder, cli, one binary under cmd/ or hack/, or a unit under
// internal/ (sharedLibrary).
func consumer(p string) string {
	for _, c := range append([]string{"cli"}, components...) {
		if under(p, c) {
			return c
		}
	}
	if under(p, "cmd") || under(p, "hack") {
		parts := strings.SplitN(p, "/", 3)
		return strings.Join(parts[:min(2, len(parts))], "/")
	}
	return sharedLibrary(p)
}

// singleConsumers returns, for each unit under internal/ (sharedLibrary)
// that production code of fewer than two consumers imports, those
// consumers. Test helpers are left out, and imports by tests, test helpers
// and benchmarks do not count.
func singleConsumers(pkgs map[string]pkg) map[string][]string {
	consumers := map[string]map[string]bool{}
	for path := range pkgs {
		if under(path, "internal") && !isTestHelper(path) {
			consumers[sharedLibrary(path)] = map[string]bool{}
		}
	}
	for from, p := range pkgs {
		if !callsCount(from) {
			continue
		}
		for _, imp := range p.Imports {
			to := rel(imp)
			unit := sharedLibrary(to)
			if _, ok := consumers[unit]; !ok || consumer(from) == unit {
				continue
			}
			consumers[unit][consumer(from)] = true
		}
	}
	out := map[string][]string{}
	for unit, cs := range consumers {
		if len(cs) < 2 {
			out[unit] = slices.Sorted(func(yield func(string) bool) {
				for c := range cs {
					if !yield(c) {
						return
					}
				}
			})
		}
	}
	return out
}

// singleConsumerAllowed are packages under internal/ that one consumer
// imports and that stay there, each with the reason.
var singleConsumerAllowed = map[string]string{
	"internal/cloudmeta": "three clouds' documented instance metadata protocols (fuzzed parsers), a library of their own that only the bootstrapper's binary wires (--cloud); not folded into cmd/",
}

// TestInternalIsShared fails for a package under internal/ that fewer than
// two consumers import (docs/architecture.md, "Import rule"): it belongs
// next to its one consumer.
func TestInternalIsShared(t *testing.T) {
	_, pkgs := listPackages(t)
	single := singleConsumers(pkgs)
	for _, unit := range slices.Sorted(func(yield func(string) bool) {
		for u := range single {
			if !yield(u) {
				return
			}
		}
	}) {
		if _, ok := singleConsumerAllowed[unit]; ok {
			continue
		}
		t.Errorf("%s is under internal/ but only %v imports it: move it next to its consumer, or add it to singleConsumerAllowed in test/architecture/callers_test.go with the reason it must stay",
			unit, fmt.Sprint(single[unit]))
	}
	for unit := range singleConsumerAllowed {
		if _, ok := single[unit]; !ok {
			t.Errorf("singleConsumerAllowed lists %s, which is gone or now has two consumers: remove it from the list", unit)
		}
	}
}

// TestSingleConsumersCatchesOneConsumer proves the rule finds what it is
// for, on a module written for the test.
func TestSingleConsumersCatchesOneConsumer(t *testing.T) {
	p := func(imports ...string) pkg {
		var full []string
		for _, i := range imports {
			full = append(full, module+"/"+i)
		}
		return pkg{Imports: full}
	}
	pkgs := map[string]pkg{
		"internal/shared":          p(),
		"internal/onlyjoin":        p(),
		"internal/attestation":     p("internal/attestation/tpm"),
		"internal/attestation/tpm": p(),
		"internal/testkit":         p("internal/onlyjoin"),
		"joinservice":              p("internal/shared", "internal/onlyjoin", "internal/attestation"),
		"joinservice/gate":         p("internal/onlyjoin"),
		"cmd/gatehouse":            p("internal/shared", "internal/attestation/tpm"),
		"test/e2e":                 p("internal/onlyjoin"),
	}
	got := singleConsumers(pkgs)
	want := map[string][]string{"internal/onlyjoin": {"joinservice"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("single consumers = %v, want %v", got, want)
	}
}
