package build

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/bootstrapper/statedisk"
)

func testRootHash(t *testing.T) []byte {
	t.Helper()
	h, err := hex.DecodeString("0123456789abcdef00112233445566778899aabbccddeeff0f1e2d3c4b5a6978")
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestCmdline(t *testing.T) {
	rootHash := testRootHash(t)
	l := newLayout(rootHash, 100*mib+5, 3*mib)
	cp := cmdline(hex.EncodeToString(rootHash), l, roleControlPlane)
	w := cmdline(hex.EncodeToString(rootHash), l, roleWorker)
	tests := []struct {
		name string
		want string
	}{
		{"root is the dm-verity device, read-only", "root=/dev/mapper/root ro rootfstype=squashfs "},
		{"root hash", " roothash=" + hex.EncodeToString(rootHash) + " "},
		{"data partition by the root hash's first half", " gatehouse.verity.data=PARTUUID=01234567-89ab-cdef-0011-223344556677 "},
		{"hash partition by the root hash's second half", " gatehouse.verity.hash=PARTUUID=8899aabb-ccdd-eeff-0f1e-2d3c4b5a6978 "},
		{"systemd's verity generator stays off", " systemd.verity=no "},
		{"the role", " gatehouse.role=controlPlane "},
		{"serial console and reboot after a panic", " console=ttyS0 panic=10"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(cp+" ", tt.want) && !strings.HasSuffix(cp, tt.want) {
				t.Errorf("command line %q lacks %q", cp, tt.want)
			}
		})
	}
	t.Run("roles differ only in gatehouse.role", func(t *testing.T) {
		if got := strings.Replace(w, "gatehouse.role=worker", "gatehouse.role=controlPlane", 1); got != cp {
			t.Errorf("worker %q\ncontrol plane %q", w, cp)
		}
	})
	t.Run("nothing node-specific", func(t *testing.T) {
		for _, f := range strings.Fields(cp) {
			if k, _, _ := strings.Cut(f, "="); slices.Contains([]string{"ip", "hostname", "gatehouse.node", "systemd.hostname"}, k) {
				t.Errorf("command line has %s", f)
			}
		}
	})
}

func TestLayout(t *testing.T) {
	rootHash := testRootHash(t)
	l := newLayout(rootHash, 100*mib+5, 3*mib-1)
	parts := l.partitions()
	for i, p := range parts {
		if p.start%mib != 0 || p.size%mib != 0 {
			t.Errorf("partition %s at %d, %d bytes: not aligned to 1 MiB", p.name, p.start, p.size)
		}
		if i > 0 && p.start != parts[i-1].start+parts[i-1].size {
			t.Errorf("partition %s starts at %d, not after %s", p.name, p.start, parts[i-1].name)
		}
	}
	if l.esp.start != mib || l.esp.size != espSize {
		t.Errorf("ESP at %d, %d bytes", l.esp.start, l.esp.size)
	}
	if l.root.size != 101*mib || l.verity.size != 3*mib {
		t.Errorf("root %d bytes, verity %d bytes: want sizes rounded up to MiB", l.root.size, l.verity.size)
	}
	if want := l.verity.start + l.verity.size + mib; l.size != want {
		t.Errorf("disk size %d, want %d (room for the backup GPT)", l.size, want)
	}
	if l.root.typeGUID != "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709" || l.verity.typeGUID != "2C7357ED-EBD2-46D9-AEC1-23D437EC2BF5" {
		t.Errorf("partition types %s, %s are not DPS root-x86-64 and root-x86-64-verity", l.root.typeGUID, l.verity.typeGUID)
	}
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	for _, id := range []string{l.diskGUID, l.esp.uuid} {
		if !uuid.MatchString(id) {
			t.Errorf("derived GUID %s is no version 4 UUID", id)
		}
	}
	if l2 := newLayout(rootHash, 100*mib+5, 3*mib-1); l2 != l {
		t.Errorf("the same inputs gave another layout:\n%+v\n%+v", l, l2)
	}
	other := slices.Clone(rootHash)
	other[31] ^= 1
	if l3 := newLayout(other, 100*mib+5, 3*mib-1); l3.diskGUID == l.diskGUID || l3.esp.uuid == l.esp.uuid || l3.verity.uuid == l.verity.uuid {
		t.Error("another root hash gave the same GUIDs")
	}
	script := l.sfdiskScript()
	for _, want := range []string{
		"label: gpt\n", "label-id: " + l.diskGUID + "\n", "first-lba: 2048\n",
		`start=2048, size=131072, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, uuid=` + l.esp.uuid + `, name="esp"` + "\n",
		`start=133120, size=206848, type=4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709, uuid=01234567-89ab-cdef-0011-223344556677, name="root-x86-64", attrs="GUID:60"` + "\n",
	} {
		if !strings.Contains(script, want) {
			t.Errorf("sfdisk script lacks %q:\n%s", want, script)
		}
	}
}

func TestUKILayout(t *testing.T) {
	vmas := ukiLayout(0x19134, []int64{0x10b, 0x1000, 0x7d77c0, 5})
	want := []uint64{0x1a000, 0x1b000, 0x1c000, 0x7f4000}
	if !slices.Equal(vmas, want) {
		t.Errorf("section addresses %#x, want %#x", vmas, want)
	}
}

func TestCacheKeys(t *testing.T) {
	t.Run("root file system key depends on the mirror only among inputs", func(t *testing.T) {
		if first, again := rootFSKey(DefaultMirror), rootFSKey(DefaultMirror); first != again {
			t.Error("the same mirror gave two keys")
		}
		if rootFSKey(DefaultMirror) == rootFSKey("http://mirror.example/debian") {
			t.Error("another mirror gave the same key")
		}
	})
	base := assemblyInputs{
		root:         &rootFS{Digest: "aa", SourceDateEpoch: 1},
		kube:         []binary{{Name: "kubelet", Path: "/usr/local/bin/kubelet", SHA256: "bb"}},
		bootstrapper: binary{Name: "gatehouse-bootstrapper", Path: bootstrapperPath, SHA256: "cc"},
	}
	key := func(in assemblyInputs) string {
		k, err := in.key()
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	want := key(base)
	if key(base) != want {
		t.Fatal("the same inputs gave two keys")
	}
	changes := map[string]func(in *assemblyInputs){
		"root file system": func(in *assemblyInputs) { in.root = &rootFS{Digest: "ab", SourceDateEpoch: 1} },
		"epoch":            func(in *assemblyInputs) { in.root = &rootFS{Digest: "aa", SourceDateEpoch: 2} },
		"kubelet": func(in *assemblyInputs) {
			in.kube = []binary{{Name: "kubelet", Path: "/usr/local/bin/kubelet", SHA256: "bc"}}
		},
		"bootstrapper": func(in *assemblyInputs) { in.bootstrapper.SHA256 = "cd" },
	}
	for name, change := range changes {
		t.Run("a changed "+name+" changes the assembly key", func(t *testing.T) {
			in := base
			change(&in)
			if key(in) == want {
				t.Errorf("key %s did not change", want)
			}
		})
	}
}

func TestTreeDigest(t *testing.T) {
	newTree := func(t *testing.T) string {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "etc/a"), []byte("a"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("a", filepath.Join(dir, "etc/b")); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	digest := func(t *testing.T, dir string) string {
		d, err := treeDigest(dir)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	want := digest(t, newTree(t))
	tests := map[string]struct {
		change  func(dir string) error
		changes bool
	}{
		"the same tree elsewhere": {func(string) error { return nil }, false},
		"a newer time stamp": {func(dir string) error {
			t1 := time.Unix(2e9, 0)
			return os.Chtimes(filepath.Join(dir, "etc/a"), t1, t1)
		}, false},
		"changed content":     {func(dir string) error { return os.WriteFile(filepath.Join(dir, "etc/a"), []byte("b"), 0o644) }, true},
		"changed permissions": {func(dir string) error { return os.Chmod(filepath.Join(dir, "etc/a"), 0o600) }, true},
		"another link target": {func(dir string) error {
			if err := os.Remove(filepath.Join(dir, "etc/b")); err != nil {
				return err
			}
			return os.Symlink("c", filepath.Join(dir, "etc/b"))
		}, true},
		"a new empty directory": {func(dir string) error { return os.Mkdir(filepath.Join(dir, "var"), 0o755) }, true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			dir := newTree(t)
			if err := tt.change(dir); err != nil {
				t.Fatal(err)
			}
			if got := digest(t, dir); (got != want) != tt.changes {
				t.Errorf("digest changed: %t, want %t", got != want, tt.changes)
			}
		})
	}
}

func TestReleaseEpoch(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"a_dists_bookworm_InRelease":          "-----BEGIN PGP SIGNED MESSAGE-----\nOrigin: Debian\nDate: Sat, 11 Jul 2026 10:16:37 UTC\n",
		"b_dists_bookworm-security_InRelease": "Origin: Debian\nDate: Fri, 27 Nov 2026 02:10:32 UTC\n",
		"c_Packages":                          "Date: Sun, 29 Nov 2026 00:00:00 UTC\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := releaseEpoch(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(1795745432); got != want {
		t.Errorf("epoch %d, want %d (the newest Release file's Date)", got, want)
	}
	if _, err := releaseEpoch(t.TempDir()); err == nil {
		t.Error("no Release file gave no error")
	}
}

func TestSourcesList(t *testing.T) {
	got := sourcesList(DefaultMirror)
	want := "deb http://deb.debian.org/debian bookworm main\ndeb http://deb.debian.org/debian bookworm-updates main\n" +
		"deb http://deb.debian.org/debian-security bookworm-security main\n"
	if got != want {
		t.Errorf("sources.list\n%s\nwant\n%s", got, want)
	}
	if got := sourcesList("http://mirror.example/archive/"); strings.Contains(got, "security") {
		t.Errorf("a mirror without …/debian got a security archive:\n%s", got)
	}
}

func TestCheckTools(t *testing.T) {
	have := map[string]bool{"debootstrap": true, "chroot": true, "mount": true, "objcopy": true, "sfdisk": true, "mkfs.vfat": true}
	look := func(name string) (string, error) {
		if have[name] {
			return "/usr/bin/" + name, nil
		}
		return "", exec.ErrNotFound
	}
	err := checkTools(look, allTools())
	if err == nil {
		t.Fatal("missing tools gave no error")
	}
	for _, want := range []string{"mksquashfs (Debian package squashfs-tools)", "veritysetup (Debian package cryptsetup-bin)",
		"mmd (Debian package mtools)", "apt-get install squashfs-tools cryptsetup-bin mtools"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	for name := range map[string]bool{"mksquashfs": true, "veritysetup": true, "mmd": true, "mcopy": true} {
		have[name] = true
	}
	if err := checkTools(look, allTools()); err != nil {
		t.Errorf("all tools present: %v", err)
	}
}

// TestStateDirsAreTheBootstrappers keeps the image's mount points of the
// state disk those the bootstrapper binds it over.
func TestStateDirsAreTheBootstrappers(t *testing.T) {
	if !slices.Equal(stateDirs(), statedisk.StateDirs) {
		t.Errorf("the image has state directories %v, the bootstrapper binds %v", stateDirs(), statedisk.StateDirs)
	}
}

// TestUnitFlagsExist checks that every flag the bootstrapper's unit passes
// is one the bootstrapper defines (its flags.go), and that the provisioning
// script passes only flags it defines.
func TestUnitFlagsExist(t *testing.T) {
	src, err := os.ReadFile("../../cmd/gatehouse-bootstrapper/flags.go")
	if err != nil {
		t.Fatal(err)
	}
	unit, err := recipeFS.ReadFile(recipeRoot + "/usr/lib/systemd/system/gatehouse-bootstrapper.service")
	if err != nil {
		t.Fatal(err)
	}
	script, err := recipeFS.ReadFile(recipeRoot + "/usr/lib/gatehouse/provision")
	if err != nil {
		t.Fatal(err)
	}
	flags := regexp.MustCompile(`--([a-z][a-z-]+)`).FindAllSubmatch(append(unit, script...), -1)
	if len(flags) < 10 {
		t.Fatalf("found only %d flags in the unit and the provisioning script", len(flags))
	}
	for _, f := range flags {
		if name := f[1]; !bytes.Contains(src, []byte(`"`+string(name)+`"`)) {
			t.Errorf("the node image passes --%s, which gatehouse-bootstrapper does not define", name)
		}
	}
}

func TestRecipeFilesAreExecutableWhereNeeded(t *testing.T) {
	tree := t.TempDir()
	if err := writeRecipeFiles(tree); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"usr/lib/gatehouse/provision", "etc/initramfs-tools/hooks/gatehouse-verity", "etc/initramfs-tools/scripts/local-top/gatehouse-verity"} {
		fi, err := os.Stat(filepath.Join(tree, f))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o755 {
			t.Errorf("%s has mode %v, want 0755", f, fi.Mode().Perm())
		}
	}
	fi, err := os.Stat(filepath.Join(tree, "etc/fstab"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("etc/fstab has mode %v, want 0644", fi.Mode().Perm())
	}
	fstab, _ := os.ReadFile(filepath.Join(tree, "etc/fstab"))
	// The bootstrapper binds the state disk only over a directory that is
	// no mount point yet (statedisk.Volume): a tmpfs of their own would keep
	// the node's state in memory.
	for _, d := range stateDirs() {
		if bytes.Contains(fstab, []byte("\t"+d+"\t")) {
			t.Errorf("/etc/fstab mounts something on %s, where the state disk belongs", d)
		}
	}
	if _, err := recipeDigest(); err != nil {
		t.Fatal(err)
	}
	if err := writeRecipeFiles(tree); err != nil && !errors.Is(err, os.ErrExist) {
		t.Errorf("writing the recipe over itself: %v", err)
	}
}

func TestPruneBuilds(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ages := map[string]time.Duration{
		"a": time.Minute, "b": time.Hour, "c": 2 * time.Hour, // the 3 most recently used
		"d":     3 * time.Hour,  // used within keepUsed
		"e":     48 * time.Hour, // old: removed
		"f.tmp": 72 * time.Hour, // an assembly in progress: kept
	}
	for name, age := range ages {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(filepath.Join(dir, name), now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pruneBuilds(dir, keepBuilds, now.Add(-keepUsed)); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if want := []string{"a", "b", "c", "d", "f.tmp"}; !slices.Equal(left, want) {
		t.Errorf("left %v, want %v", left, want)
	}
}

func TestLockCacheWaitsUntilContextEnds(t *testing.T) {
	dir := t.TempDir()
	unlock, err := lockCache(t.Context(), dir, newProgress(nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	if _, err := lockCache(ctx, dir, newProgress(nil)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second lock while the first is held: %v, want the context's deadline", err)
	}
	unlock()
	again, err := lockCache(t.Context(), dir, newProgress(nil))
	if err != nil {
		t.Fatalf("the lock after its release: %v", err)
	}
	again()
}

// TestContainerdHostsDirOnStateDisk: the directory the bootstrapper's unit
// writes an image mirror's containerd hosts files into
// (--containerd-hosts-dir) is the one the image's containerd reads them
// from (config_path), and it lies on the state disk: the root is
// read-only, and a tmpfs would lose the files at a reboot.
func TestContainerdHostsDirOnStateDisk(t *testing.T) {
	unit, err := recipeFS.ReadFile(recipeRoot + "/usr/lib/systemd/system/gatehouse-bootstrapper.service")
	if err != nil {
		t.Fatal(err)
	}
	config, err := recipeFS.ReadFile(recipeRoot + "/etc/containerd/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	flag := regexp.MustCompile(`--containerd-hosts-dir[ =](\S+)`).FindAllSubmatch(unit, -1)
	if len(flag) != 1 {
		t.Fatalf("the bootstrapper's unit passes --containerd-hosts-dir %d times, want once", len(flag))
	}
	// config_path in the CRI plugin's registry table (containerd 1.6,
	// config version 2).
	path := regexp.MustCompile(`(?m)^\s*\[plugins\."io\.containerd\.grpc\.v1\.cri"\.registry\]\s*\n\s*config_path = "([^"]+)"`).FindAllSubmatch(config, -1)
	if len(path) != 1 {
		t.Fatalf("the image's containerd configuration sets the CRI registry's config_path %d times, want once:\n%s", len(path), config)
	}
	dir := string(flag[0][1])
	if got := string(path[0][1]); got != dir {
		t.Errorf("containerd reads hosts files from %s, the bootstrapper writes them to %s", got, dir)
	}
	if !slices.ContainsFunc(stateDirs(), func(d string) bool { return strings.HasPrefix(dir, d+"/") }) {
		t.Errorf("the hosts files' directory %s is not on the state disk (%v)", dir, stateDirs())
	}
}
