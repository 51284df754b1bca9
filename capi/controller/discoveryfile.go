package controller

import (
	"context"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/secret"

	"github.com/gatehouse-dev/gatehouse/capi/render"
)

// discoveryFile handles a join with file discovery
// (spec.joinConfiguration.discovery.file): kubeadm join reads the
// discovery kubeconfig from kubeConfigPath. When the spec describes that
// kubeconfig (discovery.file.kubeConfig), the data writes it there, as
// CABPK does (reconcileDiscoveryFile, resolveDiscoveryKubeConfig): the
// server defaults to https://<the Cluster's control-plane endpoint>, the CA
// to the cluster CA. Without kubeConfig the file is the user's to provide
// (spec.files) and nothing is added; no bootstrap token is made either way.
// The CRD requires kubeConfigPath.
func (r *Reconciler) discoveryFile(ctx context.Context, s *scope, in *render.Input) (*wait, error) {
	fd := &in.Spec.JoinConfiguration.Discovery.File
	kc := &fd.KubeConfig
	if !kc.IsDefined() {
		return nil, nil
	}
	if kc.Cluster.Server == "" {
		if !s.cluster.Spec.ControlPlaneEndpoint.IsValid() {
			return &wait{ReasonWaitingForControlPlaneEndpoint, "waiting for the Cluster's spec.controlPlaneEndpoint (the discovery kubeconfig's server)"}, nil
		}
		kc.Cluster.Server = "https://" + s.cluster.Spec.ControlPlaneEndpoint.String()
	}
	if len(kc.Cluster.CertificateAuthorityData) == 0 {
		caPEM, err := r.clusterCACert(ctx, s)
		if err != nil || caPEM == nil {
			return &wait{ReasonWaitingForClusterCA, "waiting for the cluster CA Secret " + secret.Name(s.cluster.Name, secret.ClusterCA) +
				" (the discovery kubeconfig's certificate authority)"}, err
		}
		kc.Cluster.CertificateAuthorityData = caPEM
	}
	cluster := clientcmdapi.NewCluster()
	cluster.Server = kc.Cluster.Server
	cluster.TLSServerName = kc.Cluster.TLSServerName
	cluster.InsecureSkipTLSVerify = ptr.Deref(kc.Cluster.InsecureSkipTLSVerify, false)
	cluster.CertificateAuthorityData = kc.Cluster.CertificateAuthorityData
	cluster.ProxyURL = kc.Cluster.ProxyURL
	user := clientcmdapi.NewAuthInfo()
	if p := kc.User.AuthProvider; p.IsDefined() {
		user.AuthProvider = &clientcmdapi.AuthProviderConfig{Name: p.Name, Config: p.Config}
	}
	if e := kc.User.Exec; e.IsDefined() {
		user.Exec = &clientcmdapi.ExecConfig{Command: e.Command, Args: e.Args, APIVersion: e.APIVersion,
			ProvideClusterInfo: ptr.Deref(e.ProvideClusterInfo, false), InteractiveMode: clientcmdapi.NeverExecInteractiveMode}
		if user.Exec.APIVersion == "" {
			user.Exec.APIVersion = "client.authentication.k8s.io/v1"
		}
		for _, env := range e.Env {
			user.Exec.Env = append(user.Exec.Env, clientcmdapi.ExecEnvVar{Name: env.Name, Value: env.Value})
		}
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["default"] = cluster
	cfg.AuthInfos["default"] = user
	cfg.Contexts["default"] = &clientcmdapi.Context{Cluster: "default", AuthInfo: "default"}
	cfg.CurrentContext = "default"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, specErrorf("rendering the discovery kubeconfig of spec.joinConfiguration.discovery.file: %v", err)
	}
	in.Files = append(in.Files, render.File{Path: fd.KubeConfigPath, Content: string(data), Owner: "root:root", Permissions: "0640"})
	return nil, nil
}
