package nodelock

import (
	"bytes"
	"crypto/rand"
	"errors"
	"sync"
	"testing"

	"github.com/google/go-tpm-tools/simulator"
	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

func openSimulator(t *testing.T) *simulator.Simulator {
	t.Helper()
	sim, err := simulator.Get()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	return sim
}

func readPCR(t *testing.T, sim *simulator.Simulator) []byte {
	t.Helper()
	v, err := tpm2.ReadPCR(sim, keys.NodeLockPCR, tpm2.AlgSHA256)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func clusterID(t *testing.T) []byte {
	t.Helper()
	id := make([]byte, keys.ClusterIDSize)
	if _, err := rand.Read(id); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestRace has the InitServer and the JoinClient race for the lock 1000
// times, each round on a freshly reset TPM: exactly one wins every time,
// the loser gets ErrLocked, and PCR 15 holds the winner's cluster ID.
func TestRace(t *testing.T) {
	sim := openSimulator(t)
	wins := map[string]int{}
	for round := range 1000 {
		if err := sim.Reset(); err != nil {
			t.Fatal(err)
		}
		lock, err := New(sim)
		if err != nil {
			t.Fatal(err)
		}
		if lock.Locked() {
			t.Fatalf("round %d: a reset TPM's lock is taken", round)
		}
		ids := map[string][]byte{"init": clusterID(t), "join": clusterID(t)}
		errs := map[string]error{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := make(chan struct{})
		for holder, id := range ids {
			wg.Go(func() {
				<-start
				err := lock.TryLock(holder, id)
				mu.Lock()
				errs[holder] = err
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()
		select {
		case <-lock.Taken():
		default:
			t.Fatalf("round %d: Taken() is not closed after the lock was taken", round)
		}
		winner := lock.Holder()
		loser := map[string]string{"init": "join", "join": "init"}[winner]
		if winner == "" || errs[winner] != nil || !errors.Is(errs[loser], ErrLocked) {
			t.Fatalf("round %d: holder %q, results %v: want exactly one winner", round, winner, errs)
		}
		if got := readPCR(t, sim); !bytes.Equal(got, keys.ExpectedNodeLockPCR(ids[winner])) {
			t.Fatalf("round %d: PCR %d = %x, want the %s cluster ID's %x", round, keys.NodeLockPCR, got, winner, keys.ExpectedNodeLockPCR(ids[winner]))
		}
		wins[winner]++
	}
	t.Logf("wins over 1000 rounds: %v", wins)
}

// TestLockedAfterRestart: a bootstrapper started again on a node whose
// lock PCR is extended finds the lock taken and cannot take it again.
func TestLockedAfterRestart(t *testing.T) {
	sim := openSimulator(t)
	id := clusterID(t)
	first, err := New(sim)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.TryLock("join", id); err != nil {
		t.Fatal(err)
	}
	again, err := New(sim)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Locked() || again.Holder() != "" {
		t.Fatalf("after restart: locked %v holder %q, want locked by an earlier process", again.Locked(), again.Holder())
	}
	if err := again.TryLock("init", clusterID(t)); !errors.Is(err, ErrLocked) {
		t.Fatalf("TryLock after restart: %v, want ErrLocked", err)
	}
	if got := readPCR(t, sim); !bytes.Equal(got, keys.ExpectedNodeLockPCR(id)) {
		t.Fatalf("PCR changed by a refused TryLock: %x", got)
	}
}

func TestTryLockRejectsBadClusterID(t *testing.T) {
	sim := openSimulator(t)
	lock, err := New(sim)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range [][]byte{nil, make([]byte, 31), make([]byte, 33)} {
		if err := lock.TryLock("init", id); err == nil || errors.Is(err, ErrLocked) {
			t.Errorf("cluster ID of %d bytes: %v, want a size error", len(id), err)
		}
	}
	if lock.Locked() || !bytes.Equal(readPCR(t, sim), make([]byte, 32)) {
		t.Fatal("a refused TryLock changed the lock or the PCR")
	}
}

// TestTryLockFailsOnBrokenTPM: when the TPM cannot extend, the lock stays
// free and the error names the PCR.
func TestTryLockFailsOnBrokenTPM(t *testing.T) {
	sim, err := simulator.Get()
	if err != nil {
		t.Fatal(err)
	}
	lock, err := New(sim)
	if err != nil {
		t.Fatal(err)
	}
	_ = sim.Close()
	if err := lock.TryLock("init", clusterID(t)); err == nil || errors.Is(err, ErrLocked) {
		t.Fatalf("TryLock on a closed TPM: %v", err)
	}
	if lock.Locked() {
		t.Fatal("the lock is taken although the extension failed")
	}
}
