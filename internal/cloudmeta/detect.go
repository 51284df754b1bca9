package cloudmeta

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
)

// probes are the clouds Detect asks, in the order its errors list them.
var probes = []struct {
	name  string
	probe func(ctx context.Context, base string) (Provider, error)
}{
	{"gce", probeGCE},
	{"aws", probeAWS},
	{"azure", probeAzure},
}

// Detect finds the cloud whose metadata service answers at base (empty
// means http://169.254.169.254). It asks the three at once, each with one
// request of at most 2 s: Compute Engine by the Metadata-Flavor: Google
// header on its answer, EC2 by granting an IMDSv2 token, Azure by its
// instance document in JSON for Metadata: true. Exactly one must answer as
// its cloud does; otherwise the error lists what each said.
func Detect(ctx context.Context, base string) (Provider, error) {
	b, err := parseBase(base)
	if err != nil {
		return nil, err
	}
	type result struct {
		p   Provider
		err error
	}
	results := make([]result, len(probes))
	var wg sync.WaitGroup
	for i, pr := range probes {
		wg.Go(func() {
			p, err := pr.probe(ctx, b)
			results[i] = result{p, err}
		})
	}
	wg.Wait()
	var found []Provider
	var said []string
	for i, r := range results {
		if r.err != nil {
			said = append(said, fmt.Sprintf("%s: %v", probes[i].name, r.err))
			continue
		}
		found = append(found, r.p)
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("detecting the cloud at %s: %w", b, err)
		}
		return nil, fmt.Errorf("no cloud's instance metadata service answers at %s: %s", b, strings.Join(said, "; "))
	}
	names := make([]string, len(found))
	for i, p := range found {
		names[i] = p.Name()
	}
	return nil, errors.New("more than one cloud's instance metadata service answers at " + b + ": " + strings.Join(names, ", "))
}
