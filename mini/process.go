package mini

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// process is a child the agent runs.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// processes are the agent's children, stopped together.
type processes struct {
	log *slog.Logger
	dir string

	mu   sync.Mutex
	list []*process
}

// start runs bin with args, its output appended to <dir>/<name>.log. The
// child is killed if the agent dies.
func (ps *processes) start(ctx context.Context, name, bin string, args ...string) *process {
	p := &process{name: name, done: make(chan struct{})}
	logFile, err := os.OpenFile(filepath.Join(ps.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644) //nolint:gosec // logs hold no secrets
	if err != nil {
		p.err = err
		close(p.done)
		return p
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		_ = logFile.Close()
		p.err = err
		close(p.done)
		ps.log.Error("Starting a process failed", "process", name, "error", err.Error())
		return p
	}
	ps.mu.Lock()
	ps.list = append(ps.list, p)
	ps.mu.Unlock()
	go func() {
		p.err = p.cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	go func() {
		select {
		case <-ctx.Done():
			p.stop()
		case <-p.done:
		}
	}()
	return p
}

// stop sends SIGTERM, and SIGKILL after 10 s.
func (p *process) stop() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// stopAll stops every process, newest first.
func (ps *processes) stopAll() {
	ps.mu.Lock()
	list := append([]*process(nil), ps.list...)
	ps.mu.Unlock()
	for i := len(list) - 1; i >= 0; i-- {
		list[i].stop()
	}
}
