package controller

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"text/template"

	"github.com/blang/semver/v4"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/external"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/render"
)

// What the spec's users and files take from elsewhere: Secrets
// (passwdFrom, contentFrom) and, for contentFormat Template, the control
// plane's version.

// resolveUsers reads each user's passwdFrom Secret into passwd, as CABPK
// does. Attested mode refuses it: its data carries no secrets.
func (r *Reconciler) resolveUsers(ctx context.Context, config *bootstrapv1.KubeadmConfig, spec *bootstrapv1.KubeadmConfigSpec) error {
	for i := range spec.Users {
		u := &spec.Users[i]
		if !u.PasswdFrom.IsDefined() {
			continue
		}
		if spec.Attested != nil && spec.Attested.Enabled {
			return specErrorf("user %s: attested mode carries no secrets: set passwd inline or drop passwdFrom", u.Name)
		}
		data, err := r.secretKey(ctx, config.Namespace, u.PasswdFrom.Secret.Name, u.PasswdFrom.Secret.Key, "user "+u.Name+": passwdFrom")
		if err != nil {
			return err
		}
		u.Passwd, u.PasswdFrom = string(data), cabpkv1.PasswdSource{}
	}
	return nil
}

// secretKey reads one key of a Secret in namespace ns that the spec names
// (what says where, for the condition's message).
func (r *Reconciler) secretKey(ctx context.Context, ns, name, key, what string) ([]byte, error) {
	sec := &corev1.Secret{}
	if err := r.apiReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, specErrorf("%s: Secret %s does not exist", what, name)
		}
		return nil, fmt.Errorf("%s: reading Secret %s: %w", what, name, err)
	}
	data, ok := sec.Data[key]
	if !ok {
		return nil, specErrorf("%s: Secret %s has no key %q", what, name, key)
	}
	return data, nil
}

// resolveFiles turns the spec's files into render files: Secret contents
// read, templates rendered, encodings checked. Gzip stays compressed in the data (cloud-init's
// gz+b64, Ignition's compression), so it shrinks the data as it does with
// CABPK.
func (r *Reconciler) resolveFiles(ctx context.Context, config *bootstrapv1.KubeadmConfig, cluster *clusterv1.Cluster) ([]render.File, error) {
	var out []render.File
	var data map[string]any // the templates' variables, read once
	for _, f := range config.Spec.Files {
		rf := render.File{Path: f.Path, Owner: f.Owner, Permissions: f.Permissions, Append: ptr.Deref(f.Append, false)}
		content := f.Content
		if src := f.ContentFrom.Secret; src.Name != "" {
			secret, err := r.secretKey(ctx, config.Namespace, src.Name, src.Key, "file "+f.Path+": contentFrom")
			if err != nil {
				return nil, err
			}
			content = string(secret)
		}
		if f.ContentFormat == cabpkv1.FileContentFormatTemplate {
			if data == nil {
				var err error
				if data, err = r.templateData(ctx, cluster); err != nil {
					return nil, err
				}
			}
			var err error
			if content, err = renderTemplate(f.Path, content, data); err != nil {
				return nil, specErrorf("file %s: contentFormat Template: %v", f.Path, err)
			}
		}
		if f.ContentFrom.IsDefined() && f.Encoding == "" {
			// Any bytes: carried as base64. Otherwise the encoding says how
			// the Secret holds the content, as in CABPK.
			rf.Content, rf.Encoding = base64.StdEncoding.EncodeToString([]byte(content)), render.EncodingBase64
			out = append(out, rf)
			continue
		}
		var err error
		if rf.Content, rf.Encoding, err = decodeContent(content, f.Encoding); err != nil {
			return nil, specErrorf("file %s: %v", f.Path, err)
		}
		out = append(out, rf)
	}
	return out, nil
}

// decodeContent checks content in its CABPK encoding and returns it in the
// render encoding that carries it unchanged: text, base64, or base64 of
// gzip.
func decodeContent(content string, encoding cabpkv1.Encoding) (string, render.Encoding, error) {
	switch encoding {
	case "":
		return content, render.EncodingNone, nil
	case cabpkv1.Base64:
		if _, err := base64.StdEncoding.DecodeString(content); err != nil {
			return "", "", fmt.Errorf("content is not base64: %w", err)
		}
		return content, render.EncodingBase64, nil
	case cabpkv1.GzipBase64:
		raw, err := base64.StdEncoding.DecodeString(content)
		if err != nil {
			return "", "", fmt.Errorf("content is not base64: %w", err)
		}
		return content, render.EncodingGzipBase64, checkGzip(raw)
	case cabpkv1.Gzip:
		return base64.StdEncoding.EncodeToString([]byte(content)), render.EncodingGzipBase64, checkGzip([]byte(content))
	default:
		return "", "", fmt.Errorf("unknown encoding %q", encoding)
	}
}

// checkGzip reads gzip data through to its checksum.
func checkGzip(raw []byte) error {
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("content is not gzip: %w", err)
	}
	if _, err := io.Copy(io.Discard, io.LimitReader(zr, 64<<20)); err != nil {
		return fmt.Errorf("content is not gzip: %w", err)
	}
	return nil
}

// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get
// +kubebuilder:rbac:groups=controlplane.cluster.x-k8s.io,resources=kubeadmcontrolplanes,verbs=get

// templateData is the variables of contentFormat Template files, as CABPK
// gives them: .controlPlane.version, the version of the Cluster's control
// plane (spec.version of its controlPlaneRef, "v"-prefixed semver), or no
// .controlPlane when the Cluster has no control plane reference or its
// object has no spec.version.
func (r *Reconciler) templateData(ctx context.Context, cluster *clusterv1.Cluster) (map[string]any, error) {
	data := map[string]any{}
	ref := cluster.Spec.ControlPlaneRef
	if !ref.IsDefined() {
		return data, nil
	}
	cp, err := external.GetObjectFromContractVersionedRef(ctx, r.apiReader, ref, cluster.Namespace)
	if err != nil {
		if apierrors.IsForbidden(errors.Unwrap(err)) || apierrors.IsForbidden(err) {
			return nil, specErrorf("contentFormat Template needs the control plane's version, and this provider may not read %s %s (it reads KubeadmControlPlanes): %v",
				ref.Kind, ref.Name, err)
		}
		return nil, fmt.Errorf("reading the control plane's version for contentFormat Template: %w", err)
	}
	version, ok, err := unstructured.NestedString(cp.Object, "spec", "version")
	if err != nil || !ok || version == "" {
		return data, nil //nolint:nilerr // no spec.version: no .controlPlane, as in CABPK
	}
	v, err := semver.ParseTolerant(version)
	if err != nil {
		return nil, specErrorf("contentFormat Template: the control plane's spec.version %q is not a version", version)
	}
	data["controlPlane"] = map[string]any{"version": "v" + v.String()}
	return data, nil
}

// maxTemplateOutput bounds one rendered template (CABPK's bound).
const maxTemplateOutput = 1 << 20

// renderTemplate executes content as a Go text/template over data.
func renderTemplate(name, content string, data map[string]any) (string, error) {
	tpl, err := template.New(name).Parse(content)
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	if err := tpl.Execute(&limitedWriter{w: &b, left: maxTemplateOutput}, data); err != nil {
		return "", err
	}
	return b.String(), nil
}

type limitedWriter struct {
	w    io.Writer
	left int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if len(p) > l.left {
		return 0, fmt.Errorf("the rendered content exceeds %d bytes", maxTemplateOutput)
	}
	l.left -= len(p)
	return l.w.Write(p)
}
