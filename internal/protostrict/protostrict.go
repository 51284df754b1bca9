// Package protostrict refuses protobuf messages that carry fields their
// schema does not define. proto.Unmarshal keeps such fields as unknown
// bytes and goes on; a verifier or a server that acts on a message must not
// silently accept content it cannot interpret (docs/threat-model.md,
// "Strict input").
package protostrict

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// maxDepth bounds the recursion; protobuf's own decoder stops at 10000
// nested messages, ours are a few levels deep.
const maxDepth = 64

// CheckUnknown returns an error naming the first message, by its field
// path from m, that holds unknown fields; nil when there is none.
func CheckUnknown(m proto.Message) error {
	return check(m.ProtoReflect(), string(m.ProtoReflect().Descriptor().Name()), 0)
}

func check(m protoreflect.Message, path string, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("%s: messages nested deeper than %d", path, maxDepth)
	}
	if len(m.GetUnknown()) > 0 {
		return fmt.Errorf("%s: has fields this version does not know (%d bytes); update the peer or this component", path, len(m.GetUnknown()))
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := path + "." + string(fd.Name())
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = check(l.Get(i).Message(), fmt.Sprintf("%s[%d]", name, i), depth+1)
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				err = check(mv.Message(), fmt.Sprintf("%s[%v]", name, k.Interface()), depth+1)
				return err == nil
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			err = check(v.Message(), name, depth+1)
		}
		return err == nil
	})
	return err
}
