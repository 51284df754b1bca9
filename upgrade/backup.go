package upgrade

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// backup writes every CRD (crds/<name>.yaml) and every custom resource
// (resources/<crd>/<namespace>/<name>.yaml) of the cluster as YAML ready for
// server-side apply (no resourceVersion, uid, managedFields or status), and
// returns the directory, root/gatehouse-upgrade/<at, UTC>-<random>/backups:
// every run gets its own, even two started in the same second (or on two
// machines writing to one shared disk: the directory is made with an
// exclusive mkdir). A failure leaves nothing: the backup is written under
// a temporary name, renamed at the end, and removed on error.
func backup(ctx context.Context, kubeconfig, root string, at time.Time) (dir string, err error) {
	restCfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return "", err
	}
	ext, err := apiextensions.NewForConfig(restCfg)
	if err != nil {
		return "", err
	}
	dyn, err := dynamic.NewForConfig(restCfg)
	if err != nil {
		return "", err
	}
	parent := filepath.Join(root, "gatehouse-upgrade")
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", err
	}
	run, err := os.MkdirTemp(parent, at.UTC().Format("20060102T150405Z")+"-*")
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(run)
		}
	}()
	dir = filepath.Join(run, "backups")
	tmp := dir + ".partial"
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return "", err
	}
	crds, err := ext.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("listing CRDs: %w", err)
	}
	for i := range crds.Items {
		crd := &crds.Items[i]
		crd.APIVersion, crd.Kind = "apiextensions.k8s.io/v1", "CustomResourceDefinition"
		if err := writeYAML(filepath.Join(tmp, "crds", crd.Name+".yaml"), crd); err != nil {
			return "", err
		}
		version := storageVersion(crd)
		gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: version, Resource: crd.Spec.Names.Plural}
		list, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", fmt.Errorf("listing %s: %w", crd.Name, err)
		}
		for j := range list.Items {
			obj := &list.Items[j]
			ns := obj.GetNamespace()
			if ns == "" {
				ns = "_cluster"
			}
			if err := writeYAML(filepath.Join(tmp, "resources", crd.Name, ns, obj.GetName()+".yaml"), obj); err != nil {
				return "", err
			}
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return dir, nil
}

func storageVersion(crd *apiextensionsv1.CustomResourceDefinition) string {
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			return v.Name
		}
	}
	return crd.Spec.Versions[0].Name
}

// writeYAML writes obj without its server-set metadata and status.
func writeYAML(path string, obj any) error {
	u, err := toUnstructured(obj)
	if err != nil {
		return err
	}
	for _, f := range []string{"resourceVersion", "uid", "managedFields", "creationTimestamp", "generation"} {
		unstructured.RemoveNestedField(u.Object, "metadata", f)
	}
	unstructured.RemoveNestedField(u.Object, "status")
	data, err := yaml.Marshal(u.Object)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}

func toUnstructured(obj any) (*unstructured.Unstructured, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return u.DeepCopy(), nil
	}
	data, err := yaml.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: m}, nil
}
