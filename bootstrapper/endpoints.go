package bootstrapper

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
)

// EndpointSource finds the join service's endpoints (host:port). Static
// lists and files are built in; cloud metadata providers implement it too.
type EndpointSource interface {
	Endpoints(ctx context.Context) ([]string, error)
}

// StaticEndpoints is a fixed list of host:port endpoints.
type StaticEndpoints []string

// Endpoints returns the list after checking each entry.
func (s StaticEndpoints) Endpoints(context.Context) ([]string, error) {
	return checkEndpoints(s, "the static endpoint list")
}

// FileEndpoints reads host:port endpoints from a file, one per line; blank
// lines and lines starting with # are skipped. The file is read on every
// call, so it can be updated while the node waits.
type FileEndpoints string

// Endpoints reads the file.
func (f FileEndpoints) Endpoints(context.Context) ([]string, error) {
	data, err := os.ReadFile(string(f))
	if err != nil {
		return nil, fmt.Errorf("reading join service endpoints: %w", err)
	}
	var list []string
	lines := bufio.NewScanner(bytes.NewReader(data))
	for lines.Scan() {
		line := strings.TrimSpace(lines.Text())
		if line != "" && !strings.HasPrefix(line, "#") {
			list = append(list, line)
		}
	}
	return checkEndpoints(list, string(f))
}

// CloudEndpoints reads the join service's endpoints from the instance's
// cloud metadata under Key (internal/cloudmeta) at every call, so they can
// be set or changed while the node waits.
type CloudEndpoints struct {
	Source interface {
		ControlPlanes(ctx context.Context, key string) ([]string, error)
	}
	Key string
}

// Endpoints reads the metadata.
func (c CloudEndpoints) Endpoints(ctx context.Context) ([]string, error) {
	list, err := c.Source.ControlPlanes(ctx, c.Key)
	if err != nil {
		return nil, fmt.Errorf("reading join service endpoints from the cloud's metadata: %w", err)
	}
	return checkEndpoints(list, "the instance metadata key "+c.Key)
}

func checkEndpoints(list []string, source string) ([]string, error) {
	if len(list) == 0 {
		return nil, fmt.Errorf("%s names no join service endpoint", source)
	}
	var errs []error
	for _, e := range list {
		if host, port, err := net.SplitHostPort(e); err != nil || host == "" || port == "" {
			errs = append(errs, fmt.Errorf("join service endpoint %q in %s is not host:port", e, source))
		}
	}
	return list, errors.Join(errs...)
}
