package cloudmetatest

import (
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strings"
)

// azureVersions are the api-version values the fake accepts: from the one
// that added compute.tagsList on (instance-metadata-service, "Supported API
// versions").
var azureVersions = []string{"2019-06-04", "2020-09-01", "2021-01-01", "2021-02-01", "2021-12-13", "2023-07-01"}

// serveAzure answers as Azure's IMDS
// (https://learn.microsoft.com/en-us/azure/virtual-machines/instance-metadata-service):
// only GET /metadata/instance?api-version=<version> with Metadata: true is
// answered, with the instance document in JSON; a request without
// Metadata: true, with X-Forwarded-For, or without a supported api-version
// is refused with 400 and a JSON error ("Errors and debugging").
func serveAzure(f *Fake, w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("X-Forwarded-For") != "" {
		azureError(w, http.StatusBadRequest, map[string]any{"error": "Bad request. Requests with X-Forwarded-For header are not supported"})
		return
	}
	if r.Header.Get("Metadata") != "true" {
		azureError(w, http.StatusBadRequest, map[string]any{"error": "Bad request. Required metadata header not specified"})
		return
	}
	if r.Method != http.MethodGet {
		azureError(w, http.StatusMethodNotAllowed, map[string]any{"error": "Method not allowed"})
		return
	}
	if r.URL.Path != "/metadata/instance" && r.URL.Path != "/metadata/instance/" {
		azureError(w, http.StatusNotFound, map[string]any{"error": "Not found"})
		return
	}
	if v := r.URL.Query().Get("api-version"); !slices.Contains(azureVersions, v) {
		azureError(w, http.StatusBadRequest, map[string]any{
			"error":           "Bad request. api-version is invalid or was not specified in the request. For more information refer to aka.ms/azureimds",
			"newest-versions": newestVersions(),
		})
		return
	}
	body, err := json.Marshal(azureDocument(f.instance()))
	if err != nil {
		azureError(w, http.StatusInternalServerError, map[string]any{"error": err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	_, _ = w.Write(body)
}

// newestVersions lists the three newest versions, newest first, as IMDS's
// error for a bad api-version does.
func newestVersions() []string {
	list := slices.Clone(azureVersions)
	slices.Reverse(list)
	return list[:3]
}

func azureError(w http.ResponseWriter, status int, v map[string]any) {
	body, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

type azureTag struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type azureIPAddress struct {
	PrivateIPAddress string `json:"privateIpAddress"`
	PublicIPAddress  string `json:"publicIpAddress"`
}

type azureSubnet struct {
	Address string `json:"address"`
	Prefix  string `json:"prefix"`
}

type azureInterface struct {
	IPv4 struct {
		IPAddress []azureIPAddress `json:"ipAddress"`
		Subnet    []azureSubnet    `json:"subnet"`
	} `json:"ipv4"`
	IPv6 struct {
		IPAddress []azureIPAddress `json:"ipAddress"`
	} `json:"ipv6"`
	MACAddress string `json:"macAddress"`
}

type azureOSProfile struct {
	AdminUsername                 string `json:"adminUsername"`
	ComputerName                  string `json:"computerName"`
	DisablePasswordAuthentication string `json:"disablePasswordAuthentication"`
}

// azureInstanceDocument is the instance document at api-version 2021-02-01
// (instance-metadata-service, "Instance metadata", the example response),
// less the storage profile, keys, plan and security profile, which no
// client here reads.
type azureInstanceDocument struct {
	Compute struct {
		AzEnvironment        string         `json:"azEnvironment"`
		Location             string         `json:"location"`
		Name                 string         `json:"name"`
		Offer                string         `json:"offer"`
		OSProfile            azureOSProfile `json:"osProfile"`
		OSType               string         `json:"osType"`
		PlatformFaultDomain  string         `json:"platformFaultDomain"`
		PlatformUpdateDomain string         `json:"platformUpdateDomain"`
		Priority             string         `json:"priority"`
		Publisher            string         `json:"publisher"`
		ResourceGroupName    string         `json:"resourceGroupName"`
		ResourceID           string         `json:"resourceId"`
		SKU                  string         `json:"sku"`
		SubscriptionID       string         `json:"subscriptionId"`
		Tags                 string         `json:"tags"`
		TagsList             []azureTag     `json:"tagsList"`
		Version              string         `json:"version"`
		VMID                 string         `json:"vmId"`
		VMScaleSetName       string         `json:"vmScaleSetName"`
		VMSize               string         `json:"vmSize"`
		Zone                 string         `json:"zone"`
	} `json:"compute"`
	Network struct {
		Interface []azureInterface `json:"interface"`
	} `json:"network"`
}

// azureDocument renders inst as IMDS does.
func azureDocument(inst Instance) azureInstanceDocument {
	var d azureInstanceDocument
	c := &d.Compute
	c.AzEnvironment = "AzurePublicCloud"
	c.Location = inst.Region
	c.Name = inst.Name
	c.Offer = "debian-12"
	c.OSProfile = azureOSProfile{AdminUsername: "azureuser", ComputerName: inst.Name, DisablePasswordAuthentication: "true"}
	c.OSType = "Linux"
	c.PlatformFaultDomain = "0"
	c.PlatformUpdateDomain = "0"
	c.Priority = "Regular"
	c.Publisher = "Debian"
	c.ResourceGroupName = inst.ResourceGroup
	c.ResourceID = "/subscriptions/" + inst.Project + "/resourceGroups/" + inst.ResourceGroup + "/providers/Microsoft.Compute/virtualMachines/" + inst.Name
	c.SKU = "12-gen2"
	c.SubscriptionID = inst.Project
	// tags is the older "name:value;name:value" form; tagsList the list.
	c.TagsList = []azureTag{}
	var pairs []string
	for _, k := range slices.Sorted(maps.Keys(inst.Attributes)) {
		c.TagsList = append(c.TagsList, azureTag{Name: k, Value: inst.Attributes[k]})
		pairs = append(pairs, k+":"+inst.Attributes[k])
	}
	c.Tags = strings.Join(pairs, ";")
	c.Version = "0.20240101.1"
	c.VMID = inst.ID
	c.VMScaleSetName = inst.VMScaleSetName
	c.VMSize = "Standard_DC2as_v5"
	c.Zone = inst.Zone
	var nic azureInterface
	for _, ip := range inst.IPs {
		nic.IPv4.IPAddress = append(nic.IPv4.IPAddress, azureIPAddress{PrivateIPAddress: ip})
	}
	nic.IPv4.Subnet = []azureSubnet{{Address: "10.0.0.0", Prefix: "24"}}
	nic.IPv6.IPAddress = []azureIPAddress{}
	nic.MACAddress = "000D3A000001"
	d.Network.Interface = []azureInterface{nic}
	return d
}
