package build

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// tool is a program the build runs and the Debian package that has it.
type tool struct {
	name, pkg string
}

// rootfsTools make the root file system; assemblyTools make the image from
// it (hack/setup.sh --image installs their packages).
func rootfsTools() []tool {
	return []tool{{"debootstrap", "debootstrap"}, {"chroot", "coreutils"}, {"mount", "mount"}}
}

func assemblyTools() []tool {
	return []tool{
		{"mksquashfs", "squashfs-tools"}, {"veritysetup", "cryptsetup-bin"}, {"objcopy", "binutils"},
		{"sfdisk", "fdisk"}, {"mkfs.vfat", "dosfstools"}, {"mmd", "mtools"}, {"mcopy", "mtools"},
	}
}

func allTools() []tool { return append(rootfsTools(), assemblyTools()...) }

// lookTool finds name in PATH, then in /usr/sbin and /sbin: a user's PATH
// often lacks them, and most of the tools live there.
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w", name, exec.ErrNotFound)
}

// checkTools returns an error naming every missing program and the Debian
// packages to install, or nil.
func checkTools(look func(string) (string, error), tools []tool) error {
	var missing, pkgs []string
	for _, t := range tools {
		if _, err := look(t.name); err != nil {
			missing = append(missing, fmt.Sprintf("%s (Debian package %s)", t.name, t.pkg))
			if !slices.Contains(pkgs, t.pkg) {
				pkgs = append(pkgs, t.pkg)
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("the image build needs programs that are missing: %s; install them with `hack/setup.sh --image` or `apt-get install %s`",
		strings.Join(missing, ", "), strings.Join(pkgs, " "))
}

// command describes one program run.
type command struct {
	// dir is the working directory; env, when not nil, the whole
	// environment.
	dir string
	env []string
	// unshareMount runs the program in a mount namespace of its own, whose
	// mounts vanish when its last process ends.
	unshareMount bool
	// stdin is the program's standard input.
	stdin string
}

// run runs name (looked up with lookTool) with args and returns its
// standard output; the error carries the end of its standard error (or
// output).
func run(ctx context.Context, c command, name string, args ...string) ([]byte, error) {
	path, err := lookTool(name)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir, cmd.Env = c.dir, c.env
	if c.stdin != "" {
		cmd.Stdin = strings.NewReader(c.stdin)
	}
	if c.unshareMount {
		cmd.SysProcAttr = unshareMountAttr()
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := stderr.Bytes()
		if len(bytes.TrimSpace(msg)) == 0 {
			msg = stdout.Bytes()
		}
		return nil, fmt.Errorf("%s: %w: %s", name, err, tail(msg, 2048))
	}
	return stdout.Bytes(), nil
}

// tail returns the last n bytes of b, trimmed, from a line start.
func tail(b []byte, n int) string {
	b = bytes.TrimSpace(b)
	if len(b) > n {
		b = b[len(b)-n:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
		return "…" + string(b)
	}
	return string(b)
}
