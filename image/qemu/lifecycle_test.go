package qemu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// TestNothingIsLeftRunning starts VMs on a blank disk (the firmware finds
// nothing to boot; no boot is needed) and ends them each way a VM ends:
// nothing of them may be left running.
func TestNothingIsLeftRunning(t *testing.T) {
	requireTools(t, vmTools())
	image := filepath.Join(t.TempDir(), "blank.raw")
	if err := os.WriteFile(image, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := swtpm.LocalCA{Dir: t.TempDir()}
	if err := ca.Init(t.Context()); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		end  func(t *testing.T, vm *VM, cancel context.CancelFunc)
	}{
		{"Stop quits QEMU and stops swtpm", func(t *testing.T, vm *VM, _ context.CancelFunc) {
			if err := vm.Stop(t.Context()); err != nil {
				t.Fatal(err)
			}
		}},
		{"the end of Start's context kills them", func(t *testing.T, vm *VM, cancel context.CancelFunc) {
			cancel()
			select {
			case <-vm.Done():
			case <-time.After(30 * time.Second):
				t.Fatal("the VM still runs 30 s after its context ended")
			}
		}},
		{"Stop after a reset", func(t *testing.T, vm *VM, _ context.CancelFunc) {
			if err := vm.Reset(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := vm.Stop(t.Context()); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			vm, err := Start(ctx, Config{Image: image, Dir: dir, StateDiskSize: 1 << 20, MemoryMiB: 256, CPUs: 1,
				TPMCA: ca, Log: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			pids := vm.pids()
			tt.end(t, vm, cancel)
			checkNothingLeft(t, pids, dir)
			if _, err := vm.WaitForLine(t.Context(), regexp.MustCompile("never")); !errors.Is(err, ErrExited) {
				t.Errorf("WaitForLine on an ended VM: %v, want ErrExited", err)
			}
			if err := vm.Reset(t.Context()); !errors.Is(err, ErrExited) {
				t.Errorf("Reset on an ended VM: %v, want ErrExited", err)
			}
			if err := vm.Stop(t.Context()); err != nil {
				t.Errorf("a second Stop: %v", err)
			}
			if _, err := os.Stat(filepath.Join(dir, tpmDir, swtpm.StateFile)); err != nil {
				t.Errorf("the TPM's state is gone: %v", err)
			}
		})
	}

	t.Run("a Start that fails leaves nothing running", func(t *testing.T) {
		taken, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer taken.Close()
		port := taken.Addr().(*net.TCPAddr).Port
		dir := t.TempDir()
		_, err = Start(t.Context(), Config{Image: image, Dir: dir, MemoryMiB: 256, CPUs: 1, TPMCA: ca,
			Forwards: []Forward{{Host: port, Guest: 22}}})
		if err == nil || !strings.Contains(err.Error(), "QEMU's log") {
			t.Fatalf("Start with a taken host port = %v, want QEMU's failure quoted", err)
		}
		checkNothingLeft(t, nil, dir)
	})
}

// TestVMDiesWithItsProcess kills (SIGKILL, no cleanup) a process that
// started a VM: QEMU and swtpm must die with it (PR_SET_PDEATHSIG).
func TestVMDiesWithItsProcess(t *testing.T) {
	if dir := os.Getenv("GATEHOUSE_QEMU_TEST_HELPER"); dir != "" {
		helperStartVM(t, dir)
		return
	}
	requireTools(t, vmTools())
	dir := t.TempDir()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestVMDiesWithItsProcess$")
	cmd.Env = append(os.Environ(), "GATEHOUSE_QEMU_TEST_HELPER="+dir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pids []int
	scanner := bufio.NewScanner(stdout)
	for scanner.Scan() {
		if rest, ok := strings.CutPrefix(scanner.Text(), "STARTED "); ok {
			for _, f := range strings.Fields(rest) {
				pid, err := strconv.Atoi(f)
				if err != nil {
					t.Fatal(err)
				}
				pids = append(pids, pid)
			}
			break
		}
	}
	if len(pids) != 2 {
		_ = cmd.Process.Kill()
		t.Fatalf("the helper started no VM (%v)", cmd.Wait())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ticker := time.NewTicker(50 * time.Millisecond)
	defer ticker.Stop()
	for _, pid := range pids {
		for testenv.ProcessAlive(pid) {
			select {
			case <-ctx.Done():
				t.Fatalf("process %d of the VM outlived the process that started it", pid)
			case <-ticker.C:
			}
		}
	}
}

// helperStartVM starts a VM on a blank disk in dir, prints the PIDs of
// QEMU and swtpm and waits to be killed.
func helperStartVM(t *testing.T, dir string) {
	image := filepath.Join(dir, "blank.raw")
	if err := os.WriteFile(image, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	vm, err := Start(context.Background(), Config{Image: image, Dir: filepath.Join(dir, "vm"), StateDiskSize: 1 << 20,
		MemoryMiB: 256, CPUs: 1, TPMCA: swtpm.LocalCA{Dir: filepath.Join(dir, "ca")}})
	if err != nil {
		t.Fatal(err)
	}
	pids := vm.pids()
	fmt.Printf("STARTED %d %d\n", pids[0], pids[1])
	<-vm.Done()
}
