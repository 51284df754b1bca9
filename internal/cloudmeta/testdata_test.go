package cloudmeta

import (
	"encoding/json"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/cloudmeta/cloudmetatest"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestDocumentedAnswers parses the clouds' documented example answers
// (testdata/README.md).
func TestDocumentedAnswers(t *testing.T) {
	inst, err := parseAzureInstance(readTestdata(t, "azure-instance-2021-02-01.json"))
	if err != nil {
		t.Fatal(err)
	}
	self, err := azureSelf(inst)
	if err != nil {
		t.Fatal(err)
	}
	want := Self{
		Name:       "examplevmname",
		ProviderID: "azure:///subscriptions/8d2b5e1c-3f4a-4b6c-9d7e-0a1b2c3d4e5f/resourceGroups/macikgo-test-may-23/providers/Microsoft.Compute/virtualMachines/examplevmname",
		Zone:       "westus", Region: "westus", InternalIPs: []string{"10.144.133.132"},
	}
	if self.Name != want.Name || self.ProviderID != want.ProviderID || self.Zone != want.Zone ||
		self.Region != want.Region || !slices.Equal(self.InternalIPs, want.InternalIPs) {
		t.Errorf("azure example: %+v, want %+v", self, want)
	}
	if got := inst.Compute.TagsList; len(got) != 2 || got[0] != (azureTag{"baz", "bash"}) || got[1] != (azureTag{"foo", "bar"}) {
		t.Errorf("azure example tagsList: %+v", got)
	}

	zone, region, err := parseGCEZone(strings.TrimSpace(string(readTestdata(t, "gce-zone.txt"))))
	if err != nil || zone != "us-central1-f" || region != "us-central1" {
		t.Errorf("gce example zone: %q, %q, %v", zone, region, err)
	}

	wantNames := []string{"ip-10-251-50-12", "ip-10-24-34-0", "i-0123456789abcdef"}
	for i, line := range strings.Split(strings.TrimSpace(string(readTestdata(t, "aws-local-hostname.txt"))), "\n") {
		name, err := parseAWSHostname(line)
		if err != nil || name != wantNames[i] {
			t.Errorf("aws example %q: %q, %v; want %q", line, name, err, wantNames[i])
		}
	}
}

// TestAzureFakeShape checks that every field the Azure fake serves is in
// the documented example, at the same place and of the same JSON type.
func TestAzureFakeShape(t *testing.T) {
	var doc any
	if err := json.Unmarshal(readTestdata(t, "azure-instance-2021-02-01.json"), &doc); err != nil {
		t.Fatal(err)
	}
	_, base := cloudmetatest.NewAzure(t, azureVM())
	z := newAzure(base)
	a, err := z.c.do(t.Context(), "GET", azureInstancePath, map[string][]string{"Metadata": {"true"}})
	if err != nil {
		t.Fatal(err)
	}
	var served any
	if err := json.Unmarshal(a.body, &served); err != nil {
		t.Fatal(err)
	}
	documented := shape(doc, "")
	for path, kind := range shape(served, "") {
		if documented[path] != kind {
			t.Errorf("the fake serves %s as %s; the documented example has %q", path, kind, documented[path])
		}
	}
}

// shape maps each JSON path of v (array elements as []) to its JSON type.
func shape(v any, path string) map[string]string {
	out := map[string]string{}
	switch v := v.(type) {
	case map[string]any:
		out[path] = "object"
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			for p, kind := range shape(v[k], path+"."+k) {
				out[p] = kind
			}
		}
	case []any:
		out[path] = "array"
		for _, e := range v {
			for p, kind := range shape(e, path+"[]") {
				out[p] = kind
			}
		}
	case string:
		out[path] = "string"
	default:
		out[path] = "other"
	}
	return out
}
