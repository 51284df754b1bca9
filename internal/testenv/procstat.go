package testenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// userHZ is the unit of /proc/<pid>/stat's CPU times (proc(5)).
const userHZ = 100

// ProcessCPU is the CPU time (user plus system) process pid has used, from
// /proc/<pid>/stat (proc(5): fields 14 and 15, in clock ticks).
func ProcessCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// Fields after the parenthesised command name start at field 3.
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// ProcessAlive reports whether process pid exists and is no zombie (a
// dead process its parent has not reaped yet: /proc/<pid>/stat's state,
// field 3, is Z; proc(5)).
func ProcessAlive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name, which may hold
	// spaces and parentheses itself.
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

// ProcessesCPU sums ProcessCPU over the named processes (as Env.PIDs
// returns them), failing the test when one cannot be read.
func ProcessesCPU(t testing.TB, pids map[string]int) time.Duration {
	t.Helper()
	var total time.Duration
	for name, pid := range pids {
		d, err := ProcessCPU(pid)
		if err != nil {
			t.Fatalf("CPU time of %s: %v", name, err)
		}
		total += d
	}
	return total
}

// ProcessPeakRSS is the peak resident set size (VmHWM) of process pid, in
// bytes, from /proc/<pid>/status.
func ProcessPeakRSS(pid int) (int64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status VmHWM %q: %w", pid, v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no VmHWM", pid)
}
