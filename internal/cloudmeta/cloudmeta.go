package cloudmeta

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Self is what a node learns about itself from its cloud's metadata.
type Self struct {
	// Name is the node's name: a DNS-1123 subdomain, lower-case. GCE: the
	// instance name. AWS: the first label of the private DNS name
	// (local-hostname: ip-10-0-1-23 for IP names, i-0123… for resource
	// names, per EC2's "Amazon EC2 instance hostname types"), which is the
	// host name EC2's DHCP gives the instance and unique in its VPC. Azure:
	// compute.name, lower-cased (Azure VM names are case-insensitive).
	Name string
	// ProviderID is the Kubernetes Node's spec.providerID in the cloud
	// provider's format:
	//   - gce://<project-id>/<zone>/<instance-name> (cloud-provider-gcp,
	//     providers/gce/gce_util.go, splitProviderID);
	//   - aws:///<availability-zone>/<instance-id> (cloud-provider-aws,
	//     pkg/providers/v1/instances.go, KubernetesInstanceID);
	//   - azure:///subscriptions/<sub>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachines/<name>
	//     with the subscription and resource group lower-cased and the
	//     node's name (cloud-provider-azure, pkg/provider/azure_instances.go,
	//     getLocalInstanceProviderID; azure_standard.go, getStandardMachineID).
	ProviderID string
	// Zone is the GCE zone (the last element of instance/zone), the AWS
	// availability zone, or the Azure zone as cloud-provider-azure labels
	// it, <location>-<zone> (azure_zones.go, makeZone), or the location
	// when the VM is in no availability zone.
	Zone string
	// Region is the GCE region (the zone without its last "-x"), the AWS
	// region, or the Azure location, lower-case.
	Region string
	// InternalIPs are the node's private addresses, first the primary one:
	// GCE: network interface 0; AWS: local-ipv4; Azure: every interface's
	// private IPv4 addresses in the document's order.
	InternalIPs []string
}

// Provider is a cloud's instance metadata, as the instance itself sees it.
type Provider interface {
	// Name is the cloud's name: "gce", "aws" or "azure".
	Name() string
	// Self reads the instance's identity and addresses.
	Self(ctx context.Context) (Self, error)
	// ControlPlanes returns the control planes' endpoints (host:port) listed
	// comma-separated in the instance's own metadata under key: a GCE
	// instance attribute, else the project attribute; an AWS instance tag;
	// an Azure tag. An unset key, an empty list or an entry that is not
	// host:port is an error. Finding peers by label through the compute API
	// is not done here (see the package documentation).
	ControlPlanes(ctx context.Context, key string) ([]string, error)
	// InitSecretHash returns the bcrypt hash ($2a$, $2b$ or $2y$, 60 bytes)
	// of the cluster's init secret, stored in the instance's own metadata
	// under key: a GCE instance attribute, an AWS instance tag, an Azure
	// tag. An unset key or a value that is not a bcrypt hash is an error.
	InitSecretHash(ctx context.Context, key string) (string, error)
}

// ErrNotSet is wrapped by ControlPlanes' and InitSecretHash's errors when
// the instance's metadata has no such key (an attribute or tag not set),
// as opposed to a metadata service that fails or a value that is wrong.
var ErrNotSet = errors.New("not set in the instance's metadata")

// defaultBase is where every cloud's metadata service listens.
const defaultBase = "http://169.254.169.254"

// New returns the provider for cloud ("gce", "aws" or "azure") whose
// metadata service is at base (an http:// URL without a path; empty means
// http://169.254.169.254).
func New(cloud, base string) (Provider, error) {
	b, err := parseBase(base)
	if err != nil {
		return nil, err
	}
	switch cloud {
	case "gce":
		return newGCE(b), nil
	case "aws":
		return newAWS(b), nil
	case "azure":
		return newAzure(b), nil
	}
	return nil, fmt.Errorf("unknown cloud %q: known clouds are gce, aws, azure", cloud)
}

// parseBase checks a metadata service's base URL and returns it without a
// trailing slash.
func parseBase(base string) (string, error) {
	if base == "" {
		return defaultBase, nil
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("metadata service URL %q: %w", base, err)
	}
	if u.Scheme != "http" || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("metadata service URL %q is not http://host[:port]", base)
	}
	return "http://" + u.Host, nil
}

const (
	// requestTimeout bounds each request, within the caller's context.
	requestTimeout = 2 * time.Second
	// maxResponse is the largest answer read, in bytes.
	maxResponse = 64 << 10
)

// client makes one cloud's metadata requests.
type client struct {
	provider string // "gce", "aws", "azure": starts every error
	base     string // http://host[:port]
	http     *http.Client
	timeout  time.Duration // per request
	limit    int64         // bytes of an answer
}

func newClient(provider, base string, limit int64) *client {
	return &client{
		provider: provider,
		base:     base,
		timeout:  requestTimeout,
		limit:    limit,
		http: &http.Client{
			Transport: &http.Transport{
				// The metadata address is link-local and answers only
				// directly: no proxy from the environment.
				Proxy:                 nil,
				DialContext:           (&net.Dialer{Timeout: requestTimeout}).DialContext,
				ResponseHeaderTimeout: requestTimeout,
				MaxIdleConnsPerHost:   2,
				IdleConnTimeout:       30 * time.Second,
			},
			// A metadata service does not redirect; an answer that does is
			// returned as it is and refused by its status.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// answer is a metadata service's response, its body read in full.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// do sends one request. Only transport failures and oversized answers are
// errors here; the caller judges the status.
func (c *client) do(ctx context.Context, method, path string, header http.Header) (*answer, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, http.NoBody)
	if err != nil {
		return nil, c.errorf(method, path, "%w", err)
	}
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, c.errorf(method, path, "%w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, c.limit+1))
	if err != nil {
		return nil, c.errorf(method, path, "reading the answer: %w", err)
	}
	if int64(len(body)) > c.limit {
		return nil, c.errorf(method, path, "HTTP %d: the answer is larger than %d bytes", resp.StatusCode, c.limit)
	}
	return &answer{status: resp.StatusCode, header: resp.Header, body: body}, nil
}

// errorf makes an error naming the provider and the request.
func (c *client) errorf(method, path, format string, args ...any) error {
	return fmt.Errorf("%s metadata: %s %s: %w", c.provider, method, path, fmt.Errorf(format, args...))
}

// statusError is an answer with a status other than 200.
type statusError struct {
	status int
	body   string // a short, quoted excerpt
}

func (e *statusError) Error() string {
	msg := fmt.Sprintf("HTTP %d %s", e.status, http.StatusText(e.status))
	if e.status >= 300 && e.status < 400 {
		msg += " (redirects are not followed)"
	}
	if e.body != "" {
		msg += ": " + e.body
	}
	return msg
}

// newStatusError describes a refused answer with an excerpt of its body.
func newStatusError(a *answer) *statusError {
	excerpt := strings.TrimSpace(string(a.body))
	if len(excerpt) > 120 {
		excerpt = excerpt[:120] + "…"
	}
	if excerpt != "" {
		excerpt = strconv.Quote(excerpt)
	}
	return &statusError{status: a.status, body: excerpt}
}

// isStatus reports whether err is an answer with the given status.
func isStatus(err error, status int) bool {
	var se *statusError
	return errors.As(err, &se) && se.status == status
}
