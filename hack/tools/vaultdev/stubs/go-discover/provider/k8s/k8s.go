// Package k8s is a stub of go-discover's Kubernetes provider.
package k8s

import (
	"errors"
	"log"
)

// Provider is the (stub) Kubernetes discovery provider.
type Provider struct{}

// Help describes the stub.
func (p *Provider) Help() string { return "k8s discovery stub" }

// Addrs always fails.
func (p *Provider) Addrs(map[string]string, *log.Logger) ([]string, error) {
	return nil, errors.New("go-discover stub: k8s discovery not supported")
}
