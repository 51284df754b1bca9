package choose

import (
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/collateral"
)

// CollateralPolicy says where a verifier gets the vendor's collateral.
type CollateralPolicy struct {
	// CacheDir holds fetched collateral (one file per URL); required.
	CacheDir string `json:"cacheDir"`
	// Offline: never fetch; serve only what CacheDir holds (fill it online
	// once). A CRL or TCB info past its next update is then refused.
	Offline bool `json:"offline,omitempty"`
	// CheckRevocations refuses certificates the vendor's CRLs revoke, and
	// evidence whose CRL cannot be had fresh.
	CheckRevocations bool `json:"checkRevocations"`
}

func (c *CollateralPolicy) cache(field string, now func() time.Time) (*collateral.Cache, error) {
	if strings.TrimSpace(c.CacheDir) == "" {
		return nil, fmt.Errorf("%s.cacheDir is empty: name a directory for fetched collateral", field)
	}
	cache := &collateral.Cache{Dir: c.CacheDir, Now: now}
	if !c.Offline {
		cache.Upstream = collateral.HTTP(nil)
	}
	return cache, nil
}

// hexField decodes a hex field of size bytes ("" gives nil).
func hexField(field, s string, size int) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%s is not hex: %w", field, err)
	}
	if len(b) != size {
		return nil, fmt.Errorf("%s has %d bytes, want %d", field, len(b), size)
	}
	return b, nil
}

// hexList decodes a list of hex fields of size bytes each.
func hexList(field string, in []string, size int) ([][]byte, error) {
	var out [][]byte
	for i, s := range in {
		b, err := hexField(fmt.Sprintf("%s[%d]", field, i), s, size)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}
