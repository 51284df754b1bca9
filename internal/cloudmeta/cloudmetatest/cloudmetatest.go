// Package cloudmetatest serves fake instance metadata services for tests:
// Compute Engine's metadata server, EC2's IMDSv2 and Azure's IMDS, each in
// its cloud's documented request and response shapes, and each refusing,
// as the real one does, a request without the header it requires. A Fake
// is an http.Handler, so it can be served on loopback (NewGCE, NewAWS,
// NewAzure) or at 169.254.169.254 inside a node's network namespace.
package cloudmetatest

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// Instance is the machine a fake describes. One description serves any of
// the three clouds; each fake reads the fields its cloud has.
type Instance struct {
	// Name is the GCE instance name (instance/name), the AWS host name's
	// first label (local-hostname is <Name>.<region>.compute.internal, or
	// <Name>.ec2.internal in us-east-1), or Azure's compute.name.
	Name string
	// ID is the AWS instance ID (instance-id, i-…) and Azure's compute.vmId.
	ID string
	// Project is the GCE project ID (project/project-id) or the Azure
	// subscription ID (compute.subscriptionId).
	Project string
	// ProjectNumber is the GCE project number in instance/zone
	// (projects/<number>/zones/<zone>).
	ProjectNumber string
	// ResourceGroup is Azure's compute.resourceGroupName.
	ResourceGroup string
	// Zone is the GCE zone, the AWS availability zone, or the Azure zone
	// number ("1", "2", "3"; empty for none).
	Zone string
	// Region is the AWS region or the Azure location; GCE's follows from
	// Zone.
	Region string
	// VMScaleSetName is Azure's compute.vmScaleSetName.
	VMScaleSetName string
	// IPs are the private IPv4 addresses: GCE serves one per network
	// interface (network-interfaces/<i>/ip), AWS the first (local-ipv4),
	// Azure one interface with all of them.
	IPs []string
	// Attributes are GCE instance attributes, AWS instance tags and Azure
	// tags.
	Attributes map[string]string
	// ProjectAttributes are GCE project attributes.
	ProjectAttributes map[string]string
	// NoTagsInMetadata is an EC2 instance whose tags are not allowed in its
	// metadata: tags/instance and every tags/instance/<key> answer 404.
	NoTagsInMetadata bool
}

// Fake is one cloud's metadata service serving an Instance.
type Fake struct {
	cloud string
	serve func(f *Fake, w http.ResponseWriter, r *http.Request)

	mu            sync.Mutex
	inst          Instance
	tokens        map[string]bool // AWS: session tokens still valid
	tokenRequests int             // AWS: PUT /latest/api/token answered 200
	requests      int             // every request
}

// GCE serves inst as Compute Engine's metadata server.
func GCE(inst Instance) *Fake { return &Fake{cloud: "gce", serve: serveGCE, inst: inst} }

// AWS serves inst as EC2's IMDSv2 with tokens required (HttpTokens=required).
func AWS(inst Instance) *Fake {
	return &Fake{cloud: "aws", serve: serveAWS, inst: inst, tokens: map[string]bool{}}
}

// Azure serves inst as Azure's IMDS.
func Azure(inst Instance) *Fake { return &Fake{cloud: "azure", serve: serveAzure, inst: inst} }

// ServeHTTP answers one request.
func (f *Fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests++
	f.mu.Unlock()
	f.serve(f, w, r)
}

// instance returns a copy of what the fake serves now.
func (f *Fake) instance() Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inst
}

// Update changes what the fake serves from the next request on.
func (f *Fake) Update(change func(*Instance)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(&f.inst)
}

// Requests is how many requests the fake has answered.
func (f *Fake) Requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests
}

// TokenRequests is how many IMDSv2 session tokens the AWS fake has issued.
func (f *Fake) TokenRequests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tokenRequests
}

// ExpireTokens makes every session token the AWS fake issued invalid, as
// their expiry would: requests carrying one answer 401.
func (f *Fake) ExpireTokens() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.tokens)
}

// Start serves the fake on a loopback port until the test ends and returns
// its base URL (http://127.0.0.1:<port>).
func (f *Fake) Start(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return srv.URL
}

// NewGCE serves inst as Compute Engine's metadata server on loopback.
func NewGCE(t testing.TB, inst Instance) (*Fake, string) {
	t.Helper()
	f := GCE(inst)
	return f, f.Start(t)
}

// NewAWS serves inst as EC2's IMDSv2 on loopback.
func NewAWS(t testing.TB, inst Instance) (*Fake, string) {
	t.Helper()
	f := AWS(inst)
	return f, f.Start(t)
}

// NewAzure serves inst as Azure's IMDS on loopback.
func NewAzure(t testing.TB, inst Instance) (*Fake, string) {
	t.Helper()
	f := Azure(inst)
	return f, f.Start(t)
}
