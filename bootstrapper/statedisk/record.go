package statedisk

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
)

// recordFile is the state disk's own record, at the root of its file
// system: when the disk's file system was made and how often it was
// opened since (docs/bootstrapper.md, "State disk").
const recordFile = "gatehouse-state.json"

// record is what the state disk says of its history. It holds no secret.
type record struct {
	// Created is when the disk's file system was made, and CreatedInBoot
	// the boot (/proc/sys/kernel/random/boot_id) that made it.
	Created       time.Time `json:"created"`
	CreatedInBoot string    `json:"createdInBoot"`
	// Opened counts the boots that opened the disk, this one included;
	// LastOpenedInBoot is the latest.
	Opened           int    `json:"opened"`
	LastOpenedInBoot string `json:"lastOpenedInBoot"`
}

// recordOpen reads the record at the root of the mounted state disk dir
// (a new one if there is none), counts this boot's opening unless it was
// counted already, and writes it back atomically.
func recordOpen(dir, bootID string, now time.Time) (record, error) {
	path := filepath.Join(dir, recordFile)
	var r record
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		r = record{Created: now.UTC(), CreatedInBoot: bootID}
	case err != nil:
		return record{}, fmt.Errorf("reading the state disk's record: %w", err)
	default:
		if err := json.Unmarshal(data, &r); err != nil {
			return record{}, fmt.Errorf("the state disk's record %s is damaged: %w", path, err)
		}
	}
	if r.LastOpenedInBoot == bootID {
		return r, nil
	}
	r.Opened++
	r.LastOpenedInBoot = bootID
	out, err := json.Marshal(r)
	if err != nil {
		return record{}, err
	}
	if err := atomicfile.Write(path, append(out, '\n'), 0o600); err != nil {
		return record{}, fmt.Errorf("writing the state disk's record: %w", err)
	}
	return r, nil
}

// bootID returns this boot's random ID (proc(5), boot_id).
func bootID() (string, error) {
	data, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("reading this boot's ID: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}
