package continuous

import (
	"bufio"
	"context"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/simulator"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

// BenchmarkReattest's simulated nodes run in a rig process of their own:
// this test binary started again with envRig set. Their TPM quotes and TLS
// server work are then accounted to that process, not to the loop's, and
// with GATEHOUSE_BENCH_RIG_CPUS (a taskset CPU list) they run on other CPUs
// than the loop and the API server (bench/reattest.sh).
const (
	envRig     = "GATEHOUSE_REATTEST_RIG"
	envRigCPUs = "GATEHOUSE_BENCH_RIG_CPUS"
)

func TestMain(m *testing.M) {
	if os.Getenv(envRig) != "" {
		if err := serveRig(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "reattest rig:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// rigSetup is the parent's first line: the nodes' evidence endpoints
// (rigAddr of each node at Port) and the cluster ID their node lock holds,
// and a nonce for one evidence the parent verifies on its own.
type rigSetup struct {
	// First and Nodes are the nodes this rig serves: First to
	// First+Nodes-1.
	First     int    `json:"first"`
	Nodes     int    `json:"nodes"`
	Port      int    `json:"port"`
	ClusterID []byte `json:"clusterID"`
	Nonce     []byte `json:"nonce"`
	// ClientCAFile is the cluster CA the nodes' evidence endpoints admit
	// verifiers by, as serve-evidence does on a node that joined.
	ClientCAFile string `json:"clientCAFile"`
}

// rigHello is the rig's answer once every endpoint listens: the AK its
// nodes attest with (PKIX DER), its attestation identity, and evidence for
// the setup's nonce.
type rigHello struct {
	AK       []byte `json:"ak"`
	Identity string `json:"identity"`
	Evidence []byte `json:"evidence"`
}

// rigCPU answers every later line: the CPU time the rig has used.
type rigCPU struct {
	CPU time.Duration `json:"cpu"`
}

// serveRig boots this process's simulated TPM as a worker that took its
// node lock, serves its evidence at every address of the setup as
// gatehouse-bootstrapper serve-evidence does (atls.EvidenceEndpoint, with
// its door: only the cluster CA's verifiers), and
// answers each further line with its CPU time until in ends. All nodes
// share the one simulated TPM, so they share its AK: the go-tpm-tools
// simulator is one TPM per process, and a TPM holds only a few loaded
// keys at once.
func serveRig(in io.Reader, out io.Writer) error {
	lines := bufio.NewScanner(in)
	if !lines.Scan() {
		return fmt.Errorf("no setup: %w", lines.Err())
	}
	var setup rigSetup
	if err := json.Unmarshal(lines.Bytes(), &setup); err != nil {
		return fmt.Errorf("reading the setup: %w", err)
	}
	sim, err := simulator.Get()
	if err != nil {
		return err
	}
	defer sim.Close()
	if _, err := tpmattester.MeasureBoot(sim, bootArtefacts(policy.RoleWorker)); err != nil {
		return err
	}
	if err := tpm2.PCRExtend(sim, tpmutil.Handle(keys.NodeLockPCR), tpm2.AlgSHA256, setup.ClusterID, ""); err != nil {
		return err
	}
	attester, err := tpmattester.New(sim, tpmattester.Options{PCRs: testPCRs})
	if err != nil {
		return err
	}
	defer attester.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := setup.First; i < setup.First+setup.Nodes; i++ {
		lis, err := net.Listen("tcp", net.JoinHostPort(rigAddr(i), strconv.Itoa(setup.Port)))
		if err != nil {
			return err
		}
		// The production door and its default limits (one check per
		// node per round stays well within them).
		// The idle timeout is longer than the first round of 10,000
		// nodes takes (its writes), so that the steady rounds find the
		// connections kept: in a cluster, rounds come every interval,
		// within the default's 2 minutes.
		endpoint := atls.EvidenceEndpoint{Attester: attester, ClientCAFile: setup.ClientCAFile, IdleTimeout: 30 * time.Minute}
		go func() { _ = endpoint.Serve(ctx, lis) }()
	}
	ak, err := x509.MarshalPKIXPublicKey(attester.AttestationKey())
	if err != nil {
		return err
	}
	identity, err := attester.Identity()
	if err != nil {
		return err
	}
	evidence, err := attester.Attest(ctx, []byte("user data"), setup.Nonce)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(out)
	if err := enc.Encode(rigHello{AK: ak, Identity: identity, Evidence: evidence}); err != nil {
		return err
	}
	for lines.Scan() {
		if err := enc.Encode(rigCPU{CPU: processCPU()}); err != nil {
			return err
		}
	}
	return lines.Err()
}

// rigAddr is node i's address: 127.3.0.1 to 127.3.255.250, its own on
// loopback (Linux routes all of 127.0.0.0/8 there).
func rigAddr(i int) string { return fmt.Sprintf("127.3.%d.%d", i/250, i%250+1) }

// rig is the parent's handle on a rig process.
type rig struct {
	in  io.WriteCloser
	out *json.Decoder
	rigHello
	ak crypto.PublicKey
}

// startRig starts the rig process (pinned to $GATEHOUSE_BENCH_RIG_CPUS when
// set) serving setup, and waits until its endpoints listen.
func startRig(b *testing.B, setup rigSetup) *rig {
	b.Helper()
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
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
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatalf("starting the reattest rig: %v", err)
	}
	r := &rig{in: in, out: json.NewDecoder(stdout)}
	b.Cleanup(func() {
		_ = in.Close()
		if err := cmd.Wait(); err != nil {
			b.Errorf("reattest rig: %v", err)
		}
	})
	line, err := json.Marshal(setup)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := in.Write(append(line, '\n')); err != nil {
		b.Fatal(err)
	}
	if err := r.out.Decode(&r.rigHello); err != nil {
		b.Fatalf("reading the reattest rig's hello: %v", err)
	}
	if r.ak, err = x509.ParsePKIXPublicKey(r.AK); err != nil {
		b.Fatal(err)
	}
	return r
}

// rigNodes is how many nodes one rig process serves at most: each
// holds a listener and, kept by the join service, a connection, and a
// process may have 20,000 open files on the machines here.
const rigNodes = 4000

// rigs are the rig processes of a benchmark, each serving up to
// rigNodes nodes with its own simulated TPM.
type rigs []*rig

// startRigs starts as many rigs as setup.Nodes needs.
func startRigs(b *testing.B, setup rigSetup) rigs {
	b.Helper()
	var rs rigs
	for first := 0; first < setup.Nodes; first += rigNodes {
		s := setup
		s.First, s.Nodes = first, min(rigNodes, setup.Nodes-first)
		rs = append(rs, startRig(b, s))
	}
	return rs
}

// of returns the rig serving node i.
func (rs rigs) of(i int) *rig { return rs[i/rigNodes] }

// cpu returns the CPU time the rig processes have used so far.
func (rs rigs) cpu(b *testing.B) time.Duration {
	b.Helper()
	var sum time.Duration
	for _, r := range rs {
		sum += r.cpu(b)
	}
	return sum
}

// cpu returns the CPU time the rig process has used so far.
func (r *rig) cpu(b *testing.B) time.Duration {
	b.Helper()
	if _, err := r.in.Write([]byte("cpu\n")); err != nil {
		b.Fatal(err)
	}
	var c rigCPU
	if err := r.out.Decode(&c); err != nil {
		b.Fatalf("reading the reattest rig's CPU time: %v", err)
	}
	return c.CPU
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
