package render

import (
	"errors"
	"fmt"

	"github.com/coreos/butane/config"
	"github.com/coreos/butane/config/common"
	ignv3 "github.com/coreos/ignition/v2/config/v3_5"
	"github.com/coreos/ignition/v2/config/v3_5/types"
)

// ignitionVersion is the Ignition specification version rendered.
const ignitionVersion = "3.5.0"

// translateButane turns the Butane additions (YAML of any variant Butane
// knows, e.g. fcos 1.6.0) into an Ignition config of ignitionVersion, which
// renderIgnition merges over its own. An error names what Butane or
// Ignition's validator refused.
func translateButane(butane string) (types.Config, error) {
	out, report, err := config.TranslateBytes([]byte(butane), common.TranslateBytesOptions{})
	if err != nil {
		return types.Config{}, fmt.Errorf("translating the Butane additions: %w", err)
	}
	if report.IsFatal() {
		return types.Config{}, fmt.Errorf("translating the Butane additions: %s", report.String())
	}
	cfg, report2, err := ignv3.ParseCompatibleVersion(out)
	if err != nil {
		return types.Config{}, fmt.Errorf("the Butane additions translate to an Ignition version this renderer cannot merge (%w): use a Butane variant version producing Ignition %s or older", err, ignitionVersion)
	}
	if report2.IsFatal() {
		return types.Config{}, errors.New(report2.String())
	}
	return cfg, nil
}
