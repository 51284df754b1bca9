package controller

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/render"
)

// secretReader serves one Secret's data, whatever its name.
type secretReader struct {
	client.Reader
	data map[string][]byte
}

func (s secretReader) Get(_ context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	obj.(*corev1.Secret).Data = s.data
	return nil
}

// TestResolveFiles: each CABPK encoding reaches the data unchanged (gzip
// stays compressed), also for content from a Secret, whose encoding says
// how the Secret holds it; append is kept.
func TestResolveFiles(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte("hello\n"))
	_ = zw.Close()
	b64 := base64.StdEncoding.EncodeToString
	fromSecret := cabpkv1.FileSource{Secret: cabpkv1.SecretFileSource{Name: "s", Key: "k"}}
	tests := []struct {
		name   string
		file   cabpkv1.File
		secret []byte
		want   render.File
	}{
		{"text", cabpkv1.File{Path: "/a", Content: "hi", Append: ptr.To(true)}, nil,
			render.File{Path: "/a", Content: "hi", Append: true}},
		{"base64", cabpkv1.File{Path: "/a", Content: b64([]byte("hi")), Encoding: cabpkv1.Base64}, nil,
			render.File{Path: "/a", Content: b64([]byte("hi")), Encoding: render.EncodingBase64}},
		{"gzip+base64 stays compressed", cabpkv1.File{Path: "/a", Content: b64(gz.Bytes()), Encoding: cabpkv1.GzipBase64}, nil,
			render.File{Path: "/a", Content: b64(gz.Bytes()), Encoding: render.EncodingGzipBase64}},
		{"gzip", cabpkv1.File{Path: "/a", Content: gz.String(), Encoding: cabpkv1.Gzip}, nil,
			render.File{Path: "/a", Content: b64(gz.Bytes()), Encoding: render.EncodingGzipBase64}},
		{"Secret, any bytes", cabpkv1.File{Path: "/a", ContentFrom: fromSecret}, []byte{0, 1, 2},
			render.File{Path: "/a", Content: b64([]byte{0, 1, 2}), Encoding: render.EncodingBase64}},
		{"Secret holding base64", cabpkv1.File{Path: "/a", ContentFrom: fromSecret, Encoding: cabpkv1.Base64}, []byte(b64([]byte("hi"))),
			render.File{Path: "/a", Content: b64([]byte("hi")), Encoding: render.EncodingBase64}},
		{"template without a control plane", cabpkv1.File{Path: "/a", ContentFormat: cabpkv1.FileContentFormatTemplate,
			Content: "{{ if .controlPlane }}{{ .controlPlane.version }}{{ else }}none{{ end }}"}, nil,
			render.File{Path: "/a", Content: "none"}},
		{"template from a Secret", cabpkv1.File{Path: "/a", ContentFrom: fromSecret, ContentFormat: cabpkv1.FileContentFormatTemplate},
			[]byte("{{ len . }} variables"), render.File{Path: "/a", Content: b64([]byte("0 variables")), Encoding: render.EncodingBase64}},
		{"Secret holding gzip", cabpkv1.File{Path: "/a", ContentFrom: fromSecret, Encoding: cabpkv1.Gzip}, gz.Bytes(),
			render.File{Path: "/a", Content: b64(gz.Bytes()), Encoding: render.EncodingGzipBase64}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &Reconciler{apiReader: secretReader{data: map[string][]byte{"k": tc.secret}}}
			got, err := r.resolveFiles(t.Context(), &bootstrapv1.KubeadmConfig{Spec: bootstrapv1.KubeadmConfigSpec{Files: []cabpkv1.File{tc.file}}}, &clusterv1.Cluster{})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0] != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	r := &Reconciler{}
	_, err := r.resolveFiles(t.Context(), &bootstrapv1.KubeadmConfig{Spec: bootstrapv1.KubeadmConfigSpec{Files: []cabpkv1.File{
		{Path: "/a", Content: b64([]byte("not gzip")), Encoding: cabpkv1.GzipBase64}}}}, &clusterv1.Cluster{})
	var se *specError
	if !errors.As(err, &se) {
		t.Fatalf("gzip+base64 that is not gzip: %v, want a spec error", err)
	}
	_, err = r.resolveFiles(t.Context(), &bootstrapv1.KubeadmConfig{Spec: bootstrapv1.KubeadmConfigSpec{Files: []cabpkv1.File{
		{Path: "/a", Content: "{{ .controlPlane.version", ContentFormat: cabpkv1.FileContentFormatTemplate}}}}, &clusterv1.Cluster{})
	if !errors.As(err, &se) {
		t.Fatalf("a broken template: %v, want a spec error", err)
	}
}
