package capiparity

// The mapping CABPK's KubeadmConfig controller
// (sigs.k8s.io/cluster-api/bootstrap/kubeadm/reconcilers/kubeadmconfig,
// v1.14.2: handleClusterNotInitialized, joinWorker, joinControlplane,
// reconcileDiscovery, resolveFiles, resolveUsers) does from a spec to the
// input of its renderers, written again here from reading it: the
// controller's functions are unexported. Certificates and Secrets are read
// from the same API server, with Cluster API's util/secret, as the
// controller does.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"text/template"

	"github.com/blang/semver/v4"
	corev1 "k8s.io/api/core/v1"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/cloudinit"
	"sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/ignition"
	kubeadmtypes "sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/types"
	"sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/types/upstream"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// upstreamToken stands for the bootstrap token CABPK's controller creates
// for a join whose spec names none (createToken); the comparison does not
// look at generated tokens' values.
const upstreamToken = "parity.0123456789abcdef"

// upstreamData returns the bootstrap data CABPK renders for spec on a
// Machine of role r in cluster (no control plane reference: templates get
// no .controlPlane, the controller looks up or generates the CAs itself).
func upstreamData(ctx context.Context, c client.Client, cluster *clusterv1.Cluster, spec *cabpkv1.KubeadmConfigSpec, r role) ([]byte, error) {
	spec = spec.DeepCopy()
	version, err := semver.ParseTolerant(kubernetesVersion)
	if err != nil {
		return nil, err
	}
	key := client.ObjectKeyFromObject(cluster)
	base := cloudinit.BaseUserData{
		BootCommands:        spec.BootCommands,
		PreKubeadmCommands:  spec.PreKubeadmCommands,
		PostKubeadmCommands: spec.PostKubeadmCommands,
		Mounts:              spec.Mounts,
		KubernetesVersion:   version,
	}
	if spec.NTP.IsDefined() {
		base.NTP = &spec.NTP
	}
	if spec.DiskSetup.IsDefined() {
		base.DiskSetup = &spec.DiskSetup
	}
	if spec.Verbosity != nil {
		base.KubeadmVerbosity = "--v " + strconv.Itoa(int(*spec.Verbosity))
	}
	resolve := func() error {
		var err error
		if base.AdditionalFiles, err = upstreamFiles(ctx, c, cluster.Namespace, spec.Files); err != nil {
			return err
		}
		base.Users, err = upstreamUsers(ctx, c, cluster.Namespace, spec.Users)
		return err
	}
	ign := &spec.Ignition
	ignitionFormat := spec.Format == cabpkv1.Ignition

	switch r {
	case roleInit:
		cc, ic := &spec.ClusterConfiguration, &spec.InitConfiguration
		data := &upstream.AdditionalData{ClusterName: ptr.To(cluster.Name), KubernetesVersion: ptr.To(kubernetesVersion)}
		if cc.ControlPlaneEndpoint == "" && cluster.Spec.ControlPlaneEndpoint.IsValid() {
			cc.ControlPlaneEndpoint = cluster.Spec.ControlPlaneEndpoint.String()
		}
		if n := cluster.Spec.ClusterNetwork; n.ServiceDomain != "" {
			data.DNSDomain = ptr.To(n.ServiceDomain)
		}
		if n := cluster.Spec.ClusterNetwork; len(n.Services.CIDRBlocks) > 0 {
			data.ServiceSubnet = ptr.To(n.Services.String())
		}
		if n := cluster.Spec.ClusterNetwork; len(n.Pods.CIDRBlocks) > 0 {
			data.PodSubnet = ptr.To(n.Pods.String())
		}
		data.ControlPlaneComponentHealthCheckSeconds = ic.Timeouts.ControlPlaneComponentHealthCheckSeconds
		clusterData, err := kubeadmtypes.MarshalClusterConfigurationForVersion(cc, version, data)
		if err != nil {
			return nil, err
		}
		initData, err := kubeadmtypes.MarshalInitConfigurationForVersion(ic, version)
		if err != nil {
			return nil, err
		}
		// The Cluster has no control plane reference: the controller looks
		// the CAs up (or generates them; the fixture has them all).
		certs := secret.NewCertificatesForInitialControlPlane(cc)
		if err := certs.LookupCached(ctx, nil, c, key); err != nil {
			return nil, err
		}
		if err := certs.EnsureAllExist(); err != nil {
			return nil, fmt.Errorf("the fixture lacks a CA: %w", err)
		}
		if err := resolve(); err != nil {
			return nil, err
		}
		in := &cloudinit.ControlPlaneInput{BaseUserData: base, Certificates: certs, ClusterConfiguration: clusterData, InitConfiguration: initData}
		if ignitionFormat {
			out, _, err := ignition.NewInitControlPlane(&ignition.ControlPlaneInput{ControlPlaneInput: in, Ignition: ign})
			return out, err
		}
		return cloudinit.NewInitControlPlane(in)

	case roleJoin:
		certs := secret.NewCertificatesForWorker(spec.JoinConfiguration.CACertPath)
		if err := certs.LookupCached(ctx, nil, c, key); err != nil {
			return nil, err
		}
		if err := certs.EnsureAllExist(); err != nil {
			return nil, err
		}
		if err := upstreamDiscovery(cluster, spec, certs); err != nil {
			return nil, err
		}
		join := spec.JoinConfiguration.DeepCopy()
		if !hasTaint(ptr.Deref(join.NodeRegistration.Taints, nil), clusterv1.NodeUninitializedTaint) {
			join.NodeRegistration.Taints = ptr.To(append(ptr.Deref(join.NodeRegistration.Taints, []corev1.Taint{}), clusterv1.NodeUninitializedTaint))
		}
		joinData, err := kubeadmtypes.MarshalJoinConfigurationForVersion(join, version)
		if err != nil {
			return nil, err
		}
		if spec.JoinConfiguration.ControlPlane != nil {
			return nil, errors.New("Machine is a Worker, but JoinConfiguration.ControlPlane is set in the KubeadmConfig object")
		}
		if err := resolve(); err != nil {
			return nil, err
		}
		if err := appendDiscoveryKubeconfig(&base, spec); err != nil {
			return nil, err
		}
		in := &cloudinit.NodeInput{BaseUserData: base, JoinConfiguration: joinData}
		if ignitionFormat {
			out, _, err := ignition.NewNode(&ignition.NodeInput{NodeInput: in, Ignition: ign})
			return out, err
		}
		return cloudinit.NewNode(in)

	default: // roleJoinControlPlane
		if spec.JoinConfiguration.ControlPlane == nil {
			spec.JoinConfiguration.ControlPlane = &cabpkv1.JoinControlPlane{}
		}
		certs := secret.NewControlPlaneJoinCerts(&spec.ClusterConfiguration)
		if err := certs.LookupCached(ctx, nil, c, key); err != nil {
			return nil, err
		}
		if err := certs.EnsureAllExist(); err != nil {
			return nil, err
		}
		if err := upstreamDiscovery(cluster, spec, certs); err != nil {
			return nil, err
		}
		joinData, err := kubeadmtypes.MarshalJoinConfigurationForVersion(&spec.JoinConfiguration, version)
		if err != nil {
			return nil, err
		}
		if err := resolve(); err != nil {
			return nil, err
		}
		if err := appendDiscoveryKubeconfig(&base, spec); err != nil {
			return nil, err
		}
		in := &cloudinit.ControlPlaneJoinInput{BaseUserData: base, Certificates: certs, JoinConfiguration: joinData}
		if ignitionFormat {
			out, _, err := ignition.NewJoinControlPlane(&ignition.ControlPlaneJoinInput{ControlPlaneJoinInput: in, Ignition: ign})
			return out, err
		}
		return cloudinit.NewJoinControlPlane(in)
	}
}

func hasTaint(taints []corev1.Taint, t corev1.Taint) bool {
	for _, x := range taints {
		if x.MatchTaint(&t) {
			return true
		}
	}
	return false
}

// upstreamDiscovery is reconcileDiscovery: a file discovery gets the
// Cluster's endpoint and CA where it names none; token discovery gets the
// CA hashes, the endpoint and a token.
func upstreamDiscovery(cluster *clusterv1.Cluster, spec *cabpkv1.KubeadmConfigSpec, certs secret.Certificates) error {
	d := &spec.JoinConfiguration.Discovery
	if d.File.IsDefined() {
		kc := &d.File.KubeConfig
		if !kc.IsDefined() {
			return nil
		}
		if kc.Cluster.Server == "" {
			kc.Cluster.Server = "https://" + cluster.Spec.ControlPlaneEndpoint.String()
		}
		if len(kc.Cluster.CertificateAuthorityData) == 0 {
			ca := certs.GetByPurpose(secret.ClusterCA)
			if ca == nil || ca.KeyPair == nil {
				return errors.New("no cluster CA for discovery.file.kubeConfig")
			}
			kc.Cluster.CertificateAuthorityData = ca.KeyPair.Cert
		}
		return nil
	}
	bt := &d.BootstrapToken
	if len(bt.CACertHashes) == 0 {
		hashes, err := certs.GetByPurpose(secret.ClusterCA).Hashes()
		if err != nil {
			return err
		}
		bt.CACertHashes = hashes
	}
	if bt.APIServerEndpoint == "" {
		bt.APIServerEndpoint = cluster.Spec.ControlPlaneEndpoint.String()
	}
	if bt.Token == "" {
		bt.Token = upstreamToken
	}
	if len(bt.CACertHashes) == 0 {
		bt.UnsafeSkipCAVerification = ptr.To(true)
	}
	return nil
}

// appendDiscoveryKubeconfig is resolveDiscoveryKubeConfig: the kubeconfig
// of discovery.file.kubeConfig, written at its kubeConfigPath.
func appendDiscoveryKubeconfig(base *cloudinit.BaseUserData, spec *cabpkv1.KubeadmConfigSpec) error {
	f := spec.JoinConfiguration.Discovery.File
	if !f.KubeConfig.IsDefined() {
		return nil
	}
	kc := f.KubeConfig
	user := clientcmdv1.AuthInfo{}
	if kc.User.AuthProvider.IsDefined() {
		user.AuthProvider = &clientcmdv1.AuthProviderConfig{Name: kc.User.AuthProvider.Name, Config: kc.User.AuthProvider.Config}
	}
	if kc.User.Exec.IsDefined() {
		apiVersion := kc.User.Exec.APIVersion
		if apiVersion == "" {
			apiVersion = "client.authentication.k8s.io/v1"
		}
		user.Exec = &clientcmdv1.ExecConfig{Command: kc.User.Exec.Command, Args: kc.User.Exec.Args, APIVersion: apiVersion,
			ProvideClusterInfo: ptr.Deref(kc.User.Exec.ProvideClusterInfo, false), InteractiveMode: "Never"}
		for _, e := range kc.User.Exec.Env {
			user.Exec.Env = append(user.Exec.Env, clientcmdv1.ExecEnvVar{Name: e.Name, Value: e.Value})
		}
	}
	config := clientcmdv1.Config{
		CurrentContext: "default",
		Contexts:       []clientcmdv1.NamedContext{{Name: "default", Context: clientcmdv1.Context{Cluster: "default", AuthInfo: "default"}}},
		Clusters: []clientcmdv1.NamedCluster{{Name: "default", Cluster: clientcmdv1.Cluster{Server: kc.Cluster.Server, TLSServerName: kc.Cluster.TLSServerName,
			InsecureSkipTLSVerify: ptr.Deref(kc.Cluster.InsecureSkipTLSVerify, false), CertificateAuthorityData: kc.Cluster.CertificateAuthorityData,
			ProxyURL: kc.Cluster.ProxyURL}}},
		AuthInfos: []clientcmdv1.NamedAuthInfo{{Name: "default", AuthInfo: user}},
	}
	b, err := yaml.Marshal(config)
	if err != nil {
		return err
	}
	base.AdditionalFiles = append(base.AdditionalFiles, cabpkv1.File{Path: f.KubeConfigPath, Owner: "root:root", Permissions: "0640", Content: string(b)})
	return nil
}

// upstreamFiles is resolveFiles: contentFrom read from its Secret, then
// contentFormat Template rendered with Go's text/template and the
// template data of a Cluster without a control plane reference (an
// empty map).
func upstreamFiles(ctx context.Context, c client.Client, ns string, files []cabpkv1.File) ([]cabpkv1.File, error) {
	out := make([]cabpkv1.File, 0, len(files))
	for _, f := range files {
		if f.ContentFrom.IsDefined() {
			data, err := secretKey(ctx, c, ns, f.ContentFrom.Secret.Name, f.ContentFrom.Secret.Key)
			if err != nil {
				return nil, err
			}
			f.ContentFrom, f.Content = cabpkv1.FileSource{}, string(data)
		}
		if f.ContentFormat == cabpkv1.FileContentFormatTemplate {
			tpl, err := template.New(f.Path).Parse(f.Content)
			if err != nil {
				return nil, err
			}
			var b bytes.Buffer
			if err := tpl.Execute(&b, map[string]any{}); err != nil {
				return nil, err
			}
			f.Content, f.ContentFormat = b.String(), ""
		}
		out = append(out, f)
	}
	return out, nil
}

// upstreamUsers is resolveUsers: passwdFrom read into passwd.
func upstreamUsers(ctx context.Context, c client.Client, ns string, users []cabpkv1.User) ([]cabpkv1.User, error) {
	out := make([]cabpkv1.User, 0, len(users))
	for _, u := range users {
		if u.PasswdFrom.IsDefined() {
			data, err := secretKey(ctx, c, ns, u.PasswdFrom.Secret.Name, u.PasswdFrom.Secret.Key)
			if err != nil {
				return nil, err
			}
			u.PasswdFrom, u.Passwd = cabpkv1.PasswdSource{}, string(data)
		}
		out = append(out, u)
	}
	return out, nil
}

func secretKey(ctx context.Context, c client.Client, ns, name, key string) ([]byte, error) {
	s := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, s); err != nil {
		return nil, err
	}
	data, ok := s.Data[key]
	if !ok {
		return nil, fmt.Errorf("secret %s has no key %q", name, key)
	}
	return data, nil
}
