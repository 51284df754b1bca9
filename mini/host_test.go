package mini

import (
	"os"
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
		t.Skipf("no mount namespace to read: %v", err)
	}
	if len(pidsInMountNS(own)) == 0 {
		t.Fatal("this process is in no mount namespace: the test checks nothing")
	}
	n := NodeRecord{Name: "cp-0", Dir: t.TempDir(), NetNS: "gh-no-such-namespace", AgentMountNS: own, AgentPID: os.Getpid()}
	if pids := nodeMountNSPIDs(n); len(pids) != 0 {
		t.Fatalf("the namespace of a gone node, now the host's, yields processes %v", pids)
	}
}
