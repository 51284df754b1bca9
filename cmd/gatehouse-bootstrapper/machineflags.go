package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/bootstrapper"
	"github.com/gatehouse-dev/gatehouse/internal/cloudmeta"
)

// advertiseAuto is the --advertise-address value that takes the address
// from the default route.
const advertiseAuto = "auto"

// roleParameter is the kernel command line parameter the node image
// measures its role with (docs/image.md, "Roles").
const roleParameter = "gatehouse.role"

// machineFacts reads what the flags may leave to the machine: the kernel
// command line (/proc/cmdline) and the source address of the default
// route.
type machineFacts struct {
	cmdline      func() ([]byte, error)
	defaultRoute func() (string, error)
	// cloud returns the instance metadata of cloud (auto: detected) at
	// base.
	cloud func(ctx context.Context, cloud, base string) (cloudmeta.Provider, error)
}

// openCloud is machineFacts.cloud on a real machine.
func openCloud(ctx context.Context, cloud, base string) (cloudmeta.Provider, error) {
	if cloud == "auto" {
		return cloudmeta.Detect(ctx, base)
	}
	return cloudmeta.New(cloud, base)
}

// resolveFromMachine fills in the flags set to come from the machine:
// --role-from-kernel-cmdline, --advertise-address auto and --cloud.
func resolveFromMachine(ctx context.Context, o *options, m machineFacts) error {
	if o.roleFromCmdline {
		data, err := m.cmdline()
		if err != nil {
			return fmt.Errorf("--role-from-kernel-cmdline: reading the kernel command line: %w", err)
		}
		if o.controlPlane, err = roleFromCmdline(string(data)); err != nil {
			return fmt.Errorf("--role-from-kernel-cmdline: %w", err)
		}
	}
	if o.advertiseAuto {
		addr, err := m.defaultRoute()
		if err != nil {
			return fmt.Errorf("--advertise-address auto: %w", err)
		}
		o.node.AdvertiseAddress = addr
	}
	if o.cloud != "" {
		return resolveFromCloud(ctx, o, m)
	}
	return nil
}

// resolveFromCloud takes from the cloud's instance metadata what the flags
// left open: the node's name and address, its provider ID, and where to
// join (docs/cloud.md).
func resolveFromCloud(ctx context.Context, o *options, m machineFacts) error {
	// At early boot the metadata service may not answer yet: ask again
	// every second until ctx ends.
	var p cloudmeta.Provider
	var self cloudmeta.Self
	var err error
	for {
		if p, err = m.cloud(ctx, o.cloud, o.cloudMetadataURL); err == nil {
			if self, err = p.Self(ctx); err == nil {
				break
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("--cloud %s: %w", o.cloud, err)
		case <-time.After(time.Second):
		}
	}
	if !o.nodeNameSet {
		o.node.Name = self.Name
	}
	if o.node.AdvertiseAddress == "" {
		o.node.AdvertiseAddress = self.InternalIPs[0]
	}
	o.node.ProviderID = self.ProviderID
	if !o.endpointsSet {
		o.endpoints = bootstrapper.CloudEndpoints{Source: p, Key: o.cloudEndpointsKey}
	}
	o.cloudProvider = p
	return nil
}

// roleFromCmdline returns whether cmdline (the kernel command line)
// names the control-plane role: exactly one gatehouse.role= parameter,
// controlPlane or worker.
func roleFromCmdline(cmdline string) (controlPlane bool, err error) {
	var roles []string
	for _, field := range strings.Fields(cmdline) {
		if v, ok := strings.CutPrefix(field, roleParameter+"="); ok {
			roles = append(roles, v)
		}
	}
	switch {
	case len(roles) == 0:
		return false, fmt.Errorf("the kernel command line has no %s= parameter: boot the node image's UKI of the node's role", roleParameter)
	case len(roles) > 1:
		return false, fmt.Errorf("the kernel command line names %s= %d times (%s): want one", roleParameter, len(roles), strings.Join(roles, ", "))
	}
	switch roles[0] {
	case "controlPlane":
		return true, nil
	case "worker":
		return false, nil
	}
	return false, fmt.Errorf("the kernel command line's %s=%q is no role: want controlPlane or worker", roleParameter, roles[0])
}

// defaultRouteAddress returns the address this machine's packets to the
// internet leave from: the default route's source address. A UDP
// "connection" sends nothing; the kernel only picks the route
// (192.0.2.1 is TEST-NET-1, RFC 5737, never answered).
func defaultRouteAddress() (string, error) {
	conn, err := net.Dial("udp4", "192.0.2.1:9")
	if err != nil {
		return "", fmt.Errorf("finding the default route's address (is the network up?): %w", err)
	}
	defer conn.Close()
	addr, err := netip.ParseAddrPort(conn.LocalAddr().String())
	if err != nil {
		return "", err
	}
	if addr.Addr().IsLoopback() || addr.Addr().IsUnspecified() {
		return "", errors.New("the default route leaves from " + addr.Addr().String() + ": not an address other nodes reach")
	}
	return addr.Addr().String(), nil
}
