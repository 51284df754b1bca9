package controller

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// joinCAProblem says what a control-plane join's cluster CA Secrets
// ("<cluster>-ca|etcd|proxy|sa", Cluster API's certificate conventions)
// lack, naming each Secret and the key it misses: "" when every one exists
// with its certificate (tls.crt) and, unless external, its private key
// (tls.key). It reads the Secrets itself, before Cluster API's lookup,
// which fails without saying which key of which Secret is missing.
func (r *Reconciler) joinCAProblem(ctx context.Context, cluster client.ObjectKey, certs secret.Certificates) (string, error) {
	var missing, incomplete []string
	for _, c := range certs {
		name := secret.Name(cluster.Name, c.Purpose)
		s := &corev1.Secret{}
		if err := r.direct().Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: name}, s); err != nil {
			if !apierrors.IsNotFound(err) {
				return "", fmt.Errorf("reading the cluster CA Secret %s: %w", name, err)
			}
			missing = append(missing, name)
			continue
		}
		var lacks []string
		if len(s.Data[secret.TLSCrtDataName]) == 0 {
			lacks = append(lacks, secret.TLSCrtDataName+" (the certificate)")
		}
		if !c.External && len(s.Data[secret.TLSKeyDataName]) == 0 {
			lacks = append(lacks, secret.TLSKeyDataName+" (the private key)")
		}
		if len(lacks) > 0 {
			incomplete = append(incomplete, fmt.Sprintf("Secret %s has no %s", name, strings.Join(lacks, " and no ")))
		}
	}
	var problems []string
	if len(missing) > 0 {
		problems = append(problems, "Secret "+strings.Join(missing, ", ")+" does not exist")
	}
	problems = append(problems, incomplete...)
	if len(problems) == 0 {
		return "", nil
	}
	return "a control-plane join needs each cluster CA's certificate (" + secret.TLSCrtDataName + ") and private key (" +
		secret.TLSKeyDataName + ") in its Secret: " + strings.Join(problems, "; "), nil
}
