package bootstrapper

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
)

// runCommand runs bin with args and returns its combined output; an error
// names the command and its exit status.
func runCommand(ctx context.Context, bin string, args ...string) ([]byte, error) {
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		sub := ""
		if len(args) > 0 {
			sub = " " + args[0]
		}
		return out, fmt.Errorf("%s%s: %w", bin, sub, err)
	}
	return out, nil
}

// removeFile removes path; a missing file is not an error.
func removeFile(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
