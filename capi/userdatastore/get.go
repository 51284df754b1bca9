package userdatastore

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/minio/minio-go/v7"
)

// ErrObjectNotFound is returned by Get when no object is under the key
// (S3 error code NoSuchKey).
var ErrObjectNotFound = errors.New("no such object")

// maxGetSize bounds what Get reads: the objects it is for are small text
// files (the provider's base templates).
const maxGetSize = 1 << 20

// Get returns the object under key, at most 1 MiB, and its ETag. When
// etag is the object's current ETag it makes one HEAD request and returns
// (nil, etag, nil): the caller's copy is current. Errors wrap
// errEmptyKey, ErrObjectNotFound, ErrBucketNotFound, errAccessDenied, or
// the server's or transport's error.
func (s *Store) Get(ctx context.Context, key, etag string) ([]byte, string, error) {
	if key == "" {
		return nil, "", fmt.Errorf("getting an object: %w", errEmptyKey)
	}
	info, err := s.client.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
	if err != nil {
		return nil, "", s.wrapGet(key, err)
	}
	if etag != "" && info.ETag == etag {
		return nil, etag, nil
	}
	opts := minio.GetObjectOptions{}
	if err := opts.SetMatchETag(info.ETag); err != nil {
		return nil, "", err
	}
	obj, err := s.client.GetObject(ctx, s.bucket, key, opts)
	if err != nil {
		return nil, "", s.wrapGet(key, err)
	}
	defer obj.Close()
	data, err := io.ReadAll(io.LimitReader(obj, maxGetSize+1))
	if err != nil {
		return nil, "", s.wrapGet(key, err)
	}
	if len(data) > maxGetSize {
		return nil, "", fmt.Errorf("getting %s: larger than %d bytes", s.S3URI(key), maxGetSize)
	}
	return data, info.ETag, nil
}

func (s *Store) wrapGet(key string, err error) error {
	if s3Code(err) == minio.NoSuchKey {
		err = fmt.Errorf("%w: %w", ErrObjectNotFound, err)
	}
	return s.wrap("getting", key, err)
}
