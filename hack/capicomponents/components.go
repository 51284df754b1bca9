package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	"sigs.k8s.io/yaml"
)

// The names clusterctl and the cluster see.
const (
	// metadataFile and componentsFile are the contract's file names for a
	// bootstrap provider's repository.
	metadataFile   = "metadata.yaml"
	componentsFile = "bootstrap-components.yaml"
	// providerLabel is clusterctl's manifest label of the bootstrap provider
	// named "gatehouse" (type prefix + name): the value of the
	// cluster.x-k8s.io/provider label and the local repository's folder.
	providerLabel = "bootstrap-gatehouse"
	// namespace is the default target namespace; `clusterctl init
	// --target-namespace` renames it and moves every namespaced object.
	namespace = "gatehouse-capi-system"
	// appName names the Deployment and selects its Pods.
	appName = "gatehouse-capi-bootstrap"
	// managerName names the ServiceAccount, the ClusterRole (controller-gen
	// rbac:roleName) and their binding.
	managerName = "gatehouse-capi-bootstrap-manager"
	// containerName is what the contract requires of the manager container.
	containerName = "manager"
	// defaultVersion is the release the committed files describe.
	defaultVersion  = "v0.1.0"
	imageRepository = "ghcr.io/gatehouse-dev/gatehouse-capi-bootstrap"
	metricsPort     = 8443
	probePort       = 8081
)

// contractVersion is the Cluster API contract the provider implements, the
// API version of Cluster API's core types it reads (Cluster, Machine).
var contractVersion = clusterv1.GroupVersion.Version

// contractLabel maps the contract to the CRD versions that implement it
// (the contract's "API version labels"), e.g. cluster.x-k8s.io/v1beta2: v1alpha1.
var contractLabel = clusterv1.GroupVersion.String()

// variable is a clusterctl variable of the components: clusterctl replaces
// ${Name:=Default} with the value from the environment or the clusterctl
// config file, else with Default.
type variable struct {
	Name, Default, Doc string
}

// ref is the variable as the components YAML writes it.
func (v variable) ref() string { return "${" + v.Name + ":=" + v.Default + "}" }

// inputs is what the components are built from.
type inputs struct {
	version string
	major   int32
	minor   int32
	crds    []*apiextensionsv1.CustomResourceDefinition
	role    *rbacv1.ClusterRole
}

func (in inputs) image() variable {
	return variable{"GATEHOUSE_CAPI_BOOTSTRAP_IMAGE", imageRepository + ":" + in.version, "the manager's container image"}
}

var (
	concurrency = variable{"GATEHOUSE_CAPI_CONCURRENCY", "10", "KubeadmConfigs reconciled at once (--concurrency)"}
	logLevel    = variable{"GATEHOUSE_CAPI_LOG_LEVEL", "info", "debug, info, warn or error (--log-level)"}
)

func (in inputs) variables() []variable { return []variable{in.image(), concurrency, logLevel} }

// readInputs reads every CRD of crdDir (*.yaml, in name order) and the
// ClusterRole in role, strictly: a field the typed API does not know is an
// error, so nothing is lost on the way through.
func readInputs(crdDir, role, version string) (inputs, error) {
	v, err := utilversion.ParseSemantic(version)
	if err != nil || !strings.HasPrefix(version, "v") || v.PreRelease() != "" || v.BuildMetadata() != "" {
		return inputs{}, fmt.Errorf("version %q is not vMAJOR.MINOR.PATCH", version)
	}
	in := inputs{version: version, major: int32(v.Major()), minor: int32(v.Minor())}
	paths, err := filepath.Glob(filepath.Join(crdDir, "*.yaml"))
	if err != nil {
		return inputs{}, err
	}
	slices.Sort(paths)
	for _, p := range paths {
		docs, err := readDocs(p)
		if err != nil {
			return inputs{}, err
		}
		for _, doc := range docs {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := yaml.UnmarshalStrict(doc, crd); err != nil {
				return inputs{}, fmt.Errorf("%s: %w", p, err)
			}
			if crd.Kind != "CustomResourceDefinition" {
				return inputs{}, fmt.Errorf("%s: kind %q, want CustomResourceDefinition", p, crd.Kind)
			}
			in.crds = append(in.crds, crd)
		}
	}
	if len(in.crds) == 0 {
		return inputs{}, fmt.Errorf("no CRDs in %s: run make generate", crdDir)
	}
	docs, err := readDocs(role)
	if errors.Is(err, fs.ErrNotExist) {
		// controller-gen writes no file when it finds no rules, and it
		// skips +kubebuilder:rbac markers inside a doc comment.
		return inputs{}, fmt.Errorf("%w: controller-gen rbac found no +kubebuilder:rbac markers in capi/controller "+
			"(they must stand apart from doc comments, separated by a blank line)", err)
	}
	if err != nil {
		return inputs{}, err
	}
	if len(docs) != 1 {
		return inputs{}, fmt.Errorf("%s: %d YAML documents, want one ClusterRole", role, len(docs))
	}
	in.role = &rbacv1.ClusterRole{}
	if err := yaml.UnmarshalStrict(docs[0], in.role); err != nil {
		return inputs{}, fmt.Errorf("%s: %w", role, err)
	}
	if in.role.Kind != "ClusterRole" || in.role.Name != managerName {
		return inputs{}, fmt.Errorf("%s: %s %q, want ClusterRole %q (controller-gen rbac:roleName=%s)", role, in.role.Kind, in.role.Name, managerName, managerName)
	}
	return in, nil
}

// readDocs splits a YAML file into its non-empty documents.
func readDocs(path string) ([][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(bytes.TrimSpace(doc)) > 0 {
			docs = append(docs, doc)
		}
	}
}

// render returns the repository files by name.
func render(in inputs) (map[string][]byte, error) {
	meta := &clusterctlv1.Metadata{
		TypeMeta:      metav1.TypeMeta{APIVersion: clusterctlv1.GroupVersion.String(), Kind: "Metadata"},
		ReleaseSeries: []clusterctlv1.ReleaseSeries{{Major: in.major, Minor: in.minor, Contract: contractVersion}},
	}
	metaYAML, err := marshal(fmt.Sprintf(`# Code generated by hack/capicomponents; DO NOT EDIT.
# clusterctl metadata of the Cluster API bootstrap provider gatehouse-capi-bootstrap:
# release series %d.%d implements Cluster API contract %s (a major of 0 is omitted).
`, in.major, in.minor, contractVersion), meta)
	if err != nil {
		return nil, err
	}
	objs, err := objects(in)
	if err != nil {
		return nil, err
	}
	var vars strings.Builder
	for _, v := range in.variables() {
		// No "${" here: clusterctl substitutes variables in comments too.
		fmt.Fprintf(&vars, "#   %s: %s (default %s)\n", v.Name, v.Doc, v.Default)
	}
	compYAML, err := marshal(`# Code generated by hack/capicomponents from config/crd and config/rbac; DO NOT EDIT.
# clusterctl components of the Cluster API bootstrap provider gatehouse-capi-bootstrap
# (clusterctl init --bootstrap gatehouse). Variables, substituted by clusterctl
# from the environment or its config file:
`+vars.String(), objs...)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{metadataFile: metaYAML, componentsFile: compYAML}, nil
}

// objects are the components in install order.
func objects(in inputs) ([]runtime.Object, error) {
	labels := func() map[string]string { return map[string]string{clusterv1.ProviderNameLabel: providerLabel} }
	objs := []runtime.Object{&corev1.Namespace{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: labels()},
	}}
	for _, c := range in.crds {
		crd := c.DeepCopy()
		var served []string
		for _, v := range crd.Spec.Versions {
			if v.Served {
				served = append(served, v.Name)
			}
		}
		if len(served) == 0 {
			return nil, fmt.Errorf("CRD %s serves no version", crd.Name)
		}
		if crd.Labels == nil {
			crd.Labels = map[string]string{}
		}
		crd.Labels[clusterv1.ProviderNameLabel] = providerLabel
		// The contract's value is an underscore-delimited list of versions.
		crd.Labels[contractLabel] = strings.Join(served, "_")
		objs = append(objs, crd)
	}
	role := in.role.DeepCopy()
	if role.Labels == nil {
		role.Labels = map[string]string{}
	}
	role.Labels[clusterv1.ProviderNameLabel] = providerLabel
	sa := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: managerName, Namespace: namespace}
	objs = append(objs,
		&corev1.ServiceAccount{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
			ObjectMeta: metav1.ObjectMeta{Name: managerName, Namespace: namespace, Labels: labels()},
		},
		role,
		&rbacv1.ClusterRoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: managerName, Labels: labels()},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects:   []rbacv1.Subject{sa},
		},
		deployment(in, labels()),
	)
	return objs, nil
}

// deployment runs one manager replica. Leader election keeps a second
// replica, should a user scale it up, from reconciling too; the Lease is in
// the Pod's namespace, granted by the ClusterRole (coordination.k8s.io
// leases), so no Role is needed.
func deployment(in inputs, labels map[string]string) *appsv1.Deployment {
	selector := map[string]string{"app.kubernetes.io/name": appName, clusterv1.ProviderNameLabel: providerLabel}
	probe := func(path string) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("healthz")}}}
	}
	liveness, readiness := probe("/healthz"), probe("/readyz")
	liveness.InitialDelaySeconds, liveness.PeriodSeconds = 15, 20
	readiness.InitialDelaySeconds, readiness.PeriodSeconds = 5, 10
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: appName, Namespace: namespace, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: selector},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: selector},
				Spec: corev1.PodSpec{
					ServiceAccountName:            managerName,
					TerminationGracePeriodSeconds: ptr.To[int64](10),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   ptr.To(true),
						RunAsUser:      ptr.To[int64](65532),
						RunAsGroup:     ptr.To[int64](65532),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					// Like upstream CABPK: management clusters are often a
					// single control plane node.
					Tolerations: []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}},
					Containers: []corev1.Container{{
						Name:            containerName,
						Image:           in.image().ref(),
						ImagePullPolicy: corev1.PullIfNotPresent,
						// The image's entrypoint is the binary.
						Args: []string{
							"--leader-elect=true",
							fmt.Sprintf("--metrics-bind-address=:%d", metricsPort),
							fmt.Sprintf("--health-probe-bind-address=:%d", probePort),
							"--concurrency=" + concurrency.ref(),
							"--log-level=" + logLevel.ref(),
						},
						Ports: []corev1.ContainerPort{
							{Name: "metrics", ContainerPort: metricsPort, Protocol: corev1.ProtocolTCP},
							{Name: "healthz", ContainerPort: probePort, Protocol: corev1.ProtocolTCP},
						},
						LivenessProbe:  liveness,
						ReadinessProbe: readiness,
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("512Mi")},
						},
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false),
							Privileged:               ptr.To(false),
							ReadOnlyRootFilesystem:   ptr.To(true),
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
					}},
				},
			},
		},
	}
}

// marshal writes header and then objs as YAML documents. Each object goes
// through its unstructured form, so map keys come out sorted, and loses its
// status, which is the server's, and its empty top-level fields.
func marshal(header string, objs ...runtime.Object) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString(header)
	for i, obj := range objs {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			return nil, err
		}
		delete(u, "status")
		for k, v := range u {
			if m, ok := v.(map[string]any); ok && len(m) == 0 {
				delete(u, k) // metadata: {} of Metadata, spec: {} of Namespace
			}
		}
		if i > 0 {
			buf.WriteString("---\n")
		}
		b, err := yaml.Marshal(u)
		if err != nil {
			return nil, err
		}
		buf.Write(b)
	}
	return buf.Bytes(), nil
}
