package mini

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckPrerequisitesNamesWhatIsMissing: with nothing on PATH, every
// missing program is named with the package that provides it.
func TestCheckPrerequisitesNamesWhatIsMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := CheckPrerequisites()
	if err == nil {
		t.Fatal("no prerequisite reported missing with an empty PATH")
	}
	for _, want := range []string{
		"containerd missing: apt-get install containerd",
		"swtpm missing: apt-get install swtpm swtpm-tools",
		"cryptsetup missing: apt-get install cryptsetup-bin",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// TestMountsNodeRoot: a process is a node's when it has the node's root
// directory mounted over /etc/kubernetes, wherever the node's directory's
// file system is mounted; another node's, or another cluster's node of the
// same name, does not count.
func TestMountsNodeRoot(t *testing.T) {
	const info = `22 1 254:0 / / rw,relatime - ext4 /dev/vda rw
812 22 254:0 /tmp/TestMiniCluster1/002/mini/nodes/cp-0/root/etc/kubernetes /etc/kubernetes rw,relatime - ext4 /dev/vda rw
813 22 254:0 /tmp/TestMiniCluster1/002/mini/nodes/cp-0/root/var/lib/kubelet /var/lib/kubelet rw,relatime - ext4 /dev/vda rw
`
	const separate = `900 22 254:1 /gatehouse-mini/nodes/worker-1/root/etc/kubernetes /etc/kubernetes rw - ext4 /dev/vdb rw
`
	tests := []struct {
		info, dir string
		want      bool
	}{
		{info, "/tmp/TestMiniCluster1/002/mini/nodes/cp-0", true},
		{info, "/var/lib/gatehouse-mini/nodes/cp-0", false},
		{info, "/tmp/TestMiniCluster1/002/mini/nodes/cp-1", false},
		{separate, "/var/lib/gatehouse-mini/nodes/worker-1", true}, // /var/lib on a file system of its own
		{separate, "/var/lib/gatehouse-mini/nodes/worker-2", false},
		{"22 1 254:0 / / rw - ext4 /dev/vda rw\n", "/var/lib/gatehouse-mini/nodes/cp-0", false},
		// After mini down removed the directory, a survivor's mounts say so.
		{"812 22 254:0 /var/lib/gatehouse-mini/nodes/cp-0/root/etc/kubernetes//deleted /etc/kubernetes rw - ext4 /dev/vda rw\n", "/var/lib/gatehouse-mini/nodes/cp-0", true},
	}
	for _, tt := range tests {
		if got := mountsNodeRoot([]byte(tt.info), tt.dir); got != tt.want {
			t.Errorf("mountsNodeRoot(%q) = %v, want %v", tt.dir, got, tt.want)
		}
	}
}

// TestStaleMountNamespaceLeftAlone: a recorded mount namespace whose number
// now names another namespace (the kernel reuses them: here the test's
// own, which no node's network namespace or root directory is in) yields no
// process to stop, so `mini down` of a cluster whose nodes are gone never
// kills another cluster's processes, or the host's.
func TestStaleMountNamespaceLeftAlone(t *testing.T) {
	own, err := mountNS(os.Getpid())
	if err != nil {
		// Linux with /proc, as root: where mini runs, and CI.
		t.Fatalf("reading this process's mount namespace: %v", err)
	}
	if len(pidsInMountNS(own)) == 0 {
		t.Fatal("this process is in no mount namespace: the test checks nothing")
	}
	n := NodeRecord{Name: "cp-0", Dir: t.TempDir(), NetNS: "gh-no-such-namespace", AgentMountNS: own, AgentPID: os.Getpid()}
	if pids := nodeMountNSPIDs(n); len(pids) != 0 {
		t.Fatalf("the namespace of a gone node, now the host's, yields processes %v", pids)
	}
}

func TestRaiseSysctl(t *testing.T) {
	for _, tc := range []struct {
		name, content string
		min           int
		wantWas       int
		wantRaised    bool
		wantFile      string
		wantErr       string
	}{
		{name: "kernel default raised", content: "128\n", min: 1024, wantWas: 128, wantRaised: true, wantFile: "1024\n"},
		{name: "enough left alone", content: "8192\n", min: 1024, wantWas: 8192, wantFile: "8192\n"},
		{name: "equal left alone", content: "1024\n", min: 1024, wantWas: 1024, wantFile: "1024\n"},
		{name: "not a number", content: "many\n", min: 1024, wantFile: "many\n", wantErr: `"many\n" is not a number`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "max_user_instances")
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			was, raised, err := raiseSysctl(path, tc.min)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("raiseSysctl: error %v, want one containing %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatalf("raiseSysctl: %v", err)
			}
			if was != tc.wantWas || raised != tc.wantRaised {
				t.Errorf("raiseSysctl = %d, %t; want %d, %t", was, raised, tc.wantWas, tc.wantRaised)
			}
			if b, err := os.ReadFile(path); err != nil || string(b) != tc.wantFile {
				t.Errorf("file holds %q (%v), want %q", b, err, tc.wantFile)
			}
		})
	}
	if _, _, err := raiseSysctl(filepath.Join(t.TempDir(), "missing"), 1); err == nil {
		t.Error("raiseSysctl of a missing file: no error")
	}
}
