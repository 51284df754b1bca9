package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/logtail"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	initservicev1 "github.com/gatehouse-dev/gatehouse/api/initservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kms/kek"
)

type initOptions struct {
	config, node, initSecretFile, masterSecretFile, stateFile, kubeconfig, componentsFile, arch string
	// failureLog is where a failed init's node logs go.
	failureLog string
	// components, when set, are installed instead of componentsFile's or
	// the versions table's (mini up passes its own).
	components []*componentsv1.Component
	timeout    time.Duration
}

func newInitCmd() *cobra.Command {
	var o initOptions
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Initialise the cluster on its first control-plane node",
		Long: "Generate the cluster's master secret, verify the first node's attestation\n" +
			"against the configuration, and have it create the cluster. Progress streams as\n" +
			"the node works. A dropped connection is resumed; running init again with the same\n" +
			"files resumes an unfinished init.",
		Example: "  gatehouse init --node 192.0.2.10:9000 --init-secret-file init-secret",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runInit(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.config, "config", clusterconfig.DefaultPath, "cluster configuration file")
	f.StringVar(&o.node, "node", "", "InitService address of the first node, host:port (required)")
	f.StringVar(&o.initSecretFile, "init-secret-file", "", "file holding the init secret the node was provisioned for (required)")
	f.StringVar(&o.masterSecretFile, "master-secret-file", clusterconfig.DefaultMasterSecretFile, "master secret file to create (mode 0600)")
	f.StringVar(&o.stateFile, "state-file", clusterconfig.DefaultStateFile, "cluster state file to create")
	f.StringVar(&o.kubeconfig, "kubeconfig-out", clusterconfig.DefaultKubeconfig, "admin kubeconfig to write (mode 0600)")
	f.StringVar(&o.componentsFile, "components-file", "", "JSON list of components to install instead of the versions table's (offline use)")
	f.StringVar(&o.arch, "node-arch", runtime.GOARCH, "CPU architecture of the node: amd64 or arm64")
	f.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up after this long")
	f.StringVar(&o.failureLog, "failure-log", "gatehouse-init-failure.log", "where the node's logs of a failed init are written")
	_ = cmd.MarkFlagRequired("node")
	_ = cmd.MarkFlagRequired("init-secret-file")
	return cmd
}

func runInit(ctx context.Context, out io.Writer, o initOptions) error {
	cfg, err := clusterconfig.Load(o.config)
	if err != nil {
		return err
	}
	release, err := cfg.Release()
	if err != nil {
		return err
	}
	components := o.components
	if components == nil {
		if components, err = loadComponents(o.componentsFile, cfg.Components, o.arch); err != nil {
			return err
		}
	}
	initSecret, err := os.ReadFile(o.initSecretFile)
	if err != nil {
		return fmt.Errorf("reading the init secret: %w", err)
	}
	stored, state, err := prepareSecrets(ctx, o, release.Version, cfg.MasterSecretKEK)
	if err != nil {
		return err
	}
	secret, err := stored.Unwrapped(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", o.masterSecretFile, err)
	}
	salt, err := hex.DecodeString(state.MeasurementSalt)
	if err != nil {
		return fmt.Errorf("%s: measurement salt: %w", o.stateFile, err)
	}
	req := &initservicev1.InitRequest{
		InitSecret:                 []byte(strings.TrimSpace(string(initSecret))),
		KmsUri:                     kms.ClusterKMSURIString(secret.Key, secret.Salt),
		KeyServiceKmsUri:           stored.KMS,
		MeasurementSalt:            salt,
		KubernetesVersion:          release.Version,
		KubernetesComponents:       components,
		ClusterName:                cfg.Name,
		ApiServerCertSans:          cfg.APIServerCertSANs,
		ControlPlaneEndpoint:       cfg.ControlPlaneEndpoint,
		ServiceCidr:                cfg.Networking.ServiceCIDR,
		PodCidr:                    cfg.Networking.PodCIDR,
		KubeletCertLifetimeSeconds: uint32(cfg.KubeletCertLifetime() / time.Second),
		ImageRepository:            cfg.Mirror.ImageRepository(),
		ImageMirror:                cfg.Mirror.NodeImageMirror(),
	}
	appraisal, err := cfg.Appraisal(nil)
	if err != nil {
		return err
	}
	// The first node becomes a control plane: it must prove that role.
	verifier, err := appraisal.ForRole(policy.RoleControlPlane)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "Initialising cluster %q (Kubernetes %s) on %s\n", cfg.Name, release.Version, o.node)
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	success, err := streamInit(ctx, out, o.node, verifier, req, o.failureLog)
	if err != nil {
		return err
	}
	if err := writeNew(o.kubeconfig, success.GetKubeconfig(), 0o600, false); err != nil {
		return fmt.Errorf("the cluster is initialised, but writing the admin kubeconfig failed: %w", err)
	}
	state.Phase, state.ClusterID = "initialised", hex.EncodeToString(success.GetClusterId())
	if err := clusterconfig.WriteState(o.stateFile, state); err != nil {
		return err
	}
	fmt.Fprintf(out, "Cluster %q is initialised.\n  cluster ID:  %s\n  kubeconfig:  %s\n  state:       %s\n  master secret: %s (keep it safe: it derives every key of the cluster)\n",
		cfg.Name, state.ClusterID, o.kubeconfig, o.stateFile, o.masterSecretFile)
	return nil
}

// prepareSecrets creates the master secret file and the state file, or
// reuses both when the state file records an unfinished init on the same
// node. An existing master secret file is never overwritten.
// prepareSecrets reads the master secret file and state of an init to
// resume, or creates both: a new master secret, wrapped by kekURI when it
// names one (then only the wrapped form is written).
func prepareSecrets(ctx context.Context, o initOptions, version, kekURI string) (*clusterconfig.MasterSecret, *clusterconfig.State, error) {
	state, err := clusterconfig.ReadState(o.stateFile)
	switch {
	case err == nil && state.Phase == "initialised":
		return nil, nil, fmt.Errorf("%s says cluster %s is already initialised; use another --state-file for a new cluster", o.stateFile, state.ClusterID)
	case err == nil && state.Node == o.node:
		secret, err := clusterconfig.ReadMasterSecret(o.masterSecretFile)
		if err != nil {
			return nil, nil, fmt.Errorf("resuming the init recorded in %s: %w", o.stateFile, err)
		}
		return secret, state, nil
	case err == nil:
		return nil, nil, fmt.Errorf("%s records an init of node %s, not %s; use another --state-file", o.stateFile, state.Node, o.node)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, nil, err
	}
	secret := &clusterconfig.MasterSecret{Key: make([]byte, 32), Salt: make([]byte, 32)}
	salt := make([]byte, 32)
	for _, b := range [][]byte{secret.Key, secret.Salt, salt} {
		if _, err := rand.Read(b); err != nil {
			return nil, nil, err
		}
	}
	if kekURI != "" {
		uri, err := kek.WrapNew(ctx, kekURI, secret.Key, secret.Salt)
		if err != nil {
			return nil, nil, fmt.Errorf("wrapping the new master secret with masterSecretKEK: %w", err)
		}
		clear(secret.Key)
		secret = &clusterconfig.MasterSecret{KMS: uri}
	}
	data, err := json.MarshalIndent(secret, "", "  ")
	if err != nil {
		return nil, nil, err
	}
	if err := writeNew(o.masterSecretFile, append(data, '\n'), 0o600, false); err != nil {
		return nil, nil, fmt.Errorf("master secret: %w", err)
	}
	state = &clusterconfig.State{Phase: "initialising", Node: o.node, MeasurementSalt: hex.EncodeToString(salt), KubernetesVersion: version}
	if err := clusterconfig.WriteState(o.stateFile, state); err != nil {
		return nil, nil, err
	}
	return secret, state, nil
}

// loadComponents returns the components from file (a JSON list of
// Component, taken as it is) or else from the versions table for arch
// (through the cluster configuration's mirror).
func loadComponents(file string, table func(string) ([]*componentsv1.Component, error), arch string) ([]*componentsv1.Component, error) {
	if file == "" {
		return table(arch)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--components-file: %w", err)
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("--components-file %s: %w", file, err)
	}
	out := make([]*componentsv1.Component, len(raw))
	for i, r := range raw {
		out[i] = &componentsv1.Component{}
		if err := protojson.Unmarshal(r, out[i]); err != nil {
			return nil, fmt.Errorf("--components-file %s: entry %d: %w", file, i, err)
		}
	}
	return out, nil
}

// streamInit sends req until the node answers with a final message,
// printing progress once per step. It retries while the node is
// unreachable or the connection drops (the node resumes the same init);
// a node whose evidence does not verify is not retried.
func streamInit(ctx context.Context, out io.Writer, node string, verifier attestation.Verifier, req *initservicev1.InitRequest, failureLog string) (*initservicev1.InitSuccess, error) {
	creds, err := atls.NewCredentials(atls.Config{Verifiers: []attestation.Verifier{verifier}})
	if err != nil {
		return nil, err
	}
	rec := &handshakeRecorder{TransportCredentials: creds}
	conn, err := grpc.NewClient(node, grpc.WithTransportCredentials(rec))
	if err != nil {
		return nil, fmt.Errorf("--node %q: %w", node, err)
	}
	defer conn.Close()
	client := initservicev1.NewInitServiceClient(conn)
	seen := 0
	backoff := time.Second
	for {
		final, n, err := receiveInit(ctx, out, client, req, seen)
		seen = max(seen, n)
		if err == nil {
			if f := final.GetFailure(); f != nil {
				return nil, initFailure(out, f, failureLog)
			}
			return final.GetSuccess(), nil
		}
		if herr := rec.lastError(); herr != nil && !networkError(herr) {
			return nil, fmt.Errorf("the node at %s did not prove it runs what the configuration expects; nothing was sent to it: %w", node, herr)
		}
		if status.Code(err) != codes.Unavailable {
			return nil, fmt.Errorf("init on %s: %w", node, err)
		}
		fmt.Fprintf(out, "  node %s not reachable (%v); retrying in %s\n", node, status.Convert(err).Message(), backoff)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("giving up on %s: %w (last error: %w)", node, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// receiveInit runs one Init stream, printing progress messages after the
// first skip ones (a resumed stream starts from the beginning). It returns
// the final message and how many progress messages it saw.
func receiveInit(ctx context.Context, out io.Writer, client initservicev1.InitServiceClient, req *initservicev1.InitRequest, skip int) (*initservicev1.InitResponse, int, error) {
	stream, err := client.Init(ctx, req)
	if err != nil {
		return nil, 0, err
	}
	n := 0
	for {
		resp, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = status.Error(codes.Unavailable, "the stream ended without a result")
			}
			return nil, n, err
		}
		p := resp.GetProgress()
		if p == nil {
			return resp, n, nil
		}
		n++
		if n > skip {
			fmt.Fprintf(out, "  [%s] %s\n", p.GetStep(), p.GetMessage())
		}
	}
}

// initFailure prints the node's logs of a failed init and returns its error.
func initFailure(out io.Writer, f *initservicev1.InitFailure, name string) error {
	logs, err := gunzip(f.GetLogsGzip())
	if err == nil && len(logs) > 0 {
		if werr := os.WriteFile(name, logs, 0o600); werr == nil {
			fmt.Fprintf(out, "The node's logs are in %s. Last lines:\n%s\n", name, logtail.Lines(string(logs), 15))
		}
	}
	return fmt.Errorf("the node failed to initialise the cluster and must be reset: %s", f.GetError())
}

// handshakeRecorder remembers the last attested TLS handshake error, so a
// failed attestation is told apart from an unreachable node.
type handshakeRecorder struct {
	credentials.TransportCredentials
	mu   sync.Mutex
	last error
}

func (h *handshakeRecorder) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c, info, err := h.TransportCredentials.ClientHandshake(ctx, authority, conn)
	h.mu.Lock()
	h.last = err
	h.mu.Unlock()
	return c, info, err
}

func (h *handshakeRecorder) Clone() credentials.TransportCredentials {
	return &handshakeRecorder{TransportCredentials: h.TransportCredentials.Clone()}
}

func (h *handshakeRecorder) lastError() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// networkError reports whether err is the connection failing rather than
// the peer failing verification.
func networkError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}
