package cloudmetatest

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// serveGCE answers as Compute Engine's metadata server
// (https://cloud.google.com/compute/docs/metadata/querying-metadata,
// https://cloud.google.com/compute/docs/metadata/predefined-metadata-keys):
// every answer carries Metadata-Flavor: Google; a request without
// Metadata-Flavor: Google, or with X-Forwarded-For, is refused with 403
// (https://cloud.google.com/compute/docs/troubleshooting/troubleshoot-metadata-server,
// "Troubleshoot server codes"); values are text; an unset key is 404.
func serveGCE(f *Fake, w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Metadata-Flavor", "Google")
	w.Header().Set("Server", "Metadata Server for VM")
	if r.Header.Get("X-Forwarded-For") != "" {
		http.Error(w, "Your client does not have permission to get URL "+r.URL.Path+" from this server. Request contains X-Forwarded-For header.", http.StatusForbidden)
		return
	}
	if r.Header.Get("Metadata-Flavor") != "Google" {
		http.Error(w, "Your client does not have permission to get URL "+r.URL.Path+" from this server. Missing Metadata-Flavor:Google header.", http.StatusForbidden)
		return
	}
	if r.Method != http.MethodGet {
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	path, ok := strings.CutPrefix(r.URL.Path, "/computeMetadata/v1/")
	if !ok {
		http.NotFound(w, r)
		return
	}
	value, ok := gceValue(f.instance(), path)
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/text")
	_, _ = w.Write([]byte(value))
}

// gceValue is the value at path (below /computeMetadata/v1/).
func gceValue(inst Instance, path string) (string, bool) {
	listing := func(keys []string) string {
		if len(keys) == 0 {
			return ""
		}
		return strings.Join(keys, "\n") + "\n"
	}
	switch path {
	case "":
		return "instance/\noauth/\nproject/\n", true
	case "instance/name":
		return inst.Name, true
	case "instance/zone":
		return "projects/" + inst.ProjectNumber + "/zones/" + inst.Zone, true
	case "instance/hostname":
		return inst.Name + "." + inst.Zone + ".c." + inst.Project + ".internal", true
	case "instance/network-interfaces/":
		keys := make([]string, len(inst.IPs))
		for i := range inst.IPs {
			keys[i] = strconv.Itoa(i) + "/"
		}
		return listing(keys), true
	case "project/project-id":
		return inst.Project, true
	case "project/numeric-project-id":
		return inst.ProjectNumber, true
	case "instance/attributes/":
		return listing(slices.Sorted(maps.Keys(inst.Attributes))), true
	case "project/attributes/":
		return listing(slices.Sorted(maps.Keys(inst.ProjectAttributes))), true
	}
	if key, ok := strings.CutPrefix(path, "instance/attributes/"); ok {
		v, ok := inst.Attributes[key]
		return v, ok
	}
	if key, ok := strings.CutPrefix(path, "project/attributes/"); ok {
		v, ok := inst.ProjectAttributes[key]
		return v, ok
	}
	var i int
	if n, _ := fmt.Sscanf(path, "instance/network-interfaces/%d/ip", &i); n == 1 && path == fmt.Sprintf("instance/network-interfaces/%d/ip", i) && i >= 0 && i < len(inst.IPs) {
		return inst.IPs[i], true
	}
	return "", false
}
