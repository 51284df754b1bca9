package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// TestManagerAcceptsArgs runs the real gatehouse-capi-bootstrap binary with
// the Deployment's arguments (variables at their defaults) and --version,
// which prints the version and exits after every flag has been parsed, so
// an argument the binary does not define fails without a cluster. Values
// are only checked for their flag type (an int for --concurrency): checks
// made after parsing, like --log-level's, do not run.
func TestManagerAcceptsArgs(t *testing.T) {
	bin := testenv.BuildBinary(t, "github.com/gatehouse-dev/gatehouse/cmd/gatehouse-capi-bootstrap")
	args := managerArgs(t, defaultObjects(t))
	for _, tc := range []struct {
		name string
		args []string
		want string // in the output of a failed run; "" means success
	}{
		{"the Deployment's arguments parse", args, ""},
		{"an argument the binary does not define fails", append(slices.Clone(args), "--no-such-flag=1"), "flag provided but not defined: -no-such-flag"},
		{"a concurrency that is not a number fails", append(slices.Clone(args), "--concurrency=ten"), `invalid value "ten" for flag -concurrency`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := exec.CommandContext(t.Context(), bin, append(tc.args, "--version")...).CombinedOutput()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("%s %q: %v\n%s", bin, tc.args, err, out)
			case tc.want == "" && strings.TrimSpace(string(out)) == "":
				t.Fatalf("%s %q --version printed nothing", bin, tc.args)
			case tc.want != "" && (err == nil || !strings.Contains(string(out), tc.want)):
				t.Fatalf("%s %q: %v, output %q; want a failure saying %q", bin, tc.args, err, out, tc.want)
			}
		})
	}
}
