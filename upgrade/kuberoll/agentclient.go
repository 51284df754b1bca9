package kuberoll

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/rest"

	upgradeagentv1 "github.com/gatehouse-dev/gatehouse/api/upgradeagent/v1"
)

// AgentClient calls nodes' upgrade agents as the administrator of an
// admin kubeconfig: its client certificate opens the agent's door, and
// the agent must present a certificate of the cluster CA for the node's
// address (the kubelet serving certificate, issued after fresh evidence).
type AgentClient struct {
	tls  *tls.Config
	port int
}

// NewAgentClient returns a client with cfg's credentials; cfg must carry
// a client certificate and the cluster CA (kubeadm's admin.conf does).
func NewAgentClient(cfg *rest.Config) (*AgentClient, error) {
	t, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("the kubeconfig's TLS settings: %w", err)
	}
	if t == nil || t.RootCAs == nil || (len(t.Certificates) == 0 && t.GetClientCertificate == nil) {
		return nil, errors.New("the kubeconfig has no client certificate and cluster CA: a node's upgrade agent answers only an administrator's certificate (use kubeadm's admin.conf)")
	}
	t.MinVersion = tls.VersionTLS13
	return &AgentClient{tls: t, port: upgradeagentv1.DefaultPort}, nil
}

// Upgrade asks the agent at address to upgrade, passing each progress
// message to progress. While the node still runs an earlier upgrade
// (Aborted: a roll interrupted and started again) it asks again every
// 5 seconds until ctx ends.
func (c *AgentClient) Upgrade(ctx context.Context, address string, req *upgradeagentv1.UpgradeRequest, progress func(string)) error {
	t := c.tls.Clone()
	t.ServerName = address
	conn, err := grpc.NewClient(net.JoinHostPort(address, strconv.Itoa(c.port)), grpc.WithTransportCredentials(credentials.NewTLS(t)))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := upgradeagentv1.NewUpgradeAgentServiceClient(conn)
	for {
		err := stream(ctx, client, req, progress)
		if status.Code(err) != codes.Aborted {
			return err
		}
		progress("the node is still running an earlier upgrade; asking again in 5 s")
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last answer: %w)", ctx.Err(), err)
		case <-time.After(5 * time.Second):
		}
	}
}

func stream(ctx context.Context, client upgradeagentv1.UpgradeAgentServiceClient, req *upgradeagentv1.UpgradeRequest, progress func(string)) error {
	s, err := client.Upgrade(ctx, req)
	if err != nil {
		return err
	}
	for {
		msg, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		progress(msg.GetMessage())
	}
}
