package capiparity

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"
)

// absent stands for a value one side does not have.
const absent = "—"

// difference is one place where the two meanings differ.
type difference struct {
	Path, Ours, Upstream string
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// diffValues appends the differences between ours and upstream under path.
// Maps are compared key by key; lists as multisets (each element one side
// lacks is one difference), then by the order of what both have.
func diffValues(path string, ours, upstream any, out *[]difference) {
	ours, upstream = plain(ours), plain(upstream)
	if reflect.DeepEqual(ours, upstream) {
		return
	}
	om, oIsMap := ours.(map[string]any)
	um, uIsMap := upstream.(map[string]any)
	if oIsMap && uIsMap {
		keys := map[string]bool{}
		for k := range om {
			keys[k] = true
		}
		for k := range um {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		_, collection := om[keyedMarker]
		for _, k := range sorted {
			if k == keyedMarker {
				continue
			}
			o, oOK := om[k]
			u, uOK := um[k]
			sub := childPath(path, k, collection)
			switch {
			case !oOK:
				*out = append(*out, difference{sub, absent, show(withoutContent(u))})
			case !uOK:
				*out = append(*out, difference{sub, show(withoutContent(o)), absent})
			default:
				diffValues(sub, o, u, out)
			}
		}
		return
	}
	ol, oIsList := ours.([]any)
	ul, uIsList := upstream.([]any)
	if oIsList && uIsList {
		diffLists(path, ol, ul, out)
		return
	}
	*out = append(*out, difference{path, show(ours), show(upstream)})
}

func diffLists(path string, ours, upstream []any, out *[]difference) {
	count := map[string]int{}
	for _, o := range ours {
		count[show(o)]++
	}
	for _, u := range upstream {
		count[show(u)]--
	}
	var oursOnly, upOnly []string
	for _, o := range ours {
		if k := show(o); count[k] > 0 {
			oursOnly = append(oursOnly, k)
			count[k]--
		}
	}
	for k, n := range count {
		for ; n < 0; n++ {
			upOnly = append(upOnly, k)
		}
	}
	slices.Sort(upOnly)
	for _, k := range oursOnly {
		*out = append(*out, difference{path + "[]", k, absent})
	}
	for _, k := range upOnly {
		*out = append(*out, difference{path + "[]", absent, k})
	}
	// The order of what both have.
	common := func(l []any, other []any) []any {
		left := map[string]int{}
		for _, x := range other {
			left[show(x)]++
		}
		var c []any
		for _, x := range l {
			if k := show(x); left[k] > 0 {
				left[k]--
				c = append(c, x)
			}
		}
		return c
	}
	oc, uc := common(ours, upstream), common(upstream, ours)
	if !reflect.DeepEqual(oc, uc) {
		*out = append(*out, difference{path + " (order)", show(oc), show(uc)})
	}
}

// withoutContent is a file one side lacks, without its content: that it
// is there (with its mode and owner) is the difference, and the table
// then does not change with, say, the pinned versions in an install
// script.
func withoutContent(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	out := make(map[string]any, len(m))
	for k, e := range m {
		if k == "content" || k == "contents" {
			e = "…"
		}
		out[k] = e
	}
	return out
}

// keyedMarker marks a keyed collection once plain turned it into a map.
const keyedMarker = "\x00keyed"

// plain turns typed values into JSON's generic ones (maps, lists,
// strings, float64, bool, nil), keeping keyed collections marked.
func plain(v any) any {
	switch x := v.(type) {
	case keyed:
		m := map[string]any{keyedMarker: true}
		for k, e := range x {
			m[k] = plain(e)
		}
		return m
	case map[string]any:
		if _, ok := x[keyedMarker]; ok {
			return x
		}
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = plain(e)
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = plain(e)
		}
		return l
	case nil, string, bool, float64:
		return x
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%#v", v)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		return string(b)
	}
	if out == nil {
		return nil
	}
	return plain(out)
}

func childPath(path, key string, collection bool) string {
	if collection || !identifier.MatchString(key) {
		return path + "[" + key + "]"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// show prints a value as compact JSON; a long one is cut and carries a
// hash of the whole, so that the table of differences still holds it
// exactly.
func show(v any) string { return showUpTo(v, 100) }

// showUpTo is show with another length limit (failure messages are kept
// whole when they fit).
func showUpTo(v any, limit int) string {
	v = unmark(plain(v))
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	s := fmt.Sprint(v)
	if err := enc.Encode(v); err == nil {
		s = strings.TrimSuffix(b.String(), "\n")
	}
	if len(s) <= limit {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	cut := s[:limit-28]
	for !utf8.ValidString(cut) {
		cut = cut[:len(cut)-1]
	}
	return cut + "… (sha256:" + hex.EncodeToString(sum[:])[:12] + ")"
}

func unmark(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			if k != keyedMarker {
				m[k] = unmark(e)
			}
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = unmark(e)
		}
		return l
	}
	return v
}
