package components

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// ParseDataURL returns the bytes of a data URL (RFC 2397:
// "data:[<mediatype>][;base64],<data>"), percent-decoding the data unless it
// is base64. The media type is not interpreted.
func ParseDataURL(raw string) ([]byte, error) {
	rest, ok := strings.CutPrefix(raw, "data:")
	if !ok {
		return nil, errors.New("data URL: missing \"data:\" prefix")
	}
	meta, data, ok := strings.Cut(rest, ",")
	if !ok {
		return nil, errors.New("data URL: missing \",\" before the data (RFC 2397)")
	}
	if strings.HasSuffix(meta, ";base64") {
		// Padding and URL-safe variants both occur in the wild.
		unescaped, err := url.PathUnescape(data)
		if err != nil {
			return nil, fmt.Errorf("data URL: %w", err)
		}
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			if out, err := enc.DecodeString(unescaped); err == nil {
				return out, nil
			}
		}
		return nil, errors.New("data URL: the data is not valid base64")
	}
	out, err := url.PathUnescape(data)
	if err != nil {
		return nil, fmt.Errorf("data URL: %w", err)
	}
	return []byte(out), nil
}
