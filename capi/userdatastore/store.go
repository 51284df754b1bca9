// Package userdatastore keeps a Machine's bootstrap data in an S3-compatible
// bucket, for data too large for the cloud's user-data limit: the
// bootstrap provider uploads the full data with Put, and the data Secret
// holds only a stub (CloudConfigStub, IgnitionStub) that makes cloud-init or
// Ignition fetch it, through a presigned GET URL (PresignedGetURL) or, for
// Ignition on AWS with instance credentials, an s3:// URI (S3URI).
//
// The client is minio-go (Amazon S3 REST API, signature V4); it works with
// Amazon S3 and with S3-compatible servers such as MinIO. Buckets are never
// created here: they belong to the operator, with their lifecycle and
// access policies.
package userdatastore

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/encrypt"
	"github.com/minio/minio-go/v7/pkg/s3utils"
	"k8s.io/apimachinery/pkg/types"
)

// Errors returned, wrapped with the operation and the object's s3:// URI;
// test with errors.Is.
var (
	// errInvalidConfig is returned by New for a configuration it cannot use.
	errInvalidConfig = errors.New("invalid user-data store configuration")
	// errEmptyKey is returned for an empty object key.
	errEmptyKey = errors.New("empty object key")
	// errNilData is returned by Put for nil data.
	errNilData = errors.New("nil data")
	// errTTLOutOfRange is returned by PresignedGetURL for a TTL outside
	// minTTL..maxTTL.
	errTTLOutOfRange = errors.New("presigned URL TTL out of range")
	// ErrBucketNotFound is returned when the bucket does not exist (S3 error
	// code NoSuchBucket).
	ErrBucketNotFound = errors.New("bucket does not exist")
	// errAccessDenied is returned when the server rejects the credentials or
	// the request (S3 error codes InvalidAccessKeyId, SignatureDoesNotMatch,
	// AccessDenied).
	errAccessDenied = errors.New("access denied")
)

// Bounds of a presigned URL's lifetime: AWS signature V4 query
// authentication takes X-Amz-Expires in whole seconds from 1 to 604800
// (Amazon S3 API reference, "Authenticating Requests: Using Query
// Parameters").
const (
	minTTL = time.Second
	maxTTL = 7 * 24 * time.Hour
)

// minSecretLength is the shortest secret access key New accepts: MinIO
// takes 8 to 40 characters, AWS issues 40. (A shorter secret would also
// make the redaction of errors, which replaces every occurrence of the
// secret, mangle them.)
const minSecretLength = 8

// contentType is the Content-Type objects are stored with.
const contentType = "application/octet-stream"

// maxRetries bounds minio-go's own retries of one request (it defaults to
// 10): the controller's requeue is the outer retry, and a reconcile should
// not block on a dead endpoint.
const maxRetries = 3

// Config of one bucket.
type Config struct {
	// Endpoint is host[:port] of the S3 API, without a scheme or path:
	// "s3.eu-central-1.amazonaws.com", "minio.example.com:9000".
	Endpoint string
	// Bucket must exist; it is never created. Names follow the S3 bucket
	// naming rules (3-63 characters, lower case, digits, '.', '-').
	Bucket string
	// Region is optional. Empty makes the store ask the server for the
	// bucket's location before its first request (GetBucketLocation, then
	// cached); set, PresignedGetURL makes no request at all.
	Region string
	// AccessKeyID and SecretAccessKey authenticate (signature V4); both are
	// required, the secret with at least minSecretLength characters. The
	// secret never appears in errors, String or LogValue.
	AccessKeyID, SecretAccessKey string
	// Insecure speaks plain HTTP, and presigned URLs are http:// URLs
	// whose signature anyone on the path can reuse until it expires: tests
	// and development only. Default is HTTPS.
	Insecure bool
	// RootCAs verifies the server's certificate; nil is the system pool.
	RootCAs *x509.CertPool
	// ServerSideEncryption stores objects with SSE-S3 (header
	// x-amz-server-side-encryption: AES256; on MinIO it needs a KMS).
	ServerSideEncryption bool
}

// String describes c without its secret access key, for logs and %v.
func (c Config) String() string {
	return fmt.Sprintf("{Endpoint:%s Bucket:%s Region:%s AccessKeyID:%s SecretAccessKey:[REDACTED] Insecure:%t ServerSideEncryption:%t}",
		c.Endpoint, c.Bucket, c.Region, c.AccessKeyID, c.Insecure, c.ServerSideEncryption)
}

// GoString is String, for %#v.
func (c Config) GoString() string { return c.String() }

// LogValue is c for log/slog, without its secret access key.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("endpoint", c.Endpoint), slog.String("bucket", c.Bucket), slog.String("region", c.Region),
		slog.String("accessKeyID", c.AccessKeyID), slog.Bool("insecure", c.Insecure), slog.Bool("serverSideEncryption", c.ServerSideEncryption))
}

// Store puts, presigns and deletes objects in one bucket. It is safe for
// concurrent use.
type Store struct {
	client   *minio.Client
	endpoint string
	bucket   string
	insecure bool
	sse      bool
	secret   string // only to redact it from errors
}

// New validates cfg and returns its Store. It makes no request: a missing
// bucket or wrong credentials show in the first Put. Errors wrap
// errInvalidConfig.
func New(cfg Config) (*Store, error) {
	if err := validate(cfg); err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalidConfig, err)
	}
	transport, err := minio.DefaultTransport(!cfg.Insecure)
	if err != nil {
		return nil, fmt.Errorf("%w: building the HTTP transport: %w", errInvalidConfig, err)
	}
	if cfg.RootCAs != nil {
		transport.TLSClientConfig.RootCAs = cfg.RootCAs
	}
	client, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:      credentials.NewStaticV4(cfg.AccessKeyID, cfg.SecretAccessKey, ""),
		Secure:     !cfg.Insecure,
		Transport:  transport,
		Region:     cfg.Region,
		MaxRetries: maxRetries,
	})
	if err != nil {
		return nil, redact(fmt.Errorf("%w: endpoint %q: %w", errInvalidConfig, cfg.Endpoint, err), cfg.SecretAccessKey)
	}
	return &Store{
		client:   client,
		endpoint: cfg.Endpoint,
		bucket:   cfg.Bucket,
		insecure: cfg.Insecure,
		sse:      cfg.ServerSideEncryption,
		secret:   cfg.SecretAccessKey,
	}, nil
}

func validate(cfg Config) error {
	switch {
	case cfg.Endpoint == "":
		return errors.New("no endpoint")
	case strings.Contains(cfg.Endpoint, "://"):
		return fmt.Errorf("endpoint %q has a scheme: give host[:port] and set Insecure for plain HTTP", cfg.Endpoint)
	case strings.ContainsAny(cfg.Endpoint, "/?#"):
		return fmt.Errorf("endpoint %q has a path: give host[:port]", cfg.Endpoint)
	case cfg.AccessKeyID == "" || cfg.SecretAccessKey == "":
		return errors.New("no access key ID or secret access key")
	case len(cfg.SecretAccessKey) < minSecretLength:
		return fmt.Errorf("the secret access key is shorter than %d characters", minSecretLength)
	case cfg.Insecure && cfg.RootCAs != nil:
		return errors.New("RootCAs is set but Insecure turns TLS off")
	}
	if err := s3utils.CheckValidBucketNameStrict(cfg.Bucket); err != nil {
		return fmt.Errorf("bucket %q: %w", cfg.Bucket, err)
	}
	return nil
}

// keyPrefix starts every key ObjectKey returns.
const keyPrefix = "gatehouse/bootstrap-data/"

// ObjectKey returns the object key of the bootstrap data of one
// bootstrap config object (a KubeadmConfig, one per Machine):
// "gatehouse/bootstrap-data/<namespace>/<configName>-<uid>". It is
// deterministic, so a reconcile that repeats overwrites its own object,
// and the UID keeps a recreated config of the same name from reusing it.
//
// Each part is escaped with url.PathEscape: Kubernetes names (DNS labels
// and subdomains) and UIDs pass unchanged, while a '/' or '%' in a part
// could not move the key into another namespace's prefix. A UID is a
// fixed-length UUID, so the name-UID split is unambiguous.
func ObjectKey(namespace, configName string, uid types.UID) string {
	return keyPrefix + url.PathEscape(namespace) + "/" + url.PathEscape(configName) + "-" + url.PathEscape(string(uid))
}

// S3URI returns "s3://<bucket>/<key>", the form Ignition fetches with the
// machine's own AWS credentials.
func (s *Store) S3URI(key string) string {
	return "s3://" + s.bucket + "/" + key
}

// Put stores data (length in bytes, any size) under key with Content-Type
// application/octet-stream, and with SSE-S3 when configured, replacing an
// object already there. Errors wrap errEmptyKey, errNilData,
// ErrBucketNotFound (the bucket is never created), errAccessDenied, or the
// server's or transport's error.
func (s *Store) Put(ctx context.Context, key string, data []byte) error {
	if key == "" {
		return fmt.Errorf("putting bootstrap data: %w", errEmptyKey)
	}
	if data == nil {
		return fmt.Errorf("putting bootstrap data to %s: %w", s.S3URI(key), errNilData)
	}
	opts := minio.PutObjectOptions{ContentType: contentType}
	if s.sse {
		opts.ServerSideEncryption = encrypt.NewSSE()
	}
	if _, err := s.client.PutObject(ctx, s.bucket, key, bytes.NewReader(data), int64(len(data)), opts); err != nil {
		return s.wrap("putting bootstrap data to", key, err)
	}
	return nil
}

// PresignedGetURL returns a URL that GETs the object under key without
// credentials until ttl (minTTL..maxTTL, truncated to whole seconds) has
// passed: https, or http when the store is Insecure. It does not check
// that the object exists. With no Region configured the first call asks the
// server for the bucket's location.
//
// The URL is a bearer credential for the data until it expires: keep it
// out of logs, events and conditions. Errors wrap errEmptyKey,
// errTTLOutOfRange, or the location lookup's error.
func (s *Store) PresignedGetURL(ctx context.Context, key string, ttl time.Duration) (*url.URL, error) {
	if key == "" {
		return nil, fmt.Errorf("presigning a GET: %w", errEmptyKey)
	}
	if ttl < minTTL || ttl > maxTTL {
		return nil, fmt.Errorf("presigning a GET of %s: %w: %v is not within %v..%v", s.S3URI(key), errTTLOutOfRange, ttl, minTTL, maxTTL)
	}
	u, err := s.client.PresignedGetObject(ctx, s.bucket, key, ttl.Truncate(time.Second), nil)
	if err != nil {
		return nil, s.wrap("presigning a GET of", key, err)
	}
	if want := s.scheme(); u.Scheme != want {
		return nil, fmt.Errorf("presigning a GET of %s: the URL's scheme is %q, not %q", s.S3URI(key), u.Scheme, want)
	}
	return u, nil
}

// Delete removes the object under key. A missing object is not an error
// (S3 DeleteObject answers 204 for it); a missing bucket is
// (ErrBucketNotFound). Errors wrap errEmptyKey, ErrBucketNotFound,
// errAccessDenied, or the server's or transport's error.
func (s *Store) Delete(ctx context.Context, key string) error {
	if key == "" {
		return fmt.Errorf("deleting bootstrap data: %w", errEmptyKey)
	}
	err := s.client.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{})
	if err != nil && s3Code(err) != minio.NoSuchKey {
		return s.wrap("deleting bootstrap data at", key, err)
	}
	return nil
}

func (s *Store) scheme() string {
	if s.insecure {
		return "http"
	}
	return "https"
}

// wrap adds the operation, the object and a sentinel for the S3 error codes
// callers act on, and redacts the secret access key.
func (s *Store) wrap(op, key string, err error) error {
	switch s3Code(err) {
	case minio.NoSuchBucket:
		err = fmt.Errorf("%w: %q at %s: %w", ErrBucketNotFound, s.bucket, s.endpoint, err)
	case minio.InvalidAccessKeyID, minio.SignatureDoesNotMatch, minio.AccessDenied:
		err = fmt.Errorf("%w: %w", errAccessDenied, err)
	}
	return redact(fmt.Errorf("%s %s: %w", op, s.S3URI(key), err), s.secret)
}

// s3Code returns the S3 error code in err's chain, or "".
func s3Code(err error) string {
	var resp minio.ErrorResponse
	if errors.As(err, &resp) {
		return resp.Code
	}
	return ""
}

// sentinels are the errors a redacted error still matches with errors.Is.
var sentinels = []error{errInvalidConfig, ErrBucketNotFound, errAccessDenied, ErrObjectNotFound}

// redact returns err, or, should its message contain secret, an error with
// the secret replaced that matches only this package's sentinels: the
// original chain holds the secret and is dropped.
func redact(err error, secret string) error {
	if err == nil || secret == "" || !strings.Contains(err.Error(), secret) {
		return err
	}
	r := &redactedError{msg: strings.ReplaceAll(err.Error(), secret, "[REDACTED]")}
	for _, s := range sentinels {
		if errors.Is(err, s) {
			r.sentinels = append(r.sentinels, s)
		}
	}
	return r
}

type redactedError struct {
	msg       string
	sentinels []error
}

func (e *redactedError) Error() string   { return e.msg }
func (e *redactedError) Unwrap() []error { return e.sentinels }
