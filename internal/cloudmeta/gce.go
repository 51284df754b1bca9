package cloudmeta

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
)

// gce is Compute Engine's metadata server
// (https://cloud.google.com/compute/docs/metadata/querying-metadata).
type gce struct {
	c *client
}

func newGCE(base string) *gce { return &gce{c: newClient("gce", base, maxResponse)} }

func (*gce) Name() string { return "gce" }

// gcePrefix is the metadata server's current version.
const gcePrefix = "/computeMetadata/v1/"

// get reads one value. The request carries Metadata-Flavor: Google, without
// which the server answers 403, and the answer must carry the same header
// back: "Your application should also verify that the response contains
// Metadata-Flavor: Google" (querying-metadata, "Query metadata"). Any status
// but 200 is a *statusError; 404 means the key is unset.
func (g *gce) get(ctx context.Context, path string) (string, error) {
	a, err := g.c.do(ctx, http.MethodGet, gcePrefix+path, http.Header{"Metadata-Flavor": {"Google"}})
	if err != nil {
		return "", err
	}
	if a.header.Get("Metadata-Flavor") != "Google" {
		return "", g.c.errorf(http.MethodGet, gcePrefix+path, "HTTP %d without the Metadata-Flavor: Google header: not Compute Engine's metadata server", a.status)
	}
	if a.status != http.StatusOK {
		return "", g.c.errorf(http.MethodGet, gcePrefix+path, "%w", newStatusError(a))
	}
	return string(a.body), nil
}

// Self reads instance/name, instance/zone, project/project-id and
// instance/network-interfaces/0/ip (predefined-metadata-keys).
func (g *gce) Self(ctx context.Context) (Self, error) {
	name, err := g.get(ctx, "instance/name")
	if err != nil {
		return Self{}, err
	}
	// Compute Engine names are RFC 1035 labels, lower-case already; a name
	// that is not one is not from Compute Engine, so it is not lower-cased.
	if err := checkNodeName(name); err != nil {
		return Self{}, fmt.Errorf("gce metadata: instance/name: %w", err)
	}
	zoneValue, err := g.get(ctx, "instance/zone")
	if err != nil {
		return Self{}, err
	}
	zone, region, err := parseGCEZone(zoneValue)
	if err != nil {
		return Self{}, fmt.Errorf("gce metadata: instance/zone: %w", err)
	}
	project, err := g.get(ctx, "project/project-id")
	if err != nil {
		return Self{}, err
	}
	if !gceProjectID.MatchString(project) {
		return Self{}, fmt.Errorf("gce metadata: project/project-id: %q is not a project ID", project)
	}
	ipValue, err := g.get(ctx, "instance/network-interfaces/0/ip")
	if err != nil {
		return Self{}, err
	}
	ip, err := parseIPv4(ipValue)
	if err != nil {
		return Self{}, fmt.Errorf("gce metadata: instance/network-interfaces/0/ip: %w", err)
	}
	return Self{
		Name:        name,
		ProviderID:  "gce://" + project + "/" + zone + "/" + name,
		Zone:        zone,
		Region:      region,
		InternalIPs: []string{ip},
	}, nil
}

// gceProjectID is a project ID (Resource Manager: 6-30 lower-case letters,
// digits and hyphens, starting with a letter, not ending with a hyphen),
// optionally domain-scoped ("example.com:my-project").
var gceProjectID = regexp.MustCompile(`^([a-z0-9][a-z0-9.-]{0,61}[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$`)

// parseGCEZone parses instance/zone, "projects/<project-number>/zones/<zone>"
// (predefined-metadata-keys, "zone"), into the zone and its region (the
// zone without its last "-" and suffix, as cloud-provider-gcp's
// GetGCERegion computes it).
func parseGCEZone(s string) (zone, region string, err error) {
	parts := strings.Split(s, "/")
	if len(parts) != 4 || parts[0] != "projects" || parts[2] != "zones" || !isDigits(parts[1]) {
		return "", "", fmt.Errorf("%q is not projects/<number>/zones/<zone>", s)
	}
	zone = parts[3]
	if err := checkZone("zone", zone); err != nil {
		return "", "", err
	}
	i := strings.LastIndex(zone, "-")
	if i <= 0 || checkZone("region", zone[:i]) != nil {
		return "", "", fmt.Errorf("zone %q is not <region>-<suffix>", zone)
	}
	return zone, zone[:i], nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// gceKey is a custom metadata key: letters, digits, '-' and '_', at most 128
// bytes (https://cloud.google.com/compute/docs/metadata/setting-custom-metadata,
// "Limitations"). Checking it also keeps the key one path element.
var gceKey = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// attribute reads a custom metadata value of the instance ("instance") or
// the project ("project"); found is false when it is unset (404).
func (g *gce) attribute(ctx context.Context, scope, key string) (value string, found bool, err error) {
	v, err := g.get(ctx, scope+"/attributes/"+key)
	if isStatus(err, http.StatusNotFound) {
		return "", false, nil
	}
	return v, err == nil, err
}

// ControlPlanes reads the instance attribute key, else the project
// attribute key.
func (g *gce) ControlPlanes(ctx context.Context, key string) ([]string, error) {
	if !gceKey.MatchString(key) {
		return nil, fmt.Errorf("gce metadata: %q is not a metadata key (letters, digits, '-', '_', at most 128)", key)
	}
	v, found, err := g.attribute(ctx, "instance", key)
	if err != nil {
		return nil, err
	}
	scope := "instance"
	if !found {
		scope = "project"
		if v, found, err = g.attribute(ctx, scope, key); err != nil {
			return nil, err
		}
	}
	if !found {
		return nil, fmt.Errorf("gce metadata: neither the instance nor the project has the attribute %q (404): %w", key, ErrNotSet)
	}
	eps, err := parseEndpoints(v)
	if err != nil {
		return nil, fmt.Errorf("gce metadata: %s attribute %q: %w", scope, key, err)
	}
	return eps, nil
}

// InitSecretHash reads the instance attribute key.
func (g *gce) InitSecretHash(ctx context.Context, key string) (string, error) {
	if !gceKey.MatchString(key) {
		return "", fmt.Errorf("gce metadata: %q is not a metadata key (letters, digits, '-', '_', at most 128)", key)
	}
	v, found, err := g.attribute(ctx, "instance", key)
	if err != nil {
		return "", err
	}
	if !found {
		return "", fmt.Errorf("gce metadata: the instance has no attribute %q (404): %w", key, ErrNotSet)
	}
	if err := checkBcryptHash(v); err != nil {
		return "", fmt.Errorf("gce metadata: instance attribute %q: %w", key, err)
	}
	return v, nil
}

// probeGCE reports whether base answers as Compute Engine's metadata
// server: the metadata root answers 200 with Metadata-Flavor: Google.
func probeGCE(ctx context.Context, base string) (Provider, error) {
	g := newGCE(base)
	if _, err := g.get(ctx, ""); err != nil {
		return nil, err
	}
	return g, nil
}
