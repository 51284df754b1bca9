package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// childModeEnv tells a re-executed test binary which child behaviour to show.
const childModeEnv = "GATEHOUSE_TESTENV_CHILD"

// childState is what a child reports about its environment before it ends.
type childState struct {
	Dir  string         `json:"dir"`
	PIDs map[string]int `json:"pids"`
}

// childScenario runs in a re-executed test binary (TestCleanup with
// childModeEnv set): it starts an environment, reports it, and then ends badly.
func childScenario(t *testing.T, mode string) {
	env := New(t, Options{ControllerManager: true})
	state, err := json.Marshal(childState{Dir: env.Dir, PIDs: env.PIDs()})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(os.Getenv("GATEHOUSE_TESTENV_STATE"), state, 0o600); err != nil {
		t.Fatal(err)
	}
	switch mode {
	case "panic":
		panic("child panics with a running environment")
	case "fail":
		t.Fatal("child fails with a running environment")
	case "hang":
		<-t.Context().Done() // until the parent kills us
	}
}

func TestCleanup(t *testing.T) {
	if mode := os.Getenv(childModeEnv); mode != "" {
		childScenario(t, mode)
		return
	}
	tests := []struct {
		name string
		mode string
		// kill the child with SIGKILL once it reported its state, so no cleanup runs
		kill bool
	}{
		{name: "failed test stops processes and removes the directory", mode: "fail"},
		{name: "panicking test stops processes and removes the directory", mode: "panic"},
		{name: "killed test binary takes its processes along; next start removes the directory", mode: "hang", kill: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			statePath := filepath.Join(t.TempDir(), "state.json")
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestCleanup$", "-test.v")
			cmd.Env = append(os.Environ(), childModeEnv+"="+tt.mode, "GATEHOUSE_TESTENV_STATE="+statePath)
			out, err := runChild(t, cmd, statePath, tt.kill)
			var exitErr *exec.ExitError
			if !errors.As(err, &exitErr) {
				t.Fatalf("child should end with an error exit, got %v; output:\n%s", err, out)
			}
			data, err := os.ReadFile(statePath)
			if err != nil {
				t.Fatalf("child reported no state: %v; output:\n%s", err, out)
			}
			var state childState
			if err := json.Unmarshal(data, &state); err != nil {
				t.Fatal(err)
			}
			if len(state.PIDs) != 3 {
				t.Fatalf("child ran %v, want etcd, kube-apiserver and kube-controller-manager", state.PIDs)
			}
			for name, pid := range state.PIDs {
				waitGone(t, name, pid)
			}
			if tt.kill {
				// The killed child ran no cleanup: the directory is stale until the next Start.
				if _, err := os.Stat(state.Dir); err != nil {
					t.Fatalf("directory of killed child: %v", err)
				}
				removeStaleDirs()
			}
			if _, err := os.Stat(state.Dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("environment directory %s still exists (stat: %v)", state.Dir, err)
			}
		})
	}
}

// runChild runs cmd; with kill, it SIGKILLs the child as soon as statePath appears.
func runChild(t *testing.T, cmd *exec.Cmd, statePath string, kill bool) ([]byte, error) {
	t.Helper()
	if !kill {
		return cmd.CombinedOutput()
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	ticker := time.NewTicker(50 * time.Millisecond)
	defer ticker.Stop()
	for {
		if _, err := os.Stat(statePath); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			t.Fatal("child never reported its environment")
		case <-ticker.C:
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	return nil, cmd.Wait()
}

// waitGone waits until pid no longer exists (or is a zombie awaiting its reaper).
func waitGone(t *testing.T, name string, pid int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ticker := time.NewTicker(20 * time.Millisecond)
	defer ticker.Stop()
	for {
		if !ProcessAlive(pid) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s (pid %d) still runs", name, pid)
		case <-ticker.C:
		}
	}
}

func TestStartServesTheAPI(t *testing.T) {
	env := New(t, Options{})
	t.Logf("kube-apiserver ready %s after start", env.APIServerStartup.Round(time.Millisecond))
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := client.CoreV1().Namespaces().Get(t.Context(), "kube-system", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading kube-system through the admin config: %v", err)
	}
	if ns.Name != "kube-system" {
		t.Errorf("got namespace %q", ns.Name)
	}
	if _, err := os.Stat(env.KubeconfigPath); err != nil {
		t.Errorf("admin kubeconfig: %v", err)
	}
	out, err := exec.CommandContext(t.Context(), filepath.Join(env.BinDir, "kubectl"),
		"--kubeconfig", env.KubeconfigPath, "auth", "can-i", "*", "*").CombinedOutput()
	if err != nil || string(out) != "yes\n" {
		t.Errorf("kubectl auth can-i with the admin kubeconfig: %q, %v", out, err)
	}
}

func TestStopIsIdempotent(t *testing.T) {
	env, err := Start(t.Context(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	pids := env.PIDs()
	if err := env.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := env.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	for name, pid := range pids {
		waitGone(t, name, pid)
	}
}

func TestBinDirErrors(t *testing.T) {
	empty := t.TempDir()
	tests := []struct {
		name    string
		kubeBin string
		assets  string
		wantErr string
	}{
		{name: "nothing set says how to build", wantErr: "neither GATEHOUSE_KUBE_BIN nor KUBEBUILDER_ASSETS is set"},
		{name: "missing binary is named", kubeBin: empty, wantErr: "has no executable etcd"},
		{name: "KUBEBUILDER_ASSETS is used when GATEHOUSE_KUBE_BIN is unset", assets: empty, wantErr: "KUBEBUILDER_ASSETS=" + empty},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(BinDirEnv, tt.kubeBin)
			t.Setenv("KUBEBUILDER_ASSETS", tt.assets)
			_, err := BinDir()
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}
