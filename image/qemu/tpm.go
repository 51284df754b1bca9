package qemu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
)

// startTPM runs the VM's TPM: swtpm with its state in dir/tpm,
// manufactured with an EK certificate from ca on the first start, serving
// QEMU's TPM emulator backend on the control socket (QEMU's
// docs/specs/tpm.rst, "The QEMU TPM emulator device"; swtpm's
// man page swtpm-ioctls(3)): QEMU passes the data channel over the
// control channel and sends CMD_INIT when the machine starts and at every
// reset, and the firmware sends TPM2_Startup, so PCRs start from their
// reset values on every boot. It returns once swtpm accepts
// connections. A detached swtpm outlives the caller (Config.Detach).
func startTPM(ctx context.Context, bin, dir string, ca swtpm.LocalCA, detach bool, log *slog.Logger) (*process, error) {
	stateDir := filepath.Join(dir, tpmDir)
	if _, err := os.Stat(filepath.Join(stateDir, swtpm.StateFile)); errors.Is(err, os.ErrNotExist) {
		log.Info("Manufacturing the VM's TPM (endorsement keys and their certificates from the local CA)", "ca", ca.Dir)
		if err := swtpm.Manufacture(ctx, stateDir, ca); err != nil {
			return nil, fmt.Errorf("manufacturing the VM's TPM: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("the VM's TPM state: %w", err)
	}
	ctrl := filepath.Join(dir, tpmCtrlSocket)
	if err := os.Remove(ctrl); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing a stale TPM socket: %w", err)
	}
	// Not --daemon: the runner keeps swtpm as its child, so that it dies
	// with the runner. No --flags startup-clear: QEMU initialises the TPM
	// and the firmware starts it up.
	p, err := startProcess("swtpm", filepath.Join(stateDir, "swtpm.log"), detach, bin, "socket", "--tpm2",
		"--tpmstate", "dir="+stateDir,
		"--ctrl", "type=unixio,path="+ctrl,
		"--log", "level=1")
	if err != nil {
		return nil, err
	}
	if err := waitSocket(ctx, ctrl, p, 10*time.Second); err != nil {
		p.kill()
		return nil, fmt.Errorf("the VM's TPM: %w (log: %s)", err, filepath.Join(stateDir, "swtpm.log"))
	}
	return p, nil
}

// waitSocket polls until the Unix socket at path accepts a connection,
// p exits, or timeout passes.
func waitSocket(ctx context.Context, path string, p *process, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ticker := time.NewTicker(10 * time.Millisecond)
	defer ticker.Stop()
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return conn.Close()
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it listened on %s: %w", p.name, path, p.err)
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s to listen on %s: %w (%w)", p.name, path, ctx.Err(), err)
		case <-ticker.C:
		}
	}
}
