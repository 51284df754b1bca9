package cloudmetatest

import (
	"crypto/rand"
	"encoding/base64"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// serveAWS answers as EC2's instance metadata service with IMDSv2 required
// (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html):
// PUT /latest/api/token with X-aws-ec2-metadata-token-ttl-seconds (1-21600)
// issues a session token, refused with 403 when the request carries
// X-Forwarded-For and with 400 without a valid TTL; a GET without a valid
// token in X-aws-ec2-metadata-token is refused with 401. Values are text;
// an unknown path is 404, and so are the instance's tags when they are not
// allowed in its metadata
// (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/work-with-tags-in-IMDS.html).
func serveAWS(f *Fake, w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/latest/api/token" {
		f.issueToken(w, r)
		return
	}
	if r.Method != http.MethodGet {
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	token := r.Header.Get("X-Aws-Ec2-Metadata-Token")
	f.mu.Lock()
	valid := token != "" && f.tokens[token]
	f.mu.Unlock()
	if !valid {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	path, ok := strings.CutPrefix(r.URL.Path, "/latest/meta-data/")
	if !ok {
		http.NotFound(w, r)
		return
	}
	value, ok := awsValue(f.instance(), path)
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write([]byte(value))
}

// issueToken answers PUT /latest/api/token.
func (f *Fake) issueToken(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPut {
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	if r.Header.Get("X-Forwarded-For") != "" {
		http.Error(w, "Forbidden", http.StatusForbidden)
		return
	}
	ttl, err := strconv.Atoi(r.Header.Get("X-Aws-Ec2-Metadata-Token-Ttl-Seconds"))
	if err != nil || ttl < 1 || ttl > 21600 {
		http.Error(w, "Bad Request", http.StatusBadRequest)
		return
	}
	raw := make([]byte, 42)
	_, _ = rand.Read(raw)
	token := base64.StdEncoding.EncodeToString(raw)
	f.mu.Lock()
	f.tokens[token] = true
	f.tokenRequests++
	f.mu.Unlock()
	w.Header().Set("X-Aws-Ec2-Metadata-Token-Ttl-Seconds", strconv.Itoa(ttl))
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write([]byte(token))
}

// awsValue is the value at path (below /latest/meta-data/), per
// instancedata-data-retrieval.html's "Instance metadata categories".
func awsValue(inst Instance, path string) (string, bool) {
	switch path {
	case "instance-id":
		return inst.ID, true
	case "placement/availability-zone":
		return inst.Zone, true
	case "placement/region":
		return inst.Region, true
	case "local-ipv4":
		if len(inst.IPs) == 0 {
			return "", false
		}
		return inst.IPs[0], true
	case "local-hostname", "hostname":
		// EC2's private DNS names: <name>.ec2.internal in us-east-1,
		// <name>.<region>.compute.internal elsewhere.
		if inst.Region == "us-east-1" {
			return inst.Name + ".ec2.internal", true
		}
		return inst.Name + "." + inst.Region + ".compute.internal", true
	case "tags/instance", "tags/instance/":
		if inst.NoTagsInMetadata || len(inst.Attributes) == 0 {
			return "", false
		}
		return strings.Join(slices.Sorted(maps.Keys(inst.Attributes)), "\n"), true
	}
	if key, ok := strings.CutPrefix(path, "tags/instance/"); ok && !inst.NoTagsInMetadata {
		v, ok := inst.Attributes[key]
		return v, ok
	}
	return "", false
}
