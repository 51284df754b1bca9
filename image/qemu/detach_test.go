package qemu

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
)

// TestDetachedVM: a detached VM outlives Start's context and its handle;
// another caller resets it and powers it off through its directory (a
// guest without an ACPI handler: QEMU is told to quit after the grace),
// and ends swtpm by its PID.
func TestDetachedVM(t *testing.T) {
	requireTools(t, vmTools())
	image := filepath.Join(t.TempDir(), "blank.raw")
	if err := os.WriteFile(image, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := swtpm.LocalCA{Dir: t.TempDir()}
	if err := ca.Init(t.Context()); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(t.Context())
	vm, err := Start(ctx, Config{Image: image, Dir: dir, StateDiskSize: 1 << 20, MemoryMiB: 256, CPUs: 1,
		TPMCA: ca, Detach: true, Log: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	qemuPID, tpmPID := vm.PIDs()
	t.Cleanup(func() {
		_ = syscall.Kill(-qemuPID, syscall.SIGKILL)
		_ = syscall.Kill(-tpmPID, syscall.SIGKILL)
	})
	cancel()
	if err := vm.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	// swtpm outlived the context (it may end by itself once QEMU, its
	// only client, powers off below).
	if err := syscall.Kill(tpmPID, 0); err != nil {
		t.Fatalf("swtpm did not outlive Start's context: %v", err)
	}
	// QMP answers: QEMU outlived the context and the handle.
	if err := ResetDir(t.Context(), dir); err != nil {
		t.Fatalf("resetting the detached VM: %v", err)
	}
	ended, err := PowerOffDir(t.Context(), dir, time.Second)
	if err != nil || !ended {
		t.Fatalf("PowerOffDir = %v, %v; want QEMU ended", ended, err)
	}
	_ = syscall.Kill(-tpmPID, syscall.SIGKILL)
	waitGone(t, qemuPID, tpmPID)
	checkNothingLeft(t, []int{qemuPID, tpmPID}, dir)
	if ended, err := PowerOffDir(t.Context(), dir, time.Second); err != nil || !ended {
		t.Errorf("PowerOffDir of a VM that does not run = %v, %v; want nothing to do", ended, err)
	}
}

// waitGone waits until the processes are gone (reaped by their waiters).
func waitGone(t *testing.T, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for {
			if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("process %d is still there", pid)
			}
			time.Sleep(20 * time.Millisecond) // polling /proc: nothing tells when another's child is reaped
		}
	}
}
