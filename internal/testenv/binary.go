package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"testing"
)

// BuildBinary builds the main package pkg (an import path of this module,
// or a directory relative to the test's) with `go build` into a temporary
// directory of the test and returns the binary's path. It fails the test
// with the compiler's output when the build fails.
func BuildBinary(t testing.TB, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), path.Base(pkg))
	out, err := exec.CommandContext(t.Context(), "go", "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// Process is a binary a test started with StartProcess: it runs in its own
// process group, dies with the test binary (PR_SET_PDEATHSIG), and writes
// its standard output and error to a log file of the test.
type Process struct {
	p *process
}

// StartProcess starts bin with args, inheriting the test's environment,
// and registers a cleanup that stops its process group (SIGTERM, then
// SIGKILL after 10 s) and waits for it; when the test has failed, the
// cleanup first logs the tail of the process's output. name labels the
// process in messages.
func StartProcess(t testing.TB, name, bin string, args ...string) *Process {
	t.Helper()
	p, err := startProcess(name, t.TempDir(), bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("%s (exit: %v) log tail:\n%s", name, p.err, p.logTail(16<<10))
		}
	})
	return &Process{p: p}
}

// PID returns the process ID.
func (p *Process) PID() int { return p.p.pid() }

// Signal sends sig to the process (not its group).
func (p *Process) Signal(sig os.Signal) error {
	if err := p.p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signalling %s: %w", p.p.name, err)
	}
	return nil
}

// Stop terminates the process group (SIGTERM, then SIGKILL after 10 s) and
// returns once it is gone; calling it again, or the cleanup after it, is a
// no-op.
func (p *Process) Stop() { p.p.stop() }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool { return p.p.exited() }

// Wait returns the process's exit error (nil for exit status 0) once it
// has exited, or ctx's error if it is still running when ctx ends.
func (p *Process) Wait(ctx context.Context) error {
	select {
	case <-p.p.done:
		return p.p.err
	case <-ctx.Done():
		return fmt.Errorf("waiting for %s to exit: %w", p.p.name, ctx.Err())
	}
}

// Log returns everything the process has written so far.
func (p *Process) Log() string {
	data, err := os.ReadFile(p.p.logPath)
	if err != nil {
		return fmt.Sprintf("(log unreadable: %v)", err)
	}
	return string(data)
}

// FreeAddrs returns n distinct "127.0.0.1:<port>" addresses whose ports
// were free a moment ago, for a process the test starts to listen on.
// Nothing holds them meanwhile: in rare cases another process takes one
// first, and the test's process then fails with "address already in use".
func FreeAddrs(t testing.TB, n int) []string {
	t.Helper()
	ports, err := freePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	addrs := make([]string, n)
	for i, port := range ports {
		addrs[i] = hostPort(port)
	}
	return addrs
}
