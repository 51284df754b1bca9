package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	recoveryservicev1 "github.com/gatehouse-dev/gatehouse/api/recoveryservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
)

type recoverOptions struct {
	config, masterSecretFile string
	endpoints                []string
	timeout                  time.Duration
}

func newRecoverCmd() *cobra.Command {
	var o recoverOptions
	cmd := &cobra.Command{
		Use:   "recover",
		Short: "Unlock rebooted control planes after a full outage",
		Long: "After every control plane went down, no join service can unlock the rebooted control\n" +
			"planes' state disks. Each of them serves RecoveryService on its init address. recover\n" +
			"verifies each control plane's evidence against the configuration (control-plane role,\n" +
			"node lock not taken), derives that node's own state disk key (for its attested\n" +
			"identity and disk) and the measurement secret from the master secret, and sends\n" +
			"those two, never the master secret. Recover control planes one after another until\n" +
			"etcd has quorum; workers then rejoin by themselves (docs/recovery.md).",
		Example: "  gatehouse recover --endpoint 192.0.2.10:9000 --endpoint 192.0.2.11:9000 --endpoint 192.0.2.12:9000",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runRecover(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.config, "config", clusterconfig.DefaultPath, "cluster configuration file")
	f.StringVar(&o.masterSecretFile, "master-secret-file", clusterconfig.DefaultMasterSecretFile, "the master secret file gatehouse init wrote")
	f.StringArrayVar(&o.endpoints, "endpoint", nil, "init address (host:port) of a control plane to recover (repeatable; in order)")
	f.DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up on a control plane after this long")
	_ = cmd.MarkFlagRequired("endpoint")
	return cmd
}

func runRecover(ctx context.Context, out io.Writer, o recoverOptions) error {
	cfg, err := clusterconfig.Load(o.config)
	if err != nil {
		return err
	}
	stored, err := clusterconfig.ReadMasterSecret(o.masterSecretFile)
	if err != nil {
		return err
	}
	secret, err := stored.Unwrapped(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", o.masterSecretFile, err)
	}
	clusterKMS, err := kms.NewClusterKMS(secret.Key, secret.Salt)
	if err != nil {
		return fmt.Errorf("%s: %w", o.masterSecretFile, err)
	}
	// A rebooted node has not taken its node lock: PCR 15 is zero.
	appraisal, err := cfg.Appraisal(nil)
	if err != nil {
		return err
	}
	verifier, err := appraisal.ForRole(policy.RoleControlPlane)
	if err != nil {
		return err
	}
	for i, ep := range o.endpoints {
		fmt.Fprintf(out, "[%d/%d] %s: verifying the control plane's evidence\n", i+1, len(o.endpoints), ep)
		nodeCtx, cancel := context.WithTimeout(ctx, o.timeout)
		identity, err := recoverNode(nodeCtx, ep, verifier, clusterKMS)
		cancel()
		if err != nil {
			return fmt.Errorf("recovering %s: %w (nothing was sent to it; the control planes before it are recovered)", ep, err)
		}
		fmt.Fprintf(out, "[%d/%d] %s: recovered (%s): its state disk is unlocked and its kubelet runs\n", i+1, len(o.endpoints), ep, identity)
	}
	fmt.Fprintf(out, "Recovered %d control plane(s). Workers rejoin by themselves once the join service runs again.\n", len(o.endpoints))
	return nil
}

// recoverNode verifies the node at ep and sends it its keys over the one
// attested connection both calls used: the keys are derived for the
// identity that connection proved, and a call answered by another
// connection (another machine) gets nothing.
func recoverNode(ctx context.Context, ep string, verifier attestation.Verifier, clusterKMS *kms.ClusterKMS) (string, error) {
	creds, err := atls.NewCredentials(atls.Config{Verifiers: []attestation.Verifier{verifier}})
	if err != nil {
		return "", err
	}
	rec := &handshakeRecorder{TransportCredentials: creds}
	conn, err := grpc.NewClient(ep, grpc.WithTransportCredentials(&oneConnection{TransportCredentials: rec, state: &oneConnectionState{}}))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	client := recoveryservicev1.NewRecoveryServiceClient(conn)
	var infoPeer peer.Peer
	var info *recoveryservicev1.GetRecoveryInfoResponse
	// Until the node answers (it may still be booting), but not past a
	// refused attestation.
	for wait := 500 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		info, err = client.GetRecoveryInfo(ctx, &recoveryservicev1.GetRecoveryInfoRequest{}, grpc.Peer(&infoPeer))
		if err == nil {
			break
		}
		if herr := rec.lastError(); herr != nil && !networkError(herr) {
			return "", fmt.Errorf("the node did not prove it is a control plane running what the configuration expects: %w", herr)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("the node did not answer: %w", err)
		case <-time.After(wait):
		}
	}
	auth, ok := infoPeer.AuthInfo.(atls.AuthInfo)
	if !ok || auth.Peer == nil {
		return "", errors.New("the connection is not attested")
	}
	identity := auth.Peer.Identity
	diskKeyID, err := keys.DiskKeyID(identity, info.GetDiskUuid())
	if err != nil {
		return "", err
	}
	diskKey, err := clusterKMS.GetDataKey(ctx, diskKeyID, keys.StateDiskKeySize)
	if err != nil {
		return "", err
	}
	measurementSecret, err := clusterKMS.GetDataKey(ctx, keys.MeasurementSecretID, keys.MeasurementSecretSize)
	if err != nil {
		return "", err
	}
	// The connection allows one handshake (oneConnection): if the first
	// connection broke, this call fails instead of sending the keys over a
	// new one.
	if _, err := client.Recover(ctx, &recoveryservicev1.RecoverRequest{StateDiskKey: diskKey, MeasurementSecret: measurementSecret}); err != nil {
		return "", err
	}
	return identity, nil
}

// oneConnection is transport credentials that allow one handshake: keys
// derived for the identity one attested connection proved go over that
// connection or nowhere.
type oneConnection struct {
	credentials.TransportCredentials
	state *oneConnectionState
}

type oneConnectionState struct {
	mu   sync.Mutex
	used bool
}

func (o *oneConnection) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	o.state.mu.Lock()
	defer o.state.mu.Unlock()
	if o.state.used {
		return nil, nil, errors.New("the attested connection to the node broke; run recover again for it")
	}
	c, info, err := o.TransportCredentials.ClientHandshake(ctx, authority, conn)
	o.state.used = err == nil
	return c, info, err
}

func (o *oneConnection) Clone() credentials.TransportCredentials {
	return &oneConnection{TransportCredentials: o.TransportCredentials.Clone(), state: o.state}
}
