package render

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"reflect"
	"strings"
	"text/template"

	"github.com/blang/semver/v4"
	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	kubeadmtypes "sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/types"
	"sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/types/upstream"
	"sigs.k8s.io/yaml"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

// The fuzz targets' input generator. A fuzz input is a spec as YAML (the
// seeds are specs users write, covering every field) and a string of
// choices that drives a generator over the spec's Go type: it reaches every
// field of KubeadmConfigSpec by reflection (the kubeadm configurations
// too), keeping, replacing or extending values with plausible and hostile
// strings, numbers, booleans, pointers and list entries. Past the end of
// the choices every choice is 0: keep what the YAML says.

// choices hands out the fuzz input's bytes.
type choices struct{ b []byte }

func (c *choices) byte() byte {
	if len(c.b) == 0 {
		return 0
	}
	v := c.b[0]
	c.b = c.b[1:]
	return v
}

// intn is a choice in [0, n).
func (c *choices) intn(n int) int { return int(c.byte()) % n }

// raw is up to max bytes of the input, as they are.
func (c *choices) raw(max int) string {
	n := min(c.intn(max+1), len(c.b))
	s := string(c.b[:n])
	c.b = c.b[n:]
	return s
}

// plausible values make a spec get past the renderer's checks, so that a
// hostile value elsewhere reaches the output.
var plausible = []string{
	"", "ops", "root", "root:root", "ops:wheel", "0644", "0600", "0755", "0440", "/etc/motd", "/etc/kubernetes/pki/ca.crt", "/etc/hosts",
	KubeadmConfigPath, IgnitionKubeadmConfigPath, installScriptPath, BootstrapperEnvPath, IgnitionBootstrapperEnvPath, sudoersPath, chronyConfPath, commandsScriptPath,
	"/dev/vdb", "/dev/nvme0n1", "/dev/disk/by-id/virtio-data", "sdb", "LABEL=etcd", "UUID=0a1b-2c3d", "etcd", "ext4", "xfs", "swap",
	"none", "auto", "any", "1", "2", "gpt", "mbr", "/var/lib/etcd", "/mnt/data", "defaults,nofail", "sw", "time.example.com",
	"10.0.0.1:9090", "[2001:db8::1]:9090", "join.example.com:443", "echo hello", "swapoff -a", "ssh-ed25519 AAAA ops",
	"ALL=(ALL) NOPASSWD:ALL", "wheel, docker", "/bin/bash", "/home/ops", "$6$salt$hash", "base64", "gzip", "gzip+base64", "Template",
	"Linux", "LinuxSwap", "LinuxRAID", "-E", "lazy_itable_init=1", "SGVsbG8K", gzipBase64Of("hello\n"), "v1.36.4", "amd64", "arm64",
	"variant: fcos\nversion: 1.6.0\n", "variant: fcos\nversion: 1.6.0\nstorage:\n  files:\n  - path: /etc/extra\n    contents: {inline: x}\n",
	"{{ ds.meta_data.local_hostname }}", "{{ v1.local_hostname }}", "{% raw %}${#PATH}{% endraw %}", "sha256:" + strings.Repeat("ab", 32),
	"apiserver.example.com:6443", "10.96.0.0/12", "cluster.local", "node-role=worker", "true", "0", "kube-system",
}

// hostile values try to end a line, a quote, a YAML scalar, a unit
// setting or a Jinja construct, or to be read as something else.
var hostile = []string{
	"\n", "a\nb", "\n- evil", "\nusers: [{name: evil}]", "\"", "'", "\"\nevil: 1", "'\n- evil", "\\", "\\\n", "a\\", "\r", "\r\n", "\t",
	"\x00", "\x1b[0m", "\u0085", "\u2028", "\u2029", "\ufeff", "é", "😀", "\xff\xfe", " leading", "trailing ", "- item", "key: value",
	"# comment", " #x", "&anchor", "*alias", "!tag", "|", ">", "---", "...", "@", "`", "%", "%n", "%%", "=", "<<", "~", "null", "y",
	"off", "1:20", "0x1F", "0o17", "1_000", ".inf", "2001-12-14", "{{", "{%", "{#", "}}", "%}", "#}", "{{ 'x' }}", "{{ \"x\" }}",
	"{{ x }}", "{% if true %}x{% endif %}", "{% if true %}\n", "{% endif %}", "{# c #}", "{%- if true -%}", "{{- x -}}", "{% raw %}",
	"{% endraw %}", "${#PATH}", "${HOME}", "$(reboot)", "';reboot;'", "ExecStartPre=/bin/evil", "[Service]", "x iburst\nallow all",
	"a,b", " ", "..", "/..", "/./", "//", "-o", "--control-plane", "ALL", strings.Repeat("A", 12000), strings.Repeat("x y ", 2000),
}

func gzipBase64Of(s string) string {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, _ = zw.Write([]byte(s))
	_ = zw.Close()
	return base64.StdEncoding.EncodeToString(b.Bytes())
}

// genString is a new value for a string that is old.
func genString(c *choices, old string) string {
	pick := func(list []string) string { return list[int(c.byte())%len(list)] }
	switch c.intn(7) {
	case 0:
		return pick(plausible)
	case 1:
		return pick(hostile)
	case 2:
		return pick(plausible) + pick(hostile)
	case 3:
		return pick(hostile) + pick(plausible)
	case 4:
		return old + pick(hostile)
	case 5:
		return pick(plausible) + pick(hostile) + pick(plausible)
	default:
		return c.raw(40)
	}
}

// maxDepth bounds the generator in recursive types.
const maxDepth = 12

// mutate changes v, a settable value, as the choices say: structs field by
// field (a bit each says which fields change), lists entry by entry.
func mutate(v reflect.Value, c *choices, depth int) {
	if depth > maxDepth || !v.CanSet() {
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(genString(c, v.String()))
	case reflect.Bool:
		v.SetBool(c.byte()&1 == 1)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		switch c.intn(4) {
		case 0:
			v.SetInt(int64(c.byte()))
		case 1:
			v.SetInt(-int64(c.byte()))
		case 2:
			v.SetInt(int64(int32(uint32(c.byte())<<24 | uint32(c.byte())<<16 | uint32(c.byte())<<8 | uint32(c.byte()))))
		default:
			v.SetInt(0)
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(c.byte()))
	case reflect.Pointer:
		if c.intn(4) == 0 {
			v.Set(reflect.Zero(v.Type()))
			return
		}
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		mutate(v.Elem(), c, depth+1)
	case reflect.Slice:
		switch c.intn(4) {
		case 0: // change one entry
			if v.Len() > 0 {
				mutate(v.Index(c.intn(v.Len())), c, depth+1)
			}
		case 1: // add one
			e := reflect.New(v.Type().Elem()).Elem()
			fill(e, c, depth+1)
			v.Set(reflect.Append(v, e))
		case 2: // new entries
			n := 1 + c.intn(3)
			s := reflect.MakeSlice(v.Type(), n, n)
			for i := range n {
				fill(s.Index(i), c, depth+1)
			}
			v.Set(s)
		default:
			v.Set(reflect.Zero(v.Type()))
		}
	case reflect.Map:
		if c.intn(3) == 0 {
			v.Set(reflect.Zero(v.Type()))
			return
		}
		if v.IsNil() {
			v.Set(reflect.MakeMap(v.Type()))
		}
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, c, depth+1)
		fill(e, c, depth+1)
		v.SetMapIndex(k, e)
	case reflect.Struct:
		var fields []int
		for i := range v.NumField() {
			if v.Field(i).CanSet() {
				fields = append(fields, i)
			}
		}
		var mask byte
		for n, i := range fields {
			if n%8 == 0 {
				mask = c.byte()
			}
			if mask&(1<<(n%8)) != 0 {
				mutate(v.Field(i), c, depth+1)
			}
		}
	}
}

// fill gives a new (zero) value its content: a struct gets a value in
// each field the choices pick, a string a generated value.
func fill(v reflect.Value, c *choices, depth int) {
	if v.Kind() == reflect.Pointer {
		v.Set(reflect.New(v.Type().Elem()))
		mutate(v.Elem(), c, depth+1)
		return
	}
	mutate(v, c, depth)
}

// Targets of the fuzzer.
type fuzzTarget int

const (
	targetCloudConfig fuzzTarget = iota
	targetIgnition
	targetAttested
)

// fuzzCAHash is the cluster CA hash an attested join gets: valid
// mostly, hostile sometimes.
func fuzzCAHash(c *choices) string {
	if c.intn(8) == 7 {
		return genString(c, testCAHash)
	}
	return testCAHash
}

// fuzzInput is the render input of a fuzz input, made the way the
// controller makes it (capi/controller's renderInput): the spec's files
// with their encodings, passwdFrom resolved, the kubeadm configuration
// marshalled from the spec for the role and version, the CA files of a
// control plane. ok is false where the controller would refuse the spec
// before rendering (a kubeadm configuration that does not marshal).
func fuzzInput(specYAML, choiceBytes []byte, target fuzzTarget) (in Input, ok bool) {
	spec := &bootstrapv1.KubeadmConfigSpec{}
	if err := yaml.Unmarshal(specYAML, spec); err != nil {
		spec = &bootstrapv1.KubeadmConfigSpec{}
	}
	c := &choices{b: choiceBytes}
	in = Input{Spec: spec, Role: RoleJoin, KubernetesVersion: versions.Default().Version, Arch: "amd64"}
	if c.byte()&1 == 1 {
		in.Role = RoleInit
	}
	controlPlane := c.byte()&1 == 1
	in.ControlPlane = in.Role == RoleInit || controlPlane
	if v, supported := c.byte(), versions.Supported(); v == 0xff {
		in.KubernetesVersion = genString(c, in.KubernetesVersion)
	} else {
		in.KubernetesVersion = supported[int(v)%len(supported)]
	}
	formatChoice := c.byte()
	mutate(reflect.ValueOf(spec).Elem(), c, 0)
	switch target {
	case targetCloudConfig:
		spec.Format, spec.Attested = bootstrapv1.FormatCloudConfig, nil
	case targetIgnition:
		spec.Format, spec.Attested = bootstrapv1.FormatIgnition, nil
	case targetAttested:
		spec.Format = bootstrapv1.FormatCloudConfig
		if formatChoice&1 == 1 {
			spec.Format = bootstrapv1.FormatIgnition
		}
		if spec.Attested == nil {
			spec.Attested = &bootstrapv1.AttestedSpec{JoinEndpoints: []string{"10.0.0.1:9090"}}
		}
		spec.Attested.Enabled = true
		in.ClusterCAHash = fuzzCAHash(c)
	}
	if spec.Architecture != "" {
		in.Arch = spec.Architecture
	}
	attested := spec.Attested != nil && spec.Attested.Enabled
	for i := range spec.Users {
		// The controller reads passwdFrom's Secret into passwd (attested
		// mode refuses it); left unresolved, Render must refuse.
		if u := &spec.Users[i]; u.PasswdFrom.IsDefined() && c.intn(4) != 3 {
			u.Passwd, u.PasswdFrom = "$6$from-secret$"+u.PasswdFrom.Secret.Key, cabpkv1.PasswdSource{}
		}
	}
	if in.Files, ok = fuzzFiles(spec.Files); !ok {
		return in, false
	}
	if attested {
		return in, true
	}
	v, err := semver.ParseTolerant(in.KubernetesVersion)
	if err != nil {
		// The controller refuses the Machine's version; Render must too.
		in.KubeadmConfig = []byte("kind: JoinConfiguration\n")
		return in, true
	}
	if in.Role == RoleInit {
		cluster, err := kubeadmtypes.MarshalClusterConfigurationForVersion(&spec.ClusterConfiguration, v,
			&upstream.AdditionalData{ClusterName: ptr.To("fuzz"), KubernetesVersion: ptr.To(in.KubernetesVersion)})
		if err != nil {
			return in, false
		}
		init, err := kubeadmtypes.MarshalInitConfigurationForVersion(&spec.InitConfiguration, v)
		if err != nil {
			return in, false
		}
		in.KubeadmConfig = []byte(cluster + "---\n" + init)
	} else {
		join := spec.JoinConfiguration.DeepCopy()
		if in.ControlPlane && join.ControlPlane == nil {
			join.ControlPlane = &cabpkv1.JoinControlPlane{}
		}
		out, err := kubeadmtypes.MarshalJoinConfigurationForVersion(join, v)
		if err != nil {
			return in, false
		}
		in.KubeadmConfig = []byte(out)
	}
	if in.ControlPlane {
		in.Files = append(in.Files, File{Path: "/etc/kubernetes/pki/ca.crt", Content: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n", Permissions: "0640"},
			File{Path: "/etc/kubernetes/pki/ca.key", Content: "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\n", Permissions: "0600"})
	}
	return in, true
}

// fuzzFiles are the spec's files as the controller hands them to Render
// (resolveFiles), without checking their encodings: Render must refuse
// content that is not what its encoding says. A contentFrom Secret holds
// its key's name; a Template is executed as the controller does, and ok is
// false when it fails, as the controller then refuses the spec.
func fuzzFiles(files []cabpkv1.File) (_ []File, ok bool) {
	out := make([]File, 0, len(files))
	for _, f := range files {
		rf := File{Path: f.Path, Owner: f.Owner, Permissions: f.Permissions, Append: ptr.Deref(f.Append, false), Content: f.Content}
		if f.ContentFrom.IsDefined() {
			rf.Content = f.ContentFrom.Secret.Key
		}
		if f.ContentFormat == cabpkv1.FileContentFormatTemplate {
			tpl, err := template.New(f.Path).Parse(rf.Content)
			if err != nil {
				return nil, false
			}
			var b strings.Builder
			if err := tpl.Execute(&b, map[string]any{"controlPlane": map[string]any{"version": "v1.36.4"}}); err != nil {
				return nil, false
			}
			rf.Content = b.String()
		}
		if f.ContentFrom.IsDefined() {
			if f.Encoding == "" {
				rf.Content, rf.Encoding = base64.StdEncoding.EncodeToString([]byte(rf.Content)), EncodingBase64
				out = append(out, rf)
				continue
			}
		}
		switch f.Encoding {
		case "":
		case cabpkv1.Base64:
			rf.Encoding = EncodingBase64
		case cabpkv1.GzipBase64:
			rf.Encoding = EncodingGzipBase64
		case cabpkv1.Gzip:
			rf.Content, rf.Encoding = base64.StdEncoding.EncodeToString([]byte(rf.Content)), EncodingGzipBase64
		default:
			rf.Encoding = Encoding(f.Encoding)
		}
		out = append(out, rf)
	}
	return out, true
}
