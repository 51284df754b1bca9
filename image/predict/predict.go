// Package predict predicts the TPM PCR values a unified kernel image (UKI)
// produces when a named platform's firmware boots it, each value with the
// events behind it and where each came from, and signs them for the image
// build (docs/image.md, docs/attestation.md "Signed reference values").
//
// What is predicted, for the SHA-256 bank:
//
//	PCR 4   the platform's events before the UKI (platform profile, pcr4.before),
//	        EV_EFI_BOOT_SERVICES_APPLICATION with the UKI's Authenticode SHA-256
//	        (TCG PC Client PFP §10.4.4), the boot chain's PCR 4 events (the
//	        kernel systemd-stub loads, when Secure Boot is off), pcr4.after
//	PCR 9   what the Linux EFI stub measures (EV_EVENT_TAG): its load options,
//	        the command line systemd-stub hands over, then the initrd
//	PCR 11  systemd-stub 252's UKI sections: per section of .linux, .osrel,
//	        .cmdline, .initrd, .splash, .dtb, .pcrpkey present, EV_IPL of the
//	        name with its NUL, then EV_IPL of its VirtualSize bytes
//	PCR 12, 13  zero: systemd-stub measured no load options, credentials or
//	        system extensions (so the .cmdline section was the command line)
//	PCRs 0-3, 5-7  the platform profile's values, when it has them
//
// The firmware's part is a platform profile (platforms/*.yaml, or a file
// `gatehouse image measure-platform` writes from a real boot's event log);
// the boot chain's part beyond systemd-stub's sections is a data table
// (bootchain.yaml) that a real boot's event log can correct.
package predict

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/signedvalues"
)

// stubMagic is what the .sdmagic section of the systemd-stub this package
// models starts with (src/boot/efi/stub.c, magic[]).
const stubMagic = "#### LoaderInfo: systemd-stub 252"

// prediction is what one UKI produces under one platform.
type prediction struct {
	// Values are the predicted PCRs (index → SHA-256 value), each with the
	// events behind it in extension order.
	Values measurements.M
	// Notes say what is not predicted or only assumed, and why.
	Notes []string
}

// predict returns the PCRs the UKI data (named name in sources, e.g.
// "uki-worker.efi") produces when platform's firmware boots it. Errors name
// what keeps a value from being predicted: not a UKI, a stub other than
// systemd-stub 252, sections systemd-stub would read ambiguously, a layout
// whose Authenticode hash is not well defined, an initrd systemd-stub would
// extend (.pcrsig, .pcrpkey).
func predict(name string, data []byte, platform Platform) (prediction, error) {
	chain, err := loadBootChain()
	if err != nil {
		return prediction{}, err
	}
	u, err := parseUKI(name, data)
	if err != nil {
		return prediction{}, err
	}
	stub := u.stub
	if !strings.HasPrefix(stub, stubMagic) {
		return prediction{}, fmt.Errorf("%s: its stub is %q, not systemd-stub 252 (Debian 12's systemd-boot-efi), whose measurements this prediction models", name, stub)
	}
	values := measurements.M{}
	events := map[uint32][]measurements.Event{
		4: append(slices.Clone(platform.pcr4Before), measurements.Event{
			Type: "EV_EFI_BOOT_SERVICES_APPLICATION", Description: name, Digest: u.authenticode,
			Source: fmt.Sprintf("%s Authenticode SHA-256 (saferwall/pe), loaded by the firmware from the boot option", name),
		}),
		9:  nil,
		11: u.pcr11Events(),
	}
	var assumed []string
	for _, e := range chain.Events {
		if !e.appliesTo(platform.secureBoot) {
			continue
		}
		if !e.Measured {
			assumed = append(assumed, fmt.Sprintf("PCR %d %s %q", e.PCR, e.Type, e.Description))
			continue
		}
		if e.DigestOf == "initrd" {
			if _, ok := u.sections[".initrd"]; !ok {
				continue // no initrd: the kernel loads and measures none
			}
			for _, extra := range []string{".pcrsig", ".pcrpkey"} {
				if _, ok := u.sections[extra]; ok {
					return prediction{}, fmt.Errorf("%s has a %s section, which systemd-stub 252 appends to the initrd as a cpio archive: the initrd the kernel measures into PCR %d is not predicted; build the UKI without it", name, extra, e.PCR)
				}
			}
		}
		digest, source, err := e.digest(u)
		if err != nil {
			return prediction{}, err
		}
		events[e.PCR] = append(events[e.PCR], measurements.Event{Type: e.Type, Description: e.Description, Digest: digest, Source: source})
	}
	events[4] = append(events[4], platform.pcr4After...)
	for index, evs := range events {
		values[index] = measurements.Measurement{Expected: replay(evs), Events: evs}
	}
	var untouched []string
	for _, z := range chain.Untouched {
		values[z.PCR] = measurements.Measurement{Expected: make([]byte, 32)}
		untouched = append(untouched, fmt.Sprint(z.PCR))
	}
	for _, index := range platform.pcrIndices() {
		values[index] = platform.pcrs[index]
	}
	p := prediction{Values: values, Notes: []string{
		fmt.Sprintf("platform %s (%s): %s", platform.name, platform.description, platform.source),
		fmt.Sprintf("stub %s; PCRs %s are expected zero (boot chain %s, image/predict/bootchain.yaml)", strings.Trim(stub, "# "), strings.Join(untouched, ", "), chain.Name),
	}}
	if missing := platform.missingPCRs(DefaultPlatformPCRs); len(missing) > 0 {
		what := "PCRs " + joinPCRs(missing) + " are"
		if len(missing) == 1 {
			what = "PCR " + joinPCRs(missing) + " is"
		}
		p.Notes = append(p.Notes, fmt.Sprintf("%s NOT predicted: platform profile %s has no measured values for them, so a policy made from these values "+
			"does not check the firmware; measure them from a real boot with gatehouse image measure-platform", what, platform.name))
	}
	if len(assumed) > 0 {
		p.Notes = append(p.Notes, fmt.Sprintf("assumed not measured (boot chain %s, image/predict/bootchain.yaml says why): %s", chain.Name, strings.Join(assumed, "; ")))
	}
	return p, nil
}

// joinPCRs formats PCR indices as "0, 1, 2".
func joinPCRs(pcrs []uint32) string {
	parts := make([]string, len(pcrs))
	for i, p := range pcrs {
		parts[i] = fmt.Sprint(p)
	}
	return strings.Join(parts, ", ")
}

// Build names what an image build produced, for ReferenceValues.
type Build struct {
	// Platform names the embedded platform profile, e.g. "qemu-ovmf".
	Platform string
	// PlatformFile, when set, is a platform profile file (gatehouse image
	// measure-platform's output) used instead of the embedded one; its name
	// must be Platform's when both are set.
	PlatformFile string
	// Image names the image.
	Image signedvalues.Image
	// UKIs are the paths of each role's UKI (one image, two UKIs that
	// differ in gatehouse.role= on the command line).
	UKIs map[policy.Role]string
}

// Output is what ReferenceValues returns.
type Output struct {
	// Values are the predicted values of each role.
	Values signedvalues.Values
	// Payload is the unsigned file (canonical JSON), what gatehouse image
	// sign-values signs.
	Payload []byte
	// Signed is the signed reference-value file (a DSSE envelope); nil
	// when no key was given.
	Signed []byte
}

// ReferenceValues predicts every role's UKI of a build under its platform
// and returns the values, the unsigned payload and, with keyPEM (a PEM
// Ed25519 or ECDSA P-256 private key, see signedvalues.ParsePrivateKey),
// the signed file. This is the one call an image build makes after
// building: it writes Payload and Signed next to the image. Errors name the
// UKI or the key that is wrong; they never contain key material.
func ReferenceValues(ctx context.Context, b Build, keyPEM []byte) (Output, error) {
	platform, err := loadPlatform(b.Platform, b.PlatformFile)
	if err != nil {
		return Output{}, err
	}
	if len(b.UKIs) == 0 {
		return Output{}, fmt.Errorf("no UKI given: name the UKI of %s and/or %s", policy.RoleControlPlane, policy.RoleWorker)
	}
	v := signedvalues.Values{Platform: platform.name, Image: b.Image, Roles: map[policy.Role]measurements.M{}}
	for _, role := range slices.Sorted(maps.Keys(b.UKIs)) {
		if err := ctx.Err(); err != nil {
			return Output{}, err
		}
		path := b.UKIs[role]
		data, err := os.ReadFile(path)
		if err != nil {
			return Output{}, fmt.Errorf("%s UKI: %w", role, err)
		}
		p, err := predict(filepath.Base(path), data, platform)
		if err != nil {
			return Output{}, fmt.Errorf("%s UKI: %w", role, err)
		}
		v.Roles[role] = p.Values
		for _, n := range p.Notes {
			if !slices.Contains(v.Notes, n) {
				v.Notes = append(v.Notes, n)
			}
		}
	}
	out := Output{Values: v}
	if out.Payload, err = v.Payload(); err != nil {
		return Output{}, err
	}
	if keyPEM == nil {
		return out, nil
	}
	key, err := signedvalues.ParsePrivateKey(keyPEM)
	if err != nil {
		return Output{}, err
	}
	if out.Signed, err = signedvalues.Sign(ctx, v, key); err != nil {
		return Output{}, err
	}
	return out, nil
}
