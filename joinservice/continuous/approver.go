package continuous

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"

	"github.com/gatehouse-dev/gatehouse/internal/bootstraptoken"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
)

// Signers of kubelet certificates (Kubernetes docs, "Certificate Signing
// Requests", Kubernetes signers).
const (
	SignerKubeletClient  = certificatesv1.KubeAPIServerClientKubeletSignerName
	SignerKubeletServing = certificatesv1.KubeletServingSignerName
)

// AutoApprovalBindings are the ClusterRoleBindings through which kubeadm
// lets the controller manager approve every kubelet client certificate:
// renewals by any node, and first certificates for any node name by any
// bootstrap token (kubeadm's bootstrap-token phase creates them, `kubeadm
// upgrade apply` again). The approver deletes them and decides instead.
var AutoApprovalBindings = []string{"kubeadm:node-autoapprove-certificate-rotation", "kubeadm:node-autoapprove-bootstrap"}

// bootstrapUserPrefix is the user name prefix of bootstrap tokens
// (system:bootstrap:<token id>).
const bootstrapUserPrefix = "system:bootstrap:"

// nodeUserPrefix is the user name prefix of node credentials.
const nodeUserPrefix = "system:node:"

// Reasons of the approver's CSR conditions, besides the failed check's
// Outcome reason (EvidenceRejected, IdentityChanged, ...).
const (
	ReasonApproved = "AttestedNode"
	// ReasonApprovedJoin: a first client certificate, requested with a
	// bootstrap token issued for that node (after its evidence verified).
	ReasonApprovedJoin = "AttestedJoin"
	// reasonMalformed: the request is not a kubelet certificate request.
	reasonMalformed = "Malformed"
	// reasonNotItsOwn: the requester is not the node the certificate names.
	reasonNotItsOwn = "NotItsOwn"
	// reasonNameNotOwned: a serving certificate with a name or address the
	// node does not own.
	reasonNameNotOwned = "NameNotOwned"
	// reasonNoNode: no Node of that name.
	reasonNoNode = "NoNode"
	// reasonTainted: the Node is tainted TaintKey and not restored yet.
	reasonTainted = "Unattested"
	// reasonTokenInvalid: the bootstrap token's Secret is gone, expired,
	// or not a token kubeadm lets join nodes.
	reasonTokenInvalid = "TokenInvalid"
)

// joinGroup is the group of bootstrap tokens kubeadm lets request a
// kubelet's first client certificate (bootstraptoken.Group).
const joinGroup = bootstraptoken.Group

// nodeChecker verifies a node's fresh evidence and tells the names it owns
// (*Verifier).
type nodeChecker interface {
	Check(ctx context.Context, node *corev1.Node) (Outcome, error)
	NodeNames(addr netip.Addr) (clusterpki.NodeNames, error)
}

// ApproverConfig configures an Approver.
type ApproverConfig struct {
	Client   kubernetes.Interface
	Verifier nodeChecker
	// Events records an Event on the Node for each decision.
	Events events.EventRecorder
	// Freshness is how long a node's verified evidence stands for its
	// CSRs: a burst of CSRs costs one verification (10 s when zero).
	Freshness time.Duration
	// Workers bound the CSRs decided at once (4 when zero).
	Workers    int
	Now        func() time.Time
	Log        *slog.Logger
	Registerer prometheus.Registerer
}

// Approver approves kubelet client renewals and kubelet serving
// certificates only for a node whose fresh evidence verifies, for that
// node's own name and addresses; it denies the rest with a reason. The
// controller manager signs what it approves (docs/continuous-attestation.md,
// "Certificates").
type Approver struct {
	cfg       ApproverConfig
	decisions *prometheus.CounterVec

	mu     sync.Mutex
	recent map[string]checked // by node: its last verification
}

type checked struct {
	at      time.Time
	outcome Outcome
}

// NewApprover returns the approver; its metrics are registered with
// cfg.Registerer.
func NewApprover(cfg ApproverConfig) (*Approver, error) {
	if cfg.Client == nil || cfg.Verifier == nil || cfg.Events == nil || cfg.Log == nil || cfg.Registerer == nil {
		return nil, errors.New("certificate approver: Client, Verifier, Events, Log and Registerer are required")
	}
	if cfg.Freshness <= 0 {
		cfg.Freshness = 10 * time.Second
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "gatehouse", Subsystem: "reattest", Name: "csr_decisions_total",
		Help: "Kubelet certificate signing requests decided, by signer and result (approved, or the denial's reason).",
	}, []string{"signer", "result"})
	if err := cfg.Registerer.Register(decisions); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	return &Approver{cfg: cfg, decisions: decisions, recent: map[string]checked{}}, nil
}

// Run decides every pending kubelet CSR, and each new one, until ctx
// ends; every minute it makes sure kubeadm's automatic approval of client
// renewals is gone.
func (a *Approver) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactory(a.cfg.Client, 10*time.Minute)
	informer := factory.Certificates().V1().CertificateSigningRequests()
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	defer queue.ShutDown()
	enqueue := func(obj any) {
		if csr, ok := obj.(*certificatesv1.CertificateSigningRequest); ok && decidable(csr) {
			queue.Add(csr.Name)
		}
	}
	if _, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return err
	}
	lister := informer.Lister()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := a.RemoveAutoApproval(ctx); err != nil {
			a.cfg.Log.Warn("Could not remove kubeadm's automatic approval of kubelet client renewals; retrying in a minute", "error", err.Error())
		}
	}, time.Minute)
	if !cache.WaitForCacheSync(ctx.Done(), informer.Informer().HasSynced) {
		return ctx.Err()
	}
	for range a.cfg.Workers {
		go func() {
			for {
				name, quit := queue.Get()
				if quit {
					return
				}
				csr, err := lister.Get(name)
				if err == nil {
					err = a.Handle(ctx, csr)
				} else if apierrors.IsNotFound(err) {
					err = nil
				}
				if err != nil {
					a.cfg.Log.Warn("Could not decide a kubelet certificate request; retrying", "csr", name, "error", err.Error())
					queue.AddRateLimited(name)
				} else {
					queue.Forget(name)
				}
				queue.Done(name)
			}
		}()
	}
	<-ctx.Done()
	return ctx.Err()
}

// RemoveAutoApproval deletes the AutoApprovalBindings that exist.
func (a *Approver) RemoveAutoApproval(ctx context.Context) error {
	for _, name := range AutoApprovalBindings {
		err := a.cfg.Client.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return fmt.Errorf("deleting ClusterRoleBinding %s: %w", name, err)
		}
		a.cfg.Log.Warn("audit", "event", "reattest.autoapproval_removed", "binding", name,
			"message", "kubelet client certificates are approved only for attested nodes, by the join service")
	}
	return nil
}

// decidable reports whether csr is a pending kubelet certificate request
// this approver decides.
func decidable(csr *certificatesv1.CertificateSigningRequest) bool {
	if csr.Spec.SignerName != SignerKubeletClient && csr.Spec.SignerName != SignerKubeletServing {
		return false
	}
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed {
			return false
		}
	}
	return true
}

// Handle decides csr once, if it is a pending kubelet certificate request
// this approver decides, and writes the decision. It returns an error when
// nothing could be decided (no policy, API errors): try again later.
func (a *Approver) Handle(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) error {
	if !decidable(csr) {
		return nil
	}
	node, reason, message, err := a.decide(ctx, csr)
	if err != nil {
		return err
	}
	approved := reason == ReasonApproved || reason == ReasonApprovedJoin
	cond := certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: reason, Message: truncate(message, 512),
		LastUpdateTime: metav1.NewTime(a.cfg.Now()),
	}
	if approved {
		cond.Type = certificatesv1.CertificateApproved
	}
	update := csr.DeepCopy()
	update.Status.Conditions = append(update.Status.Conditions, cond)
	if _, err := a.cfg.Client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, update, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("recording the decision on CertificateSigningRequest %s: %w", csr.Name, err)
	}
	result, level, kind := "approved", slog.LevelInfo, corev1.EventTypeNormal
	if !approved {
		result, level, kind = reason, slog.LevelWarn, corev1.EventTypeWarning
	}
	a.decisions.WithLabelValues(csr.Spec.SignerName, result).Inc()
	a.cfg.Log.Log(ctx, level, "audit", "event", "reattest.csr", "csr", csr.Name, "signer", csr.Spec.SignerName,
		"requester", csr.Spec.Username, "node", nodeName(node), "result", result, "message", message)
	if node != nil {
		a.cfg.Events.Eventf(node, nil, kind, string(cond.Type), "ApproveCertificate", "%s %s: %s", csr.Name, reason, truncate(message, 512))
	}
	return nil
}

func nodeName(n *corev1.Node) string {
	if n == nil {
		return ""
	}
	return n.Name
}

// decide returns the decision on csr: ReasonApproved or a denial's reason,
// with a message, and the Node it is for when there is one.
func (a *Approver) decide(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (*corev1.Node, string, string, error) {
	if tokenID, ok := strings.CutPrefix(csr.Spec.Username, bootstrapUserPrefix); ok && csr.Spec.SignerName == SignerKubeletClient {
		reason, message, err := a.decideFirst(ctx, csr, tokenID)
		return nil, reason, message, err
	}
	name, isNode := strings.CutPrefix(csr.Spec.Username, nodeUserPrefix)
	if !isNode {
		return nil, reasonNotItsOwn, fmt.Sprintf("requested by %q: only a node's own credentials may request its kubelet certificates", csr.Spec.Username), nil
	}
	block, rest := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" || len(strings.TrimSpace(string(rest))) > 0 {
		return nil, reasonMalformed, "the request is not one PEM CERTIFICATE REQUEST", nil
	}
	var serving *clusterpki.KubeletRequest
	var named string
	var err error
	switch csr.Spec.SignerName {
	case SignerKubeletServing:
		serving, err = clusterpki.ParseKubeletCSR(block.Bytes)
		if err == nil {
			named, err = serving.NodeName, checkUsages(csr.Spec.Usages, certificatesv1.UsageServerAuth)
		}
	default:
		named, err = clusterpki.ParseKubeletClientCSR(block.Bytes)
		if err == nil {
			err = checkUsages(csr.Spec.Usages, certificatesv1.UsageClientAuth)
		}
	}
	if err != nil {
		return nil, reasonMalformed, err.Error(), nil
	}
	if named != name {
		return nil, reasonNotItsOwn, fmt.Sprintf("node %s requested a certificate for node %s", name, named), nil
	}
	node, err := a.cfg.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, reasonNoNode, fmt.Sprintf("there is no Node %s", name), nil
	}
	if err != nil {
		return nil, "", "", fmt.Errorf("reading Node %s: %w", name, err)
	}
	if hasTaint(node) {
		return node, reasonTainted, fmt.Sprintf("the Node is tainted %s: it must prove itself again (or an administrator restore it) first", TaintKey), nil
	}
	o, err := a.fresh(ctx, node)
	if err != nil {
		return nil, "", "", err
	}
	if !o.Attested {
		return node, o.Reason, o.Message, nil
	}
	if serving != nil {
		names, err := a.cfg.Verifier.NodeNames(o.Address)
		if err != nil {
			return nil, "", "", err
		}
		if err := serving.CheckNames(names); err != nil {
			return node, reasonNameNotOwned, err.Error(), nil
		}
	}
	return node, ReasonApproved, fmt.Sprintf("fresh evidence of node %s verifies, from the machine that joined (%s)", name, o.Identity), nil
}

// decideFirst decides a kubelet's first client certificate, requested
// with bootstrap token tokenID: the token must be valid and of kubeadm's
// join group (what kubeadm's binding let the controller manager approve),
// and a token the join service issued to one node (AnnotationNode) gets a
// certificate for that node only. The token was issued after that node's
// evidence verified and lives minutes; the Node does not exist yet.
func (a *Approver) decideFirst(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, tokenID string) (string, string, error) {
	block, rest := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" || len(strings.TrimSpace(string(rest))) > 0 {
		return reasonMalformed, "the request is not one PEM CERTIFICATE REQUEST", nil
	}
	named, err := clusterpki.ParseKubeletClientCSR(block.Bytes)
	if err == nil {
		err = checkUsages(csr.Spec.Usages, certificatesv1.UsageClientAuth)
	}
	if err != nil {
		return reasonMalformed, err.Error(), nil
	}
	if !slices.Contains(csr.Spec.Groups, joinGroup) {
		return reasonTokenInvalid, fmt.Sprintf("bootstrap token %s is not in the join group %s", tokenID, joinGroup), nil
	}
	secret, err := a.cfg.Client.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, bootstraptoken.SecretName(tokenID), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return reasonTokenInvalid, fmt.Sprintf("bootstrap token %s no longer exists", tokenID), nil
	}
	if err != nil {
		return "", "", fmt.Errorf("reading bootstrap token %s: %w", tokenID, err)
	}
	token, ok := bootstraptoken.FromSecret(secret)
	if !ok || !a.cfg.Now().Before(token.Expiration) {
		return reasonTokenInvalid, fmt.Sprintf("bootstrap token %s is malformed or expired", tokenID), nil
	}
	node, issuedToOne := secret.Annotations[bootstraptoken.AnnotationNode]
	if !issuedToOne {
		// A token an administrator made (kubeadm token create) may join
		// any node, as with kubeadm's binding.
		return ReasonApprovedJoin, fmt.Sprintf("bootstrap token %s of kubeadm's join group, issued to no particular node, requested node %s", tokenID, named), nil
	}
	if named != node {
		return reasonNotItsOwn, fmt.Sprintf("bootstrap token %s was issued to node %s, not %s", tokenID, node, named), nil
	}
	return ReasonApprovedJoin, fmt.Sprintf("bootstrap token %s was issued to node %s after its evidence verified", tokenID, node), nil
}

// checkUsages checks that usages hold want and otherwise only digital
// signature and key encipherment, as a kubelet asks.
func checkUsages(usages []certificatesv1.KeyUsage, want certificatesv1.KeyUsage) error {
	if !slices.Contains(usages, want) {
		return fmt.Errorf("the request's usages %v lack %q", usages, want)
	}
	for _, u := range usages {
		if u != want && u != certificatesv1.UsageDigitalSignature && u != certificatesv1.UsageKeyEncipherment {
			return fmt.Errorf("the request asks for usage %q; a kubelet certificate has %q, digital signature and key encipherment only", u, want)
		}
	}
	return nil
}

// fresh returns node's verification, at most Freshness old: a burst of
// CSRs from one node costs one evidence fetch.
func (a *Approver) fresh(ctx context.Context, node *corev1.Node) (Outcome, error) {
	now := a.cfg.Now()
	a.mu.Lock()
	c, ok := a.recent[node.Name]
	for name, old := range a.recent {
		if now.Sub(old.at) >= a.cfg.Freshness {
			delete(a.recent, name)
		}
	}
	a.mu.Unlock()
	if ok && now.Sub(c.at) < a.cfg.Freshness {
		return c.outcome, nil
	}
	o, err := a.cfg.Verifier.Check(ctx, node)
	if err != nil {
		return Outcome{}, err
	}
	a.mu.Lock()
	a.recent[node.Name] = checked{at: now, outcome: o}
	a.mu.Unlock()
	return o, nil
}
