package cloudmeta

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/gatehouse-dev/gatehouse/internal/cloudmeta/cloudmetatest"
)

const (
	endpointsKey = "gatehouse-join-endpoints"
	hashKey      = "gatehouse-init-secret-hash"
)

// testHash is a bcrypt hash of an init secret.
var testHash = func() string {
	h, err := bcrypt.GenerateFromPassword([]byte("init secret"), bcrypt.MinCost)
	if err != nil {
		panic(err)
	}
	return string(h)
}()

func gceVM() cloudmetatest.Instance {
	return cloudmetatest.Instance{
		Name: "gatehouse-cp-0", Project: "gatehouse-test", ProjectNumber: "123456789012",
		Zone: "europe-west4-a", IPs: []string{"10.164.0.2", "10.200.0.2"},
		Attributes: map[string]string{
			endpointsKey: "10.164.0.2:9000, 10.164.0.3:9000",
			hashKey:      testHash,
		},
		ProjectAttributes: map[string]string{endpointsKey: "cp.internal:9000"},
	}
}

func awsVM() cloudmetatest.Instance {
	return cloudmetatest.Instance{
		Name: "ip-10-0-1-23", ID: "i-0123456789abcdef0",
		Zone: "eu-central-1a", Region: "eu-central-1", IPs: []string{"10.0.1.23"},
		Attributes: map[string]string{
			endpointsKey: "10.0.1.23:9000,10.0.2.17:9000",
			hashKey:      testHash,
		},
	}
}

func azureVM() cloudmetatest.Instance {
	return cloudmetatest.Instance{
		Name: "Gatehouse-CP-0", ID: "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
		Project: "8D2B5E1C-3F4A-4B6C-9D7E-0A1B2C3D4E5F", ResourceGroup: "Gatehouse-RG",
		Zone: "2", Region: "WestEurope", IPs: []string{"10.0.0.4", "10.0.0.5"},
		Attributes: map[string]string{
			"Gatehouse-Join-Endpoints": "[fd00::4]:9000,10.0.0.4:9000",
			hashKey:                    testHash,
		},
	}
}

// fakes start a fake of cloud serving inst and return the fake and a
// provider reading it.
func fake(t *testing.T, cloud string, inst cloudmetatest.Instance) (*cloudmetatest.Fake, Provider) {
	t.Helper()
	var f *cloudmetatest.Fake
	var base string
	switch cloud {
	case "gce":
		f, base = cloudmetatest.NewGCE(t, inst)
	case "aws":
		f, base = cloudmetatest.NewAWS(t, inst)
	case "azure":
		f, base = cloudmetatest.NewAzure(t, inst)
	}
	p, err := New(cloud, base)
	if err != nil {
		t.Fatal(err)
	}
	return f, p
}

func wantErr(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one containing %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("error %q does not contain %q", err, w)
		}
	}
}

func TestSelf(t *testing.T) {
	tests := []struct {
		name   string
		cloud  string
		inst   cloudmetatest.Instance
		change func(*cloudmetatest.Instance)
		want   Self
	}{
		{
			name: "gce", cloud: "gce", inst: gceVM(),
			want: Self{
				Name: "gatehouse-cp-0", ProviderID: "gce://gatehouse-test/europe-west4-a/gatehouse-cp-0",
				Zone: "europe-west4-a", Region: "europe-west4", InternalIPs: []string{"10.164.0.2"},
			},
		},
		{
			name: "gce domain-scoped project", cloud: "gce", inst: gceVM(),
			change: func(i *cloudmetatest.Instance) { i.Project = "example.com:gatehouse-test" },
			want: Self{
				Name: "gatehouse-cp-0", ProviderID: "gce://example.com:gatehouse-test/europe-west4-a/gatehouse-cp-0",
				Zone: "europe-west4-a", Region: "europe-west4", InternalIPs: []string{"10.164.0.2"},
			},
		},
		{
			name: "aws", cloud: "aws", inst: awsVM(),
			want: Self{
				Name: "ip-10-0-1-23", ProviderID: "aws:///eu-central-1a/i-0123456789abcdef0",
				Zone: "eu-central-1a", Region: "eu-central-1", InternalIPs: []string{"10.0.1.23"},
			},
		},
		{
			name: "aws us-east-1 resource name", cloud: "aws", inst: awsVM(),
			change: func(i *cloudmetatest.Instance) {
				i.Name, i.Zone, i.Region = "i-0123456789abcdef0", "us-east-1d", "us-east-1"
			},
			want: Self{
				Name: "i-0123456789abcdef0", ProviderID: "aws:///us-east-1d/i-0123456789abcdef0",
				Zone: "us-east-1d", Region: "us-east-1", InternalIPs: []string{"10.0.1.23"},
			},
		},
		{
			name: "azure, lower-cased", cloud: "azure", inst: azureVM(),
			want: Self{
				Name:       "gatehouse-cp-0",
				ProviderID: "azure:///subscriptions/8d2b5e1c-3f4a-4b6c-9d7e-0a1b2c3d4e5f/resourceGroups/gatehouse-rg/providers/Microsoft.Compute/virtualMachines/gatehouse-cp-0",
				Zone:       "westeurope-2", Region: "westeurope", InternalIPs: []string{"10.0.0.4", "10.0.0.5"},
			},
		},
		{
			name: "azure without a zone, in a flexible scale set", cloud: "azure", inst: azureVM(),
			change: func(i *cloudmetatest.Instance) { i.Zone, i.VMScaleSetName = "", "gatehouse-workers" },
			want: Self{
				Name:       "gatehouse-cp-0",
				ProviderID: "azure:///subscriptions/8d2b5e1c-3f4a-4b6c-9d7e-0a1b2c3d4e5f/resourceGroups/gatehouse-rg/providers/Microsoft.Compute/virtualMachines/gatehouse-cp-0",
				Zone:       "westeurope", Region: "westeurope", InternalIPs: []string{"10.0.0.4", "10.0.0.5"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inst := tt.inst
			if tt.change != nil {
				tt.change(&inst)
			}
			_, p := fake(t, tt.cloud, inst)
			if p.Name() != tt.cloud {
				t.Errorf("Name() = %q, want %q", p.Name(), tt.cloud)
			}
			got, err := p.Self(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if got.Name != tt.want.Name || got.ProviderID != tt.want.ProviderID || got.Zone != tt.want.Zone ||
				got.Region != tt.want.Region || !slices.Equal(got.InternalIPs, tt.want.InternalIPs) {
				t.Errorf("Self() =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

func TestSelfRefuses(t *testing.T) {
	big := strings.Repeat("a", 70<<10)
	tests := []struct {
		name   string
		cloud  string
		inst   cloudmetatest.Instance
		change func(*cloudmetatest.Instance)
		want   []string
	}{
		{"gce bad ip", "gce", gceVM(), func(i *cloudmetatest.Instance) { i.IPs = []string{"10.0.0.300"} },
			[]string{"instance/network-interfaces/0/ip", `"10.0.0.300" is not an IPv4 address`}},
		{"gce no interface", "gce", gceVM(), func(i *cloudmetatest.Instance) { i.IPs = nil },
			[]string{"gce metadata: GET /computeMetadata/v1/instance/network-interfaces/0/ip: HTTP 404"}},
		{"gce upper-case name", "gce", gceVM(), func(i *cloudmetatest.Instance) { i.Name = "CP-0" },
			[]string{"instance/name", "not a DNS-1123 subdomain"}},
		{"gce bad zone", "gce", gceVM(), func(i *cloudmetatest.Instance) { i.ProjectNumber = "my-project" },
			[]string{"instance/zone", "is not projects/<number>/zones/<zone>"}},
		{"gce empty zone", "gce", gceVM(), func(i *cloudmetatest.Instance) { i.Zone = "" },
			[]string{"instance/zone", "the zone is empty"}},
		{"gce bad project", "gce", gceVM(), func(i *cloudmetatest.Instance) { i.Project = "a/b" },
			[]string{"project/project-id", "not a project ID"}},
		{"gce oversized", "gce", gceVM(), func(i *cloudmetatest.Instance) { i.Name = big },
			[]string{"gce metadata: GET /computeMetadata/v1/instance/name: HTTP 200: the answer is larger than 65536 bytes"}},
		{"aws bad ip", "aws", awsVM(), func(i *cloudmetatest.Instance) { i.IPs = []string{"fd00::1"} },
			[]string{"local-ipv4", "is not an IPv4 address"}},
		{"aws no ipv4", "aws", awsVM(), func(i *cloudmetatest.Instance) { i.IPs = nil },
			[]string{"aws metadata: GET /latest/meta-data/local-ipv4: HTTP 404 Not Found"}},
		{"aws bad instance id", "aws", awsVM(), func(i *cloudmetatest.Instance) { i.ID = "i-xyz" },
			[]string{"instance-id", "not an instance ID"}},
		{"aws zone outside region", "aws", awsVM(), func(i *cloudmetatest.Instance) { i.Zone = "us-east-1a" },
			[]string{`availability zone "us-east-1a" is not in region "eu-central-1"`}},
		{"aws bad host name", "aws", awsVM(), func(i *cloudmetatest.Instance) { i.Name = "ip_10_0_1_23" },
			[]string{"local-hostname", "is not a DNS name"}},
		{"aws oversized", "aws", awsVM(), func(i *cloudmetatest.Instance) { i.ID = big },
			[]string{"aws metadata: GET /latest/meta-data/instance-id: HTTP 200: the answer is larger than 65536 bytes"}},
		{"azure bad ip", "azure", azureVM(), func(i *cloudmetatest.Instance) { i.IPs = []string{"10.0.0.4", "ten"} },
			[]string{"network.interface[0].ipv4.ipAddress[1].privateIpAddress", `"ten" is not an IPv4 address`}},
		{"azure no ip", "azure", azureVM(), func(i *cloudmetatest.Instance) { i.IPs = nil },
			[]string{"no private IPv4 address"}},
		{"azure underscore", "azure", azureVM(), func(i *cloudmetatest.Instance) { i.Name = "cp_0" },
			[]string{"compute.name", "not a DNS-1123 subdomain"}},
		{"azure uniform scale set", "azure", azureVM(), func(i *cloudmetatest.Instance) { i.Name, i.VMScaleSetName = "workers_3", "workers" },
			[]string{"uniform scale set", "not supported"}},
		{"azure bad subscription", "azure", azureVM(), func(i *cloudmetatest.Instance) { i.Project = "xxxxx-xxxx" },
			[]string{"compute.subscriptionId"}},
		{"azure bad zone", "azure", azureVM(), func(i *cloudmetatest.Instance) { i.Zone = "zone-a" },
			[]string{"compute.zone"}},
		{"azure empty location", "azure", azureVM(), func(i *cloudmetatest.Instance) { i.Region = "" },
			[]string{"compute.location", "the location is empty"}},
		{"azure oversized", "azure", azureVM(), func(i *cloudmetatest.Instance) { i.Attributes["big"] = strings.Repeat(big, 4) },
			[]string{"azure metadata: GET /metadata/instance?api-version=2021-02-01: HTTP 200: the answer is larger than 262144 bytes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inst := tt.inst
			tt.change(&inst)
			_, p := fake(t, tt.cloud, inst)
			_, err := p.Self(t.Context())
			wantErr(t, err, append([]string{tt.cloud + " metadata"}, tt.want...)...)
		})
	}
}

func TestControlPlanes(t *testing.T) {
	tests := []struct {
		name    string
		cloud   string
		inst    cloudmetatest.Instance
		change  func(*cloudmetatest.Instance)
		key     string
		want    []string
		wantErr []string
	}{
		{name: "gce instance attribute", cloud: "gce", inst: gceVM(), key: endpointsKey,
			want: []string{"10.164.0.2:9000", "10.164.0.3:9000"}},
		{name: "gce project attribute", cloud: "gce", inst: gceVM(), key: endpointsKey,
			change: func(i *cloudmetatest.Instance) { delete(i.Attributes, endpointsKey) },
			want:   []string{"cp.internal:9000"}},
		{name: "gce neither", cloud: "gce", inst: gceVM(), key: "other",
			wantErr: []string{`gce metadata: neither the instance nor the project has the attribute "other" (404)`}},
		{name: "gce bad key", cloud: "gce", inst: gceVM(), key: "gatehouse.dev/role",
			wantErr: []string{"is not a metadata key"}},
		{name: "gce bad entry", cloud: "gce", inst: gceVM(), key: endpointsKey,
			change:  func(i *cloudmetatest.Instance) { i.Attributes[endpointsKey] = "10.0.0.1:9000,10.0.0.2" },
			wantErr: []string{`instance attribute "gatehouse-join-endpoints": endpoint "10.0.0.2" is not host:port`}},
		{name: "gce empty list", cloud: "gce", inst: gceVM(), key: endpointsKey,
			change:  func(i *cloudmetatest.Instance) { i.Attributes[endpointsKey] = " , " },
			wantErr: []string{"the endpoint list is empty"}},
		{name: "gce oversized", cloud: "gce", inst: gceVM(), key: endpointsKey,
			change:  func(i *cloudmetatest.Instance) { i.Attributes[endpointsKey] = strings.Repeat("10.0.0.1:9000,", 5000) },
			wantErr: []string{"instance/attributes/gatehouse-join-endpoints: HTTP 200: the answer is larger than 65536 bytes"}},
		{name: "aws tag", cloud: "aws", inst: awsVM(), key: endpointsKey,
			want: []string{"10.0.1.23:9000", "10.0.2.17:9000"}},
		{name: "aws tag absent", cloud: "aws", inst: awsVM(), key: "other",
			wantErr: []string{"GET /latest/meta-data/tags/instance/other: HTTP 404", `the instance has no tag "other"`}},
		{name: "aws tags not in metadata", cloud: "aws", inst: awsVM(), key: endpointsKey,
			change:  func(i *cloudmetatest.Instance) { i.NoTagsInMetadata = true },
			wantErr: []string{"HTTP 404", "instance tags are not in the instance metadata", "InstanceMetadataTags=enabled"}},
		{name: "aws key with slash", cloud: "aws", inst: awsVM(), key: "gatehouse.dev/role",
			wantErr: []string{"is not a tag key instance metadata can serve"}},
		{name: "aws bad port", cloud: "aws", inst: awsVM(), key: endpointsKey,
			change:  func(i *cloudmetatest.Instance) { i.Attributes[endpointsKey] = "10.0.0.1:99999" },
			wantErr: []string{`port "99999" is not 1-65535`}},
		{name: "azure tag, name case-insensitive", cloud: "azure", inst: azureVM(), key: endpointsKey,
			want: []string{"[fd00::4]:9000", "10.0.0.4:9000"}},
		{name: "azure tag absent", cloud: "azure", inst: azureVM(), key: "other",
			wantErr: []string{`azure metadata: the VM has no tag "other" (compute.tagsList)`}},
		{name: "azure bad key", cloud: "azure", inst: azureVM(), key: "gatehouse.dev/role",
			wantErr: []string{"is not a tag name"}},
		{name: "azure bad host", cloud: "azure", inst: azureVM(), key: endpointsKey,
			change:  func(i *cloudmetatest.Instance) { i.Attributes["Gatehouse-Join-Endpoints"] = "cp_0:9000" },
			wantErr: []string{`host "cp_0" is neither an IP address nor a DNS name`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inst := tt.inst
			if tt.change != nil {
				tt.change(&inst)
			}
			_, p := fake(t, tt.cloud, inst)
			got, err := p.ControlPlanes(t.Context(), tt.key)
			if tt.wantErr != nil {
				wantErr(t, err, tt.wantErr...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("ControlPlanes() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestInitSecretHash(t *testing.T) {
	for _, cloud := range []string{"gce", "aws", "azure"} {
		inst := map[string]func() cloudmetatest.Instance{"gce": gceVM, "aws": awsVM, "azure": azureVM}[cloud]
		tests := []struct {
			name    string
			change  func(*cloudmetatest.Instance)
			key     string
			wantErr []string
		}{
			{name: "hash", key: hashKey},
			{name: "absent", key: "other", wantErr: []string{`"other"`}},
			{name: "not bcrypt", key: hashKey, change: func(i *cloudmetatest.Instance) { i.Attributes[hashKey] = "plain secret" },
				wantErr: []string{"the value (12 bytes) is not a bcrypt hash"}},
			{name: "short hash", key: hashKey, change: func(i *cloudmetatest.Instance) { i.Attributes[hashKey] = testHash[:59] },
				wantErr: []string{"is not a bcrypt hash"}},
			{name: "bad key", key: "a/b", wantErr: []string{`"a/b"`}},
		}
		for _, tt := range tests {
			t.Run(cloud+" "+tt.name, func(t *testing.T) {
				in := inst()
				if tt.change != nil {
					tt.change(&in)
				}
				if cloud == "gce" {
					// The init secret's hash is read from the instance only.
					in.ProjectAttributes = map[string]string{hashKey: testHash, "other": testHash}
				}
				_, p := fake(t, cloud, in)
				got, err := p.InitSecretHash(t.Context(), tt.key)
				if tt.wantErr != nil {
					wantErr(t, err, append([]string{cloud + " metadata"}, tt.wantErr...)...)
					if strings.Contains(err.Error(), "plain secret") {
						t.Fatalf("error echoes the value: %v", err)
					}
					// Only an unset key is ErrNotSet (the bootstrapper then
					// starts without an init secret).
					if errors.Is(err, ErrNotSet) != (tt.name == "absent") {
						t.Fatalf("errors.Is(%v, ErrNotSet) = %v", err, tt.name != "absent")
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if got != testHash {
					t.Errorf("InitSecretHash() = %q, want %q", got, testHash)
				}
			})
		}
	}
}

// TestFakesRefuseLikeTheRealServices shows that each fake refuses what the
// real service refuses, so the passing tests above prove that the clients
// send the required headers.
func TestFakesRefuseLikeTheRealServices(t *testing.T) {
	_, gceBase := cloudmetatest.NewGCE(t, gceVM())
	_, awsBase := cloudmetatest.NewAWS(t, awsVM())
	_, azureBase := cloudmetatest.NewAzure(t, azureVM())
	tests := []struct {
		name   string
		method string
		url    string
		header http.Header
		status int
	}{
		{"gce without Metadata-Flavor", "GET", gceBase + "/computeMetadata/v1/instance/name", nil, http.StatusForbidden},
		{"gce with the wrong flavor", "GET", gceBase + "/computeMetadata/v1/instance/name", http.Header{"Metadata-Flavor": {"Amazon"}}, http.StatusForbidden},
		{"gce with X-Forwarded-For", "GET", gceBase + "/computeMetadata/v1/instance/name",
			http.Header{"Metadata-Flavor": {"Google"}, "X-Forwarded-For": {"10.0.0.9"}}, http.StatusForbidden},
		{"gce with the header", "GET", gceBase + "/computeMetadata/v1/instance/name", http.Header{"Metadata-Flavor": {"Google"}}, http.StatusOK},
		{"aws IMDSv1 GET", "GET", awsBase + "/latest/meta-data/instance-id", nil, http.StatusUnauthorized},
		{"aws forged token", "GET", awsBase + "/latest/meta-data/instance-id", http.Header{"X-Aws-Ec2-Metadata-Token": {"forged"}}, http.StatusUnauthorized},
		{"aws token without TTL", "PUT", awsBase + "/latest/api/token", nil, http.StatusBadRequest},
		{"aws token TTL too long", "PUT", awsBase + "/latest/api/token", http.Header{"X-Aws-Ec2-Metadata-Token-Ttl-Seconds": {"21601"}}, http.StatusBadRequest},
		{"aws token with X-Forwarded-For", "PUT", awsBase + "/latest/api/token",
			http.Header{"X-Aws-Ec2-Metadata-Token-Ttl-Seconds": {"60"}, "X-Forwarded-For": {"10.0.0.9"}}, http.StatusForbidden},
		{"aws token", "PUT", awsBase + "/latest/api/token", http.Header{"X-Aws-Ec2-Metadata-Token-Ttl-Seconds": {"60"}}, http.StatusOK},
		{"azure without Metadata: true", "GET", azureBase + azureInstancePath, nil, http.StatusBadRequest},
		{"azure without api-version", "GET", azureBase + "/metadata/instance", http.Header{"Metadata": {"true"}}, http.StatusBadRequest},
		{"azure with X-Forwarded-For", "GET", azureBase + azureInstancePath,
			http.Header{"Metadata": {"true"}, "X-Forwarded-For": {"10.0.0.9"}}, http.StatusBadRequest},
		{"azure with the header", "GET", azureBase + azureInstancePath, http.Header{"Metadata": {"true"}}, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), tt.method, tt.url, http.NoBody)
			if err != nil {
				t.Fatal(err)
			}
			req.Header = tt.header
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tt.status)
			}
		})
	}
}

// TestAWSNoIMDSv1 shows that a refused token request is an error and that
// no GET is sent without a token, even to a service that would answer it.
func TestAWSNoIMDSv1(t *testing.T) {
	var gets atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			http.Error(w, "Forbidden", http.StatusForbidden) // IMDSv2 switched off
			return
		}
		gets.Add(1)
		_, _ = w.Write([]byte("i-0123456789abcdef0"))
	}))
	t.Cleanup(srv.Close)
	p, err := New("aws", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Self(t.Context())
	wantErr(t, err, "aws metadata: PUT /latest/api/token: HTTP 403 Forbidden", "IMDSv1 is not used")
	if n := gets.Load(); n != 0 {
		t.Errorf("%d GETs without a token", n)
	}
}

// TestAWSToken shows that the session token is kept until shortly before
// its TTL ends, and replaced after a 401.
func TestAWSToken(t *testing.T) {
	f, base := cloudmetatest.NewAWS(t, awsVM())
	a := newAWS(base)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a.now = func() time.Time { return now }
	self := func() {
		t.Helper()
		if _, err := a.Self(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	self()
	self()
	if n := f.TokenRequests(); n != 1 {
		t.Fatalf("%d token requests for two Self calls within the TTL, want 1", n)
	}
	now = now.Add(awsTokenTTL - awsTokenMargin - time.Second)
	self()
	if n := f.TokenRequests(); n != 1 {
		t.Fatalf("%d token requests before the margin, want 1", n)
	}
	now = now.Add(time.Second)
	self()
	if n := f.TokenRequests(); n != 2 {
		t.Fatalf("%d token requests after the margin, want 2", n)
	}
	f.ExpireTokens()
	self()
	if n := f.TokenRequests(); n != 3 {
		t.Fatalf("%d token requests after the service expired the token, want 3", n)
	}
}

// TestGCEImpostor refuses answers without Metadata-Flavor: Google, and
// shows the request carries the header.
func TestGCEImpostor(t *testing.T) {
	var flavor atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		flavor.Store(r.Header.Get("Metadata-Flavor"))
		_, _ = w.Write([]byte("gatehouse-cp-0"))
	}))
	t.Cleanup(srv.Close)
	p, err := New("gce", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Self(t.Context())
	wantErr(t, err, "gce metadata: GET /computeMetadata/v1/instance/name: HTTP 200 without the Metadata-Flavor: Google header")
	if f, _ := flavor.Load().(string); f != "Google" {
		t.Errorf("the request's Metadata-Flavor is %q", f)
	}
}

// TestTransport covers what all providers share: no redirect is followed,
// no X-Forwarded-For is sent, no proxy is used, a hung service times out,
// and the caller's context is honoured.
func TestTransport(t *testing.T) {
	var followed, forwarded atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("/computeMetadata/v1/instance/name", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Forwarded-For") != "" {
			forwarded.Store(true)
		}
		w.Header().Set("Metadata-Flavor", "Google")
		http.Redirect(w, r, "/elsewhere", http.StatusFound)
	})
	mux.HandleFunc("/elsewhere", func(w http.ResponseWriter, _ *http.Request) {
		followed.Store(true)
		w.Header().Set("Metadata-Flavor", "Google")
		_, _ = w.Write([]byte("gatehouse-cp-0"))
	})
	mux.HandleFunc("/hang", func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	g := newGCE(srv.URL)
	_, err := g.Self(t.Context())
	wantErr(t, err, "HTTP 302 Found (redirects are not followed)")
	if followed.Load() {
		t.Error("the redirect was followed")
	}
	if forwarded.Load() {
		t.Error("X-Forwarded-For sent")
	}
	if tr := g.c.http.Transport.(*http.Transport); tr.Proxy != nil {
		t.Error("the transport uses a proxy")
	}

	c := newClient("aws", srv.URL, maxResponse)
	c.timeout = 50 * time.Millisecond
	_, err = c.do(t.Context(), http.MethodGet, "/hang", nil)
	wantErr(t, err, "aws metadata: GET /hang:", "context deadline exceeded")

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = newClient("azure", srv.URL, maxResponse).do(ctx, http.MethodGet, "/hang", nil)
	wantErr(t, err, "azure metadata: GET /hang:", "context canceled")
}

func TestNew(t *testing.T) {
	tests := []struct {
		cloud, base string
		wantErr     string
	}{
		{cloud: "gce", base: ""},
		{cloud: "aws", base: "http://127.0.0.1:8080/"},
		{cloud: "openstack", base: "", wantErr: `unknown cloud "openstack"`},
		{cloud: "gce", base: "https://169.254.169.254", wantErr: "is not http://host[:port]"},
		{cloud: "gce", base: "http://169.254.169.254/computeMetadata", wantErr: "is not http://host[:port]"},
		{cloud: "gce", base: "http://user@169.254.169.254", wantErr: "is not http://host[:port]"},
		{cloud: "gce", base: "169.254.169.254", wantErr: "is not http://host[:port]"},
	}
	for _, tt := range tests {
		t.Run(tt.cloud+" "+tt.base, func(t *testing.T) {
			p, err := New(tt.cloud, tt.base)
			if tt.wantErr != "" {
				wantErr(t, err, tt.wantErr)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Name() != tt.cloud {
				t.Errorf("Name() = %q", p.Name())
			}
		})
	}
	p, _ := New("gce", "")
	if base := p.(*gce).c.base; base != "http://169.254.169.254" {
		t.Errorf("default base %q", base)
	}
}
