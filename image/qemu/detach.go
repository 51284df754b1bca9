package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"
)

// PIDs returns the process IDs of QEMU and swtpm: what a caller records
// to end a detached VM (Config.Detach) from another process.
func (v *VM) PIDs() (qemu, tpm int) {
	return v.qemu.cmd.Process.Pid, v.tpm.cmd.Process.Pid
}

// Release lets a detached VM (Config.Detach) go on without this handle:
// the console is no longer followed and the QMP connection closes, so
// that another process can reach the VM (ResetDir, PowerOffDir). The VM
// keeps running; after Release only PIDs and ConsoleLog may be called.
// On a VM that is not detached it is Stop.
func (v *VM) Release(ctx context.Context) error {
	if !v.cfg.Detach {
		return v.Stop(ctx)
	}
	v.releaseOnce.Do(func() { close(v.released) })
	return nil
}

// PowerOff presses the VM's power button (ACPI: the guest shuts down
// cleanly) and waits up to grace for the guest to power off; then, or
// when the guest has no ACPI power button handler, it ends the VM as
// Stop does. It returns once no process of the VM is left.
func (v *VM) PowerOff(ctx context.Context, grace time.Duration) error {
	if v.running() == nil {
		if _, err := v.qmp.execute(ctx, "system_powerdown", nil); err != nil {
			v.log.Warn("Pressing the power button failed: quitting", "error", err)
		} else if !v.qemu.wait(ctx, grace) {
			v.log.Warn("The guest did not power off in time: quitting QEMU", "grace", grace.String())
		}
	}
	return v.Stop(ctx)
}

// ResetDir resets the running VM whose directory is dir (a VM started
// with Config.Detach, by this or another process, and released), as
// VM.Reset does: the firmware starts again and measures a new boot into
// the TPM, whose PCRs start from their reset values.
func ResetDir(ctx context.Context, dir string) error {
	q, err := attachQMP(ctx, dir)
	if err != nil {
		return err
	}
	defer q.close()
	if _, err := q.execute(ctx, "system_reset", nil); err != nil {
		return fmt.Errorf("resetting the VM in %s: %w", dir, err)
	}
	return nil
}

// PowerOffDir presses the power button of the running VM whose directory
// is dir (as ResetDir) and waits up to grace for QEMU to end (the guest
// powered off); then it tells QEMU to quit. It returns whether QEMU
// ended; the caller kills what is left by its PIDs (VM.PIDs), swtpm
// always. A VM that is not running (no QMP socket answers) is no error.
func PowerOffDir(ctx context.Context, dir string, grace time.Duration) (bool, error) {
	q, err := attachQMP(ctx, dir)
	if err != nil {
		return true, nil //nolint:nilerr // nothing answers: no VM runs there
	}
	defer q.close()
	if _, err := q.execute(ctx, "system_powerdown", nil); err == nil {
		timer := time.NewTimer(grace)
		defer timer.Stop()
		select {
		case <-q.closed: // QEMU ended with the guest's power-off
			return true, nil
		case <-timer.C:
		case <-ctx.Done():
		}
	}
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	// Its answer and the socket's end race; either means QEMU quits.
	_, err = q.execute(qctx, "quit", nil)
	select {
	case <-q.closed:
		return true, nil
	case <-qctx.Done():
		return false, fmt.Errorf("QEMU in %s did not quit: %w", dir, errors.Join(err, qctx.Err()))
	}
}

// attachQMP connects to the QMP socket of the VM in dir, which another
// process may have started: it fails within 5 s when none answers.
func attachQMP(ctx context.Context, dir string) (*qmp, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// Not this process's child: nothing tells when it ends but the socket.
	p := &process{name: "QEMU", done: make(chan struct{})}
	q, err := dialQMP(ctx, filepath.Join(dir, qmpSocket), p, func(string, json.RawMessage) {})
	if err != nil {
		return nil, fmt.Errorf("reaching the VM in %s: %w", dir, err)
	}
	return q, nil
}
