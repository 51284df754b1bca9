package testenv

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/client-go/rest"
)

// APIRequests counts an API server's requests by "verb resource" or
// "verb resource/subresource" (its apiserver_request_total counter, all
// clients together), as ReadAPIRequests returns them.
type APIRequests map[string]float64

// ReadAPIRequests reads the API server's request counts from its /metrics,
// through c (a client of the API server allowed to get /metrics, such as
// Env.Config's). It reads the page (megabytes) a line at a time and keeps
// only its lines, so a benchmark reading it between measured windows adds
// little garbage to them.
func ReadAPIRequests(ctx context.Context, c rest.Interface) (APIRequests, error) {
	body, err := c.Get().AbsPath("/metrics").Stream(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's metrics: %w", err)
	}
	defer body.Close()
	counts := APIRequests{}
	lines := bufio.NewScanner(body)
	lines.Buffer(make([]byte, 64<<10), 1<<20)
	prefix := []byte("apiserver_request_total{")
	for lines.Scan() {
		if !bytes.HasPrefix(lines.Bytes(), prefix) {
			continue
		}
		line := lines.Text()
		labels, value, ok := strings.Cut(strings.TrimPrefix(line, string(prefix)), "} ")
		if !ok {
			continue
		}
		n, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("apiserver_request_total: %q: %w", line, err)
		}
		l := map[string]string{}
		for kv := range strings.SplitSeq(labels, ",") {
			k, v, _ := strings.Cut(kv, "=")
			l[k] = strings.Trim(v, `"`)
		}
		key := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		counts[key] += n
	}
	if err := lines.Err(); err != nil {
		return nil, fmt.Errorf("reading the API server's metrics: %w", err)
	}
	return counts, nil
}

// Add adds to r the requests made between before and after.
func (r APIRequests) Add(before, after APIRequests) {
	for k, n := range after {
		if d := n - before[k]; d > 0 {
			r[k] += d
		}
	}
}

// PerOp formats r divided by ops, most frequent first, leaving out what is
// under 0.01 per operation, and the total per operation.
func (r APIRequests) PerOp(ops int) string {
	keys := slices.SortedFunc(maps.Keys(r), func(a, b string) int { return cmp.Compare(r[b], r[a]) })
	var parts []string
	var total float64
	for _, k := range keys {
		total += r[k] / float64(ops)
		if r[k]/float64(ops) >= 0.01 {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, r[k]/float64(ops)))
		}
	}
	return strings.Join(parts, ", ") + fmt.Sprintf(" (total %.2f)", total)
}
