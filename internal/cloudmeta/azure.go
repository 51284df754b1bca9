package cloudmeta

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
)

// azure is Azure's Instance Metadata Service
// (https://learn.microsoft.com/en-us/azure/virtual-machines/instance-metadata-service).
type azure struct {
	c *client
}

// azureMaxResponse is the largest instance document read: it describes
// every disk, key and tag of the VM, so it is allowed more than a single
// value.
const azureMaxResponse = 256 << 10

func newAzure(base string) *azure { return &azure{c: newClient("azure", base, azureMaxResponse)} }

func (*azure) Name() string { return "azure" }

// azureInstancePath is the whole-instance document at an API version that
// has compute.tagsList (2019-06-04 and later) and network.interface.
const azureInstancePath = "/metadata/instance?api-version=2021-02-01"

// azureInstance is the part of the instance document this package reads
// (instance-metadata-service, "Instance metadata": compute and network).
type azureInstance struct {
	Compute struct {
		Name              string     `json:"name"`
		Location          string     `json:"location"`
		Zone              string     `json:"zone"`
		SubscriptionID    string     `json:"subscriptionId"`
		ResourceGroupName string     `json:"resourceGroupName"`
		VMScaleSetName    string     `json:"vmScaleSetName"`
		TagsList          []azureTag `json:"tagsList"`
	} `json:"compute"`
	Network struct {
		Interface []struct {
			IPv4 struct {
				IPAddress []struct {
					PrivateIPAddress string `json:"privateIpAddress"`
				} `json:"ipAddress"`
			} `json:"ipv4"`
		} `json:"interface"`
	} `json:"network"`
}

type azureTag struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// instance reads the instance document with Metadata: true, without which
// IMDS answers 400 (instance-metadata-service, "Security and
// authentication").
func (z *azure) instance(ctx context.Context) (*azureInstance, error) {
	a, err := z.c.do(ctx, http.MethodGet, azureInstancePath, http.Header{"Metadata": {"true"}})
	if err != nil {
		return nil, err
	}
	if a.status != http.StatusOK {
		return nil, z.c.errorf(http.MethodGet, azureInstancePath, "%w", newStatusError(a))
	}
	inst, err := parseAzureInstance(a.body)
	if err != nil {
		return nil, z.c.errorf(http.MethodGet, azureInstancePath, "%w", err)
	}
	return inst, nil
}

// parseAzureInstance decodes the instance document: one JSON object with a
// compute object.
func parseAzureInstance(data []byte) (*azureInstance, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("the answer is not a JSON object: %w", err)
	}
	if c, ok := raw["compute"]; !ok || !bytes.HasPrefix(bytes.TrimSpace(c), []byte("{")) {
		return nil, fmt.Errorf("the instance document has no compute object")
	}
	var inst azureInstance
	if err := json.Unmarshal(data, &inst); err != nil {
		return nil, fmt.Errorf("the instance document: %w", err)
	}
	return &inst, nil
}

var (
	// azureSubscription is a subscription ID: a GUID.
	azureSubscription = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	// azureResourceGroup is a resource group name: 1-90 of letters, digits,
	// '-', '_', '.', '(' and ')', not ending with '.'. Azure's rules allow
	// other Unicode letters too, which a providerID here does not carry.
	azureResourceGroup = regexp.MustCompile(`^[-\w.()]{0,89}[-\w()]$`)
	// azureZone is an availability zone's number.
	azureZone = regexp.MustCompile(`^[1-9][0-9]?$`)
)

// azureSelf turns the instance document into Self.
func azureSelf(inst *azureInstance) (Self, error) {
	c := inst.Compute
	if c.VMScaleSetName != "" && strings.HasPrefix(c.Name, c.VMScaleSetName+"_") {
		// A uniform scale set's VM is <scale set>_<instance id>: its node
		// name is its computer name and its providerID another form
		// (…/virtualMachineScaleSets/<set>/virtualMachines/<id>).
		return Self{}, fmt.Errorf("compute.name %q is a VM of the uniform scale set %q, which is not supported", c.Name, c.VMScaleSetName)
	}
	name := strings.ToLower(c.Name)
	if err := checkNodeName(name); err != nil {
		return Self{}, fmt.Errorf("compute.name: %w", err)
	}
	if !azureSubscription.MatchString(c.SubscriptionID) {
		return Self{}, fmt.Errorf("compute.subscriptionId: %q is not a subscription ID", c.SubscriptionID)
	}
	if !azureResourceGroup.MatchString(c.ResourceGroupName) {
		return Self{}, fmt.Errorf("compute.resourceGroupName: %q is not a resource group name", c.ResourceGroupName)
	}
	location := strings.ToLower(c.Location)
	if err := checkZone("location", location); err != nil {
		return Self{}, fmt.Errorf("compute.location: %w", err)
	}
	zone := location
	if c.Zone != "" {
		if !azureZone.MatchString(c.Zone) {
			return Self{}, fmt.Errorf("compute.zone: %q is not an availability zone's number", c.Zone)
		}
		zone = location + "-" + c.Zone
	}
	var ips []string
	for i, nic := range inst.Network.Interface {
		for j, addr := range nic.IPv4.IPAddress {
			ip, err := parseIPv4(addr.PrivateIPAddress)
			if err != nil {
				return Self{}, fmt.Errorf("network.interface[%d].ipv4.ipAddress[%d].privateIpAddress: %w", i, j, err)
			}
			ips = append(ips, ip)
		}
	}
	if len(ips) == 0 {
		return Self{}, fmt.Errorf("network.interface lists no private IPv4 address")
	}
	return Self{
		Name: name,
		ProviderID: "azure:///subscriptions/" + strings.ToLower(c.SubscriptionID) +
			"/resourceGroups/" + strings.ToLower(c.ResourceGroupName) +
			"/providers/Microsoft.Compute/virtualMachines/" + name,
		Zone:        zone,
		Region:      location,
		InternalIPs: ips,
	}, nil
}

// Self reads the instance document.
func (z *azure) Self(ctx context.Context) (Self, error) {
	inst, err := z.instance(ctx)
	if err != nil {
		return Self{}, err
	}
	s, err := azureSelf(inst)
	if err != nil {
		return Self{}, fmt.Errorf("azure metadata: %w", err)
	}
	return s, nil
}

// checkAzureTagName checks a tag name: 1-512 bytes without < > % & \ ? /
// (https://learn.microsoft.com/en-us/azure/azure-resource-manager/management/tag-resources,
// "Limitations").
func checkAzureTagName(key string) error {
	if key == "" || len(key) > 512 || strings.ContainsAny(key, `<>%&\?/`) {
		return fmt.Errorf("azure metadata: %q is not a tag name (1-512 bytes without < > %% & \\ ? /)", key)
	}
	return nil
}

// tag returns the VM's tag key from compute.tagsList; tag names are
// case-insensitive (tag-resources, "Limitations").
func (z *azure) tag(ctx context.Context, key string) (string, error) {
	if err := checkAzureTagName(key); err != nil {
		return "", err
	}
	inst, err := z.instance(ctx)
	if err != nil {
		return "", err
	}
	var values []string
	for _, t := range inst.Compute.TagsList {
		if strings.EqualFold(t.Name, key) {
			values = append(values, t.Value)
		}
	}
	switch len(values) {
	case 0:
		return "", fmt.Errorf("azure metadata: the VM has no tag %q (compute.tagsList): %w", key, ErrNotSet)
	case 1:
		return values[0], nil
	}
	return "", fmt.Errorf("azure metadata: compute.tagsList has %d tags named %q", len(values), key)
}

// ControlPlanes reads the VM's tag key.
func (z *azure) ControlPlanes(ctx context.Context, key string) ([]string, error) {
	v, err := z.tag(ctx, key)
	if err != nil {
		return nil, err
	}
	eps, err := parseEndpoints(v)
	if err != nil {
		return nil, fmt.Errorf("azure metadata: tag %q: %w", key, err)
	}
	return eps, nil
}

// InitSecretHash reads the VM's tag key.
func (z *azure) InitSecretHash(ctx context.Context, key string) (string, error) {
	v, err := z.tag(ctx, key)
	if err != nil {
		return "", err
	}
	if err := checkBcryptHash(v); err != nil {
		return "", fmt.Errorf("azure metadata: tag %q: %w", key, err)
	}
	return v, nil
}

// probeAzure reports whether base answers as Azure's IMDS: the instance
// document, a JSON object with a compute object, answered to Metadata: true.
func probeAzure(ctx context.Context, base string) (Provider, error) {
	z := newAzure(base)
	if _, err := z.instance(ctx); err != nil {
		return nil, err
	}
	return z, nil
}
