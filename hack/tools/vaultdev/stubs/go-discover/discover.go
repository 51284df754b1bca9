// Package discover is an API-compatible stub of github.com/hashicorp/go-discover
// that knows no providers: every lookup fails. Only the identifiers that
// github.com/hashicorp/vault references are provided.
package discover

import (
	"errors"
	"log"
	"sort"
	"strings"
)

// Provider is a cloud address-discovery provider.
type Provider interface {
	Addrs(args map[string]string, l *log.Logger) ([]string, error)
	Help() string
}

// Providers is empty in this stub.
var Providers = map[string]Provider{}

// Discover looks up addresses with a set of providers.
type Discover struct{ providers map[string]Provider }

// Option configures a Discover.
type Option func(*Discover) error

// New returns a Discover configured by opts.
func New(opts ...Option) (*Discover, error) {
	d := &Discover{}
	for _, o := range opts {
		if err := o(d); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// WithUserAgent is accepted and ignored.
func WithUserAgent(string) Option { return func(*Discover) error { return nil } }

// WithProviders sets the providers (ignored by Addrs in this stub).
func WithProviders(m map[string]Provider) Option {
	return func(d *Discover) error { d.providers = m; return nil }
}

// Help describes the stub.
func (d *Discover) Help() string { return "go-discover stub: auto-join is not supported" }

// Addrs always fails: auto-join is not supported by this build.
func (d *Discover) Addrs(cfg string, l *log.Logger) ([]string, error) {
	return nil, errors.New("go-discover stub: auto-join is not supported")
}

// Config is a parsed "key=value key=value" discovery string.
type Config map[string]string

// Parse splits a space-separated list of key=value pairs.
func Parse(s string) (Config, error) {
	c := Config{}
	for _, f := range strings.Fields(s) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return nil, errors.New("go-discover stub: invalid key=value: " + f)
		}
		c[k] = v
	}
	return c, nil
}

// String formats the config back as "key=value" pairs in key order.
func (c Config) String() string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+c[k])
	}
	return strings.Join(parts, " ")
}
