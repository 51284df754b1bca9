package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm/swtpmtest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
)

// goldenNode serves the evidence of a manufactured TPM that measured
// artefacts, and returns the node and its boot event log.
func goldenNode(t *testing.T, ca swtpm.LocalCA, artefacts []tpm.Artefact) (*node, []byte) {
	t.Helper()
	var eventLog []byte
	m := swtpmtest.Manufacture(t, ca, testPCRs, func(sw *swtpm.TPM) error {
		rw, err := sw.Open()
		if err != nil {
			return err
		}
		defer rw.Close()
		eventLog, err = tpmattester.MeasureBoot(rw, artefacts)
		return err
	})
	rw, err := m.TPM.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rw.Close() })
	return startNodeOn(t, rw, m.Attester), eventLog
}

// TestReferenceValuesCapture: values captured from golden nodes over
// attested TLS (their TPMs trusted by manufacturer) or from an event log
// replayed offline are what the nodes measure, split into common and
// per-role values that config generate takes; an untrusted golden node,
// or two roles that measure alike, are refused and nothing is written.
func TestReferenceValuesCapture(t *testing.T) {
	ca := swtpmtest.CA(t)
	root, inter, err := ca.Roots()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	roots := filepath.Join(dir, "roots.pem")
	if err := os.WriteFile(roots, append(root, inter...), 0o600); err != nil {
		t.Fatal(err)
	}
	workerArtefacts := append(roleArtefacts("worker"), tpm.BytesArtefact(4, "gatehouse-bootstrapper", []byte("bootstrapper v1")))
	cp, cpLog := goldenNode(t, ca, bootArtefacts)
	worker, _ := goldenNode(t, ca, workerArtefacts)

	want := func(t *testing.T, artefacts []tpm.Artefact, pcrs ...int) measurements.M {
		t.Helper()
		m, err := tpm.ReferenceValues(artefacts, pcrs)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	check := func(t *testing.T, path string, expected measurements.M, says ...string) {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := measurements.Parse(data, 32)
		if err != nil {
			t.Fatalf("%s does not parse: %v\n%s", path, err, data)
		}
		gotYAML, _ := got.Marshal()
		wantYAML, _ := expected.Marshal()
		if string(gotYAML) != string(wantYAML) {
			t.Fatalf("%s holds\n%s\nwant\n%s", path, gotYAML, wantYAML)
		}
		for _, s := range says {
			if !strings.Contains(string(data), s) {
				t.Errorf("%s does not say %q:\n%s", path, s, data)
			}
		}
	}

	out := filepath.Join(dir, "captured")
	if err := os.Mkdir(out, 0o700); err != nil {
		t.Fatal(err)
	}
	run(t, "reference-values", "capture", "--control-plane", cp.evidence, "--worker", worker.evidence, "--ek-roots", roots,
		"--pcrs", "0,4,8,15", "--output-dir", out)
	check(t, filepath.Join(out, "reference-values.yaml"), want(t, bootArtefacts, 0, 4), "fresh evidence from "+cp.evidence, "ek-certificate manufacturer=")
	check(t, filepath.Join(out, "control-plane.yaml"), want(t, bootArtefacts, 8), "prove the controlPlane role")
	check(t, filepath.Join(out, "worker.yaml"), want(t, workerArtefacts, 8), "fresh evidence from "+worker.evidence)
	config := filepath.Join(dir, "config.yaml")
	run(t, "config", "generate", "--output", config, "--reference-values", filepath.Join(out, "reference-values.yaml"),
		"--control-plane-reference-values", filepath.Join(out, "control-plane.yaml"), "--worker-reference-values", filepath.Join(out, "worker.yaml"),
		"--ek-roots", roots, "--pcrs", "0,4,8,15")

	t.Run("event log replayed offline", func(t *testing.T) {
		logFile := filepath.Join(dir, "cp.eventlog")
		if err := os.WriteFile(logFile, cpLog, 0o600); err != nil {
			t.Fatal(err)
		}
		offline := t.TempDir()
		run(t, "reference-values", "capture", "--control-plane-event-log", logFile, "--pcrs", "0,4,8,15", "--output-dir", offline)
		// One role: every value is both common and the role's.
		check(t, filepath.Join(offline, "control-plane.yaml"), want(t, bootArtefacts, 0, 4, 8), "replayed offline from the event log")
		check(t, filepath.Join(offline, "reference-values.yaml"), want(t, bootArtefacts, 0, 4, 8))
	})

	for _, tt := range []struct {
		name string
		args []string
		says string
	}{
		{"golden node of another manufacturer", []string{"--control-plane", cp.evidence, "--ek-roots", writeTemp(t, "other.pem", otherCARoot(t))}, "certificate signed by unknown authority"},
		{"no key trust", []string{"--control-plane", cp.evidence}, "set exactly one of pinnedAKs"},
		{"roles measure alike", []string{"--control-plane", cp.evidence, "--worker", cp.evidence, "--ek-roots", roots}, "no PCR tells the roles apart"},
		{"no control plane", []string{"--worker", worker.evidence, "--ek-roots", roots}, "exactly one of --control-plane"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			empty := t.TempDir()
			out, err := runErr(t, append([]string{"reference-values", "capture", "--pcrs", "0,4,8,15", "--output-dir", empty}, tt.args...)...)
			if err == nil || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("got %v, want an error saying %q\n%s", err, tt.says, out)
			}
			if entries, _ := os.ReadDir(empty); len(entries) != 0 {
				t.Fatalf("a refused capture wrote %d files", len(entries))
			}
		})
	}
}

func otherCARoot(t *testing.T) []byte {
	t.Helper()
	root, _, err := swtpmtest.CA(t).Roots()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func writeTemp(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestNitroSection: the awsNitroTPM section holds the SHA-384 PCRs every
// golden instance's document shows alike, never PCR 15, and loads as the
// policy section it says it is.
func TestNitroSection(t *testing.T) {
	doc := func(pcr4 byte) *attestation.Result {
		return &attestation.Result{Endorsement: "aws-nitrotpm instance=i-0123456789abcdef0", Measurements: map[uint32][]byte{
			0: bytes.Repeat([]byte{1}, 48), 4: bytes.Repeat([]byte{pcr4}, 48), 15: make([]byte, 48),
		}}
	}
	out, err := nitroSection([]captured{
		{role: policy.RoleControlPlane, provenance: "cp", hardware: doc(2)},
		{role: policy.RoleWorker, provenance: "worker", hardware: doc(3)},
	}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var section struct {
		AWSNitroTPM policy.AWSNitroTPMPolicy `json:"awsNitroTPM"`
	}
	if err := yaml.Unmarshal(out, &section); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	refs, err := measurements.Parse(section.AWSNitroTPM.ReferenceValues, 48)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(refs) != 1 || !bytes.Equal(refs[0].Expected, bytes.Repeat([]byte{1}, 48)) || !section.AWSNitroTPM.AnyInstance {
		t.Fatalf("section %+v from\n%s", section.AWSNitroTPM, out)
	}
	if _, err := nitroSection([]captured{{role: policy.RoleWorker}}, time.Now()); err == nil {
		t.Fatal("a golden node without a document accepted")
	}
}
