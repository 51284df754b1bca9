// Package joinservice is the Gatehouse join service: it admits attested
// nodes into the cluster by issuing join tickets (disk key, measurement
// secret, bootstrap token, kubelet certificate, and for control planes the
// cluster PKI) over attested TLS. docs/joinservice.md describes the protocol,
// the trust decisions, the metrics and the audit log.
package joinservice

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/util/validation"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/bootstraptoken"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/internal/protostrict"
	"github.com/gatehouse-dev/gatehouse/joinservice/gate"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

// maxRequestSize bounds a request message in bytes; a CSR is well under 4 KiB.
const maxRequestSize = 16 << 10

// controlPlaneFileNames are the files, relative to the PKI directory, a control
// plane needs to run `kubeadm join --control-plane` without a certificate
// key (kubeadm docs, "Manual certificate distribution").
var controlPlaneFileNames = []string{
	"ca.crt", "ca.key", "sa.key", "sa.pub",
	"front-proxy-ca.crt", "front-proxy-ca.key",
	"etcd/ca.crt", "etcd/ca.key",
}

// keySource returns data keys from the key service; declared here, where it is used.
type keySource interface {
	GetDataKey(ctx context.Context, id string, length int) ([]byte, error)
}

// tokenIssuer issues bootstrap tokens; *Tokens in production.
type tokenIssuer interface {
	Issue(ctx context.Context, requestKey, address, description string) (bootstraptoken.Token, error)
}

// controlPlaneLocker serialises control-plane joins; *ControlPlaneLock in production.
type controlPlaneLocker interface {
	Acquire(ctx context.Context, node, identity string) (release func(context.Context) error, err error)
}

// nameBinder binds node names to attestation identities; *nodebinding.Store in
// production.
type nameBinder interface {
	// Claim binds a joiner's node name, refusing one an existing Node
	// holds without a binding unless an administrator adopted it.
	Claim(ctx context.Context, node, identity string) (nodebinding.Binding, error)
	Identity(ctx context.Context, node string) (string, error)
}

// credentialGate is the one decision every node credential passes
// (*gate.Gate).
type credentialGate interface {
	Decide(ctx context.Context, req gate.Request) (*gate.Refusal, error)
}

// boundNames lists the node names bound to an attestation identity
// (*nodebinding.Cache).
type boundNames interface {
	NodesOf(identity string) ([]string, error)
}

// Config holds a Server's dependencies.
type Config struct {
	// PolicyStore is the live join config and deny list (NewPolicyStore,
	// watched with Watch).
	PolicyStore *PolicyStore
	// Gate decides every ticket after the request's own checks.
	Gate credentialGate
	// BoundNames finds the node a rejoining machine is, for the gate.
	BoundNames       boundNames
	Keys             keySource
	Tokens           tokenIssuer
	ControlPlaneLock controlPlaneLocker
	Bindings         nameBinder
	CA               *clusterpki.CA
	// KubeletCertLifetime is the lifetime of the kubelet serving
	// certificate a ticket carries, the cluster's kubelet certificate
	// lifetime (the kubelet renews it through CSRs); 0 is
	// clusterpki.KubeletCertValidity.
	KubeletCertLifetime time.Duration
	// PKIDir holds the controlPlaneFileNames (/etc/kubernetes/pki on a control plane).
	PKIDir string
	// RateLimit is the per-source budget of requests.
	RateLimit connlimit.Rate
	// Log receives the audit log and operational messages.
	Log *slog.Logger
	// Registerer registers the service's metrics.
	Registerer prometheus.Registerer
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Server implements JoinService.
type Server struct {
	joinservicev1.UnimplementedJoinServiceServer
	cfg     Config
	limiter *connlimit.Buckets
	metrics *metrics
}

// NewServer returns a join service with the dependencies in cfg.
func NewServer(cfg Config) (*Server, error) {
	if cfg.PolicyStore == nil || cfg.Gate == nil || cfg.BoundNames == nil || cfg.Keys == nil || cfg.Tokens == nil || cfg.ControlPlaneLock == nil ||
		cfg.Bindings == nil || cfg.CA == nil || cfg.Log == nil {
		return nil, errors.New("join service: PolicyStore, Gate, BoundNames, Keys, Tokens, ControlPlaneLock, Bindings, CA and Log are required")
	}
	if cfg.RateLimit.Rate <= 0 || cfg.RateLimit.Burst < 1 {
		return nil, fmt.Errorf("join service: rate limit %+v must have a positive rate and a burst of at least 1", cfg.RateLimit)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, limiter: connlimit.NewBuckets(cfg.RateLimit, cfg.Now), metrics: m}, nil
}

// refusal is an error with the gRPC code and audit reason it maps to. Its
// message is what the caller sees; it never holds secrets.
type refusal struct {
	code   codes.Code
	reason string
	err    error
	// retryAfter, when set, is sent as a RetryInfo detail (google.rpc):
	// how long the caller should wait before retrying a refusal that is a
	// matter of time, such as another control plane's join.
	retryAfter time.Duration
}

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

func refuse(code codes.Code, reason string, format string, args ...any) *refusal {
	return &refusal{code: code, reason: reason, err: fmt.Errorf(format, args...)}
}

// decision collects what the audit log entry of one request records.
type decision struct {
	method       string
	source       string
	sourceAddr   netip.Addr
	peer         *attestation.Result
	evidence     atls.Evidence
	roles        []policy.Role
	node         string
	controlPlane bool
	diskUUID     string
	tokenID      string
	rebound      *nodebinding.Binding
	adoption     *nodebinding.Adoption
}

// admission is what the checks every request passes first established:
// one snapshot of the policy, and the caller's appraisal under it.
type admission struct {
	join *joinconfig.JoinConfig
	deny *joinconfig.DenyList
}

// IssueJoinTicket gives an attested new node its join ticket. Errors:
// Unauthenticated without attestation; ResourceExhausted over the rate
// limit; PermissionDenied for a denied identity or node, evidence that no
// longer satisfies the policy, a role the evidence does not prove
// (role_not_attested), a node name bound to another identity (name_bound),
// held by a Node that joined without Gatehouse and that no administrator
// adopted (name_held), or certificate names the node does not own
// (name_not_owned);
// InvalidArgument for a malformed disk UUID or CSR or unknown fields,
// naming what is wrong; Unavailable (retry) while the policy is not loaded,
// another control plane joins, or the key service or API server fail;
// FailedPrecondition when control-plane files are missing. A refusal
// creates nothing; only failures after the name is bound (key service, API
// server) leave the binding, which is the caller's own.
func (s *Server) IssueJoinTicket(ctx context.Context, req *joinservicev1.IssueJoinTicketRequest) (*joinservicev1.IssueJoinTicketResponse, error) {
	d := &decision{method: "IssueJoinTicket", controlPlane: req.GetIsControlPlane(), diskUUID: req.GetDiskUuid()}
	start := s.begin(ctx, d)
	resp, err := s.issueJoinTicket(ctx, req, d)
	return resp, s.finish(ctx, d, start, err)
}

func (s *Server) issueJoinTicket(ctx context.Context, req *joinservicev1.IssueJoinTicketRequest, d *decision) (*joinservicev1.IssueJoinTicketResponse, error) {
	adm, err := s.admit(ctx, d)
	if err != nil {
		return nil, err
	}
	if err := strict(req); err != nil {
		return nil, err
	}
	diskKeyID, err := diskKeyID(d.peer.Identity, req.GetDiskUuid())
	if err != nil {
		return nil, err
	}
	kubelet, err := clusterpki.ParseKubeletCSR(req.GetCertificateRequest())
	if err != nil {
		return nil, refuse(codes.InvalidArgument, "invalid_request", "%w", err)
	}
	d.node = kubelet.NodeName
	if err := checkDenied(adm.deny, d); err != nil {
		return nil, err
	}
	role := policy.RoleWorker
	if req.GetIsControlPlane() {
		role = policy.RoleControlPlane
	}
	if !slices.Contains(d.roles, role) {
		return nil, refuse(codes.PermissionDenied, "role_not_attested",
			"the node asked to join as %s, but its evidence satisfies the reference values of %v only; a node's role comes from what it measures at boot (docs/joinservice.md, \"Roles from evidence\")", role, d.roles)
	}
	if err := kubelet.CheckNames(adm.join.NodeNames(d.sourceAddr)); err != nil {
		return nil, refuse(codes.PermissionDenied, "name_not_owned", "%w", err)
	}
	if err := s.pass(ctx, gate.Join, d, kubelet.NodeName); err != nil {
		return nil, err
	}
	binding, err := s.cfg.Bindings.Claim(ctx, kubelet.NodeName, d.peer.Identity)
	switch {
	case errors.Is(err, nodebinding.ErrNameBound):
		return nil, refuse(codes.PermissionDenied, "name_bound", "%w", err)
	case errors.Is(err, nodebinding.ErrNameHeld):
		return nil, refuse(codes.PermissionDenied, "name_held", "%w", err)
	case err != nil:
		return nil, refuse(codes.Unavailable, "api_error", "%w", err)
	case binding.Rebound:
		d.rebound = &binding
	case binding.Adoption != nil:
		d.adoption = binding.Adoption
	}
	join := adm.join
	resp := &joinservicev1.IssueJoinTicketResponse{
		MeasurementSalt:          join.MeasurementSalt,
		ApiServerEndpoint:        join.APIServerEndpoint,
		DiscoveryTokenCaCertHash: s.cfg.CA.DiscoveryTokenCACertHash(),
		KubernetesVersion:        join.KubernetesVersion,
		KubernetesComponents:     join.Components,
		ImageMirror:              join.ImageMirror,
	}
	if role == policy.RoleControlPlane {
		if resp.ControlPlaneFiles, err = s.controlPlaneFiles(); err != nil {
			return nil, err
		}
		if resp.EtcdEncryptionKeys, err = s.etcdEncryptionKeys(ctx); err != nil {
			return nil, err
		}
	}
	if resp.StateDiskKey, resp.MeasurementSecret, err = s.keys(ctx, diskKeyID); err != nil {
		return nil, err
	}
	release := func(context.Context) error { return nil }
	if role == policy.RoleControlPlane {
		if release, err = s.cfg.ControlPlaneLock.Acquire(ctx, kubelet.NodeName, d.peer.Identity); err != nil {
			if errors.Is(err, errControlPlaneBusy) {
				r := refuse(codes.Unavailable, "control_plane_busy", "%w", err)
				r.retryAfter = controlPlaneBusyRetry
				return nil, r
			}
			return nil, refuse(codes.Unavailable, "api_error", "%w", err)
		}
	}
	undo := func() {
		if relErr := release(context.WithoutCancel(ctx)); relErr != nil {
			s.cfg.Log.Error("Releasing the control-plane join lock failed; it expires by itself", "node", kubelet.NodeName, "error", relErr.Error())
		}
	}
	if resp.KubeletCert, err = s.cfg.CA.SignKubelet(kubelet, s.cfg.Now(), s.cfg.KubeletCertLifetime); err != nil {
		undo()
		return nil, refuse(codes.Internal, "internal", "%w", err)
	}
	// The token is the last step: every step that can fail has passed, so a
	// refusal never leaves a token behind.
	token, err := s.cfg.Tokens.Issue(ctx, d.peer.Identity+"\x00"+kubelet.NodeName, d.source,
		"Gatehouse join ticket for node "+kubelet.NodeName)
	if err != nil {
		undo()
		return nil, refuse(codes.Unavailable, "api_error", "creating bootstrap token: %w", err)
	}
	s.metrics.tokens.Inc()
	d.tokenID = token.ID
	resp.Token = token.String()
	resp.TokenExpiration = timestamppb.New(token.Expiration)
	return resp, nil
}

// nodeNames are the names and addresses the caller of d owns under join.

// IssueRejoinTicket gives an attested, already joined node the keys to
// unlock its state disk. Errors as IssueJoinTicket's, without the CSR and
// control-plane ones.
func (s *Server) IssueRejoinTicket(ctx context.Context, req *joinservicev1.IssueRejoinTicketRequest) (*joinservicev1.IssueRejoinTicketResponse, error) {
	d := &decision{method: "IssueRejoinTicket", diskUUID: req.GetDiskUuid()}
	start := s.begin(ctx, d)
	resp, err := s.issueRejoinTicket(ctx, req, d)
	return resp, s.finish(ctx, d, start, err)
}

func (s *Server) issueRejoinTicket(ctx context.Context, req *joinservicev1.IssueRejoinTicketRequest, d *decision) (*joinservicev1.IssueRejoinTicketResponse, error) {
	adm, err := s.admit(ctx, d)
	if err != nil {
		return nil, err
	}
	if err := strict(req); err != nil {
		return nil, err
	}
	diskKeyID, err := diskKeyID(d.peer.Identity, req.GetDiskUuid())
	if err != nil {
		return nil, err
	}
	nodes := []string{}
	if node := req.GetRenewKubeletCredentialsFor(); node != "" {
		if err := s.checkRenewal(ctx, adm, d, node); err != nil {
			return nil, err
		}
		nodes = append(nodes, node)
	} else if nodes, err = s.cfg.BoundNames.NodesOf(d.peer.Identity); err != nil {
		return nil, refuse(codes.Unavailable, "api_error", "finding the node names bound to the caller: %w", err)
	}
	if len(nodes) == 0 {
		nodes = append(nodes, "") // never joined under a name: the deny list by identity still applies
	}
	for _, node := range nodes {
		if err := s.pass(ctx, gate.Rejoin, d, node); err != nil {
			return nil, err
		}
	}
	diskKey, secret, err := s.keys(ctx, diskKeyID)
	if err != nil {
		return nil, err
	}
	resp := &joinservicev1.IssueRejoinTicketResponse{StateDiskKey: diskKey, MeasurementSecret: secret}
	if d.node != "" {
		// Last, as in a join: no refusal leaves a token behind.
		token, err := s.cfg.Tokens.Issue(ctx, d.peer.Identity+"\x00"+d.node, d.source, "Gatehouse rejoin credentials for node "+d.node)
		if err != nil {
			return nil, refuse(codes.Unavailable, "api_error", "creating bootstrap token: %w", err)
		}
		s.metrics.tokens.Inc()
		d.tokenID = token.ID
		resp.KubeletBootstrapToken = token.String()
	}
	return resp, nil
}

// checkRenewal checks that a rejoining node may have new kubelet
// credentials for node: a valid node name, not denied, bound to the
// caller's identity (the machine that joined under it). It records node
// in d.
func (s *Server) checkRenewal(ctx context.Context, adm *admission, d *decision, node string) error {
	if msgs := validation.IsDNS1123Subdomain(node); len(msgs) > 0 {
		return refuse(codes.InvalidArgument, "invalid_request", "renew_kubelet_credentials_for %q is not a node name: %s", node, strings.Join(msgs, "; "))
	}
	d.node = node
	if err := checkDenied(adm.deny, d); err != nil {
		return err
	}
	bound, err := s.cfg.Bindings.Identity(ctx, node)
	switch {
	case errors.Is(err, nodebinding.ErrNotBound):
		return refuse(codes.PermissionDenied, "name_bound", "%w: only the machine that joined as %s gets its credentials", err, node)
	case err != nil:
		return refuse(codes.Unavailable, "api_error", "%w", err)
	case bound != d.peer.Identity:
		return refuse(codes.PermissionDenied, "name_bound", "%w: node %s is another machine's", nodebinding.ErrNameBound, node)
	}
	return nil
}

// pass asks the gate whether the caller of d may have a credential of
// kind for node, with the connection's evidence (appraised under the
// policy in force) as its fresh evidence.
func (s *Server) pass(ctx context.Context, kind gate.Kind, d *decision, node string) error {
	refusal, err := s.cfg.Gate.Decide(ctx, gate.Request{Kind: kind, Node: node, Evidence: &gate.Evidence{Identities: d.peer.Identities()}})
	switch {
	case err != nil:
		return refuse(codes.Unavailable, "not_ready", "%w", err)
	case refusal != nil:
		return refuse(codes.PermissionDenied, gateReason(refusal.Reason), "%w", refusal)
	}
	return nil
}

// gateReason is the audit reason of a gate refusal.
func gateReason(reason string) string {
	switch reason {
	case gate.ReasonDenied:
		return "denied"
	case gate.ReasonAwaitingRestore:
		return "awaiting_restore"
	case gate.ReasonTainted:
		return "tainted"
	}
	return "gate_" + strings.ToLower(reason)
}

// begin records the caller in d and counts the attempt.
func (s *Server) begin(ctx context.Context, d *decision) time.Time {
	s.metrics.attempts.WithLabelValues(d.method).Inc()
	if p, ok := peer.FromContext(ctx); ok {
		d.source = sourceHost(p.Addr)
		d.sourceAddr, _ = netip.ParseAddr(d.source)
		d.sourceAddr = d.sourceAddr.Unmap()
		if info, ok := p.AuthInfo.(atls.AuthInfo); ok {
			d.peer, d.evidence = info.Peer, info.Evidence
		}
	}
	return s.cfg.Now()
}

// admit runs the checks every request passes first: attested caller, rate
// limit, loaded policy, the caller's evidence appraised under the policy in
// force now (revocation takes effect on open connections), its roles, and
// the deny list by identity. It returns the policy snapshot the rest of the
// request uses, so every check sees one version.
func (s *Server) admit(ctx context.Context, d *decision) (*admission, error) {
	if d.peer == nil {
		return nil, refuse(codes.Unauthenticated, "unattested", "the caller did not attest")
	}
	if !s.limiter.Allow(d.source) {
		return nil, refuse(codes.ResourceExhausted, "rate_limited",
			"too many requests from %s (budget %g per second, burst %d); retry later", d.source, s.cfg.RateLimit.Rate, s.cfg.RateLimit.Burst)
	}
	join, deny, err := s.cfg.PolicyStore.Current()
	if err != nil {
		return nil, refuse(codes.Unavailable, "not_ready", "%w", err)
	}
	if err := s.reappraise(ctx, join, d); err != nil {
		return nil, err
	}
	return &admission{join: join, deny: deny}, checkDenied(deny, d)
}

// reappraise makes d.peer an appraisal under join's policy: the handshake's
// result when join's policy is the one that accepted it, else the
// connection's evidence verified again. A connection whose evidence no
// longer satisfies the policy gets nothing more.
func (s *Server) reappraise(ctx context.Context, join *joinconfig.JoinConfig, d *decision) error {
	if d.peer.AppraisalPolicy != join.Appraisal.ID {
		// A key activation the result asks for again was answered in this
		// connection's handshake, for these very evidence bytes (the same
		// AK and EK certificate); only the policy's roots are new, and
		// Verify checks the EK certificate against them.
		result, err := join.Appraisal.Verify(ctx, d.evidence.Data, d.evidence.Nonce)
		if err == nil && (result.Identity != d.peer.Identity || !bytes.Equal(result.UserData, d.peer.UserData)) {
			err = fmt.Errorf("%w: the evidence appraised again differs from the handshake's", attestation.ErrPolicy)
		}
		if err != nil {
			return refuse(codes.PermissionDenied, handshakeReason(err),
				"the join policy changed since this connection attested, and its evidence no longer satisfies it: %w", err)
		}
		d.peer = result
	}
	d.roles = join.Appraisal.Roles(d.peer.Measurements)
	if len(d.roles) == 0 {
		return refuse(codes.PermissionDenied, "measurement_mismatch", "the caller's measurements satisfy no role of the join policy")
	}
	return nil
}

// checkDenied consults deny with every identity the caller's evidence
// proves (attestation.Result.Identities) and, once known, its
// node name.
func checkDenied(deny *joinconfig.DenyList, d *decision) error {
	if entry, denied := deny.DeniesAny(d.peer.Identities(), d.node); denied {
		return refuse(codes.PermissionDenied, "denied", "denied by the cluster's deny list (entry %q)", entry)
	}
	return nil
}

// strict refuses a request with fields this service does not know: it
// acts only on what it can check.
func strict(req proto.Message) error {
	if err := protostrict.CheckUnknown(req); err != nil {
		return refuse(codes.InvalidArgument, "invalid_request", "%w", err)
	}
	return nil
}

// diskKeyID returns the key id of the caller's disk key: bound to its
// attestation identity, with the UUID canonicalised (keys.DiskKeyID).
func diskKeyID(identity, diskUUID string) (string, error) {
	id, err := keys.DiskKeyID(identity, diskUUID)
	if err != nil {
		return "", refuse(codes.InvalidArgument, "invalid_request",
			"disk_uuid %q is not a UUID in RFC 9562 text form (8-4-4-4-12 hex digits)", truncate(diskUUID, 40))
	}
	return id, nil
}

// keys fetches the disk key and the measurement secret.
func (s *Server) keys(ctx context.Context, diskKeyID string) (diskKey, measurementSecret []byte, err error) {
	if diskKey, err = s.cfg.Keys.GetDataKey(ctx, diskKeyID, keys.StateDiskKeySize); err != nil {
		return nil, nil, refuse(codes.Unavailable, "key_service_error", "getting the state disk key from the key service: %w", err)
	}
	if measurementSecret, err = s.cfg.Keys.GetDataKey(ctx, keys.MeasurementSecretID, keys.MeasurementSecretSize); err != nil {
		return nil, nil, refuse(codes.Unavailable, "key_service_error", "getting the measurement secret from the key service: %w", err)
	}
	return diskKey, measurementSecret, nil
}

// etcdEncryptionKeys fetches a control plane's KMS v2 key-encryption key
// (docs/keys.md, "Secrets encrypted in etcd").
func (s *Server) etcdEncryptionKeys(ctx context.Context) ([]*joinservicev1.EtcdEncryptionKey, error) {
	g := keys.EtcdEncryptionGeneration
	key, err := s.cfg.Keys.GetDataKey(ctx, keys.EtcdEncryptionKeyID(g), keys.EtcdEncryptionKeySize)
	if err != nil {
		return nil, refuse(codes.Unavailable, "key_service_error", "getting the KMS v2 key-encryption key from the key service: %w", err)
	}
	return []*joinservicev1.EtcdEncryptionKey{{Generation: uint32(g), Key: key}}, nil
}

func (s *Server) controlPlaneFiles() ([]*joinservicev1.ControlPlaneFile, error) {
	files := make([]*joinservicev1.ControlPlaneFile, 0, len(controlPlaneFileNames))
	for _, name := range controlPlaneFileNames {
		data, err := os.ReadFile(filepath.Join(s.cfg.PKIDir, name))
		if err != nil {
			return nil, refuse(codes.FailedPrecondition, "pki_error", "reading control-plane file %s from the service's PKI directory: %w", name, err)
		}
		files = append(files, &joinservicev1.ControlPlaneFile{Name: name, Data: data})
	}
	return files, nil
}

// finish writes the audit entry and metrics of d and maps err to a gRPC status.
func (s *Server) finish(ctx context.Context, d *decision, start time.Time, err error) error {
	s.metrics.latency.WithLabelValues(d.method).Observe(s.cfg.Now().Sub(start).Seconds())
	verdict, reason, code := "allowed", "allowed", codes.OK
	var r *refusal
	switch {
	case err == nil:
	case errors.As(err, &r):
		verdict, reason, code = "refused", r.reason, r.code
	case ctx.Err() != nil:
		verdict, reason, code = "refused", "canceled", status.FromContextError(ctx.Err()).Code()
	default:
		verdict, reason, code = "refused", "internal", codes.Internal
	}
	s.metrics.verdicts.WithLabelValues(d.method, verdict, reason).Inc()
	attrs := []slog.Attr{
		slog.String("event", "join.decision"),
		slog.String("method", d.method),
		slog.String("source", d.source),
		slog.String("verdict", verdict),
		slog.String("reason", reason),
		evidenceSummary(d.peer),
		slog.String("diskUUID", truncate(d.diskUUID, 40)),
	}
	if d.method == "IssueJoinTicket" {
		attrs = append(attrs, slog.String("node", d.node), slog.Bool("controlPlane", d.controlPlane))
	}
	if d.roles != nil {
		attrs = append(attrs, slog.Any("roles", d.roles))
	}
	if d.rebound != nil {
		attrs = append(attrs, slog.String("previousIdentity", d.rebound.PreviousIdentity), slog.Bool("rebound", true))
	}
	if a := d.adoption; a != nil {
		attrs = append(attrs, slog.Group("adoption", slog.String("by", a.By), slog.Time("at", a.At), slog.String("identity", a.Identity)))
	}
	if d.tokenID != "" {
		attrs = append(attrs, slog.String("tokenID", d.tokenID))
	}
	level := slog.LevelInfo
	if err != nil {
		level = slog.LevelWarn
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	s.cfg.Log.LogAttrs(ctx, level, "audit", attrs...)
	if err == nil {
		return nil
	}
	st := status.New(code, err.Error())
	if r != nil && r.retryAfter > 0 {
		if withRetry, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(r.retryAfter)}); derr == nil {
			st = withRetry
		}
	}
	return st.Err()
}

// evidenceSummary describes verified evidence for the audit log: variant,
// identity, every identity it proves (deny-list entries), how its key is
// endorsed, a digest of the measurements and the
// warn-only mismatches.
func evidenceSummary(r *attestation.Result) slog.Attr {
	if r == nil {
		return slog.Group("evidence")
	}
	return slog.Group("evidence",
		slog.String("variant", string(r.Variant)),
		slog.String("identity", r.Identity),
		slog.Any("identities", r.Identities()),
		slog.String("endorsement", r.Endorsement),
		slog.String("measurements", measurementsDigest(r.Measurements)),
		slog.Any("warnings", r.Warnings),
	)
}

func sourceHost(addr net.Addr) string {
	if addr == nil {
		return ""
	}
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return host
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Ready returns nil when the service can decide requests (its policy is
// loaded), else why not; for readiness probes.
func (s *Server) Ready() error {
	_, _, err := s.cfg.PolicyStore.Current()
	return err
}
