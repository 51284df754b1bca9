package keyservice

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kms/kek"
	"github.com/gatehouse-dev/gatehouse/keyservice/secretstore"
)

// KMSConfig says where the key service's keys come from: either a KMS URI
// file, or a master secret file and a salt file (a mounted Kubernetes Secret).
type KMSConfig struct {
	// URIFile holds a kms:// URI (docs/keys.md).
	URIFile string
	// MasterSecretFile and SaltFile hold the raw master secret and salt.
	MasterSecretFile, SaltFile string
	// Client and Namespace store wrapped DEKs for the pkcs11 backend.
	Client    kubernetes.Interface
	Namespace string
	// CheckInterval is how often an external KMS (aws-kms, vault-transit)
	// is asked to unwrap the master secret again; kms.DefaultCheckInterval
	// if zero.
	CheckInterval time.Duration
	// AWSOptions add to the AWS SDK's loading options.
	AWSOptions []func(*config.LoadOptions) error
}

// closerFunc is a key source's closer.
type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// noClose is the closer of a key source that holds nothing to release.
var noClose = closerFunc(func() error { return nil })

// OpenKMS builds the key source cfg describes; close the returned closer on
// shutdown. With an external KMS the master secret is unwrapped now and
// again every check interval (kms.WrappedKMS), until the closer is called;
// a failed unwrap is logged and makes requests Unavailable with its reason
// until the KMS answers, and is no error here.
func OpenKMS(ctx context.Context, cfg KMSConfig, log *slog.Logger, reg prometheus.Registerer) (keySource, io.Closer, error) {
	switch {
	case cfg.URIFile != "" && (cfg.MasterSecretFile != "" || cfg.SaltFile != ""):
		return nil, nil, errors.New("give either a KMS URI file or master secret and salt files, not both")
	case cfg.URIFile == "" && (cfg.MasterSecretFile == "" || cfg.SaltFile == ""):
		return nil, nil, errors.New("no key source: give a KMS URI file, or both a master secret file and a salt file")
	case cfg.URIFile == "":
		secret, err := os.ReadFile(cfg.MasterSecretFile)
		if err != nil {
			return nil, nil, fmt.Errorf("reading master secret: %w", err)
		}
		salt, err := os.ReadFile(cfg.SaltFile)
		if err != nil {
			return nil, nil, fmt.Errorf("reading master salt: %w", err)
		}
		k, err := kms.NewClusterKMS(secret, salt)
		return k, noClose, err
	}
	data, err := os.ReadFile(cfg.URIFile)
	if err != nil {
		return nil, nil, fmt.Errorf("reading KMS URI: %w", err)
	}
	parsed, err := kms.ParseURI(strings.TrimSpace(string(data)))
	if err != nil {
		return nil, nil, err
	}
	if w, ok := kms.External(parsed); ok {
		if !w.IsWrapped() {
			return nil, nil, fmt.Errorf("%s names a key-encryption key but carries no wrapped master secret (wrapped=…&salt=…): give the URI gatehouse init wrote", cfg.URIFile)
		}
		return openWrapped(ctx, cfg, log, reg)
	}
	switch u := parsed.(type) {
	case *kms.ClusterKMSURI:
		k, err := kms.NewClusterKMS(u.MasterSecret, u.Salt)
		return k, noClose, err
	case *kms.PKCS11URI:
		if cfg.Client == nil || cfg.Namespace == "" {
			return nil, nil, errors.New("the pkcs11 KMS stores wrapped keys in Kubernetes: a client and namespace are needed")
		}
		hsm, kek, err := kms.OpenPKCS11(u)
		if err != nil {
			return nil, nil, err
		}
		return kms.NewPKCS11KMS(kek, secretstore.New(cfg.Client, cfg.Namespace)), hsm, nil
	default:
		return nil, nil, fmt.Errorf("unsupported KMS URI type %T", parsed)
	}
}

// openWrapped starts a kms.WrappedKMS that reads cfg.URIFile at every
// check, so a re-wrapped URI (gatehouse kms rewrap, a mounted Secret
// updated) takes over without a restart.
func openWrapped(ctx context.Context, cfg KMSConfig, log *slog.Logger, reg prometheus.Registerer) (keySource, io.Closer, error) {
	interval := cfg.CheckInterval
	if interval == 0 {
		interval = kms.DefaultCheckInterval
	}
	available := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "gatehouse_keyservice_kms_available",
		Help: "1 while the master secret is unwrapped by its external KMS and keys are served, 0 while the last check failed.",
	})
	checks := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gatehouse_keyservice_kms_checks_total",
		Help: "Unwraps of the master secret by its external KMS, by result (ok, error).",
	}, []string{"result"})
	for _, c := range []prometheus.Collector{available, checks} {
		if err := reg.Register(c); err != nil {
			return nil, nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	var mu sync.Mutex
	wasOK := false
	report := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			checks.WithLabelValues("error").Inc()
			available.Set(0)
			log.Error("External KMS check failed: serving no keys until it unwraps the master secret again",
				slog.String("event", "keyservice.kms"), slog.String("error", err.Error()))
		} else {
			checks.WithLabelValues("ok").Inc()
			available.Set(1)
			if !wasOK {
				log.Info("Master secret unwrapped by the external KMS", slog.String("event", "keyservice.kms"))
			}
		}
		wasOK = err == nil
	}
	w := kms.NewWrappedKMS(func(ctx context.Context) ([]byte, []byte, error) {
		data, err := os.ReadFile(cfg.URIFile)
		if err != nil {
			return nil, nil, fmt.Errorf("reading KMS URI: %w", err)
		}
		return kek.UnwrapURI(ctx, string(data), cfg.AWSOptions...)
	}, interval, clock.RealClock{}, report)
	firstCtx, cancelFirst := context.WithTimeout(ctx, interval)
	_ = w.Check(firstCtx) // a failure is reported and retried
	cancelFirst()
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(runCtx)
	}()
	return w, closerFunc(func() error { cancel(); <-done; return nil }), nil
}
