package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// process is a child the runner started: in a process group of its own,
// killed when the runner dies (PR_SET_PDEATHSIG) and, with its group, by
// kill.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // Wait's result, set before done closes
}

// startProcess starts bin with args, its output appended to logPath.
// A detached process runs in a session of its own and outlives the
// caller; otherwise it dies with the caller.
func startProcess(name, logPath string, detach bool, bin string, args ...string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating the log of %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if detach {
		// The session's leader leads its process group too: kill's -pid
		// reaches it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits up to timeout (or ctx) for the process to end by itself.
func (p *process) wait(ctx context.Context, timeout time.Duration) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return true
	case <-timer.C:
	case <-ctx.Done():
	}
	return false
}

// stop sends SIGTERM to the process group, then SIGKILL after grace, and
// waits for the process to end.
func (p *process) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	if !p.wait(context.Background(), grace) {
		p.kill()
	}
}

// kill sends SIGKILL to the process group and waits for the process.
func (p *process) kill() {
	if !p.exited() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-p.done
}
