package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/gatehouse-dev/gatehouse/bootstrapper"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/nodelock"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/statedisk"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// TestRecover: a rebooted control plane (state disk initialised with its
// key, TPM unlocked) runs the real bootstrapper with no join service; a
// configuration expecting other measurements makes recover refuse it
// before sending anything; the right one makes recover derive and send
// its own keys, the node takes its node lock with the cluster's ID and
// its bootstrapper finishes.
func TestRecover(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := t.Context()
	dir := t.TempDir()
	t.Chdir(dir)
	sim, a := bootSimulator(t)
	lock, err := nodelock.New(sim)
	if err != nil {
		t.Fatal(err)
	}
	identity, err := a.Identity()
	if err != nil {
		t.Fatal(err)
	}

	// The cluster: its master secret, and the node's disk keyed as init or
	// a join left it.
	secret := clusterconfig.MasterSecret{Key: bytes.Repeat([]byte{1}, 32), Salt: bytes.Repeat([]byte{2}, 32)}
	data, _ := json.Marshal(secret)
	if err := os.WriteFile("master.json", data, 0o600); err != nil {
		t.Fatal(err)
	}
	clusterKMS, err := kms.NewClusterKMS(secret.Key, secret.Salt)
	if err != nil {
		t.Fatal(err)
	}
	disk, err := statedisk.New(testenv.LoopDevice(t, 32<<20))
	if err != nil {
		t.Fatal(err)
	}
	firstKey, err := disk.FormatRandom(ctx)
	if err != nil {
		t.Fatal(err)
	}
	uuid, err := disk.UUID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id, err := keys.DiskKeyID(identity, uuid)
	if err != nil {
		t.Fatal(err)
	}
	diskKey, err := clusterKMS.GetDataKey(ctx, id, keys.StateDiskKeySize)
	if err != nil {
		t.Fatal(err)
	}
	salt := bytes.Repeat([]byte{3}, keys.MeasurementSaltSize)
	if err := disk.Rekey(ctx, firstKey, diskKey); err != nil {
		t.Fatal(err)
	}
	if err := disk.MarkInitialised(ctx, salt); err != nil {
		t.Fatal(err)
	}

	// The rebooted node: its bootstrapper, with no join service.
	creds, err := atls.NewCredentials(atls.Config{Attester: a})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		done <- bootstrapper.Run(runCtx, bootstrapper.Config{
			Machine: &bootstrapper.Machine{Root: t.TempDir(), Disk: disk, Log: slog.New(slog.DiscardHandler)},
			Lock:    lock, Disk: disk, InitGRPCServer: grpc.NewServer(grpc.Creds(creds)), InitListener: lis,
			Kubelet: bootstrapper.NoKubelet{},
		})
	}()
	n := &node{akPEM: akPEM(t, a)}

	tampered := writeConfig(t, t.TempDir(), n, true)
	out, err := runErr(t, "recover", "--config", tampered, "--master-secret-file", "master.json", "--endpoint", lis.Addr().String())
	if err == nil || !strings.Contains(err.Error(), "did not prove") || !strings.Contains(err.Error(), "nothing was sent") {
		t.Fatalf("recover of a node measuring otherwise: %v\n%s", err, out)
	}
	if lock.Locked() {
		t.Fatal("a node recover refused took its node lock")
	}

	config := writeConfig(t, dir, n, false)
	out = run(t, "recover", "--config", config, "--master-secret-file", "master.json", "--endpoint", lis.Addr().String())
	if !strings.Contains(out, "recovered ("+identity+")") {
		t.Fatalf("recover output:\n%s", out)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the bootstrapper did not finish after the recovery")
	}
	measurementSecret, err := clusterKMS.GetDataKey(ctx, keys.MeasurementSecretID, keys.MeasurementSecretSize)
	if err != nil {
		t.Fatal(err)
	}
	clusterID, err := keys.DeriveClusterID(measurementSecret, salt)
	if err != nil {
		t.Fatal(err)
	}
	pcr, err := tpm2.ReadPCR(sim, keys.NodeLockPCR, tpm2.AlgSHA256)
	if err != nil || !bytes.Equal(pcr, keys.ExpectedNodeLockPCR(clusterID)) || lock.Holder() != "recover" {
		t.Fatalf("holder %q, PCR 15 %x (%v): want the cluster's ID", lock.Holder(), pcr, err)
	}
}

// handshakeOK is transport credentials whose handshakes succeed.
type handshakeOK struct {
	credentials.TransportCredentials
}

func (handshakeOK) ClientHandshake(_ context.Context, _ string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return conn, nil, nil
}

func (h handshakeOK) Clone() credentials.TransportCredentials { return h }

// handshakeFails is transport credentials whose handshakes fail.
type handshakeFails struct {
	credentials.TransportCredentials
}

func (handshakeFails) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("refused")
}

// TestOneConnection: recover's keys go over the first connection that
// completed its attested handshake or nowhere: after one, every further
// handshake (a reconnect, maybe to another machine) fails; failed
// handshakes before it do not count.
func TestOneConnection(t *testing.T) {
	state := &oneConnectionState{}
	if _, _, err := (&oneConnection{TransportCredentials: handshakeFails{}, state: state}).ClientHandshake(t.Context(), "", nil); err == nil {
		t.Fatal("a failing handshake succeeded")
	}
	o := &oneConnection{TransportCredentials: handshakeOK{}, state: state}
	if _, _, err := o.ClientHandshake(t.Context(), "", nil); err != nil {
		t.Fatalf("the first successful handshake: %v", err)
	}
	if _, _, err := o.Clone().ClientHandshake(t.Context(), "", nil); err == nil || !strings.Contains(err.Error(), "broke") {
		t.Fatalf("a second handshake: %v, want refused", err)
	}
}
