package bootstrapper

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
)

// NameBinder binds node to identity in the cluster kubeconfig (kubeadm's
// admin kubeconfig) reaches.
type NameBinder func(ctx context.Context, kubeconfig, node, identity string) error

// BindNodeName is the NameBinder of a real node: it creates the join
// service's namespace if it is missing and binds node to identity there
// (internal/nodebinding), retrying for up to a minute while the new API
// server settles. A name bound to another identity is an error.
func BindNodeName(ctx context.Context, kubeconfig, node, identity string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("reading %s: %w", kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	store := nodebinding.New(client, charts.Namespace, time.Now)
	var last error
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: charts.Namespace}}
		if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			last = fmt.Errorf("creating namespace %s: %w", charts.Namespace, err)
			return false, nil
		}
		_, last = store.Bind(ctx, node, identity)
		if errors.Is(last, nodebinding.ErrNameBound) {
			return false, last // retrying cannot change it
		}
		return last == nil, nil
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, nodebinding.ErrNameBound):
		return err
	default:
		return fmt.Errorf("%w (last: %w)", err, last)
	}
}
