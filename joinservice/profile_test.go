package joinservice

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"testing"

	"k8s.io/client-go/kubernetes"
)

// envProfile names a directory where BenchmarkJoinStorm writes CPU
// profiles of each phase (join storm, raw creates) of each round: this
// process's (join and key services, the raw-rate client) and
// kube-apiserver's. Profiling costs CPU itself; take the figures from a
// run without it.
const envProfile = "GATEHOUSE_BENCH_PROFILE"

// phaseProfiler profiles the server side over the benchmark's phases.
type phaseProfiler struct {
	dir    string
	client kubernetes.Interface
}

// newPhaseProfiler returns a profiler writing under $GATEHOUSE_BENCH_PROFILE,
// or nil when it is not set.
func newPhaseProfiler(t testing.TB, client kubernetes.Interface) *phaseProfiler {
	t.Helper()
	dir := os.Getenv(envProfile)
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return &phaseProfiler{dir: dir, client: client}
}

// start profiles this process and kube-apiserver (in back-to-back
// one-second profiles, the API server's pprof handler's granularity) until
// the returned function is called; files are named phase-round-*.pprof.
// A nil profiler does nothing.
func (p *phaseProfiler) start(t testing.TB, phase string, round int) (stop func()) {
	t.Helper()
	if p == nil {
		return func() {}
	}
	name := fmt.Sprintf("%s-%d", phase, round)
	f, err := os.Create(filepath.Join(p.dir, name+"-service.pprof"))
	if err != nil {
		t.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			data, err := p.client.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
				Param("seconds", "1").DoRaw(t.Context())
			if err != nil {
				t.Errorf("profiling kube-apiserver: %v", err)
				return
			}
			if err := os.WriteFile(filepath.Join(p.dir, fmt.Sprintf("%s-apiserver-%d.pprof", name, i)), data, 0o644); err != nil {
				t.Error(err)
				return
			}
		}
	})
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
		close(done)
		wg.Wait()
	}
}
