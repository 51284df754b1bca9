package joinservice

import (
	"go.uber.org/goleak"

	"bufio"
	"context"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	runtimemetrics "runtime/metrics"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/kms/kek/kektest"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// The benchmark's simulated nodes run in a rig process of their own: this
// test binary started again with envRig set. Their TPM quotes and TLS
// client work are then accounted to that process instead of the service's,
// and with GATEHOUSE_BENCH_RIG_CPUS (a taskset CPU list) they run on other
// CPUs than the service and the API server (bench/joinservice.sh).
const (
	envRig     = "GATEHOUSE_STORM_RIG"
	envRigCPUs = "GATEHOUSE_BENCH_RIG_CPUS"
)

func TestMain(m *testing.M) {
	if os.Getenv(envRig) != "" {
		if err := serveRig(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "storm rig:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// A test that leaves a goroutine running (a server not stopped, a
	// connection not closed) fails the package.
	goleak.VerifyTestMain(m, kektest.IgnoreLocalKMSDrain)
}

// rigHello is the rig's first line: the AK its nodes attest with (PKIX DER).
type rigHello struct {
	AK []byte `json:"ak"`
}

// rigStorm asks the rig for one storm.
type rigStorm struct {
	Addr   string `json:"addr"`
	CAHash string `json:"caHash"`
	N      int    `json:"n"`
}

// rigReport is the rig's answer to a rigStorm: every node's outcome, the
// storm's wall time and the CPU time the rig process spent in it.
type rigReport struct {
	Results []rigResult   `json:"results"`
	Elapsed time.Duration `json:"elapsed"`
	CPU     time.Duration `json:"cpu"`
}

type rigResult struct {
	Name        string        `json:"name"`
	Err         string        `json:"err,omitempty"`
	Attempts    int           `json:"attempts"`
	Latency     time.Duration `json:"latency"`
	Token       string        `json:"token,omitempty"`
	KubeletCert []byte        `json:"kubeletCert,omitempty"`
}

// serveRig boots this process's simulated TPM, says its AK, then runs one
// storm per request line until in ends.
func serveRig(in io.Reader, out io.Writer) error {
	attester, closeNode, err := bootNode()
	if err != nil {
		return err
	}
	defer closeNode()
	ak, err := x509.MarshalPKIXPublicKey(attester.AttestationKey())
	if err != nil {
		return err
	}
	enc := json.NewEncoder(out)
	if err := enc.Encode(rigHello{AK: ak}); err != nil {
		return err
	}
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		var req rigStorm
		if err := json.Unmarshal(lines.Bytes(), &req); err != nil {
			return fmt.Errorf("reading storm request: %w", err)
		}
		joiners, closeAll, err := newJoiners(req.Addr, req.CAHash, attester, req.N)
		if err != nil {
			return err
		}
		cpu := processCPU()
		results, elapsed := runStorm(context.Background(), joiners, false, nil, nil)
		report := rigReport{Elapsed: elapsed, CPU: processCPU() - cpu}
		closeAll()
		for _, r := range results {
			rr := rigResult{Name: r.name, Attempts: r.attempts, Latency: r.latency,
				Token: r.ticket.GetToken(), KubeletCert: r.ticket.GetKubeletCert()}
			if r.err != nil {
				rr.Err = r.err.Error()
			}
			report.Results = append(report.Results, rr)
		}
		if err := enc.Encode(report); err != nil {
			return err
		}
	}
	return lines.Err()
}

// rig is the parent's handle on a rig process.
type rig struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *json.Decoder
	ak  crypto.PublicKey
}

// startRig starts the rig process (pinned to $GATEHOUSE_BENCH_RIG_CPUS when
// set) and reads its AK.
func startRig(t testing.TB) *rig {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{self}
	if cpus := os.Getenv(envRigCPUs); cpus != "" {
		args = append([]string{"taskset", "--cpu-list", cpus}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), envRig+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the storm rig: %v", err)
	}
	r := &rig{cmd: cmd, in: in, out: json.NewDecoder(stdout)}
	t.Cleanup(func() {
		_ = in.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("storm rig: %v", err)
		}
	})
	var hello rigHello
	if err := r.out.Decode(&hello); err != nil {
		t.Fatalf("reading the storm rig's AK: %v", err)
	}
	if r.ak, err = x509.ParsePKIXPublicKey(hello.AK); err != nil {
		t.Fatal(err)
	}
	return r
}

// storm has the rig's n nodes join h at once.
func (r *rig) storm(t testing.TB, h *harness, n int) ([]stormResult, rigReport) {
	t.Helper()
	line, err := json.Marshal(rigStorm{Addr: h.addr, CAHash: h.caHash, N: n})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.in.Write(append(line, '\n')); err != nil {
		t.Fatal(err)
	}
	var report rigReport
	if err := r.out.Decode(&report); err != nil {
		t.Fatalf("reading the storm rig's report: %v", err)
	}
	results := make([]stormResult, len(report.Results))
	for i, rr := range report.Results {
		results[i] = stormResult{name: rr.Name, attempts: rr.Attempts, latency: rr.Latency,
			ticket: &joinservicev1.IssueJoinTicketResponse{Token: rr.Token, KubeletCert: rr.KubeletCert}}
		if rr.Err != "" {
			results[i].err = errors.New(rr.Err)
		}
	}
	return results, report
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuSplit is CPU time by process of the benchmark's server side:
// "service" is this process (join service, key service, the raw-rate
// client), the others are named as testenv.Env.PIDs names them (etcd,
// kube-apiserver, kube-controller-manager).
type cpuSplit map[string]time.Duration

// serverCPU is the CPU time used so far by each process of the server side;
// "service-gc" is the part of the service's that the Go runtime counts as
// garbage collection (runtime/metrics, an estimate), not a process of its
// own: total leaves it out.
func serverCPU(t testing.TB, h *harness) cpuSplit {
	t.Helper()
	gc := []runtimemetrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	runtimemetrics.Read(gc)
	split := cpuSplit{"service": processCPU(), gcShare: time.Duration(gc[0].Value.Float64() * float64(time.Second))}
	for name, pid := range h.env.PIDs() {
		split[name] = testenv.ProcessesCPU(t, map[string]int{name: pid})
	}
	return split
}

// gcShare names the service's garbage collection in a cpuSplit.
const gcShare = "service-gc"

// total is the CPU time of all processes in s.
func (s cpuSplit) total() time.Duration {
	var d time.Duration
	for name, v := range s {
		if name != gcShare {
			d += v
		}
	}
	return d
}

// add adds to s what each process used between before and after.
func (s cpuSplit) add(before, after cpuSplit) {
	for name, d := range after {
		s[name] += d - before[name]
	}
}

// perOp formats s divided by ops, by process in name order, in ms.
func (s cpuSplit) perOp(ops int) string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(s)) {
		parts = append(parts, fmt.Sprintf("%s %.2f", name, float64(s[name].Microseconds())/1e3/float64(ops)))
	}
	return strings.Join(parts, ", ") + fmt.Sprintf(" (total %.2f) ms", float64(s.total().Microseconds())/1e3/float64(ops))
}
