package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/gatehouse-dev/gatehouse/image/qemu"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
)

// imageRunOptions are the flags of `gatehouse image run`.
type imageRunOptions struct {
	dir, tpmCA, stateDisk string
	stateSizeGiB          int64
	memoryMiB, cpus       int
	accel                 string
	forwards              []string
	until                 string
	timeout               time.Duration
	quiet                 bool
}

func newImageRunCmd() *cobra.Command {
	var o imageRunOptions
	cmd := &cobra.Command{
		Use:   "run IMAGE",
		Short: "Boot a node image in a local VM with UEFI firmware and a TPM (QEMU, OVMF, swtpm)",
		Long: "Boot a node image (a raw GPT disk from `gatehouse image build`) in a QEMU VM as a machine boots it:\n" +
			"OVMF measures the boot into a software TPM whose endorsement key is certified by a local\n" +
			"manufacturer CA (--tpm-ca), the image is a disk the VM cannot change, and the node's state disk\n" +
			"is a file of its own. The guest's serial console is printed here; its ports are forwarded to\n" +
			"127.0.0.1. KVM is used where /dev/kvm is usable; under software emulation the firmware alone\n" +
			"takes about a minute.\n\n" +
			"Ctrl-C stops the VM; Ctrl-\\ (SIGQUIT) resets it (a measured reboot). With --until the VM stops\n" +
			"once a console line matches, and the command fails if none does within --timeout.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runImage(cmd.Context(), args[0], o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dir, "dir", "", "the VM's directory (TPM, firmware variables, state disk, console log), kept and reused: the same machine again (default: a new temporary one, removed at exit)")
	f.StringVar(&o.tpmCA, "tpm-ca", "", "directory of the local TPM manufacturer CA that certifies the VM's endorsement key, created if missing; a verifier trusts its root (default: <dir>/tpm-ca; the local cluster's is /var/lib/gatehouse-mini/tpm-ca)")
	f.StringVar(&o.stateDisk, "state-disk", "", "the node's state disk, a raw file created when missing (default: <dir>/state.raw)")
	f.Int64Var(&o.stateSizeGiB, "state-size", 4, "size in GiB of a state disk that is created (sparse)")
	f.IntVar(&o.memoryMiB, "memory", 2048, "the VM's memory in MiB")
	f.IntVar(&o.cpus, "cpus", 2, "the VM's virtual CPUs")
	f.StringVar(&o.accel, "accel", "auto", "accelerator: auto (KVM when usable, else TCG), kvm or tcg")
	f.StringSliceVar(&o.forwards, "forward", []string{"9000", "9001"}, "guest TCP ports to reach from this machine: GUEST (on a free local port, printed) or HOST:GUEST; always on 127.0.0.1 (default: the bootstrapper's init and evidence ports)")
	f.StringVar(&o.until, "until", "", "stop the VM once a console line matches this regular expression (RE2), and exit 0")
	f.DurationVar(&o.timeout, "timeout", 15*time.Minute, "with --until: how long to wait for the line")
	f.BoolVar(&o.quiet, "quiet", false, "do not print the console (it is in <dir>/console.log)")
	return cmd
}

// runImage boots the image and runs the VM until a signal, the guest's
// power-off or --until.
func runImage(ctx context.Context, image string, o imageRunOptions, out, errOut io.Writer) (err error) {
	forwards, err := parseForwards(o.forwards)
	if err != nil {
		return err
	}
	accel, err := qemu.ParseAccel(o.accel)
	if err != nil {
		return err
	}
	var until *regexp.Regexp
	if o.until != "" {
		if until, err = regexp.Compile(o.until); err != nil {
			return fmt.Errorf("--until: %w", err)
		}
	}
	if o.stateSizeGiB <= 0 {
		return fmt.Errorf("--state-size %d: give a size in GiB above zero", o.stateSizeGiB)
	}
	log := slog.New(slog.NewTextHandler(errOut, nil))
	dir := o.dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "gatehouse-vm-"); err != nil {
			return err
		}
		defer func() {
			if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
				err = rerr
			}
		}()
	}
	if o.tpmCA == "" {
		o.tpmCA = filepath.Join(dir, "tpm-ca")
	}
	// The VM outlives ctx's cancellation (Ctrl-C) long enough to quit
	// cleanly in Stop; it dies with this process in any case.
	vm, err := qemu.Start(context.WithoutCancel(ctx), qemu.Config{
		Image: image, Dir: dir, StateDisk: o.stateDisk, StateDiskSize: o.stateSizeGiB << 30,
		MemoryMiB: o.memoryMiB, CPUs: o.cpus, Accel: accel, Forwards: forwards,
		TPMCA: swtpm.LocalCA{Dir: o.tpmCA}, Log: log,
	})
	if err != nil {
		return err
	}
	for _, f := range vm.Ports() {
		log.Info("Forwarded", "guest", f.Guest, "address", "127.0.0.1:"+strconv.Itoa(f.Host))
	}
	log.Info("The VM runs", "console", vm.ConsoleLog(), "tpmCA", o.tpmCA, "stop", "Ctrl-C", "reset", "Ctrl-\\")
	printed := make(chan struct{})
	go func() {
		defer close(printed)
		printConsole(vm, out, o.quiet)
	}()
	err = superviseVM(ctx, vm, until, o.timeout, log)
	if serr := vm.Stop(context.WithoutCancel(ctx)); serr != nil && err == nil {
		err = serr
	}
	<-printed
	return err
}

// superviseVM waits for --until's line, the end of ctx (Ctrl-C) or the
// VM's end, and resets the VM on SIGQUIT (Ctrl-\).
func superviseVM(ctx context.Context, vm *qemu.VM, until *regexp.Regexp, timeout time.Duration, log *slog.Logger) error {
	reset := make(chan os.Signal, 1)
	signal.Notify(reset, syscall.SIGQUIT)
	defer signal.Stop(reset)
	matched := make(chan error, 1)
	if until != nil {
		wctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		go func() {
			l, err := vm.WaitForLine(wctx, until)
			switch {
			case errors.Is(err, qemu.ErrExited):
				err = fmt.Errorf("the VM ended before a console line matched --until: %w", err)
			case err == nil:
				log.Info("The console line came", "line", l.Text, "boot", l.Boot, "after", l.At.Round(100*time.Millisecond).String())
			}
			matched <- err
		}()
	}
	for {
		select {
		case err := <-matched:
			return err
		case <-reset:
			if err := vm.Reset(ctx); err != nil {
				return err
			}
		case <-vm.Done():
			if until != nil {
				return <-matched
			}
			log.Info("The VM ended (the guest powered off)")
			return nil
		case <-ctx.Done():
			if until != nil {
				return fmt.Errorf("interrupted before a console line matched --until: %w", ctx.Err())
			}
			log.Info("Stopping the VM")
			return nil
		}
	}
}

// printConsole prints the guest's console lines until the VM ends.
func printConsole(vm *qemu.VM, out io.Writer, quiet bool) {
	next := 0
	for {
		lines, n, more := vm.Console(next)
		next = n
		for _, l := range lines {
			if !quiet {
				fmt.Fprintln(out, l.Text)
			}
		}
		select {
		case <-more:
		case <-vm.Done():
			lines, _, _ := vm.Console(next)
			for _, l := range lines {
				if !quiet {
					fmt.Fprintln(out, l.Text)
				}
			}
			return
		}
	}
}

// parseForwards parses --forward values: "GUEST" or "HOST:GUEST".
func parseForwards(values []string) ([]qemu.Forward, error) {
	var out []qemu.Forward
	for _, v := range values {
		host, guest, ok := strings.Cut(v, ":")
		if !ok {
			host, guest = "0", v
		}
		h, herr := strconv.Atoi(host)
		g, gerr := strconv.Atoi(guest)
		if herr != nil || gerr != nil {
			return nil, fmt.Errorf("--forward %q: write GUEST or HOST:GUEST, e.g. 9000 or 19000:9000", v)
		}
		out = append(out, qemu.Forward{Host: h, Guest: g})
	}
	return out, nil
}
