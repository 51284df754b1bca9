package render

import (
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_5/types"
	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"

	"github.com/gatehouse-dev/gatehouse/capi/render/cloudinit"
)

// Disks, file systems and mounts. cloud-config gets CABPK's disk_setup,
// fs_setup and mounts; Ignition gets storage.disks and
// storage.filesystems, and a systemd mount (or swap) unit per mount.

// cloudInitDisks maps the disk setup to cloud-init's cc_disk_setup.
func cloudInitDisks(c *cloudinit.Config, d cabpkv1.DiskSetup) error {
	for _, p := range d.Partitions {
		ds := cloudinit.DiskSetup{TableType: p.TableType, Overwrite: p.Overwrite}
		switch {
		case len(p.DiskLayout) > 0:
			layout := make([]any, 0, len(p.DiskLayout))
			for _, part := range p.DiskLayout {
				if part.PartitionType == "" {
					layout = append(layout, part.Percentage)
				} else {
					layout = append(layout, []any{part.Percentage, partitionTypeCode(part.PartitionType)})
				}
			}
			ds.Layout = layout
		case p.Layout != nil:
			ds.Layout = *p.Layout
		}
		if c.DiskSetup == nil {
			c.DiskSetup = map[string]cloudinit.DiskSetup{}
		}
		c.DiskSetup[p.Device] = ds
	}
	for i, fs := range d.Filesystems {
		// cloud-init's partition is auto, any, none or a number, as CABPK
		// writes it.
		var partition any
		switch p := fs.Partition; {
		case p == "":
		case p == "auto" || p == "any" || p == "none":
			partition = p
		case digits.MatchString(p) && len(p) < 4:
			partition, _ = strconv.Atoi(p)
		default:
			return fmt.Errorf("diskSetup.filesystems[%d]: partition %q is auto, any, none or a number", i, p)
		}
		c.FSSetup = append(c.FSSetup, cloudinit.FSSetup{Label: fs.Label, Filesystem: fs.Filesystem, Device: fs.Device,
			Partition: partition, Overwrite: fs.Overwrite, ReplaceFS: fs.ReplaceFS, ExtraOpts: fs.ExtraOpts})
	}
	return nil
}

// partitionTypeCode is cloud-init's partition type for CABPK's name (MBR
// type codes, as CABPK maps them); a GPT GUID passes through. A decimal
// code is a number, as cloud-init's schema wants; cloud-init hands it to
// sfdisk as hex text either way.
func partitionTypeCode(t string) any {
	code, ok := map[string]string{
		cabpkv1.PartitionTypeLinux: "83", cabpkv1.PartitionTypeLinuxSwap: "82", cabpkv1.PartitionTypeLinuxRAID: "fd",
		cabpkv1.PartitionTypeLVM: "8e", cabpkv1.PartitionTypeFat32: "0c", cabpkv1.PartitionTypeNTFS: "07",
		cabpkv1.PartitionTypeLinuxExtended: "85",
	}[t]
	if !ok {
		return t
	}
	if n, err := strconv.Atoi(code); err == nil {
		return n
	}
	return code
}

// addIgnitionStorage adds the disks, file systems and mount units.
func addIgnitionStorage(cfg *types.Config, d cabpkv1.DiskSetup, mounts []cabpkv1.MountPoints) error {
	partitioned := map[string]bool{}
	for i, p := range d.Partitions {
		switch {
		case len(p.DiskLayout) > 0:
			return fmt.Errorf("diskSetup.partitions[%d] (%s): Ignition sizes partitions in MiB, not in percent of the disk: "+
				"describe them under storage.disks in spec.ignition.additionalConfig (Butane) instead of diskLayout", i, p.Device)
		case p.TableType == "mbr":
			return fmt.Errorf("diskSetup.partitions[%d] (%s): Ignition writes GPT partition tables only: drop tableType mbr", i, p.Device)
		case !ptr.Deref(p.Layout, false):
			continue // leave the device's partitions as they are
		}
		// One partition filling the device.
		cfg.Storage.Disks = append(cfg.Storage.Disks, types.Disk{Device: p.Device, WipeTable: p.Overwrite, Partitions: []types.Partition{{Number: 1}}})
		partitioned[p.Device] = true
	}
	for i, fs := range d.Filesystems {
		dev, err := filesystemDevice(fs, partitioned)
		if err != nil {
			return fmt.Errorf("diskSetup.filesystems[%d]: %w", i, err)
		}
		// replaceFS replaces the file system found: Ignition may wipe it.
		f := types.Filesystem{Device: dev, Format: ptr.To(fs.Filesystem), WipeFilesystem: ptr.To(ptr.Deref(fs.Overwrite, false) || fs.ReplaceFS != "")}
		if fs.Label != "" && fs.Label != "None" {
			f.Label = ptr.To(fs.Label)
		}
		for _, o := range fs.ExtraOpts {
			f.Options = append(f.Options, types.FilesystemOption(o))
		}
		cfg.Storage.Filesystems = append(cfg.Storage.Filesystems, f)
	}
	for i, m := range mounts {
		unit, err := mountUnit(m, cfg.Storage.Filesystems)
		if err != nil {
			return fmt.Errorf("mounts[%d]: %w", i, err)
		}
		cfg.Systemd.Units = append(cfg.Systemd.Units, unit)
	}
	return nil
}

var digits = regexp.MustCompile(`^[0-9]+$`)

// filesystemDevice is the device a file system goes on: the device, or
// its partition (cloud-init's partition: a number, or auto/any for the
// partition this data makes on the device).
func filesystemDevice(fs cabpkv1.Filesystem, partitioned map[string]bool) (string, error) {
	switch p := fs.Partition; {
	case p == "none":
		return fs.Device, nil
	case p == "" || p == "auto" || p == "any" || p == "auto|any":
		if partitioned[fs.Device] {
			return partitionPath(fs.Device, "1"), nil
		}
		return fs.Device, nil
	case digits.MatchString(p):
		return partitionPath(fs.Device, p), nil
	default:
		return "", fmt.Errorf("partition %q is none, auto, any or a number", p)
	}
}

// partitionPath names partition n of a disk the way the kernel and udev
// do: /dev/vdb1, /dev/nvme0n1p1, /dev/disk/by-id/…-part1.
func partitionPath(dev, n string) string {
	switch {
	case strings.HasPrefix(dev, "/dev/disk/by-"):
		return dev + "-part" + n
	case dev != "" && dev[len(dev)-1] >= '0' && dev[len(dev)-1] <= '9':
		return dev + "p" + n
	}
	return dev + n
}

// mountUnit is the systemd mount (or swap) unit of a cloud-init mounts
// entry: device, mount point, type, options (dump and pass are fsck's,
// which systemd decides itself). The type defaults to the file system
// this data makes on the device.
func mountUnit(m cabpkv1.MountPoints, filesystems []types.Filesystem) (types.Unit, error) {
	if len(m) < 2 {
		return types.Unit{}, fmt.Errorf("%q: an entry needs a device and a mount point", []string(m))
	}
	what, err := mountDevice(m[0])
	if err != nil {
		return types.Unit{}, err
	}
	if fs := labelled(m[0], filesystems); fs != nil {
		// A file system's label alone (as CAPZ's templates write it): its
		// device, as CABPK's Ignition resolves it.
		what = fs.Device
	}
	where, typ, opts := m[1], field(m, 2), field(m, 3)
	var b strings.Builder
	if typ == "swap" || where == "none" || where == "swap" {
		b.WriteString("[Swap]\n")
		if err := writeSetting(&b, "What", what); err != nil {
			return types.Unit{}, err
		}
		if err := writeSetting(&b, "Options", opts); err != nil {
			return types.Unit{}, err
		}
		b.WriteString("\n[Install]\nWantedBy=swap.target\n")
		return types.Unit{Name: escapePath(what) + ".swap", Enabled: ptr.To(true), Contents: ptr.To(b.String())}, nil
	}
	if !path.IsAbs(where) || path.Clean(where) != where {
		return types.Unit{}, fmt.Errorf("mount point %q must be an absolute, clean path", where)
	}
	if typ == "" || typ == "auto" {
		typ = ""
		for _, fs := range filesystems {
			if fs.Device == what || (fs.Label != nil && "/dev/disk/by-label/"+*fs.Label == what) {
				typ = ptr.Deref(fs.Format, "")
			}
		}
	}
	b.WriteString("[Mount]\n")
	for _, s := range []struct{ key, value string }{{"What", what}, {"Where", where}, {"Type", typ}, {"Options", opts}} {
		if err := writeSetting(&b, s.key, s.value); err != nil {
			return types.Unit{}, err
		}
	}
	// Without nofail a missing device fails the boot, as an fstab entry does.
	install := "RequiredBy"
	if strings.Contains(","+opts+",", ",nofail,") {
		install = "WantedBy"
	}
	b.WriteString("\n[Install]\n" + install + "=local-fs.target\n")
	return types.Unit{Name: escapePath(where) + ".mount", Enabled: ptr.To(true), Contents: ptr.To(b.String())}, nil
}

// labelled is the file system this data makes whose label is name, or nil;
// a name with '=' or '/' is a tag or a path, never a label.
func labelled(name string, filesystems []types.Filesystem) *types.Filesystem {
	if strings.ContainsAny(name, "=/") {
		return nil
	}
	for i := range filesystems {
		if l := filesystems[i].Label; l != nil && *l == name {
			return &filesystems[i]
		}
	}
	return nil
}

func field(m cabpkv1.MountPoints, i int) string {
	if i < len(m) {
		return m[i]
	}
	return ""
}

// deviceTag is what LABEL=, UUID=, PARTLABEL= and PARTUUID= may name: udev
// escapes anything else in the /dev/disk/by-* link.
var deviceTag = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// kernelName is a block device name cloud-init's mounts module puts under
// /dev (cc_mounts' DEVICE_NAME_FILTER).
var kernelName = regexp.MustCompile(`^(x?[shv]d[a-z][0-9]*|sr[0-9]+)$`)

// mountDevice is the What= of a mounts entry's device: a path, a kernel
// name (sdb), a LABEL=, UUID=, PARTLABEL= or PARTUUID= tag, or a source
// such as server:/export or tmpfs, as given. cloud-init's datasource
// aliases (ephemeral0, swap, ebs…) do not exist without cloud-init.
func mountDevice(dev string) (string, error) {
	if k, v, ok := strings.Cut(dev, "="); ok {
		dir, known := map[string]string{"LABEL": "by-label", "UUID": "by-uuid", "PARTLABEL": "by-partlabel", "PARTUUID": "by-partuuid"}[k]
		if !known || !deviceTag.MatchString(v) {
			return "", fmt.Errorf("device %q: a tag is LABEL=, UUID=, PARTLABEL= or PARTUUID= with letters, digits, '.', '_' or '-'", dev)
		}
		return "/dev/disk/" + dir + "/" + v, nil
	}
	switch {
	case dev == "":
		return "", fmt.Errorf("the device is empty")
	case kernelName.MatchString(dev):
		return "/dev/" + dev, nil
	case dev == "ami" || dev == "root" || dev == "swap" || !strings.Contains(dev, ":") && (strings.HasPrefix(dev, "ephemeral") || strings.HasPrefix(dev, "ebs")):
		return "", fmt.Errorf("device %q is a cloud-init datasource alias, which Ignition has not: name the device", dev)
	case strings.HasPrefix(dev, "/") && path.Clean(dev) != dev:
		return "", fmt.Errorf("device %q must be a clean path", dev)
	}
	return dev, nil
}

// writeSetting writes "key=value" to a unit, or nothing for an empty
// value. A value is refused when it could end the line or continue it
// (control characters, a trailing backslash); '%' is escaped, since
// systemd expands specifiers in these settings (systemd.unit(5)).
func writeSetting(b *strings.Builder, key, value string) error {
	if value == "" {
		return nil
	}
	if strings.ContainsFunc(value, isControl) || strings.HasSuffix(value, `\`) || strings.TrimSpace(value) != value {
		return fmt.Errorf("%s %q: a unit setting must be one line without surrounding spaces or a trailing backslash", key, value)
	}
	fmt.Fprintf(b, "%s=%s\n", key, strings.ReplaceAll(value, "%", "%%"))
	return nil
}

// escapePath is systemd-escape --path: the unit name of a mount point or
// device (systemd.unit(5), "String Escaping for Inclusion in Unit Names").
func escapePath(p string) string {
	p = strings.Trim(path.Clean(p), "/")
	if p == "" {
		return "-"
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '/':
			b.WriteByte('-')
		case c == '.' && i == 0 || !unitNameByte(c):
			fmt.Fprintf(&b, `\x%02x`, c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func unitNameByte(c byte) bool {
	return c == '_' || c == ':' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
