package render

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/render/rendertest"
)

// commandScript is the shell script the machine runs for data: for
// cloud-config, runcmd as cloud-init's own shellify writes it (one sh
// script); for Ignition, the commands unit's script.
func commandScript(t *testing.T, format bootstrapv1.Format, data []byte) string {
	t.Helper()
	if format == bootstrapv1.FormatIgnition {
		script, ok := rendertest.Files(t, format, data)[commandsScriptPath]
		if !ok {
			t.Fatalf("the Ignition data writes no %s", commandsScriptPath)
		}
		return string(script)
	}
	var cfg struct {
		RunCmd any `json:"runcmd"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("parsing the cloud-config: %v", err)
	}
	runcmd, err := yaml.Marshal(cfg.RunCmd)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "runcmd.json")
	if err := os.WriteFile(f, runcmd, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), cloudInitPython(t), "-c",
		"import sys, yaml; from cloudinit import util; sys.stdout.write(util.shellify(yaml.safe_load(open(sys.argv[1]))))", f).Output()
	if err != nil {
		t.Fatalf("cloud-init's shellify: %v", err)
	}
	return string(out)
}

// cloudInitPython is the interpreter cloud-init runs with (its script's
// #! line), whose path has the cloudinit package.
func cloudInitPython(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("cloud-init")
	if err != nil {
		t.Fatalf("cloud-init is not installed (.ci/run installs it): %v", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	interpreter, ok := strings.CutPrefix(line, "#!")
	if !ok {
		t.Fatalf("%s starts with %q, not a #! line", path, line)
	}
	return strings.Fields(interpreter)[0]
}

// TestCommandsStopAtFirstFailure runs the data's commands (cloud-init's
// runcmd script, Ignition's script) with a kubeadm that succeeds or fails
// and pre-/post-kubeadm commands: the success sentinel, which Cluster API
// reads as "bootstrapped", is written only when every command succeeded,
// and nothing runs after a failure (CABPK chains the sentinel to kubeadm).
func TestCommandsStopAtFirstFailure(t *testing.T) {
	for _, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
		for _, tc := range []struct {
			name          string
			pre           string
			kubeadmStatus int
			wantSentinel  bool
			wantPost      bool
		}{
			{name: "all succeed", pre: "true", wantSentinel: true, wantPost: true},
			{name: "kubeadm fails", pre: "true", kubeadmStatus: 1},
			{name: "a pre-kubeadm command fails", pre: "false"},
		} {
			t.Run(string(format)+"/"+tc.name, func(t *testing.T) {
				dir := t.TempDir()
				post := filepath.Join(dir, "post-ran")
				s := &bootstrapv1.KubeadmConfigSpec{Format: format, PreKubeadmCommands: []string{tc.pre},
					PostKubeadmCommands: []string{"touch " + post}}
				data, err := Render(input(s, RoleJoin))
				if err != nil {
					t.Fatalf("Render: %v", err)
				}
				// The machine's paths point into dir: the install script
				// becomes true, the sentinel's directory dir/run.
				script := commandScript(t, format, data)
				script = strings.ReplaceAll(script, installScriptPath, "true")
				script = strings.ReplaceAll(script, filepath.Dir(sentinelPath), filepath.Join(dir, "run"))
				bin := filepath.Join(dir, "bin")
				if err := os.Mkdir(bin, 0o755); err != nil {
					t.Fatal(err)
				}
				kubeadm := "#!/bin/sh\nexit " + string(rune('0'+tc.kubeadmStatus)) + "\n"
				if err := os.WriteFile(filepath.Join(bin, "kubeadm"), []byte(kubeadm), 0o755); err != nil {
					t.Fatal(err)
				}
				cmd := exec.CommandContext(t.Context(), "/bin/sh", "-c", script)
				cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
				out, runErr := cmd.CombinedOutput()
				_, statErr := os.Stat(filepath.Join(dir, "run", filepath.Base(sentinelPath)))
				if gotSentinel := statErr == nil; gotSentinel != tc.wantSentinel {
					t.Errorf("sentinel written: %v, want %v (script error %v, output %q)\n%s", gotSentinel, tc.wantSentinel, runErr, out, script)
				}
				if (runErr == nil) != tc.wantSentinel {
					t.Errorf("script error %v, want it to fail exactly when the sentinel is not written", runErr)
				}
				_, statErr = os.Stat(post)
				if gotPost := statErr == nil; gotPost != tc.wantPost {
					t.Errorf("post-kubeadm command ran: %v, want %v", gotPost, tc.wantPost)
				}
			})
		}
	}
}
