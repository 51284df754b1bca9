package cloudmeta

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/cloudmeta/cloudmetatest"
)

func TestDetect(t *testing.T) {
	for _, tt := range []struct {
		cloud string
		fake  *cloudmetatest.Fake
	}{
		{"gce", cloudmetatest.GCE(gceVM())},
		{"aws", cloudmetatest.AWS(awsVM())},
		{"azure", cloudmetatest.Azure(azureVM())},
	} {
		t.Run(tt.cloud, func(t *testing.T) {
			p, err := Detect(t.Context(), tt.fake.Start(t))
			if err != nil {
				t.Fatal(err)
			}
			if p.Name() != tt.cloud {
				t.Fatalf("Detect found %q, want %q", p.Name(), tt.cloud)
			}
			if _, err := p.Self(t.Context()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestDetectKeepsAWSToken shows the probe's IMDSv2 token serves the
// provider's first requests.
func TestDetectKeepsAWSToken(t *testing.T) {
	f, base := cloudmetatest.NewAWS(t, awsVM())
	p, err := Detect(t.Context(), base)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Self(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := f.TokenRequests(); n != 1 {
		t.Errorf("%d token requests, want 1", n)
	}
}

func TestDetectRefuses(t *testing.T) {
	// A web server that is none of the three: 404 everywhere.
	notFound := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(notFound.Close)
	// One that answers everything with 200 and JSON, but is no cloud:
	// no Metadata-Flavor header, no token, no compute object.
	generic := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	}))
	t.Cleanup(generic.Close)
	// A port nobody listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	// Two clouds at one address.
	both := http.NewServeMux()
	both.Handle("/computeMetadata/", cloudmetatest.GCE(gceVM()))
	both.Handle("/latest/", cloudmetatest.AWS(awsVM()))
	two := httptest.NewServer(both)
	t.Cleanup(two.Close)

	tests := []struct {
		name string
		base string
		want []string
	}{
		{"404 everywhere", notFound.URL, []string{
			"no cloud's instance metadata service answers at " + notFound.URL,
			"gce: gce metadata: GET /computeMetadata/v1/: HTTP 404 without the Metadata-Flavor: Google header",
			"aws: aws metadata: PUT /latest/api/token: HTTP 404 Not Found",
			"azure: azure metadata: GET /metadata/instance?api-version=2021-02-01: HTTP 404 Not Found",
		}},
		{"a web server that is no cloud", generic.URL, []string{
			"gce: gce metadata: GET /computeMetadata/v1/: HTTP 200 without the Metadata-Flavor: Google header",
			"aws: aws metadata: PUT /latest/api/token: the answer's X-aws-ec2-metadata-token-ttl-seconds \"\" is not 1-21600",
			"azure: azure metadata: GET /metadata/instance?api-version=2021-02-01: the instance document has no compute object",
		}},
		{"nothing listens", closed, []string{"gce: ", "aws: ", "azure: ", "connection refused"}},
		{"two clouds", two.URL, []string{"more than one cloud's instance metadata service answers", "gce, aws"}},
		{"bad base", "ftp://169.254.169.254", []string{"is not http://host[:port]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Detect(t.Context(), tt.base)
			if err == nil {
				t.Fatalf("Detect found %q", p.Name())
			}
			wantErr(t, err, tt.want...)
		})
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = Detect(ctx, notFound.URL)
	wantErr(t, err, "detecting the cloud at "+notFound.URL, "context canceled")
}
