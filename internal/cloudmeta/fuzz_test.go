package cloudmeta

import (
	"net"
	"net/netip"
	"strings"
	"testing"
)

// The parsers of network answers, fuzzed: go test -fuzz=FuzzParse… .

func FuzzParseGCEZone(f *testing.F) {
	f.Add(strings.TrimSpace(string(readTestdata(f, "gce-zone.txt"))))
	f.Add("projects/1/zones/a-b")
	f.Add("projects//zones/us-central1-a")
	f.Add("projects/1/zones/-")
	f.Fuzz(func(t *testing.T, s string) {
		zone, region, err := parseGCEZone(s)
		if err != nil {
			return
		}
		if !strings.HasSuffix(s, "/zones/"+zone) || region == "" || !strings.HasPrefix(zone, region+"-") {
			t.Fatalf("%q gave zone %q, region %q", s, zone, region)
		}
		if checkZone("zone", zone) != nil || checkZone("region", region) != nil || strings.Contains(zone, "/") {
			t.Fatalf("%q gave an invalid zone %q or region %q", s, zone, region)
		}
	})
}

func FuzzParseAzureInstance(f *testing.F) {
	f.Add(readTestdata(f, "azure-instance-2021-02-01.json"))
	f.Add([]byte(`{"compute":{"name":"VM","location":"WestUS","zone":"1","subscriptionId":"8d2b5e1c-3f4a-4b6c-9d7e-0a1b2c3d4e5f","resourceGroupName":"rg"},"network":{"interface":[{"ipv4":{"ipAddress":[{"privateIpAddress":"10.0.0.4"}]}}]}}`))
	f.Add([]byte(`{"compute":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		inst, err := parseAzureInstance(data)
		if err != nil {
			return
		}
		self, err := azureSelf(inst)
		if err != nil {
			return
		}
		if checkNodeName(self.Name) != nil {
			t.Fatalf("accepted node name %q", self.Name)
		}
		if !strings.HasPrefix(self.ProviderID, "azure:///subscriptions/") ||
			!strings.HasSuffix(self.ProviderID, "/providers/Microsoft.Compute/virtualMachines/"+self.Name) ||
			strings.Count(self.ProviderID, "/") != 10 {
			t.Fatalf("providerID %q", self.ProviderID)
		}
		if self.Zone == "" || self.Region == "" || !strings.HasPrefix(self.Zone, self.Region) {
			t.Fatalf("zone %q, region %q", self.Zone, self.Region)
		}
		if len(self.InternalIPs) == 0 {
			t.Fatal("no address")
		}
		for _, ip := range self.InternalIPs {
			if a, err := netip.ParseAddr(ip); err != nil || !a.Is4() {
				t.Fatalf("accepted address %q", ip)
			}
		}
	})
}

func FuzzParseEndpoints(f *testing.F) {
	f.Add("10.0.0.1:9000, 10.0.0.2:9000")
	f.Add("[fd00::1]:9000,cp.internal:9000")
	f.Add("cp:0,")
	f.Add("[fe80::1%eth0]:9000")
	f.Fuzz(func(t *testing.T, s string) {
		eps, err := parseEndpoints(s)
		if err != nil {
			return
		}
		if len(eps) == 0 {
			t.Fatal("no endpoint and no error")
		}
		for _, e := range eps {
			host, port, err := net.SplitHostPort(e)
			if err != nil || host == "" || port == "" || strings.ContainsAny(e, ", \t\n") {
				t.Fatalf("accepted endpoint %q from %q", e, s)
			}
		}
	})
}

func FuzzParseAWSHostname(f *testing.F) {
	for _, line := range strings.Split(strings.TrimSpace(string(readTestdata(f, "aws-local-hostname.txt"))), "\n") {
		f.Add(line)
	}
	f.Add("ip-10-0-0-1.example.com example.org")
	f.Add("-bad.ec2.internal")
	f.Fuzz(func(t *testing.T, s string) {
		name, err := parseAWSHostname(s)
		if err != nil {
			return
		}
		if checkNodeName(name) != nil || strings.Contains(name, ".") || name != strings.ToLower(name) {
			t.Fatalf("%q gave node name %q", s, name)
		}
	})
}
