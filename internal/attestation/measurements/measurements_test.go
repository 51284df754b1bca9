package measurements

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
)

var (
	h32a = strings.Repeat("aa", 32)
	h32b = strings.Repeat("bb", 32)
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		size    int
		want    M
		wantErr string
	}{
		{
			name: "yaml with warn-only index",
			in:   "4: {expected: " + h32a + "}\n15: {expected: " + h32b + ", warnOnly: true}\n",
			size: 32,
			want: M{4: {Expected: bytes.Repeat([]byte{0xaa}, 32)}, 15: {Expected: bytes.Repeat([]byte{0xbb}, 32), WarnOnly: true}},
		},
		{
			name: "json",
			in:   `{"7": {"expected": "` + h32a + `", "warnOnly": false}}`,
			size: 32,
			want: M{7: {Expected: bytes.Repeat([]byte{0xaa}, 32)}},
		},
		{
			name: "further accepted values",
			in:   "4: {expected: " + h32a + ", alsoAccepted: [" + h32b + "]}\n",
			size: 32,
			want: M{4: {Expected: bytes.Repeat([]byte{0xaa}, 32), AlsoAccepted: [][]byte{bytes.Repeat([]byte{0xbb}, 32)}}},
		},
		{
			name: "expected events",
			in:   "11: {expected: " + h32a + ", events: [{type: EV_IPL, description: .cmdline, digest: " + h32b + ", source: uki.efi}]}\n",
			size: 32,
			want: M{11: {Expected: bytes.Repeat([]byte{0xaa}, 32), Events: []Event{{Type: "EV_IPL", Description: ".cmdline", Digest: bytes.Repeat([]byte{0xbb}, 32), Source: "uki.efi"}}}},
		},
		{name: "an event without a type is refused", in: "11: {expected: " + h32a + ", events: [{description: x, digest: " + h32b + "}]}", size: 32, wantErr: "index 11: events[0] has no type"},
		{name: "an event digest of the wrong size is refused", in: "11: {expected: " + h32a + ", events: [{type: EV_IPL, description: .linux, digest: aabb}]}", size: 32, wantErr: `index 11: events[0] (EV_IPL ".linux"): digest has 2 bytes, want 32`},
		{name: "an event digest that is not hex is refused", in: "11: {expected: " + h32a + ", events: [{type: EV_IPL, digest: xyz}]}", size: 32, wantErr: "digest is not hex"},
		{name: "an unknown event field is refused", in: "11: {expected: " + h32a + ", events: [{type: EV_IPL, digest: " + h32b + ", pcr: 4}]}", size: 32, wantErr: `unknown field "pcr"`},
		{name: "a further value that is not hex is refused", in: "4: {expected: " + h32a + ", alsoAccepted: [" + h32b + ", xyz]}", size: 32, wantErr: "index 4: alsoAccepted[1] is not hex"},
		{name: "a further value of the wrong size is refused", in: "4: {expected: " + h32a + ", alsoAccepted: [aabb]}", size: 32, wantErr: "index 4: alsoAccepted[0] has 2 bytes, want 32"},
		{name: "unknown field is refused", in: "4: {expected: " + h32a + ", warnonly: true}", size: 32, wantErr: `unknown field "warnonly"`},
		{name: "non-numeric index is refused", in: "pcr4: {expected: " + h32a + "}", size: 32, wantErr: `index "pcr4" is not a decimal integer`},
		{name: "negative index is refused", in: "-1: {expected: " + h32a + "}", size: 32, wantErr: `index "-1" is not a decimal integer`},
		{name: "missing expected is refused", in: "4: {warnOnly: true}", size: 32, wantErr: "index 4 has no expected value"},
		{name: "non-hex value is refused", in: "4: {expected: xyz}", size: 32, wantErr: "index 4: expected value is not hex"},
		{name: "wrong size is refused", in: "4: {expected: aabb}", size: 32, wantErr: "index 4: expected value has 2 bytes, want 32"},
		{name: "empty value is refused", in: `4: {expected: ""}`, size: 0, wantErr: "index 4: expected value has 0 bytes"},
		{name: "empty file is refused", in: "", size: 32, wantErr: "none given"},
		{name: "not a map is refused", in: "[1, 2]", size: 32, wantErr: "want a map of index to"},
		{name: "oversized file is refused", in: strings.Repeat(" ", maxFileSize+1), size: 32, wantErr: "at most 1048576 allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.in), tt.size)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d indices, want %d", len(got), len(tt.want))
			}
			for i, w := range tt.want {
				if !bytes.Equal(got[i].Expected, w.Expected) || got[i].WarnOnly != w.WarnOnly || !slices.EqualFunc(got[i].AlsoAccepted, w.AlsoAccepted, bytes.Equal) || !slices.EqualFunc(got[i].Events, w.Events, equalEvent) {
					t.Errorf("index %d: got %+v, want %+v", i, got[i], w)
				}
			}
		})
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	m := M{0: {Expected: bytes.Repeat([]byte{1}, 32)}, 23: {Expected: bytes.Repeat([]byte{2}, 32), WarnOnly: true},
		4: {Expected: bytes.Repeat([]byte{3}, 32), AlsoAccepted: [][]byte{bytes.Repeat([]byte{4}, 32), bytes.Repeat([]byte{5}, 32)}},
		11: {Expected: bytes.Repeat([]byte{6}, 32), Events: []Event{
			{Type: "EV_IPL", Description: ".linux\x00", Digest: bytes.Repeat([]byte{7}, 32), Source: `uki.efi "section" name`},
			{Type: "EV_IPL", Description: ".linux", Digest: bytes.Repeat([]byte{8}, 32)},
		}}}
	data, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(data, 32)
	if err != nil {
		t.Fatalf("parsing %s: %v", data, err)
	}
	for i := range m {
		if !bytes.Equal(back[i].Expected, m[i].Expected) || back[i].WarnOnly != m[i].WarnOnly || !slices.EqualFunc(back[i].AlsoAccepted, m[i].AlsoAccepted, bytes.Equal) || !slices.EqualFunc(back[i].Events, m[i].Events, equalEvent) {
			t.Errorf("index %d: got %+v, want %+v", i, back[i], m[i])
		}
	}
}

func TestCompare(t *testing.T) {
	a, b, c := []byte{0xa}, []byte{0xb}, []byte{0xc}
	ref := M{1: {Expected: a}, 2: {Expected: b}, 3: {Expected: c, WarnOnly: true}, 4: {Expected: a}, 5: {Expected: a, AlsoAccepted: [][]byte{b}}}
	tests := []struct {
		name         string
		got          map[uint32][]byte
		wantEnforced []uint32
		wantWarn     []uint32
	}{
		{name: "all match", got: map[uint32][]byte{1: a, 2: b, 3: c, 4: a, 5: a, 9: c}},
		{name: "a further accepted value matches", got: map[uint32][]byte{1: a, 2: b, 3: c, 4: a, 5: b}},
		{name: "a value accepted nowhere is a mismatch", got: map[uint32][]byte{1: a, 2: b, 3: c, 4: a, 5: c}, wantEnforced: []uint32{5}},
		{name: "every enforced mismatch is reported", got: map[uint32][]byte{1: b, 2: a, 3: c, 4: a, 5: a}, wantEnforced: []uint32{1, 2}},
		{name: "missing index is a mismatch", got: map[uint32][]byte{1: a, 2: b, 3: c, 5: a}, wantEnforced: []uint32{4}},
		{name: "warn-only mismatch is a warning", got: map[uint32][]byte{1: a, 2: b, 3: a, 4: a, 5: a}, wantWarn: []uint32{3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			warnings, err := ref.Compare(tt.got)
			var mismatch *mismatchError
			switch {
			case len(tt.wantEnforced) == 0:
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
			case !errors.As(err, &mismatch):
				t.Fatalf("error = %v, want *MismatchError", err)
			default:
				if got := indices(mismatch.Mismatches); !equal(got, tt.wantEnforced) {
					t.Errorf("enforced mismatches at %v, want %v (%v)", got, tt.wantEnforced, err)
				}
			}
			if got := indices(warnings); !equal(got, tt.wantWarn) {
				t.Errorf("warnings at %v, want %v", got, tt.wantWarn)
			}
		})
	}
}

func TestMismatchErrorNamesIndexExpectedAndGot(t *testing.T) {
	_, err := M{7: {Expected: []byte{0xab}}, 8: {Expected: []byte{0xcd}}}.Compare(map[uint32][]byte{7: {0xef}})
	want := "index 7: expected ab, got ef; index 8: expected cd, got missing"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error = %v, want it to contain %q", err, want)
	}
}

func indices(mm []Mismatch) []uint32 {
	var out []uint32
	for _, m := range mm {
		out = append(out, m.Index)
	}
	return out
}

func equal(a, b []uint32) bool { return slices.Equal(a, b) }

func FuzzParse(f *testing.F) {
	f.Add([]byte("4: {expected: " + h32a + "}\n15: {expected: " + h32b + ", warnOnly: true}\n"))
	f.Add([]byte(`{"7": {"expected": "` + h32a + `"}}`))
	f.Add([]byte("4: {expected: xyz}"))
	f.Add([]byte("[1, 2]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data, 32)
		if err != nil {
			return
		}
		// Whatever parses must round-trip.
		out, err := m.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(out, 32)
		if err != nil {
			t.Fatalf("re-parsing %q: %v", out, err)
		}
		if len(back) != len(m) {
			t.Fatalf("round trip changed %d indices into %d", len(m), len(back))
		}
	})
}

func equalEvent(a, b Event) bool {
	return a.Type == b.Type && a.Description == b.Description && bytes.Equal(a.Digest, b.Digest) && a.Source == b.Source
}
