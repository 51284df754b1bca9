// Package upgrade upgrades Gatehouse's cluster services (Helm releases of
// the embedded charts) safely: every CRD and custom resource is backed up
// first, each release is upgraded atomically (rolled back on failure) with
// the cluster's own values merged onto the new chart's defaults, chart
// versions may advance at most one minor version, and a dry run shows what
// would change. docs/upgrades.md describes it.
package upgrade

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/semver"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"

	"github.com/gatehouse-dev/gatehouse/internal/helm"
)

// Options configure Apply.
type Options struct {
	// Kubeconfig is the admin kubeconfig file.
	Kubeconfig string
	// Namespace holds the releases (charts.Namespace, gatehouse-system).
	Namespace string
	// Charts maps release name to the chart to upgrade it to.
	Charts map[string]*chart.Chart
	// Order is the order releases are upgraded in (keys of Charts).
	Order []string
	// BackupRoot is where gatehouse-upgrade/<timestamp>-<random>/backups is made.
	BackupRoot string
	// DryRun prints what would change and changes nothing.
	DryRun bool
	// Timeout bounds each release's upgrade, waiting included.
	Timeout time.Duration
	// Wait waits for the upgraded resources to be ready before a release
	// counts as upgraded; a failure then rolls it back too.
	Wait bool
	// Values are set over a release's own values, by release name: the
	// Kubernetes upgrade's join configuration (joinConfig.kubernetesVersion
	// and kubernetesComponents of the join service's release). Nested maps
	// merge key by key; anything else replaces. A release whose chart and
	// values already match is unchanged.
	Values map[string]map[string]any
	// KeepCharts upgrades values only: each installed release keeps its
	// deployed chart (Charts may be empty), e.g. a join policy change
	// before the Kubernetes roll, which must not bring a chart that needs
	// the new Kubernetes version early.
	KeepCharts bool
	// Out receives progress and the summary.
	Out io.Writer
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Result is what happened to one release.
type Result struct {
	Release  string
	From, To string
	// Outcome is "upgraded", "unchanged", "not installed", "would upgrade"
	// or "rolled back".
	Outcome string
	Err     error
}

// Apply upgrades every release in opts.Order and returns what happened to
// each. It stops at the first release it cannot upgrade; that one is
// rolled back and the ones after it are left alone. Running it again after
// an interruption is safe: a release left pending is rolled back to its
// last deployed revision first.
func Apply(ctx context.Context, opts Options) ([]Result, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	cfg, err := helm.Config(opts.Kubeconfig, opts.Namespace)
	if err != nil {
		return nil, err
	}
	plan, err := planReleases(cfg, opts)
	if err != nil {
		return nil, err
	}
	if !opts.DryRun && needsChange(plan) {
		dir, err := backup(ctx, opts.Kubeconfig, opts.BackupRoot, opts.Now())
		if err != nil {
			return nil, fmt.Errorf("backing up before the upgrade (nothing was changed): %w", err)
		}
		fmt.Fprintf(opts.Out, "Backed up every CRD and custom resource to %s\n", dir)
	}
	var results []Result
	for _, p := range plan {
		r := p.result
		if r.Outcome == "" {
			r = upgradeOne(ctx, cfg, opts, p)
		}
		results = append(results, r)
		fmt.Fprintf(opts.Out, "%s: %s\n", r.Release, describe(r))
		if r.Err != nil {
			return results, r.Err
		}
	}
	return results, nil
}

func describe(r Result) string {
	switch r.Outcome {
	case "upgraded", "would upgrade":
		return fmt.Sprintf("%s %s → %s", r.Outcome, r.From, r.To)
	case "unchanged":
		return "already at " + r.To
	case "rolled back":
		return fmt.Sprintf("upgrade %s → %s failed and was rolled back: %v", r.From, r.To, r.Err)
	default:
		return r.Outcome
	}
}

// planned is one release's deployed state and target.
type planned struct {
	name    string
	current *release.Release
	chart   *chart.Chart
	result  Result // set when nothing is to be done
}

func needsChange(plan []planned) bool {
	for _, p := range plan {
		if p.result.Outcome == "" {
			return true
		}
	}
	return false
}

// planReleases reads each release and checks the version step before
// anything changes.
func planReleases(cfg *action.Configuration, opts Options) ([]planned, error) {
	var plan []planned
	for _, name := range opts.Order {
		c := opts.Charts[name]
		p := planned{name: name, chart: c}
		rel, err := cfg.Releases.Last(name)
		switch {
		case errors.Is(err, driver.ErrReleaseNotFound):
			p.result = Result{Release: name, Outcome: "not installed"}
			if c != nil {
				p.result.To = c.Metadata.Version
			}
		case err != nil:
			return nil, fmt.Errorf("reading release %s: %w", name, err)
		default:
			p.current = rel
			if opts.KeepCharts {
				c, p.chart = rel.Chart, rel.Chart
			}
			from, to := rel.Chart.Metadata.Version, c.Metadata.Version
			if err := checkStep(from, to); err != nil {
				return nil, fmt.Errorf("release %s: %w", name, err)
			}
			if from == to && rel.Info.Status == release.StatusDeployed && !changesValues(rel.Config, opts.Values[name]) {
				p.result = Result{Release: name, From: from, To: to, Outcome: "unchanged"}
			}
		}
		plan = append(plan, p)
	}
	return plan, nil
}

// ReleaseValues returns the values the cluster set on release name (its
// last deployed revision's, not the chart's defaults): what Apply keeps.
// The release must be deployed.
func ReleaseValues(kubeconfig, namespace, name string) (map[string]any, error) {
	cfg, err := helm.Config(kubeconfig, namespace)
	if err != nil {
		return nil, err
	}
	rel, err := cfg.Releases.Deployed(name)
	if err != nil {
		return nil, fmt.Errorf("reading release %s in %s: %w", name, namespace, err)
	}
	return rel.Config, nil
}

// checkStep allows the same version, a patch, or one minor version
// forward within a major version; anything else is refused.
func checkStep(from, to string) error {
	f, t := "v"+strings.TrimPrefix(from, "v"), "v"+strings.TrimPrefix(to, "v")
	if !semver.IsValid(f) || !semver.IsValid(t) {
		return fmt.Errorf("chart versions %q → %q are not semantic versions", from, to)
	}
	if semver.Compare(t, f) < 0 {
		return fmt.Errorf("chart %s is older than the deployed %s: downgrades are not supported", to, from)
	}
	if semver.Major(f) != semver.Major(t) {
		return fmt.Errorf("chart %s changes the major version of the deployed %s: upgrade through each major version's notes", to, from)
	}
	minor := func(v string) int {
		n, _ := strconv.Atoi(strings.Split(semver.MajorMinor(v), ".")[1])
		return n
	}
	fm, tm := minor(f), minor(t)
	if tm-fm > 1 {
		return fmt.Errorf("chart %s skips %d minor versions after the deployed %s: upgrade one minor version at a time", to, tm-fm-1, from)
	}
	return nil
}

// upgradeOne upgrades p's release: the values the cluster set (not the
// computed ones of the old chart) are applied over the new chart's
// defaults, so new defaults take effect and the cluster's choices stay.
func upgradeOne(ctx context.Context, cfg *action.Configuration, opts Options, p planned) Result {
	r := Result{Release: p.name, From: p.current.Chart.Metadata.Version, To: p.chart.Metadata.Version}
	if p.current.Info.Status.IsPending() && opts.DryRun {
		// A dry run changes nothing, the interrupted revision included; Helm
		// would refuse to plan over it, so there is no diff to show.
		fmt.Fprintf(opts.Out, "%s: an earlier upgrade was interrupted (%s); the real run rolls back to the last deployed revision first, then upgrades\n", p.name, p.current.Info.Status)
		r.Outcome = "would roll back and upgrade"
		return r
	}
	if p.current.Info.Status.IsPending() {
		fmt.Fprintf(opts.Out, "%s: an earlier upgrade was interrupted (%s); rolling back to the last deployed revision first\n", p.name, p.current.Info.Status)
		if err := rollback(ctx, cfg, opts, p.name); err != nil {
			r.Outcome, r.Err = "rolled back", fmt.Errorf("recovering the interrupted release %s: %w", p.name, err)
			return r
		}
	}
	up := action.NewUpgrade(cfg)
	up.Namespace, up.Timeout, up.Wait, up.MaxHistory = opts.Namespace, opts.Timeout, opts.Wait, 10
	up.DryRun = opts.DryRun
	up.Description = "gatehouse upgrade apply"
	if opts.DryRun {
		rel, err := up.RunWithContext(ctx, p.name, p.chart, mergeValues(p.current.Config, opts.Values[p.name]))
		if err != nil {
			r.Outcome, r.Err = "would fail", fmt.Errorf("dry run of %s: %w", p.name, err)
			return r
		}
		fmt.Fprint(opts.Out, diff(p.current.Manifest, rel.Manifest))
		r.Outcome = "would upgrade"
		return r
	}
	fmt.Fprintf(opts.Out, "%s: upgrading %s → %s (timeout %s)\n", p.name, r.From, r.To, opts.Timeout)
	if _, err := up.RunWithContext(ctx, p.name, p.chart, mergeValues(p.current.Config, opts.Values[p.name])); err != nil {
		if rerr := rollback(context.WithoutCancel(ctx), cfg, opts, p.name); rerr != nil {
			r.Outcome, r.Err = "rolled back", fmt.Errorf("upgrading %s: %w; rolling back failed too: %w", p.name, err, rerr)
			return r
		}
		r.Outcome, r.Err = "rolled back", fmt.Errorf("upgrading %s: %w", p.name, err)
		return r
	}
	r.Outcome = "upgraded"
	return r
}

// rollback returns name to its last deployed revision.
func rollback(ctx context.Context, cfg *action.Configuration, opts Options, name string) error {
	deployed, err := cfg.Releases.Deployed(name)
	if err != nil {
		return fmt.Errorf("finding the last deployed revision: %w", err)
	}
	rb := action.NewRollback(cfg)
	rb.Version, rb.Timeout, rb.Wait, rb.MaxHistory = deployed.Version, opts.Timeout, opts.Wait, 10
	return rb.Run(name)
}

// changesValues says whether setting over on values changes them.
func changesValues(values, over map[string]any) bool {
	return len(over) > 0 && !reflect.DeepEqual(mergeValues(values, over), values)
}

// mergeValues returns a copy of values with over set on it: nested maps
// merge key by key, anything else replaces. Neither input changes.
func mergeValues(values, over map[string]any) map[string]any {
	out := make(map[string]any, len(values)+len(over))
	maps.Copy(out, values)
	for k, v := range over {
		sub, isMap := v.(map[string]any)
		have, hadMap := out[k].(map[string]any)
		if isMap && hadMap {
			out[k] = mergeValues(have, sub)
			continue
		}
		out[k] = v
	}
	return out
}
