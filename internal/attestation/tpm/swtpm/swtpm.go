// Package swtpm runs a software TPM 2.0 (Debian's swtpm) as a separate
// process, for tests and for the nodes of the local cluster, each of which
// gets a TPM of its own.
package swtpm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/google/go-tpm/tpmutil"
)

// TPM is a running swtpm process serving the TPM 2.0 command protocol on a
// Unix socket.
type TPM struct {
	cmd    *exec.Cmd
	socket string
	done   chan struct{}
	err    error
}

// StateFile is the file in a state directory that holds a TPM's
// permanent state (its seeds, NV and persistent objects); it exists once
// the TPM was manufactured or has run.
const StateFile = "tpm2-00.permall"

// Start runs swtpm with its state (its seeds, NV and persistent objects) in
// stateDir, created if missing, and returns once it accepts connections. The
// TPM starts up by itself (TPM2_Startup(CLEAR)), so PCRs begin at their reset
// values, as after a power-on. Stop ends it.
func Start(ctx context.Context, stateDir string) (*TPM, error) {
	bin, err := exec.LookPath("swtpm")
	if err != nil {
		return nil, errors.New("swtpm not found: install the Debian packages swtpm and swtpm-tools (make setup does)")
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating swtpm state directory: %w", err)
	}
	socket := filepath.Join(stateDir, "tpm.sock")
	ctrl := filepath.Join(stateDir, "ctrl.sock")
	for _, s := range []string{socket, ctrl} {
		if err := os.Remove(s); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("removing stale socket: %w", err)
		}
	}
	logFile, err := os.OpenFile(filepath.Join(stateDir, "swtpm.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating swtpm log: %w", err)
	}
	cmd := exec.Command(bin, "socket", "--tpm2",
		"--tpmstate", "dir="+stateDir,
		"--server", "type=unixio,path="+socket,
		"--ctrl", "type=unixio,path="+ctrl,
		// No control-channel handshake needed: swtpm initialises itself and
		// sends TPM2_Startup(CLEAR).
		"--flags", "not-need-init,startup-clear",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting swtpm: %w", err)
	}
	t := &TPM{cmd: cmd, socket: socket, done: make(chan struct{})}
	go func() {
		t.err = cmd.Wait()
		_ = logFile.Close()
		close(t.done)
	}()
	if err := t.waitReady(ctx); err != nil {
		t.Stop()
		return nil, err
	}
	return t, nil
}

func (t *TPM) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ticker := time.NewTicker(10 * time.Millisecond)
	defer ticker.Stop()
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "unix", t.socket)
		if err == nil {
			return conn.Close()
		}
		select {
		case <-t.done:
			return fmt.Errorf("swtpm exited before it accepted connections: %w", t.err)
		case <-ctx.Done():
			return fmt.Errorf("waiting for swtpm socket %s: %w (%w)", t.socket, ctx.Err(), err)
		case <-ticker.C:
		}
	}
}

// Open returns a connection to the TPM for go-tpm and go-tpm-tools; every
// command dials the socket anew. Close it when done.
func (t *TPM) Open() (io.ReadWriteCloser, error) {
	rw, err := tpmutil.OpenTPM(t.socket)
	if err != nil {
		return nil, fmt.Errorf("opening swtpm socket: %w", err)
	}
	return rw, nil
}

// PID returns the swtpm process ID.
func (t *TPM) PID() int { return t.cmd.Process.Pid }

// Stop terminates swtpm and waits for it to exit. Its state stays in the
// state directory, so a later Start resumes the same TPM (same seeds, hence
// the same keys), as a reboot would.
func (t *TPM) Stop() {
	select {
	case <-t.done:
		return
	default:
	}
	_ = syscall.Kill(-t.cmd.Process.Pid, syscall.SIGTERM)
	timer := time.NewTimer(5 * time.Second)
	defer timer.Stop()
	select {
	case <-t.done:
	case <-timer.C:
		_ = syscall.Kill(-t.cmd.Process.Pid, syscall.SIGKILL)
		<-t.done
	}
}
