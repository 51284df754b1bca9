package capiparity

import (
	"encoding"
	"encoding/json"
	"reflect"
	"slices"
	"strings"

	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
)

// cabpkPkg is the package of upstream's KubeadmConfigSpec: its structs are
// walked into, anything else (corev1.Taint, metav1.Time, maps) is a leaf.
var cabpkPkg = reflect.TypeFor[cabpkv1.KubeadmConfigSpec]().PkgPath()

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// specFields returns the path of every leaf field of upstream's
// KubeadmConfigSpec, by JSON name: "users[].sudo", "ntp.enabled". A field
// upstream adds shows up here, and the test fails until a sample sets it.
func specFields() []string {
	var out []string
	walkType(reflect.TypeFor[cabpkv1.KubeadmConfigSpec](), "", &out)
	slices.Sort(out)
	return out
}

func walkType(t reflect.Type, path string, out *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct && isCABPKStruct(t.Elem()) {
		walkType(t.Elem(), path+"[]", out)
		return
	}
	if !isCABPKStruct(t) {
		*out = append(*out, path)
		return
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name, ok := jsonName(f)
		if !ok {
			continue
		}
		walkType(f.Type, join(path, name), out)
	}
}

// isCABPKStruct is a struct of upstream's API package without its own JSON
// form (BootstrapTokenString marshals as one string).
func isCABPKStruct(t reflect.Type) bool {
	if t.Kind() != reflect.Struct || t.PkgPath() != cabpkPkg {
		return false
	}
	p := reflect.PointerTo(t)
	return !t.Implements(jsonMarshaler) && !p.Implements(jsonMarshaler) && !t.Implements(textMarshaler) && !p.Implements(textMarshaler)
}

// jsonName is f's JSON name ("" for an inlined embedded struct); ok is
// false for fields JSON skips.
func jsonName(f reflect.StructField) (string, bool) {
	tag := f.Tag.Get("json")
	name, _, _ := strings.Cut(tag, ",")
	if name == "-" || !f.IsExported() {
		return "", false
	}
	if name == "" && !f.Anonymous {
		name = f.Name
	}
	return name, true
}

// join appends a field's name to a path; an inlined field ("") adds none.
func join(path, name string) string {
	if name == "" {
		return path
	}
	if path == "" {
		return name
	}
	return path + "." + name
}

// setFields returns the leaf paths that spec sets: a non-zero value, or a
// pointer that is not nil (ntp.enabled: false sets ntp.enabled).
func setFields(spec *cabpkv1.KubeadmConfigSpec) []string {
	seen := map[string]bool{}
	walkValue(reflect.ValueOf(spec).Elem(), "", seen)
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

func walkValue(v reflect.Value, path string, seen map[string]bool) {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return
		}
		v = v.Elem()
		if t := v.Type(); !isCABPKStruct(t) && (t.Kind() != reflect.Slice || !isCABPKStruct(t.Elem())) {
			seen[path] = true // a pointer to a leaf sets it, even to its zero value
			return
		}
	}
	t := v.Type()
	if t.Kind() == reflect.Slice && isCABPKStruct(t.Elem()) {
		for i := range v.Len() {
			walkValue(v.Index(i), path+"[]", seen)
		}
		return
	}
	if !isCABPKStruct(t) {
		if !v.IsZero() {
			seen[path] = true
		}
		return
	}
	for i := range t.NumField() {
		name, ok := jsonName(t.Field(i))
		if !ok {
			continue
		}
		walkValue(v.Field(i), join(path, name), seen)
	}
}
