package rendertest

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
)

// CloudInit is one long-running Python interpreter with cloud-init's own
// modules loaded: it renders Jinja cloud-config and validates it with the
// code `cloud-init devel render` and `cloud-init schema` run, without a
// process per document, so that a fuzz target can check every input with
// the real cloud-init. Tests of a few documents use CloudInitSchema, the
// command line itself.
type CloudInit struct {
	mu     sync.Mutex
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
}

// CloudInitResult is what cloud-init makes of one document.
type CloudInitResult struct {
	// Error is why cloud-init refuses the document (Jinja, YAML or the
	// schema); empty when it is valid cloud-config.
	Error string `json:"error"`
	// Config is the document as cloud-init reads it (after Jinja), as
	// JSON; a value JSON cannot hold is {"nonjson": repr}.
	Config any `json:"config"`
	// Templates holds, for each template asked about, what Jinja makes of
	// it alone, as cloud-init's Jinja renders user data.
	Templates map[string]Template `json:"templates"`
	// Refs holds, for each Jinja expression asked about, its value as
	// cloud-init's Jinja renders {{ expression }} with the instance data.
	Refs map[string]Template `json:"refs"`
}

// Template is what Jinja makes of one value alone.
type Template struct {
	// Error is why Jinja refuses it.
	Error string `json:"error"`
	// Rendered is its output (its trailing newline kept, as in a document).
	Rendered string `json:"rendered"`
	// ShapesYAML says an expression's output holds a line break, a quote or a
	// backslash, which can shape the YAML around it.
	ShapesYAML bool `json:"shapesYAML"`
}

// cloudInitChecker is the interpreter's loop: one JSON request a line
// ({"data": base64, "templates": [...]}), one JSON answer a line.
const cloudInitChecker = `
import base64, contextlib, io, json, os, sys, tempfile
import jinja2
from cloudinit import safeyaml
from cloudinit.config.schema import get_schema, validate_cloudconfig_file
from cloudinit.handlers.jinja_template import convert_jinja_instance_data, render_jinja_payload
from cloudinit.templater import UndefinedJinjaVariable

schema = get_schema()
instance = json.loads(sys.argv[1])
jinja_vars = convert_jinja_instance_data(instance, decode_paths=instance.get("base64-encoded-keys", []), include_key_aliases=True)
path = os.path.join(tempfile.mkdtemp(), "user-data")

def alone(text):
    outputs = []
    def finalize(v):
        outputs.append(str(v))
        return v
    try:
        rendered = jinja2.Template(text, undefined=UndefinedJinjaVariable, trim_blocks=True, keep_trailing_newline=True,
                                   extensions=["jinja2.ext.do"], finalize=finalize).render(**jinja_vars)
    except Exception as e:
        return {"error": repr(e)}
    shaping = any(c in o for o in outputs for c in "\n\r\x85\u2028\u2029\"'\\")
    return {"rendered": rendered, "shapesYAML": shaping}

def check(data):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return {"error": "not UTF-8: %r" % e}
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        try:
            if text.startswith("## template: jinja"):
                text = render_jinja_payload(text, "user-data", instance)
                if not text:
                    return {"error": "cloud-init ignored the Jinja template: %s" % sink.getvalue()}
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            validate_cloudconfig_file(path, schema)
            config = safeyaml.load(text)
        except Exception as e:
            return {"error": "%s: %s %s" % (type(e).__name__, e, sink.getvalue())}
    return {"config": json.loads(json.dumps(config, default=lambda o: {"nonjson": repr(o)}))}

for line in sys.stdin:
    req = json.loads(line)
    resp = check(base64.b64decode(req["data"]))
    resp["templates"] = {t: alone(t) for t in req.get("templates") or []}
    resp["refs"] = {e: alone("{{ " + e + " }}") for e in req.get("refs") or []}
    sys.stdout.write(json.dumps(resp) + "\n")
    sys.stdout.flush()
`

// StartCloudInit starts the interpreter cloud-init runs with (its
// script's #! line); Close ends it.
func StartCloudInit() (*CloudInit, error) {
	bin, err := exec.LookPath("cloud-init")
	if err != nil {
		return nil, fmt.Errorf("cloud-init is not installed (.ci/run installs it): %w", err)
	}
	script, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	line, _, _ := strings.Cut(string(script), "\n")
	interpreter, ok := strings.CutPrefix(line, "#!")
	if !ok || len(strings.Fields(interpreter)) == 0 {
		return nil, fmt.Errorf("%s starts with %q, not a #! line", bin, line)
	}
	cmd := exec.Command(strings.Fields(interpreter)[0], "-c", cloudInitChecker, string(InstanceData))
	// Away from the caller's directory, which could shadow the modules.
	cmd.Dir = os.TempDir()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting cloud-init's Python: %w", err)
	}
	return &CloudInit{cmd: cmd, stdin: stdin, stdout: bufio.NewReaderSize(stdout, 1<<20)}, nil
}

// Check renders data's Jinja with InstanceData and validates the result
// as `cloud-init schema` does; each of templates is also rendered alone,
// and each of refs, a Jinja expression, as {{ ref }}.
func (c *CloudInit) Check(data []byte, templates, refs []string) (CloudInitResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	req, err := json.Marshal(map[string]any{"data": base64.StdEncoding.EncodeToString(data), "templates": templates, "refs": refs})
	if err != nil {
		return CloudInitResult{}, err
	}
	if _, err := c.stdin.Write(append(req, '\n')); err != nil {
		return CloudInitResult{}, fmt.Errorf("writing to cloud-init's Python: %w", err)
	}
	line, err := c.stdout.ReadBytes('\n')
	if err != nil {
		return CloudInitResult{}, fmt.Errorf("reading from cloud-init's Python: %w", err)
	}
	var res CloudInitResult
	if err := json.Unmarshal(line, &res); err != nil {
		return CloudInitResult{}, fmt.Errorf("cloud-init's Python answered %q: %w", line, err)
	}
	return res, nil
}

// Close ends the interpreter.
func (c *CloudInit) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.stdin.Close()
	if werr := c.cmd.Wait(); werr != nil && !errors.Is(werr, os.ErrClosed) {
		err = errors.Join(err, werr)
	}
	return err
}
