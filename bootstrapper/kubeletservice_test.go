package bootstrapper

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPIDFileKubelet: Restart stops the process the file names and
// returns once its supervisor wrote another; a supervisor that never
// does is an error naming the file.
func TestPIDFileKubelet(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "kubelet.pid")
	start := func() *exec.Cmd {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	first := start()
	// The supervisor: once the kubelet exits, start it again.
	exited := make(chan struct{})
	go func() {
		_ = first.Wait()
		close(exited)
	}()
	restarted := make(chan error, 1)
	go func() {
		<-exited
		second := exec.Command("sleep", "60")
		if err := second.Start(); err != nil {
			restarted <- err
			return
		}
		t.Cleanup(func() { _ = second.Process.Kill(); _ = second.Wait() })
		restarted <- os.WriteFile(pidFile, []byte(strconv.Itoa(second.Process.Pid)+"\n"), 0o600)
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := (PIDFileKubelet{Path: pidFile}).Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}

	// Nobody starts it again.
	start()
	ctx, cancel = context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if err := (PIDFileKubelet{Path: pidFile}).Restart(ctx); err == nil || !strings.Contains(err.Error(), pidFile) {
		t.Fatalf("Restart without a supervisor: %v", err)
	}
	if err := (PIDFileKubelet{Path: filepath.Join(t.TempDir(), "none")}).Restart(t.Context()); err == nil || !strings.Contains(err.Error(), "the kubelet's process ID") {
		t.Fatalf("Restart without a PID file: %v", err)
	}
}
