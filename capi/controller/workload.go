package controller

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/cluster-api/util/kubeconfig"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// KubeconfigClients builds clients for workload clusters from their
// Cluster API kubeconfig Secrets ("<cluster>-kubeconfig", key "value"),
// and keeps one client per cluster until that Secret changes.
type KubeconfigClients struct {
	reader client.Reader
	scheme *runtime.Scheme
	qps    float32
	burst  int

	mu      sync.Mutex
	clients map[client.ObjectKey]cachedClient
}

type cachedClient struct {
	digest [32]byte
	client client.Client
}

// NewKubeconfigClients reads kubeconfig Secrets through cached, and
// through direct when the cache does not have them (a Secret without the
// cluster-name label is not cached). Each workload client may make qps
// requests per second, burst at once.
func NewKubeconfigClients(cached, direct client.Reader, qps float32, burst int) *KubeconfigClients {
	return &KubeconfigClients{reader: fallbackReader{cached: cached, direct: direct}, scheme: clientgoscheme.Scheme,
		qps: qps, burst: burst, clients: map[client.ObjectKey]cachedClient{}}
}

type fallbackReader struct{ cached, direct client.Reader }

func (f fallbackReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	err := f.cached.Get(ctx, key, obj, opts...)
	if apierrors.IsNotFound(err) {
		return f.direct.Get(ctx, key, obj, opts...)
	}
	return err
}

func (f fallbackReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return f.direct.List(ctx, list, opts...)
}

// ClientFor returns a client of the workload cluster of the Cluster named
// by cluster.
func (k *KubeconfigClients) ClientFor(ctx context.Context, cluster client.ObjectKey) (client.Client, error) {
	data, err := kubeconfig.FromSecret(ctx, k.reader, cluster)
	if err != nil {
		return nil, fmt.Errorf("reading the kubeconfig Secret of cluster %s: %w", cluster, err)
	}
	digest := sha256.Sum256(data)
	k.mu.Lock()
	defer k.mu.Unlock()
	if c, ok := k.clients[cluster]; ok && c.digest == digest {
		return c.client, nil
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
	if err != nil {
		return nil, fmt.Errorf("parsing the kubeconfig of cluster %s: %w", cluster, err)
	}
	cfg.UserAgent, cfg.QPS, cfg.Burst = "gatehouse-capi-bootstrap", k.qps, k.burst
	c, err := client.New(cfg, client.Options{Scheme: k.scheme})
	if err != nil {
		return nil, fmt.Errorf("connecting to the workload cluster %s: %w", cluster, err)
	}
	k.clients[cluster] = cachedClient{digest: digest, client: c}
	return c, nil
}
