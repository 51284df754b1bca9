// Package cloudmeta is a node's view of itself from its cloud's instance
// metadata service (IMDS) at http://169.254.169.254: one interface
// (Provider), three clouds (Compute Engine, EC2, Azure), and Detect, which
// finds the cloud that answers.
//
// What each cloud is asked, with the documents the request and response
// shapes follow:
//
//   - gce: Compute Engine's metadata server
//     (https://cloud.google.com/compute/docs/metadata/querying-metadata,
//     https://cloud.google.com/compute/docs/metadata/predefined-metadata-keys).
//     Every request carries Metadata-Flavor: Google and every answer must
//     carry it back. Self reads instance/name, instance/zone
//     (projects/<number>/zones/<zone>), project/project-id and
//     instance/network-interfaces/0/ip; custom values are instance
//     attributes (instance/attributes/<key>) and, for ControlPlanes only,
//     project attributes (project/attributes/<key>); 404 means unset.
//   - aws: EC2's IMDSv2
//     (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html,
//     https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html).
//     A session token from PUT /latest/api/token is sent with every GET;
//     IMDSv1 (a GET without a token) is never used, so a refused token
//     request is an error. Self reads meta-data/instance-id,
//     placement/availability-zone, placement/region, local-ipv4 and
//     local-hostname; custom values are instance tags in the metadata
//     (meta-data/tags/instance/<key>,
//     https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/work-with-tags-in-IMDS.html),
//     which the instance must allow (InstanceMetadataTags=enabled).
//   - azure: Azure's IMDS
//     (https://learn.microsoft.com/en-us/azure/virtual-machines/instance-metadata-service).
//     One GET /metadata/instance?api-version=2021-02-01 with Metadata: true;
//     the JSON's compute object (name, location, zone, subscriptionId,
//     resourceGroupName, vmScaleSetName, tagsList) and the private IPv4
//     addresses of network.interface[].ipv4.ipAddress[]; custom values are
//     the VM's tags (compute.tagsList, names compared case-insensitively as
//     Azure does).
//
// Every request has a timeout of 2 s within the caller's context, goes to
// the metadata address directly (never through an HTTP proxy: all three
// clouds' documents require that), follows no redirect, sends no
// X-Forwarded-For (which the services refuse), and reads at most 64 KiB of
// an answer (256 KiB for Azure's whole-instance document). An error names
// the provider, the method and path, and the HTTP status. Values are
// checked before use: addresses parse, zones and regions are non-empty,
// node names are DNS-1123 subdomains (lower-cased where the cloud allows
// upper case: Azure VM names, EC2 host names), endpoint lists are host:port.
//
// # Control planes: from the node's own metadata only
//
// ControlPlanes reads a comma-separated list of host:port endpoints that the
// operator or the infrastructure tooling put into the node's own metadata
// under a key the caller names (gatehouse-join-endpoints, say): a GCE
// instance or project attribute, an EC2 instance tag, an Azure tag. Finding
// the control planes by a label or tag on other instances is left to a
// later step: none of the three metadata services lists other instances,
// so it takes the cloud's compute API (compute.instances.list,
// ec2:DescribeInstances, Microsoft.Compute virtualMachines list) called
// with credentials the instance holds (a service account, an instance
// profile, a managed identity), which this package has none of and does
// not want: it would need each cloud's SDK or request signing, and a
// permission to read the whole project's or account's instances.
package cloudmeta
