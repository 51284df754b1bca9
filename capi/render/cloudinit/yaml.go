package cloudinit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"
)

// cloud-init reads cloud-config with PyYAML, a YAML 1.1 parser, after
// rendering Jinja when the data is a Jinja template. Go's YAML encoders
// write some strings plain that YAML 1.1 reads as something else ("=" is
// PyYAML's value tag, which it cannot load; "<<" a merge key), and keep
// Unicode line breaks (U+0085, U+2028, U+2029) that PyYAML turns into
// newlines or spaces. So the document is written here, with each string
// in the first of these styles that holds it as it is, character for
// character:
//
//   - plain, when no YAML 1.1 or 1.2 parser can read it as anything but
//     this string, and it opens no Jinja delimiter;
//   - single-quoted, when it is one line without a quote or a Jinja
//     delimiter;
//   - literal (|), with an explicit indentation indicator, so that leading
//     spaces never move the block, when it opens no Jinja delimiter;
//   - double-quoted with escapes, for what no other style holds (control
//     characters, Unicode line breaks, Jinja delimiters, whose brace is
//     escaped: jinja.go).

// templates are the strings of a document that are Jinja templates, by
// the placeholder each stands for, parsed (jinja.go).
type templates map[string][]Part

// encode writes v, as encoding/json reads JSON (maps, lists, strings,
// numbers, booleans, null), as a block YAML document; a string that is a
// key of tpl is written as that template.
func encode(v any, tpl templates) []byte {
	var b bytes.Buffer
	switch t := v.(type) {
	case map[string]any:
		if len(t) == 0 {
			b.WriteString("{}\n")
			return b.Bytes()
		}
		writeMapping(&b, t, 0, false, tpl)
	default:
		b.WriteString(scalar(v, 0, tpl))
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// writeMapping writes m's entries at column indent, sorted by key; the
// first one continues the current line when inline.
func writeMapping(b *bytes.Buffer, m map[string]any, indent int, inline bool, tpl templates) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		if i > 0 || !inline {
			b.WriteString(strings.Repeat(" ", indent))
		}
		b.WriteString(key(k))
		b.WriteByte(':')
		switch v := m[k].(type) {
		case map[string]any:
			if len(v) == 0 {
				b.WriteString(" {}\n")
				continue
			}
			b.WriteByte('\n')
			writeMapping(b, v, indent+2, false, tpl)
		case []any:
			if len(v) == 0 {
				b.WriteString(" []\n")
				continue
			}
			// A list in a mapping starts at the key's column.
			b.WriteByte('\n')
			writeSequence(b, v, indent, false, tpl)
		default:
			b.WriteString(" " + scalar(v, indent, tpl) + "\n")
		}
	}
}

// writeSequence writes l's items at column indent; the first one
// continues the current line when inline.
func writeSequence(b *bytes.Buffer, l []any, indent int, inline bool, tpl templates) {
	for i, item := range l {
		if i > 0 || !inline {
			b.WriteString(strings.Repeat(" ", indent))
		}
		b.WriteString("- ")
		switch v := item.(type) {
		case map[string]any:
			if len(v) == 0 {
				b.WriteString("{}\n")
				continue
			}
			writeMapping(b, v, indent+2, true, tpl)
		case []any:
			if len(v) == 0 {
				b.WriteString("[]\n")
				continue
			}
			writeSequence(b, v, indent+2, true, tpl)
		default:
			b.WriteString(scalar(v, indent, tpl) + "\n")
		}
	}
}

// scalar is v written as a node owned by a key or list item at column
// indent (a literal block's lines go two columns further).
func scalar(v any, indent int, tpl templates) string {
	switch t := v.(type) {
	case nil:
		return "null"
	case bool:
		if t {
			return "true"
		}
		return "false"
	case json.Number:
		return t.String()
	case string:
		if parts, ok := tpl[t]; ok {
			return writeTemplate(parts)
		}
		return str(t, indent)
	}
	panic(fmt.Sprintf("cloudinit: cannot write %T", v))
}

// key is a mapping key, on its line: plain, single- or double-quoted.
func key(k string) string {
	switch {
	case plainSafe(k) && !jinja(k):
		return k
	case singleQuoted(k):
		return "'" + k + "'"
	}
	return doubleQuoted(k)
}

func str(s string, indent int) string {
	switch {
	case plainSafe(s) && !jinja(s):
		return s
	case singleQuoted(s):
		return "'" + s + "'"
	case verbatim(s) && !jinja(s) && strings.TrimRight(s, "\n") != "":
		return literal(s, indent)
	}
	return doubleQuoted(s)
}

// literal is s as a literal block scalar, its lines at indent+2.
func literal(s string, indent int) string {
	body := strings.TrimRight(s, "\n")
	chomp := "-"
	switch trailing := len(s) - len(body); {
	case trailing == 1:
		chomp = ""
	case trailing > 1:
		chomp = "+"
	}
	pad := strings.Repeat(" ", indent+2)
	var b strings.Builder
	b.WriteString("|2" + chomp)
	for line := range strings.SplitSeq(body, "\n") {
		b.WriteByte('\n')
		if line != "" {
			b.WriteString(pad + line)
		}
	}
	// Kept line breaks beyond the first are empty lines of the block.
	b.WriteString(strings.Repeat("\n", max(0, len(s)-len(body)-1)))
	return b.String()
}

// doubleQuoted escapes what YAML cannot hold as it is.
func doubleQuoted(s string) string { return `"` + escapeDouble(s) + `"` }

// escapeDouble is s escaped for YAML's double quotes. A brace that opens
// a Jinja delimiter ({{, {%, {#), or ends s (where a template's reference
// may follow), is written \x7b, so that Jinja never sees a delimiter in
// the value.
func escapeDouble(s string) string {
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == '{' && (i+1 == len(s) || s[i+1] == '{' || s[i+1] == '%' || s[i+1] == '#'):
			b.WriteString(`\x7b`)
		case r == '"' || r == '\\':
			b.WriteString(`\` + string(r))
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\u0085':
			b.WriteString(`\N`)
		case r == '\u2028':
			b.WriteString(`\L`)
		case r == '\u2029':
			b.WriteString(`\P`)
		case r < 0x20 || r >= 0x7f && r <= 0x9f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case !printable(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// printable is what YAML 1.1 (and PyYAML) take as it is in a stream
// beyond ASCII's control characters, less the byte order mark and the
// Unicode line and paragraph separators, which YAML reads as line breaks.
func printable(r rune) bool {
	return r == '\t' || r == '\n' || r >= 0x20 && r <= 0x7e || r >= 0xa0 && r <= 0xd7ff && r != 0x2028 && r != 0x2029 ||
		r >= 0xe000 && r <= 0xfffd && r != 0xfeff || r >= 0x10000 && r <= 0x10ffff
}

// singleQuoted says s is written in single quotes: one line of verbatim
// text without a quote that is not plain and opens no Jinja delimiter
// (which only double quotes can escape).
func singleQuoted(s string) bool {
	return !plainSafe(s) && !jinja(s) && !strings.ContainsAny(s, "'\n\t") && verbatim(s)
}

// jinja says s opens a Jinja delimiter.
func jinja(s string) bool { return delimiter(s) >= 0 }

// verbatim says a literal block or single quotes hold s character for
// character: printable text whose only line breaks are newlines.
func verbatim(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !printable(r) {
			return false
		}
	}
	return true
}

// implicit matches what YAML 1.1 (PyYAML's resolvers) or YAML 1.2 read as
// something other than a string when it is plain.
var implicit = regexp.MustCompile(`^(` +
	`[yY]|[yY]es|YES|[nN]|[nN]o|NO|[tT]rue|TRUE|false|False|FALSE|[oO]n|ON|[oO]ff|OFF|` + // booleans
	`~|[nN]ull|NULL|<<|=|` + // null, merge, value
	`[-+]?\.?[0-9][0-9a-zA-Z_.:+-]*|` + // numbers, timestamps, sexagesimals
	`[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)` +
	`)$`)

// plainSafe says s can be written plain: one line of printable ASCII that
// starts with no indicator, holds no ": " or " #", has no surrounding
// spaces and is not read as another type.
func plainSafe(s string) bool {
	if s == "" || implicit.MatchString(s) || strings.TrimSpace(s) != s {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	switch s[0] {
	case '-', '?', ':':
		// "-e", "--config" are plain; "- x", "-" are not.
		if len(s) == 1 || s[1] == ' ' {
			return false
		}
	case ',', '[', ']', '{', '}', '#', '&', '*', '!', '|', '>', '\'', '"', '%', '@', '`':
		return false
	}
	return !strings.Contains(s, ": ") && !strings.Contains(s, " #") && !strings.HasSuffix(s, ":")
}
