package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// stopGrace is how long a process gets to exit after SIGTERM before SIGKILL.
const stopGrace = 10 * time.Second

// process is one started binary of the environment. It runs in its own
// process group, dies with the test process (PR_SET_PDEATHSIG), and writes its
// output to <name>.log in the environment directory.
type process struct {
	name    string
	dir     string
	bin     string
	args    []string
	env     []string // the whole environment; nil inherits the test's
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
	err     error         // exit error, valid after done is closed

	stopOnce sync.Once
}

// startProcess starts bin with args; its output goes to dir/<name>.log.
func startProcess(name, dir, bin string, args ...string) (*process, error) {
	return startProcessEnv(name, dir, bin, nil, args...)
}

// startProcessEnv is startProcess with env (KEY=value entries) as the
// process's whole environment; nil inherits the test's.
func startProcessEnv(name, dir, bin string, env []string, args ...string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating log for %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Dir = dir
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid: true,
		// If the test binary dies without running its cleanups (test timeout,
		// SIGKILL), the kernel kills the children too.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	p := &process{name: name, dir: dir, bin: bin, args: args, env: env, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// pid returns the process ID.
func (p *process) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop terminates the process group: SIGTERM, then SIGKILL after stopGrace.
// It is safe to call more than once and returns once the process is gone.
func (p *process) stop() {
	p.stopOnce.Do(func() {
		if p.exited() {
			return
		}
		pgid := p.pid()
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		timer := time.NewTimer(stopGrace)
		defer timer.Stop()
		select {
		case <-p.done:
		case <-timer.C:
		}
		// Also reaps anything left in the group after the leader exited.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	})
}

// restart stops the process and starts the same command again; its log
// continues in the same file.
func (p *process) restart() (*process, error) {
	p.stop()
	return startProcessEnv(p.name, p.dir, p.bin, p.env, p.args...)
}

// logTail returns the last n bytes of the process's log, for error messages.
func (p *process) logTail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(log unreadable: %v)", err)
	}
	if len(data) > n {
		data = data[len(data)-n:]
		// Drop the partial first line, unless it is all there is.
		if i := bytes.IndexByte(data, '\n'); i >= 0 && i+1 < len(data) {
			data = data[i+1:]
		}
	}
	return string(data)
}

// errExited is returned by waitReady when the process exits before it is ready.
var errExited = errors.New("process exited before it became ready")

// waitReady polls ready every interval until it returns nil, the process
// exits, or ctx ends. The error carries the tail of the process's log.
func (p *process) waitReady(ctx context.Context, interval time.Duration, ready func(context.Context) error) error {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	var last error
	for {
		if last = ready(ctx); last == nil {
			return nil
		}
		select {
		case <-p.done:
			exit := p.err
			if exit == nil {
				exit = errors.New("exit status 0")
			}
			return fmt.Errorf("%s: %w (%w); log tail:\n%s", p.name, errExited, exit, p.logTail(4096))
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s to become ready: %w (last check: %w); log tail:\n%s",
				p.name, ctx.Err(), last, p.logTail(4096))
		case <-ticker.C:
		}
	}
}

// freePorts reserves n distinct free TCP ports on 127.0.0.1. The listeners are
// closed before returning, so a port may in rare cases be taken by another
// process before the component binds it; Start retries in that case.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	listeners := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("reserving a loopback port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
