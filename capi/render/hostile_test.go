package render

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	"sigs.k8s.io/yaml"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
)

// hostileCorpus is put in every string field of a spec setting every
// field: quotes, line breaks, Jinja expressions, statements and comments
// ({% endraw %} among them), YAML indicators, control characters, Unicode
// line separators and a very long string.
var hostileCorpus = []string{
	`"`, `'`, "a\nb", "\n- evil", "\"\nruncmd: [[evil]]\n#", "\r\n", "\t", "\x00", "\x1b[0m", "\u0085", "\u2028", "\u2029",
	"{{ 'x\\n' ~ 'runcmd: [[evil]]' }}", "{{ ds.meta_data.local_hostname }}", "a{{ v1.local_hostname }}\nb",
	"{% if true %}\nruncmd: [[evil]]\n{% endif %}", "{% endraw %}", "{% raw %}{{ x }}{% endraw %}{% endraw %}", "{% raw %}${#PATH}{% endraw %}",
	"{# c #}", "${#PATH}", "- item: &a *a !!python/object:os.system", "---\n...", "a{", "{{", "}}",
	strings.Repeat("{{ x }}\n\u2028\"", 400),
}

// hostileSpec sets every field a user writes (as the fuzz seeds do).
const hostileSpec = `
clusterConfiguration:
  controlPlaneEndpoint: apiserver.example.com:6443
  apiServer: {extraArgs: [{name: audit-log-maxage, value: "30"}], certSANs: [apiserver.example.com]}
initConfiguration:
  nodeRegistration: {name: node, kubeletExtraArgs: [{name: node-labels, value: tier=control-plane}]}
joinConfiguration:
  nodeRegistration: {name: node, kubeletExtraArgs: [{name: cloud-provider, value: external}]}
files:
- {path: /etc/motd, content: "managed\n", owner: "root:adm", permissions: "0640"}
users:
- {name: ops, gecos: Operations, groups: "wheel, docker", homeDir: /home/ops, shell: /bin/bash, passwd: $6$salt$hash, primaryGroup: ops,
   sudo: "ALL=(ALL) ALL", sshAuthorizedKeys: [ssh-ed25519 AAAA ops]}
ntp: {servers: [time.example.com]}
diskSetup:
  partitions: [{device: /dev/vdb, layout: true, tableType: gpt}]
  filesystems: [{device: /dev/vdb, partition: auto, filesystem: ext4, label: etcd, extraOpts: ["-E", "lazy_itable_init=1"]}]
mounts: [[LABEL=etcd, /var/lib/etcd, ext4, defaults]]
bootCommands: [echo boot]
preKubeadmCommands: [swapoff -a]
postKubeadmCommands: [echo done]
`

// stringFields calls fn with the JSON path of each string the spec sets
// and a function that replaces it.
func stringFields(v reflect.Value, at string, fn func(at string, set func(string))) {
	switch v.Kind() {
	case reflect.String:
		fn(at, v.SetString)
	case reflect.Pointer:
		if !v.IsNil() {
			stringFields(v.Elem(), at, fn)
		}
	case reflect.Slice:
		for i := range v.Len() {
			stringFields(v.Index(i), fmt.Sprintf("%s[%d]", at, i), fn)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
			if name == "" || name == "-" || !v.Field(i).CanSet() {
				continue
			}
			stringFields(v.Field(i), at+"."+name, fn)
		}
	}
}

// TestHostileValuesInEveryField: each hostile value, in each string field
// of the spec, in both formats and in attested mode, in the init and join
// roles, is refused with an error (naming the field when it is a value
// check), or the data means exactly the spec: for cloud-config, through
// the real `cloud-init devel render` and `cloud-init schema`, the parsed
// document holds every value as the spec has it (templates rendered), and
// nothing else (checkCloudConfig); Ignition and attested data likewise
// (checkIgnition, checkAttested). Each value is also put in every field
// that accepts it at once.
func TestHostileValuesInEveryField(t *testing.T) {
	t.Parallel()
	targets := []struct {
		name    string
		target  fuzzTarget
		choices string
	}{
		{"cloud-config join", targetCloudConfig, ""}, {"cloud-config init", targetCloudConfig, "\x01"},
		{"ignition join", targetIgnition, ""}, {"attested cloud-config", targetAttested, "\x00\x00\x00\x00"},
		{"attested ignition", targetAttested, "\x00\x00\x00\x01"},
	}
	for _, tg := range targets {
		for vi, value := range hostileCorpus {
			t.Run(fmt.Sprintf("%s/%d", tg.name, vi), func(t *testing.T) {
				t.Parallel()
				base := &bootstrapv1.KubeadmConfigSpec{}
				if err := yaml.Unmarshal([]byte(hostileSpec), base); err != nil {
					t.Fatal(err)
				}
				if tg.target == targetAttested {
					// Attested mode carries only the join's node
					// registration; the rest is refused (attestedreg_test.go).
					base.ClusterConfiguration, base.InitConfiguration = cabpkv1.ClusterConfiguration{}, cabpkv1.InitConfiguration{}
					base.JoinConfiguration.NodeRegistration.Name = ""
				}
				var accepted []string
				render := func(spec *bootstrapv1.KubeadmConfigSpec) (Input, []byte, error, bool) {
					specYAML, err := yaml.Marshal(spec)
					if err != nil {
						t.Fatal(err)
					}
					in, ok := fuzzInput(specYAML, []byte(tg.choices), tg.target)
					if !ok {
						return in, nil, nil, false
					}
					data, err := Render(in)
					return in, data, err, true
				}
				var paths []string
				stringFields(reflect.ValueOf(base).Elem(), "spec", func(at string, _ func(string)) { paths = append(paths, at) })
				for _, path := range paths {
					spec := base.DeepCopy()
					stringFields(reflect.ValueOf(spec).Elem(), "spec", func(at string, set func(string)) {
						if at == path {
							set(value)
						}
					})
					_, _, err, ok := render(spec)
					switch {
					case !ok:
						continue // the controller refuses it before rendering
					case err != nil:
						// passwdFrom's Secret is read into passwd before rendering.
						named := strings.ReplaceAll(path, "passwdFrom.secret.key", "passwd")
						if strings.Contains(err.Error(), errValue.Error()) && !strings.Contains(err.Error(), named) &&
							!strings.Contains(err.Error(), "the kubeadm configuration") && !strings.HasPrefix(path, "spec.files") {
							t.Errorf("%s = %.40q: the refusal does not name the field: %v", path, value, err)
						}
						continue
					}
					accepted = append(accepted, path)
				}
				// All at once, through cloud-init's command lines.
				spec := base.DeepCopy()
				set := func(path, v string) {
					stringFields(reflect.ValueOf(spec).Elem(), "spec", func(at string, set func(string)) {
						if at == path {
							set(v)
						}
					})
				}
				for _, path := range accepted {
					set(path, value)
				}
				if _, _, err, ok := render(spec); !ok || err != nil {
					// Some fields refuse it together (a duplicate, a size): add
					// them one by one.
					spec = base.DeepCopy()
					for _, path := range accepted {
						set(path, value)
						if _, _, err, ok := render(spec); !ok || err != nil {
							set(path, fieldValue(base, path))
						}
					}
				}
				in, data, err, ok := render(spec)
				if !ok || err != nil {
					t.Fatalf("the fields that accept %.40q do not render together: %v", value, err)
				}
				checkData(t, in, data, true)
			})
		}
	}
}

// fieldValue is the string at path in spec.
func fieldValue(spec *bootstrapv1.KubeadmConfigSpec, path string) string {
	var out string
	var walk func(v reflect.Value, at string)
	walk = func(v reflect.Value, at string) {
		switch v.Kind() {
		case reflect.String:
			if at == path {
				out = v.String()
			}
		case reflect.Pointer:
			if !v.IsNil() {
				walk(v.Elem(), at)
			}
		case reflect.Slice:
			for i := range v.Len() {
				walk(v.Index(i), fmt.Sprintf("%s[%d]", at, i))
			}
		case reflect.Struct:
			for i := range v.NumField() {
				name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
				if name != "" && name != "-" {
					walk(v.Field(i), at+"."+name)
				}
			}
		}
	}
	walk(reflect.ValueOf(spec).Elem(), "spec")
	return out
}

// checkData checks rendered data as the fuzz targets do; cli runs
// cloud-init's command lines on cloud-config.
func checkData(t *testing.T, in Input, data []byte, cli bool) {
	t.Helper()
	if in.Spec.Format == bootstrapv1.FormatIgnition {
		checkIgnition(t, in, data)
	} else {
		checkCloudConfig(t, in, data, cli)
	}
	if in.Spec.Attested != nil && in.Spec.Attested.Enabled {
		checkAttested(t, in, in.Spec.Format, data)
	}
}
