package statedisk

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRecordOpen: the record made in the boot that made the file system
// is kept across boots; each boot counts once.
func TestRecordOpen(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	steps := []struct {
		boot        string
		wantOpened  int
		wantCreated string
	}{
		{boot: "boot-1", wantOpened: 1, wantCreated: "boot-1"},
		{boot: "boot-1", wantOpened: 1, wantCreated: "boot-1"}, // a rejoin in the same boot
		{boot: "boot-2", wantOpened: 2, wantCreated: "boot-1"},
		{boot: "boot-3", wantOpened: 3, wantCreated: "boot-1"},
	}
	for i, s := range steps {
		r, err := recordOpen(dir, s.boot, t0.Add(time.Duration(i)*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if r.Opened != s.wantOpened || r.CreatedInBoot != s.wantCreated || r.LastOpenedInBoot != s.boot || !r.Created.Equal(t0) {
			t.Errorf("step %d: %+v, want opened %d, created in %s at %s", i, r, s.wantOpened, s.wantCreated, t0)
		}
	}
	info, err := os.Stat(filepath.Join(dir, recordFile))
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("record mode %v, want 0600", info.Mode().Perm())
	}
}

func TestRecordOpenDamaged(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, recordFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := recordOpen(dir, "boot-1", time.Now()); err == nil || !strings.Contains(err.Error(), "is damaged") {
		t.Fatalf("damaged record: %v", err)
	}
}
