package qemu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Reset resets the VM as a reset button does: the firmware starts again,
// QEMU re-initialises the TPM (its PCRs start from their reset values) and
// the firmware measures the new boot; disks and the TPM's keys stay.
// Console lines from then on belong to the next boot (Line.Boot). It
// returns once the VM runs again.
func (v *VM) Reset(ctx context.Context) error {
	if err := v.running(); err != nil {
		return err
	}
	// Pause the CPUs first, so that everything the old boot wrote to the
	// console is in the file and the new boot's lines begin at its size.
	if _, err := v.qmp.execute(ctx, "stop", nil); err != nil {
		return fmt.Errorf("pausing the VM to reset it: %w", err)
	}
	err := v.resetPaused(ctx)
	if _, cerr := v.qmp.execute(ctx, "cont", nil); cerr != nil && err == nil {
		err = fmt.Errorf("resuming the VM after its reset: %w", cerr)
	}
	return err
}

// resetPaused resets the paused VM and starts the console's next boot.
func (v *VM) resetPaused(ctx context.Context) error {
	size, err := v.console.size()
	if err != nil {
		return fmt.Errorf("resetting the VM: %w", err)
	}
	select {
	case <-v.hostReset: // a stale event
	default:
	}
	if _, err := v.qmp.execute(ctx, "system_reset", nil); err != nil {
		return fmt.Errorf("resetting the VM: %w", err)
	}
	// QEMU resets the machine after it answered; resuming before that
	// would race the reset.
	select {
	case <-v.hostReset:
	case <-v.qemu.done:
		return v.running()
	case <-ctx.Done():
		return fmt.Errorf("waiting for QEMU to reset the VM: %w", ctx.Err())
	}
	boot := v.console.newBoot(size, time.Now())
	v.log.Info("Reset the VM: OVMF starting"+v.firmwareEstimate(), "boot", boot)
	return nil
}

// Stop ends the VM: QEMU quits (as pulling the plug would: the guest is
// not shut down), or is killed if it does not within 10 s or ctx, and
// swtpm stops. It returns once no process of the VM is left. Dir keeps
// the TPM, the firmware variables, the state disk and the logs; the image
// overlay is removed. Stop may be called more than once and after the
// guest powered off.
func (v *VM) Stop(ctx context.Context) error {
	v.stopOnce.Do(func() { v.stopErr = v.stop(ctx) })
	return v.stopErr
}

func (v *VM) stop(ctx context.Context) error {
	if !v.qemu.exited() {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		// Its answer and the socket's end race; either means QEMU quits.
		_, _ = v.qmp.execute(qctx, "quit", nil)
		if !v.qemu.wait(qctx, 10*time.Second) {
			v.log.Warn("QEMU did not quit: killing it")
			v.qemu.kill()
		}
		cancel()
	}
	<-v.ended
	var errs []error
	for _, f := range []string{overlayFile, qmpSocket, tpmCtrlSocket} {
		if err := os.Remove(filepath.Join(v.cfg.Dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	v.log.Info("Stopped the VM", "dir", v.cfg.Dir)
	return errors.Join(errs...)
}

// Done returns a channel that closes once the VM has ended (Stop, the
// guest powered off, QEMU failed, or Start's context ended) and none of
// its processes is left.
func (v *VM) Done() <-chan struct{} { return v.ended }

// running returns nil while QEMU runs, and otherwise ErrExited with how
// QEMU ended.
func (v *VM) running() error {
	if !v.qemu.exited() {
		return nil
	}
	status := "exited"
	if v.qemu.err != nil {
		status = v.qemu.err.Error()
	}
	return fmt.Errorf("%w: QEMU %s%s", ErrExited, status, v.qemuLogTail())
}

// WaitForLine waits until a console line of the current boot (the one
// since Start or the last reset, including lines already written) matches
// re, and returns it. It fails with ErrExited when the VM ends first, and
// with ctx's error, naming re and quoting the boot's last lines, when ctx
// ends first.
func (v *VM) WaitForLine(ctx context.Context, re *regexp.Regexp) (Line, error) {
	next := 0
	var last []Line
	for {
		lines, n, boot, ended, more := v.console.since(next)
		for _, l := range lines {
			if l.Boot != boot {
				continue
			}
			if re.MatchString(l.Text) {
				return l, nil
			}
			last = append(last, l)
			if len(last) > 20 {
				last = last[1:]
			}
		}
		next = n
		if ended {
			return Line{}, fmt.Errorf("waiting for %q on the console: %w%s", re, v.running(), quoteLines(last))
		}
		select {
		case <-more:
		case <-ctx.Done():
			return Line{}, fmt.Errorf("waiting for %q on the console of boot %d: %w%s", re, boot, ctx.Err(), quoteLines(last))
		}
	}
}

// Console returns the console lines read so far from index from on (0:
// all; lines beyond the last 50,000 are only in ConsoleLog), the index to
// pass next to get only newer ones, and a channel that closes when more
// lines come or the VM ends.
func (v *VM) Console(from int) (lines []Line, next int, more <-chan struct{}) {
	lines, next, _, _, more = v.console.since(from)
	return lines, next, more
}

// ConsoleLog is the file that holds everything the guest wrote to its
// serial console since the VM started.
func (v *VM) ConsoleLog() string { return filepath.Join(v.cfg.Dir, consoleFile) }

// Ports returns the forwarded ports, each Host port resolved:
// 127.0.0.1:Host reaches the guest's Guest port.
func (v *VM) Ports() []Forward { return append([]Forward(nil), v.ports...) }

// choosePorts returns forwards with every zero Host port replaced by a
// port that was free a moment ago (QEMU fails to start, naming it, if
// another program takes it first).
func choosePorts(forwards []Forward) ([]Forward, error) {
	out := append([]Forward(nil), forwards...)
	for i := range out {
		if out[i].Host != 0 {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port for guest port %d: %w", out[i].Guest, err)
		}
		out[i].Host = l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
	}
	return out, nil
}

// qemuLogTail quotes the end of QEMU's log, where it says why it failed.
func (v *VM) qemuLogTail() string {
	path := filepath.Join(v.cfg.Dir, qemuLogFile)
	data, err := os.ReadFile(path)
	if err != nil || len(strings.TrimSpace(string(data))) == 0 {
		return ""
	}
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return fmt.Sprintf("\nQEMU's log (%s):\n%s", path, strings.TrimSpace(string(data)))
}

// quoteLines formats the last console lines for an error.
func quoteLines(lines []Line) string {
	if len(lines) == 0 {
		return "\nThe boot has written nothing to the console yet."
	}
	var b strings.Builder
	b.WriteString("\nThe boot's last console lines:")
	for _, l := range lines {
		fmt.Fprintf(&b, "\n  %s", l.Text)
	}
	return b.String()
}
