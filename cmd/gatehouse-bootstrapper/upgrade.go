package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	upgradeagentv1 "github.com/gatehouse-dev/gatehouse/api/upgradeagent/v1"
	"github.com/gatehouse-dev/gatehouse/bootstrapper"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/installer"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/upgradeagent"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
	"github.com/gatehouse-dev/gatehouse/internal/grpcopts"
)

// serveUpgrade serves the node's upgrade agent (docs/upgrades.md).
func serveUpgrade(log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("serve-upgrade", flag.ExitOnError)
	listen := fs.String("listen", fmt.Sprintf(":%d", upgradeagentv1.DefaultPort), "address `gatehouse upgrade apply --kubernetes` connects to")
	clientCA := fs.String("client-ca", "/etc/kubernetes/pki/ca.crt", "the cluster CA (PEM): callers need a client certificate it issued in an administrators' group (kubeadm:cluster-admins, system:masters); nobody is answered while it does not exist")
	servingCert := fs.String("serving-cert", "/var/lib/kubelet/pki/kubelet-server-current.pem", "the node's certificate and key (PEM), read at each connection: the kubelet's serving certificate, which the cluster CA issued after fresh evidence")
	kubeadmPath := fs.String("kubeadm", "/usr/local/bin/kubeadm", "the node's kubeadm")
	installDir := fs.String("install-dir", "/usr/local/bin", "where kubeadm, the kubelet and kubectl are installed")
	kubeletService := fs.String("kubelet-service", "systemd", "how the kubelet is restarted: systemd, or pidfile:PATH (its supervisor writes its process ID to PATH and starts it again when it exits)")
	ignorePreflight := fs.String("ignore-preflight-errors", "", "comma-separated kubeadm preflight checks kubeadm upgrade ignores (the bootstrapper's own list)")
	limits := connlimit.Limits{Handshakes: connlimit.Rate{Rate: 1, Burst: 5}, PerSource: 2, Total: 16}
	if err := fs.Parse(args); err != nil {
		return err
	}
	var kubelet bootstrapper.KubeletService
	switch {
	case *kubeletService == "systemd":
		kubelet = bootstrapper.SystemdKubelet{}
	case strings.HasPrefix(*kubeletService, "pidfile:") && len(*kubeletService) > len("pidfile:"):
		kubelet = bootstrapper.PIDFileKubelet{Path: strings.TrimPrefix(*kubeletService, "pidfile:")}
	default:
		return fmt.Errorf("--kubelet-service %q: use systemd or pidfile:PATH", *kubeletService)
	}
	agent, err := upgradeagent.New(upgradeagent.Options{
		Installer: installer.New(installer.Options{Log: log}), Kubeadm: bootstrapper.ExecKubeadm{Path: *kubeadmPath},
		Kubelet: kubelet, InstallDir: *installDir, IgnorePreflightErrors: splitList(*ignorePreflight), Log: log,
		PatchesDir: bootstrapper.KubeadmPatchesDir,
	})
	if err != nil {
		return err
	}
	door, err := atls.NewClientCertDoor(*clientCA, atls.AdministratorOrganizations(), log)
	if err != nil {
		return err
	}
	certFile := *servingCert
	tlsConfig := door.TLSConfig(func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		cert, err := tls.LoadX509KeyPair(certFile, certFile)
		if err != nil {
			return nil, fmt.Errorf("the node's serving certificate %s: %w", certFile, err)
		}
		return &cert, nil
	})
	inner, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	lis, err := connlimit.NewListener(inner, limits, connlimit.Options{
		OnRefuse: func(source, reason string) { log.Warn("Refused a connection", "source", source, "reason", reason) },
	})
	if err != nil {
		return err
	}
	srv := grpc.NewServer(append(grpcopts.Server(), grpc.Creds(credentials.NewTLS(tlsConfig)))...)
	upgradeagentv1.RegisterUpgradeAgentServiceServer(srv, agent)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	log.Info("Serving the upgrade agent", "address", lis.Addr().String(), "clientCA", *clientCA, "servingCert", certFile)
	if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}
