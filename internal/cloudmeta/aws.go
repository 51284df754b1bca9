package cloudmeta

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// aws is EC2's instance metadata service, version 2
// (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html).
type aws struct {
	c   *client
	now func() time.Time

	mu      sync.Mutex
	token   string
	renewAt time.Time // when the cached token is replaced
}

func newAWS(base string) *aws {
	return &aws{c: newClient("aws", base, maxResponse), now: time.Now}
}

func (*aws) Name() string { return "aws" }

const (
	awsTokenPath = "/latest/api/token" //nolint:gosec // G101: the path of the token request, not a credential
	// awsTokenTTL is the session token's lifetime asked for (1-21600 s).
	awsTokenTTL = 300 * time.Second
	// awsTokenMargin is how long before its expiry a token is replaced, so
	// that no request carries a token that expires on the way.
	awsTokenMargin = 60 * time.Second
)

// sessionToken returns the cached token or a new one from
// PUT /latest/api/token with X-aws-ec2-metadata-token-ttl-seconds. A refused
// token request is an error: IMDSv1 (a GET without a token) is not used.
func (a *aws) sessionToken(ctx context.Context) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.token != "" && a.now().Before(a.renewAt) {
		return a.token, nil
	}
	ans, err := a.c.do(ctx, http.MethodPut, awsTokenPath, http.Header{
		"X-Aws-Ec2-Metadata-Token-Ttl-Seconds": {strconv.Itoa(int(awsTokenTTL / time.Second))},
	})
	if err != nil {
		return "", fmt.Errorf("%w (IMDSv2's session token; IMDSv1 is not used)", err)
	}
	if ans.status != http.StatusOK {
		return "", a.c.errorf(http.MethodPut, awsTokenPath, "%w (IMDSv2's session token; IMDSv1 is not used)", newStatusError(ans))
	}
	token := string(ans.body)
	if len(token) > 1024 || !awsToken.MatchString(token) {
		return "", a.c.errorf(http.MethodPut, awsTokenPath, "the answer (%d bytes) is not a session token", len(token))
	}
	// IMDS states the token's lifetime in the answer's TTL header, which
	// the AWS SDK requires too (aws-sdk-go-v2 feature/ec2/imds,
	// api_op_GetToken.go); a web server that is not IMDS does not send it.
	ttlHeader := ans.header.Get("X-Aws-Ec2-Metadata-Token-Ttl-Seconds")
	ttl, err := strconv.Atoi(ttlHeader)
	if err != nil || ttl < 1 || ttl > 21600 {
		return "", a.c.errorf(http.MethodPut, awsTokenPath, "the answer's X-aws-ec2-metadata-token-ttl-seconds %q is not 1-21600", ttlHeader)
	}
	lifetime := min(time.Duration(ttl)*time.Second, awsTokenTTL)
	a.token, a.renewAt = token, a.now().Add(lifetime-min(awsTokenMargin, lifetime/5))
	return token, nil
}

// awsToken is what a session token may be: printable ASCII without
// blanks, so that it is a valid header value (and at most 1 KiB).
var awsToken = regexp.MustCompile(`^[!-~]+$`)

// dropToken forgets token if it is still the cached one.
func (a *aws) dropToken(token string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.token == token {
		a.token = ""
	}
}

// get reads /latest/meta-data/<path> with the session token. A 401 (the
// token expired or the service restarted) gets one new token and one
// retry. Any status but 200 is a *statusError.
func (a *aws) get(ctx context.Context, path string) (string, error) {
	full := "/latest/meta-data/" + path
	for attempt := 0; ; attempt++ {
		token, err := a.sessionToken(ctx)
		if err != nil {
			return "", err
		}
		ans, err := a.c.do(ctx, http.MethodGet, full, http.Header{"X-Aws-Ec2-Metadata-Token": {token}})
		if err != nil {
			return "", err
		}
		if ans.status == http.StatusUnauthorized && attempt == 0 {
			a.dropToken(token)
			continue
		}
		if ans.status != http.StatusOK {
			return "", a.c.errorf(http.MethodGet, full, "%w", newStatusError(ans))
		}
		return string(ans.body), nil
	}
}

// awsInstanceID is an instance ID: "i-" and 8 or 17 hexadecimal digits.
var awsInstanceID = regexp.MustCompile(`^i-([0-9a-f]{8}|[0-9a-f]{17})$`)

// Self reads instance-id, placement/availability-zone, placement/region,
// local-ipv4 and local-hostname (instancedata-data-retrieval.html,
// "Instance metadata categories").
func (a *aws) Self(ctx context.Context) (Self, error) {
	id, err := a.get(ctx, "instance-id")
	if err != nil {
		return Self{}, err
	}
	if !awsInstanceID.MatchString(id) {
		return Self{}, fmt.Errorf("aws metadata: instance-id: %q is not an instance ID", id)
	}
	az, err := a.get(ctx, "placement/availability-zone")
	if err != nil {
		return Self{}, err
	}
	if err := checkZone("availability zone", az); err != nil {
		return Self{}, fmt.Errorf("aws metadata: placement/availability-zone: %w", err)
	}
	region, err := a.get(ctx, "placement/region")
	if err != nil {
		return Self{}, err
	}
	if err := checkZone("region", region); err != nil {
		return Self{}, fmt.Errorf("aws metadata: placement/region: %w", err)
	}
	if !strings.HasPrefix(az, region) {
		return Self{}, fmt.Errorf("aws metadata: availability zone %q is not in region %q", az, region)
	}
	ipValue, err := a.get(ctx, "local-ipv4")
	if err != nil {
		return Self{}, err
	}
	ip, err := parseIPv4(ipValue)
	if err != nil {
		return Self{}, fmt.Errorf("aws metadata: local-ipv4: %w", err)
	}
	hostname, err := a.get(ctx, "local-hostname")
	if err != nil {
		return Self{}, err
	}
	name, err := parseAWSHostname(hostname)
	if err != nil {
		return Self{}, fmt.Errorf("aws metadata: local-hostname: %w", err)
	}
	return Self{
		Name:        name,
		ProviderID:  "aws:///" + az + "/" + id,
		Zone:        az,
		Region:      region,
		InternalIPs: []string{ip},
	}, nil
}

// parseAWSHostname returns the node name local-hostname gives: its first
// label, lower-cased. local-hostname is the private DNS name
// (ip-10-0-1-23.ec2.internal, ip-10-0-1-23.eu-west-1.compute.internal, or
// i-0123456789abcdef0.eu-west-1.compute.internal for resource names); with
// a DHCP option set of several domain names it may list several names,
// separated by blanks, of which the first is taken.
func parseAWSHostname(s string) (string, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return "", fmt.Errorf("%q names no host", s)
	}
	if err := checkDNSName(fields[0]); err != nil {
		return "", fmt.Errorf("%q is not a DNS name", fields[0])
	}
	name, _, _ := strings.Cut(strings.ToLower(fields[0]), ".")
	if err := checkNodeName(name); err != nil {
		return "", err
	}
	return name, nil
}

// awsTagKey is a tag key that instance metadata can serve: letters,
// digits and + - = . , _ : @, no blank or '/', not ".", ".." or "_index"
// (work-with-tags-in-IMDS.html, "Allow access to tags in instance
// metadata"); at most 128 bytes, as any tag key. Checking it also keeps the
// key one path element.
var awsTagKey = regexp.MustCompile(`^[A-Za-z0-9+\-=.,_:@]{1,128}$`)

func checkAWSTagKey(key string) error {
	if !awsTagKey.MatchString(key) || key == "." || key == ".." || key == "_index" {
		return fmt.Errorf("aws metadata: %q is not a tag key instance metadata can serve (letters, digits, + - = . , _ : @)", key)
	}
	return nil
}

// tag reads the instance tag key from tags/instance/<key>. A 404 is told
// apart by listing tags/instance: when that answers 404 too, tags are not
// allowed in the instance's metadata (or the instance has no tag at all,
// which EC2 answers the same way); otherwise the instance has no tag key.
func (a *aws) tag(ctx context.Context, key string) (string, error) {
	if err := checkAWSTagKey(key); err != nil {
		return "", err
	}
	v, err := a.get(ctx, "tags/instance/"+key)
	if !isStatus(err, http.StatusNotFound) {
		return v, err
	}
	_, listErr := a.get(ctx, "tags/instance")
	switch {
	case isStatus(listErr, http.StatusNotFound):
		return "", fmt.Errorf("%w: instance tags are not in the instance metadata: allow tags in instance metadata (InstanceMetadataTags=enabled) and tag the instance %q (%w)", err, key, ErrNotSet)
	case listErr != nil:
		return "", listErr
	}
	return "", fmt.Errorf("%w: the instance has no tag %q (%w)", err, key, ErrNotSet)
}

// ControlPlanes reads the instance tag key.
func (a *aws) ControlPlanes(ctx context.Context, key string) ([]string, error) {
	v, err := a.tag(ctx, key)
	if err != nil {
		return nil, err
	}
	eps, err := parseEndpoints(v)
	if err != nil {
		return nil, fmt.Errorf("aws metadata: instance tag %q: %w", key, err)
	}
	return eps, nil
}

// InitSecretHash reads the instance tag key.
func (a *aws) InitSecretHash(ctx context.Context, key string) (string, error) {
	v, err := a.tag(ctx, key)
	if err != nil {
		return "", err
	}
	if err := checkBcryptHash(v); err != nil {
		return "", fmt.Errorf("aws metadata: instance tag %q: %w", key, err)
	}
	return v, nil
}

// probeAWS reports whether base answers as EC2's IMDSv2: the token request
// is granted. The token is kept for the provider's first requests.
func probeAWS(ctx context.Context, base string) (Provider, error) {
	a := newAWS(base)
	if _, err := a.sessionToken(ctx); err != nil {
		return nil, err
	}
	return a, nil
}
