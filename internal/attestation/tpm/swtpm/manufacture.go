package swtpm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
)

// LocalCA is a TPM manufacturer's certificate authority for software TPMs:
// Debian's swtpm_localca, kept in a directory of its own (not the system's
// /var/lib/swtpm-localca). Its root and intermediate certify the
// endorsement keys (EKs) of the TPMs Manufacture makes, as a TPM vendor's
// CA certifies a hardware TPM's EK (TCG EK Credential Profile).
type LocalCA struct {
	// Dir holds the CA's keys, certificates and serial counter; swtpm_localca
	// creates them on first use.
	Dir string
}

// Files swtpm_localca keeps in LocalCA.Dir.
const (
	localCARootCert         = "swtpm-localca-rootca-cert.pem"
	localCAIntermediateCert = "issuercert.pem"
)

// Manufacture provisions a new TPM's state in stateDir (created if missing,
// overwritten if present) as a TPM vendor does: it creates the TPM's RSA
// 2048 and ECC EKs, persists them at the TCG's default handles
// (0x81010001, 0x81010016), and writes their certificates, issued by ca,
// into the TCG's default NV indices (0x01c00002, 0x01c00016), with the
// SHA-256 PCR bank active. Start then runs that TPM. It takes about a
// second. Calls for many TPMs may run concurrently once the CA exists
// (call ca.Init first); swtpm_localca serialises its serial numbers.
func Manufacture(ctx context.Context, stateDir string, ca LocalCA) error {
	if err := ca.Init(ctx); err != nil {
		return err
	}
	setupConf, err := ca.setupConfig()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return fmt.Errorf("creating swtpm state directory: %w", err)
	}
	return runTool(ctx, "swtpm_setup", "--tpm2", "--tpmstate", stateDir, "--create-ek-cert",
		"--config", setupConf, "--overwrite", "--pcr-banks", "sha256")
}

// Init creates the CA's root and intermediate if they do not exist yet, by
// manufacturing a throwaway TPM. It is idempotent.
func (ca LocalCA) Init(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(ca.Dir, localCAIntermediateCert)); err == nil {
		return nil
	}
	if err := os.MkdirAll(ca.Dir, 0o700); err != nil {
		return fmt.Errorf("creating the local CA directory: %w", err)
	}
	setupConf, err := ca.setupConfig()
	if err != nil {
		return err
	}
	scratch, err := os.MkdirTemp(ca.Dir, "init-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	return runTool(ctx, "swtpm_setup", "--tpm2", "--tpmstate", scratch, "--create-ek-cert",
		"--config", setupConf, "--overwrite", "--pcr-banks", "sha256")
}

// Roots returns the CA's root certificate and the intermediate that issues
// EK certificates, PEM: what a verifier configures as the manufacturer's
// trust anchor and chain.
func (ca LocalCA) Roots() (root, intermediate []byte, err error) {
	if root, err = os.ReadFile(filepath.Join(ca.Dir, localCARootCert)); err != nil {
		return nil, nil, fmt.Errorf("reading the local CA's root (run Init first): %w", err)
	}
	if intermediate, err = os.ReadFile(filepath.Join(ca.Dir, localCAIntermediateCert)); err != nil {
		return nil, nil, fmt.Errorf("reading the local CA's intermediate (run Init first): %w", err)
	}
	return root, intermediate, nil
}

// setupConfig writes the swtpm_setup and swtpm_localca configurations that
// keep the CA in ca.Dir and returns the former's path.
func (ca LocalCA) setupConfig() (string, error) {
	dir, err := filepath.Abs(ca.Dir)
	if err != nil {
		return "", err
	}
	localca := filepath.Join(dir, "swtpm-localca.conf")
	options := filepath.Join(dir, "swtpm-localca.options")
	setup := filepath.Join(dir, "swtpm_setup.conf")
	files := map[string]string{
		localca: "statedir = " + dir + "\n" +
			"signingkey = " + filepath.Join(dir, "signkey.pem") + "\n" +
			"issuercert = " + filepath.Join(dir, localCAIntermediateCert) + "\n" +
			"certserial = " + filepath.Join(dir, "certserial") + "\n",
		options: "--platform-manufacturer Gatehouse\n--platform-version 1\n--platform-model swtpm\n",
		setup: "create_certs_tool = /usr/bin/swtpm_localca\n" +
			"create_certs_tool_config = " + localca + "\n" +
			"create_certs_tool_options = " + options + "\n" +
			"active_pcr_banks = sha256\n",
	}
	for path, content := range files {
		// Atomic: a concurrent Manufacture may be reading it.
		if err := atomicfile.Write(path, []byte(content), 0o600); err != nil {
			return "", err
		}
	}
	return setup, nil
}

// runTool runs one of swtpm's tools; a failure quotes its output.
func runTool(ctx context.Context, name string, args ...string) error {
	if _, err := exec.LookPath(name); err != nil {
		return errors.New(name + " not found: install the Debian package swtpm-tools (make setup does)")
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w\n%s", name, err, out.String())
	}
	return nil
}
