package build

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"strconv"
)

// squashfsArgs are mksquashfs's options for the root: zstd (fast to
// decompress, which a boot under emulation feels) in 1 MiB blocks, every
// time stamp (files and the superblock) set to epoch, and a new image
// (-noappend). mksquashfs 4.4 and later write the same image for the same
// tree and options (-reproducible is their default).
func squashfsArgs(tree, out string, epoch int64) []string {
	e := strconv.FormatInt(epoch, 10)
	return []string{tree, out, "-noappend", "-comp", "zstd", "-b", "1M", "-all-time", e, "-mkfs-time", e, "-no-progress", "-quiet"}
}

// verityBlockSize is dm-verity's data and hash block size in bytes.
const verityBlockSize = 4096

// verity is the dm-verity hash tree of the root.
type verity struct {
	// RootHash is the root hash (hex, 64 digits), Salt the salt (hex) and
	// UUID the hash superblock's UUID, both derived from the data.
	RootHash string `json:"rootHash"`
	Salt     string `json:"salt"`
	UUID     string `json:"uuid"`
	// HashAlgorithm and BlockSize are veritysetup's --hash and
	// --data-block-size/--hash-block-size.
	HashAlgorithm string `json:"hashAlgorithm"`
	BlockSize     int    `json:"blockSize"`
}

var rootHashLine = regexp.MustCompile(`(?m)^Root hash:\s+([0-9a-f]{64})\s*$`)

// formatVerity writes the dm-verity hash tree of data (a multiple of
// verityBlockSize bytes) to hashFile with veritysetup format (format 1,
// with a superblock, SHA-256). Salt and UUID are derived from the data's
// digest, so the same data gives the same hash tree and root hash.
func formatVerity(ctx context.Context, data, hashFile string) (*verity, error) {
	fi, err := os.Stat(data)
	if err != nil {
		return nil, err
	}
	if fi.Size()%verityBlockSize != 0 {
		return nil, fmt.Errorf("the root image is %d bytes, not a multiple of dm-verity's %d-byte blocks", fi.Size(), verityBlockSize)
	}
	sum, err := sha256File(data)
	if err != nil {
		return nil, err
	}
	digest, _ := hex.DecodeString(sum)
	salt := sha256.Sum256(append([]byte("gatehouse-image verity-salt "), digest...))
	v := &verity{Salt: hex.EncodeToString(salt[:]), UUID: derivedUUID(digest, "verity-superblock"), HashAlgorithm: "sha256", BlockSize: verityBlockSize}
	if err := os.Remove(hashFile); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	bs := strconv.Itoa(verityBlockSize)
	out, err := run(ctx, command{env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}}, "veritysetup", "format",
		"--hash="+v.HashAlgorithm, "--data-block-size="+bs, "--hash-block-size="+bs, "--salt="+v.Salt, "--uuid="+v.UUID,
		data, hashFile)
	if err != nil {
		return nil, err
	}
	m := rootHashLine.FindSubmatch(out)
	if m == nil {
		return nil, fmt.Errorf("veritysetup format printed no root hash: %s", tail(out, 1024))
	}
	v.RootHash = string(m[1])
	return v, nil
}
