package userdatastore

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"

	ignition "github.com/coreos/ignition/v2/config/v3_5"
	"github.com/coreos/ignition/v2/config/v3_5/types"
)

// ignitionVersion is the Ignition specification version of IgnitionStub.
const ignitionVersion = "3.5.0"

// CloudConfigStub returns cloud-init user data that makes cloud-init fetch
// the full user data from u and process it as if it had been given
// directly: the "Include File" format, which begins with "#include" and
// lists URLs one per line (cloud-init documentation, "User-Data Formats";
// cloud-init's UserDataProcessor._do_include). The fetched data must itself
// be a format cloud-init recognises, e.g. begin with "#cloud-config" or
// "## template: jinja".
//
// The result is "#include\n<u>\n"; a CR or LF in u is percent-encoded so u
// stays one line. cloud-init fails the boot's user-data processing when the
// fetch fails (an answer other than 2xx, e.g. for an expired presigned URL).
// It keeps the processed data in its instance cache, so later boots do not
// fetch again unless the datasource re-reads its metadata. "#include-once",
// which would also copy the data to the machine's disk, is not used. u must
// not be nil; a presigned u is a bearer credential.
func CloudConfigStub(u *url.URL) []byte {
	line := strings.NewReplacer("\r", "%0D", "\n", "%0A").Replace(u.String())
	return []byte("#include\n" + line + "\n")
}

// IgnitionStub returns an Ignition v3.5.0 config (JSON) whose only content
// is ignition.config.replace.source = source: Ignition fetches the config
// at source and uses it instead of this one (Ignition configuration
// specification v3.5.0). source is an https:// presigned URL
// (PresignedGetURL) or an s3:// URI (S3URI; Ignition fetches it with the
// instance's AWS credentials); Ignition also accepts http, tftp, gs, arn
// and data URLs.
//
// The config is checked with coreos/ignition's own validator; an error
// names the problem (an empty source, an unsupported scheme).
//
// caPEM, when not empty, is a PEM CA certificate Ignition trusts for the
// fetch (ignition.security.tls.certificateAuthorities, as a data URL): the
// store's CA when it is not publicly trusted.
func IgnitionStub(source string, caPEM []byte) ([]byte, error) {
	if source == "" {
		return nil, errors.New("rendering the Ignition stub: empty source")
	}
	if u, err := url.Parse(source); err != nil || u.Scheme == "" {
		return nil, errors.New("rendering the Ignition stub: the source is not an absolute URL")
	}
	cfg := types.Config{Ignition: types.Ignition{
		Version: ignitionVersion,
		Config:  types.IgnitionConfig{Replace: types.Resource{Source: &source}},
	}}
	if len(caPEM) > 0 {
		ca := "data:;base64," + base64.StdEncoding.EncodeToString(caPEM)
		cfg.Ignition.Security.TLS.CertificateAuthorities = []types.Resource{{Source: &ca}}
	}
	out, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("rendering the Ignition stub: %w", err)
	}
	// The report locates problems by JSON path and never quotes the
	// source, which may be a presigned URL.
	if _, report, err := ignition.Parse(out); err != nil {
		return nil, fmt.Errorf("the Ignition stub is invalid: %w: %s", err, report.String())
	} else if report.IsFatal() {
		return nil, fmt.Errorf("the Ignition stub is invalid: %s", report.String())
	}
	return out, nil
}
