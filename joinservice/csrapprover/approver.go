// Package csrapprover approves kubelet certificates (client renewals,
// serving certificates, and first client certificates requested with a
// bootstrap token) only for a node whose fresh evidence verifies and
// passes the credential gate, for that node's own name and addresses; it
// denies the rest with a reason. It decides on a workqueue fed by an
// informer of CertificateSigningRequests; the controller manager signs
// what it approves (docs/continuous-attestation.md, "Certificates").
package csrapprover

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
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous"
	"github.com/gatehouse-dev/gatehouse/joinservice/gate"
)

// Signers of kubelet certificates (Kubernetes docs, "Certificate Signing
// Requests", Kubernetes signers).
const (
	signerKubeletClient  = certificatesv1.KubeAPIServerClientKubeletSignerName
	signerKubeletServing = certificatesv1.KubeletServingSignerName
)

// autoApprovalBindings are the ClusterRoleBindings through which kubeadm
// lets the controller manager approve every kubelet client certificate:
// renewals by any node, and first certificates for any node name by any
// bootstrap token (kubeadm's bootstrap-token phase creates them, `kubeadm
// upgrade apply` again). The approver deletes them and decides instead.
var autoApprovalBindings = []string{"kubeadm:node-autoapprove-certificate-rotation", "kubeadm:node-autoapprove-bootstrap"}

// bootstrapUserPrefix is the user name prefix of bootstrap tokens
// (system:bootstrap:<token id>).
const bootstrapUserPrefix = "system:bootstrap:"

// nodeUserPrefix is the user name prefix of node credentials.
const nodeUserPrefix = "system:node:"

// Reasons of the approver's CSR conditions, besides the failed check's
// continuous.Outcome reason (EvidenceRejected, IdentityChanged, ...).
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
	// reasonTokenInvalid: the bootstrap token's Secret is gone, expired,
	// or not a token kubeadm lets join nodes.
	reasonTokenInvalid = "TokenInvalid"
)

// joinGroup is the group of bootstrap tokens kubeadm lets request a
// kubelet's first client certificate (bootstraptoken.Group).
const joinGroup = bootstraptoken.Group

// nodeChecker verifies a node's fresh evidence and tells the names it owns
// (*continuous.NodeChecker).
type nodeChecker interface {
	Check(ctx context.Context, node *corev1.Node) (continuous.Outcome, error)
	NodeNames(addr netip.Addr) (clusterpki.NodeNames, error)
}

// credentialGate is the one decision every node credential passes
// (*gate.Gate).
type credentialGate interface {
	Decide(ctx context.Context, req gate.Request) (*gate.Refusal, error)
}

// identitySource returns the identity a node name is bound to
// (*nodebinding.Cache).
type identitySource interface {
	Identity(ctx context.Context, node string) (string, error)
}

// Config configures an Approver.
type Config struct {
	Client  kubernetes.Interface
	Checker nodeChecker
	// Gate decides, after the request's own checks, with the node's fresh
	// evidence.
	Gate credentialGate
	// Bindings tell whether a node name belongs to an attested machine: an
	// administrator's bootstrap token cannot get a certificate for one.
	Bindings identitySource
	// Events records an Event on the Node for each decision.
	Events events.EventRecorder
	// Freshness is how long a node's verification stands for its CSRs,
	// from when its evidence was taken: a burst of CSRs costs one
	// verification (10 s when zero).
	Freshness time.Duration
	// FetchTimeout bounds one node's check
	// (continuous.DefaultFetchTimeout when zero).
	FetchTimeout time.Duration
	// Workers bound the CSRs decided at once (4 when zero). A node's
	// check runs beside them, one at a time per node: a worker never
	// waits for a node that does not answer.
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
	cfg       Config
	decisions *prometheus.CounterVec

	mu       sync.Mutex
	recent   map[string]checked             // by node: its last verification
	inFlight map[string]chan struct{}       // by node: its check under way, closed when done
	waiting  map[string]map[string]struct{} // by node: CSRs decided once its check is done
	requeue  func(csr string)               // adds a CSR to Run's queue again
}

type checked struct {
	at      time.Time // when the evidence was taken (the check ended)
	outcome continuous.Outcome
}

// New returns the approver; its metrics are registered with
// cfg.Registerer.
func New(cfg Config) (*Approver, error) {
	if cfg.Client == nil || cfg.Checker == nil || cfg.Gate == nil || cfg.Bindings == nil || cfg.Events == nil || cfg.Log == nil || cfg.Registerer == nil {
		return nil, errors.New("certificate approver: Client, Verifier, Gate, Bindings, Events, Log and Registerer are required")
	}
	if cfg.Freshness <= 0 {
		cfg.Freshness = 10 * time.Second
	}
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = continuous.DefaultFetchTimeout
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
	return &Approver{cfg: cfg, decisions: decisions, recent: map[string]checked{}, inFlight: map[string]chan struct{}{},
		waiting: map[string]map[string]struct{}{}}, nil
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
	a.mu.Lock()
	a.requeue = queue.Add
	a.mu.Unlock()
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
					err = a.handle(ctx, csr, false)
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

// RemoveAutoApproval deletes the autoApprovalBindings that exist.
func (a *Approver) RemoveAutoApproval(ctx context.Context) error {
	for _, name := range autoApprovalBindings {
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
	if csr.Spec.SignerName != signerKubeletClient && csr.Spec.SignerName != signerKubeletServing {
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
//
// Handle waits for the node's check; Run's workers do not (a CSR whose
// node is being checked is decided again once the check ends).
func (a *Approver) Handle(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) error {
	return a.handle(ctx, csr, true)
}

// errPending means the CSR's node is being checked: it is decided again
// when the check ends.
var errPending = errors.New("the node's check is under way")

func (a *Approver) handle(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, wait bool) error {
	if !decidable(csr) {
		return nil
	}
	node, reason, message, err := a.decide(ctx, csr, wait)
	if errors.Is(err, errPending) {
		return nil
	}
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
// with a message, and the Node it is for when there is one. Without wait,
// it returns errPending while the node's check is under way.
func (a *Approver) decide(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, wait bool) (*corev1.Node, string, string, error) {
	if tokenID, ok := strings.CutPrefix(csr.Spec.Username, bootstrapUserPrefix); ok && csr.Spec.SignerName == signerKubeletClient {
		return a.decideFirst(ctx, csr, tokenID, wait)
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
	case signerKubeletServing:
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
	o, err := a.fresh(ctx, node, csr.Name, wait)
	if err != nil {
		return nil, "", "", err
	}
	if reason, message, err := a.pass(ctx, gate.Renewal, name, &o); reason != "" || err != nil {
		return node, reason, message, err
	}
	if serving != nil {
		names, err := a.cfg.Checker.NodeNames(o.Address)
		if err != nil {
			return nil, "", "", err
		}
		if err := serving.CheckNames(names); err != nil {
			return node, reasonNameNotOwned, err.Error(), nil
		}
	}
	return node, ReasonApproved, fmt.Sprintf("fresh evidence of node %s verifies, from the machine that joined (%s)", name, o.Identity), nil
}

// pass asks the gate for a credential of kind for node, with o as the
// fresh evidence (nil: an administrator's token); it returns the
// refusal's reason and message, "" when allowed.
func (a *Approver) pass(ctx context.Context, kind gate.Kind, node string, o *continuous.Outcome) (string, string, error) {
	req := gate.Request{Kind: kind, Node: node}
	if o != nil {
		req.Evidence = &gate.Evidence{}
		if o.Attested {
			req.Evidence.Identities = o.Identities
		} else {
			req.Evidence.Failure, req.Evidence.Message = o.Reason, o.Message
		}
	}
	refusal, err := a.cfg.Gate.Decide(ctx, req)
	if err != nil || refusal == nil {
		return "", "", err
	}
	return refusal.Reason, refusal.Message, nil
}

// decideFirst decides a kubelet's first client certificate, requested
// with bootstrap token tokenID: the token must be valid and of kubeadm's
// join group (what kubeadm's binding let the controller manager approve).
// A token the join service issued to one node (AnnotationNode) gets a
// certificate for that node only, and only once the node's fresh evidence
// passes the gate (fetched where the node joined from, or its Node's
// address): the token may have outlived the node's good standing. A token
// an administrator made names no node: it gets no certificate for a name
// an attested machine holds, and the gate's record and taint still apply.
func (a *Approver) decideFirst(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, tokenID string, wait bool) (*corev1.Node, string, string, error) {
	block, rest := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" || len(strings.TrimSpace(string(rest))) > 0 {
		return nil, reasonMalformed, "the request is not one PEM CERTIFICATE REQUEST", nil
	}
	named, err := clusterpki.ParseKubeletClientCSR(block.Bytes)
	if err == nil {
		err = checkUsages(csr.Spec.Usages, certificatesv1.UsageClientAuth)
	}
	if err != nil {
		return nil, reasonMalformed, err.Error(), nil
	}
	if !slices.Contains(csr.Spec.Groups, joinGroup) {
		return nil, reasonTokenInvalid, fmt.Sprintf("bootstrap token %s is not in the join group %s", tokenID, joinGroup), nil
	}
	secret, err := a.cfg.Client.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, bootstraptoken.SecretName(tokenID), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, reasonTokenInvalid, fmt.Sprintf("bootstrap token %s no longer exists", tokenID), nil
	}
	if err != nil {
		return nil, "", "", fmt.Errorf("reading bootstrap token %s: %w", tokenID, err)
	}
	token, ok := bootstraptoken.FromSecret(secret)
	if !ok || !a.cfg.Now().Before(token.Expiration) {
		return nil, reasonTokenInvalid, fmt.Sprintf("bootstrap token %s is malformed or expired", tokenID), nil
	}
	node, err := a.cfg.Client.CoreV1().Nodes().Get(ctx, named, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		node = nil
	case err != nil:
		return nil, "", "", fmt.Errorf("reading Node %s: %w", named, err)
	}
	issuedTo, issuedToOne := secret.Annotations[bootstraptoken.AnnotationNode]
	if !issuedToOne {
		if _, err := a.cfg.Bindings.Identity(ctx, named); err == nil {
			return node, reasonNotItsOwn, fmt.Sprintf("bootstrap token %s, issued to no particular node, requested node %s, whose name an attested machine holds", tokenID, named), nil
		}
		if reason, message, err := a.pass(ctx, gate.FirstCertificate, named, nil); reason != "" || err != nil {
			return node, reason, message, err
		}
		return node, ReasonApprovedJoin, fmt.Sprintf("bootstrap token %s of kubeadm's join group, issued to no particular node, requested node %s", tokenID, named), nil
	}
	if named != issuedTo {
		return node, reasonNotItsOwn, fmt.Sprintf("bootstrap token %s was issued to node %s, not %s", tokenID, issuedTo, named), nil
	}
	target := node
	if target == nil {
		// Not registered yet: its evidence is where it joined from.
		target = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: named}}
		if addr := secret.Annotations[bootstraptoken.AnnotationAddress]; addr != "" {
			target.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}
		}
	}
	o, err := a.fresh(ctx, target, csr.Name, wait)
	if err != nil {
		return nil, "", "", err
	}
	if reason, message, err := a.pass(ctx, gate.FirstCertificate, named, &o); reason != "" || err != nil {
		return node, reason, message, err
	}
	return node, ReasonApprovedJoin, fmt.Sprintf("bootstrap token %s was issued to node %s, whose fresh evidence verifies", tokenID, named), nil
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

// fresh returns node's verification, at most Freshness old (counted from
// when its evidence was taken): a burst of CSRs from one node costs one
// evidence fetch. A node has at most one check in flight. Without wait,
// when the node must be checked, fresh starts the check (unless one is
// under way), remembers csr, and returns errPending: the CSR is queued
// again when the check ends, and the worker is free meanwhile.
func (a *Approver) fresh(ctx context.Context, node *corev1.Node, csr string, wait bool) (continuous.Outcome, error) {
	for {
		now := a.cfg.Now()
		a.mu.Lock()
		for name, old := range a.recent {
			if now.Sub(old.at) >= a.cfg.Freshness {
				delete(a.recent, name)
			}
		}
		if c, ok := a.recent[node.Name]; ok {
			a.mu.Unlock()
			return c.outcome, nil
		}
		done, running := a.inFlight[node.Name]
		if !running {
			done = make(chan struct{})
			a.inFlight[node.Name] = done
			go a.check(context.WithoutCancel(ctx), node.DeepCopy(), done)
		}
		if !wait {
			if a.waiting[node.Name] == nil {
				a.waiting[node.Name] = map[string]struct{}{}
			}
			a.waiting[node.Name][csr] = struct{}{}
			a.mu.Unlock()
			return continuous.Outcome{}, errPending
		}
		a.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return continuous.Outcome{}, ctx.Err()
		}
	}
}

// check verifies node once, bounded by FetchTimeout, caches the outcome
// with the time its evidence was taken, closes done and queues the CSRs
// that wait for it.
func (a *Approver) check(ctx context.Context, node *corev1.Node, done chan struct{}) {
	cctx, cancel := context.WithTimeout(ctx, a.cfg.FetchTimeout)
	o, err := a.cfg.Checker.Check(cctx, node)
	cancel()
	a.mu.Lock()
	defer a.mu.Unlock()
	if err == nil {
		a.recent[node.Name] = checked{at: a.cfg.Now(), outcome: o}
	} else {
		a.cfg.Log.Warn("Could not check a node for its kubelet certificates; its requests are retried", "node", node.Name, "error", err.Error())
	}
	delete(a.inFlight, node.Name)
	close(done)
	for csr := range a.waiting[node.Name] {
		if a.requeue != nil {
			a.requeue(csr)
		}
	}
	delete(a.waiting, node.Name)
}

// truncate cuts s to n bytes, marking the cut, for a condition's or an
// Event's message (as continuous does for its own).
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
