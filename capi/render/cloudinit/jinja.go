package cloudinit

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// JinjaHeader is the first line of cloud-config that is a Jinja template:
// cloud-init renders the whole document with the instance's metadata
// before it reads the YAML (cloud-init's "Instance metadata"
// documentation; CABPK writes the same header).
const JinjaHeader = "## template: jinja\n"

// Jinja templating is contained value by value. RenderJinja writes the
// document so that whatever a value holds, Jinja's output parses to exactly
// the structure written:
//
//   - a template value (a file's content, a command's argument) may hold
//     references to instance data, {{ ds.meta_data.local_hostname }}, and
//     {% raw %}…{% endraw %} around literal text; any other Jinja is
//     refused (ParseTemplate). It is written double-quoted, each reference
//     as an expression whose output Jinja escapes for YAML's double quotes,
//     so no metadata value can end the scalar;
//   - every other value is literal: a value that opens a Jinja delimiter
//     ({{, {%, {#) is written double-quoted with that brace escaped (\x7b),
//     so Jinja never sees a delimiter in it.

// Part is a piece of a template value: literal Text, or a reference to
// instance data (Ref, its steps such as "ds", ".meta_data", "['local-ipv4']").
type Part struct {
	Text string
	Ref  []string
}

// errTemplate is wrapped by ParseTemplate's errors.
var errTemplate = errors.New("unsupported Jinja")

var (
	refName     = `[A-Za-z_][A-Za-z0-9_]*`
	refStep     = regexp.MustCompile(`^\s*(?:\.\s*(` + refName + `)|\[\s*(?:'([A-Za-z0-9_.:/-]*)'|"([A-Za-z0-9_.:/-]*)"|([0-9]{1,6}))\s*\])`)
	refStart    = regexp.MustCompile(`^\s*(` + refName + `)`)
	rawBegin    = regexp.MustCompile(`^\{%\s*raw\s*%\}`)
	rawEndLoose = regexp.MustCompile(`\{%[-+]?\s*endraw\s*[-+]?%\}`)
	rawEnd      = regexp.MustCompile(`^\{%\s*endraw\s*%\}`)
)

// ParseTemplate splits a template value into literal text and references
// to instance data, as cloud-init's Jinja (trim_blocks) renders it:
// {{ name(.name | ['key'] | [n])* }} is a reference; {% raw %}text{% endraw %}
// is text (a line break right after {% endraw %} is removed, as Jinja
// does); anything else that opens {{, {% or {# is refused with an error
// wrapping errTemplate, as are names starting with "__". Adjacent text
// parts are merged.
func ParseTemplate(s string) ([]Part, error) {
	var parts []Part
	full := len(s)
	at := func() int { return full - len(s) }
	text := func(t string) {
		if t == "" {
			return
		}
		if n := len(parts); n > 0 && parts[n-1].Ref == nil {
			parts[n-1].Text += t
			return
		}
		parts = append(parts, Part{Text: t})
	}
	for s != "" {
		i := delimiter(s)
		if i < 0 {
			text(s)
			break
		}
		text(s[:i])
		s = s[i:]
		switch s[:2] {
		case "{{":
			end := strings.Index(s, "}}")
			if end < 0 {
				return nil, fmt.Errorf("%w: {{ at byte %d without }}", errTemplate, at())
			}
			ref, err := parseRef(s[2:end])
			if err != nil {
				return nil, fmt.Errorf("%w: {{ at byte %d: %w", errTemplate, at(), err)
			}
			parts = append(parts, Part{Ref: ref})
			s = s[end+2:]
		case "{%":
			m := rawBegin.FindString(s)
			if m == "" {
				return nil, fmt.Errorf("%w: {%% at byte %d: the only tag a value may hold is {%% raw %%}…{%% endraw %%}", errTemplate, at())
			}
			s = s[len(m):]
			loc := rawEndLoose.FindStringIndex(s)
			if loc == nil {
				return nil, fmt.Errorf("%w: {%% raw %%} at byte %d without {%% endraw %%}", errTemplate, at())
			}
			if !rawEnd.MatchString(s[loc[0]:]) {
				return nil, fmt.Errorf("%w: the {%% endraw %%} at byte %d strips white space (- or +): write {%% endraw %%}", errTemplate, at()+loc[0])
			}
			text(s[:loc[0]])
			s = s[loc[1]:]
			// trim_blocks: Jinja removes the line break after a block tag.
			s = strings.TrimPrefix(s, "\n")
		default:
			return nil, fmt.Errorf("%w: {# at byte %d opens a Jinja comment (shell's ${#var} does): write it inside {%% raw %%}…{%% endraw %%}", errTemplate, at())
		}
	}
	return parts, nil
}

// delimiter is the index of the first {{, {% or {# in s, or -1.
func delimiter(s string) int {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '{' && (s[i+1] == '{' || s[i+1] == '%' || s[i+1] == '#') {
			return i
		}
	}
	return -1
}

// parseRef reads the inside of {{ … }}: a reference to instance data.
func parseRef(expr string) ([]string, error) {
	m := refStart.FindStringSubmatch(expr)
	if m == nil {
		return nil, fmt.Errorf("an expression is a reference to instance data such as ds.meta_data.local_hostname")
	}
	steps := []string{m[1]}
	rest := expr[len(m[0]):]
	for strings.TrimSpace(rest) != "" {
		m := refStep.FindStringSubmatch(rest)
		if m == nil {
			return nil, fmt.Errorf("an expression is a reference to instance data such as ds.meta_data.local_hostname or ds.meta_data['local-ipv4'], without filters, calls or whitespace control")
		}
		switch {
		case m[1] != "":
			steps = append(steps, "."+m[1])
		case m[4] != "":
			steps = append(steps, "["+m[4]+"]")
		default:
			steps = append(steps, "['"+m[2]+m[3]+"']")
		}
		rest = rest[len(m[0]):]
	}
	for _, st := range steps {
		if strings.HasPrefix(strings.TrimPrefix(st, "."), "__") {
			return nil, fmt.Errorf("%s is not instance data", st)
		}
	}
	return steps, nil
}

// jinjaExpr is the Jinja expression of a reference: a missing step
// renders cloud-init's CI_MISSING_JINJA_VAR marker instead of failing the
// whole template (which makes cloud-init drop all user data), and the
// output is escaped for YAML's double quotes (Python's unicode_escape
// writes \\, \n, \xNN, \uNNNN and \UNNNNNNNN, which YAML reads back; the
// quote becomes \x22), so no value can end the scalar or the line.
func jinjaExpr(ref []string) string {
	return `{{ (` + RefExpr(ref) + `).encode('unicode_escape').decode('ascii').replace('"', '\\x22') }}`
}

// RefExpr is the Jinja expression whose value (a string) a reference
// renders to, before it is escaped for YAML: each step looked up in what
// the previous one found, a missing one rendering cloud-init's
// CI_MISSING_JINJA_VAR/<name>.
func RefExpr(ref []string) string {
	expr := ref[0]
	for _, st := range ref[1:] {
		expr = "(" + expr + " | default({}))" + st
	}
	return expr + " | string"
}

// writeTemplate writes a template value as a double-quoted scalar.
func writeTemplate(parts []Part) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, p := range parts {
		if p.Ref != nil {
			b.WriteString(jinjaExpr(p.Ref))
			continue
		}
		b.WriteString(escapeDouble(p.Text))
	}
	b.WriteByte('"')
	return b.String()
}
