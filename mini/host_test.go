package mini

import (
	"strings"
	"testing"
)

// TestCheckPrerequisitesNamesWhatIsMissing: with nothing on PATH, every
// missing program is named with the package that provides it.
func TestCheckPrerequisitesNamesWhatIsMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := CheckPrerequisites()
	if err == nil {
		t.Fatal("no prerequisite reported missing with an empty PATH")
	}
	for _, want := range []string{
		"containerd missing: apt-get install containerd",
		"swtpm missing: apt-get install swtpm swtpm-tools",
		"cryptsetup missing: apt-get install cryptsetup-bin",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}
