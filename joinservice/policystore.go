package joinservice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

// errNotReady means the join config (or a deny list that exists) has not
// loaded yet or never validated; the service refuses to act on a policy it
// does not have.
var errNotReady = errors.New("join service policy not loaded")

// PolicyStore is the live policy of the join service: the join config and
// the deny list, each swapped atomically when its ConfigMap changes. An
// update that does not validate is refused, logged and counted; the
// previous version stays. Deleting a ConfigMap is refused the same way (to
// clear the deny list, empty it). The handshake appraises with the current
// join config through liveVerifier. It is safe for concurrent use.
type PolicyStore struct {
	variant attestation.Variant
	now     func() time.Time
	log     *slog.Logger
	reloads *prometheus.CounterVec

	join atomic.Pointer[joinconfig.JoinConfig]
	deny atomic.Pointer[joinconfig.DenyList]
}

// NewPolicyStore returns an empty policy for variant; it refuses everything until
// ApplyJoinConfig succeeds. now is the clock AK certificates are checked
// with; the counter gatehouse_joinservice_config_reloads_total{configmap,
// result="applied"|"refused"} is registered with reg.
func NewPolicyStore(variant attestation.Variant, now func() time.Time, log *slog.Logger, reg prometheus.Registerer) (*PolicyStore, error) {
	if _, err := variant.OID(); err != nil {
		return nil, err
	}
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "gatehouse", Subsystem: "joinservice", Name: "config_reloads_total",
		Help: "ConfigMap versions applied or refused, by ConfigMap name.",
	}, []string{"configmap", "result"})
	if err := reg.Register(reloads); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	return &PolicyStore{variant: variant, now: now, log: log, reloads: reloads}, nil
}

// ApplyJoinConfig validates the join config ConfigMap and makes it current.
// On error the previous config stays.
func (p *PolicyStore) ApplyJoinConfig(cm *corev1.ConfigMap) error {
	cfg, err := joinconfig.ParseJoinConfig(cm.Data, p.variant, p.now)
	if err != nil {
		p.refused(cm, err)
		return err
	}
	p.join.Store(cfg)
	p.log.Info("Join config applied", "configmap", cm.Namespace+"/"+cm.Name,
		"resourceVersion", cm.ResourceVersion, "policy", cfg.Summary, "kubernetesVersion", cfg.KubernetesVersion)
	p.reloads.WithLabelValues(cm.Name, "applied").Inc()
	return nil
}

// ApplyDenyList validates the deny list ConfigMap and makes it current. On
// error the previous deny list stays.
func (p *PolicyStore) ApplyDenyList(cm *corev1.ConfigMap) error {
	d, err := joinconfig.ParseDenyList(cm.Data[joinconfig.KeyDenyList])
	if err != nil {
		p.refused(cm, err)
		return err
	}
	p.deny.Store(&d)
	p.log.Info("Deny list applied", "configmap", cm.Namespace+"/"+cm.Name,
		"resourceVersion", cm.ResourceVersion, "entries", d.Len())
	p.reloads.WithLabelValues(cm.Name, "applied").Inc()
	return nil
}

func (p *PolicyStore) refused(cm *corev1.ConfigMap, err error) {
	// Logged before it is counted: whoever sees the count finds the line.
	p.log.Error("ConfigMap update refused; the previous version stays in force",
		"configmap", cm.Namespace+"/"+cm.Name, "resourceVersion", cm.ResourceVersion, "error", err.Error())
	p.reloads.WithLabelValues(cm.Name, "refused").Inc()
}

// Current returns the join config and deny list in force, or errNotReady.
func (p *PolicyStore) Current() (*joinconfig.JoinConfig, *joinconfig.DenyList, error) {
	join, deny := p.join.Load(), p.deny.Load()
	switch {
	case join == nil:
		return nil, nil, fmt.Errorf("%w: no valid join config yet", errNotReady)
	case deny == nil:
		return nil, nil, fmt.Errorf("%w: the deny list ConfigMap does not validate", errNotReady)
	}
	return join, deny, nil
}

// liveVerifier is the service's attestation verifier: it appraises with
// the store's current join config, so a new config applies to the next
// handshake.
type liveVerifier struct{ store *PolicyStore }

// Variant returns the service's attestation variant.
func (v liveVerifier) Variant() attestation.Variant { return v.store.variant }

// Verify appraises evidence with the current join config's verifier; with
// no valid join config yet it returns an error wrapping
// attestation.ErrPolicy and errNotReady.
func (v liveVerifier) Verify(ctx context.Context, evidence, nonce []byte) (*attestation.Result, error) {
	join := v.store.join.Load()
	if join == nil {
		return nil, fmt.Errorf("%w: %w: no valid join config yet", attestation.ErrPolicy, errNotReady)
	}
	return join.Appraisal.Verify(ctx, evidence, nonce)
}

// Watch follows the join config and deny list ConfigMaps (by name, in
// namespace) with informers until ctx ends. It returns once both informers
// have delivered their initial state; a deny list ConfigMap that does not
// exist then is an empty deny list. A missing or invalid join config is not
// an error here: the service stays not ready until a valid one appears.
func (p *PolicyStore) Watch(ctx context.Context, client kubernetes.Interface, namespace, joinName, denyName string) error {
	joinSynced, err := p.watchConfigMap(ctx, client, namespace, joinName, p.ApplyJoinConfig)
	if err != nil {
		return err
	}
	denySynced, err := p.watchConfigMap(ctx, client, namespace, denyName, p.ApplyDenyList)
	if err != nil {
		return err
	}
	if !cache.WaitForNamedCacheSyncWithContext(ctx, joinSynced.HasSynced, denySynced.HasSynced) {
		return fmt.Errorf("waiting for ConfigMaps %s and %s: %w", joinName, denyName, ctx.Err())
	}
	if !denySynced.seen.Load() && p.deny.Load() == nil {
		p.deny.Store(&joinconfig.DenyList{})
		p.log.Info("No deny list ConfigMap; nothing is denied", "configmap", namespace+"/"+denyName)
	}
	if p.join.Load() == nil {
		p.log.Warn("No valid join config yet; refusing joins until one appears", "configmap", namespace+"/"+joinName)
	}
	return nil
}

// watched is the registration of one ConfigMap's handler.
type watched struct {
	cache.ResourceEventHandlerRegistration
	seen atomic.Bool // the ConfigMap existed at some point
}

func (p *PolicyStore) watchConfigMap(ctx context.Context, client kubernetes.Interface, namespace, name string, apply func(*corev1.ConfigMap) error) (*watched, error) {
	lw := cache.NewListWatchFromClient(client.CoreV1().RESTClient(), "configmaps", namespace,
		fields.OneTermEqualSelector("metadata.name", name))
	informer := cache.NewSharedIndexInformerWithOptions(lw, &corev1.ConfigMap{}, cache.SharedIndexInformerOptions{})
	w := &watched{}
	onChange := func(obj any) {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			w.seen.Store(true)
			_ = apply(cm) // apply logs and counts a refusal
		}
	}
	reg, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onChange,
		UpdateFunc: func(_, obj any) { onChange(obj) },
		DeleteFunc: func(any) {
			p.reloads.WithLabelValues(name, "refused").Inc()
			p.log.Error("ConfigMap deleted; the previous version stays in force", "configmap", namespace+"/"+name)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("watching ConfigMap %s/%s: %w", namespace, name, err)
	}
	w.ResourceEventHandlerRegistration = reg
	go informer.RunWithContext(ctx)
	return w, nil
}
