// Package render turns a KubeadmConfig into a Machine's bootstrap data,
// as cloud-config or Ignition v3: the kubeadm configuration, files, users,
// NTP, disks and mounts, a script that downloads the pinned Kubernetes
// binaries of the Machine's version and checks their sha256, the commands
// around `kubeadm init` or `kubeadm join`, and Cluster API's success
// sentinel. In attested mode the data holds no secret: it only configures
// the machine's gatehouse-bootstrapper, which gets its token, keys and
// certificates from the join service after attesting.
//
// Each field of CABPK's KubeadmConfigSpec means in both formats what it
// means in upstream's cloud-config; docs/capi.md lists where the two
// formats differ and why.
package render

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

// Paths on the machine.
const (
	// KubeadmConfigPath holds the kubeadm configuration in cloud-config
	// data (CABPK's path): cloud-init writes it at boot, after /run is
	// mounted.
	KubeadmConfigPath = "/run/kubeadm/kubeadm.yaml"
	// IgnitionKubeadmConfigPath holds it in Ignition data (CABPK's
	// Ignition path). Ignition writes files from the initramfs, before the
	// real root's /run is mounted, so nothing it writes under /run
	// survives.
	IgnitionKubeadmConfigPath = "/etc/kubeadm.yml"
	// installScriptPath downloads and checks the pinned binaries.
	installScriptPath = "/etc/gatehouse/install-kubernetes.sh"
	// sentinelPath is CABPK's bootstrap success sentinel
	// (Cluster API bootstrap provider contract).
	sentinelPath = "/run/cluster-api/bootstrap-success.complete"
	// BootstrapperEnvPath configures gatehouse-bootstrapper in attested
	// cloud-config data. The node image's unit reads it (docs/image.md):
	// that image's root, /etc included, is read-only (dm-verity), and
	// /etc/gatehouse is the state disk's once it is bound; /run is a
	// tmpfs that cloud-init writes at boot, before cloud-config.service
	// ends, which the unit is ordered after.
	BootstrapperEnvPath = "/run/gatehouse/bootstrapper-userdata.env"
	// IgnitionBootstrapperEnvPath configures it in attested Ignition data:
	// Ignition writes from the initramfs, so nothing under /run survives
	// (IgnitionKubeadmConfigPath), and Flatcar's /etc is writable. The
	// unit of config/systemd reads it.
	IgnitionBootstrapperEnvPath = "/etc/gatehouse/bootstrapper.env"
	// bootstrapperUnit is gatehouse-bootstrapper's systemd unit, part of
	// the machine image (config/systemd).
	bootstrapperUnit = "gatehouse-bootstrapper.service"
)

// BootstrapperEnvPathFor is where attested data of format writes
// gatehouse-bootstrapper's environment file.
func BootstrapperEnvPathFor(format bootstrapv1.Format) string {
	if format == bootstrapv1.FormatIgnition {
		return IgnitionBootstrapperEnvPath
	}
	return BootstrapperEnvPath
}

// KubeadmConfigPathFor is where data of format writes the kubeadm
// configuration.
func KubeadmConfigPathFor(format bootstrapv1.Format) string {
	if format == bootstrapv1.FormatIgnition {
		return IgnitionKubeadmConfigPath
	}
	return KubeadmConfigPath
}

// Role is what kubeadm does on the machine.
type Role string

// Roles.
const (
	RoleInit Role = "init"
	RoleJoin Role = "join"
)

// Encoding says how a File's Content holds the bytes to write.
type Encoding string

// Encodings.
const (
	// EncodingNone: Content is the text to write.
	EncodingNone Encoding = ""
	// EncodingBase64: Content is base64 of the bytes to write.
	EncodingBase64 Encoding = "base64"
	// EncodingGzipBase64: Content is base64 of the gzip-compressed bytes;
	// the data carries them compressed and the machine decompresses them.
	EncodingGzipBase64 Encoding = "gzip+base64"
)

// File is a file with its content resolved (contentFrom Secrets read).
type File struct {
	Path, Content, Owner, Permissions string
	Encoding                          Encoding
	// Append adds the content to the end of the file, which the machine
	// or an earlier file of the data may already have.
	Append bool
}

// Input is everything the data is made from.
type Input struct {
	// Spec is the config's spec; its users' passwdFrom must be resolved
	// into passwd (the controller reads the Secrets).
	Spec *bootstrapv1.KubeadmConfigSpec
	Role Role
	// KubeadmConfig is the rendered kubeadm configuration (YAML); unused in
	// attested mode.
	KubeadmConfig []byte
	// Files are the spec's files with contentFrom resolved.
	Files []File
	// KubernetesVersion is the Machine's version; its base template (the
	// versions table's components) must exist.
	KubernetesVersion string
	// Arch is amd64 or arm64.
	Arch string
	// ClusterCAHash is the discovery token CA cert hash attested machines
	// pin the join service to (public); needed for attested joins.
	ClusterCAHash string
	// ControlPlane says a joining machine becomes a control plane.
	ControlPlane bool
	// Components, when set, are the version's base template (the
	// provider's template directory or bucket, or the versions table
	// through a mirror: package capi/basetemplate); nil means the
	// versions table's.
	Components []versions.Component
}

// ErrNoBaseTemplate means the Kubernetes version has no pinned
// components: the controller reports it as a condition.
var ErrNoBaseTemplate = errors.New("no base template for this Kubernetes version")

// ErrContainerLinuxConfig refuses CABPK's ignition.containerLinuxConfig:
// the message says how to write it as Butane. The controller reports it as
// an InvalidSpec condition.
var ErrContainerLinuxConfig = errors.New("spec.ignition.containerLinuxConfig is CABPK's Container Linux Config, which becomes Ignition v2, " +
	"and this provider writes Ignition v3: write the same additions as Butane in spec.ignition.additionalConfig, starting with " +
	"\"variant: flatcar\" and \"version: 1.1.0\". passwd.users, systemd.units and storage.files keep their shape (drop a file's " +
	"\"filesystem: root\"); a storage.filesystems entry takes the fields of its \"mount\" directly; CLC's flannel, etcd, docker, " +
	"update and locksmith sections become systemd units or files")

// steps is the format-neutral plan of the data: the spec's typed values,
// which each format maps to its own fields.
type steps struct {
	format bootstrapv1.Format
	files  []File
	users  []cabpkv1.User
	ntp    cabpkv1.NTP
	disks  cabpkv1.DiskSetup
	mounts []cabpkv1.MountPoints
	// bootCommands run early (cloud-init's bootcmd; first in Ignition).
	bootCommands [][]string
	// commands run in order: pre-kubeadm, kubeadm or the bootstrapper's
	// start, post-kubeadm, the sentinel.
	commands [][]string
	// onlyStartsBootstrapper says commands only start the bootstrapper:
	// Ignition enables its unit instead of running a script.
	onlyStartsBootstrapper bool
	butane                 string
}

// Render returns the data in the spec's format.
func Render(in Input) ([]byte, error) {
	s, err := plan(in)
	if err != nil {
		return nil, err
	}
	if s.format == bootstrapv1.FormatIgnition {
		return renderIgnition(s)
	}
	return renderCloudConfig(s)
}

// baseTemplate returns the pinned components of a Kubernetes version and
// architecture, or an error wrapping ErrNoBaseTemplate.
func baseTemplate(version, arch string) ([]versions.Component, error) {
	release, err := versions.Resolve(version)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoBaseTemplate, err)
	}
	components, err := release.Components(arch)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoBaseTemplate, err)
	}
	return components, nil
}

func plan(in Input) (*steps, error) {
	components := in.Components
	if components == nil {
		var err error
		if components, err = baseTemplate(in.KubernetesVersion, in.Arch); err != nil {
			return nil, err
		}
	}
	spec := in.Spec
	s := &steps{format: spec.Format, files: append([]File(nil), in.Files...), users: spec.Users, ntp: spec.NTP,
		disks: spec.DiskSetup, mounts: spec.Mounts}
	if s.format == "" {
		s.format = bootstrapv1.FormatCloudConfig
	}
	for i, u := range spec.Users {
		if u.PasswdFrom.IsDefined() && u.Passwd == "" {
			return nil, fmt.Errorf("spec.users[%d]: passwdFrom is not resolved", i)
		}
	}
	// Each value for its reader on the machine, in both formats alike.
	if err := checkValues(in); err != nil {
		return nil, err
	}
	if s.format == bootstrapv1.FormatCloudConfig {
		if err := checkTemplates(in); err != nil {
			return nil, err
		}
	}
	devices := map[string]bool{}
	for i, p := range spec.DiskSetup.Partitions {
		// cloud-init's disk_setup is keyed by device.
		if p.Device == "" || strings.ContainsFunc(p.Device, isControl) || devices[p.Device] {
			return nil, fmt.Errorf("diskSetup.partitions[%d]: device %q is empty, not one line or partitioned twice", i, p.Device)
		}
		devices[p.Device] = true
		// What the CRD admits (cloud-init's schema refuses other table
		// types; sfdisk other partition types).
		if p.TableType != "" && p.TableType != "mbr" && p.TableType != "gpt" {
			return nil, fmt.Errorf("diskSetup.partitions[%d]: tableType %q is mbr or gpt", i, p.TableType)
		}
		for j, part := range p.DiskLayout {
			if part.Percentage < 1 || part.Percentage > 100 || part.PartitionType != "" && !partitionType.MatchString(part.PartitionType) {
				return nil, fmt.Errorf("diskSetup.partitions[%d].diskLayout[%d]: want a percentage of 1-100 and a partition type of %s or a GPT GUID",
					i, j, "Linux, LinuxSwap, LinuxRAID, LVM, Fat32, NTFS, LinuxExtended")
			}
		}
	}
	for i, fs := range spec.DiskSetup.Filesystems {
		if fs.Device == "" || fs.Filesystem == "" || strings.ContainsFunc(fs.Device, isControl) {
			return nil, fmt.Errorf("diskSetup.filesystems[%d]: a file system needs a device (one line) and a type", i)
		}
	}
	for _, f := range in.Files {
		if err := checkContent(f); err != nil {
			return nil, err
		}
	}
	for _, c := range spec.BootCommands {
		s.bootCommands = append(s.bootCommands, shell(c))
	}
	if spec.Ignition != nil {
		if spec.Ignition.ContainerLinuxConfig.IsDefined() {
			return nil, ErrContainerLinuxConfig
		}
		s.butane = spec.Ignition.AdditionalConfig
	}
	attested := spec.Attested != nil && spec.Attested.Enabled
	if !attested {
		// An attested machine's bootstrapper installs the components the
		// join service (or `gatehouse init`) pins, once it has attested.
		s.files = append(s.files, File{Path: installScriptPath, Content: installScript(components), Permissions: "0700"})
		s.commands = append(s.commands, []string{installScriptPath})
	}
	for _, c := range spec.PreKubeadmCommands {
		s.commands = append(s.commands, shell(c))
	}
	if attested {
		env, err := bootstrapperEnv(in)
		if err != nil {
			return nil, err
		}
		s.files = append(s.files, File{Path: BootstrapperEnvPathFor(s.format), Content: env, Permissions: "0644"})
		s.onlyStartsBootstrapper = len(s.commands) == 0 && len(spec.PostKubeadmCommands) == 0
		s.commands = append(s.commands, []string{"systemctl", "enable", "--now", bootstrapperUnit})
	} else {
		if len(in.KubeadmConfig) == 0 {
			return nil, errors.New("no kubeadm configuration to write")
		}
		path := KubeadmConfigPathFor(s.format)
		s.files = append(s.files, File{Path: path, Content: string(in.KubeadmConfig), Owner: "root:root", Permissions: "0640"})
		kubeadm := []string{"kubeadm", string(in.Role), "--config", path}
		if spec.Verbosity != nil {
			kubeadm = append(kubeadm, "--v", strconv.Itoa(int(*spec.Verbosity)))
		}
		s.commands = append(s.commands, kubeadm)
	}
	for _, c := range spec.PostKubeadmCommands {
		s.commands = append(s.commands, shell(c))
	}
	if !attested {
		// In attested mode the bootstrapper writes it once the node joined.
		s.commands = append(s.commands, shell("mkdir -p /run/cluster-api && echo success > "+sentinelPath))
	}
	return s, nil
}

func shell(line string) []string { return []string{"/bin/sh", "-c", line} }

// partitionType is a CABPK partition type or a GPT partition GUID, as the
// CRD admits.
var partitionType = regexp.MustCompile(`^(Linux|LinuxSwap|LinuxRAID|LVM|Fat32|NTFS|LinuxExtended|[0-9A-Fa-f]{8}(-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12})$`)

// ntpServer is a host name or an IP address.
var ntpServer = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._:-]*[A-Za-z0-9.])?$`)

// maxFileSize bounds what a gzip file's content may inflate to when it is
// checked (a Secret holds at most 1 MiB).
const maxFileSize = 64 << 20

// checkContent refuses a file whose content is not what its encoding
// says: the machine could not write it.
func checkContent(f File) error {
	switch f.Encoding {
	case EncodingNone:
		return nil
	case EncodingBase64, EncodingGzipBase64:
	default:
		return fmt.Errorf("file %s: unknown encoding %q", f.Path, f.Encoding)
	}
	raw, err := base64.StdEncoding.DecodeString(f.Content)
	if err != nil {
		return fmt.Errorf("file %s: content is not base64: %w", f.Path, err)
	}
	if f.Encoding == EncodingGzipBase64 {
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			return fmt.Errorf("file %s: content is not gzip: %w", f.Path, err)
		}
		if _, err := io.Copy(io.Discard, io.LimitReader(zr, maxFileSize)); err != nil {
			return fmt.Errorf("file %s: content is not gzip: %w", f.Path, err)
		}
	}
	return nil
}

// installScript downloads each pinned component, checks its sha256 before
// installing it, and retries transient failures.
func installScript(components []versions.Component) string {
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# Installs the pinned Kubernetes components; a digest mismatch stops the bootstrap.\nset -eu\n")
	b.WriteString("fetch() { for i in 1 2 3 4 5; do curl -fsSL --retry 3 -o \"$2\" \"$1\" && return 0; sleep \"$i\"; done; return 1; }\n")
	b.WriteString("tmp=$(mktemp -d)\ntrap 'rm -rf \"$tmp\"' EXIT\n")
	for _, c := range components {
		hash := strings.TrimPrefix(c.Hash, "sha256:")
		fmt.Fprintf(&b, "fetch '%s' \"$tmp/%s\"\necho '%s  '\"$tmp/%s\" | sha256sum -c -\n", c.URL, c.Name, hash, c.Name)
		if c.Extract {
			fmt.Fprintf(&b, "mkdir -p '%s' && tar -xzf \"$tmp/%s\" -C '%s'\n", c.InstallPath, c.Name, c.InstallPath)
		} else {
			fmt.Fprintf(&b, "install -m 0755 \"$tmp/%s\" '%s'\n", c.Name, c.InstallPath)
		}
	}
	return b.String()
}
