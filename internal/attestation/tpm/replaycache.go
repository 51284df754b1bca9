package tpm

import (
	"bytes"
	"container/list"
	"hash/maphash"
	"slices"
	"sync"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// replayCacheBytes bounds the logs a replayCache keeps, in bytes: 4 MiB
// hold about 1 300 logs of the node image's OVMF boot (3 KiB) or 90 of a
// cloud VM with Secure Boot (45 KiB).
const replayCacheBytes = 4 << 20

// replayCache remembers the replays of TCG event logs it saw last, so
// that a log verified again against the same PCR values is not parsed
// again. Replaying is a pure function of the log and the PCR values, and
// an entry is found only for byte-equal logs and values, so a hit returns
// exactly what a replay would. Nodes booted from one image on one platform
// send byte-equal logs, and a node sends the same log every time it
// attests until it reboots: parsing is paid once per distinct log
// (docs/benchmarks.md, issue 35). It is safe for concurrent use.
type replayCache struct {
	seed maphash.Seed

	mu      sync.Mutex
	byHash  map[uint64]*list.Element // of *replayEntry
	recency *list.List               // most recently used first
	size    int                      // bytes of the logs held
}

// replayEntry is one remembered replay.
type replayEntry struct {
	hash   uint64
	log    []byte
	pcrs   []byte // the PCR values replayed to, concatenated in index order
	events []attestation.BootEvent
}

func newReplayCache() *replayCache {
	return &replayCache{seed: maphash.MakeSeed(), byHash: map[uint64]*list.Element{}, recency: list.New()}
}

// replay returns replayTCGEventLog(log, pcrs), from memory when it holds
// the replay of the same log to the same values of the PCRs order lists
// (the quoted selection, sorted). The events returned are shared with
// the cache and every result it served them to: read only.
func (c *replayCache) replay(log []byte, pcrs map[uint32][]byte, order []int) ([]attestation.BootEvent, error) {
	values := make([]byte, 0, 32*len(order))
	for _, index := range order {
		values = append(values, pcrs[uint32(index)]...)
	}
	var h maphash.Hash
	h.SetSeed(c.seed)
	_, _ = h.Write(log)
	_, _ = h.Write(values)
	hash := h.Sum64()

	c.mu.Lock()
	if elem, ok := c.byHash[hash]; ok {
		entry := elem.Value.(*replayEntry)
		if bytes.Equal(entry.log, log) && bytes.Equal(entry.pcrs, values) {
			c.recency.MoveToFront(elem)
			c.mu.Unlock()
			return entry.events, nil
		}
	}
	c.mu.Unlock()

	events, err := replayTCGEventLog(log, pcrs)
	if err != nil || len(log) > replayCacheBytes/4 {
		return events, err
	}
	// Clipped, so that appending to a result's events never writes into
	// another's.
	events = slices.Clip(events)
	entry := &replayEntry{hash: hash, log: slices.Clone(log), pcrs: values, events: events}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.byHash[hash]; ok {
		c.remove(old)
	}
	c.byHash[hash] = c.recency.PushFront(entry)
	c.size += len(entry.log)
	for c.size > replayCacheBytes {
		c.remove(c.recency.Back())
	}
	return events, nil
}

func (c *replayCache) remove(elem *list.Element) {
	entry := c.recency.Remove(elem).(*replayEntry)
	delete(c.byHash, entry.hash)
	c.size -= len(entry.log)
}
