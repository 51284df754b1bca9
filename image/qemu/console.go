package qemu

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Line is one line the guest wrote to its serial console.
type Line struct {
	// Boot counts the VM's boots: 0 for the one Start began, one more for
	// each reset (Reset, or the guest rebooting).
	Boot int
	// At is when the runner read the line, measured from the start of its
	// boot (QEMU's start, or the reset).
	At time.Duration
	// Text is the line without its line end, terminal control sequences
	// and other control characters (the firmware clears the screen).
	Text string
}

// Limits that keep a chatty or hostile guest from filling the runner's
// memory; the console file keeps everything.
const (
	maxLineBytes = 64 << 10 // a longer line is split
	maxLines     = 50000    // older lines are dropped from memory
)

// console follows the console file QEMU writes the guest's serial port to
// and splits it into Lines, attributing each to its boot by the file offset
// at which the boot began.
type console struct {
	file    *os.File
	onLines func([]Line)

	mu         sync.Mutex
	lines      []Line
	first      int   // index of lines[0] among all lines read
	offset     int64 // bytes of the file consumed
	partial    []byte
	boundaries []int64     // boundaries[i]: offset at which boot i+1 began
	bootStarts []time.Time // bootStarts[i]: when boot i began
	changed    chan struct{}
	ended      bool
}

// newConsole follows path (which QEMU creates; it is created here if
// missing so the first read finds it) from offset 0, boot 0 beginning at
// start. onLines, if set, is called with each batch of new lines on the
// goroutine calling poll.
func newConsole(path string, start time.Time, onLines func([]Line)) (*console, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the console log: %w", err)
	}
	return &console{file: f, onLines: onLines, bootStarts: []time.Time{start}, changed: make(chan struct{})}, nil
}

// newBoot records that a boot began at offset of the file, at time at,
// and returns its number. Bytes already read past offset stay with the
// boot before (a boot the guest began is only known after the fact).
func (c *console) newBoot(offset int64, at time.Time) int {
	c.mu.Lock()
	offset = max(offset, c.offset)
	if len(c.boundaries) > 0 {
		offset = max(offset, c.boundaries[len(c.boundaries)-1])
	}
	var flushed []Line
	if offset == c.offset && len(c.partial) > 0 {
		flushed = append(flushed, c.flush(c.bootAt(c.offset-1), at))
	}
	c.boundaries = append(c.boundaries, offset)
	c.bootStarts = append(c.bootStarts, at)
	c.notify()
	boot := len(c.boundaries)
	c.mu.Unlock()
	if len(flushed) > 0 && c.onLines != nil {
		c.onLines(flushed)
	}
	return boot
}

// size returns the console file's current size.
func (c *console) size() (int64, error) {
	info, err := c.file.Stat()
	if err != nil {
		return 0, err
	}
	return info.Size(), nil
}

// poll reads what the guest wrote since the last poll.
func (c *console) poll() error {
	buf := make([]byte, 64<<10)
	var added []Line
	for {
		c.mu.Lock()
		n, err := c.file.ReadAt(buf, c.offset)
		if n > 0 {
			added = append(added, c.consume(buf[:n], time.Now())...)
		}
		c.mu.Unlock()
		if err == io.EOF || n == 0 {
			break
		}
		if err != nil {
			return fmt.Errorf("reading the console log: %w", err)
		}
	}
	if len(added) > 0 && c.onLines != nil {
		c.onLines(added)
	}
	return nil
}

// consume splits data (read at c.offset) into lines; c.mu is held.
func (c *console) consume(data []byte, now time.Time) []Line {
	var added []Line
	for len(data) > 0 {
		// A boot boundary inside data ends the previous boot's last line.
		chunk := data
		boot := c.bootAt(c.offset)
		if boot < len(c.boundaries) {
			if next := c.boundaries[boot]; next-c.offset < int64(len(chunk)) {
				chunk = chunk[:next-c.offset]
			}
		}
		for len(chunk) > 0 {
			i := bytes.IndexByte(chunk, '\n')
			if i < 0 {
				c.partial = append(c.partial, chunk...)
				c.offset += int64(len(chunk))
				data = data[len(chunk):]
				chunk = nil
				if len(c.partial) >= maxLineBytes {
					added = append(added, c.flush(boot, now))
				}
				break
			}
			c.partial = append(c.partial, chunk[:i]...)
			c.offset += int64(i + 1)
			data, chunk = data[i+1:], chunk[i+1:]
			added = append(added, c.flush(boot, now))
		}
		if boot < len(c.boundaries) && c.offset == c.boundaries[boot] && len(c.partial) > 0 {
			added = append(added, c.flush(boot, now))
		}
	}
	if len(added) > 0 {
		c.notify()
	}
	return added
}

// bootAt returns the boot that wrote the byte at offset; c.mu is held.
func (c *console) bootAt(offset int64) int {
	boot := 0
	for boot < len(c.boundaries) && offset >= c.boundaries[boot] {
		boot++
	}
	return boot
}

// flush makes the partial line a Line of boot; c.mu is held.
func (c *console) flush(boot int, now time.Time) Line {
	l := Line{Boot: boot, At: now.Sub(c.bootStarts[boot]), Text: cleanText(c.partial)}
	c.partial = c.partial[:0]
	c.lines = append(c.lines, l)
	if len(c.lines) > maxLines {
		drop := len(c.lines) - maxLines
		c.lines = append([]Line(nil), c.lines[drop:]...)
		c.first += drop
	}
	return l
}

// notify wakes the waiters of lines; c.mu is held.
func (c *console) notify() {
	if !c.ended {
		close(c.changed)
		c.changed = make(chan struct{})
	}
}

// end reads the rest of the file, makes a last partial line a Line and
// wakes the waiters for good.
func (c *console) end() {
	_ = c.poll()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.partial) > 0 {
		c.flush(c.bootAt(c.offset-1), time.Now())
	}
	if !c.ended {
		c.ended = true
		close(c.changed)
	}
	_ = c.file.Close()
}

// since returns the lines from index from on (index counts every line
// read; lines dropped from memory are skipped), the index after them, the
// current boot, whether the console ended (no line will follow), and a
// channel that closes when more lines or a new boot come (or, once the
// console ended, is closed already).
func (c *console) since(from int) (lines []Line, next, boot int, ended bool, more <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	from = max(from-c.first, 0)
	if from < len(c.lines) {
		lines = append(lines, c.lines[from:]...)
	}
	return lines, c.first + len(c.lines), len(c.boundaries), c.ended, c.changed
}

// cleanText removes a carriage return, ANSI escape sequences (CSI, e.g.
// "ESC[2J", and two-byte ones) and other control characters but tab.
func cleanText(b []byte) string {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		switch ch := b[i]; {
		case ch == 0x1b:
			if i+1 < len(b) && b[i+1] == '[' {
				// CSI: parameters and intermediates up to a final byte 0x40–0x7e.
				i += 2
				for i < len(b) && (b[i] < 0x40 || b[i] > 0x7e) {
					i++
				}
			} else {
				i++
			}
		case ch < 0x20 && ch != '\t', ch == 0x7f:
		default:
			out = append(out, ch)
		}
	}
	return string(out)
}
