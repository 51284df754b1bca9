package mini

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// EtcdMember is one member of the cluster's stacked etcd.
type EtcdMember struct {
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peerURLs"`
	ClientURLs []string `json:"clientURLs"`
	IsLearner  bool     `json:"isLearner"`
	// Healthy is what the member's own /health answers.
	Healthy bool `json:"-"`
}

// EtcdMembers lists the etcd members of the local cluster in dir and asks
// each for its health. It talks to etcd as kubeadm's health check does,
// with the etcd healthcheck-client certificate of a control plane, through
// etcd's v3 JSON gateway (POST /v3/cluster/member/list, GET /health). It
// asks the control planes in turn until one answers.
func EtcdMembers(ctx context.Context, dir string) ([]EtcdMember, error) {
	rec, err := ReadRecord(dir)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, n := range rec.Nodes {
		spec, err := ReadNodeSpec(filepath.Join(n.Dir, "node.json"))
		if err != nil || !spec.ControlPlane {
			continue
		}
		client, err := etcdClient(filepath.Join(spec.rootDir(), "etc/kubernetes/pki/etcd"))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.Name, err))
			continue
		}
		members, err := listEtcdMembers(ctx, client, "https://"+spec.IP+":2379")
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.Name, err))
			continue
		}
		for i := range members {
			if len(members[i].ClientURLs) > 0 {
				members[i].Healthy = etcdHealthy(ctx, client, members[i].ClientURLs[0])
			}
		}
		return members, nil
	}
	return nil, fmt.Errorf("no control plane's etcd answers: %w", errors.Join(errs...))
}

func etcdClient(pki string) (*http.Client, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(pki, "healthcheck-client.crt"), filepath.Join(pki, "healthcheck-client.key"))
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(filepath.Join(pki, "ca.crt"))
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		return nil, errors.New("the etcd CA file holds no certificate")
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, MinVersion: tls.VersionTLS12},
	}}, nil
}

func listEtcdMembers(ctx context.Context, client *http.Client, endpoint string) ([]EtcdMember, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint+"/v3/cluster/member/list", strings.NewReader("{}"))
	if err != nil {
		return nil, err
	}
	body, err := do(client, req)
	if err != nil {
		return nil, fmt.Errorf("listing etcd members: %w", err)
	}
	var list struct {
		Members []EtcdMember `json:"members"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("listing etcd members: %w", err)
	}
	return list.Members, nil
}

func etcdHealthy(ctx context.Context, client *http.Client, endpoint string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/health", nil)
	if err != nil {
		return false
	}
	body, err := do(client, req)
	var h struct {
		Health string `json:"health"`
	}
	return err == nil && json.Unmarshal(body, &h) == nil && h.Health == "true"
}

func do(client *http.Client, req *http.Request) ([]byte, error) {
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(body))
	}
	return body, nil
}
